//! Tensor infos: the ggml tensor types with their block layouts, and one tensor's description.

use std::fmt;

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
    /// cannot panic; [`GgufFile::parse`](crate::GgufFile::parse) refuses files where it would
    /// overflow).
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
