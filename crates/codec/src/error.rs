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

    #[error("unsupported bit width {bits}: {supported}")]
    UnsupportedBits { bits: u32, supported: &'static str },

    #[error("code {code} at position {index} does not fit in {bits} bits")]
    CodeTooWide { index: usize, code: u8, bits: u32 },

    #[error(
        "a stream of {got} {unit} cannot hold {len} codes of {bits} bits: they need exactly {expected} {unit}"
    )]
    StreamSize {
        len: usize,
        bits: u32,
        got: usize,
        expected: usize,
        unit: &'static str,
    },

    #[error(
        "group {group} of row {row} spans {low} to {high}, a range too wide for a float32 scale at {bits} bits"
    )]
    RangeOverflow {
        row: usize,
        group: usize,
        low: f32,
        high: f32,
        bits: u32,
    },

    #[error("unknown axis {0:?}: expected \"token\" or \"feature\"")]
    UnknownAxis(String),

    #[error("unknown {what} {got:?}: expected one of {expected}")]
    UnknownChoice {
        what: &'static str,
        got: String,
        expected: &'static str,
    },

    #[error("empty matrix shape {rows} x {cols}: effective bits need at least one element")]
    EmptyShape { rows: usize, cols: usize },

    #[error(
        "{quantity} of a {rows} x {cols} matrix does not fit in {} bits; refusing to print a \
         wrapped number",
        usize::BITS
    )]
    SizeOverflow {
        quantity: &'static str,
        rows: usize,
        cols: usize,
    },

    #[error("malformed packed tensor: {0}")]
    Malformed(String),
}

pub type Result<T> = std::result::Result<T, CodecError>;
