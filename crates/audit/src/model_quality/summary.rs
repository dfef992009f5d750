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
    /// Each run's attention error, when the protocol asks for it.
    #[serde(default)]
    pub attention: Option<super::attention::AttentionSummary>,
    /// The bootstrap intervals, when the protocol asks for them.
    #[serde(default)]
    pub bootstrap: Option<super::bootstrap::BootstrapSummary>,
    /// The mechanisms' means over the texts, when the protocol asks for them.
    #[serde(default)]
    pub mechanisms: Option<super::mechanisms::MechanismSummary>,
    /// The named runs' sensitivity, when the protocol asks for it.
    #[serde(default)]
    pub sensitivity: Option<super::sensitivity::SensitivitySummary>,
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
    /// Median of KL over every position of every text.
    pub kl_median: f64,
    /// Its 99th percentile.
    pub kl_p99: f64,
    /// Its 99.9th percentile.
    pub kl_p999: f64,
    /// Mean KL per band of positions ([`POSITION_BANDS`]), null where no text reaches.
    pub kl_band_means: Vec<Option<f64>>,
    /// Mean over texts.
    pub top1_agreement: f64,
    /// Mean over texts.
    pub bytes_per_token: f64,
    /// bytes_per_token * 32 / the float32 cache's bytes per token.
    pub bits_per_element: f64,
    /// The float32 cache's bytes per token (SmolLM2: 46,080; Gemma 3: 36,864).
    pub float32_bytes_per_token: f64,
}

/// The bands of positions (the index of the token a prediction is made from) whose mean KL a
/// summary reports: 0-127, 128-1,023, 1,024 on (docs/model-quality.md).
pub const POSITION_BANDS: [(usize, Option<usize>); 3] =
    [(0, Some(127)), (128, Some(1023)), (1024, None)];

/// KL's median and percentiles by llama.cpp's perplexity tool's rule (`tools/perplexity/
/// perplexity.cpp`, `kl_divergence`): over the values sorted, the median is the middle value or
/// the mean of the two middle ones; percentile f is interpolated between the values at
/// floor(f (n - 1)) and the next, by the fraction left over. In f64 here. NaN for no values.
pub fn kl_statistics(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) * 0.5
    };
    let at = |f: f64| {
        let p = f * (n - 1) as f64;
        let k = p.floor() as usize;
        let w = p - k as f64;
        v[k] * (1.0 - w) + v[(k + 1).min(n - 1)] * w
    };
    (median, at(0.99), at(0.999))
}

/// Mean KL per band of [`POSITION_BANDS`] over `texts` (each text's KL per position), `None`
/// where no position falls.
pub fn kl_band_means(texts: &[&[f64]]) -> Vec<Option<f64>> {
    POSITION_BANDS
        .iter()
        .map(|&(first, last)| {
            let inside: Vec<f64> = texts
                .iter()
                .flat_map(|kl| {
                    kl.iter()
                        .enumerate()
                        .filter(move |(i, _)| *i >= first && last.is_none_or(|l| *i <= l))
                        .map(|(_, &x)| x)
                })
                .collect();
            (!inside.is_empty()).then(|| inside.iter().sum::<f64>() / inside.len() as f64)
        })
        .collect()
}

/// A run's aggregates over the texts, as summary.json must hold them.
#[derive(Debug, Clone, PartialEq)]
pub struct Aggregate {
    /// Mean NLL of the float32 cache.
    pub nll_f32: f64,
    /// Mean NLL.
    pub nll: f64,
    /// Mean KL.
    pub kl_mean: f64,
    /// Max KL.
    pub kl_max: f64,
    /// KL's median, 99th and 99.9th percentiles over every position of every text.
    pub kl_statistics: (f64, f64, f64),
    /// Mean KL per band of positions.
    pub kl_band_means: Vec<Option<f64>>,
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
        kl_statistics: kl_statistics(
            &rows
                .iter()
                .flat_map(|d| d.kl.iter().copied())
                .collect::<Vec<_>>(),
        ),
        kl_band_means: kl_band_means(&rows.iter().map(|d| d.kl.as_slice()).collect::<Vec<_>>()),
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
            ("kl_median", row.kl_median, a.kl_statistics.0),
            ("kl_p99", row.kl_p99, a.kl_statistics.1),
            ("kl_p999", row.kl_p999, a.kl_statistics.2),
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
        let bands_match = row.kl_band_means.len() == a.kl_band_means.len()
            && row
                .kl_band_means
                .iter()
                .zip(&a.kl_band_means)
                .all(|(found, expected)| match (found, expected) {
                    (Some(f), Some(e)) => close(*f, *e),
                    (None, None) => true,
                    _ => false,
                });
        if !bands_match {
            report.fail(Problem::Summary {
                place: format!("{label} kl_band_means"),
                found: format!("{:?}", row.kl_band_means),
                expected: format!("{:?}", a.kl_band_means),
            });
        }
        report.count(Checked::SummaryRows, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_statistics_are_numpys_default_percentiles() {
        // NumPy 2.4.6: np.median, np.percentile(v, 99), np.percentile(v, 99.9) of these values.
        let (median, p99, p999) = kl_statistics(&[0.3, 0.1, 0.7, 0.2, 0.9, 0.05]);
        assert_eq!(median, 0.25);
        assert!((p99 - 0.89).abs() < 1e-15, "{p99}");
        assert!((p999 - 0.8990000000000002).abs() < 1e-15, "{p999}");
        assert!(kl_statistics(&[]).0.is_nan());
    }

    #[test]
    fn band_means_pool_the_texts_positions_by_band() {
        let long: Vec<f64> = (0..1030)
            .map(|i| if i < 1024 { 0.0 } else { 6.0 })
            .collect();
        let short = [1.0; 10];
        let means = kl_band_means(&[&long, &short]);
        assert_eq!(means[0], Some(10.0 / 138.0));
        assert_eq!(means[1], Some(0.0));
        assert_eq!(means[2], Some(6.0));
        assert_eq!(kl_band_means(&[&short]), vec![Some(1.0), None, None]);
    }
}
