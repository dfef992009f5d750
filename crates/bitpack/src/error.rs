//! Typed errors of the streams and planes. Every message names the problem and the value that
//! caused it.

use thiserror::Error;

/// Why a stream, a plane set or a width is refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BitsError {
    /// A width outside 1 to 8 bits.
    #[error("unsupported bit width {bits}: bit streams hold 1- to 8-bit codes")]
    UnsupportedBits {
        /// The width asked for.
        bits: u32,
    },
    /// A code that does not fit the width; nothing is masked silently.
    #[error("code {code} at position {index} does not fit in {bits} bits")]
    CodeTooWide {
        /// Position of the code.
        index: usize,
        /// The code.
        code: u8,
        /// The width.
        bits: u32,
    },
    /// A container whose size is not exactly what the recorded length needs.
    #[error(
        "a stream of {got} {unit} cannot hold {len} codes of {bits} bits: they need exactly {expected} {unit}"
    )]
    StreamSize {
        /// Codes recorded.
        len: usize,
        /// Their width.
        bits: u32,
        /// Container units present.
        got: usize,
        /// Container units the codes need.
        expected: usize,
        /// `bytes` or `words`.
        unit: &'static str,
    },
    /// Planes read back that are not the split of their width.
    #[error("{got} planes, but {bits}-bit codes split into {expected}")]
    PlaneCount {
        /// Planes present.
        got: usize,
        /// The codes' width.
        bits: u32,
        /// Planes the width splits into.
        expected: usize,
    },
    /// An axis name other than `token` or `feature`.
    #[error("unknown axis {found:?}: expected \"token\" or \"feature\"")]
    UnknownAxis {
        /// The name given.
        found: String,
    },
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, BitsError>;
