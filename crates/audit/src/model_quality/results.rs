//! results.json of a model-quality run: one row per (text, run), in run order, its descriptive
//! fields from the protocol and every figure re-derived from the arrays.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::arrays::Derived;
use super::protocol::{QualityProtocol, Run};
use super::summary::bits_per_element;
use crate::common::problem::ResultsProblem;
use crate::common::report::{Checked, Problem, Report};
use crate::common::tolerance::close;

/// One row of results.json.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityRow {
    /// Row id.
    pub id: String,
    /// Text index.
    pub text: usize,
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
    /// bytes_per_token * 32 / 46,080.
    pub bits_per_element: f64,
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

/// results.json: one row per (text, run), in run order, descriptive fields from the protocol,
/// every figure re-derived.
pub(super) fn check_results(
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
    let g = p.geometry();
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
        let (setting, policy) = run.setting_policy();
        let descriptive = row.text == i
            && row.setting == setting
            && row.policy == policy
            && row.scheme.as_deref() == run.scheme()
            && row.schedule == run.schedule.to_string()
            && row.tokens == t
            && row.positions == t - 1
            && row.float32_bytes_per_token == g.float32_bytes_per_token(t)
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
            metric(
                "bits_per_element",
                row.bits_per_element,
                bits_per_element(d.bytes_per_token, g.float32_bytes_per_token(tokens[i])),
            ),
        ];
        for problem in problems.into_iter().flatten() {
            report.fail(problem);
        }
        if generating {
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
