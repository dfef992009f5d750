//! arrays.npz against the protocol: every generated input re-derived and required bit for bit
//! (a model's input, which the audit cannot re-derive without running the model, is read from
//! the archive and required to be finite f32 of its shape: [`crate::packed_kv::inputs::archived`]),
//! every reference and output recomputed, every stored segment checked
//! ([`crate::packed_kv::tensors`]) on the axes its setting groups it along, and each results row's
//! metrics and payloads recomputed.

use std::collections::{BTreeMap, BTreeSet};

use ndarray::{Array2, s};

use crate::common::npz::Archive;
use crate::common::report::{Checked, Problem, Report};
use crate::common::tolerance::{close, within};
use crate::packed_kv::attention::{Rows, attention, relative_max_diff};
use crate::packed_kv::decoder::Grid;
use crate::packed_kv::inputs::{self, Draw};
use crate::packed_kv::plan::{ComparisonPlan, InputPlan, InputSource};
use crate::packed_kv::protocol::Protocol;
use crate::packed_kv::results::ResultRow;
use crate::packed_kv::tensors::{self, Stored};

/// Recomputed attention outputs must agree with the archived ones to this relative precision.
pub const OUTPUT_TOLERANCE: f64 = 1e-12;

/// What the audit recomputed for one comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Recomputed {
    /// ||out - ref||_F / ||ref||_F from the archived (and verified) out and reference.
    pub relative_l2: f64,
    /// max |out - ref|.
    pub max_abs: f64,
    /// K + V payload as stored.
    pub payload_bytes: usize,
}

/// Checks arrays.npz and the rows' numbers; returns what it recomputed, by comparison id.
///
/// Inputs are checked in run order (the archive's order), each followed by its comparisons; a
/// model's input is read from the archive ([`inputs::archived`]) instead of drawn. One
/// draw is held at a time (the inputs of one seed and length are consecutive, so each is drawn
/// once), its keys shaped in place for each distribution; besides it, one comparison's stored
/// arrays at a time. Archived inputs are compared a chunk at a time, never loaded.
pub fn check(
    p: &Protocol,
    inputs: &[InputPlan],
    plan: &[ComparisonPlan],
    rows: &BTreeMap<String, ResultRow>,
    archive: &Archive,
    report: &mut Report,
) -> BTreeMap<String, Recomputed> {
    let mut recomputed = BTreeMap::new();
    if !check_names(inputs, plan, archive, report) {
        return recomputed;
    }
    let mut draw: Option<((u64, usize), Draw)> = None;
    for (index, input) in inputs.iter().enumerate() {
        let (seed, distribution) = match input.source {
            InputSource::Drawn { seed, distribution } => (seed, distribution),
            InputSource::Model { .. } => {
                // The audit does not run the model: q, k and v are the archive's (checked for
                // dtype, shape and finiteness), and everything downstream is recomputed.
                drop(draw.take());
                match inputs::archived(p, &input.id, input.tokens, archive) {
                    Ok(d) => check_input_and_comparisons(
                        p,
                        index,
                        input,
                        plan,
                        &d,
                        rows,
                        archive,
                        report,
                        &mut recomputed,
                    ),
                    Err(problem) => report.fail(problem),
                }
                continue;
            }
        };
        let key = (seed, input.tokens);
        if draw.as_ref().is_none_or(|(k, _)| *k != key) {
            // The last draw goes before the next is made, so two are never held.
            drop(draw.take());
            let Some(d) = inputs::draw(p, seed, input.tokens) else {
                return recomputed;
            };
            draw = Some((key, d));
        }
        let (_, d) = draw.as_mut().expect("just drawn");
        // This input's keys are the draw's, shifted in place; the shifted rows are put back
        // for the next distribution.
        let focus = inputs::focus_rows(p, input.tokens, distribution);
        let unshifted = d.k.slice(s![focus.clone(), ..]).to_owned();
        inputs::shift_keys(p, &d.q, &mut d.k, distribution);
        check_input_and_comparisons(
            p,
            index,
            input,
            plan,
            d,
            rows,
            archive,
            report,
            &mut recomputed,
        );
        d.k.slice_mut(s![focus, ..]).assign(&unshifted);
    }
    recomputed
}

/// One input (`d.k` holding its keys) and its comparisons.
#[allow(clippy::too_many_arguments)]
fn check_input_and_comparisons(
    p: &Protocol,
    index: usize,
    input: &InputPlan,
    plan: &[ComparisonPlan],
    d: &Draw,
    rows: &BTreeMap<String, ResultRow>,
    archive: &Archive,
    report: &mut Report,
    recomputed: &mut BTreeMap<String, Recomputed>,
) {
    let Some(reference) = check_input(p, input, &d.q, &d.k, &d.v, archive, report) else {
        return;
    };
    let q64 = d.q.mapv(f64::from);
    for e in plan.iter().filter(|e| e.input == index) {
        if let Some(r) = check_comparison(
            p,
            e,
            &q64,
            &d.k,
            &d.v,
            &reference,
            archive,
            rows.get(&e.id),
            report,
        ) {
            recomputed.insert(e.id.clone(), r);
        }
    }
}

/// The archive must hold exactly the arrays the plan names.
fn check_names(
    inputs: &[InputPlan],
    plan: &[ComparisonPlan],
    archive: &Archive,
    report: &mut Report,
) -> bool {
    let mut expected = BTreeSet::new();
    for input in inputs {
        for part in ["q", "k", "v", "ref"] {
            expected.insert(format!("{}_{part}", input.id));
        }
    }
    for e in plan {
        expected.extend(e.array_names());
    }
    let present: BTreeSet<String> = archive.names().iter().cloned().collect();
    let missing: Vec<&String> = expected.difference(&present).collect();
    let unexpected: Vec<&String> = present.difference(&expected).collect();
    for (what, names) in [
        ("is missing", &missing),
        ("has an unexpected array", &unexpected),
    ] {
        if let Some(first) = names.first() {
            report.fail(Problem::ArrayNames {
                what,
                first: first.to_string(),
                more: names.len() - 1,
            });
        }
    }
    // Missing arrays would fail again one by one below; the line above says it once.
    missing.is_empty()
}

/// The archived q, k, v must be the re-derived ones (for a generated input; a model's are the
/// archived ones themselves), and the reference their attention. Returns the archived reference.
fn check_input(
    p: &Protocol,
    input: &InputPlan,
    q: &Array2<f32>,
    k: &Array2<f32>,
    v: &Array2<f32>,
    archive: &Archive,
    report: &mut Report,
) -> Option<Array2<f64>> {
    let id = &input.id;
    let mut all_same = true;
    let parts: &[(&str, &Array2<f32>)] = match input.source {
        InputSource::Drawn { .. } => &[("q", q), ("k", k), ("v", v)],
        // Read from the archive by `inputs::archived`: comparing them with themselves says
        // nothing.
        InputSource::Model { .. } => {
            report.count(Checked::ModelInputsRead, 1);
            &[]
        }
    };
    for &(part, derived) in parts {
        let array = format!("{id}_{part}");
        let derived = derived.as_standard_layout();
        let flat = derived
            .as_slice()
            .expect("a standard-layout array is one slice");
        let columns = derived.ncols();
        let mut count = 0usize;
        let mut first = None;
        let read =
            archive.for_each::<f32>(&array, &[derived.nrows(), columns], |start, archived| {
                for (i, (a, b)) in archived.iter().zip(&flat[start..]).enumerate() {
                    if a.to_bits() != b.to_bits() {
                        count += 1;
                        first.get_or_insert((start + i, *a, *b));
                    }
                }
            });
        match read {
            Ok(()) => {
                if let Some((at, a, b)) = first {
                    all_same = false;
                    report.fail(Problem::Input {
                        array,
                        count,
                        first: [at / columns, at % columns],
                        archived: a,
                        derived: b,
                    });
                }
            }
            Err(e) => {
                all_same = false;
                report.fail(Problem::Array(e));
            }
        }
    }
    if all_same && !parts.is_empty() {
        report.count(Checked::InputsRederived, 1);
    }
    let array = format!("{id}_ref");
    let reference = match archive.matrix::<f64>(&array, [p.queries, p.features]) {
        Ok(r) => r,
        Err(e) => {
            report.fail(Problem::Array(e));
            return None;
        }
    };
    // K and V are read as f64 a block at a time, never copied whole.
    let recomputed = attention(q.mapv(f64::from).view(), k.view(), v.view());
    let diff = relative_max_diff(&recomputed, &reference);
    if !within(diff, OUTPUT_TOLERANCE) {
        report.fail(Problem::Attention {
            array,
            what: "attention over the re-derived inputs",
            diff,
        });
    }
    report.count(Checked::References, 1);
    Some(reference)
}

#[allow(clippy::too_many_arguments)]
fn check_comparison(
    p: &Protocol,
    e: &ComparisonPlan,
    q: &Array2<f64>,
    k: &Array2<f32>,
    v: &Array2<f32>,
    reference: &Array2<f64>,
    archive: &Archive,
    row: Option<&ResultRow>,
    report: &mut Report,
) -> Option<Recomputed> {
    let id = &e.id;
    let mut caches = Vec::new();
    let mut payloads = Vec::new();
    for (tensor, original, axis) in [("k", k, e.axes.k()), ("v", v, e.axes.v())] {
        let mut parts: Vec<(usize, Stored)> = Vec::new();
        for (index, segment) in e.segments.iter().enumerate() {
            let suffix = e.suffix(index);
            let slice = original.slice(s![segment.start..segment.end, ..]);
            let name = format!("{id}_{tensor}");
            let stored = match segment.bits {
                Some(bits) => {
                    let grid = Grid {
                        tokens: segment.len(),
                        features: p.features,
                        group_size: e.group_size,
                        bits,
                        axis,
                        mode: segment.mode,
                    };
                    tensors::check_quantized(archive, &name, &suffix, grid, slice, report)
                }
                None => tensors::check_float32(archive, &name, &suffix, slice, report),
            };
            parts.push((segment.start, stored?));
        }
        payloads.push(parts.iter().map(|(_, s)| s.payload_bytes).sum::<usize>());
        caches.push(Cache {
            tokens: original.nrows(),
            features: p.features,
            segments: parts,
        });
    }
    report.count(Checked::Segments, 2 * e.segments.len());
    let array = format!("{id}_out");
    let out = match archive.matrix::<f64>(&array, [p.queries, p.features]) {
        Ok(out) => out,
        Err(err) => {
            report.fail(Problem::Array(err));
            return None;
        }
    };
    let recomputed = attention(q.view(), &caches[0], &caches[1]);
    let diff = relative_max_diff(&recomputed, &out);
    if !within(diff, OUTPUT_TOLERANCE) {
        report.fail(Problem::Attention {
            array,
            what: "attention over the decoded codes",
            diff,
        });
    }
    report.count(Checked::Comparisons, 1);

    let difference = &out - reference;
    let result = Recomputed {
        relative_l2: frobenius(&difference) / frobenius(reference),
        max_abs: difference.iter().fold(0.0f64, |m, x| m.max(x.abs())),
        payload_bytes: payloads[0] + payloads[1],
    };
    if let Some(row) = row {
        for (field, recorded, actual) in [
            ("relative_l2", row.relative_l2, result.relative_l2),
            ("max_abs", row.max_abs, result.max_abs),
        ] {
            if !close(recorded, actual) {
                report.fail(Problem::Metric {
                    id: id.clone(),
                    field,
                    recorded: recorded.to_string(),
                    recomputed: actual.to_string(),
                });
            }
        }
        for (field, recorded, actual) in [
            ("k_payload_bytes", row.k_payload_bytes, payloads[0]),
            ("v_payload_bytes", row.v_payload_bytes, payloads[1]),
            ("payload_bytes", row.payload_bytes, result.payload_bytes),
            ("baseline_bytes", row.baseline_bytes, 2 * 4 * k.len()),
        ] {
            if recorded != actual {
                report.fail(Problem::Metric {
                    id: id.clone(),
                    field,
                    recorded: recorded.to_string(),
                    recomputed: actual.to_string(),
                });
            }
        }
    }
    Some(result)
}

/// One tensor of a comparison as stored: its segments, each with its first token, tiling the
/// cache in token order. Attention reads it a block of rows at a time, decoding as it goes.
struct Cache {
    tokens: usize,
    features: usize,
    segments: Vec<(usize, Stored)>,
}

impl Rows for Cache {
    fn dim(&self) -> (usize, usize) {
        (self.tokens, self.features)
    }

    fn rows(&self, start: usize, out: &mut [f64]) {
        for (i, row) in out.chunks_exact_mut(self.features.max(1)).enumerate() {
            let t = start + i;
            // The last segment starting at or before t holds it (the plan's segments tile).
            if let Some((first, stored)) = self.segments.iter().rev().find(|(s, _)| *s <= t) {
                stored.values.row(t - first, row);
            }
        }
    }
}

fn frobenius(a: &Array2<f64>) -> f64 {
    a.iter().map(|x| x * x).sum::<f64>().sqrt()
}
