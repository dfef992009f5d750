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

pub mod writer;

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u32 = 32;
/// ggml's `GGML_MAX_DIMS`: a tensor has at most this many dimensions.
pub const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays accepted; deeper files are refused so recursion stays bounded.
pub const MAX_ARRAY_DEPTH: usize = 64;

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

/// Metadata value type ids, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// 0
    U8,
    /// 1
    I8,
    /// 2
    U16,
    /// 3
    I16,
    /// 4
    U32,
    /// 5
    I32,
    /// 6
    F32,
    /// 7
    Bool,
    /// 8
    String,
    /// 9
    Array,
    /// 10
    U64,
    /// 11
    I64,
    /// 12
    F64,
}

impl ValueType {
    /// The type for a stored id, if it is one.
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The stored id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The fewest bytes one value of this type takes: its whole size for scalars, the length
    /// prefix for a string, the element type and count for an array.
    fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// An array's elements, kept in their stored type so large arrays stay compact.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // one variant per element type, named as in ValueType
pub enum Array<'a> {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<&'a str>),
    /// Nested arrays; each may hold its own element type.
    Array(Vec<Array<'a>>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Array<'_> {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One metadata value. Strings borrow from the file's bytes.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // one variant per value type, named as in ValueType
pub enum Value<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(&'a str),
    Array(Array<'a>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value<'_> {
    /// The stored type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// A short description for error messages, e.g. `u32` or `array of string`.
    fn describe(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {:?}", a.elem_type()),
            v => format!("{:?}", v.value_type()),
        }
    }
}

/// A tensor's ggml type. Types whose block layout is known here can be sliced; any other id
/// is kept as `Other` so the rest of the file can still be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)] // ggml's names
pub enum TensorType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    I8,
    I16,
    I32,
    I64,
    F64,
    BF16,
    /// A type id this reader has no layout for.
    Other(u32),
}

impl TensorType {
    /// The type for a ggml type id (never fails: unknown ids become `Other`).
    pub fn from_id(id: u32) -> Self {
        use TensorType::*;
        match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2K,
            11 => Q3K,
            12 => Q4K,
            13 => Q5K,
            14 => Q6K,
            15 => Q8K,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            30 => BF16,
            other => Other(other),
        }
    }

    /// The ggml type id.
    pub fn id(self) -> u32 {
        use TensorType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2K => 10,
            Q3K => 11,
            Q4K => 12,
            Q5K => 13,
            Q6K => 14,
            Q8K => 15,
            I8 => 24,
            I16 => 25,
            I32 => 26,
            I64 => 27,
            F64 => 28,
            BF16 => 30,
            Other(id) => id,
        }
    }

    /// (elements per block, bytes per block), from gguf-py's `GGML_QUANT_SIZES`; `None` for
    /// `Other`.
    pub fn block_layout(self) -> Option<(u64, u64)> {
        use TensorType::*;
        const QK_K: u64 = 256;
        Some(match self {
            F32 | I32 => (1, 4),
            F16 | BF16 | I16 => (1, 2),
            I8 => (1, 1),
            I64 | F64 => (1, 8),
            Q4_0 => (32, 2 + 16),
            Q4_1 => (32, 2 + 2 + 16),
            Q5_0 => (32, 2 + 4 + 16),
            Q5_1 => (32, 2 + 2 + 4 + 16),
            Q8_0 => (32, 2 + 32),
            Q8_1 => (32, 4 + 4 + 32),
            Q2K => (QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
            Q3K => (QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
            Q4K => (QK_K, 2 + 2 + QK_K / 2 + 12),
            Q5K => (QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
            Q6K => (QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
            Q8K => (QK_K, 4 + QK_K + QK_K / 8),
            Other(_) => return None,
        })
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use TensorType::*;
        let name = match self {
            Q2K => "Q2_K",
            Q3K => "Q3_K",
            Q4K => "Q4_K",
            Q5K => "Q5_K",
            Q6K => "Q6_K",
            Q8K => "Q8_K",
            Other(id) => return write!(f, "ggml type {id}"),
            other => return write!(f, "{other:?}"),
        };
        f.write_str(name)
    }
}

/// One tensor's description from the file header.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo<'a> {
    /// Its name, e.g. `blk.0.attn_q.weight`.
    pub name: &'a str,
    /// Dimensions in ggml order: `dims[0]` (ne0) is the row length, the fastest-varying axis.
    pub dims: Vec<u64>,
    /// Its ggml type.
    pub ty: TensorType,
    /// Offset of its first byte from the start of the data section.
    pub offset: u64,
}

impl TensorInfo<'_> {
    /// The number of elements: the product of the dims (saturating, so an info built by hand
    /// cannot panic; [`GgufFile::parse`] refuses files where it would overflow).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Its size in bytes (saturating like [`Self::n_elements`]), or `None` for a type whose
    /// layout is unknown.
    pub fn n_bytes(&self) -> Option<u64> {
        let (block, size) = self.ty.block_layout()?;
        Some((self.n_elements() / block).saturating_mul(size))
    }
}

/// A parsed GGUF file borrowing its bytes.
#[derive(Debug, Clone)]
pub struct GgufFile<'a> {
    bytes: &'a [u8],
    version: u32,
    metadata: Vec<(&'a str, Value<'a>)>,
    tensors: Vec<TensorInfo<'a>>,
    alignment: u32,
    data_start: u64,
}

/// Reads a whole file into memory, checking first that its length is addressable. Parse the
/// result with [`GgufFile::parse`].
pub fn read_file(path: impl AsRef<Path>) -> Result<Vec<u8>, Error> {
    let path = path.as_ref();
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if usize::try_from(len).is_err() {
        return Err(Error::FileTooLarge {
            path: path.to_path_buf(),
            len,
        });
    }
    std::fs::read(path).map_err(io)
}

/// A position in the file; every read is checked against the bytes left.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], Error> {
        let available = self.remaining();
        match usize::try_from(n) {
            Ok(n) if n <= available => {
                let out = &self.bytes[self.pos..self.pos + n];
                self.pos += n;
                Ok(out)
            }
            _ => Err(Error::Truncated {
                what: what(),
                offset: self.pos,
                needed: n,
                available,
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: impl FnOnce() -> String) -> Result<[u8; N], Error> {
        let b = self.take(N as u64, what)?;
        Ok(b.try_into().expect("take returned N bytes"))
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, Error> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, Error> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Refuses a count whose smallest encoding exceeds the bytes left, before anything sized
    /// by it is allocated.
    fn check_count(
        &self,
        count: u64,
        min_size: u64,
        what: impl Fn() -> String,
    ) -> Result<usize, Error> {
        let available = self.remaining();
        match count.checked_mul(min_size) {
            Some(total) if total <= available as u64 => Ok(count as usize),
            _ => Err(Error::CountTooLarge {
                what: what(),
                count,
                min_size,
                available,
            }),
        }
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<&'a str, Error> {
        let len = self.u64(|| format!("length of {}", what()))?;
        let raw = self.take(len, what)?;
        std::str::from_utf8(raw).map_err(|_| Error::InvalidUtf8 { what: what() })
    }

    fn value(
        &mut self,
        ty: ValueType,
        what: &dyn Fn() -> String,
        depth: usize,
    ) -> Result<Value<'a>, Error> {
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array(what)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            // ggml reads a bool as a byte and takes any nonzero value as true.
            ValueType::Bool => Value::Bool(self.array::<1>(what)?[0] != 0),
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => Value::Array(self.array_value(what, depth + 1)?),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
        })
    }

    fn array_value(&mut self, what: &dyn Fn() -> String, depth: usize) -> Result<Array<'a>, Error> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(Error::NestingTooDeep { what: what() });
        }
        let type_id = self.u32(|| format!("element type of {}", what()))?;
        let elem = ValueType::from_id(type_id).ok_or_else(|| Error::UnknownValueType {
            what: format!("element of {}", what()),
            type_id,
        })?;
        let count = self.u64(|| format!("element count of {}", what()))?;
        let n = self.check_count(count, elem.min_size(), || format!("array {}", what()))?;
        macro_rules! scalars {
            ($variant:ident, $t:ty) => {{
                let raw = self.take(n as u64 * elem.min_size(), what)?;
                Array::$variant(
                    raw.chunks_exact(size_of::<$t>())
                        .map(|c| {
                            <$t>::from_le_bytes(c.try_into().expect("chunk of the type's size"))
                        })
                        .collect(),
                )
            }};
        }
        Ok(match elem {
            ValueType::U8 => scalars!(U8, u8),
            ValueType::I8 => scalars!(I8, i8),
            ValueType::U16 => scalars!(U16, u16),
            ValueType::I16 => scalars!(I16, i16),
            ValueType::U32 => scalars!(U32, u32),
            ValueType::I32 => scalars!(I32, i32),
            ValueType::F32 => scalars!(F32, f32),
            ValueType::U64 => scalars!(U64, u64),
            ValueType::I64 => scalars!(I64, i64),
            ValueType::F64 => scalars!(F64, f64),
            ValueType::Bool => {
                Array::Bool(self.take(n as u64, what)?.iter().map(|&b| b != 0).collect())
            }
            ValueType::String => {
                let mut out = Vec::with_capacity(n);
                for i in 0..n {
                    out.push(self.string(&|| format!("element {i} of {}", what()))?);
                }
                Array::String(out)
            }
            ValueType::Array => {
                let mut out = Vec::with_capacity(n);
                for i in 0..n {
                    out.push(
                        self.array_value(&|| format!("element {i} of {}", what()), depth + 1)?,
                    );
                }
                Array::Array(out)
            }
        })
    }
}

impl<'a> GgufFile<'a> {
    /// Parses the header, metadata and tensor infos, and checks that every tensor of a known
    /// type lies, aligned, within `bytes`.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, Error> {
        let mut c = Cursor { bytes, pos: 0 };
        if bytes.get(..4) != Some(b"GGUF".as_slice()) {
            return Err(Error::BadMagic {
                found: bytes[..bytes.len().min(4)].to_vec(),
            });
        }
        c.pos = 4;
        let version = c.u32(|| "version".into())?;
        if version != 2 && version != 3 {
            return Err(Error::UnsupportedVersion { version });
        }
        let tensor_count = c.u64(|| "tensor count".into())?;
        let kv_count = c.u64(|| "metadata count".into())?;

        // Smallest kv: empty key (8) + type (4) + one byte.
        let n_kv = c.check_count(kv_count, 8 + 4 + 1, || "metadata count".into())?;
        let mut metadata = Vec::with_capacity(n_kv);
        let mut seen = HashSet::with_capacity(n_kv);
        for i in 0..n_kv {
            let key = c.string(&|| format!("key of metadata entry {i}"))?;
            let what = || format!("value of metadata key {key:?}");
            let type_id = c.u32(|| format!("type of metadata key {key:?}"))?;
            let ty = ValueType::from_id(type_id).ok_or_else(|| Error::UnknownValueType {
                what: what(),
                type_id,
            })?;
            let value = c.value(ty, &what, 0)?;
            if !seen.insert(key) {
                return Err(Error::DuplicateKey(key.to_string()));
            }
            metadata.push((key, value));
        }

        let alignment = match metadata.iter().find(|(k, _)| *k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, Value::U32(a))) if a.is_power_of_two() => *a,
            Some((_, Value::U32(a))) => return Err(Error::BadAlignment(*a)),
            Some((key, other)) => {
                return Err(Error::WrongType {
                    key: key.to_string(),
                    expected: "U32",
                    found: other.describe(),
                });
            }
        };

        // Smallest tensor info: empty name (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
        let n_tensors = c.check_count(tensor_count, 8 + 4 + 8 + 4 + 8, || "tensor count".into())?;
        let mut tensors = Vec::with_capacity(n_tensors);
        let mut names = HashSet::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let name = c.string(&|| format!("name of tensor {i}"))?;
            let n_dims = c.u32(|| format!("dimension count of tensor {name:?}"))?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(Error::BadDimCount {
                    tensor: name.to_string(),
                    n_dims,
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for d in 0..n_dims {
                dims.push(c.u64(|| format!("dimension {d} of tensor {name:?}"))?);
            }
            let ty = TensorType::from_id(c.u32(|| format!("type of tensor {name:?}"))?);
            let offset = c.u64(|| format!("offset of tensor {name:?}"))?;
            if !names.insert(name) {
                return Err(Error::DuplicateTensor(name.to_string()));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                offset,
            });
        }

        let end = c.pos as u64;
        let data_start = end.div_ceil(u64::from(alignment)) * u64::from(alignment);
        let file = GgufFile {
            bytes,
            version,
            metadata,
            tensors,
            alignment,
            data_start,
        };
        for t in &file.tensors {
            file.check_tensor(t)?;
        }
        Ok(file)
    }

    /// Checks one tensor's shape, alignment and (for a known type) extent; returns its
    /// absolute byte range when the type is known.
    fn check_tensor(&self, t: &TensorInfo<'_>) -> Result<Option<(usize, usize)>, Error> {
        let overflow = || Error::SizeOverflow {
            tensor: t.name.to_string(),
            dims: t.dims.clone(),
        };
        let n = t
            .dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(overflow)?;
        if !t.offset.is_multiple_of(u64::from(self.alignment)) {
            return Err(Error::MisalignedOffset {
                tensor: t.name.to_string(),
                offset: t.offset,
                alignment: self.alignment,
            });
        }
        let start = self.data_start.checked_add(t.offset).ok_or_else(overflow)?;
        let out_of_range = |end: u64| Error::TensorOutOfRange {
            tensor: t.name.to_string(),
            start,
            end,
            file_len: self.bytes.len(),
        };
        let Some((block, size)) = t.ty.block_layout() else {
            // Unknown layout: the start at least must be inside the file.
            if start > self.bytes.len() as u64 {
                return Err(out_of_range(start));
            }
            return Ok(None);
        };
        if !t.dims[0].is_multiple_of(block) {
            return Err(Error::RowNotBlockMultiple {
                tensor: t.name.to_string(),
                ty: t.ty,
                ne0: t.dims[0],
                block_size: block,
            });
        }
        let len = (n / block).checked_mul(size).ok_or_else(overflow)?;
        let end = start.checked_add(len).ok_or_else(overflow)?;
        if end > self.bytes.len() as u64 {
            return Err(out_of_range(end));
        }
        Ok(Some((start as usize, end as usize)))
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The alignment of the data section and tensors.
    pub fn alignment(&self) -> u32 {
        self.alignment
    }

    /// Absolute offset of the data section in the file.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> &[(&'a str, Value<'a>)] {
        &self.metadata
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo<'a>] {
        &self.tensors
    }

    /// The tensor of that name.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo<'a>, Error> {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| Error::MissingTensor(name.to_string()))
    }

    /// A tensor's raw bytes (blocks as stored). Fails for a type whose layout is unknown, or
    /// for an info that does not belong to this file's checked ranges.
    pub fn tensor_bytes(&self, info: &TensorInfo<'_>) -> Result<&'a [u8], Error> {
        // Re-checked so an info built by the caller cannot slice out of range.
        match self.check_tensor(info)? {
            Some((start, end)) => Ok(&self.bytes[start..end]),
            None => Err(Error::UnknownTensorType {
                tensor: info.name.to_string(),
                type_id: info.ty.id(),
            }),
        }
    }

    /// The value of a metadata key, if present.
    pub fn get(&self, key: &str) -> Option<&Value<'a>> {
        self.metadata
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }

    fn require(&self, key: &str) -> Result<&Value<'a>, Error> {
        self.get(key)
            .ok_or_else(|| Error::MissingKey(key.to_string()))
    }

    fn wrong(key: &str, expected: &'static str, found: &Value<'_>) -> Error {
        Error::WrongType {
            key: key.to_string(),
            expected,
            found: found.describe(),
        }
    }

    /// A `u32` value.
    pub fn get_u32(&self, key: &str) -> Result<u32, Error> {
        match self.require(key)? {
            Value::U32(v) => Ok(*v),
            other => Err(Self::wrong(key, "U32", other)),
        }
    }

    /// A `u64` value.
    pub fn get_u64(&self, key: &str) -> Result<u64, Error> {
        match self.require(key)? {
            Value::U64(v) => Ok(*v),
            other => Err(Self::wrong(key, "U64", other)),
        }
    }

    /// An `i32` value.
    pub fn get_i32(&self, key: &str) -> Result<i32, Error> {
        match self.require(key)? {
            Value::I32(v) => Ok(*v),
            other => Err(Self::wrong(key, "I32", other)),
        }
    }

    /// An `f32` value.
    pub fn get_f32(&self, key: &str) -> Result<f32, Error> {
        match self.require(key)? {
            Value::F32(v) => Ok(*v),
            other => Err(Self::wrong(key, "F32", other)),
        }
    }

    /// A `bool` value.
    pub fn get_bool(&self, key: &str) -> Result<bool, Error> {
        match self.require(key)? {
            Value::Bool(v) => Ok(*v),
            other => Err(Self::wrong(key, "Bool", other)),
        }
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&'a str, Error> {
        match self.require(key)? {
            Value::String(v) => Ok(v),
            other => Err(Self::wrong(key, "String", other)),
        }
    }

    /// An array value of any element type.
    pub fn get_array(&self, key: &str) -> Result<&Array<'a>, Error> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            other => Err(Self::wrong(key, "Array", other)),
        }
    }

    /// An array of strings.
    pub fn get_string_array(&self, key: &str) -> Result<&[&'a str], Error> {
        match self.require(key)? {
            Value::Array(Array::String(v)) => Ok(v),
            other => Err(Self::wrong(key, "array of String", other)),
        }
    }

    /// An array of `i32` (e.g. `tokenizer.ggml.token_type`).
    pub fn get_i32_array(&self, key: &str) -> Result<&[i32], Error> {
        match self.require(key)? {
            Value::Array(Array::I32(v)) => Ok(v),
            other => Err(Self::wrong(key, "array of I32", other)),
        }
    }

    /// An array of `f32` (e.g. `tokenizer.ggml.scores`).
    pub fn get_f32_array(&self, key: &str) -> Result<&[f32], Error> {
        match self.require(key)? {
            Value::Array(Array::F32(v)) => Ok(v),
            other => Err(Self::wrong(key, "array of F32", other)),
        }
    }
}
