//! Safetensors checkpoints in memory: named tensors (dtype, shape, raw little-endian bytes) and
//! the string metadata, read with the `safetensors` crate and written back through it.
//!
//! Serializing is deterministic: the crate lays out the data (tensors sorted by dtype
//! alignment, then name) but keeps metadata in a `HashMap`, whose order changes from run to run,
//! so the header it produced is re-emitted with its keys sorted.
//!
//! This module works on bytes only and depends on no other of this crate's; reading and writing
//! files (atomically, never overwriting) is [`crate::files`]'s.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use half::f16;
use ndarray::Array2;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensorError, SafeTensors, View};
use serde::Deserialize;
use thiserror::Error;

/// Why bytes are not a safetensors file this tool can read.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Fewer bytes than the header length takes.
    #[error("{found} bytes; a safetensors file starts with an 8-byte little-endian header length")]
    TooShort {
        /// Bytes present.
        found: usize,
    },

    /// A header length past the end of the bytes.
    #[error("its header declares {declared} bytes, but only {available} bytes follow its length")]
    HeaderPastEnd {
        /// The header length it declares.
        declared: u64,
        /// Bytes after the length field.
        available: usize,
    },

    /// A tensor whose data offsets hold another number of bytes than its shape needs.
    #[error(
        "tensor {tensor:?} is {dtype:?} with shape {shape:?}, which is {needed} bytes, but its \
         data_offsets [{start}, {end}] hold {held}",
        held = .end.saturating_sub(*.start)
    )]
    TensorByteCount {
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
        /// Its shape.
        shape: Vec<usize>,
        /// Bytes the shape and dtype need.
        needed: usize,
        /// Its first data offset.
        start: usize,
        /// Its end data offset.
        end: usize,
    },

    /// A tensor whose size in bytes does not fit in a usize.
    #[error(
        "tensor {tensor:?} is {dtype:?} with shape {shape:?}, whose size in bytes does not fit \
         in {} bits",
        usize::BITS
    )]
    TensorSizeOverflow {
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
        /// Its shape.
        shape: Vec<usize>,
    },

    /// Whatever else the `safetensors` crate refuses.
    #[error(transparent)]
    Format(#[from] SafetensorsError),
}

/// An error of the `safetensors` crate, as one message. Its messages already include their
/// cause (`invalid JSON in header: expected value at line 1 column 1`) and report that cause as
/// their `source()` as well, so a chain printed in full would say it twice; this wrapper ends the
/// chain at the crate's message. The original error is [`SafetensorsError::get`].
#[derive(Debug)]
pub struct SafetensorsError(SafeTensorError);

impl SafetensorsError {
    /// The crate's own error.
    pub fn get(&self) -> &SafeTensorError {
        &self.0
    }
}

impl fmt::Display for SafetensorsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SafetensorsError {}

impl From<SafeTensorError> for SafetensorsError {
    fn from(error: SafeTensorError) -> Self {
        SafetensorsError(error)
    }
}

impl From<SafeTensorError> for CheckpointError {
    fn from(error: SafeTensorError) -> Self {
        CheckpointError::Format(SafetensorsError(error))
    }
}

/// Why a tensor is not what a layout stores in it.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum TensorError {
    /// A dtype or rank other than the layout's.
    #[error(
        "tensor {tensor:?} is {dtype:?} with shape {shape:?}; this layout stores it as {expected}"
    )]
    WrongType {
        /// The tensor's full name.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
        /// Its shape.
        shape: Vec<usize>,
        /// What the layout stores there ("an int32 matrix").
        expected: &'static str,
    },

    /// Data of another length than the shape and dtype need (only a tensor built by hand, not
    /// one read from a file, can be so).
    #[error("tensor {tensor:?} is {dtype:?} with shape {shape:?}, but holds {found} bytes of data")]
    DataLength {
        /// The tensor's full name.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
        /// Its shape.
        shape: Vec<usize>,
        /// Bytes it holds.
        found: usize,
    },
}

/// What a safetensors header says about each tensor (the crate's own `TensorInfo`).
#[derive(Deserialize)]
struct HeaderEntry {
    dtype: Dtype,
    shape: Vec<usize>,
    data_offsets: (usize, usize),
}

/// Checks the header's declared length against the bytes present, and each tensor's shape and
/// dtype against the bytes its offsets give it. Anything it cannot make sense of (JSON that does
/// not parse, an entry that is not a tensor) is left for the `safetensors` crate to refuse.
fn check_header(bytes: &[u8]) -> Result<(), CheckpointError> {
    let Some(length) = bytes.first_chunk::<8>() else {
        return Err(CheckpointError::TooShort { found: bytes.len() });
    };
    let declared = u64::from_le_bytes(*length);
    let available = bytes.len() - 8;
    let header_end = match usize::try_from(declared) {
        Ok(declared) if declared <= available => 8 + declared,
        _ => {
            return Err(CheckpointError::HeaderPastEnd {
                declared,
                available,
            });
        }
    };
    let Ok(entries) =
        serde_json::from_slice::<BTreeMap<String, serde_json::Value>>(&bytes[8..header_end])
    else {
        return Ok(());
    };
    for (tensor, entry) in entries {
        if tensor == "__metadata__" {
            continue;
        }
        let Ok(HeaderEntry {
            dtype,
            shape,
            data_offsets: (start, end),
        }) = serde_json::from_value(entry)
        else {
            continue;
        };
        let bits = shape
            .iter()
            .try_fold(1usize, |count, &dim| count.checked_mul(dim))
            .and_then(|count| count.checked_mul(dtype.bitsize()));
        let Some(bits) = bits else {
            return Err(CheckpointError::TensorSizeOverflow {
                tensor,
                dtype,
                shape,
            });
        };
        // Sub-byte dtypes that end mid-byte, and reversed offsets, are the crate's to refuse.
        let needed = bits / 8;
        if bits % 8 == 0 && start <= end && end - start != needed {
            return Err(CheckpointError::TensorByteCount {
                tensor,
                dtype,
                shape,
                needed,
                start,
                end,
            });
        }
    }
    Ok(())
}

/// One tensor: dtype, shape and raw little-endian data.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// The elements, little-endian, row-major.
    pub data: Vec<u8>,
}

/// A checkpoint's tensors and metadata, both sorted by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Checkpoint {
    /// Tensors by full name.
    pub tensors: BTreeMap<String, Tensor>,
    /// The header's `__metadata__`, string to string.
    pub metadata: BTreeMap<String, String>,
}

impl View for &Tensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

impl Checkpoint {
    /// The checkpoint that `bytes` hold in safetensors format. The `safetensors` crate checks
    /// the offsets; before it runs, the header's length is checked against the bytes present
    /// and each tensor's shape against its byte count, so that those refusals name the numbers
    /// (and the tensor) rather than saying "invalid header length".
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CheckpointError> {
        check_header(bytes)?;
        let (_, header) = SafeTensors::read_metadata(bytes)?;
        let metadata = header
            .metadata()
            .as_ref()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let tensors = SafeTensors::deserialize(bytes)?
            .tensors()
            .into_iter()
            .map(|(name, view)| (name, Tensor::from_view(&view)))
            .collect();
        Ok(Checkpoint { tensors, metadata })
    }

    /// The file's bytes: the crate's serialization with the header's keys sorted.
    pub fn to_bytes(&self) -> Result<Vec<u8>, SafetensorsError> {
        let metadata: HashMap<String, String> = self.metadata.clone().into_iter().collect();
        let serialized = safetensors::serialize(
            self.tensors
                .iter()
                .map(|(name, tensor)| (name.as_str(), tensor)),
            (!metadata.is_empty()).then_some(metadata),
        )?;
        Ok(with_sorted_header(&serialized))
    }
}

/// Re-emits a safetensors header with every JSON object's keys in sorted order.
fn with_sorted_header(serialized: &[u8]) -> Vec<u8> {
    let header_len = u64::from_le_bytes(serialized[..8].try_into().expect("8-byte length"));
    let header_end = 8 + header_len as usize;
    let header: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&serialized[8..header_end]).expect("the crate wrote valid JSON");
    let header = header
        .into_iter()
        .map(|(name, value)| (name, sorted_object(value)))
        .collect::<BTreeMap<_, _>>();
    let mut text = serde_json::to_vec(&header).expect("JSON values serialize");
    text.resize(text.len().next_multiple_of(8), b' ');
    let mut out = Vec::with_capacity(8 + text.len() + serialized.len() - header_end);
    out.extend((text.len() as u64).to_le_bytes());
    out.extend(text);
    out.extend(&serialized[header_end..]);
    out
}

fn sorted_object(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let sorted: BTreeMap<String, serde_json::Value> = map.into_iter().collect();
            serde_json::to_value(sorted).expect("a map of JSON values")
        }
        other => other,
    }
}

impl Tensor {
    fn from_view(view: &TensorView<'_>) -> Self {
        Tensor {
            dtype: view.dtype(),
            shape: view.shape().to_vec(),
            data: view.data().to_vec(),
        }
    }

    /// An int32 matrix as a tensor.
    pub fn from_i32_matrix(values: &Array2<i32>) -> Self {
        Tensor {
            dtype: Dtype::I32,
            shape: values.shape().to_vec(),
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// An int32 vector as a tensor.
    pub fn from_i32_vector(values: &[i32]) -> Self {
        Tensor {
            dtype: Dtype::I32,
            shape: vec![values.len()],
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// An f16 matrix as a tensor.
    pub fn from_f16_matrix(values: &Array2<f16>) -> Self {
        Tensor {
            dtype: Dtype::F16,
            shape: values.shape().to_vec(),
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// The tensor as an int32 matrix, or an error naming it `name`.
    pub fn i32_matrix(&self, name: &str) -> Result<Array2<i32>, TensorError> {
        let [rows, cols] = self.expect(name, Dtype::I32, 2, "an int32 matrix")?;
        let values = self
            .data
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect();
        Ok(Array2::from_shape_vec((rows, cols), values).expect("checked size"))
    }

    /// The tensor as an f16 matrix, or an error naming it `name`.
    pub fn f16_matrix(&self, name: &str) -> Result<Array2<f16>, TensorError> {
        let [rows, cols] = self.expect(name, Dtype::F16, 2, "an f16 matrix")?;
        let values = self
            .data
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes(b.try_into().expect("2 bytes")))
            .collect();
        Ok(Array2::from_shape_vec((rows, cols), values).expect("checked size"))
    }

    /// The tensor as an int32 vector, or an error naming it `name`.
    pub fn i32_vector(&self, name: &str) -> Result<Vec<i32>, TensorError> {
        self.expect(name, Dtype::I32, 1, "an int32 vector")?;
        Ok(self
            .data
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect())
    }

    /// The tensor as an f32 vector, or an error naming it `name`.
    pub fn f32_vector(&self, name: &str) -> Result<Vec<f32>, TensorError> {
        self.expect(name, Dtype::F32, 1, "an f32 vector")?;
        Ok(self
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect())
    }

    /// Checks dtype and rank; returns the first two dimensions (the second is 1 for vectors).
    fn expect(
        &self,
        name: &str,
        dtype: Dtype,
        rank: usize,
        expected: &'static str,
    ) -> Result<[usize; 2], TensorError> {
        if self.dtype != dtype || self.shape.len() != rank {
            return Err(TensorError::WrongType {
                tensor: name.to_string(),
                dtype: self.dtype,
                shape: self.shape.clone(),
                expected,
            });
        }
        // A tensor read from a file has the bytes its shape needs (the reader checked); one
        // built by hand may not, and the matrices built from it must not be short.
        let bytes = self
            .shape
            .iter()
            .try_fold(dtype.bitsize() / 8, |n, &d| n.checked_mul(d));
        if bytes != Some(self.data.len()) {
            return Err(TensorError::DataLength {
                tensor: name.to_string(),
                dtype: self.dtype,
                shape: self.shape.clone(),
                found: self.data.len(),
            });
        }
        Ok([self.shape[0], self.shape.get(1).copied().unwrap_or(1)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    fn sample() -> Checkpoint {
        let mut ckpt = Checkpoint::default();
        ckpt.tensors.insert(
            "layer.qweight".into(),
            Tensor::from_i32_matrix(&array![[-1, 2], [3, i32::MIN]]),
        );
        ckpt.tensors.insert(
            "layer.scales".into(),
            Tensor::from_f16_matrix(&array![[f16::ONE, f16::from_f32(0.01)]]),
        );
        for (k, v) in [
            ("format", "pt"),
            ("bits", "4"),
            ("group_size", "32"),
            ("b", "x"),
        ] {
            ckpt.metadata.insert(k.into(), v.into());
        }
        ckpt
    }

    #[test]
    fn writes_the_same_bytes_every_time_and_reads_them_back() {
        let ckpt = sample();
        let bytes = ckpt.to_bytes().unwrap();
        for _ in 0..8 {
            assert_eq!(ckpt.to_bytes().unwrap(), bytes);
        }
        let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header = std::str::from_utf8(&bytes[8..8 + header_len]).unwrap();
        assert!(header.starts_with(
            r#"{"__metadata__":{"b":"x","bits":"4","format":"pt","group_size":"32"},"layer.qweight":{"data_offsets":[0,16],"dtype":"I32","shape":[2,2]}"#
        ));
        assert_eq!(header_len % 8, 0);
        let back = Checkpoint::from_bytes(&bytes).unwrap();
        assert_eq!(back, ckpt);
        assert_eq!(
            back.tensors["layer.qweight"].i32_matrix("q").unwrap(),
            array![[-1, 2], [3, i32::MIN]]
        );
    }

    #[test]
    fn a_tensor_of_the_wrong_type_is_named() {
        let ckpt = sample();
        assert_eq!(
            ckpt.tensors["layer.scales"].i32_matrix("layer.scales"),
            Err(TensorError::WrongType {
                tensor: "layer.scales".into(),
                dtype: Dtype::F16,
                shape: vec![1, 2],
                expected: "an int32 matrix",
            })
        );
    }

    /// A safetensors file with `header` (JSON) and `data`, its length field as given.
    fn safetensors(declared: u64, header: &str, data: &[u8]) -> Vec<u8> {
        let mut out = declared.to_le_bytes().to_vec();
        out.extend(header.as_bytes());
        out.extend(data);
        out
    }

    #[test]
    fn a_header_length_past_the_end_of_the_file_is_refused_with_both_numbers() {
        let mut bytes = sample().to_bytes().unwrap();
        let available = bytes.len() - 8;
        bytes[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let err = Checkpoint::from_bytes(&bytes).unwrap_err();
        assert!(
            matches!(err, CheckpointError::HeaderPastEnd { declared, available: a }
                if declared == 1 << 40 && a == available),
            "{err:?}"
        );
        let err = Checkpoint::from_bytes(&[1, 2, 3]).unwrap_err();
        assert!(
            matches!(err, CheckpointError::TooShort { found: 3 }),
            "{err:?}"
        );
    }

    #[test]
    fn a_shape_whose_byte_count_disagrees_with_its_offsets_names_the_tensor() {
        let header = r#"{"t":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}}"#;
        let bytes = safetensors(header.len() as u64, header, &[0; 16]);
        let err = Checkpoint::from_bytes(&bytes).unwrap_err();
        assert!(
            matches!(&err, CheckpointError::TensorByteCount { tensor, dtype: Dtype::F32, shape, needed: 24, start: 0, end: 16 }
                if tensor == "t" && shape == &[2, 3]),
            "{err:?}"
        );
    }

    #[test]
    fn a_shape_whose_byte_count_overflows_is_refused() {
        let header = format!(
            r#"{{"t":{{"dtype":"I32","shape":[{},4],"data_offsets":[0,0]}}}}"#,
            usize::MAX / 2
        );
        let bytes = safetensors(header.len() as u64, &header, &[]);
        let err = Checkpoint::from_bytes(&bytes).unwrap_err();
        assert!(
            matches!(&err, CheckpointError::TensorSizeOverflow { tensor, .. } if tensor == "t"),
            "{err:?}"
        );
    }

    #[test]
    fn what_the_crate_refuses_is_still_refused() {
        // Offsets that leave a gap: the safetensors crate's own check.
        let header = r#"{"t":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}"#;
        let bytes = safetensors(header.len() as u64, header, &[0; 3]);
        let err = Checkpoint::from_bytes(&bytes).unwrap_err();
        assert!(matches!(err, CheckpointError::Format(_)), "{err:?}");
    }

    #[test]
    fn a_hand_built_tensor_shorter_than_its_shape_is_an_error_not_a_panic() {
        let tensor = Tensor {
            dtype: Dtype::I32,
            shape: vec![2, 2],
            data: vec![0; 12],
        };
        assert_eq!(
            tensor.i32_matrix("short"),
            Err(TensorError::DataLength {
                tensor: "short".into(),
                dtype: Dtype::I32,
                shape: vec![2, 2],
                found: 12,
            })
        );
    }
}
