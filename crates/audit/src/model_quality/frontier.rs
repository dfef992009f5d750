//! Which runs are on their schedule's Pareto frontier, and the runs ranked at matched budgets,
//! derived again from the audit's aggregates (the format's rule, the quality crate's
//! `frontier.rs`):
//!
//! - a one-layer probe (`kvpack-...-layer<L>`, every other layer float32) is on no frontier and
//!   dominates nothing: it says where error comes from, it is no cache to choose;
//! - any other run r is off the frontier when the float32 cache (46,080 B/token, KL 0) or another
//!   run of r's schedule, not a probe, has bytes per token <= r's and mean KL <= r's, one of them
//!   strictly;
//! - the budgets are 2.5, 4.5 and 8.5 bits per element; a run belongs to a budget when its bits
//!   per element (bytes per token * 32 / 46,080) are within 1 of it, both ends included; per
//!   budget, per schedule (in order of first appearance), runs are ranked by mean KL, lowest
//!   first, ties in run order, ranks counting from 1.

use super::protocol::Run;
use super::summary::Aggregate;

/// The budgets, in bits per element.
pub const BUDGETS: [f64; 3] = [2.5, 4.5, 8.5];

/// Whether each run is on its schedule's frontier.
pub fn on_frontier(runs: &[Run], aggregates: &[Aggregate]) -> Vec<bool> {
    let float32 = aggregates
        .first()
        .map_or(f64::NAN, |a| a.float32_bytes_per_token);
    let beats =
        |(b1, k1): (f64, f64), (b2, k2): (f64, f64)| b1 <= b2 && k1 <= k2 && (b1 < b2 || k1 < k2);
    runs.iter()
        .zip(aggregates)
        .map(|(run, a)| {
            let me = (a.bytes_per_token, a.kl_mean);
            let others = runs
                .iter()
                .zip(aggregates)
                .filter(|(other, _)| other.schedule == run.schedule && !other.is_probe())
                .any(|(_, b)| beats((b.bytes_per_token, b.kl_mean), me));
            !run.is_probe() && !others && !beats((float32, 0.0), me)
        })
        .collect()
}

/// The ranked table's lines in order: (budget index, run index, rank).
pub fn ranked(runs: &[Run], aggregates: &[Aggregate]) -> Vec<(usize, usize, usize)> {
    let mut schedules = Vec::new();
    for run in runs {
        if !schedules.contains(&run.schedule) {
            schedules.push(run.schedule);
        }
    }
    let mut lines = Vec::new();
    for (b, budget) in BUDGETS.iter().enumerate() {
        for schedule in &schedules {
            let mut members: Vec<usize> = (0..runs.len().min(aggregates.len()))
                .filter(|&r| {
                    runs[r].schedule == *schedule
                        && (aggregates[r].bits_per_element() - budget).abs() <= 1.0
                })
                .collect();
            // A stable sort keeps run order among equal KL.
            members.sort_by(|&x, &y| aggregates[x].kl_mean.total_cmp(&aggregates[y].kl_mean));
            for (rank, r) in members.into_iter().enumerate() {
                lines.push((b, r, rank + 1));
            }
        }
    }
    lines
}
