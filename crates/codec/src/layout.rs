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
//! quantizes padding zeros; decoding crops them away. Scales (and, in asymmetric mode, zero
//! points) have shape [rows, groups_per_row].

use std::fmt;
use std::str::FromStr;

pub use crate::bits::Bits;
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

/// How a group's values become unsigned codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// One scale per group, codes -qmax..=qmax stored as code + qmax: see [`crate::symmetric`].
    Symmetric,
    /// One scale and one integer zero point per group, codes 0..=2^b - 1: see
    /// [`crate::asymmetric`].
    Asymmetric,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Symmetric => "symmetric",
            Mode::Asymmetric => "asymmetric",
        }
    }

    /// Checks that `bits` suits the mode: symmetric codes need qmax = 2^(b-1) - 1 >= 1, so
    /// 2 to 8 bits; asymmetric codes use every width a stream holds, 1 to 8 bits.
    fn bits(self, bits: u32) -> Result<Bits> {
        match (self, bits) {
            (Mode::Symmetric, 2..=8) | (Mode::Asymmetric, 1..=8) => Bits::new(bits),
            (Mode::Symmetric, _) => Err(CodecError::UnsupportedBits {
                bits,
                supported: "symmetric codes take 2 to 8 bits",
            }),
            (Mode::Asymmetric, _) => Err(CodecError::UnsupportedBits {
                bits,
                supported: "asymmetric codes take 1 to 8 bits",
            }),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The full description of a packed tensor's format, apart from its logical shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    pub axis: Axis,
    pub mode: Mode,
    pub bits: Bits,
    pub group_size: usize,
}

impl Layout {
    /// A symmetric layout (2 to 8 bits).
    pub fn new(axis: Axis, bits: u32, group_size: usize) -> Result<Self> {
        Layout::with_mode(axis, Mode::Symmetric, bits, group_size)
    }

    pub fn with_mode(axis: Axis, mode: Mode, bits: u32, group_size: usize) -> Result<Self> {
        if group_size == 0 {
            return Err(CodecError::ZeroGroupSize);
        }
        Ok(Layout {
            axis,
            mode,
            bits: mode.bits(bits)?,
            group_size,
        })
    }

    /// Largest stored code the encoder writes: 2 * qmax for symmetric codes (2^b - 2, so the
    /// top code 2^b - 1 is never written), 2^b - 1 for asymmetric ones.
    pub fn max_stored(&self) -> u8 {
        match self.mode {
            Mode::Symmetric => 2 * self.bits.qmax(),
            Mode::Asymmetric => self.bits.max_code(),
        }
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
    fn rejects_zero_group_and_widths_the_mode_cannot_hold() {
        assert_eq!(
            Layout::new(Axis::Token, 4, 0),
            Err(CodecError::ZeroGroupSize)
        );
        for bits in [0, 1, 9, 16] {
            let err = Layout::new(Axis::Token, bits, 8).unwrap_err().to_string();
            assert!(
                err.contains(&format!("bit width {bits}"))
                    && err.contains("symmetric codes take 2 to 8 bits"),
                "{err}"
            );
        }
        for bits in [0, 9] {
            let err = Layout::with_mode(Axis::Token, Mode::Asymmetric, bits, 8).unwrap_err();
            assert!(
                err.to_string()
                    .contains("asymmetric codes take 1 to 8 bits"),
                "{err}"
            );
        }
        assert_eq!(
            "channel".parse::<Axis>(),
            Err(CodecError::UnknownAxis("channel".into()))
        );
    }

    #[test]
    fn stored_code_range_by_mode() {
        let symmetric = |b| Layout::new(Axis::Token, b, 8).unwrap();
        let asymmetric = |b| Layout::with_mode(Axis::Token, Mode::Asymmetric, b, 8).unwrap();
        assert_eq!((Bits::FOUR.qmax(), symmetric(4).max_stored()), (7, 14));
        assert_eq!((Bits::EIGHT.qmax(), symmetric(8).max_stored()), (127, 254));
        assert_eq!(symmetric(2).max_stored(), 2);
        assert_eq!(symmetric(3).max_stored(), 6);
        assert_eq!(asymmetric(1).max_stored(), 1);
        assert_eq!(asymmetric(4).max_stored(), 15);
        assert_eq!(asymmetric(8).max_stored(), 255);
    }
}
