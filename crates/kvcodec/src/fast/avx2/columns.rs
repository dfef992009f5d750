//! Quantizing and packing down columns: a tile of rows, 8 columns at a time, its codes
//! transposed into each column's stream, with or without fitting the tile first.

use core::arch::x86_64::*;

use super::fit::{Quant, asymmetric8, symmetric8};
use super::pack::{codes, pack8, squeeze4, transpose_codes};
use super::vectors::{all_zero, load, load_at, load_i32, magnitude_mask, non_finite_bits, store};
use crate::fast::bits::write_packed;
use crate::fast::params::ColumnQuant;
use crate::fast::{ColumnScratch, ColumnTileOut, Fit, Stop, portable};

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn quantize_pack_columns<const B: u32>(
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
///
/// [`Kernels::fit_quantize_pack_columns`]: crate::fast::Kernels::fit_quantize_pack_columns
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn fit_quantize_pack_columns<const B: u32>(
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
    // work. Larger tiles: the next tile, half a line per row of each block as the fitting goes
    // (a burst of the whole tile at its start stalled on the line-fill buffers, and the loads
    // then waited on memory), into L1 for tiles of up to 16 KiB and into L2 beyond (a 64 KiB
    // tile does not fit L1 beside the one in hand; either hint the other way measured slower).
    let small = tile.len() <= AHEAD;
    let l1_ahead = tile.len() <= 4096;
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
        // The block's own flag, so that the loop's chain stays in a register.
        let mut block_bad = _mm256_setzero_ps();
        for r in 0..rows {
            if !small {
                let next = tile
                    .as_ptr()
                    .wrapping_add(tile.len() + (block * rows + r) * 8);
                // SAFETY: a prefetch never faults, whatever the address.
                #[allow(unused_unsafe)]
                unsafe {
                    if l1_ahead {
                        _mm_prefetch::<_MM_HINT_T0>(next.cast::<i8>())
                    } else {
                        _mm_prefetch::<_MM_HINT_T1>(next.cast::<i8>())
                    }
                };
            }
            let x = load_at(tile, r * cols + base);
            block_bad = _mm256_or_ps(block_bad, non_finite_bits(x));
            match fit {
                Fit::Symmetric(_) => hi = _mm256_max_ps(hi, _mm256_and_ps(x, magnitude)),
                Fit::Asymmetric(_) => {
                    lo = _mm256_min_ps(lo, x);
                    hi = _mm256_max_ps(hi, x);
                }
            }
        }
        bad = _mm256_or_ps(bad, block_bad);
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
                q.scale[c] = crate::fast::params::symmetric(low[c], qmax).scale;
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
