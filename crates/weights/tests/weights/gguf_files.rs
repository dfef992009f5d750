//! Real tensors of the SmolLM2-135M and Gemma 3 270M GGUF files dequantize bit for bit as
//! gguf-py 0.19 dequantizes them, through [`weights::gguf::dequantize_tensor`]. The oracle's
//! outputs come from `tests/data/make_gguf_fixture.py` (see its top comment for how to
//! regenerate them).

use std::path::{Path, PathBuf};

use gguf_file::{GgufFile, TensorType};
use sha2::{Digest, Sha256};
use weights::gguf::dequantize_tensor;

/// The models with a fixture: folder under `tests/data/` and file under the model cache.
const SMOLLM2: (&str, &str) = ("smollm2", "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
const GEMMA3: (&str, &str) = ("gemma3", "gemma3/gemma-3-270m-q4_k_m.gguf");

fn data(model: &str, path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(model)
        .join(path)
}

fn json(model: &str, path: &str) -> serde_json::Map<String, serde_json::Value> {
    let text = std::fs::read_to_string(data(model, path)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A stored tensor's values, with this crate's one dispatch over ggml types.
fn dequantize(ty: TensorType, bytes: &[u8], elements: usize) -> Vec<f32> {
    let mut out = vec![0f32; elements];
    dequantize_tensor(ty, bytes, &mut out).unwrap_or_else(|e| panic!("{ty}: {e}"));
    out
}

fn type_named(name: &str) -> TensorType {
    match name {
        "F32" => TensorType::F32,
        "F16" => TensorType::F16,
        "Q4_0" => TensorType::Q4_0,
        "Q4_1" => TensorType::Q4_1,
        "Q5_0" => TensorType::Q5_0,
        "Q8_0" => TensorType::Q8_0,
        "Q4_K" => TensorType::Q4K,
        "Q6_K" => TensorType::Q6K,
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

/// Rows of tensors copied out of a model's file (committed, so this runs without the model):
/// the same bits as gguf-py's `gguf.quants.dequantize`; returns the types they cover.
fn sampled_rows_dequantize_to_gguf_py_bits(model: &str) -> Vec<TensorType> {
    let rows = json(model, "rows.json");
    let mut types = Vec::new();
    for (name, entry) in &rows {
        let ty = type_named(entry["type"].as_str().unwrap());
        let n_rows = entry["rows"].as_array().unwrap().len();
        let ne0 = entry["ne0"].as_u64().unwrap() as usize;
        let stored = std::fs::read(data(model, &format!("rows/{name}.bin"))).unwrap();
        let expected = std::fs::read(data(model, &format!("rows/{name}.f32"))).unwrap();
        let ours = dequantize(ty, &stored, n_rows * ne0);
        assert_eq!(ours.len(), n_rows * ne0, "{name}");
        let ours: Vec<u8> = ours.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert!(
            ours == expected,
            "{name}: dequantized bits differ from gguf-py's"
        );
        types.push(ty);
    }
    types
}

/// SmolLM2's rows cover both quantized types of its file and a plain f32 tensor.
#[test]
fn smollm2_rows_dequantize_to_gguf_py_bits() {
    let types = sampled_rows_dequantize_to_gguf_py_bits(SMOLLM2.0);
    for ty in [TensorType::Q8_0, TensorType::Q4_1, TensorType::F32] {
        assert!(types.contains(&ty), "{ty} missing from rows.json");
    }
}

/// Gemma 3's rows cover every type of its file: Q8_0, Q5_0, Q4_K, Q6_K and F32.
#[test]
fn gemma3_rows_dequantize_to_gguf_py_bits() {
    let types = sampled_rows_dequantize_to_gguf_py_bits(GEMMA3.0);
    for ty in [
        TensorType::Q8_0,
        TensorType::Q5_0,
        TensorType::Q4K,
        TensorType::Q6K,
        TensorType::F32,
    ] {
        assert!(types.contains(&ty), "{ty} missing from rows.json");
    }
}

/// A model's GGUF file, fetched by `scripts/fetch-models` on first use.
fn model_path(file: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cache = match std::env::var_os("KVPACK_MODELS") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => root.join("model-cache"),
    };
    let path = cache.join(file);
    if !path.exists() {
        let status = std::process::Command::new(root.join("scripts/fetch-models"))
            .status()
            .expect("run scripts/fetch-models");
        assert!(status.success(), "scripts/fetch-models failed");
    }
    path
}

/// Every tensor of a model's file, read with gguf-file and dequantized here, hashes as gguf-py's
/// dequantization does (`hashes.json`), with the same type and dims.
fn every_tensor_dequantizes_to_gguf_py_bits((model, file): (&str, &str)) {
    let hashes = json(model, "hashes.json");
    let bytes = gguf_file::read_file(model_path(file)).unwrap();
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
        let elements = usize::try_from(t.n_elements()).unwrap();
        let values = dequantize(t.ty, file.tensor_bytes(t).unwrap(), elements);
        assert_eq!(values.len() as u64, t.n_elements(), "{}", t.name);
        if sha256_f32(&values) != entry["sha256"].as_str().unwrap() {
            mismatches.push(t.name);
        }
    }
    assert!(mismatches.is_empty(), "differ from gguf-py: {mismatches:?}");
}

#[test]
fn every_smollm2_tensor_dequantizes_to_gguf_py_bits() {
    every_tensor_dequantizes_to_gguf_py_bits(SMOLLM2);
}

/// All 236 tensors: Q8_0, Q5_0, Q4_K, Q6_K and F32.
#[test]
fn every_gemma3_tensor_dequantizes_to_gguf_py_bits() {
    every_tensor_dequantizes_to_gguf_py_bits(GEMMA3);
}
