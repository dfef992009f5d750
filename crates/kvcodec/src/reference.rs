//! The oracle: the codec one value at a time, exactly as first written (the spec is in
//! [`crate::quantize`]). Every fast path in this crate is tested against these functions bit for
//! bit; other crates' tests may use them too. They are slow (a libm call per rounding, strided
//! indexing, four passes over the data) and meant for nothing else.

use ndarray::{Array2, ArrayView2};

use bitpack::stream as bits;

use crate::asymmetric::{self, GroupParams};
use crate::error::{KvError, Result};
use crate::layout::{GroupAxis, Layout, Mode};
use crate::packed::PackedTensor;
use crate::symmetric;

/// Quantizes `x` (N tokens x D features) under `layout`, one value at a time.
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

/// Reconstructs the N x D matrix in f64: `(stored - offset) as f64 * scale as f64`.
pub fn decode_exact(packed: &PackedTensor) -> Array2<f64> {
    decode_each(packed, |code, offset, scale| {
        (f64::from(code) - f64::from(offset)) * f64::from(scale)
    })
}

/// Reconstructs the N x D matrix in f32: `(stored - offset) as f32 * scale`, one f32 product
/// (the difference is an exact small integer, so the product is the correctly rounded exact one).
pub fn decode(packed: &PackedTensor) -> Array2<f32> {
    decode_each(packed, |code, offset, scale| {
        (i32::from(code) - i32::from(offset)) as f32 * scale
    })
}

fn decode_each<T: Clone + Default>(
    packed: &PackedTensor,
    value: impl Fn(u8, u8, f32) -> T,
) -> Array2<T> {
    let [tokens, features] = packed.shape();
    let layout = packed.layout();
    let geometry = packed.geometry();
    let stored = packed.stored_codes();
    let scales = packed.scales();
    let offsets = packed.offsets();
    let mut out = Array2::<T>::from_elem((tokens, features), T::default());
    for r in 0..geometry.rows {
        let row_codes = &stored[r * geometry.padded_row_len..][..geometry.row_len];
        for (j, &code) in row_codes.iter().enumerate() {
            let group = [r, j / layout.group_size];
            let value = value(code, offsets[group], scales[group]);
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
