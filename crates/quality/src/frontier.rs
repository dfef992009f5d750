//! Which caches are worth their bytes: each schedule's Pareto frontier, and the runs ranked at
//! matched budgets.
//!
//! **Probes.** A scheme that quantizes one layer and holds every other float32
//! (`kvpack-k4v4-layer7`, [`is_probe`]) says where a cache's error comes from, not what a cache
//! of its size can do: it is on no frontier, dominates nothing and is left out of the chart (a
//! layer-by-layer study puts sixty of them at one size). The budgets need no rule for it: at
//! nearly 32 bits per element it lies in none.
//!
//! **Frontier.** Runs are compared only with runs of their own schedule (a schedule changes what
//! a cache holds when). Run r, not a probe, is on its schedule's frontier unless another such run
//! s of that schedule, or the float32 cache (its bytes per token, mean KL 0), dominates it:
//! bytes_s <= bytes_r and kl_s <= kl_r, with one of the two strict. Runs at the same point do not
//! dominate each other, so both are on it. A run that stores as much as the float32 cache and
//! loses anything is dominated by it.
//!
//! **Budgets.** [`BUDGETS`] are about 2.5, 4.5 and 8.5 bits per element (the widths where the
//! literature's 2-, 4- and 8-bit formats land once their metadata is billed). A run belongs to a
//! budget when its bits per element lie within [`WITHIN`] of it (both ends included), so a run
//! may belong to none or, at 3.5 or 6.5 bits exactly, to two. Within a budget, runs are listed per
//! schedule (in order of first appearance) and ranked by mean KL, lowest first, ties in run
//! order; ranks count from 1 in each (budget, schedule).

use kvschemes::codec::CodecScheme;

use crate::study::{Summary, SummaryRow};

/// The budgets, in bits per element.
pub const BUDGETS: [f64; 3] = [2.5, 4.5, 8.5];
/// How far from a budget a run may lie, in bits per element.
pub const WITHIN: f64 = 1.0;

/// Whether a row's cache is a probe: a codec scheme with `-layer<L>` (module docs).
pub fn is_probe(row: &SummaryRow) -> bool {
    row.scheme
        .as_deref()
        .and_then(CodecScheme::parse)
        .is_some_and(|s| s.layer.is_some())
}

/// Whether each summary row is on its schedule's frontier (module docs).
pub fn members(summary: &Summary) -> Vec<bool> {
    let float32 = summary.float32.bytes_per_token;
    let dominates =
        |(bs, ks): (f64, f64), (br, kr): (f64, f64)| bs <= br && ks <= kr && (bs < br || ks < kr);
    summary
        .rows
        .iter()
        .map(|r| {
            let point = (r.bytes_per_token, r.kl_mean);
            !is_probe(r)
                && !dominates((float32, 0.0), point)
                && !summary
                    .rows
                    .iter()
                    .filter(|s| s.schedule == r.schedule && !is_probe(s))
                    .any(|s| dominates((s.bytes_per_token, s.kl_mean), point))
        })
        .collect()
}

/// One line of the ranked table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ranked {
    /// Index into [`BUDGETS`].
    pub budget: usize,
    /// Index into the summary's rows.
    pub row: usize,
    /// 1 for the lowest mean KL of its (budget, schedule).
    pub rank: usize,
}

/// The schedules in order of first appearance.
pub fn schedules(summary: &Summary) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for row in &summary.rows {
        if !out.contains(&row.schedule) {
            out.push(row.schedule.clone());
        }
    }
    out
}

/// The ranked table's lines, in order (module docs).
pub fn ranked(summary: &Summary) -> Vec<Ranked> {
    let mut out = Vec::new();
    for (budget, &bits) in BUDGETS.iter().enumerate() {
        for schedule in schedules(summary) {
            let mut rows: Vec<usize> = (0..summary.rows.len())
                .filter(|&i| {
                    let r = &summary.rows[i];
                    r.schedule == schedule && (r.bits_per_element - bits).abs() <= WITHIN
                })
                .collect();
            rows.sort_by(|&a, &b| {
                summary.rows[a]
                    .kl_mean
                    .total_cmp(&summary.rows[b].kl_mean)
                    .then(a.cmp(&b))
            });
            out.extend(rows.into_iter().enumerate().map(|(i, row)| Ranked {
                budget,
                row,
                rank: i + 1,
            }));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::study::{Float32Row, SummaryRow};

    fn row(schedule: &str, bytes: f64, kl: f64) -> SummaryRow {
        SummaryRow {
            setting: None,
            policy: None,
            scheme: Some(format!("s{bytes}")),
            schedule: schedule.into(),
            nll_f32: 1.0,
            nll: 1.0,
            perplexity_f32: 1.0,
            perplexity: 1.0,
            kl_mean: kl,
            kl_max: kl,
            kl_median: kl,
            kl_p99: kl,
            kl_p999: kl,
            kl_band_means: vec![Some(kl), None, None],
            top1_agreement: 1.0,
            bytes_per_token: bytes,
            bits_per_element: bytes * 32.0 / 1000.0,
            float32_bytes_per_token: 1000.0,
        }
    }

    fn summary(rows: Vec<SummaryRow>) -> Summary {
        Summary {
            texts: 1,
            float32: Float32Row {
                nll: 1.0,
                perplexity: 1.0,
                bytes_per_token: 1000.0,
            },
            rows,
            attention: None,
            bootstrap: None,
            mechanisms: None,
            sensitivity: None,
        }
    }

    #[test]
    fn a_run_both_larger_and_worse_is_off_the_frontier_and_ties_stay_on() {
        let s = summary(vec![
            row("prefill", 100.0, 0.5),
            row("prefill", 200.0, 0.1),
            row("prefill", 250.0, 0.2),    // dominated by the 200-byte run
            row("prefill", 200.0, 0.1),    // the same point as row 1
            row("streaming", 250.0, 0.2),  // alone in its schedule
            row("prefill", 1000.0, 0.001), // as large as float32, and lossy
        ]);
        assert_eq!(members(&s), [true, true, false, true, true, false]);
    }

    #[test]
    fn a_one_layer_probe_is_on_no_frontier_and_dominates_nothing() {
        let named = |scheme: &str, bytes: f64, kl: f64| SummaryRow {
            scheme: Some(scheme.into()),
            ..row("prefill", bytes, kl)
        };
        let s = summary(vec![
            named("kvpack-k4v4", 150.0, 0.02),
            named("kvpack-k4v4-layer3", 970.0, 0.0001), // would be on it, were it a cache
            named("kvpack-k8v8", 980.0, 0.001),         // dominated only by the probe
            named("kvpack-k2v2-layer0", 940.0, 0.5),
        ]);
        assert_eq!(members(&s), [true, false, true, false]);
        assert!(is_probe(&s.rows[1]) && is_probe(&s.rows[3]));
        assert!(!is_probe(&s.rows[0]) && !is_probe(&row("prefill", 1.0, 0.0)));
    }

    #[test]
    fn runs_are_ranked_per_budget_and_schedule_by_kl() {
        // bits = bytes * 0.032: 62.5 -> 2, 109.375 -> 3.5, 140.625 -> 4.5, 265.625 -> 8.5.
        let s = summary(vec![
            row("prefill", 140.625, 0.3),
            row("streaming", 140.625, 0.1),
            row("prefill", 109.375, 0.2),
            row("prefill", 62.5, 0.9),
            row("prefill", 265.625, 0.01),
        ]);
        let lines: Vec<(usize, usize, usize)> = ranked(&s)
            .into_iter()
            .map(|r| (r.budget, r.row, r.rank))
            .collect();
        assert_eq!(
            lines,
            [
                (0, 2, 1), // 3.5 bits is within one of 2.5 ...
                (0, 3, 2),
                (1, 2, 1), // ... and of 4.5
                (1, 0, 2),
                (1, 1, 1), // streaming ranks apart
                (2, 4, 1),
            ]
        );
    }
}
