//! The packed tensor container and its byte accounting.
//!
//! A packed tensor is exactly three arrays, and nothing else is needed to decode it given its
//! [`Layout`]:
//! - `codes`: u8 stream bytes, `bits.stream_bytes(rows * padded_row_len)` of them;
//! - `scales`: f32, shape [rows, groups_per_row] of the grouped view;
//! - `shape`: the logical [N, D] as two i32 values.
//!
//! Its payload is `codes.len() + 4 * scales.len() + 8` bytes: codes, f32 scales and the two
//! i32 shape values. Containers, allocator overhead and decoded copies are not counted.

use ndarray::Array2;

use crate::error::{CodecError, Result};
use crate::layout::{Geometry, Layout};
use crate::stream;

/// Bytes taken by the two i32 shape values stored with every packed tensor.
pub const SHAPE_BYTES: usize = 2 * std::mem::size_of::<i32>();

#[derive(Debug, Clone, PartialEq)]
pub struct PackedTensor {
    layout: Layout,
    tokens: usize,
    features: usize,
    codes: Vec<u8>,
    scales: Array2<f32>,
}

impl PackedTensor {
    /// Assembles a packed tensor from its stored parts, checking that they agree with each other
    /// and with the layout: shape positive, byte count, scale shape, scales finite and positive,
    /// every code within the width's stored range.
    pub fn from_parts(
        layout: Layout,
        shape: [i32; 2],
        codes: Vec<u8>,
        scales: Array2<f32>,
    ) -> Result<Self> {
        let [n, d] = shape;
        if n <= 0 || d <= 0 {
            return Err(CodecError::Malformed(format!(
                "shape [{n}, {d}] must have two positive dimensions"
            )));
        }
        let tensor = PackedTensor {
            layout,
            tokens: n as usize,
            features: d as usize,
            codes,
            scales,
        };
        tensor.validate()?;
        Ok(tensor)
    }

    /// Used by the encoder, whose parts agree by construction.
    pub(crate) fn new_unchecked(
        layout: Layout,
        tokens: usize,
        features: usize,
        codes: Vec<u8>,
        scales: Array2<f32>,
    ) -> Self {
        PackedTensor {
            layout,
            tokens,
            features,
            codes,
            scales,
        }
    }

    fn validate(&self) -> Result<()> {
        let geometry = self.geometry();
        let expected_bytes = self.layout.bits.stream_bytes(geometry.code_count());
        if self.codes.len() != expected_bytes {
            return Err(CodecError::Malformed(format!(
                "{} code bytes, but shape [{}, {}] with {} groups of {} on the {} axis at {} bits needs {}",
                self.codes.len(),
                self.tokens,
                self.features,
                geometry.scale_count(),
                self.layout.group_size,
                self.layout.axis,
                self.layout.bits.get(),
                expected_bytes
            )));
        }
        let expected_scales = (geometry.rows, geometry.groups_per_row);
        if self.scales.dim() != expected_scales {
            return Err(CodecError::Malformed(format!(
                "scales have shape {:?}, expected {:?} (rows x groups per row)",
                self.scales.dim(),
                expected_scales
            )));
        }
        if let Some(((r, g), s)) = self
            .scales
            .indexed_iter()
            .find(|(_, s)| !(s.is_finite() && **s > 0.0))
        {
            return Err(CodecError::Malformed(format!(
                "scale [{r}, {g}] is {s}; scales must be finite and positive"
            )));
        }
        let max_stored = self.layout.bits.max_stored();
        let codes = self.stored_codes();
        if let Some((i, c)) = codes.iter().enumerate().find(|(_, c)| **c > max_stored) {
            return Err(CodecError::Malformed(format!(
                "code {c} at stream position {i} exceeds the {}-bit maximum {max_stored}",
                self.layout.bits.get()
            )));
        }
        Ok(())
    }

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

    pub fn geometry(&self) -> Geometry {
        self.layout.geometry(self.tokens, self.features)
    }

    /// The packed code stream.
    pub fn code_bytes(&self) -> &[u8] {
        &self.codes
    }

    pub fn scales(&self) -> &Array2<f32> {
        &self.scales
    }

    /// Stored (offset) codes in stream order, padding included, one per element of the grouped
    /// view.
    pub fn stored_codes(&self) -> Vec<u8> {
        stream::unpack(self.layout.bits, &self.codes, self.geometry().code_count())
    }

    /// Bytes this tensor occupies: codes, f32 scales and the two i32 shape values.
    pub fn payload_bytes(&self) -> usize {
        self.codes.len() + std::mem::size_of::<f32>() * self.scales.len() + SHAPE_BYTES
    }
}
