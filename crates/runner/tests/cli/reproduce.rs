//! The `runner` binary as a user drives it.
//!
//! - reproduce: the frozen protocol prints the published table and rewrites the archived
//!   evidence byte for byte;
//! - refusals: an existing output directory and a bad protocol are refused, touching nothing;
//! - fresh sweeps: a user-written protocol runs into a new directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ndarray::Array2;
use ndarray_npy::NpzReader;
use sha2::{Digest, Sha256};

fn runner(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(args)
        .output()
        .expect("runner starts")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Writes `text` as a protocol in `dir`, runs it into `dir/out`, and requires success.
/// Returns (protocol path, output directory).
fn run_protocol(dir: &Path, text: &str, out: &str) -> (PathBuf, PathBuf) {
    let protocol = dir.join("protocol.json");
    std::fs::write(&protocol, text).unwrap();
    let out = dir.join(out);
    let result = runner(&[
        "--out",
        out.to_str().unwrap(),
        "--protocol",
        protocol.to_str().unwrap(),
    ]);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    (protocol, out)
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn frozen_protocol_reproduces_the_published_table_and_the_archive() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    // 3 worker threads: batches that do not divide the 8 configurations; the widths-and-modes
    // test below runs on 1. Both must rewrite their archive byte for byte.
    let result = runner(&["--out", out.to_str().unwrap(), "--threads", "3"]);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let stdout = String::from_utf8(result.stdout).unwrap();

    // The published figures, as the study printed them.
    let published =
        json(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/published-packed-kv.json"));
    let summary = json(&out.join("summary.json"));
    for (row, want) in summary["packed_kv"]
        .as_array()
        .unwrap()
        .iter()
        .zip(published["rows"].as_array().unwrap())
    {
        assert_eq!(row["group_size"], want["group_size"]);
        assert_eq!(row["bits"], want["bits"]);
        let percent = format!("{:.3}", want["mean_relative_l2_percent"].as_f64().unwrap());
        assert_eq!(row["mean_relative_l2_clean_percent"], percent.as_str());
        assert_eq!(row["payload_bytes"]["128"], want["payload_bytes_at_128"]);
        assert!(
            stdout.contains(&format!("{percent}%")),
            "{percent}% not printed:\n{stdout}"
        );
    }
    assert_eq!(
        summary["float32_kv_bytes"]["128"],
        published["float32_kv_bytes_at_128"]
    );
    for printed in ["8,208 B", "5,136 B", "12,304 B", "9,232 B", "32,768 B"] {
        assert!(stdout.contains(printed), "{printed} not printed:\n{stdout}");
    }

    // The archived inputs are NumPy's draws, bit for bit (hashes made with NumPy 2.4).
    let draws =
        json(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/numpy-study-draws.json"));
    let mut npz = NpzReader::new(std::fs::File::open(out.join("arrays.npz")).unwrap()).unwrap();
    for draw in draws["draws"].as_array().unwrap() {
        let input = format!("s{}_n{}_clean", draw["seed"], draw["tokens"]);
        for part in ["q", "k", "v"] {
            let array: Array2<f32> = npz.by_name(&format!("{input}_{part}")).unwrap();
            let bytes: Vec<u8> = array.iter().flat_map(|x| x.to_le_bytes()).collect();
            let hash = hex::encode(Sha256::digest(&bytes));
            assert_eq!(
                hash,
                draw[format!("sha256_{part}_f32_le_c_order")],
                "{input}_{part}"
            );
        }
    }

    // Same protocol, same bytes: the archived evidence's deterministic outputs are what this
    // build writes. (summary.json, summary.md and timings.json carry timings, which vary.)
    let fresh = json(&out.join("manifest.json"));
    let archived = json(&workspace().join("evidence/packed-kv/manifest.json"));
    for file in ["arrays.npz", "results.json", "error-vs-bytes.svg"] {
        assert_eq!(
            fresh["outputs"][file], archived["outputs"][file],
            "{file} changed: refresh evidence/packed-kv and the root manifest (scripts/refresh-evidence)"
        );
    }
    assert_eq!(fresh["counts"]["comparisons"], 144);
    assert_eq!(fresh["counts"]["timings"], 144 * 5 * 5);
    assert_eq!(fresh["threads"], 3);
    let fresh_summary = json(&out.join("summary.json"));
    let archived_summary = json(&workspace().join("evidence/packed-kv/summary.json"));
    for table in ["float32_kv_bytes", "packed_kv", "budget"] {
        assert_eq!(
            fresh_summary[table], archived_summary[table],
            "summary.json {table}"
        );
    }
    // The sources may have moved on since the archive was made (a comment, say): the archive is
    // tied to its own commit, which the audit checks; `scripts/refresh-evidence --check` says
    // whether it is stale.
}

#[test]
fn the_widths_and_modes_sweep_reproduces_its_archive() {
    // 2- to 8-bit codes, symmetric and asymmetric, partial groups (N = 100) and a 2-bit budget.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let protocol = workspace().join("experiments/widths-and-modes/protocol.json");
    let result = runner(&[
        "--out",
        out.to_str().unwrap(),
        "--protocol",
        protocol.to_str().unwrap(),
        "--threads",
        "1",
    ]);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let fresh = json(&out.join("manifest.json"));
    let archived = json(&workspace().join("evidence/widths-and-modes/manifest.json"));
    // No timings in this protocol, so every output is deterministic.
    assert_eq!(
        fresh["outputs"], archived["outputs"],
        "refresh evidence/widths-and-modes (scripts/refresh-evidence)"
    );
    let rows = json(&out.join("results.json"));
    let asym = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "s7_n100_clean_g32_b3_asym")
        .unwrap();
    assert_eq!(asym["mode"], "asymmetric");
    assert_eq!(asym["segments"][0]["mode"], "asymmetric");
}

#[test]
fn refuses_an_existing_output_directory_and_leaves_it_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("taken");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "mine").unwrap();
    let result = runner(&["--out", out.to_str().unwrap()]);
    assert!(!result.status.success());
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("already exists"), "{stderr}");
    let names: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec!["keep.txt"]);
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        1,
        "no temporary sibling left"
    );
}

#[test]
fn a_bad_protocol_is_refused_by_field_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let protocol = tmp.path().join("bad.json");
    let mut value: serde_json::Value = serde_json::from_str(kvstudy::protocol::FROZEN).unwrap();
    value["settings"][1]["bits"] = 9.into();
    std::fs::write(&protocol, value.to_string()).unwrap();
    let out = tmp.path().join("run");
    let result = runner(&[
        "--out",
        out.to_str().unwrap(),
        "--protocol",
        protocol.to_str().unwrap(),
    ]);
    assert!(!result.status.success());
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        stderr.contains("settings[1]") && stderr.contains("bit width 9"),
        "{stderr}"
    );
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
}

#[test]
fn a_user_protocol_with_the_chacha_generator_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let text = r#"{
        "study": "small-sweep",
        "seeds": [1],
        "tokens": [40, 64],
        "features": 16,
        "queries": 2,
        "distributions": ["clean", "recent_focus"],
        "focus": { "window": 4, "gain": 1.5 },
        "settings": [ { "group_size": 16, "bits": 4 }, { "group_size": 3, "bits": 8 } ],
        "generator": { "name": "chacha20",
                       "entropy": { "seed_multiplier": 1000, "tokens_multiplier": 1, "offset": 5 } }
    }"#;
    let (protocol, out) = run_protocol(tmp.path(), text, "nested/run");
    let rows = json(&out.join("results.json"));
    assert_eq!(rows.as_array().unwrap().len(), 8);
    assert_eq!(rows[0]["id"], "s1_n40_clean_g16_b4");
    let manifest = json(&out.join("manifest.json"));
    assert_eq!(manifest["protocol"]["generator"]["name"], "chacha20");
    assert_eq!(manifest["protocol_source"], protocol.to_str().unwrap());
}

#[test]
fn a_long_user_sweep_with_budget_and_timings_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let text = r#"{
        "study": "long-context",
        "seeds": [3],
        "tokens": [1024, 4096],
        "features": 128,
        "queries": 4,
        "distributions": ["clean", "recent_focus"],
        "focus": { "window": 8, "gain": 2.0 },
        "settings": [ { "group_size": 64, "bits": 4 }, { "group_size": 128, "bits": 8 } ],
        "generator": { "name": "numpy",
                       "entropy": { "seed_multiplier": 10000, "tokens_multiplier": 1, "offset": 0 } },
        "budget": { "group_size": 64, "low_bits": 4, "window": 128,
                    "policies": ["uniform", "recent8", "early_f32"] },
        "timing": { "warmup": 0, "repeats": 1, "shuffle_seed": 1 }
    }"#;
    let (_, out) = run_protocol(tmp.path(), text, "run");
    // 1 seed x 2 lengths x 2 distributions x (2 settings + 3 policies).
    let rows = json(&out.join("results.json"));
    assert_eq!(rows.as_array().unwrap().len(), 20);
    let early = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "s3_n4096_recent_focus_budget_early_f32")
        .unwrap();
    // 128 float32 tokens first, then 3968 4-bit tokens.
    assert_eq!(early["segments"][0]["storage"], "float32");
    assert_eq!(early["segments"][1]["start"], 128);
    let timings = json(&out.join("timings.json"));
    assert_eq!(timings["measurements"].as_array().unwrap().len(), 20 * 5);
    for file in ["summary.md", "error-vs-bytes.svg"] {
        assert!(out.join(file).is_file(), "{file}");
    }
}

#[test]
fn group_sizes_that_used_to_crash_the_runner_are_refused_by_field() {
    // Each passed validation and then panicked (exit 101) or aborted on allocation (134).
    let cases = [
        ("settings", 1u64 << 62, "settings[0].group_size"),
        ("settings", 1 << 32, "settings[0].group_size"),
        ("budget", 1 << 40, "budget.group_size"),
    ];
    for (part, group_size, field) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let mut value: serde_json::Value = serde_json::from_str(kvstudy::protocol::FROZEN).unwrap();
        match part {
            "settings" => value["settings"][0]["group_size"] = group_size.into(),
            _ => value["budget"]["group_size"] = group_size.into(),
        }
        let protocol = tmp.path().join("protocol.json");
        std::fs::write(&protocol, value.to_string()).unwrap();
        let out = tmp.path().join("run");
        let result = runner(&[
            "--out",
            out.to_str().unwrap(),
            "--protocol",
            protocol.to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert_eq!(result.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(&format!("`{field}`")), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(!out.exists());
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    }
}

#[test]
fn a_protocol_that_is_not_a_small_regular_file_is_refused_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let big = tmp.path().join("big.json");
    std::fs::write(
        &big,
        vec![b' '; (kvstudy::validate::MAX_PROTOCOL_FILE_BYTES + 1) as usize],
    )
    .unwrap();
    for (protocol, needle) in [
        ("/dev/zero", "is not a regular file"),
        (tmp.path().to_str().unwrap(), "is not a regular file"),
        (big.to_str().unwrap(), "holds more than"),
    ] {
        let result = runner(&["--out", out.to_str().unwrap(), "--protocol", protocol]);
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert_eq!(result.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(needle), "{stderr}");
        assert!(!out.exists());
    }
}

#[test]
fn a_run_whose_every_error_is_zero_still_draws_its_chart() {
    // One token, one feature, groups of one: every value is its group's extreme, so every code
    // decodes exactly and nothing can be marked on a log scale. (Found by protocol_props.)
    let tmp = tempfile::tempdir().unwrap();
    let text = r#"{"study": "exact", "seeds": [0], "tokens": [1], "features": 1, "queries": 1,
        "distributions": ["clean"], "focus": {"window": 1, "gain": 0.0},
        "settings": [{"group_size": 1, "bits": 2}],
        "generator": {"name": "numpy", "entropy": {"seed_multiplier": 1, "tokens_multiplier": 1, "offset": 0}}}"#;
    let (_, out) = run_protocol(tmp.path(), text, "run");
    let svg = std::fs::read_to_string(out.join("error-vs-bytes.svg")).unwrap();
    assert!(svg.contains("every error is 0"));
    assert!(!svg.contains("class=\"marker\""));
}

#[test]
fn pin_adds_a_run_that_passes_the_audit_keeps_other_pins_and_refuses_a_tampered_run() {
    let tmp = tempfile::tempdir().unwrap();
    let text = r#"{
        "study": "pinned",
        "seeds": [1],
        "tokens": [16],
        "features": 8,
        "queries": 2,
        "distributions": ["clean"],
        "settings": [ { "group_size": 8, "bits": 4 } ],
        "generator": { "name": "numpy",
                       "entropy": { "seed_multiplier": 1, "tokens_multiplier": 1, "offset": 0 } }
    }"#;
    let (_, out) = run_protocol(tmp.path(), text, "run");
    // A root manifest that already pins something else, which a pin must not drop.
    let root = tmp.path().join("manifest.json");
    let old = serde_json::json!({
        "format": "evidence-pins/1",
        "about": "",
        "evidence": { "older": { "files": { "manifest.json": "00" } } }
    });
    std::fs::write(&root, old.to_string()).unwrap();
    let pin = |dir: &Path| {
        runner(&[
            "pin",
            "--manifest",
            root.to_str().unwrap(),
            dir.to_str().unwrap(),
        ])
    };

    // Paths are relative to the root manifest's directory.
    let result = Command::new(env!("CARGO_BIN_EXE_runner"))
        .current_dir(tmp.path())
        .args(["pin", "run"])
        .output()
        .unwrap();
    let stdout = String::from_utf8(result.stdout).unwrap();
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    assert!(stdout.contains("pinned run: 6 files (new)"), "{stdout}");
    assert!(stdout.contains("kept older"), "{stdout}");
    let pinned = json(&root);
    assert_eq!(pinned["evidence"]["older"], old["evidence"]["older"]);
    assert_eq!(
        pinned["evidence"]["run"]["files"]
            .as_object()
            .unwrap()
            .len(),
        6
    );

    // A run whose results were edited does not pass the audit: refused, manifest untouched.
    let before = std::fs::read(&root).unwrap();
    let results = out.join("results.json");
    let edited =
        std::fs::read_to_string(&results)
            .unwrap()
            .replacen("\"tokens\": 16", "\"tokens\": 17", 1);
    std::fs::write(&results, edited).unwrap();
    let result = pin(Path::new("run"));
    let stderr = String::from_utf8(result.stderr).unwrap();
    assert_eq!(result.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("does not pass the audit, so nothing was pinned"),
        "{stderr}"
    );
    assert!(stderr.contains("FAIL"), "{stderr}");
    assert_eq!(std::fs::read(&root).unwrap(), before);
}
