//! The run's tables, in summary.json and as text:
//! - packed-KV: per setting, the mean relative L2 error over the clean inputs (the published
//!   table's shape), the same mean per distribution, and the K+V payload per length;
//! - budget: per policy, the mean relative L2 error per distribution and the payload per length;
//! - timings: per configuration, length and operation, the median of the raw measurements.
//!
//! Means run over seeds and lengths, in protocol order.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::plan::{float32_kv_bytes, plans};
use crate::protocol::{Axes, Distribution, Mode, Policy, Protocol};
use crate::study::{ResultRow, Study};
use crate::timing::{Operation, Timings, median};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub about: String,
    /// Float32 K+V bytes per length (keys are token counts).
    pub float32_kv_bytes: BTreeMap<String, usize>,
    pub packed_kv: Vec<PackedRow>,
    /// Empty when the protocol has no budget study.
    pub budget: Vec<BudgetRow>,
    /// Empty when the protocol takes no timings.
    pub timings: Vec<TimingRow>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PackedRow {
    pub group_size: usize,
    pub bits: u32,
    #[serde(default, skip_serializing_if = "crate::protocol::is_symmetric")]
    pub mode: Mode,
    /// K on tokens and V on features unless stated (and then not written).
    #[serde(default, skip_serializing_if = "crate::protocol::is_default_axes")]
    pub axes: Axes,
    /// Number of clean inputs averaged (every input of a model: its keys are never shaped).
    pub clean_inputs: usize,
    /// Mean relative L2 over the clean inputs (a fraction); null without clean inputs.
    pub mean_relative_l2_clean: Option<f64>,
    /// The same in percent, rounded to three decimals, as printed.
    pub mean_relative_l2_clean_percent: Option<String>,
    /// Mean relative L2 per distribution (a fraction).
    pub mean_relative_l2: BTreeMap<String, f64>,
    /// K+V payload per length (keys are token counts).
    pub payload_bytes: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetRow {
    pub policy: Policy,
    pub group_size: usize,
    pub low_bits: u32,
    pub window: usize,
    /// Mean relative L2 per distribution (a fraction).
    pub mean_relative_l2: BTreeMap<String, f64>,
    pub payload_bytes: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimingRow {
    /// `g8_b4` for a packed-KV setting, the policy name for a budget one.
    pub config: String,
    pub tokens: usize,
    pub operation: Operation,
    pub median_ns: u64,
    /// How many raw measurements the median is over.
    pub measurements: usize,
}

/// Builds the tables from a run's rows and timings.
pub fn summarize(protocol: &Protocol, rows: &[ResultRow], timings: Option<&Timings>) -> Summary {
    let packed_kv = protocol
        .settings
        .iter()
        .map(|s| {
            let mine = select(rows, Study::PackedKv, |r| {
                r.group_size == s.group_size
                    && r.bits == s.bits
                    && r.mode == s.mode
                    && r.k_axis == s.axes.k()
            });
            let clean = mean_where(&mine, |r| {
                r.distribution == Some(Distribution::Clean) || r.layer.is_some()
            });
            PackedRow {
                group_size: s.group_size,
                bits: s.bits,
                mode: s.mode,
                axes: s.axes,
                clean_inputs: clean.map_or(0, |(_, n)| n),
                mean_relative_l2_clean: clean.map(|(m, _)| m),
                mean_relative_l2_clean_percent: clean.map(|(m, _)| percent(m)),
                mean_relative_l2: means_by_distribution(protocol, &mine),
                payload_bytes: payload_by_length(protocol, &mine),
            }
        })
        .collect();
    let budget = protocol.budget.iter().flat_map(|b| {
        b.policies.iter().map(|policy| {
            let mine = select(rows, Study::Budget, |r| r.policy == Some(*policy));
            BudgetRow {
                policy: *policy,
                group_size: b.group_size,
                low_bits: b.low_bits,
                window: b.window,
                mean_relative_l2: means_by_distribution(protocol, &mine),
                payload_bytes: payload_by_length(protocol, &mine),
            }
        })
    });
    Summary {
        about: if protocol.model.is_some() {
            "Mean relative L2 attention-output error (over texts, KV heads and lengths, per \
             layer; the packed-KV table's headline is over every input), K+V payload per length \
             (codes, f32 scales, float32 segments and two i32 shape values per stored tensor), \
             and median timings in ns (descriptive, machine-dependent)."
        } else {
            "Mean relative L2 attention-output error (over seeds and lengths; the packed-KV \
             table's headline is over the clean inputs), K+V payload per length (codes, f32 \
             scales, float32 segments and two i32 shape values per stored tensor), and median \
             timings in ns (descriptive, machine-dependent)."
        }
        .into(),
        float32_kv_bytes: protocol
            .tokens
            .iter()
            .map(|&n| (n.to_string(), float32_kv_bytes(n, protocol.features)))
            .collect(),
        packed_kv,
        budget: budget.collect(),
        timings: timings.map_or_else(Vec::new, |t| timing_medians(protocol, rows, t)),
    }
}

fn select(rows: &[ResultRow], study: Study, keep: impl Fn(&ResultRow) -> bool) -> Vec<&ResultRow> {
    rows.iter()
        .filter(|r| r.study == study && keep(r))
        .collect()
}

/// (mean relative L2, count) of the rows that pass `keep`, or None if none do.
fn mean_where(rows: &[&ResultRow], keep: impl Fn(&ResultRow) -> bool) -> Option<(f64, usize)> {
    let values: Vec<f64> = rows
        .iter()
        .filter(|r| keep(r))
        .map(|r| r.relative_l2)
        .collect();
    (!values.is_empty()).then(|| {
        (
            values.iter().sum::<f64>() / values.len() as f64,
            values.len(),
        )
    })
}

/// Mean error per condition: per distribution, or per layer of a model's inputs (`l5`).
fn means_by_distribution(protocol: &Protocol, rows: &[&ResultRow]) -> BTreeMap<String, f64> {
    protocol
        .conditions()
        .into_iter()
        .filter_map(|c| mean_where(rows, |r| r.condition() == c).map(|(m, _)| (c, m)))
        .collect()
}

fn payload_by_length(protocol: &Protocol, rows: &[&ResultRow]) -> BTreeMap<String, usize> {
    protocol
        .tokens
        .iter()
        .filter_map(|&n| {
            rows.iter()
                .find(|r| r.tokens == n)
                .map(|r| (n.to_string(), r.payload_bytes))
        })
        .collect()
}

fn timing_medians(protocol: &Protocol, rows: &[ResultRow], timings: &Timings) -> Vec<TimingRow> {
    let config_of: BTreeMap<&str, (String, usize)> = rows
        .iter()
        .map(|r| (r.id.as_str(), (r.label(), r.tokens)))
        .collect();
    let mut groups: BTreeMap<(String, usize, Operation), Vec<u64>> = BTreeMap::new();
    for m in &timings.measurements {
        if let Some((config, tokens)) = config_of.get(m.comparison.as_str()) {
            groups
                .entry((config.clone(), *tokens, m.operation))
                .or_default()
                .push(m.ns);
        }
    }
    let mut out = Vec::new();
    for plan in plans(protocol) {
        let config = plan.label();
        for &tokens in &protocol.tokens {
            for operation in Operation::ALL {
                if let Some(values) = groups.get_mut(&(config.clone(), tokens, operation)) {
                    out.push(TimingRow {
                        config: config.clone(),
                        tokens,
                        operation,
                        measurements: values.len(),
                        median_ns: median(values),
                    });
                }
            }
        }
    }
    out
}

/// A fraction as a percentage with three decimals, e.g. 0.09797 -> "9.797".
pub fn percent(fraction: f64) -> String {
    format!("{:.3}", fraction * 100.0)
}

pub use evidence::format::{thousands, thousands_u64};

pub use evidence::table::Table;

fn error_cell(value: Option<f64>) -> String {
    value.map_or_else(|| "n/a".into(), |m| format!("{}%", percent(m)))
}

fn bytes_cell(value: Option<&usize>) -> String {
    value.map_or_else(|| "n/a".into(), |b| format!("{} B", thousands(*b)))
}

/// The published table's shape: per setting, the clean mean error and the payload per length,
/// then the float32 baseline.
pub fn packed_table(protocol: &Protocol, summary: &Summary) -> Table {
    let headline = if protocol.model.is_some() {
        "rel. error (mean)"
    } else {
        "rel. error (clean mean)"
    };
    let mut headers = vec!["group".into(), "bits".into(), headline.into()];
    headers.extend(protocol.tokens.iter().map(|n| format!("payload N={n}")));
    let mut rows: Vec<Vec<String>> = summary
        .packed_kv
        .iter()
        .map(|row| {
            let mut cells = vec![
                row.group_size.to_string(),
                format!(
                    "{}{}{}",
                    row.bits,
                    if row.mode == Mode::Symmetric {
                        ""
                    } else {
                        " asym"
                    },
                    if row.axes == Axes::KTokenVFeature {
                        ""
                    } else {
                        " swap"
                    }
                ),
                error_cell(row.mean_relative_l2_clean),
            ];
            cells.extend(
                protocol
                    .tokens
                    .iter()
                    .map(|n| bytes_cell(row.payload_bytes.get(&n.to_string()))),
            );
            cells
        })
        .collect();
    let mut baseline = vec!["f32".into(), "32".into(), "0.000%".into()];
    baseline.extend(
        protocol
            .tokens
            .iter()
            .map(|n| bytes_cell(summary.float32_kv_bytes.get(&n.to_string()))),
    );
    rows.push(baseline);
    Table { headers, rows }
}

/// Mean error per condition (distribution or layer) for every configuration of one study.
fn by_distribution_table<'a>(
    protocol: &Protocol,
    first: &str,
    rows: impl Iterator<
        Item = (
            String,
            &'a BTreeMap<String, f64>,
            &'a BTreeMap<String, usize>,
        ),
    >,
) -> Table {
    let mut headers = vec![first.to_string()];
    let conditions = protocol.conditions();
    headers.extend(conditions.iter().cloned());
    headers.extend(protocol.tokens.iter().map(|n| format!("payload N={n}")));
    let rows = rows
        .map(|(label, means, payloads)| {
            let mut cells = vec![label];
            cells.extend(conditions.iter().map(|c| error_cell(means.get(c).copied())));
            cells.extend(
                protocol
                    .tokens
                    .iter()
                    .map(|n| bytes_cell(payloads.get(&n.to_string()))),
            );
            cells
        })
        .collect();
    Table { headers, rows }
}

pub fn packed_by_distribution_table(protocol: &Protocol, summary: &Summary) -> Table {
    by_distribution_table(
        protocol,
        "setting",
        summary.packed_kv.iter().map(|r| {
            let setting = crate::protocol::Setting {
                group_size: r.group_size,
                bits: r.bits,
                mode: r.mode,
                axes: r.axes,
            };
            (setting.label(), &r.mean_relative_l2, &r.payload_bytes)
        }),
    )
}

pub fn budget_table(protocol: &Protocol, summary: &Summary) -> Table {
    by_distribution_table(
        protocol,
        "policy",
        summary
            .budget
            .iter()
            .map(|r| (r.policy.to_string(), &r.mean_relative_l2, &r.payload_bytes)),
    )
}

/// Median timings: one row per configuration and length, with how many raw measurements each
/// median is over, then one column per operation.
pub fn timing_table(summary: &Summary) -> Table {
    let mut headers = vec![
        "config".to_string(),
        "N".to_string(),
        "measurements".to_string(),
    ];
    headers.extend(
        Operation::ALL
            .iter()
            .map(|op| format!("{} (ns)", op.name())),
    );
    let mut rows: Vec<Vec<String>> = Vec::new();
    for row in &summary.timings {
        let key = [row.config.clone(), row.tokens.to_string()];
        if rows.last().is_none_or(|last| last[..2] != key) {
            let mut cells = key.to_vec();
            cells.push(row.measurements.to_string());
            rows.push(cells);
        }
        rows.last_mut()
            .expect("just pushed")
            .push(thousands(row.median_ns as usize));
    }
    Table { headers, rows }
}

/// What the runner prints at the end of a run.
pub fn render(protocol: &Protocol, summary: &Summary) -> String {
    let mut out = packed_table(protocol, summary).to_text();
    out.push('\n');
    if !summary.budget.is_empty() {
        out.push_str(if protocol.model.is_some() {
            "\nbudget (mean rel. error over texts, KV heads and lengths, per layer)\n"
        } else {
            "\nbudget (mean rel. error over seeds and lengths, per distribution)\n"
        });
        out.push_str(&budget_table(protocol, summary).to_text());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_separators() {
        assert_eq!(super::thousands(8208), "8,208");
        assert_eq!(super::thousands(131072), "131,072");
        assert_eq!(super::thousands(999), "999");
        assert_eq!(super::thousands(1000000), "1,000,000");
    }
}
