//! The portable kernels: plain Rust, written in blocks of 8 so the compiler may vectorize them,
//! with the exact rounding of [`super::params`]. The AVX2 kernels use the column-range
//! functions here for the columns left over after their blocks of 8.

use super::bits::{read_u64, spread, squeeze, write_packed};
use super::params::{self, ColumnQuant, GroupQuant};
use super::{ColumnParams, Kernels};

/// The portable kernels.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Portable;

impl Kernels for Portable {
    fn group_amax(self, group: &[f32]) -> (f32, bool) {
        let mut amax = [0f32; 8];
        let mut finite = [true; 8];
        let (blocks, tail) = group.as_chunks::<8>();
        for block in blocks {
            for i in 0..8 {
                amax[i] = amax[i].max(block[i].abs());
                finite[i] &= block[i].is_finite();
            }
        }
        for (i, &x) in tail.iter().enumerate() {
            amax[i] = amax[i].max(x.abs());
            finite[i] &= x.is_finite();
        }
        (
            amax.into_iter().fold(0f32, f32::max),
            finite.into_iter().all(|f| f),
        )
    }

    fn group_range(self, group: &[f32]) -> (f32, f32, bool) {
        let (mut lo, mut hi) = ([0f32; 8], [0f32; 8]);
        let mut finite = [true; 8];
        let (blocks, tail) = group.as_chunks::<8>();
        for block in blocks {
            for i in 0..8 {
                lo[i] = lo[i].min(block[i]);
                hi[i] = hi[i].max(block[i]);
                finite[i] &= block[i].is_finite();
            }
        }
        for (i, &x) in tail.iter().enumerate() {
            lo[i] = lo[i].min(x);
            hi[i] = hi[i].max(x);
            finite[i] &= x.is_finite();
        }
        (
            lo.into_iter().fold(0f32, f32::min),
            hi.into_iter().fold(0f32, f32::max),
            finite.into_iter().all(|f| f),
        )
    }

    fn quantize_pack<const B: u32>(self, group: &[f32], q: &GroupQuant, out: &mut [u8]) {
        let (blocks, _) = group.as_chunks::<8>();
        for (block, dst) in blocks.iter().zip(out.chunks_mut(B as usize)) {
            let lanes = u64::from_le_bytes(block.map(|x| params::quantize(x, q)));
            write_packed::<B>(dst, squeeze::<B>(lanes));
        }
    }

    fn columns_amax(self, tile: &[f32], amax: &mut [f32]) -> bool {
        columns_amax(tile, amax, 0..amax.len())
    }

    fn columns_range(self, tile: &[f32], lo: &mut [f32], hi: &mut [f32]) -> bool {
        columns_range(tile, lo, hi, 0..lo.len())
    }

    fn symmetric_columns(self, amax: &[f32], qmax: u8, scale: &mut [f32]) {
        for (s, &a) in scale.iter_mut().zip(amax) {
            *s = params::symmetric(a, qmax).scale;
        }
    }

    fn asymmetric_columns(self, lo: &[f32], hi: &[f32], levels: u8, q: &mut ColumnQuant) -> bool {
        asymmetric_columns(lo, hi, levels, q, 0..lo.len())
    }

    fn quantize_pack_columns<const B: u32>(
        self,
        tile: &[f32],
        q: &ColumnQuant,
        group_size: usize,
        codes: &mut [u8],
        row_bytes: usize,
        at: usize,
    ) {
        quantize_pack_columns::<B>(tile, q, group_size, codes, row_bytes, at, 0..q.cols());
    }

    fn dequantize_group<const B: u32>(
        self,
        codes: &[u8],
        offset: i32,
        scale: f32,
        out: &mut [f32],
    ) {
        for (k, dst) in out.chunks_mut(8).enumerate() {
            let lanes = spread::<B>(read_u64(codes, k * B as usize)).to_le_bytes();
            for (slot, &code) in dst.iter_mut().zip(&lanes) {
                *slot = params::dequantize(code, offset, scale);
            }
        }
    }

    fn dequantize_columns<const B: u32>(
        self,
        codes: &[u8],
        row_bytes: usize,
        at: usize,
        params: ColumnParams,
        out: &mut [f32],
    ) {
        dequantize_columns::<B>(codes, row_bytes, at, params, out, 0..params.cols);
    }

    fn stream_copy(self, src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }

    fn finish_streaming(self) {}
}

/// [`Kernels::columns_amax`] over the columns in `range`.
pub(crate) fn columns_amax(tile: &[f32], amax: &mut [f32], range: std::ops::Range<usize>) -> bool {
    let cols = amax.len();
    let mut finite = true;
    for row in tile.chunks_exact(cols) {
        for c in range.clone() {
            amax[c] = amax[c].max(row[c].abs());
            finite &= row[c].is_finite();
        }
    }
    finite
}

/// [`Kernels::columns_range`] over the columns in `range`.
pub(crate) fn columns_range(
    tile: &[f32],
    lo: &mut [f32],
    hi: &mut [f32],
    range: std::ops::Range<usize>,
) -> bool {
    let cols = lo.len();
    let mut finite = true;
    for row in tile.chunks_exact(cols) {
        for c in range.clone() {
            lo[c] = lo[c].min(row[c]);
            hi[c] = hi[c].max(row[c]);
            finite &= row[c].is_finite();
        }
    }
    finite
}

/// [`Kernels::asymmetric_columns`] over the columns in `range`.
pub(crate) fn asymmetric_columns(
    lo: &[f32],
    hi: &[f32],
    levels: u8,
    q: &mut ColumnQuant,
    range: std::ops::Range<usize>,
) -> bool {
    for c in range {
        match params::asymmetric(lo[c], hi[c], levels) {
            Some(group) => q.set(c, group),
            None => return false,
        }
    }
    true
}

/// [`Kernels::quantize_pack_columns`] over the columns in `range`.
pub(crate) fn quantize_pack_columns<const B: u32>(
    tile: &[f32],
    q: &ColumnQuant,
    group_size: usize,
    codes: &mut [u8],
    row_bytes: usize,
    at: usize,
    range: std::ops::Range<usize>,
) {
    let cols = q.cols();
    let rows = tile.len() / cols;
    for c in range {
        let column = q.get(c);
        let start = c * row_bytes + at;
        let group = &mut codes[start..start + group_size * B as usize / 8];
        for (k, dst) in group.chunks_mut(B as usize).enumerate() {
            let lanes: [u8; 8] = std::array::from_fn(|i| {
                let r = 8 * k + i;
                let x = if r < rows { tile[r * cols + c] } else { 0.0 };
                params::quantize(x, &column)
            });
            write_packed::<B>(dst, squeeze::<B>(u64::from_le_bytes(lanes)));
        }
    }
}

/// [`Kernels::dequantize_columns`] over the columns in `range`.
pub(crate) fn dequantize_columns<const B: u32>(
    codes: &[u8],
    row_bytes: usize,
    at: usize,
    column_params: ColumnParams,
    out: &mut [f32],
    range: std::ops::Range<usize>,
) {
    let cols = column_params.cols;
    for c in range {
        let lanes = spread::<B>(read_u64(codes, c * row_bytes + at)).to_le_bytes();
        let (offset, scale) = (column_params.offset(c), column_params.scale(c));
        for (row, &code) in out.chunks_exact_mut(cols).zip(&lanes) {
            row[c] = params::dequantize(code, offset, scale);
        }
    }
}
