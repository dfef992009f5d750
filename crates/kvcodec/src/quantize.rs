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
//! - Errors: an empty matrix or one too large for the i32 shape; then the first non-finite
//!   element in row-major order of the N x D input; then the first group, in row-major order
//!   of the grouped view, whose asymmetric scale overflows.
//! - Decode ([`decode`], [`decode_into`]): `(stored - offset) as f32 * scale`, where offset is
//!   qmax (symmetric) or the group's zero point (asymmetric), cropped back to exactly N x D.
//!   The integer difference is exact in f32, so this one product is the exact product
//!   correctly rounded to f32.
//! - Exact decode ([`decode_exact`], [`decode_exact_tokens_into`]): `(stored - offset) as f64 *
//!   scale as f64`, the exact product (an 8-bit integer times a 24-bit significand fits f64's
//!   53 bits).
//!
//! How: [`encode`] and [`decode_into`] run the fast paths of the `fast` module with the
//! [`Kernel`] that [`Kernel::detect`] picks; [`encode_with`] and [`decode_into_with`] take one
//! explicitly. [`crate::reference`] holds the one-value-at-a-time oracle they are tested against.

use std::ops::Range;

use ndarray::{Array2, ArrayView2, ArrayViewMut2};

use bitpack::stream as bits;

use crate::asymmetric;
use crate::error::{KvError, Result};
use crate::fast::bits::with_width;
use crate::fast::decode::{Offsets, Stored};
use crate::fast::decode::{along_rows as decode_rows, down_columns as decode_columns};
use crate::fast::encode::{along_rows as encode_rows, down_columns as encode_columns};
use crate::fast::portable::Portable;
use crate::fast::{Dense, Orientation, Parts, Stop, general};
use crate::kernel::Kernel;
use crate::layout::{GroupAxis, Layout, Mode};
use crate::packed::PackedTensor;

/// Outputs from this size on are written with non-temporal stores: they cannot stay in cache
/// anyway, and skipping the read for ownership nearly halves the memory traffic.
const STREAMING_BYTES: usize = 16 << 20;

/// Quantizes `x` (N tokens x D features) under `layout`.
pub fn encode(x: ArrayView2<f32>, layout: Layout) -> Result<PackedTensor> {
    encode_with(Kernel::detect(), x, layout)
}

/// [`encode`] with the given kernel; every kernel writes the same bytes.
pub fn encode_with(kernel: Kernel, x: ArrayView2<f32>, layout: Layout) -> Result<PackedTensor> {
    encode_in(kernel, x, layout, Parts::default(), false)
}

/// [`encode`] into the memory of `spare`, a tensor no longer needed (of any layout and shape),
/// as a cache re-encoded again and again would be: the same result, without a fresh
/// allocation's page faults when `spare` is at least as large.
pub fn encode_reusing(
    x: ArrayView2<f32>,
    layout: Layout,
    spare: PackedTensor,
) -> Result<PackedTensor> {
    encode_reusing_with(Kernel::detect(), x, layout, spare)
}

/// [`encode_reusing`] with the given kernel.
pub fn encode_reusing_with(
    kernel: Kernel,
    x: ArrayView2<f32>,
    layout: Layout,
    spare: PackedTensor,
) -> Result<PackedTensor> {
    let (codes, scales, zero_points) = spare.into_buffers();
    let spare = Parts {
        codes,
        scales,
        zero_points,
    };
    encode_in(kernel, x, layout, spare, true)
}

/// Encodes into `spare`'s memory. The zero points are fitted one byte each and packed in place;
/// with `keep_room` their buffer keeps the unpacked length's capacity, for the next encoding
/// that reuses it, else it is shrunk to the packed length.
fn encode_in(
    kernel: Kernel,
    x: ArrayView2<f32>,
    layout: Layout,
    spare: Parts,
    keep_room: bool,
) -> Result<PackedTensor> {
    check_shape(x.dim())?;
    if !kernel.is_available() {
        return Err(KvError::KernelUnavailable { kernel });
    }
    let standard;
    let (m, orientation) = match dense(x, layout.axis) {
        Some(dense) => dense,
        None => {
            standard = x.as_standard_layout();
            dense(standard.view(), layout.axis).expect("a standard layout array is dense")
        }
    };
    let parts = encode_parts(kernel, m, orientation, layout, spare).map_err(|stop| match stop {
        Stop::NonFinite => first_non_finite(x),
        // The reference refuses a non-finite value anywhere before any overflowing range, and a
        // fast path may meet an overflowing group before a later non-finite value.
        Stop::RangeOverflow if x.iter().any(|v| !v.is_finite()) => first_non_finite(x),
        Stop::RangeOverflow => first_range_overflow(x, layout),
    })?;
    let geometry = layout.geometry(x.nrows(), x.ncols());
    let scales = Array2::from_shape_vec((geometry.rows, geometry.groups_per_row), parts.scales)
        .expect("one scale per group");
    let zero_points = match layout.mode {
        Mode::Symmetric => Vec::new(),
        Mode::Asymmetric => {
            let mut packed = pack_in_place(layout.bits, parts.zero_points)?;
            if !keep_room {
                packed.shrink_to_fit();
            }
            packed
        }
    };
    Ok(PackedTensor::new_unchecked(
        layout,
        [x.nrows(), x.ncols()],
        parts.codes,
        scales,
        zero_points,
    ))
}

/// Packs one-byte codes into their `bits`-wide stream in the same memory: chunk k's packed
/// bytes land before chunk k + 1 starts, and each chunk is copied out before it is overwritten.
fn pack_in_place(bits: bitpack::Bits, mut codes: Vec<u8>) -> Result<Vec<u8>> {
    // A multiple of 8 codes, so that every chunk's stream starts on a byte.
    const CHUNK: usize = 4096;
    let mut staged = [0u8; CHUNK];
    let mut packed = [0u8; CHUNK];
    let count = codes.len();
    let mut at = 0;
    while at < count {
        let len = (count - at).min(CHUNK);
        staged[..len].copy_from_slice(&codes[at..at + len]);
        let bytes = bits.byte_count(len);
        bits::pack_bytes_into(bits, &staged[..len], &mut packed[..bytes])?;
        let to = bits.byte_count(at);
        codes[to..to + bytes].copy_from_slice(&packed[..bytes]);
        at += len;
    }
    codes.truncate(bits.byte_count(count));
    Ok(codes)
}

/// Reconstructs the N x D matrix in f32.
pub fn decode(packed: &PackedTensor) -> Array2<f32> {
    let [tokens, features] = packed.shape();
    let mut out = Array2::<f32>::zeros((tokens, features));
    decode_into(packed, out.view_mut()).expect("the output has the tensor's shape");
    out
}

/// Decodes into `out`, which must be N x D (any memory layout; row-major or column-major
/// outputs take the fast paths).
pub fn decode_into(packed: &PackedTensor, out: ArrayViewMut2<f32>) -> Result<()> {
    decode_into_with(Kernel::detect(), packed, out)
}

/// [`decode_into`] with the given kernel; every kernel writes the same values.
pub fn decode_into_with(
    kernel: Kernel,
    packed: &PackedTensor,
    out: ArrayViewMut2<f32>,
) -> Result<()> {
    let streaming = out.len() * std::mem::size_of::<f32>() >= STREAMING_BYTES;
    decode_into_stores(kernel, packed, out, streaming)
}

/// Reconstructs the N x D matrix in f64, exactly: `(stored - offset) as f64 * scale as f64`.
pub fn decode_exact(packed: &PackedTensor) -> Array2<f64> {
    let [tokens, features] = packed.shape();
    let mut out = Array2::<f64>::zeros((tokens, features));
    general::decode_tokens(packed, 0..tokens, out.view_mut());
    out
}

/// Writes rows `tokens.start..tokens.end` of [`decode_exact`]'s matrix into `out`, which must
/// be `tokens.len()` x D, so a long tensor can be decoded a block of tokens at a time.
pub fn decode_exact_tokens_into(
    packed: &PackedTensor,
    tokens: Range<usize>,
    out: ArrayViewMut2<f64>,
) -> Result<()> {
    let [n, features] = packed.shape();
    if tokens.start > tokens.end || tokens.end > n {
        return Err(KvError::TokenRange {
            start: tokens.start,
            end: tokens.end,
            tokens: n,
        });
    }
    let expected = (tokens.len(), features);
    if out.dim() != expected {
        return Err(KvError::OutputShape {
            got: out.dim(),
            expected,
        });
    }
    general::decode_tokens(packed, tokens, out);
    Ok(())
}

/// [`decode_into_with`], with the choice of streaming stores made by the caller (the tests
/// force it on small outputs).
pub(crate) fn decode_into_stores(
    kernel: Kernel,
    packed: &PackedTensor,
    mut out: ArrayViewMut2<f32>,
    streaming: bool,
) -> Result<()> {
    let [tokens, features] = packed.shape();
    if out.dim() != (tokens, features) {
        return Err(KvError::OutputShape {
            got: out.dim(),
            expected: (tokens, features),
        });
    }
    if !kernel.is_available() {
        return Err(KvError::KernelUnavailable { kernel });
    }
    let layout = packed.layout();
    if !layout.group_size.is_multiple_of(8) {
        general::decode_tokens(packed, 0..tokens, out);
        return Ok(());
    }
    let scales = packed.scales().as_standard_layout();
    let scales = scales.as_slice().expect("standard layout");
    // Row-major: rows are tokens. Column-major: its transpose is row-major, rows are features.
    let (rows_are_tokens, mut view) = if out.is_standard_layout() {
        (true, out.view_mut())
    } else {
        (false, out.view_mut().reversed_axes())
    };
    let Some(data) = view.as_slice_mut() else {
        general::decode_tokens(packed, 0..tokens, out);
        return Ok(());
    };
    let cols = if rows_are_tokens { features } else { tokens };
    let orientation = match (layout.axis == GroupAxis::Feature, rows_are_tokens) {
        (true, true) | (false, false) => Orientation::Rows,
        _ => Orientation::Columns,
    };
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Avx512 && orientation == Orientation::Columns {
        use crate::fast::avx512::{
            Avx512, ColumnOffsets, Streams, decode_down_columns, decodes_down_columns,
        };
        if let Some(k) = Avx512::detect().filter(|k| k.has_bytes())
            && decodes_down_columns(cols, layout.group_size)
        {
            let streams = Streams {
                codes: packed.code_bytes(),
                scales,
                offsets: match layout.mode {
                    Mode::Symmetric => ColumnOffsets::Constant(i32::from(layout.bits.qmax())),
                    Mode::Asymmetric => ColumnOffsets::Packed(packed.zero_point_bytes()),
                },
                group_size: layout.group_size,
            };
            let bits = layout.bits.get();
            // SAFETY: `k.has_bytes()`, and the decoder takes this shape.
            unsafe { with_width!(bits, decode_down_columns, k, streams, data, cols, streaming) };
            return Ok(());
        }
    }
    let offsets = Offsets::of(packed);
    let stored = Stored {
        codes: packed.code_bytes(),
        scales,
        offsets: &offsets,
        group_size: layout.group_size,
    };
    decode_dense(kernel, stored, data, cols, orientation, streaming, layout);
    Ok(())
}

fn decode_dense(
    kernel: Kernel,
    stored: Stored,
    data: &mut [f32],
    cols: usize,
    orientation: Orientation,
    streaming: bool,
    layout: Layout,
) {
    let bits = layout.bits.get();
    match (kernel, orientation) {
        #[cfg(target_arch = "x86_64")]
        // Decoding has no other AVX-512 loop: AVX-512 runs AVX2's.
        (Kernel::Avx2 | Kernel::Avx512, orientation) => {
            use crate::fast::avx2::{Avx2, decode_along_rows, decode_down_columns};
            let k = Avx2::detect().expect("availability is checked");
            // SAFETY: `k` proves the CPU has AVX2.
            unsafe {
                match orientation {
                    Orientation::Rows => {
                        with_width!(bits, decode_along_rows, k, stored, data, cols, streaming)
                    }
                    Orientation::Columns => {
                        with_width!(bits, decode_down_columns, k, stored, data, cols, streaming)
                    }
                }
            }
        }
        (_, Orientation::Rows) => with_width!(
            bits,
            decode_rows::<Portable>,
            Portable,
            stored,
            data,
            cols,
            streaming
        ),
        (_, Orientation::Columns) => with_width!(
            bits,
            decode_columns::<Portable>,
            Portable,
            stored,
            data,
            cols,
            streaming
        ),
    }
}

fn encode_parts(
    kernel: Kernel,
    m: Dense,
    orientation: Orientation,
    layout: Layout,
    spare: Parts,
) -> std::result::Result<Parts, Stop> {
    if !layout.group_size.is_multiple_of(8) {
        return general::encode(m, orientation, layout, spare);
    }
    let bits = layout.bits.get();
    match (kernel, orientation) {
        #[cfg(target_arch = "x86_64")]
        (Kernel::Avx512, Orientation::Columns) => {
            use crate::fast::avx512::{Avx512, encode_down_columns};
            let k = Avx512::detect().expect("availability is checked");
            // SAFETY: `k` proves the CPU has AVX2 and AVX-512F.
            unsafe { with_width!(bits, encode_down_columns, k, m, layout, spare) }
        }
        #[cfg(target_arch = "x86_64")]
        (Kernel::Avx512, Orientation::Rows)
            if crate::fast::avx512::Avx512::detect().is_some_and(|k| k.has_bytes()) =>
        {
            use crate::fast::avx512::{Avx512, encode_along_rows};
            let k = Avx512::detect().expect("availability is checked");
            // SAFETY: `k` proves the CPU has AVX2 and AVX-512F, and BW and VBMI were seen.
            unsafe { with_width!(bits, encode_along_rows, k, m, layout, spare) }
        }
        #[cfg(target_arch = "x86_64")]
        (Kernel::Avx2 | Kernel::Avx512, orientation) => {
            use crate::fast::avx2::{Avx2, encode_along_rows, encode_down_columns};
            let k = Avx2::detect().expect("availability is checked");
            // SAFETY: `k` proves the CPU has AVX2.
            unsafe {
                match orientation {
                    Orientation::Rows => with_width!(bits, encode_along_rows, k, m, layout, spare),
                    Orientation::Columns => {
                        with_width!(bits, encode_down_columns, k, m, layout, spare)
                    }
                }
            }
        }
        (_, Orientation::Rows) => {
            with_width!(bits, encode_rows::<Portable>, Portable, m, layout, spare)
        }
        (_, Orientation::Columns) => {
            with_width!(bits, encode_columns::<Portable>, Portable, m, layout, spare)
        }
    }
}

/// `x` as a dense row-major matrix, if it is one either way round, with how it holds the
/// grouped view.
fn dense(x: ArrayView2<f32>, axis: GroupAxis) -> Option<(Dense, Orientation)> {
    let (tokens, features) = x.dim();
    if let Some(data) = x.to_slice() {
        let orientation = match axis {
            GroupAxis::Feature => Orientation::Rows,
            GroupAxis::Token => Orientation::Columns,
        };
        return Some((
            Dense {
                data,
                rows: tokens,
                cols: features,
            },
            orientation,
        ));
    }
    let data = x.reversed_axes().to_slice()?;
    let orientation = match axis {
        GroupAxis::Token => Orientation::Rows,
        GroupAxis::Feature => Orientation::Columns,
    };
    Some((
        Dense {
            data,
            rows: features,
            cols: tokens,
        },
        orientation,
    ))
}

fn check_shape((rows, cols): (usize, usize)) -> Result<()> {
    if rows == 0 || cols == 0 {
        return Err(KvError::EmptyMatrix { rows, cols });
    }
    if rows > i32::MAX as usize || cols > i32::MAX as usize {
        return Err(KvError::Shape {
            rows: rows as i64,
            cols: cols as i64,
        });
    }
    Ok(())
}

/// The first non-finite element in row-major order (a fast path saw one somewhere).
fn first_non_finite(x: ArrayView2<f32>) -> KvError {
    let ((row, col), &value) = x
        .indexed_iter()
        .find(|(_, v)| !v.is_finite())
        .expect("a fast path saw a non-finite value");
    KvError::NonFinite { row, col, value }
}

/// The first group, in row-major order of the grouped view, whose scale overflows (a fast
/// path met one somewhere): every group's range in one pass over `x`, then the groups in order.
fn first_range_overflow(x: ArrayView2<f32>, layout: Layout) -> KvError {
    let geometry = layout.geometry(x.nrows(), x.ncols());
    let groups = geometry.groups_per_row;
    let mut low = vec![0f32; geometry.scale_count()];
    let mut high = vec![0f32; geometry.scale_count()];
    for ((t, f), &v) in x.indexed_iter() {
        let (row, j) = match layout.axis {
            GroupAxis::Token => (f, t),
            GroupAxis::Feature => (t, f),
        };
        let index = row * groups + j / layout.group_size;
        low[index] = low[index].min(v);
        high[index] = high[index].max(v);
    }
    let index = (0..geometry.scale_count())
        .find(|&i| asymmetric::group_params(low[i], high[i], layout.bits).is_none())
        .expect("a fast path met an overflowing group");
    KvError::RangeOverflow {
        row: index / groups,
        group: index % groups,
        low: low[index],
        high: high[index],
        bits: layout.bits.get(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_in_place_gives_the_stream_packers_bytes() {
        for width in bitpack::Bits::ALL {
            for count in [0, 1, 7, 4095, 4096, 4097, 3 * 4096 + 5] {
                let codes: Vec<u8> = (0..count)
                    .map(|i| (i * 37 + i / 11) as u8 & width.max_code())
                    .collect();
                let expected = bits::pack_bytes(width, &codes).unwrap();
                let packed = pack_in_place(width, codes.clone()).unwrap();
                assert_eq!(packed, expected, "{width}, {count} codes");
                // The memory keeps room for the unpacked codes, for the next encoding.
                assert!(packed.capacity() >= count);
            }
        }
    }

    #[test]
    fn a_fresh_encoding_holds_its_zero_points_packed_and_a_reused_one_keeps_room() {
        let x = ndarray::Array2::from_shape_fn((64, 96), |(t, f)| (t * 7 + f) as f32 % 13.0 - 6.0);
        let layout = Layout::with_mode(GroupAxis::Feature, Mode::Asymmetric, 2, 8).unwrap();
        let fresh = encode(x.view(), layout).unwrap();
        let expected = fresh.clone();
        let (_, _, zeros) = fresh.into_buffers();
        assert_eq!(zeros.len(), 64 * 96 / 8 * 2 / 8);
        assert_eq!(zeros.capacity(), zeros.len());
        let reused = encode_reusing(x.view(), layout, expected.clone()).unwrap();
        assert_eq!(reused, expected);
        let (_, _, zeros) = reused.into_buffers();
        assert!(zeros.capacity() >= 64 * 96 / 8);
    }
}
