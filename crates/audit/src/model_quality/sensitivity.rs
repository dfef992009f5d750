//! Numerical sensitivity (a protocol's `sensitivity` block), written again from the format's
//! spec: the named runs re-run with their cache inputs perturbed at the size of float32 rounding.
//!
//! The block: `perturbations`, 1 to 4 distinct `{relative, seed}` with `relative` finite, above
//! 0 and at most 1e-3; `runs`, at least one index into the protocol's runs, ascending. For
//! perturbation k, text i and named run r, pass `s{k}_{row id}`: at every layer in order, from one
//! `nprand` generator per pass (`default_rng(seed)`), `z_k` and then `z_v`, each
//! `standard_normal((kv_heads, T, head_dim))` in f64; the cache receives keys before RoPE
//! `f32(k_pre * (1 + relative * z_k))` (f64 product, rounded once), keys after RoPE their
//! rotation by the layer's own RoPE (`LayerKv::rope`), values `f32(v * (1 + relative * z_v))`.
//! A re-run requires its `s{k}_{row id}_logp`, `_kl` and `_argmax` bit for bit (the members come
//! last in arrays.npz, per text, then perturbation, then named run).
//!
//! From the archived arrays: per pass the NLL change (`-sum(logp) / n` minus the text's float32
//! NLL), the KL mean and the top-1 agreement with the text's float32 argmax; per named run the
//! unperturbed means over the texts (of its rows), each perturbation's, and the spread (the
//! largest absolute move of a mean); per pair of named runs (a before b) the difference a - b of
//! the unperturbed means and its spread (the largest absolute move of that difference). summary.json's
//! `sensitivity` is held to them, and summary.md's two tables rendered from them (NLL and KL with 6
//! decimals, top-1 in percent with 3; a pair's "beyond the spread" lists NLL, KL and top-1 where
//! the difference's magnitude exceeds its spread, or "none").

use std::collections::BTreeMap;

use models::llama::{HookError, LayerKv};
use ndarray::Array3;
use serde::Deserialize;

use super::arrays::{Derived, KL_SLACK};
use super::protocol::{QualityProtocol, Run};
use crate::common::npz::Archive;
use crate::common::report::{Problem, Report};
use crate::common::tolerance::close;

pub use super::protocol::{
    MAX_PERTURBATIONS, MAX_RELATIVE, Perturbation, SensitivityBlock, perturbed_pass_id as pass_id,
};

/// `x (1 + relative z)` per element in C order, `z` the generator's next standard normals.
fn moved(x: &Array3<f32>, relative: f64, rng: &mut nprand::NumpyRng) -> Array3<f32> {
    let mut out = x.as_standard_layout().into_owned();
    for y in out.iter_mut() {
        let z = rng.standard_normal();
        *y = (f64::from(*y) * (1.0 + relative * z)) as f32;
    }
    out
}

/// A layer's cache inputs: keys after RoPE, values, keys before RoPE.
pub type Inputs = (Array3<f32>, Array3<f32>, Array3<f32>);

/// One layer's cache inputs perturbed.
pub fn perturb(
    kv: &LayerKv<'_>,
    relative: f64,
    rng: &mut nprand::NumpyRng,
) -> Result<Inputs, HookError> {
    let before = moved(kv.k_pre_rope, relative, rng);
    let values = moved(kv.v, relative, rng);
    let mut after = before.clone();
    kv.rope(&mut after)?;
    Ok((after, values, before))
}

/// (NLL change, KL mean, top-1 agreement).
pub type Values = [f64; 3];

/// What summary.json and summary.md are held to.
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    /// Per named run: (run index, unperturbed, per perturbation, spread).
    pub runs: Vec<(usize, Values, Vec<Values>, Values)>,
    /// Per pair: (a, b, difference, spread).
    pub pairs: Vec<(usize, usize, Values, Values)>,
}

fn spread(base: Values, moved: &[Values]) -> Values {
    let mut s = [0f64; 3];
    for m in moved {
        for i in 0..3 {
            s[i] = s[i].max((m[i] - base[i]).abs());
        }
    }
    s
}

fn means(per_text: &[Values]) -> Values {
    let mut sum = [0f64; 3];
    for v in per_text {
        for i in 0..3 {
            sum[i] += v[i];
        }
    }
    sum.map(|s| s / per_text.len() as f64)
}

/// One perturbed pass's values from its archived arrays, range-checked.
fn pass_values(
    archive: &Archive,
    id: &str,
    nll_f32: f64,
    f32_argmax: &[i64],
    vocabulary: u32,
    report: &mut Report,
) -> Option<Values> {
    let n = f32_argmax.len();
    let logp = archive.values::<f64>(&format!("{id}_logp"), &[n]).ok()?;
    let kl = archive.values::<f64>(&format!("{id}_kl"), &[n]).ok()?;
    let argmax = archive.values::<i64>(&format!("{id}_argmax"), &[n]).ok()?;
    let bad = |array: String, index: usize, found: String, expected: &str| Problem::Value {
        array,
        index,
        found,
        expected: expected.into(),
    };
    if let Some((i, x)) = logp
        .iter()
        .enumerate()
        .find(|(_, x)| !(x.is_finite() && **x <= 0.0))
    {
        report.fail(bad(
            format!("{id}_logp"),
            i,
            format!("{x:?}"),
            "a finite log-prob <= 0",
        ));
    }
    if let Some((i, x)) = kl
        .iter()
        .enumerate()
        .find(|(_, x)| !(x.is_finite() && **x >= -KL_SLACK))
    {
        report.fail(bad(
            format!("{id}_kl"),
            i,
            format!("{x:?}"),
            "a finite KL >= 0",
        ));
    }
    if let Some((i, x)) = argmax
        .iter()
        .enumerate()
        .find(|(_, x)| !(0..i64::from(vocabulary)).contains(*x))
    {
        report.fail(bad(
            format!("{id}_argmax"),
            i,
            x.to_string(),
            "an id below the vocabulary",
        ));
    }
    let count = n as f64;
    let sum = |xs: &[f64]| xs.iter().fold(0f64, |a, x| a + x);
    let agree = argmax
        .iter()
        .zip(f32_argmax)
        .filter(|(a, b)| a == b)
        .count();
    Some([
        -sum(&logp) / count - nll_f32,
        sum(&kl) / count,
        agree as f64 / count,
    ])
}

/// The expected summary from the archive and each row's derived values; `None` without the
/// block or when a member or row cannot be read (reported with the arrays).
pub fn expected(
    p: &QualityProtocol,
    runs: &[Run],
    derived: &BTreeMap<(usize, usize), Derived>,
    archive: &Archive,
    report: &mut Report,
) -> Option<Expected> {
    let block = p.sensitivity.as_ref()?;
    let texts = p.texts.len();
    let vocabulary = p.geometry().vocabulary;
    let mut base: Vec<Vec<Values>> = vec![Vec::new(); block.runs.len()];
    let mut perturbed: Vec<Vec<Vec<Values>>> =
        vec![vec![Vec::new(); block.runs.len()]; block.perturbations.len()];
    for t in 0..texts {
        let first = derived.get(&(t, *block.runs.first()?))?;
        let f32_argmax = archive
            .values::<i64>(&format!("t{t}_f32_argmax"), &[first.kl.len()])
            .ok()?;
        for (j, &r) in block.runs.iter().enumerate() {
            let d = derived.get(&(t, r))?;
            base[j].push([d.nll - d.nll_f32, d.kl_mean, d.top1_agreement]);
            for (k, per_run) in perturbed.iter_mut().enumerate() {
                let id = pass_id(k, &runs[r], t);
                per_run[j].push(pass_values(
                    archive,
                    &id,
                    d.nll_f32,
                    &f32_argmax,
                    vocabulary,
                    report,
                )?);
            }
        }
    }
    let unperturbed: Vec<Values> = base.iter().map(|v| means(v)).collect();
    let moved: Vec<Vec<Values>> = perturbed
        .iter()
        .map(|runs| runs.iter().map(|v| means(v)).collect())
        .collect();
    let runs_out = block
        .runs
        .iter()
        .enumerate()
        .map(|(j, &r)| {
            let under: Vec<Values> = moved.iter().map(|m| m[j]).collect();
            (
                r,
                unperturbed[j],
                under.clone(),
                spread(unperturbed[j], &under),
            )
        })
        .collect();
    let mut pairs = Vec::new();
    let diff = |x: Values, y: Values| [x[0] - y[0], x[1] - y[1], x[2] - y[2]];
    for a in 0..block.runs.len() {
        for b in a + 1..block.runs.len() {
            let d = diff(unperturbed[a], unperturbed[b]);
            let under: Vec<Values> = moved.iter().map(|m| diff(m[a], m[b])).collect();
            pairs.push((block.runs[a], block.runs[b], d, spread(d, &under)));
        }
    }
    Some(Expected {
        runs: runs_out,
        pairs,
    })
}

/// summary.json's three metrics.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metrics {
    /// NLL change.
    pub nll_change: f64,
    /// KL mean.
    pub kl_mean: f64,
    /// Top-1 agreement.
    pub top1_agreement: f64,
}

impl Metrics {
    fn values(&self) -> Values {
        [self.nll_change, self.kl_mean, self.top1_agreement]
    }
}

/// A named run in summary.json.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunEntry {
    /// Its index.
    pub run: usize,
    /// Unperturbed means.
    pub unperturbed: Metrics,
    /// Each perturbation's means.
    pub perturbed: Vec<Metrics>,
    /// The spread.
    pub spread: Metrics,
}

/// A pair in summary.json.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairEntry {
    /// The first run's index.
    pub a: usize,
    /// The second's.
    pub b: usize,
    /// a - b.
    pub difference: Metrics,
    /// Its spread.
    pub spread: Metrics,
}

/// summary.json's `sensitivity`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SensitivitySummary {
    /// The perturbations.
    pub perturbations: Vec<Perturbation>,
    /// Per named run.
    pub runs: Vec<RunEntry>,
    /// Per pair.
    pub pairs: Vec<PairEntry>,
}

const METRICS: [&str; 3] = ["nll_change", "kl_mean", "top1_agreement"];

/// summary.json's `sensitivity` against the block and the expected values.
pub fn check_summary(
    p: &QualityProtocol,
    expected: Option<&Expected>,
    found: Option<&SensitivitySummary>,
    report: &mut Report,
) {
    let fail = |report: &mut Report, place: String, found: String, expected: String| {
        report.fail(Problem::Summary {
            place,
            found,
            expected,
        })
    };
    let asked = p.sensitivity.is_some();
    let Some(found) = super::optional::block_present("sensitivity", asked, found, report) else {
        return;
    };
    let Some(block) = &p.sensitivity else {
        return;
    };
    if found.perturbations != block.perturbations {
        fail(
            report,
            "sensitivity perturbations".into(),
            format!("{:?}", found.perturbations),
            format!("{:?}", block.perturbations),
        );
    }
    let Some(expected) = expected else {
        return;
    };
    if found.runs.len() != expected.runs.len() || found.pairs.len() != expected.pairs.len() {
        return fail(
            report,
            "sensitivity runs and pairs".into(),
            format!("{} and {}", found.runs.len(), found.pairs.len()),
            format!("{} and {}", expected.runs.len(), expected.pairs.len()),
        );
    }
    let compare = |report: &mut Report, place: String, got: Values, want: Values| {
        for i in 0..3 {
            if !close(got[i], want[i]) {
                fail(
                    report,
                    format!("{place} {}", METRICS[i]),
                    got[i].to_string(),
                    want[i].to_string(),
                );
            }
        }
    };
    for (got, (r, base, under, spread)) in found.runs.iter().zip(&expected.runs) {
        let place = format!("sensitivity run {r}");
        if got.run != *r || got.perturbed.len() != under.len() {
            fail(
                report,
                place,
                format!("run {} with {} perturbations", got.run, got.perturbed.len()),
                format!("run {r} with {}", under.len()),
            );
            continue;
        }
        compare(
            report,
            format!("{place} unperturbed"),
            got.unperturbed.values(),
            *base,
        );
        for (k, (g, w)) in got.perturbed.iter().zip(under).enumerate() {
            compare(report, format!("{place} perturbation {k}"), g.values(), *w);
        }
        compare(
            report,
            format!("{place} spread"),
            got.spread.values(),
            *spread,
        );
    }
    for (got, (a, b, d, s)) in found.pairs.iter().zip(&expected.pairs) {
        let place = format!("sensitivity pair {a}-{b}");
        if (got.a, got.b) != (*a, *b) {
            fail(
                report,
                place,
                format!("{}-{}", got.a, got.b),
                format!("{a}-{b}"),
            );
            continue;
        }
        compare(
            report,
            format!("{place} difference"),
            got.difference.values(),
            *d,
        );
        compare(report, format!("{place} spread"), got.spread.values(), *s);
    }
}

/// summary.md's two sensitivity tables (module docs).
pub fn tables(runs: &[Run], expected: &Expected) -> [Vec<Vec<String>>; 2] {
    let header = |cells: &[&str]| cells.iter().map(|c| c.to_string()).collect::<Vec<_>>();
    let label = |r: usize| format!("{} {}", runs[r].label(), runs[r].schedule);
    let decimal = |x: f64| format!("{x:.6}");
    let percent = |x: f64| format!("{:.3}%", 100.0 * x);
    let mut by_run = vec![header(&[
        "cache",
        "NLL change",
        "spread",
        "KL mean",
        "spread",
        "top-1",
        "spread",
    ])];
    for (r, base, _, s) in &expected.runs {
        by_run.push(vec![
            label(*r),
            decimal(base[0]),
            decimal(s[0]),
            decimal(base[1]),
            decimal(s[1]),
            percent(base[2]),
            percent(s[2]),
        ]);
    }
    let mut pairs = vec![header(&[
        "first",
        "second",
        "NLL difference",
        "spread",
        "KL difference",
        "spread",
        "top-1 difference",
        "spread",
        "beyond the spread",
    ])];
    for (a, b, d, s) in &expected.pairs {
        let beyond: Vec<&str> = ["NLL", "KL", "top-1"]
            .iter()
            .enumerate()
            .filter(|&(i, _)| d[i].abs() > s[i])
            .map(|(_, name)| *name)
            .collect();
        pairs.push(vec![
            label(*a),
            label(*b),
            decimal(d[0]),
            decimal(s[0]),
            decimal(d[1]),
            decimal(s[1]),
            percent(d[2]),
            percent(s[2]),
            if beyond.is_empty() {
                "none".into()
            } else {
                beyond.join(", ")
            },
        ]);
    }
    [by_run, pairs]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_perturbation_is_a_seeded_relative_move_of_the_inputs() {
        let q = Array3::<f32>::zeros((1, 4, 2));
        let k = Array3::from_shape_fn((1, 4, 2), |(_, t, c)| 1.0 + (2 * t + c) as f32);
        let kv = LayerKv::unrotated(&q, &k, &k);
        let mut rng = nprand::NumpyRng::default_rng(3);
        let (after, values, before) = perturb(&kv, 1e-3, &mut rng).unwrap();
        assert_eq!(after, before);
        // Keys take the first eight normals, values the next eight.
        let mut check = nprand::NumpyRng::default_rng(3);
        for (x, y) in k.iter().zip(&before) {
            let z = check.standard_normal();
            assert_eq!(*y, (f64::from(*x) * (1.0 + 1e-3 * z)) as f32);
        }
        for (x, y) in k.iter().zip(&values) {
            let z = check.standard_normal();
            assert_eq!(*y, (f64::from(*x) * (1.0 + 1e-3 * z)) as f32);
        }
    }

    #[test]
    fn spreads_are_the_largest_moves() {
        assert_eq!(
            spread([1.0, 0.5, 0.25], &[[1.5, 0.5, 0.0], [0.75, 0.5, 0.5]]),
            [0.5, 0.0, 0.25]
        );
        assert_eq!(means(&[[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]), [2.0, 2.0, 2.0]);
    }
}
