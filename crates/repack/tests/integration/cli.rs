//! Runs the real `repack` binary on the fixtures and on checkpoints built here, and checks what
//! it prints, what it writes and what it refuses (by message, with nothing written).

use std::path::{Path, PathBuf};
use std::process::Output;

use half::f16;
use ndarray::Array2;
use repack::checkpoint::{Checkpoint, Tensor};
use repack::files::{read_checkpoint, write_checkpoint};
use repack::layers::find_layers;
use repack::{layer_io, metadata};
use weights::gptq::{self, ZeroConvention};
use weights::transcode::PackedLayer;
use weights::{LogicalWeights, WeightFormat};

use crate::support::{data, expected_hash, path, raw_tensors, repack, succeeds, weight_hash};

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs `repack` and requires a refusal (a non-zero exit that is not a panic's 101), returning
/// stderr.
fn fails(args: &[&str]) -> String {
    let output = repack(args);
    assert!(
        !output.status.success(),
        "repack {args:?} should have failed:\n{}",
        stdout(&output)
    );
    assert_ne!(
        output.status.code(),
        Some(101),
        "repack {args:?} panicked:\n{}",
        stderr(&output)
    );
    stderr(&output)
}

/// The arguments of `repack convert --from FROM --to TO --group-size G IN OUT`.
fn convert_args<'a>(
    from: &'a str,
    to: &'a str,
    group_size: &'a str,
    input: &'a str,
    output: &'a str,
) -> [&'a str; 9] {
    [
        "convert",
        "--from",
        from,
        "--to",
        to,
        "--group-size",
        group_size,
        input,
        output,
    ]
}

/// `repack convert ...`, which must succeed; its stdout.
fn convert_ok(from: &str, to: &str, group_size: &str, input: &str, output: &str) -> String {
    succeeds(&convert_args(from, to, group_size, input, output))
}

/// `repack convert ...`, which must fail; its stderr.
fn convert_fails(from: &str, to: &str, group_size: &str, input: &str, output: &str) -> String {
    fails(&convert_args(from, to, group_size, input, output))
}

/// The only layer of a checkpoint, read as `format`.
fn only_layer(file: &Path, format: WeightFormat, group_size: usize) -> PackedLayer {
    let ckpt = read_checkpoint(file).unwrap();
    let found = find_layers(&ckpt).unwrap();
    assert_eq!(found.layers.len(), 1);
    let layer = &found.layers[0];
    let logical = metadata::logical_shape(&ckpt.metadata, &layer.prefix).unwrap();
    layer_io::read_integer_layer(layer, format, None, group_size, logical).unwrap()
}

/// A copy of a fixture in `dir`, edited.
fn edited_fixture(dir: &Path, fixture: &str, edit: impl FnOnce(&mut Checkpoint)) -> PathBuf {
    let mut ckpt = read_checkpoint(&data(fixture)).unwrap();
    edit(&mut ckpt);
    let edited = dir.join("edited.safetensors");
    write_checkpoint(&ckpt, &edited).unwrap();
    edited
}

fn write_layer(file: &Path, prefix: &str, layer: &PackedLayer, metadata: &[(&str, &str)]) {
    let mut ckpt = Checkpoint::default();
    ckpt.tensors.extend(layer_io::layer_tensors(prefix, layer));
    ckpt.metadata
        .extend(metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    write_checkpoint(&ckpt, file).unwrap();
}

#[test]
fn awq_to_gptq_writes_autoawqs_own_bytes_and_prints_both_costs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("as_gptq.safetensors");
    let input = data("library/awq_pattern.safetensors");
    let printed = convert_ok("awq", "gptq", "32", path(&input), path(&out));
    assert_eq!(
        printed,
        format!(
            "layer (unprefixed): K=128 N=64, 4-bit, group 32\n\
             \x20 before awq   4.625 bits/weight = 4.000 codes + 0.625 metadata (4,096 + 640 bytes for 8,192 weights)\n\
             \x20 after  gptq  5.125 bits/weight = 4.000 codes + 1.125 metadata (4,096 + 1,152 bytes for 8,192 weights)\n\
             metadata copied unchanged: lib, versions\n\
             1 layer(s) converted awq -> gptq, every weight verified bit-identical; 0 other tensor(s) copied unchanged\n\
             wrote {}\n",
            out.display()
        )
    );
    let ours = raw_tensors(&out);
    let autoawq = raw_tensors(&data("library/awq_pattern_as_gptq.safetensors"));
    assert_eq!(ours, autoawq, "every tensor's dtype, shape and bytes");
    let metadata = read_checkpoint(&out).unwrap().metadata;
    assert_eq!(metadata["checkpoint_format"], "gptq");
    assert_eq!(metadata["format"], "pt");
}

#[test]
fn act_order_gptq_to_awq_and_back_gives_the_original_tensors_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let (awq, back) = (
        dir.path().join("awq.safetensors"),
        dir.path().join("back.safetensors"),
    );
    let input = data("library/gptq_actorder_b4.safetensors");
    // Both outputs as docs/weights.md quotes them.
    let printed = convert_ok("gptq", "awq", "32", path(&input), path(&awq));
    assert_eq!(
        printed,
        format!(
            "layer (unprefixed): K=128 N=64, 4-bit, group 32\n\
             \x20 before gptq  5.125 bits/weight = 4.000 codes + 1.125 metadata (4,096 + 1,152 bytes for 8,192 weights)\n\
             \x20 after  awq   4.625 bits/weight = 4.000 codes + 0.625 metadata (4,096 + 640 bytes for 8,192 weights)\n\
             \x20 rows reordered into contiguous groups: permute the input activations by `input_permutation`\n\
             metadata copied unchanged: lib, versions\n\
             1 layer(s) converted gptq -> awq, every weight verified bit-identical; 0 other tensor(s) copied unchanged\n\
             wrote {}\n",
            awq.display()
        )
    );
    let printed = convert_ok("awq", "gptq", "32", path(&awq), path(&back));
    assert_eq!(
        printed,
        format!(
            "layer (unprefixed): K=128 N=64, 4-bit, group 32\n\
             \x20 before awq   4.625 bits/weight = 4.000 codes + 0.625 metadata (4,096 + 640 bytes for 8,192 weights)\n\
             \x20 after  gptq  5.125 bits/weight = 4.000 codes + 1.125 metadata (4,096 + 1,152 bytes for 8,192 weights)\n\
             \x20 rows put back in their original order from the recorded `input_permutation`, g_idx with them: no input permutation needed\n\
             metadata copied unchanged: lib, versions\n\
             1 layer(s) converted awq -> gptq, every weight verified bit-identical; 0 other tensor(s) copied unchanged\n\
             wrote {}\n",
            back.display()
        )
    );
    // The rows are back where AutoGPTQ put them, with its scattered g_idx: the same qweight,
    // qzeros, scales and g_idx bytes, and no permutation left for a loader to ignore.
    assert_eq!(raw_tensors(&back), raw_tensors(&input));
    let metadata = read_checkpoint(&back).unwrap().metadata;
    assert!(!metadata.contains_key("input_permutation"), "{metadata:?}");
    let weights = only_layer(&back, WeightFormat::Gptq, 32)
        .unpack()
        .unwrap()
        .dequantize();
    assert_eq!(weight_hash(&weights), expected_hash("gptq_actorder_b4"));
}

/// The act-order fixture converted to AWQ, its `input_permutation` then replaced by `value`.
fn awq_with_permutation(dir: &Path, value: &str) -> PathBuf {
    let awq = dir.join("awq.safetensors");
    let input = data("library/gptq_actorder_b4.safetensors");
    convert_ok("gptq", "awq", "32", path(&input), path(&awq));
    let mut ckpt = read_checkpoint(&awq).unwrap();
    ckpt.metadata
        .insert("input_permutation".into(), value.to_string());
    let edited = dir.join("edited.safetensors");
    write_checkpoint(&ckpt, &edited).unwrap();
    edited
}

#[test]
fn a_malformed_input_permutation_is_refused_instead_of_panicking() {
    let duplicated = format!(
        "[{}]",
        (0..128)
            .map(|k| (k / 2).to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (value, why) in [
        (
            "[0]".to_string(),
            "the row permutation has 1 entries for K = 128 rows",
        ),
        (
            duplicated,
            "the row permutation is not a permutation of rows 0..128: entry 1 is 0, which entry \
             0 already holds",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let edited = awq_with_permutation(dir.path(), &value);
        let out = dir.path().join("out.safetensors");
        for to in ["gptq", "awq"] {
            let message = convert_fails("awq", to, "32", path(&edited), path(&out));
            assert_eq!(
                message,
                format!("repack: error: metadata \"input_permutation\" cannot be used: {why}\n"),
                "--to {to}"
            );
            assert!(!out.exists());
        }
        let output = repack(&["inspect", path(&edited)]);
        assert_eq!(output.status.code(), Some(1));
        assert!(
            stdout(&output).contains(&format!(
                "  check: FAILS: metadata \"input_permutation\" cannot be used: {why}\n"
            )),
            "{}",
            stdout(&output)
        );
        assert_eq!(
            stderr(&output),
            format!(
                "repack: error: {}: 1 layer(s) failed the check (`check: FAILS` above): \
                 (unprefixed)\n",
                edited.display()
            )
        );
    }
}

#[test]
fn the_sources_other_metadata_is_carried_over_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (awq, back) = (
        dir.path().join("awq.safetensors"),
        dir.path().join("back.safetensors"),
    );
    let input = data("library/gptq_actorder_b4.safetensors");
    let printed = convert_ok("gptq", "awq", "32", path(&input), path(&awq));
    assert!(
        printed.contains("\nmetadata copied unchanged: lib, versions\n"),
        "{printed}"
    );
    let source = read_checkpoint(&input).unwrap().metadata;
    let written = read_checkpoint(&awq).unwrap().metadata;
    for key in ["lib", "versions"] {
        assert_eq!(written[key], source[key], "{key}");
    }
    // What convert owns is rewritten, the recorded permutation included; nothing else is added.
    let keys: Vec<&str> = written.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "bits",
            "checkpoint_format",
            "converted_from",
            "format",
            "group_size",
            "input_permutation",
            "lib",
            "quant_method",
            "versions"
        ]
    );
    assert_eq!(written["format"], "pt");
    // Back to GPTQ: the permutation was undone, so its key goes; the others travel on.
    convert_ok("awq", "gptq", "32", path(&awq), path(&back));
    let back = read_checkpoint(&back).unwrap().metadata;
    assert!(!back.contains_key("input_permutation"));
    assert_eq!(back["versions"], source["versions"]);
}

#[test]
fn nf4_to_gptq_is_refused_because_it_needs_requantization() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.safetensors");
    let input = data("proj_nf4.safetensors");
    let why = "converting NF4 to gptq needs requantization: NF4 codes index 16 fixed, non-uniform \
               levels scaled by a per-block absmax, and no integer code with a scale and zero \
               point reproduces them exactly; this tool only converts what it can prove \
               bit-identical, so it refuses";
    // docs/weights.md quotes the --from gptq line.
    for (from, message) in [
        ("gptq", format!("repack: error: layer \"proj\": {why}\n")),
        ("nf4", format!("repack: error: {why}\n")),
    ] {
        assert_eq!(
            convert_fails(from, "gptq", "64", path(&input), path(&out)),
            message,
            "--from {from}"
        );
        assert!(!out.exists());
    }
    let inspected = succeeds(&["inspect", path(&input)]);
    assert!(inspected.contains("layer proj: bitsandbytes nf4, block 64, shape [8, 128]"));
}

/// `proj_nf4.safetensors` with its quant state replaced by `state` under `bitsandbytes__<named>`.
fn nf4_with_state(dir: &Path, named: &str, state: &str) -> PathBuf {
    edited_fixture(dir, "proj_nf4.safetensors", |ckpt| {
        ckpt.tensors
            .remove("proj.weight.quant_state.bitsandbytes__nf4");
        ckpt.tensors.insert(
            format!("proj.weight.quant_state.bitsandbytes__{named}"),
            Tensor {
                dtype: safetensors::Dtype::U8,
                shape: vec![state.len()],
                data: state.as_bytes().to_vec(),
            },
        );
    })
}

#[test]
fn inspect_exits_non_zero_when_an_nf4_check_fails() {
    let dir = tempfile::tempdir().unwrap();
    let input = edited_fixture(dir.path(), "proj_nf4.safetensors", |ckpt| {
        let absmax = ckpt.tensors.get_mut("proj.weight.absmax").unwrap();
        absmax.shape = vec![15];
        absmax.data.truncate(60);
    });
    let output = repack(&["inspect", path(&input)]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stdout(&output)
            .ends_with("  check: FAILS: NF4 absmax for 16 blocks of 64: 60 bytes, expected 64\n"),
        "{}",
        stdout(&output)
    );
    assert_eq!(
        stderr(&output),
        format!(
            "repack: error: {}: 1 layer(s) failed the check (`check: FAILS` above): proj\n",
            input.display()
        )
    );
}

#[test]
fn malformed_quant_state_json_is_an_error_not_an_empty_shape() {
    let dir = tempfile::tempdir().unwrap();
    let input = nf4_with_state(
        dir.path(),
        "nf4",
        "{\"quant_type\": \"nf4\", \"shape\": [8, 128]}",
    );
    let output = repack(&["inspect", path(&input)]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stdout(&output).is_empty(), "no partial report");
    assert_eq!(
        stderr(&output),
        "repack: error: layer \"proj\": quant state \"proj.weight.quant_state.bitsandbytes__nf4\" \
         is unusable: not bitsandbytes' quant-state JSON: missing field `blocksize` at line 1 \
         column 40\n"
    );
}

#[test]
fn an_nf4_shape_whose_element_count_overflows_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let huge = 1usize << (usize::BITS / 2 + 8);
    let state =
        format!("{{\"quant_type\": \"nf4\", \"blocksize\": 64, \"shape\": [{huge}, {huge}]}}");
    let input = nf4_with_state(dir.path(), "nf4", &state);
    let output = repack(&["inspect", path(&input)]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        stderr(&output),
        format!(
            "repack: error: layer \"proj\": the element count of shape [{huge}, {huge}] does not \
             fit in {} bits\n",
            usize::BITS
        )
    );
}

/// A quant-state shape whose product wraps to exactly the codes' count: [2^57 + 8, 128] is
/// 2^64 + 1024 elements, 1024 after the wrap, which is what the fixture's 512 code bytes and 16
/// absmax hold. `dequantize` panicked shaping the codes; now both commands refuse it by name,
/// with nothing written.
#[test]
fn an_nf4_shape_whose_product_wraps_to_the_codes_count_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let rows = (1usize << 57) + 8;
    assert_eq!(rows.wrapping_mul(128), 8 * 128);
    let state = format!(
        "{{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", \
         \"shape\": [{rows}, 128]}}"
    );
    let input = nf4_with_state(dir.path(), "nf4", &state);
    let out = dir.path().join("w.npy");
    let output = repack(&["dequantize", path(&input), path(&out)]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert_eq!(
        stderr(&output),
        format!(
            "repack: error: {}: layer proj: shape {rows} x 128 has more elements than this \
             machine can count (rows x cols overflows)\n",
            input.display()
        )
    );
    assert!(stdout(&output).is_empty());
    assert!(!out.exists());
    let output = repack(&["inspect", path(&input)]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("does not fit in"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn an_fp4_layer_is_flagged_by_name_not_labelled_nf4() {
    let dir = tempfile::tempdir().unwrap();
    let fp4 =
        "{\"quant_type\": \"fp4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [8, 128]}";
    // The state's JSON says fp4 though its name says nf4.
    let mislabelled = nf4_with_state(dir.path(), "nf4", fp4);
    let output = repack(&["inspect", path(&mislabelled)]);
    assert_eq!(output.status.code(), Some(1));
    let printed = stdout(&output);
    assert!(
        printed.contains("layer proj: bitsandbytes fp4, block 64, shape [8, 128]\n"),
        "{printed}"
    );
    assert!(
        printed.ends_with(
            "  check: FAILS: its quant_type is \"fp4\", though the state tensor is named for nf4; \
             this tool reads only nf4 (fp4 codes index a different table), so it does not vouch \
             for this layer\n"
        ),
        "{printed}"
    );
    // A layer bitsandbytes wrote as fp4: found and flagged, never passed through as plain tensors.
    let dir = tempfile::tempdir().unwrap();
    let written_as_fp4 = nf4_with_state(dir.path(), "fp4", fp4);
    let output = repack(&["inspect", path(&written_as_fp4)]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stdout(&output)
            .contains("  check: FAILS: its quant_type is \"fp4\"; this tool reads only nf4"),
        "{}",
        stdout(&output)
    );
    let out = dir.path().join("out.safetensors");
    assert_eq!(
        convert_fails("gptq", "awq", "64", path(&written_as_fp4), path(&out)),
        "repack: error: layer \"proj\": a bitsandbytes \"fp4\" 4-bit layer; this tool reads only \
         nf4, so it refuses the layer rather than copy or label it as something it has not checked\n"
    );
    assert!(!out.exists());
}

#[test]
fn an_existing_output_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("taken.safetensors");
    std::fs::write(&out, b"precious").unwrap();
    let input = data("library/gptq_pattern_b4.safetensors");
    let message = convert_fails("gptq", "awq", "32", path(&input), path(&out));
    assert_eq!(
        message,
        format!(
            "repack: error: {} already exists; refusing to overwrite it (nothing was written)\n",
            out.display()
        )
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"precious");
}

#[test]
fn a_convention_the_file_contradicts_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.safetensors");
    let input = data("library/gptq_pattern_b4_v2.safetensors");
    let message = convert_fails("gptq", "awq", "32", path(&input), path(&out));
    assert!(message.contains(
        "its metadata says format = \"gptq_v2\", but --from gptq was given; reading one layout or \
         zero-point convention as another shifts or scrambles every weight"
    ));
    let message = convert_fails(
        "gptq",
        "awq",
        "64",
        path(&data("library/gptq_pattern_b4.safetensors")),
        path(&out),
    );
    assert!(message.contains("metadata says group_size = \"32\", but --group-size 64 was given"));
    assert!(!out.exists());
}

#[test]
fn metadata_bits_that_contradict_the_shapes_are_refused_not_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.safetensors");
    // A 4-bit file whose metadata says 8: before, convert read it as 4-bit and wrote bits = 4.
    let input = edited_fixture(dir.path(), "library/gptq_pattern_b4.safetensors", |ckpt| {
        ckpt.metadata.insert("bits".into(), "8".into());
    });
    let message = convert_fails("gptq", "awq", "32", path(&input), path(&out));
    assert_eq!(
        message,
        "repack: error: layer (unprefixed): the metadata says bits = 8, but its tensor shapes are \
         4-bit (qweight has 16 rows for K = 128 g_idx entries: K * 4 / 32); the codes cannot be \
         read at another width\n"
    );
    assert!(!out.exists());
    let output = repack(&["inspect", path(&input)]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stdout(&output).contains("  check: FAILS: layer (unprefixed): the metadata says bits = 8"),
        "{}",
        stdout(&output)
    );

    // An explicit --bits is held to the shapes the same way.
    let fixture = data("library/gptq_pattern_b4.safetensors");
    let mut args = convert_args("gptq", "awq", "32", path(&fixture), path(&out)).to_vec();
    args.extend(["--bits", "8"]);
    let message = fails(&args);
    assert!(
        message.contains("its metadata says bits = \"4\", but --bits 8 was given"),
        "{message}"
    );
    let unrecorded = dir.path().join("unrecorded.safetensors");
    let mut ckpt = read_checkpoint(&fixture).unwrap();
    ckpt.metadata.remove("bits");
    write_checkpoint(&ckpt, &unrecorded).unwrap();
    let mut args = convert_args("gptq", "awq", "32", path(&unrecorded), path(&out)).to_vec();
    args.extend(["--bits", "8"]);
    assert!(
        fails(&args)
            .contains("layer (unprefixed): --bits 8 was given, but its tensor shapes are 4-bit"),
    );
    assert!(!out.exists());
}

#[test]
fn without_bits_the_metadata_width_is_used_and_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.safetensors");
    let input = data("library/gptq_pattern_b3.safetensors");
    let printed = convert_ok("gptq", "gptq_v2", "32", path(&input), path(&out));
    assert!(printed.starts_with("layer (unprefixed): K=128 N=64, 3-bit, group 32\n"));
    assert_eq!(read_checkpoint(&out).unwrap().metadata["bits"], "3");
}

#[test]
fn an_unknown_layer_layout_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.safetensors");
    let input = edited_fixture(dir.path(), "library/gptq_pattern_b4.safetensors", |ckpt| {
        // What an exllama repack adds beside qweight.
        ckpt.tensors
            .insert("q_perm".into(), Tensor::from_i32_vector(&[0; 128]));
    });
    let message = convert_fails("gptq", "awq", "32", path(&input), path(&out));
    assert!(message.contains(
        "unknown layout: tensor \"q_perm\" is not one of qweight, qzeros, scales, g_idx (or bias)"
    ));
    assert!(!out.exists());
}

#[test]
fn a_shape_that_does_not_match_the_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.safetensors");
    // Without metadata, nothing but the shapes can contradict a wrong --group-size.
    let input = edited_fixture(dir.path(), "library/awq_pattern.safetensors", |ckpt| {
        ckpt.metadata.clear()
    });
    let message = convert_fails("awq", "gptq", "64", path(&input), path(&out));
    assert!(
        message.contains(
            "AWQ scales has shape [4, 64], expected [2, 64] (K / group size = 128 / 64 groups)"
        ),
        "{message}"
    );
    let message = convert_fails(
        "awq",
        "gptq",
        "32",
        path(&data("library/gptq_pattern_b4.safetensors")),
        path(&out),
    );
    assert!(
        message.contains("metadata says format = \"gptq\", but --from awq was given"),
        "{message}"
    );
    assert!(!out.exists());
}

#[test]
fn zero_point_0_is_refused_under_gptq_v1() {
    let dir = tempfile::tempdir().unwrap();
    let (input, out) = (
        dir.path().join("v2.safetensors"),
        dir.path().join("v1.safetensors"),
    );
    let weights = LogicalWeights::with_sequential_groups(
        4,
        32,
        Array2::from_elem((64, 8), 3),
        Array2::from_elem((2, 8), f16::from_f32(0.5)),
        Array2::from_shape_fn((2, 8), |(g, n)| ((g + n) % 3) as u8),
    )
    .unwrap();
    let layer = PackedLayer::Gptq(gptq::pack(&weights, ZeroConvention::V2).unwrap());
    write_layer(&input, "proj", &layer, &[("checkpoint_format", "gptq_v2")]);
    let message = convert_fails("gptq_v2", "gptq", "32", path(&input), path(&out));
    assert_eq!(
        message,
        "repack: error: layer \"proj\": GPTQ v1 stores zero - 1, so the zero point 0 at [group 0, \
         column 0] cannot be written (the field would wrap to 15 and AutoGPTQ's reader would see \
         16); write gptq_v2, which stores the zero point itself\n"
    );
    assert!(!out.exists());
    convert_ok("gptq_v2", "awq", "32", path(&input), path(&out));
}

#[test]
fn odd_sizes_are_padded_recorded_and_cropped_through_two_conversions() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("odd.safetensors");
    // K = 72 (not a multiple of the group of 32), N = 60 (not a multiple of 8).
    let weights = LogicalWeights::with_sequential_groups(
        4,
        32,
        Array2::from_shape_fn((72, 60), |(k, n)| ((k * 7 + n * 3) % 16) as u8),
        Array2::from_shape_fn((3, 60), |(g, n)| {
            f16::from_f32(0.01 * (1 + (g + n) % 7) as f32)
        }),
        Array2::from_shape_fn((3, 60), |(g, n)| (1 + (g * 5 + n) % 15) as u8),
    )
    .unwrap();
    let layer = PackedLayer::Gptq(gptq::pack(&weights, ZeroConvention::V1).unwrap());
    write_layer(
        &input,
        "model.proj",
        &layer,
        &[
            ("checkpoint_format", "gptq"),
            ("model.proj.logical_shape", "[72, 60]"),
        ],
    );
    let (awq, back) = (
        dir.path().join("awq.safetensors"),
        dir.path().join("back.safetensors"),
    );
    let printed = convert_ok("gptq", "awq", "32", path(&input), path(&awq));
    assert!(
        printed.contains("  padded to K=96 N=64 with zero weights; logical size recorded\n"),
        "{printed}"
    );
    convert_ok("awq", "gptq_v2", "32", path(&awq), path(&back));
    let read = only_layer(&back, WeightFormat::GptqV2, 32)
        .unpack()
        .unwrap();
    assert_eq!(read, weights);
    let inspected = succeeds(&["inspect", path(&awq)]);
    assert!(
        inspected.contains("layer model.proj: awq, 4-bit, group 32, K=72 N=60\n"),
        "{inspected}"
    );
}

/// docs/weights.md's realistic-size example: a synthetic 4096 x 4096 GPTQ layer (4-bit, group 128,
/// patterned codes; its bytes follow from the shapes alone) converted to AWQ by the binary.
/// `cargo test --release -p repack --test integration a_4096_square -- --nocapture` prints it.
#[test]
fn a_4096_square_layer_costs_what_the_readme_says() {
    let dir = tempfile::tempdir().unwrap();
    let (input, out) = (
        dir.path().join("proj.safetensors"),
        dir.path().join("awq.safetensors"),
    );
    let weights = LogicalWeights::with_sequential_groups(
        4,
        128,
        Array2::from_shape_fn((4096, 4096), |(k, n)| ((k * 7 + n * 3) % 16) as u8),
        Array2::from_shape_fn((32, 4096), |(g, n)| {
            f16::from_f32(0.001 * (1 + (g + n) % 13) as f32)
        }),
        Array2::from_shape_fn((32, 4096), |(g, n)| (1 + (g * 5 + n) % 15) as u8),
    )
    .unwrap();
    let layer = PackedLayer::Gptq(gptq::pack(&weights, ZeroConvention::V1).unwrap());
    write_layer(&input, "proj", &layer, &[("checkpoint_format", "gptq")]);
    let printed = convert_ok("gptq", "awq", "128", path(&input), path(&out));
    print!("{printed}");
    assert_eq!(
        printed,
        format!(
            "layer proj: K=4096 N=4096, 4-bit, group 128\n\
             \x20 before gptq  4.164 bits/weight = 4.000 codes + 0.164 metadata (8,388,608 + 344,064 bytes for 16,777,216 weights)\n\
             \x20 after  awq   4.156 bits/weight = 4.000 codes + 0.156 metadata (8,388,608 + 327,680 bytes for 16,777,216 weights)\n\
             1 layer(s) converted gptq -> awq, every weight verified bit-identical; 0 other tensor(s) copied unchanged\n\
             wrote {}\n",
            out.display()
        )
    );
}

#[test]
fn every_layer_is_converted_and_other_tensors_pass_through_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let (input, out) = (
        dir.path().join("model.safetensors"),
        dir.path().join("awq.safetensors"),
    );
    let mut ckpt = Checkpoint::default();
    for (prefix, case) in [
        (
            "model.layers.0.mlp.up_proj",
            "library/gptq_pattern_b4.safetensors",
        ),
        (
            "model.layers.0.mlp.down_proj",
            "library/gptq_all15_b4.safetensors",
        ),
    ] {
        let layer = only_layer(&data(case), WeightFormat::Gptq, 32);
        ckpt.tensors.extend(layer_io::layer_tensors(prefix, &layer));
    }
    let embedding = Tensor {
        dtype: safetensors::Dtype::BF16,
        shape: vec![3, 2],
        data: (0..12).collect(),
    };
    ckpt.tensors
        .insert("model.embed_tokens.weight".into(), embedding.clone());
    ckpt.tensors.insert(
        "model.layers.0.mlp.up_proj.bias".into(),
        Tensor::from_i32_vector(&[7; 64]),
    );
    ckpt.metadata
        .insert("checkpoint_format".into(), "gptq".into());
    write_checkpoint(&ckpt, &input).unwrap();

    let printed = convert_ok("gptq", "awq", "32", path(&input), path(&out));
    assert!(printed.contains("layer model.layers.0.mlp.down_proj: K=128 N=64, 4-bit, group 32\n"));
    assert!(printed.contains("layer model.layers.0.mlp.up_proj: K=128 N=64, 4-bit, group 32\n"));
    assert!(printed.contains("2 layer(s) converted gptq -> awq, every weight verified bit-identical; 2 other tensor(s) copied unchanged\n"));
    let written = read_checkpoint(&out).unwrap();
    assert_eq!(written.tensors["model.embed_tokens.weight"], embedding);
    assert_eq!(
        written.tensors["model.layers.0.mlp.up_proj.bias"],
        ckpt.tensors["model.layers.0.mlp.up_proj.bias"]
    );
    let awq_names: Vec<&String> = written
        .tensors
        .keys()
        .filter(|n| n.contains("down_proj"))
        .collect();
    assert_eq!(
        awq_names,
        [
            "model.layers.0.mlp.down_proj.qweight",
            "model.layers.0.mlp.down_proj.qzeros",
            "model.layers.0.mlp.down_proj.scales"
        ]
    );
    let awq_tensors = raw_tensors(&data("library/awq_all15.safetensors"));
    assert_eq!(
        raw_tensors(&out)["model.layers.0.mlp.down_proj.qweight"],
        awq_tensors["qweight"]
    );
}

#[test]
fn widths_awq_cannot_store_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.safetensors");
    let message = convert_fails(
        "gptq",
        "awq",
        "32",
        path(&data("library/gptq_pattern_b8.safetensors")),
        path(&out),
    );
    assert_eq!(
        message,
        "repack: error: layer (unprefixed): AWQ (GEMM) stores 4-bit codes, not 8-bit codes\n"
    );
    assert!(!out.exists());
}

#[test]
fn inspect_names_each_tensor_its_layout_and_its_bits() {
    let printed = succeeds(&[
        "inspect",
        path(&data("library/gptq_pattern_b3_v2.safetensors")),
    ]);
    let body: Vec<&str> = printed.lines().skip(2).collect();
    assert_eq!(
        body,
        [
            "layer (unprefixed): gptq_v2, 3-bit, group 32, K=128 N=64",
            "  g_idx    I32 [128]            512 B   0.500 bits/weight  group of each row",
            "  qweight  I32 [12, 64]       3,072 B   3.000 bits/weight  codes: 3-bit, packed along K",
            "  qzeros   I32 [4, 6]            96 B   0.094 bits/weight  zero points stored as is (gptq_v2), packed along N",
            "  scales   F16 [4, 64]          512 B   0.500 bits/weight  f16 scale per group and column",
            "  total  4.094 bits/weight = 3.000 codes + 1.094 metadata (3,072 + 1,120 bytes for 8,192 weights)",
            "  check: unpacks cleanly as gptq_v2",
        ]
    );
}
