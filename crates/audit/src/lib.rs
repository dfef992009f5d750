//! Independent audit of packed-KV evidence.
//!
//! The audit trusts nothing the runner wrote: it checks file hashes, then re-decodes every code
//! with its own decoder ([`decoder`]), recomputes attention with a different expression
//! ([`attention`]), and recomputes every metric, payload and summary figure. It does not depend
//! on the codec or the runner crates and shares no code with them.
//!
//! - [`audit_dir`]: one evidence directory (`audit DIR`);
//! - [`audit_pins`]: everything a root manifest pins (`audit`).

pub mod arrays;
pub mod attention;
pub mod decoder;
pub mod hashes;
pub mod model;
pub mod report;
pub mod study;

use std::path::{Path, PathBuf};

use model::{MANIFEST_FORMAT, Manifest, ROOT_MANIFEST_FORMAT, RootManifest, read_json};
pub use report::Report;

/// The workspace this audit was built from: where source hashes are checked by default.
pub fn default_tree() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Audits one evidence directory; source hashes are compared with the files in `tree`.
pub fn audit_dir(dir: &Path, tree: &Path) -> Report {
    let mut report = Report::new(dir.display().to_string());
    if !dir.is_dir() {
        report.fail(format!("{} is not a directory", dir.display()));
        return report;
    }
    let manifest: Manifest = match read_json(&dir.join("manifest.json")) {
        Ok(m) => m,
        Err(problem) => {
            report.fail(problem);
            return report;
        }
    };
    if manifest.format != MANIFEST_FORMAT {
        report.fail(format!(
            "manifest.json format is {:?}; this audit reads {MANIFEST_FORMAT:?}",
            manifest.format
        ));
        return report;
    }
    let mut required = vec![
        "arrays.npz",
        "results.json",
        "summary.json",
        "summary.md",
        "error-vs-bytes.svg",
    ];
    if manifest.protocol.timing.is_some() {
        required.push("timings.json");
    }
    for required in required {
        if !manifest.outputs.contains_key(required) {
            report.fail(format!("manifest.json does not list the output {required}"));
        }
    }
    hashes::check_outputs(dir, &manifest.outputs, "output hashes", &mut report);
    let tree = tree.canonicalize().unwrap_or_else(|_| tree.to_path_buf());
    hashes::check_sources(
        &tree,
        &manifest.source_roots,
        &manifest.sources,
        &mut report,
    );
    report.note(format!(
        "source hashes compared with the tree at {}",
        tree.display()
    ));
    study::check_study(dir, &manifest.protocol, &mut report);
    report
}

/// Audits what a root manifest pins: each pinned file's hash, then each directory in full.
pub fn audit_pins(root_manifest: &Path, tree: &Path) -> Vec<Report> {
    let mut pins = Report::new(root_manifest.display().to_string());
    let root: RootManifest = match read_json(root_manifest) {
        Ok(r) => r,
        Err(problem) => {
            pins.fail(problem);
            return vec![pins];
        }
    };
    if root.format != ROOT_MANIFEST_FORMAT {
        pins.fail(format!(
            "root manifest format is {:?}; this audit reads {ROOT_MANIFEST_FORMAT:?}",
            root.format
        ));
        return vec![pins];
    }
    if root.evidence.is_empty() {
        pins.fail("the root manifest pins no evidence");
    }
    let base = root_manifest.parent().unwrap_or(Path::new(""));
    let mut reports = Vec::new();
    for (dir, pinned) in &root.evidence {
        let path = base.join(dir);
        hashes::check_outputs(&path, &pinned.files, "pinned file hashes", &mut pins);
        if !pinned.files.contains_key("manifest.json") {
            pins.fail(format!(
                "{dir}: the root manifest does not pin its manifest.json"
            ));
        }
        reports.push(audit_dir(&path, tree));
    }
    reports.insert(0, pins);
    reports
}
