//! The audit's own decoder, written from the evidence format's spec and sharing no code with the
//! codec.
//!
//! - Streams are little-endian bit streams in bytes: stored code p of a b-bit stream occupies
//!   bits [p*b, (p+1)*b), counting from bit 0 of byte 0 (at 4 bits: the low nibble holds the
//!   even position). A stream of n codes takes ceil(n*b / 8) bytes; unused high bits are zero.
//! - The code stream holds one stored code per element of the grouped view, padding included, in
//!   row-major order. K (`token` axis): element (t, f) is row f, column t of a D x N_padded view;
//!   its group is (f, t / g). V (`feature` axis): element (t, f) is row t, column f of an
//!   N x D_padded view; its group is (t, f / g).
//! - Symmetric: stored codes run 0..=2*qmax with qmax = 2^(b-1) - 1; value = (stored - qmax) *
//!   scale. Asymmetric: codes run 0..=2^b - 1 and each group has a b-bit zero point, stored in
//!   its own stream in the scales' row-major order; value = (code - zero) * scale.

use ndarray::{Array2, ArrayView2};

pub use crate::packed_kv::protocol::Mode;

/// The axis a tensor is grouped along.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupAxis {
    /// Groups of consecutive tokens within each feature column (K).
    Token,
    /// Groups of consecutive features within each token row (V).
    Feature,
}

/// Where one packed tensor's elements live, from its logical shape and format.
#[derive(Debug, Clone, Copy)]
pub struct Grid {
    pub tokens: usize,
    pub features: usize,
    pub group_size: usize,
    pub bits: u32,
    pub axis: GroupAxis,
    pub mode: Mode,
}

impl Grid {
    /// (rows, padded row length, groups per row) of the grouped view.
    pub fn view(&self) -> (usize, usize, usize) {
        let (rows, len) = match self.axis {
            GroupAxis::Token => (self.features, self.tokens),
            GroupAxis::Feature => (self.tokens, self.features),
        };
        let groups = len / self.group_size + usize::from(len % self.group_size != 0);
        (rows, groups * self.group_size, groups)
    }

    /// Codes in the stream, padding included.
    pub fn positions(&self) -> usize {
        let (rows, padded, _) = self.view();
        rows * padded
    }

    /// Groups (scales, and zero points when asymmetric).
    pub fn groups(&self) -> usize {
        let (rows, _, groups) = self.view();
        rows * groups
    }

    /// Bytes a stream of `count` codes of this width takes.
    pub fn stream_bytes(&self, count: usize) -> usize {
        (count * self.bits as usize).div_ceil(8)
    }

    /// Largest code the encoder writes: 2 * qmax when symmetric, 2^b - 1 when asymmetric.
    pub fn max_code(&self) -> u8 {
        let all_ones = ((1u16 << self.bits) - 1) as u8;
        match self.mode {
            Mode::Symmetric => all_ones - 1,
            Mode::Asymmetric => all_ones,
        }
    }

    /// The symmetric offset qmax = 2^(b-1) - 1.
    pub fn qmax(&self) -> u8 {
        ((1u16 << (self.bits - 1)) - 1) as u8
    }

    /// Stream position and group index (row, group) of logical element (t, f).
    pub fn locate(&self, t: usize, f: usize) -> (usize, [usize; 2]) {
        let (_, padded, _) = self.view();
        match self.axis {
            GroupAxis::Token => (f * padded + t, [f, t / self.group_size]),
            GroupAxis::Feature => (t * padded + f, [t, f / self.group_size]),
        }
    }

    /// Group index (row, group) of stream position p.
    pub fn group_of(&self, p: usize) -> [usize; 2] {
        let (_, padded, _) = self.view();
        [p / padded, (p % padded) / self.group_size]
    }

    /// Whether stream position p is padding (beyond the logical row length).
    pub fn is_padding(&self, p: usize) -> bool {
        let (_, padded, _) = self.view();
        let len = match self.axis {
            GroupAxis::Token => self.tokens,
            GroupAxis::Feature => self.features,
        };
        p % padded >= len
    }
}

/// Code at position `p` of a b-bit little-endian byte stream: the two bytes around its first
/// bit, read as one little-endian u16, shifted and masked.
pub fn code_at(stream: &[u8], bits: u32, p: usize) -> u8 {
    let bit = p * bits as usize;
    let (byte, shift) = (bit / 8, bit % 8);
    let low = u16::from(stream[byte]);
    let high = stream.get(byte + 1).map_or(0, |&b| u16::from(b));
    (((high << 8 | low) >> shift) & ((1u16 << bits) - 1)) as u8
}

/// Whether the bits of `stream` past `count` codes are all zero.
pub fn tail_is_clear(stream: &[u8], bits: u32, count: usize) -> bool {
    let used = count * bits as usize;
    match stream.last() {
        Some(&last) if !used.is_multiple_of(8) => last >> (used % 8) == 0,
        _ => true,
    }
}

/// The offset subtracted from each group's codes: qmax when symmetric, the stored zero point when
/// asymmetric.
pub fn offsets(grid: &Grid, zeros: &[u8]) -> Array2<u8> {
    let (rows, _, groups) = grid.view();
    Array2::from_shape_fn((rows, groups), |(r, g)| match grid.mode {
        Mode::Symmetric => grid.qmax(),
        Mode::Asymmetric => code_at(zeros, grid.bits, r * groups + g),
    })
}

/// The logical N x D matrix a stream, its scales and its offsets encode.
pub fn decode(
    grid: &Grid,
    stream: &[u8],
    scales: ArrayView2<f32>,
    offsets: &Array2<u8>,
) -> Array2<f64> {
    Array2::from_shape_fn((grid.tokens, grid.features), |(t, f)| {
        value_at(grid, stream, scales, offsets, t, f)
    })
}

/// Logical element (t, f) of what [`decode`] returns, alone: the audit decodes as it reads
/// rather than holding a decoded f64 copy of K or V.
pub fn value_at(
    grid: &Grid,
    stream: &[u8],
    scales: ArrayView2<f32>,
    offsets: &Array2<u8>,
    t: usize,
    f: usize,
) -> f64 {
    let (p, group) = grid.locate(t, f);
    let signed = i32::from(code_at(stream, grid.bits, p)) - i32::from(offsets[group]);
    f64::from(signed) * f64::from(scales[group])
}

/// The axes of a setting, as the decoder reads them (here rather than in `protocol`, which the
/// decoder depends on).
impl crate::packed_kv::protocol::Axes {
    /// The axis K is grouped along.
    pub fn k(self) -> GroupAxis {
        match self {
            Self::KTokenVFeature => GroupAxis::Token,
            Self::KFeatureVToken => GroupAxis::Feature,
        }
    }

    /// The axis V is grouped along.
    pub fn v(self) -> GroupAxis {
        match self {
            Self::KTokenVFeature => GroupAxis::Feature,
            Self::KFeatureVToken => GroupAxis::Token,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    fn grid(tokens: usize, features: usize, group_size: usize, bits: u32, axis: GroupAxis) -> Grid {
        Grid {
            tokens,
            features,
            group_size,
            bits,
            axis,
            mode: Mode::Symmetric,
        }
    }

    #[test]
    fn byte_d2_holds_codes_2_then_13() {
        assert_eq!((code_at(&[0xD2], 4, 0), code_at(&[0xD2], 4, 1)), (2, 13));
    }

    #[test]
    fn three_bit_codes_straddle_bytes() {
        // Codes 1..=8 masked to 3 bits: 1,2,3,4,5,6,7,0 packed LSB first = 0xD1 0x58 0x1F.
        let stream = [0xD1, 0x58, 0x1F];
        let codes: Vec<u8> = (0..8).map(|p| code_at(&stream, 3, p)).collect();
        assert_eq!(codes, vec![1, 2, 3, 4, 5, 6, 7, 0]);
        assert!(tail_is_clear(&[0x07], 3, 1) && !tail_is_clear(&[0x0F], 3, 1));
    }

    #[test]
    fn token_axis_reads_feature_columns_of_padded_tokens() {
        // 3 tokens x 2 features, g2: stream positions 0..4 are feature 0 (token 3 is padding).
        let g = grid(3, 2, 2, 4, GroupAxis::Token);
        let scales = array![[1.0f32, 1.0], [1.0, 1.0]];
        let out = decode(
            &g,
            &[0x10, 0x32, 0x54, 0x76],
            scales.view(),
            &offsets(&g, &[]),
        );
        assert_eq!(out, array![[-7.0, -3.0], [-6.0, -2.0], [-5.0, -1.0]]);
        assert!(g.is_padding(3) && g.is_padding(7) && !g.is_padding(4));
    }

    #[test]
    fn feature_axis_reads_token_rows() {
        let g = grid(3, 2, 2, 8, GroupAxis::Feature);
        let scales = array![[1.0f32], [1.0], [2.0]];
        let stream = [127, 128, 129, 130, 131, 132];
        let out = decode(&g, &stream, scales.view(), &offsets(&g, &[]));
        assert_eq!(out, array![[0.0, 1.0], [2.0, 3.0], [8.0, 10.0]]);
    }

    #[test]
    fn asymmetric_codes_subtract_their_groups_zero_point() {
        // 2-bit, 2 tokens x 2 features on the feature axis, one group per token row.
        // Zero points 1 and 2 (stream 0b10_01); codes [0, 3] and [3, 2] (stream 0b10_11_11_00).
        let g = Grid {
            mode: Mode::Asymmetric,
            ..grid(2, 2, 2, 2, GroupAxis::Feature)
        };
        let scales = array![[0.5f32], [1.0]];
        let out = decode(&g, &[0b1011_1100], scales.view(), &offsets(&g, &[0b10_01]));
        assert_eq!(out, array![[-0.5, 1.0], [1.0, 0.0]]);
    }
}
