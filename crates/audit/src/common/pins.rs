//! The root manifest (`evidence-pins/1`): where `audit` finds it, and the check of what it pins.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::common::files::{self, MAX_TEXT_BYTES};
use crate::common::hashes;
use crate::common::manifest::{ROOT_MANIFEST_FORMAT, RootManifest};
use crate::common::npz;
use crate::common::outputs::{MANIFEST, parse_json};
use crate::common::report::{Checked, Problem, Report};

/// The root manifest `audit` uses when given no directory: `manifest.json` in `start` or the
/// nearest directory above it whose `format` is the root manifest's (a run's own manifest.json,
/// met inside an evidence directory, is passed over). The path is `start`-relative (`../..`), so
/// reports name it as a user in `start` would.
pub fn find_root_manifest(start: &Path) -> Option<PathBuf> {
    let mut relative = PathBuf::new();
    for dir in start.ancestors() {
        let candidate = dir.join(MANIFEST);
        let is_root = files::read_regular(&candidate, MAX_TEXT_BYTES)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .is_some_and(|v| {
                v.get("format").and_then(|f| f.as_str()) == Some(ROOT_MANIFEST_FORMAT)
            });
        if is_root {
            return Some(relative.join(MANIFEST));
        }
        relative.push("..");
    }
    None
}

/// Audits what a root manifest pins: each pinned file's hash, then each directory in full with
/// `audit_dir` (the crate's `audit_dir_with`, which chooses a directory's checker by its format).
pub fn audit_pins(root_manifest: &Path, audit_dir: impl Fn(&Path) -> Report) -> Vec<Report> {
    let mut pins = Report::new(root_manifest.display().to_string());
    let root: RootManifest = match files::read_regular(root_manifest, MAX_TEXT_BYTES) {
        Ok(bytes) => {
            let format = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.get("format").and_then(|f| f.as_str()).map(String::from));
            if let Some(found) = format.filter(|f| f != ROOT_MANIFEST_FORMAT) {
                pins.fail(Problem::Format {
                    file: root_manifest.display().to_string(),
                    found,
                    expected: ROOT_MANIFEST_FORMAT,
                });
                return vec![pins];
            }
            match parse_json(&root_manifest.display().to_string(), &bytes) {
                Ok(root) => root,
                Err(problem) => {
                    pins.fail(problem);
                    return vec![pins];
                }
            }
        }
        Err(e) => {
            pins.fail(Problem::File(e));
            return vec![pins];
        }
    };
    if root.evidence.is_empty() {
        pins.fail(Problem::Pin("it pins no evidence".into()));
    }
    // Relative to the root manifest's directory (the current one for a bare `manifest.json`).
    let base = root_manifest.parent().unwrap_or(Path::new(""));
    let mut reports = Vec::new();
    for (dir, pinned) in &root.evidence {
        let path = match files::confined_path(base, dir) {
            Ok(path) => path,
            Err(e) => {
                pins.fail(Problem::Pin(e.to_string()));
                continue;
            }
        };
        if !pinned.files.contains_key(MANIFEST) {
            pins.fail(Problem::Pin(format!(
                "{dir}: its manifest.json is not pinned"
            )));
        }
        let present: BTreeSet<String> = match files::list_dir(&path) {
            Ok(entries) => entries.into_iter().map(|(name, _)| name).collect(),
            Err(e) => {
                pins.fail(Problem::File(e));
                BTreeSet::new()
            }
        };
        for name in present.iter().filter(|n| !pinned.files.contains_key(*n)) {
            pins.fail(Problem::Pin(format!("{dir}/{name} is not pinned")));
        }
        for (name, recorded) in &pinned.files {
            let cap = npz::zip::MAX_ARCHIVE_BYTES;
            match files::plain_components(name)
                .ok()
                .filter(|parts| parts.len() == 1)
                .map(|_| files::sha256_confined(&path, name, cap))
            {
                Some(Ok(actual)) => {
                    if &actual != recorded {
                        pins.fail(Problem::Hash {
                            file: format!("{dir}/{name}"),
                            recorded: hashes::short(recorded),
                            actual: hashes::short(&actual),
                        });
                    }
                }
                Some(Err(e)) => pins.fail(Problem::File(e)),
                None => pins.fail(Problem::Pin(format!(
                    "{dir}: {name:?} is not a plain file name"
                ))),
            }
            pins.count(Checked::PinnedFiles, 1);
        }
        reports.push(audit_dir(&path));
    }
    reports.insert(0, pins);
    reports
}
