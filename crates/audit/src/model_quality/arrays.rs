//! arrays.npz of a model-quality run: exactly the members the format lists, in order, each of
//! its dtype and shape; `t{i}_ids` the manifest's ids; every log-prob finite and <= 0, every KL
//! finite and >= 0 (within [`KL_SLACK`]), every argmax and generated id below the vocabulary; and
//! what each row (text x run) derives from them.

use std::collections::{BTreeMap, BTreeSet};

use super::bytes;
use super::manifest::QualityManifest;
use super::protocol::{QualityProtocol, Run};
use crate::common::models::ModelName;
use crate::common::npz::{self, Archive, Element};
use crate::common::report::{Checked, Problem, Report};

/// How far below zero a KL value may be (rounding).
pub const KL_SLACK: f64 = 1e-12;

/// What the audit derives for one row (text x run) from the arrays.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Derived {
    /// NLL of the float32 cache.
    pub nll_f32: f64,
    /// NLL of the packed cache.
    pub nll: f64,
    /// Mean KL.
    pub kl_mean: f64,
    /// Largest KL.
    pub kl_max: f64,
    /// Top-1 agreement.
    pub top1_agreement: f64,
    /// Bytes per token.
    pub bytes_per_token: f64,
    /// First departure (when generating).
    pub first_departure: Option<usize>,
}

/// The archive members a run of `p` writes, in order, with their dtype and length.
pub fn members(
    p: &QualityProtocol,
    runs: &[Run],
    tokens: &[usize],
) -> Vec<(String, npz::Dtype, usize)> {
    use npz::Dtype::{F64, I64};
    let generated = p.generate.map(|g| g.tokens);
    let mut out = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        out.push((format!("t{i}_ids"), I64, t));
        out.push((format!("t{i}_f32_logp"), F64, t - 1));
        out.push((format!("t{i}_f32_argmax"), I64, t - 1));
        if let Some(n) = generated {
            out.push((format!("t{i}_f32_generated"), I64, n));
        }
    }
    for (i, &t) in tokens.iter().enumerate() {
        for run in runs {
            let id = run.id(i);
            out.push((format!("{id}_logp"), F64, t - 1));
            out.push((format!("{id}_kl"), F64, t - 1));
            out.push((format!("{id}_argmax"), I64, t - 1));
            if let Some(n) = generated {
                out.push((format!("{id}_generated"), I64, n));
            }
        }
    }
    out
}

fn value_problem(array: &str, index: usize, found: String, expected: &str) -> Problem {
    Problem::Value {
        array: array.to_string(),
        index,
        found,
        expected: expected.to_string(),
    }
}

/// Reads one member, failing the report if it cannot be had as the format gives it.
fn read<T: Element>(
    archive: &Archive,
    name: &str,
    len: usize,
    report: &mut Report,
) -> Option<Vec<T>> {
    match archive.values::<T>(name, &[len]) {
        Ok(v) => Some(v),
        Err(e) => {
            report.fail(Problem::Array(e));
            None
        }
    }
}

/// Every log-prob finite and <= 0.
fn check_logp(name: &str, values: &[f64], report: &mut Report) {
    if let Some((j, v)) = values
        .iter()
        .enumerate()
        .find(|(_, v)| !(v.is_finite() && **v <= 0.0))
    {
        report.fail(value_problem(
            name,
            j,
            format!("{v:?}"),
            "a finite log-prob <= 0",
        ));
    }
}

/// Every id below the vocabulary.
fn check_ids(name: &str, values: &[i64], report: &mut Report) {
    let vocabulary = i64::from(ModelName::SmolLm2.shape().vocabulary);
    if let Some((j, v)) = values
        .iter()
        .enumerate()
        .find(|(_, v)| !(0..vocabulary).contains(*v))
    {
        report.fail(value_problem(
            name,
            j,
            v.to_string(),
            "a token id from 0 to 49,151",
        ));
    }
}

/// Checks arrays.npz and derives every row's aggregates; None if any array is unusable. The
/// map is keyed by (text, run).
pub(super) fn check_arrays(
    manifest: &QualityManifest,
    runs: &[Run],
    tokens: &[usize],
    archive: &Archive,
    report: &mut Report,
) -> Option<BTreeMap<(usize, usize), Derived>> {
    let p = &manifest.protocol;
    let expected = members(p, runs, tokens);
    let names: Vec<&str> = expected.iter().map(|(n, _, _)| n.as_str()).collect();
    let found: Vec<&str> = archive.names().iter().map(String::as_str).collect();
    if found != names {
        let want: BTreeSet<&str> = names.iter().copied().collect();
        let have: BTreeSet<&str> = found.iter().copied().collect();
        let missing: Vec<&&str> = names.iter().filter(|n| !have.contains(*n)).collect();
        let extra: Vec<&&str> = found.iter().filter(|n| !want.contains(*n)).collect();
        for (what, list) in [
            ("is missing", &missing),
            ("has an unexpected array", &extra),
        ] {
            if let Some(first) = list.first() {
                report.fail(Problem::ArrayNames {
                    what,
                    first: first.to_string(),
                    more: list.len() - 1,
                });
            }
        }
        if missing.is_empty() && extra.is_empty() {
            let position = found.iter().zip(&names).position(|(a, b)| a != b);
            report.fail(Problem::ArrayNames {
                what: "holds its arrays out of order, first",
                first: position.map_or(String::new(), |i| found[i].to_string()),
                more: 0,
            });
        }
    }
    let generated = p.generate.map(|g| g.tokens);
    let mut ok = true;
    let mut derived = BTreeMap::new();
    for (i, &t) in tokens.iter().enumerate() {
        let ids = read::<i64>(archive, &format!("t{i}_ids"), t, report);
        if let Some(ids) = &ids {
            let recorded = &manifest.model.ids[&format!("t{i}")];
            if let Some(j) = (0..t).find(|&j| ids[j] != i64::from(recorded[j])) {
                report.fail(value_problem(
                    &format!("t{i}_ids"),
                    j,
                    ids[j].to_string(),
                    &format!("manifest.json model.ids.t{i}[{j}] = {}", recorded[j]),
                ));
            }
        }
        let f32_logp = read::<f64>(archive, &format!("t{i}_f32_logp"), t - 1, report);
        if let Some(v) = &f32_logp {
            check_logp(&format!("t{i}_f32_logp"), v, report);
        }
        let f32_argmax = read::<i64>(archive, &format!("t{i}_f32_argmax"), t - 1, report);
        if let Some(v) = &f32_argmax {
            check_ids(&format!("t{i}_f32_argmax"), v, report);
        }
        let f32_generated = match generated {
            Some(n) => {
                let v = read::<i64>(archive, &format!("t{i}_f32_generated"), n, report);
                if let Some(v) = &v {
                    check_ids(&format!("t{i}_f32_generated"), v, report);
                }
                v.map(Some)
            }
            None => Some(None),
        };
        for (r, run) in runs.iter().enumerate() {
            let id = run.id(i);
            let logp = read::<f64>(archive, &format!("{id}_logp"), t - 1, report);
            if let Some(v) = &logp {
                check_logp(&format!("{id}_logp"), v, report);
            }
            let kl = read::<f64>(archive, &format!("{id}_kl"), t - 1, report);
            if let Some(v) = &kl
                && let Some((j, x)) = v
                    .iter()
                    .enumerate()
                    .find(|(_, x)| !(x.is_finite() && **x >= -KL_SLACK))
            {
                report.fail(value_problem(
                    &format!("{id}_kl"),
                    j,
                    format!("{x:?}"),
                    "a finite KL >= 0 (-1e-12 allowed for rounding)",
                ));
            }
            let argmax = read::<i64>(archive, &format!("{id}_argmax"), t - 1, report);
            if let Some(v) = &argmax {
                check_ids(&format!("{id}_argmax"), v, report);
            }
            let row_generated = match generated {
                Some(n) => {
                    let v = read::<i64>(archive, &format!("{id}_generated"), n, report);
                    if let Some(v) = &v {
                        check_ids(&format!("{id}_generated"), v, report);
                    }
                    v.map(Some)
                }
                None => Some(None),
            };
            let (
                Some(f32_logp),
                Some(f32_argmax),
                Some(f32_generated),
                Some(logp),
                Some(kl),
                Some(argmax),
                Some(row_generated),
            ) = (
                &f32_logp,
                &f32_argmax,
                &f32_generated,
                logp,
                kl,
                argmax,
                row_generated,
            )
            else {
                ok = false;
                continue;
            };
            report.count(Checked::Positions, t - 1);
            let positions = (t - 1) as f64;
            let first_departure = match (f32_generated, &row_generated) {
                (Some(a), Some(b)) => a.iter().zip(b).position(|(x, y)| x != y),
                _ => None,
            };
            derived.insert(
                (i, r),
                Derived {
                    nll_f32: -f32_logp.iter().sum::<f64>() / positions,
                    nll: -logp.iter().sum::<f64>() / positions,
                    kl_mean: kl.iter().sum::<f64>() / positions,
                    kl_max: kl.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    top1_agreement: argmax
                        .iter()
                        .zip(f32_argmax)
                        .filter(|(a, b)| a == b)
                        .count() as f64
                        / positions,
                    bytes_per_token: match bytes::bytes_per_token(run, t) {
                        Ok(b) => b,
                        Err(reason) => {
                            report.fail(Problem::RerunFailed {
                                pass: id.clone(),
                                reason,
                            });
                            f64::NAN
                        }
                    },
                    first_departure,
                },
            );
            report.count(Checked::BytesPerToken, 1);
        }
    }
    ok.then_some(derived)
}
