//! Numerical sensitivity: how far a run's figures move when its cache receives keys and values
//! perturbed at the size of float32 rounding. Two correct implementations differ by about that
//! much (another summation order), and in a packed cache such a difference can tip a code across
//! a rounding tie and cascade through the later layers; a difference between two runs smaller than
//! the spread measured here is not a finding, whatever its bootstrap interval says.
//!
//! A protocol's optional `sensitivity` block names `perturbations` (1 to
//! [`MAX_PERTURBATIONS`], distinct, each a `relative` size in (0, [`MAX_RELATIVE`]] and a
//! `seed`) and `runs` (indices into the protocol's runs, ascending, unique). For perturbation k,
//! text i and each named run, a pass of the run's cache in which, at every layer in order, the
//! cache receives, from one generator per pass, NumPy's `default_rng(seed)`:
//!
//! - `z_k = standard_normal((kv_heads, T, head_dim))`, then `z_v` of the same shape (float64, C
//!   order, drawn for every layer);
//! - keys before RoPE `float32(k_pre * (1 + relative * z_k))` (the product in f64, rounded
//!   once), keys after RoPE the layer's own rotation of those (`LayerKv::rope`), values
//!   `float32(v * (1 + relative * z_v))`;
//!
//! queries and everything outside the cache are the pass's own. The pass is scored as a row is
//! (log-prob of the next id, KL against the unperturbed float32 pass, argmax): arrays.npz ends
//! with `s{k}_{row id}_logp`, `_kl` and `_argmax`, per text, then perturbation, then named run.
//!
//! summary.json's `sensitivity`: per named run, its unperturbed means over the texts (the NLL
//! change `nll - nll_f32`, the KL mean and top-1 agreement, as the summary rows average them),
//! each perturbation's means, and the spread (per metric, the largest absolute difference between
//! a perturbation's mean and the unperturbed one); per pair of named runs (a before b), the
//! unperturbed difference of their means `a - b` and its spread (the largest absolute change of
//! that difference under a perturbation). Sums run in text order, perturbations in order.
//! summary.md gets two tables: the runs, and the pairs with the metrics whose difference exceeds
//! its spread.

use models::llama::{HookError, LayerKv};
use ndarray::Array3;
use nprand::NumpyRng;
use serde::{Deserialize, Serialize};

/// Most perturbations.
pub const MAX_PERTURBATIONS: usize = 4;
/// Largest relative size.
pub const MAX_RELATIVE: f64 = 1e-3;

/// The protocol's `sensitivity` block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SensitivitySpec {
    /// The perturbations, in order.
    pub perturbations: Vec<Perturbation>,
    /// The runs perturbed: indices into the protocol's runs, ascending.
    pub runs: Vec<usize>,
}

/// One perturbation of every cache input.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Perturbation {
    /// Its relative size (the standard deviation of the relative change).
    pub relative: f64,
    /// NumPy's `default_rng` seed of each pass.
    pub seed: u64,
}

// Validation refuses a size that is not finite, so equality is an equivalence.
impl Eq for Perturbation {}

impl Perturbation {
    /// The pass's generator: a new one for each pass.
    pub fn generator(&self) -> NumpyRng {
        NumpyRng::default_rng(u128::from(self.seed))
    }
}

/// Why a `sensitivity` block is refused: the field, and what is wrong with it.
pub fn refusal(spec: &SensitivitySpec, runs: usize) -> Option<(String, String)> {
    let n = spec.perturbations.len();
    if !(1..=MAX_PERTURBATIONS).contains(&n) {
        return Some((
            "sensitivity.perturbations".into(),
            format!("must hold 1 to {MAX_PERTURBATIONS}, got {n}"),
        ));
    }
    for (k, p) in spec.perturbations.iter().enumerate() {
        if !(p.relative.is_finite() && p.relative > 0.0 && p.relative <= MAX_RELATIVE) {
            return Some((
                format!("sensitivity.perturbations[{k}].relative"),
                format!(
                    "must be above 0 and at most {MAX_RELATIVE:e}, got {}",
                    p.relative
                ),
            ));
        }
        if spec.perturbations[..k].contains(p) {
            return Some((
                format!("sensitivity.perturbations[{k}]"),
                "repeats an earlier perturbation".into(),
            ));
        }
    }
    if spec.runs.is_empty() {
        return Some(("sensitivity.runs".into(), "names no run".into()));
    }
    for (i, &r) in spec.runs.iter().enumerate() {
        if r >= runs {
            return Some((
                format!("sensitivity.runs[{i}]"),
                format!(
                    "must index a run (0 to {}), got {r}",
                    runs.saturating_sub(1)
                ),
            ));
        }
        if i > 0 && r <= spec.runs[i - 1] {
            return Some((
                format!("sensitivity.runs[{i}]"),
                "runs must be named in ascending order, each once".into(),
            ));
        }
    }
    None
}

/// `x * (1 + relative * z)` in f64, rounded once to f32, with `z` the generator's next
/// standard normals in C order.
fn perturbed(x: &Array3<f32>, relative: f64, rng: &mut NumpyRng) -> Array3<f32> {
    let z = rng.normal_array(x.dim());
    let mut out = x.as_standard_layout().into_owned();
    for (y, z) in out.iter_mut().zip(z.iter()) {
        *y = (f64::from(*y) * (1.0 + relative * z)) as f32;
    }
    out
}

/// A layer's cache inputs: keys before RoPE, keys after it, values.
pub type Inputs = (Array3<f32>, Array3<f32>, Array3<f32>);

/// One layer's cache inputs perturbed (module docs).
pub fn perturb(kv: &LayerKv<'_>, relative: f64, rng: &mut NumpyRng) -> Result<Inputs, HookError> {
    let k_pre = perturbed(kv.k_pre_rope, relative, rng);
    let v = perturbed(kv.v, relative, rng);
    let mut k = k_pre.clone();
    kv.rope(&mut k)?;
    Ok((k_pre, k, v))
}

/// A run's three per-text values (texts in order).
#[derive(Debug, Clone, PartialEq)]
pub struct PerText {
    /// `nll - nll_f32`.
    pub nll_change: Vec<f64>,
    /// The row's mean KL.
    pub kl_mean: Vec<f64>,
    /// The row's top-1 agreement.
    pub top1_agreement: Vec<f64>,
}

impl PerText {
    fn means(&self) -> Metrics {
        let mean = |xs: &[f64]| xs.iter().fold(0f64, |a, x| a + x) / xs.len() as f64;
        Metrics {
            nll_change: mean(&self.nll_change),
            kl_mean: mean(&self.kl_mean),
            top1_agreement: mean(&self.top1_agreement),
        }
    }
}

/// The three metrics.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// NLL change against the float32 cache, nats per token.
    pub nll_change: f64,
    /// Mean KL.
    pub kl_mean: f64,
    /// Top-1 agreement.
    pub top1_agreement: f64,
}

impl Metrics {
    fn zip(self, other: Metrics, f: impl Fn(f64, f64) -> f64) -> Metrics {
        Metrics {
            nll_change: f(self.nll_change, other.nll_change),
            kl_mean: f(self.kl_mean, other.kl_mean),
            top1_agreement: f(self.top1_agreement, other.top1_agreement),
        }
    }
    /// The largest absolute difference from `base` over `moved`, per metric.
    fn spread(base: Metrics, moved: &[Metrics]) -> Metrics {
        moved.iter().fold(
            Metrics {
                nll_change: 0.0,
                kl_mean: 0.0,
                top1_agreement: 0.0,
            },
            |s, m| s.zip(m.zip(base, |a, b| (a - b).abs()), f64::max),
        )
    }
}

/// A named run's sensitivity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSensitivity {
    /// Its index in the protocol's runs.
    pub run: usize,
    /// Its unperturbed means over the texts.
    pub unperturbed: Metrics,
    /// Each perturbation's means, in order.
    pub perturbed: Vec<Metrics>,
    /// The largest absolute change of each mean.
    pub spread: Metrics,
}

/// A pair of named runs, a before b.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairSensitivity {
    /// The first run's index.
    pub a: usize,
    /// The second's.
    pub b: usize,
    /// The unperturbed difference of their means, a - b.
    pub difference: Metrics,
    /// The largest absolute change of that difference under a perturbation.
    pub spread: Metrics,
}

/// summary.json's `sensitivity`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SensitivitySummary {
    /// The perturbations, in order.
    pub perturbations: Vec<Perturbation>,
    /// Per named run, in order.
    pub runs: Vec<RunSensitivity>,
    /// Per pair of named runs, a before b, in order.
    pub pairs: Vec<PairSensitivity>,
}

/// The summary from each named run's per-text values, unperturbed (`base[j]` for
/// `spec.runs[j]`) and under each perturbation (`moved[k][j]`).
pub fn summarize(
    spec: &SensitivitySpec,
    base: &[PerText],
    moved: &[Vec<PerText>],
) -> SensitivitySummary {
    let base: Vec<Metrics> = base.iter().map(PerText::means).collect();
    let moved: Vec<Vec<Metrics>> = moved
        .iter()
        .map(|runs| runs.iter().map(PerText::means).collect())
        .collect();
    let runs = spec
        .runs
        .iter()
        .enumerate()
        .map(|(j, &run)| {
            let perturbed: Vec<Metrics> = moved.iter().map(|m| m[j]).collect();
            RunSensitivity {
                run,
                unperturbed: base[j],
                spread: Metrics::spread(base[j], &perturbed),
                perturbed,
            }
        })
        .collect();
    let mut pairs = Vec::new();
    for a in 0..spec.runs.len() {
        for b in a + 1..spec.runs.len() {
            let difference = base[a].zip(base[b], |x, y| x - y);
            let under: Vec<Metrics> = moved.iter().map(|m| m[a].zip(m[b], |x, y| x - y)).collect();
            pairs.push(PairSensitivity {
                a: spec.runs[a],
                b: spec.runs[b],
                difference,
                spread: Metrics::spread(difference, &under),
            });
        }
    }
    SensitivitySummary {
        perturbations: spec.perturbations.clone(),
        runs,
        pairs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per_text(nll: [f64; 2]) -> PerText {
        PerText {
            nll_change: nll.to_vec(),
            kl_mean: vec![0.5, 0.5],
            top1_agreement: vec![1.0, 1.0],
        }
    }

    #[test]
    fn the_spread_is_the_largest_move_of_a_mean_and_of_a_difference() {
        let spec = SensitivitySpec {
            perturbations: vec![
                Perturbation {
                    relative: 1e-6,
                    seed: 1,
                },
                Perturbation {
                    relative: 3e-6,
                    seed: 2,
                },
            ],
            runs: vec![0, 2],
        };
        let base = [per_text([0.25, 0.75]), per_text([0.0, 0.5])];
        let moved = [
            vec![per_text([0.5, 0.75]), per_text([0.0, 0.5])],
            vec![per_text([0.25, 0.5]), per_text([0.25, 0.5])],
        ];
        let s = summarize(&spec, &base, &moved);
        assert_eq!(s.runs[0].unperturbed.nll_change, 0.5);
        assert_eq!(s.runs[0].spread.nll_change, 0.125);
        assert_eq!(s.runs[1].spread.nll_change, 0.125);
        assert_eq!(s.runs[0].spread.kl_mean, 0.0);
        // Difference 0.25; under the perturbations 0.375 and 0.0.
        assert_eq!((s.pairs[0].a, s.pairs[0].b), (0, 2));
        assert_eq!(s.pairs[0].difference.nll_change, 0.25);
        assert_eq!(s.pairs[0].spread.nll_change, 0.25);
    }

    #[test]
    fn a_perturbation_moves_values_by_about_its_relative_size_and_is_seeded() {
        let q = Array3::<f32>::zeros((2, 64, 8));
        let k = Array3::from_shape_fn((1, 64, 8), |(_, t, c)| 1.0 + (t * 8 + c) as f32);
        let kv = LayerKv::unrotated(&q, &k, &k);
        let (pre, post, v) = perturb(&kv, 3e-6, &mut NumpyRng::default_rng(7)).unwrap();
        assert_eq!(
            pre, post,
            "an unrotated layer's keys are its keys before RoPE"
        );
        let relative: Vec<f64> = pre
            .iter()
            .zip(&k)
            .map(|(a, b)| f64::from(a - b) / f64::from(*b))
            .collect();
        let rms = (relative.iter().map(|r| r * r).sum::<f64>() / relative.len() as f64).sqrt();
        assert!((2e-6..4e-6).contains(&rms), "{rms}");
        assert_ne!(pre, v, "keys and values take their own draws");
        let again = perturb(&kv, 3e-6, &mut NumpyRng::default_rng(7)).unwrap();
        assert_eq!(again.0, pre);
    }

    #[test]
    fn blocks_are_refused_by_field() {
        let p = |relative| Perturbation { relative, seed: 1 };
        let refused = |perturbations: Vec<Perturbation>, runs: Vec<usize>| {
            refusal(
                &SensitivitySpec {
                    perturbations,
                    runs,
                },
                3,
            )
            .map(|(f, _)| f)
        };
        assert_eq!(refused(vec![p(1e-6)], vec![0, 2]), None);
        assert_eq!(
            refused(vec![], vec![0]).as_deref(),
            Some("sensitivity.perturbations")
        );
        assert_eq!(
            refused(vec![p(0.0)], vec![0]).as_deref(),
            Some("sensitivity.perturbations[0].relative")
        );
        assert_eq!(
            refused(vec![p(1e-6), p(1e-6)], vec![0]).as_deref(),
            Some("sensitivity.perturbations[1]")
        );
        assert_eq!(
            refused(vec![p(1e-6)], vec![3]).as_deref(),
            Some("sensitivity.runs[0]")
        );
        assert_eq!(
            refused(vec![p(1e-6)], vec![1, 1]).as_deref(),
            Some("sensitivity.runs[1]")
        );
        assert_eq!(
            refused(vec![p(1e-6)], vec![]).as_deref(),
            Some("sensitivity.runs")
        );
    }
}
