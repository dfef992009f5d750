//! `arrays.npz`, read so that the audit and NumPy cannot disagree about it.
//!
//! [`zip`] accepts only the canonical container and [`npy`] only the canonical member header;
//! [`Archive`] then gives typed arrays by name, checking dtype and shape before it copies a byte.
//! The whole archive is held in memory: it is at most [`zip::MAX_ARCHIVE_BYTES`].

pub mod npy;
pub mod zip;

use std::collections::BTreeMap;
use std::ops::Range;

use ndarray::{Array1, Array2};
use thiserror::Error;

pub use npy::{Dtype, NpyError};
pub use zip::ZipError;

/// Why bytes are not a canonical npz archive.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum NpzError {
    /// The container breaks a rule of [`zip`].
    #[error("{0}")]
    Zip(#[from] ZipError),
    /// A member breaks a rule of [`npy`].
    #[error("member {member}.npy: {error}")]
    Npy {
        /// The member's name without `.npy`.
        member: String,
        /// The rule it breaks.
        error: NpyError,
    },
}

impl NpzError {
    /// A stable identifier of the rule broken (see [`ZipError::rule`] and [`NpyError::rule`]).
    pub fn rule(&self) -> &'static str {
        match self {
            NpzError::Zip(e) => e.rule(),
            NpzError::Npy { error, .. } => error.rule(),
        }
    }
}

/// Why one array cannot be had as the caller expects it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ArrayError {
    /// No member of that name.
    #[error("arrays.npz has no array {name}")]
    Missing {
        /// The array's name.
        name: String,
    },
    /// Another element type.
    #[error("array {name} is {found}, expected {expected}")]
    Dtype {
        /// The array's name.
        name: String,
        /// Its dtype.
        found: Dtype,
        /// The dtype the evidence format gives it.
        expected: Dtype,
    },
    /// Another shape.
    #[error("array {name} has shape {found:?}, expected {expected:?}")]
    Shape {
        /// The array's name.
        name: String,
        /// Its shape.
        found: Vec<usize>,
        /// The shape the protocol gives it.
        expected: Vec<usize>,
    },
}

/// An element type the evidence stores, read from little-endian bytes.
pub trait Element: Copy {
    /// Its dtype.
    const DTYPE: Dtype;
    /// One element from exactly `DTYPE.itemsize()` little-endian bytes.
    fn from_le(bytes: &[u8]) -> Self;
}

impl Element for u8 {
    const DTYPE: Dtype = Dtype::U8;
    fn from_le(bytes: &[u8]) -> Self {
        bytes[0]
    }
}

impl Element for i32 {
    const DTYPE: Dtype = Dtype::I32;
    fn from_le(bytes: &[u8]) -> Self {
        i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn from_le(bytes: &[u8]) -> Self {
        f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }
}

impl Element for f64 {
    const DTYPE: Dtype = Dtype::F64;
    fn from_le(bytes: &[u8]) -> Self {
        let mut b = [0u8; 8];
        b.copy_from_slice(bytes);
        f64::from_le_bytes(b)
    }
}

/// One array's description and where its data lies in the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrayInfo {
    /// Element type.
    pub dtype: Dtype,
    /// Shape, C order.
    pub shape: Vec<usize>,
    data: Range<usize>,
}

/// A canonical npz archive: every member checked, arrays available by name.
#[derive(Debug, Clone)]
pub struct Archive {
    bytes: Vec<u8>,
    arrays: BTreeMap<String, ArrayInfo>,
    order: Vec<String>,
}

/// Checks every rule of [`zip`] and [`npy`] on `bytes` and describes each array, in archive order.
pub fn parse(bytes: &[u8]) -> Result<Vec<(String, ArrayInfo)>, NpzError> {
    zip::entries(bytes)?
        .into_iter()
        .map(|entry| {
            let header = npy::parse(&bytes[entry.data.clone()]).map_err(|error| NpzError::Npy {
                member: entry.stem.clone(),
                error,
            })?;
            let info = ArrayInfo {
                dtype: header.dtype,
                shape: header.shape,
                data: entry.data.start + header.data_offset..entry.data.end,
            };
            Ok((entry.stem, info))
        })
        .collect()
}

impl Archive {
    /// Parses and checks an archive held in memory.
    pub fn new(bytes: Vec<u8>) -> Result<Archive, NpzError> {
        let parsed = parse(&bytes)?;
        let order = parsed.iter().map(|(name, _)| name.clone()).collect();
        Ok(Archive {
            bytes,
            arrays: parsed.into_iter().collect(),
            order,
        })
    }

    /// Array names (without `.npy`), in archive order.
    pub fn names(&self) -> &[String] {
        &self.order
    }

    /// The description of array `name`, if there is one.
    pub fn info(&self, name: &str) -> Option<&ArrayInfo> {
        self.arrays.get(name)
    }

    /// The raw little-endian data bytes of array `name`.
    pub fn data(&self, name: &str) -> Option<&[u8]> {
        self.arrays.get(name).map(|a| &self.bytes[a.data.clone()])
    }

    fn checked<T: Element>(&self, name: &str, expected: &[usize]) -> Result<&[u8], ArrayError> {
        let info = self.arrays.get(name).ok_or_else(|| ArrayError::Missing {
            name: name.to_string(),
        })?;
        if info.dtype != T::DTYPE {
            return Err(ArrayError::Dtype {
                name: name.to_string(),
                found: info.dtype,
                expected: T::DTYPE,
            });
        }
        if info.shape != expected {
            return Err(ArrayError::Shape {
                name: name.to_string(),
                found: info.shape.clone(),
                expected: expected.to_vec(),
            });
        }
        Ok(&self.bytes[info.data.clone()])
    }

    /// Array `name` as a matrix of exactly `shape`.
    pub fn matrix<T: Element>(
        &self,
        name: &str,
        shape: [usize; 2],
    ) -> Result<Array2<T>, ArrayError> {
        let data = self.checked::<T>(name, &shape)?;
        let values: Vec<T> = data
            .chunks_exact(T::DTYPE.itemsize())
            .map(T::from_le)
            .collect();
        Ok(Array2::from_shape_vec(shape, values).expect("the shape was checked against the data"))
    }

    /// Array `name` as a vector of exactly `len` elements.
    pub fn vector<T: Element>(&self, name: &str, len: usize) -> Result<Array1<T>, ArrayError> {
        let data = self.checked::<T>(name, &[len])?;
        Ok(data
            .chunks_exact(T::DTYPE.itemsize())
            .map(T::from_le)
            .collect())
    }
}
