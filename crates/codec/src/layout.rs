//! What a packed KV tensor means: the grouping axis, the bit width and the group size, and the
//! geometry they imply for an N x D (tokens x features) matrix.
//!
//! Grouped view:
//! - `Axis::Token` (used for K): the D x N transpose. Row r is feature column r; each row is cut
//!   into groups of `group_size` consecutive tokens.
//! - `Axis::Feature` (used for V): the N x D matrix itself. Row r is token r; each row is cut into
//!   groups of `group_size` consecutive features.
//!
//! Each row is zero-padded to `groups_per_row * group_size` elements, so a partial last group
//! quantizes padding zeros; decoding crops them away. Scales have shape [rows, groups_per_row].

use std::fmt;
use std::str::FromStr;

use crate::error::{CodecError, Result};

/// The axis along which consecutive elements share one scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Axis {
    /// Groups run along tokens within one feature column (K).
    Token,
    /// Groups run along features within one token row (V).
    Feature,
}

impl Axis {
    pub fn name(self) -> &'static str {
        match self {
            Axis::Token => "token",
            Axis::Feature => "feature",
        }
    }
}

impl fmt::Display for Axis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Axis {
    type Err = CodecError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "token" => Ok(Axis::Token),
            "feature" => Ok(Axis::Feature),
            other => Err(CodecError::UnknownAxis(other.to_string())),
        }
    }
}

/// A supported code width. Symmetric codes lie in -qmax..=qmax and are stored as code + qmax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bits(u32);

impl Bits {
    pub const FOUR: Bits = Bits(4);
    pub const EIGHT: Bits = Bits(8);

    pub fn new(bits: u32) -> Result<Self> {
        match bits {
            4 | 8 => Ok(Bits(bits)),
            other => Err(CodecError::UnsupportedBits(other)),
        }
    }

    pub fn get(self) -> u32 {
        self.0
    }

    /// Largest code magnitude: 2^(bits-1) - 1 (7 for 4-bit, 127 for 8-bit).
    pub fn qmax(self) -> u8 {
        ((1u32 << (self.0 - 1)) - 1) as u8
    }

    /// Largest stored (offset) code: 2 * qmax (14 for 4-bit, 254 for 8-bit).
    pub fn max_stored(self) -> u8 {
        2 * self.qmax()
    }

    /// Bytes needed for `count` codes in the stream.
    pub fn stream_bytes(self, count: usize) -> usize {
        match self.0 {
            4 => count.div_ceil(2),
            _ => count,
        }
    }
}

/// The full description of a packed tensor's format, apart from its logical shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    pub axis: Axis,
    pub bits: Bits,
    pub group_size: usize,
}

impl Layout {
    pub fn new(axis: Axis, bits: u32, group_size: usize) -> Result<Self> {
        if group_size == 0 {
            return Err(CodecError::ZeroGroupSize);
        }
        Ok(Layout {
            axis,
            bits: Bits::new(bits)?,
            group_size,
        })
    }

    /// The grouped view of an N x D matrix under this layout.
    pub fn geometry(&self, tokens: usize, features: usize) -> Geometry {
        let (rows, row_len) = match self.axis {
            Axis::Token => (features, tokens),
            Axis::Feature => (tokens, features),
        };
        let groups_per_row = row_len.div_ceil(self.group_size);
        Geometry {
            rows,
            row_len,
            groups_per_row,
            padded_row_len: groups_per_row * self.group_size,
        }
    }
}

/// Sizes of the grouped view: `rows` rows of `row_len` logical elements, padded to
/// `padded_row_len` and cut into `groups_per_row` groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub rows: usize,
    pub row_len: usize,
    pub groups_per_row: usize,
    pub padded_row_len: usize,
}

impl Geometry {
    /// Number of codes in the stream, padding included.
    pub fn code_count(&self) -> usize {
        self.rows * self.padded_row_len
    }

    pub fn scale_count(&self) -> usize {
        self.rows * self.groups_per_row
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_axis_groups_run_down_feature_columns() {
        let layout = Layout::new(Axis::Token, 4, 8).unwrap();
        let g = layout.geometry(35, 13);
        assert_eq!(
            (g.rows, g.row_len, g.groups_per_row, g.padded_row_len),
            (13, 35, 5, 40)
        );
    }

    #[test]
    fn feature_axis_groups_run_along_token_rows() {
        let layout = Layout::new(Axis::Feature, 8, 32).unwrap();
        let g = layout.geometry(35, 13);
        assert_eq!(
            (g.rows, g.row_len, g.groups_per_row, g.padded_row_len),
            (35, 13, 1, 32)
        );
    }

    #[test]
    fn rejects_zero_group_and_odd_widths() {
        assert_eq!(
            Layout::new(Axis::Token, 4, 0),
            Err(CodecError::ZeroGroupSize)
        );
        assert_eq!(
            Layout::new(Axis::Token, 3, 8),
            Err(CodecError::UnsupportedBits(3))
        );
        assert_eq!(
            "channel".parse::<Axis>(),
            Err(CodecError::UnknownAxis("channel".into()))
        );
    }

    #[test]
    fn qmax_and_stored_range() {
        assert_eq!((Bits::FOUR.qmax(), Bits::FOUR.max_stored()), (7, 14));
        assert_eq!((Bits::EIGHT.qmax(), Bits::EIGHT.max_stored()), (127, 254));
    }
}
