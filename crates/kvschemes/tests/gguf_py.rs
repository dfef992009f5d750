//! llama.cpp's cache types on real SmolLM2 keys and values, byte for byte against gguf-py's
//! `quants.quantize` (q4_0, q4_1, q5_0, q8_0) and against the C rule of iq4_nl written out in
//! NumPy, with and without the rotation: tests/data/gguf_py.json, made by
//! tests/data/make_fixture.py from evidence/real-smollm2/arrays.npz.

use std::fs::File;
use std::path::PathBuf;

use kvschemes::hadamard::Hadamard;
use kvschemes::llamacpp::CacheType;
use ndarray::Array2;
use ndarray_npy::NpzReader;
use sha2::{Digest, Sha256};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn cache_blocks_of_real_keys_and_values_are_gguf_pys() {
    let fixture: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("crates/kvschemes/tests/data/gguf_py.json")).unwrap(),
    )
    .unwrap();
    let mut npz =
        NpzReader::new(File::open(root().join("evidence/real-smollm2/arrays.npz")).unwrap())
            .unwrap();
    let arrays: Vec<Array2<f32>> = fixture["arrays"]
        .as_array()
        .unwrap()
        .iter()
        .map(|name| {
            npz.by_name(&format!("{}.npy", name.as_str().unwrap()))
                .unwrap()
        })
        .collect();
    let h = Hadamard::new(64).unwrap();
    let mut checked = 0;
    for rotate in [false, true] {
        for ty in CacheType::ALL {
            let mut digest = Sha256::new();
            for x in &arrays {
                assert_eq!(x.ncols(), 64);
                for row in x.outer_iter() {
                    let row = row.to_vec();
                    let row = if rotate { h.apply(&row) } else { row };
                    let mut blocks = Vec::new();
                    ty.quantize_row(&row, &mut blocks, &mut [0f32; 64]);
                    digest.update(&blocks);
                }
            }
            let key = format!("{ty}{}", if rotate { "+rot" } else { "" });
            assert_eq!(
                hex::encode(digest.finalize()),
                fixture["sha256"][&key].as_str().unwrap(),
                "{key}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 10);
}

/// Softmax attention of each query row over keys and values, in f64.
fn attention(q: &Array2<f32>, k: &Array2<f32>, v: &Array2<f32>) -> Array2<f64> {
    let scale = 1.0 / (q.ncols() as f64).sqrt();
    let mut out = Array2::<f64>::zeros((q.nrows(), v.ncols()));
    for (i, qi) in q.outer_iter().enumerate() {
        let scores: Vec<f64> = k
            .outer_iter()
            .map(|kj| {
                qi.iter()
                    .zip(kj)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
        let total: f64 = weights.iter().sum();
        for (w, vj) in weights.iter().zip(v.outer_iter()) {
            for (o, x) in out.row_mut(i).iter_mut().zip(vj) {
                *o += w / total * f64::from(*x);
            }
        }
    }
    out
}

#[test]
fn the_rotation_alone_leaves_real_attention_unchanged_to_float_precision() {
    let mut npz =
        NpzReader::new(File::open(root().join("evidence/real-smollm2/arrays.npz")).unwrap())
            .unwrap();
    let h = Hadamard::new(64).unwrap();
    let rotated = |x: &Array2<f32>| {
        let flat: Vec<f32> = x.outer_iter().flat_map(|r| h.apply(&r.to_vec())).collect();
        Array2::from_shape_vec(x.dim(), flat).unwrap()
    };
    for layer in [0, 15, 29] {
        let get = |npz: &mut NpzReader<File>, side: &str| -> Array2<f32> {
            npz.by_name(&format!("t0_n512_l{layer}_h0_{side}.npy"))
                .unwrap()
        };
        let (q, k, v) = (get(&mut npz, "q"), get(&mut npz, "k"), get(&mut npz, "v"));
        let plain = attention(&q, &k, &v);
        // llama.cpp: scores of H q against H k, output of H v multiplied by H again.
        let through = attention(&rotated(&q), &rotated(&k), &rotated(&v)).mapv(|x| x as f32);
        let back = rotated(&through);
        for (a, b) in plain.iter().zip(back.iter()) {
            assert!(
                (a - f64::from(*b)).abs() <= 1e-5 * a.abs().max(1.0),
                "layer {layer}: {a} vs {b}"
            );
        }
    }
}
