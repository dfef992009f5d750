//! Sharded runs as a cluster makes them: `runner --shard I/N` into separate directories, then
//! `runner merge`, which must give a single run's arrays.npz and results.json byte for byte, and
//! must refuse any set of shards that is not exactly the N slices of one protocol.

use std::path::{Path, PathBuf};
use std::process::Command;

use evidence::shard::SetError;
use kvstudy::merge::{MergeError, merge};
use sha2::{Digest, Sha256};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `runner --shard I/N` for every I into `dir/shard-I`; returns the directories.
fn shards(dir: &Path, count: usize, protocol: Option<&Path>) -> Vec<PathBuf> {
    (1..=count)
        .map(|index| {
            let out = dir.join(format!("shard-{index}"));
            let mut command = Command::new(env!("CARGO_BIN_EXE_runner"));
            command
                .arg("--shard")
                .arg(format!("{index}/{count}"))
                .arg("--out")
                .arg(&out);
            if let Some(protocol) = protocol {
                command.arg("--protocol").arg(protocol);
            }
            let result = command.output().unwrap();
            assert!(
                result.status.success(),
                "{}",
                String::from_utf8_lossy(&result.stderr)
            );
            out
        })
        .collect()
}

fn sha256(path: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).unwrap()))
}

fn archived_hash(archive: &str, file: &str) -> String {
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(workspace().join(archive).join("manifest.json")).unwrap(),
    )
    .unwrap();
    manifest["outputs"][file].as_str().unwrap().to_string()
}

#[test]
fn three_shards_merge_into_the_archived_single_runs_byte_for_byte() {
    for (archive, protocol) in [
        ("evidence/packed-kv", None),
        (
            "evidence/widths-and-modes",
            Some(workspace().join("experiments/widths-and-modes/protocol.json")),
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let mut dirs = shards(tmp.path(), 3, protocol.as_deref());
        dirs.reverse(); // any order
        let out = tmp.path().join("merged");
        let merged = merge(&out, &dirs).unwrap();
        assert_eq!(merged.manifest.merged_from.as_ref().map(Vec::len), Some(3));
        for file in ["arrays.npz", "results.json", "error-vs-bytes.svg"] {
            assert_eq!(
                sha256(&out.join(file)),
                archived_hash(archive, file),
                "{archive} {file}"
            );
        }
    }
}

#[test]
fn sets_that_are_not_the_slices_of_one_protocol_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let protocol = workspace().join("experiments/widths-and-modes/protocol.json");
    let dirs = shards(tmp.path(), 3, Some(&protocol));
    let out = tmp.path().join("merged");

    // Incomplete.
    let err = merge(&out, &dirs[..2]).unwrap_err();
    assert!(
        matches!(err, MergeError::Set(SetError::Missing { ref missing, count: 3 }) if missing == &[3]),
        "{err:?}"
    );
    // One shard twice.
    let err = merge(
        &out,
        &[
            dirs[0].clone(),
            dirs[1].clone(),
            dirs[1].clone(),
            dirs[2].clone(),
        ],
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            MergeError::Set(SetError::Duplicate {
                index: 2,
                count: 3,
                ..
            })
        ),
        "{err:?}"
    );
    // A shard of another protocol (the frozen one, cut in three too).
    let other = shards(&tmp.path().join("other"), 3, None);
    let err = merge(&out, &[dirs[0].clone(), dirs[1].clone(), other[2].clone()]).unwrap_err();
    assert!(
        matches!(err, MergeError::DifferentProtocols { .. }),
        "{err:?}"
    );
    // A shard cut another way.
    let two = shards(&tmp.path().join("two"), 2, Some(&protocol));
    let err = merge(&out, &[dirs[0].clone(), two[1].clone()]).unwrap_err();
    assert!(
        matches!(err, MergeError::DifferentProtocols { .. }),
        "{err:?}"
    );
    // A tampered shard (its manifest no longer matches its results).
    let results = dirs[1].join("results.json");
    let text = std::fs::read_to_string(&results).unwrap();
    std::fs::write(
        &results,
        text.replacen("\"max_abs\": 0.", "\"max_abs\": 1.", 1),
    )
    .unwrap();
    let err = merge(&out, &dirs).unwrap_err();
    assert!(
        matches!(err, MergeError::Hash { ref file, .. } if file == "results.json"),
        "{err:?}"
    );
    // A full run is not a shard.
    let full = tmp.path().join("full");
    let result = Command::new(env!("CARGO_BIN_EXE_runner"))
        .args([
            "--out",
            full.to_str().unwrap(),
            "--protocol",
            protocol.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(result.status.success());
    let err = merge(&out, &[full]).unwrap_err();
    assert!(matches!(err, MergeError::NotAShard { .. }), "{err:?}");
    assert!(!out.exists(), "a refused merge writes nothing");
}

#[test]
fn more_shards_than_inputs_are_refused_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("s");
    for (shard, needle) in [
        ("19/18", "index runs from 1 to 18"),
        ("1/19", "19 shards of 18 inputs"),
        ("1-3", "not I/N"),
    ] {
        let result = Command::new(env!("CARGO_BIN_EXE_runner"))
            .args(["--shard", shard, "--out", out.to_str().unwrap()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(
            !result.status.success() && stderr.contains(needle),
            "{shard}: {stderr}"
        );
        assert!(!out.exists());
    }
}
