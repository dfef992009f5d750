//! The audit's own reading of `manifest.json` and of the root manifest. Fields are declared here
//! from the evidence format, not shared with the runner, and unknown fields are refused: the audit
//! cannot vouch for what it does not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

use crate::files;
use crate::plan::InputPlan;
use crate::protocol::Protocol;
use crate::report::{Note, Problem, Report};

/// Largest model weight file the audit hashes (the pinned ones are about 100 MB).
pub const MAX_MODEL_BYTES: u64 = 4 << 30;

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
/// ([`crate::protocol::ModelName::pin`]); its ids exactly one list per pass of the inputs in
/// this directory (`inputs`: a shard's only its own), each of N ids below the vocabulary size,
/// and MiniLM's opening with `[CLS]` and closing with `[SEP]`.
///
/// With `models` (`audit --models DIR`), the weight file `DIR/<name>/<weight_file>` is hashed
/// and must have the recorded SHA-256; without it a note says the file was not checked. Either
/// way the audit does not run the model: a note says what the archived inputs rest on.
pub fn check_model(
    manifest: &Manifest,
    inputs: &[InputPlan],
    models: Option<&Path>,
    report: &mut Report,
) {
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
    report.note(Note::ModelNotRerun);
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
        if let Some((open, close)) = model.markers()
            && (ids.first() != Some(&open) || ids.last() != Some(&close))
        {
            fail(
                report,
                &field,
                format!("first {:?}, last {:?}", ids.first(), ids.last()),
                format!("[CLS] ({open}) first and [SEP] ({close}) last"),
            );
        }
    }

    check_weight_file(model, &record.weight_sha256, models, report);
}

/// With `models` (`audit --models DIR`), hashes `DIR/<name>/<weight file>` and requires the
/// recorded SHA-256; without it, notes that the file was not checked.
pub fn check_weight_file(
    model: crate::protocol::ModelName,
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
