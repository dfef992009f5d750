//! Groups of 8 along rows (the feature axis of a standard array), sixteen groups at a time, for
//! CPUs with AVX-512 BW and VBMI, at widths of 1 to 7 bits (8-bit codes stay on AVX2's loop,
//! which measured faster).
//!
//! The 16 groups (128 floats) are transposed as two 8 x 8 blocks with AVX2's shuffles and
//! joined, so that lane i of vector j is group i's value j; the fit is then a lane-wise
//! min/max tree over the 8 vectors, and the parameters are AVX2's `asymmetric8` and
//! `symmetric8` on each half (the same bits, which the tests hold to the scalar rule). Each
//! vector's codes narrow to 16 bytes; one VBMI byte permutation of those 128 bytes puts each
//! group's 8 codes in a 64-bit lane, which is squeezed to its 8B-bit run (the shifts of
//! AVX2's `squeeze4`, 512 bits wide) and a second permutation packs the 8 runs end to end, so
//! the 16 groups' codes leave in two masked stores of exactly 8B bytes each.
//!
//! Why 16 at a time: on AMD's Zen 4 each 512-bit operation issues as one but runs as two
//! 256-bit halves, so the arithmetic costs what AVX2's does, while each group's chain of
//! dependent steps (load, transpose, fit, two divisions for the parameters, one for the codes,
//! pack) is shared by twice the groups and the out-of-order window holds twice the work. AVX2's
//! loop of 8 groups was bound by that chain, not by memory (see docs/speed.md). The same
//! kernel down columns (a tile of 8 tokens, 16 columns a block, no transpose needed) measured
//! no faster than AVX2's from memory, so the token axis keeps AVX2's loop at groups of 8.

use core::arch::x86_64::*;

use super::{Quant16, codes16, halves, join, join_quant};
use crate::fast::Fit;
use crate::fast::avx2::fit::{asymmetric8, prefetch, symmetric8};
use crate::fast::avx2::pack::{pair_multiplier, quad_multiplier};
use crate::fast::avx2::vectors::{load, transpose8};

/// Values per call: 16 groups of 8.
const VALUES: usize = 128;

/// Fits, quantizes and packs 16 whole groups of 8 at B < 8 bits (see
/// [`Kernels::fit_quantize_pack8`]): the
/// 16 scales into `scales`, the zero points into `zero_points` (asymmetric; else empty), and
/// exactly `16 * B` bytes of codes into `out`. False, with any of them written, when some value
/// is not finite or some scale overflows.
///
/// [`Kernels::fit_quantize_pack8`]: crate::fast::Kernels::fit_quantize_pack8
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
pub(super) fn fit_quantize_pack16x8<const B: u32>(
    values: &[f32],
    fit: Fit,
    scales: &mut [f32],
    zero_points: &mut [u8],
    out: &mut [u8],
) -> bool {
    debug_assert!(B < 8, "8-bit codes take AVX2's loop");
    let values: &[f32; VALUES] = values[..VALUES].try_into().expect("16 groups of 8");
    prefetch(values);
    let (blocks, _) = values.as_chunks::<8>();
    let mut first: [__m256; 8] = std::array::from_fn(|j| load(&blocks[j]));
    let mut second: [__m256; 8] = std::array::from_fn(|j| load(&blocks[8 + j]));
    transpose8(&mut first);
    transpose8(&mut second);
    // Lane i of x[j]: group i's value j.
    let x: [__m512; 8] = std::array::from_fn(|j| join(first[j], second[j]));
    let mut bad = _mm512_setzero_si512();
    for &v in &x {
        bad = _mm512_or_si512(bad, _mm512_castps_si512(_mm512_sub_ps(v, v)));
    }
    let Some(q) = params16(fit, &x) else {
        return false;
    };
    if _mm512_test_epi32_mask(bad, bad) != 0 {
        return false;
    }
    let scales: &mut [f32; 16] = (&mut scales[..16]).try_into().expect("16 scales");
    // SAFETY: writes exactly the 16 floats of `scales`.
    unsafe { _mm512_storeu_ps(scales.as_mut_ptr(), q.scale) };
    if let Fit::Asymmetric(_) = fit {
        let zeros: &mut [u8; 16] = (&mut zero_points[..16]).try_into().expect("16 zero points");
        // SAFETY: writes exactly the 16 bytes of `zeros` (each offset is 0..=255).
        unsafe { _mm_storeu_si128(zeros.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(q.offset)) };
    }
    // Row j's 16 codes as bytes, rows 0-3 in `top` and 4-7 in `bottom` (16 bytes each).
    let c: [__m128i; 8] = std::array::from_fn(|j| _mm512_cvtepi32_epi8(codes16(x[j], &q)));
    let top = quarters(c[0], c[1], c[2], c[3]);
    let bottom = quarters(c[4], c[5], c[6], c[7]);
    let b = B as usize;
    let out: &mut [u8] = &mut out[..16 * b];
    for half in 0..2 {
        let lanes = _mm512_permutex2var_epi8(top, table(&GROUP_LANES[half]), bottom);
        let runs = squeeze16::<B>(lanes);
        let to = out[8 * b * half..][..8 * b].as_mut_ptr();
        // SAFETY: each store writes the 8B bytes from `to`, inside `out`.
        unsafe {
            let packed = _mm512_permutexvar_epi8(table(&EndToEnd::<B>::TABLE), runs);
            _mm512_mask_storeu_epi8(to.cast(), (1u64 << (8 * b)) - 1, packed);
        }
    }
    true
}

/// The lane-wise fitted range of 8 vectors, (min, max) with 0 when asymmetric, (0, max |x|)
/// when symmetric.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
fn fit16(fit: Fit, x: &[__m512; 8]) -> (__m512, __m512) {
    match fit {
        Fit::Symmetric(_) => {
            let magnitude = _mm512_set1_epi32(i32::MAX);
            let abs: [__m512; 8] = std::array::from_fn(|j| {
                _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x[j]), magnitude))
            });
            (_mm512_setzero_ps(), tree_max(&abs))
        }
        Fit::Asymmetric(_) => (tree_min(x), tree_max(x)),
    }
}

/// The parameters of 16 groups, lane i from the values in lane i of `x` (fits start at 0, as
/// the per-group fit's), or `None` when some scale overflows.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
fn params16(fit: Fit, x: &[__m512; 8]) -> Option<Quant16> {
    let (lo, hi) = fit16(fit, x);
    let (lo, hi) = (halves(lo), halves(hi));
    match fit {
        Fit::Symmetric(qmax) => Some(join_quant(&symmetric8(hi.0, qmax), &symmetric8(hi.1, qmax))),
        Fit::Asymmetric(levels) => {
            let (first, finite_first) = asymmetric8(lo.0, hi.0, levels);
            let (second, finite_second) = asymmetric8(lo.1, hi.1, levels);
            let finite = _mm256_movemask_ps(_mm256_and_ps(finite_first, finite_second));
            (finite == 0xFF).then(|| join_quant(&first, &second))
        }
    }
}

// The fits below reduce as a tree (three steps deep, not eight). For finite values min and max
// give the same result in any order (but for the sign of a zero, which no parameter depends
// on); a non-finite value is refused by the caller anyway.

/// Lane-wise max of 0 and the 8 vectors.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
fn tree_max(m: &[__m512; 8]) -> __m512 {
    let pairs = [
        _mm512_max_ps(m[0], m[1]),
        _mm512_max_ps(m[2], m[3]),
        _mm512_max_ps(m[4], m[5]),
        _mm512_max_ps(m[6], m[7]),
    ];
    let all = _mm512_max_ps(
        _mm512_max_ps(pairs[0], pairs[1]),
        _mm512_max_ps(pairs[2], pairs[3]),
    );
    _mm512_max_ps(_mm512_setzero_ps(), all)
}

/// Lane-wise min of 0 and the 8 vectors.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
fn tree_min(m: &[__m512; 8]) -> __m512 {
    let pairs = [
        _mm512_min_ps(m[0], m[1]),
        _mm512_min_ps(m[2], m[3]),
        _mm512_min_ps(m[4], m[5]),
        _mm512_min_ps(m[6], m[7]),
    ];
    let all = _mm512_min_ps(
        _mm512_min_ps(pairs[0], pairs[1]),
        _mm512_min_ps(pairs[2], pairs[3]),
    );
    _mm512_min_ps(_mm512_setzero_ps(), all)
}

/// Four 16-byte vectors as one, `a` lowest.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
fn quarters(a: __m128i, b: __m128i, c: __m128i, d: __m128i) -> __m512i {
    let v = _mm512_castsi128_si512(a);
    let v = _mm512_inserti32x4::<1>(v, b);
    let v = _mm512_inserti32x4::<2>(v, c);
    _mm512_inserti32x4::<3>(v, d)
}

/// Byte permutations that gather groups `8 * half..8 * half + 8` from rows 0-3 (`top`, indices
/// 0..64: row j's group i at 16j + i) and rows 4-7 (`bottom`, 64..128): output byte 8i + j is
/// group (8 * half + i)'s code j.
const GROUP_LANES: [[u8; 64]; 2] = [group_lanes(0), group_lanes(1)];

const fn group_lanes(half: usize) -> [u8; 64] {
    let mut table = [0u8; 64];
    let mut p = 0;
    while p < 64 {
        let (i, j) = (8 * half + p / 8, p % 8);
        table[p] = (if j < 4 {
            16 * j + i
        } else {
            64 + 16 * (j - 4) + i
        }) as u8;
        p += 1;
    }
    table
}

/// The byte permutation that moves each 64-bit lane's first B bytes (its squeezed run) end to
/// end: output byte k < 8B is lane k / B's byte k % B.
struct EndToEnd<const B: u32>;

impl<const B: u32> EndToEnd<B> {
    const TABLE: [u8; 64] = {
        let b = B as usize;
        let mut table = [0u8; 64];
        let mut k = 0;
        while k < 8 * b {
            table[k] = (k / b * 8 + k % b) as u8;
            k += 1;
        }
        table
    };
}

/// The 64 bytes of `table` as a vector.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
fn table(table: &[u8; 64]) -> __m512i {
    // SAFETY: reads the 64 bytes of `table`.
    unsafe { _mm512_loadu_si512(table.as_ptr().cast()) }
}
/// Each 64-bit lane's eight byte codes (< 2^B) moved to its low 8B bits: AVX2's `squeeze4`,
/// 512 bits wide.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
fn squeeze16<const B: u32>(v: __m512i) -> __m512i {
    let pairs = if B <= 6 {
        _mm512_maddubs_epi16(v, _mm512_set1_epi16(pair_multiplier(B)))
    } else {
        // At 7 bits the multiplier 2^7 does not fit maddubs's signed bytes.
        let low = _mm512_and_si512(v, _mm512_set1_epi16(0x00FF));
        let high = _mm512_and_si512(v, _mm512_set1_epi16(0xFF00u16 as i16));
        _mm512_or_si512(low, _mm512_srli_epi16::<1>(high))
    };
    let quads = _mm512_madd_epi16(pairs, _mm512_set1_epi32(quad_multiplier(B)));
    let low = _mm512_and_si512(quads, _mm512_set1_epi64(0xFFFF_FFFF));
    let high = _mm512_srli_epi64::<32>(quads);
    _mm512_or_si512(low, _mm512_sll_epi64(high, _mm_cvtsi32_si128(4 * B as i32)))
}
