//! Model-quality evidence (`model-quality-evidence/1`): what a SmolLM2 run scores when its KV
//! cache is packed, checked from the arrays up.
//!
//! # What a PASS means for this format
//!
//! The per-position log-probs, KL values, argmaxes and generated ids in arrays.npz rest on the
//! model's weight hash (held to the audit's own pin, and with `--models` the file itself
//! hashed), the token ids the manifest records (one list per text, checked in length and range
//! and equal to the archived ids) and the runner's byte-reproducibility test. **The audit does
//! not run the model**: there is no second forward pass. It re-derives from those arrays every
//! aggregate of results.json (NLL, perplexity, KL mean and max, top-1 agreement,
//! first departure), every bytes-per-token figure (from the setting, policy and T with its own
//! implementation of the cache-size rule, [`bytes`]), every value of summary.json, every cell of
//! summary.md's tables and every chart marker, and it checks each file's hash and the run's
//! sources as for packed-KV evidence. Generated text is not re-decoded (the audit has no
//! tokenizer): its report says so in a note.
//!
//! The checks:
//! - the protocol: schema and bounds ([`protocol`]), unknown fields refused;
//! - the files: exactly manifest.json and [`QUALITY_FILES`], each hashing as recorded; the
//!   sources as for packed-KV manifests ([`crate::sources`]); the model record pinned, its ids
//!   `t{i}` one list per text of T = min(max_tokens, the text's length) >= 2 ids below 49,152;
//! - arrays.npz: exactly the members the format lists, in order, each of its dtype and shape;
//!   `t{i}_ids` the manifest's ids; every log-prob finite and <= 0, every KL finite and >= 0
//!   (-1e-12 allowed for rounding), every argmax and generated id below 49,152;
//! - results.json, summary.json, summary.md and quality-vs-bytes.svg re-derived as above, to
//!   the audit's relative tolerance ([`crate::comparisons::close`]) for figures and exactly for
//!   rendered cells.

pub mod bytes;
mod chart;
pub mod protocol;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

use crate::comparisons::close;
use crate::files::{self, MAX_TEXT_BYTES};
use crate::manifest::{Git, Platform, Tool, check_weight_file};
use crate::markdown::{Block, blocks, figures};
use crate::npz::{self, Archive, Element};
use crate::problem::{ChartProblem, MarkdownProblem, ResultsProblem};
use crate::protocol::ModelName;
use crate::report::{Checked, Note, Problem, Report};
use crate::{MANIFEST, Options, parse_json};
use bytes::FLOAT32_BYTES_PER_TOKEN;
use protocol::{QualityProtocol, Run};

/// The manifest format of model-quality evidence.
pub const QUALITY_FORMAT: &str = "model-quality-evidence/1";
/// The files a model-quality run writes besides manifest.json.
pub const QUALITY_FILES: [&str; 5] = [
    "arrays.npz",
    "results.json",
    "summary.json",
    "summary.md",
    "quality-vs-bytes.svg",
];
/// The chart.
pub const QUALITY_CHART: &str = "quality-vs-bytes.svg";
/// How far below zero a KL value may be (rounding).
pub const KL_SLACK: f64 = 1e-12;

/// A model-quality manifest.json.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityManifest {
    /// [`QUALITY_FORMAT`].
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

/// One row of results.json.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityRow {
    /// Row id.
    pub id: String,
    /// Text index.
    pub text: usize,
    /// Setting label.
    pub setting: String,
    /// Policy label.
    pub policy: String,
    /// Schedule label.
    pub schedule: String,
    /// T.
    pub tokens: usize,
    /// T - 1.
    pub positions: usize,
    /// NLL of the float32 cache.
    pub nll_f32: f64,
    /// NLL of the packed cache.
    pub nll: f64,
    /// exp(nll_f32).
    pub perplexity_f32: f64,
    /// exp(nll).
    pub perplexity: f64,
    /// Mean KL(p_f32 || p_packed).
    pub kl_mean: f64,
    /// Largest KL.
    pub kl_max: f64,
    /// Share of positions whose argmax agrees.
    pub top1_agreement: f64,
    /// Cache bytes over T.
    pub bytes_per_token: f64,
    /// 46,080.
    pub float32_bytes_per_token: f64,
    /// When generating: the first generated token that differs, or null (kept as written, so
    /// a null is told apart from an absent field).
    #[serde(default, deserialize_with = "present")]
    pub first_departure: Option<serde_json::Value>,
    /// When generating: the packed cache's continuation, decoded.
    #[serde(default)]
    pub generated_text: Option<String>,
    /// When generating: the float32 cache's continuation, decoded.
    #[serde(default)]
    pub f32_generated_text: Option<String>,
}

/// A field that is present, null included.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

/// summary.json.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualitySummary {
    /// How many texts the rows average over.
    pub texts: usize,
    /// The float32 cache's row.
    pub float32: Float32Summary,
    /// One row per run, in run order.
    pub rows: Vec<QualitySummaryRow>,
}

/// summary.json's float32 row.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Float32Summary {
    /// Mean over texts of the float32 NLL.
    pub nll: f64,
    /// exp(nll).
    pub perplexity: f64,
    /// 46,080.
    pub bytes_per_token: f64,
}

/// One row of summary.json: a run's aggregates averaged over the texts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualitySummaryRow {
    /// Setting label.
    pub setting: String,
    /// Policy label.
    pub policy: String,
    /// Schedule label.
    pub schedule: String,
    /// Mean over texts.
    pub nll_f32: f64,
    /// Mean over texts.
    pub nll: f64,
    /// exp(nll_f32).
    pub perplexity_f32: f64,
    /// exp(nll).
    pub perplexity: f64,
    /// Mean over texts.
    pub kl_mean: f64,
    /// Max over texts.
    pub kl_max: f64,
    /// Mean over texts.
    pub top1_agreement: f64,
    /// Mean over texts.
    pub bytes_per_token: f64,
    /// 46,080.
    pub float32_bytes_per_token: f64,
}

/// What the audit derives for one row (text x run) from the arrays.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Derived {
    /// NLL of the float32 cache.
    pub nll_f32: f64,
    /// NLL of the packed cache.
    pub nll: f64,
    /// Mean KL.
    pub kl_mean: f64,
    /// Largest KL.
    pub kl_max: f64,
    /// Top-1 agreement.
    pub top1_agreement: f64,
    /// Bytes per token.
    pub bytes_per_token: f64,
    /// First departure (when generating).
    pub first_departure: Option<usize>,
}

/// A run's aggregates over the texts, as summary.json must hold them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Aggregate {
    /// Mean NLL of the float32 cache.
    pub nll_f32: f64,
    /// Mean NLL.
    pub nll: f64,
    /// Mean KL.
    pub kl_mean: f64,
    /// Max KL.
    pub kl_max: f64,
    /// Mean top-1 agreement.
    pub top1_agreement: f64,
    /// Mean bytes per token.
    pub bytes_per_token: f64,
}

impl Aggregate {
    /// exp of the mean float32 NLL.
    pub fn perplexity_f32(&self) -> f64 {
        self.nll_f32.exp()
    }
    /// exp of the mean NLL.
    pub fn perplexity(&self) -> f64 {
        self.nll.exp()
    }
}

/// The archive members a run of `p` writes, in order, with their dtype and length.
pub fn members(
    p: &QualityProtocol,
    runs: &[Run],
    tokens: &[usize],
) -> Vec<(String, npz::Dtype, usize)> {
    use npz::Dtype::{F64, I64};
    let generated = p.generate.map(|g| g.tokens);
    let mut out = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        out.push((format!("t{i}_ids"), I64, t));
        out.push((format!("t{i}_f32_logp"), F64, t - 1));
        out.push((format!("t{i}_f32_argmax"), I64, t - 1));
        if let Some(n) = generated {
            out.push((format!("t{i}_f32_generated"), I64, n));
        }
    }
    for (i, &t) in tokens.iter().enumerate() {
        for run in runs {
            let id = run.id(i);
            out.push((format!("{id}_logp"), F64, t - 1));
            out.push((format!("{id}_kl"), F64, t - 1));
            out.push((format!("{id}_argmax"), I64, t - 1));
            if let Some(n) = generated {
                out.push((format!("{id}_generated"), I64, n));
            }
        }
    }
    out
}

/// Audits a directory whose manifest has format [`QUALITY_FORMAT`].
pub fn audit(
    dir: &Path,
    tree: &Path,
    options: &Options,
    manifest_bytes: &[u8],
    report: &mut Report,
) {
    let manifest: QualityManifest = match parse_json(MANIFEST, manifest_bytes) {
        Ok(m) => m,
        Err(problem) => return report.fail(problem),
    };
    let p = &manifest.protocol;
    let runs = match p.validate() {
        Ok(runs) => runs,
        Err(e) => return report.fail(Problem::Protocol(e)),
    };
    report.note(Note::QualityModelNotRerun);
    let (texts, archive) = read_outputs(dir, &manifest, report);
    crate::sources::check_recorded(
        tree,
        &manifest.source_roots,
        &manifest.sources,
        manifest.git.as_ref(),
        report,
    );
    check_fields(tree, &manifest, report);
    let Some(tokens) = check_model(&manifest, options, report) else {
        return;
    };
    let derived = match archive {
        Some(Ok(archive)) => {
            report.count(Checked::ArchiveMembers, archive.names().len());
            check_arrays(&manifest, &runs, &tokens, &archive, report)
        }
        Some(Err(e)) => {
            report.fail(Problem::Archive(e));
            None
        }
        None => None,
    };
    if let Some(bytes) = texts.get("results.json") {
        match parse_json::<Vec<QualityRow>>("results.json", bytes) {
            Ok(rows) => check_results(p, &runs, &tokens, derived.as_ref(), &rows, report),
            Err(problem) => report.fail(problem),
        }
    }
    let Some(derived) = derived else {
        return;
    };
    let aggregates: Vec<Aggregate> = (0..runs.len())
        .map(|r| aggregate(&derived, p.texts.len(), r))
        .collect();
    if let Some(bytes) = texts.get("summary.json") {
        match parse_json::<QualitySummary>("summary.json", bytes) {
            Ok(summary) => check_summary(p.texts.len(), &runs, &aggregates, &summary, report),
            Err(problem) => report.fail(problem),
        }
    }
    let rows = texts
        .get("results.json")
        .and_then(|b| serde_json::from_slice::<Vec<QualityRow>>(b).ok())
        .unwrap_or_default();
    if let Some(md) = texts.get("summary.md") {
        match std::str::from_utf8(md) {
            Ok(text) => check_markdown(text, p, &runs, &tokens, &aggregates, &rows, report),
            Err(_) => report.fail(Problem::Markdown(MarkdownProblem::Markup {
                what: "bytes that are not UTF-8".into(),
            })),
        }
    }
    if let Some(svg) = texts.get(QUALITY_CHART) {
        match std::str::from_utf8(svg) {
            Ok(text) => chart::check_chart(text, &p.study, &runs, &aggregates, report),
            Err(_) => report.fail(Problem::QualityChart(ChartProblem::Document {
                reason: "not UTF-8".into(),
            })),
        }
    }
}

type Texts = BTreeMap<&'static str, Vec<u8>>;

/// Exactly the run's files, listed and hashed as recorded (the check every format shares); the
/// text files read, arrays.npz opened.
fn read_outputs(
    dir: &Path,
    manifest: &QualityManifest,
    report: &mut Report,
) -> (Texts, Option<Result<Archive, npz::NpzError>>) {
    crate::read_files(dir, &QUALITY_FILES, &manifest.outputs, report)
}

/// The tool, the thread count, and a protocol read from the tree.
fn check_fields(tree: &Path, manifest: &QualityManifest, report: &mut Report) {
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
fn check_model(
    manifest: &QualityManifest,
    options: &Options,
    report: &mut Report,
) -> Option<Vec<usize>> {
    let record = &manifest.model;
    let p = &manifest.protocol;
    let model = ModelName::SmolLm2;
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
    check_weight_file(
        model,
        &record.weight_sha256,
        options.models.as_deref(),
        report,
    );
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

fn value_problem(array: &str, index: usize, found: String, expected: &str) -> Problem {
    Problem::Value {
        array: array.to_string(),
        index,
        found,
        expected: expected.to_string(),
    }
}

/// Reads one member, failing the report if it cannot be had as the format gives it.
fn read<T: Element>(
    archive: &Archive,
    name: &str,
    len: usize,
    report: &mut Report,
) -> Option<Vec<T>> {
    match archive.values::<T>(name, &[len]) {
        Ok(v) => Some(v),
        Err(e) => {
            report.fail(Problem::Array(e));
            None
        }
    }
}

/// Every log-prob finite and <= 0.
fn check_logp(name: &str, values: &[f64], report: &mut Report) {
    if let Some((j, v)) = values
        .iter()
        .enumerate()
        .find(|(_, v)| !(v.is_finite() && **v <= 0.0))
    {
        report.fail(value_problem(
            name,
            j,
            format!("{v:?}"),
            "a finite log-prob <= 0",
        ));
    }
}

/// Every id below the vocabulary.
fn check_ids(name: &str, values: &[i64], report: &mut Report) {
    let vocabulary = i64::from(ModelName::SmolLm2.shape().vocabulary);
    if let Some((j, v)) = values
        .iter()
        .enumerate()
        .find(|(_, v)| !(0..vocabulary).contains(*v))
    {
        report.fail(value_problem(
            name,
            j,
            v.to_string(),
            "a token id from 0 to 49,151",
        ));
    }
}

/// Checks arrays.npz and derives every row's aggregates; None if any array is unusable. The
/// map is keyed by (text, run).
fn check_arrays(
    manifest: &QualityManifest,
    runs: &[Run],
    tokens: &[usize],
    archive: &Archive,
    report: &mut Report,
) -> Option<BTreeMap<(usize, usize), Derived>> {
    let p = &manifest.protocol;
    let expected = members(p, runs, tokens);
    let names: Vec<&str> = expected.iter().map(|(n, _, _)| n.as_str()).collect();
    let found: Vec<&str> = archive.names().iter().map(String::as_str).collect();
    if found != names {
        let want: BTreeSet<&str> = names.iter().copied().collect();
        let have: BTreeSet<&str> = found.iter().copied().collect();
        let missing: Vec<&&str> = names.iter().filter(|n| !have.contains(*n)).collect();
        let extra: Vec<&&str> = found.iter().filter(|n| !want.contains(*n)).collect();
        for (what, list) in [
            ("is missing", &missing),
            ("has an unexpected array", &extra),
        ] {
            if let Some(first) = list.first() {
                report.fail(Problem::ArrayNames {
                    what,
                    first: first.to_string(),
                    more: list.len() - 1,
                });
            }
        }
        if missing.is_empty() && extra.is_empty() {
            let position = found.iter().zip(&names).position(|(a, b)| a != b);
            report.fail(Problem::ArrayNames {
                what: "holds its arrays out of order, first",
                first: position.map_or(String::new(), |i| found[i].to_string()),
                more: 0,
            });
        }
    }
    let generated = p.generate.map(|g| g.tokens);
    let mut ok = true;
    let mut derived = BTreeMap::new();
    for (i, &t) in tokens.iter().enumerate() {
        let ids = read::<i64>(archive, &format!("t{i}_ids"), t, report);
        if let Some(ids) = &ids {
            let recorded = &manifest.model.ids[&format!("t{i}")];
            if let Some(j) = (0..t).find(|&j| ids[j] != i64::from(recorded[j])) {
                report.fail(value_problem(
                    &format!("t{i}_ids"),
                    j,
                    ids[j].to_string(),
                    &format!("manifest.json model.ids.t{i}[{j}] = {}", recorded[j]),
                ));
            }
        }
        let f32_logp = read::<f64>(archive, &format!("t{i}_f32_logp"), t - 1, report);
        if let Some(v) = &f32_logp {
            check_logp(&format!("t{i}_f32_logp"), v, report);
        }
        let f32_argmax = read::<i64>(archive, &format!("t{i}_f32_argmax"), t - 1, report);
        if let Some(v) = &f32_argmax {
            check_ids(&format!("t{i}_f32_argmax"), v, report);
        }
        let f32_generated = match generated {
            Some(n) => {
                let v = read::<i64>(archive, &format!("t{i}_f32_generated"), n, report);
                if let Some(v) = &v {
                    check_ids(&format!("t{i}_f32_generated"), v, report);
                }
                v.map(Some)
            }
            None => Some(None),
        };
        for (r, run) in runs.iter().enumerate() {
            let id = run.id(i);
            let logp = read::<f64>(archive, &format!("{id}_logp"), t - 1, report);
            if let Some(v) = &logp {
                check_logp(&format!("{id}_logp"), v, report);
            }
            let kl = read::<f64>(archive, &format!("{id}_kl"), t - 1, report);
            if let Some(v) = &kl
                && let Some((j, x)) = v
                    .iter()
                    .enumerate()
                    .find(|(_, x)| !(x.is_finite() && **x >= -KL_SLACK))
            {
                report.fail(value_problem(
                    &format!("{id}_kl"),
                    j,
                    format!("{x:?}"),
                    "a finite KL >= 0 (-1e-12 allowed for rounding)",
                ));
            }
            let argmax = read::<i64>(archive, &format!("{id}_argmax"), t - 1, report);
            if let Some(v) = &argmax {
                check_ids(&format!("{id}_argmax"), v, report);
            }
            let row_generated = match generated {
                Some(n) => {
                    let v = read::<i64>(archive, &format!("{id}_generated"), n, report);
                    if let Some(v) = &v {
                        check_ids(&format!("{id}_generated"), v, report);
                    }
                    v.map(Some)
                }
                None => Some(None),
            };
            let (
                Some(f32_logp),
                Some(f32_argmax),
                Some(f32_generated),
                Some(logp),
                Some(kl),
                Some(argmax),
                Some(row_generated),
            ) = (
                &f32_logp,
                &f32_argmax,
                &f32_generated,
                logp,
                kl,
                argmax,
                row_generated,
            )
            else {
                ok = false;
                continue;
            };
            report.count(Checked::Positions, t - 1);
            let positions = (t - 1) as f64;
            let first_departure = match (f32_generated, &row_generated) {
                (Some(a), Some(b)) => a.iter().zip(b).position(|(x, y)| x != y),
                _ => None,
            };
            derived.insert(
                (i, r),
                Derived {
                    nll_f32: -f32_logp.iter().sum::<f64>() / positions,
                    nll: -logp.iter().sum::<f64>() / positions,
                    kl_mean: kl.iter().sum::<f64>() / positions,
                    kl_max: kl.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    top1_agreement: argmax
                        .iter()
                        .zip(f32_argmax)
                        .filter(|(a, b)| a == b)
                        .count() as f64
                        / positions,
                    bytes_per_token: bytes::bytes_per_token(run, t),
                    first_departure,
                },
            );
            report.count(Checked::BytesPerToken, 1);
        }
    }
    ok.then_some(derived)
}

/// results.json: one row per (text, run), in run order, descriptive fields from the protocol,
/// every figure re-derived.
fn check_results(
    p: &QualityProtocol,
    runs: &[Run],
    tokens: &[usize],
    derived: Option<&BTreeMap<(usize, usize), Derived>>,
    rows: &[QualityRow],
    report: &mut Report,
) {
    let plan: Vec<(usize, usize)> = (0..tokens.len())
        .flat_map(|i| (0..runs.len()).map(move |r| (i, r)))
        .collect();
    if rows.len() != plan.len() {
        report.fail(Problem::Results(ResultsProblem::Count {
            found: rows.len(),
            expected: plan.len(),
        }));
    }
    let generating = p.generate.is_some();
    for (position, (row, &(i, r))) in rows.iter().zip(&plan).enumerate() {
        let run = &runs[r];
        let id = run.id(i);
        if row.id != id {
            report.fail(Problem::Results(ResultsProblem::Order {
                position,
                found: row.id.clone(),
                expected: id,
            }));
            continue;
        }
        let t = tokens[i];
        let descriptive = row.text == i
            && row.setting == run.setting.to_string()
            && row.policy == run.policy.to_string()
            && row.schedule == run.schedule.to_string()
            && row.tokens == t
            && row.positions == t - 1
            && row.float32_bytes_per_token == FLOAT32_BYTES_PER_TOKEN as f64
            && row.first_departure.is_some() == generating
            && row.generated_text.is_some() == generating
            && row.f32_generated_text.is_some() == generating;
        if !descriptive {
            report.fail(Problem::Results(ResultsProblem::Description {
                id: id.clone(),
            }));
        }
        report.count(Checked::ResultRows, 1);
        let Some(d) = derived.and_then(|d| d.get(&(i, r))) else {
            continue;
        };
        let metric = |field: &'static str, recorded: f64, recomputed: f64| {
            (!close(recorded, recomputed)).then(|| Problem::Metric {
                id: id.clone(),
                field,
                recorded: format!("{recorded:?}"),
                recomputed: format!("{recomputed:?}"),
            })
        };
        let problems = [
            metric("nll_f32", row.nll_f32, d.nll_f32),
            metric("nll", row.nll, d.nll),
            metric("perplexity_f32", row.perplexity_f32, d.nll_f32.exp()),
            metric("perplexity", row.perplexity, d.nll.exp()),
            metric("kl_mean", row.kl_mean, d.kl_mean),
            metric("kl_max", row.kl_max, d.kl_max),
            metric("top1_agreement", row.top1_agreement, d.top1_agreement),
            metric("bytes_per_token", row.bytes_per_token, d.bytes_per_token),
        ];
        for problem in problems.into_iter().flatten() {
            report.fail(problem);
        }
        if generating {
            report.note(Note::GeneratedTextNotDecoded);
            let recorded = row.first_departure.clone().unwrap_or_default();
            let expected = match d.first_departure {
                Some(k) => serde_json::Value::from(k),
                None => serde_json::Value::Null,
            };
            if recorded != expected {
                report.fail(Problem::Metric {
                    id: id.clone(),
                    field: "first_departure",
                    recorded: recorded.to_string(),
                    recomputed: expected.to_string(),
                });
            }
        }
    }
}

/// Run `r`'s aggregates over the texts, in text order.
fn aggregate(derived: &BTreeMap<(usize, usize), Derived>, texts: usize, r: usize) -> Aggregate {
    let rows: Vec<&Derived> = (0..texts).filter_map(|i| derived.get(&(i, r))).collect();
    let n = rows.len() as f64;
    let mean = |f: fn(&Derived) -> f64| rows.iter().map(|d| f(d)).sum::<f64>() / n;
    Aggregate {
        nll_f32: mean(|d| d.nll_f32),
        nll: mean(|d| d.nll),
        kl_mean: mean(|d| d.kl_mean),
        kl_max: rows
            .iter()
            .map(|d| d.kl_max)
            .fold(f64::NEG_INFINITY, f64::max),
        top1_agreement: mean(|d| d.top1_agreement),
        bytes_per_token: mean(|d| d.bytes_per_token),
    }
}

fn check_summary(
    texts: usize,
    runs: &[Run],
    aggregates: &[Aggregate],
    summary: &QualitySummary,
    report: &mut Report,
) {
    let float32 = aggregates.first().map_or(f64::NAN, |a| a.nll_f32);
    for (place, found, expected) in [
        ("texts", summary.texts as f64, texts as f64),
        ("float32 nll", summary.float32.nll, float32),
        (
            "float32 perplexity",
            summary.float32.perplexity,
            float32.exp(),
        ),
        (
            "float32 bytes_per_token",
            summary.float32.bytes_per_token,
            FLOAT32_BYTES_PER_TOKEN as f64,
        ),
    ] {
        if !close(found, expected) {
            report.fail(Problem::Summary {
                place: place.into(),
                found: format!("{found:?}"),
                expected: format!("{expected:?}"),
            });
        }
    }
    if summary.rows.len() != runs.len() {
        report.fail(Problem::Summary {
            place: "rows".into(),
            found: summary.rows.len().to_string(),
            expected: runs.len().to_string(),
        });
    }
    for (row, (run, a)) in summary.rows.iter().zip(runs.iter().zip(aggregates)) {
        let label = format!("{} {} {}", run.setting, run.policy, run.schedule);
        let labels = [
            ("setting", &row.setting, run.setting.to_string()),
            ("policy", &row.policy, run.policy.to_string()),
            ("schedule", &row.schedule, run.schedule.to_string()),
        ];
        let mut same = true;
        for (field, found, expected) in labels {
            if *found != expected {
                same = false;
                report.fail(Problem::Summary {
                    place: format!("{label} {field}"),
                    found: found.clone(),
                    expected,
                });
            }
        }
        if !same {
            continue;
        }
        for (field, found, expected) in [
            ("nll_f32", row.nll_f32, a.nll_f32),
            ("nll", row.nll, a.nll),
            ("perplexity_f32", row.perplexity_f32, a.perplexity_f32()),
            ("perplexity", row.perplexity, a.perplexity()),
            ("kl_mean", row.kl_mean, a.kl_mean),
            ("kl_max", row.kl_max, a.kl_max),
            ("top1_agreement", row.top1_agreement, a.top1_agreement),
            ("bytes_per_token", row.bytes_per_token, a.bytes_per_token),
            (
                "float32_bytes_per_token",
                row.float32_bytes_per_token,
                FLOAT32_BYTES_PER_TOKEN as f64,
            ),
        ] {
            if !close(found, expected) {
                report.fail(Problem::Summary {
                    place: format!("{label} {field}"),
                    found: format!("{found:?}"),
                    expected: format!("{expected:?}"),
                });
            }
        }
        report.count(Checked::SummaryRows, 1);
    }
}

/// 46080.0 -> "46,080.0".
pub fn bytes_cell(value: f64) -> String {
    let text = format!("{value:.1}");
    let (whole, fraction) = text.split_once('.').unwrap_or((&text, "0"));
    let (sign, digits) = whole.strip_prefix('-').map_or(("", whole), |d| ("-", d));
    let mut grouped = String::new();
    for (k, c) in digits.chars().enumerate() {
        if k > 0 && (digits.len() - k).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    format!("{sign}{grouped}.{fraction}")
}

/// The tables summary.md must hold, in order: the run table, the quality table, and when
/// generating one table per text.
pub fn expected_tables(
    p: &QualityProtocol,
    runs: &[Run],
    tokens: &[usize],
    aggregates: &[Aggregate],
    rows: &[QualityRow],
) -> Vec<(&'static str, Vec<Vec<String>>)> {
    let join = |items: Vec<String>| items.join(", ");
    let mut run_table = vec![
        vec!["quantity".to_string(), "value".into()],
        vec!["model".into(), p.model.clone()],
        vec![
            "texts".into(),
            join(p.texts.iter().map(|t| t.name.clone()).collect()),
        ],
        vec![
            "tokens scored per text".into(),
            join(tokens.iter().map(|t| (t - 1).to_string()).collect()),
        ],
        vec!["runs".into(), runs.len().to_string()],
        vec![
            "generated tokens".into(),
            p.generate.map_or(0, |g| g.tokens).to_string(),
        ],
    ];
    if let Some(g) = p.generate {
        run_table.push(vec!["prompt tokens".into(), g.prompt_tokens.to_string()]);
    }
    let mut tables = vec![("run", run_table)];
    let header = [
        "setting",
        "policy",
        "schedule",
        "NLL",
        "perplexity",
        "ppl change",
        "KL mean",
        "KL max",
        "top-1",
        "bytes/token",
    ];
    let mut quality = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    if let Some(first) = aggregates.first() {
        quality.push(vec![
            "float32".into(),
            "-".into(),
            "-".into(),
            format!("{:.6}", first.nll_f32),
            format!("{:.4}", first.perplexity_f32()),
            "0.000%".into(),
            "0".into(),
            "0".into(),
            "100.000%".into(),
            crate::text::thousands(FLOAT32_BYTES_PER_TOKEN as u64),
        ]);
    }
    for (run, a) in runs.iter().zip(aggregates) {
        quality.push(vec![
            run.setting.to_string(),
            run.policy.to_string(),
            run.schedule.to_string(),
            format!("{:.6}", a.nll),
            format!("{:.4}", a.perplexity()),
            format!(
                "{:.3}%",
                (a.perplexity() / a.perplexity_f32() - 1.0) * 100.0
            ),
            format!("{:.6}", a.kl_mean),
            format!("{:.6}", a.kl_max),
            format!("{:.3}%", a.top1_agreement * 100.0),
            bytes_cell(a.bytes_per_token),
        ]);
    }
    tables.push(("quality", quality));
    if p.generate.is_some() {
        let shown = |text: &str| {
            text.replace('\r', "\\r")
                .replace('\n', "\\n")
                .trim()
                .to_string()
        };
        for i in 0..tokens.len() {
            let mut table = vec![
                [
                    "setting",
                    "policy",
                    "schedule",
                    "first departure",
                    "generated text",
                ]
                .iter()
                .map(|h| h.to_string())
                .collect::<Vec<_>>(),
            ];
            let text_rows: Vec<&QualityRow> = rows.iter().filter(|r| r.text == i).collect();
            if let Some(first) = text_rows.first() {
                table.push(vec![
                    "float32".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    shown(first.f32_generated_text.as_deref().unwrap_or("")),
                ]);
            }
            for row in text_rows {
                let departure = match &row.first_departure {
                    Some(serde_json::Value::Number(n)) => n.to_string(),
                    _ => "none".into(),
                };
                table.push(vec![
                    row.setting.clone(),
                    row.policy.clone(),
                    row.schedule.clone(),
                    departure,
                    shown(row.generated_text.as_deref().unwrap_or("")),
                ]);
            }
            tables.push(("generation", table));
        }
    }
    tables
}

fn check_markdown(
    text: &str,
    p: &QualityProtocol,
    runs: &[Run],
    tokens: &[usize],
    aggregates: &[Aggregate],
    rows: &[QualityRow],
    report: &mut Report,
) {
    let fail =
        |report: &mut Report, problem: MarkdownProblem| report.fail(Problem::Markdown(problem));
    let blocks = match blocks(text) {
        Ok(blocks) => blocks,
        Err(problem) => return fail(report, problem),
    };
    // Names the protocol bounds (the study's and the texts') may hold digits; nothing else in
    // free text may.
    let mut names: Vec<&str> = p.texts.iter().map(|t| t.name.as_str()).collect();
    names.push(&p.study);
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    let mut found_tables = Vec::new();
    for block in &blocks {
        let text = match block {
            Block::Heading(_, t) | Block::Paragraph(t) => t.clone(),
            Block::Chart { alt, dest } => {
                if dest != QUALITY_CHART {
                    fail(
                        report,
                        MarkdownProblem::Markup {
                            what: format!("an image of {dest:?}"),
                        },
                    );
                }
                alt.clone()
            }
            Block::Table(rows) => {
                found_tables.push(rows);
                continue;
            }
        };
        let mut stripped = text.clone();
        for name in &names {
            stripped = stripped.replace(name, " ");
        }
        if let Some(figure) = figures(&stripped).into_iter().next() {
            fail(report, MarkdownProblem::Figure { figure, text });
        }
    }
    let expected = expected_tables(p, runs, tokens, aggregates, rows);
    if found_tables.len() != expected.len() {
        fail(
            report,
            MarkdownProblem::Structure {
                position: found_tables.len().min(expected.len()),
                found: format!("{} tables", found_tables.len()),
                expected: format!("{} tables", expected.len()),
            },
        );
    }
    let mut cells = 0;
    for (got, (name, want)) in found_tables.iter().zip(&expected) {
        let dims = |rows: &Vec<Vec<String>>| (rows.len(), rows.first().map_or(0, Vec::len));
        if dims(got) != dims(want) || got.iter().any(|r| r.len() != want[0].len()) {
            fail(
                report,
                MarkdownProblem::TableShape {
                    table: name,
                    found: dims(got),
                    expected: dims(want),
                },
            );
            continue;
        }
        let mut first = None;
        for (r, (g, w)) in got.iter().zip(want).enumerate() {
            for (c, (gc, wc)) in g.iter().zip(w).enumerate() {
                cells += 1;
                if gc != wc && first.is_none() {
                    first = Some(MarkdownProblem::Cell {
                        table: name,
                        row: r,
                        column: c,
                        found: gc.clone(),
                        expected: wc.clone(),
                    });
                }
            }
        }
        if let Some(problem) = first {
            fail(report, problem);
        }
    }
    report.count(Checked::MarkdownCells, cells);
}
