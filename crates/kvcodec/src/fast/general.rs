//! The general path: any group size and any output layout, in plain Rust. Encoding quantizes
//! into one byte per code and packs the stream at the end (groups of a size that is not a
//! multiple of 8 do not start on byte boundaries); decoding reads codes from any bit and writes
//! through ndarray views, a block of tokens at a time so that the token axis's transpose stays
//! in cache. It also serves the exact f64 decode and decoding a range of tokens.

use std::ops::Range;

use ndarray::{ArrayViewMut2, Axis};

use crate::layout::{GroupAxis, Layout, Mode};
use crate::packed::PackedTensor;

use super::bits::unpack_range;
use super::params::{self, GroupQuant};
use super::portable::Portable;
use super::{Dense, Kernels, Orientation, Parts, Stop};

/// Encodes `m` under any group size.
pub(crate) fn encode(
    m: Dense,
    orientation: Orientation,
    layout: Layout,
    spare: Parts,
) -> Result<Parts, Stop> {
    let g = layout.group_size;
    let (rows, row_len) = match orientation {
        Orientation::Rows => (m.rows, m.cols),
        Orientation::Columns => (m.cols, m.rows),
    };
    let groups = row_len.div_ceil(g);
    let padded_row_len = groups * g;
    let zero_count = match layout.mode {
        Mode::Symmetric => 0,
        Mode::Asymmetric => rows * groups,
    };
    let mut parts = Parts::zeroed(spare, rows * padded_row_len, rows * groups, zero_count);
    let mut group = vec![0f32; g];
    match orientation {
        Orientation::Rows => {
            for (r, row) in m.data.chunks_exact(m.cols).enumerate() {
                for (group_index, values) in row.chunks(g).enumerate() {
                    group[..values.len()].copy_from_slice(values);
                    group[values.len()..].fill(0.0);
                    let index = r * groups + group_index;
                    quantize_group(&group, layout, &mut parts, index, index * g)?;
                }
            }
        }
        Orientation::Columns => {
            for (t, tile) in m.data.chunks(g * m.cols).enumerate() {
                for c in 0..m.cols {
                    for (i, slot) in group.iter_mut().enumerate() {
                        *slot = tile.get(i * m.cols + c).copied().unwrap_or(0.0);
                    }
                    let index = c * groups + t;
                    quantize_group(&group, layout, &mut parts, index, index * g)?;
                }
            }
        }
    }
    parts.codes = bitpack::stream::pack_bytes(layout.bits, &parts.codes)
        .expect("every stored code fits the width");
    Ok(parts)
}

/// Fits one zero-padded group and writes its scale, zero point and unpacked codes.
fn quantize_group(
    group: &[f32],
    layout: Layout,
    parts: &mut Parts,
    index: usize,
    first_code: usize,
) -> Result<(), Stop> {
    let q = fit(group, layout)?;
    parts.scales[index] = q.scale;
    if layout.mode == Mode::Asymmetric {
        parts.zero_points[index] = q.offset as u8;
    }
    for (slot, &x) in parts.codes[first_code..first_code + group.len()]
        .iter_mut()
        .zip(group)
    {
        *slot = params::quantize(x, &q);
    }
    Ok(())
}

fn fit(group: &[f32], layout: Layout) -> Result<GroupQuant, Stop> {
    match layout.mode {
        Mode::Symmetric => {
            let (amax, finite) = Portable.group_amax(group);
            if !finite {
                return Err(Stop::NonFinite);
            }
            Ok(params::symmetric(amax, layout.bits.qmax()))
        }
        Mode::Asymmetric => {
            let (lo, hi, finite) = Portable.group_range(group);
            if !finite {
                return Err(Stop::NonFinite);
            }
            params::asymmetric(lo, hi, layout.bits.max_code()).ok_or(Stop::RangeOverflow)
        }
    }
}

/// A decoded value type: f32 (one f32 product) or f64 (the exact product).
pub(crate) trait Decoded: Copy {
    /// The value of stored code `code` in a group of offset `offset` and scale `scale`.
    fn value(code: u8, offset: i32, scale: f32) -> Self;
}

impl Decoded for f32 {
    #[inline(always)]
    fn value(code: u8, offset: i32, scale: f32) -> f32 {
        params::dequantize(code, offset, scale)
    }
}

impl Decoded for f64 {
    #[inline(always)]
    fn value(code: u8, offset: i32, scale: f32) -> f64 {
        (f64::from(code) - f64::from(offset)) * f64::from(scale)
    }
}

/// Tokens decoded per block on the token axis.
const TOKEN_BLOCK: usize = 256;

/// Writes rows `tokens` of the decoded matrix into `out` ((tokens.len(), features), checked by
/// the caller), any layout, any group size. Reads only the codes, scales and zero points of
/// those tokens, so decoding a long tensor a block at a time costs what decoding it once does.
pub(crate) fn decode_tokens<T: Decoded>(
    packed: &PackedTensor,
    tokens: Range<usize>,
    mut out: ArrayViewMut2<T>,
) {
    if tokens.is_empty() {
        return;
    }
    let layout = packed.layout();
    let geometry = packed.geometry();
    let (g, groups, padded) = (
        layout.group_size,
        geometry.groups_per_row,
        geometry.padded_row_len,
    );
    let bits = layout.bits.get();
    let codes = packed.code_bytes();
    let scales = packed.scales().as_standard_layout();
    let scales = scales.as_slice().expect("standard layout");
    let features = packed.shape()[1];
    match layout.axis {
        GroupAxis::Feature => {
            let mut row_codes = vec![0u8; features];
            let mut row_offsets = vec![0i32; groups];
            for (t, mut row) in tokens.zip(out.rows_mut()) {
                unpack_range(bits, codes, t * padded, &mut row_codes);
                offsets_into(packed, t * groups, &mut row_offsets);
                let row_scales = &scales[t * groups..(t + 1) * groups];
                let parts = row_codes.chunks(g).zip(&row_offsets).zip(row_scales);
                for (mut slots, ((group, &offset), &scale)) in
                    row.axis_chunks_iter_mut(Axis(0), g).zip(parts)
                {
                    let decode = |(slot, &code): (&mut T, &u8)| {
                        *slot = T::value(code, offset, scale);
                    };
                    match slots.as_slice_mut() {
                        Some(slots) => slots.iter_mut().zip(group).for_each(decode),
                        None => slots.iter_mut().zip(group).for_each(decode),
                    }
                }
            }
        }
        GroupAxis::Token => {
            // The groups these tokens fall in, per column: their offsets and scales.
            let (first_group, last_group) = (tokens.start / g, (tokens.end - 1) / g);
            let span = last_group - first_group + 1;
            let mut column_offsets = vec![0i32; features * span];
            let mut column_scales = vec![0f32; features * span];
            for c in 0..features {
                let first = c * groups + first_group;
                offsets_into(packed, first, &mut column_offsets[c * span..(c + 1) * span]);
                column_scales[c * span..(c + 1) * span]
                    .copy_from_slice(&scales[first..first + span]);
            }
            let mut block_codes = vec![0u8; features * TOKEN_BLOCK];
            let (mut row_offsets, mut row_scales) = (vec![0i32; features], vec![0f32; features]);
            let start = tokens.start;
            for first in tokens.clone().step_by(TOKEN_BLOCK) {
                let len = TOKEN_BLOCK.min(tokens.end - first);
                for c in 0..features {
                    let column = &mut block_codes[c * TOKEN_BLOCK..c * TOKEN_BLOCK + len];
                    unpack_range(bits, codes, c * padded + first, column);
                }
                for j in 0..len {
                    let t = first + j;
                    if t == first || t.is_multiple_of(g) {
                        // A new group of tokens: every column's offset and scale change.
                        let k = t / g - first_group;
                        for c in 0..features {
                            row_offsets[c] = column_offsets[c * span + k];
                            row_scales[c] = column_scales[c * span + k];
                        }
                    }
                    let mut row = out.row_mut(t - start);
                    let column_codes = block_codes[j..].iter().step_by(TOKEN_BLOCK);
                    let parts = column_codes.zip(&row_offsets).zip(&row_scales);
                    for (slot, ((&code, &offset), &scale)) in row.iter_mut().zip(parts) {
                        *slot = T::value(code, offset, scale);
                    }
                }
            }
        }
    }
}

/// The offsets of groups `first..first + out.len()` in row-major group order: qmax for a
/// symmetric tensor, the zero points of an asymmetric one (unpacked from just that range).
fn offsets_into(packed: &PackedTensor, first: usize, out: &mut [i32]) {
    let layout = packed.layout();
    match layout.mode {
        Mode::Symmetric => out.fill(i32::from(layout.bits.qmax())),
        Mode::Asymmetric => {
            let mut zeros = vec![0u8; out.len()];
            unpack_range(
                layout.bits.get(),
                packed.zero_point_bytes(),
                first,
                &mut zeros,
            );
            for (slot, &zero) in out.iter_mut().zip(&zeros) {
                *slot = i32::from(zero);
            }
        }
    }
}
