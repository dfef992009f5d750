//! The packed tensor container and its byte accounting.
//!
//! A packed tensor is these arrays, and nothing else is needed to decode it given its
//! [`Layout`]:
//! - `codes`: the b-bit byte stream ([`bitpack::stream`]) of `rows * padded_row_len` stored codes,
//!   `bits.byte_count(rows * padded_row_len)` bytes (at 4 bits two codes per byte, even element
//!   in the low nibble; at 8 bits one per byte);
//! - `scales`: f32, shape [rows, groups_per_row] of the grouped view;
//! - `zero_points`: asymmetric layouts only, the b-bit byte stream of the `rows *
//!   groups_per_row` zero points in row-major group order, `bits.byte_count(groups)` bytes;
//!   empty for symmetric layouts, whose offset qmax is implied by the width;
//! - `shape`: the logical [N, D] as two i32 values.
//!
//! Its payload is `codes + 4 * scales + zero_points + 8` bytes: code bytes, f32 scales, zero
//! point bytes (none when symmetric) and the two i32 shape values, each counted as stored.
//! Containers, allocator overhead and decoded copies are not counted.

use ndarray::Array2;

use bitpack::stream as bits;

use crate::error::{KvError, Result};
use crate::layout::{Geometry, Layout, Mode};

/// Bytes taken by the two i32 shape values stored with every packed tensor.
pub const SHAPE_BYTES: usize = 2 * std::mem::size_of::<i32>();

/// One N x D matrix as stored: its layout and shape, the code stream, the scales and (when
/// asymmetric) the zero-point stream.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedTensor {
    layout: Layout,
    tokens: usize,
    features: usize,
    codes: Vec<u8>,
    scales: Array2<f32>,
    zero_points: Vec<u8>,
}

impl PackedTensor {
    /// Assembles a symmetric packed tensor from its stored parts; see
    /// [`PackedTensor::from_parts_with_zero_points`] for the checks. An asymmetric layout is
    /// refused here because it needs zero points.
    pub fn from_parts(
        layout: Layout,
        shape: [i32; 2],
        codes: Vec<u8>,
        scales: Array2<f32>,
    ) -> Result<Self> {
        PackedTensor::from_parts_with_zero_points(layout, shape, codes, scales, Vec::new())
    }

    /// Assembles a packed tensor from its stored parts, checking that they agree with each other
    /// and with the layout: shape positive, code byte count, scale shape, scales finite and
    /// positive, every code within the layout's stored range, and zero point bytes (exactly
    /// `bits.byte_count(groups)` for asymmetric layouts, none for symmetric ones).
    pub fn from_parts_with_zero_points(
        layout: Layout,
        shape: [i32; 2],
        codes: Vec<u8>,
        scales: Array2<f32>,
        zero_points: Vec<u8>,
    ) -> Result<Self> {
        let [n, d] = shape;
        if n <= 0 || d <= 0 {
            return Err(KvError::Shape {
                rows: n.into(),
                cols: d.into(),
            });
        }
        let tensor = PackedTensor::new_unchecked(
            layout,
            [n as usize, d as usize],
            codes,
            scales,
            zero_points,
        );
        tensor.validate()?;
        Ok(tensor)
    }

    /// Used by the encoder, whose parts agree by construction.
    pub(crate) fn new_unchecked(
        layout: Layout,
        [tokens, features]: [usize; 2],
        codes: Vec<u8>,
        scales: Array2<f32>,
        zero_points: Vec<u8>,
    ) -> Self {
        PackedTensor {
            layout,
            tokens,
            features,
            codes,
            scales,
            zero_points,
        }
    }

    /// The tensor's memory, for [`crate::encode_reusing`]: code stream, scales (row-major) and
    /// packed zero points.
    pub(crate) fn into_buffers(self) -> (Vec<u8>, Vec<f32>, Vec<u8>) {
        let (scales, _) = self.scales.into_raw_vec_and_offset();
        (self.codes, scales, self.zero_points)
    }

    fn validate(&self) -> Result<()> {
        let geometry = self.geometry();
        let expected_bytes = self.layout.bits.byte_count(geometry.code_count());
        if self.codes.len() != expected_bytes {
            return Err(KvError::CodeBytes {
                got: self.codes.len(),
                expected: expected_bytes,
            });
        }
        let expected_scales = (geometry.rows, geometry.groups_per_row);
        if self.scales.dim() != expected_scales {
            return Err(KvError::ScaleShape {
                got: self.scales.dim(),
                expected: expected_scales,
            });
        }
        if let Some(((row, group), &value)) = self
            .scales
            .indexed_iter()
            .find(|(_, s)| !(s.is_finite() && **s > 0.0))
        {
            return Err(KvError::Scale { row, group, value });
        }
        self.validate_zero_points(geometry)?;
        let max_stored = self.layout.max_stored();
        let codes = self.stored_codes();
        if let Some((position, &code)) = codes.iter().enumerate().find(|(_, c)| **c > max_stored) {
            return Err(KvError::CodeRange {
                code,
                position,
                max: max_stored,
            });
        }
        Ok(())
    }

    fn validate_zero_points(&self, geometry: Geometry) -> Result<()> {
        let expected = match self.layout.mode {
            Mode::Symmetric => 0,
            Mode::Asymmetric => self.layout.bits.byte_count(geometry.scale_count()),
        };
        if self.zero_points.len() == expected {
            return Ok(());
        }
        Err(KvError::ZeroPointBytes {
            got: self.zero_points.len(),
            expected,
            mode: self.layout.mode,
        })
    }

    /// The layout the codes follow.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Logical shape [N, D] (tokens, features).
    pub fn shape(&self) -> [usize; 2] {
        [self.tokens, self.features]
    }

    /// Logical shape as stored: two i32 values.
    pub fn shape_i32(&self) -> [i32; 2] {
        [self.tokens as i32, self.features as i32]
    }

    /// The grouped view's sizes.
    pub fn geometry(&self) -> Geometry {
        self.layout.geometry(self.tokens, self.features)
    }

    /// The packed code stream.
    pub fn code_bytes(&self) -> &[u8] {
        &self.codes
    }

    /// The float32 scales, [rows, groups per row].
    pub fn scales(&self) -> &Array2<f32> {
        &self.scales
    }

    /// The packed zero point stream: empty for symmetric layouts.
    pub fn zero_point_bytes(&self) -> &[u8] {
        &self.zero_points
    }

    /// Stored (offset) codes in stream order, padding included, one per element of the grouped
    /// view.
    pub fn stored_codes(&self) -> Vec<u8> {
        bits::unpack_bytes(self.layout.bits, &self.codes, self.geometry().code_count())
            .expect("the code stream's size is checked on construction")
    }

    /// What decoding subtracts from each group's stored codes, [rows, groups_per_row]: qmax for
    /// every group of a symmetric tensor, the stored zero points of an asymmetric one.
    pub fn offsets(&self) -> Array2<u8> {
        let geometry = self.geometry();
        let shape = (geometry.rows, geometry.groups_per_row);
        match self.layout.mode {
            Mode::Symmetric => Array2::from_elem(shape, self.layout.bits.qmax()),
            Mode::Asymmetric => {
                let zeros =
                    bits::unpack_bytes(self.layout.bits, &self.zero_points, geometry.scale_count())
                        .expect("the zero point stream's size is checked on construction");
                Array2::from_shape_vec(shape, zeros).expect("one zero point per group")
            }
        }
    }

    /// Bytes this tensor occupies: codes, f32 scales, zero points and the two i32 shape values.
    pub fn payload_bytes(&self) -> usize {
        self.codes.len()
            + std::mem::size_of::<f32>() * self.scales.len()
            + self.zero_points.len()
            + SHAPE_BYTES
    }
}
