//! Quantizing and packing along rows: codes from floats, eight codes squeezed into 8b bits,
//! whole groups (one at a time or 8 fitted together), and the streaming copy of packed bytes.

use core::arch::x86_64::*;

use super::fit::{Quant, asymmetric8, prefetch, symmetric8};
use super::tables::Tables;
use super::vectors::{all_zero, load, magnitude_mask, non_finite_bits, store, transpose8};
use crate::fast::Fit;
use crate::fast::bits::squeeze;
use crate::fast::params::GroupQuant;

/// Stored codes of 8 values, as i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn codes(x: __m256, q: &Quant) -> __m256i {
    let v = _mm256_min_ps(_mm256_max_ps(_mm256_div_ps(x, q.scale), q.low), q.high);
    _mm256_add_epi32(_mm256_cvtps_epi32(v), q.offset)
}

/// 32 codes (0..=255 in i32 lanes) as bytes, in order.
#[inline]
#[target_feature(enable = "avx2")]
fn pack32(c: [__m256i; 4]) -> __m256i {
    let words = [
        _mm256_packs_epi32(c[0], c[1]),
        _mm256_packs_epi32(c[2], c[3]),
    ];
    // The packs work per 128-bit half: dwords come out as c0[0..4], c1[0..4], c2[0..4],
    // c3[0..4], c0[4..8], ...
    let bytes = _mm256_packus_epi16(words[0], words[1]);
    _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// 8 codes (0..=255 in i32 lanes) as the bytes of a u64.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn pack8(c: __m256i) -> u64 {
    let words = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256::<1>(c));
    _mm_cvtsi128_si64(_mm_packus_epi16(words, words)) as u64
}

/// Each 64-bit lane's eight byte codes (< 2^B) moved to its low 8B bits.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn squeeze4<const B: u32>(v: __m256i) -> __m256i {
    if B == 8 {
        return v;
    }
    // Byte pairs into 16-bit lanes of 2B bits: c0 + c1 * 2^B.
    let pairs = if B <= 6 {
        _mm256_maddubs_epi16(v, _mm256_set1_epi16(pair_multiplier(B)))
    } else {
        // At 7 bits the multiplier 2^7 does not fit maddubs's signed bytes.
        let low = _mm256_and_si256(v, _mm256_set1_epi16(0x00FF));
        let high = _mm256_and_si256(v, _mm256_set1_epi16(0xFF00u16 as i16));
        _mm256_or_si256(low, _mm256_srli_epi16::<1>(high))
    };
    // 16-bit pairs into 32-bit lanes of 4B bits: p0 + p1 * 2^2B.
    let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi32(quad_multiplier(B)));
    // 32-bit pairs into the 64-bit lane: q0 | q1 << 4B.
    let low = _mm256_blend_epi32::<0b1010_1010>(quads, _mm256_setzero_si256());
    let high = _mm256_srli_epi64::<32>(quads);
    _mm256_or_si256(low, _mm256_sll_epi64(high, _mm_cvtsi32_si128(4 * B as i32)))
}

pub(crate) const fn pair_multiplier(b: u32) -> i16 {
    (1i32 | (1i32 << (b + 8))) as i16
}

pub(crate) const fn quad_multiplier(b: u32) -> i32 {
    (1i64 | (1i64 << (2 * b + 16))) as i32
}

/// Writes the four squeezed 64-bit lanes of `packed` (B bytes each) as 4B contiguous bytes at
/// the start of `out`, and garbage over the next 16 - 2B bytes.
#[inline]
#[target_feature(enable = "avx2")]
fn store4<const B: u32>(packed: __m256i, out: &mut [u8]) {
    let table = Tables::<B>::COMPACT;
    // SAFETY: reads the 32 bytes of `table`.
    let compact = unsafe { _mm256_loadu_si256(table.as_ptr().cast()) };
    let halves = _mm256_shuffle_epi8(packed, compact);
    let b2 = 2 * B as usize;
    let out = &mut out[..b2 + 16];
    // SAFETY: both 16-byte stores lie inside `out` (0..16 and 2B..2B + 16); the second
    // overwrites the first's garbage.
    unsafe {
        _mm_storeu_si128(out.as_mut_ptr().cast(), _mm256_castsi256_si128(halves));
        _mm_storeu_si128(
            out[b2..].as_mut_ptr().cast(),
            _mm256_extracti128_si256::<1>(halves),
        );
    }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn quantize_pack<const B: u32>(group: &[f32], q: &GroupQuant, out: &mut [u8]) {
    let quant = Quant {
        scale: _mm256_set1_ps(q.scale),
        low: _mm256_set1_ps(q.low),
        high: _mm256_set1_ps(q.high),
        offset: _mm256_set1_epi32(q.offset),
    };
    quantize_pack_with::<B>(group, &quant, out);
}

/// [`quantize_pack`] with the parameters in every lane of `quant`.
#[inline]
#[target_feature(enable = "avx2")]
fn quantize_pack_with<const B: u32>(group: &[f32], quant: &Quant, out: &mut [u8]) {
    let b = B as usize;
    let (blocks, _) = group.as_chunks::<8>();
    let (quads, rest) = blocks.as_chunks::<4>();
    let mut at = 0;
    for quad in quads {
        let c = [
            codes(load(&quad[0]), quant),
            codes(load(&quad[1]), quant),
            codes(load(&quad[2]), quant),
            codes(load(&quad[3]), quant),
        ];
        store4::<B>(squeeze4::<B>(pack32(c)), &mut out[at..]);
        at += 4 * b;
    }
    for block in rest {
        let packed = squeeze::<B>(pack8(codes(load(block), quant)));
        // Whole 8 bytes: the next block (or group) overwrites the 8 - B bytes of garbage.
        out[at..at + 8].copy_from_slice(&packed.to_le_bytes());
        at += b;
    }
}

/// The byte codes of 8 columns x 8 rows, given as row i's codes (i32 lanes) in `c[i]`, as
/// each column's 8 codes in a 64-bit lane: columns 0, 1, 4, 5 and columns 2, 3, 6, 7.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn transpose_codes(c: [__m256i; 8]) -> (__m256i, __m256i) {
    // Per 128-bit half, 4 rows x 4 columns of bytes to 4 columns x 4 rows.
    let transpose = _mm256_setr_epi8(
        0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10,
        14, 3, 7, 11, 15,
    );
    // Bytes per half: rows 0-3 x columns 0-3 (low half) and columns 4-7 (high half).
    let top = _mm256_packus_epi16(
        _mm256_packs_epi32(c[0], c[1]),
        _mm256_packs_epi32(c[2], c[3]),
    );
    let bottom = _mm256_packus_epi16(
        _mm256_packs_epi32(c[4], c[5]),
        _mm256_packs_epi32(c[6], c[7]),
    );
    let top = _mm256_shuffle_epi8(top, transpose);
    let bottom = _mm256_shuffle_epi8(bottom, transpose);
    // 64-bit lanes: columns 0, 1, 4, 5 and 2, 3, 6, 7, each with its 8 rows.
    (
        _mm256_unpacklo_epi32(top, bottom),
        _mm256_unpackhi_epi32(top, bottom),
    )
}

/// Fits, quantizes and packs 8 whole groups of `g` values (see
/// [`Kernels::fit_quantize_pack8`]).
///
/// [`Kernels::fit_quantize_pack8`]: crate::fast::Kernels::fit_quantize_pack8
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn fit_quantize_pack8<const B: u32>(
    values: &[f32],
    g: usize,
    fit: Fit,
    scales: &mut [f32],
    zero_points: &mut [u8],
    out: &mut [u8],
) -> bool {
    if g == 8 {
        let values = values[..64].try_into().expect("8 groups of 8");
        fit_quantize_pack8x8::<B>(values, fit, scales, zero_points, out)
    } else {
        fit_quantize_pack8_wide::<B>(&values[..8 * g], g, fit, scales, zero_points, out)
    }
}

/// Lane i: the parameters of the group whose lane-wise max |x| (symmetric) or min and max
/// (asymmetric) are lane i of the vectors `hi[j]` and `lo[j]`, reduced from accumulators that
/// start at 0 as the per-group fit's; or `None` when some scale overflows.
#[inline]
#[target_feature(enable = "avx2")]
fn params8(fit: Fit, lo: &[__m256; 8], hi: &[__m256; 8]) -> Option<Quant> {
    match fit {
        Fit::Symmetric(qmax) => {
            let magnitude = magnitude_mask();
            let mut amax = _mm256_setzero_ps();
            for &v in hi {
                amax = _mm256_max_ps(amax, _mm256_and_ps(v, magnitude));
            }
            Some(symmetric8(amax, qmax))
        }
        Fit::Asymmetric(levels) => {
            let (mut low, mut high) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for (&l, &h) in lo.iter().zip(hi) {
                low = _mm256_min_ps(low, l);
                high = _mm256_max_ps(high, h);
            }
            let (quant, finite) = asymmetric8(low, high, levels);
            (_mm256_movemask_ps(finite) == 0xFF).then_some(quant)
        }
    }
}

/// Stores 8 groups' scales and (asymmetric) zero points.
#[inline]
#[target_feature(enable = "avx2")]
fn store_params(quant: &Quant, fit: Fit, scales: &mut [f32], zero_points: &mut [u8]) {
    store(
        (&mut scales[..8]).try_into().expect("8 scales"),
        quant.scale,
    );
    if let Fit::Asymmetric(_) = fit {
        zero_points[..8].copy_from_slice(&pack8(quant.offset).to_le_bytes());
    }
}

/// 8 groups of 8, fitted and quantized transposed (lane i of `x[j]` is group i's value j); the
/// codes come back to group order with the column packer's byte transpose.
#[inline]
#[target_feature(enable = "avx2")]
fn fit_quantize_pack8x8<const B: u32>(
    values: &[f32; 64],
    fit: Fit,
    scales: &mut [f32],
    zero_points: &mut [u8],
    out: &mut [u8],
) -> bool {
    prefetch(values);
    let (blocks, _) = values.as_chunks::<8>();
    let mut x = [_mm256_setzero_ps(); 8];
    let mut bad = _mm256_setzero_ps();
    for (slot, block) in x.iter_mut().zip(blocks) {
        *slot = load(block);
        bad = _mm256_or_ps(bad, non_finite_bits(*slot));
    }
    transpose8(&mut x);
    let Some(quant) = params8(fit, &x, &x) else {
        return false;
    };
    if !all_zero(bad) {
        return false;
    }
    store_params(&quant, fit, scales, zero_points);
    let mut c = [_mm256_setzero_si256(); 8];
    for (slot, v) in c.iter_mut().zip(x) {
        *slot = codes(v, &quant);
    }
    let (even, odd) = transpose_codes(c);
    let (even, odd) = (squeeze4::<B>(even), squeeze4::<B>(odd));
    let b = B as usize;
    store4::<B>(_mm256_permute2x128_si256::<0x20>(even, odd), out);
    store4::<B>(
        _mm256_permute2x128_si256::<0x31>(even, odd),
        &mut out[4 * b..],
    );
    true
}

/// 8 groups of 16 or more: each reduced to one vector, the 8 vectors transposed and reduced to
/// the groups' parameters, then each group quantized with its parameters in every lane.
#[inline]
#[target_feature(enable = "avx2")]
fn fit_quantize_pack8_wide<const B: u32>(
    values: &[f32],
    g: usize,
    fit: Fit,
    scales: &mut [f32],
    zero_points: &mut [u8],
    out: &mut [u8],
) -> bool {
    prefetch(values);
    let magnitude = magnitude_mask();
    let mut bad = _mm256_setzero_ps();
    // Per group: lane-wise max |x| (symmetric) or max x (asymmetric), and min x.
    let mut hi = [_mm256_setzero_ps(); 8];
    let mut lo = [_mm256_setzero_ps(); 8];
    for (i, group) in values.chunks_exact(g).enumerate() {
        let (blocks, _) = group.as_chunks::<8>();
        for block in blocks {
            let v = load(block);
            bad = _mm256_or_ps(bad, non_finite_bits(v));
            match fit {
                Fit::Symmetric(_) => {
                    hi[i] = _mm256_max_ps(hi[i], _mm256_and_ps(v, magnitude));
                }
                Fit::Asymmetric(_) => {
                    lo[i] = _mm256_min_ps(lo[i], v);
                    hi[i] = _mm256_max_ps(hi[i], v);
                }
            }
        }
    }
    transpose8(&mut hi);
    if let Fit::Asymmetric(_) = fit {
        transpose8(&mut lo);
    }
    let Some(quant) = params8(fit, &lo, &hi) else {
        return false;
    };
    if !all_zero(bad) {
        return false;
    }
    store_params(&quant, fit, scales, zero_points);
    let group_bytes = g * B as usize / 8;
    for (i, group) in values.chunks_exact(g).enumerate() {
        let lane = _mm256_set1_epi32(i as i32);
        let one = Quant {
            scale: _mm256_permutevar8x32_ps(quant.scale, lane),
            low: _mm256_permutevar8x32_ps(quant.low, lane),
            high: _mm256_permutevar8x32_ps(quant.high, lane),
            offset: _mm256_permutevar8x32_epi32(quant.offset, lane),
        };
        quantize_pack_with::<B>(group, &one, &mut out[i * group_bytes..]);
    }
    true
}
