//! A model-quality run's aggregates over the texts, and summary.json held to them.

use super::geometry::Geometry;
use std::collections::BTreeMap;

use serde::Deserialize;

use super::arrays::Derived;
use super::protocol::Run;
use crate::common::report::{Checked, Problem, Report};
use crate::common::tolerance::close;

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
    /// bytes_per_token * 32 / the float32 cache's bytes per token.
    pub bits_per_element: f64,
    /// The float32 cache's bytes per token (SmolLM2: 46,080; Gemma 3: 36,864).
    pub float32_bytes_per_token: f64,
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
    /// The float32 cache's bytes per token ([`super::geometry::Geometry`]).
    pub float32_bytes_per_token: f64,
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
    /// Bits per stored K or V value.
    pub fn bits_per_element(&self) -> f64 {
        bits_per_element(self.bytes_per_token, self.float32_bytes_per_token)
    }
}

/// Bits per stored K or V value of a cache of `bytes_per_token` (32 for the float32 cache,
/// which stores `float32_bytes_per_token`).
pub fn bits_per_element(bytes_per_token: f64, float32_bytes_per_token: f64) -> f64 {
    bytes_per_token * 32.0 / float32_bytes_per_token
}

/// Run `r`'s aggregates over the texts, in text order.
pub(super) fn aggregate(
    derived: &BTreeMap<(usize, usize), Derived>,
    tokens: &[usize],
    r: usize,
    g: &Geometry,
) -> Aggregate {
    let texts = tokens.len();
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
        float32_bytes_per_token: tokens
            .iter()
            .map(|&t| g.float32_bytes_per_token(t))
            .sum::<f64>()
            / texts as f64,
    }
}

pub(super) fn check_summary(
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
            aggregates
                .first()
                .map_or(f64::NAN, |a| a.float32_bytes_per_token),
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
        let label = format!("{} {}", run.label(), run.schedule);
        let (setting, policy) = run.setting_policy();
        let labels = [
            ("setting", row.setting.clone(), setting),
            ("policy", row.policy.clone(), policy),
            (
                "scheme",
                row.scheme.clone(),
                run.scheme().map(str::to_string),
            ),
            (
                "schedule",
                Some(row.schedule.clone()),
                Some(run.schedule.to_string()),
            ),
        ];
        let mut same = true;
        for (field, found, expected) in labels {
            if found != expected {
                same = false;
                report.fail(Problem::Summary {
                    place: format!("{label} {field}"),
                    found: format!("{found:?}"),
                    expected: format!("{expected:?}"),
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
                "bits_per_element",
                row.bits_per_element,
                a.bits_per_element(),
            ),
            (
                "float32_bytes_per_token",
                row.float32_bytes_per_token,
                a.float32_bytes_per_token,
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
