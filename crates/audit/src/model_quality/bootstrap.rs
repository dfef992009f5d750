//! The paired bootstrap over texts (a protocol's `bootstrap` block), re-derived from the
//! audit's own per-text values and held against summary.json's `bootstrap` and summary.md's two
//! interval tables.
//!
//! The rule, as the evidence format states it (docs/model-quality.md, "How sure"): per text,
//! the NLL change (`nll - nll_f32`), the mean KL and the top-1 agreement of each run, from
//! the audit's own derivation of the arrays; resample b takes row b of NumPy's
//! `default_rng(seed).integers(0, texts, size=(resamples, texts))` (drawn through `nprand`,
//! which is pinned to NumPy's own outputs); a statistic is the drawn values summed in draw order
//! over the count of texts; the pairs are those the block names (`[a, b]`, in its order), else
//! every pair a before b; a pair's per-text value is the first run's minus the second's; the
//! estimate is the plain mean in text order; the bounds are the 2.5th and 97.5th percentiles of
//! the sorted statistics, linear between neighbours (NumPy's default); the perplexity change
//! is `expm1` (`libm`) of the NLL change's three numbers. Written here again from that rule.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::arrays::Derived;
use super::protocol::{BootstrapBlock, Run};
use crate::common::report::{Checked, Problem, Report};
use crate::common::tolerance::close;

/// An estimate and its bounds, as summary.json writes them.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bounds {
    /// The mean over the texts.
    pub estimate: f64,
    /// The lower bound.
    pub low: f64,
    /// The upper bound.
    pub high: f64,
}

/// One run's intervals in summary.json.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunBounds {
    /// Setting label.
    #[serde(default)]
    pub setting: Option<String>,
    /// Policy label.
    #[serde(default)]
    pub policy: Option<String>,
    /// Scheme name.
    #[serde(default)]
    pub scheme: Option<String>,
    /// Schedule label.
    pub schedule: String,
    /// NLL change.
    pub nll_change: Bounds,
    /// Perplexity change (a fraction).
    pub perplexity_change: Bounds,
    /// Mean KL.
    pub kl_mean: Bounds,
    /// Top-1 agreement.
    pub top1_agreement: Bounds,
}

/// One pair's intervals in summary.json.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairBounds {
    /// The first run's index.
    pub a: usize,
    /// The second run's index.
    pub b: usize,
    /// Difference of NLL changes.
    pub nll_change: Bounds,
    /// Difference of mean KL.
    pub kl_mean: Bounds,
    /// Difference of top-1 agreement.
    pub top1_agreement: Bounds,
}

/// summary.json's `bootstrap`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootstrapSummary {
    /// Resamples.
    pub resamples: usize,
    /// Seed.
    pub seed: u64,
    /// Texts resampled.
    pub texts: usize,
    /// Per run.
    pub runs: Vec<RunBounds>,
    /// Per pair.
    pub pairs: Vec<PairBounds>,
}

/// What the audit derives: per run its four intervals, per pair (a, b) its three.
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    /// Per run: NLL change, perplexity change, mean KL, top-1 agreement.
    pub runs: Vec<[Bounds; 4]>,
    /// Per pair, a < b in order: (a, b, [NLL, KL, top-1]).
    pub pairs: Vec<(usize, usize, [Bounds; 3])>,
}

/// The sorted values' `q` quantile, linear between neighbours.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let position = q * (sorted.len() - 1) as f64;
    let below = position.floor() as usize;
    let above = (below + 1).min(sorted.len() - 1);
    let weight = position - below as f64;
    (1.0 - weight) * sorted[below] + weight * sorted[above]
}

/// The mean of `values` in order and its bounds over the resamples `draws` (flattened rows of
/// `texts` indexes each).
fn bounds(values: &[f64], draws: &[usize]) -> Bounds {
    let texts = values.len();
    let mut means: Vec<f64> = draws
        .chunks_exact(texts)
        .map(|row| {
            let mut sum = 0f64;
            for &i in row {
                sum += values[i];
            }
            sum / texts as f64
        })
        .collect();
    means.sort_by(f64::total_cmp);
    let mut sum = 0f64;
    for &v in values {
        sum += v;
    }
    Bounds {
        estimate: sum / texts as f64,
        low: quantile(&means, 0.025),
        high: quantile(&means, 0.975),
    }
}

/// The intervals the block's rule gives on the audit's derived rows (`derived[(text, run)]`);
/// `None` when a row is missing (reported where it is derived).
pub fn expected(
    block: &BootstrapBlock,
    texts: usize,
    runs: usize,
    derived: &BTreeMap<(usize, usize), Derived>,
) -> Option<Expected> {
    let mut values: Vec<[Vec<f64>; 3]> = Vec::with_capacity(runs);
    for r in 0..runs {
        let mut v: [Vec<f64>; 3] = Default::default();
        for t in 0..texts {
            let d = derived.get(&(t, r))?;
            v[0].push(d.nll - d.nll_f32);
            v[1].push(d.kl_mean);
            v[2].push(d.top1_agreement);
        }
        values.push(v);
    }
    let mut rng = nprand::NumpyRng::default_rng(u128::from(block.seed));
    let high = u32::try_from(texts).ok()?;
    let draws: Vec<usize> = (0..block.resamples * texts)
        .map(|_| rng.integers(high) as usize)
        .collect();
    let run_bounds = values
        .iter()
        .map(|[nll, kl, top1]| {
            let n = bounds(nll, &draws);
            let ppl = libm::expm1;
            [
                n,
                Bounds {
                    estimate: ppl(n.estimate),
                    low: ppl(n.low),
                    high: ppl(n.high),
                },
                bounds(kl, &draws),
                bounds(top1, &draws),
            ]
        })
        .collect();
    let mut pairs = Vec::new();
    for (a, b) in block.pairs(runs) {
        let diff = |m: usize| -> Vec<f64> {
            values[a][m]
                .iter()
                .zip(&values[b][m])
                .map(|(x, y)| x - y)
                .collect()
        };
        pairs.push((
            a,
            b,
            [
                bounds(&diff(0), &draws),
                bounds(&diff(1), &draws),
                bounds(&diff(2), &draws),
            ],
        ));
    }
    Some(Expected {
        runs: run_bounds,
        pairs,
    })
}

/// Whether two sets of bounds agree to the audit's relative tolerance (exactly, where a value is
/// zero).
fn same(found: &Bounds, expected: &Bounds) -> bool {
    close(found.estimate, expected.estimate)
        && close(found.low, expected.low)
        && close(found.high, expected.high)
}

/// One row's recorded bounds (named by field) held to the expected ones, in order; the row
/// counted.
fn compare(label: &str, got: &[(&str, &Bounds)], want: &[Bounds], report: &mut Report) {
    for ((field, found), expected) in got.iter().zip(want) {
        if !same(found, expected) {
            report.fail(Problem::Summary {
                place: format!("{label} {field}"),
                found: format!("{found:?}"),
                expected: format!("{expected:?}"),
            });
        }
    }
    report.count(Checked::SummaryRows, 1);
}

/// summary.json's `bootstrap` held to the block and the expected intervals.
pub fn check_summary(
    block: Option<&BootstrapBlock>,
    texts: usize,
    runs: &[Run],
    expected: Option<&Expected>,
    found: Option<&BootstrapSummary>,
    report: &mut Report,
) {
    let fail = |report: &mut Report, place: String, found: String, expected: String| {
        report.fail(Problem::Summary {
            place,
            found,
            expected,
        })
    };
    let Some(found) = super::optional::block_present("bootstrap", block.is_some(), found, report)
    else {
        return;
    };
    let Some(block) = block else {
        return;
    };
    for (place, f, e) in [
        ("bootstrap resamples", found.resamples, block.resamples),
        ("bootstrap texts", found.texts, texts),
        ("bootstrap runs", found.runs.len(), runs.len()),
        (
            "bootstrap pairs",
            found.pairs.len(),
            block.pairs(runs.len()).len(),
        ),
    ] {
        if f != e {
            fail(report, place.into(), f.to_string(), e.to_string());
        }
    }
    if found.seed != block.seed {
        fail(
            report,
            "bootstrap seed".into(),
            found.seed.to_string(),
            block.seed.to_string(),
        );
    }
    let Some(expected) = expected else {
        return;
    };
    for ((row, run), want) in found.runs.iter().zip(runs).zip(&expected.runs) {
        let label = format!("bootstrap {} {}", run.label(), run.schedule);
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
                "the run's".into(),
            );
            continue;
        }
        let got = [
            ("nll_change", &row.nll_change),
            ("perplexity_change", &row.perplexity_change),
            ("kl_mean", &row.kl_mean),
            ("top1_agreement", &row.top1_agreement),
        ];
        compare(&label, &got, want, report);
    }
    for (pair, (a, b, want)) in found.pairs.iter().zip(&expected.pairs) {
        let label = format!("bootstrap pair {a}-{b}");
        if (pair.a, pair.b) != (*a, *b) {
            fail(
                report,
                format!("{label} order"),
                format!("{}-{}", pair.a, pair.b),
                format!("{a}-{b}"),
            );
            continue;
        }
        let got = [
            ("nll_change", &pair.nll_change),
            ("kl_mean", &pair.kl_mean),
            ("top1_agreement", &pair.top1_agreement),
        ];
        compare(&label, &got, want, report);
    }
}

/// summary.md's interval table and pair table, as the audit renders them.
pub fn tables(runs: &[Run], expected: &Expected) -> [Vec<Vec<String>>; 2] {
    let header = |cells: &[&str]| cells.iter().map(|c| c.to_string()).collect::<Vec<_>>();
    let percent = |x: f64| format!("{:.3}%", x * 100.0);
    let percents = |b: &Bounds| format!("{} to {}", percent(b.low), percent(b.high));
    let decimals = |b: &Bounds| format!("{:.6} to {:.6}", b.low, b.high);
    let mut intervals = vec![header(&[
        "cache",
        "schedule",
        "ppl change",
        "95% interval",
        "KL mean",
        "95% interval",
        "top-1",
        "95% interval",
    ])];
    for (run, [_, ppl, kl, top1]) in runs.iter().zip(&expected.runs) {
        intervals.push(vec![
            run.label(),
            run.schedule.to_string(),
            percent(ppl.estimate),
            percents(ppl),
            format!("{:.6}", kl.estimate),
            decimals(kl),
            percent(top1.estimate),
            percents(top1),
        ]);
    }
    let mut pairs = vec![header(&[
        "cache a",
        "cache b",
        "NLL a - b",
        "95% interval",
        "KL mean a - b",
        "95% interval",
        "top-1 a - b, points",
        "95% interval",
        "interval excludes zero",
    ])];
    let name = |r: usize| format!("{} {}", runs[r].label(), runs[r].schedule);
    for (a, b, [nll, kl, top1]) in &expected.pairs {
        let excludes: Vec<&str> = [("NLL", nll), ("KL", kl), ("top-1", top1)]
            .into_iter()
            .filter(|(_, i)| i.low > 0.0 || i.high < 0.0)
            .map(|(name, _)| name)
            .collect();
        pairs.push(vec![
            name(*a),
            name(*b),
            format!("{:.6}", nll.estimate),
            decimals(nll),
            format!("{:.6}", kl.estimate),
            decimals(kl),
            format!("{:.3}", top1.estimate * 100.0),
            format!("{:.3} to {:.3}", top1.low * 100.0, top1.high * 100.0),
            if excludes.is_empty() {
                "none".into()
            } else {
                excludes.join(", ")
            },
        ]);
    }
    [intervals, pairs]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_numpys_percentile_bootstrap() {
        // NumPy 2.4.6: v = [0.1, 0.4, 0.35, 0.2, 0.9]; idx = default_rng(3).integers(0, 5,
        // size=(1000, 5)); np.percentile(v[idx].sum(axis=1) / 5, [2.5, 97.5]).
        let v = [0.1, 0.4, 0.35, 0.2, 0.9];
        let mut rng = nprand::NumpyRng::default_rng(3);
        let draws: Vec<usize> = (0..5000).map(|_| rng.integers(5) as usize).collect();
        let b = bounds(&v, &draws);
        assert!((b.low - 0.19).abs() < 1e-15, "{}", b.low);
        assert!((b.high - 0.6399999999999999).abs() < 1e-15, "{}", b.high);
        assert_eq!(b.estimate, 1.95 / 5.0);
    }
}
