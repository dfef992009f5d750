//! Content checks of a run: the expected comparisons (packed-KV settings and budget policies),
//! every array's dtype and shape, every segment's codes, range, padding, scales and quantization
//! bound, float32 segments equal to the input, the recomputed reference and outputs, the metrics
//! and payloads in results.json, the tables in summary.json, and the form of timings.json.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use ndarray::{Array1, Array2, ArrayView2, Axis as NdAxis, s};

use crate::arrays::{Arrays, expect_shape};
use crate::attention::{attention, relative_max_diff};
use crate::decoder::{Axis, Grid, Mode, code_at, decode, offsets, tail_is_clear};
use crate::model::{
    Protocol, ResultRow, SegmentRow, Summary, Timings, budget_id, comparison_id, input_id,
    read_json, setting_label,
};
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
const OPERATIONS: [&str; 5] = ["encode_k", "encode_v", "decode_k", "decode_v", "attention"];

struct ExpectedInput {
    id: String,
    seed: u64,
    tokens: usize,
    distribution: String,
}

/// A comparison the protocol calls for, derived here from the protocol alone.
struct Expected {
    id: String,
    input: usize,
    study: &'static str,
    group_size: usize,
    bits: u32,
    /// As results.json records it: absent for symmetric.
    mode: Option<String>,
    policy: Option<String>,
    window: Option<usize>,
    segments: Vec<SegmentRow>,
    /// Budget comparisons name their arrays with a `_s<index>` suffix per segment.
    suffixed: bool,
}

impl Expected {
    /// Configuration label used by the tables: `g8_b4`, `g32_b2_asym` or the policy name.
    fn config(&self) -> String {
        let suffix = if self.mode.is_some() { "_asym" } else { "" };
        self.policy
            .clone()
            .unwrap_or_else(|| format!("g{}_b{}{suffix}", self.group_size, self.bits))
    }
}

pub fn check_study(dir: &Path, protocol: &Protocol, report: &mut Report) {
    if let Err(problem) = check_protocol(protocol) {
        report.fail(problem);
        return;
    }
    let inputs = expected_inputs(protocol);
    let expected = expected_comparisons(protocol, &inputs);
    let rows = match read_json::<Vec<ResultRow>>(&dir.join("results.json")) {
        Ok(rows) => rows,
        Err(problem) => {
            report.fail(problem);
            return;
        }
    };
    let rows = check_rows(protocol, &inputs, &expected, rows, report);
    match Arrays::open(&dir.join("arrays.npz")) {
        Ok(mut arrays) => check_arrays(protocol, &inputs, &expected, &rows, &mut arrays, report),
        Err(problem) => report.fail(problem),
    }
    let timings =
        protocol.timing.and_then(
            |timing| match read_json::<Timings>(&dir.join("timings.json")) {
                Ok(timings) => {
                    check_timings(&timing, &expected, &timings, report);
                    Some(timings)
                }
                Err(problem) => {
                    report.fail(problem);
                    None
                }
            },
        );
    match read_json::<Summary>(&dir.join("summary.json")) {
        Ok(summary) => {
            check_summary(protocol, &expected, &rows, &summary, report);
            check_timing_medians(&inputs, &expected, timings.as_ref(), &summary, report);
            check_report_files(dir, &summary, report);
        }
        Err(problem) => report.fail(problem),
    }
}

fn check_protocol(p: &Protocol) -> Result<(), String> {
    // The runner refuses matrices over 2^27 elements; a manifest asking for more is not a run
    // (and the audit's own arithmetic on its sizes must not overflow).
    let fits = |rows: usize| rows.checked_mul(p.features).is_some_and(|e| e <= 1 << 27);
    let sizes_ok = p.features > 0
        && p.queries > 0
        && fits(p.queries)
        && p.tokens.iter().all(|&n| n > 0 && fits(n));
    let lists_ok = !(p.seeds.is_empty()
        || p.tokens.is_empty()
        || p.distributions.is_empty()
        || p.settings.is_empty());
    let settings_ok = p.settings.iter().all(|s| {
        s.group_size > 0 && Mode::parse(s.mode.as_deref()).is_some_and(|m| m.supports(s.bits))
    });
    let known = p
        .distributions
        .iter()
        .all(|d| matches!(d.as_str(), "clean" | "early_focus" | "recent_focus"));
    let shortest = p.tokens.iter().copied().min().unwrap_or(0);
    let budget_ok = p.budget.as_ref().is_none_or(|b| {
        b.group_size > 0
            && Mode::Symmetric.supports(b.low_bits)
            && (1..=shortest).contains(&b.window)
            && !b.policies.is_empty()
            && b.policies
                .iter()
                .all(|policy| policy_segments(policy, shortest, b.window, b.low_bits).is_some())
    });
    let timing_ok = p.timing.is_none_or(|t| t.repeats > 0);
    if sizes_ok && lists_ok && settings_ok && known && budget_ok && timing_ok {
        Ok(())
    } else {
        Err(
            "the manifest's protocol is not one this audit can check (empty list, zero size, \
             unknown distribution or policy, or unsupported bits)"
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

fn quantized(start: usize, end: usize, bits: u32) -> SegmentRow {
    SegmentRow {
        start,
        end,
        storage: "quantized".into(),
        bits: Some(bits),
        mode: None,
    }
}

/// The audit's own reading of a budget policy: a window of W tokens at the start (`early*`) or
/// the end (`recent*`), 8-bit or float32, the rest at the low width; empty segments dropped.
fn policy_segments(
    policy: &str,
    tokens: usize,
    window: usize,
    low_bits: u32,
) -> Option<Vec<SegmentRow>> {
    let high = |start, end| match policy {
        "recent8" | "early8" => Some(quantized(start, end, 8)),
        "recent_f32" | "early_f32" => Some(SegmentRow {
            start,
            end,
            storage: "float32".into(),
            bits: None,
            mode: None,
        }),
        _ => None,
    };
    let w = window.min(tokens);
    let segments = match policy {
        "uniform" => vec![quantized(0, tokens, low_bits)],
        "recent8" | "recent_f32" => {
            vec![
                quantized(0, tokens - w, low_bits),
                high(tokens - w, tokens)?,
            ]
        }
        "early8" | "early_f32" => vec![high(0, w)?, quantized(w, tokens, low_bits)],
        _ => return None,
    };
    Some(segments.into_iter().filter(|s| s.end > s.start).collect())
}

fn expected_comparisons(p: &Protocol, inputs: &[ExpectedInput]) -> Vec<Expected> {
    let mut out = Vec::new();
    for (index, input) in inputs.iter().enumerate() {
        for setting in &p.settings {
            // Symmetric is recorded by leaving the mode out.
            let mode = setting.mode.clone().filter(|m| m != "symmetric");
            out.push(Expected {
                id: comparison_id(&input.id, setting),
                input: index,
                study: "packed_kv",
                group_size: setting.group_size,
                bits: setting.bits,
                mode: mode.clone(),
                policy: None,
                window: None,
                segments: vec![SegmentRow {
                    mode,
                    ..quantized(0, input.tokens, setting.bits)
                }],
                suffixed: false,
            });
        }
        if let Some(budget) = &p.budget {
            for policy in &budget.policies {
                out.push(Expected {
                    id: budget_id(&input.id, policy),
                    input: index,
                    study: "budget",
                    group_size: budget.group_size,
                    bits: budget.low_bits,
                    mode: None,
                    policy: Some(policy.clone()),
                    window: Some(budget.window),
                    segments: policy_segments(policy, input.tokens, budget.window, budget.low_bits)
                        .expect("policies are checked with the protocol"),
                    suffixed: true,
                });
            }
        }
    }
    out
}

/// Checks the rows against the expected comparisons and returns them by id (first occurrence).
fn check_rows(
    p: &Protocol,
    inputs: &[ExpectedInput],
    expected: &[Expected],
    rows: Vec<ResultRow>,
    report: &mut Report,
) -> BTreeMap<String, ResultRow> {
    if rows.len() != expected.len() {
        report.fail(format!(
            "results.json has {} rows, the protocol calls for {}",
            rows.len(),
            expected.len()
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
    for e in expected {
        let input = &inputs[e.input];
        match by_id.get(&e.id) {
            None => report.fail(format!("results.json is missing comparison {}", e.id)),
            Some(row) => {
                let consistent = row.study == e.study
                    && row.input == input.id
                    && row.seed == input.seed
                    && row.tokens == input.tokens
                    && row.distribution == input.distribution
                    && row.group_size == e.group_size
                    && row.bits == e.bits
                    && row.mode == e.mode
                    && row.policy == e.policy
                    && row.window == e.window
                    && row.segments == e.segments
                    && row.features == p.features
                    && row.queries == p.queries
                    && row.k_axis == K_AXIS
                    && row.v_axis == V_AXIS;
                if !consistent {
                    report.fail(format!(
                        "results.json row {}: its descriptive fields do not match its id and the protocol",
                        e.id
                    ));
                }
            }
        }
    }
    let expected_ids: BTreeSet<&str> = expected.iter().map(|e| e.id.as_str()).collect();
    for id in by_id
        .keys()
        .filter(|id| !expected_ids.contains(id.as_str()))
    {
        report.fail(format!("results.json has an unexpected comparison {id}"));
    }
    report.count("result rows", by_id.len());
    by_id
}

/// Array names a comparison must have, segment by segment.
fn expected_array_names(e: &Expected) -> Vec<String> {
    let mut names = vec![format!("{}_out", e.id)];
    for tensor in ["k", "v"] {
        for (index, segment) in e.segments.iter().enumerate() {
            let suffix = if e.suffixed {
                format!("_s{index}")
            } else {
                String::new()
            };
            let parts: &[&str] = match (segment.bits, segment.mode.as_deref()) {
                (Some(_), Some("asymmetric")) => &["codes", "scales", "zeros", "shape"],
                (Some(_), _) => &["codes", "scales", "shape"],
                (None, _) => &["values", "shape"],
            };
            names.extend(
                parts
                    .iter()
                    .map(|part| format!("{}_{tensor}_{part}{suffix}", e.id)),
            );
        }
    }
    names
}

fn check_arrays(
    p: &Protocol,
    inputs: &[ExpectedInput],
    expected: &[Expected],
    rows: &BTreeMap<String, ResultRow>,
    arrays: &mut Arrays,
    report: &mut Report,
) {
    let mut expected_names = BTreeSet::new();
    for input in inputs {
        for part in ["q", "k", "v", "ref"] {
            expected_names.insert(format!("{}_{part}", input.id));
        }
    }
    for e in expected {
        expected_names.extend(expected_array_names(e));
    }
    let present: BTreeSet<String> = arrays.names().iter().cloned().collect();
    let missing: Vec<&String> = expected_names.difference(&present).collect();
    let unexpected: Vec<&String> = present.difference(&expected_names).collect();
    for (what, names) in [
        ("is missing", missing),
        ("has an unexpected array", unexpected),
    ] {
        if let Some(first) = names.first() {
            let more = names.len() - 1;
            let tail = if more > 0 {
                format!(" (and {more} more)")
            } else {
                String::new()
            };
            report.fail(format!("arrays.npz {what} {first}{tail}"));
        }
    }
    // Arrays that are missing would fail again one by one below; the line above says it once.
    if !expected_names.is_subset(&present) {
        return;
    }

    let mut clean_draws = CleanDraws::new();
    for (index, input) in inputs.iter().enumerate() {
        let Some(data) = load_input(p, input, arrays, report) else {
            continue;
        };
        check_focus(p, input, &data, &mut clean_draws, report);
        for e in expected.iter().filter(|e| e.input == index) {
            if let Err(problem) = check_comparison(p, e, &data, rows.get(&e.id), arrays, report) {
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

/// One stored tensor segment, decoded, with its payload as stored.
struct Stored {
    decoded: Array2<f64>,
    payload_bytes: usize,
}

fn check_comparison(
    p: &Protocol,
    e: &Expected,
    data: &InputData,
    row: Option<&ResultRow>,
    arrays: &mut Arrays,
    report: &mut Report,
) -> Result<(), String> {
    let id = &e.id;
    let mut decoded = Vec::new();
    let mut payloads = Vec::new();
    for (tensor, original, axis) in [("k", &data.k, Axis::Token), ("v", &data.v, Axis::Feature)] {
        let mut parts = Vec::new();
        for (index, segment) in e.segments.iter().enumerate() {
            let suffix = if e.suffixed {
                format!("_s{index}")
            } else {
                String::new()
            };
            let slice = original.slice(s![segment.start..segment.end, ..]);
            let stored = match segment.bits {
                Some(bits) => {
                    let grid = Grid {
                        tokens: segment.end - segment.start,
                        features: p.features,
                        group_size: e.group_size,
                        bits,
                        axis,
                        mode: Mode::parse(segment.mode.as_deref())
                            .ok_or_else(|| format!("{id}: unknown mode {:?}", segment.mode))?,
                    };
                    check_tensor(
                        &format!("{id}_{tensor}"),
                        &suffix,
                        grid,
                        slice,
                        arrays,
                        report,
                    )?
                }
                None => check_float32(&format!("{id}_{tensor}"), &suffix, slice, arrays)?,
            };
            parts.push(stored);
        }
        let views: Vec<_> = parts.iter().map(|s| s.decoded.view()).collect();
        decoded.push(ndarray::concatenate(NdAxis(0), &views).map_err(|err| {
            format!("{id}_{tensor}: segments do not stack into the cache: {err}")
        })?);
        payloads.push(parts.iter().map(|s| s.payload_bytes).sum::<usize>());
    }
    let out: Array2<f64> = arrays.matrix(&format!("{id}_out"))?;
    expect_shape(&format!("{id}_out"), out.shape(), data.reference.shape())?;
    let recomputed = attention(
        data.q.mapv(f64::from).view(),
        decoded[0].view(),
        decoded[1].view(),
    );
    let diff = relative_max_diff(&recomputed, &out);
    if !within(diff, OUTPUT_TOLERANCE) {
        report.fail(format!(
            "{id}_out differs from attention over the decoded codes by {diff:.3e} (relative)"
        ));
    }
    report.count("comparisons (outputs recomputed from decoded codes)", 1);
    report.count("segments", 2 * e.segments.len());

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
    let bytes = [
        ("k_payload_bytes", row.k_payload_bytes, payloads[0]),
        ("v_payload_bytes", row.v_payload_bytes, payloads[1]),
        (
            "payload_bytes",
            row.payload_bytes,
            payloads[0] + payloads[1],
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

/// A float32 segment must hold exactly the input's values, with its shape stored beside it.
fn check_float32(
    name: &str,
    suffix: &str,
    original: ArrayView2<f32>,
    arrays: &mut Arrays,
) -> Result<Stored, String> {
    let values: Array2<f32> = arrays.matrix(&format!("{name}_values{suffix}"))?;
    let shape: Array1<i32> = arrays.vector(&format!("{name}_shape{suffix}"))?;
    let logical = [original.nrows() as i32, original.ncols() as i32];
    if shape.as_slice() != Some(&logical[..]) {
        return Err(format!(
            "{name}_shape{suffix} is {shape}, expected {logical:?}"
        ));
    }
    expect_shape(
        &format!("{name}_values{suffix}"),
        values.shape(),
        original.shape(),
    )?;
    let same = values
        .iter()
        .zip(original.iter())
        .all(|(a, b)| a.to_bits() == b.to_bits());
    if !same {
        return Err(format!(
            "{name}_values{suffix} differs from the input it claims to keep in float32"
        ));
    }
    Ok(Stored {
        decoded: values.mapv(f64::from),
        payload_bytes: 4 * values.len() + 8,
    })
}

/// Loads one packed tensor segment, checks its layout, codes, padding, scales and quantization
/// bound, and decodes it.
fn check_tensor(
    name: &str,
    suffix: &str,
    grid: Grid,
    original: ArrayView2<f32>,
    arrays: &mut Arrays,
    report: &mut Report,
) -> Result<Stored, String> {
    let array = |part: &str| format!("{name}_{part}{suffix}");
    let codes: Array1<u8> = arrays.vector(&array("codes"))?;
    let scales: Array2<f32> = arrays.matrix(&array("scales"))?;
    let shape: Array1<i32> = arrays.vector(&array("shape"))?;
    let zeros: Array1<u8> = match grid.mode {
        Mode::Symmetric => Array1::zeros(0),
        Mode::Asymmetric => arrays.vector(&array("zeros"))?,
    };
    let logical = [grid.tokens as i32, grid.features as i32];
    if shape.as_slice() != Some(&logical[..]) {
        return Err(format!(
            "{} is {shape}, expected {logical:?}",
            array("shape")
        ));
    }
    expect_shape(
        &array("codes"),
        codes.shape(),
        &[grid.stream_bytes(grid.positions())],
    )?;
    let (rows, _, groups) = grid.view();
    expect_shape(&array("scales"), scales.shape(), &[rows, groups])?;
    if grid.mode == Mode::Asymmetric {
        expect_shape(
            &array("zeros"),
            zeros.shape(),
            &[grid.stream_bytes(grid.groups())],
        )?;
        if !tail_is_clear(
            zeros.as_slice().expect("contiguous"),
            grid.bits,
            grid.groups(),
        ) {
            report.fail(format!(
                "{}: bits past the last zero point are not zero",
                array("zeros")
            ));
        }
    }
    let stream = codes
        .as_slice()
        .expect("a freshly read array is contiguous");
    let offsets = offsets(&grid, zeros.as_slice().expect("contiguous"));

    let max_code = grid.max_code();
    let mut out_of_range = Vec::new();
    let mut bad_padding = 0usize;
    for position in 0..grid.positions() {
        let code = code_at(stream, grid.bits, position);
        if code > max_code {
            out_of_range.push((position, code));
        } else if grid.is_padding(position) && code != offsets[grid.group_of(position)] {
            bad_padding += 1;
        }
    }
    if !tail_is_clear(stream, grid.bits, grid.positions()) {
        bad_padding += 1;
    }
    if let Some((position, code)) = out_of_range.first() {
        report.fail(format!(
            "{}: {} codes exceed the {}-bit maximum {max_code}; first {code} at stream position {position}",
            array("codes"),
            out_of_range.len(),
            grid.bits
        ));
    }
    if bad_padding > 0 {
        report.fail(format!(
            "{}: {bad_padding} padding positions do not hold their group's zero code (or the stream's unused bits are not zero)",
            array("codes")
        ));
    }
    report.count("codes (range, padding and bound)", grid.positions());

    check_scales(&array("scales"), grid, original, &scales, &offsets, report);
    let decoded = decode(&grid, stream, scales.view(), &offsets);
    let levels = f64::from(grid.max_code());
    let mut over = 0usize;
    let mut first = None;
    for ((t, f), &x) in original.indexed_iter() {
        let (_, at) = grid.locate(t, f);
        let scale = f64::from(scales[at]);
        let err = (decoded[[t, f]] - f64::from(x)).abs();
        if !within(err, scale * (0.5 + levels * BOUND_SLACK)) {
            over += 1;
            first.get_or_insert((t, f, err, scale / 2.0));
        }
    }
    if let Some((t, f, err, half)) = first {
        report.fail(format!(
            "{name}{suffix}: {over} decoded elements exceed scale/2 from the original; first [{t}, {f}]: {err:.6e} > {half:.6e}"
        ));
    }
    Ok(Stored {
        payload_bytes: codes.len() + 4 * scales.len() + zeros.len() + 8,
        decoded,
    })
}

/// Each scale (and zero point) must follow from its group of the original:
/// - symmetric: scale = max|x| / qmax in f32, or 1.0 when that is 0;
/// - asymmetric: lo = min(min x, 0), hi = max(max x, 0), scale = (hi - lo) / (2^b - 1) in f32
///   (1.0 with zero point 0 if that is 0), zero = clamp(round_half_even(-lo / scale), 0, 2^b - 1).
fn check_scales(
    name: &str,
    grid: Grid,
    original: ArrayView2<f32>,
    scales: &Array2<f32>,
    offsets: &Array2<u8>,
    report: &mut Report,
) {
    let mut lo = Array2::<f32>::zeros(scales.raw_dim());
    let mut hi = Array2::<f32>::zeros(scales.raw_dim());
    for ((t, f), &x) in original.indexed_iter() {
        let (_, s) = grid.locate(t, f);
        lo[s] = lo[s].min(x);
        hi[s] = hi[s].max(x);
    }
    let expected = |r: usize, g: usize| -> (f32, u8) {
        match grid.mode {
            Mode::Symmetric => {
                let amax = (-lo[[r, g]]).max(hi[[r, g]]);
                let scale = amax / f32::from(grid.qmax());
                // A zero (all-zero or underflowing) scale is stored as 1.0.
                (if scale == 0.0 { 1.0 } else { scale }, grid.qmax())
            }
            Mode::Asymmetric => {
                let levels = f32::from(grid.max_code());
                let scale = (hi[[r, g]] - lo[[r, g]]) / levels;
                if scale == 0.0 {
                    return (1.0, 0);
                }
                let zero = (-lo[[r, g]] / scale).round_ties_even().clamp(0.0, levels);
                (scale, zero as u8)
            }
        }
    };
    let wrong: Vec<(usize, usize)> = scales
        .indexed_iter()
        .filter(|&((r, g), &scale)| {
            let (want_scale, want_offset) = expected(r, g);
            scale.to_bits() != want_scale.to_bits() || offsets[[r, g]] != want_offset
        })
        .map(|(index, _)| index)
        .collect();
    if let Some(&(r, g)) = wrong.first() {
        let rule = match grid.mode {
            Mode::Symmetric => format!("max|x| / {}", grid.qmax()),
            Mode::Asymmetric => format!("(max - min) / {} with its zero point", grid.max_code()),
        };
        report.fail(format!(
            "{name}: {} scales are not {rule} of their group; first [{r}, {g}] is {} (offset {})",
            wrong.len(),
            scales[[r, g]],
            offsets[[r, g]]
        ));
    }
    report.count("scales (recomputed from the inputs)", scales.len());
}

/// Mean relative L2 of the rows that pass `keep`, in the rows' protocol order.
fn mean_of<'a>(rows: impl Iterator<Item = &'a ResultRow>) -> Option<(f64, usize)> {
    let values: Vec<f64> = rows.map(|r| r.relative_l2).collect();
    (!values.is_empty()).then(|| {
        (
            values.iter().sum::<f64>() / values.len() as f64,
            values.len(),
        )
    })
}

fn close(recorded: f64, actual: f64) -> bool {
    within((recorded - actual).abs(), METRIC_TOLERANCE * actual.abs())
}

/// Recomputes every table of summary.json from the results rows.
fn check_summary(
    p: &Protocol,
    expected: &[Expected],
    rows: &BTreeMap<String, ResultRow>,
    summary: &Summary,
    report: &mut Report,
) {
    for &n in &p.tokens {
        let bytes = 2 * 4 * n * p.features;
        if summary.float32_kv_bytes.get(&n.to_string()) != Some(&bytes) {
            report.fail(format!(
                "summary.json float32_kv_bytes at N={n} is not {bytes}"
            ));
        }
    }
    // Rows of one configuration, in protocol order.
    let config_rows = |config: &str| -> Vec<&ResultRow> {
        expected
            .iter()
            .filter(|e| e.config() == config)
            .filter_map(|e| rows.get(&e.id))
            .collect()
    };
    let check_means = |label: &str,
                       mine: &[&ResultRow],
                       means: &BTreeMap<String, f64>,
                       payloads: &BTreeMap<String, usize>,
                       report: &mut Report| {
        for distribution in &p.distributions {
            let actual = mean_of(
                mine.iter()
                    .copied()
                    .filter(|r| &r.distribution == distribution),
            );
            let ok = match (means.get(distribution), actual) {
                (Some(&recorded), Some((mean, _))) => close(recorded, mean),
                (None, None) => true,
                _ => false,
            };
            if !ok {
                report.fail(format!(
                    "summary.json {label}: the {distribution} mean does not match the results"
                ));
            }
        }
        for &n in &p.tokens {
            let actual = mine.iter().find(|r| r.tokens == n).map(|r| r.payload_bytes);
            if payloads.get(&n.to_string()).copied() != actual {
                report.fail(format!(
                    "summary.json {label}: payload at N={n} does not match the results"
                ));
            }
        }
    };

    if summary.packed_kv.len() != p.settings.len() {
        report.fail(format!(
            "summary.json has {} packed-KV rows, the protocol has {} settings",
            summary.packed_kv.len(),
            p.settings.len()
        ));
    }
    for (setting, srow) in p.settings.iter().zip(&summary.packed_kv) {
        let config = setting_label(setting);
        let label = config.replace('_', " ");
        let same_mode = srow.mode.as_deref().unwrap_or("symmetric")
            == setting.mode.as_deref().unwrap_or("symmetric");
        if (srow.group_size, srow.bits) != (setting.group_size, setting.bits) || !same_mode {
            report.fail(format!(
                "summary.json {label}: row is for g{} b{} {:?}",
                srow.group_size, srow.bits, srow.mode
            ));
            continue;
        }
        let mine = config_rows(&config);
        let clean = mean_of(mine.iter().copied().filter(|r| r.distribution == "clean"));
        let mean_ok = match (srow.mean_relative_l2_clean, clean) {
            (Some(recorded), Some((mean, _))) => close(recorded, mean),
            (None, None) => true,
            _ => false,
        };
        let percent_ok = srow.mean_relative_l2_clean_percent
            == srow
                .mean_relative_l2_clean
                .map(|m| format!("{:.3}", m * 100.0));
        if !mean_ok || !percent_ok || srow.clean_inputs != clean.map_or(0, |(_, n)| n) {
            report.fail(format!(
                "summary.json {label}: the clean mean does not match the results ({:?} recorded, {:?} recomputed)",
                srow.mean_relative_l2_clean,
                clean.map(|(m, _)| m)
            ));
        }
        check_means(
            &label,
            &mine,
            &srow.mean_relative_l2,
            &srow.payload_bytes,
            report,
        );
    }

    let policies: Vec<String> = p.budget.iter().flat_map(|b| b.policies.clone()).collect();
    if summary.budget.len() != policies.len() {
        report.fail(format!(
            "summary.json has {} budget rows, the protocol has {} policies",
            summary.budget.len(),
            policies.len()
        ));
    }
    for (policy, brow) in policies.iter().zip(&summary.budget) {
        let budget = p.budget.as_ref().expect("policies come from the budget");
        let same_params = (brow.group_size, brow.low_bits, brow.window)
            == (budget.group_size, budget.low_bits, budget.window);
        if &brow.policy != policy || !same_params {
            report.fail(format!(
                "summary.json budget row {}: does not describe policy {policy}",
                brow.policy
            ));
            continue;
        }
        let mine = config_rows(policy);
        check_means(
            &format!("budget {policy}"),
            &mine,
            &brow.mean_relative_l2,
            &brow.payload_bytes,
            report,
        );
    }
    report.count(
        "summary rows",
        summary.packed_kv.len() + summary.budget.len(),
    );
}

/// timings.json cannot be recomputed; the audit checks it is complete and well-formed: every
/// (comparison, operation, repeat) exactly once, orders 0..n in sequence, and parameters equal
/// to the protocol's. (A time of 0 ns is possible on a coarse clock and is kept as measured.)
fn check_timings(
    timing: &crate::model::Timing,
    expected: &[Expected],
    timings: &Timings,
    report: &mut Report,
) {
    if (timings.warmup, timings.repeats, timings.shuffle_seed)
        != (timing.warmup, timing.repeats, timing.shuffle_seed)
        || timings.unit != "ns"
    {
        report.fail("timings.json: warmup, repeats, shuffle seed or unit differ from the protocol");
    }
    let ids: BTreeSet<&str> = expected.iter().map(|e| e.id.as_str()).collect();
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    for (index, m) in timings.measurements.iter().enumerate() {
        if m.order != index {
            problems.push(format!("measurement {index} has order {}", m.order));
        }
        if !ids.contains(m.comparison.as_str()) {
            problems.push(format!(
                "measurement {index} names unknown comparison {}",
                m.comparison
            ));
        }
        if !OPERATIONS.contains(&m.operation.as_str()) {
            problems.push(format!(
                "measurement {index} names unknown operation {}",
                m.operation
            ));
        }
        if m.repeat >= timing.repeats {
            problems.push(format!(
                "measurement {index} has repeat {} of {}",
                m.repeat, timing.repeats
            ));
        }
        if !seen.insert((m.comparison.as_str(), m.operation.as_str(), m.repeat)) {
            problems.push(format!(
                "measurement {index} repeats ({}, {}, {})",
                m.comparison, m.operation, m.repeat
            ));
        }
    }
    let wanted = expected.len() * OPERATIONS.len() * timing.repeats;
    if timings.measurements.len() != wanted {
        problems.push(format!(
            "{} measurements, the protocol calls for {wanted}",
            timings.measurements.len()
        ));
    }
    if let Some(first) = problems.first() {
        report.fail(format!(
            "timings.json: {} problems; first: {first}",
            problems.len()
        ));
    }
    report.count("raw timings (form only)", timings.measurements.len());
    report.note("timings cannot be recomputed: timings.json was checked for completeness and form, and summary medians against it");
}

/// summary.json's timing medians must be the medians of timings.json (lower middle for an even
/// count), per configuration, length and operation.
fn check_timing_medians(
    inputs: &[ExpectedInput],
    expected: &[Expected],
    timings: Option<&Timings>,
    summary: &Summary,
    report: &mut Report,
) {
    let Some(timings) = timings else {
        if !summary.timings.is_empty() {
            report.fail("summary.json has timing medians but the run has no timings.json");
        }
        return;
    };
    let key_of: BTreeMap<&str, (String, usize)> = expected
        .iter()
        .map(|e| (e.id.as_str(), (e.config(), inputs[e.input].tokens)))
        .collect();
    let mut groups: BTreeMap<(String, usize, String), Vec<u64>> = BTreeMap::new();
    for m in &timings.measurements {
        if let Some((config, tokens)) = key_of.get(m.comparison.as_str()) {
            groups
                .entry((config.clone(), *tokens, m.operation.clone()))
                .or_default()
                .push(m.ns);
        }
    }
    if summary.timings.len() != groups.len() {
        report.fail(format!(
            "summary.json has {} timing medians, timings.json has {} groups",
            summary.timings.len(),
            groups.len()
        ));
    }
    for row in &summary.timings {
        let key = (row.config.clone(), row.tokens, row.operation.clone());
        let Some(values) = groups.get_mut(&key) else {
            report.fail(format!("summary.json timing {key:?} has no measurements"));
            continue;
        };
        values.sort_unstable();
        let median = values[(values.len() - 1) / 2];
        if (row.median_ns, row.measurements) != (median, values.len()) {
            report.fail(format!(
                "summary.json timing {key:?}: median {} of {} recorded, {median} of {} in timings.json",
                row.median_ns,
                row.measurements,
                values.len()
            ));
        }
    }
}

/// summary.md must show the summary's error figures; the chart must at least be an SVG document.
fn check_report_files(dir: &Path, summary: &Summary, report: &mut Report) {
    match std::fs::read_to_string(dir.join("summary.md")) {
        Ok(markdown) => {
            let figures: Vec<String> = summary
                .packed_kv
                .iter()
                .filter_map(|r| r.mean_relative_l2_clean_percent.clone())
                .chain(summary.budget.iter().flat_map(|r| {
                    r.mean_relative_l2
                        .values()
                        .map(|m| format!("{:.3}", m * 100.0))
                }))
                .collect();
            if let Some(missing) = figures
                .iter()
                .find(|f| !markdown.contains(&format!("{f}%")))
            {
                report.fail(format!(
                    "summary.md does not show {missing}% from summary.json"
                ));
            }
        }
        Err(e) => report.fail(format!("cannot read summary.md: {e}")),
    }
    match std::fs::read_to_string(dir.join("error-vs-bytes.svg")) {
        Ok(svg) if svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>") => {}
        Ok(_) => report.fail("error-vs-bytes.svg is not an SVG document"),
        Err(e) => report.fail(format!("cannot read error-vs-bytes.svg: {e}")),
    }
}
