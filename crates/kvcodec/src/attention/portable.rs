//! The block kernels in plain Rust, one value at a time: the spec's steps 3 to 6 as written
//! (see the module comment of [`super`]). The AVX2 kernels compute each value with the same
//! operations in the same order, eight tokens or features to a vector. Multiply-adds are
//! [`super::fma::fma`], rounded once in integer arithmetic on every platform.

use super::exp::exp;
use super::fma::fma as fmaf;
use super::{
    BLOCK_TOKENS, DenseHead, K_GROUP_MULTIPLE, LANES, PASS_TOKENS, PackedHead, Scratch, Stream,
    read_code, tree_sum,
};

/// The stored code at element `at` of a tensor's grouped view.
#[inline]
fn code<const B: u32>(stream: &Stream, at: usize) -> i32 {
    read_code(stream.codes, at, B)
}

/// Step 3 over a packed K: scores of tokens t0.. for every query into `s.pass_scores`, for the
/// pass's tokens rounded up to whole 32-token runs (the padded K row holds them).
pub(crate) fn packed_scores<const B: u32>(
    head: &PackedHead,
    scaled: &[f32],
    q: usize,
    t0: usize,
    len: usize,
    s: &mut Scratch,
) {
    let k = &head.k;
    let d_count = head.features;
    let first = t0 / k.group_size;
    let pass_groups = (t0 + len).div_ceil(k.group_size) - first;
    s.pass_scores.resize(q * PASS_TOKENS, 0.0);
    for j in 0..len.next_multiple_of(K_GROUP_MULTIPLE) {
        let t = t0 + j;
        let g = t / k.group_size - first;
        for i in 0..q {
            let mut sum = 0f32;
            for d in 0..d_count {
                let c = code::<B>(k, d * k.row_len + t) - s.k_offsets[d * pass_groups + g];
                let w = scaled[i * d_count + d] * k.scales[d * k.groups_per_row + first + g];
                sum = fmaf(c as f32, w, sum);
            }
            s.pass_scores[i * PASS_TOKENS + j] = sum;
        }
    }
}

/// Step 6 over a packed V: adds tokens t0..t0 + len into `acc` [Q][D].
pub(crate) fn packed_accumulate<const B: u32>(
    head: &PackedHead,
    q: usize,
    t0: usize,
    len: usize,
    s: &Scratch,
    acc: &mut [f32],
) {
    let v = &head.v;
    let d_count = head.features;
    let groups = v.groups_per_row;
    for j in 0..len {
        let t = t0 + j;
        for d in 0..d_count {
            let h = d / v.group_size;
            let c = (code::<B>(v, t * v.row_len + d) - s.v_offsets[j * groups + h]) as f32;
            for i in 0..q {
                let w = s.v_weights[(i * BLOCK_TOKENS + j) * groups + h];
                acc[i * d_count + d] = fmaf(c, w, acc[i * d_count + d]);
            }
        }
    }
}

/// Step 3 over an unpacked K: `qs[i][d] * K[t][d]` into lane d mod 8, lanes added as a tree.
pub(crate) fn dense_scores(
    head: &DenseHead,
    scaled: &[f32],
    q: usize,
    t0: usize,
    len: usize,
    scores: &mut [f32],
) {
    let d_count = head.features;
    for j in 0..len {
        let row = &head.k[(t0 + j) * d_count..][..d_count];
        for i in 0..q {
            let qs = &scaled[i * d_count..][..d_count];
            let mut lanes = [0f32; LANES];
            for (d, (&x, &y)) in qs.iter().zip(row).enumerate() {
                lanes[d % LANES] = fmaf(x, y, lanes[d % LANES]);
            }
            scores[i * BLOCK_TOKENS + j] = tree_sum(lanes);
        }
    }
}

/// Step 6 over an unpacked V: `acc[i][d] += V[t][d] * p[i][t]`, token by token.
pub(crate) fn dense_accumulate(
    head: &DenseHead,
    q: usize,
    t0: usize,
    len: usize,
    p: &[f32],
    acc: &mut [f32],
) {
    let d_count = head.features;
    for j in 0..len {
        let row = &head.v[(t0 + j) * d_count..][..d_count];
        for i in 0..q {
            let w = p[i * BLOCK_TOKENS + j];
            for (a, &x) in acc[i * d_count..][..d_count].iter_mut().zip(row) {
                *a = fmaf(x, w, *a);
            }
        }
    }
}

/// Steps 4 and 5: weights in place and the eight lane sums.
pub(crate) fn weights(scores: &mut [f32], seen: usize, m: f32) -> [f32; LANES] {
    let mut lanes = [0f32; LANES];
    for (t, s) in scores.iter_mut().enumerate() {
        *s = if t < seen { exp(*s - m) } else { 0.0 };
        lanes[t % LANES] += *s;
    }
    lanes
}
