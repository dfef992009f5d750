//! The audit's own reading of a packed-KV `manifest.json`, and its checks against the protocol:
//! the shard or merge record ([`Scope`]), the counts, the tool and a protocol read from the tree,
//! and the model record. Fields are declared here from the evidence format, not shared with the
//! runner, and unknown fields are refused: the audit cannot vouch for what it does not read.
//! (What both formats' manifests share, and the root manifest, are in
//! [`crate::common::manifest`].)

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

use crate::common::files::{self, MAX_TEXT_BYTES};
use crate::common::hashes;
use crate::common::manifest::{Git, Platform, Tool};
use crate::common::report::{Problem, Report};
use crate::packed_kv::plan::{self, InputPlan};
use crate::packed_kv::protocol::{self, Protocol};
use crate::packed_kv::timings;

/// The evidence manifest format this audit reads.
pub const MANIFEST_FORMAT: &str = "packed-kv-evidence/1";
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
    /// For a model's inputs: the model file (by hash) and the token ids of each pass; present
    /// exactly when the protocol has a model ([`check_model`]).
    #[serde(default)]
    pub model: Option<ModelRecord>,
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

/// Whether a merged run's record lists shards 1 to N in order, N at most `units` (a shard
/// holds at least one unit: an input, a text), each with a SHA-256 in lowercase hex.
pub(crate) fn merged_from_is_well_formed(shards: &[MergedShard], units: usize) -> bool {
    let in_order = shards.iter().map(|s| s.index).eq(1..=shards.len());
    let hex = shards.iter().all(|s| {
        s.manifest_sha256.len() == 64
            && s.manifest_sha256
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    });
    in_order && shards.len() <= units && hex
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

/// Where a run's model inputs came from, as manifest.json records it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRecord {
    /// `minilm` or `smollm2` (read as text, so a wrong name is named rather than unparsed).
    pub name: String,
    /// The PyPI wheel the files come from (`name==version`).
    pub wheel: String,
    /// The weight file's name.
    pub weight_file: String,
    /// Its SHA-256, lower-case hex.
    pub weight_sha256: String,
    /// Token ids per pass, by `t{text}_n{N}`.
    pub ids: BTreeMap<String, Vec<u32>>,
}

/// Checks the manifest's `model` record: present exactly when the protocol has a model; its
/// name the protocol's; its wheel, weight file and hash the audit's own pins
/// ([`crate::common::models::ModelName::pin`]); its ids exactly one list per pass of the inputs in
/// this directory (`inputs`: a shard's only its own), each of N ids below the vocabulary size,
/// and MiniLM's opening with `[CLS]` and closing with `[SEP]`.
///
/// The weight file itself is hashed when the model is re-run
/// ([`crate::packed_kv::model_inputs`]).
pub fn check_model(manifest: &Manifest, inputs: &[InputPlan], report: &mut Report) {
    let fail = |report: &mut Report, field: &str, found: String, expected: String| {
        report.fail(Problem::ModelRecord {
            field: field.to_string(),
            found,
            expected,
        })
    };
    let (source, record) = match (&manifest.protocol.model, &manifest.model) {
        (None, None) => return,
        (Some(_), None) => {
            return fail(
                report,
                "(record)",
                "absent".into(),
                "present: the protocol takes its inputs from a model".into(),
            );
        }
        (None, Some(_)) => {
            return fail(
                report,
                "(record)",
                "present".into(),
                "absent: the protocol draws its inputs".into(),
            );
        }
        (Some(source), Some(record)) => (source, record),
    };
    let model = source.name;
    let pin = model.pin();
    for (field, found, expected) in [
        ("name", record.name.as_str(), model.name()),
        ("wheel", &record.wheel, pin.wheel),
        ("weight_file", &record.weight_file, pin.weight_file),
        ("weight_sha256", &record.weight_sha256, pin.weight_sha256),
    ] {
        if found != expected {
            fail(report, field, format!("{found:?}"), format!("{expected:?}"));
        }
    }

    // One pass per (text, length) among this directory's inputs, with its length.
    let passes: BTreeMap<String, usize> = inputs
        .iter()
        .filter_map(|i| Some((i.pass()?, i.tokens)))
        .collect();
    let recorded: BTreeSet<&String> = record.ids.keys().collect();
    let expected: BTreeSet<&String> = passes.keys().collect();
    if recorded != expected {
        fail(
            report,
            "ids",
            format!("passes {recorded:?}"),
            format!("passes {expected:?}"),
        );
    }
    let shape = model.shape();
    for (pass, &tokens) in &passes {
        let Some(ids) = record.ids.get(pass) else {
            continue;
        };
        let field = format!("ids.{pass}");
        if ids.len() != tokens {
            fail(
                report,
                &field,
                format!("{} ids", ids.len()),
                format!("{tokens} ids"),
            );
            continue;
        }
        if let Some((i, id)) = ids
            .iter()
            .enumerate()
            .find(|(_, id)| **id >= shape.vocabulary)
        {
            fail(
                report,
                &field,
                format!("id {id} at position {i}"),
                format!("ids below {model}'s vocabulary of {}", shape.vocabulary),
            );
        }
        let (open, close) = model.markers();
        if open.is_some_and(|open| ids.first() != Some(&open))
            || close.is_some_and(|close| ids.last() != Some(&close))
        {
            let named =
                |marker: Option<u32>| marker.map_or("anything".to_string(), |id| id.to_string());
            fail(
                report,
                &field,
                format!("first {:?}, last {:?}", ids.first(), ids.last()),
                format!("{} first and {} last", named(open), named(close)),
            );
        }
    }
}

/// What part of its protocol a directory holds: all of it (a run or a merge of N shards), or
/// one shard's slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope {
    /// `(index, count)` for a shard's run.
    pub shard: Option<(usize, usize)>,
    /// N for a merged run.
    pub merged: Option<usize>,
}

/// Checks the manifest's shard or merge record against the protocol; None if the directory
/// cannot be checked further.
pub fn check_scope(
    manifest: &Manifest,
    manifest_bytes: &[u8],
    report: &mut Report,
) -> Option<Scope> {
    let inputs = manifest.protocol.input_count();
    let mut fail = |field, found: String, expected: String| {
        report.fail(Problem::Manifest {
            field,
            found,
            expected,
        })
    };
    let shard = match &manifest.shard {
        None => None,
        Some(record) => {
            if record.count == 0
                || !(1..=record.count).contains(&record.index)
                || record.count > inputs
            {
                fail(
                    "shard",
                    format!("{} of {}", record.index, record.count),
                    format!("1 <= index <= count <= {inputs} inputs"),
                );
                return None;
            }
            // The hash of the protocol object exactly as recorded: compact, keys sorted.
            let recorded = serde_json::from_slice::<serde_json::Value>(manifest_bytes)
                .ok()
                .and_then(|v| v.get("protocol").map(|p| p.to_string()))
                .map(|text| hashes::sha256_hex(text.as_bytes()));
            if recorded.as_deref() != Some(record.protocol_sha256.as_str()) {
                fail(
                    "shard.protocol_sha256",
                    record.protocol_sha256.clone(),
                    recorded.unwrap_or_default(),
                );
            }
            Some((record.index, record.count))
        }
    };
    let merged = match &manifest.merged_from {
        None => None,
        Some(shards) => {
            if !merged_from_is_well_formed(shards, inputs) {
                let indices: Vec<usize> = shards.iter().map(|s| s.index).collect();
                fail(
                    "merged_from",
                    format!("shards {indices:?}"),
                    "shards 1 to N, each once, in order, with their manifests' SHA-256".into(),
                );
                return None;
            }
            Some(shards.len())
        }
    };
    if shard.is_some() && merged.is_some() {
        fail(
            "shard",
            "both a shard and a merge".into(),
            "one or the other".into(),
        );
        return None;
    }
    // A run records the worker threads it used; a merge computed nothing (its shards' manifests
    // record theirs).
    match (merged, manifest.threads) {
        (None, Some(1..)) | (Some(_), None) => {}
        (None, found) => fail(
            "threads",
            format!("{found:?}"),
            "the worker thread count, at least 1".into(),
        ),
        (Some(_), Some(found)) => fail(
            "threads",
            found.to_string(),
            "absent in a merged run".into(),
        ),
    }
    Some(Scope { shard, merged })
}

/// The manifest's counts, tool, and (for a protocol from the tree) the protocol itself.
pub fn check_manifest_fields(tree: &Path, manifest: &Manifest, scope: Scope, report: &mut Report) {
    let p = &manifest.protocol;
    let inputs = plan::inputs_of(p, scope.shard).len();
    let comparisons = inputs * p.configurations();
    let timings = p
        .timing
        .map_or(0, |t| comparisons * timings::OPERATIONS.len() * t.repeats);
    for (field, found, expected) in [
        ("counts.inputs", manifest.counts.inputs, inputs),
        (
            "counts.comparisons",
            manifest.counts.comparisons,
            comparisons,
        ),
        ("counts.timings", manifest.counts.timings, timings),
    ] {
        if found != expected {
            report.fail(Problem::Manifest {
                field,
                found: found.to_string(),
                expected: expected.to_string(),
            });
        }
    }
    if manifest.tool.name != "runner" {
        report.fail(Problem::Manifest {
            field: "tool.name",
            found: manifest.tool.name.clone(),
            expected: "runner".into(),
        });
    }
    // A protocol read from a file of the tree must be that file's protocol.
    let source = manifest.protocol_source.as_str();
    let path = source.strip_prefix("embedded ").unwrap_or(source);
    if path.starts_with("experiments/") {
        let from_tree = files::read_confined(tree, path, MAX_TEXT_BYTES)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<protocol::Protocol>(&bytes).ok());
        if from_tree.as_ref() != Some(p) {
            report.fail(Problem::Manifest {
                field: "protocol",
                found: "the protocol recorded".into(),
                expected: format!("the tree's {path}"),
            });
        }
    }
}
