//! The archived evidence passes, in full, as a user audits it.

use std::process::Command;

use audit::Checked;

use crate::support::{assert_pass, small_run, workspace};

#[test]
fn the_packed_kv_archive_passes_with_every_input_rederived() {
    let report = audit::audit_dir(&workspace().join("evidence/packed-kv"), &workspace());
    assert_pass(&report);
    assert_eq!(report.counted(Checked::InputsRederived), 18);
    assert_eq!(report.counted(Checked::Comparisons), 144);
    assert_eq!(report.counted(Checked::Segments), 396);
    assert_eq!(report.counted(Checked::Codes), 2_912_256);
    assert_eq!(report.counted(Checked::ChartMarkers), 48);
}

#[test]
fn the_small_run_passes() {
    let report = audit::audit_dir(small_run(), &workspace());
    assert_pass(&report);
    // 2 seeds x 2 lengths x 3 distributions, each with 3 settings and 5 policies.
    assert_eq!(report.counted(Checked::InputsRederived), 12);
    assert_eq!(report.counted(Checked::Comparisons), 96);
}

#[test]
fn plain_audit_finds_the_root_manifest_above_the_current_directory_or_says_how() {
    let tmp = tempfile::tempdir().unwrap();
    let nested = tmp.path().join("evidence/some-run");
    std::fs::create_dir_all(&nested).unwrap();
    // A run's own manifest.json is passed over; the root one above it is used.
    std::fs::write(
        nested.join("manifest.json"),
        r#"{"format": "packed-kv-evidence/1"}"#,
    )
    .unwrap();
    let audit_in = |dir: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_audit"))
            .current_dir(dir)
            .output()
            .expect("audit starts")
    };

    let out = audit_in(&nested);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("no root manifest"), "{stderr}");
    assert!(stderr.contains("`audit DIR`"), "{stderr}");
    assert!(out.stdout.is_empty());

    std::fs::write(
        tmp.path().join("manifest.json"),
        r#"{"format": "evidence-pins/1", "about": "", "evidence": {}}"#,
    )
    .unwrap();
    assert_eq!(
        audit::find_root_manifest(&nested),
        Some(std::path::PathBuf::from("../../manifest.json"))
    );
    let out = audit_in(&nested);
    let stdout = String::from_utf8(out.stdout).unwrap();
    // It audited the root manifest two levels up (which pins nothing, so FAIL).
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.starts_with("FAIL ../../manifest.json"), "{stdout}");
    assert!(stdout.contains("pins no evidence"), "{stdout}");
}

/// A checkout whose text files have CRLF line endings (`core.autocrlf=true`, as Git for Windows
/// sets it) audits the archive as the LF one does: sources are hashed LF-normalised, and
/// `.gitattributes` keeps evidence, the root manifest and fixtures byte for byte. Without the
/// models, for time: what line endings can change (source hashes, the files the passes read) is
/// checked here, and CI's audit step re-runs the passes on this workspace, whose evidence bytes
/// are these. So the generated evidence PASSes, the model evidence is UNVERIFIED, and so is the
/// whole (exit status 3), with no FAIL.
#[test]
fn a_crlf_checkout_audits_the_archived_evidence_as_the_lf_one_does() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let clone = tmp.path().join("crlf");
    let cloned = Command::new("git")
        .args(["clone", "--quiet", "-c", "core.autocrlf=true"])
        .arg(workspace())
        .arg(&clone)
        .status()
        .expect("git starts");
    assert!(cloned.success());
    let read = |path: &str| std::fs::read(clone.join(path)).unwrap();
    let crlf = |bytes: &[u8]| bytes.windows(2).any(|w| w == b"\r\n");
    // The sources were converted (else this test would check nothing); the evidence was not.
    assert!(crlf(&read("README.md")));
    assert!(crlf(&read("crates/kvcodec/src/lib.rs")));
    for path in [
        "manifest.json",
        "evidence/packed-kv/summary.md",
        "evidence/kv-methods/results.json",
        "evidence/model-quality/quality-vs-bytes.svg",
    ] {
        assert!(!read(path).contains(&b'\r'), "{path}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_audit"))
        .arg("--no-models")
        .current_dir(&clone)
        .output()
        .expect("audit starts");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    assert!(out.stderr.is_empty());
    assert!(stdout.ends_with("\nUNVERIFIED\n"), "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
    for dir in [
        "packed-kv",
        "widths-and-modes",
        "gaussian-d32",
        "gaussian-d64",
    ] {
        assert!(
            stdout.contains(&format!("PASS evidence/{dir}\n")),
            "{dir}:\n{stdout}"
        );
    }
    for dir in [
        "real-minilm",
        "real-smollm2",
        "real-gemma3",
        "model-quality",
        "kv-methods",
        "model-quality-gemma3",
        "model-quality-corpus",
        "model-quality-code",
        "model-quality-2048",
        "model-quality-layers",
        "model-quality-8192",
        "kv-methods-2048",
        "kv-methods-8192",
    ] {
        assert!(
            stdout.contains(&format!("UNVERIFIED evidence/{dir}\n")),
            "{dir}:\n{stdout}"
        );
    }
    assert!(stdout.contains("pinned file hashes"), "{stdout}");
}
