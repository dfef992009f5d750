//! What the float32 cache looks like: the mechanisms the literature gives for why keys quantize
//! worse than values (outlier channels, keys that carry a per-channel offset) and why the first
//! tokens matter (attention sinks), measured on each text's float32 pass when a protocol asks for
//! `mechanisms`.
//!
//! For layer l and KV head h of a text of T positions (keys `[kv_heads, T, head_dim]`):
//!
//! - **key outlier ratio**, before RoPE (`LayerKv::k_pre_rope`, the projection's output) and
//!   after it (the keys a cache stores): per channel c, `rms_c = sqrt(s_c / T)`, `s_c` the sum
//!   over positions in order of `k[c]^2` in f64; the ratio is `max_c rms_c / median_c rms_c`,
//!   the median NumPy's (the mean of the two middle values when `head_dim` is even);
//! - **key energy in channel means** (the stored keys): `sum_c m_c^2 / sum_c (s_c / T)`, `m_c`
//!   the sum over positions in order of `k[c]` in f64, over T, both sums over channels in order:
//!   the share of the keys' mean square that a per-channel offset carries (near 0 for zero-mean
//!   noise, 1 for keys that never move);
//! - **first-token attention**: for each query head that reads h (`h * g` to `h * g + g - 1`,
//!   g query heads per KV head) and each query position i from 1 to T - 1, the weight query i
//!   gives position 0, scored as [`crate::attention_error`] scores (the f64 dot product over
//!   features in order times `1 / sqrt(head_dim)`; weights `exp(s_j - max s)` with `libm::exp`
//!   over their sum in position order), 0 where a sliding layer's window no longer reaches
//!   position 0; the measure sums each head's weights over positions in order, then the heads in
//!   order, and divides by `g (T - 1)`.
//!
//! arrays.npz holds each text's measures as `t{i}_mechanisms`, float64
//! `[layers, kv_heads, 4]` in the order above ([`MEASURES`]); summary.json's `mechanisms` holds
//! their mean over the texts (summed in text order) per layer and head, and summary.md a table
//! with a row per layer, each cell the mean over the layer's heads (summed in head order).

use models::llama::LayerKv;
use ndarray::Array3;
use rayon::ThreadPool;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// The measures of a layer's KV head, in array order.
pub const MEASURES: [&str; 4] = [
    "key_outlier_before_rope",
    "key_outlier_after_rope",
    "key_mean_energy",
    "first_token_attention",
];

/// One KV head's measures, in [`MEASURES`] order.
pub type HeadMeasures = [f64; 4];

/// Per channel, the sum over positions in order of x and of x^2, in f64.
fn channel_sums(keys: &Array3<f32>, head: usize) -> (Vec<f64>, Vec<f64>) {
    let (_, tokens, dim) = keys.dim();
    let mut sum = vec![0f64; dim];
    let mut squares = vec![0f64; dim];
    for t in 0..tokens {
        for c in 0..dim {
            let x = f64::from(keys[[head, t, c]]);
            sum[c] += x;
            squares[c] += x * x;
        }
    }
    (sum, squares)
}

/// NumPy's median of `values` (sorted in place): the middle one, or the mean of the two.
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Max over median of the channels' RMS of head `head` (module docs).
fn outlier_ratio(keys: &Array3<f32>, head: usize) -> f64 {
    let tokens = keys.dim().1 as f64;
    let (_, squares) = channel_sums(keys, head);
    let mut rms: Vec<f64> = squares.iter().map(|s| (s / tokens).sqrt()).collect();
    let max = rms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    max / median(&mut rms)
}

/// The share of the stored keys' mean square in their per-channel means (module docs).
fn mean_energy(keys: &Array3<f32>, head: usize) -> f64 {
    let tokens = keys.dim().1 as f64;
    let (sum, squares) = channel_sums(keys, head);
    let means = sum
        .iter()
        .fold(0f64, |a, s| a + (s / tokens) * (s / tokens));
    let total = squares.iter().fold(0f64, |a, s| a + s / tokens);
    means / total
}

/// Keys scored at once by [`scores_of`]: one running sum each, side by side in vector lanes.
const KEY_BLOCK: usize = 32;

/// Query head `q`'s weights on position 0, summed over query positions 1..T in order.
///
/// The scores are the module docs' (each a sum over features in order), [`KEY_BLOCK`] keys at a
/// time from an f64 copy of the head's keys stored feature by feature: the sums are independent,
/// so they run side by side in vector lanes without changing any one's order
/// ([`first_token_weights_plain`] in the tests is the plain loop, and gives the same bits). At
/// 8,192 tokens this is 33.5 M scores per head.
fn first_token_weights(kv: &LayerKv<'_>, q: usize, kv_head: usize, window: Option<usize>) -> f64 {
    let (_, tokens, dim) = kv.q.dim();
    let scale = 1.0 / (dim as f64).sqrt();
    let queries: Vec<f64> =
        kv.q.slice(ndarray::s![q, .., ..])
            .iter()
            .map(|&x| f64::from(x))
            .collect();
    // keys_t[f * tokens + j]: feature f of position j.
    let keys_t: Vec<f64> =
        kv.k.slice(ndarray::s![kv_head, .., ..])
            .t()
            .iter()
            .map(|&x| f64::from(x))
            .collect();
    let mut total = 0f64;
    let mut scores = Vec::with_capacity(tokens);
    for i in 1..tokens {
        // A sliding layer's query i reads positions past i - W only.
        if window.is_some_and(|w| i >= w) {
            continue;
        }
        let query = &queries[i * dim..(i + 1) * dim];
        scores.clear();
        scores.resize(i + 1, 0.0);
        scores_of(query, (&keys_t, tokens), scale, &mut scores);
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z = scores.iter().fold(0f64, |a, &s| a + libm::exp(s - max));
        total += libm::exp(scores[0] - max) / z;
    }
    total
}

/// scores\[j\] = (query · key j) * scale for the first `scores.len()` keys of `keys_t`
/// (feature-major, `tokens` keys per feature), each dot product summed over features in order:
/// with AVX-512F or AVX2 where the CPU has them (the same code, compiled for wider registers),
/// else as plain Rust.
fn scores_of(query: &[f64], keys_t: (&[f64], usize), scale: f64, scores: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f")]
        fn avx512(query: &[f64], keys_t: (&[f64], usize), scale: f64, scores: &mut [f64]) {
            scores_body(query, keys_t, scale, scores);
        }
        #[target_feature(enable = "avx2")]
        fn avx2(query: &[f64], keys_t: (&[f64], usize), scale: f64, scores: &mut [f64]) {
            scores_body(query, keys_t, scale, scores);
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: this CPU has AVX-512F (checked just above).
            return unsafe { avx512(query, keys_t, scale, scores) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: this CPU has AVX2 (checked just above).
            return unsafe { avx2(query, keys_t, scale, scores) };
        }
    }
    scores_body(query, keys_t, scale, scores);
}

#[inline(always)]
fn scores_body(query: &[f64], (keys_t, tokens): (&[f64], usize), scale: f64, scores: &mut [f64]) {
    let n = scores.len();
    let whole = n / KEY_BLOCK * KEY_BLOCK;
    for (block, out) in scores[..whole].chunks_exact_mut(KEY_BLOCK).enumerate() {
        let first = block * KEY_BLOCK;
        let mut sums = [0f64; KEY_BLOCK];
        for (f, &x) in query.iter().enumerate() {
            let keys = &keys_t[f * tokens + first..][..KEY_BLOCK];
            for (sum, &k) in sums.iter_mut().zip(keys) {
                *sum += x * k;
            }
        }
        for (o, sum) in out.iter_mut().zip(sums) {
            *o = sum * scale;
        }
    }
    for (j, o) in scores.iter_mut().enumerate().skip(whole) {
        let mut sum = 0f64;
        for (f, &x) in query.iter().enumerate() {
            sum += x * keys_t[f * tokens + j];
        }
        *o = sum * scale;
    }
}

/// One layer's measures per KV head (module docs); the query heads run on `pool`, and their
/// sums are added in head order, so the result does not depend on the thread count.
pub fn layer(kv: &LayerKv<'_>, window: Option<usize>, pool: &ThreadPool) -> Vec<HeadMeasures> {
    let kv_heads = kv.k.dim().0;
    let (heads, tokens, _) = kv.q.dim();
    let group = (heads / kv_heads.max(1)).max(1);
    let weights: Vec<f64> = pool.install(|| {
        (0..heads)
            .into_par_iter()
            .map(|q| first_token_weights(kv, q, q / group, window))
            .collect()
    });
    (0..kv_heads)
        .map(|h| {
            let sink = weights[h * group..(h + 1) * group]
                .iter()
                .fold(0f64, |a, w| a + w)
                / (group * (tokens - 1)) as f64;
            [
                outlier_ratio(kv.k_pre_rope, h),
                outlier_ratio(kv.k, h),
                mean_energy(kv.k, h),
                sink,
            ]
        })
        .collect()
}

/// summary.json's `mechanisms`: per layer and KV head, the mean over the texts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MechanismSummary {
    /// The measures' names, in the order of each head's values.
    pub measures: Vec<String>,
    /// Per layer, per KV head, the measures' means over the texts.
    pub layers: Vec<Vec<HeadMeasures>>,
}

/// The mean over `texts` (each per layer, per head), summed in text order.
pub fn summarize(texts: &[Vec<Vec<HeadMeasures>>]) -> MechanismSummary {
    let n = texts.len() as f64;
    let shape = texts.first().map_or(Vec::new(), |t| {
        t.iter().map(Vec::len).collect::<Vec<usize>>()
    });
    let layers = shape
        .iter()
        .enumerate()
        .map(|(l, &heads)| {
            (0..heads)
                .map(|h| {
                    let mut mean = [0f64; 4];
                    for text in texts {
                        for (m, x) in mean.iter_mut().zip(text[l][h]) {
                            *m += x;
                        }
                    }
                    mean.map(|m| m / n)
                })
                .collect()
        })
        .collect();
    MechanismSummary {
        measures: MEASURES.iter().map(|m| m.to_string()).collect(),
        layers,
    }
}

/// One layer's row of summary.md: each measure's mean over the layer's heads, summed in order.
pub fn layer_means(heads: &[HeadMeasures]) -> HeadMeasures {
    let n = heads.len() as f64;
    let mut mean = [0f64; 4];
    for head in heads {
        for (m, x) in mean.iter_mut().zip(head) {
            *m += x;
        }
    }
    mean.map(|m| m / n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array3, ShapeBuilder};

    fn pool() -> ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap()
    }

    /// The module docs' first-token weights as a plain loop over ndarray indexes.
    fn first_token_weights_plain(
        kv: &LayerKv<'_>,
        q: usize,
        kv_head: usize,
        window: Option<usize>,
    ) -> f64 {
        let (_, tokens, dim) = kv.q.dim();
        let scale = 1.0 / (dim as f64).sqrt();
        let mut total = 0f64;
        for i in 1..tokens {
            if window.is_some_and(|w| i >= w) {
                continue;
            }
            let scores: Vec<f64> = (0..=i)
                .map(|j| {
                    let mut s = 0f64;
                    for f in 0..dim {
                        s += f64::from(kv.q[[q, i, f]]) * f64::from(kv.k[[kv_head, j, f]]);
                    }
                    s * scale
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z = scores.iter().fold(0f64, |a, &s| a + libm::exp(s - max));
            total += libm::exp(scores[0] - max) / z;
        }
        total
    }

    #[test]
    fn blocks_of_keys_give_the_plain_loops_bits() {
        // Random, tie-heavy (a few levels), all-maximum and patterned rows; token counts on both
        // sides of whole blocks; a window; a transposed (non-contiguous) query array.
        let mut rng = nprand::NumpyRng::default_rng(20261206);
        for tokens in [2, 3, 4, 5, 6, 7, 9, 31, 32, 33, 65, 70] {
            for (name, fill) in [("random", 0), ("ties", 1), ("maximum", 2), ("patterned", 3)] {
                let dim = 12;
                let mut draw = |shape: (usize, usize, usize)| {
                    Array3::from_shape_fn(shape, |(h, t, c)| match fill {
                        0 => rng.standard_normal() as f32 * 3.0,
                        1 => [-1.0f32, 0.0, 1.0][(rng.integers(3)) as usize],
                        2 => f32::MAX.sqrt() / 64.0,
                        _ => ((h * 7 + t * 3 + c) % 5) as f32 - 2.0,
                    })
                };
                let k = draw((2, tokens, dim));
                let q_t = draw((4, dim, tokens));
                let q = q_t.view().permuted_axes([0, 2, 1]).to_owned();
                let q_strided = {
                    let mut a = Array3::<f32>::zeros((4, tokens, dim).f());
                    a.assign(&q);
                    a
                };
                for queries in [&q, &q_strided] {
                    let kv = LayerKv::unrotated(queries, &k, &k);
                    for head in 0..4 {
                        for window in [None, Some(3)] {
                            let fast = first_token_weights(&kv, head, head / 2, window);
                            let plain = first_token_weights_plain(&kv, head, head / 2, window);
                            assert_eq!(
                                fast.to_bits(),
                                plain.to_bits(),
                                "{name}, {tokens} tokens, head {head}, {window:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_key_channel_ten_times_the_others_has_an_outlier_ratio_of_ten() {
        // Four channels of RMS 1, 1, 2 and 10: median 1.5 (NumPy's mean of the middle two).
        let k = Array3::from_shape_fn((1, 3, 4), |(_, _, c)| [1.0f32, -1.0, 2.0, 10.0][c]);
        assert_eq!(outlier_ratio(&k, 0), 10.0 / 1.5);
    }

    #[test]
    fn keys_that_never_move_are_all_mean_and_alternating_ones_are_none() {
        let constant = Array3::from_shape_fn((1, 4, 2), |_| 3.0f32);
        assert_eq!(mean_energy(&constant, 0), 1.0);
        let alternating =
            Array3::from_shape_fn((1, 4, 2), |(_, t, _)| if t % 2 == 0 { 1.0 } else { -1.0 });
        assert_eq!(mean_energy(&alternating, 0), 0.0);
    }

    #[test]
    fn equal_scores_give_the_first_token_one_share_in_i_plus_one() {
        // Zero queries score every key alike: query i gives position 0 a weight of 1 / (i + 1).
        let (heads, kv_heads, tokens, dim) = (4, 2, 5, 8);
        let q = Array3::<f32>::zeros((heads, tokens, dim));
        let k = Array3::from_shape_fn((kv_heads, tokens, dim), |(h, t, c)| (h + t + c) as f32);
        let v = k.clone();
        let kv = LayerKv::unrotated(&q, &k, &v);
        let measured = layer(&kv, None, &pool());
        let expected = (1..tokens).map(|i| 1.0 / (i + 1) as f64).sum::<f64>() / (tokens - 1) as f64;
        for head in &measured {
            assert!((head[3] - expected).abs() < 1e-15, "{head:?}");
        }
        // Past a window of 3 positions, query 3 and 4 no longer see position 0.
        let windowed = layer(&kv, Some(3), &pool());
        let expected = (0.5 + 1.0 / 3.0) / (tokens - 1) as f64;
        assert!((windowed[0][3] - expected).abs() < 1e-15);
    }

    #[test]
    fn a_query_that_matches_the_first_key_sends_it_almost_all_its_weight() {
        let (tokens, dim) = (6, 4);
        let k = Array3::from_shape_fn(
            (1, tokens, dim),
            |(_, t, c)| {
                if t == 0 && c == 0 { 100.0 } else { 0.0 }
            },
        );
        let q = Array3::from_shape_fn((1, tokens, dim), |(_, _, c)| if c == 0 { 1.0 } else { 0.0 });
        let kv = LayerKv::unrotated(&q, &k, &k);
        let measured = layer(&kv, None, &pool());
        assert!(measured[0][3] > 0.999_999, "{measured:?}");
    }

    #[test]
    fn the_summary_is_the_mean_over_texts_and_the_row_the_mean_over_heads() {
        let a = vec![vec![[1.0, 2.0, 0.5, 0.25], [3.0, 4.0, 0.0, 0.75]]];
        let b = vec![vec![[3.0, 2.0, 0.5, 0.75], [5.0, 6.0, 1.0, 0.25]]];
        let s = summarize(&[a, b]);
        assert_eq!(
            s.layers,
            vec![vec![[2.0, 2.0, 0.5, 0.5], [4.0, 5.0, 0.5, 0.5]]]
        );
        assert_eq!(layer_means(&s.layers[0]), [3.0, 3.5, 0.5, 0.5]);
        assert_eq!(s.measures.len(), 4);
    }
}
