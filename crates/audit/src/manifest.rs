//! The audit's own reading of `manifest.json` and of the root manifest. Fields are declared here
//! from the evidence format, not shared with the runner, and unknown fields are refused: the audit
//! cannot vouch for what it does not read.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::protocol::Protocol;

/// The evidence manifest format this audit reads.
pub const MANIFEST_FORMAT: &str = "packed-kv-evidence/1";
/// The root manifest format this audit reads.
pub const ROOT_MANIFEST_FORMAT: &str = "evidence-pins/1";

/// An evidence directory's manifest.json.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`].
    pub format: String,
    /// What made the run.
    pub tool: Tool,
    /// Where it ran.
    pub platform: Platform,
    /// `embedded <path>` for the frozen protocol, or the protocol file's path.
    pub protocol_source: String,
    /// The protocol as run.
    pub protocol: Protocol,
    /// For a shard's run: which slice of the protocol, and the protocol's hash.
    #[serde(default)]
    pub shard: Option<ShardRecord>,
    /// For a merged run: the shards it was merged from.
    #[serde(default)]
    pub merged_from: Option<Vec<MergedShard>>,
    /// How many inputs, comparisons and timings the run wrote.
    pub counts: Counts,
    /// Worker threads a run's comparisons ran on; absent in a merged run.
    #[serde(default)]
    pub threads: Option<usize>,
    /// The commit the runner was built from, if it was built in a git work tree.
    pub git: Option<Git>,
    /// Files and directories whose contents produce a run.
    pub source_roots: Vec<String>,
    /// LF-normalised SHA-256 of each source file.
    pub sources: BTreeMap<String, String>,
    /// SHA-256 of each output file.
    pub outputs: BTreeMap<String, String>,
}

/// Which slice of the protocol a shard's run is: inputs at positions
/// `floor((index - 1) * U / count)` up to `floor(index * U / count)` of the U inputs in run order.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardRecord {
    /// 1 to `count`.
    pub index: usize,
    /// How many slices.
    pub count: usize,
    /// SHA-256 of the protocol object as compact JSON with sorted keys.
    pub protocol_sha256: String,
}

/// One shard of a merged run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergedShard {
    /// 1 to N.
    pub index: usize,
    /// SHA-256 of the shard's manifest.json (recorded; the shard itself is not here to check).
    pub manifest_sha256: String,
}

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

/// Counts the manifest records.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Counts {
    /// Inputs.
    pub inputs: usize,
    /// Comparisons.
    pub comparisons: usize,
    /// Raw timings.
    pub timings: usize,
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
