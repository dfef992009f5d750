use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use half::f16;
use ndarray::Array2;
use safetensors::{Dtype, SafeTensors};
use sha2::{Digest, Sha256};
use weights::LogicalWeights;

/// A file under `tests/data/formats`.
pub fn data(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/formats")
        .join(path)
}

/// A safetensors file's tensors as (dtype, shape, bytes), read with the `safetensors` crate
/// directly rather than this crate's reader.
pub fn raw_tensors(path: &PathBuf) -> BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    SafeTensors::deserialize(&bytes)
        .unwrap()
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            (
                name,
                (view.dtype(), view.shape().to_vec(), view.data().to_vec()),
            )
        })
        .collect()
}

/// SHA-256 of float32 values as little-endian bytes in row-major order (as `expected.json`).
pub fn weight_hash(weights: &Array2<f32>) -> String {
    let mut hasher = Sha256::new();
    for value in weights.iter() {
        hasher.update(value.to_le_bytes());
    }
    hex::encode(hasher.finalize())
}

/// The hash every library reader of `case` agreed on.
pub fn expected_hash(case: &str) -> String {
    let text = std::fs::read_to_string(data("expected.json")).unwrap();
    let expected: serde_json::Value = serde_json::from_str(&text).unwrap();
    expected[case]["weight_sha256"]
        .as_str()
        .unwrap_or_else(|| panic!("no expected hash for {case}"))
        .to_string()
}

/// The logical matrix a fixture was packed from (`inputs/<case>.safetensors`): codes, true zero
/// points, scales and, for act-order cases, g_idx.
pub fn logical_input(case: &str, bits: u32, group_size: usize) -> LogicalWeights {
    let tensors = raw_tensors(&data(&format!("inputs/{case}.safetensors")));
    let matrix_u8 = |name: &str| {
        let (_, shape, bytes) = &tensors[name];
        Array2::from_shape_vec((shape[0], shape[1]), bytes.clone()).unwrap()
    };
    let (_, shape, bytes) = &tensors["scales"];
    let scales = Array2::from_shape_vec(
        (shape[0], shape[1]),
        bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]))
            .collect(),
    )
    .unwrap();
    let (codes, zeros) = (matrix_u8("codes"), matrix_u8("zeros"));
    match tensors.get("g_idx") {
        Some((_, _, bytes)) => {
            let g_idx = bytes
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes(b.try_into().unwrap()) as u32)
                .collect();
            LogicalWeights::new(bits, group_size, codes, scales, zeros, g_idx).unwrap()
        }
        None => {
            LogicalWeights::with_sequential_groups(bits, group_size, codes, scales, zeros).unwrap()
        }
    }
}

/// A `Vec<u8>` of i32 values, little-endian.
pub fn i32_bytes<'a>(values: impl IntoIterator<Item = &'a i32>) -> Vec<u8> {
    values.into_iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A `Vec<u8>` of f16 values, little-endian.
pub fn f16_bytes<'a>(values: impl IntoIterator<Item = &'a f16>) -> Vec<u8> {
    values.into_iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A version 1.0 `.npy` file with `header` (a dict literal) padded as numpy pads it, then `data`.
pub fn npy_bytes(header: &str, data: &[u8]) -> Vec<u8> {
    let mut text = header.as_bytes().to_vec();
    let total = 10 + text.len() + 1;
    text.resize(text.len() + (64 - total % 64) % 64, b' ');
    text.push(b'\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend(u16::try_from(text.len()).unwrap().to_le_bytes());
    out.extend(text);
    out.extend(data);
    out
}

/// The header numpy writes for a C-order float32 array of `shape` (a tuple literal).
pub fn f4_header(shape: &str) -> String {
    format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}")
}

/// Runs the real `repack` binary.
pub fn repack(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_repack"))
        .args(args)
        .output()
        .expect("the repack binary runs")
}

/// Runs `repack` and requires success, returning stdout.
pub fn succeeds(args: &[&str]) -> String {
    let output = repack(args);
    assert!(
        output.status.success(),
        "repack {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A path as an argument.
pub fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}
