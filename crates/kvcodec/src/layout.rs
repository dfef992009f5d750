//! What a packed KV tensor means: the grouping axis, the bit width and the group size, and the
//! geometry they imply for an N x D (tokens x features) matrix.
//!
//! Grouped view:
//! - `GroupAxis::Token` (used for K): the D x N transpose. Row r is feature column r; each row is cut
//!   into groups of `group_size` consecutive tokens.
//! - `GroupAxis::Feature` (used for V): the N x D matrix itself. Row r is token r; each row is cut into
//!   groups of `group_size` consecutive features.
//!
//! Each row is zero-padded to `groups_per_row * group_size` elements, so a partial last group
//! quantizes padding zeros; decoding crops them away. Scales (and, in asymmetric mode, zero
//! points) have shape [rows, groups_per_row].

pub use bitpack::{Bits, GroupAxis};

use crate::error::{KvError, Result};
pub use crate::mode::Mode;

/// The full description of a packed tensor's format, apart from its logical shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    /// The axis groups run along.
    pub axis: GroupAxis,
    /// How a group's values become codes.
    pub mode: Mode,
    /// Code width.
    pub bits: Bits,
    /// Consecutive elements per group.
    pub group_size: usize,
}

impl Layout {
    /// A symmetric layout (2 to 8 bits).
    pub fn new(axis: GroupAxis, bits: u32, group_size: usize) -> Result<Self> {
        Layout::with_mode(axis, Mode::Symmetric, bits, group_size)
    }

    /// A layout in either mode; refuses a group size of 0 and widths the mode cannot store.
    pub fn with_mode(axis: GroupAxis, mode: Mode, bits: u32, group_size: usize) -> Result<Self> {
        if group_size == 0 {
            return Err(KvError::ZeroGroupSize);
        }
        Ok(Layout {
            axis,
            mode,
            bits: mode_bits(mode, bits)?,
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
            GroupAxis::Token => (features, tokens),
            GroupAxis::Feature => (tokens, features),
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
    /// Rows of the grouped view (features for K, tokens for V).
    pub rows: usize,
    /// Logical elements per row.
    pub row_len: usize,
    /// Groups per row, the last one possibly padded.
    pub groups_per_row: usize,
    /// Elements per row once padded to whole groups.
    pub padded_row_len: usize,
}

impl Geometry {
    /// Number of codes in the stream, padding included.
    pub fn code_count(&self) -> usize {
        self.rows * self.padded_row_len
    }

    /// Number of groups: one scale (and zero point) each.
    pub fn scale_count(&self) -> usize {
        self.rows * self.groups_per_row
    }
}

/// Checks that `bits` suits the mode: symmetric codes need qmax = 2^(b-1) - 1 >= 1, so 2 to 8
/// bits; asymmetric codes use every width a stream holds, 1 to 8 bits.
fn mode_bits(mode: Mode, bits: u32) -> Result<Bits> {
    match (mode, bits) {
        (Mode::Symmetric, 2..=8) | (Mode::Asymmetric, 1..=8) => Ok(Bits::new(bits)?),
        (mode, _) => Err(KvError::UnsupportedBits { bits, mode }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_axis_groups_run_down_feature_columns() {
        let layout = Layout::new(GroupAxis::Token, 4, 8).unwrap();
        let g = layout.geometry(35, 13);
        assert_eq!(
            (g.rows, g.row_len, g.groups_per_row, g.padded_row_len),
            (13, 35, 5, 40)
        );
    }

    #[test]
    fn feature_axis_groups_run_along_token_rows() {
        let layout = Layout::new(GroupAxis::Feature, 8, 32).unwrap();
        let g = layout.geometry(35, 13);
        assert_eq!(
            (g.rows, g.row_len, g.groups_per_row, g.padded_row_len),
            (35, 13, 1, 32)
        );
    }

    #[test]
    fn rejects_zero_group_and_widths_the_mode_cannot_hold() {
        assert_eq!(
            Layout::new(GroupAxis::Token, 4, 0),
            Err(KvError::ZeroGroupSize)
        );
        for bits in [0, 1, 9, 16] {
            assert_eq!(
                Layout::new(GroupAxis::Token, bits, 8),
                Err(KvError::UnsupportedBits {
                    bits,
                    mode: Mode::Symmetric
                })
            );
        }
        for bits in [0, 9] {
            assert_eq!(
                Layout::with_mode(GroupAxis::Token, Mode::Asymmetric, bits, 8),
                Err(KvError::UnsupportedBits {
                    bits,
                    mode: Mode::Asymmetric
                })
            );
        }
        // One display test: the message says which widths the mode takes.
        let err = Layout::new(GroupAxis::Token, 1, 8).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unsupported bit width 1: symmetric codes take 2 to 8 bits"
        );
    }

    #[test]
    fn stored_code_range_by_mode() {
        let symmetric = |b| Layout::new(GroupAxis::Token, b, 8).unwrap();
        let asymmetric = |b| Layout::with_mode(GroupAxis::Token, Mode::Asymmetric, b, 8).unwrap();
        assert_eq!((Bits::FOUR.qmax(), symmetric(4).max_stored()), (7, 14));
        assert_eq!((Bits::EIGHT.qmax(), symmetric(8).max_stored()), (127, 254));
        assert_eq!(symmetric(2).max_stored(), 2);
        assert_eq!(symmetric(3).max_stored(), 6);
        assert_eq!(asymmetric(1).max_stored(), 1);
        assert_eq!(asymmetric(4).max_stored(), 15);
        assert_eq!(asymmetric(8).max_stored(), 255);
    }
}
