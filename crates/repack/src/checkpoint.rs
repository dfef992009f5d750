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

use crate::error::{Error, Result};

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
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(Error::io(path))?;
        Self::from_bytes(&bytes).map_err(|source| Error::SafeTensors {
            path: path.to_path_buf(),
            source,
        })
    }

    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<Self, safetensors::SafeTensorError> {
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
        let bytes = self.to_bytes().map_err(|source| Error::SafeTensors {
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
}
