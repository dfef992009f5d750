//! The fast codec: drivers that walk a dense matrix in memory order ([`encode`], [`decode`]),
//! over inner kernels per instruction set ([`portable`], and [`avx2`] on x86_64), plus a general
//! path for group sizes that are not a multiple of 8 and for exact (f64) or ranged decoding
//! ([`general`]).
//!
//! Two ways a dense row-major matrix M holds the grouped view of [`crate::layout`]:
//! - [`Orientation::Rows`]: grouped row r is M's row r (the feature axis of a standard N x D
//!   array, or the token axis of its transpose). Groups are contiguous runs of a row.
//! - [`Orientation::Columns`]: grouped row r is M's column r (the token axis of a standard
//!   array). The drivers take tiles of `group_size` consecutive rows of M, fit every column of
//!   the tile at once (vertical max/min), and transpose the tile's codes to the column-major
//!   stream with an in-register byte transpose.
//!
//! With a group size that is a multiple of 8, every group starts on a byte boundary of the code
//! stream (`group_size * b` bits), so groups are packed and unpacked independently, straight
//! into or out of the stream.

pub(crate) mod bits;
pub(crate) mod decode;
pub(crate) mod encode;
pub(crate) mod general;
pub(crate) mod params;
pub(crate) mod portable;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

use params::{ColumnQuant, GroupQuant};

/// How a group's parameters are fitted: symmetric at `qmax`, or asymmetric at `levels`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fit {
    /// Symmetric, with this qmax.
    Symmetric(u8),
    /// Asymmetric, with this many levels (2^b - 1).
    Asymmetric(u8),
}

/// Bytes past a group's end that [`Kernels::quantize_pack`] may overwrite with garbage before
/// the next group overwrites them with codes.
pub(crate) const SCRIBBLE: usize = 16;

/// A dense row-major matrix.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dense<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
}

/// How a dense matrix holds the grouped view (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Orientation {
    /// Grouped rows are the matrix's rows.
    Rows,
    /// Grouped rows are the matrix's columns.
    Columns,
}

/// Why a fast encoder stopped; the caller finds the element or group to name, in the order
/// the reference would have met it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Some input value is NaN or infinite.
    NonFinite,
    /// Some group's scale overflows f32.
    RangeOverflow,
}

/// The stored parts of an encoded matrix: code stream, scales [rows * groups_per_row] in
/// row-major group order, and unpacked zero points in the same order (asymmetric only).
#[derive(Debug, Default)]
pub(crate) struct Parts {
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    pub zero_points: Vec<u8>,
}

impl Parts {
    /// Zeroed parts of these lengths, in `spare`'s memory where it is large enough: pages that
    /// were written before cost nothing to write again, while a fresh allocation's fault in on
    /// first write (on some systems that costs more than the encoding itself).
    pub(crate) fn zeroed(spare: Parts, codes: usize, scales: usize, zero_points: usize) -> Parts {
        Parts {
            codes: zeroed(spare.codes, codes),
            scales: zeroed(spare.scales, scales),
            zero_points: zeroed(spare.zero_points, zero_points),
        }
    }
}

/// `len` zeros in `spare`'s memory if it holds them, else in a fresh zeroed allocation.
fn zeroed<T: Copy + Default>(mut spare: Vec<T>, len: usize) -> Vec<T> {
    if spare.capacity() < len {
        return vec![T::default(); len];
    }
    spare.clear();
    spare.resize(len, T::default());
    spare
}

/// Where [`Kernels::fit_quantize_pack_columns`] writes one tile's per-column results.
pub(crate) struct ColumnTileOut<'a> {
    /// Column c's scale goes to `scales[c * stride]`.
    pub scales: &'a mut [f32],
    /// Column c's zero point goes to `zero_points[c * stride]` (asymmetric; else empty).
    pub zero_points: &'a mut [u8],
    /// See `scales`.
    pub stride: usize,
    /// Column c's `group_size * B / 8` bytes of codes go to `codes[c * row_bytes + at..]`.
    pub codes: &'a mut [u8],
    /// See `codes`.
    pub row_bytes: usize,
    /// See `codes`.
    pub at: usize,
}

/// One tile's parameters for [`Kernels::dequantize_columns`]: column c's offset is
/// `offsets[c * stride]` and its scale `scales[c * stride]`, so that a pass can gather each
/// column's run of tiles contiguously (one column after another) and hand the kernel tile j's
/// as the slices from j on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ColumnParams<'a> {
    /// See the type's comment.
    pub offsets: &'a [i32],
    /// See the type's comment.
    pub scales: &'a [f32],
    /// See the type's comment.
    pub stride: usize,
    /// Columns of the tile.
    pub cols: usize,
}

impl ColumnParams<'_> {
    /// Column c's offset.
    #[inline(always)]
    pub(crate) fn offset(&self, c: usize) -> i32 {
        self.offsets[c * self.stride]
    }

    /// Column c's scale.
    #[inline(always)]
    pub(crate) fn scale(&self, c: usize) -> f32 {
        self.scales[c * self.stride]
    }
}

/// Per-column working space of [`Kernels::fit_quantize_pack_columns`], `cols` long.
pub(crate) struct ColumnScratch {
    /// Fitted minima (or max |x|).
    pub low: Vec<f32>,
    /// Fitted maxima.
    pub high: Vec<f32>,
    /// Parameters.
    pub q: ColumnQuant,
}

/// [`Kernels::fit_quantize_pack16`] as two calls of [`Kernels::fit_quantize_pack8`].
#[inline(always)]
pub(crate) fn pack16_as_eights<K: Kernels, const B: u32>(
    k: K,
    values: &[f32],
    group_size: usize,
    fit: Fit,
    scales: &mut [f32],
    zero_points: &mut [u8],
    out: &mut [u8],
) -> bool {
    let (values, later) = values.split_at(8 * group_size);
    let (scales, later_scales) = scales.split_at_mut(8);
    let (zero_points, later_zeros) = zero_points.split_at_mut(zero_points.len().min(8));
    // The first half may scribble over the second's codes, which come after.
    k.fit_quantize_pack8::<B>(values, group_size, fit, scales, zero_points, out)
        && k.fit_quantize_pack8::<B>(
            later,
            group_size,
            fit,
            later_scales,
            later_zeros,
            &mut out[group_size * B as usize..],
        )
}

/// The inner loops, one implementation per instruction set. `B` is the code width.
pub(crate) trait Kernels: Copy {
    /// max |x| over the group (0 if empty), and whether every value is finite.
    fn group_amax(self, group: &[f32]) -> (f32, bool);

    /// (min(min x, 0), max(max x, 0)) over the group, and whether every value is finite.
    fn group_range(self, group: &[f32]) -> (f32, f32, bool);

    /// Quantizes a group whose length is a multiple of 8 and packs its codes into the first
    /// `len * B / 8` bytes of `out`; may overwrite the next [`SCRIBBLE`] bytes with garbage, so
    /// `out` must be that much longer.
    fn quantize_pack<const B: u32>(self, group: &[f32], q: &GroupQuant, out: &mut [u8]);

    /// Fits, quantizes and packs 8 consecutive whole groups of `group_size` values (a multiple
    /// of 8; `values` holds the 8 groups): the 8 scales into `scales`, for [`Fit::Asymmetric`]
    /// the 8 zero points into `zero_points` (empty for symmetric), and the codes into the first
    /// `8 * group_size * B / 8` bytes of `out`, which may be scribbled on as in
    /// [`Kernels::quantize_pack`]. Returns false when some group has a non-finite value or an
    /// overflowing scale, with any of the outputs written; the caller then redoes the groups
    /// one at a time to stop where that would.
    #[inline(always)]
    fn fit_quantize_pack8<const B: u32>(
        self,
        values: &[f32],
        group_size: usize,
        fit: Fit,
        scales: &mut [f32],
        zero_points: &mut [u8],
        out: &mut [u8],
    ) -> bool {
        let group_bytes = group_size * B as usize / 8;
        for (i, group) in values.chunks_exact(group_size).take(8).enumerate() {
            let zero = zero_points.get_mut(i);
            let out = &mut out[i * group_bytes..];
            if encode::pack_group::<Self, B>(self, group, fit, &mut scales[i], zero, out).is_err() {
                return false;
            }
        }
        true
    }

    /// Whether [`Kernels::fit_quantize_pack16`] has a loop of its own for this group size
    /// (else it is two calls of [`Kernels::fit_quantize_pack8`], and the driver goes 8 at a time).
    #[inline(always)]
    fn packs16<const B: u32>(self, _group_size: usize) -> bool {
        false
    }

    /// [`Kernels::fit_quantize_pack8`] over 16 consecutive whole groups.
    #[inline(always)]
    fn fit_quantize_pack16<const B: u32>(
        self,
        values: &[f32],
        group_size: usize,
        fit: Fit,
        scales: &mut [f32],
        zero_points: &mut [u8],
        out: &mut [u8],
    ) -> bool {
        pack16_as_eights::<Self, B>(self, values, group_size, fit, scales, zero_points, out)
    }

    /// Column-wise max |x| of a tile of `amax.len()` columns into `amax` (which starts at 0),
    /// and whether every value is finite.
    fn columns_amax(self, tile: &[f32], amax: &mut [f32]) -> bool;

    /// Column-wise (min, 0) and (max, 0) of a tile into `lo` and `hi` (which start at 0), and
    /// whether every value is finite.
    fn columns_range(self, tile: &[f32], lo: &mut [f32], hi: &mut [f32]) -> bool;

    /// Symmetric scales of the columns whose max |x| is `amax`.
    fn symmetric_columns(self, amax: &[f32], qmax: u8, scale: &mut [f32]);

    /// Asymmetric parameters of the columns of range [`lo`, `hi`]; false if a scale overflows.
    fn asymmetric_columns(self, lo: &[f32], hi: &[f32], levels: u8, q: &mut ColumnQuant) -> bool;

    /// Quantizes a tile of up to `group_size` rows (missing rows are zero padding; the group
    /// size is a multiple of 8) and writes column c's `group_size * B / 8` bytes at
    /// `codes[c * row_bytes + at..]`, exactly.
    fn quantize_pack_columns<const B: u32>(
        self,
        tile: &[f32],
        q: &ColumnQuant,
        group_size: usize,
        codes: &mut [u8],
        row_bytes: usize,
        at: usize,
    );

    /// Fits, quantizes and packs a tile of up to `group_size` rows (missing rows are zero
    /// padding) of `scratch`'s column count, into `out`. Stops with [`Stop::NonFinite`] if
    /// some value of the tile is not finite, else with [`Stop::RangeOverflow`] if some
    /// column's scale overflows (with any of `out` written).
    #[inline(always)]
    fn fit_quantize_pack_columns<const B: u32>(
        self,
        tile: &[f32],
        group_size: usize,
        fit: Fit,
        scratch: &mut ColumnScratch,
        out: ColumnTileOut,
    ) -> Result<(), Stop> {
        let ColumnScratch { low, high, q } = scratch;
        low.fill(0.0);
        match fit {
            Fit::Symmetric(qmax) => {
                if !self.columns_amax(tile, low) {
                    return Err(Stop::NonFinite);
                }
                self.symmetric_columns(low, qmax, &mut q.scale);
            }
            Fit::Asymmetric(levels) => {
                high.fill(0.0);
                if !self.columns_range(tile, low, high) {
                    return Err(Stop::NonFinite);
                }
                if !self.asymmetric_columns(low, high, levels, q) {
                    return Err(Stop::RangeOverflow);
                }
                for (c, &zero) in q.offset.iter().enumerate() {
                    out.zero_points[c * out.stride] = zero as u8;
                }
            }
        }
        for (c, &scale) in q.scale.iter().enumerate() {
            out.scales[c * out.stride] = scale;
        }
        self.quantize_pack_columns::<B>(tile, q, group_size, out.codes, out.row_bytes, out.at);
        Ok(())
    }

    /// Decodes the first `out.len()` codes of the group starting at `codes[0]` (the stream
    /// from there on).
    fn dequantize_group<const B: u32>(self, codes: &[u8], offset: i32, scale: f32, out: &mut [f32]);

    /// Decodes `scales.len()` consecutive whole groups of `group_size` values (a multiple of
    /// 8) whose codes start at `codes[0]`, group i with scale `scales[i]` and offset
    /// `offsets.get(i)`, into `out` (`scales.len() * group_size` values). With `streaming`,
    /// stores may bypass the caches; [`Kernels::finish_streaming`] must follow.
    #[inline(always)]
    fn dequantize_groups<const B: u32>(
        self,
        codes: &[u8],
        offsets: decode::GroupOffsets,
        scales: &[f32],
        group_size: usize,
        out: &mut [f32],
        streaming: bool,
    ) {
        let _ = streaming;
        decode::groups_one_by_one::<Self, B>(self, codes, offsets, scales, group_size, out);
    }

    /// Decodes up to 8 consecutive rows of a tile grouped down its columns: column c's codes
    /// start at `codes[c * row_bytes + at]` (byte aligned), its parameters are `params`'
    /// column c, and `out` holds `rows x params.cols` values.
    fn dequantize_columns<const B: u32>(
        self,
        codes: &[u8],
        row_bytes: usize,
        at: usize,
        params: ColumnParams,
        out: &mut [f32],
    );

    /// Copies `src` to `dst` (same length) with stores that bypass the caches where the
    /// instruction set has them; [`Kernels::finish_streaming`] must follow before `dst` is
    /// handed on.
    fn stream_copy(self, src: &[f32], dst: &mut [f32]);

    /// Orders the streaming stores before anything that follows.
    fn finish_streaming(self);
}
