//! A parsed GGUF file: the header, metadata and tensor infos read and checked, tensor slicing,
//! and typed metadata getters; and reading a whole file into memory.

use std::collections::HashSet;
use std::path::Path;

use crate::cursor::Cursor;
use crate::error::Error;
use crate::tensor::{TensorInfo, TensorType};
use crate::value::{Array, Value, ValueType};
use crate::{DEFAULT_ALIGNMENT, MAX_DIMS};

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
