//! `repack quantize` / `dequantize` / `inspect` on the files quantize writes: GGUF (against
//! gguf-py's own reading of them, recorded in `tests/data/gguf/gguf_py.json` by the script
//! beside it) and NF4 safetensors (against the `safetensors` crate's reading and bitsandbytes'
//! bytes); bare block files only with `--raw`; and every refusal by its whole message, with
//! nothing written.

use std::path::{Path, PathBuf};

use gguf_file::TensorType;
use gguf_file::writer::GgufWriter;
use ndarray::Array2;
use safetensors::Dtype;
use weights::nf4::NF4_LEVELS;

use crate::support::{
    data, expected_hash, f4_header, npy_bytes, path, raw_tensors, repack, succeeds, weight_hash,
};

/// Runs `repack`, requires a refusal (exit 1, not a panic) that wrote nothing to `output` and
/// left no temporary file beside it, and returns stderr.
fn refused(args: &[&str], output: &Path) -> String {
    let out = repack(args);
    assert_eq!(
        out.status.code(),
        Some(1),
        "repack {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !output.exists(),
        "repack {args:?} wrote {}",
        output.display()
    );
    if let Some(dir) = output.parent() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let name = entry.unwrap().file_name();
            assert!(
                !name.to_string_lossy().starts_with(".repack-"),
                "repack {args:?} left {name:?}"
            );
        }
    }
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn gguf_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/gguf")
        .join(name)
}

fn pattern() -> PathBuf {
    data("inputs/gguf_pattern.npy")
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

fn read_npy(path: &Path) -> Array2<f32> {
    ndarray_npy::read_npy(path).unwrap()
}

#[test]
fn gguf_files_match_what_gguf_py_read() {
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(gguf_dir("gguf_py.json")).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (format, ty, library) in [
        ("q4_0", "Q4_0", "gguf_pattern_Q4_0"),
        ("q8_0", "Q8_0", "gguf_pattern_Q8_0"),
        ("q4_1", "Q4_1", "gguf_pattern_Q4_1"),
    ] {
        let name = format!("pattern_{format}.gguf");
        let committed = std::fs::read(gguf_dir(&name)).unwrap();
        let ours = dir.path().join(&name);
        succeeds(&["quantize", "--to", format, path(&pattern()), path(&ours)]);
        assert!(
            std::fs::read(&ours).unwrap() == committed,
            "{name}: quantize no longer writes the committed file (if on purpose, rerun \
             tests/data/gguf/make_gguf_fixture.py with the new binary)"
        );
        let seen = &fixture[name.as_str()];
        assert_eq!(
            seen["file_sha256"],
            sha256_hex(&committed),
            "{name}: the fixture was recorded from another file"
        );
        assert_eq!(
            seen["gguf_py_writer_identical"], true,
            "{name}: gguf-py's GGUFWriter writes another file for the same tensor and metadata"
        );
        // What gguf-py read: one tensor, named, typed and shaped as written (ne order).
        let tensor = &seen["tensors"][0];
        assert_eq!(seen["tensors"].as_array().unwrap().len(), 1, "{name}");
        assert_eq!(tensor["name"], "weight", "{name}");
        assert_eq!(tensor["type"], ty, "{name}");
        assert_eq!(tensor["shape"], serde_json::json!([256, 8]), "{name}");
        assert_eq!(tensor["dequantized_shape"], serde_json::json!([8, 256]));
        assert_eq!(
            seen["metadata"],
            serde_json::json!({
                "general.architecture": "kvpack",
                "general.name": "gguf_pattern",
                "kvpack.tool": format!("repack {}", env!("CARGO_PKG_VERSION")),
            }),
            "{name}"
        );
        // The tensor data are exactly the blocks ggml / gguf-py produce for the same input.
        let file = gguf_file::GgufFile::parse(&committed).unwrap();
        let info = file.tensor("weight").unwrap();
        assert_eq!(
            file.tensor_bytes(info).unwrap(),
            std::fs::read(data(&format!("library/{library}.bin"))).unwrap(),
            "{name}: blocks"
        );
        // repack's dequantize gives gguf-py's values, bit for bit.
        let npy = dir.path().join(format!("{format}.npy"));
        let printed = succeeds(&["dequantize", path(&gguf_dir(&name)), path(&npy)]);
        assert!(
            printed.starts_with(&format!("{format} 8 x 256: ")),
            "{printed}"
        );
        let back = read_npy(&npy);
        assert_eq!(
            weight_hash(&back),
            tensor["dequantized_sha256"].as_str().unwrap(),
            "{name}: dequantized"
        );
        assert_eq!(weight_hash(&back), expected_hash(library), "{name}");
    }
}

#[test]
fn inspect_reads_a_gguf_file() {
    let report = succeeds(&["inspect", path(&gguf_dir("pattern_q4_1.gguf"))]);
    let lines: Vec<&str> = report.lines().collect();
    assert_eq!(
        lines[1..],
        [
            format!(
                "metadata: general.architecture=kvpack, general.name=gguf_pattern, \
                 kvpack.tool=repack {}",
                env!("CARGO_PKG_VERSION")
            )
            .as_str(),
            "tensor weight: Q4_1, shape [8, 256] (ggml dims [256, 8]), 1,280 bytes",
            "  5.000 bits/weight = 4.000 codes + 1.000 metadata (1,024 + 256 bytes for 2,048 weights)",
        ]
    );
    assert!(
        lines[0].ends_with("pattern_q4_1.gguf: GGUF v3, 1 tensor"),
        "{report}"
    );
}

#[test]
fn nf4_is_written_in_bitsandbytes_layout_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("w.safetensors");
    let input = data("inputs/nf4_pattern.npy");
    let printed = succeeds(&["quantize", "--to", "nf4", path(&input), path(&out)]);
    assert!(
        printed.starts_with("nf4 8 x 128: 4.500 bits/weight"),
        "{printed}"
    );
    // Read with the safetensors crate itself: the names, dtypes and shapes Linear4bit saves.
    let tensors = raw_tensors(&out);
    let names: Vec<&str> = tensors.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "weight",
            "weight.absmax",
            "weight.quant_map",
            "weight.quant_state.bitsandbytes__nf4"
        ]
    );
    let (dtype, shape, codes) = &tensors["weight"];
    assert_eq!((*dtype, shape.as_slice()), (Dtype::U8, &[512, 1][..]));
    assert_eq!(
        codes,
        &std::fs::read(data("library/nf4_pattern.bin")).unwrap()
    );
    let (dtype, shape, absmax) = &tensors["weight.absmax"];
    assert_eq!((*dtype, shape.as_slice()), (Dtype::F32, &[16][..]));
    assert_eq!(
        absmax,
        &std::fs::read(data("library/nf4_pattern_absmax.bin")).unwrap()
    );
    let (dtype, shape, levels) = &tensors["weight.quant_map"];
    assert_eq!((*dtype, shape.as_slice()), (Dtype::F32, &[16][..]));
    let expected: Vec<u8> = NF4_LEVELS.iter().flat_map(|l| l.to_le_bytes()).collect();
    assert_eq!(levels, &expected);
    let (dtype, _, state) = &tensors["weight.quant_state.bitsandbytes__nf4"];
    assert_eq!(*dtype, Dtype::U8);
    assert_eq!(
        std::str::from_utf8(state).unwrap(),
        // As bitsandbytes' pack_dict_to_tensor (json.dumps) writes it, and as the fixture
        // assembled from bitsandbytes' output holds it.
        r#"{"quant_type": "nf4", "blocksize": 64, "dtype": "float32", "shape": [8, 128]}"#
    );
    assert_eq!(
        state,
        &raw_tensors(&data("proj_nf4.safetensors"))["proj.weight.quant_state.bitsandbytes__nf4"].2
    );
    // inspect reads it as an NF4 layer; dequantize gives bitsandbytes' values.
    let report = succeeds(&["inspect", path(&out)]);
    assert!(
        report.contains("layer (unprefixed): bitsandbytes nf4, block 64, shape [8, 128]"),
        "{report}"
    );
    assert!(
        report.contains("  check: codes and absmax agree"),
        "{report}"
    );
    let npy = dir.path().join("w.npy");
    succeeds(&["dequantize", path(&out), path(&npy)]);
    assert_eq!(weight_hash(&read_npy(&npy)), expected_hash("nf4_pattern"));
    // Another block size is recorded in the state and read back from it.
    let out32 = dir.path().join("w32.safetensors");
    succeeds(&[
        "quantize",
        "--to",
        "nf4",
        "--block-size",
        "32",
        path(&input),
        path(&out32),
    ]);
    let report = succeeds(&["inspect", path(&out32)]);
    assert!(
        report.contains("bitsandbytes nf4, block 32, shape [8, 128]"),
        "{report}"
    );
    let npy32 = dir.path().join("w32.npy");
    succeeds(&["dequantize", path(&out32), path(&npy32)]);
    assert_eq!(read_npy(&npy32).dim(), (8, 128));
}

#[test]
fn dequantize_reads_the_bitsandbytes_layout_fixture() {
    // `proj.weight` and its quant state under a layer prefix, bitsandbytes' bytes.
    let dir = tempfile::tempdir().unwrap();
    let fixture = data("proj_nf4.safetensors");
    let npy = dir.path().join("proj.npy");
    let printed = succeeds(&["dequantize", path(&fixture), path(&npy)]);
    assert!(printed.starts_with("nf4 8 x 128: "), "{printed}");
    assert_eq!(weight_hash(&read_npy(&npy)), expected_hash("nf4_pattern"));
    let npy = dir.path().join("named.npy");
    succeeds(&[
        "dequantize",
        "--tensor",
        "proj.weight",
        path(&fixture),
        path(&npy),
    ]);
    let missing = dir.path().join("none.npy");
    assert_eq!(
        refused(
            &[
                "dequantize",
                "--tensor",
                "weight",
                path(&fixture),
                path(&missing)
            ],
            &missing
        ),
        format!(
            "repack: error: {}: no tensor \"weight\" among its NF4 weights (proj.weight)\n",
            fixture.display()
        )
    );
    // A GPTQ checkpoint holds no NF4 weight.
    let gptq = data("library/gptq_pattern_b4.safetensors");
    assert_eq!(
        refused(&["dequantize", path(&gptq), path(&missing)], &missing),
        format!(
            "repack: error: {}: no bitsandbytes NF4 weight in it (looked for NAME with \
             NAME.quant_state.bitsandbytes__nf4); dequantize reads NF4 safetensors and GGUF \
             files\n",
            gptq.display()
        )
    );
}

#[test]
fn quantize_prints_each_formats_effective_bits() {
    let dir = tempfile::tempdir().unwrap();
    let line = |format: &str, input: &str, ext: &str| {
        let out = dir.path().join(format!("{format}.{ext}"));
        let input = data(&format!("inputs/{input}"));
        succeeds(&["quantize", "--to", format, path(&input), path(&out)])
            .lines()
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        line("q4_0", "gguf_pattern.npy", "gguf"),
        "q4_0 8 x 256: 4.500 bits/weight = 4.000 codes + 0.500 metadata (1,024 + 128 bytes for 2,048 weights)"
    );
    assert_eq!(
        line("q8_0", "gguf_pattern.npy", "gguf"),
        "q8_0 8 x 256: 8.500 bits/weight = 8.000 codes + 0.500 metadata (2,048 + 128 bytes for 2,048 weights)"
    );
    assert_eq!(
        line("q4_1", "gguf_pattern.npy", "gguf"),
        "q4_1 8 x 256: 5.000 bits/weight = 4.000 codes + 1.000 metadata (1,024 + 256 bytes for 2,048 weights)"
    );
    assert_eq!(
        line("nf4", "nf4_pattern.npy", "safetensors"),
        "nf4 8 x 128: 4.500 bits/weight = 4.000 codes + 0.500 metadata (512 + 64 bytes for 1,024 weights)"
    );
}

#[test]
fn flags_that_do_not_apply_are_refused_not_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let input = pattern();
    let gguf = gguf_dir("pattern_q4_0.gguf");
    for format in ["q4_0", "q8_0", "q4_1"] {
        let out = dir.path().join("w.gguf");
        assert_eq!(
            refused(
                &[
                    "quantize",
                    "--to",
                    format,
                    "--block-size",
                    "64",
                    path(&input),
                    path(&out)
                ],
                &out
            ),
            format!(
                "repack: error: --block-size 64 does not apply to {format}: its blocks are \
                 always 32 values (only nf4 has a block size to choose)\n"
            )
        );
    }
    for (format, name, container, ext) in [
        ("q4_0", "w.bin", "a GGUF file", "gguf"),
        ("q8_0", "w.safetensors", "a GGUF file", "gguf"),
        (
            "nf4",
            "w.gguf",
            "a safetensors file in bitsandbytes' layout",
            "safetensors",
        ),
    ] {
        let out = dir.path().join(name);
        assert_eq!(
            refused(
                &["quantize", "--to", format, path(&input), path(&out)],
                &out
            ),
            format!(
                "repack: error: {}: quantize --to {format} writes {container}; name the output \
                 *.{ext}\n",
                out.display()
            )
        );
    }
    let out = dir.path().join("x.npy");
    let without_raw = "without --raw: a GGUF or safetensors file says its own format, shape and \
                       block size (give --raw only for a bare block file)";
    for (flags, flag) in [
        (&["--cols", "256"][..], "--cols 256"),
        (&["--from", "q4_0"][..], "--from q4_0"),
        (&["--block-size", "64"][..], "--block-size 64"),
    ] {
        let mut args = vec!["dequantize"];
        args.extend(flags);
        args.extend([path(&gguf), path(&out)]);
        assert_eq!(
            refused(&args, &out),
            format!("repack: error: {flag} does not apply {without_raw}\n")
        );
    }
    let raw = |extra: &[&str]| {
        let mut args = vec!["dequantize", "--raw"];
        args.extend(extra);
        args.extend([path(&gguf), path(&out)]);
        refused(&args, &out)
    };
    assert_eq!(
        raw(&["--from", "q4_0"]),
        "repack: error: --raw needs --cols C: a bare block file does not say its format or its \
         row length\n"
    );
    assert_eq!(
        raw(&[]),
        "repack: error: --raw needs --from FORMAT and --cols C: a bare block file does not say \
         its format or its row length\n"
    );
    assert_eq!(
        raw(&["--from", "q4_0", "--cols", "256", "--tensor", "weight"]),
        "repack: error: --tensor weight does not apply with --raw: a bare block file holds one \
         unnamed tensor\n"
    );
    assert_eq!(
        raw(&["--from", "q8_0", "--cols", "256", "--block-size", "64"]),
        "repack: error: --block-size 64 does not apply to q8_0: its blocks are always 32 values \
         (only nf4 has a block size)\n"
    );
    assert_eq!(
        raw(&["--from", "q4_0", "--cols", "256"]),
        format!(
            "repack: error: {}: this is a GGUF file, which says its own format and shape; drop \
             --raw, --from, --cols and --block-size\n",
            gguf.display()
        )
    );
}

#[test]
fn bare_block_files_need_raw_and_a_wrong_size_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("w.bin");
    std::fs::write(&bin, [0u8; 512]).unwrap();
    let out = dir.path().join("w.npy");
    assert_eq!(
        refused(&["dequantize", path(&bin), path(&out)], &out),
        format!(
            "repack: error: {}: 512 bytes that are neither a GGUF file (magic \"GGUF\") nor a \
             safetensors file; a bare block file (what repack quantize wrote before it wrote \
             GGUF) is read only with --raw --from FORMAT --cols C\n",
            bin.display()
        )
    );
    let raw = |format: &str, cols: &str| {
        vec![
            "dequantize".to_string(),
            "--raw".into(),
            "--from".into(),
            format.into(),
            "--cols".into(),
            cols.into(),
        ]
    };
    let mut args = raw("q4_0", "64");
    args.extend([path(&bin).to_string(), path(&out).to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(
        refused(&args, &out),
        format!(
            "repack: error: {}: 512 bytes is not a whole number of rows: with --cols 64 a q4_0 \
             row is 2 blocks of 18 bytes = 36 bytes; 512 is 14 rows and 8 bytes; check --from \
             and --cols against what wrote the file\n",
            bin.display()
        )
    );
    // With --raw, the library's own block bytes still read back, for every format.
    for (format, file, cols, case) in [
        ("q4_0", "gguf_pattern_Q4_0.bin", "256", "gguf_pattern_Q4_0"),
        ("q8_0", "gguf_pattern_Q8_0.bin", "256", "gguf_pattern_Q8_0"),
        ("q4_1", "gguf_pattern_Q4_1.bin", "256", "gguf_pattern_Q4_1"),
    ] {
        let npy = dir.path().join(format!("{format}.npy"));
        let mut args = raw(format, cols);
        args.extend([
            path(&data(&format!("library/{file}"))).to_string(),
            path(&npy).to_string(),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        succeeds(&args);
        assert_eq!(
            weight_hash(&read_npy(&npy)),
            expected_hash(case),
            "{format}"
        );
    }
    // Bare blocks that start like a GGUF file ("GG" is a Q4_0 scale of 7.277) or a safetensors
    // one (byte 8 is `{`) but are neither still read with --raw.
    let lookalike = dir.path().join("lookalike.bin");
    let mut block = b"GGUF".to_vec();
    block.extend([0x88; 14]);
    block[8] = b'{';
    std::fs::write(&lookalike, &block).unwrap();
    let npy = dir.path().join("lookalike.npy");
    succeeds(&[
        "dequantize",
        "--raw",
        "--from",
        "q4_0",
        "--cols",
        "32",
        path(&lookalike),
        path(&npy),
    ]);
    assert_eq!(read_npy(&npy).dim(), (1, 32));
    // NF4's bare file: bitsandbytes' codes, then the absmax.
    let nf4 = dir.path().join("nf4.bin");
    let mut bytes = std::fs::read(data("library/nf4_pattern.bin")).unwrap();
    bytes.extend(std::fs::read(data("library/nf4_pattern_absmax.bin")).unwrap());
    std::fs::write(&nf4, &bytes).unwrap();
    let npy = dir.path().join("nf4.npy");
    succeeds(&[
        "dequantize",
        "--raw",
        "--from",
        "nf4",
        "--cols",
        "128",
        path(&nf4),
        path(&npy),
    ]);
    assert_eq!(weight_hash(&read_npy(&npy)), expected_hash("nf4_pattern"));
    bytes.push(0);
    std::fs::write(&nf4, &bytes).unwrap();
    let npy = dir.path().join("nf4b.npy");
    assert_eq!(
        refused(
            &[
                "dequantize",
                "--raw",
                "--from",
                "nf4",
                "--cols",
                "128",
                path(&nf4),
                path(&npy)
            ],
            &npy
        ),
        format!(
            "repack: error: {}: 577 bytes is not a whole number of rows: with --cols 128 and \
             --block-size 64, an nf4 bare file is the codes (half a byte per value) then an f32 \
             absmax per 64 values, and the nearest shorter length of whole rows is 576 bytes; \
             check --cols and --block-size against what wrote the file\n",
            nf4.display()
        )
    );
}

#[test]
fn an_empty_bare_block_file_is_refused_instead_of_written_as_nan_bits() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.bin");
    std::fs::write(&empty, b"").unwrap();
    for format in ["q4_0", "q8_0", "q4_1", "nf4"] {
        let out = dir.path().join(format!("{format}.npy"));
        let args = [
            "dequantize",
            "--raw",
            "--from",
            format,
            "--cols",
            "32",
            path(&empty),
            path(&out),
        ];
        assert_eq!(
            refused(&args, &out),
            format!(
                "repack: error: {}: the file is empty; a {format} block file holds at least one \
                 row (nothing was written)\n",
                empty.display()
            )
        );
    }
}

#[test]
fn npy_inputs_are_refused_saying_what_they_are_and_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("w.gguf");
    let missing = dir.path().join("IN.npy");
    assert_eq!(
        refused(
            &["quantize", "--to", "q4_0", path(&missing), path(&out)],
            &out
        ),
        format!("repack: error: {}: no such file\n", missing.display())
    );
    let float64 = dir.path().join("f8.npy");
    let header = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 32), }";
    std::fs::write(&float64, npy_bytes(header, &[0; 512])).unwrap();
    assert_eq!(
        refused(
            &["quantize", "--to", "q4_0", path(&float64), path(&out)],
            &out
        ),
        format!(
            "repack: error: {}: not a float32 matrix in .npy format: its elements are float64 \
             ('<f8'); quantize needs float32 ('<f4'): convert it with np.save(path, \
             x.astype(np.float32))\n",
            float64.display()
        )
    );
    let vector = dir.path().join("v.npy");
    std::fs::write(&vector, npy_bytes(&f4_header("(64,)"), &[0; 256])).unwrap();
    assert_eq!(
        refused(
            &["quantize", "--to", "q8_0", path(&vector), path(&out)],
            &out
        ),
        format!(
            "repack: error: {}: not a float32 matrix in .npy format: it has 1 dimension (shape \
             [64]); quantize needs a 2-D float32 matrix [rows, cols]: to quantize it as one row, \
             save x.reshape(1, 64)\n",
            vector.display()
        )
    );
}

/// A GGUF file of two Q8_0 tensors: `a` of 1 x 32 and `b` of 2 x 32.
fn two_tensor_gguf(dir: &Path) -> PathBuf {
    let x = Array2::from_shape_fn((2, 32), |(r, c)| r as f32 - c as f32 / 8.0);
    let flat: Vec<f32> = x.iter().copied().collect();
    let blocks = weights::gguf::quantize::<weights::gguf::BlockQ8_0>(&flat, 32).unwrap();
    let bytes = weights::gguf::to_bytes(&blocks);
    let mut w = GgufWriter::new();
    w.add_tensor("a", &[32, 1], TensorType::Q8_0, bytes[..34].to_vec())
        .unwrap();
    w.add_tensor("b", &[32, 2], TensorType::Q8_0, bytes.clone())
        .unwrap();
    let file = dir.join("two.gguf");
    std::fs::write(&file, w.to_bytes()).unwrap();
    file
}

#[test]
fn a_gguf_file_of_several_tensors_needs_tensor_and_lists_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = two_tensor_gguf(dir.path());
    let out = dir.path().join("x.npy");
    assert_eq!(
        refused(&["dequantize", path(&file), path(&out)], &out),
        format!(
            "repack: error: {}: holds 2 tensors (a, b); choose one with --tensor NAME\n",
            file.display()
        )
    );
    assert_eq!(
        refused(
            &["dequantize", "--tensor", "c", path(&file), path(&out)],
            &out
        ),
        format!(
            "repack: error: {}: no tensor \"c\" among its tensors (a, b)\n",
            file.display()
        )
    );
    let printed = succeeds(&["dequantize", "--tensor", "b", path(&file), path(&out)]);
    assert!(printed.starts_with("q8_0 2 x 32: "), "{printed}");
    assert_eq!(read_npy(&out).dim(), (2, 32));
    let report = succeeds(&["inspect", path(&file)]);
    assert!(report.contains("GGUF v3, 2 tensors"), "{report}");
    assert!(
        report.contains("tensor a: Q8_0, shape [1, 32] (ggml dims [32, 1]), 34 bytes"),
        "{report}"
    );
}

#[test]
fn a_truncated_gguf_file_is_refused_clearly_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let whole = std::fs::read(gguf_dir("pattern_q8_0.gguf")).unwrap();
    let out = dir.path().join("x.npy");
    for cut in [6, 30, 100, whole.len() - 1] {
        let file = dir.path().join(format!("cut{cut}.gguf"));
        std::fs::write(&file, &whole[..cut]).unwrap();
        let message = refused(&["dequantize", path(&file), path(&out)], &out);
        let prefix = format!(
            "repack: error: {}: not a readable GGUF file: ",
            file.display()
        );
        assert!(message.starts_with(&prefix), "{cut}: {message}");
        assert_eq!(message.lines().count(), 1, "{message}");
        let inspect = refused(&["inspect", path(&file)], &out);
        assert!(inspect.starts_with(&prefix), "{cut}: {inspect}");
    }
    // Cut inside the tensor data: the tensor's extent is checked against the file's length.
    let file = dir.path().join(format!("cut{}.gguf", whole.len() - 1));
    let message = refused(&["dequantize", path(&file), path(&out)], &out);
    assert!(message.contains("tensor \"weight\""), "{message}");
}

#[test]
fn values_a_block_scale_cannot_hold_are_refused_instead_of_stored_as_inf_or_0() {
    let dir = tempfile::tempdir().unwrap();
    // Row 0 ramps to 1e9, past what an f16 Q4_0 or Q8_0 scale holds (ggml stores d = inf);
    // row 1 is 1e-9 small, where d rounds to 0 (ggml stores 0 and every weight becomes 0).
    let x = Array2::from_shape_fn((2, 32), |(row, col)| {
        let ramp = (col as f32 - 15.5) / 15.5;
        if row == 0 { ramp * 1e9 } else { ramp * 1e-9 }
    });
    let input = dir.path().join("x.npy");
    ndarray_npy::write_npy(&input, &x).unwrap();
    for (format, why) in [
        (
            "q4_0",
            "Q4_0 block 0 (row 0, columns 0..32) spans -1e9 to 1e9: its scale d = 1.25e8 rounds \
             to infinity in f16",
        ),
        (
            "q8_0",
            "Q8_0 block 0 (row 0, columns 0..32) spans -1e9 to 1e9: its scale d = 7.8740155e6 \
             rounds to infinity in f16",
        ),
    ] {
        let out = dir.path().join(format!("{format}.gguf"));
        let message = refused(
            &["quantize", "--to", format, path(&input), path(&out)],
            &out,
        );
        assert!(
            message.starts_with(&format!("repack: error: {}: {why}", input.display())),
            "{message}"
        );
    }
    let small = dir.path().join("small.npy");
    ndarray_npy::write_npy(&small, &x.slice(ndarray::s![1.., ..]).to_owned()).unwrap();
    let out = dir.path().join("small.gguf");
    let message = refused(
        &["quantize", "--to", "q4_0", path(&small), path(&out)],
        &out,
    );
    assert!(
        message.contains(
            "Q4_0 block 0 (row 0, columns 0..32) spans -1e-9 to 1e-9: its scale d = 1.25e-10 \
             rounds to 0 in f16 (smallest positive value 2^-24 = 5.96e-8), so every weight of \
             the block would dequantize to 0; ggml stores it anyway, this tool refuses"
        ),
        "{message}"
    );
}

#[test]
fn non_finite_input_is_refused_naming_the_file_and_element() {
    let dir = tempfile::tempdir().unwrap();
    let mut x = Array2::<f32>::from_elem((2, 64), 0.25);
    x[[1, 3]] = f32::NAN;
    let input = dir.path().join("x.npy");
    ndarray_npy::write_npy(&input, &x).unwrap();
    for (format, ext) in [
        ("q4_0", "gguf"),
        ("q8_0", "gguf"),
        ("q4_1", "gguf"),
        ("nf4", "safetensors"),
    ] {
        let out = dir.path().join(format!("{format}.{ext}"));
        assert_eq!(
            refused(
                &["quantize", "--to", format, path(&input), path(&out)],
                &out
            ),
            format!(
                "repack: error: {}: non-finite input: element [1, 3] is NaN; the quantizers need \
                 finite values\n",
                input.display()
            ),
            "{format}"
        );
    }
}

#[test]
fn unknown_format_names_are_listed() {
    for name in ["q4_k", "gptq"] {
        let out = repack(&["quantize", "--to", name, "in.npy", "out.gguf"]);
        let message = String::from_utf8_lossy(&out.stderr);
        assert!(
            message.contains(&format!(
                "unknown format \"{name}\": quantize writes q4_0, q8_0, q4_1 (GGUF) or nf4 \
                 (safetensors); gptq, gptq_v2 and awq come from calibrating quantizers and are \
                 repacked with convert"
            )),
            "{message}"
        );
        assert_eq!(out.status.code(), Some(2));
    }
}

/// A GGUF file of one tensor per read-only block type, from the `weights` crate's committed
/// blocks (11 rows of one block each), and gguf-py's values for each (see
/// `crates/weights/tests/data/make_block_fixture.py`).
/// A tensor's name (its type's), row length and gguf-py's values as bits.
type Expected = (&'static str, usize, Vec<u32>);

fn read_only_types_gguf(dir: &Path) -> (PathBuf, Vec<Expected>) {
    let blocks = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../weights/tests/data/blocks");
    let mut w = GgufWriter::new();
    let mut expected = Vec::new();
    for (name, ty, cols) in [
        ("Q5_0", TensorType::Q5_0, 32),
        ("Q5_1", TensorType::Q5_1, 32),
        ("Q4_K", TensorType::Q4K, 256),
        ("Q5_K", TensorType::Q5K, 256),
        ("Q6_K", TensorType::Q6K, 256),
    ] {
        let bytes = std::fs::read(blocks.join(format!("{name}.bin"))).unwrap();
        w.add_tensor(name, &[cols as u64, 11], ty, bytes).unwrap();
        let values = std::fs::read(blocks.join(format!("{name}.f32"))).unwrap();
        let bits = values
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        expected.push((name, cols, bits));
    }
    let file = dir.join("read_only.gguf");
    std::fs::write(&file, w.to_bytes()).unwrap();
    (file, expected)
}

#[test]
fn dequantize_and_inspect_read_k_quants_and_q5_as_gguf_py_does() {
    let dir = tempfile::tempdir().unwrap();
    let (file, expected) = read_only_types_gguf(dir.path());
    for (name, cols, bits) in expected {
        let out = dir.path().join(format!("{name}.npy"));
        let printed = succeeds(&["dequantize", "--tensor", name, path(&file), path(&out)]);
        assert!(
            printed.starts_with(&format!("{name} 11 x {cols}: ")),
            "{printed}"
        );
        let x = read_npy(&out);
        assert_eq!(x.dim(), (11, cols));
        let ours: Vec<u32> = x.iter().map(|v| v.to_bits()).collect();
        assert!(ours == bits, "{name}: values differ from gguf-py's");
    }
    let report = succeeds(&["inspect", path(&file)]);
    for line in [
        "tensor Q4_K: Q4_K, shape [11, 256] (ggml dims [256, 11]), 1,584 bytes\n  4.500 bits/weight",
        "tensor Q5_K: Q5_K, shape [11, 256] (ggml dims [256, 11]), 1,936 bytes\n  5.500 bits/weight",
        "tensor Q6_K: Q6_K, shape [11, 256] (ggml dims [256, 11]), 2,310 bytes\n  6.562 bits/weight",
        "tensor Q5_0: Q5_0, shape [11, 32] (ggml dims [32, 11]), 242 bytes\n  5.500 bits/weight",
        "tensor Q5_1: Q5_1, shape [11, 32] (ggml dims [32, 11]), 264 bytes\n  6.000 bits/weight",
    ] {
        assert!(report.contains(line), "{line}\nnot in\n{report}");
    }
}

#[test]
fn a_k_quant_block_with_a_nan_scale_is_refused_by_name_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../weights/tests/data/blocks");
    let mut bytes = std::fs::read(blocks.join("Q6_K.bin")).unwrap();
    bytes[2 * 210 + 208..2 * 210 + 210].copy_from_slice(&[0x00, 0x7E]); // block 2's d: NaN
    let mut w = GgufWriter::new();
    w.add_tensor("w", &[256, 11], TensorType::Q6K, bytes)
        .unwrap();
    let file = dir.path().join("nan.gguf");
    std::fs::write(&file, w.to_bytes()).unwrap();
    let out = dir.path().join("x.npy");
    assert_eq!(
        refused(&["dequantize", path(&file), path(&out)], &out),
        format!(
            "repack: error: {}: Q6_K block 2 has scale d = NaN; a stored scale must be finite\n",
            file.display()
        )
    );
    // A type with no dequantizer is named with the ones there are.
    let mut w = GgufWriter::new();
    w.add_tensor("w", &[256, 1], TensorType::Q2K, vec![0; 84])
        .unwrap();
    let file = dir.path().join("q2k.gguf");
    std::fs::write(&file, w.to_bytes()).unwrap();
    assert_eq!(
        refused(&["dequantize", path(&file), path(&out)], &out),
        format!(
            "repack: error: {}: tensor \"w\" is Q2_K; dequantize reads F32, F16, BF16, Q4_0, \
             Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K\n",
            file.display()
        )
    );
}
