//! Typed errors for the codec. Every message names the problem and the value that caused it.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum CodecError {
    #[error("empty matrix: shape {rows} x {cols} has no elements")]
    EmptyMatrix { rows: usize, cols: usize },

    #[error("non-finite input: element [{row}, {col}] is {value}")]
    NonFinite { row: usize, col: usize, value: f32 },

    #[error("group size must be at least 1, got 0")]
    ZeroGroupSize,

    #[error("unsupported bit width {0}: this codec stores 4-bit or 8-bit codes")]
    UnsupportedBits(u32),

    #[error("unknown axis {0:?}: expected \"token\" or \"feature\"")]
    UnknownAxis(String),

    #[error("malformed packed tensor: {0}")]
    Malformed(String),
}

pub type Result<T> = std::result::Result<T, CodecError>;
