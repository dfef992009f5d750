//! quality-vs-bytes.svg: one panel per schedule (in order of first appearance among the runs),
//! side by side, each `<g class="panel" data-schedule="prefill">` declaring its log-log mapping
//! and holding its markers, `<g class="marker" data-setting data-policy data-schedule
//! data-bytes-per-token data-kl-mean transform="translate(X,Y)">`. The audit requires what
//! [`crate::common::panels`] requires of a chart of panels (the figures, not the style): exactly
//! the runs with a positive mean KL, in run order, in their schedule's panel, with the audit's
//! recomputed bytes per token and mean KL, within a pixel of the panel's mapping, each drawn as a
//! point there; each panel titled `schedule: prefill`, one y range for all, its float32 line at
//! 46,080 B/token labelled `float32 46,080 B/token`; tick labels at their pixel. A series is a
//! (setting, policy) pair: the pairs with policy `uniform` first, then the others, each in order
//! of first appearance; the legend lists them in that order, under `settings (uniform policy)`
//! (labelled `g32_b4`) or `with a budget policy (hollow)` (labelled `g32_b4 + recent_f32:64`).

use super::bytes::FLOAT32_BYTES_PER_TOKEN;
use super::protocol::{Run, Window};
use super::summary::Aggregate;
use crate::common::panels::{ExpectedChart, ExpectedMarker, ExpectedPanel, check_panels};
use crate::common::report::{Problem, Report};
use crate::common::svg::decimal_label;
use crate::common::text::thousands;

/// Checks the chart against the runs and the audit's aggregates (one per run).
pub(super) fn check_chart(
    svg: &str,
    study: &str,
    runs: &[Run],
    aggregates: &[Aggregate],
    report: &mut Report,
) {
    let pair = |run: &Run| (run.setting.to_string(), run.policy.to_string());
    let mut series: Vec<(String, String)> = Vec::new();
    for uniform in [true, false] {
        for run in runs {
            if (run.policy == Window::Uniform) == uniform && !series.contains(&pair(run)) {
                series.push(pair(run));
            }
        }
    }
    let mut schedules: Vec<String> = Vec::new();
    for run in runs {
        if !schedules.contains(&run.schedule.to_string()) {
            schedules.push(run.schedule.to_string());
        }
    }
    let float32 = FLOAT32_BYTES_PER_TOKEN;
    let panels = schedules
        .iter()
        .enumerate()
        .map(|(column, schedule)| {
            let markers = runs
                .iter()
                .zip(aggregates)
                .enumerate()
                .filter(|(_, (run, a))| run.schedule.to_string() == *schedule && a.kl_mean > 0.0)
                .map(|(index, (run, a))| {
                    let (setting, policy) = pair(run);
                    let series = if policy == "uniform" {
                        setting.clone()
                    } else {
                        format!("{setting} + {policy}")
                    };
                    ExpectedMarker {
                        strings: vec![
                            ("data-setting", setting.clone()),
                            ("data-policy", policy.clone()),
                            ("data-schedule", schedule.clone()),
                        ],
                        numbers: vec![
                            ("data-bytes-per-token", a.bytes_per_token),
                            ("data-kl-mean", a.kl_mean),
                        ],
                        x: a.bytes_per_token,
                        y: a.kl_mean,
                        config: setting,
                        condition: format!("{policy} {schedule}"),
                        tokens: index,
                        series,
                    }
                })
                .collect();
            ExpectedPanel {
                attributes: vec![("data-schedule", schedule.clone())],
                title: format!("schedule: {schedule}"),
                first_column: column == 0,
                float32: float32 as f64,
                float32_label: format!("float32 {} B/token", thousands(float32)),
                empty_note: "every KL is 0: nothing to mark on a log scale",
                markers,
            }
        })
        .collect();
    let group = |uniform: bool| -> Vec<String> {
        series
            .iter()
            .filter(|(_, policy)| (policy == "uniform") == uniform)
            .map(|(setting, policy)| {
                if uniform {
                    setting.clone()
                } else {
                    format!("{setting} + {policy}")
                }
            })
            .collect()
    };
    let mut legend = vec![("settings (uniform policy)".to_string(), group(true))];
    if series.iter().any(|(_, policy)| policy != "uniform") {
        legend.push(("with a budget policy (hollow)".to_string(), group(false)));
    }
    let mut texts = vec![
        format!("{study}: next-token KL against cache bytes"),
        "KV cache bytes per token (log)".to_string(),
        "one panel per schedule, each on its own scale".to_string(),
        "KL(p_f32 || p_packed) (log),".to_string(),
        "mean over positions and texts".to_string(),
    ];
    texts.extend(legend.iter().map(|(heading, _)| heading.clone()));
    let expected = ExpectedChart {
        panels,
        legend,
        texts,
        marker_attributes: vec![
            "data-setting",
            "data-policy",
            "data-schedule",
            "data-bytes-per-token",
            "data-kl-mean",
        ],
        y_label: decimal_label,
    };
    check_panels(svg, &expected, Problem::QualityChart, report);
}
