//! summary.json: every table recomputed from what the audit itself recomputed, with exactly the
//! rows and keys the protocol implies. Means are keyed by condition (the distributions, or a
//! model's layers `l5`); the packed-KV headline is over the clean inputs, which for a model are
//! all of them (its keys are never shaped).

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::common::report::{Checked, Problem, Report};
use crate::common::text::{figures, percent};
use crate::common::tolerance::close;
use crate::packed_kv::comparisons::Recomputed;
use crate::packed_kv::plan::{ComparisonPlan, Config, InputPlan, conditions, setting_label};
use crate::packed_kv::protocol::{Axes, Mode, Policy, Protocol};

/// summary.json.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    /// Free text (no figures).
    pub about: String,
    /// Float32 K + V bytes, by length.
    pub float32_kv_bytes: BTreeMap<String, usize>,
    /// One row per packed-KV setting.
    pub packed_kv: Vec<PackedRow>,
    /// One row per budget policy.
    pub budget: Vec<BudgetRow>,
    /// Median timings.
    pub timings: Vec<TimingRow>,
}

/// A packed-KV setting's row.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackedRow {
    /// Group size.
    pub group_size: usize,
    /// Width.
    pub bits: u32,
    /// Absent when symmetric.
    #[serde(default)]
    pub mode: Option<Mode>,
    /// Absent for the default axes (K on tokens, V on features).
    #[serde(default)]
    pub axes: Option<Axes>,
    /// Clean inputs averaged (every input of a model: its keys are never shaped).
    pub clean_inputs: usize,
    /// Mean relative L2 over the clean inputs.
    pub mean_relative_l2_clean: Option<f64>,
    /// The same in percent with three decimals.
    pub mean_relative_l2_clean_percent: Option<String>,
    /// Mean relative L2 by condition (distribution, or layer `l5`).
    pub mean_relative_l2: BTreeMap<String, f64>,
    /// K + V payload by length.
    pub payload_bytes: BTreeMap<String, usize>,
}

/// A budget policy's row.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetRow {
    /// The policy.
    pub policy: Policy,
    /// Group size.
    pub group_size: usize,
    /// Low width.
    pub low_bits: u32,
    /// Window W.
    pub window: usize,
    /// Mean relative L2 by condition (distribution, or layer `l5`).
    pub mean_relative_l2: BTreeMap<String, f64>,
    /// K + V payload by length.
    pub payload_bytes: BTreeMap<String, usize>,
}

/// One median timing.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimingRow {
    /// Configuration label.
    pub config: String,
    /// N.
    pub tokens: usize,
    /// Operation name.
    pub operation: String,
    /// Median in ns.
    pub median_ns: u64,
    /// Measurements the median is over.
    pub measurements: usize,
}

/// Mean of `values` in order, or None when empty.
pub fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// The audit's own tables, from its recomputed values.
pub struct Tables<'a> {
    p: &'a Protocol,
    inputs: &'a [InputPlan],
    plan: &'a [ComparisonPlan],
    recomputed: &'a BTreeMap<String, Recomputed>,
}

impl<'a> Tables<'a> {
    /// Tables over the comparisons the audit recomputed.
    pub fn new(
        p: &'a Protocol,
        inputs: &'a [InputPlan],
        plan: &'a [ComparisonPlan],
        recomputed: &'a BTreeMap<String, Recomputed>,
    ) -> Tables<'a> {
        Tables {
            p,
            inputs,
            plan,
            recomputed,
        }
    }

    /// Recomputed values of one configuration, with their inputs, in run order.
    fn of(&self, config: Config) -> Vec<(&InputPlan, Recomputed)> {
        self.plan
            .iter()
            .filter(|e| e.config == config)
            .filter_map(|e| Some((&self.inputs[e.input], *self.recomputed.get(&e.id)?)))
            .collect()
    }

    /// Mean relative L2 of a configuration over the inputs `keep` selects.
    pub fn mean_where(
        &self,
        config: Config,
        keep: impl Fn(&InputPlan) -> bool,
    ) -> Option<(f64, usize)> {
        let values: Vec<f64> = self
            .of(config)
            .into_iter()
            .filter(|(i, _)| keep(i))
            .map(|(_, r)| r.relative_l2)
            .collect();
        mean(&values).map(|m| (m, values.len()))
    }

    /// Mean relative L2 by condition (only conditions with comparisons): by distribution, or
    /// by layer for a model's inputs.
    pub fn means(&self, config: Config) -> BTreeMap<String, f64> {
        conditions(self.p)
            .into_iter()
            .filter_map(|c| {
                self.mean_where(config, |i| i.condition() == c)
                    .map(|(m, _)| (c, m))
            })
            .collect()
    }

    /// Payload by length (from the first comparison at that length).
    pub fn payloads(&self, config: Config) -> BTreeMap<String, usize> {
        let rows = self.of(config);
        self.p
            .tokens
            .iter()
            .filter_map(|&n| {
                rows.iter()
                    .find(|(i, _)| i.tokens == n)
                    .map(|(_, r)| (n.to_string(), r.payload_bytes))
            })
            .collect()
    }

    /// Payloads must not depend on the input beyond its length: the first one stands for all.
    pub fn payloads_agree(&self, config: Config) -> bool {
        let rows = self.of(config);
        rows.iter().all(|(i, r)| {
            rows.iter()
                .find(|(j, _)| j.tokens == i.tokens)
                .is_some_and(|(_, first)| first.payload_bytes == r.payload_bytes)
        })
    }
}

/// Checks summary.json's error and payload tables.
pub fn check(p: &Protocol, tables: &Tables, summary: &Summary, report: &mut Report) {
    let fail = |report: &mut Report, place: String, found: String, expected: String| {
        report.fail(Problem::Summary {
            place,
            found,
            expected,
        });
    };
    if let Some(figure) = figures(&summary.about).first() {
        fail(
            report,
            "about".into(),
            format!("holds the figure {figure}"),
            "text without figures".into(),
        );
    }
    let float32: BTreeMap<String, usize> = p
        .tokens
        .iter()
        .map(|&n| (n.to_string(), 2 * 4 * n * p.features))
        .collect();
    if summary.float32_kv_bytes != float32 {
        fail(
            report,
            "float32_kv_bytes".into(),
            format!("{:?}", summary.float32_kv_bytes),
            format!("{float32:?}"),
        );
    }
    let check_maps = |report: &mut Report,
                      label: &str,
                      config: Config,
                      means: &BTreeMap<String, f64>,
                      payloads: &BTreeMap<String, usize>| {
        let expected = tables.means(config);
        let same_keys = means.keys().eq(expected.keys());
        let close_all = same_keys
            && means
                .values()
                .zip(expected.values())
                .all(|(a, b)| close(*a, *b));
        if !close_all {
            report.fail(Problem::Summary {
                place: format!("{label} mean_relative_l2"),
                found: format!("{means:?}"),
                expected: format!("{expected:?}"),
            });
        }
        let expected = tables.payloads(config);
        if *payloads != expected || !tables.payloads_agree(config) {
            report.fail(Problem::Summary {
                place: format!("{label} payload_bytes"),
                found: format!("{payloads:?}"),
                expected: format!("{expected:?}"),
            });
        }
    };

    if summary.packed_kv.len() != p.settings.len() {
        fail(
            report,
            "packed_kv".into(),
            format!("{} rows", summary.packed_kv.len()),
            format!("{} settings", p.settings.len()),
        );
    }
    for (setting, row) in p.settings.iter().zip(&summary.packed_kv) {
        let label = setting_label(setting);
        let mode = (setting.mode == Mode::Asymmetric).then_some(Mode::Asymmetric);
        let axes = (setting.axes != Axes::default()).then_some(setting.axes);
        if (row.group_size, row.bits, row.mode, row.axes)
            != (setting.group_size, setting.bits, mode, axes)
        {
            fail(
                report,
                format!("packed_kv {label}"),
                format!(
                    "row for g{} b{} {:?} {:?}",
                    row.group_size, row.bits, row.mode, row.axes
                ),
                label.clone(),
            );
            continue;
        }
        let config = Config::Setting(*setting);
        let clean = tables.mean_where(config, InputPlan::is_clean);
        let mean_ok = match (row.mean_relative_l2_clean, clean) {
            (Some(recorded), Some((m, _))) => close(recorded, m),
            (None, None) => true,
            _ => false,
        };
        let percent_ok =
            row.mean_relative_l2_clean_percent == row.mean_relative_l2_clean.map(percent);
        if !mean_ok || !percent_ok || row.clean_inputs != clean.map_or(0, |(_, n)| n) {
            fail(
                report,
                format!("packed_kv {label} clean mean"),
                format!(
                    "{:?} ({:?}, {} inputs)",
                    row.mean_relative_l2_clean,
                    row.mean_relative_l2_clean_percent,
                    row.clean_inputs
                ),
                format!(
                    "{:?} ({} inputs)",
                    clean.map(|c| c.0),
                    clean.map_or(0, |c| c.1)
                ),
            );
        }
        check_maps(
            report,
            &format!("packed_kv {label}"),
            config,
            &row.mean_relative_l2,
            &row.payload_bytes,
        );
    }

    let policies: Vec<Policy> = p.budget.iter().flat_map(|b| b.policies.clone()).collect();
    if summary.budget.len() != policies.len() {
        fail(
            report,
            "budget".into(),
            format!("{} rows", summary.budget.len()),
            format!("{} policies", policies.len()),
        );
    }
    if let Some(b) = &p.budget {
        for (&policy, row) in policies.iter().zip(&summary.budget) {
            if (row.policy, row.group_size, row.low_bits, row.window)
                != (policy, b.group_size, b.low_bits, b.window)
            {
                fail(
                    report,
                    format!("budget {policy}"),
                    format!(
                        "row for {} g{} b{} W{}",
                        row.policy, row.group_size, row.low_bits, row.window
                    ),
                    policy.to_string(),
                );
                continue;
            }
            check_maps(
                report,
                &format!("budget {policy}"),
                Config::Policy(policy),
                &row.mean_relative_l2,
                &row.payload_bytes,
            );
        }
    }
    report.count(
        Checked::SummaryRows,
        summary.packed_kv.len() + summary.budget.len(),
    );
}
