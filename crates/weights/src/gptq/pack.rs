//! The fast packer: a logical matrix into qweight and qzeros, row unit by row unit, with the
//! padding written as it is packed.

use half::f16;
use ndarray::Array2;

use super::drivers::{PEIGHT, PFOUR, pack_columns_best as columns, store_fence, streams};
use super::{GptqLayer, ZeroConvention, alignment, check_bits};
use super::{kernels, rows};
use crate::error::Result;
use crate::logical::LogicalWeights;
use bitpack::{Bits, stream as bits};

/// Packs a logical matrix into GPTQ tensors, padding K and N with zero weights.
///
/// Row-major: each unit of [`alignment`] consecutive rows of the codes becomes one word row of
/// qweight (three at 3 bits), built column by column with elementwise shifts and ors over whole
/// rows. Padded places are written from their group's zero point as they are packed; the
/// padded matrix is never built. Byte-for-byte the output of
/// [`reference::pack`](super::reference::pack).
pub fn pack(weights: &LogicalWeights, convention: ZeroConvention) -> Result<GptqLayer> {
    let mut layer = GptqLayer {
        bits: weights.bits(),
        group_size: weights.group_size(),
        convention,
        qweight: Array2::zeros((0, 0)),
        qzeros: Array2::zeros((0, 0)),
        scales: Array2::from_elem((0, 0), f16::ZERO),
        g_idx: Vec::new(),
        logical_shape: [0, 0],
    };
    pack_into(weights, convention, &mut layer)?;
    Ok(layer)
}

/// [`pack`] into an existing layer, overwriting every field and reusing the memory of its
/// qweight and qzeros where their shapes already fit (as when packing same-shaped layers one
/// after another: a fresh qweight costs about as much in page faults as the packing itself).
/// On an error `layer` is unchanged.
pub fn pack_into(
    weights: &LogicalWeights,
    convention: ZeroConvention,
    layer: &mut GptqLayer,
) -> Result<()> {
    let bits = weights.bits();
    check_bits(bits)?;
    let (k, n) = (weights.k(), weights.n());
    let step = alignment(bits);
    let (padded_k, padded_n) = (k.next_multiple_of(step), n.next_multiple_of(step));
    let parts = weights.padded_parts(padded_k, padded_n);
    let width = Bits::new(bits)?;

    // Zero points first: the only part that can refuse (v1 and zero 0), before anything is
    // written.
    let stored_zeros = store_zeros(&parts.zeros, convention, bits)?;
    let qzeros = reusable(
        &mut layer.qzeros,
        (stored_zeros.nrows(), width.word_count(padded_n)),
    );
    pack_rows_along_n(width, &stored_zeros, qzeros)?;

    let codes = weights.codes().as_standard_layout();
    let codes = codes
        .as_slice()
        .expect("a standard-layout array has a slice");
    let qweight = reusable(
        &mut layer.qweight,
        (padded_k * bits as usize / 32, padded_n),
    );
    let source = RowSource {
        codes,
        k,
        n,
        pad: parts
            .zeros
            .as_slice()
            .expect("padded zeros are in standard layout"),
        padded_n,
        g_idx: &parts.g_idx,
    };
    match bits {
        2 => pack_qweight::<16, 1>(&source, qweight, rows::pack),
        3 => pack_qweight::<32, 3>(&source, qweight, rows::pack),
        4 => pack_qweight(&source, qweight, columns::<8, 1, kernels::Four, PFOUR>),
        _ => pack_qweight(&source, qweight, columns::<4, 1, kernels::Eight, PEIGHT>),
    }
    layer.bits = bits;
    layer.group_size = weights.group_size();
    layer.convention = convention;
    layer.scales = parts.scales;
    layer.g_idx.clear();
    layer.g_idx.extend(parts.g_idx.iter().map(|&g| g as i32));
    layer.logical_shape = [k, n];
    Ok(())
}

/// The memory of `array` as a row-major slice of `shape`: kept when it already has that shape
/// in standard layout, else a new array of zeros. Every element is then overwritten.
pub(crate) fn reusable(array: &mut Array2<i32>, shape: (usize, usize)) -> &mut [i32] {
    if array.dim() != shape || !array.is_standard_layout() {
        *array = Array2::zeros(shape);
    }
    array
        .as_slice_mut()
        .expect("a standard-layout array has a slice")
}

/// The zero points as qzeros stores them under `convention`; refuses as
/// [`ZeroConvention::store`] does, at the first refused place in row-major order.
fn store_zeros(zeros: &Array2<u8>, convention: ZeroConvention, bits: u32) -> Result<Array2<u8>> {
    let mut stored = zeros.as_standard_layout().into_owned();
    if convention == ZeroConvention::V1 {
        let fields = stored
            .as_slice_mut()
            .expect("an owned standard-layout array has a slice");
        if fields.contains(&0) {
            for ((group, col), &zero) in zeros.indexed_iter() {
                convention.store(zero, bits, group, col)?;
            }
        }
        fields.iter_mut().for_each(|zero| *zero -= 1);
    }
    Ok(stored)
}

/// Packs each row of `values` [rows, cols] (standard layout) into its own dense word stream:
/// `packed` is [rows, cols*b/32], row-major.
fn pack_rows_along_n(width: Bits, values: &Array2<u8>, packed: &mut [i32]) -> Result<()> {
    let cols = values.ncols();
    let words = width.word_count(cols);
    let values = values.as_slice().expect("standard layout");
    for (row, out) in values
        .chunks_exact(cols)
        .zip(packed.chunks_exact_mut(words))
    {
        bits::pack_i32_words_into(width, row, out)?;
    }
    Ok(())
}

/// The padded codes, row by row, without building them: row k < K is the logical row for its
/// first N columns; every other place (k, c) holds the padded zero point `pad[g_idx[k], c]`.
struct RowSource<'a> {
    /// The logical codes [K, N], row-major.
    codes: &'a [u8],
    k: usize,
    n: usize,
    /// The padded true zero points [groups, padded N], row-major.
    pad: &'a [u8],
    padded_n: usize,
    /// The padded g_idx.
    g_idx: &'a [u32],
}

impl<'a> RowSource<'a> {
    fn pad_row(&self, row: usize) -> &'a [u8] {
        let group = self.g_idx[row] as usize;
        &self.pad[group * self.padded_n..(group + 1) * self.padded_n]
    }

    /// Columns 0..N of padded row `row`.
    fn main(&self, row: usize) -> &'a [u8] {
        if row < self.k {
            &self.codes[row * self.n..(row + 1) * self.n]
        } else {
            &self.pad_row(row)[..self.n]
        }
    }

    /// Columns N..padded N of padded row `row`.
    fn tail(&self, row: usize) -> &'a [u8] {
        &self.pad_row(row)[self.n..]
    }
}

/// A driver that packs R code rows into W word rows (non-temporal stores when asked).
type PackUnit<const R: usize, const W: usize> = fn(&[&[u8]; R], &mut [&mut [i32]; W], bool);

/// Fills qweight [padded K * b/32, padded N] unit by unit: R rows of codes into W word rows.
fn pack_qweight<const R: usize, const W: usize>(
    source: &RowSource<'_>,
    qweight: &mut [i32],
    columns: PackUnit<R, W>,
) {
    let (n, padded_n) = (source.n, source.padded_n);
    // One word row per unit (2, 4 and 8 bits), so whole lines of one row stream; three rows
    // (3 bits) streamed measured slower.
    let stream = W == 1 && streams(std::mem::size_of_val(qweight));
    for (unit, words) in qweight.chunks_exact_mut(W * padded_n).enumerate() {
        let first = unit * R;
        let mut rows = words.chunks_exact_mut(padded_n);
        let mut outs: [(&mut [i32], &mut [i32]); W] =
            std::array::from_fn(|_| rows.next().expect("W word rows").split_at_mut(n));
        let main: [&[u8]; R] = std::array::from_fn(|j| source.main(first + j));
        let main_outs = &mut outs.each_mut().map(|(m, _)| &mut **m);
        columns(&main, main_outs, stream);
        if padded_n > n {
            let tail: [&[u8]; R] = std::array::from_fn(|j| source.tail(first + j));
            columns(&tail, &mut outs.each_mut().map(|(_, t)| &mut **t), false);
        }
    }
    if stream {
        store_fence();
    }
}
