//! Content checks of a packed-KV run: the expected comparisons, every array's dtype and shape,
//! every code's range and quantization bound, the recomputed reference and outputs, the metrics
//! and payloads in results.json, and the table in summary.json.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use ndarray::{Array1, Array2, ArrayView2};

use crate::arrays::{Arrays, expect_shape};
use crate::attention::{attention, relative_max_diff};
use crate::decoder::{Axis, Grid, code_at, decode};
use crate::model::{Protocol, ResultRow, Summary, comparison_id, input_id, read_json};
use crate::report::Report;

/// Recomputed attention outputs must agree with the archived ones to this relative precision.
pub const OUTPUT_TOLERANCE: f64 = 1e-12;
/// Recomputed metrics must agree with results.json to this relative precision.
pub const METRIC_TOLERANCE: f64 = 1e-12;
/// Slack on the |decoded - original| <= scale / 2 bound, in units of scale * qmax: x / scale is
/// rounded to f32 before rounding to a code, which can move it by up to qmax * 2^-24.
pub const BOUND_SLACK: f64 = 1.0 / (1u64 << 22) as f64;

/// The K and V axes every comparison of this study uses.
const K_AXIS: &str = "token";
const V_AXIS: &str = "feature";

struct ExpectedInput {
    id: String,
    seed: u64,
    tokens: usize,
    distribution: String,
}

pub fn check_study(dir: &Path, protocol: &Protocol, report: &mut Report) {
    if let Err(problem) = check_protocol(protocol) {
        report.fail(problem);
        return;
    }
    let inputs = expected_inputs(protocol);
    let rows = match read_json::<Vec<ResultRow>>(&dir.join("results.json")) {
        Ok(rows) => rows,
        Err(problem) => {
            report.fail(problem);
            return;
        }
    };
    let rows = check_rows(protocol, &inputs, rows, report);
    match Arrays::open(&dir.join("arrays.npz")) {
        Ok(mut arrays) => check_arrays(protocol, &inputs, &rows, &mut arrays, report),
        Err(problem) => report.fail(problem),
    }
    match read_json::<Summary>(&dir.join("summary.json")) {
        Ok(summary) => check_summary(protocol, &rows, &summary, report),
        Err(problem) => report.fail(problem),
    }
}

fn check_protocol(p: &Protocol) -> Result<(), String> {
    let sizes_ok = p.features > 0 && p.queries > 0 && p.tokens.iter().all(|&n| n > 0);
    let lists_ok = !(p.seeds.is_empty()
        || p.tokens.is_empty()
        || p.distributions.is_empty()
        || p.settings.is_empty());
    let settings_ok = p
        .settings
        .iter()
        .all(|s| s.group_size > 0 && matches!(s.bits, 4 | 8));
    let known = p
        .distributions
        .iter()
        .all(|d| matches!(d.as_str(), "clean" | "early_focus" | "recent_focus"));
    if sizes_ok && lists_ok && settings_ok && known {
        Ok(())
    } else {
        Err(
            "the manifest's protocol is not one this audit can check (empty list, zero size, \
             unknown distribution or unsupported bits)"
                .into(),
        )
    }
}

fn expected_inputs(p: &Protocol) -> Vec<ExpectedInput> {
    let mut inputs = Vec::new();
    for &seed in &p.seeds {
        for &tokens in &p.tokens {
            for distribution in &p.distributions {
                inputs.push(ExpectedInput {
                    id: input_id(seed, tokens, distribution),
                    seed,
                    tokens,
                    distribution: distribution.clone(),
                });
            }
        }
    }
    inputs
}

/// Checks the rows against the protocol and returns them by id (first occurrence).
fn check_rows(
    p: &Protocol,
    inputs: &[ExpectedInput],
    rows: Vec<ResultRow>,
    report: &mut Report,
) -> BTreeMap<String, ResultRow> {
    let expected_count = inputs.len() * p.settings.len();
    if rows.len() != expected_count {
        report.fail(format!(
            "results.json has {} rows, the protocol calls for {expected_count}",
            rows.len()
        ));
    }
    let mut by_id = BTreeMap::new();
    for row in rows {
        if by_id.contains_key(&row.id) {
            report.fail(format!("results.json lists {} more than once", row.id));
        } else {
            by_id.insert(row.id.clone(), row);
        }
    }
    let mut expected_ids = BTreeSet::new();
    for input in inputs {
        for setting in &p.settings {
            let id = comparison_id(&input.id, setting);
            match by_id.get(&id) {
                None => report.fail(format!("results.json is missing comparison {id}")),
                Some(row) => {
                    let consistent = row.input == input.id
                        && row.seed == input.seed
                        && row.tokens == input.tokens
                        && row.distribution == input.distribution
                        && row.group_size == setting.group_size
                        && row.bits == setting.bits
                        && row.features == p.features
                        && row.queries == p.queries
                        && row.k_axis == K_AXIS
                        && row.v_axis == V_AXIS;
                    if !consistent {
                        report.fail(format!(
                            "results.json row {id}: its descriptive fields do not match its id and the protocol"
                        ));
                    }
                }
            }
            expected_ids.insert(id);
        }
    }
    for id in by_id.keys().filter(|id| !expected_ids.contains(*id)) {
        report.fail(format!("results.json has an unexpected comparison {id}"));
    }
    report.count("result rows", by_id.len());
    by_id
}

fn check_arrays(
    p: &Protocol,
    inputs: &[ExpectedInput],
    rows: &BTreeMap<String, ResultRow>,
    arrays: &mut Arrays,
    report: &mut Report,
) {
    let mut expected_names = BTreeSet::new();
    for input in inputs {
        for part in ["q", "k", "v", "ref"] {
            expected_names.insert(format!("{}_{part}", input.id));
        }
        for setting in &p.settings {
            let id = comparison_id(&input.id, setting);
            for part in [
                "k_codes", "v_codes", "k_scales", "v_scales", "k_shape", "v_shape", "out",
            ] {
                expected_names.insert(format!("{id}_{part}"));
            }
        }
    }
    let present: BTreeSet<String> = arrays.names().iter().cloned().collect();
    for name in expected_names.difference(&present) {
        report.fail(format!("arrays.npz is missing {name}"));
    }
    for name in present.difference(&expected_names) {
        report.fail(format!("arrays.npz has an unexpected array {name}"));
    }

    let mut clean_draws = CleanDraws::new();
    for input in inputs {
        let Some(data) = load_input(p, input, arrays, report) else {
            continue;
        };
        check_focus(p, input, &data, &mut clean_draws, report);
        for setting in &p.settings {
            let id = comparison_id(&input.id, setting);
            let grid_k = Grid {
                tokens: input.tokens,
                features: p.features,
                group_size: setting.group_size,
                bits: setting.bits,
                axis: Axis::Token,
            };
            let grid_v = Grid {
                axis: Axis::Feature,
                ..grid_k
            };
            if let Err(problem) =
                check_comparison(&id, &data, grid_k, grid_v, rows.get(&id), arrays, report)
            {
                report.fail(problem);
            }
        }
    }
}

#[derive(Clone)]
struct InputData {
    q: Array2<f32>,
    k: Array2<f32>,
    v: Array2<f32>,
    reference: Array2<f64>,
}

fn load_input(
    p: &Protocol,
    input: &ExpectedInput,
    arrays: &mut Arrays,
    report: &mut Report,
) -> Option<InputData> {
    let id = &input.id;
    let loaded = (|| -> Result<InputData, String> {
        let q: Array2<f32> = arrays.matrix(&format!("{id}_q"))?;
        let k: Array2<f32> = arrays.matrix(&format!("{id}_k"))?;
        let v: Array2<f32> = arrays.matrix(&format!("{id}_v"))?;
        let reference: Array2<f64> = arrays.matrix(&format!("{id}_ref"))?;
        expect_shape(&format!("{id}_q"), q.shape(), &[p.queries, p.features])?;
        expect_shape(&format!("{id}_k"), k.shape(), &[input.tokens, p.features])?;
        expect_shape(&format!("{id}_v"), v.shape(), &[input.tokens, p.features])?;
        expect_shape(
            &format!("{id}_ref"),
            reference.shape(),
            &[p.queries, p.features],
        )?;
        if [&q, &k, &v]
            .iter()
            .any(|a| a.iter().any(|x| !x.is_finite()))
        {
            return Err(format!("input {id} holds a non-finite value"));
        }
        Ok(InputData { q, k, v, reference })
    })();
    let data = match loaded {
        Ok(data) => data,
        Err(problem) => {
            report.fail(problem);
            return None;
        }
    };
    let recomputed = attention(
        data.q.mapv(f64::from).view(),
        data.k.mapv(f64::from).view(),
        data.v.mapv(f64::from).view(),
    );
    let diff = relative_max_diff(&recomputed, &data.reference);
    if !within(diff, OUTPUT_TOLERANCE) {
        report.fail(format!(
            "{id}_ref differs from recomputed attention by {diff:.3e} (relative)"
        ));
    }
    report.count("inputs (reference attention recomputed)", 1);
    Some(data)
}

/// The focus distributions share q and v with the clean draw and differ from its k only in the
/// window, where k = clean k + gain * mean(q) in f32 (sequential sum over queries, then / count).
fn check_focus(
    p: &Protocol,
    input: &ExpectedInput,
    data: &InputData,
    clean: &mut CleanDraws,
    report: &mut Report,
) {
    let key = (input.seed, input.tokens);
    if input.distribution == "clean" {
        clean.insert(key, data.clone());
        return;
    }
    let Some(InputData { q, k, v, .. }) = clean.get(&key) else {
        report.note(format!(
            "{}: no clean draw precedes it, so its focus shift was not checked",
            input.id
        ));
        return;
    };
    if data.q != *q || data.v != *v {
        report.fail(format!("{}: q or v differs from the clean draw", input.id));
        return;
    }
    let mut mean = Array1::<f32>::zeros(p.features);
    for row in q.outer_iter() {
        mean.zip_mut_with(&row, |m, x| *m += x);
    }
    mean.mapv_inplace(|m| m / p.queries as f32);
    let window = match input.distribution.as_str() {
        "early_focus" => 0..p.focus.window.min(input.tokens),
        _ => input.tokens.saturating_sub(p.focus.window)..input.tokens,
    };
    for t in 0..input.tokens {
        for f in 0..p.features {
            let expected = if window.contains(&t) {
                k[[t, f]] + p.focus.gain * mean[f]
            } else {
                k[[t, f]]
            };
            if data.k[[t, f]].to_bits() != expected.to_bits() {
                report.fail(format!(
                    "{}_k[{t}, {f}] is {}, but the clean draw and the focus rule give {expected}",
                    input.id,
                    data.k[[t, f]]
                ));
                return;
            }
        }
    }
    report.count("focus shifts (against the clean draw)", 1);
}

/// Clean draws by (seed, tokens), for checking the focus distributions against them.
type CleanDraws = BTreeMap<(u64, usize), InputData>;

struct Tensor {
    codes: Array1<u8>,
    scales: Array2<f32>,
    decoded: Array2<f64>,
}

#[allow(clippy::too_many_arguments)]
fn check_comparison(
    id: &str,
    data: &InputData,
    grid_k: Grid,
    grid_v: Grid,
    row: Option<&ResultRow>,
    arrays: &mut Arrays,
    report: &mut Report,
) -> Result<(), String> {
    let k = check_tensor(id, "k", grid_k, data.k.view(), arrays, report)?;
    let v = check_tensor(id, "v", grid_v, data.v.view(), arrays, report)?;
    let out: Array2<f64> = arrays.matrix(&format!("{id}_out"))?;
    expect_shape(&format!("{id}_out"), out.shape(), data.reference.shape())?;
    let recomputed = attention(
        data.q.mapv(f64::from).view(),
        k.decoded.view(),
        v.decoded.view(),
    );
    let diff = relative_max_diff(&recomputed, &out);
    if !within(diff, OUTPUT_TOLERANCE) {
        report.fail(format!(
            "{id}_out differs from attention over the decoded codes by {diff:.3e} (relative)"
        ));
    }
    report.count("comparisons (outputs recomputed from decoded codes)", 1);

    let Some(row) = row else { return Ok(()) };
    let relative_l2 = frobenius(&out - &data.reference) / frobenius(data.reference.clone());
    let max_abs = (&out - &data.reference)
        .iter()
        .fold(0.0f64, |m, x| m.max(x.abs()));
    for (name, recorded, actual) in [
        ("relative_l2", row.relative_l2, relative_l2),
        ("max_abs", row.max_abs, max_abs),
    ] {
        if !within((recorded - actual).abs(), METRIC_TOLERANCE * actual.abs()) {
            report.fail(format!(
                "results.json {id}: {name} is {recorded}, recomputed {actual}"
            ));
        }
    }
    let payload = |t: &Tensor| t.codes.len() + 4 * t.scales.len() + 8;
    let bytes = [
        ("k_payload_bytes", row.k_payload_bytes, payload(&k)),
        ("v_payload_bytes", row.v_payload_bytes, payload(&v)),
        (
            "payload_bytes",
            row.payload_bytes,
            payload(&k) + payload(&v),
        ),
        ("baseline_bytes", row.baseline_bytes, 2 * 4 * data.k.len()),
    ];
    for (name, recorded, actual) in bytes {
        if recorded != actual {
            report.fail(format!(
                "results.json {id}: {name} is {recorded}, recomputed {actual}"
            ));
        }
    }
    Ok(())
}

/// `value <= bound`, false for NaN: a NaN never passes a check.
fn within(value: f64, bound: f64) -> bool {
    value <= bound
}

fn frobenius(a: Array2<f64>) -> f64 {
    a.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// Loads one packed tensor, checks its layout, codes, padding, scales and quantization bound,
/// and decodes it.
fn check_tensor(
    id: &str,
    which: &str,
    grid: Grid,
    original: ArrayView2<f32>,
    arrays: &mut Arrays,
    report: &mut Report,
) -> Result<Tensor, String> {
    let name = format!("{id}_{which}");
    let codes: Array1<u8> = arrays.vector(&format!("{name}_codes"))?;
    let scales: Array2<f32> = arrays.matrix(&format!("{name}_scales"))?;
    let shape: Array1<i32> = arrays.vector(&format!("{name}_shape"))?;
    let logical = [grid.tokens as i32, grid.features as i32];
    if shape.as_slice() != Some(&logical[..]) {
        return Err(format!("{name}_shape is {shape}, expected {logical:?}"));
    }
    expect_shape(
        &format!("{name}_codes"),
        codes.shape(),
        &[grid.stream_bytes()],
    )?;
    let (rows, _, groups) = grid.view();
    expect_shape(&format!("{name}_scales"), scales.shape(), &[rows, groups])?;
    let stream = codes
        .as_slice()
        .expect("a freshly read array is contiguous");

    let max_stored = 2 * grid.qmax();
    let qmax = grid.qmax();
    let mut out_of_range = Vec::new();
    let mut bad_padding = 0usize;
    for p in 0..grid.positions() {
        let code = code_at(stream, grid.bits, p);
        if code > max_stored {
            out_of_range.push((p, code));
        } else if grid.is_padding(p) && code != qmax {
            bad_padding += 1;
        }
    }
    if grid.bits == 4 && grid.positions() % 2 == 1 && stream[stream.len() - 1] >> 4 != 0 {
        bad_padding += 1;
    }
    if let Some((p, code)) = out_of_range.first() {
        report.fail(format!(
            "{name}_codes: {} codes exceed the {}-bit maximum {max_stored}; first {code} at stream position {p}",
            out_of_range.len(),
            grid.bits
        ));
    }
    if bad_padding > 0 {
        report.fail(format!(
            "{name}_codes: {bad_padding} padding positions do not hold the zero code {qmax} (or a zero pad nibble)"
        ));
    }
    report.count("codes (range, padding and bound)", grid.positions());

    check_scales(&name, grid, original, &scales, report);
    let decoded = decode(&grid, stream, scales.view());
    let mut over = 0usize;
    let mut first = None;
    for ((t, f), &x) in original.indexed_iter() {
        let (_, s) = grid.locate(t, f);
        let scale = f64::from(scales[s]);
        let err = (decoded[[t, f]] - f64::from(x)).abs();
        if !within(err, scale * (0.5 + f64::from(qmax) * BOUND_SLACK)) {
            over += 1;
            first.get_or_insert((t, f, err, scale / 2.0));
        }
    }
    if let Some((t, f, err, half)) = first {
        report.fail(format!(
            "{name}: {over} decoded elements exceed scale/2 from the original; first [{t}, {f}]: {err:.6e} > {half:.6e}"
        ));
    }
    Ok(Tensor {
        codes,
        scales,
        decoded,
    })
}

/// Each scale must be max|x| over its group of the original, divided by qmax in f32, or 1.0 for
/// an all-zero group.
fn check_scales(
    name: &str,
    grid: Grid,
    original: ArrayView2<f32>,
    scales: &Array2<f32>,
    report: &mut Report,
) {
    let mut amax = Array2::<f32>::zeros(scales.raw_dim());
    for ((t, f), &x) in original.indexed_iter() {
        let (_, s) = grid.locate(t, f);
        amax[s] = amax[s].max(x.abs());
    }
    let qmax = f32::from(grid.qmax());
    let wrong = amax
        .indexed_iter()
        .filter(|&((r, g), &m)| {
            let expected = if m == 0.0 { 1.0 } else { m / qmax };
            scales[[r, g]].to_bits() != expected.to_bits()
        })
        .map(|(index, _)| index)
        .collect::<Vec<_>>();
    if let Some(&(r, g)) = wrong.first() {
        report.fail(format!(
            "{name}_scales: {} scales are not max|x| / {qmax} of their group; first [{r}, {g}] is {}",
            wrong.len(),
            scales[[r, g]]
        ));
    }
    report.count("scales (recomputed from the inputs)", scales.len());
}

fn check_summary(
    p: &Protocol,
    rows: &BTreeMap<String, ResultRow>,
    summary: &Summary,
    report: &mut Report,
) {
    if summary.rows.len() != p.settings.len() {
        report.fail(format!(
            "summary.json has {} rows, the protocol has {} settings",
            summary.rows.len(),
            p.settings.len()
        ));
    }
    for &n in &p.tokens {
        let expected = 2 * 4 * n * p.features;
        if summary.float32_kv_bytes.get(&n.to_string()) != Some(&expected) {
            report.fail(format!(
                "summary.json float32_kv_bytes at N={n} is not {expected}"
            ));
        }
    }
    for (setting, srow) in p.settings.iter().zip(&summary.rows) {
        let label = format!("summary.json g{} b{}", setting.group_size, setting.bits);
        if (srow.group_size, srow.bits) != (setting.group_size, setting.bits) {
            report.fail(format!(
                "{label}: row is for g{} b{}",
                srow.group_size, srow.bits
            ));
            continue;
        }
        let mine: Vec<&ResultRow> = rows
            .values()
            .filter(|r| r.group_size == setting.group_size && r.bits == setting.bits)
            .collect();
        let clean: Vec<f64> = mine
            .iter()
            .filter(|r| r.distribution == "clean")
            .map(|r| r.relative_l2)
            .collect();
        let mean = (!clean.is_empty()).then(|| clean.iter().sum::<f64>() / clean.len() as f64);
        let mean_ok = match (srow.mean_relative_l2_clean, mean) {
            (Some(a), Some(b)) => (a - b).abs() <= METRIC_TOLERANCE * b.abs(),
            (None, None) => true,
            _ => false,
        };
        let percent_ok = srow.mean_relative_l2_clean_percent
            == srow
                .mean_relative_l2_clean
                .map(|m| format!("{:.3}", m * 100.0));
        if !mean_ok || !percent_ok || srow.clean_inputs != clean.len() {
            report.fail(format!(
                "{label}: the clean mean does not match the results ({:?} recorded, {mean:?} recomputed)",
                srow.mean_relative_l2_clean
            ));
        }
        for &n in &p.tokens {
            let expected = mine.iter().find(|r| r.tokens == n).map(|r| r.payload_bytes);
            if srow.payload_bytes.get(&n.to_string()).copied() != expected {
                report.fail(format!(
                    "{label}: payload at N={n} does not match the results"
                ));
            }
        }
    }
    report.count("summary rows", summary.rows.len());
}
