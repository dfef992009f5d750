//! [`super::attend_rows`]'s scores and exponentials in AVX2 intrinsics (the compiler keeps the
//! portable versions' arrays on the stack): the same operations, lane for lane.
//!
//! - A dot product's eight lane sums are one register; four keys' registers are reduced at
//!   once: `lo + hi` gives (l0 + l4, l1 + l5, l2 + l6, l3 + l7) and two horizontal adds give
//!   ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)), [`crate::ops::dot`]'s tree.
//! - [`super::expf8`]'s steps with compares and blends for its branches.

use std::arch::x86_64::*;

use super::{HALF, INV_LN2, LANES, LN2_HI, LN2_LO, P1, P2};

/// score\[g * n + j\] = dot(query_g, key_j) * scale for every query and key (module docs):
/// up to three queries at a time against each quad of keys, so a key is loaded once for them and
/// twelve independent sums are in flight.
#[target_feature(enable = "avx2")]
pub(super) fn scores(queries: &[&[f32]], keys: &[&[f32]], scale: f32, scores: &mut [f32]) {
    let n = keys.len();
    let mut first = 0;
    for group in queries.chunks(3) {
        let out = &mut scores[first * n..(first + group.len()) * n];
        match group {
            [a] => scores_of::<1>([a], keys, scale, out),
            [a, b] => scores_of::<2>([a, b], keys, scale, out),
            [a, b, c] => scores_of::<3>([a, b, c], keys, scale, out),
            _ => unreachable!("chunks of one to three"),
        }
        first += group.len();
    }
}

/// [`scores`] for `Q` queries; `scores` holds `Q` rows of `keys.len()`.
#[target_feature(enable = "avx2")]
#[inline]
fn scores_of<const Q: usize>(
    queries: [&[f32]; Q],
    keys: &[&[f32]],
    scale: f32,
    scores: &mut [f32],
) {
    let n = keys.len();
    let d = queries[0].len();
    let body = d / LANES * LANES;
    let quads = n / 4 * 4;
    for (quad, k) in keys[..quads].chunks_exact(4).enumerate() {
        let mut acc = [[_mm256_setzero_ps(); 4]; Q];
        for at in (0..body).step_by(LANES) {
            let rows = [
                load(&k[0][at..at + LANES]),
                load(&k[1][at..at + LANES]),
                load(&k[2][at..at + LANES]),
                load(&k[3][at..at + LANES]),
            ];
            for (acc, q) in acc.iter_mut().zip(queries) {
                let x = load(&q[at..at + LANES]);
                for (a, row) in acc.iter_mut().zip(rows) {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(x, row));
                }
            }
        }
        for (g, (acc, q)) in acc.iter().zip(queries).enumerate() {
            let out = &mut scores[g * n + quad * 4..][..4];
            finish_quad(acc.map(|a| fold(a)), q, k, scale, out);
        }
    }
    for (j, k) in keys.iter().enumerate().skip(quads) {
        for (g, q) in queries.iter().enumerate() {
            scores[g * n + j] = crate::ops::dot(q, k) * scale;
        }
    }
}

/// [`scores`] with AVX-512F: two queries share a 512-bit register (query a's eight lanes in the
/// low half, query b's in the high one) against a key loaded into both halves, so a pair of
/// queries costs the operations one query costs with AVX2. Each half keeps its query's own eight
/// lane sums, reduced by [`crate::ops::dot`]'s tree as above. An odd query is paired with itself
/// and its high half is not read.
#[target_feature(enable = "avx2,avx512f")]
pub(super) fn scores_avx512(queries: &[&[f32]], keys: &[&[f32]], scale: f32, scores: &mut [f32]) {
    let n = keys.len();
    let mut first = 0;
    for group in queries.chunks(4) {
        let out = &mut scores[first * n..(first + group.len()) * n];
        match group {
            [a] => scores_of::<1>([a], keys, scale, out),
            [a, b] => pairs_of::<1>([[a, b]], 2, keys, scale, out),
            [a, b, c] => pairs_of::<2>([[a, b], [c, c]], 3, keys, scale, out),
            [a, b, c, d] => pairs_of::<2>([[a, b], [c, d]], 4, keys, scale, out),
            _ => unreachable!("chunks of one to four"),
        }
        first += group.len();
    }
}

/// [`scores_avx512`] for `P` pairs of queries, the first `used` of their `2 P` queries written
/// (`scores` holds `used` rows of `keys.len()`).
#[target_feature(enable = "avx2,avx512f")]
#[inline]
fn pairs_of<const P: usize>(
    pairs: [[&[f32]; 2]; P],
    used: usize,
    keys: &[&[f32]],
    scale: f32,
    scores: &mut [f32],
) {
    let n = keys.len();
    let d = pairs[0][0].len();
    let body = d / LANES * LANES;
    // Each pair's chunks of eight side by side, once per call: [pair][chunk][a's 8, b's 8].
    let mut paired = vec![0f32; P * body * 2];
    for (pair, out) in pairs.iter().zip(paired.chunks_exact_mut((body * 2).max(1))) {
        for (at, out) in (0..body)
            .step_by(LANES)
            .zip(out.chunks_exact_mut(2 * LANES))
        {
            out[..LANES].copy_from_slice(&pair[0][at..at + LANES]);
            out[LANES..].copy_from_slice(&pair[1][at..at + LANES]);
        }
    }
    let quads = n / 4 * 4;
    for (quad, k) in keys[..quads].chunks_exact(4).enumerate() {
        let mut acc = [[_mm512_setzero_ps(); 4]; P];
        for (c, at) in (0..body).step_by(LANES).enumerate() {
            let rows = [
                both_halves(&k[0][at..at + LANES]),
                both_halves(&k[1][at..at + LANES]),
                both_halves(&k[2][at..at + LANES]),
                both_halves(&k[3][at..at + LANES]),
            ];
            for (p, acc) in acc.iter_mut().enumerate() {
                let x = load16(&paired[(p * body + c * LANES) * 2..]);
                for (a, row) in acc.iter_mut().zip(rows) {
                    *a = _mm512_add_ps(*a, _mm512_mul_ps(x, row));
                }
            }
        }
        for g in 0..used {
            // Query g's lanes: the low half of its pair's registers, or the high one.
            let half = |a: __m512| {
                let a = _mm512_castps_pd(a);
                _mm256_castpd_ps(if g % 2 == 0 {
                    _mm512_castpd512_pd256(a)
                } else {
                    _mm512_extractf64x4_pd(a, 1)
                })
            };
            let out = &mut scores[g * n + quad * 4..][..4];
            finish_quad(
                acc[g / 2].map(|a| fold(half(a))),
                pairs[g / 2][g % 2],
                k,
                scale,
                out,
            );
        }
    }
    for (j, k) in keys.iter().enumerate().skip(quads) {
        for g in 0..used {
            scores[g * n + j] = crate::ops::dot(pairs[g / 2][g % 2], k) * scale;
        }
    }
}

/// The eight floats at the start of `x` in both halves of a 512-bit register.
#[target_feature(enable = "avx2,avx512f")]
#[inline]
fn both_halves(x: &[f32]) -> __m512 {
    _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(load(x))))
}

/// Sixteen floats from a slice of at least sixteen.
#[target_feature(enable = "avx512f")]
#[inline]
fn load16(x: &[f32]) -> __m512 {
    assert!(x.len() >= 2 * LANES);
    // SAFETY: sixteen floats are readable at `x` (checked).
    unsafe { _mm512_loadu_ps(x.as_ptr()) }
}

/// [`super::columns`] of [`super::COLUMNS`] columns, sixteen to a register: out\[start + c\]
/// += p_0 * value_0\[start + c\] + ..., each column its own running sum in order.
#[target_feature(enable = "avx2,avx512f")]
pub(super) fn columns_avx512(p: &[f32], values: &[&[f32]], start: usize, out: &mut [f32]) {
    const N: usize = super::COLUMNS;
    const _: () = assert!(N == 64, "four registers of sixteen");
    let out = &mut out[..N];
    let mut acc = [
        load16(&out[0..]),
        load16(&out[16..]),
        load16(&out[32..]),
        load16(&out[48..]),
    ];
    for (&pj, v) in p.iter().zip(values) {
        let v = &v[start..start + N];
        let pj = _mm512_set1_ps(pj);
        for (i, a) in acc.iter_mut().enumerate() {
            *a = _mm512_add_ps(*a, _mm512_mul_ps(pj, load16(&v[16 * i..])));
        }
    }
    for (i, a) in acc.iter().enumerate() {
        // SAFETY: `out` holds N = 64 floats, so sixteen are writable at 16 i.
        unsafe { _mm512_storeu_ps(out[16 * i..].as_mut_ptr(), *a) };
    }
}

/// A dot product's eight lane sums folded to four: (l0 + l4, l1 + l5, l2 + l6, l3 + l7).
#[target_feature(enable = "avx2")]
#[inline]
fn fold(lanes: __m256) -> __m128 {
    _mm_add_ps(
        _mm256_castps256_ps128(lanes),
        _mm256_extractf128_ps(lanes, 1),
    )
}

/// Four keys' scores against `q` from their folded lane sums: two horizontal adds give
/// [`crate::ops::dot`]'s tree, then the tail past the whole chunks of eight in order, then the
/// scale.
#[target_feature(enable = "avx2")]
#[inline]
fn finish_quad(folded: [__m128; 4], q: &[f32], keys: &[&[f32]], scale: f32, out: &mut [f32]) {
    let body = q.len() / LANES * LANES;
    let trees = _mm_hadd_ps(
        _mm_hadd_ps(folded[0], folded[1]),
        _mm_hadd_ps(folded[2], folded[3]),
    );
    let mut sums = [0f32; 4];
    // SAFETY: `sums` holds four floats.
    unsafe { _mm_storeu_ps(sums.as_mut_ptr(), trees) };
    for ((s, sum), row) in out.iter_mut().zip(sums).zip(keys) {
        let mut sum = sum;
        for (x, y) in q[body..].iter().zip(&row[body..]) {
            sum += x * y;
        }
        *s = sum * scale;
    }
}

/// Eight floats from a slice of at least eight.
#[target_feature(enable = "avx2")]
#[inline]
fn load(x: &[f32]) -> __m256 {
    assert!(x.len() >= LANES);
    // SAFETY: eight floats are readable at `x` (checked).
    unsafe { _mm256_loadu_ps(x.as_ptr()) }
}

/// `values[i] = libm::expf(values[i] - max)` over whole chunks of eight ([`super::expf8`]'s
/// arithmetic); `values.len()` must be a multiple of eight.
#[target_feature(enable = "avx2")]
pub(super) fn exp_chunks(values: &mut [f32], max: f32) {
    for chunk in values.chunks_exact_mut(LANES) {
        expf8(chunk, max);
    }
}

#[target_feature(enable = "avx2")]
#[inline]
fn expf8(values: &mut [f32], max: f32) {
    let x = _mm256_sub_ps(load(values), _mm256_set1_ps(max));
    let bits = _mm256_castps_si256(x);
    let h = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fff_ffff));
    let main = _mm256_and_si256(
        _mm256_cmpgt_epi32(h, _mm256_set1_epi32(0x3900_0000)),
        _mm256_cmpgt_epi32(_mm256_set1_epi32(0x42ae_ac50), h),
    );
    if _mm256_movemask_ps(_mm256_castsi256_ps(main)) != 0xff {
        for v in &mut values[..LANES] {
            *v = libm::expf(*v - max);
        }
        return;
    }
    let negative = _mm256_cmpgt_epi32(_mm256_setzero_si256(), bits);
    let half = _mm256_blendv_ps(
        _mm256_set1_ps(HALF[0]),
        _mm256_set1_ps(HALF[1]),
        _mm256_castsi256_ps(negative),
    );
    let k_far = _mm256_cvttps_epi32(_mm256_add_ps(
        _mm256_mul_ps(_mm256_set1_ps(INV_LN2), x),
        half,
    ));
    let k_near = _mm256_blendv_epi8(_mm256_set1_epi32(1), _mm256_set1_epi32(-1), negative);
    let far = _mm256_cmpgt_epi32(h, _mm256_set1_epi32(0x3f85_1592));
    let near = _mm256_cmpgt_epi32(h, _mm256_set1_epi32(0x3eb1_7218));
    let k = _mm256_blendv_epi8(_mm256_and_si256(near, k_near), k_far, far);
    let kf = _mm256_cvtepi32_ps(k);
    let hi = _mm256_sub_ps(x, _mm256_mul_ps(kf, _mm256_set1_ps(LN2_HI)));
    let lo = _mm256_mul_ps(kf, _mm256_set1_ps(LN2_LO));
    let r = _mm256_sub_ps(hi, lo);
    let rr = _mm256_mul_ps(r, r);
    let c = _mm256_sub_ps(
        r,
        _mm256_mul_ps(
            rr,
            _mm256_add_ps(_mm256_set1_ps(P1), _mm256_mul_ps(rr, _mm256_set1_ps(P2))),
        ),
    );
    let quotient = _mm256_div_ps(_mm256_mul_ps(r, c), _mm256_sub_ps(_mm256_set1_ps(2.0), c));
    let y = _mm256_add_ps(
        _mm256_set1_ps(1.0),
        _mm256_add_ps(_mm256_sub_ps(quotient, lo), hi),
    );
    let two_k = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_add_epi32(k, _mm256_set1_epi32(0x7f)),
        23,
    ));
    // SAFETY: eight floats are writable at `values` (`load` checked the length).
    unsafe { _mm256_storeu_ps(values.as_mut_ptr(), _mm256_mul_ps(y, two_k)) };
}
