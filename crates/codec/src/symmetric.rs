//! Symmetric per-group quantization of an N x D float32 matrix.
//!
//! Spec (for the grouped view and stream order see [`crate::layout`] and [`crate::nibble`]):
//! - Scale per group: `max|x|` over the group (f32) divided by qmax (f32 division); a group whose
//!   maximum is 0 gets scale 1.0, so all-zero input decodes to exact zeros.
//! - Code: `clamp(round_half_even(x / scale), -qmax, qmax)`, the division done in f32, stored
//!   unsigned as `code + qmax`: 4-bit 0..=14 (15 is never written), 8-bit 0..=254. This is an
//!   offset code, not two's-complement and not a codebook.
//! - Padding elements of a partial last group are zeros and quantize to the stored code qmax.
//! - Stream order: groups in row-major order of the grouped view, padding included.
//! - Decode: `(stored - qmax) as f64 * scale as f64`, cropped back to exactly N x D.

use ndarray::{Array2, ArrayView2};

use crate::error::{CodecError, Result};
use crate::layout::{Axis, Layout};
use crate::packed::PackedTensor;
use crate::stream;

/// Quantizes `x` (N tokens x D features) under `layout`.
pub fn encode(x: ArrayView2<f32>, layout: Layout) -> Result<PackedTensor> {
    let (tokens, features) = x.dim();
    check_input(x)?;
    let geometry = layout.geometry(tokens, features);
    let qmax = layout.bits.qmax();
    let g = layout.group_size;

    let mut stored = Vec::with_capacity(geometry.code_count());
    let mut scales = Array2::<f32>::zeros((geometry.rows, geometry.groups_per_row));
    let mut row = vec![0f32; geometry.padded_row_len];
    for r in 0..geometry.rows {
        row.fill(0.0);
        for (j, slot) in row.iter_mut().take(geometry.row_len).enumerate() {
            *slot = match layout.axis {
                Axis::Token => x[[j, r]],
                Axis::Feature => x[[r, j]],
            };
        }
        for (group_index, group) in row.chunks_exact(g).enumerate() {
            let scale = group_scale(group, qmax);
            scales[[r, group_index]] = scale;
            stored.extend(group.iter().map(|&v| quantize_value(v, scale, qmax)));
        }
    }
    let codes = stream::pack(layout.bits, &stored);
    Ok(PackedTensor::new_unchecked(
        layout, tokens, features, codes, scales,
    ))
}

/// Reconstructs the N x D matrix in f64.
pub fn decode(packed: &PackedTensor) -> Array2<f64> {
    let [tokens, features] = packed.shape();
    let layout = packed.layout();
    let geometry = packed.geometry();
    let qmax = f64::from(layout.bits.qmax());
    let stored = packed.stored_codes();
    let scales = packed.scales();
    let mut out = Array2::<f64>::zeros((tokens, features));
    for r in 0..geometry.rows {
        let row_codes = &stored[r * geometry.padded_row_len..][..geometry.row_len];
        for (j, &code) in row_codes.iter().enumerate() {
            let value = (f64::from(code) - qmax) * f64::from(scales[[r, j / layout.group_size]]);
            match layout.axis {
                Axis::Token => out[[j, r]] = value,
                Axis::Feature => out[[r, j]] = value,
            }
        }
    }
    out
}

/// Scale of one group: max|x| / qmax in f32, or 1.0 for an all-zero group.
pub fn group_scale(group: &[f32], qmax: u8) -> f32 {
    let amax = group.iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 {
        1.0
    } else {
        amax / f32::from(qmax)
    }
}

/// Stored code of one value: round-half-even of x / scale (in f32), clamped, offset by qmax.
pub fn quantize_value(x: f32, scale: f32, qmax: u8) -> u8 {
    let q = f32::from(qmax);
    let code = (x / scale).round_ties_even().clamp(-q, q);
    (code + q) as u8
}

fn check_input(x: ArrayView2<f32>) -> Result<()> {
    let (rows, cols) = x.dim();
    if rows == 0 || cols == 0 {
        return Err(CodecError::EmptyMatrix { rows, cols });
    }
    if rows > i32::MAX as usize || cols > i32::MAX as usize {
        return Err(CodecError::Malformed(format!(
            "shape [{rows}, {cols}] does not fit the two i32 shape values"
        )));
    }
    if let Some(((row, col), &value)) = x.indexed_iter().find(|(_, v)| !v.is_finite()) {
        return Err(CodecError::NonFinite { row, col, value });
    }
    Ok(())
}
