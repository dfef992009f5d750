//! The attention block kernels (steps 3 and 6 of [`crate::attention`]) with AVX2: eight tokens
//! (scores) or eight features (values) to a vector. Each lane computes what the portable
//! kernel computes for its token or feature, with the same f32 operations in the same order
//! (multiply, then add: no fused multiply-add), so both give the same bits.

use core::arch::x86_64::*;

use super::Avx2;
use super::unpack::{Unpack, broadcast_codes};
use super::vectors::{load_at, store};
use crate::attention::{BLOCK_TOKENS, DenseHead, K_GROUP_MULTIPLE, LANES, PackedHead, Scratch};

/// Step 3 over a packed K, 32 tokens (one group's run, since K groups are multiples of 32) and
/// up to two queries at a time, their accumulators in registers across all D features.
#[target_feature(enable = "avx2")]
pub(crate) fn packed_scores<const B: u32>(
    _: Avx2,
    head: &PackedHead,
    q: usize,
    t0: usize,
    len: usize,
    s: &mut Scratch,
) {
    let k = &head.k;
    let d_count = head.features;
    let first = t0 / k.group_size;
    let unpack = Unpack::new::<B>();
    for run in (0..len).step_by(K_GROUP_MULTIPLE) {
        let t = t0 + run;
        let g = t / k.group_size - first;
        let keys = Keys {
            codes: k.codes,
            row_len: k.row_len,
            t,
            weights: &s.k_weights[g * d_count * q..][..d_count * q],
            offsets: &s.k_offsets[g * d_count..][..d_count],
            queries: q,
        };
        let mut i = 0;
        while i < q {
            if q - i >= 2 {
                run_scores::<B, 2>(&unpack, &keys, i, run, &mut s.scores);
                i += 2;
            } else {
                run_scores::<B, 1>(&unpack, &keys, i, run, &mut s.scores);
                i += 1;
            }
        }
    }
}

/// One 32-token run of a packed K, and its block's weights and offsets.
struct Keys<'a> {
    codes: &'a [u8],
    row_len: usize,
    t: usize,
    weights: &'a [f32],
    offsets: &'a [i32],
    queries: usize,
}

#[inline]
#[target_feature(enable = "avx2")]
fn run_scores<const B: u32, const N: usize>(
    unpack: &Unpack,
    keys: &Keys,
    i0: usize,
    run: usize,
    scores: &mut [f32],
) {
    let b = B as usize;
    let mut acc = [[_mm256_setzero_ps(); 4]; N];
    for (d, &offset) in keys.offsets.iter().enumerate() {
        let offset = _mm256_set1_epi32(offset);
        // A multiple of 8: rows are whole groups and runs start at multiples of 32.
        let base = d * keys.row_len + keys.t;
        let mut c = [_mm256_setzero_ps(); 4];
        for (u, c) in c.iter_mut().enumerate() {
            let codes = unpack.spread(broadcast_codes(keys.codes, (base + 8 * u) * b / 8));
            *c = _mm256_cvtepi32_ps(_mm256_sub_epi32(codes, offset));
        }
        for (n, acc) in acc.iter_mut().enumerate() {
            let w = _mm256_set1_ps(keys.weights[d * keys.queries + i0 + n]);
            for (a, &c) in acc.iter_mut().zip(&c) {
                *a = _mm256_add_ps(*a, _mm256_mul_ps(c, w));
            }
        }
    }
    for (n, acc) in acc.iter().enumerate() {
        let row = &mut scores[(i0 + n) * BLOCK_TOKENS + run..][..K_GROUP_MULTIPLE];
        for (dst, &a) in row.as_chunks_mut::<LANES>().0.iter_mut().zip(acc) {
            store(dst, a);
        }
    }
}

/// Step 6 over a packed V, four tokens at a time: their codes unpacked once per eight
/// features, then added into every query's accumulator in token order.
#[target_feature(enable = "avx2")]
pub(crate) fn packed_accumulate<const B: u32>(
    _: Avx2,
    head: &PackedHead,
    q: usize,
    t0: usize,
    len: usize,
    s: &Scratch,
    acc: &mut [f32],
) {
    let unpack = Unpack::new::<B>();
    let mut j = 0;
    while j < len {
        if len - j >= 4 {
            tokens_accumulate::<B, 4>(&unpack, head, q, t0, j, s, acc);
            j += 4;
        } else {
            tokens_accumulate::<B, 1>(&unpack, head, q, t0, j, s, acc);
            j += 1;
        }
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn tokens_accumulate<const B: u32, const N: usize>(
    unpack: &Unpack,
    head: &PackedHead,
    q: usize,
    t0: usize,
    j: usize,
    s: &Scratch,
    acc: &mut [f32],
) {
    let v = &head.v;
    let b = B as usize;
    let d_count = head.features;
    let groups = v.groups_per_row;
    for f in (0..d_count).step_by(LANES) {
        let h = f / v.group_size;
        let mut c = [_mm256_setzero_ps(); N];
        for (n, c) in c.iter_mut().enumerate() {
            // A multiple of 8: rows are whole groups of a multiple of 8 features.
            let at = ((t0 + j + n) * v.row_len + f) * b / 8;
            let offset = _mm256_set1_epi32(s.v_offsets[(j + n) * groups + h]);
            *c = _mm256_cvtepi32_ps(_mm256_sub_epi32(
                unpack.spread(broadcast_codes(v.codes, at)),
                offset,
            ));
        }
        for i in 0..q {
            let at = i * d_count + f;
            let mut a = load_at(acc, at);
            for (n, &c) in c.iter().enumerate() {
                let w = s.v_weights[(i * BLOCK_TOKENS + j + n) * groups + h];
                a = _mm256_add_ps(a, _mm256_mul_ps(c, _mm256_set1_ps(w)));
            }
            store((&mut acc[at..at + LANES]).try_into().expect("8 floats"), a);
        }
    }
}

/// Step 3 over an unpacked K, four tokens at a time per query.
#[target_feature(enable = "avx2")]
pub(crate) fn dense_scores(
    _: Avx2,
    head: &DenseHead,
    scaled: &[f32],
    q: usize,
    t0: usize,
    len: usize,
    scores: &mut [f32],
) {
    let mut j = 0;
    while j < len {
        if len - j >= 4 {
            dense_tokens::<4>(head, scaled, q, t0 + j, &mut scores[j..]);
            j += 4;
        } else {
            dense_tokens::<1>(head, scaled, q, t0 + j, &mut scores[j..]);
            j += 1;
        }
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn dense_tokens<const N: usize>(
    head: &DenseHead,
    scaled: &[f32],
    q: usize,
    t: usize,
    scores: &mut [f32],
) {
    let d_count = head.features;
    for i in 0..q {
        let mut acc = [_mm256_setzero_ps(); N];
        for f in (0..d_count).step_by(LANES) {
            let x = load_at(scaled, i * d_count + f);
            for (n, a) in acc.iter_mut().enumerate() {
                let y = load_at(head.k, (t + n) * d_count + f);
                *a = _mm256_add_ps(*a, _mm256_mul_ps(x, y));
            }
        }
        for (n, &a) in acc.iter().enumerate() {
            let mut lanes = [0f32; LANES];
            store(&mut lanes, a);
            scores[i * BLOCK_TOKENS + n] = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
                + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
        }
    }
}

/// Step 6 over an unpacked V, four tokens at a time.
#[target_feature(enable = "avx2")]
pub(crate) fn dense_accumulate(
    _: Avx2,
    head: &DenseHead,
    q: usize,
    t0: usize,
    len: usize,
    p: &[f32],
    acc: &mut [f32],
) {
    let d_count = head.features;
    let mut j = 0;
    while j < len {
        let n_count = if len - j >= 4 { 4 } else { 1 };
        for i in 0..q {
            for f in (0..d_count).step_by(LANES) {
                let at = i * d_count + f;
                let mut a = load_at(acc, at);
                for n in 0..n_count {
                    let x = load_at(head.v, (t0 + j + n) * d_count + f);
                    let w = _mm256_set1_ps(p[i * BLOCK_TOKENS + j + n]);
                    a = _mm256_add_ps(a, _mm256_mul_ps(x, w));
                }
                store((&mut acc[at..at + LANES]).try_into().expect("8 floats"), a);
            }
        }
        j += n_count;
    }
}
