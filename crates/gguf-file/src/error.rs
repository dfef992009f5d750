//! The error type of GGUF reading: every way a file can fail to parse, or a lookup fails.

use std::path::PathBuf;

use crate::tensor::TensorType;
use crate::{MAX_ARRAY_DEPTH, MAX_DIMS};

/// What went wrong reading a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The first four bytes are not "GGUF".
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The first four bytes (fewer if the file is shorter).
        found: Vec<u8>,
    },
    /// A version other than 2 or 3.
    #[error("unsupported GGUF version {version} (this reader accepts 2 and 3, little-endian){}",
        if version & 0xFFFF == 0 { "; the file may be big-endian" } else { "" })]
    UnsupportedVersion {
        /// The version field as read little-endian.
        version: u32,
    },
    /// The file ends before a field it declares.
    #[error(
        "truncated file: {what} needs {needed} bytes at offset {offset}, only {available} remain"
    )]
    Truncated {
        /// Which field.
        what: String,
        /// Where it starts.
        offset: usize,
        /// Bytes it needs.
        needed: u64,
        /// Bytes left in the file from `offset`.
        available: usize,
    },
    /// A count that cannot fit in the bytes left, even at the smallest size per element.
    #[error(
        "{what} claims {count} entries of at least {min_size} bytes each, but only {available} bytes remain"
    )]
    CountTooLarge {
        /// Which count.
        what: String,
        /// The count read.
        count: u64,
        /// The smallest encoding of one entry.
        min_size: u64,
        /// Bytes left in the file.
        available: usize,
    },
    /// A key, string value or tensor name is not UTF-8.
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 {
        /// Which string.
        what: String,
    },
    /// A metadata value type id outside 0..=12.
    #[error("{what} has unknown value type {type_id}")]
    UnknownValueType {
        /// Which value.
        what: String,
        /// The id read.
        type_id: u32,
    },
    /// Arrays nested deeper than [`MAX_ARRAY_DEPTH`].
    #[error("{what} nests arrays deeper than {MAX_ARRAY_DEPTH} levels")]
    NestingTooDeep {
        /// Which value.
        what: String,
    },
    /// The same metadata key twice.
    #[error("metadata key {0:?} appears more than once")]
    DuplicateKey(String),
    /// The same tensor name twice.
    #[error("tensor name {0:?} appears more than once")]
    DuplicateTensor(String),
    /// `general.alignment` is not a nonzero power of two.
    #[error("general.alignment is {0}, not a nonzero power of two")]
    BadAlignment(u32),
    /// A tensor with 0 or more than [`MAX_DIMS`] dimensions.
    #[error("tensor {tensor:?} has {n_dims} dimensions (1..={MAX_DIMS} allowed)")]
    BadDimCount {
        /// The tensor's name.
        tensor: String,
        /// The count read.
        n_dims: u32,
    },
    /// The product of a tensor's dimensions, or its byte size or end, overflows.
    #[error("tensor {tensor:?}: size of dims {dims:?} overflows")]
    SizeOverflow {
        /// The tensor's name.
        tensor: String,
        /// Its dimensions.
        dims: Vec<u64>,
    },
    /// A row length (ne0) that is not a whole number of blocks.
    #[error(
        "tensor {tensor:?}: row length {ne0} is not a multiple of {ty}'s block size {block_size}"
    )]
    RowNotBlockMultiple {
        /// The tensor's name.
        tensor: String,
        /// Its type.
        ty: TensorType,
        /// Its row length.
        ne0: u64,
        /// The type's block size.
        block_size: u64,
    },
    /// A tensor offset that is not a multiple of the alignment.
    #[error("tensor {tensor:?}: offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedOffset {
        /// The tensor's name.
        tensor: String,
        /// Its offset within the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u32,
    },
    /// A tensor whose bytes run past the end of the file.
    #[error(
        "tensor {tensor:?}: bytes [{start}, {end}) lie beyond the end of the file ({file_len} bytes)"
    )]
    TensorOutOfRange {
        /// The tensor's name.
        tensor: String,
        /// Absolute start in the file.
        start: u64,
        /// Absolute end in the file.
        end: u64,
        /// The file's length.
        file_len: usize,
    },
    /// The byte size of a tensor whose type this crate does not know was asked for.
    #[error(
        "tensor {tensor:?} has ggml type {type_id}, whose block layout this reader does not know"
    )]
    UnknownTensorType {
        /// The tensor's name.
        tensor: String,
        /// The ggml type id.
        type_id: u32,
    },
    /// No tensor of that name.
    #[error("no tensor named {0:?}")]
    MissingTensor(String),
    /// No metadata key of that name.
    #[error("metadata key {0:?} is missing")]
    MissingKey(String),
    /// A metadata key holding another type than asked for.
    #[error("metadata key {key:?} holds {found}, expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// What the getter wanted.
        expected: &'static str,
        /// What the file holds.
        found: String,
    },
    /// Reading the file failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file does not fit in memory's address space.
    #[error("{path} is {len} bytes, more than this platform can address")]
    FileTooLarge {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
}
