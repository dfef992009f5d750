//! The straightforward implementation, kept as the oracle the fast [`pack`](fn@super::pack) and
//! [`unpack`](fn@super::unpack) are tested against bit for bit: it pads the whole matrix, then
//! packs column by column through `bitpack`'s word streams (qzeros through transposes). Slow;
//! not for production use.

use ndarray::{Array2, Axis};

use super::{GptqLayer, ZeroConvention, alignment, check_bits};
use crate::error::{FormatError, Result};
use crate::logical::LogicalWeights;
use bitpack::{Bits, stream as bits};

/// Packs a logical matrix into GPTQ tensors, padding K and N with zero weights.
pub fn pack(weights: &LogicalWeights, convention: ZeroConvention) -> Result<GptqLayer> {
    let bits = weights.bits();
    check_bits(bits)?;
    let logical_shape = [weights.k(), weights.n()];
    let step = alignment(bits);
    let padded = weights.padded(step, step);
    let qweight = pack_columns(padded.codes(), bits)?;
    let mut stored_zeros = padded.zeros().clone();
    for ((group, col), zero) in stored_zeros.indexed_iter_mut() {
        *zero = convention.store(*zero, bits, group, col)?;
    }
    let qzeros = transposed(&pack_columns(&transposed(&stored_zeros), bits)?);
    Ok(GptqLayer {
        bits,
        group_size: padded.group_size(),
        convention,
        qweight,
        qzeros,
        scales: padded.scales().clone(),
        g_idx: padded.g_idx().iter().map(|&g| g as i32).collect(),
        logical_shape,
    })
}

/// Unpacks GPTQ tensors into the logical matrix, cropped to the logical shape, after checking
/// every shape against the format.
pub fn unpack(layer: &GptqLayer) -> Result<LogicalWeights> {
    let bits = layer.bits;
    check_bits(bits)?;
    let (stored_k, stored_n) = layer.check_shapes()?;
    let codes = unpack_columns(&layer.qweight, bits, stored_k)?;
    let mut zeros = transposed(&unpack_columns(&transposed(&layer.qzeros), bits, stored_n)?);
    for ((group, col), zero) in zeros.indexed_iter_mut() {
        *zero = layer.convention.read(*zero, bits, group, col)?;
    }
    let g_idx = layer
        .g_idx
        .iter()
        .enumerate()
        .map(|(row, &group)| {
            u32::try_from(group).map_err(|_| FormatError::NegativeGroupIndex { row, group })
        })
        .collect::<Result<Vec<u32>>>()?;
    let stored = LogicalWeights::new(
        bits,
        layer.group_size,
        codes,
        layer.scales.clone(),
        zeros,
        g_idx,
    )?;
    let [k, n] = layer.logical_shape;
    stored.cropped(k, n)
}

/// A row-major copy of the transpose.
fn transposed<T: Clone>(a: &Array2<T>) -> Array2<T> {
    a.t().as_standard_layout().into_owned()
}

/// Packs each column of `values` [rows, cols] into its own word stream: [rows*b/32, cols].
fn pack_columns(values: &Array2<u8>, bits: u32) -> Result<Array2<i32>> {
    let width = Bits::new(bits)?;
    let rows = values.nrows() * bits as usize / 32;
    let mut packed = Array2::<i32>::zeros((rows, values.ncols()));
    for (column, mut out) in values.axis_iter(Axis(1)).zip(packed.axis_iter_mut(Axis(1))) {
        let stream = bits::pack_i32_words(width, &column.to_vec())?;
        out.assign(&ndarray::ArrayView1::from(&stream));
    }
    Ok(packed)
}

/// Unpacks each column of `packed` [rows*b/32, cols] into `rows` values: [rows, cols].
fn unpack_columns(packed: &Array2<i32>, bits: u32, rows: usize) -> Result<Array2<u8>> {
    let width = Bits::new(bits)?;
    let mut values = Array2::<u8>::zeros((rows, packed.ncols()));
    for (column, mut out) in packed.axis_iter(Axis(1)).zip(values.axis_iter_mut(Axis(1))) {
        let stream = bits::unpack_i32_words(width, &column.to_vec(), rows)?;
        out.assign(&ndarray::ArrayView1::from(&stream));
    }
    Ok(values)
}
