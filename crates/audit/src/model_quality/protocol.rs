//! The model-quality protocol (`experiments/model-quality/protocol.json`), read with the audit's
//! own types and held to the format's bounds. A run names either a codec setting and policy or
//! a scheme of the literature, under a schedule. Setting, policy and schedule labels are parsed
//! here again with the quality crate's rules (`g<GROUP>_b<BITS>[_asym][_swap]`; `uniform`,
//! `recent_f32:W`, `recent8:W`, `early8:W` with W a positive multiple of the group size;
//! `prefill`, `streaming`, `causal`, the last with `uniform` only), and the widths and group
//! sizes the KV codec allows ([`Mode::supports`], a group size of at least 1). A scheme name is
//! one the audit's own schemes parse ([`super::schemes::AuditScheme::parse`]); `causal` is
//! refused for KIVI and quanto, which keep a residual and re-pack on
//! their own terms.
//!
//! A run naming a KVQuant scheme (`kvquant<B>[-first<N>]`) needs the protocol's `calibration`,
//! a `name` and `text` its levels and thresholds are fitted on: the name 1 to 32 of
//! `[A-Za-z0-9-_.]` and none of the texts' names, the text (trimmed) neither containing nor
//! contained in any evaluated text (trimmed): calibration is not evaluation. Its first
//! [`CALIBRATION_TOKENS`] ids (SmolLM2's BPE, no BOS, as the texts are encoded) are the
//! calibration pass's.

use super::geometry::Geometry;
use std::collections::BTreeSet;
use std::fmt;

use serde::Deserialize;

use super::schemes::codec::CodecScheme;
use super::schemes::{AuditScheme, kvquant};
use crate::common::problem::ProtocolError;
use crate::packed_kv::bounds::MAX_STUDY_NAME;
use crate::packed_kv::protocol::Mode;

/// Most texts a protocol lists.
pub const MAX_TEXTS: usize = 64;
/// Most runs a protocol lists.
pub const MAX_RUNS: usize = 72;
/// Longest text name.
pub const MAX_TEXT_NAME: usize = 32;
/// Fewest and most ids scored per text.
pub const TOKEN_RANGE: std::ops::RangeInclusive<usize> = 2..=8192;
/// The most tokens a cache holds (SmolLM2's context): a group size or a policy's window is at
/// most this, as the quality crate requires.
pub const MAX_CACHE_TOKENS: usize = 8192;

/// Most generated tokens.
pub const MAX_GENERATED: usize = 64;
/// Ids of the calibration text the calibration pass reads (its first).
pub const CALIBRATION_TOKENS: usize = 2048;

/// A model-quality study's protocol.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityProtocol {
    /// The study's name.
    pub study: String,
    /// Only `smollm2` (read as text, so another name is named rather than unparsed).
    pub model: String,
    /// The texts, written out in full.
    pub texts: Vec<QualityText>,
    /// Each text's ids are cut to this many.
    pub max_tokens: usize,
    /// The cache configurations, in run order.
    pub runs: Vec<RunLabels>,
    /// Greedy generation, if any.
    #[serde(default)]
    pub generate: Option<Generate>,
    /// The text KVQuant schemes are calibrated on (required when a run names one).
    #[serde(default)]
    pub calibration: Option<QualityText>,
    /// Each run's attention error, when asked for ([`super::attention`]).
    #[serde(default)]
    pub attention: Option<AttentionBlock>,
    /// A paired bootstrap over the texts, when asked for ([`super::bootstrap`]).
    #[serde(default)]
    pub bootstrap: Option<BootstrapBlock>,
    /// Whether each text's float32 pass measures the mechanisms ([`super::mechanisms`]).
    #[serde(default)]
    pub mechanisms: bool,
    /// Named runs re-run with perturbed cache inputs, when asked for ([`super::sensitivity`]).
    #[serde(default)]
    pub sensitivity: Option<SensitivityBlock>,
}

/// Most Gaussian seeds.
pub const MAX_GAUSSIAN_SEEDS: usize = 8;

/// The protocol's `attention` block.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionBlock {
    /// Every stride-th position is a query.
    pub stride: usize,
    /// The Gaussian draws' seeds.
    pub gaussian_seeds: Vec<u64>,
    /// The draw KVQuant is calibrated on.
    #[serde(default)]
    pub calibration_seed: Option<u64>,
    /// Whether each seed is drawn again matched to the first text's per-channel statistics.
    #[serde(default)]
    pub matched: bool,
}

impl AttentionBlock {
    /// The block's bounds: stride 1 to `max_tokens`; at most [`MAX_GAUSSIAN_SEEDS`] distinct
    /// seeds; matched draws only with seeds; a calibration seed, none of them, exactly when a
    /// KVQuant run has draws.
    pub fn validate(&self, max_tokens: usize, runs: &[Run]) -> Result<(), ProtocolError> {
        if !(1..=max_tokens).contains(&self.stride) {
            return Err(refuse("attention.stride", "1 to max_tokens"));
        }
        let seeds = &self.gaussian_seeds;
        if seeds.len() > MAX_GAUSSIAN_SEEDS
            || (1..seeds.len()).any(|i| seeds[..i].contains(&seeds[i]))
        {
            return Err(refuse(
                "attention.gaussian_seeds",
                "at most 8 distinct seeds",
            ));
        }
        if self.matched && seeds.is_empty() {
            return Err(refuse(
                "attention.matched",
                "matched draws need Gaussian seeds",
            ));
        }
        let needs = !seeds.is_empty() && runs.iter().any(|r| r.kvquant().is_some());
        match self.calibration_seed {
            None if needs => Err(refuse(
                "attention.calibration_seed",
                "missing: a KVQuant run is calibrated on a Gaussian draw of its own",
            )),
            Some(_) if !needs => Err(refuse(
                "attention.calibration_seed",
                "only a KVQuant run over Gaussian draws reads it",
            )),
            Some(seed) if seeds.contains(&seed) => Err(refuse(
                "attention.calibration_seed",
                "one of the Gaussian seeds: calibration is not evaluation",
            )),
            _ => Ok(()),
        }
    }
}

/// Fewest resamples.
pub const MIN_RESAMPLES: usize = 100;
/// Most resamples.
pub const MAX_RESAMPLES: usize = 100_000;

/// The protocol's `bootstrap` block.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootstrapBlock {
    /// Resamples drawn.
    pub resamples: usize,
    /// NumPy's `default_rng` seed.
    pub seed: u64,
    /// The pairs compared, `[a, b]` for a - b; absent: every pair, a before b.
    #[serde(default)]
    pub pairs: Option<Vec<[usize; 2]>>,
}

/// Most pairs a `pairs` list may name.
pub const MAX_PAIRS: usize = 256;

impl BootstrapBlock {
    /// 100 to 100,000 resamples over at least two texts; named pairs: 1 to 256, each of two
    /// different runs of the `runs`, no pair twice in either order.
    pub fn validate(&self, texts: usize, runs: usize) -> Result<(), ProtocolError> {
        if !(MIN_RESAMPLES..=MAX_RESAMPLES).contains(&self.resamples) {
            return Err(refuse("bootstrap.resamples", "100 to 100,000"));
        }
        if let Some(pairs) = &self.pairs {
            if !(1..=MAX_PAIRS).contains(&pairs.len()) {
                return Err(refuse("bootstrap.pairs", "1 to 256 pairs"));
            }
            let mut seen = std::collections::BTreeSet::new();
            for (i, &[a, b]) in pairs.iter().enumerate() {
                if a >= runs || b >= runs || a == b || !seen.insert((a.min(b), a.max(b))) {
                    return Err(refuse(
                        format!("bootstrap.pairs[{i}]"),
                        "two different runs of the protocol, a pair not named before",
                    ));
                }
            }
        }
        if texts < 2 {
            return Err(refuse(
                "bootstrap",
                "resamples texts: it needs at least two",
            ));
        }
        Ok(())
    }

    /// The pairs compared among `runs` runs.
    pub fn pairs(&self, runs: usize) -> Vec<(usize, usize)> {
        match &self.pairs {
            Some(named) => named.iter().map(|&[a, b]| (a, b)).collect(),
            None => (0..runs)
                .flat_map(|a| (a + 1..runs).map(move |b| (a, b)))
                .collect(),
        }
    }
}

/// Most perturbations.
pub const MAX_PERTURBATIONS: usize = 4;
/// Largest relative size.
pub const MAX_RELATIVE: f64 = 1e-3;

/// The protocol's `sensitivity` block.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SensitivityBlock {
    /// The perturbations, in order.
    pub perturbations: Vec<Perturbation>,
    /// Indices of the runs perturbed, ascending.
    pub runs: Vec<usize>,
}

/// One perturbation.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Perturbation {
    /// The relative size.
    pub relative: f64,
    /// The seed of each pass's generator.
    pub seed: u64,
}

// A size that is not finite is refused, so equality is an equivalence.
impl Eq for SensitivityBlock {}

impl SensitivityBlock {
    /// The bounds in the module docs, over a protocol of `runs` runs.
    pub fn validate(&self, runs: usize) -> Result<(), ProtocolError> {
        let refuse = |field: String, reason: String| Err(ProtocolError { field, reason });
        if !(1..=MAX_PERTURBATIONS).contains(&self.perturbations.len()) {
            return refuse("sensitivity.perturbations".into(), "1 to 4".into());
        }
        for (k, p) in self.perturbations.iter().enumerate() {
            if !(p.relative.is_finite() && p.relative > 0.0 && p.relative <= MAX_RELATIVE) {
                return refuse(
                    format!("sensitivity.perturbations[{k}].relative"),
                    "above 0 and at most 1e-3".into(),
                );
            }
            if self.perturbations[..k].contains(p) {
                return refuse(
                    format!("sensitivity.perturbations[{k}]"),
                    "a perturbation listed twice".into(),
                );
            }
        }
        if self.runs.is_empty() {
            return refuse("sensitivity.runs".into(), "at least one run".into());
        }
        for (j, &r) in self.runs.iter().enumerate() {
            if r >= runs || (j > 0 && r <= self.runs[j - 1]) {
                return refuse(
                    format!("sensitivity.runs[{j}]"),
                    "indices of the protocol's runs, ascending, each once".into(),
                );
            }
        }
        Ok(())
    }
}

/// The pass of perturbation `k` of `run` on text `t` ([`super::sensitivity`]).
pub fn perturbed_pass_id(k: usize, run: &Run, t: usize) -> String {
    format!("s{k}_{}", run.id(t))
}

/// The archive members a `sensitivity` block adds, in order: each name, whether it is float64 (else
/// int64), and its text.
pub fn sensitivity_members(
    p: &QualityProtocol,
    runs: &[Run],
    texts: usize,
) -> Vec<(String, bool, usize)> {
    let Some(block) = &p.sensitivity else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in 0..texts {
        for k in 0..block.perturbations.len() {
            for &r in &block.runs {
                let id = perturbed_pass_id(k, &runs[r], t);
                out.push((format!("{id}_logp"), true, t));
                out.push((format!("{id}_kl"), true, t));
                out.push((format!("{id}_argmax"), false, t));
            }
        }
    }
    out
}

/// One text.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityText {
    /// 1 to 32 of `[A-Za-z0-9-_.]`.
    pub name: String,
    /// The text itself.
    pub text: String,
}

/// One run as the protocol spells it: a setting and policy, or a scheme.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunLabels {
    /// `g<GROUP>_b<BITS>[_asym][_swap]`.
    #[serde(default)]
    pub setting: Option<String>,
    /// `uniform`, `recent_f32:W`, `recent8:W` or `early8:W`.
    #[serde(default)]
    pub policy: Option<String>,
    /// A scheme's name (`kivi4`, `llamacpp-q4_0+rot`).
    #[serde(default)]
    pub scheme: Option<String>,
    /// `prefill`, `streaming` or `causal`.
    pub schedule: String,
}

/// Greedy generation after a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generate {
    /// Prompt: the first this many ids of each text.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub tokens: usize,
}

/// A codec setting for the whole cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QualitySetting {
    /// Elements per group.
    pub group_size: usize,
    /// Width of the low tier.
    pub bits: u32,
    /// Symmetric or asymmetric.
    pub mode: Mode,
    /// K grouped along features and V along tokens.
    pub swap: bool,
}

impl fmt::Display for QualitySetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "g{}_b{}", self.group_size, self.bits)?;
        if self.mode == Mode::Asymmetric {
            f.write_str("_asym")?;
        }
        if self.swap {
            f.write_str("_swap")?;
        }
        Ok(())
    }
}

/// How the cache spends its bytes over positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// Every position at the setting's width.
    Uniform,
    /// The last W tokens at 8 bits.
    Recent8(usize),
    /// The first W tokens at 8 bits.
    Early8(usize),
    /// A float32 window of the last W tokens.
    RecentF32(usize),
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Window::Uniform => f.write_str("uniform"),
            Window::Recent8(w) => write!(f, "recent8:{w}"),
            Window::Early8(w) => write!(f, "early8:{w}"),
            Window::RecentF32(w) => write!(f, "recent_f32:{w}"),
        }
    }
}

/// When the cache is quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Once, for the whole text.
    Prefill,
    /// Token by token, a group quantized when it fills.
    Streaming,
    /// The whole cache re-packed before each step.
    Causal,
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Schedule::Prefill => "prefill",
            Schedule::Streaming => "streaming",
            Schedule::Causal => "causal",
        })
    }
}

/// A codec setting under a policy and schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodecRun {
    /// The setting.
    pub setting: QualitySetting,
    /// The policy.
    pub policy: Window,
    /// The schedule.
    pub schedule: Schedule,
}

/// What a run's cache is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunCache {
    /// The project's codec.
    Codec(CodecRun),
    /// A scheme, by its name (parsed by [`super::schemes::AuditScheme::parse`] when the
    /// protocol was validated).
    Scheme(String),
}

/// One parsed run, with its labels as the protocol writes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The labels as written (row ids and archive names use them as written; results and
    /// summaries print the parsed values back).
    pub written: RunLabels,
    /// The cache.
    pub cache: RunCache,
    /// The schedule.
    pub schedule: Schedule,
}

impl Run {
    /// The row id for text `text`: `t{text}_{setting}_{policy}_{schedule}` or
    /// `t{text}_{scheme}_{schedule}` with the labels as the protocol writes them, ':' and '+'
    /// written '-' (as the runner names rows).
    pub fn id(&self, text: usize) -> String {
        let w = &self.written;
        let cache = match (&w.scheme, &w.setting, &w.policy) {
            (Some(scheme), _, _) => scheme.clone(),
            (None, setting, policy) => format!(
                "{}_{}",
                setting.as_deref().unwrap_or_default(),
                policy.as_deref().unwrap_or_default()
            ),
        };
        format!("t{text}_{cache}_{}", w.schedule).replace([':', '+'], "-")
    }

    /// The codec run, if the cache is the codec's.
    pub fn codec(&self) -> Option<&CodecRun> {
        match &self.cache {
            RunCache::Codec(c) => Some(c),
            RunCache::Scheme(_) => None,
        }
    }

    /// The setting and policy labels, parsed and printed back (None for a scheme).
    pub fn setting_policy(&self) -> (Option<String>, Option<String>) {
        match &self.cache {
            RunCache::Codec(c) => (Some(c.setting.to_string()), Some(c.policy.to_string())),
            RunCache::Scheme(_) => (None, None),
        }
    }

    /// The scheme's name (None for a codec run).
    pub fn scheme(&self) -> Option<&str> {
        match &self.cache {
            RunCache::Codec(_) => None,
            RunCache::Scheme(name) => Some(name),
        }
    }

    /// Whether the run is a one-layer probe: a codec scheme with `-layer<L>`, every other layer
    /// float32. It is on no frontier and not in the chart ([`super::frontier`]).
    pub fn is_probe(&self) -> bool {
        self.scheme()
            .and_then(CodecScheme::parse)
            .is_some_and(|s| s.layer.is_some())
    }

    /// The (bits, first tokens) of a KVQuant run's scheme (None for any other run).
    pub fn kvquant(&self) -> Option<(u32, usize)> {
        self.scheme().and_then(kvquant::parse)
    }

    /// How reports name the cache: the scheme, the setting under `uniform`, or
    /// `setting + policy`.
    pub fn label(&self) -> String {
        match &self.cache {
            RunCache::Scheme(name) => name.clone(),
            RunCache::Codec(c) if c.policy == Window::Uniform => c.setting.to_string(),
            RunCache::Codec(c) => format!("{} + {}", c.setting, c.policy),
        }
    }

    /// The legend group of its series.
    pub fn group(&self) -> SeriesGroup {
        match &self.cache {
            RunCache::Scheme(_) => SeriesGroup::Scheme,
            RunCache::Codec(c) if c.policy == Window::Uniform => SeriesGroup::Uniform,
            RunCache::Codec(_) => SeriesGroup::Budget,
        }
    }
}

/// The chart legend's groups, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeriesGroup {
    /// A setting under the uniform policy.
    Uniform,
    /// A setting under a budget policy (drawn hollow).
    Budget,
    /// A scheme of the literature.
    Scheme,
}

/// Parses a setting label as the quality crate does; None if it would refuse it.
pub fn parse_setting(label: &str) -> Option<QualitySetting> {
    let mut parts = label.split('_');
    let number = |part: Option<&str>, prefix: char| -> Option<usize> {
        let digits = part?.strip_prefix(prefix)?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    };
    let group_size = number(parts.next(), 'g')?;
    let bits = u32::try_from(number(parts.next(), 'b')?).ok()?;
    let rest: Vec<&str> = parts.collect();
    let (mode, swap) = match rest.as_slice() {
        [] => (Mode::Symmetric, false),
        ["asym"] => (Mode::Asymmetric, false),
        ["swap"] => (Mode::Symmetric, true),
        ["asym", "swap"] => (Mode::Asymmetric, true),
        _ => return None,
    };
    ((1..=MAX_CACHE_TOKENS).contains(&group_size) && mode.supports(bits)).then_some(
        QualitySetting {
            group_size,
            bits,
            mode,
            swap,
        },
    )
}

/// Parses a policy label for `setting`; None if the quality crate would refuse it.
pub fn parse_policy(label: &str, setting: &QualitySetting) -> Option<Window> {
    if label == "uniform" {
        return Some(Window::Uniform);
    }
    let (name, window) = label.split_once(':')?;
    if window.is_empty() || !window.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let window: usize = window.parse().ok()?;
    if window == 0 || window > MAX_CACHE_TOKENS || !window.is_multiple_of(setting.group_size) {
        return None;
    }
    match name {
        "recent8" => Some(Window::Recent8(window)),
        "early8" => Some(Window::Early8(window)),
        "recent_f32" => Some(Window::RecentF32(window)),
        _ => None,
    }
}

/// Parses a schedule label.
pub fn parse_schedule(label: &str) -> Option<Schedule> {
    match label {
        "prefill" => Some(Schedule::Prefill),
        "streaming" => Some(Schedule::Streaming),
        "causal" => Some(Schedule::Causal),
        _ => None,
    }
}

fn refuse(field: impl Into<String>, reason: impl Into<String>) -> ProtocolError {
    ProtocolError {
        field: field.into(),
        reason: reason.into(),
    }
}

fn plain_name(name: &str, longest: usize) -> bool {
    (1..=longest).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl QualityProtocol {
    /// The decoder the protocol names; SmolLM2's for a protocol that [`Self::validate`]
    /// refuses (no check reads it then).
    pub fn geometry(&self) -> Geometry {
        Geometry::named(&self.model)
            .or_else(|| Geometry::of(crate::common::models::ModelName::SmolLm2))
            .expect("SmolLM2 is a decoder")
    }

    /// Applies the format's bounds and parses every run; the first field refused is named.
    pub fn validate(&self) -> Result<Vec<Run>, ProtocolError> {
        if !plain_name(&self.study, MAX_STUDY_NAME) {
            return Err(refuse(
                "study",
                "1 to 64 ASCII letters, digits, '-', '_' or '.'",
            ));
        }
        if Geometry::named(&self.model).is_none() {
            return Err(refuse(
                "model",
                "smollm2 or gemma3 (an encoder has no next-token distribution)",
            ));
        }
        if !(1..=MAX_TEXTS).contains(&self.texts.len()) {
            return Err(refuse("texts", "1 to 64 texts"));
        }
        let mut names = BTreeSet::new();
        for (i, t) in self.texts.iter().enumerate() {
            if !plain_name(&t.name, MAX_TEXT_NAME) || !names.insert(t.name.as_str()) {
                return Err(refuse(
                    format!("texts[{i}].name"),
                    "unique, 1 to 32 ASCII letters, digits, '-', '_' or '.'",
                ));
            }
        }
        if !TOKEN_RANGE.contains(&self.max_tokens) {
            return Err(refuse("max_tokens", "2 to 8192"));
        }
        if !(1..=MAX_RUNS).contains(&self.runs.len()) {
            return Err(refuse("runs", "1 to 72 runs"));
        }
        let mut runs = Vec::new();
        let mut ids = BTreeSet::new();
        for (i, r) in self.runs.iter().enumerate() {
            let schedule = parse_schedule(&r.schedule).ok_or_else(|| {
                refuse(
                    format!("runs[{i}].schedule"),
                    "prefill, streaming or causal",
                )
            })?;
            let cache = match (&r.scheme, &r.setting, &r.policy) {
                (Some(name), None, None) => {
                    let scheme = AuditScheme::parse(name)
                        .map_err(|reason| refuse(format!("runs[{i}].scheme"), reason))?;
                    let residual = matches!(
                        scheme,
                        AuditScheme::Kivi { .. } | AuditScheme::Quanto { .. }
                    );
                    if schedule == Schedule::Causal && residual {
                        return Err(refuse(
                            format!("runs[{i}].schedule"),
                            "KIVI and quanto keep a residual: prefill or streaming",
                        ));
                    }
                    RunCache::Scheme(name.clone())
                }
                (None, Some(setting), Some(policy)) => {
                    RunCache::Codec(codec_run(i, setting, policy, schedule)?)
                }
                _ => {
                    return Err(refuse(
                        format!("runs[{i}]"),
                        "a setting and a policy, or a scheme",
                    ));
                }
            };
            let run = Run {
                written: r.clone(),
                cache,
                schedule,
            };
            if !ids.insert((&r.setting, &r.policy, &r.scheme, &r.schedule)) {
                return Err(refuse(format!("runs[{i}]"), "listed twice"));
            }
            runs.push(run);
        }
        if let Some(g) = self.generate
            && (g.prompt_tokens == 0 || !(1..=MAX_GENERATED).contains(&g.tokens))
        {
            return Err(refuse(
                "generate",
                "prompt_tokens at least 1 and tokens 1 to 64",
            ));
        }
        self.validate_calibration(&runs)?;
        if let Some(block) = &self.attention {
            block.validate(self.max_tokens, &runs)?;
        }
        if let Some(block) = &self.bootstrap {
            block.validate(self.texts.len(), runs.len())?;
        }
        if let Some(block) = &self.sensitivity {
            block.validate(runs.len())?;
        }
        Ok(runs)
    }

    /// The calibration text: required when a run is KVQuant; its name unlike every text's, and
    /// its text (trimmed) neither inside a text (trimmed) nor holding one (module docs).
    fn validate_calibration(&self, runs: &[Run]) -> Result<(), ProtocolError> {
        let Some(calibration) = &self.calibration else {
            return match runs.iter().position(|r| r.kvquant().is_some()) {
                Some(i) => Err(refuse(
                    "calibration",
                    format!(
                        "missing: runs[{i}] is {}, which is calibrated on a text that is not \
                         evaluated",
                        runs[i].label()
                    ),
                )),
                None => Ok(()),
            };
        };
        if !plain_name(&calibration.name, MAX_TEXT_NAME) {
            return Err(refuse(
                "calibration.name",
                "1 to 32 ASCII letters, digits, '-', '_' or '.'",
            ));
        }
        for (i, text) in self.texts.iter().enumerate() {
            if text.name == calibration.name {
                return Err(refuse(
                    "calibration.name",
                    format!("{:?} is also texts[{i}]'s name", text.name),
                ));
            }
            let (a, b) = (text.text.trim(), calibration.text.trim());
            if a.contains(b) || b.contains(a) {
                return Err(refuse(
                    "calibration.text",
                    format!(
                        "overlaps texts[{i}] ({}), one holding the other: calibration is not \
                         evaluation",
                        text.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The distinct KVQuant schemes' (bits, first tokens), in the order runs first name them:
    /// the calibrations arrays.npz holds.
    pub fn kvquant_schemes(runs: &[Run]) -> Vec<(u32, usize)> {
        let mut out: Vec<(u32, usize)> = Vec::new();
        for scheme in runs.iter().filter_map(Run::kvquant) {
            if !out.contains(&scheme) {
                out.push(scheme);
            }
        }
        out
    }
}

/// Run `i`'s setting and policy, parsed.
fn codec_run(
    i: usize,
    setting: &str,
    policy: &str,
    schedule: Schedule,
) -> Result<CodecRun, ProtocolError> {
    let setting = parse_setting(setting).ok_or_else(|| {
        refuse(
            format!("runs[{i}].setting"),
            "g<GROUP>_b<BITS>[_asym][_swap] with a width and group size the codec stores",
        )
    })?;
    let policy = parse_policy(policy, &setting).ok_or_else(|| {
        refuse(
            format!("runs[{i}].policy"),
            "uniform, recent_f32:W, recent8:W or early8:W, W a positive multiple of the \
             group size",
        )
    })?;
    if schedule == Schedule::Causal && policy != Window::Uniform {
        return Err(refuse(
            format!("runs[{i}].schedule"),
            "causal only with the uniform policy",
        ));
    }
    Ok(CodecRun {
        setting,
        policy,
        schedule,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_parse_as_the_quality_crate_parses_them() {
        for label in [
            "g32_b4",
            "g32_b4_asym",
            "g32_b4_swap",
            "g64_b2_asym_swap",
            "g8_b8",
        ] {
            assert_eq!(parse_setting(label).unwrap().to_string(), label);
        }
        assert_eq!(parse_setting("g32_b1_asym").unwrap().bits, 1);
        for label in [
            "",
            "g32",
            "g32_b4_",
            "g0_b4",
            "g32_b1",
            "g32_b9",
            "g32_b4_swap_asym",
            "G32_b4",
            "g32_b+4",
            "g32_b4_q",
        ] {
            assert_eq!(parse_setting(label), None, "{label}");
        }
        let s = parse_setting("g32_b2").unwrap();
        assert_eq!(
            parse_policy("recent_f32:64", &s),
            Some(Window::RecentF32(64))
        );
        for label in [
            "recent8:48",
            "early8:0",
            "recent8",
            "late8:32",
            "early8:-32",
        ] {
            assert_eq!(parse_policy(label, &s), None, "{label}");
        }
        assert_eq!(parse_schedule("stream"), None);
        let run = Run {
            written: RunLabels {
                setting: Some("g32_b2".into()),
                policy: Some("recent_f32:64".into()),
                scheme: None,
                schedule: "streaming".into(),
            },
            cache: RunCache::Codec(CodecRun {
                setting: s,
                policy: Window::RecentF32(64),
                schedule: Schedule::Streaming,
            }),
            schedule: Schedule::Streaming,
        };
        assert_eq!(run.id(0), "t0_g32_b2_recent_f32-64_streaming");
        assert_eq!(run.label(), "g32_b2 + recent_f32:64");
        let run = Run {
            written: RunLabels {
                setting: None,
                policy: None,
                scheme: Some("llamacpp-q8_0+rot".into()),
                schedule: "prefill".into(),
            },
            cache: RunCache::Scheme("llamacpp-q8_0+rot".into()),
            schedule: Schedule::Prefill,
        };
        assert_eq!(run.id(2), "t2_llamacpp-q8_0-rot_prefill");
    }

    #[test]
    fn matched_draws_are_drawn_from_the_gaussian_seeds() {
        let protocol = |seeds: serde_json::Value| -> QualityProtocol {
            serde_json::from_value(serde_json::json!({
                "study": "s", "model": "smollm2",
                "texts": [ { "name": "a", "text": "Some words." } ],
                "max_tokens": 8,
                "runs": [ { "scheme": "kivi2", "schedule": "prefill" } ],
                "attention": { "stride": 2, "gaussian_seeds": seeds, "matched": true }
            }))
            .unwrap()
        };
        assert!(protocol(serde_json::json!([3])).validate().is_ok());
        let err = protocol(serde_json::json!([])).validate().unwrap_err();
        assert_eq!(err.field, "attention.matched");
    }

    #[test]
    fn causal_is_refused_for_the_schemes_that_keep_a_residual() {
        let protocol = |scheme: &str, schedule: &str| -> QualityProtocol {
            serde_json::from_value(serde_json::json!({
                "study": "s", "model": "smollm2",
                "texts": [ { "name": "a", "text": "Some words." } ],
                "max_tokens": 8,
                "runs": [ { "scheme": scheme, "schedule": schedule } ]
            }))
            .unwrap()
        };
        for scheme in ["kivi2", "hf-quanto4"] {
            let err = protocol(scheme, "causal").validate().unwrap_err();
            assert_eq!(err.field, "runs[0].schedule", "{scheme}");
            assert!(protocol(scheme, "streaming").validate().is_ok());
        }
        assert!(protocol("llamacpp-q4_0", "causal").validate().is_ok());
        let err = protocol("kivi3", "prefill").validate().unwrap_err();
        assert_eq!(err.field, "runs[0].scheme");
    }

    fn with_calibration(
        runs: serde_json::Value,
        calibration: serde_json::Value,
    ) -> QualityProtocol {
        let mut p = serde_json::json!({
            "study": "s", "model": "smollm2",
            "texts": [
                { "name": "a", "text": "Some words about bit streams." },
                { "name": "b", "text": "  Other words, about caches. " }
            ],
            "max_tokens": 8,
            "runs": runs
        });
        if !calibration.is_null() {
            p["calibration"] = calibration;
        }
        serde_json::from_value(p).unwrap()
    }

    #[test]
    fn a_kvquant_run_needs_a_calibration_text_that_is_not_evaluated() {
        let runs = serde_json::json!([
            { "scheme": "kivi2", "schedule": "prefill" },
            { "scheme": "kvquant4-first1", "schedule": "prefill" },
            { "scheme": "kvquant4-first1", "schedule": "streaming" },
            { "scheme": "kvquant3", "schedule": "prefill" }
        ]);
        let good = serde_json::json!({ "name": "calib-1.x", "text": "A passage of prose." });
        let runs_parsed = with_calibration(runs.clone(), good).validate().unwrap();
        assert_eq!(
            QualityProtocol::kvquant_schemes(&runs_parsed),
            vec![(4, 1), (3, 0)]
        );
        assert_eq!(runs_parsed[0].kvquant(), None);
        let err = with_calibration(runs.clone(), serde_json::Value::Null)
            .validate()
            .unwrap_err();
        assert_eq!(err.field, "calibration");
        assert!(err.reason.contains("runs[1]"), "{}", err.reason);
        for (calibration, field) in [
            (
                serde_json::json!({ "name": "", "text": "x y z" }),
                "calibration.name",
            ),
            (
                serde_json::json!({ "name": "a b", "text": "x y z" }),
                "calibration.name",
            ),
            (
                serde_json::json!({ "name": "n".repeat(33), "text": "x y z" }),
                "calibration.name",
            ),
            (
                serde_json::json!({ "name": "b", "text": "x y z" }),
                "calibration.name",
            ),
            // Inside a text, trimmed.
            (
                serde_json::json!({ "name": "c", "text": " about caches " }),
                "calibration.text",
            ),
            // Holding a text, trimmed.
            (
                serde_json::json!({ "name": "c", "text": "Before. Other words, about caches. After." }),
                "calibration.text",
            ),
            (
                serde_json::json!({ "name": "c", "text": "   " }),
                "calibration.text",
            ),
        ] {
            let err = with_calibration(runs.clone(), calibration.clone())
                .validate()
                .unwrap_err();
            assert_eq!(err.field, field, "{calibration}");
        }
        // A calibration without a KVQuant run is accepted (its ids are still archived).
        let plain = serde_json::json!([{ "scheme": "kivi2", "schedule": "prefill" }]);
        assert!(
            with_calibration(
                plain.clone(),
                serde_json::json!({ "name": "c", "text": "x y" })
            )
            .validate()
            .is_ok()
        );
        assert!(
            with_calibration(plain, serde_json::Value::Null)
                .validate()
                .is_ok()
        );
        // Unknown fields stay refused, in the calibration too.
        let err = serde_json::from_value::<QualityProtocol>(serde_json::json!({
            "study": "s", "model": "smollm2",
            "texts": [ { "name": "a", "text": "Some words." } ],
            "max_tokens": 8,
            "runs": [ { "scheme": "kvquant4", "schedule": "prefill" } ],
            "calibration": { "name": "c", "text": "x", "ids": [1] }
        }));
        assert!(err.is_err());
    }
}
