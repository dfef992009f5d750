//! results.json: one row per comparison, read with the audit's own types and held to the plan.
//! Descriptive fields must be what the protocol gives the row's id (a generated input's `seed`
//! and `distribution`, or a model input's `text`, `layer` and `kv_head`, each present only for
//! its kind; `k_axis` and `v_axis` as the setting groups them); the numbers are checked against
//! recomputation in [`crate::packed_kv::comparisons`].

pub use crate::common::problem::ResultsProblem;
use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use crate::common::report::{Checked, Problem, Report};
use crate::packed_kv::decoder::GroupAxis;
use crate::packed_kv::plan::{ComparisonPlan, Config, InputPlan, InputSource, Segment};
use crate::packed_kv::protocol::{Distribution, Mode, Policy, Protocol};

/// One row of results.json.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultRow {
    /// Comparison id.
    pub id: String,
    /// `packed_kv` or `budget`.
    pub study: String,
    /// Input id.
    pub input: String,
    /// Seed; absent for a model's input.
    #[serde(default)]
    pub seed: Option<u64>,
    /// N.
    pub tokens: usize,
    /// D.
    pub features: usize,
    /// Query rows.
    pub queries: usize,
    /// Distribution; absent for a model's input.
    #[serde(default)]
    pub distribution: Option<Distribution>,
    /// A model's input: index of its text; absent otherwise.
    #[serde(default)]
    pub text: Option<usize>,
    /// A model's input: the layer; absent otherwise.
    #[serde(default)]
    pub layer: Option<usize>,
    /// A model's input: the KV head; absent otherwise.
    #[serde(default)]
    pub kv_head: Option<usize>,
    /// Group size.
    pub group_size: usize,
    /// Width (the low width for budget rows).
    pub bits: u32,
    /// Absent when symmetric.
    #[serde(default)]
    pub mode: Option<Mode>,
    /// Budget policy, null for packed-KV rows.
    pub policy: Option<Policy>,
    /// Budget window, null for packed-KV rows.
    pub window: Option<usize>,
    /// The token segments.
    pub segments: Vec<SegmentRow>,
    /// `token`, or `feature` when the setting swaps axes.
    pub k_axis: String,
    /// `feature`, or `token` when the setting swaps axes.
    pub v_axis: String,
    /// ||out - ref||_F / ||ref||_F.
    pub relative_l2: f64,
    /// max |out - ref|.
    pub max_abs: f64,
    /// K's payload.
    pub k_payload_bytes: usize,
    /// V's payload.
    pub v_payload_bytes: usize,
    /// K + V.
    pub payload_bytes: usize,
    /// Float32 K + V.
    pub baseline_bytes: usize,
}

/// How a segment is stored, as results.json spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Storage {
    /// Codes, scales (and zero points).
    Quantized,
    /// Raw float32 values.
    Float32,
}

/// One token segment as results.json describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SegmentRow {
    /// First token.
    pub start: usize,
    /// One past the last.
    pub end: usize,
    /// How it is stored.
    pub storage: Storage,
    /// Width of a quantized segment.
    #[serde(default)]
    pub bits: Option<u32>,
    /// Absent when symmetric.
    #[serde(default)]
    pub mode: Option<Mode>,
}

impl SegmentRow {
    fn describes(&self, s: &Segment) -> bool {
        let storage = match s.bits {
            Some(_) => Storage::Quantized,
            None => Storage::Float32,
        };
        let mode = (s.mode == Mode::Asymmetric).then_some(Mode::Asymmetric);
        (self.start, self.end, self.storage, self.bits, self.mode)
            == (s.start, s.end, storage, s.bits, mode)
    }
}

/// An axis as results.json spells it.
pub fn axis_name(axis: GroupAxis) -> &'static str {
    match axis {
        GroupAxis::Token => "token",
        GroupAxis::Feature => "feature",
    }
}

/// The input fields of a row, as the input's source gives them: (seed, distribution, text,
/// layer, KV head), each absent where the source has none.
type SourceFields = (
    Option<u64>,
    Option<Distribution>,
    Option<usize>,
    Option<usize>,
    Option<usize>,
);

fn source_fields(source: InputSource) -> SourceFields {
    match source {
        InputSource::Drawn { seed, distribution } => {
            (Some(seed), Some(distribution), None, None, None)
        }
        InputSource::Model {
            text,
            layer,
            kv_head,
        } => (None, None, Some(text), Some(layer), Some(kv_head)),
    }
}

/// Checks the rows against the plan and returns them by id (first occurrence kept).
pub fn check(
    p: &Protocol,
    inputs: &[InputPlan],
    plan: &[ComparisonPlan],
    rows: Vec<ResultRow>,
    report: &mut Report,
) -> BTreeMap<String, ResultRow> {
    let fail =
        |report: &mut Report, problem: ResultsProblem| report.fail(Problem::Results(problem));
    if rows.len() != plan.len() {
        fail(
            report,
            ResultsProblem::Count {
                found: rows.len(),
                expected: plan.len(),
            },
        );
    } else if let Some((position, (row, e))) = rows
        .iter()
        .zip(plan)
        .enumerate()
        .find(|(_, (row, e))| row.id != e.id)
    {
        fail(
            report,
            ResultsProblem::Order {
                position,
                found: row.id.clone(),
                expected: e.id.clone(),
            },
        );
    }
    let mut by_id = BTreeMap::new();
    for row in rows {
        if by_id.contains_key(&row.id) {
            fail(report, ResultsProblem::Duplicate { id: row.id });
        } else {
            by_id.insert(row.id.clone(), row);
        }
    }
    for e in plan {
        let input = &inputs[e.input];
        let Some(row) = by_id.get(&e.id) else {
            fail(report, ResultsProblem::Missing { id: e.id.clone() });
            continue;
        };
        let (policy, window) = match e.config {
            Config::Policy(policy) => (Some(policy), p.budget.as_ref().map(|b| b.window)),
            Config::Setting(_) => (None, None),
        };
        let mode = (e.mode == Mode::Asymmetric).then_some(Mode::Asymmetric);
        let segments_ok = row.segments.len() == e.segments.len()
            && row
                .segments
                .iter()
                .zip(&e.segments)
                .all(|(r, s)| r.describes(s));
        let consistent = row.study == e.study.name()
            && row.input == input.id
            && (row.seed, row.distribution, row.text, row.layer, row.kv_head)
                == source_fields(input.source)
            && row.tokens == input.tokens
            && row.group_size == e.group_size
            && row.bits == e.bits
            && row.mode == mode
            && row.policy == policy
            && row.window == window
            && segments_ok
            && row.features == p.features
            && row.queries == p.queries
            && row.k_axis == axis_name(e.axes.k())
            && row.v_axis == axis_name(e.axes.v());
        if !consistent {
            fail(report, ResultsProblem::Description { id: e.id.clone() });
        }
    }
    let expected: BTreeSet<&str> = plan.iter().map(|e| e.id.as_str()).collect();
    for id in by_id.keys().filter(|id| !expected.contains(id.as_str())) {
        fail(report, ResultsProblem::Unexpected { id: id.clone() });
    }
    report.count(Checked::ResultRows, by_id.len());
    by_id
}
