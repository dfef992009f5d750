//! manifest.json: what produced a run and the SHA-256 of everything it wrote.
//!
//! Provenance (tool, platform, git, source hashes) is the `evidence` crate's
//! ([`evidence::provenance`]); output hashes are over the raw bytes of each file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::protocol::Protocol;
use evidence::hashing::sha256_hex;
pub use evidence::provenance::{Git, Platform, Tool};
use evidence::provenance::{git_info, source_hashes, source_roots};
pub use models::ModelRecord;

/// Identifies the manifest layout, so readers can refuse one they do not know.
pub const MANIFEST_FORMAT: &str = "packed-kv-evidence/1";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub tool: Tool,
    pub platform: Platform,
    /// Where the protocol came from: the embedded frozen file or a user-given path.
    pub protocol_source: String,
    pub protocol: Protocol,
    /// For a shard's run: which slice of the protocol it ran, and the protocol's hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardRecord>,
    /// For a merged run: the shards it was merged from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged_from: Option<Vec<MergedShard>>,
    pub counts: Counts,
    /// Worker threads the run's comparisons were computed on (results do not depend on it;
    /// timed calls always run alone). Absent for a merged run: each shard's manifest has its
    /// own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    /// For a model's inputs: which model file produced them and the token ids of each pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelRecord>,
    pub git: Option<Git>,
    /// Files and directories whose contents produce a run (relative to the workspace root).
    pub source_roots: Vec<String>,
    /// SHA-256 of each source file, LF-normalised, keyed by relative path.
    pub sources: BTreeMap<String, String>,
    /// SHA-256 of each output file's raw bytes, keyed by file name.
    pub outputs: BTreeMap<String, String>,
}

/// Which slice of which protocol a shard's run is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardRecord {
    /// 1 to `count`.
    pub index: usize,
    /// How many shards the protocol was cut into.
    pub count: usize,
    /// [`protocol_sha256`] of the whole protocol.
    pub protocol_sha256: String,
}

pub use evidence::shard::MergedShard;

/// SHA-256 of a protocol as compact JSON with its object keys sorted (serde_json's own order),
/// so that anyone can recompute it from the `protocol` object of a manifest.
pub fn protocol_sha256(protocol: &Protocol) -> String {
    let value = serde_json::to_value(protocol).expect("a protocol serializes");
    sha256_hex(value.to_string().as_bytes())
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    pub inputs: usize,
    pub comparisons: usize,
    /// Raw timing measurements in timings.json (0 when the protocol takes none).
    pub timings: usize,
}

impl Manifest {
    /// A manifest for a run of `protocol`, before output hashes are added.
    pub fn new(protocol_source: String, protocol: Protocol, counts: Counts) -> Manifest {
        Manifest {
            format: MANIFEST_FORMAT.into(),
            tool: Tool::current(),
            platform: Platform::current(),
            protocol_source,
            protocol,
            shard: None,
            merged_from: None,
            counts,
            threads: None,
            model: None,
            git: git_info(),
            source_roots: source_roots(),
            sources: source_hashes(),
            outputs: BTreeMap::new(),
        }
    }
}
