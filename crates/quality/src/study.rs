//! `runner quality --protocol FILE --out DIR`: an archived model-quality study. The protocol's
//! decoder (SmolLM2 or Gemma 3, [`crate::decoder`]) reads each of the protocol's texts with the float32 cache and with packed caches (the `quality`
//! crate's settings, policies and schedules), and the run is written as an evidence directory
//! of format [`QUALITY_MANIFEST_FORMAT`].
//!
//! The protocol (`experiments/model-quality/protocol.json`; unknown fields are refused, and every
//! refusal names its field):
//! - `study`: a name (1 to 64 characters of `[A-Za-z0-9-_.]`);
//! - `model`: `smollm2` or `gemma3` (an encoder has no next-token distribution);
//! - `texts`: 1 to 64, unique names of 1 to 32 characters of `[A-Za-z0-9-_.]`; each text is
//!   encoded with the model's tokenizer (SmolLM2's BPE, no BOS; Gemma 3's SentencePiece, BOS
//!   first) and cut to its first `max_tokens` ids
//!   (2 <= `max_tokens` <= 8192, SmolLM2's context); a shorter text is used whole, but needs at
//!   least 2 ids;
//! - `runs`: 1 to 64, unique, each a `schedule` (`prefill`, `streaming`, `causal`) with either a
//!   `setting` (`g<GROUP>_b<BITS>[_asym][_swap]`) and a `policy` (`uniform`, `recent_f32:W`,
//!   `recent8:W`, `early8:W`), exactly what `quality::setting` parses and `CacheSpec::new`
//!   accepts, or a `scheme` of the literature (`kivi4`, `llamacpp-q4_0+rot`: a name
//!   `kvschemes::Scheme` parses, under a schedule [`SchemeSpec::new`] accepts);
//! - `generate` (optional): `prompt_tokens` (1 to the shortest text's ids) and `tokens` (1 to 64);
//! - `calibration` (required when a run names a KVQuant scheme): a `name` and `text`, neither
//!   a text's name nor overlapping a text (one containing the other); its first
//!   [`CALIBRATION_TOKENS`] ids are the calibration pass (`crate::scheme::calibrate`);
//! - `attention` (optional): each run's attention error ([`crate::attention_error`]): a
//!   `stride` (1 to `max_tokens`: every stride-th position is a query), `gaussian_seeds` (at
//!   most [`MAX_GAUSSIAN_SEEDS`], distinct), when a KVQuant run has Gaussian draws to
//!   quantize, a `calibration_seed` that is none of them, and `matched` (optional, `false`
//!   when absent; needs seeds): `true` to draw each seed again matched to the first text's
//!   per-channel mean and spread;
//! - `bootstrap` (optional, at least two texts): `resamples` ([`MIN_RESAMPLES`] to
//!   [`MAX_RESAMPLES`]), a `seed` and, optionally, `pairs` (1 to [`MAX_PAIRS`] `[a, b]` run
//!   indices, two different runs each, no pair twice; absent: every pair): a paired bootstrap
//!   over the texts ([`crate::bootstrap`]);
//! - `mechanisms` (optional, `false` when absent): `true` to measure the float32 cache's outlier
//!   key channels, per-channel offsets and first-token attention ([`crate::mechanisms`]);
//! - `sensitivity` (optional): `perturbations` (1 to 4 `{relative, seed}`) and `runs` (indices,
//!   ascending): those runs re-run with their cache inputs perturbed ([`crate::sensitivity`]).
//!
//! Rows run texts first, then runs in protocol order; a row's id is
//! `t{text}_{setting}_{policy}_{schedule}` or `t{text}_{scheme}_{schedule}`, with `:` and `+`
//! written `-`.
//!
//! The directory (see [`crate::write`] for how it is staged and moved into place):
//! - `arrays.npz`: with a calibration text, first `calibration_ids` (int64 `[C]`) and per KVQuant
//!   scheme, in the order runs first name it, `calibration_<scheme>_key_upper` and `_key_lower`
//!   (float32 `[layers, W]`: each key channel's fp16 thresholds, widened) and `_key_levels` and
//!   `_value_levels` (float32 `[layers, 2^bits]`); then per text, in order, `t{i}_ids` (int64 `[T]`), `t{i}_f32_logp` (float64 `[T-1]`,
//!   ln p_f32(ids[j+1] | ids[..=j]) from an f64 log-softmax of the f32 logits), `t{i}_f32_argmax`
//!   (int64 `[T-1]`), when generating, `t{i}_f32_generated` (int64 `[tokens]`) and, with
//!   `mechanisms`, `t{i}_mechanisms` (float64 `[layers, kv_heads, 4]`); then per row, in
//!   run order, `<id>_logp`, `<id>_kl` (float64 `[T-1]`, KL(p_f32 || p_packed) over the whole
//!   vocabulary), `<id>_argmax` (int64 `[T-1]`), for a KVQuant run `<id>_outliers` (int64
//!   `[layers]`: the outlier values each layer's cache stores, K and V together, which with the
//!   shape decide its bytes) and, when generating, `<id>_generated`; then, with `attention`,
//!   per text and run `<id>_attention` and per Gaussian draw and run `g{draw}_..._attention`
//!   (float64 `[layers, 2]`: each layer's summed squared error and squared reference output)
//!   and, when matched, `matched_q_stats`, `matched_k_stats` and `matched_v_stats` (float64
//!   `[layers, heads, head_dim, 2]`, query or KV heads: the first text's per-channel mean and
//!   spread) and per draw and run `m{draw}_..._attention`;
//!   then, with `sensitivity`, per text, perturbation and named run `s{k}_<id>_logp`, `_kl` and
//!   `_argmax` (as a row's);
//! - `results.json`: one object per row ([`ResultRow`]), its aggregates computed from the arrays
//!   exactly as the fields' docs say;
//! - `summary.json`, `summary.md`: a row per run averaged over the texts ([`SummaryRow`]) and,
//!   with `attention`, a row per run of its attention error
//!   ([`crate::attention_error::AttentionRow`]) and, with `bootstrap`, each run's and each pair
//!   of runs' intervals ([`crate::bootstrap::BootstrapSummary`]) and, with `mechanisms`, their
//!   means over the texts ([`crate::mechanisms::MechanismSummary`]) and, with `sensitivity`, the
//!   named runs' spreads ([`crate::sensitivity::SensitivitySummary`]);
//! - `quality-vs-bytes.svg`: mean KL against cache bytes per token, with each schedule's Pareto
//!   frontier ([`crate::chart`]);
//! - `manifest.json`: [`crate::write::QualityManifest`].
//!
//! The float32 pass of each text is computed once and shared by its runs; the runs of a text are
//! computed on a rayon pool, each from its own inputs only, so the files (but the manifest's
//! `threads`, git and tool facts) do not depend on the thread count.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::attention_error::{
    AttentionResult, AttentionRow, AttentionSpec, AttentionSummary, Draw, GaussianRun, LayerError,
    LayerStats, MAX_GAUSSIAN_SEEDS,
};
use crate::bootstrap::{BootstrapSpec, BootstrapSummary, MAX_PAIRS, MAX_RESAMPLES, MIN_RESAMPLES};
use crate::mechanisms::{HeadMeasures, MechanismSummary};
use crate::metrics::{self, kl};
use crate::reference::{Reference, Scored};
use crate::scheme::{Cache, SchemeSpec};
use crate::sensitivity::{SensitivitySpec, SensitivitySummary};
use crate::{CacheSpec, KvSetting, Policy, QualityError, Schedule};
use std::sync::Arc;

use crate::decoder::Decoder;
use kvschemes::Scheme;
use kvschemes::kvquant::{Calibration, KvQuantScheme};
use models::CausalLm;
use models::ModelName;
use models::llama::{LayerKv, ModelError, OwnKv};
use models::tokenizer::bpe::BpeError;
use ndarray::Array2;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use evidence::EvidenceError;
use evidence::MAX_STUDY_NAME_CHARS;
use evidence::shard::{Shard, ShardError};

/// Identifies this manifest layout.
pub const QUALITY_MANIFEST_FORMAT: &str = "model-quality-evidence/2";
/// results.json.
pub const RESULTS: &str = "results.json";
/// summary.json.
pub const SUMMARY: &str = "summary.json";
/// summary.md.
pub const SUMMARY_MD: &str = "summary.md";
/// The chart.
pub const PLOT: &str = "quality-vs-bytes.svg";
/// Most texts in a protocol.
pub const MAX_TEXTS: usize = 64;
/// Longest text name.
pub const MAX_TEXT_NAME_CHARS: usize = 32;
/// Most runs in a protocol (a layer-by-layer study of a 30-layer model at two widths, with its
/// whole, K-only and V-only caches, is 66).
pub const MAX_RUNS: usize = 72;
/// Largest `max_tokens`.
pub const MAX_TOKENS: usize = 8192;
/// Most generated tokens.
pub const MAX_GENERATED: usize = 64;
/// Ids of the calibration text kept (its first).
pub const CALIBRATION_TOKENS: usize = 2048;

/// A model-quality protocol, as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityProtocol {
    /// The study's name.
    pub study: String,
    /// Only `smollm2`.
    pub model: ModelName,
    /// The texts, in order.
    pub texts: Vec<QualityText>,
    /// Ids kept per text.
    pub max_tokens: usize,
    /// The cache configurations.
    pub runs: Vec<RunSpec>,
    /// Greedy generation, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate: Option<Generate>,
    /// The text KVQuant schemes fit their levels on (required when a run names one), distinct
    /// from every evaluated text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<QualityText>,
    /// Each run's attention error on the texts' K/V and on Gaussian K/V
    /// ([`crate::attention_error`]), when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention: Option<AttentionSpec>,
    /// A paired bootstrap over the texts ([`crate::bootstrap`]), when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapSpec>,
    /// Whether each text's float32 pass measures the mechanisms ([`crate::mechanisms`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mechanisms: bool,
    /// Named runs re-run with perturbed cache inputs ([`crate::sensitivity`]), when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sensitivity: Option<SensitivitySpec>,
}

/// One text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityText {
    /// Its name.
    pub name: String,
    /// Its text.
    pub text: String,
}

/// One cache configuration, as labels: a codec `setting` and `policy`, or a `scheme` of the
/// literature, under a `schedule`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// Setting label (a [`KvSetting`]); with `policy`, absent for a scheme.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setting: Option<String>,
    /// Policy label; absent for a scheme.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Scheme name (`kvschemes::Scheme`, as it prints itself); absent for a setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// Schedule label.
    pub schedule: String,
}

/// Greedy generation from each text's first ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generate {
    /// Prompt ids (the text's first).
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub tokens: usize,
}

/// Why a model-quality protocol is refused; each names the field to change.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum QualityProtocolError {
    /// The JSON does not fit the schema (unknown field, wrong type, unknown model).
    #[error("protocol field `{field}`: {message}")]
    Parse {
        /// The field's path, or `(top level)`.
        field: String,
        /// What the parser said.
        message: String,
    },
    /// A value out of bounds or refused.
    #[error("protocol field `{field}`: {problem}")]
    Field {
        /// The field's path (`runs[2].policy`).
        field: String,
        /// What is wrong.
        problem: String,
    },
}

fn field(field: impl Into<String>, problem: impl Into<String>) -> QualityProtocolError {
    QualityProtocolError::Field {
        field: field.into(),
        problem: problem.into(),
    }
}

fn is_name(name: &str, max: usize) -> bool {
    (1..=max).contains(&name.chars().count())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl RunSpec {
    /// A codec run.
    pub fn codec(setting: &str, policy: &str, schedule: &str) -> RunSpec {
        RunSpec {
            setting: Some(setting.into()),
            policy: Some(policy.into()),
            scheme: None,
            schedule: schedule.into(),
        }
    }

    /// A scheme run.
    pub fn scheme(scheme: &str, schedule: &str) -> RunSpec {
        RunSpec {
            setting: None,
            policy: None,
            scheme: Some(scheme.into()),
            schedule: schedule.into(),
        }
    }

    /// The cache configuration, or the field (`runs[i].setting`, ...) that is refused.
    pub fn spec(&self, index: usize) -> Result<Cache, QualityProtocolError> {
        let at = |name: &str| format!("runs[{index}].{name}");
        let schedule: Schedule = self
            .schedule
            .parse()
            .map_err(|e: QualityError| field(at("schedule"), e.to_string()))?;
        let (setting, policy) = match (&self.scheme, &self.setting, &self.policy) {
            (Some(name), None, None) => {
                let scheme: Scheme = name
                    .parse()
                    .map_err(|e: kvschemes::UnknownScheme| field(at("scheme"), e.to_string()))?;
                return SchemeSpec::new(scheme, schedule)
                    .map(Cache::from)
                    .map_err(|e| field(at("schedule"), e.to_string()));
            }
            (Some(_), _, _) => {
                return Err(field(
                    at("scheme"),
                    "a run names a scheme or a setting and policy, not both",
                ));
            }
            (None, Some(setting), Some(policy)) => (setting, policy),
            (None, None, _) => {
                return Err(field(
                    at("setting"),
                    "missing: a run names a setting and policy, or a scheme",
                ));
            }
            (None, Some(_), None) => {
                return Err(field(at("policy"), "missing: a setting needs a policy"));
            }
        };
        let setting: KvSetting = setting
            .parse()
            .map_err(|e: kvcodec::KvError| field(at("setting"), e.to_string()))?;
        let policy =
            Policy::parse(policy, &setting).map_err(|e| field(at("policy"), e.to_string()))?;
        CacheSpec::new(setting, policy, schedule)
            .map(Cache::from)
            .map_err(|e| {
                let name = match e {
                    QualityError::GroupSize { .. } => "setting",
                    QualityError::Policy(_) => "policy",
                    _ => "schedule",
                };
                field(at(name), e.to_string())
            })
    }

    /// How reports name the cache: the scheme, the setting under the uniform policy, or
    /// `setting + policy`.
    pub fn label(&self) -> String {
        run_label(
            self.setting.as_deref(),
            self.policy.as_deref(),
            self.scheme.as_deref(),
        )
    }

    /// The row id of this run on text `text`: `t{text}_{setting}_{policy}_{schedule}` or
    /// `t{text}_{scheme}_{schedule}`, with `:` and `+` written `-`.
    pub fn row_id(&self, text: usize) -> String {
        self.id_on(&format!("t{text}"))
    }

    /// The id of this run's attention error on Gaussian draw `draw` (its index among the
    /// seeds): `g{draw}_...`, as [`RunSpec::row_id`] writes the rest.
    pub fn gaussian_id(&self, draw: usize) -> String {
        self.id_on(&format!("g{draw}"))
    }

    /// The same on the matched draw of seed `draw`: `m{draw}_...`.
    pub fn matched_id(&self, draw: usize) -> String {
        self.id_on(&format!("m{draw}"))
    }

    fn id_on(&self, input: &str) -> String {
        let cache = match (&self.scheme, &self.setting, &self.policy) {
            (Some(scheme), _, _) => scheme.clone(),
            (None, setting, policy) => format!(
                "{}_{}",
                setting.as_deref().unwrap_or(""),
                policy.as_deref().unwrap_or("")
            ),
        };
        format!("{input}_{cache}_{}", self.schedule).replace([':', '+'], "-")
    }
}

/// How reports name a run's cache (see [`RunSpec::label`]).
pub fn run_label(setting: Option<&str>, policy: Option<&str>, scheme: Option<&str>) -> String {
    match (scheme, setting, policy) {
        (Some(scheme), _, _) => scheme.to_string(),
        (None, Some(setting), Some("uniform") | None) => setting.to_string(),
        (None, Some(setting), Some(policy)) => format!("{setting} + {policy}"),
        (None, None, _) => "-".to_string(),
    }
}

impl QualityProtocol {
    /// Parses and validates (everything but what needs the tokenizer: see [`encode_texts`]).
    pub fn from_json(text: &str) -> Result<QualityProtocol, QualityProtocolError> {
        let deserializer = &mut serde_json::Deserializer::from_str(text);
        let protocol: QualityProtocol =
            serde_path_to_error::deserialize(deserializer).map_err(|err| {
                let path = err.path().to_string();
                QualityProtocolError::Parse {
                    field: if path == "." {
                        "(top level)".into()
                    } else {
                        path
                    },
                    message: err.into_inner().to_string(),
                }
            })?;
        protocol.validate()?;
        Ok(protocol)
    }

    /// Checks every bound that does not need the tokenizer.
    pub fn validate(&self) -> Result<(), QualityProtocolError> {
        if !is_name(&self.study, MAX_STUDY_NAME_CHARS) {
            return Err(field(
                "study",
                format!("must be 1 to {MAX_STUDY_NAME_CHARS} characters of [A-Za-z0-9-_.]"),
            ));
        }
        if !self.model.shape().causal {
            return Err(field(
                "model",
                format!(
                    "{} is an encoder: it has no next-token distribution; only smollm2 and \
                     gemma3",
                    self.model
                ),
            ));
        }
        if !(1..=MAX_TEXTS).contains(&self.texts.len()) {
            return Err(field(
                "texts",
                format!("must hold 1 to {MAX_TEXTS} texts, got {}", self.texts.len()),
            ));
        }
        let mut names = BTreeSet::new();
        for (i, text) in self.texts.iter().enumerate() {
            if !is_name(&text.name, MAX_TEXT_NAME_CHARS) {
                return Err(field(
                    format!("texts[{i}].name"),
                    format!("must be 1 to {MAX_TEXT_NAME_CHARS} characters of [A-Za-z0-9-_.]"),
                ));
            }
            if !names.insert(text.name.as_str()) {
                return Err(field(
                    format!("texts[{i}].name"),
                    format!("{} is listed twice", text.name),
                ));
            }
        }
        if !(2..=MAX_TOKENS).contains(&self.max_tokens) {
            return Err(field(
                "max_tokens",
                format!("must be 2 to {MAX_TOKENS}, got {}", self.max_tokens),
            ));
        }
        if !(1..=MAX_RUNS).contains(&self.runs.len()) {
            return Err(field(
                "runs",
                format!("must hold 1 to {MAX_RUNS} runs, got {}", self.runs.len()),
            ));
        }
        let mut seen = BTreeSet::new();
        for (i, run) in self.runs.iter().enumerate() {
            run.spec(i)?;
            if !seen.insert(run) {
                return Err(field(
                    format!("runs[{i}]"),
                    format!("{} {} is listed twice", run.label(), run.schedule),
                ));
            }
        }
        self.validate_calibration()?;
        self.validate_attention()?;
        self.validate_bootstrap()?;
        if let Some((name, problem)) = self
            .sensitivity
            .as_ref()
            .and_then(|spec| crate::sensitivity::refusal(spec, self.runs.len()))
        {
            return Err(field(name, problem));
        }
        if let Some(g) = self.generate {
            if g.prompt_tokens == 0 {
                return Err(field("generate.prompt_tokens", "must be at least 1, got 0"));
            }
            if g.prompt_tokens > self.max_tokens {
                return Err(field(
                    "generate.prompt_tokens",
                    format!(
                        "{} exceeds max_tokens, {}",
                        g.prompt_tokens, self.max_tokens
                    ),
                ));
            }
            if !(1..=MAX_GENERATED).contains(&g.tokens) {
                return Err(field(
                    "generate.tokens",
                    format!("must be 1 to {MAX_GENERATED}, got {}", g.tokens),
                ));
            }
        }
        Ok(())
    }

    /// The calibration text: required when a run names a KVQuant scheme; its name unlike the
    /// texts', and no text inside it or it inside one (calibration is not evaluation).
    fn validate_calibration(&self) -> Result<(), QualityProtocolError> {
        let needs = self
            .specs()?
            .iter()
            .position(|c| matches!(c, Cache::Scheme(s) if s.kvquant().is_some()));
        let Some(calibration) = &self.calibration else {
            return match needs {
                Some(i) => Err(field(
                    "calibration",
                    format!(
                        "missing: runs[{i}] names {}, which fits its levels on a calibration \
                         text that is not evaluated",
                        self.runs[i].label()
                    ),
                )),
                None => Ok(()),
            };
        };
        if !is_name(&calibration.name, MAX_TEXT_NAME_CHARS) {
            return Err(field(
                "calibration.name",
                format!("must be 1 to {MAX_TEXT_NAME_CHARS} characters of [A-Za-z0-9-_.]"),
            ));
        }
        for (i, text) in self.texts.iter().enumerate() {
            if text.name == calibration.name {
                return Err(field(
                    "calibration.name",
                    format!("{} is also texts[{i}]'s name", text.name),
                ));
            }
            let (a, b) = (text.text.trim(), calibration.text.trim());
            if a.contains(b) || b.contains(a) {
                return Err(field(
                    "calibration.text",
                    format!(
                        "overlaps texts[{i}] ({}): calibration is not evaluation",
                        text.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The bootstrap block: [`MIN_RESAMPLES`] to [`MAX_RESAMPLES`] resamples, over at least two
    /// texts.
    fn validate_bootstrap(&self) -> Result<(), QualityProtocolError> {
        let Some(b) = &self.bootstrap else {
            return Ok(());
        };
        if !(MIN_RESAMPLES..=MAX_RESAMPLES).contains(&b.resamples) {
            return Err(field(
                "bootstrap.resamples",
                format!(
                    "must be {MIN_RESAMPLES} to {MAX_RESAMPLES}, got {}",
                    b.resamples
                ),
            ));
        }
        if let Some(pairs) = &b.pairs {
            if !(1..=MAX_PAIRS).contains(&pairs.len()) {
                return Err(field(
                    "bootstrap.pairs",
                    format!("must name 1 to {MAX_PAIRS} pairs, got {}", pairs.len()),
                ));
            }
            let mut seen = BTreeSet::new();
            for (i, &[a, b]) in pairs.iter().enumerate() {
                let problem = if a.max(b) >= self.runs.len() {
                    format!("names run {}, past the {} runs", a.max(b), self.runs.len())
                } else if a == b {
                    format!("compares run {a} with itself")
                } else if !seen.insert((a.min(b), a.max(b))) {
                    format!("repeats the pair of runs {a} and {b}")
                } else {
                    continue;
                };
                return Err(field(format!("bootstrap.pairs[{i}]"), problem));
            }
        }
        if self.texts.len() < 2 {
            return Err(field(
                "bootstrap",
                "resamples the texts: a protocol with one text has nothing to resample",
            ));
        }
        Ok(())
    }

    /// The attention block: a stride of 1 to `max_tokens`; distinct Gaussian seeds, at most
    /// [`MAX_GAUSSIAN_SEEDS`]; matched draws only with seeds; a calibration seed, not one of
    /// them, exactly when a KVQuant run has Gaussian draws to quantize.
    fn validate_attention(&self) -> Result<(), QualityProtocolError> {
        let Some(a) = &self.attention else {
            return Ok(());
        };
        if !(1..=self.max_tokens).contains(&a.stride) {
            return Err(field(
                "attention.stride",
                format!(
                    "must be 1 to max_tokens ({}), got {}",
                    self.max_tokens, a.stride
                ),
            ));
        }
        if a.gaussian_seeds.len() > MAX_GAUSSIAN_SEEDS {
            return Err(field(
                "attention.gaussian_seeds",
                format!(
                    "at most {MAX_GAUSSIAN_SEEDS} seeds, got {}",
                    a.gaussian_seeds.len()
                ),
            ));
        }
        for (i, seed) in a.gaussian_seeds.iter().enumerate() {
            if a.gaussian_seeds[..i].contains(seed) {
                return Err(field(
                    format!("attention.gaussian_seeds[{i}]"),
                    format!("{seed} is listed twice"),
                ));
            }
        }
        if a.matched && a.gaussian_seeds.is_empty() {
            return Err(field(
                "attention.matched",
                "matched draws are drawn from the Gaussian seeds, and there are none",
            ));
        }
        let kvquant = self
            .specs()?
            .iter()
            .any(|c| matches!(c, Cache::Scheme(s) if s.kvquant().is_some()));
        match (kvquant && !a.gaussian_seeds.is_empty(), a.calibration_seed) {
            (true, None) => Err(field(
                "attention.calibration_seed",
                "missing: a KVQuant run fits its levels on a Gaussian draw of its own",
            )),
            (false, Some(_)) => Err(field(
                "attention.calibration_seed",
                "only a KVQuant run over Gaussian draws reads it",
            )),
            (true, Some(seed)) if a.gaussian_seeds.contains(&seed) => Err(field(
                "attention.calibration_seed",
                format!("{seed} is also a Gaussian seed: calibration is not evaluation"),
            )),
            _ => Ok(()),
        }
    }

    /// The cache configurations, in protocol order (validated).
    pub fn specs(&self) -> Result<Vec<Cache>, QualityProtocolError> {
        self.runs
            .iter()
            .enumerate()
            .map(|(i, r)| r.spec(i))
            .collect()
    }
}

/// Why a study cannot run or be written.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum QualityStudyError {
    /// The protocol is refused.
    #[error(transparent)]
    Protocol(#[from] QualityProtocolError),
    /// The cache or a measurement is refused.
    #[error(transparent)]
    Quality(#[from] QualityError),
    /// The model cannot run.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The model files are missing.
    #[error(transparent)]
    Files(#[from] models::files::FilesError),
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] BpeError),
    /// The thread pool cannot be built.
    #[error("starting {threads} worker threads")]
    Threads {
        /// Threads asked for.
        threads: usize,
        /// Rayon's error.
        #[source]
        source: rayon::ThreadPoolBuildError,
    },
    /// Writing the directory failed.
    #[error(transparent)]
    Evidence(#[from] EvidenceError),
    /// The shard is not one of the protocol's.
    #[error(transparent)]
    Shard(#[from] ShardError),
}

/// Encodes each text and cuts it to `max_tokens` ids; refuses a text with fewer than 2 ids or
/// fewer than `generate.prompt_tokens`, naming `texts[i].text`.
pub fn encode_texts(
    protocol: &QualityProtocol,
    decoder: &Decoder,
) -> Result<Vec<Vec<u32>>, QualityStudyError> {
    let mut out = Vec::with_capacity(protocol.texts.len());
    for (i, text) in protocol.texts.iter().enumerate() {
        let mut ids = decoder.encode(&text.text)?;
        ids.truncate(protocol.max_tokens);
        let least = protocol.generate.map_or(2, |g| g.prompt_tokens.max(2));
        if ids.len() < least {
            return Err(field(
                format!("texts[{i}].text"),
                format!("encodes to {} ids; at least {least} are needed", ids.len()),
            )
            .into());
        }
        out.push(ids);
    }
    Ok(out)
}

/// The float32 pass of one text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextResult {
    /// The ids scored (after the cut).
    pub ids: Vec<u32>,
    /// ln p_f32 of each next id, per position (T - 1).
    pub logp: Vec<f64>,
    /// The f32 logits' argmax per position (T - 1).
    pub argmax: Vec<u32>,
    /// The greedy continuation with the float32 cache, when generating.
    pub generated: Option<Vec<u32>>,
    /// Its UTF-8 lossy decode.
    pub generated_text: Option<String>,
    /// Per layer, per KV head, the mechanisms measured on the pass, when asked for.
    pub mechanisms: Option<Vec<Vec<HeadMeasures>>>,
}

/// One row: a run on a text, with its per-position arrays.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Row {
    /// What results.json holds.
    pub result: ResultRow,
    /// ln p_packed of each next id.
    pub logp: Vec<f64>,
    /// KL(p_f32 || p_packed) per position.
    pub kl: Vec<f64>,
    /// The packed logits' argmax per position.
    pub argmax: Vec<u32>,
    /// The greedy continuation with the packed cache, when generating.
    pub generated: Option<Vec<u32>>,
    /// Per layer, the outlier values its cache stores (KVQuant runs only).
    pub outliers: Option<Vec<usize>>,
}

/// One object of results.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultRow {
    /// [`RunSpec::row_id`].
    pub id: String,
    /// The text's index.
    pub text: usize,
    /// Setting label (a [`KvSetting`]); absent for a scheme.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setting: Option<String>,
    /// Policy label; absent for a scheme.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Scheme name; absent for a setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// Schedule label.
    pub schedule: String,
    /// T.
    pub tokens: usize,
    /// T - 1.
    pub positions: usize,
    /// -(sum of `t{i}_f32_logp` in order) / (T - 1).
    pub nll_f32: f64,
    /// -(sum of `<id>_logp` in order) / (T - 1).
    pub nll: f64,
    /// exp(nll_f32).
    pub perplexity_f32: f64,
    /// exp(nll).
    pub perplexity: f64,
    /// (sum of `<id>_kl` in order) / (T - 1).
    pub kl_mean: f64,
    /// max of `<id>_kl`.
    pub kl_max: f64,
    /// Share of positions whose argmax equals the f32 cache's.
    pub top1_agreement: f64,
    /// End-state cache bytes / T, summed over layers from what each layer's cache stores
    /// (`crate::cache` docs for a setting, `kvschemes::LayerCache::stored` for a scheme).
    pub bytes_per_token: f64,
    /// [`bits_per_element`] of `bytes_per_token`.
    pub bits_per_element: f64,
    /// The float32 cache's bytes per token at the end of the text: 2 * kv_heads * head_dim * 4
    /// for each token each layer holds (every token, or a sliding layer's last 512), over T.
    #[serde(serialize_with = "crate::cache::whole_as_integer")]
    pub float32_bytes_per_token: f64,
    /// The first generated index that differs from the f32 cache's (`null`: none); absent
    /// without generation.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub first_departure: Option<Option<usize>>,
    /// UTF-8 lossy decode of `<id>_generated`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_text: Option<String>,
    /// UTF-8 lossy decode of `t{i}_f32_generated`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub f32_generated_text: Option<String>,
}

pub use crate::cache::bits_per_element;

impl ResultRow {
    /// How reports name its cache ([`RunSpec::label`]).
    pub fn label(&self) -> String {
        run_label(
            self.setting.as_deref(),
            self.policy.as_deref(),
            self.scheme.as_deref(),
        )
    }
}

impl SummaryRow {
    /// How reports name its cache ([`RunSpec::label`]).
    pub fn label(&self) -> String {
        run_label(
            self.setting.as_deref(),
            self.policy.as_deref(),
            self.scheme.as_deref(),
        )
    }
}

/// A member that is present, `null` included (absent is `None` by `default`).
fn present<'de, D>(deserializer: D) -> Result<Option<Option<usize>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Option::<usize>::deserialize(deserializer).map(Some)
}

/// A finished study in memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Study {
    /// Per text, in order.
    pub texts: Vec<TextResult>,
    /// Per row: texts, then runs in protocol order.
    pub rows: Vec<Row>,
    /// The calibration, when the protocol has a calibration text.
    pub calibration: Option<CalibrationRun>,
    /// Each run's attention error, when the protocol asks for it.
    pub attention: Option<AttentionResult>,
    /// The perturbed passes: per text, per perturbation, per named run.
    pub sensitivity: Vec<PerturbedRow>,
}

/// A named run's pass with perturbed cache inputs ([`crate::sensitivity`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerturbedRow {
    /// `s{k}_{row id}`.
    pub id: String,
    /// ln p of each next id.
    pub logp: Vec<f64>,
    /// KL(p_f32 || p) per position.
    pub kl: Vec<f64>,
    /// The argmax per position.
    pub argmax: Vec<u32>,
    /// `nll - nll_f32`, KL mean and top-1 agreement, as a row computes them.
    pub values: crate::sensitivity::Metrics,
}

/// The calibration text's ids and each KVQuant scheme's calibration fitted on them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationRun {
    /// Its first [`CALIBRATION_TOKENS`] ids.
    pub ids: Vec<u32>,
    /// Per KVQuant scheme, in the order runs first name them.
    pub fitted: Vec<(KvQuantScheme, Arc<Calibration>)>,
}

/// Progress steps of a protocol, or of one shard of it: the calibration pass, when there is
/// one; per text of the run, its float32 pass, then one per run and per perturbed pass.
pub fn steps(protocol: &QualityProtocol, shard: Option<Shard>) -> usize {
    let perturbed = protocol
        .sensitivity
        .as_ref()
        .map_or(0, |s| s.perturbations.len() * s.runs.len());
    let texts = match shard {
        Some(shard) => shard.range(protocol.texts.len()).len(),
        None => protocol.texts.len(),
    };
    usize::from(protocol.calibration.is_some()) + texts * (1 + protocol.runs.len() + perturbed)
}

pub use crate::scheme::LayerBuilder;

/// Runs the study on `threads` worker threads; `progress` receives the steps done (see
/// [`steps`]) and may be called from any of them.
pub fn run_study(
    protocol: &QualityProtocol,
    decoder: &Decoder,
    threads: usize,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<Study, QualityStudyError> {
    let layer = |cache: &Cache, at: (usize, usize), window: Option<usize>, kv: &LayerKv<'_>| {
        cache.layer(at, window, kv)
    };
    run_study_with(protocol, decoder, threads, progress, &layer)
}

/// [`run_study`] with each run's cache built by `layer`: the study's own arithmetic around a
/// cache the caller supplies, so that a test can forge a study whose every downstream figure,
/// file and hash is consistent with a cache that is not the scheme's (greedy generation still
/// uses [`Cache::layer`]).
pub fn run_study_with(
    protocol: &QualityProtocol,
    decoder: &Decoder,
    threads: usize,
    progress: &(dyn Fn(usize) + Sync),
    layer: &LayerBuilder,
) -> Result<Study, QualityStudyError> {
    run_part(protocol, decoder, (threads, progress), layer, None)
}

/// One shard of the study ([`crate::shard`]): the texts of its slice, each with everything a
/// whole run computes for it; shard 1 also keeps the calibration and the Gaussian draws' errors.
pub fn run_study_shard(
    protocol: &QualityProtocol,
    decoder: &Decoder,
    threads: usize,
    progress: &(dyn Fn(usize) + Sync),
    shard: Shard,
) -> Result<Study, QualityStudyError> {
    let layer = |cache: &Cache, at: (usize, usize), window: Option<usize>, kv: &LayerKv<'_>| {
        cache.layer(at, window, kv)
    };
    run_part(protocol, decoder, (threads, progress), &layer, Some(shard))
}

/// The study, or one shard of it.
fn run_part(
    protocol: &QualityProtocol,
    decoder: &Decoder,
    (threads, progress): (usize, &(dyn Fn(usize) + Sync)),
    layer: &LayerBuilder,
    shard: Option<Shard>,
) -> Result<Study, QualityStudyError> {
    protocol.validate()?;
    let texts_run = match shard {
        Some(shard) => shard.slice(protocol.texts.len(), "texts")?,
        None => 0..protocol.texts.len(),
    };
    // What belongs to the protocol rather than to a text: kept by a whole run and by shard 1.
    let keeps_shared = shard.is_none_or(|s| s.index == 1);
    if decoder.model().name() != protocol.model {
        return Err(QualityError::NotDecoder(protocol.model).into());
    }
    let model = decoder.model();
    let mut specs = protocol.specs()?;
    let all_ids = encode_texts(protocol, decoder)?;
    let done = AtomicUsize::new(0);
    let step = || progress(done.fetch_add(1, Ordering::SeqCst) + 1);
    let calibration = match &protocol.calibration {
        Some(text) => {
            let mut ids = decoder.encode(&text.text)?;
            ids.truncate(CALIBRATION_TOKENS);
            let schemes = crate::scheme::kvquant_schemes(&specs);
            let fitted = crate::scheme::calibrate(model, &ids, &schemes)?;
            specs = crate::scheme::with_calibrations(&specs, &fitted)?;
            step();
            Some(CalibrationRun { ids, fitted })
        }
        None => None,
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|source| QualityStudyError::Threads { threads, source })?;
    let windows: Vec<Option<usize>> = (0..model.layers()).map(|l| model.window(l)).collect();
    let mut texts = Vec::with_capacity(all_ids.len());
    let mut rows = Vec::with_capacity(all_ids.len() * specs.len());
    let mut attention_texts = Vec::new();
    let mut text0_stats = None;
    let mut sensitivity = Vec::new();
    let slice = all_ids
        .into_iter()
        .enumerate()
        .skip(texts_run.start)
        .take(texts_run.len());
    for (t, ids) in slice {
        let float32_bytes = crate::cache::f32_held_bytes_per_token(
            &windows,
            model.kv_heads(),
            model.head_dim(),
            ids.len(),
        );
        // The float32 pass, shared by every run of this text (and where each run's attention
        // error and the mechanisms are measured, when asked for).
        let measure_stats = t == 0 && protocol.attention.as_ref().is_some_and(|a| a.matched);
        let Float32Pass {
            hidden,
            errors,
            mechanisms,
            stats,
        } = float32_pass(protocol, model, &ids, (&specs, layer), measure_stats, &pool)?;
        if let Some(errors) = errors {
            attention_texts.push(errors);
        }
        if stats.is_some() {
            text0_stats = stats;
        }
        let Scored {
            reference,
            logp: f32_logp,
            argmax: f32_argmax,
        } = Reference::score(model, &ids, hidden, crate::reference::ROWS_BUDGET_BYTES)?;
        let prompt = protocol.generate.map(|g| &ids[..g.prompt_tokens]);
        let f32_generated = match (prompt, protocol.generate) {
            (Some(prompt), Some(g)) => Some(model.generate_greedy(prompt, g.tokens)?),
            _ => None,
        };
        let f32_generated_text = f32_generated
            .as_deref()
            .map(|g| decoder.decode(g))
            .transpose()?;
        step();
        let text_rows: Vec<Result<Row, QualityStudyError>> = pool.install(|| {
            specs
                .par_iter()
                .zip(&protocol.runs)
                .map(|(spec, run)| {
                    let row = one_row(
                        decoder,
                        RowInput {
                            text: t,
                            ids: &ids,
                            spec: spec.clone(),
                            run,
                            reference: &reference,
                            f32_logp: &f32_logp,
                            f32_argmax: &f32_argmax,
                            prompt,
                            generate: protocol.generate,
                            f32_generated: f32_generated.as_deref(),
                            f32_generated_text: f32_generated_text.as_deref(),
                            float32_bytes,
                        },
                        layer,
                    );
                    step();
                    row
                })
                .collect()
        });
        for row in text_rows {
            rows.push(row?);
        }
        if let Some(spec) = &protocol.sensitivity {
            let jobs: Vec<(usize, usize)> = (0..spec.perturbations.len())
                .flat_map(|k| spec.runs.iter().map(move |&r| (k, r)))
                .collect();
            let moved: Vec<Result<PerturbedRow, QualityStudyError>> = pool.install(|| {
                jobs.par_iter()
                    .map(|&(k, r)| {
                        let row = perturbed_row(
                            model,
                            &ids,
                            (&specs[r], layer),
                            (k, spec.perturbations[k]),
                            &protocol.runs[r].row_id(t),
                            (&reference, &f32_logp, &f32_argmax),
                        );
                        step();
                        row
                    })
                    .collect()
            });
            for row in moved {
                sensitivity.push(row?);
            }
        }
        texts.push(TextResult {
            ids,
            logp: f32_logp,
            argmax: f32_argmax,
            generated: f32_generated,
            generated_text: f32_generated_text,
            mechanisms,
        });
    }
    let attention = match &protocol.attention {
        Some(_) if !keeps_shared => Some(AttentionResult {
            texts: attention_texts,
            gaussian: Vec::new(),
            stats: None,
            matched: Vec::new(),
        }),
        Some(a) => {
            let shape = protocol.model.shape();
            let draws = |draw: Draw<'_>| -> Result<Vec<Vec<GaussianRun>>, QualityError> {
                let calibrations = match a.calibration_seed {
                    Some(seed) => crate::attention_error::gaussian_calibrations(
                        (seed, draw),
                        &shape,
                        protocol.max_tokens,
                        &specs,
                    )?,
                    None => Vec::new(),
                };
                a.gaussian_seeds
                    .iter()
                    .map(|&seed| {
                        crate::attention_error::gaussian_runs(
                            (seed, draw),
                            &shape,
                            protocol.max_tokens,
                            &specs,
                            &calibrations,
                            layer,
                            a.stride,
                            &pool,
                        )
                    })
                    .collect()
            };
            let gaussian = draws(Draw::Iid)?;
            let matched = match &text0_stats {
                Some(stats) => draws(Draw::Matched(stats))?,
                None => Vec::new(),
            };
            Some(AttentionResult {
                texts: attention_texts,
                gaussian,
                stats: text0_stats,
                matched,
            })
        }
        None => None,
    };
    Ok(Study {
        texts,
        rows,
        calibration: calibration.filter(|_| keeps_shared),
        attention,
        sensitivity,
    })
}

/// Each layer's attention error per run, from a text's float32 pass.
type TextErrors = Vec<Vec<LayerError>>;
/// Each layer's mechanisms per KV head, from a text's float32 pass.
type TextMechanisms = Vec<Vec<HeadMeasures>>;

/// A text's float32 pass: the stream the LM head reads, and what it measured when asked.
struct Float32Pass {
    hidden: Array2<f32>,
    errors: Option<TextErrors>,
    mechanisms: Option<TextMechanisms>,
    /// Each layer's per-channel statistics ([`crate::attention_error::layer_stats`]).
    stats: Option<Vec<LayerStats>>,
}

/// A text's float32 pass: the stream the LM head reads and, when the protocol asks, every run's
/// attention error at each layer ([`crate::attention_error`]), each layer's mechanisms
/// ([`crate::mechanisms`]) and, with `stats`, each layer's per-channel statistics. A source that
/// hands attention the layer's own rows gives the plain pass's bits.
fn float32_pass(
    protocol: &QualityProtocol,
    model: &dyn CausalLm,
    ids: &[u32],
    (specs, layer): (&[Cache], &LayerBuilder),
    stats: bool,
    pool: &rayon::ThreadPool,
) -> Result<Float32Pass, ModelError> {
    if protocol.attention.is_none() && !protocol.mechanisms {
        let hidden = model.hidden_with(ids, &mut |_, _, _| Ok(()))?.0;
        return Ok(Float32Pass {
            hidden,
            errors: None,
            mechanisms: None,
            stats: None,
        });
    }
    let layers = model.layers();
    let mut errors = vec![Vec::with_capacity(layers); specs.len()];
    let mut mechanisms = Vec::with_capacity(layers);
    let mut layer_stats = Vec::with_capacity(layers);
    let (hidden, _) = model.hidden_with_layer_source(ids, &mut |l, kv| {
        let window = model.window(l);
        if let Some(a) = &protocol.attention {
            let measured = crate::attention_error::layer_errors(
                specs,
                layer,
                (l, layers),
                window,
                kv,
                a.stride,
                pool,
            )?;
            for (run, (e, _)) in measured.into_iter().enumerate() {
                errors[run].push(e);
            }
        }
        if protocol.mechanisms {
            mechanisms.push(crate::mechanisms::layer(kv, window, pool));
        }
        if stats {
            layer_stats.push(crate::attention_error::layer_stats(kv));
        }
        Ok(Box::new(OwnKv::new(kv.k, kv.v)))
    })?;
    Ok(Float32Pass {
        hidden,
        errors: protocol.attention.is_some().then_some(errors),
        mechanisms: protocol.mechanisms.then_some(mechanisms),
        stats: stats.then_some(layer_stats),
    })
}

/// Scores a pass whose stream is `packed` against the float32 pass's distributions: per
/// position, the log-prob of the next id, the KL and the argmax. The LM head runs a block of
/// positions at a time (Gemma 3's rows are 1 MiB each).
type Scores = (Vec<f64>, Vec<f64>, Vec<u32>);
fn score(
    model: &dyn CausalLm,
    ids: &[u32],
    packed: &Array2<f32>,
    reference: &Reference,
) -> Result<Scores, QualityError> {
    let positions = ids.len() - 1;
    let mut logp = Vec::with_capacity(positions);
    let mut kls = Vec::with_capacity(positions);
    let mut maxes = Vec::with_capacity(positions);
    for block in crate::reference::blocks(positions) {
        let f32_rows = reference.rows(model, block.clone())?;
        for ((j, ls, max), f32_row) in crate::reference::block_rows(model, packed, block)?
            .into_iter()
            .zip(f32_rows.iter())
        {
            logp.push(ls.get(ids[j + 1] as usize).copied().unwrap_or(f64::NAN));
            kls.push(kl(f32_row, &ls));
            maxes.push(max);
        }
    }
    Ok((logp, kls, maxes))
}

/// Named run `spec`'s pass with perturbation `k` of its cache inputs ([`crate::sensitivity`]),
/// scored as a row is.
fn perturbed_row(
    model: &dyn CausalLm,
    ids: &[u32],
    (spec, layer): (&Cache, &LayerBuilder),
    (k, perturbation): (usize, crate::sensitivity::Perturbation),
    row_id: &str,
    (reference, f32_logp, f32_argmax): (&Reference, &[f64], &[u32]),
) -> Result<PerturbedRow, QualityStudyError> {
    let layers = model.layers();
    let mut rng = perturbation.generator();
    let (packed, _) = model.hidden_with_layer_source(ids, &mut |l, kv| {
        let (k_pre, k, v) = crate::sensitivity::perturb(kv, perturbation.relative, &mut rng)?;
        let moved = kv.positions_from(0, (&k, &v, &k_pre))?;
        Ok(layer(spec, (l, layers), model.window(l), &moved)?.0)
    })?;
    let (logp, kl, argmax) = score(model, ids, &packed, reference)?;
    let n = (ids.len() - 1) as f64;
    let sum = |xs: &[f64]| xs.iter().fold(0f64, |a, &x| a + x);
    let agree = argmax
        .iter()
        .zip(f32_argmax)
        .filter(|(a, b)| a == b)
        .count();
    let values = crate::sensitivity::Metrics {
        nll_change: -sum(&logp) / n - -sum(f32_logp) / n,
        kl_mean: sum(&kl) / n,
        top1_agreement: agree as f64 / n,
    };
    Ok(PerturbedRow {
        id: format!("s{k}_{row_id}"),
        logp,
        kl,
        argmax,
        values,
    })
}

/// What one row is computed from.
struct RowInput<'a> {
    text: usize,
    ids: &'a [u32],
    spec: Cache,
    run: &'a RunSpec,
    reference: &'a Reference,
    f32_logp: &'a [f64],
    f32_argmax: &'a [u32],
    prompt: Option<&'a [u32]>,
    generate: Option<Generate>,
    f32_generated: Option<&'a [u32]>,
    f32_generated_text: Option<&'a str>,
    float32_bytes: f64,
}

fn one_row(
    decoder: &Decoder,
    input: RowInput<'_>,
    layer: &LayerBuilder,
) -> Result<Row, QualityStudyError> {
    let RowInput {
        text,
        ids,
        spec,
        run,
        reference,
        f32_logp,
        f32_argmax,
        prompt,
        generate,
        f32_generated,
        f32_generated_text,
        float32_bytes,
    } = input;
    let positions = ids.len() - 1;
    let model = decoder.model();
    let layers = model.layers();
    let mut cache_bytes = 0usize;
    let mut outliers = Vec::with_capacity(layers);
    let is_kvquant = matches!(&spec, Cache::Scheme(s) if s.kvquant().is_some());
    let (packed, _) = model.hidden_with_layer_source(ids, &mut |l, kv| {
        let (source, cost) = layer(&spec, (l, layers), model.window(l), kv)?;
        cache_bytes = cache_bytes.saturating_add(cost.bytes);
        outliers.push(cost.outliers);
        Ok(source)
    })?;
    let (logp, kls, maxes) = score(model, ids, &packed, reference)?;
    drop(packed);
    let generated = match (prompt, generate) {
        (Some(prompt), Some(g)) => Some(crate::generate::greedy(
            model,
            prompt,
            g.tokens,
            spec,
            |_| {},
        )?),
        _ => None,
    };
    let n = positions as f64;
    let sum = |xs: &[f64]| xs.iter().fold(0f64, |a, &x| a + x);
    let nll_f32 = -sum(f32_logp) / n;
    let nll = -sum(&logp) / n;
    let agree = maxes.iter().zip(f32_argmax).filter(|(a, b)| a == b).count();
    let (first_departure, generated_text) = match (&generated, f32_generated) {
        (Some(g), Some(f)) => (
            Some(crate::generate::first_difference(f, g)),
            Some(decoder.decode(g)?),
        ),
        _ => (None, None),
    };
    Ok(Row {
        result: ResultRow {
            id: run.row_id(text),
            text,
            setting: run.setting.clone(),
            policy: run.policy.clone(),
            scheme: run.scheme.clone(),
            schedule: run.schedule.clone(),
            tokens: ids.len(),
            positions,
            nll_f32,
            nll,
            perplexity_f32: libm::exp(nll_f32),
            perplexity: libm::exp(nll),
            kl_mean: sum(&kls) / n,
            kl_max: kls.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x)),
            top1_agreement: agree as f64 / n,
            bytes_per_token: cache_bytes as f64 / ids.len() as f64,
            bits_per_element: bits_per_element(
                cache_bytes as f64 / ids.len() as f64,
                float32_bytes,
            ),
            float32_bytes_per_token: float32_bytes,
            first_departure,
            generated_text,
            f32_generated_text: f32_generated_text.map(str::to_string),
        },
        logp,
        kl: kls,
        argmax: maxes,
        generated,
        outliers: is_kvquant.then_some(outliers),
    })
}

/// summary.json: the float32 row and a row per run, each averaged over the texts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Texts averaged over.
    pub texts: usize,
    /// The float32 cache.
    pub float32: Float32Row,
    /// Per run, in protocol order.
    pub rows: Vec<SummaryRow>,
    /// Each run's attention error, when the protocol asks for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention: Option<AttentionSummary>,
    /// Intervals from a paired bootstrap over the texts, when the protocol asks for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapSummary>,
    /// The mechanisms per layer and KV head, averaged over the texts, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mechanisms: Option<MechanismSummary>,
    /// The named runs' numerical sensitivity, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sensitivity: Option<SensitivitySummary>,
}

/// The float32 cache's row of the summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Float32Row {
    /// Mean over texts of `nll_f32`.
    pub nll: f64,
    /// exp(nll).
    pub perplexity: f64,
    /// Mean over texts of each text's `float32_bytes_per_token`.
    #[serde(serialize_with = "crate::cache::whole_as_integer")]
    pub bytes_per_token: f64,
}

/// A run averaged over the texts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryRow {
    /// Setting label (a [`KvSetting`]); absent for a scheme.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setting: Option<String>,
    /// Policy label; absent for a scheme.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Scheme name; absent for a setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// Schedule label.
    pub schedule: String,
    /// Mean over texts (in text order) of the rows' `nll_f32`.
    pub nll_f32: f64,
    /// Mean over texts of `nll`.
    pub nll: f64,
    /// exp(nll_f32) of the mean.
    pub perplexity_f32: f64,
    /// exp(nll) of the mean.
    pub perplexity: f64,
    /// Mean over texts of `kl_mean`.
    pub kl_mean: f64,
    /// Max over texts of `kl_max`.
    pub kl_max: f64,
    /// Median of KL over every scored position of every text ([`crate::metrics::median`]).
    pub kl_median: f64,
    /// Its 99th percentile ([`crate::metrics::percentile`]).
    pub kl_p99: f64,
    /// Its 99.9th percentile.
    pub kl_p999: f64,
    /// Mean KL within each band of [`crate::metrics::POSITION_BANDS`], pooled over the texts;
    /// null for a band no text reaches.
    pub kl_band_means: Vec<Option<f64>>,
    /// Mean over texts of `top1_agreement`.
    pub top1_agreement: f64,
    /// Mean over texts of `bytes_per_token`.
    pub bytes_per_token: f64,
    /// [`bits_per_element`] of `bytes_per_token`.
    pub bits_per_element: f64,
    /// Mean over texts of the float32 cache's bytes per token.
    #[serde(serialize_with = "crate::cache::whole_as_integer")]
    pub float32_bytes_per_token: f64,
}

/// The summary of `study_rows` (texts, then runs in protocol order). A run's bits per element
/// are its mean bytes per token over the float32 cache's mean, times 32.
pub fn summarize(protocol: &QualityProtocol, study: &Study) -> Summary {
    let study_rows = &study.rows[..];
    let results: Vec<ResultRow> = study_rows.iter().map(|r| r.result.clone()).collect();
    let rows = &results[..];
    let runs = protocol.runs.len();
    let texts = protocol.texts.len();
    let n = texts as f64;
    let mean = |r: usize, f: &dyn Fn(&ResultRow) -> f64| {
        (0..texts).fold(0f64, |a, t| a + f(&rows[t * runs + r])) / n
    };
    let float32_bytes = if rows.len() == texts * runs && runs > 0 {
        (0..texts).fold(0f64, |a, t| a + rows[t * runs].float32_bytes_per_token) / n
    } else {
        f64::NAN
    };
    // Each run's KL over every position of every text, sorted.
    let pooled: Vec<Vec<f64>> = (0..runs)
        .map(|r| {
            let mut all: Vec<f64> = (0..texts)
                .filter_map(|t| study_rows.get(t * runs + r))
                .flat_map(|row| row.kl.iter().copied())
                .collect();
            all.sort_by(f64::total_cmp);
            all
        })
        .collect();
    let out: Vec<SummaryRow> = (0..runs)
        .filter(|&r| rows.len() == texts * runs && r < rows.len())
        .map(|r| {
            let nll_f32 = mean(r, &|x| x.nll_f32);
            let nll = mean(r, &|x| x.nll);
            SummaryRow {
                setting: rows[r].setting.clone(),
                policy: rows[r].policy.clone(),
                scheme: rows[r].scheme.clone(),
                schedule: rows[r].schedule.clone(),
                nll_f32,
                nll,
                perplexity_f32: libm::exp(nll_f32),
                perplexity: libm::exp(nll),
                kl_mean: mean(r, &|x| x.kl_mean),
                kl_max: (0..texts).fold(f64::NEG_INFINITY, |m, t| m.max(rows[t * runs + r].kl_max)),
                kl_median: metrics::median(&pooled[r]),
                kl_p99: metrics::percentile(&pooled[r], 0.99),
                kl_p999: metrics::percentile(&pooled[r], 0.999),
                kl_band_means: metrics::band_means(
                    &(0..texts)
                        .map(|t| study_rows[t * runs + r].kl.as_slice())
                        .collect::<Vec<_>>(),
                ),
                top1_agreement: mean(r, &|x| x.top1_agreement),
                bytes_per_token: mean(r, &|x| x.bytes_per_token),
                bits_per_element: bits_per_element(mean(r, &|x| x.bytes_per_token), float32_bytes),
                float32_bytes_per_token: float32_bytes,
            }
        })
        .collect();
    let nll = out.first().map_or(f64::NAN, |r| r.nll_f32);
    Summary {
        texts,
        float32: Float32Row {
            nll,
            perplexity: libm::exp(nll),
            bytes_per_token: float32_bytes,
        },
        rows: out,
        attention: protocol
            .attention
            .as_ref()
            .zip(study.attention.as_ref())
            .map(|(spec, result)| summarize_attention(protocol, spec, result)),
        bootstrap: protocol
            .bootstrap
            .as_ref()
            .filter(|_| rows.len() == texts * runs)
            .map(|spec| summarize_bootstrap(spec, protocol, rows)),
        mechanisms: study
            .texts
            .iter()
            .map(|t| t.mechanisms.clone())
            .collect::<Option<Vec<_>>>()
            .filter(|_| protocol.mechanisms)
            .map(|texts| crate::mechanisms::summarize(&texts)),
        sensitivity: protocol
            .sensitivity
            .as_ref()
            .filter(|_| rows.len() == texts * runs)
            .map(|spec| summarize_sensitivity(spec, protocol, rows, &study.sensitivity)),
    }
}

/// summary.json's `bootstrap`: each run's per-text values from `rows` (texts, then runs).
fn summarize_bootstrap(
    spec: &BootstrapSpec,
    protocol: &QualityProtocol,
    rows: &[ResultRow],
) -> BootstrapSummary {
    let runs = protocol.runs.len();
    let texts = protocol.texts.len();
    let labels: Vec<_> = protocol
        .runs
        .iter()
        .map(|r| {
            (
                r.setting.clone(),
                r.policy.clone(),
                r.scheme.clone(),
                r.schedule.clone(),
            )
        })
        .collect();
    let per_run: Vec<crate::bootstrap::PerText> = (0..runs)
        .map(|r| {
            let of =
                |f: fn(&ResultRow) -> f64| (0..texts).map(|t| f(&rows[t * runs + r])).collect();
            crate::bootstrap::PerText {
                nll_change: of(|x| x.nll - x.nll_f32),
                kl_mean: of(|x| x.kl_mean),
                top1_agreement: of(|x| x.top1_agreement),
            }
        })
        .collect();
    crate::bootstrap::summarize(spec, &labels, &per_run)
}

/// summary.json's `sensitivity`: the named runs' per-text values from `rows` (texts, then runs)
/// and from the perturbed passes (texts, then perturbations, then named runs).
fn summarize_sensitivity(
    spec: &SensitivitySpec,
    protocol: &QualityProtocol,
    rows: &[ResultRow],
    moved: &[PerturbedRow],
) -> SensitivitySummary {
    use crate::sensitivity::PerText;
    let (runs, texts) = (protocol.runs.len(), protocol.texts.len());
    let named = spec.runs.len();
    let per_text = |f: &dyn Fn(usize) -> crate::sensitivity::Metrics| PerText {
        nll_change: (0..texts).map(|t| f(t).nll_change).collect(),
        kl_mean: (0..texts).map(|t| f(t).kl_mean).collect(),
        top1_agreement: (0..texts).map(|t| f(t).top1_agreement).collect(),
    };
    let base: Vec<PerText> = spec
        .runs
        .iter()
        .map(|&r| {
            per_text(&|t| {
                let x = &rows[t * runs + r];
                crate::sensitivity::Metrics {
                    nll_change: x.nll - x.nll_f32,
                    kl_mean: x.kl_mean,
                    top1_agreement: x.top1_agreement,
                }
            })
        })
        .collect();
    let per_perturbation = spec.perturbations.len() * named;
    let perturbed: Vec<Vec<PerText>> = (0..spec.perturbations.len())
        .map(|k| {
            (0..named)
                .map(|j| per_text(&|t| moved[t * per_perturbation + k * named + j].values))
                .collect()
        })
        .collect();
    crate::sensitivity::summarize(spec, &base, &perturbed)
}

/// summary.json's `attention`: a row per run, in protocol order.
fn summarize_attention(
    protocol: &QualityProtocol,
    spec: &AttentionSpec,
    result: &AttentionResult,
) -> AttentionSummary {
    let shape = protocol.model.shape();
    let windows: Vec<Option<usize>> = (0..shape.layers).map(|l| shape.window(l)).collect();
    let float32 = crate::cache::f32_held_bytes_per_token(
        &windows,
        shape.kv_heads,
        shape.head_dim,
        protocol.max_tokens,
    );
    let rows = protocol
        .runs
        .iter()
        .enumerate()
        .map(|(r, run)| {
            let texts: Vec<&[LayerError]> = result.texts.iter().map(|t| t[r].as_slice()).collect();
            let draws: Vec<&GaussianRun> = result.gaussian.iter().map(|g| &g[r]).collect();
            let matched: Vec<&GaussianRun> = result.matched.iter().map(|g| &g[r]).collect();
            AttentionRow {
                setting: run.setting.clone(),
                policy: run.policy.clone(),
                scheme: run.scheme.clone(),
                schedule: run.schedule.clone(),
                figures: crate::attention_error::figures(
                    &texts,
                    (&draws, &matched),
                    protocol.max_tokens,
                    float32,
                ),
            }
        })
        .collect();
    AttentionSummary {
        stride: spec.stride,
        gaussian_draws: spec.gaussian_seeds.len(),
        rows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn protocol() -> serde_json::Value {
        serde_json::json!({
            "study": "model-quality",
            "model": "smollm2",
            "texts": [ { "name": "a", "text": "Some words here." } ],
            "max_tokens": 64,
            "runs": [ { "setting": "g32_b4", "policy": "uniform", "schedule": "prefill" } ],
            "generate": { "prompt_tokens": 2, "tokens": 3 }
        })
    }

    fn refused(edit: impl FnOnce(&mut serde_json::Value)) -> String {
        let mut v = protocol();
        edit(&mut v);
        match QualityProtocol::from_json(&v.to_string()).unwrap_err() {
            QualityProtocolError::Parse { field, .. }
            | QualityProtocolError::Field { field, .. } => field,
        }
    }

    #[test]
    fn a_bootstrap_needs_two_texts_and_a_bounded_resample_count() {
        use serde_json::json;
        let with = |texts: usize, resamples: usize| {
            let mut v = protocol();
            v["texts"] = (0..texts)
                .map(|i| json!({ "name": format!("t{i}"), "text": format!("Text number {i}.") }))
                .collect();
            v["bootstrap"] = json!({ "resamples": resamples, "seed": 5 });
            QualityProtocol::from_json(&v.to_string())
        };
        assert_eq!(with(2, 100).unwrap().bootstrap.unwrap().resamples, 100);
        let field_of = |r: Result<QualityProtocol, QualityProtocolError>| match r.unwrap_err() {
            QualityProtocolError::Field { field, .. }
            | QualityProtocolError::Parse { field, .. } => field,
        };
        assert_eq!(field_of(with(1, 1000)), "bootstrap");
        assert_eq!(field_of(with(3, 99)), "bootstrap.resamples");
        let runs = 2;
        let pairs = |pairs: serde_json::Value| {
            let mut v = protocol();
            v["texts"] = json!([
                { "name": "a", "text": "One text." },
                { "name": "b", "text": "Another text." }
            ]);
            let run = v["runs"][0].clone();
            v["runs"] = json!([run.clone(), run]);
            v["runs"][1]["schedule"] = json!("streaming");
            v["bootstrap"] = json!({ "resamples": 100, "seed": 5, "pairs": pairs });
            QualityProtocol::from_json(&v.to_string())
        };
        assert_eq!(
            pairs(json!([[1, 0]])).unwrap().bootstrap.unwrap().pairs,
            Some(vec![[1, 0]])
        );
        assert_eq!(field_of(pairs(json!([]))), "bootstrap.pairs");
        assert_eq!(field_of(pairs(json!([[0, runs]]))), "bootstrap.pairs[0]");
        assert_eq!(
            field_of(pairs(json!([[1, 0], [1, 1]]))),
            "bootstrap.pairs[1]"
        );
        assert_eq!(
            field_of(pairs(json!([[1, 0], [0, 1]]))),
            "bootstrap.pairs[1]"
        );
        assert_eq!(field_of(with(3, 100_001)), "bootstrap.resamples");
        assert_eq!(
            refused(|v| v["bootstrap"] = json!({ "resamples": 200, "seed": 1, "level": 0.9 })),
            "bootstrap.level"
        );
    }

    #[test]
    fn a_valid_protocol_parses_and_row_ids_write_colons_as_dashes() {
        let p = QualityProtocol::from_json(&protocol().to_string()).unwrap();
        let run = RunSpec::codec("g32_b2", "recent_f32:64", "streaming");
        assert_eq!(run.row_id(0), "t0_g32_b2_recent_f32-64_streaming");
        assert_eq!(run.label(), "g32_b2 + recent_f32:64");
        let run = RunSpec::scheme("llamacpp-q4_0+rot", "prefill");
        assert_eq!(run.row_id(3), "t3_llamacpp-q4_0-rot_prefill");
        assert_eq!(run.gaussian_id(1), "g1_llamacpp-q4_0-rot_prefill");
        assert_eq!(run.label(), "llamacpp-q4_0+rot");
        assert_eq!(p.specs().unwrap().len(), 1);
    }

    #[test]
    fn each_refusal_names_its_field() {
        assert_eq!(refused(|v| v["colour"] = 1.into()), "colour");
        assert_eq!(refused(|v| v["model"] = "minilm".into()), "model");
        assert_eq!(refused(|v| v["model"] = "gpt".into()), "model");
        assert_eq!(refused(|v| v["max_tokens"] = 1.into()), "max_tokens");
        assert_eq!(refused(|v| v["max_tokens"] = 8193.into()), "max_tokens");
        assert_eq!(refused(|v| v["texts"] = serde_json::json!([])), "texts");
        assert_eq!(
            refused(|v| v["texts"][0]["name"] = "a b".into()),
            "texts[0].name"
        );
        assert_eq!(
            refused(|v| v["runs"][0]["setting"] = "int4".into()),
            "runs[0].setting"
        );
        assert_eq!(
            refused(|v| v["runs"][0]["policy"] = "recent8:48".into()),
            "runs[0].policy"
        );
        assert_eq!(
            refused(|v| {
                v["runs"][0]["policy"] = "recent8:32".into();
                v["runs"][0]["schedule"] = "causal".into();
            }),
            "runs[0].schedule"
        );
        assert_eq!(
            refused(|v| {
                let run = v["runs"][0].clone();
                v["runs"].as_array_mut().unwrap().push(run);
            }),
            "runs[1]"
        );
        assert_eq!(
            refused(|v| v["generate"]["tokens"] = 65.into()),
            "generate.tokens"
        );
        assert_eq!(
            refused(|v| v["generate"]["prompt_tokens"] = 0.into()),
            "generate.prompt_tokens"
        );
        assert_eq!(refused(|v| v["runs"][0]["bits"] = 4.into()), "runs[0].bits");
    }

    #[test]
    fn the_attention_block_is_checked_field_by_field() {
        use serde_json::json;
        let attention = |a: serde_json::Value| move |v: &mut serde_json::Value| v["attention"] = a;
        for ok in [
            json!({ "stride": 8, "gaussian_seeds": [1, 2] }),
            json!({ "stride": 8, "gaussian_seeds": [1], "matched": true }),
        ] {
            let mut v = protocol();
            attention(ok)(&mut v);
            assert!(QualityProtocol::from_json(&v.to_string()).is_ok());
        }
        for (block, at) in [
            (
                json!({ "stride": 0, "gaussian_seeds": [] }),
                "attention.stride",
            ),
            (
                json!({ "stride": 65, "gaussian_seeds": [] }),
                "attention.stride",
            ),
            (
                json!({ "stride": 8, "gaussian_seeds": [3, 3] }),
                "attention.gaussian_seeds[1]",
            ),
            (
                json!({ "stride": 8, "gaussian_seeds": [0, 1, 2, 3, 4, 5, 6, 7, 8] }),
                "attention.gaussian_seeds",
            ),
            (
                json!({ "stride": 8, "gaussian_seeds": [1], "calibration_seed": 2 }),
                "attention.calibration_seed",
            ),
            (
                json!({ "stride": 8, "gaussian_seeds": [1], "colour": 2 }),
                "attention.colour",
            ),
            (
                json!({ "stride": 8, "gaussian_seeds": [], "matched": true }),
                "attention.matched",
            ),
        ] {
            assert_eq!(refused(attention(block)), at);
        }
        // A KVQuant run over Gaussian draws needs a calibration draw of its own.
        let kvquant = |seed: Option<u64>| {
            move |v: &mut serde_json::Value| {
                v["runs"] = json!([{ "scheme": "kvquant3", "schedule": "prefill" }]);
                v["calibration"] = json!({ "name": "c", "text": "Other words entirely." });
                v["attention"] = json!({ "stride": 8, "gaussian_seeds": [1] });
                if let Some(seed) = seed {
                    v["attention"]["calibration_seed"] = seed.into();
                }
            }
        };
        assert_eq!(refused(kvquant(None)), "attention.calibration_seed");
        assert_eq!(refused(kvquant(Some(1))), "attention.calibration_seed");
        let mut v = protocol();
        kvquant(Some(2))(&mut v);
        assert!(QualityProtocol::from_json(&v.to_string()).is_ok());
    }

    #[test]
    fn a_run_names_a_scheme_or_a_setting_and_policy() {
        let scheme = |v: &mut serde_json::Value, name: &str, schedule: &str| {
            v["runs"][0] = serde_json::json!({ "scheme": name, "schedule": schedule });
        };
        let mut v = protocol();
        scheme(&mut v, "kivi4", "streaming");
        let p = QualityProtocol::from_json(&v.to_string()).unwrap();
        assert!(matches!(p.specs().unwrap()[0], Cache::Scheme(_)));
        assert_eq!(refused(|v| scheme(v, "kivi3", "prefill")), "runs[0].scheme");
        assert_eq!(
            refused(|v| scheme(v, "kivi4", "causal")),
            "runs[0].schedule"
        );
        assert_eq!(
            refused(|v| v["runs"][0]["scheme"] = "kivi4".into()),
            "runs[0].scheme"
        );
        assert_eq!(
            refused(|v| {
                v["runs"][0] = serde_json::json!({ "policy": "uniform", "schedule": "prefill" });
            }),
            "runs[0].setting"
        );
        assert_eq!(
            refused(|v| {
                v["runs"][0] = serde_json::json!({ "setting": "g32_b4", "schedule": "prefill" });
            }),
            "runs[0].policy"
        );
    }

    #[test]
    fn a_kvquant_run_needs_a_calibration_text_that_is_not_evaluated() {
        let kvquant = |v: &mut serde_json::Value| {
            v["runs"][0] =
                serde_json::json!({ "scheme": "kvquant4-first1", "schedule": "prefill" });
        };
        assert_eq!(refused(kvquant), "calibration");
        let mut v = protocol();
        kvquant(&mut v);
        v["calibration"] = serde_json::json!({ "name": "c", "text": "Other words, elsewhere." });
        let p = QualityProtocol::from_json(&v.to_string()).unwrap();
        assert_eq!(steps(&p, None), 1 + 2);
        // Every shard fits the calibration (its KVQuant runs need it).
        let shard = |index, count| Some(Shard { index, count });
        assert_eq!(steps(&p, shard(1, 1)), 1 + 2);
        for (calibration, field) in [
            (
                serde_json::json!({ "name": "a", "text": "Other." }),
                "calibration.name",
            ),
            (
                serde_json::json!({ "name": "c d", "text": "Other." }),
                "calibration.name",
            ),
            (
                serde_json::json!({ "name": "c", "text": "words" }),
                "calibration.text",
            ),
            (
                serde_json::json!({ "name": "c", "text": " Some words here. And more." }),
                "calibration.text",
            ),
        ] {
            assert_eq!(
                refused(|v| {
                    kvquant(v);
                    v["calibration"] = calibration;
                }),
                field
            );
        }
    }

    /// Sizes that passed the validator and then aborted (an allocation from the group size) or
    /// panicked (a wrapping sum) in the run are refused by the validator, naming the field.
    #[test]
    fn group_sizes_and_windows_past_the_context_are_refused_by_field() {
        for setting in ["g4294967296_b4", "g18446744073709551615_b4", "g16384_b4"] {
            assert_eq!(
                refused(|v| v["runs"][0]["setting"] = setting.into()),
                "runs[0].setting",
                "{setting}"
            );
        }
        let huge = format!("recent8:{}", usize::MAX);
        assert_eq!(
            refused(|v| {
                v["runs"][0]["setting"] = "g1_b4".into();
                v["runs"][0]["policy"] = huge.into();
            }),
            "runs[0].policy"
        );
    }
}
