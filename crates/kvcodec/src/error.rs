//! Typed errors of the KV codec. Every message names the problem and the value that caused it;
//! a wrapped stream error is a source, not repeated in the message.

use bitpack::BitsError;
use thiserror::Error;

use crate::kernel::Kernel;
use crate::mode::Mode;

/// Why a matrix cannot be encoded, or stored parts cannot form a packed tensor.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum KvError {
    /// A matrix with no element.
    #[error("empty matrix: shape {rows} x {cols} has no elements")]
    EmptyMatrix {
        /// Rows (tokens).
        rows: usize,
        /// Columns (features).
        cols: usize,
    },
    /// A dimension the two i32 shape values cannot hold, or a non-positive stored one.
    #[error("shape [{rows}, {cols}] is not two positive dimensions that fit an i32")]
    Shape {
        /// Rows as given.
        rows: i64,
        /// Columns as given.
        cols: i64,
    },
    /// NaN or an infinity in the input.
    #[error("non-finite input: element [{row}, {col}] is {value}")]
    NonFinite {
        /// Its row.
        row: usize,
        /// Its column.
        col: usize,
        /// Its value.
        value: f32,
    },
    /// A setting label that is not of the form `g<GROUP>_b<BITS>[_asym][_swap]`, or names a
    /// setting the codec refuses.
    #[error(
        "setting {0:?} is not of the form g<GROUP>_b<BITS>[_asym][_swap] (e.g. g32_b4, \
         g32_b4_asym, g32_b4_swap; symmetric widths 2-8, asymmetric 1-8, group size 1 to \
         2^27)"
    )]
    SettingLabel(String),
    /// A group size of 0.
    #[error("group size must be at least 1, got 0")]
    ZeroGroupSize,
    /// A setting's group size above [`crate::setting::MAX_GROUP_SIZE`].
    #[error(
        "group size {group_size} is above {max}, the largest a setting takes (one group alone \
         would be a larger grouped view than any study holds)"
    )]
    GroupSizeTooLarge {
        /// The group size asked for.
        group_size: usize,
        /// [`crate::setting::MAX_GROUP_SIZE`].
        max: usize,
    },
    /// A width the mode cannot store.
    #[error("unsupported bit width {bits}: {mode} codes take {} to 8 bits", if *mode == Mode::Symmetric { 2 } else { 1 })]
    UnsupportedBits {
        /// The width asked for.
        bits: u32,
        /// The mode.
        mode: Mode,
    },
    /// A group whose range overflows the f32 scale.
    #[error(
        "group {group} of row {row} spans {low} to {high}, a range too wide for a float32 scale at {bits} bits"
    )]
    RangeOverflow {
        /// Row of the grouped view.
        row: usize,
        /// Group within the row.
        group: usize,
        /// Smallest value (widened to 0).
        low: f32,
        /// Largest value (widened to 0).
        high: f32,
        /// The width.
        bits: u32,
    },
    /// A code stream whose byte count is not what the shape and layout need.
    #[error("{got} code bytes, but the shape and layout need {expected}")]
    CodeBytes {
        /// Bytes present.
        got: usize,
        /// Bytes needed.
        expected: usize,
    },
    /// Scales of another shape than [rows, groups per row].
    #[error("scales have shape {got:?}, expected {expected:?} (rows x groups per row)")]
    ScaleShape {
        /// Their shape.
        got: (usize, usize),
        /// The layout's.
        expected: (usize, usize),
    },
    /// A scale that is not finite and positive.
    #[error("scale [{row}, {group}] is {value}; scales must be finite and positive")]
    Scale {
        /// Row.
        row: usize,
        /// Group.
        group: usize,
        /// The scale.
        value: f32,
    },
    /// A zero-point stream of another size than the mode needs (none when symmetric).
    #[error("{got} zero point bytes, but a {mode} layout of these groups needs {expected}")]
    ZeroPointBytes {
        /// Bytes present.
        got: usize,
        /// Bytes needed.
        expected: usize,
        /// The mode.
        mode: Mode,
    },
    /// A stored code above the layout's largest.
    #[error("code {code} at stream position {position} exceeds the layout's maximum {max}")]
    CodeRange {
        /// The code.
        code: u8,
        /// Its position.
        position: usize,
        /// The largest code the layout writes.
        max: u8,
    },
    /// An output array of another shape than the decoded rows need.
    #[error("output has shape {got:?}, but the decoded rows need {expected:?}")]
    OutputShape {
        /// The output's shape.
        got: (usize, usize),
        /// The shape needed: (tokens, features).
        expected: (usize, usize),
    },
    /// A token range that is reversed or runs past the tensor's tokens.
    #[error("token range {start}..{end} is not within the tensor's {tokens} tokens")]
    TokenRange {
        /// First token asked for.
        start: usize,
        /// One past the last token asked for.
        end: usize,
        /// Tokens the tensor holds.
        tokens: usize,
    },
    /// A kernel this CPU cannot run.
    #[error("the {kernel} kernel needs CPU features this machine does not have")]
    KernelUnavailable {
        /// The kernel asked for.
        kernel: Kernel,
    },
    /// The streams underneath refused.
    #[error("the code stream")]
    Stream(#[from] BitsError),
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, KvError>;
