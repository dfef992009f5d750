//! The audit binary against the archived evidence: it passes as archived, and fails with a
//! message naming the problem for each kind of tampering, including tampering whose manifest
//! hashes were rewritten to match (caught by recomputation).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use ndarray::{ArrayD, IxDyn, OwnedRepr};
use ndarray_npy::{NpzReader, NpzWriter};
use sha2::{Digest, Sha256};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn archived() -> PathBuf {
    workspace().join("evidence/packed-kv")
}

/// Runs `audit` in `cwd` with `args`; returns (passed, stdout).
fn audit_in(cwd: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_audit"))
        .current_dir(cwd)
        .args(args)
        .arg("--tree")
        .arg(workspace())
        .output()
        .expect("audit starts");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.stderr.is_empty(),
        "audit wrote to stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.status.success(),
        stdout.trim_end().ends_with("\nPASS"),
        "{stdout}"
    );
    (out.status.success(), stdout)
}

fn audit(dir: &Path) -> (bool, String) {
    audit_in(&workspace(), &[dir.to_str().unwrap()])
}

/// Asserts the audit fails and prints a FAIL line containing every needle.
fn assert_fails_with(dir: &Path, needles: &[&str]) {
    let (passed, stdout) = audit(dir);
    assert!(!passed, "audit passed:\n{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("FAIL:") && needles.iter().all(|n| l.contains(n))),
        "no FAIL line with {needles:?}:\n{stdout}"
    );
}

/// A private copy of the archived packed-KV evidence.
fn copy() -> (tempfile::TempDir, PathBuf) {
    copy_of(&archived())
}

/// A private copy of an evidence directory.
fn copy_of(source: &Path) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(source).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    (tmp, dir)
}

/// Rewrites manifest.json's output hashes to match the files, as a forger would.
fn rehash(dir: &Path) {
    let path = dir.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for (name, hash) in manifest["outputs"].as_object_mut().unwrap() {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        *hash = hex::encode(Sha256::digest(bytes)).into();
    }
    std::fs::write(&path, serde_json::to_string_pretty(&manifest).unwrap()).unwrap();
}

enum AnyArray {
    U8(ArrayD<u8>),
    I32(ArrayD<i32>),
    F32(ArrayD<f32>),
    F64(ArrayD<f64>),
}

/// Reads every array (dtype from the naming convention), lets `edit` change them, writes them
/// back in the same order.
fn edit_arrays(dir: &Path, edit: impl FnOnce(&mut BTreeMap<String, AnyArray>)) {
    let path = dir.join("arrays.npz");
    let mut reader = NpzReader::new(File::open(&path).unwrap()).unwrap();
    let names = reader.names().unwrap();
    let mut arrays = BTreeMap::new();
    for name in &names {
        // Budget segments carry a `_s<index>` suffix after the part name.
        let part = match name.rsplit_once("_s") {
            Some((head, index)) if index.parse::<usize>().is_ok() => head,
            _ => name.as_str(),
        };
        let array = if part.ends_with("_codes") || part.ends_with("_zeros") {
            AnyArray::U8(reader.by_name::<OwnedRepr<u8>, IxDyn>(name).unwrap())
        } else if part.ends_with("_shape") {
            AnyArray::I32(reader.by_name::<OwnedRepr<i32>, IxDyn>(name).unwrap())
        } else if part.ends_with("_ref") || part.ends_with("_out") {
            AnyArray::F64(reader.by_name::<OwnedRepr<f64>, IxDyn>(name).unwrap())
        } else {
            AnyArray::F32(reader.by_name::<OwnedRepr<f32>, IxDyn>(name).unwrap())
        };
        arrays.insert(name.clone(), array);
    }
    edit(&mut arrays);
    let mut writer = NpzWriter::new(File::create(&path).unwrap());
    for name in &names {
        match &arrays[name] {
            AnyArray::U8(a) => writer.add_array(name.as_str(), a),
            AnyArray::I32(a) => writer.add_array(name.as_str(), a),
            AnyArray::F32(a) => writer.add_array(name.as_str(), a),
            AnyArray::F64(a) => writer.add_array(name.as_str(), a),
        }
        .unwrap();
    }
    writer.finish().unwrap();
}

fn edit_results(dir: &Path, edit: impl FnOnce(&mut Vec<serde_json::Value>)) {
    let path = dir.join("results.json");
    let mut rows: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut rows);
    std::fs::write(&path, serde_json::to_string_pretty(&rows).unwrap()).unwrap();
}

fn codes<'a>(arrays: &'a mut BTreeMap<String, AnyArray>, name: &str) -> &'a mut ArrayD<u8> {
    match arrays.get_mut(name) {
        Some(AnyArray::U8(a)) => a,
        _ => panic!("{name} is not a u8 array"),
    }
}

fn floats<'a>(arrays: &'a mut BTreeMap<String, AnyArray>, name: &str) -> &'a mut ArrayD<f32> {
    match arrays.get_mut(name) {
        Some(AnyArray::F32(a)) => a,
        _ => panic!("{name} is not an f32 array"),
    }
}

#[test]
fn archived_evidence_passes() {
    let (passed, stdout) = audit(&archived());
    assert!(passed, "{stdout}");
    assert!(stdout.contains("144 comparisons"), "{stdout}");
}

#[test]
fn plain_audit_checks_what_the_root_manifest_pins() {
    let (passed, stdout) = audit_in(&workspace(), &[]);
    assert!(passed, "{stdout}");
    assert!(
        stdout.contains("pinned file hashes")
            && stdout.contains("PASS evidence/packed-kv")
            && stdout.contains("PASS evidence/widths-and-modes"),
        "{stdout}"
    );
}

#[test]
fn a_flipped_nibble_fails_on_the_hash_and_on_recomputation() {
    let (_tmp, dir) = copy();
    edit_arrays(&dir, |arrays| {
        let codes = codes(arrays, "s19_n128_clean_g8_b4_k_codes");
        // Move the low nibble of byte 5 by one step, staying inside 0..=14.
        let low = codes[5] & 0x0F;
        codes[5] = (codes[5] & 0xF0) | if low < 14 { low + 1 } else { low - 1 };
    });
    assert_fails_with(&dir, &["output hash mismatch", "arrays.npz"]);
    rehash(&dir);
    assert_fails_with(
        &dir,
        &["s19_n128_clean_g8_b4_out", "differs from attention"],
    );
    assert_fails_with(&dir, &["s19_n128_clean_g8_b4_k", "exceed scale/2"]);
}

#[test]
fn a_nibble_set_to_15_is_out_of_range() {
    let (_tmp, dir) = copy();
    edit_arrays(&dir, |arrays| {
        codes(arrays, "s7_n512_early_focus_g32_b4_v_codes")[0] |= 0xF0;
    });
    rehash(&dir);
    assert_fails_with(
        &dir,
        &[
            "s7_n512_early_focus_g32_b4_v_codes",
            "exceed the 4-bit maximum 14",
        ],
    );
}

#[test]
fn a_changed_scale_fails() {
    let (_tmp, dir) = copy();
    edit_arrays(&dir, |arrays| {
        floats(arrays, "s41_n512_recent_focus_g32_b8_v_scales")[[3, 0]] *= 1.001;
    });
    rehash(&dir);
    assert_fails_with(
        &dir,
        &[
            "s41_n512_recent_focus_g32_b8_v_scales",
            "max|x| / 127",
            "[3, 0]",
        ],
    );
}

#[test]
fn tampered_inputs_and_outputs_with_rewritten_hashes_are_caught_by_recomputation() {
    let (_tmp, dir) = copy();
    edit_arrays(&dir, |arrays| {
        match arrays.get_mut("s7_n128_clean_g32_b8_out") {
            Some(AnyArray::F64(out)) => out[[1, 2]] += 1e-9,
            _ => panic!("no f64 output"),
        }
        floats(arrays, "s19_n512_clean_v")[[100, 7]] = 0.25;
    });
    rehash(&dir);
    assert_fails_with(
        &dir,
        &["s7_n128_clean_g32_b8_out", "differs from attention"],
    );
    assert_fails_with(
        &dir,
        &["s19_n512_clean_ref", "differs from recomputed attention"],
    );
}

#[test]
fn an_edited_number_in_results_fails() {
    let (_tmp, dir) = copy();
    edit_results(&dir, |rows| {
        let x = rows[9]["relative_l2"].as_f64().unwrap();
        rows[9]["relative_l2"] = (x * 0.9).into();
        rows[10]["payload_bytes"] = 4096.into();
    });
    rehash(&dir);
    // Eight comparisons per input: rows 9 and 10 belong to the second input.
    assert_fails_with(
        &dir,
        &["results.json", "s7_n128_early_focus_g32_b4", "relative_l2"],
    );
    assert_fails_with(
        &dir,
        &[
            "results.json",
            "s7_n128_early_focus_g8_b8",
            "payload_bytes is 4096",
        ],
    );
    assert_fails_with(&dir, &["summary.json g32 b4", "early_focus mean"]);
}

#[test]
fn a_removed_row_fails() {
    let (_tmp, dir) = copy();
    edit_results(&dir, |rows| {
        rows.remove(0);
    });
    rehash(&dir);
    assert_fails_with(&dir, &["results.json has 143 rows", "144"]);
    assert_fails_with(&dir, &["missing comparison s7_n128_clean_g8_b4"]);
    assert_fails_with(&dir, &["summary.json g8 b4"]);
}

#[test]
fn a_tampered_budget_segment_fails() {
    let (_tmp, dir) = copy();
    edit_arrays(&dir, |arrays| {
        // The float32 window of a recent_f32 comparison no longer equals the input ...
        floats(
            arrays,
            "s19_n512_recent_focus_budget_recent_f32_k_values_s1",
        )[[3, 5]] += 0.5;
        // ... and one 8-bit code of a recent8 window moves by one step.
        let codes = codes(arrays, "s41_n128_clean_budget_recent8_v_codes_s1");
        codes[17] = if codes[17] < 254 { codes[17] + 1 } else { 253 };
    });
    rehash(&dir);
    assert_fails_with(
        &dir,
        &[
            "s19_n512_recent_focus_budget_recent_f32_k_values_s1",
            "float32",
        ],
    );
    assert_fails_with(
        &dir,
        &["s41_n128_clean_budget_recent8_v_s1", "exceed scale/2"],
    );
    assert_fails_with(
        &dir,
        &[
            "s41_n128_clean_budget_recent8_out",
            "differs from attention",
        ],
    );
}

#[test]
fn a_budget_row_with_a_moved_window_fails() {
    let (_tmp, dir) = copy();
    edit_results(&dir, |rows| {
        let row = rows
            .iter_mut()
            .find(|r| r["id"] == "s7_n512_clean_budget_early8")
            .unwrap();
        row["segments"][0]["end"] = 64.into();
    });
    rehash(&dir);
    assert_fails_with(&dir, &["s7_n512_clean_budget_early8", "descriptive fields"]);
}

#[test]
fn incomplete_or_altered_timings_fail() {
    let (_tmp, dir) = copy();
    let path = dir.join("timings.json");
    let mut timings: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let measurements = timings["measurements"].as_array_mut().unwrap();
    measurements.pop();
    measurements[0]["operation"] = "encode_q".into();
    std::fs::write(&path, serde_json::to_string_pretty(&timings).unwrap()).unwrap();
    rehash(&dir);
    assert_fails_with(
        &dir,
        &["timings.json", "problems", "unknown operation encode_q"],
    );
    assert_fails_with(&dir, &["summary.json timing", "median"]);
}

fn widths_and_modes() -> PathBuf {
    workspace().join("evidence/widths-and-modes")
}

#[test]
fn the_widths_and_modes_archive_passes() {
    let (passed, stdout) = audit(&widths_and_modes());
    assert!(passed, "{stdout}");
    assert!(stdout.contains("104 comparisons"), "{stdout}");
}

#[test]
fn a_changed_asymmetric_zero_point_fails() {
    let (_tmp, dir) = copy_of(&widths_and_modes());
    edit_arrays(&dir, |arrays| {
        // 2-bit zero points, four to a byte: move the first group's by one.
        let zeros = codes(arrays, "s19_n256_recent_focus_g32_b2_asym_k_zeros");
        zeros[0] ^= 0b01;
    });
    rehash(&dir);
    assert_fails_with(
        &dir,
        &[
            "s19_n256_recent_focus_g32_b2_asym_k_scales",
            "with its zero point",
            "[0, 0]",
        ],
    );
    assert_fails_with(&dir, &["s19_n256_recent_focus_g32_b2_asym_out", "differs"]);
}

#[test]
fn a_changed_code_that_straddles_a_byte_fails() {
    let (_tmp, dir) = copy_of(&widths_and_modes());
    edit_arrays(&dir, |arrays| {
        // 3-bit stream: code 2 occupies bits 6..9, across bytes 0 and 1. Flip its top bit.
        codes(arrays, "s7_n100_clean_g32_b3_v_codes")[1] ^= 0b1;
    });
    rehash(&dir);
    assert_fails_with(
        &dir,
        &["s7_n100_clean_g32_b3_v", "exceed scale/2", "[0, 2]"],
    );
}

#[test]
fn a_truncated_archive_fails_without_panicking() {
    let (_tmp, dir) = copy();
    let path = dir.join("arrays.npz");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert_fails_with(&dir, &["output hash mismatch", "arrays.npz"]);
    assert_fails_with(&dir, &["arrays.npz", "not a readable npz archive"]);
}

#[test]
fn a_missing_file_fails() {
    let (_tmp, dir) = copy();
    std::fs::remove_file(dir.join("summary.json")).unwrap();
    assert_fails_with(&dir, &["missing output summary.json"]);
    std::fs::remove_file(dir.join("manifest.json")).unwrap();
    assert_fails_with(&dir, &["cannot read", "manifest.json"]);
}

#[test]
fn malformed_json_fails_with_its_file_named() {
    let (_tmp, dir) = copy();
    std::fs::write(dir.join("results.json"), "[{\"id\": ").unwrap();
    rehash(&dir);
    assert_fails_with(&dir, &["malformed", "results.json"]);
    std::fs::write(dir.join("manifest.json"), "{}").unwrap();
    assert_fails_with(&dir, &["malformed", "manifest.json", "format"]);
}

#[test]
fn an_unlisted_file_fails() {
    let (_tmp, dir) = copy();
    std::fs::write(dir.join("notes.txt"), "added later").unwrap();
    assert_fails_with(&dir, &["unlisted file notes.txt"]);
}

#[test]
fn a_source_tree_that_differs_is_reported_as_a_source_mismatch() {
    let (tmp, dir) = copy();
    // A tree holding only an edited protocol: it differs, and every other source is missing.
    let tree = tmp.path().join("tree");
    std::fs::create_dir_all(tree.join("experiments/packed-kv")).unwrap();
    std::fs::write(tree.join("experiments/packed-kv/protocol.json"), "{}\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_audit"))
        .arg(&dir)
        .arg("--tree")
        .arg(&tree)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(!out.status.success());
    assert!(
        stdout.contains(
            "source hash mismatch: experiments/packed-kv/protocol.json differs from the tree"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("source hash mismatch: crates/codec/src/lib.rs is not in the tree"),
        "{stdout}"
    );
}

#[test]
fn a_tampered_pinned_file_fails_the_root_audit() {
    let (tmp, dir) = copy();
    let manifest = tmp.path().join("manifest.json");
    // The root manifest, pinning only this copy of the packed-KV run.
    let mut root: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(workspace().join("manifest.json")).unwrap())
            .unwrap();
    let pinned = root["evidence"]["evidence/packed-kv"].clone();
    root["evidence"] = serde_json::json!({ "run": pinned });
    std::fs::write(&manifest, serde_json::to_string_pretty(&root).unwrap()).unwrap();
    let (passed, stdout) = audit_in(tmp.path(), &["--manifest", manifest.to_str().unwrap()]);
    assert!(passed, "{stdout}");
    edit_results(&dir, |rows| rows[0]["max_abs"] = 0.0.into());
    rehash(&dir);
    let (passed, stdout) = audit_in(tmp.path(), &["--manifest", manifest.to_str().unwrap()]);
    assert!(!passed);
    assert!(
        stdout.contains("output hash mismatch: manifest.json"),
        "{stdout}"
    );
    assert!(
        stdout.contains("output hash mismatch: results.json"),
        "{stdout}"
    );
}
