//! error-vs-bytes.svg: every marker tied to its numbers, in its own panel, placed where that
//! panel's axes say. What the audit requires of any chart of panels, and what it leaves to the
//! chart (the style: colours, shapes, paint, dashes, anchoring), is in [`crate::common::panels`];
//! this module derives what this chart must hold.
//!
//! The chart is a grid of panels, one column per length and one row per condition (a
//! distribution, or a model's layer), row by row in protocol order. Each panel is a
//! `<g class="panel" data-tokens="N" data-distribution="clean">` (a model's: `data-condition="l5"`)
//! that declares its log-log axis mapping and holds its markers, `<g class="marker" data-config
//! data-distribution (or data-condition) data-tokens data-payload-bytes data-relative-l2
//! transform="translate(X,Y)">` around one shape. The audit requires:
//! - the panels in that order, each titled `N=128 · clean` (`N=128 · layer 5`), each with its
//!   float32 line at the float32 K+V size at its length, labelled `float32 65,536 B`;
//! - in each panel exactly its markers: one per configuration with a positive mean error there,
//!   in configuration order, whose data equal the audit's own mean over seeds (or texts and KV
//!   heads) and payload, with no other attribute, each where its panel's mapping puts it;
//! - a legend under the heading `packed settings`, then `budget policies (hollow)`, with a
//!   swatch per configuration in that order (`data-series` its label); and besides it only the
//!   chart's title and its axis titles (the y axis's says what a mean is over: seeds, or texts
//!   and heads).

pub use crate::common::problem::ChartProblem;
use std::collections::BTreeMap;

use crate::common::panels::{ExpectedChart, ExpectedMarker, ExpectedPanel, check_panels};
use crate::common::report::{Problem, Report};
use crate::common::svg::percent_label;
use crate::common::text::thousands;
use crate::packed_kv::comparisons::Recomputed;
use crate::packed_kv::plan::{ComparisonPlan, Config, InputPlan, Study, layer_condition};
use crate::packed_kv::protocol::Protocol;

/// Checks the error-vs-bytes chart against the audit's recomputed values.
pub fn check(
    svg: &str,
    p: &Protocol,
    inputs: &[InputPlan],
    plan: &[ComparisonPlan],
    configs: &[Config],
    recomputed: &BTreeMap<String, Recomputed>,
    report: &mut Report,
) {
    let expected = expected_chart(p, inputs, plan, configs, recomputed);
    check_panels(svg, &expected, Problem::Chart, report);
}

/// The conditions (rows) in protocol order: the name markers carry, and the one titles show.
fn conditions(p: &Protocol) -> Vec<(String, String)> {
    match &p.model {
        Some(m) => m
            .layers
            .iter()
            .map(|&layer| (layer_condition(layer), format!("layer {layer}")))
            .collect(),
        None => p
            .distributions
            .iter()
            .map(|d| (d.name().to_string(), d.name().to_string()))
            .collect(),
    }
}

fn expected_chart(
    p: &Protocol,
    inputs: &[InputPlan],
    plan: &[ComparisonPlan],
    configs: &[Config],
    recomputed: &BTreeMap<String, Recomputed>,
) -> ExpectedChart {
    let budget = |config: &Config| {
        plan.iter()
            .find(|e| e.config == *config)
            .is_some_and(|e| e.study == Study::Budget)
    };
    let attribute = if p.model.is_some() {
        "data-condition"
    } else {
        "data-distribution"
    };
    let mut panels = Vec::new();
    for (condition, title) in conditions(p) {
        for (column, &n) in p.tokens.iter().enumerate() {
            let mut markers = Vec::new();
            for config in configs {
                let mine: Vec<&Recomputed> = plan
                    .iter()
                    .filter(|e| e.config == *config)
                    .filter(|e| {
                        inputs[e.input].condition() == condition && inputs[e.input].tokens == n
                    })
                    .filter_map(|e| recomputed.get(&e.id))
                    .collect();
                let Some(first) = mine.first() else {
                    continue;
                };
                let mean = mine.iter().map(|r| r.relative_l2).sum::<f64>() / mine.len() as f64;
                if mean > 0.0 {
                    markers.push(ExpectedMarker {
                        strings: vec![
                            ("data-config", config.label()),
                            (attribute, condition.clone()),
                            ("data-tokens", n.to_string()),
                            ("data-payload-bytes", first.payload_bytes.to_string()),
                        ],
                        numbers: vec![("data-relative-l2", mean)],
                        x: first.payload_bytes as f64,
                        y: mean,
                        config: config.label(),
                        condition: condition.clone(),
                        tokens: n,
                        series: config.label(),
                    });
                }
            }
            let float32 = 2 * 4 * n as u128 * p.features as u128;
            panels.push(ExpectedPanel {
                attributes: vec![
                    ("data-tokens", n.to_string()),
                    (attribute, condition.clone()),
                ],
                title: format!("N={n} · {title}"),
                first_column: column == 0,
                float32: float32 as f64,
                float32_label: format!("float32 {} B", thousands(float32)),
                empty_note: "every error is 0: nothing to mark on a log scale",
                markers,
                frontier: Vec::new(),
            });
        }
    }
    let group = |budget_group: bool| -> Vec<String> {
        configs
            .iter()
            .filter(|c| budget(c) == budget_group)
            .map(|c| c.label())
            .collect()
    };
    let mut legend = vec![("packed settings".to_string(), group(false))];
    if configs.iter().any(budget) {
        legend.push(("budget policies (hollow)".to_string(), group(true)));
    }
    let mut texts = vec![
        format!("{}: attention-output error against K+V payload", p.study),
        "K+V payload bytes (log)".to_string(),
        "one column per length N, each on its own scale".to_string(),
        "relative L2 error (log),".to_string(),
        if p.model.is_some() {
            "mean over texts and heads"
        } else {
            "mean over seeds"
        }
        .to_string(),
    ];
    texts.extend(legend.iter().map(|(heading, _)| heading.clone()));
    ExpectedChart {
        panels,
        legend,
        texts,
        y_label: percent_label,
    }
}
