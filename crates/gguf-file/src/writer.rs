//! Writes GGUF version 3 files: the layout [`crate`]'s top comment describes, produced the way
//! gguf-py's `GGUFWriter` lays it out (header, metadata in insertion order, tensor infos in
//! insertion order, zero padding to the alignment, then each tensor's bytes, each padded with
//! zeros to the alignment so the next one starts aligned).
//!
//! Only what `repack` needs is here: string, u32 and u64 metadata values, and tensors whose
//! bytes are already in their ggml type's block layout. Every tensor's byte length is checked
//! against its dims and type before anything is written, so a file this writer produces is one
//! [`crate::GgufFile::parse`] and gguf-py's `GGUFReader` accept.
//!
//! Why by hand rather than a crate: crates that write GGUF exist (`gguf-rs`, `gguf-rs-lib`,
//! `ggus`, and `candle-core`'s `quantized::gguf_file`), but this crate already holds the format,
//! in a reader whose every size is checked and which is fuzzed; the writer is that reader's
//! inverse over the same types (the ggml type table, the value types) in a few hundred lines
//! with no `unsafe`, where a dependency would bring a second definition of the type table to
//! keep in agreement with the first (and, for candle, a whole tensor library). What matters is
//! that ggml's readers accept the files, and that is tested directly: byte for byte and value
//! for value against gguf-py (the `repack` crate's conformance fixtures under
//! `tests/data/gguf/` and `scripts/check-gguf-py`, which also has gguf-py's own `GGUFWriter`
//! write the same file).

use crate::{DEFAULT_ALIGNMENT, MAX_DIMS, TensorType, ValueType};

/// Why a GGUF file cannot be laid out as asked.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteError {
    /// The same metadata key twice.
    #[error("metadata key {0:?} given twice")]
    DuplicateKey(String),
    /// The same tensor name twice.
    #[error("tensor name {0:?} given twice")]
    DuplicateTensor(String),
    /// A tensor with 0 or more than [`MAX_DIMS`] dimensions, or a zero dimension.
    #[error("tensor {tensor:?}: dims {dims:?}; a tensor has 1..={MAX_DIMS} dimensions, none 0")]
    BadDims {
        /// The tensor's name.
        tensor: String,
        /// Its dims, ne0 first.
        dims: Vec<u64>,
    },
    /// A type with no known block layout.
    #[error("tensor {tensor:?}: {ty} has no block layout known to this writer")]
    UnknownType {
        /// The tensor's name.
        tensor: String,
        /// Its type.
        ty: TensorType,
    },
    /// A row length (ne0) that is not whole blocks.
    #[error("tensor {tensor:?}: row length {ne0} is not a multiple of {ty}'s block of {block}")]
    RowNotBlockMultiple {
        /// The tensor's name.
        tensor: String,
        /// Its type.
        ty: TensorType,
        /// Its row length.
        ne0: u64,
        /// Elements per block.
        block: u64,
    },
    /// Bytes of another length than the dims and type need.
    #[error("tensor {tensor:?}: {found} bytes given, but dims {dims:?} of {ty} need {expected}")]
    DataLength {
        /// The tensor's name.
        tensor: String,
        /// Its dims, ne0 first.
        dims: Vec<u64>,
        /// Its type.
        ty: TensorType,
        /// Bytes needed.
        expected: u64,
        /// Bytes given.
        found: usize,
    },
}

/// A metadata value this writer stores.
#[derive(Debug, Clone, PartialEq)]
enum MetaValue {
    U32(u32),
    U64(u64),
    String(String),
}

#[derive(Debug, Clone)]
struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: TensorType,
    data: Vec<u8>,
}

/// A GGUF v3 file being assembled in memory; [`GgufWriter::to_bytes`] lays it out.
#[derive(Debug, Clone, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<PendingTensor>,
}

impl GgufWriter {
    /// An empty file (no metadata, no tensors), alignment [`DEFAULT_ALIGNMENT`].
    pub fn new() -> Self {
        Self::default()
    }

    fn add(&mut self, key: &str, value: MetaValue) -> Result<(), WriteError> {
        if self.metadata.iter().any(|(k, _)| k == key) {
            return Err(WriteError::DuplicateKey(key.to_string()));
        }
        self.metadata.push((key.to_string(), value));
        Ok(())
    }

    /// Adds a string metadata value.
    pub fn add_string(&mut self, key: &str, value: &str) -> Result<(), WriteError> {
        self.add(key, MetaValue::String(value.to_string()))
    }

    /// Adds a u32 metadata value.
    pub fn add_u32(&mut self, key: &str, value: u32) -> Result<(), WriteError> {
        self.add(key, MetaValue::U32(value))
    }

    /// Adds a u64 metadata value.
    pub fn add_u64(&mut self, key: &str, value: u64) -> Result<(), WriteError> {
        self.add(key, MetaValue::U64(value))
    }

    /// Adds a tensor: `dims` in ggml order (ne0, the row length, first: a `[rows, cols]`
    /// matrix is `[cols, rows]`), `data` its bytes in `ty`'s block layout, checked against the
    /// dims.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: TensorType,
        data: Vec<u8>,
    ) -> Result<(), WriteError> {
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(WriteError::DuplicateTensor(name.to_string()));
        }
        let bad_dims = || WriteError::BadDims {
            tensor: name.to_string(),
            dims: dims.to_vec(),
        };
        if dims.is_empty() || dims.len() > MAX_DIMS as usize || dims.contains(&0) {
            return Err(bad_dims());
        }
        let (block, size) = ty.block_layout().ok_or_else(|| WriteError::UnknownType {
            tensor: name.to_string(),
            ty,
        })?;
        if !dims[0].is_multiple_of(block) {
            return Err(WriteError::RowNotBlockMultiple {
                tensor: name.to_string(),
                ty,
                ne0: dims[0],
                block,
            });
        }
        let expected = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .and_then(|n| (n / block).checked_mul(size))
            .ok_or_else(bad_dims)?;
        if u64::try_from(data.len()).ok() != Some(expected) {
            return Err(WriteError::DataLength {
                tensor: name.to_string(),
                dims: dims.to_vec(),
                ty,
                expected,
                found: data.len(),
            });
        }
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ty,
            data,
        });
        Ok(())
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = DEFAULT_ALIGNMENT as usize;
        let pad = |len: usize| (align - len % align) % align;
        let mut out = Vec::new();
        out.extend(b"GGUF");
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_string(&mut out, key);
            match value {
                MetaValue::U32(v) => {
                    out.extend(ValueType::U32.id().to_le_bytes());
                    out.extend(v.to_le_bytes());
                }
                MetaValue::U64(v) => {
                    out.extend(ValueType::U64.id().to_le_bytes());
                    out.extend(v.to_le_bytes());
                }
                MetaValue::String(v) => {
                    out.extend(ValueType::String.id().to_le_bytes());
                    put_string(&mut out, v);
                }
            }
        }
        let mut offset = 0usize;
        for t in &self.tensors {
            put_string(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ty.id().to_le_bytes());
            out.extend((offset as u64).to_le_bytes());
            offset += t.data.len() + pad(t.data.len());
        }
        out.resize(out.len() + pad(out.len()), 0);
        for t in &self.tensors {
            out.extend(&t.data);
            out.resize(out.len() + pad(t.data.len()), 0);
        }
        out
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GgufFile, Value};

    #[test]
    fn what_it_writes_reads_back() {
        let mut w = GgufWriter::new();
        w.add_string("general.name", "w").unwrap();
        w.add_u32("kvpack.n", 7).unwrap();
        // Two Q8_0 rows of 32 and one Q4_0 row of 64: data of 68 and 36 bytes, padded to 96
        // and 64.
        w.add_tensor("a", &[32, 2], TensorType::Q8_0, vec![1; 68])
            .unwrap();
        w.add_tensor("b", &[64], TensorType::Q4_0, vec![2; 36])
            .unwrap();
        let bytes = w.to_bytes();
        let file = GgufFile::parse(&bytes).unwrap();
        assert_eq!(file.version(), 3);
        assert_eq!(file.get_str("general.name").unwrap(), "w");
        assert!(matches!(file.get("kvpack.n"), Some(Value::U32(7))));
        let a = file.tensor("a").unwrap();
        assert_eq!(
            (a.dims.as_slice(), a.ty, a.offset),
            (&[32, 2][..], TensorType::Q8_0, 0)
        );
        assert_eq!(file.tensor_bytes(a).unwrap(), &[1; 68][..]);
        let b = file.tensor("b").unwrap();
        assert_eq!(b.offset, 96);
        assert_eq!(file.tensor_bytes(b).unwrap(), &[2; 36][..]);
        assert_eq!(file.data_start() % 32, 0);
        assert_eq!(bytes.len() as u64, file.data_start() + 96 + 64);
    }

    #[test]
    fn refuses_what_no_reader_would_accept() {
        let mut w = GgufWriter::new();
        w.add_string("k", "v").unwrap();
        assert_eq!(w.add_u32("k", 1), Err(WriteError::DuplicateKey("k".into())));
        assert!(matches!(
            w.add_tensor("t", &[48], TensorType::Q4_0, vec![0; 27]),
            Err(WriteError::RowNotBlockMultiple {
                ne0: 48,
                block: 32,
                ..
            })
        ));
        assert!(matches!(
            w.add_tensor("t", &[32, 2], TensorType::Q4_0, vec![0; 35]),
            Err(WriteError::DataLength {
                expected: 36,
                found: 35,
                ..
            })
        ));
        assert!(matches!(
            w.add_tensor("t", &[], TensorType::F32, vec![]),
            Err(WriteError::BadDims { .. })
        ));
        assert!(matches!(
            w.add_tensor("t", &[1, 0], TensorType::F32, vec![]),
            Err(WriteError::BadDims { .. })
        ));
        assert!(matches!(
            w.add_tensor("t", &[1], TensorType::Other(99), vec![0]),
            Err(WriteError::UnknownType { .. })
        ));
        w.add_tensor("t", &[1], TensorType::F32, vec![0; 4])
            .unwrap();
        assert_eq!(
            w.add_tensor("t", &[1], TensorType::F32, vec![0; 4]),
            Err(WriteError::DuplicateTensor("t".into()))
        );
    }
}
