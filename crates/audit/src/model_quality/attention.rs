//! Attention error (a protocol's `attention` block), written again from the format's spec:
//! each run's per-layer attention error on each text's float32 K/V and on Gaussian K/V.
//!
//! For layer l, query head h (reading KV head h / (heads / kv_heads)), query position i in
//! stride - 1, 2 stride - 1, ... below T, over the positions i reads (j <= i; on a sliding
//! layer of window W, j > i - W): scores are the f64 dot product over features in order times
//! 1 / sqrt(head_dim); weights exp(score - max) (`libm::exp`) over their sum in position order;
//! the output the weighted sum of value rows in position order. It is computed from the layer's
//! float32 K/V and from what the run's cache (the audit's own, [`super::cache::layer_source`])
//! hands query i; the layer's entry is `[sum (o - o_ref)^2, sum o_ref^2]` over heads, queries
//! and features in that order. The arithmetic is the spec's, so the audit requires each
//! archived `[layers, 2]` member bit for bit.
//!
//! Gaussian draws: per seed, NumPy's `default_rng(seed)` (through `nprand`) and per layer q
//! `(heads, T, head_dim)`, k and v `(kv_heads, T, head_dim)` from `standard_normal`, cast to
//! float32, T = `max_tokens`; keys have no position (KVQuant quantizes them as drawn and is
//! calibrated on the draw of `calibration_seed`). Their bytes per token follow each cache's
//! rule at T ([`super::bytes`]); KVQuant's from the outliers the audit's own caches keep.
//!
//! Matched draws (`matched`): the same standard normals z, each value stored as `(mean + std *
//! z) as f32` computed in f64, where mean and std are the first text's, per layer, head and
//! channel of its float32 pass's q (after RoPE), stored k and v: mean = (the f64 sum over
//! positions in order) / T0, std = sqrt((the f64 sum over positions in order of (x - mean)^2)
//! / T0). The archive holds them (`matched_q_stats`, `_k_stats`, `_v_stats`, `[layers, heads,
//! head_dim, 2]`); the audit re-derives the matched entries from the archived statistics
//! (finite, spreads not negative), and the statistics themselves bit for bit whenever it
//! re-runs the first text's float32 pass ([`stats`]). KVQuant is calibrated on the matched
//! draw of `calibration_seed`.
//!
//! Summaries: a run's relative L2 error over a set of inputs is sqrt(sum of every layer's first
//! entry / sum of the second); summary.json holds it pooled over the texts with the least and
//! most text's, the same over the draws, and the draws' bits per element.

use std::collections::BTreeMap;

use models::llama::{HookError, KvSource, LayerKv, row_of};
use ndarray::Array3;
use nprand::NumpyRng;
use serde::Deserialize;

use super::bytes;
use super::cache;
use super::geometry::Geometry;
use super::protocol::{QualityProtocol, Run};
use super::schemes::kvquant::Calibration;
use crate::common::npz::Archive;
use crate::common::report::{Checked, Problem, Report};
use crate::common::tolerance::close;

pub use super::protocol::{AttentionBlock, MAX_GAUSSIAN_SEEDS};

/// One layer's `[sum of squared errors, sum of squared reference outputs]`.
pub type LayerError = [f64; 2];

/// The archive member of run `run`'s error on text `text`.
pub fn text_member(run: &Run, text: usize) -> String {
    format!("{}_attention", run.id(text))
}

/// The archive member of run `run`'s error on Gaussian draw `draw`: the text id's `t{i}`
/// written `g{draw}`.
pub fn gaussian_member(run: &Run, draw: usize) -> String {
    let id = run.id(0);
    let rest = id.strip_prefix("t0").unwrap_or(&id);
    format!("g{draw}{rest}_attention")
}

/// The archive member of run `run`'s error on matched draw `draw`: `m{draw}...`.
pub fn matched_member(run: &Run, draw: usize) -> String {
    let id = run.id(0);
    let rest = id.strip_prefix("t0").unwrap_or(&id);
    format!("m{draw}{rest}_attention")
}

/// The matched statistics' members, q, k, v, with their shapes.
pub fn stats_members(g: &Geometry) -> [(String, Vec<usize>); 3] {
    let heads = g.model.shape().query_heads;
    ["q", "k", "v"].map(|side| {
        let h = if side == "q" { heads } else { g.kv_heads };
        (
            format!("matched_{side}_stats"),
            vec![g.layers, h, g.head_dim, 2],
        )
    })
}

/// Every member the block adds, in order, with its shape: per text then run, per draw then
/// run, and when matched the statistics and per matched draw then run.
pub fn members(p: &QualityProtocol, runs: &[Run], texts: usize) -> Vec<(String, Vec<usize>)> {
    let Some(block) = &p.attention else {
        return Vec::new();
    };
    let g = p.geometry();
    let entry = |name: String| (name, vec![g.layers, 2]);
    let mut out = Vec::new();
    for t in 0..texts {
        out.extend(runs.iter().map(|r| entry(text_member(r, t))));
    }
    for d in 0..block.gaussian_seeds.len() {
        out.extend(runs.iter().map(|r| entry(gaussian_member(r, d))));
    }
    if block.matched {
        out.extend(stats_members(&g));
        for d in 0..block.gaussian_seeds.len() {
            out.extend(runs.iter().map(|r| entry(matched_member(r, d))));
        }
    }
    out
}

/// Per head and channel of `x` (`[heads, T, head_dim]`), its mean and spread (module docs),
/// flattened `[heads, head_dim, 2]`.
pub fn stats(x: &Array3<f32>) -> Vec<f64> {
    let (heads, tokens, head_dim) = x.dim();
    let mut out = Vec::with_capacity(heads * head_dim * 2);
    for h in 0..heads {
        for c in 0..head_dim {
            let mut sum = 0f64;
            for t in 0..tokens {
                sum += f64::from(x[[h, t, c]]);
            }
            let mean = sum / tokens as f64;
            let mut squares = 0f64;
            for t in 0..tokens {
                let d = f64::from(x[[h, t, c]]) - mean;
                squares += d * d;
            }
            out.push(mean);
            out.push((squares / tokens as f64).sqrt());
        }
    }
    out
}

/// The archived statistics, per layer (q, k, v), each flattened `[heads, head_dim, 2]`; `None`
/// (reported) when one cannot be read or holds a non-finite value or a negative spread.
fn read_stats(g: &Geometry, archive: &Archive, report: &mut Report) -> Option<Vec<[Vec<f64>; 3]>> {
    let mut sides = Vec::with_capacity(3);
    for (name, shape) in stats_members(g) {
        // An unreadable member is reported with the arrays.
        let values = archive.values::<f64>(&name, &shape).ok()?;
        if let Some(i) = values
            .iter()
            .enumerate()
            .position(|(i, x)| !x.is_finite() || (i % 2 == 1 && *x < 0.0))
        {
            report.fail(Problem::Value {
                array: name,
                index: i,
                found: values[i].to_string(),
                expected: "a finite mean, and a finite spread of at least 0".into(),
            });
            return None;
        }
        sides.push(values);
    }
    let per_layer = |side: &Vec<f64>| side.len() / g.layers.max(1);
    Some(
        (0..g.layers)
            .map(|l| {
                [0, 1, 2].map(|s| {
                    let n = per_layer(&sides[s]);
                    sides[s][l * n..(l + 1) * n].to_vec()
                })
            })
            .collect(),
    )
}

/// `z` moved to `stats` (flattened `[heads, head_dim, 2]`): `(mean + std * z) as f32`.
fn moved(z: &Array3<f32>, stats: &[f64]) -> Array3<f32> {
    let head_dim = z.dim().2;
    let mut out = z.clone();
    for ((h, _, c), x) in out.indexed_iter_mut() {
        let at = 2 * (h * head_dim + c);
        *x = (stats[at] + stats[at + 1] * f64::from(*x)) as f32;
    }
    out
}

/// One query's attention output over `first..=last`, rows from `row(j)`; `None` when a row
/// is not as long as the query (K) or `width` (V).
fn output<'a>(
    query: &[f32],
    (first, last): (usize, usize),
    width: usize,
    row: impl Fn(usize) -> (&'a [f32], &'a [f32]),
) -> Option<Vec<f64>> {
    let scale = 1.0 / (query.len() as f64).sqrt();
    let mut weights = Vec::with_capacity(last + 1 - first);
    for j in first..=last {
        let key = row(j).0;
        if key.len() != query.len() || row(j).1.len() != width {
            return None;
        }
        let mut dot = 0f64;
        for (a, b) in query.iter().zip(key) {
            dot += f64::from(*a) * f64::from(*b);
        }
        weights.push(dot * scale);
    }
    let top = weights.iter().fold(f64::NEG_INFINITY, |m, &w| m.max(w));
    let mut sum = 0f64;
    for w in weights.iter_mut() {
        *w = libm::exp(*w - top);
        sum += *w;
    }
    let mut out = vec![0f64; width];
    for (j, w) in (first..=last).zip(&weights) {
        let share = w / sum;
        for (o, x) in out.iter_mut().zip(row(j).1) {
            *o += share * f64::from(*x);
        }
    }
    Some(out)
}

/// One layer's entry (module docs): `kv`'s float32 K/V against `read`.
pub fn layer_error(
    kv: &LayerKv<'_>,
    read: &dyn KvSource,
    window: Option<usize>,
    stride: usize,
) -> Result<LayerError, HookError> {
    let (heads, tokens, head_dim) = kv.q.dim();
    let kv_heads = kv.k.dim().0;
    if kv_heads == 0 || heads % kv_heads != 0 || kv.k.dim() != (kv_heads, tokens, head_dim) {
        return Err(format!(
            "queries {:?} and keys {:?} of no grouped-query layout",
            kv.q.dim(),
            kv.k.dim()
        )
        .into());
    }
    let per_kv_head = heads / kv_heads;
    let mut entry = [0f64, 0f64];
    for h in 0..heads {
        let g = h / per_kv_head;
        let mut i = stride - 1;
        while i < tokens {
            let first = match window {
                Some(w) if i + 1 > w => i + 1 - w,
                _ => 0,
            };
            let query: Vec<f32> = (0..head_dim).map(|f| kv.q[[h, i, f]]).collect();
            let truth = output(&query, (first, i), head_dim, |j| {
                (row_of(kv.k, g, j), row_of(kv.v, g, j))
            });
            let cached = output(&query, (first, i), head_dim, |j| {
                (read.key(g, i, j), read.value(g, i, j))
            });
            let (Some(truth), Some(cached)) = (truth, cached) else {
                return Err(format!("the cache reads rows of another length at query {i}").into());
            };
            for (c, t) in cached.iter().zip(&truth) {
                entry[0] += (c - t) * (c - t);
                entry[1] += t * t;
            }
            i += stride;
        }
    }
    Ok(entry)
}

/// The relative L2 error of `entries` pooled.
pub fn relative_l2<'a>(entries: impl IntoIterator<Item = &'a LayerError>) -> f64 {
    let (mut err, mut reference) = (0f64, 0f64);
    for e in entries {
        err += e[0];
        reference += e[1];
    }
    (err / reference).sqrt()
}

/// The Gaussian draw of `seed`: per layer (q, k, v).
fn draw(seed: u64, g: &Geometry, tokens: usize) -> Vec<(Array3<f32>, Array3<f32>, Array3<f32>)> {
    let heads = g.model.shape().query_heads;
    let mut rng = NumpyRng::default_rng(u128::from(seed));
    let mut normal = |n: usize| {
        Array3::from_shape_simple_fn((n, tokens, g.head_dim), || rng.normal(0.0, 1.0) as f32)
    };
    (0..g.layers)
        .map(|_| (normal(heads), normal(g.kv_heads), normal(g.kv_heads)))
        .collect()
}

/// What the Gaussian draws re-derive: per draw and run, each layer's entry; per run, the
/// draws' mean bytes per token (`None` where a cache could not be built).
pub struct GaussianCheck {
    /// `[draw][run]`.
    pub entries: Vec<Vec<Vec<LayerError>>>,
    /// Per run.
    pub bytes_per_token: Vec<Option<f64>>,
    /// The same for the matched draws, when the protocol asks for them and the statistics
    /// could be read.
    pub matched: Option<Box<GaussianCheck>>,
}

/// Which draws: i.i.d., or matched to per-layer statistics.
#[derive(Clone, Copy)]
enum Kind<'a> {
    Iid,
    Matched(&'a [[Vec<f64>; 3]]),
}

impl Kind<'_> {
    fn draw(
        self,
        seed: u64,
        g: &Geometry,
        tokens: usize,
    ) -> Vec<(Array3<f32>, Array3<f32>, Array3<f32>)> {
        let layers = draw(seed, g, tokens);
        match self {
            Kind::Iid => layers,
            Kind::Matched(stats) => layers
                .iter()
                .zip(stats)
                .map(|((q, k, v), [sq, sk, sv])| (moved(q, sq), moved(k, sk), moved(v, sv)))
                .collect(),
        }
    }

    fn member(self, run: &Run, d: usize) -> String {
        match self {
            Kind::Iid => gaussian_member(run, d),
            Kind::Matched(_) => matched_member(run, d),
        }
    }

    fn calibration_pass(self, seed: u64) -> String {
        match self {
            Kind::Iid => format!("gaussian calibration draw {seed}"),
            Kind::Matched(_) => format!("matched calibration draw {seed}"),
        }
    }
}

/// Re-derives every run's Gaussian entries (and matched ones, when asked for) with the audit's
/// caches and requires the archive's bit for bit; needs no model.
pub fn check_gaussian(
    p: &QualityProtocol,
    runs: &[Run],
    archive: &Archive,
    report: &mut Report,
) -> GaussianCheck {
    let mut out = check_draws(p, runs, Kind::Iid, archive, report);
    if p.attention.as_ref().is_some_and(|b| b.matched)
        && let Some(stats) = read_stats(&p.geometry(), archive, report)
    {
        let matched = check_draws(p, runs, Kind::Matched(&stats), archive, report);
        out.matched = Some(Box::new(matched));
    }
    out
}

/// [`check_gaussian`] for one kind of draw.
fn check_draws(
    p: &QualityProtocol,
    runs: &[Run],
    kind: Kind<'_>,
    archive: &Archive,
    report: &mut Report,
) -> GaussianCheck {
    use rayon::prelude::*;
    let mut out = GaussianCheck {
        entries: Vec::new(),
        bytes_per_token: vec![Some(0.0); runs.len()],
        matched: None,
    };
    let Some(block) = &p.attention else {
        return out;
    };
    let g = p.geometry();
    let tokens = p.max_tokens;
    let mut calibrations: Vec<((u32, usize), Calibration)> = Vec::new();
    if let Some(seed) = block.calibration_seed {
        let layers: Vec<(Array3<f32>, Array3<f32>)> = kind
            .draw(seed, &g, tokens)
            .into_iter()
            .map(|(_, k, v)| (k, v))
            .collect();
        for scheme in QualityProtocol::kvquant_schemes(runs) {
            match Calibration::fit(scheme.0, scheme.1, &layers) {
                Ok(c) => calibrations.push((scheme, c)),
                Err(reason) => report.fail(Problem::RerunFailed {
                    pass: kind.calibration_pass(seed),
                    reason,
                }),
            }
        }
    }
    let draws = block.gaussian_seeds.len() as f64;
    for (d, &seed) in block.gaussian_seeds.iter().enumerate() {
        let layers = kind.draw(seed, &g, tokens);
        let mut entries = vec![Vec::with_capacity(g.layers); runs.len()];
        let mut outliers = vec![Vec::with_capacity(g.layers); runs.len()];
        let mut failed: BTreeMap<usize, String> = BTreeMap::new();
        for (l, (q, k, v)) in layers.iter().enumerate() {
            let kv = LayerKv::unrotated(q, k, v);
            let window = g.window(l);
            let measured: Vec<Result<(LayerError, usize), String>> = runs
                .par_iter()
                .map(|run| {
                    let calibration = run
                        .kvquant()
                        .and_then(|s| calibrations.iter().find(|(c, _)| *c == s).map(|(_, c)| c));
                    let (read, count) = cache::layer_source(run, calibration, (l, g.layers), &kv)
                        .map_err(|e| e.to_string())?;
                    let e = layer_error(&kv, read.as_ref(), window, block.stride)
                        .map_err(|e| e.to_string())?;
                    Ok((e, count))
                })
                .collect();
            for (r, m) in measured.into_iter().enumerate() {
                match m {
                    Ok((e, count)) => {
                        entries[r].push(e);
                        outliers[r].push(i64::try_from(count).unwrap_or(i64::MAX));
                    }
                    Err(reason) => {
                        failed.entry(r).or_insert(reason);
                    }
                }
            }
        }
        for (r, run) in runs.iter().enumerate() {
            let name = kind.member(run, d);
            if let Some(reason) = failed.get(&r) {
                report.fail(Problem::RerunFailed {
                    pass: name,
                    reason: reason.clone(),
                });
                out.bytes_per_token[r] = None;
                continue;
            }
            let flat: Vec<f64> = entries[r].iter().flatten().copied().collect();
            super::require::require_shaped(archive, &name, &name, &[g.layers, 2], &flat, report);
            let bytes = match run.kvquant() {
                Some(scheme) => bytes::kvquant_bytes_per_token(scheme, &g, tokens, &outliers[r]),
                None => bytes::bytes_per_token(run, &g, tokens),
            };
            out.bytes_per_token[r] = match (out.bytes_per_token[r], bytes) {
                (Some(sum), Ok(b)) => Some(sum + b / draws),
                _ => None,
            };
        }
        report.count(Checked::PassesRerun, 1);
        out.entries.push(entries);
    }
    out
}

/// summary.json's `attention`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionSummary {
    /// The protocol's stride.
    pub stride: usize,
    /// Its Gaussian seeds' count.
    pub gaussian_draws: usize,
    /// One row per run.
    pub rows: Vec<AttentionSummaryRow>,
}

/// One run's row.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionSummaryRow {
    /// Setting label (absent for a scheme).
    #[serde(default)]
    pub setting: Option<String>,
    /// Policy label (absent for a scheme).
    #[serde(default)]
    pub policy: Option<String>,
    /// Scheme name (absent for a setting).
    #[serde(default)]
    pub scheme: Option<String>,
    /// Schedule label.
    pub schedule: String,
    /// Pooled over the texts.
    pub relative_l2: f64,
    /// The least text's.
    pub relative_l2_min: f64,
    /// The most text's.
    pub relative_l2_max: f64,
    /// Pooled over the draws.
    pub gaussian_relative_l2: Option<f64>,
    /// The least draw's.
    pub gaussian_relative_l2_min: Option<f64>,
    /// The most draw's.
    pub gaussian_relative_l2_max: Option<f64>,
    /// The draws' bits per element.
    pub gaussian_bits_per_element: Option<f64>,
    /// Pooled over the matched draws (absent unless matched).
    #[serde(default)]
    pub matched_relative_l2: Option<f64>,
    /// The least matched draw's.
    #[serde(default)]
    pub matched_relative_l2_min: Option<f64>,
    /// The most matched draw's.
    #[serde(default)]
    pub matched_relative_l2_max: Option<f64>,
    /// The matched draws' bits per element.
    #[serde(default)]
    pub matched_bits_per_element: Option<f64>,
}

/// A run's figures as the audit derives them, in summary.json's order.
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    /// Pooled, least and most over the texts.
    pub texts: [f64; 3],
    /// The same over the draws, and the draws' bits per element; `None` without draws.
    pub gaussian: Option<[f64; 4]>,
    /// The same over the matched draws; `None` unless matched.
    pub matched: Option<[f64; 4]>,
}

/// Each run's expected figures from the archived text entries (read here, shape-checked; a
/// member that cannot be read is reported with the arrays) and the re-derived Gaussian ones.
pub fn expected(
    p: &QualityProtocol,
    runs: &[Run],
    texts: usize,
    archive: &Archive,
    gaussian: &GaussianCheck,
) -> Option<Vec<Expected>> {
    p.attention.as_ref()?;
    let g = p.geometry();
    let float32 = g.float32_bytes_per_token(p.max_tokens);
    let spread = |each: &[Vec<LayerError>]| {
        let one: Vec<f64> = each.iter().map(relative_l2).collect();
        [
            relative_l2(each.iter().flatten()),
            one.iter().fold(f64::INFINITY, |m, &x| m.min(x)),
            one.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x)),
        ]
    };
    runs.iter()
        .enumerate()
        .map(|(r, run)| {
            let each: Option<Vec<Vec<LayerError>>> = (0..texts)
                .map(|t| {
                    let flat = archive
                        .values::<f64>(&text_member(run, t), &[g.layers, 2])
                        .ok()?;
                    Some(flat.chunks_exact(2).map(|c| [c[0], c[1]]).collect())
                })
                .collect();
            let over = |check: &GaussianCheck| {
                let draws: Vec<Vec<LayerError>> =
                    check.entries.iter().map(|d| d[r].clone()).collect();
                (!draws.is_empty()).then(|| {
                    let [pooled, least, most] = spread(&draws);
                    let bits = check.bytes_per_token[r].map_or(f64::NAN, |b| b * 32.0 / float32);
                    [pooled, least, most, bits]
                })
            };
            Some(Expected {
                texts: spread(&each?),
                gaussian: over(gaussian),
                matched: gaussian.matched.as_deref().and_then(over),
            })
        })
        .collect()
}

/// summary.json's `attention` against the audit's figures (labels, then each figure to the
/// audit's tolerance).
pub fn check_summary(
    p: &QualityProtocol,
    runs: &[Run],
    expected: Option<&[Expected]>,
    found: Option<&AttentionSummary>,
    report: &mut Report,
) {
    let fail = |report: &mut Report, place: String, found: String, expected: String| {
        report.fail(Problem::Summary {
            place,
            found,
            expected,
        })
    };
    let Some(found) =
        super::optional::block_present("attention", p.attention.is_some(), found, report)
    else {
        return;
    };
    let Some(block) = &p.attention else {
        return;
    };
    for (place, f, e) in [
        ("attention stride", found.stride, block.stride),
        (
            "attention gaussian_draws",
            found.gaussian_draws,
            block.gaussian_seeds.len(),
        ),
        ("attention rows", found.rows.len(), runs.len()),
    ] {
        if f != e {
            fail(report, place.into(), f.to_string(), e.to_string());
        }
    }
    let Some(expected) = expected else {
        return;
    };
    for ((row, run), e) in found.rows.iter().zip(runs).zip(expected) {
        let label = format!("attention {} {}", run.label(), run.schedule);
        let (setting, policy) = run.setting_policy();
        if row.setting != setting
            || row.policy != policy
            || row.scheme.as_deref() != run.scheme()
            || row.schedule != run.schedule.to_string()
        {
            fail(
                report,
                format!("{label} labels"),
                format!(
                    "{:?} {:?} {:?} {}",
                    row.setting, row.policy, row.scheme, row.schedule
                ),
                format!("{setting:?} {policy:?} {:?} {}", run.scheme(), run.schedule),
            );
            continue;
        }
        let mut figures = vec![
            ("relative_l2", Some(row.relative_l2), Some(e.texts[0])),
            (
                "relative_l2_min",
                Some(row.relative_l2_min),
                Some(e.texts[1]),
            ),
            (
                "relative_l2_max",
                Some(row.relative_l2_max),
                Some(e.texts[2]),
            ),
        ];
        let g = e.gaussian.map(|g| g.map(Some)).unwrap_or([None; 4]);
        figures.extend([
            ("gaussian_relative_l2", row.gaussian_relative_l2, g[0]),
            (
                "gaussian_relative_l2_min",
                row.gaussian_relative_l2_min,
                g[1],
            ),
            (
                "gaussian_relative_l2_max",
                row.gaussian_relative_l2_max,
                g[2],
            ),
            (
                "gaussian_bits_per_element",
                row.gaussian_bits_per_element,
                g[3],
            ),
        ]);
        let m = e.matched.map(|m| m.map(Some)).unwrap_or([None; 4]);
        figures.extend([
            ("matched_relative_l2", row.matched_relative_l2, m[0]),
            ("matched_relative_l2_min", row.matched_relative_l2_min, m[1]),
            ("matched_relative_l2_max", row.matched_relative_l2_max, m[2]),
            (
                "matched_bits_per_element",
                row.matched_bits_per_element,
                m[3],
            ),
        ]);
        for (field, f, x) in figures {
            let same = match (f, x) {
                (Some(f), Some(x)) => close(f, x),
                (None, None) => true,
                _ => false,
            };
            if !same {
                fail(
                    report,
                    format!("{label} {field}"),
                    format!("{f:?}"),
                    format!("{x:?}"),
                );
            }
        }
        report.count(Checked::SummaryRows, 1);
    }
}

/// summary.md's attention table as the audit renders it (percent with 3 decimals, bits with 3,
/// dashes without draws; four more columns when `matched`).
pub fn table(runs: &[Run], expected: &[Expected], matched: bool) -> Vec<Vec<String>> {
    let mut headers = vec![
        "cache",
        "schedule",
        "model K/V error",
        "least",
        "most",
        "Gaussian error",
        "least",
        "most",
        "Gaussian bits/element",
    ];
    if matched {
        headers.extend(["matched error", "least", "most", "matched bits/element"]);
    }
    let mut table = vec![headers.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    let percent = |x: f64| format!("{:.3}%", 100.0 * x);
    let cells = |figures: Option<[f64; 4]>| match figures {
        Some([pooled, least, most, bits]) => {
            let mut cells: Vec<String> = [pooled, least, most].map(percent).to_vec();
            cells.push(format!("{bits:.3}"));
            cells
        }
        None => vec!["-".to_string(); 4],
    };
    for (run, e) in runs.iter().zip(expected) {
        let mut row = vec![run.label(), run.schedule.to_string()];
        row.extend(e.texts.iter().map(|&x| percent(x)));
        row.extend(cells(e.gaussian));
        if matched {
            row.extend(cells(e.matched));
        }
        table.push(row);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use models::llama::OwnKv;

    fn layer() -> (Array3<f32>, Array3<f32>, Array3<f32>) {
        let g = Geometry::named("smollm2").unwrap();
        let mut d = draw(4, &g, 12);
        d.truncate(1);
        d.pop().unwrap()
    }

    #[test]
    fn the_float32_cache_reads_no_error_and_zero_values_read_the_whole_output() {
        let (q, k, v) = layer();
        let kv = LayerKv::unrotated(&q, &k, &v);
        let [err, reference] = layer_error(&kv, &OwnKv::new(&k, &v), None, 5).unwrap();
        assert_eq!(err, 0.0);
        assert!(reference > 0.0);
        let zeros = OwnKv::new(&k, &Array3::zeros(v.dim()));
        let [err, whole] = layer_error(&kv, &zeros, Some(3), 5).unwrap();
        assert_eq!(err, whole);
        assert_eq!(relative_l2(&[[err, whole]]), 1.0);
    }

    #[test]
    fn gaussian_members_name_the_draw_where_text_members_name_the_text() {
        let p: QualityProtocol = serde_json::from_value(serde_json::json!({
            "study": "s", "model": "smollm2",
            "texts": [{ "name": "a", "text": "x" }], "max_tokens": 8,
            "runs": [{ "scheme": "llamacpp-q4_0+rot", "schedule": "prefill" }],
            "attention": { "stride": 2, "gaussian_seeds": [5] }
        }))
        .unwrap();
        let runs = p.validate().unwrap();
        let names: Vec<String> = members(&p, &runs, 1).into_iter().map(|m| m.0).collect();
        assert_eq!(
            names,
            [
                "t0_llamacpp-q4_0-rot_prefill_attention",
                "g0_llamacpp-q4_0-rot_prefill_attention"
            ]
        );
    }
}
