//! Encoding drivers for group sizes that are a multiple of 8: one fused pass per group (or per
//! tile of `group_size` rows) that fits the group in L1, computes its parameters and packs its
//! codes straight into the preallocated stream. Generic over the kernels and inlined into each
//! instruction set's entry point, so the kernels inline with that instruction set enabled.

use crate::layout::{Layout, Mode};

use super::params::{self, ColumnQuant, GroupQuant};
use super::{ColumnScratch, ColumnTileOut, Dense, Fit, Kernels, Parts, SCRIBBLE, Stop};

/// One group's parameters, or why the encoder stops there (a non-finite value first).
#[inline(always)]
pub(crate) fn fit_group<K: Kernels>(k: K, group: &[f32], fit: Fit) -> Result<GroupQuant, Stop> {
    match fit {
        Fit::Symmetric(qmax) => {
            let (amax, finite) = k.group_amax(group);
            if !finite {
                return Err(Stop::NonFinite);
            }
            Ok(params::symmetric(amax, qmax))
        }
        Fit::Asymmetric(levels) => {
            let (lo, hi, finite) = k.group_range(group);
            if !finite {
                return Err(Stop::NonFinite);
            }
            params::asymmetric(lo, hi, levels).ok_or(Stop::RangeOverflow)
        }
    }
}

/// Fits, quantizes and packs one group: its scale into `scale`, its zero point into `zero`
/// (asymmetric), its codes into `out` (scribbling as [`Kernels::quantize_pack`] does).
#[inline(always)]
pub(crate) fn pack_group<K: Kernels, const B: u32>(
    k: K,
    group: &[f32],
    fit: Fit,
    scale: &mut f32,
    zero: Option<&mut u8>,
    out: &mut [u8],
) -> Result<(), Stop> {
    let q = fit_group(k, group, fit)?;
    *scale = q.scale;
    if let Some(zero) = zero {
        *zero = q.offset as u8;
    }
    k.quantize_pack::<B>(group, &q, out);
    Ok(())
}

/// The largest group size whose groups are fitted 8 at a time by
/// [`Kernels::fit_quantize_pack8`] (8 groups of 128 are 4 KiB, in L1 between fitting and
/// quantizing); larger groups amortize their own fitting. Raised from 64 to 128: in cache,
/// groups of 128 encoded at 11.5-15.3 GB/s batched against 7.3-11.6 one at a time.
const BATCHED_GROUP_SIZE: usize = 128;

/// Encodes `m` whose rows are the grouped rows (groups run along each row).
#[inline(always)]
pub(crate) fn along_rows<K: Kernels, const B: u32>(
    k: K,
    m: Dense,
    layout: Layout,
    spare: Parts,
) -> Result<Parts, Stop> {
    let g = layout.group_size;
    debug_assert_eq!(g % 8, 0);
    // Rows made of whole groups lie end to end in the input, the code stream, the scales and
    // the zero points alike: then the matrix is encoded as one long row, so that batches of 8
    // groups run across rows (in the same order the groups are met row by row).
    let (rows, row_len) = if m.cols.is_multiple_of(g) && m.rows > 1 {
        (1, m.rows * m.cols)
    } else {
        (m.rows, m.cols)
    };
    let groups = row_len.div_ceil(g);
    let group_bytes = g * B as usize / 8;
    let row_bytes = groups * group_bytes;
    // Slack for the scribbling packer, cut off at the end.
    let zero_count = match layout.mode {
        Mode::Symmetric => 0,
        Mode::Asymmetric => rows * groups,
    };
    let Parts {
        mut codes,
        mut scales,
        mut zero_points,
    } = Parts {
        // Every byte up to the slack is written: each group's codes (a partial group's
        // padding too), scales and zero points.
        codes: overwritable(spare.codes, rows * row_bytes + SCRIBBLE),
        scales: overwritable(spare.scales, rows * groups),
        zero_points: overwritable(spare.zero_points, zero_count),
    };
    // The partial last group of each row, zero-padded (the padding stays zero).
    let mut padded = vec![0f32; if row_len % g == 0 { 0 } else { g }];
    let fit = match layout.mode {
        Mode::Symmetric => Fit::Symmetric(layout.bits.qmax()),
        Mode::Asymmetric => Fit::Asymmetric(layout.bits.max_code()),
    };
    let asymmetric = layout.mode == Mode::Asymmetric;
    // Whole groups per row taken 16 or 8 at a time.
    let batched = if g <= BATCHED_GROUP_SIZE {
        row_len / g
    } else {
        0
    };
    let sixteens = k.packs16::<B>(g);
    for (r, row) in m.data.chunks_exact(row_len).enumerate() {
        let mut first = 0;
        while first + 8 <= batched {
            let n = if sixteens && first + 16 <= batched {
                16
            } else {
                8
            };
            let start = first * g;
            let at = r * row_bytes + first * group_bytes;
            let index = r * groups + first;
            let zeros: &mut [u8] = if asymmetric {
                &mut zero_points[index..index + n]
            } else {
                &mut []
            };
            let values = &row[start..start + n * g];
            let batch_scales = &mut scales[index..index + n];
            let batch_codes = &mut codes[at..at + n * group_bytes + SCRIBBLE];
            let packed = if n == 16 {
                k.fit_quantize_pack16::<B>(values, g, fit, batch_scales, zeros, batch_codes)
            } else {
                k.fit_quantize_pack8::<B>(values, g, fit, batch_scales, zeros, batch_codes)
            };
            if !packed {
                // Some group stops the encoder: redo them one at a time to stop where that
                // would, and why.
                for i in 0..n {
                    let (s, at) = (start + i * g, at + i * group_bytes);
                    pack_group::<K, B>(
                        k,
                        &row[s..s + g],
                        fit,
                        &mut scales[index + i],
                        asymmetric.then(|| &mut zero_points[index + i]),
                        &mut codes[at..at + group_bytes + SCRIBBLE],
                    )?;
                }
            }
            first += n;
        }
        for group_index in first..groups {
            let start = group_index * g;
            let group = if start + g <= row_len {
                &row[start..start + g]
            } else {
                padded[..row_len - start].copy_from_slice(&row[start..]);
                &padded[..]
            };
            let index = r * groups + group_index;
            let at = r * row_bytes + group_index * group_bytes;
            pack_group::<K, B>(
                k,
                group,
                fit,
                &mut scales[index],
                asymmetric.then(|| &mut zero_points[index]),
                &mut codes[at..at + group_bytes + SCRIBBLE],
            )?;
        }
    }
    codes.truncate(rows * row_bytes);
    Ok(Parts {
        codes,
        scales,
        zero_points,
    })
}

/// Bytes of codes that [`down_columns`] stages per batch of tiles, at most (unless one tile
/// alone needs more).
const STAGED_BYTES: usize = 128 * 1024;

/// Tiles per batch of [`down_columns`]: enough that each column's codes of a batch fill
/// several cache lines and its scales at least one.
const fn tiles_per_batch(group_size: usize, cols: usize, group_bytes: usize) -> usize {
    let wanted = if group_size >= 64 {
        16
    } else {
        1024 / group_size
    };
    let fits = STAGED_BYTES / (cols * group_bytes);
    let t = if wanted < fits { wanted } else { fits };
    if t == 0 { 1 } else { t }
}

/// `len` values in `spare`'s memory, holding whatever it held (zeros past its old length), or
/// a fresh zeroed allocation if it is too small: for outputs that are written in full, so that
/// reusing memory does not cost a pass of zeroing it.
pub(crate) fn overwritable<T: Copy + Default>(mut spare: Vec<T>, len: usize) -> Vec<T> {
    if spare.capacity() < len {
        return vec![T::default(); len];
    }
    spare.truncate(len);
    spare.resize(len, T::default());
    spare
}

/// Encodes `m` whose columns are the grouped rows (groups run down each column), a tile of
/// `group_size` rows at a time.
///
/// The output is column-major: each tile writes a few bytes of codes and one scale (and zero
/// point) to every column, and columns lie a whole code row apart, so writing them straight
/// out would touch one cache line (and page) per column per tile, all mapping to the same
/// cache sets. Instead a batch of tiles is staged in small column-major buffers that stay in
/// cache, and each column's part of the batch is then copied out as one contiguous run.
#[inline(always)]
pub(crate) fn down_columns<K: Kernels, const B: u32>(
    k: K,
    m: Dense,
    layout: Layout,
    spare: Parts,
) -> Result<Parts, Stop> {
    let g = layout.group_size;
    debug_assert_eq!(g % 8, 0);
    let (cols, row_len) = (m.cols, m.rows);
    let groups = row_len.div_ceil(g);
    let group_bytes = g * B as usize / 8;
    let row_bytes = groups * group_bytes;
    let asymmetric = layout.mode == Mode::Asymmetric;
    let zero_count = if asymmetric { cols * groups } else { 0 };
    let Parts {
        mut codes,
        mut scales,
        mut zero_points,
    } = Parts {
        codes: overwritable(spare.codes, cols * row_bytes),
        scales: overwritable(spare.scales, cols * groups),
        zero_points: overwritable(spare.zero_points, zero_count),
    };
    if cols == 0 {
        return Ok(Parts {
            codes,
            scales,
            zero_points,
        });
    }
    let fit = match layout.mode {
        Mode::Symmetric => Fit::Symmetric(layout.bits.qmax()),
        Mode::Asymmetric => Fit::Asymmetric(layout.bits.max_code()),
    };
    let mut scratch = ColumnScratch {
        low: vec![0f32; cols],
        high: vec![0f32; cols],
        q: ColumnQuant::new(cols, layout.bits.qmax()),
    };
    let batch = tiles_per_batch(g, cols, group_bytes);
    // Column c's part of the batch: codes at c * staged_row.., scales and zero points at
    // c * batch.., tile by tile.
    let staged_row = batch * group_bytes;
    // The runs are copied out with ordinary stores. Stores that bypass the caches (tried for
    // runs of 1 KiB and more, which only 8-bit codes reach) ran symmetric 8-bit codes at
    // 0.33-0.39x memcpy in full runs of `bench --only kv`, against 0.49-0.67x without.
    let mut staged_codes = vec![0u8; cols * staged_row];
    let mut staged_scales = vec![0f32; cols * batch];
    let mut staged_zeros = vec![0u8; if asymmetric { cols * batch } else { 0 }];
    for (b, tiles) in m.data.chunks(batch * g * cols).enumerate() {
        let first = b * batch;
        let count = tiles.len().div_ceil(g * cols);
        for (i, tile) in tiles.chunks(g * cols).enumerate() {
            let out = ColumnTileOut {
                scales: &mut staged_scales[i..],
                zero_points: if asymmetric {
                    &mut staged_zeros[i..]
                } else {
                    &mut []
                },
                stride: batch,
                codes: &mut staged_codes,
                row_bytes: staged_row,
                at: i * group_bytes,
            };
            // On a stop, which error the reference would name is decided by the caller (a
            // non-finite value anywhere comes first).
            k.fit_quantize_pack_columns::<B>(tile, g, fit, &mut scratch, out)?;
        }
        let run = count * group_bytes;
        for c in 0..cols {
            let at = c * row_bytes + first * group_bytes;
            codes[at..at + run].copy_from_slice(&staged_codes[c * staged_row..][..run]);
            let at = c * groups + first;
            scales[at..at + count].copy_from_slice(&staged_scales[c * batch..][..count]);
            if asymmetric {
                zero_points[at..at + count].copy_from_slice(&staged_zeros[c * batch..][..count]);
            }
        }
    }
    Ok(Parts {
        codes,
        scales,
        zero_points,
    })
}
