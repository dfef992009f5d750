//! The AVX-512 kernel (x86_64). Where the CPU has AVX-512 BW and VBMI as well as F: the
//! token-axis encoder and decoder a pass of about 512 tokens and 16 columns at a time
//! ([`token_encode`], [`token_decode`]; inputs of up to 1,024 columns in whole blocks of 16),
//! and the feature-axis encoder's groups of 8 sixteen at a time ([`eights`]). Where it has F
//! only, or for other widths, the token-axis encoder's tiles of 64 tokens and more go through
//! the wide-tile loop below. Every other loop is AVX2's (a CPU with AVX-512F has AVX2). An
//! [`Avx512`] value exists only once the CPU was seen to have both, and its `bytes` flag only
//! once BW and VBMI were seen: that is the invariant behind every `unsafe` call below.
//!
//! Along tokens, a tile of at least [`WIDE_TILE`] floats (64 tokens of 128 features) whose
//! columns are whole blocks of 16 is fitted row by row in memory order, up to 128 columns (8
//! blocks of 16) at once, their minima and maxima in 16 of the 32 registers: the input is read
//! as one sequential stream, which the hardware prefetchers follow (AVX2's 16 registers hold
//! one block of 8 columns, so it fits a block down the tile, 32 bytes a row apart, and
//! prefetches by hand; prefetching by hand here measured slower). Each block's parameters are AVX2's `symmetric8` and `asymmetric8` on each half, so
//! they are those functions' bits, which the tests hold to the scalar rule; its rows are then
//! quantized exactly as AVX2 does (IEEE division, clamp, conversion rounding half to even).
//! Codes are packed without a transpose: lane j of a block is column j, so row i's codes are
//! shifted to bits `B * i` of each lane and or-ed together, eight rows to a lane (rows 0-3 and
//! 4-7 in two lanes from 5 bits up), which is exactly the 8B-bit little-endian run that column
//! j's stream holds for those eight tokens.

mod eights;
mod token_decode;
mod token_encode;

pub(crate) use token_decode::{
    Offsets as ColumnOffsets, Streams, decode_down_columns, takes as decodes_down_columns,
};

use core::arch::x86_64::*;

use super::avx2::Avx2;
use super::avx2::fit::{Quant, asymmetric8, symmetric8};
use super::bits::write_packed;
use super::decode;
use super::encode;
use super::params::{ColumnQuant, GroupQuant};
use super::{ColumnParams, ColumnScratch, ColumnTileOut, Dense, Fit, Kernels, Parts, Stop};
use crate::layout::Layout;

/// Proof that the CPU has AVX-512F and AVX2.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx512 {
    avx2: Avx2,
    /// The CPU has AVX-512 BW and VBMI too.
    bytes: bool,
}

impl Avx512 {
    /// The proof, if this CPU has AVX-512F (and AVX2).
    pub(crate) fn detect() -> Option<Avx512> {
        let avx2 = Avx2::detect()?;
        let bytes = std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vbmi");
        std::arch::is_x86_feature_detected!("avx512f").then_some(Avx512 { avx2, bytes })
    }

    /// Whether the CPU has AVX-512 BW and VBMI, which [`encode_along_rows`] needs.
    pub(crate) fn has_bytes(self) -> bool {
        self.bytes
    }
}

/// The feature-axis encoder, instantiated with AVX-512 BW and VBMI enabled so that [`eights`]'
/// kernel inlines.
///
/// # Safety
/// `k.has_bytes()`: the CPU has AVX-512 BW and VBMI.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
pub(crate) unsafe fn encode_along_rows<const B: u32>(
    k: Avx512,
    m: Dense,
    layout: Layout,
    spare: Parts,
) -> Result<Parts, Stop> {
    encode::along_rows::<Avx512, B>(k, m, layout, spare)
}

/// The token-axis encoder: [`token_encode`]'s where the CPU has BW and VBMI and it takes the
/// shape, else the driver instantiated with AVX-512F enabled so that the kernel inlines.
#[target_feature(enable = "avx2,avx512f")]
pub(crate) fn encode_down_columns<const B: u32>(
    k: Avx512,
    m: Dense,
    layout: Layout,
    spare: Parts,
) -> Result<Parts, Stop> {
    if k.bytes && token_decode::takes(m.cols, layout.group_size) {
        // SAFETY: `bytes` proves the CPU has AVX-512 BW and VBMI; the shape is taken.
        return unsafe { token_encode::encode_down_columns::<B>(m, layout, spare) };
    }
    encode::down_columns::<Avx512, B>(k, m, layout, spare)
}

/// Columns per block (lanes of a register).
const LANES: usize = 16;

/// The least tile, in floats, that takes the 16-column path; smaller ones go to AVX2's kernel.
/// Measured in one process against AVX2 on 2^18 tokens x 128 features: groups of 64 and 128
/// tokens went from 0.49-0.60x memcpy to 0.55-0.79x; groups of 32 were within noise either way
/// (wide asymmetric codes slower), and groups of 8 fell from 0.49x to 0.32x (the fitting's
/// loads waited on memory that AVX2's hand-made prefetch brings; prefetching here did not help).
const WIDE_TILE: usize = 8192;

// SAFETY (every method): `self` proves the CPU has AVX2 (and AVX-512F).
impl Kernels for Avx512 {
    #[inline(always)]
    fn group_amax(self, group: &[f32]) -> (f32, bool) {
        self.avx2.group_amax(group)
    }

    #[inline(always)]
    fn group_range(self, group: &[f32]) -> (f32, f32, bool) {
        self.avx2.group_range(group)
    }

    #[inline(always)]
    fn quantize_pack<const B: u32>(self, group: &[f32], q: &GroupQuant, out: &mut [u8]) {
        self.avx2.quantize_pack::<B>(group, q, out)
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
        self.avx2
            .fit_quantize_pack8::<B>(values, group_size, fit, scales, zero_points, out)
    }

    #[inline(always)]
    fn packs16<const B: u32>(self, group_size: usize) -> bool {
        // At 8 bits AVX2's loop measured faster in cache (10.0 GB/s against 8.7-9.3): it has
        // no squeezing to skip, and the byte permutations cost more than its shuffles.
        self.bytes && group_size == 8 && B < 8
    }

    #[inline(always)]
    fn fit_quantize_pack16<const B: u32>(
        self,
        values: &[f32],
        group_size: usize,
        fit: Fit,
        scales: &mut [f32],
        zero_points: &mut [u8],
        out: &mut [u8],
    ) -> bool {
        if !self.packs16::<B>(group_size) {
            return super::pack16_as_eights::<Self, B>(
                self,
                values,
                group_size,
                fit,
                scales,
                zero_points,
                out,
            );
        }
        // SAFETY: `bytes` proves the CPU has AVX-512 BW and VBMI.
        unsafe { eights::fit_quantize_pack16x8::<B>(values, fit, scales, zero_points, out) }
    }

    #[inline(always)]
    fn columns_amax(self, tile: &[f32], amax: &mut [f32]) -> bool {
        self.avx2.columns_amax(tile, amax)
    }

    #[inline(always)]
    fn columns_range(self, tile: &[f32], lo: &mut [f32], hi: &mut [f32]) -> bool {
        self.avx2.columns_range(tile, lo, hi)
    }

    #[inline(always)]
    fn symmetric_columns(self, amax: &[f32], qmax: u8, scale: &mut [f32]) {
        self.avx2.symmetric_columns(amax, qmax, scale)
    }

    #[inline(always)]
    fn asymmetric_columns(self, lo: &[f32], hi: &[f32], levels: u8, q: &mut ColumnQuant) -> bool {
        self.avx2.asymmetric_columns(lo, hi, levels, q)
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
        self.avx2
            .quantize_pack_columns::<B>(tile, q, group_size, codes, row_bytes, at)
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
        let cols = scratch.low.len();
        if !cols.is_multiple_of(LANES) || tile.len() < WIDE_TILE {
            return self
                .avx2
                .fit_quantize_pack_columns::<B>(tile, group_size, fit, scratch, out);
        }
        unsafe { fit_quantize_pack_columns::<B>(tile, group_size, fit, cols, out) }
    }

    #[inline(always)]
    fn dequantize_group<const B: u32>(
        self,
        codes: &[u8],
        offset: i32,
        scale: f32,
        out: &mut [f32],
    ) {
        self.avx2.dequantize_group::<B>(codes, offset, scale, out)
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
        self.avx2
            .dequantize_groups::<B>(codes, offsets, scales, group_size, out, streaming)
    }

    #[inline(always)]
    fn dequantize_columns<const B: u32>(
        self,
        codes: &[u8],
        row_bytes: usize,
        at: usize,
        params: ColumnParams,
        out: &mut [f32],
    ) {
        self.avx2
            .dequantize_columns::<B>(codes, row_bytes, at, params, out)
    }

    #[inline(always)]
    fn stream_copy(self, src: &[f32], dst: &mut [f32]) {
        self.avx2.stream_copy(src, dst)
    }

    #[inline(always)]
    fn finish_streaming(self) {
        self.avx2.finish_streaming()
    }
}

/// A block's parameters, 16 lanes.
struct Quant16 {
    scale: __m512,
    low: __m512,
    high: __m512,
    offset: __m512i,
}

/// Two 8-lane halves as one 16-lane vector.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn join(low: __m256, high: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(low)),
        _mm256_castps_pd(high),
    ))
}

/// The 8-lane halves of a 16-lane vector.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn halves(v: __m512) -> (__m256, __m256) {
    let pd = _mm512_castps_pd(v);
    (
        _mm256_castpd_ps(_mm512_castpd512_pd256(pd)),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(pd)),
    )
}

/// AVX2's parameters of two 8-column halves as one 16-lane block.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn join_quant(first: &Quant, second: &Quant) -> Quant16 {
    Quant16 {
        scale: join(first.scale, second.scale),
        low: join(first.low, second.low),
        high: join(first.high, second.high),
        offset: _mm512_inserti64x4::<1>(_mm512_castsi256_si512(first.offset), second.offset),
    }
}

/// The 16 floats of `s` from `at` (bounds-checked).
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn load16(s: &[f32], at: usize) -> __m512 {
    let v: &[f32; LANES] = s[at..at + LANES].try_into().expect("16 floats");
    // SAFETY: reads exactly the 16 floats of `v`.
    unsafe { _mm512_loadu_ps(v.as_ptr()) }
}

/// Stored codes of 16 values, as i32 lanes: AVX2's `codes`, 16 lanes wide.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn codes16(x: __m512, q: &Quant16) -> __m512i {
    let v = _mm512_min_ps(_mm512_max_ps(_mm512_div_ps(x, q.scale), q.low), q.high);
    _mm512_add_epi32(_mm512_cvtps_epi32(v), q.offset)
}

/// Column-wise (min, 0) and (max, 0) of blocks `first..first + N` of a tile, row by row in
/// memory order (max |x| in `hi` when symmetric), and the or of every value's `x - x` (0
/// unless some value is not finite).
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn fit_blocks<const N: usize>(
    tile: &[f32],
    cols: usize,
    first: usize,
    fit: Fit,
) -> ([__m512; N], [__m512; N], __m512i) {
    let magnitude = _mm512_set1_epi32(i32::MAX);
    let mut lo = [_mm512_setzero_ps(); N];
    let mut hi = [_mm512_setzero_ps(); N];
    let mut bad = _mm512_setzero_si512();
    for row in tile.chunks_exact(cols) {
        for j in 0..N {
            let x = load16(row, LANES * (first + j));
            bad = _mm512_or_si512(bad, _mm512_castps_si512(_mm512_sub_ps(x, x)));
            match fit {
                Fit::Symmetric(_) => {
                    let abs = _mm512_and_si512(_mm512_castps_si512(x), magnitude);
                    hi[j] = _mm512_max_ps(hi[j], _mm512_castsi512_ps(abs));
                }
                Fit::Asymmetric(_) => {
                    lo[j] = _mm512_min_ps(lo[j], x);
                    hi[j] = _mm512_max_ps(hi[j], x);
                }
            }
        }
    }
    (lo, hi, bad)
}

/// Fits, quantizes and packs a tile of `cols` columns (a multiple of 16; see
/// [`Kernels::fit_quantize_pack_columns`]).
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn fit_quantize_pack_columns<const B: u32>(
    tile: &[f32],
    group_size: usize,
    fit: Fit,
    cols: usize,
    mut out: ColumnTileOut,
) -> Result<(), Stop> {
    let blocks = cols / LANES;
    let mut bad = _mm512_setzero_si512();
    let mut fits = true;
    let mut first = 0;
    while first < blocks {
        let (n, ranges, chunk_bad) = fit_chunk(tile, cols, first, blocks, fit);
        bad = _mm512_or_si512(bad, chunk_bad);
        for (j, &(lo, hi)) in ranges.iter().take(n).enumerate() {
            let base = LANES * (first + j);
            let (q, finite) = block_params(fit, lo, hi, base, &mut out);
            fits &= finite;
            quantize_pack_block::<B>(tile, cols, base, group_size, &q, &mut out);
        }
        first += n;
    }
    if _mm512_test_epi32_mask(bad, bad) != 0 {
        return Err(Stop::NonFinite);
    }
    if !fits {
        return Err(Stop::RangeOverflow);
    }
    Ok(())
}

/// Fits the blocks of a tile from block `first` on, up to 8 together (their 16 accumulators
/// and the row's values fill the registers), in chunks of 8, 4, 2 and 1: how many it fitted,
/// their ranges (as [`fit_blocks`]), and the non-finite flag.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn fit_chunk(
    tile: &[f32],
    cols: usize,
    first: usize,
    blocks: usize,
    fit: Fit,
) -> (usize, [(__m512, __m512); 8], __m512i) {
    let n = match blocks - first {
        8.. => 8,
        4..=7 => 4,
        2 | 3 => 2,
        _ => 1,
    };
    let mut ranges = [(_mm512_setzero_ps(), _mm512_setzero_ps()); 8];
    let bad = match n {
        8 => spread::<8>(fit_blocks::<8>(tile, cols, first, fit), &mut ranges),
        4 => spread::<4>(fit_blocks::<4>(tile, cols, first, fit), &mut ranges),
        2 => spread::<2>(fit_blocks::<2>(tile, cols, first, fit), &mut ranges),
        _ => spread::<1>(fit_blocks::<1>(tile, cols, first, fit), &mut ranges),
    };
    (n, ranges, bad)
}

/// [`fit_blocks`]' ranges into `ranges` (block by block), and its flag.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn spread<const N: usize>(
    fitted: ([__m512; N], [__m512; N], __m512i),
    ranges: &mut [(__m512, __m512); 8],
) -> __m512i {
    let (lo, hi, bad) = fitted;
    for j in 0..N {
        ranges[j] = (lo[j], hi[j]);
    }
    bad
}

/// The parameters of 16 columns whose fitted range is [`lo`, `hi`] (max |x| in `hi` when
/// symmetric): AVX2's `symmetric8` or `asymmetric8` on each half, and whether every scale is
/// finite.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn quant16(fit: Fit, lo: __m512, hi: __m512) -> (Quant16, bool) {
    let (lo, hi) = (halves(lo), halves(hi));
    let (first, second, finite) = match fit {
        Fit::Symmetric(qmax) => (symmetric8(hi.0, qmax), symmetric8(hi.1, qmax), true),
        Fit::Asymmetric(levels) => {
            let (first, finite_first) = asymmetric8(lo.0, hi.0, levels);
            let (second, finite_second) = asymmetric8(lo.1, hi.1, levels);
            let finite = _mm256_movemask_ps(_mm256_and_ps(finite_first, finite_second));
            (first, second, finite == 0xFF)
        }
    };
    (join_quant(&first, &second), finite)
}

/// The parameters of the 16 columns from `base` whose fitted range is [`lo`, `hi`] (max |x| in
/// `hi` when symmetric), written to `out`, and whether every scale is finite.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn block_params(
    fit: Fit,
    lo: __m512,
    hi: __m512,
    base: usize,
    out: &mut ColumnTileOut,
) -> (Quant16, bool) {
    let (q, finite) = quant16(fit, lo, hi);
    let (first, second) = halves(q.scale);
    let stride = out.stride;
    // Through two 256-bit stores: 32-bit loads from one 512-bit store measured far slower
    // (store forwarding), the cost of a whole block at 8 tokens a group.
    let mut scales = [0f32; LANES];
    // SAFETY: the stores write the 16 floats of `scales`, 8 each.
    unsafe {
        _mm256_storeu_ps(scales.as_mut_ptr(), first);
        _mm256_storeu_ps(scales[8..].as_mut_ptr(), second);
    }
    for (j, &scale) in scales.iter().enumerate() {
        out.scales[(base + j) * stride] = scale;
    }
    if let Fit::Asymmetric(_) = fit {
        let mut zeros = [0u8; LANES];
        // SAFETY: writes exactly the 16 bytes of `zeros` (each offset is 0..=255).
        unsafe { _mm_storeu_si128(zeros.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(q.offset)) };
        for (j, &zero) in zeros.iter().enumerate() {
            out.zero_points[(base + j) * stride] = zero;
        }
    }
    (q, finite)
}

/// Quantizes the 16 columns from `base` of a tile of up to `group_size` rows (missing rows are
/// zero padding) and writes column j's `group_size * B / 8` bytes at
/// `out.codes[(base + j) * out.row_bytes + out.at..]`.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn quantize_pack_block<const B: u32>(
    tile: &[f32],
    cols: usize,
    base: usize,
    group_size: usize,
    q: &Quant16,
    out: &mut ColumnTileOut,
) {
    let b = B as usize;
    let rows = tile.len() / cols;
    for k in 0..group_size / 8 {
        let first = 8 * k;
        // Rows 0-3 of the eight at bits B * i of each lane, rows 4-7 likewise in `high`
        // (in `low` too, from bit 4B, when 8B bits fit a lane).
        let (mut low, mut high) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        for i in 0..8 {
            let r = first + i;
            let x = if r < rows {
                load16(tile, r * cols + base)
            } else {
                _mm512_setzero_ps()
            };
            let c = codes16(x, q);
            if B <= 4 || i < 4 {
                let shift = _mm_cvtsi32_si128((b * i) as i32);
                low = _mm512_or_si512(low, _mm512_sll_epi32(c, shift));
            } else {
                let shift = _mm_cvtsi32_si128((b * (i - 4)) as i32);
                high = _mm512_or_si512(high, _mm512_sll_epi32(c, shift));
            }
        }
        let (mut lows, mut highs) = ([0u32; LANES], [0u32; LANES]);
        // SAFETY: the stores write the 16 u32s of each array, 8 each (see `block_params` on
        // why 256 bits at a time).
        unsafe {
            let pointer = |a: &mut [u32; LANES], at: usize| a[at..].as_mut_ptr().cast::<__m256i>();
            _mm256_storeu_si256(pointer(&mut lows, 0), _mm512_castsi512_si256(low));
            _mm256_storeu_si256(pointer(&mut lows, 8), _mm512_extracti64x4_epi64::<1>(low));
            if B > 4 {
                _mm256_storeu_si256(pointer(&mut highs, 0), _mm512_castsi512_si256(high));
                _mm256_storeu_si256(pointer(&mut highs, 8), _mm512_extracti64x4_epi64::<1>(high));
            }
        }
        for j in 0..LANES {
            let packed = u64::from(lows[j]) | u64::from(highs[j]) << (4 * b);
            let start = (base + j) * out.row_bytes + out.at + k * b;
            write_packed::<B>(&mut out.codes[start..], packed);
        }
    }
}
