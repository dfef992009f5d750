//! Token-axis encoding (groups down the input's columns) for CPUs with AVX-512 BW and VBMI, a
//! pass of about 512 tokens at a time, the inverse of [`super::token_decode`]:
//! - each group's rows are read once in memory order and fitted, 8 blocks of 16 columns at a
//!   time ([`fit_blocks`]); each block's parameters are AVX2's `symmetric8` and `asymmetric8`
//!   on its halves, so they are those functions' bits, which the tests hold to the scalar rule;
//!   the group's rows are then quantized as AVX2 does (IEEE division, clamp, conversion
//!   rounding half to even), a row's 16 codes narrowed to 16 bytes of a tile of 16 tokens x 16
//!   columns, and the scales and zero points kept a row of all columns per group;
//! - each tile's bytes are transposed in registers to 16 columns of 16 codes
//!   ([`transpose_bytes`]), each run of 8 codes is squeezed to its 8B-bit run (`bits::squeeze`,
//!   512 bits wide), and one byte permutation puts each column's 2B bytes side by side, which
//!   go to that column's run of the pass;
//! - each column's run of codes is copied to its stream once per pass, and the scales and zero
//!   points are transposed 16 groups x 16 columns into each column's run.
//!
//! Why: AVX2's loop and the wide-tile loop above write each block's scales, zero points and
//! packed codes column by column with scalar stores, a run of 8 tokens at a time at groups of
//! 8; in cache they encoded 5.0-9.0 GB/s at groups of 8 and 32, no faster than from memory.

use core::arch::x86_64::*;

#[cfg(doc)]
use super::token_decode::takes;
use super::token_decode::{pass_tokens, prefetch_run, transpose_bytes, transpose16};
use super::{LANES, Quant16, codes16, fit_chunk, load16, quant16};
use crate::fast::encode::overwritable;
use crate::fast::{Dense, Fit, Parts, Stop};
use crate::layout::{Layout, Mode};

/// Passes ahead whose output runs (codes, scales, zero points) are prefetched into L2 as each
/// column's runs are written, as the decoder prefetches its input: the runs of all columns
/// share a few cache sets, and a store's read for ownership otherwise waits on memory. Measured
/// on bench's shape, asymmetric 7-bit groups of 8, in a slow phase of the machine: 0.40-0.53x
/// memcpy two passes ahead with the hint for L2, 0.34-0.36x with none, 0.36-0.48x with the
/// write hint, 0.36-0.45x three passes ahead.
const PASSES_AHEAD: usize = 2;

/// How far ahead of the group being fitted its input is prefetched (into L2), for groups of
/// at most [`PREFETCHED_GROUP_BYTES`]. On bench's shape in alternation: asymmetric 6-bit
/// groups of 8 (4 KiB) read 0.62-0.68x memcpy 4 or 8 KiB ahead against 0.41-0.56x without (and
/// 0.45-0.52x with the hint for L1); symmetric 4-bit groups of 32 (16 KiB), prefetched the
/// same way a group at a time, read 0.67-0.74x against 0.78x without, so larger groups are
/// left to the hardware prefetcher.
const INPUT_AHEAD_BYTES: usize = 4096;
const PREFETCHED_GROUP_BYTES: usize = 8192;

/// Encodes `m` (tokens x features, row-major) along tokens into `spare`'s memory: codes,
/// scales and (asymmetric) unpacked zero points, as [`crate::fast::encode::down_columns`]
/// writes them.
///
/// # Safety
/// The CPU has AVX2, AVX-512 F, BW and VBMI, and [`takes`]`(m.cols, layout.group_size)`.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
pub(crate) unsafe fn encode_down_columns<const B: u32>(
    m: Dense,
    layout: Layout,
    spare: Parts,
) -> Result<Parts, Stop> {
    let b = B as usize;
    let g = layout.group_size;
    debug_assert!(g.is_multiple_of(8));
    let (cols, tokens) = (m.cols, m.rows);
    let groups = tokens.div_ceil(g);
    let group_bytes = g * b / 8;
    let column_bytes = groups * group_bytes;
    let asymmetric = layout.mode == Mode::Asymmetric;
    let mut codes = overwritable(spare.codes, cols * column_bytes);
    let mut scales = overwritable(spare.scales, cols * groups);
    let mut zero_points = overwritable(
        spare.zero_points,
        if asymmetric { cols * groups } else { 0 },
    );
    let fit = match layout.mode {
        Mode::Symmetric => Fit::Symmetric(layout.bits.qmax()),
        Mode::Asymmetric => Fit::Asymmetric(layout.bits.max_code()),
    };
    let pass = pass_tokens(g);
    let pass_groups = pass / g;
    let tiles = pass / LANES;
    let blocks = cols / LANES;
    // Column c's packed codes of the pass at `runs[c * run_stride..]`, 2B bytes per tile.
    let run_stride = tiles * 2 * b;
    let mut tile_codes = vec![0u8; blocks * tiles * 256];
    let mut runs = vec![0u8; cols * run_stride];
    // Group j's parameters of every column at `[j * cols..]`; whole rows of 16 groups.
    let param_rows = pass_groups.next_multiple_of(LANES);
    let mut scale_rows = vec![0f32; param_rows * cols];
    let mut zero_rows = vec![0u8; if asymmetric { param_rows * cols } else { 0 }];
    let mut bad = _mm512_setzero_si512();
    let mut fits = true;
    let squeeze = Squeeze::new::<B>();
    let run_mask = (1u64 << (2 * b)) - 1;
    for (p, part) in m.data.chunks(pass * cols).enumerate() {
        let first_group = p * pass_groups;
        let part_groups = (part.len() / cols).div_ceil(g);
        for (j, rows) in part.chunks(g * cols).enumerate() {
            if g * cols * 4 <= PREFETCHED_GROUP_BYTES {
                let at = (p * pass + j * g) * cols + INPUT_AHEAD_BYTES / 4;
                prefetch_run(m.data, at, rows.len());
            }
            let mut first = 0;
            while first < blocks {
                let (n, ranges, chunk_bad) = fit_chunk(rows, cols, first, blocks, fit);
                bad = _mm512_or_si512(bad, chunk_bad);
                for (i, &(lo, hi)) in ranges.iter().take(n).enumerate() {
                    let block = first + i;
                    let (q, finite) = quant16(fit, lo, hi);
                    fits &= finite;
                    let at = j * cols + block * LANES;
                    let scale_row: &mut [f32; LANES] =
                        (&mut scale_rows[at..at + LANES]).try_into().expect("16");
                    // SAFETY: writes the 16 floats of `scale_row`.
                    unsafe { _mm512_storeu_ps(scale_row.as_mut_ptr(), q.scale) };
                    if asymmetric {
                        let zero_row: &mut [u8; LANES] =
                            (&mut zero_rows[at..at + LANES]).try_into().expect("16");
                        // SAFETY: writes the 16 bytes of `zero_row` (each offset is 0..=255).
                        unsafe {
                            _mm_storeu_si128(
                                zero_row.as_mut_ptr().cast(),
                                _mm512_cvtepi32_epi8(q.offset),
                            )
                        };
                    }
                    let block_tiles = &mut tile_codes[block * tiles * 256..][..tiles * 256];
                    quantize_rows(rows, cols, block, j * g, g, &q, block_tiles);
                }
                first += n;
            }
        }
        let coded_tiles = (part_groups * g).div_ceil(LANES);
        for block in 0..blocks {
            for tile in 0..coded_tiles {
                let bytes = &tile_codes[(block * tiles + tile) * 256..][..256];
                let columns = transpose_bytes(bytes.try_into().expect("a tile of 256 codes"));
                for (k, &v) in columns.iter().enumerate() {
                    // Column 4k + l's 2B bytes at the start of 16-byte lane l.
                    let packed = squeeze.apply(v);
                    let lanes = [
                        packed,
                        _mm512_alignr_epi64::<2>(packed, packed),
                        _mm512_alignr_epi64::<4>(packed, packed),
                        _mm512_alignr_epi64::<6>(packed, packed),
                    ];
                    for (l, lane) in lanes.into_iter().enumerate() {
                        let c = block * LANES + 4 * k + l;
                        let to = &mut runs[c * run_stride + tile * 2 * b..][..2 * b];
                        // SAFETY: the mask writes the 2B bytes of `to` only.
                        unsafe { _mm512_mask_storeu_epi8(to.as_mut_ptr().cast(), run_mask, lane) };
                    }
                }
            }
        }
        let run = part_groups * group_bytes;
        let ahead = first_group + PASSES_AHEAD * pass_groups;
        for c in 0..cols {
            prefetch_run(&codes, c * column_bytes + ahead * group_bytes, run);
            prefetch_run(&scales, c * groups + ahead, part_groups);
            prefetch_run(&zero_points, c * groups + ahead, part_groups);
            let at = c * column_bytes + first_group * group_bytes;
            copy_bytes(&mut codes[at..at + run], &runs[c * run_stride..][..run]);
        }
        for block in 0..blocks {
            for first in (0..part_groups).step_by(LANES) {
                let count = (part_groups - first).min(LANES);
                let column = |lane: usize| (block * LANES + lane) * groups + first_group + first;
                let mut v = [_mm512_setzero_ps(); LANES];
                for (i, x) in v.iter_mut().enumerate() {
                    *x = load16(&scale_rows, (first + i) * cols + block * LANES);
                }
                transpose16(&mut v);
                let mask = ((1u32 << count) - 1) as u16;
                for (lane, x) in v.iter().enumerate() {
                    let to = &mut scales[column(lane)..][..count];
                    // SAFETY: the mask writes `to`'s `count` floats only.
                    unsafe { _mm512_mask_storeu_ps(to.as_mut_ptr(), mask, *x) };
                }
                if asymmetric {
                    let mut tile = [0u8; 256];
                    for (i, row) in tile.chunks_exact_mut(LANES).enumerate() {
                        let at = (first + i) * cols + block * LANES;
                        row.copy_from_slice(&zero_rows[at..at + LANES]);
                    }
                    let columns = transpose_bytes(&tile);
                    let mask = (1u64 << count) - 1;
                    for (k, &v) in columns.iter().enumerate() {
                        let lanes = [
                            v,
                            _mm512_alignr_epi64::<2>(v, v),
                            _mm512_alignr_epi64::<4>(v, v),
                            _mm512_alignr_epi64::<6>(v, v),
                        ];
                        for (l, lane) in lanes.into_iter().enumerate() {
                            let to = &mut zero_points[column(4 * k + l)..][..count];
                            // SAFETY: the mask writes `to`'s `count` bytes only.
                            unsafe { _mm512_mask_storeu_epi8(to.as_mut_ptr().cast(), mask, lane) };
                        }
                    }
                }
            }
        }
    }
    if _mm512_test_epi32_mask(bad, bad) != 0 {
        return Err(Stop::NonFinite);
    }
    if !fits {
        return Err(Stop::RangeOverflow);
    }
    Ok(Parts {
        codes,
        scales,
        zero_points,
    })
}

/// Quantizes block `block`'s 16 columns of a group's `rows` (fewer than `group_size` in a last
/// partial group: the rest are zero padding), the pass's tokens from `first_token`, into the
/// block's tiles (`tiles[256 t + 16 i..][..16]` holds token 16t + i's 16 codes).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
fn quantize_rows(
    rows: &[f32],
    cols: usize,
    block: usize,
    first_token: usize,
    group_size: usize,
    q: &Quant16,
    tiles: &mut [u8],
) {
    let present = rows.len() / cols;
    let to = &mut tiles[first_token * LANES..(first_token + group_size) * LANES];
    let (whole, padding) = to.split_at_mut(present.min(group_size) * LANES);
    if present > 0 {
        // One bounds check for the rows read below.
        assert!((present - 1) * cols + (block + 1) * LANES <= rows.len());
    }
    let from = rows[block * LANES..].as_ptr();
    for (r, codes) in whole.chunks_exact_mut(LANES).enumerate() {
        // SAFETY: row r < present is in bounds (asserted above); `codes` is 16 bytes.
        unsafe {
            let x = _mm512_loadu_ps(from.add(r * cols));
            _mm_storeu_si128(
                codes.as_mut_ptr().cast(),
                _mm512_cvtepi32_epi8(codes16(x, q)),
            );
        }
    }
    if !padding.is_empty() {
        let zero = _mm512_cvtepi32_epi8(codes16(_mm512_setzero_ps(), q));
        for codes in padding.chunks_exact_mut(LANES) {
            // SAFETY: `codes` is 16 bytes.
            unsafe { _mm_storeu_si128(codes.as_mut_ptr().cast(), zero) };
        }
    }
}

/// Copies `src` to `dst` (equal lengths) 64 bytes at a time, the last part masked: the runs
/// are a few hundred bytes, for which a call to memmove cost about a tenth of the encoder's
/// time in cache.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_bytes needs equal lengths");
    for (d, s) in dst.chunks_mut(64).zip(src.chunks(64)) {
        let mask = if s.len() == 64 {
            u64::MAX
        } else {
            (1u64 << s.len()) - 1
        };
        // SAFETY: the mask reads and writes the chunks' bytes only.
        unsafe {
            let v = _mm512_maskz_loadu_epi8(mask, s.as_ptr().cast());
            _mm512_mask_storeu_epi8(d.as_mut_ptr().cast(), mask, v);
        }
    }
}

/// Packs 16-byte lanes of 16 codes each (< 2^B) into their 2B-byte runs, each at the start of
/// its lane.
struct Squeeze {
    /// Bits::squeeze's three shifts, as counts.
    shifts: [__m128i; 3],
    /// Byte 16l + i takes byte 16l + i (i < B) or 16l + 8 + (i - B) (B <= i < 2B).
    gather: __m512i,
}

impl Squeeze {
    #[inline]
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
    fn new<const B: u32>() -> Squeeze {
        let b = B as usize;
        let gather: [u8; 64] = std::array::from_fn(|i| {
            let (lane, within) = (i / 16, i % 16);
            if within < b {
                (16 * lane + within) as u8
            } else if within < 2 * b {
                (16 * lane + 8 + within - b) as u8
            } else {
                0
            }
        });
        Squeeze {
            shifts: [
                _mm_cvtsi32_si128(8 - B as i32),
                _mm_cvtsi32_si128(16 - 2 * B as i32),
                _mm_cvtsi32_si128(32 - 4 * B as i32),
            ],
            // SAFETY: reads the 64 bytes of `gather`.
            gather: unsafe { _mm512_loadu_si512(gather.as_ptr().cast()) },
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
    fn apply(&self, v: __m512i) -> __m512i {
        let v = squeeze_step(v, 0x00FF_00FF_00FF_00FF, self.shifts[0]);
        let v = squeeze_step(v, 0x0000_FFFF_0000_FFFF, self.shifts[1]);
        let v = squeeze_step(v, 0x0000_0000_FFFF_FFFF, self.shifts[2]);
        _mm512_permutexvar_epi8(self.gather, v)
    }
}

/// One step of `bits::squeeze` in every 64-bit lane: the bits of `keep` stay, the others move
/// down by `shift`.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn squeeze_step(v: __m512i, keep: i64, shift: __m128i) -> __m512i {
    let keep = _mm512_set1_epi64(keep);
    let kept = _mm512_and_si512(v, keep);
    let moved = _mm512_andnot_si512(keep, v);
    _mm512_or_si512(kept, _mm512_srl_epi64(moved, shift))
}
