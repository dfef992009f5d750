//! Safetensors checkpoints in memory: named tensors (dtype, shape, raw little-endian bytes) and
//! the string metadata, read with the `safetensors` crate and written back through it.
//!
//! Writing is deterministic and atomic: the crate lays out the data (tensors sorted by dtype
//! alignment, then name) but keeps metadata in a `HashMap`, whose order changes from run to run,
//! so the header it produced is re-emitted with its keys sorted; the bytes go to a temporary file
//! in the destination's directory that is renamed into place only if the destination still does
//! not exist. A failed run leaves nothing behind.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

use half::f16;
use ndarray::Array2;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors, View};
use serde::Deserialize;
use thiserror::Error;

use crate::error::{Error, Result};
use crate::input::read_input;

/// Why bytes are not a safetensors file this tool can read.
#[derive(Debug, Error)]
pub enum CheckpointError {
    #[error("{found} bytes; a safetensors file starts with an 8-byte little-endian header length")]
    TooShort { found: usize },

    #[error("its header declares {declared} bytes, but only {available} bytes follow its length")]
    HeaderPastEnd { declared: u64, available: usize },

    #[error(
        "tensor {tensor:?} is {dtype:?} with shape {shape:?}, which is {needed} bytes, but its \
         data_offsets [{start}, {end}] hold {held}",
        held = .end.saturating_sub(*.start)
    )]
    TensorByteCount {
        tensor: String,
        dtype: Dtype,
        shape: Vec<usize>,
        needed: usize,
        start: usize,
        end: usize,
    },

    #[error(
        "tensor {tensor:?} is {dtype:?} with shape {shape:?}, whose size in bytes does not fit \
         in {} bits",
        usize::BITS
    )]
    TensorSizeOverflow {
        tensor: String,
        dtype: Dtype,
        shape: Vec<usize>,
    },

    #[error("{0}")]
    Format(#[from] safetensors::SafeTensorError),
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
fn check_header(bytes: &[u8]) -> std::result::Result<(), CheckpointError> {
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
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// A checkpoint's tensors and metadata, both sorted by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Checkpoint {
    pub tensors: BTreeMap<String, Tensor>,
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
    /// Reads the safetensors file at `path` (a thin wrapper over [`Checkpoint::from_bytes`]).
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = read_input(path)?;
        Self::from_bytes(&bytes).map_err(|source| Error::SafeTensors {
            path: path.to_path_buf(),
            source,
        })
    }

    /// The checkpoint that `bytes` hold in safetensors format. The `safetensors` crate checks
    /// the offsets; before it runs, the header's length is checked against the bytes present
    /// and each tensor's shape against its byte count, so that those refusals name the numbers
    /// (and the tensor) rather than saying "invalid header length".
    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<Self, CheckpointError> {
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
    pub fn to_bytes(&self) -> std::result::Result<Vec<u8>, safetensors::SafeTensorError> {
        let metadata: HashMap<String, String> = self.metadata.clone().into_iter().collect();
        let serialized = safetensors::serialize(
            self.tensors
                .iter()
                .map(|(name, tensor)| (name.as_str(), tensor)),
            (!metadata.is_empty()).then_some(metadata),
        )?;
        Ok(with_sorted_header(&serialized))
    }

    /// Writes the checkpoint to `path`, which must not exist; nothing is left behind on failure.
    pub fn write_new(&self, path: &Path) -> Result<()> {
        let bytes = self.to_bytes().map_err(|source| Error::Serialize {
            path: path.to_path_buf(),
            source,
        })?;
        write_new_file(path, &bytes)
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

/// Writes `bytes` to `path` through a temporary sibling; refuses if `path` exists.
pub fn write_new_file(path: &Path, bytes: &[u8]) -> Result<()> {
    if path.exists() {
        return Err(Error::OutputExists(path.to_path_buf()));
    }
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let mut builder = tempfile::Builder::new();
    // tempfile creates private (0600) files; an output is an ordinary file, 0666 minus the umask.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let mut temp = builder
        .prefix(".repack-")
        .tempfile_in(dir)
        .map_err(Error::io(dir))?;
    temp.write_all(bytes).map_err(Error::io(temp.path()))?;
    temp.as_file().sync_all().map_err(Error::io(temp.path()))?;
    temp.persist_noclobber(path).map_err(|err| {
        if path.exists() {
            Error::OutputExists(path.to_path_buf())
        } else {
            Error::io(path)(err.error)
        }
    })?;
    Ok(())
}

impl Tensor {
    fn from_view(view: &TensorView<'_>) -> Self {
        Tensor {
            dtype: view.dtype(),
            shape: view.shape().to_vec(),
            data: view.data().to_vec(),
        }
    }

    pub fn from_i32_matrix(values: &Array2<i32>) -> Self {
        Tensor {
            dtype: Dtype::I32,
            shape: values.shape().to_vec(),
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    pub fn from_i32_vector(values: &[i32]) -> Self {
        Tensor {
            dtype: Dtype::I32,
            shape: vec![values.len()],
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    pub fn from_f16_matrix(values: &Array2<f16>) -> Self {
        Tensor {
            dtype: Dtype::F16,
            shape: values.shape().to_vec(),
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// The tensor as an int32 matrix, or an error naming it.
    pub fn i32_matrix(&self, name: &str) -> Result<Array2<i32>> {
        let [rows, cols] = self.expect(name, Dtype::I32, 2, "an int32 matrix")?;
        let values = self
            .data
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect();
        Ok(Array2::from_shape_vec((rows, cols), values).expect("checked size"))
    }

    pub fn f16_matrix(&self, name: &str) -> Result<Array2<f16>> {
        let [rows, cols] = self.expect(name, Dtype::F16, 2, "an f16 matrix")?;
        let values = self
            .data
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]))
            .collect();
        Ok(Array2::from_shape_vec((rows, cols), values).expect("checked size"))
    }

    pub fn i32_vector(&self, name: &str) -> Result<Vec<i32>> {
        self.expect(name, Dtype::I32, 1, "an int32 vector")?;
        Ok(self
            .data
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect())
    }

    pub fn f32_vector(&self, name: &str) -> Result<Vec<f32>> {
        self.expect(name, Dtype::F32, 1, "an f32 vector")?;
        Ok(self
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect())
    }

    /// Checks dtype and rank; returns the first two dimensions (the second is 1 for vectors).
    fn expect(&self, name: &str, dtype: Dtype, rank: usize, what: &str) -> Result<[usize; 2]> {
        if self.dtype != dtype || self.shape.len() != rank {
            return Err(Error::TensorType {
                tensor: name.to_string(),
                found: format!("{:?}", self.dtype),
                shape: self.shape.clone(),
                expected: format!("this layout stores it as {what}"),
            });
        }
        // A tensor read from a file has the bytes its shape needs (the reader checked); one
        // built by hand may not, and the matrices built from it must not be short.
        let bytes = self
            .shape
            .iter()
            .try_fold(dtype.bitsize() / 8, |n, &d| n.checked_mul(d));
        if bytes != Some(self.data.len()) {
            return Err(Error::TensorData {
                tensor: name.to_string(),
                dtype: format!("{:?}", self.dtype),
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
            ckpt.tensors["layer.scales"]
                .i32_matrix("layer.scales")
                .unwrap_err()
                .to_string(),
            "tensor \"layer.scales\" is F16 with shape [1, 2]; this layout stores it as an int32 matrix"
        );
    }

    #[test]
    fn refuses_to_overwrite_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.safetensors");
        sample().write_new(&path).unwrap();
        let before = std::fs::read(&path).unwrap();
        let err = sample().write_new(&path).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{} already exists; refusing to overwrite it (nothing was written)",
                path.display()
            )
        );
        assert_eq!(std::fs::read(&path).unwrap(), before);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
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
        let err = tensor.i32_matrix("short").unwrap_err();
        assert!(
            matches!(&err, Error::TensorData { tensor, found: 12, .. } if tensor == "short"),
            "{err:?}"
        );
    }
}
