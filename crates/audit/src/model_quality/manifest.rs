//! A model-quality manifest.json and its checks: the tool, the thread count, a protocol read
//! from the tree, and the model record (the pinned file, one id list per text).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

use super::protocol::QualityProtocol;
use crate::common::files::{self, MAX_TEXT_BYTES};
use crate::common::manifest::{Git, Platform, Tool};
use crate::common::report::{Problem, Report};
use crate::packed_kv::manifest::{MergedShard, merged_from_is_well_formed};

/// A model-quality manifest.json.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityManifest {
    /// [`super::QUALITY_FORMAT`].
    pub format: String,
    /// What made the run.
    pub tool: Tool,
    /// Where it ran.
    pub platform: Platform,
    /// The protocol file's path (or `embedded <path>`).
    pub protocol_source: String,
    /// The protocol as read.
    pub protocol: QualityProtocol,
    /// The model file and the ids scored.
    pub model: QualityModel,
    /// Worker threads.
    pub threads: usize,
    /// For a run merged from shards: each shard's index and manifest hash (recorded; the
    /// shards are not here to check).
    #[serde(default)]
    pub merged_from: Option<Vec<MergedShard>>,
    /// The commit the runner was built from.
    pub git: Option<Git>,
    /// Source roots.
    pub source_roots: Vec<String>,
    /// LF-normalised SHA-256 of each source file.
    pub sources: BTreeMap<String, String>,
    /// SHA-256 of each output file.
    pub outputs: BTreeMap<String, String>,
}

/// The manifest's model record.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityModel {
    /// `smollm2`.
    pub name: String,
    /// The PyPI wheel.
    pub wheel: String,
    /// The weight file's name.
    pub weight_file: String,
    /// Its SHA-256.
    pub weight_sha256: String,
    /// The ids scored, by `t{i}`.
    pub ids: BTreeMap<String, Vec<u32>>,
}

/// The tool, the thread count, and a protocol read from the tree.
pub(super) fn check_fields(tree: &Path, manifest: &QualityManifest, report: &mut Report) {
    if manifest.tool.name != "runner" {
        report.fail(Problem::Manifest {
            field: "tool.name",
            found: manifest.tool.name.clone(),
            expected: "runner".into(),
        });
    }
    if manifest.threads == 0 {
        report.fail(Problem::Manifest {
            field: "threads",
            found: "0".into(),
            expected: "the worker thread count, at least 1".into(),
        });
    }
    if let Some(shards) = &manifest.merged_from {
        let texts = manifest.protocol.texts.len();
        if !merged_from_is_well_formed(shards, texts) {
            let indices: Vec<usize> = shards.iter().map(|s| s.index).collect();
            report.fail(Problem::Manifest {
                field: "merged_from",
                found: format!("shards {indices:?}"),
                expected: format!(
                    "shards 1 to N (N at most the {texts} texts), each once, in order, with \
                     their manifests' SHA-256"
                ),
            });
        }
    }
    let source = manifest.protocol_source.as_str();
    let path = source.strip_prefix("embedded ").unwrap_or(source);
    if path.starts_with("experiments/") {
        let from_tree = files::read_confined(tree, path, MAX_TEXT_BYTES)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<QualityProtocol>(&bytes).ok());
        if from_tree.as_ref() != Some(&manifest.protocol) {
            report.fail(Problem::Manifest {
                field: "protocol",
                found: "the protocol recorded".into(),
                expected: format!("the tree's {path}"),
            });
        }
    }
}

/// The model record: pinned file, one id list per text; returns each text's T if the ids can
/// be used.
pub(super) fn check_model(manifest: &QualityManifest, report: &mut Report) -> Option<Vec<usize>> {
    let record = &manifest.model;
    let p = &manifest.protocol;
    let model = p.geometry().model;
    let pin = model.pin();
    let fail = |report: &mut Report, field: String, found: String, expected: String| {
        report.fail(Problem::ModelRecord {
            field,
            found,
            expected,
        })
    };
    for (field, found, expected) in [
        ("name", record.name.as_str(), model.name()),
        ("wheel", &record.wheel, pin.wheel),
        ("weight_file", &record.weight_file, pin.weight_file),
        ("weight_sha256", &record.weight_sha256, pin.weight_sha256),
    ] {
        if found != expected {
            fail(
                report,
                field.into(),
                format!("{found:?}"),
                format!("{expected:?}"),
            );
        }
    }
    let expected: BTreeSet<String> = (0..p.texts.len()).map(|i| format!("t{i}")).collect();
    let recorded: BTreeSet<String> = record.ids.keys().cloned().collect();
    if recorded != expected {
        fail(
            report,
            "ids".into(),
            format!("texts {recorded:?}"),
            format!("texts {expected:?}"),
        );
        return None;
    }
    let vocabulary = model.shape().vocabulary;
    let mut tokens = Vec::new();
    let mut usable = true;
    for i in 0..p.texts.len() {
        let ids = &record.ids[&format!("t{i}")];
        let field = format!("ids.t{i}");
        let shortest = p.generate.map_or(2, |g| g.prompt_tokens.max(2));
        if !(shortest..=p.max_tokens).contains(&ids.len()) {
            fail(
                report,
                field.clone(),
                format!("{} ids", ids.len()),
                format!(
                    "min(max_tokens, the text's length) ids: {shortest} to {}",
                    p.max_tokens
                ),
            );
            usable = false;
        }
        if let Some((j, id)) = ids.iter().enumerate().find(|(_, id)| **id >= vocabulary) {
            fail(
                report,
                field,
                format!("id {id} at position {j}"),
                format!("ids below {vocabulary}"),
            );
        }
        tokens.push(ids.len());
    }
    usable.then_some(tokens)
}
