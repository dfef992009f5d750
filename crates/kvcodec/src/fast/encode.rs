//! Encoding drivers for group sizes that are a multiple of 8: one fused pass per group (or per
//! tile of `group_size` rows) that fits the group in L1, computes its parameters and packs its
//! codes straight into the preallocated stream. Generic over the kernels and inlined into each
//! instruction set's entry point, so the kernels inline with that instruction set enabled.

use crate::layout::{Layout, Mode};

use super::params::{self, ColumnQuant};
use super::{Dense, Kernels, Parts, SCRIBBLE, Stop};

/// Encodes `m` whose rows are the grouped rows (groups run along each row).
#[inline(always)]
pub(crate) fn along_rows<K: Kernels, const B: u32>(
    k: K,
    m: Dense,
    layout: Layout,
) -> Result<Parts, Stop> {
    let g = layout.group_size;
    debug_assert_eq!(g % 8, 0);
    let (rows, row_len) = (m.rows, m.cols);
    let groups = row_len.div_ceil(g);
    let group_bytes = g * B as usize / 8;
    let row_bytes = groups * group_bytes;
    // Slack for the scribbling packer, cut off at the end.
    let mut codes = vec![0u8; rows * row_bytes + SCRIBBLE];
    let mut scales = vec![0f32; rows * groups];
    let mut zero_points = match layout.mode {
        Mode::Symmetric => Vec::new(),
        Mode::Asymmetric => vec![0u8; rows * groups],
    };
    // The partial last group of each row, zero-padded (the padding stays zero).
    let mut padded = vec![0f32; if row_len % g == 0 { 0 } else { g }];
    let (qmax, levels) = (layout.bits.qmax(), layout.bits.max_code());
    for (r, row) in m.data.chunks_exact(row_len).enumerate() {
        for group_index in 0..groups {
            let start = group_index * g;
            let group = if start + g <= row_len {
                &row[start..start + g]
            } else {
                padded[..row_len - start].copy_from_slice(&row[start..]);
                &padded[..]
            };
            let q = match layout.mode {
                Mode::Symmetric => {
                    let (amax, finite) = k.group_amax(group);
                    if !finite {
                        return Err(Stop::NonFinite);
                    }
                    params::symmetric(amax, qmax)
                }
                Mode::Asymmetric => {
                    let (lo, hi, finite) = k.group_range(group);
                    if !finite {
                        return Err(Stop::NonFinite);
                    }
                    let q = params::asymmetric(lo, hi, levels).ok_or(Stop::RangeOverflow)?;
                    zero_points[r * groups + group_index] = q.offset as u8;
                    q
                }
            };
            scales[r * groups + group_index] = q.scale;
            let at = r * row_bytes + group_index * group_bytes;
            k.quantize_pack::<B>(group, &q, &mut codes[at..at + group_bytes + SCRIBBLE]);
        }
    }
    codes.truncate(rows * row_bytes);
    Ok(Parts {
        codes,
        scales,
        zero_points,
    })
}

/// Encodes `m` whose columns are the grouped rows (groups run down each column), a tile of
/// `group_size` rows at a time.
#[inline(always)]
pub(crate) fn down_columns<K: Kernels, const B: u32>(
    k: K,
    m: Dense,
    layout: Layout,
) -> Result<Parts, Stop> {
    let g = layout.group_size;
    debug_assert_eq!(g % 8, 0);
    let (cols, row_len) = (m.cols, m.rows);
    let groups = row_len.div_ceil(g);
    let group_bytes = g * B as usize / 8;
    let row_bytes = groups * group_bytes;
    let mut codes = vec![0u8; cols * row_bytes];
    let mut scales = vec![0f32; cols * groups];
    let mut zero_points = match layout.mode {
        Mode::Symmetric => Vec::new(),
        Mode::Asymmetric => vec![0u8; cols * groups],
    };
    let (qmax, levels) = (layout.bits.qmax(), layout.bits.max_code());
    let mut q = ColumnQuant::new(cols, qmax);
    let mut low = vec![0f32; cols];
    let mut high = vec![0f32; cols];
    for (t, tile) in m.data.chunks(g * cols).enumerate() {
        low.fill(0.0);
        match layout.mode {
            Mode::Symmetric => {
                if !k.columns_amax(tile, &mut low) {
                    return Err(Stop::NonFinite);
                }
                k.symmetric_columns(&low, qmax, &mut q.scale);
            }
            Mode::Asymmetric => {
                high.fill(0.0);
                if !k.columns_range(tile, &mut low, &mut high) {
                    return Err(Stop::NonFinite);
                }
                if !k.asymmetric_columns(&low, &high, levels, &mut q) {
                    return Err(Stop::RangeOverflow);
                }
                for (c, &zero) in q.offset.iter().enumerate() {
                    zero_points[c * groups + t] = zero as u8;
                }
            }
        }
        for (c, &scale) in q.scale.iter().enumerate() {
            scales[c * groups + t] = scale;
        }
        k.quantize_pack_columns::<B>(tile, &q, g, &mut codes, row_bytes, t * group_bytes);
    }
    Ok(Parts {
        codes,
        scales,
        zero_points,
    })
}
