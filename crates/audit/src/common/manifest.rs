//! The manifest pieces every evidence format shares, read as the evidence format gives them
//! (unknown fields refused): the tool that made a run, where it ran, the commit it records, the
//! root manifest that pins archived evidence, and the check of a model's weight file.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::common::files;
use crate::common::models::ModelName;
use crate::common::report::{Note, Problem, Report};

/// Largest model weight file the audit hashes (the pinned ones are about 100 MB).
pub const MAX_MODEL_BYTES: u64 = 4 << 30;

/// The root manifest format this audit reads.
pub const ROOT_MANIFEST_FORMAT: &str = "evidence-pins/1";

/// The tool that made the run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// `runner`.
    pub name: String,
    /// Its version.
    pub version: String,
    /// `rustc --version` at build time.
    pub rustc: String,
    /// Cargo profile.
    pub profile: String,
    /// Versions of the crates that do the work.
    pub crates: BTreeMap<String, String>,
}

/// Where the run was made.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Platform {
    /// Operating system.
    pub os: String,
    /// CPU architecture.
    pub arch: String,
    /// Target triple.
    pub target: String,
}

/// The recorded commit.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Git {
    /// Full object id of HEAD at run time.
    pub commit: String,
    /// Whether every source matched that commit at run time.
    pub sources_match_commit: bool,
}

/// The root manifest that pins archived evidence.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RootManifest {
    /// [`ROOT_MANIFEST_FORMAT`].
    pub format: String,
    /// Free text for readers.
    pub about: String,
    /// Pinned directories, by path relative to the root manifest.
    pub evidence: BTreeMap<String, PinnedDir>,
}

/// One pinned directory.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinnedDir {
    /// SHA-256 of every file, by name.
    pub files: BTreeMap<String, String>,
}

/// With `models` (`audit --models DIR`), hashes `DIR/<name>/<weight file>` and requires the
/// recorded SHA-256; without it, notes that the file was not checked.
pub fn check_weight_file(
    model: ModelName,
    recorded: &str,
    models: Option<&Path>,
    report: &mut Report,
) {
    let pin = model.pin();
    let path = format!("{}/{}", model.name(), pin.weight_file);
    let Some(dir) = models else {
        report.note(Note::ModelFileNotChecked(path));
        return;
    };
    let shown = dir.join(&path).display().to_string();
    match files::sha256_confined(dir, &path, MAX_MODEL_BYTES) {
        Ok(actual) if actual == recorded => {
            report.note(Note::ModelFileChecked(shown));
        }
        Ok(actual) => report.fail(Problem::ModelFile {
            path: shown,
            reason: format!("SHA-256 {actual}, recorded {recorded}"),
        }),
        Err(e) => report.fail(Problem::ModelFile {
            path: shown,
            reason: e.to_string(),
        }),
    }
}
