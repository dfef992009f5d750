//! manifest.json: what produced a run and the SHA-256 of everything it wrote.
//!
//! Source hashes are computed at build time (see build.rs) over LF-normalised bytes; output
//! hashes are over the raw bytes of each file. The git commit is read at run time from the
//! workspace the binary was built in, when there is one.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::hashing::{sha256_hex, source_hash};
use crate::protocol::Protocol;

/// Build-time facts: SOURCE_ROOTS, SOURCES, CRATE_VERSIONS, RUSTC_VERSION, TARGET, PROFILE,
/// WORKSPACE_ROOT.
pub mod build_info {
    include!(concat!(env!("OUT_DIR"), "/build_info.rs"));
}

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

/// Where a run's model inputs came from: the model file (by hash) and, per pass (a text's first
/// N tokens, `t{text}_n{tokens}`), the token ids the model saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRecord {
    /// `minilm` or `smollm2`.
    pub name: models::ModelName,
    /// The PyPI wheel the files come from (`name==version`).
    pub wheel: String,
    /// The weight file's name.
    pub weight_file: String,
    /// Its SHA-256, checked against the pin before the run.
    pub weight_sha256: String,
    /// Token ids per pass.
    pub ids: BTreeMap<String, Vec<u32>>,
}

impl ModelRecord {
    /// The record of `model`'s pinned files with the given passes' ids.
    pub fn new(model: models::ModelName, ids: BTreeMap<String, Vec<u32>>) -> ModelRecord {
        ModelRecord {
            name: model,
            wheel: model.wheel().into(),
            weight_file: model.weight_file().into(),
            weight_sha256: model.weight_sha256().into(),
            ids,
        }
    }
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

/// One shard a merged run was made from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergedShard {
    /// 1 to N.
    pub index: usize,
    /// SHA-256 of that shard's manifest.json, as it was merged.
    pub manifest_sha256: String,
}

/// SHA-256 of a protocol as compact JSON with its object keys sorted (serde_json's own order),
/// so that anyone can recompute it from the `protocol` object of a manifest.
pub fn protocol_sha256(protocol: &Protocol) -> String {
    let value = serde_json::to_value(protocol).expect("a protocol serializes");
    sha256_hex(value.to_string().as_bytes())
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    pub version: String,
    pub rustc: String,
    pub profile: String,
    pub crates: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Platform {
    pub os: String,
    pub arch: String,
    pub target: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    pub inputs: usize,
    pub comparisons: usize,
    /// Raw timing measurements in timings.json (0 when the protocol takes none).
    pub timings: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Git {
    pub commit: String,
    /// False when a source file differs from that commit (the run came from uncommitted code).
    pub sources_match_commit: bool,
}

impl Tool {
    /// This runner: its name and version, rustc, profile and the recorded crates' versions.
    pub fn current() -> Tool {
        Tool {
            name: env!("CARGO_PKG_NAME").into(),
            version: env!("CARGO_PKG_VERSION").into(),
            rustc: build_info::RUSTC_VERSION.into(),
            profile: build_info::PROFILE.into(),
            crates: build_info::CRATE_VERSIONS
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        }
    }
}

impl Platform {
    /// The platform this binary runs on.
    pub fn current() -> Platform {
        Platform {
            os: std::env::consts::OS.into(),
            arch: std::env::consts::ARCH.into(),
            target: build_info::TARGET.into(),
        }
    }
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
            source_roots: build_info::SOURCE_ROOTS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            sources: source_hashes(),
            outputs: BTreeMap::new(),
        }
    }
}

/// The build-time source hashes.
pub fn source_hashes() -> BTreeMap<String, String> {
    build_info::SOURCES
        .iter()
        .map(|(p, h)| (p.to_string(), h.to_string()))
        .collect()
}

/// Lower-case hex SHA-256 of a file's raw bytes.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    // Streamed: arrays.npz can be far larger than anything else a run holds.
    let mut hasher = Sha256::new();
    let mut file = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

/// The commit the binary's workspace is at, and whether the sources match it.
pub fn git_info() -> Option<Git> {
    let root = build_info::WORKSPACE_ROOT;
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "HEAD"])?;
    let mut status_args = vec!["status", "--porcelain", "--"];
    status_args.extend(build_info::SOURCE_ROOTS);
    let status = git(&status_args)?;
    // The build-time hashes must also match the tree, or the binary is older than the checkout.
    let tree_matches_build = build_info::SOURCES.iter().all(|(path, hash)| {
        std::fs::read(Path::new(root).join(path))
            .map(|bytes| source_hash(&bytes) == *hash)
            .unwrap_or(false)
    });
    Some(Git {
        commit,
        sources_match_commit: status.is_empty() && tree_matches_build,
    })
}
