//! How sure a model-quality study is: a paired bootstrap over its texts (issue 23).
//!
//! A protocol's optional `bootstrap` block (`resamples`, `seed`) has summary.json carry a 95 %
//! interval for each run's change against the float32 cache and for the difference between
//! every two runs. The texts are the unit resampled: positions within a text are not
//! independent, texts are. The spec, which the audit re-derives with its own code:
//!
//! - The pairs: those the block's optional `pairs` names, each `[a, b]` measured as a - b, in
//!   its order (1 to [`MAX_PAIRS`], two different runs each, no pair twice in either order);
//!   without it, every pair, a before b in protocol order.
//! - Per text t (n texts) and run r, three values from results.json's row: the NLL change
//!   `nll - nll_f32` (nats), `kl_mean` and `top1_agreement`.
//! - Resample b (0 to B - 1) draws n text indexes, row b of NumPy's
//!   `default_rng(seed).integers(0, n, size=(B, n))` (`nprand`, the draws in row-major order).
//!   The same draws serve every run, pair and metric: the comparison is paired.
//! - A statistic is the drawn texts' values summed in draw order in f64, over n. For a pair
//!   (a, b), each text's value is `v_a - v_b`, taken per text before the sum.
//! - The estimate is the same mean over the texts in order (no resampling). The interval is the
//!   2.5th and 97.5th percentiles of the B statistics sorted (`metrics::percentile`: linear
//!   between neighbours, as NumPy's default).
//! - The perplexity change is `expm1(x)` (`libm`) of the NLL change's estimate and bounds: the
//!   perplexity ratio is the exponential of the mean NLL change, and the map is monotone.
//!
//! A difference whose interval includes zero is not a finding; summary.md says which intervals
//! exclude it.

use nprand::NumpyRng;
use serde::{Deserialize, Serialize};

use crate::metrics::percentile;

/// Fewest resamples a protocol may ask for.
pub const MIN_RESAMPLES: usize = 100;
/// Most resamples a protocol may ask for.
pub const MAX_RESAMPLES: usize = 100_000;
/// The interval's lower percentile, as a fraction.
pub const LOW: f64 = 0.025;
/// The interval's upper percentile, as a fraction.
pub const HIGH: f64 = 0.975;

/// Most pairs a `pairs` list may name.
pub const MAX_PAIRS: usize = 256;

/// The protocol's `bootstrap` block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootstrapSpec {
    /// B, from [`MIN_RESAMPLES`] to [`MAX_RESAMPLES`].
    pub resamples: usize,
    /// NumPy's `default_rng` seed.
    pub seed: u64,
    /// The pairs of runs compared, `[a, b]` for a - b, in this order; absent: every pair (a
    /// study of many runs names the few comparisons it is for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pairs: Option<Vec<[usize; 2]>>,
}

impl BootstrapSpec {
    /// The pairs compared among `runs` runs (module docs).
    pub fn pairs(&self, runs: usize) -> Vec<(usize, usize)> {
        match &self.pairs {
            Some(named) => named.iter().map(|&[a, b]| (a, b)).collect(),
            None => (0..runs)
                .flat_map(|a| (a + 1..runs).map(move |b| (a, b)))
                .collect(),
        }
    }
}

/// One metric's estimate and interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interval {
    /// The mean over the texts.
    pub estimate: f64,
    /// The 2.5th percentile of the resampled means.
    pub low: f64,
    /// The 97.5th percentile.
    pub high: f64,
}

impl Interval {
    /// Whether zero lies outside [low, high].
    pub fn excludes_zero(&self) -> bool {
        self.low > 0.0 || self.high < 0.0
    }

    fn map(self, f: impl Fn(f64) -> f64) -> Interval {
        Interval {
            estimate: f(self.estimate),
            low: f(self.low),
            high: f(self.high),
        }
    }
}

/// A run's changes against the float32 cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunIntervals {
    /// Setting label; absent for a scheme.
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
    /// NLL change in nats per token.
    pub nll_change: Interval,
    /// Perplexity change as a fraction (`expm1` of the NLL change).
    pub perplexity_change: Interval,
    /// Mean KL.
    pub kl_mean: Interval,
    /// Top-1 agreement.
    pub top1_agreement: Interval,
}

/// The difference between two runs, `runs[a]` minus `runs[b]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairIntervals {
    /// The first run's index in the protocol.
    pub a: usize,
    /// The second's (greater than `a`).
    pub b: usize,
    /// Difference of NLL changes (equally, of NLLs), nats per token.
    pub nll_change: Interval,
    /// Difference of mean KL.
    pub kl_mean: Interval,
    /// Difference of top-1 agreement.
    pub top1_agreement: Interval,
}

/// summary.json's `bootstrap`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootstrapSummary {
    /// B.
    pub resamples: usize,
    /// The seed.
    pub seed: u64,
    /// Texts resampled.
    pub texts: usize,
    /// Per run, in protocol order.
    pub runs: Vec<RunIntervals>,
    /// Every pair of runs, a before b, in the order (0, 1), (0, 2), ..., (1, 2), ...
    pub pairs: Vec<PairIntervals>,
}

/// A run's setting, policy, scheme and schedule labels, as summary.json writes them.
pub type RunLabels = (Option<String>, Option<String>, Option<String>, String);

/// One run's per-text values (module docs), each `[texts]`.
#[derive(Debug, Clone, PartialEq)]
pub struct PerText {
    /// `nll - nll_f32`.
    pub nll_change: Vec<f64>,
    /// `kl_mean`.
    pub kl_mean: Vec<f64>,
    /// `top1_agreement`.
    pub top1_agreement: Vec<f64>,
}

/// The resamples' draws: row b of `default_rng(seed).integers(0, n, size=(B, n))`.
pub fn draws(spec: &BootstrapSpec, texts: usize) -> Vec<Vec<usize>> {
    let high = u32::try_from(texts).expect("a protocol holds far fewer texts than 2^32");
    let mut rng = NumpyRng::default_rng(u128::from(spec.seed));
    (0..spec.resamples)
        .map(|_| (0..texts).map(|_| rng.integers(high) as usize).collect())
        .collect()
}

/// The mean of `values` in order, and its interval over `draws`.
pub fn interval(values: &[f64], draws: &[Vec<usize>]) -> Interval {
    let n = values.len() as f64;
    let mean_of =
        |indexes: &mut dyn Iterator<Item = usize>| indexes.fold(0f64, |sum, i| sum + values[i]) / n;
    let mut means: Vec<f64> = draws
        .iter()
        .map(|draw| mean_of(&mut draw.iter().copied()))
        .collect();
    means.sort_by(f64::total_cmp);
    Interval {
        estimate: mean_of(&mut (0..values.len())),
        low: percentile(&means, LOW),
        high: percentile(&means, HIGH),
    }
}

/// Each text's `a[t] - b[t]`.
fn difference(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x - y).collect()
}

/// Every run's intervals and every pair's, over the same draws. `labels[r]` is run r's
/// (setting, policy, scheme, schedule).
pub fn summarize(
    spec: &BootstrapSpec,
    labels: &[RunLabels],
    per_run: &[PerText],
) -> BootstrapSummary {
    let texts = per_run.first().map_or(0, |r| r.nll_change.len());
    let draws = draws(spec, texts);
    let runs = labels
        .iter()
        .zip(per_run)
        .map(|((setting, policy, scheme, schedule), v)| {
            let nll_change = interval(&v.nll_change, &draws);
            RunIntervals {
                setting: setting.clone(),
                policy: policy.clone(),
                scheme: scheme.clone(),
                schedule: schedule.clone(),
                nll_change,
                perplexity_change: nll_change.map(libm::expm1),
                kl_mean: interval(&v.kl_mean, &draws),
                top1_agreement: interval(&v.top1_agreement, &draws),
            }
        })
        .collect();
    let pairs = spec
        .pairs(per_run.len())
        .into_iter()
        .map(|(a, b)| {
            let (va, vb) = (&per_run[a], &per_run[b]);
            PairIntervals {
                a,
                b,
                nll_change: interval(&difference(&va.nll_change, &vb.nll_change), &draws),
                kl_mean: interval(&difference(&va.kl_mean, &vb.kl_mean), &draws),
                top1_agreement: interval(
                    &difference(&va.top1_agreement, &vb.top1_agreement),
                    &draws,
                ),
            }
        })
        .collect();
    BootstrapSummary {
        resamples: spec.resamples,
        seed: spec.seed,
        texts,
        runs,
        pairs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_numpys_percentile_bootstrap() {
        // NumPy 2.4.6:
        //   v = np.array([0.1, 0.4, 0.35, 0.2, 0.9]); rng = np.random.default_rng(3)
        //   idx = rng.integers(0, 5, size=(1000, 5)); m = v[idx].sum(axis=1) / 5
        //   np.percentile(m, [2.5, 97.5])
        let v = [0.1, 0.4, 0.35, 0.2, 0.9];
        let spec = BootstrapSpec {
            resamples: 1000,
            seed: 3,
            pairs: None,
        };
        let i = interval(&v, &draws(&spec, v.len()));
        assert_eq!(i.estimate, v.iter().sum::<f64>() / 5.0);
        assert!((i.low - NUMPY_LOW).abs() < 1e-15, "{}", i.low);
        assert!((i.high - NUMPY_HIGH).abs() < 1e-15, "{}", i.high);
    }

    // What NumPy printed (the means summed in draw order, as here).
    const NUMPY_LOW: f64 = 0.19;
    const NUMPY_HIGH: f64 = 0.6399999999999999;

    #[test]
    fn equal_texts_give_a_point_and_pairs_are_paired() {
        let mut spec = BootstrapSpec {
            resamples: 200,
            seed: 9,
            pairs: None,
        };
        let flat = PerText {
            nll_change: vec![0.25; 4],
            kl_mean: vec![0.01; 4],
            top1_agreement: vec![0.9; 4],
        };
        // A run that is the first plus a constant on every text: whatever the texts, the pair's
        // difference is that constant, so its interval is a point even though each run's is not.
        let base = PerText {
            nll_change: vec![0.1, 0.5, 0.2, 0.9],
            kl_mean: vec![0.02, 0.08, 0.03, 0.2],
            top1_agreement: vec![0.95, 0.8, 0.9, 0.7],
        };
        let shifted = PerText {
            nll_change: base.nll_change.iter().map(|x| x + 0.5).collect(),
            ..base.clone()
        };
        let label = |s: &str| {
            (
                Some(s.to_string()),
                Some("uniform".into()),
                None,
                "prefill".into(),
            )
        };
        let labels = [label("a"), label("b"), label("c")];
        let per_run = [flat, base, shifted];
        let s = summarize(&spec, &labels, &per_run);
        assert_eq!(s.texts, 4);
        let flat = &s.runs[0];
        assert_eq!((flat.nll_change.low, flat.nll_change.high), (0.25, 0.25));
        assert_eq!(flat.perplexity_change.estimate, libm::expm1(0.25));
        assert!(s.runs[1].nll_change.low < s.runs[1].nll_change.high);
        assert_eq!(
            s.pairs.iter().map(|p| (p.a, p.b)).collect::<Vec<_>>(),
            [(0, 1), (0, 2), (1, 2)]
        );
        let pair = &s.pairs[2].nll_change;
        assert!((pair.low + 0.5).abs() < 1e-12 && (pair.high + 0.5).abs() < 1e-12);
        assert!(pair.excludes_zero());
        assert_eq!(s.pairs[2].kl_mean.low, 0.0);
        assert!(!s.pairs[2].kl_mean.excludes_zero());

        // Named pairs: only those, in their order and direction, on the same draws.
        spec.pairs = Some(vec![[2, 1], [0, 2]]);
        let named = summarize(&spec, &labels, &per_run);
        assert_eq!(named.runs, s.runs);
        assert_eq!(
            named.pairs.iter().map(|p| (p.a, p.b)).collect::<Vec<_>>(),
            [(2, 1), (0, 2)]
        );
        let reversed = &named.pairs[0].nll_change;
        assert!((reversed.low - 0.5).abs() < 1e-12 && (reversed.high - 0.5).abs() < 1e-12);
        assert_eq!(named.pairs[1], s.pairs[1]);
    }
}
