//! Attention read straight from a packed cache, as a model-quality pass computes it where its
//! cache is one packed tensor per head and side (the quality crate's `cache.rs`, "Attention":
//! `prefill`, `uniform`, K grouped along tokens in groups that are a multiple of 32, V along
//! features, a head dimension that is a multiple of 8; and the `kvpack-*` schemes under
//! `prefill` without sinks). Written again from the spec in the codec's attention module
//! comment, one value at a time; the audit requires the pass's arrays bit for bit, so every
//! operation below is one f32 operation in the spec's order:
//!
//! 1. `qs[i][d] = q[i][d] * scale`.
//! 2. Tokens are cut into splits of 4,096, each into blocks of 256; a split keeps per query a
//!    state (m, l, acc\[D\]) from (-inf, 0, 0). A block no query sees (its first token at or past
//!    every `visible[i]`) is skipped.
//! 3. A block's scores: from `s = 0`, for d = 0, 1, ..: `s = fma(dK[t][d], qs[i][d] * sK[t][d],
//!    s)`, where `dK` is a code minus its group's offset and `sK` its group's scale.
//! 4. For a query that sees `seen` of the block's tokens (`visible[i] - t0`, clamped to the
//!    block): `m' = max(m, max of the seen scores)`; `corr = exp(m - m')`; `p[t] = exp(s[t] -
//!    m')` for a seen token, 0 otherwise.
//! 5. `p[t]` is added into lane t mod 8 in token order; `sum8` = ((l0 + l1) + (l2 + l3)) + ((l4
//!    + l5) + (l6 + l7)); if `seen > 0`: m = m', `l = l * corr + sum8` and every `acc[d] *=
//!    corr` (a query that sees none of the block keeps its state).
//! 6. For every token of the block in order (unseen ones too, whose weight is 0): `acc[d] =
//!    fma(dV[t][d], p[t] * sV[t][d], acc[d])`.
//! 7. Splits merge in order: with B the later one, nothing changes if `mB = -inf`; B is taken if
//!    `mA = -inf`; otherwise `m = max(mA, mB)`, `a = exp(mA - m)`, `b = exp(mB - m)`, `l = lA * a
//!    + lB * b` and `acc = accA * a + accB * b`.
//! 8. `out[i][d] = acc[d] / l`.
//!
//! `exp` is the spec's Cephes `expf` (0 below -87, Cody and Waite's reduction, the degree-5
//! polynomial, no fused operation); `fma` is `a * b + c` rounded once. The audit computes the
//! latter its own way: the exact product in f64, its sum with c rounded to odd (Boldo and
//! Melquiond: f64's 53 bits are more than 24 + 2, so rounding that to f32 is the one correct
//! rounding), not through a C library's `fmaf`, which some platforms get wrong.

use ndarray::{Array2, ArrayView2};

use crate::packed_kv::decoder::GroupAxis;
use crate::packed_kv::protocol::Mode;
use crate::packed_kv::rules;

/// Tokens per split.
const SPLIT: usize = 4096;
/// Tokens per block.
const BLOCK: usize = 256;
/// Lanes of step 5.
const LANES: usize = 8;
/// K's group size must be a multiple of this (and the head dimension of 8).
pub const K_GROUP_MULTIPLE: usize = 32;

/// One KV head's K or V as the spec reads it, token-major (`[t][d]`): each value's code minus its
/// group's offset (an exact small integer, as f32) and its group's scale.
#[derive(Debug, Clone, PartialEq)]
pub struct Coded {
    tokens: usize,
    dim: usize,
    diff: Vec<f32>,
    scale: Vec<f32>,
}

impl Coded {
    /// `values` (`tokens` x `dim`, row-major) quantized by the audit's rule in groups of `group`
    /// along `axis` (a partial last group has fewer values); Err when a group's scale overflows.
    pub fn quantize(
        values: &[f32],
        (tokens, dim): (usize, usize),
        axis: GroupAxis,
        (mode, bits, group): (Mode, u32, usize),
    ) -> Result<Coded, String> {
        let mut coded = Coded {
            tokens,
            dim,
            diff: vec![0.0; values.len()],
            scale: vec![0.0; values.len()],
        };
        let group = group.max(1);
        let mut indices = Vec::with_capacity(group);
        let (lines, along) = match axis {
            GroupAxis::Token => (dim, tokens),
            GroupAxis::Feature => (tokens, dim),
        };
        for line in 0..lines {
            for start in (0..along).step_by(group) {
                let end = start.saturating_add(group).min(along);
                indices.clear();
                indices.extend((start..end).map(|a| match axis {
                    GroupAxis::Token => a * dim + line,
                    GroupAxis::Feature => line * dim + a,
                }));
                let (mut lo, mut hi) = (0f32, 0f32);
                for &i in &indices {
                    lo = lo.min(values[i]);
                    hi = hi.max(values[i]);
                }
                let rule = rules::group_rule(mode, bits, lo, hi);
                if !rule.scale.is_finite() {
                    return Err(format!(
                        "a group ranging over [{lo}, {hi}] has a scale f32 cannot hold at {bits} \
                         bits"
                    ));
                }
                for &i in &indices {
                    let code = rules::code(mode, bits, values[i], rule.scale, rule.offset);
                    coded.diff[i] = (i32::from(code) - i32::from(rule.offset)) as f32;
                    coded.scale[i] = rule.scale;
                }
            }
        }
        Ok(coded)
    }

    /// What the cache reads back: `(code - offset) as f32 * scale`, row-major.
    pub fn decoded(&self) -> Vec<f32> {
        self.diff
            .iter()
            .zip(&self.scale)
            .map(|(&c, &s)| c * s)
            .collect()
    }
}

/// Each KV head of `k` and `v` ([heads, tokens, head_dim], flat) quantized as attention reads
/// it in place: K along tokens at `k_bits`, V along features at `v_bits`, groups of `group`.
pub fn coded_heads(
    (k, v): (&[f32], &[f32]),
    (heads, tokens, d): (usize, usize, usize),
    mode: Mode,
    (k_bits, v_bits): (u32, u32),
    group: usize,
) -> Result<Vec<(Coded, Coded)>, String> {
    let size = tokens * d;
    (0..heads)
        .map(|h| {
            let (k, v) = (&k[h * size..][..size], &v[h * size..][..size]);
            Ok((
                Coded::quantize(k, (tokens, d), GroupAxis::Token, (mode, k_bits, group))?,
                Coded::quantize(v, (tokens, d), GroupAxis::Feature, (mode, v_bits, group))?,
            ))
        })
        .collect()
}

/// `KvSource::attend` over `coded` heads (models::llama::KvSource).
pub fn attend_coded(
    coded: &[(Coded, Coded)],
    head: usize,
    queries: ArrayView2<'_, f32>,
    visible: &[usize],
    scale: f32,
) -> Option<Result<Array2<f32>, String>> {
    let (k, v) = coded.get(head)?;
    let flat: Vec<f32> = queries.iter().copied().collect();
    let out = attend(k, v, &flat, visible, scale);
    Some(Array2::from_shape_vec(queries.dim(), out).map_err(|e| e.to_string()))
}

/// The running softmax of one query.
#[derive(Debug, Clone)]
struct State {
    max: f32,
    sum: f32,
    acc: Vec<f32>,
}

/// Attention (module docs) of `queries` (`visible.len()` rows of the head dimension, row-major)
/// over K and V of one head; the output has one row per query.
pub fn attend(k: &Coded, v: &Coded, queries: &[f32], visible: &[usize], scale: f32) -> Vec<f32> {
    let d = k.dim;
    let scaled: Vec<f32> = queries.iter().map(|&x| x * scale).collect();
    let last = visible.iter().copied().max().unwrap_or(0).min(k.tokens);
    let mut total: Option<Vec<State>> = None;
    for split in (0..last).step_by(SPLIT) {
        let end = (split + SPLIT).min(last);
        let part = split_states(k, v, &scaled, visible, split..end);
        total = Some(match total {
            None => part,
            Some(earlier) => earlier.into_iter().zip(part).map(merge).collect(),
        });
    }
    let mut out = Vec::with_capacity(visible.len() * d);
    for state in total.unwrap_or_default() {
        out.extend(state.acc.iter().map(|&a| a / state.sum));
    }
    out
}

/// Steps 2 to 6 over one split.
fn split_states(
    k: &Coded,
    v: &Coded,
    scaled: &[f32],
    visible: &[usize],
    split: std::ops::Range<usize>,
) -> Vec<State> {
    let d = k.dim;
    let mut states: Vec<State> = (0..visible.len())
        .map(|_| State {
            max: f32::NEG_INFINITY,
            sum: 0.0,
            acc: vec![0.0; d],
        })
        .collect();
    for t0 in split.clone().step_by(BLOCK) {
        if visible.iter().all(|&n| n <= t0) {
            continue;
        }
        let len = (t0 + BLOCK).min(split.end) - t0;
        for (i, state) in states.iter_mut().enumerate() {
            let qs = &scaled[i * d..][..d];
            let scores: Vec<f32> = (t0..t0 + len)
                .map(|t| {
                    let mut s = 0f32;
                    for (c, &q) in qs.iter().enumerate() {
                        let at = t * d + c;
                        s = fma(k.diff[at], q * k.scale[at], s);
                    }
                    s
                })
                .collect();
            let seen = visible[i].saturating_sub(t0).min(len);
            let block_max = scores[..seen]
                .iter()
                .fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            let m = state.max.max(block_max);
            let corr = if seen == 0 { 1.0 } else { exp(state.max - m) };
            let mut lanes = [0f32; LANES];
            let p: Vec<f32> = scores
                .iter()
                .enumerate()
                .map(|(t, &s)| {
                    let p = if t < seen { exp(s - m) } else { 0.0 };
                    lanes[t % LANES] += p;
                    p
                })
                .collect();
            let sum8 = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
                + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
            if seen > 0 {
                state.max = m;
                state.sum = state.sum * corr + sum8;
                for a in &mut state.acc {
                    *a *= corr;
                }
            }
            for (j, &w) in p.iter().enumerate() {
                let row = (t0 + j) * d;
                for (c, a) in state.acc.iter_mut().enumerate() {
                    *a = fma(v.diff[row + c], w * v.scale[row + c], *a);
                }
            }
        }
    }
    states
}

/// Step 7 for one query: `a` then `b`.
fn merge((a, b): (State, State)) -> State {
    if b.max == f32::NEG_INFINITY {
        return a;
    }
    if a.max == f32::NEG_INFINITY {
        return b;
    }
    let m = a.max.max(b.max);
    let (x, y) = (exp(a.max - m), exp(b.max - m));
    State {
        max: m,
        sum: a.sum * x + b.sum * y,
        acc: a
            .acc
            .iter()
            .zip(&b.acc)
            .map(|(&p, &q)| p * x + q * y)
            .collect(),
    }
}

/// The spec's e^x for x <= 0 (module docs).
fn exp(x: f32) -> f32 {
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    const P: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ];
    if x.is_nan() || x < -87.0 {
        return 0.0;
    }
    let n = libm::floorf(x * std::f32::consts::LOG2_E + 0.5);
    let r = (x - n * C1) - n * C2;
    let r2 = r * r;
    let mut y = P[0];
    for &p in &P[1..] {
        y = y * r + p;
    }
    let y = (y * r2 + r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `a * b + c` rounded once to f32 (module docs): the product is exact in f64, the sum's error
/// is recovered exactly (Knuth's two-sum) and the f64 sum rounded to odd before f32's rounding.
fn fma(a: f32, b: f32, c: f32) -> f32 {
    let (p, c) = (f64::from(a) * f64::from(b), f64::from(c));
    let s = p + c;
    if !s.is_finite() {
        return s as f32;
    }
    let bb = s - p;
    let error = (p - (s - bb)) + (c - bb);
    let odd = if error != 0.0 && s.to_bits() & 1 == 0 {
        // Inexact, and s is the even neighbour: take the odd one on the exact sum's side.
        let away = (error > 0.0) == (s > 0.0);
        f64::from_bits(if away {
            s.to_bits() + 1
        } else {
            s.to_bits() - 1
        })
    } else {
        s
    };
    odd as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvcodec::attention::{self, Kernel};
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn codec_mode(mode: Mode) -> kvcodec::Mode {
        match mode {
            Mode::Symmetric => kvcodec::Mode::Symmetric,
            Mode::Asymmetric => kvcodec::Mode::Asymmetric,
        }
    }

    /// The codec's fused attention and the audit's on the same K, V and queries, compared bit
    /// for bit.
    fn compare(
        (k, v, q): (&Array2<f32>, &Array2<f32>, &Array2<f32>),
        visible: &[usize],
        (mode, k_bits, v_bits, group): (Mode, u32, u32, usize),
    ) {
        let (tokens, dim) = k.dim();
        let layout =
            |axis, bits| kvcodec::Layout::with_mode(axis, codec_mode(mode), bits, group).unwrap();
        let packed_k =
            kvcodec::encode(k.view(), layout(kvcodec::GroupAxis::Token, k_bits)).unwrap();
        let packed_v =
            kvcodec::encode(v.view(), layout(kvcodec::GroupAxis::Feature, v_bits)).unwrap();
        let scale = 1.0 / (dim as f32).sqrt();
        let q_view: ArrayView2<f32> = q.view();
        let theirs = attention::attend_with(
            Kernel::Portable,
            q_view,
            visible,
            &packed_k,
            &packed_v,
            scale,
        )
        .unwrap();
        let flat = |x: &Array2<f32>| x.iter().copied().collect::<Vec<f32>>();
        let coded_k = Coded::quantize(
            &flat(k),
            (tokens, dim),
            GroupAxis::Token,
            (mode, k_bits, group),
        )
        .unwrap();
        let coded_v = Coded::quantize(
            &flat(v),
            (tokens, dim),
            GroupAxis::Feature,
            (mode, v_bits, group),
        )
        .unwrap();
        assert_eq!(
            coded_k.decoded(),
            flat(&kvcodec::decode(&packed_k)),
            "the audit's codes read back as the codec's"
        );
        let ours = attend(&coded_k, &coded_v, &flat(q), visible, scale);
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
        assert_eq!(
            bits(&ours),
            bits(&flat(&theirs)),
            "{tokens} tokens, {mode:?}, K {k_bits} and V {v_bits} bits, group {group}"
        );
    }

    fn random(rng: &mut ChaCha8Rng, (rows, cols): (usize, usize), spread: f32) -> Array2<f32> {
        Array2::from_shape_fn((rows, cols), |(_, c)| {
            // An outlier channel, as real keys have.
            let wide = if c == 3 { 8.0 } else { 1.0 };
            rng.random_range(-spread..spread) * wide
        })
    }

    #[test]
    fn it_gives_the_codecs_bits_for_every_width_mode_and_a_causal_chunk() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let (tokens, dim) = (300, 64);
        let k = random(&mut rng, (tokens, dim), 2.0);
        let v = random(&mut rng, (tokens, dim), 1.0);
        let q = random(&mut rng, (6, dim), 3.0);
        // A causal chunk (the last rows see a partial block), and a decode step.
        let visible = [1, 31, 256, 257, 299, 300];
        for mode in [Mode::Symmetric, Mode::Asymmetric] {
            for (k_bits, v_bits) in [(2, 2), (3, 4), (4, 4), (8, 4), (4, 8), (5, 6)] {
                compare((&k, &v, &q), &visible, (mode, k_bits, v_bits, 32));
            }
        }
        compare((&k, &v, &q), &visible, (Mode::Asymmetric, 4, 4, 128));
    }

    #[test]
    fn it_gives_the_codecs_bits_over_several_splits_and_on_ties() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let (tokens, dim) = (4100, 16);
        let k = random(&mut rng, (tokens, dim), 1.0);
        let v = random(&mut rng, (tokens, dim), 1.0);
        let q = random(&mut rng, (3, dim), 2.0);
        compare((&k, &v, &q), &[4100, 4097, 17], (Mode::Symmetric, 4, 4, 32));
        // Tie-heavy: small integers, so codes sit on rounding ties and scores repeat.
        let ints = |rows, seed: usize| {
            Array2::from_shape_fn((rows, dim), |(t, c)| {
                ((t * 7 + c * 3 + seed) % 5) as f32 - 2.0
            })
        };
        let (k, v, q) = (ints(tokens, 0), ints(tokens, 1), ints(2, 2));
        compare((&k, &v, &q), &[4100, 4096], (Mode::Asymmetric, 2, 3, 64));
    }

    #[test]
    fn its_multiply_add_rounds_once() {
        // (1 + 2^-12)^2 + 2^-70 = 1 + 2^-11 + 2^-24 + 2^-70: just above a tie of f32, which a
        // sum rounded to f64 first would lose (and round down to even).
        let a = 1.0 + 2f32.powi(-12);
        assert_eq!(
            fma(a, a, 2f32.powi(-70)),
            1.0 + 2f32.powi(-11) + 2f32.powi(-23)
        );
        assert_eq!(fma(1.5, 2.0, 0.25), 3.25);
        assert_eq!(fma(-2.0, 3.0, 6.0).to_bits(), 0.0f32.to_bits());
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for _ in 0..100_000 {
            let x: f32 = rng.random_range(-4.0..4.0);
            let y: f32 = rng.random_range(-4.0..4.0);
            let z: f32 = rng.random_range(-16.0..16.0) * 2f32.powi(rng.random_range(-30..4));
            let codec = attention::fma::fma(x, y, z);
            assert_eq!(fma(x, y, z).to_bits(), codec.to_bits(), "{x} {y} {z}");
        }
    }

    #[test]
    fn its_exp_is_within_two_tenths_of_a_millionth() {
        let mut x = 0f32;
        while x >= -87.0 {
            let exact = f64::from(x).exp();
            assert!((f64::from(exp(x)) - exact).abs() / exact < 2e-7, "{x}");
            x -= 1.0 / 512.0 + x.abs() * 1e-3;
        }
        assert_eq!(exp(-88.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
    }
}
