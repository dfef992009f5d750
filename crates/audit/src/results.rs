//! results.json: one row per comparison, read with the audit's own types and held to the plan.
//! Descriptive fields must be what the protocol gives the row's id; the numbers are checked
//! against recomputation in [`crate::comparisons`].

pub use crate::problem::ResultsProblem;
use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use crate::plan::{ComparisonPlan, Config, InputPlan, Segment};
use crate::protocol::{Distribution, Mode, Policy, Protocol};
use crate::report::{Checked, Problem, Report};

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
    /// Seed.
    pub seed: u64,
    /// N.
    pub tokens: usize,
    /// D.
    pub features: usize,
    /// Query rows.
    pub queries: usize,
    /// Distribution.
    pub distribution: Distribution,
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
    /// `token`.
    pub k_axis: String,
    /// `feature`.
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

/// The axis names every row carries.
pub const K_AXIS: &str = "token";
/// See [`K_AXIS`].
pub const V_AXIS: &str = "feature";

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
            && row.seed == input.seed
            && row.tokens == input.tokens
            && row.distribution == input.distribution
            && row.group_size == e.group_size
            && row.bits == e.bits
            && row.mode == mode
            && row.policy == policy
            && row.window == window
            && segments_ok
            && row.features == p.features
            && row.queries == p.queries
            && row.k_axis == K_AXIS
            && row.v_axis == V_AXIS;
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
