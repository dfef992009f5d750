//! The manifest pieces every evidence format shares, read as the evidence format gives them
//! (unknown fields refused): the tool that made a run, where it ran, the commit it records, the
//! root manifest that pins archived evidence.

use std::collections::BTreeMap;

use serde::Deserialize;

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
