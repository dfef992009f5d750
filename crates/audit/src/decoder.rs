//! The audit's own decoder, written from the evidence format's spec and sharing no code with the
//! codec.
//!
//! - The stream holds one stored code per element of the grouped view, padding included, in
//!   row-major order. 4-bit: stream position i lives in byte i / 2, in the low nibble when i is
//!   even and the high nibble when i is odd. 8-bit: one byte per position.
//! - K (`token` axis): element (t, f) is row f, column t of a D x N_padded view; its scale is
//!   scales[f, t / g]. V (`feature` axis): element (t, f) is row t, column f of an N x D_padded
//!   view; its scale is scales[t, f / g].
//! - Stored codes run 0..=2*qmax with qmax = 2^(bits-1) - 1; value = (stored - qmax) * scale.

use ndarray::{Array2, ArrayView2};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    Token,
    Feature,
}

impl Axis {
    pub fn parse(name: &str) -> Option<Axis> {
        match name {
            "token" => Some(Axis::Token),
            "feature" => Some(Axis::Feature),
            _ => None,
        }
    }
}

/// Where one packed tensor's elements live, from its logical shape and format.
#[derive(Debug, Clone, Copy)]
pub struct Grid {
    pub tokens: usize,
    pub features: usize,
    pub group_size: usize,
    pub bits: u32,
    pub axis: Axis,
}

impl Grid {
    /// (rows, padded row length, groups per row) of the grouped view.
    pub fn view(&self) -> (usize, usize, usize) {
        let (rows, len) = match self.axis {
            Axis::Token => (self.features, self.tokens),
            Axis::Feature => (self.tokens, self.features),
        };
        let groups = len / self.group_size + usize::from(len % self.group_size != 0);
        (rows, groups * self.group_size, groups)
    }

    /// Codes in the stream, padding included.
    pub fn positions(&self) -> usize {
        let (rows, padded, _) = self.view();
        rows * padded
    }

    pub fn stream_bytes(&self) -> usize {
        let n = self.positions();
        if self.bits == 4 { n / 2 + n % 2 } else { n }
    }

    pub fn qmax(&self) -> u8 {
        (1u8 << (self.bits - 1)) - 1
    }

    /// Stream position and scale index of logical element (t, f).
    pub fn locate(&self, t: usize, f: usize) -> (usize, [usize; 2]) {
        let (_, padded, _) = self.view();
        match self.axis {
            Axis::Token => (f * padded + t, [f, t / self.group_size]),
            Axis::Feature => (t * padded + f, [t, f / self.group_size]),
        }
    }

    /// Whether stream position p is padding (beyond the logical row length).
    pub fn is_padding(&self, p: usize) -> bool {
        let (_, padded, _) = self.view();
        let len = match self.axis {
            Axis::Token => self.tokens,
            Axis::Feature => self.features,
        };
        p % padded >= len
    }
}

/// Stored code at stream position `p`.
pub fn code_at(stream: &[u8], bits: u32, p: usize) -> u8 {
    if bits == 4 {
        (stream[p >> 1] >> ((p & 1) << 2)) & 0x0F
    } else {
        stream[p]
    }
}

/// The logical N x D matrix a stream and its scales encode.
pub fn decode(grid: &Grid, stream: &[u8], scales: ArrayView2<f32>) -> Array2<f64> {
    let qmax = i32::from(grid.qmax());
    Array2::from_shape_fn((grid.tokens, grid.features), |(t, f)| {
        let (p, s) = grid.locate(t, f);
        let signed = i32::from(code_at(stream, grid.bits, p)) - qmax;
        f64::from(signed) * f64::from(scales[s])
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn byte_d2_holds_codes_2_then_13() {
        assert_eq!((code_at(&[0xD2], 4, 0), code_at(&[0xD2], 4, 1)), (2, 13));
    }

    #[test]
    fn token_axis_reads_feature_columns_of_padded_tokens() {
        // 3 tokens x 2 features, g2: stream positions 0..4 are feature 0 (token 3 is padding).
        let grid = Grid {
            tokens: 3,
            features: 2,
            group_size: 2,
            bits: 4,
            axis: Axis::Token,
        };
        let out = decode(
            &grid,
            &[0x10, 0x32, 0x54, 0x76],
            array![[1.0f32, 1.0], [1.0, 1.0]].view(),
        );
        assert_eq!(out, array![[-7.0, -3.0], [-6.0, -2.0], [-5.0, -1.0]]);
        assert!(grid.is_padding(3) && grid.is_padding(7) && !grid.is_padding(4));
    }

    #[test]
    fn feature_axis_reads_token_rows() {
        let grid = Grid {
            tokens: 3,
            features: 2,
            group_size: 2,
            bits: 8,
            axis: Axis::Feature,
        };
        let out = decode(
            &grid,
            &[127, 128, 129, 130, 131, 132],
            array![[1.0f32], [1.0], [2.0]].view(),
        );
        assert_eq!(out, array![[0.0, 1.0], [2.0, 3.0], [8.0, 10.0]]);
    }
}
