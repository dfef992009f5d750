//! The AVX2 kernels (x86_64). Every function here has `#[target_feature(enable = "avx2")]`
//! and is reached only through an [`Avx2`] value, which exists only once the CPU was seen to
//! have AVX2: that is the invariant behind every `unsafe` call of them below.
//!
//! Exactness: `x / scale` is `_mm256_div_ps` (IEEE division, the same f32 as the scalar `/`),
//! clamped to the integer bounds and converted with `_mm256_cvtps_epi32`, which rounds to
//! nearest, ties to even, under the default MXCSR that Rust code runs with. Codes then travel
//! as integers, and decoding converts the exact integer `code - offset` to f32 before one
//! multiply.
//!
//! Code layout tricks: eight codes per 64-bit lane are merged into 8b bits with multiply-adds
//! and shifts ([`squeeze4`]); eight codes are pulled out of b bytes with one byte shuffle and a
//! per-lane variable shift ([`Unpack`]). Tiles grouped down columns transpose their codes with
//! byte shuffles (encoding) or their decoded floats with the usual 8 x 8 shuffle network
//! (decoding).

use core::arch::x86_64::*;

use crate::layout::Layout;

use super::bits::{read_u64, squeeze, write_packed};
use super::decode::{self, Stored};
use super::encode;
use super::params::{ColumnQuant, GroupQuant};
use super::{ColumnScratch, ColumnTileOut, Dense, Fit, Kernels, Parts, Stop, portable};

/// Proof that the CPU has AVX2.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx2 {
    _detected: (),
}

impl Avx2 {
    /// The proof, if this CPU has AVX2.
    pub(crate) fn detect() -> Option<Avx2> {
        std::arch::is_x86_feature_detected!("avx2").then_some(Avx2 { _detected: () })
    }
}

// The drivers, instantiated with AVX2 enabled so that the kernels inline into them.

#[target_feature(enable = "avx2")]
pub(crate) fn encode_along_rows<const B: u32>(
    k: Avx2,
    m: Dense,
    layout: Layout,
    spare: Parts,
) -> Result<Parts, Stop> {
    encode::along_rows::<Avx2, B>(k, m, layout, spare)
}

#[target_feature(enable = "avx2")]
pub(crate) fn encode_down_columns<const B: u32>(
    k: Avx2,
    m: Dense,
    layout: Layout,
    spare: Parts,
) -> Result<Parts, Stop> {
    encode::down_columns::<Avx2, B>(k, m, layout, spare)
}

#[target_feature(enable = "avx2")]
pub(crate) fn decode_along_rows<const B: u32>(
    k: Avx2,
    s: Stored,
    out: &mut [f32],
    row_len: usize,
    streaming: bool,
) {
    decode::along_rows::<Avx2, B>(k, s, out, row_len, streaming)
}

#[target_feature(enable = "avx2")]
pub(crate) fn decode_down_columns<const B: u32>(
    k: Avx2,
    s: Stored,
    out: &mut [f32],
    cols: usize,
    streaming: bool,
) {
    decode::down_columns::<Avx2, B>(k, s, out, cols, streaming)
}

// SAFETY (every method): `self` proves the CPU has AVX2.
impl Kernels for Avx2 {
    #[inline(always)]
    fn group_amax(self, group: &[f32]) -> (f32, bool) {
        unsafe { group_amax(group) }
    }

    #[inline(always)]
    fn group_range(self, group: &[f32]) -> (f32, f32, bool) {
        unsafe { group_range(group) }
    }

    #[inline(always)]
    fn quantize_pack<const B: u32>(self, group: &[f32], q: &GroupQuant, out: &mut [u8]) {
        unsafe { quantize_pack::<B>(group, q, out) }
    }

    #[inline(always)]
    fn fit_quantize_pack8<const B: u32>(
        self,
        values: &[f32],
        group_size: usize,
        fit: Fit,
        scales: &mut [f32],
        zero_points: &mut [u8],
        out: &mut [u8],
    ) -> bool {
        unsafe { fit_quantize_pack8::<B>(values, group_size, fit, scales, zero_points, out) }
    }

    #[inline(always)]
    fn columns_amax(self, tile: &[f32], amax: &mut [f32]) -> bool {
        unsafe { columns_amax(tile, amax) }
    }

    #[inline(always)]
    fn columns_range(self, tile: &[f32], lo: &mut [f32], hi: &mut [f32]) -> bool {
        unsafe { columns_range(tile, lo, hi) }
    }

    #[inline(always)]
    fn symmetric_columns(self, amax: &[f32], qmax: u8, scale: &mut [f32]) {
        unsafe { symmetric_columns(amax, qmax, scale) }
    }

    #[inline(always)]
    fn asymmetric_columns(self, lo: &[f32], hi: &[f32], levels: u8, q: &mut ColumnQuant) -> bool {
        unsafe { asymmetric_columns(lo, hi, levels, q) }
    }

    #[inline(always)]
    fn quantize_pack_columns<const B: u32>(
        self,
        tile: &[f32],
        q: &ColumnQuant,
        group_size: usize,
        codes: &mut [u8],
        row_bytes: usize,
        at: usize,
    ) {
        unsafe { quantize_pack_columns::<B>(tile, q, group_size, codes, row_bytes, at) }
    }

    #[inline(always)]
    fn fit_quantize_pack_columns<const B: u32>(
        self,
        tile: &[f32],
        group_size: usize,
        fit: Fit,
        scratch: &mut ColumnScratch,
        out: ColumnTileOut,
    ) -> Result<(), Stop> {
        unsafe { fit_quantize_pack_columns::<B>(tile, group_size, fit, scratch, out) }
    }

    #[inline(always)]
    fn stream_copy_bytes(self, src: &[u8], dst: &mut [u8]) {
        unsafe { stream_copy_bytes(src, dst) }
    }

    #[inline(always)]
    fn dequantize_group<const B: u32>(
        self,
        codes: &[u8],
        offset: i32,
        scale: f32,
        out: &mut [f32],
    ) {
        unsafe { dequantize_group::<B>(codes, offset, scale, out) }
    }

    #[inline(always)]
    fn dequantize_groups<const B: u32>(
        self,
        codes: &[u8],
        offsets: decode::GroupOffsets,
        scales: &[f32],
        group_size: usize,
        out: &mut [f32],
        streaming: bool,
    ) {
        unsafe { dequantize_groups::<B>(codes, offsets, scales, group_size, out, streaming) }
    }

    #[inline(always)]
    fn dequantize_columns<const B: u32>(
        self,
        codes: &[u8],
        row_bytes: usize,
        at: usize,
        offsets: &[i32],
        scales: &[f32],
        out: &mut [f32],
    ) {
        unsafe { dequantize_columns::<B>(codes, row_bytes, at, offsets, scales, out) }
    }

    #[inline(always)]
    fn stream_copy(self, src: &[f32], dst: &mut [f32]) {
        unsafe { stream_copy(src, dst) }
    }

    #[inline(always)]
    fn finish_streaming(self) {
        // SAFETY: SSE is part of x86_64.
        unsafe { _mm_sfence() }
    }
}

// ---------------------------------------------------------------------------------------------
// Loads, stores and reductions.

#[inline]
#[target_feature(enable = "avx2")]
fn load(v: &[f32; 8]) -> __m256 {
    // SAFETY: reads exactly the 8 floats of `v`.
    unsafe { _mm256_loadu_ps(v.as_ptr()) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn load_i32(v: &[i32; 8]) -> __m256i {
    // SAFETY: reads exactly the 8 integers of `v`.
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn store(dst: &mut [f32; 8], v: __m256) {
    // SAFETY: writes exactly the 8 floats of `dst`.
    unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), v) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn store_i32(dst: &mut [i32; 8], v: __m256i) {
    // SAFETY: writes exactly the 8 integers of `dst`.
    unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), v) }
}

/// The 8 floats of `s` from `at`.
#[inline]
#[target_feature(enable = "avx2")]
fn load_at(s: &[f32], at: usize) -> __m256 {
    load(s[at..at + 8].try_into().expect("8 floats"))
}

/// Whether every bit of `v` is 0.
#[inline]
#[target_feature(enable = "avx2")]
fn all_zero(v: __m256) -> bool {
    let bits = _mm256_castps_si256(v);
    _mm256_testz_si256(bits, bits) == 1
}

/// Bits of `x - x`: all 0 for a finite x, a NaN for an infinity or a NaN.
#[inline]
#[target_feature(enable = "avx2")]
fn non_finite_bits(x: __m256) -> __m256 {
    _mm256_sub_ps(x, x)
}

#[inline]
#[target_feature(enable = "avx2")]
fn magnitude_mask() -> __m256 {
    _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX))
}

#[inline]
#[target_feature(enable = "avx2")]
fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<0b01>(m, m)))
}

#[inline]
#[target_feature(enable = "avx2")]
fn hmin(v: __m256) -> f32 {
    let m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_min_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_min_ss(m, _mm_shuffle_ps::<0b01>(m, m)))
}

// ---------------------------------------------------------------------------------------------
// Fitting groups.

/// How far ahead of the values being fitted the input is prefetched, in floats (along tokens,
/// tiles are contiguous, so this runs into the next tiles). The fitting pass is the first to
/// touch the input; without the hint its loads wait on memory (the
/// hardware prefetcher alone ran encode at about half the speed).
const PREFETCH: usize = 512;

/// Asks for the cache lines [`PREFETCH`] floats ahead of `values`.
#[inline]
#[target_feature(enable = "avx2")]
fn prefetch(values: &[f32]) {
    let ahead = values.as_ptr().wrapping_add(PREFETCH).cast::<i8>();
    let mut at = 0;
    while at < std::mem::size_of_val(values) {
        // SAFETY: a prefetch is a hint that never faults, whatever the address. (Newer
        // compilers call it safe here; Rust 1.89, the workspace's rust-version, needs the block.)
        #[allow(unused_unsafe)]
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(at))
        };
        at += 64;
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn group_amax(group: &[f32]) -> (f32, bool) {
    prefetch(group);
    let magnitude = magnitude_mask();
    let (blocks, tail) = group.as_chunks::<8>();
    let (quads, rest) = blocks.as_chunks::<4>();
    // Four accumulators hide the latency of max.
    let mut amax = [_mm256_setzero_ps(); 4];
    let mut bad = _mm256_setzero_ps();
    for quad in quads {
        for i in 0..4 {
            let x = load(&quad[i]);
            amax[i] = _mm256_max_ps(amax[i], _mm256_and_ps(x, magnitude));
            bad = _mm256_or_ps(bad, non_finite_bits(x));
        }
    }
    for block in rest {
        let x = load(block);
        amax[0] = _mm256_max_ps(amax[0], _mm256_and_ps(x, magnitude));
        bad = _mm256_or_ps(bad, non_finite_bits(x));
    }
    let all = _mm256_max_ps(
        _mm256_max_ps(amax[0], amax[1]),
        _mm256_max_ps(amax[2], amax[3]),
    );
    let (tail_amax, tail_finite) = portable::Portable.group_amax(tail);
    (hmax(all).max(tail_amax), all_zero(bad) && tail_finite)
}

#[inline]
#[target_feature(enable = "avx2")]
fn group_range(group: &[f32]) -> (f32, f32, bool) {
    prefetch(group);
    let (blocks, tail) = group.as_chunks::<8>();
    let (pairs, rest) = blocks.as_chunks::<2>();
    let mut lo = [_mm256_setzero_ps(); 2];
    let mut hi = [_mm256_setzero_ps(); 2];
    let mut bad = _mm256_setzero_ps();
    for pair in pairs {
        for i in 0..2 {
            let x = load(&pair[i]);
            lo[i] = _mm256_min_ps(lo[i], x);
            hi[i] = _mm256_max_ps(hi[i], x);
            bad = _mm256_or_ps(bad, non_finite_bits(x));
        }
    }
    for block in rest {
        let x = load(block);
        lo[0] = _mm256_min_ps(lo[0], x);
        hi[0] = _mm256_max_ps(hi[0], x);
        bad = _mm256_or_ps(bad, non_finite_bits(x));
    }
    let (tail_lo, tail_hi, tail_finite) = portable::Portable.group_range(tail);
    (
        hmin(_mm256_min_ps(lo[0], lo[1])).min(tail_lo),
        hmax(_mm256_max_ps(hi[0], hi[1])).max(tail_hi),
        all_zero(bad) && tail_finite,
    )
}

#[inline]
#[target_feature(enable = "avx2")]
fn columns_amax(tile: &[f32], amax: &mut [f32]) -> bool {
    let cols = amax.len();
    let magnitude = magnitude_mask();
    let mut bad = _mm256_setzero_ps();
    let (acc, _) = amax.as_chunks_mut::<8>();
    for row in tile.chunks_exact(cols) {
        prefetch(row);
        let (xs, _) = row.as_chunks::<8>();
        for (a, x) in acc.iter_mut().zip(xs) {
            let x = load(x);
            store(a, _mm256_max_ps(load(a), _mm256_and_ps(x, magnitude)));
            bad = _mm256_or_ps(bad, non_finite_bits(x));
        }
    }
    let tail_finite = portable::columns_amax(tile, amax, cols / 8 * 8..cols);
    all_zero(bad) && tail_finite
}

#[inline]
#[target_feature(enable = "avx2")]
fn columns_range(tile: &[f32], lo: &mut [f32], hi: &mut [f32]) -> bool {
    let cols = lo.len();
    let mut bad = _mm256_setzero_ps();
    let (lo_acc, _) = lo.as_chunks_mut::<8>();
    let (hi_acc, _) = hi.as_chunks_mut::<8>();
    for row in tile.chunks_exact(cols) {
        prefetch(row);
        let (xs, _) = row.as_chunks::<8>();
        for ((l, h), x) in lo_acc.iter_mut().zip(hi_acc.iter_mut()).zip(xs) {
            let x = load(x);
            store(l, _mm256_min_ps(load(l), x));
            store(h, _mm256_max_ps(load(h), x));
            bad = _mm256_or_ps(bad, non_finite_bits(x));
        }
    }
    let tail_finite = portable::columns_range(tile, lo, hi, cols / 8 * 8..cols);
    all_zero(bad) && tail_finite
}

#[inline]
#[target_feature(enable = "avx2")]
fn symmetric_columns(amax: &[f32], qmax: u8, scale: &mut [f32]) {
    let q = _mm256_set1_ps(f32::from(qmax));
    let one = _mm256_set1_ps(1.0);
    let (amax_blocks, amax_tail) = amax.as_chunks::<8>();
    let (scale_blocks, scale_tail) = scale.as_chunks_mut::<8>();
    for (a, s) in amax_blocks.iter().zip(scale_blocks) {
        let v = _mm256_div_ps(load(a), q);
        let zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(v, _mm256_setzero_ps());
        store(s, _mm256_blendv_ps(v, one, zero));
    }
    for (s, &a) in scale_tail.iter_mut().zip(amax_tail) {
        *s = super::params::symmetric(a, qmax).scale;
    }
}

/// Asymmetric parameters of 8 ranges [`lo`, `hi`] (as [`super::params::asymmetric`]), and
/// the lanes whose scale is finite (all bits set there).
#[inline]
#[target_feature(enable = "avx2")]
fn asymmetric8(lo: __m256, hi: __m256, levels: u8) -> (Quant, __m256) {
    let l = _mm256_set1_ps(f32::from(levels));
    let one = _mm256_set1_ps(1.0);
    let zero = _mm256_setzero_ps();
    let sign = _mm256_set1_ps(-0.0);
    let scale = _mm256_div_ps(_mm256_sub_ps(hi, lo), l);
    let magnitude = _mm256_and_ps(scale, magnitude_mask());
    let finite = _mm256_cmp_ps::<_CMP_LE_OQ>(magnitude, _mm256_set1_ps(f32::MAX));
    let is_zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(scale, zero);
    let scale = _mm256_blendv_ps(scale, one, is_zero);
    let point = _mm256_div_ps(_mm256_xor_ps(lo, sign), scale);
    let point = _mm256_min_ps(_mm256_max_ps(point, zero), l);
    let point = _mm256_andnot_si256(_mm256_castps_si256(is_zero), _mm256_cvtps_epi32(point));
    let point_f = _mm256_cvtepi32_ps(point);
    let quant = Quant {
        scale,
        low: _mm256_xor_ps(point_f, sign),
        high: _mm256_sub_ps(l, point_f),
        offset: point,
    };
    (quant, finite)
}

/// Symmetric parameters of 8 groups of largest magnitudes `amax` (as
/// [`super::params::symmetric`]).
#[inline]
#[target_feature(enable = "avx2")]
fn symmetric8(amax: __m256, qmax: u8) -> Quant {
    let q = _mm256_set1_ps(f32::from(qmax));
    let scale = _mm256_div_ps(amax, q);
    let zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(scale, _mm256_setzero_ps());
    Quant {
        scale: _mm256_blendv_ps(scale, _mm256_set1_ps(1.0), zero),
        low: _mm256_xor_ps(q, _mm256_set1_ps(-0.0)),
        high: q,
        offset: _mm256_set1_epi32(i32::from(qmax)),
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn asymmetric_columns(lo: &[f32], hi: &[f32], levels: u8, q: &mut ColumnQuant) -> bool {
    let cols = lo.len();
    let mut finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    let blocks = cols / 8;
    let (lo_blocks, _) = lo.as_chunks::<8>();
    let (hi_blocks, _) = hi.as_chunks::<8>();
    for c in 0..blocks {
        let (quant, ok) = asymmetric8(load(&lo_blocks[c]), load(&hi_blocks[c]), levels);
        finite = _mm256_and_ps(finite, ok);
        let at = 8 * c;
        store(
            (&mut q.scale[at..at + 8]).try_into().expect("8"),
            quant.scale,
        );
        store_i32(
            (&mut q.offset[at..at + 8]).try_into().expect("8"),
            quant.offset,
        );
        store((&mut q.low[at..at + 8]).try_into().expect("8"), quant.low);
        store((&mut q.high[at..at + 8]).try_into().expect("8"), quant.high);
    }
    let tail_finite = portable::asymmetric_columns(lo, hi, levels, q, blocks * 8..cols);
    _mm256_movemask_ps(finite) == 0xFF && tail_finite
}

// ---------------------------------------------------------------------------------------------
// Quantizing and packing.

/// A group's (or 8 columns') parameters, one per lane.
struct Quant {
    scale: __m256,
    low: __m256,
    high: __m256,
    offset: __m256i,
}

/// Stored codes of 8 values, as i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn codes(x: __m256, q: &Quant) -> __m256i {
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
fn pack8(c: __m256i) -> u64 {
    let words = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256::<1>(c));
    _mm_cvtsi128_si64(_mm_packus_epi16(words, words)) as u64
}

/// Each 64-bit lane's eight byte codes (< 2^B) moved to its low 8B bits.
#[inline]
#[target_feature(enable = "avx2")]
fn squeeze4<const B: u32>(v: __m256i) -> __m256i {
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

const fn pair_multiplier(b: u32) -> i16 {
    (1i32 | (1i32 << (b + 8))) as i16
}

const fn quad_multiplier(b: u32) -> i32 {
    (1i64 | (1i64 << (2 * b + 16))) as i32
}

/// Per 128-bit half: the low B bytes of both 64-bit lanes, side by side.
const fn compact_table(b: usize) -> [i8; 32] {
    let mut table = [-128i8; 32];
    let mut half = 0;
    while half < 2 {
        let mut i = 0;
        while i < 2 * b {
            table[16 * half + i] = if i < b { i } else { 8 + i - b } as i8;
            i += 1;
        }
        half += 1;
    }
    table
}

struct Tables<const B: u32>;

impl<const B: u32> Tables<B> {
    const COMPACT: [i8; 32] = compact_table(B as usize);
    const UNPACK_SHUFFLE: [i8; 32] = unpack_shuffle(B as usize);
    const UNPACK_SHIFT: [i32; 8] = unpack_shift(B as usize);
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
fn quantize_pack<const B: u32>(group: &[f32], q: &GroupQuant, out: &mut [u8]) {
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
fn transpose_codes(c: [__m256i; 8]) -> (__m256i, __m256i) {
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
#[inline]
#[target_feature(enable = "avx2")]
fn fit_quantize_pack8<const B: u32>(
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

#[inline]
#[target_feature(enable = "avx2")]
fn quantize_pack_columns<const B: u32>(
    tile: &[f32],
    q: &ColumnQuant,
    group_size: usize,
    codes_out: &mut [u8],
    row_bytes: usize,
    at: usize,
) {
    let b = B as usize;
    let cols = q.cols();
    let rows = tile.len() / cols;
    let blocks = cols / 8;
    let (scales, _) = q.scale.as_chunks::<8>();
    let (lows, _) = q.low.as_chunks::<8>();
    let (highs, _) = q.high.as_chunks::<8>();
    let (offsets, _) = q.offset.as_chunks::<8>();
    for k in 0..group_size / 8 {
        let first = 8 * k;
        for block in 0..blocks {
            let quant = Quant {
                scale: load(&scales[block]),
                low: load(&lows[block]),
                high: load(&highs[block]),
                offset: load_i32(&offsets[block]),
            };
            // Row i's codes for the block's 8 columns; rows past the tile are zero padding.
            let mut c = [_mm256_setzero_si256(); 8];
            for (i, slot) in c.iter_mut().enumerate() {
                let r = first + i;
                let x = if r < rows {
                    load_at(tile, r * cols + 8 * block)
                } else {
                    _mm256_setzero_ps()
                };
                *slot = codes(x, &quant);
            }
            let (even, odd) = transpose_codes(c);
            let mut lanes = [0u64; 8];
            let (even, odd) = (squeeze4::<B>(even), squeeze4::<B>(odd));
            // SAFETY: each store writes 4 of the 8 u64s of `lanes`.
            unsafe {
                _mm256_storeu_si256(lanes.as_mut_ptr().cast(), even);
                _mm256_storeu_si256(lanes[4..].as_mut_ptr().cast(), odd);
            }
            for (lane, column) in lanes.into_iter().zip([0, 1, 4, 5, 2, 3, 6, 7]) {
                let start = (8 * block + column) * row_bytes + at + k * b;
                write_packed::<B>(&mut codes_out[start..], lane);
            }
        }
    }
    portable::quantize_pack_columns::<B>(
        tile,
        q,
        group_size,
        codes_out,
        row_bytes,
        at,
        blocks * 8..cols,
    );
}

/// How far ahead of a tile [`fit_quantize_pack_columns`] prefetches, in floats.
const AHEAD: usize = 1024;

/// Fits, quantizes and packs a tile (see [`Kernels::fit_quantize_pack_columns`]) 8 columns at
/// a time: each block of 8 columns is fitted down the tile in registers, its parameters
/// computed at once, and its rows quantized while they are still in L1; so the tile is read
/// once from memory and the per-column parameters never go through memory.
#[inline]
#[target_feature(enable = "avx2")]
fn fit_quantize_pack_columns<const B: u32>(
    tile: &[f32],
    group_size: usize,
    fit: Fit,
    scratch: &mut ColumnScratch,
    mut out: ColumnTileOut,
) -> Result<(), Stop> {
    let b = B as usize;
    let cols = scratch.low.len();
    let rows = tile.len() / cols;
    let blocks = cols / 8;
    let stride = out.stride;
    let magnitude = magnitude_mask();
    let mut bad = _mm256_setzero_ps();
    let mut fits = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    // Small tiles: the input from `AHEAD` floats past the tile's start on, a tile's length of
    // it, asked for a block's share at a time so that the requests spread over the tile's
    // work. Larger tiles (which would push themselves out of L1 that way): a burst ahead of
    // each row, as the separate fitting pass does.
    let small = tile.len() <= AHEAD;
    if !small {
        prefetch(tile);
    }
    let share = (tile.len() / blocks.max(1)).next_multiple_of(16);
    let ahead = |block: usize| {
        if !small {
            return;
        }
        let from = tile
            .as_ptr()
            .wrapping_add(AHEAD + block * share)
            .cast::<i8>();
        let mut at = 0;
        while at < 4 * share {
            // SAFETY: a prefetch never faults, whatever the address (the block is for Rust 1.89).
            #[allow(unused_unsafe)]
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(from.wrapping_add(at))
            };
            at += 64;
        }
    };
    let whole_eights = group_size == 8 && rows == 8;
    if whole_eights {
        // Whole tiles of 8 rows: each block's 8 x 8 values stay in registers.
        for block in 0..blocks {
            ahead(block);
            let base = 8 * block;
            let x: [__m256; 8] = std::array::from_fn(|r| load_at(tile, r * cols + base));
            let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for &v in &x {
                bad = _mm256_or_ps(bad, non_finite_bits(v));
                match fit {
                    Fit::Symmetric(_) => hi = _mm256_max_ps(hi, _mm256_and_ps(v, magnitude)),
                    Fit::Asymmetric(_) => {
                        lo = _mm256_min_ps(lo, v);
                        hi = _mm256_max_ps(hi, v);
                    }
                }
            }
            let quant = block_params(fit, lo, hi, &mut fits, base, stride, &mut out);
            let c: [__m256i; 8] = std::array::from_fn(|i| codes(x[i], &quant));
            write_block::<B>(c, base, out.at, out.row_bytes, out.codes);
        }
    }
    // Other tiles: each block fitted down the tile, then quantized 8 rows at a time.
    for block in 0..if whole_eights { 0 } else { blocks } {
        ahead(block);
        let base = 8 * block;
        // Accumulators start at 0, as the zero padding of a partial tile would leave them.
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for r in 0..rows {
            let x = load_at(tile, r * cols + base);
            bad = _mm256_or_ps(bad, non_finite_bits(x));
            match fit {
                Fit::Symmetric(_) => hi = _mm256_max_ps(hi, _mm256_and_ps(x, magnitude)),
                Fit::Asymmetric(_) => {
                    lo = _mm256_min_ps(lo, x);
                    hi = _mm256_max_ps(hi, x);
                }
            }
        }
        let quant = block_params(fit, lo, hi, &mut fits, base, stride, &mut out);
        for k in 0..group_size / 8 {
            let first = 8 * k;
            // Row i's codes for the block's 8 columns; rows past the tile are zero padding.
            let mut c = [_mm256_setzero_si256(); 8];
            for (i, slot) in c.iter_mut().enumerate() {
                let r = first + i;
                let x = if r < rows {
                    load_at(tile, r * cols + base)
                } else {
                    _mm256_setzero_ps()
                };
                *slot = codes(x, &quant);
            }
            write_block::<B>(c, base, out.at + k * b, out.row_bytes, out.codes);
        }
    }
    // The columns after the last block of 8, one at a time.
    let tail = blocks * 8..cols;
    let ColumnScratch { low, high, q } = scratch;
    let (tail_finite, tail_fits) = match fit {
        Fit::Symmetric(qmax) => {
            low[tail.clone()].fill(0.0);
            let finite = portable::columns_amax(tile, low, tail.clone());
            for c in tail.clone() {
                q.scale[c] = super::params::symmetric(low[c], qmax).scale;
            }
            (finite, true)
        }
        Fit::Asymmetric(levels) => {
            low[tail.clone()].fill(0.0);
            high[tail.clone()].fill(0.0);
            let finite = portable::columns_range(tile, low, high, tail.clone());
            let fits = portable::asymmetric_columns(low, high, levels, q, tail.clone());
            for c in tail.clone() {
                out.zero_points[c * stride] = q.offset[c] as u8;
            }
            (finite, fits)
        }
    };
    for c in tail.clone() {
        out.scales[c * stride] = q.scale[c];
    }
    portable::quantize_pack_columns::<B>(
        tile,
        q,
        group_size,
        out.codes,
        out.row_bytes,
        out.at,
        tail,
    );
    if !(all_zero(bad) && tail_finite) {
        return Err(Stop::NonFinite);
    }
    if _mm256_movemask_ps(fits) != 0xFF || !tail_fits {
        return Err(Stop::RangeOverflow);
    }
    Ok(())
}

/// The parameters of 8 columns from `base` whose fitted range is [`lo`, `hi`] (max |x| in
/// `hi` when symmetric); their scales and zero points written to `out`, and the lanes whose
/// scale is finite and-ed into `fits`.
#[inline]
#[target_feature(enable = "avx2")]
fn block_params(
    fit: Fit,
    lo: __m256,
    hi: __m256,
    fits: &mut __m256,
    base: usize,
    stride: usize,
    out: &mut ColumnTileOut,
) -> Quant {
    let quant = match fit {
        Fit::Symmetric(qmax) => symmetric8(hi, qmax),
        Fit::Asymmetric(levels) => {
            let (quant, finite) = asymmetric8(lo, hi, levels);
            *fits = _mm256_and_ps(*fits, finite);
            let zeros = pack8(quant.offset).to_le_bytes();
            for (j, &zero) in zeros.iter().enumerate() {
                out.zero_points[(base + j) * stride] = zero;
            }
            quant
        }
    };
    let mut scales = [0f32; 8];
    store(&mut scales, quant.scale);
    for (j, &scale) in scales.iter().enumerate() {
        out.scales[(base + j) * stride] = scale;
    }
    quant
}

/// Writes 8 rows' codes `c` (row i in `c[i]`) of the 8 columns from `base`: column j's B bytes
/// at `codes[(base + j) * row_bytes + at..]`.
#[inline]
#[target_feature(enable = "avx2")]
fn write_block<const B: u32>(
    c: [__m256i; 8],
    base: usize,
    at: usize,
    row_bytes: usize,
    codes: &mut [u8],
) {
    let (even, odd) = transpose_codes(c);
    let mut lanes = [0u64; 8];
    let (even, odd) = (squeeze4::<B>(even), squeeze4::<B>(odd));
    // SAFETY: each store writes 4 of the 8 u64s of `lanes`.
    unsafe {
        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), even);
        _mm256_storeu_si256(lanes[4..].as_mut_ptr().cast(), odd);
    }
    for (lane, column) in lanes.into_iter().zip([0, 1, 4, 5, 2, 3, 6, 7]) {
        let start = (base + column) * row_bytes + at;
        write_packed::<B>(&mut codes[start..], lane);
    }
}

/// See [`Kernels::stream_copy_bytes`].
#[inline]
#[target_feature(enable = "avx2")]
fn stream_copy_bytes(src: &[u8], dst: &mut [u8]) {
    let len = dst.len();
    let src = &src[..len];
    let head = dst.as_ptr().align_offset(32).min(len);
    let end = head + (len - head) / 32 * 32;
    dst[..head].copy_from_slice(&src[..head]);
    let mut at = head;
    while at < end {
        // SAFETY: `at + 32 <= end <= len`, so both 32-byte blocks lie inside `src` and `dst`,
        // and `dst`'s starts on a 32-byte boundary (`head` aligned it, steps are 32).
        unsafe {
            let v = _mm256_loadu_si256(src.as_ptr().add(at).cast());
            _mm256_stream_si256(dst.as_mut_ptr().add(at).cast(), v);
        }
        at += 32;
    }
    dst[end..].copy_from_slice(&src[end..]);
}

// ---------------------------------------------------------------------------------------------
// Unpacking and decoding.

/// Dword j takes the byte (or two) holding code j of eight packed B-bit codes.
const fn unpack_shuffle(b: usize) -> [i8; 32] {
    let mut table = [-128i8; 32];
    let mut j = 0;
    while j < 8 {
        let bit = j * b;
        let at = 16 * (j / 4) + 4 * (j % 4);
        table[at] = (bit / 8) as i8;
        if bit % 8 + b > 8 {
            table[at + 1] = (bit / 8 + 1) as i8;
        }
        j += 1;
    }
    table
}

/// Dword j's shift to bring code j to bit 0.
const fn unpack_shift(b: usize) -> [i32; 8] {
    let mut table = [0i32; 8];
    let mut j = 0;
    while j < 8 {
        table[j] = ((j * b) % 8) as i32;
        j += 1;
    }
    table
}

/// Eight B-bit codes from the low B bytes of a u64, as i32 lanes.
struct Unpack {
    shuffle: __m256i,
    shift: __m256i,
    mask: __m256i,
}

impl Unpack {
    #[inline]
    #[target_feature(enable = "avx2")]
    fn new<const B: u32>() -> Unpack {
        let shuffle = Tables::<B>::UNPACK_SHUFFLE;
        let shift = Tables::<B>::UNPACK_SHIFT;
        // SAFETY: reads the 32 bytes of each table.
        unsafe {
            Unpack {
                shuffle: _mm256_loadu_si256(shuffle.as_ptr().cast()),
                shift: _mm256_loadu_si256(shift.as_ptr().cast()),
                mask: _mm256_set1_epi32((1 << B) - 1),
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn codes(&self, packed: u64) -> __m256i {
        self.spread(_mm256_set1_epi64x(packed as i64))
    }

    /// [`Unpack::codes`] of packed codes already broadcast to every 64-bit lane.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn spread(&self, packed: __m256i) -> __m256i {
        let bytes = _mm256_shuffle_epi8(packed, self.shuffle);
        _mm256_and_si256(_mm256_srlv_epi32(bytes, self.shift), self.mask)
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn dequantize_group<const B: u32>(codes: &[u8], offset: i32, scale: f32, out: &mut [f32]) {
    let b = B as usize;
    let unpack = Unpack::new::<B>();
    let offset = _mm256_set1_epi32(offset);
    let scale = _mm256_set1_ps(scale);
    let (blocks, tail) = out.as_chunks_mut::<8>();
    let whole = blocks.len();
    for (k, dst) in blocks.iter_mut().enumerate() {
        store(
            dst,
            dequantize8(&unpack, read_u64(codes, k * b), offset, scale),
        );
    }
    if !tail.is_empty() {
        let mut last = [0f32; 8];
        let packed = read_u64(codes, whole * b);
        store(&mut last, dequantize8(&unpack, packed, offset, scale));
        tail.copy_from_slice(&last[..tail.len()]);
    }
}

/// Plain stores.
const PLAIN: u8 = 0;
/// Non-temporal stores of 32 bytes, at 32-byte boundaries.
const STREAM32: u8 = 1;
/// Non-temporal stores of 16 bytes, at 16-byte boundaries.
const STREAM16: u8 = 2;

/// The store mode for vectors written at `dst` and multiples of 8 floats after it.
#[inline]
fn store_mode(dst: *const f32, streaming: bool) -> Option<u8> {
    match (streaming, dst as usize % 32) {
        (false, _) => Some(PLAIN),
        (true, 0) => Some(STREAM32),
        (true, 16) => Some(STREAM16),
        _ => None,
    }
}

/// Stores `v` to `dst` as `MODE` says.
#[inline]
#[target_feature(enable = "avx2")]
fn put<const MODE: u8>(dst: &mut [f32; 8], v: __m256) {
    let p = dst.as_mut_ptr();
    // SAFETY: writes exactly the 8 floats of `dst`; the streaming stores need `dst` at a 32-
    // (or 16-) byte boundary, which [`store_mode`] checked for the first vector of a run whose
    // vectors are all 8 floats apart.
    unsafe {
        match MODE {
            PLAIN => _mm256_storeu_ps(p, v),
            STREAM32 => {
                debug_assert_eq!(p as usize % 32, 0);
                _mm256_stream_ps(p, v)
            }
            _ => {
                debug_assert_eq!(p as usize % 16, 0);
                _mm_stream_ps(p, _mm256_castps256_ps128(v));
                _mm_stream_ps(p.add(4), _mm256_extractf128_ps::<1>(v));
            }
        }
    }
}

/// Eight packed codes from `codes[at..]` broadcast to every 64-bit lane (zero-filled past the
/// end of `codes`).
#[inline]
#[target_feature(enable = "avx2")]
fn broadcast_codes(codes: &[u8], at: usize) -> __m256i {
    if at + 8 <= codes.len() {
        // SAFETY: reads the 8 bytes codes[at..at + 8], in bounds as just checked.
        unsafe { _mm256_broadcastq_epi64(_mm_loadl_epi64(codes.as_ptr().add(at).cast())) }
    } else {
        _mm256_set1_epi64x(read_u64(codes, at) as i64)
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn dequantize_groups<const B: u32>(
    codes: &[u8],
    offsets: decode::GroupOffsets,
    scales: &[f32],
    group_size: usize,
    out: &mut [f32],
    streaming: bool,
) {
    use decode::GroupOffsets::{Constant, PerGroup};
    assert_eq!(out.len(), scales.len() * group_size, "whole groups");
    assert!(group_size.is_multiple_of(8), "groups of a multiple of 8");
    match (store_mode(out.as_ptr(), streaming), offsets) {
        (Some(PLAIN), Constant(o)) => {
            groups_with::<B, PLAIN>(codes, o, &[], scales, group_size, out)
        }
        (Some(PLAIN), PerGroup(z)) => groups_with::<B, PLAIN>(codes, 0, z, scales, group_size, out),
        (Some(STREAM32), Constant(o)) => {
            groups_with::<B, STREAM32>(codes, o, &[], scales, group_size, out)
        }
        (Some(STREAM32), PerGroup(z)) => {
            groups_with::<B, STREAM32>(codes, 0, z, scales, group_size, out)
        }
        (Some(_), Constant(o)) => {
            groups_with::<B, STREAM16>(codes, o, &[], scales, group_size, out)
        }
        (Some(_), PerGroup(z)) => groups_with::<B, STREAM16>(codes, 0, z, scales, group_size, out),
        (None, _) => {
            // Not at a 16-byte boundary: decode a block at a time into a buffer and copy it
            // out with streaming stores.
            let per_block = (4096 / group_size).max(1);
            let mut staging = vec![0f32; per_block * group_size];
            let group_bytes = group_size * B as usize / 8;
            for (block, dst) in out.chunks_mut(per_block * group_size).enumerate() {
                let first = block * per_block;
                let count = dst.len() / group_size;
                let staged = &mut staging[..dst.len()];
                let part = match offsets {
                    Constant(o) => Constant(o),
                    PerGroup(z) => PerGroup(&z[first..first + count]),
                };
                let codes = &codes[first * group_bytes..];
                let scales = &scales[first..first + count];
                dequantize_groups::<B>(codes, part, scales, group_size, staged, false);
                stream_copy(staged, dst);
            }
        }
    }
}

/// [`dequantize_groups`] with stores `MODE`; `zeros` holds the groups' offsets, or is empty
/// when every group's is `offset`.
#[inline]
#[target_feature(enable = "avx2")]
fn groups_with<const B: u32, const MODE: u8>(
    codes: &[u8],
    offset: i32,
    zeros: &[u8],
    scales: &[f32],
    group_size: usize,
    out: &mut [f32],
) {
    let b = B as usize;
    let unpack = Unpack::new::<B>();
    let group_bytes = group_size * b / 8;
    let constant = _mm256_set1_epi32(offset);
    if group_size == 8 && zeros.is_empty() {
        // One vector per group, the same offset for all.
        let (values, _) = out.as_chunks_mut::<8>();
        for (k, (dst, &scale)) in values.iter_mut().zip(scales).enumerate() {
            let difference =
                _mm256_sub_epi32(unpack.spread(broadcast_codes(codes, k * b)), constant);
            put::<MODE>(
                dst,
                _mm256_mul_ps(_mm256_cvtepi32_ps(difference), _mm256_set1_ps(scale)),
            );
        }
        return;
    }
    if group_size == 8 {
        // One vector per group, with its own offset.
        let (values, _) = out.as_chunks_mut::<8>();
        let groups = values.iter_mut().zip(scales.iter().zip(zeros));
        for (k, (dst, (&scale, &zero))) in groups.enumerate() {
            let codes = unpack.spread(broadcast_codes(codes, k * b));
            let difference = _mm256_sub_epi32(codes, _mm256_set1_epi32(i32::from(zero)));
            put::<MODE>(
                dst,
                _mm256_mul_ps(_mm256_cvtepi32_ps(difference), _mm256_set1_ps(scale)),
            );
        }
        return;
    }
    for (k, group) in out.chunks_exact_mut(group_size).enumerate() {
        let offset = match zeros.get(k) {
            Some(&zero) => _mm256_set1_epi32(i32::from(zero)),
            None => constant,
        };
        let scale = _mm256_set1_ps(scales[k]);
        let (vectors, _) = group.as_chunks_mut::<8>();
        for (i, dst) in vectors.iter_mut().enumerate() {
            let codes = unpack.spread(broadcast_codes(codes, k * group_bytes + i * b));
            let difference = _mm256_sub_epi32(codes, offset);
            put::<MODE>(dst, _mm256_mul_ps(_mm256_cvtepi32_ps(difference), scale));
        }
    }
}

/// The decoded values of eight packed codes: (code - offset) as f32 * scale.
#[inline]
#[target_feature(enable = "avx2")]
fn dequantize8(unpack: &Unpack, packed: u64, offset: __m256i, scale: __m256) -> __m256 {
    let difference = _mm256_sub_epi32(unpack.codes(packed), offset);
    _mm256_mul_ps(_mm256_cvtepi32_ps(difference), scale)
}

/// Transposes 8 x 8 floats held as 8 rows.
#[inline]
#[target_feature(enable = "avx2")]
fn transpose8(v: &mut [__m256; 8]) {
    let t = [
        _mm256_unpacklo_ps(v[0], v[1]),
        _mm256_unpackhi_ps(v[0], v[1]),
        _mm256_unpacklo_ps(v[2], v[3]),
        _mm256_unpackhi_ps(v[2], v[3]),
        _mm256_unpacklo_ps(v[4], v[5]),
        _mm256_unpackhi_ps(v[4], v[5]),
        _mm256_unpacklo_ps(v[6], v[7]),
        _mm256_unpackhi_ps(v[6], v[7]),
    ];
    let s = [
        _mm256_shuffle_ps::<0x44>(t[0], t[2]),
        _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
        _mm256_shuffle_ps::<0x44>(t[1], t[3]),
        _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
        _mm256_shuffle_ps::<0x44>(t[4], t[6]),
        _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
        _mm256_shuffle_ps::<0x44>(t[5], t[7]),
        _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
    ];
    for i in 0..4 {
        v[i] = _mm256_permute2f128_ps::<0x20>(s[i], s[i + 4]);
        v[i + 4] = _mm256_permute2f128_ps::<0x31>(s[i], s[i + 4]);
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn dequantize_columns<const B: u32>(
    codes: &[u8],
    row_bytes: usize,
    at: usize,
    offsets: &[i32],
    scales: &[f32],
    out: &mut [f32],
) {
    let cols = scales.len();
    let blocks = cols / 8;
    let unpack = Unpack::new::<B>();
    for block in 0..blocks {
        // Column j's 8 rows, then transposed to row i's 8 columns.
        let mut v = [_mm256_setzero_ps(); 8];
        for (j, slot) in v.iter_mut().enumerate() {
            let c = 8 * block + j;
            let difference = _mm256_sub_epi32(
                unpack.spread(broadcast_codes(codes, c * row_bytes + at)),
                _mm256_set1_epi32(offsets[c]),
            );
            *slot = _mm256_mul_ps(_mm256_cvtepi32_ps(difference), _mm256_set1_ps(scales[c]));
        }
        transpose8(&mut v);
        for (row, value) in out.chunks_exact_mut(cols).zip(v) {
            store(
                (&mut row[8 * block..8 * block + 8]).try_into().expect("8"),
                value,
            );
        }
    }
    portable::dequantize_columns::<B>(codes, row_bytes, at, offsets, scales, out, blocks * 8..cols);
}

#[inline]
#[target_feature(enable = "avx2")]
fn stream_copy(src: &[f32], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "stream_copy needs equal lengths");
    let head = dst.as_ptr().align_offset(32).min(dst.len());
    dst[..head].copy_from_slice(&src[..head]);
    let (src_blocks, src_tail) = src[head..].as_chunks::<8>();
    let (dst_blocks, dst_tail) = dst[head..].as_chunks_mut::<8>();
    for (s, d) in src_blocks.iter().zip(dst_blocks) {
        debug_assert_eq!(d.as_ptr() as usize % 32, 0);
        // SAFETY: `d` is 8 floats at a 32-byte boundary: the head was copied up to that
        // boundary and every block is 32 bytes.
        unsafe { _mm256_stream_ps(d.as_mut_ptr(), load(s)) }
    }
    dst_tail.copy_from_slice(src_tail);
}
