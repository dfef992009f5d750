//! File-level checks: output hashes against the manifest, and source hashes against a tree.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::report::Report;

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Source hashes are over LF-normalised bytes (CRLF pairs lose their CR).
pub fn source_hash(bytes: &[u8]) -> String {
    let mut normalised = Vec::with_capacity(bytes.len());
    let mut iter = bytes.iter().peekable();
    while let Some(&b) = iter.next() {
        if b == b'\r' && iter.peek() == Some(&&b'\n') {
            continue;
        }
        normalised.push(b);
    }
    sha256_hex(&normalised)
}

/// Every file in `dir` must be listed (or be the manifest) and every listed file must exist and
/// hash to its recorded value.
pub fn check_outputs(
    dir: &Path,
    outputs: &BTreeMap<String, String>,
    label: &str,
    report: &mut Report,
) {
    for (name, expected) in outputs {
        match std::fs::read(dir.join(name)) {
            Ok(bytes) => {
                let actual = sha256_hex(&bytes);
                if &actual != expected {
                    report.fail(format!(
                        "output hash mismatch: {name} (manifest {}, file {})",
                        short(expected),
                        short(&actual)
                    ));
                }
            }
            Err(e) => report.fail(format!("missing output {name}: {e}")),
        }
        report.count(label, 1);
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name != "manifest.json" && !outputs.contains_key(&name) {
                report.fail(format!("unlisted file {name} in the evidence directory"));
            }
        }
    }
}

/// Compares the manifest's source hashes with the files under the same roots in `tree`.
pub fn check_sources(
    tree: &Path,
    roots: &[String],
    sources: &BTreeMap<String, String>,
    report: &mut Report,
) {
    let mut in_tree = BTreeSet::new();
    for root in roots {
        let path = tree.join(root);
        if !path.exists() {
            report.fail(format!(
                "source root {root} is missing from the tree {}",
                tree.display()
            ));
            continue;
        }
        for entry in walkdir::WalkDir::new(&path).into_iter().flatten() {
            if entry.file_type().is_file() {
                if let Ok(relative) = entry.path().strip_prefix(tree) {
                    let parts: Vec<_> = relative.iter().map(|p| p.to_string_lossy()).collect();
                    in_tree.insert(parts.join("/"));
                }
            }
        }
    }
    for (path, expected) in sources {
        report.count("source hashes", 1);
        match std::fs::read(tree.join(path)) {
            Ok(bytes) => {
                let actual = source_hash(&bytes);
                if &actual != expected {
                    report.fail(format!(
                        "source hash mismatch: {path} differs from the tree (manifest {}, tree {})",
                        short(expected),
                        short(&actual)
                    ));
                }
            }
            Err(_) => report.fail(format!("source hash mismatch: {path} is not in the tree")),
        }
    }
    for path in in_tree.iter().filter(|p| !sources.contains_key(*p)) {
        report.fail(format!(
            "source hash mismatch: {path} is in the tree but not in the manifest"
        ));
    }
}

fn short(hash: &str) -> &str {
    &hash[..hash.len().min(12)]
}
