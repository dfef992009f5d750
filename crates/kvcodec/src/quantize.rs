//! Encoding and decoding an N x D float32 matrix: walk the grouped view of [`crate::layout`],
//! quantize each group under the layout's mode ([`crate::symmetric`] or
//! [`crate::asymmetric`]), and pack the stored codes (and zero points) as b-bit streams
//! ([`bitpack::stream`]).
//!
//! Spec:
//! - Stream order: groups in row-major order of the grouped view, padding included; each
//!   row is zero-padded to whole groups.
//! - Codes: one b-bit byte stream of `rows * padded_row_len` stored codes.
//! - Scales: f32, [rows, groups_per_row].
//! - Zero points (asymmetric only): one b-bit byte stream of `rows * groups_per_row` codes in the
//!   same row-major group order; symmetric tensors store none (their offset is the constant
//!   qmax).
//! - Decode: `(stored - offset) as f64 * scale as f64`, where offset is qmax (symmetric) or the
//!   group's zero point (asymmetric), cropped back to exactly N x D.

use ndarray::{Array2, ArrayView2};

use bitpack::stream as bits;

use crate::asymmetric::{self, GroupParams};
use crate::error::{KvError, Result};
use crate::layout::{GroupAxis, Layout, Mode};
use crate::packed::PackedTensor;
use crate::symmetric;

/// Quantizes `x` (N tokens x D features) under `layout`.
pub fn encode(x: ArrayView2<f32>, layout: Layout) -> Result<PackedTensor> {
    let (tokens, features) = x.dim();
    check_input(x)?;
    let geometry = layout.geometry(tokens, features);
    let mut stored = Vec::with_capacity(geometry.code_count());
    let mut scales = Array2::<f32>::zeros((geometry.rows, geometry.groups_per_row));
    let mut zero_points = Vec::new();
    let mut row = vec![0f32; geometry.padded_row_len];
    for r in 0..geometry.rows {
        row.fill(0.0);
        for (j, slot) in row.iter_mut().take(geometry.row_len).enumerate() {
            *slot = match layout.axis {
                GroupAxis::Token => x[[j, r]],
                GroupAxis::Feature => x[[r, j]],
            };
        }
        for (group_index, group) in row.chunks_exact(layout.group_size).enumerate() {
            let quantizer = GroupQuantizer::fit(layout, group)
                .map_err(|overflow| overflow.at(r, group_index, layout))?;
            scales[[r, group_index]] = quantizer.scale();
            if let GroupQuantizer::Asymmetric(params) = quantizer {
                zero_points.push(params.zero);
            }
            stored.extend(group.iter().map(|&v| quantizer.quantize(v, layout)));
        }
    }
    let codes = bits::pack_bytes(layout.bits, &stored)?;
    let zero_points = match layout.mode {
        Mode::Symmetric => Vec::new(),
        Mode::Asymmetric => bits::pack_bytes(layout.bits, &zero_points)?,
    };
    Ok(PackedTensor::new_unchecked(
        layout,
        [tokens, features],
        codes,
        scales,
        zero_points,
    ))
}

/// Reconstructs the N x D matrix in f64.
pub fn decode(packed: &PackedTensor) -> Array2<f64> {
    let [tokens, features] = packed.shape();
    let layout = packed.layout();
    let geometry = packed.geometry();
    let stored = packed.stored_codes();
    let scales = packed.scales();
    let offsets = packed.offsets();
    let mut out = Array2::<f64>::zeros((tokens, features));
    for r in 0..geometry.rows {
        let row_codes = &stored[r * geometry.padded_row_len..][..geometry.row_len];
        for (j, &code) in row_codes.iter().enumerate() {
            let group = [r, j / layout.group_size];
            let value = (f64::from(code) - f64::from(offsets[group])) * f64::from(scales[group]);
            match layout.axis {
                GroupAxis::Token => out[[j, r]] = value,
                GroupAxis::Feature => out[[r, j]] = value,
            }
        }
    }
    out
}

/// How one group's values become stored codes.
#[derive(Debug, Clone, Copy)]
enum GroupQuantizer {
    Symmetric { scale: f32 },
    Asymmetric(GroupParams),
}

/// A group whose range overflows the f32 scale, before it is placed in the grouped view.
struct RangeOverflow {
    low: f32,
    high: f32,
}

impl RangeOverflow {
    fn at(self, row: usize, group: usize, layout: Layout) -> KvError {
        KvError::RangeOverflow {
            row,
            group,
            low: self.low,
            high: self.high,
            bits: layout.bits.get(),
        }
    }
}

impl GroupQuantizer {
    fn fit(layout: Layout, group: &[f32]) -> std::result::Result<Self, RangeOverflow> {
        match layout.mode {
            Mode::Symmetric => Ok(GroupQuantizer::Symmetric {
                scale: symmetric::group_scale(group, layout.bits.qmax()),
            }),
            Mode::Asymmetric => {
                let (low, high) = asymmetric::group_range(group);
                asymmetric::group_params(low, high, layout.bits)
                    .map(GroupQuantizer::Asymmetric)
                    .ok_or(RangeOverflow { low, high })
            }
        }
    }

    fn scale(self) -> f32 {
        match self {
            GroupQuantizer::Symmetric { scale } => scale,
            GroupQuantizer::Asymmetric(params) => params.scale,
        }
    }

    fn quantize(self, x: f32, layout: Layout) -> u8 {
        match self {
            GroupQuantizer::Symmetric { scale } => {
                symmetric::quantize_value(x, scale, layout.bits.qmax())
            }
            GroupQuantizer::Asymmetric(params) => {
                asymmetric::quantize_value(x, params, layout.bits)
            }
        }
    }
}

fn check_input(x: ArrayView2<f32>) -> Result<()> {
    let (rows, cols) = x.dim();
    if rows == 0 || cols == 0 {
        return Err(KvError::EmptyMatrix { rows, cols });
    }
    if rows > i32::MAX as usize || cols > i32::MAX as usize {
        return Err(KvError::Shape {
            rows: rows as i64,
            cols: cols as i64,
        });
    }
    if let Some(((row, col), &value)) = x.indexed_iter().find(|(_, v)| !v.is_finite()) {
        return Err(KvError::NonFinite { row, col, value });
    }
    Ok(())
}
