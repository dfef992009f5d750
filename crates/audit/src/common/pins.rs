//! The root manifest (`evidence-pins/1`): where `audit` finds it, and the check of what it pins:
//! each pinned directory opened once and audited through that handle, its pins compared with the
//! hashes of the bytes the audit read ([`audit_pins`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::common::files::{self, ConfinedDir, FileError, MAX_TEXT_BYTES};
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

/// Audits what a root manifest pins: each pinned directory is opened once, from the root
/// manifest's own directory one name at a time without following a link
/// ([`ConfinedDir::open_dir`]), audited in full with `audit_dir` (the crate's `audit_opened`,
/// which chooses a directory's checker by its format) through that handle, and then its files'
/// hashes are compared with the pins: the hash of the bytes the audit read and parsed, as the
/// handle recorded them ([`ConfinedDir::hashes`]), never a second read. A pinned file the audit
/// did not read (one it refused, say) is hashed through the same handle.
pub fn audit_pins(root_manifest: &Path, audit_dir: impl Fn(&ConfinedDir) -> Report) -> Vec<Report> {
    let mut pins = Report::new(root_manifest.display().to_string());
    // Relative to the root manifest's directory (the current one for a bare `manifest.json`).
    let base_path = root_manifest.parent().unwrap_or(Path::new(""));
    let read = ConfinedDir::open(base_path).and_then(|base| {
        let name = root_manifest
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| FileError::NotRegular {
                path: root_manifest.to_path_buf(),
            })?;
        let bytes = base.read(name, MAX_TEXT_BYTES)?;
        Ok((base, bytes))
    });
    let (base, root): (ConfinedDir, RootManifest) = match read {
        Ok((base, bytes)) => {
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
                Ok(root) => (base, root),
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
    let mut reports = Vec::new();
    for (dir, pinned) in &root.evidence {
        let handle = match base.open_dir(dir) {
            Ok(handle) => handle,
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
        let report = audit_dir(&handle);
        let present: BTreeSet<String> = match handle.list() {
            Ok(entries) => entries.into_iter().map(|(name, _)| name).collect(),
            Err(e) => {
                pins.fail(Problem::File(e));
                BTreeSet::new()
            }
        };
        for name in present.iter().filter(|n| !pinned.files.contains_key(*n)) {
            pins.fail(Problem::Pin(format!("{dir}/{name} is not pinned")));
        }
        let read = handle.hashes();
        for (name, recorded) in &pinned.files {
            if !files::plain_components(name).is_ok_and(|parts| parts.len() == 1) {
                pins.fail(Problem::Pin(format!(
                    "{dir}: {name:?} is not a plain file name"
                )));
                pins.count(Checked::PinnedFiles, 1);
                continue;
            }
            let actual = match read.get(name).map(Vec::as_slice) {
                // What the audit parsed. Each file is read once; two reads that differ would
                // mean the pins and the checks saw different bytes.
                Some([first, rest @ ..]) => {
                    if rest.iter().any(|other| other != first) {
                        pins.fail(Problem::Pin(format!(
                            "{dir}/{name} changed while it was audited"
                        )));
                    }
                    Ok(first.clone())
                }
                _ => handle.sha256(name, npz::zip::MAX_ARCHIVE_BYTES),
            };
            match actual {
                Ok(actual) => {
                    if &actual != recorded {
                        pins.fail(Problem::Hash {
                            file: format!("{dir}/{name}"),
                            recorded: hashes::short(recorded),
                            actual: hashes::short(&actual),
                        });
                    }
                }
                Err(e) => pins.fail(Problem::File(e)),
            }
            pins.count(Checked::PinnedFiles, 1);
        }
        reports.push(report);
    }
    reports.insert(0, pins);
    reports
}
