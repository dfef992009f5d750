//! Reads GGUF files (versions 2 and 3, little-endian) from a byte slice, and writes version 3
//! ([`writer`]).
//!
//! Layout (all integers little-endian; facts from ggml's `gguf.cpp` and gguf-py 0.19):
//!
//! ```text
//! header   magic "GGUF" | version u32 (2 or 3) | tensor_count u64 | kv_count u64
//! kv       key: string | value_type u32 | value
//! string   len u64 | len bytes of UTF-8 (no terminator)
//! value    u8 i8 u16 i16 u32 i32 f32 (types 0..=6), bool (7, one byte, nonzero = true),
//!          string (8), array (9: elem_type u32 | count u64 | count values, arrays may nest),
//!          u64 i64 f64 (10..=12)
//! tensor   name: string | n_dims u32 (1..=4) | n_dims x u64 dims, ne0 first (ggml order)
//!          | ggml type u32 | offset u64, relative to the data section, a multiple of the alignment
//! data     starts at the end of the tensor infos rounded up to the alignment
//!          (`general.alignment`, a u32 power of two, default 32)
//! ```
//!
//! A tensor of a known type holds `n_elements / block_size * bytes_per_block` bytes; its row
//! length (ne0) must be a multiple of the block size. Tensors of types this crate does not know
//! are kept as [`TensorType::Other`] so the file still opens, but their bytes cannot be sliced.
//!
//! Every count, length and offset read from the file is checked against the bytes present
//! before anything is allocated, so a damaged or hostile file gives an [`Error`], never a panic
//! or an out-of-memory abort. Metadata keeps file order; keys and tensor names must be unique
//! (as ggml requires).
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod cursor;
mod error;
mod reader;
mod tensor;
mod value;
pub mod writer;

pub use error::Error;
pub use reader::{GgufFile, read_file};
pub use tensor::{TensorInfo, TensorType};
pub use value::{Array, Value, ValueType};

/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u32 = 32;
/// ggml's `GGML_MAX_DIMS`: a tensor has at most this many dimensions.
pub const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays accepted; deeper files are refused so recursion stays bounded.
pub const MAX_ARRAY_DEPTH: usize = 64;
