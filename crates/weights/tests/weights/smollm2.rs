//! Real tensors of the SmolLM2-135M GGUF dequantize bit for bit as gguf-py 0.19 dequantizes
//! them. The oracle's outputs come from `tests/data/smollm2/make_fixture.py` (see its top
//! comment for how to regenerate them).

use std::path::{Path, PathBuf};

use gguf_file::{GgufFile, TensorType};
use half::f16;
use sha2::{Digest, Sha256};
use weights::gguf::{self, BlockQ4_0, BlockQ8_0, q4_1};

fn data(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/smollm2")
        .join(path)
}

fn json(path: &str) -> serde_json::Map<String, serde_json::Value> {
    let text = std::fs::read_to_string(data(path)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A tensor's stored bytes as f32 values, with this crate's readers (F32 and F16 as they are).
fn dequantize(ty: TensorType, bytes: &[u8]) -> Vec<f32> {
    match ty {
        TensorType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        TensorType::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes(c.try_into().unwrap()).to_f32())
            .collect(),
        TensorType::Q4_0 => gguf::dequantize(&gguf::from_bytes::<BlockQ4_0>(bytes).unwrap()),
        TensorType::Q8_0 => gguf::dequantize(&gguf::from_bytes::<BlockQ8_0>(bytes).unwrap()),
        TensorType::Q4_1 => q4_1::dequantize(&q4_1::from_bytes(bytes).unwrap()),
        other => panic!("no dequantizer for {other}"),
    }
}

fn type_named(name: &str) -> TensorType {
    match name {
        "F32" => TensorType::F32,
        "F16" => TensorType::F16,
        "Q4_0" => TensorType::Q4_0,
        "Q4_1" => TensorType::Q4_1,
        "Q8_0" => TensorType::Q8_0,
        other => panic!("fixture names type {other}"),
    }
}

fn sha256_f32(values: &[f32]) -> String {
    let mut bytes = Vec::with_capacity(values.len() * 4);
    for v in values {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    hex::encode(Sha256::digest(&bytes))
}

/// Rows of Q8_0, Q4_1 and F32 tensors copied out of the file (committed, so this runs without
/// the model): same bits as gguf-py's `gguf.quants.dequantize`.
#[test]
fn sampled_rows_dequantize_to_gguf_py_bits() {
    let rows = json("rows.json");
    let mut types = Vec::new();
    for (name, entry) in &rows {
        let ty = type_named(entry["type"].as_str().unwrap());
        let n_rows = entry["rows"].as_array().unwrap().len();
        let ne0 = entry["ne0"].as_u64().unwrap() as usize;
        let stored = std::fs::read(data(&format!("rows/{name}.bin"))).unwrap();
        let expected = std::fs::read(data(&format!("rows/{name}.f32"))).unwrap();
        let ours = dequantize(ty, &stored);
        assert_eq!(ours.len(), n_rows * ne0, "{name}");
        let ours: Vec<u8> = ours.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert!(
            ours == expected,
            "{name}: dequantized bits differ from gguf-py's"
        );
        types.push(ty);
    }
    // The fixture covers both quantized types of the file and a plain f32 tensor.
    for ty in [TensorType::Q8_0, TensorType::Q4_1, TensorType::F32] {
        assert!(types.contains(&ty), "{ty} missing from rows.json");
    }
}

/// The SmolLM2 GGUF, fetched by `scripts/fetch-models` on first use.
fn smollm2_path() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cache = match std::env::var_os("KVPACK_MODELS") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => root.join("model-cache"),
    };
    let path = cache.join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        let status = std::process::Command::new(root.join("scripts/fetch-models"))
            .status()
            .expect("run scripts/fetch-models");
        assert!(status.success(), "scripts/fetch-models failed");
    }
    path
}

/// Every tensor of the file, read with gguf-file and dequantized here, hashes as gguf-py's
/// dequantization does (`hashes.json`), with the same type and dims.
#[test]
fn every_tensor_of_the_file_dequantizes_to_gguf_py_bits() {
    let hashes = json("hashes.json");
    let bytes = gguf_file::read_file(smollm2_path()).unwrap();
    let file = GgufFile::parse(&bytes).unwrap();
    assert_eq!(file.tensors().len(), hashes.len());
    let mut mismatches = Vec::new();
    for t in file.tensors() {
        let entry = &hashes[t.name];
        assert_eq!(
            t.ty,
            type_named(entry["type"].as_str().unwrap()),
            "{}",
            t.name
        );
        let dims: Vec<u64> = entry["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(t.dims, dims, "{}", t.name);
        let values = dequantize(t.ty, file.tensor_bytes(t).unwrap());
        assert_eq!(values.len() as u64, t.n_elements(), "{}", t.name);
        if sha256_f32(&values) != entry["sha256"].as_str().unwrap() {
            mismatches.push(t.name);
        }
    }
    assert!(mismatches.is_empty(), "differ from gguf-py: {mismatches:?}");
}
