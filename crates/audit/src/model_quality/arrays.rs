//! arrays.npz of a model-quality run: exactly the members the format lists, in order, each of
//! its dtype and shape; `t{i}_ids` the manifest's ids; every log-prob finite and <= 0, every KL
//! finite and >= 0 (within [`KL_SLACK`]), every argmax and generated id below the vocabulary; and
//! what each row (text x run) derives from them.
//!
//! With a calibration text (KVQuant), first `calibration_ids` (int64 `[C]`, 1 <= C <= 2048, more
//! than any scheme's first tokens, ids below the vocabulary), then per KVQuant scheme in the
//! order runs first name it `calibration_<scheme>_key_upper` and `_key_lower` (float32 [layers,
//! W]: each a finite fp16 value widened, lower <= upper) and `_key_levels` and `_value_levels`
//! (float32 [layers, 2^bits]: ascending, within [-1, 1], as k-means of values in [-1, 1] are);
//! and for a KVQuant row, after `<id>_argmax`, `<id>_outliers` (int64 `[layers]`: 0 to the values
//! its quantized rows hold, 2 (T - F) W), from which with the shape its bytes per token derive
//! ([`bytes::kvquant_bytes`]). The re-run ([`super::rerun`]) holds all of them bit for bit.

use std::collections::{BTreeMap, BTreeSet};

use half::f16;

use super::bytes;
use super::geometry::Geometry;
use super::manifest::QualityManifest;
use super::protocol::{CALIBRATION_TOKENS, QualityProtocol, Run};
use super::schemes::kvquant;
use crate::common::npz::{self, Archive, Element};
use crate::common::report::{Checked, Problem, Report};

/// How far below zero a KL value may be (rounding).
pub const KL_SLACK: f64 = 1e-12;

/// What the audit derives for one row (text x run) from the arrays.
#[derive(Debug, Clone, PartialEq)]
pub struct Derived {
    /// NLL of the float32 cache.
    pub nll_f32: f64,
    /// NLL of the packed cache.
    pub nll: f64,
    /// Mean KL.
    pub kl_mean: f64,
    /// Largest KL.
    pub kl_max: f64,
    /// KL per position, as archived (held bit for bit to the re-run where the models run).
    pub kl: Vec<f64>,
    /// Top-1 agreement.
    pub top1_agreement: f64,
    /// Bytes per token.
    pub bytes_per_token: f64,
    /// First departure (when generating).
    pub first_departure: Option<usize>,
}

/// The name prefix of a KVQuant scheme's calibration arrays: `calibration_<scheme>`.
pub fn calibration_prefix((bits, first): (u32, usize)) -> String {
    format!("calibration_{}", kvquant::name(bits, first))
}

/// The four arrays of one KVQuant scheme's calibration, in order, after the prefix.
pub const CALIBRATION_ARRAYS: [&str; 4] = ["key_upper", "key_lower", "key_levels", "value_levels"];

/// The archive members a run of `p` writes, in order, with their dtype and shape;
/// `calibration_ids` is the archived length C of `calibration_ids` (which only the model can
/// re-derive), read when the protocol has a calibration.
pub fn members(
    p: &QualityProtocol,
    runs: &[Run],
    tokens: &[usize],
    calibration_ids: usize,
) -> Vec<(String, npz::Dtype, Vec<usize>)> {
    use npz::Dtype::{F32, F64, I64};
    let generated = p.generate.map(|g| g.tokens);
    let (layers, width) = (p.geometry().layers, p.geometry().width());
    let mut out = Vec::new();
    if p.calibration.is_some() {
        out.push(("calibration_ids".to_string(), I64, vec![calibration_ids]));
        for scheme in QualityProtocol::kvquant_schemes(runs) {
            let prefix = calibration_prefix(scheme);
            let levels = 1usize << scheme.0;
            for (name, width) in CALIBRATION_ARRAYS
                .iter()
                .zip([width, width, levels, levels])
            {
                out.push((format!("{prefix}_{name}"), F32, vec![layers, width]));
            }
        }
    }
    for (i, &t) in tokens.iter().enumerate() {
        out.push((format!("t{i}_ids"), I64, vec![t]));
        out.push((format!("t{i}_f32_logp"), F64, vec![t - 1]));
        out.push((format!("t{i}_f32_argmax"), I64, vec![t - 1]));
        if let Some(n) = generated {
            out.push((format!("t{i}_f32_generated"), I64, vec![n]));
        }
        if p.mechanisms {
            let kv_heads = p.geometry().kv_heads;
            out.push((super::mechanisms::member(i), F64, vec![layers, kv_heads, 4]));
        }
    }
    for (i, &t) in tokens.iter().enumerate() {
        for run in runs {
            let id = run.id(i);
            out.push((format!("{id}_logp"), F64, vec![t - 1]));
            out.push((format!("{id}_kl"), F64, vec![t - 1]));
            out.push((format!("{id}_argmax"), I64, vec![t - 1]));
            if run.kvquant().is_some() {
                out.push((format!("{id}_outliers"), I64, vec![layers]));
            }
            if let Some(n) = generated {
                out.push((format!("{id}_generated"), I64, vec![n]));
            }
        }
    }
    for (name, shape) in super::attention::members(p, runs, tokens.len()) {
        out.push((name, F64, shape));
    }
    for (name, float, t) in super::protocol::sensitivity_members(p, runs, tokens.len()) {
        let n = tokens.get(t).map_or(0, |t| t - 1);
        out.push((name, if float { F64 } else { I64 }, vec![n]));
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
    read_shaped(archive, name, &[len], report)
}

/// [`read`] of any shape.
fn read_shaped<T: Element>(
    archive: &Archive,
    name: &str,
    shape: &[usize],
    report: &mut Report,
) -> Option<Vec<T>> {
    match archive.values::<T>(name, shape) {
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
fn check_ids(g: &Geometry, name: &str, values: &[i64], report: &mut Report) {
    let vocabulary = i64::from(g.vocabulary);
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

/// The length of `calibration_ids` as archived (0 if absent or not one-dimensional; its shape
/// is then reported when it is read).
fn archived_calibration_ids(archive: &Archive) -> usize {
    match archive.info("calibration_ids").map(|i| i.shape.as_slice()) {
        Some(&[n]) => n,
        _ => 0,
    }
}

/// `calibration_ids` and every KVQuant scheme's calibration arrays, read and held to their
/// ranges (module docs).
fn check_calibration(p: &QualityProtocol, runs: &[Run], archive: &Archive, report: &mut Report) {
    if p.calibration.is_none() {
        return;
    }
    let schemes = QualityProtocol::kvquant_schemes(runs);
    let c = archived_calibration_ids(archive);
    if let Some(ids) = read::<i64>(archive, "calibration_ids", c, report) {
        check_ids(&p.geometry(), "calibration_ids", &ids, report);
        let first = schemes.iter().map(|s| s.1).max().unwrap_or(0);
        if !(first + 1..=CALIBRATION_TOKENS).contains(&c) {
            report.fail(value_problem(
                "calibration_ids",
                c,
                format!("{c} ids"),
                &format!(
                    "{} to {CALIBRATION_TOKENS} ids (more than the {first} first tokens a \
                     scheme keeps in fp16)",
                    first + 1
                ),
            ));
        }
        report.count(Checked::CalibrationValues, ids.len());
    }
    let (layers, width) = (p.geometry().layers, p.geometry().width());
    for scheme in schemes {
        let prefix = calibration_prefix(scheme);
        let upper = read_shaped::<f32>(
            archive,
            &format!("{prefix}_key_upper"),
            &[layers, width],
            report,
        );
        let lower = read_shaped::<f32>(
            archive,
            &format!("{prefix}_key_lower"),
            &[layers, width],
            report,
        );
        for (side, values) in [("key_upper", &upper), ("key_lower", &lower)] {
            let Some(values) = values else { continue };
            let fp16 =
                |x: &f32| x.is_finite() && f16::from_f32(*x).to_f32().to_bits() == x.to_bits();
            if let Some((j, x)) = values.iter().enumerate().find(|(_, x)| !fp16(x)) {
                report.fail(value_problem(
                    &format!("{prefix}_{side}"),
                    j,
                    format!("{x:?}"),
                    "a finite fp16 threshold, widened to float32",
                ));
            }
            report.count(Checked::CalibrationValues, values.len());
        }
        if let (Some(upper), Some(lower)) = (&upper, &lower)
            && let Some(j) = (0..upper.len()).find(|&j| lower[j] > upper[j])
        {
            report.fail(value_problem(
                &format!("{prefix}_key_lower"),
                j,
                format!("{:?}", lower[j]),
                &format!(
                    "at most {:?}, the channel's upper threshold (the 0.005 percentile is not \
                     above the 0.995)",
                    upper[j]
                ),
            ));
        }
        let levels = 1usize << scheme.0;
        for side in ["key_levels", "value_levels"] {
            let name = format!("{prefix}_{side}");
            let Some(values) = read_shaped::<f32>(archive, &name, &[layers, levels], report) else {
                continue;
            };
            let bad = values.chunks(levels).enumerate().find_map(|(l, table)| {
                let at = table.iter().enumerate().position(|(i, x)| {
                    !((-1.0..=1.0).contains(x) && (i == 0 || table[i - 1] <= *x))
                })?;
                Some(l * levels + at)
            });
            if let Some(j) = bad {
                report.fail(value_problem(
                    &name,
                    j,
                    format!("{:?}", values[j]),
                    &format!(
                        "{levels} levels per layer, ascending, within [-1, 1] (k-means of \
                         normalized values in [-1, 1])"
                    ),
                ));
            }
            report.count(Checked::CalibrationValues, values.len());
        }
    }
}

/// A KVQuant row's outlier counts, read and held to 0 ..= 2 (T - F) W per layer.
fn read_outliers(
    g: &Geometry,
    id: &str,
    first: usize,
    tokens: usize,
    archive: &Archive,
    report: &mut Report,
) -> Option<Vec<i64>> {
    let name = format!("{id}_outliers");
    let counts = read::<i64>(archive, &name, g.layers, report)?;
    let most = 2 * tokens.saturating_sub(first) as u128 * g.width() as u128;
    if let Some((j, n)) = counts
        .iter()
        .enumerate()
        .find(|(_, n)| u128::try_from(**n).map_or(true, |n| n > most))
    {
        report.fail(value_problem(
            &name,
            j,
            n.to_string(),
            &format!(
                "an outlier count from 0 to {most}, the values of the layer's {} quantized \
                 rows of K and of V",
                tokens.saturating_sub(first)
            ),
        ));
        return None;
    }
    report.count(Checked::OutlierCounts, counts.len());
    Some(counts)
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
    let g = p.geometry();
    let expected = members(p, runs, tokens, archived_calibration_ids(archive));
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
    check_calibration(p, runs, archive, report);
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
            check_ids(&g, &format!("t{i}_f32_argmax"), v, report);
        }
        let f32_generated = match generated {
            Some(n) => {
                let v = read::<i64>(archive, &format!("t{i}_f32_generated"), n, report);
                if let Some(v) = &v {
                    check_ids(&g, &format!("t{i}_f32_generated"), v, report);
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
                check_ids(&g, &format!("{id}_argmax"), v, report);
            }
            // A KVQuant row's bytes need its outlier counts; any other row's need none.
            let bytes = match run.kvquant() {
                Some(scheme) => read_outliers(&g, &id, scheme.1, t, archive, report)
                    .map(|counts| bytes::kvquant_bytes_per_token(scheme, &g, t, &counts)),
                None => Some(bytes::bytes_per_token(run, &g, t)),
            };
            let row_generated = match generated {
                Some(n) => {
                    let v = read::<i64>(archive, &format!("{id}_generated"), n, report);
                    if let Some(v) = &v {
                        check_ids(&g, &format!("{id}_generated"), v, report);
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
                Some(bytes),
            ) = (
                &f32_logp,
                &f32_argmax,
                &f32_generated,
                logp,
                kl,
                argmax,
                row_generated,
                bytes,
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
                    kl: kl.to_vec(),
                    top1_agreement: argmax
                        .iter()
                        .zip(f32_argmax)
                        .filter(|(a, b)| a == b)
                        .count() as f64
                        / positions,
                    bytes_per_token: match bytes {
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

#[cfg(test)]
mod tests {
    use ndarray::{Array1, Array2};

    use super::*;

    fn protocol() -> (QualityProtocol, Vec<Run>) {
        let p: QualityProtocol = serde_json::from_value(serde_json::json!({
            "study": "s", "model": "smollm2",
            "texts": [ { "name": "a", "text": "Some words." } ],
            "max_tokens": 8,
            "runs": [
                { "scheme": "kvquant4-first1", "schedule": "prefill" },
                { "scheme": "kivi2", "schedule": "prefill" },
                { "scheme": "kvquant4-first1", "schedule": "streaming" },
                { "scheme": "kvquant3", "schedule": "prefill" }
            ],
            "generate": { "prompt_tokens": 1, "tokens": 2 },
            "calibration": { "name": "c", "text": "Other prose." }
        }))
        .unwrap();
        let runs = p.validate().unwrap();
        (p, runs)
    }

    #[test]
    fn members_put_the_calibration_first_and_outliers_after_argmax() {
        use npz::Dtype::{F32, F64, I64};
        let (p, runs) = protocol();
        let listed = members(&p, &runs, &[5], 7);
        let shown: Vec<(&str, npz::Dtype, &[usize])> = listed
            .iter()
            .map(|(n, d, s)| (n.as_str(), *d, s.as_slice()))
            .collect();
        let row = |id: &'static str, outliers: bool| {
            let mut out = vec![
                (format!("{id}_logp"), F64, vec![4]),
                (format!("{id}_kl"), F64, vec![4]),
                (format!("{id}_argmax"), I64, vec![4]),
            ];
            if outliers {
                out.push((format!("{id}_outliers"), I64, vec![30]));
            }
            out.push((format!("{id}_generated"), I64, vec![2]));
            out
        };
        let mut expected: Vec<(String, npz::Dtype, Vec<usize>)> =
            vec![("calibration_ids".into(), I64, vec![7])];
        for (scheme, levels) in [("kvquant4-first1", 16), ("kvquant3", 8)] {
            for (name, width) in [
                ("key_upper", 192),
                ("key_lower", 192),
                ("key_levels", levels),
                ("value_levels", levels),
            ] {
                expected.push((format!("calibration_{scheme}_{name}"), F32, vec![30, width]));
            }
        }
        expected.extend([
            ("t0_ids".into(), I64, vec![5]),
            ("t0_f32_logp".into(), F64, vec![4]),
            ("t0_f32_argmax".into(), I64, vec![4]),
            ("t0_f32_generated".into(), I64, vec![2]),
        ]);
        expected.extend(row("t0_kvquant4-first1_prefill", true));
        expected.extend(row("t0_kivi2_prefill", false));
        expected.extend(row("t0_kvquant4-first1_streaming", true));
        expected.extend(row("t0_kvquant3_prefill", true));
        let expected: Vec<(&str, npz::Dtype, &[usize])> = expected
            .iter()
            .map(|(n, d, s)| (n.as_str(), *d, s.as_slice()))
            .collect();
        assert_eq!(shown, expected);
        // Without a calibration text, none of it.
        let mut plain = p.clone();
        plain.calibration = None;
        plain.runs.retain(|r| r.scheme.as_deref() == Some("kivi2"));
        let runs = plain.validate().unwrap();
        assert!(
            members(&plain, &runs, &[5], 0)
                .iter()
                .all(|(n, _, _)| !n.contains("calibration") && !n.ends_with("_outliers"))
        );
    }

    /// A scheme's four calibration arrays, honest: thresholds fp16 values, levels ascending.
    struct Tables {
        upper: Array2<f32>,
        lower: Array2<f32>,
        key_levels: Array2<f32>,
        value_levels: Array2<f32>,
    }

    fn tables(levels: usize) -> Tables {
        let ascending = Array2::from_shape_fn((30, levels), |(_, i)| {
            -1.0 + 2.0 * i as f32 / (levels - 1) as f32
        });
        Tables {
            upper: Array2::from_shape_fn((30, 192), |(l, c)| 1.5 + (l + c) as f32 / 8.0),
            lower: Array2::from_shape_fn((30, 192), |(l, c)| -0.5 - ((l * c) % 64) as f32 / 4.0),
            key_levels: ascending.clone(),
            value_levels: ascending,
        }
    }

    fn archive(ids: &[i64], schemes: &[(&str, &Tables)], outliers: &[i64]) -> Archive {
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .last_modified_time(zip::DateTime::default());
        let mut w =
            ndarray_npy::NpzWriter::new_with_options(std::io::Cursor::new(Vec::new()), options);
        w.add_array("calibration_ids", &Array1::from(ids.to_vec()))
            .unwrap();
        for (scheme, t) in schemes {
            for (name, a) in [
                ("key_upper", &t.upper),
                ("key_lower", &t.lower),
                ("key_levels", &t.key_levels),
                ("value_levels", &t.value_levels),
            ] {
                w.add_array(format!("calibration_{scheme}_{name}"), a)
                    .unwrap();
            }
        }
        w.add_array("row_outliers", &Array1::from(outliers.to_vec()))
            .unwrap();
        Archive::new(w.finish().unwrap().into_inner()).unwrap()
    }

    /// The problems a calibration and one row of kvquant4-first1's outliers at T tokens give.
    fn problems(
        ids: &[i64],
        four: &Tables,
        three: &Tables,
        outliers: &[i64],
        t: usize,
    ) -> Vec<Problem> {
        let (p, runs) = protocol();
        let a = archive(
            ids,
            &[("kvquant4-first1", four), ("kvquant3", three)],
            outliers,
        );
        let mut report = Report::new(String::new());
        check_calibration(&p, &runs, &a, &mut report);
        let g = Geometry::named("smollm2").unwrap();
        let counts = read_outliers(&g, "row", 1, t, &a, &mut report);
        assert_eq!(
            counts.is_some(),
            !report
                .problems
                .iter()
                .any(|p| matches!(p, Problem::Value { array, .. } if array == "row_outliers"))
        );
        report.problems
    }

    fn flagged(problems: &[Problem]) -> Vec<(String, usize)> {
        problems
            .iter()
            .map(|p| match p {
                Problem::Value { array, index, .. } => (array.clone(), *index),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn calibration_arrays_and_outlier_counts_are_range_checked() {
        let (four, three) = (tables(16), tables(8));
        let mut outliers = vec![0i64; 30];
        // At T = 10 with 1 first token: 9 quantized rows of 192 values per side.
        outliers[29] = 2 * 9 * 192;
        assert!(problems(&[0, 49_151, 3], &four, &three, &outliers, 10).is_empty());
        let mut report = Report::new(String::new());
        let (p, runs) = protocol();
        check_calibration(
            &p,
            &runs,
            &archive(
                &[1, 2],
                &[("kvquant4-first1", &four), ("kvquant3", &three)],
                &outliers,
            ),
            &mut report,
        );
        assert_eq!(
            report.counted(Checked::CalibrationValues),
            2 + 2 * (2 * 30 * 192) + 2 * 30 * 16 + 2 * 30 * 8
        );

        let mut bad_outliers = outliers.clone();
        bad_outliers[3] = -1;
        bad_outliers[29] += 1;
        assert_eq!(
            flagged(&problems(&[0, 49_152, 3], &four, &three, &bad_outliers, 10)),
            [("calibration_ids".into(), 1), ("row_outliers".into(), 3)]
        );
        // One id is fewer than first tokens + 1.
        assert_eq!(
            flagged(&problems(&[0], &four, &three, &outliers[..], 10))
                .first()
                .cloned(),
            Some(("calibration_ids".into(), 1))
        );
        assert_eq!(
            flagged(&problems(&[0, 1], &four, &three, &outliers, 9)),
            [("row_outliers".into(), 29)]
        );

        let mut forged = tables(16);
        forged.upper[[0, 5]] = 0.1; // not an fp16 value
        forged.lower[[1, 7]] = 40.0; // above its upper threshold
        forged.key_levels[[2, 3]] = forged.key_levels[[2, 2]] - 0.01; // not ascending
        let mut three_forged = tables(8);
        three_forged.value_levels[[0, 7]] = 1.5; // beyond [-1, 1]
        three_forged.lower[[0, 0]] = -70_000.0; // beyond fp16
        assert_eq!(
            flagged(&problems(&[0, 1], &forged, &three_forged, &outliers, 10)),
            [
                ("calibration_kvquant4-first1_key_upper".into(), 5),
                ("calibration_kvquant4-first1_key_lower".into(), 192 + 7),
                ("calibration_kvquant4-first1_key_levels".into(), 2 * 16 + 3),
                ("calibration_kvquant3_key_lower".into(), 0),
                ("calibration_kvquant3_value_levels".into(), 7),
            ]
        );
    }
}
