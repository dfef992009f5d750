//! timings.json cannot be recomputed: a time is what one machine measured once. The audit checks
//! that it is complete and well formed (every comparison, operation and repeat exactly once, in
//! order, each a positive whole number of nanoseconds, parameters equal to the protocol's, free
//! text without figures), and that summary.json's medians are its medians.

pub use crate::common::problem::TimingProblem;
use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use crate::common::report::{Checked, Note, Problem, Report};
use crate::common::text::figures;
use crate::packed_kv::plan::{ComparisonPlan, InputPlan};
use crate::packed_kv::protocol::Timing;
use crate::packed_kv::summary::Summary;

/// The operations timed per comparison, in the order tables list them.
pub const OPERATIONS: [&str; 5] = ["encode_k", "encode_v", "decode_k", "decode_v", "attention"];

/// timings.json.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timings {
    /// Free text (no figures).
    pub about: String,
    /// `ns`.
    pub unit: String,
    /// Free text naming the clock (no figures).
    pub clock: String,
    /// Warm-up calls.
    pub warmup: usize,
    /// Timed calls per operation.
    pub repeats: usize,
    /// Seed of the call order.
    pub shuffle_seed: u64,
    /// Every measurement, in the order made.
    pub measurements: Vec<Measurement>,
}

/// One timed call.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measurement {
    /// Position in the call order.
    pub order: usize,
    /// Comparison id.
    pub comparison: String,
    /// Operation name.
    pub operation: String,
    /// Which repeat.
    pub repeat: usize,
    /// Nanoseconds.
    pub ns: u64,
    /// In a merged run, the shard (1 to N) that made it; absent otherwise.
    #[serde(default)]
    pub shard: Option<usize>,
}

/// Checks timings.json's form.
pub fn check(
    timing: &Timing,
    plan: &[ComparisonPlan],
    timings: &Timings,
    shard_of: Option<&BTreeMap<String, usize>>,
    report: &mut Report,
) {
    let fail = |report: &mut Report, p: TimingProblem| report.fail(Problem::Timings(p));
    if (timings.warmup, timings.repeats, timings.shuffle_seed)
        != (timing.warmup, timing.repeats, timing.shuffle_seed)
        || timings.unit != "ns"
    {
        fail(report, TimingProblem::Parameters);
    }
    for (field, text) in [("about", &timings.about), ("clock", &timings.clock)] {
        if let Some(figure) = figures(text).into_iter().next() {
            fail(report, TimingProblem::Figure { field, figure });
        }
    }
    let ids: BTreeSet<&str> = plan.iter().map(|e| e.id.as_str()).collect();
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
        let expected_shard = shard_of.and_then(|map| map.get(&m.comparison).copied());
        if m.shard != expected_shard {
            problems.push(format!(
                "measurement {index} records shard {:?}, but its comparison is shard {:?}'s",
                m.shard, expected_shard
            ));
        }
        if m.ns == 0 {
            problems.push(format!("measurement {index} is 0 ns, which no call takes"));
        }
        if !seen.insert((m.comparison.as_str(), m.operation.as_str(), m.repeat)) {
            problems.push(format!(
                "measurement {index} repeats ({}, {}, {})",
                m.comparison, m.operation, m.repeat
            ));
        }
    }
    let wanted = plan.len() * OPERATIONS.len() * timing.repeats;
    if timings.measurements.len() != wanted {
        problems.push(format!(
            "{} measurements, the protocol calls for {wanted}",
            timings.measurements.len()
        ));
    }
    if let Some(first) = problems.first() {
        fail(
            report,
            TimingProblem::Measurements {
                count: problems.len(),
                first: first.clone(),
            },
        );
    }
    report.count(Checked::Timings, timings.measurements.len());
    report.note(Note::TimingsForm);
}

/// (configuration label, length, operation).
pub type MedianKey = (String, usize, &'static str);

/// The medians (lower middle for an even count) by (configuration, length, operation), in the
/// order summary tables list them.
pub fn medians(
    inputs: &[InputPlan],
    plan: &[ComparisonPlan],
    configs: &[String],
    tokens: &[usize],
    timings: &Timings,
) -> Vec<(MedianKey, (u64, usize))> {
    let key_of: BTreeMap<&str, (String, usize)> = plan
        .iter()
        .map(|e| (e.id.as_str(), (e.config.label(), inputs[e.input].tokens)))
        .collect();
    let mut groups: BTreeMap<(String, usize, &str), Vec<u64>> = BTreeMap::new();
    for m in &timings.measurements {
        if let (Some((config, n)), Some(op)) = (
            key_of.get(m.comparison.as_str()),
            OPERATIONS.iter().find(|&&op| op == m.operation),
        ) {
            groups
                .entry((config.clone(), *n, op))
                .or_default()
                .push(m.ns);
        }
    }
    let mut out = Vec::new();
    for config in configs {
        for &n in tokens {
            for op in OPERATIONS {
                if let Some(values) = groups.get_mut(&(config.clone(), n, op)) {
                    values.sort_unstable();
                    let median = values[(values.len() - 1) / 2];
                    out.push(((config.clone(), n, op), (median, values.len())));
                }
            }
        }
    }
    out
}

/// summary.json's timing rows must be exactly the medians of timings.json, in order.
pub fn check_medians(
    inputs: &[InputPlan],
    plan: &[ComparisonPlan],
    configs: &[String],
    tokens: &[usize],
    timings: Option<&Timings>,
    summary: &Summary,
    report: &mut Report,
) {
    let fail = |report: &mut Report, p: TimingProblem| report.fail(Problem::Timings(p));
    let Some(timings) = timings else {
        if !summary.timings.is_empty() {
            fail(report, TimingProblem::Unexpected);
        }
        return;
    };
    let expected = medians(inputs, plan, configs, tokens, timings);
    if summary.timings.len() != expected.len() {
        fail(
            report,
            TimingProblem::Rows {
                found: summary.timings.len(),
                expected: expected.len(),
            },
        );
    }
    for (row, ((config, n, op), (median, count))) in summary.timings.iter().zip(&expected) {
        let same_key = (&row.config, row.tokens, row.operation.as_str()) == (config, *n, *op);
        if !same_key || (row.median_ns, row.measurements) != (*median, *count) {
            fail(
                report,
                TimingProblem::Median {
                    config: row.config.clone(),
                    tokens: row.tokens,
                    operation: row.operation.clone(),
                    recorded: row.median_ns,
                    recorded_count: row.measurements,
                    median: *median,
                    count: *count,
                },
            );
        }
    }
}
