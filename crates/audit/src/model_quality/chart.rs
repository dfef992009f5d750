//! quality-vs-bytes.svg: one panel per schedule (in order of first appearance among the runs),
//! side by side, each `<g class="panel" data-schedule="prefill">` declaring its log-log mapping
//! and holding its markers, `<g class="marker" data-setting data-policy data-schedule
//! data-bytes-per-token data-kl-mean transform="translate(X,Y)">` (`data-scheme` in place of
//! `data-setting` and `data-policy` for a scheme). The audit requires what
//! [`crate::common::panels`] requires of a chart of panels (the figures, not the style): exactly
//! the runs with a positive mean KL that are not one-layer probes ([`super::frontier`]: sixty at
//! one size would hide each other), in run order, in their schedule's panel, with the audit's
//! recomputed bytes per token and mean KL, within a pixel of the panel's mapping, each drawn as a
//! point there; each panel titled `schedule: prefill`, one y range for all, its float32 line at
//! 46,080 B/token labelled `float32 46,080 B/token`; tick labels at their pixel; and the
//! staircase through the markers on their schedule's Pareto frontier ([`super::frontier`]), in
//! order of bytes per token (ties in run order). A series is a cache label (`g32_b4`, `g32_b4 +
//! recent_f32:64`, `kivi4`; a probe has none): the settings under `uniform` first, then those under a budget
//! policy, then the schemes, each in order of first appearance; the legend lists them in that
//! order under `settings (uniform policy)`, `with a budget policy (hollow)` and `schemes of the
//! literature` (a heading only when it has series).

use super::frontier::on_frontier;
use super::protocol::{Run, SeriesGroup};
use super::summary::Aggregate;
use crate::common::panels::{ExpectedChart, ExpectedMarker, ExpectedPanel, check_panels};
use crate::common::report::{Problem, Report};
use crate::common::svg::decimal_label;

const GROUPS: [(SeriesGroup, &str); 3] = [
    (SeriesGroup::Uniform, "settings (uniform policy)"),
    (SeriesGroup::Budget, "with a budget policy (hollow)"),
    (SeriesGroup::Scheme, "named schemes (--scheme)"),
];

/// Checks the chart against the runs and the audit's aggregates (one per run).
pub(super) fn check_chart(
    svg: &str,
    study: &str,
    runs: &[Run],
    aggregates: &[Aggregate],
    report: &mut Report,
) {
    let mut series: Vec<(String, SeriesGroup)> = Vec::new();
    for (group, _) in GROUPS {
        for run in runs.iter().filter(|r| !r.is_probe()) {
            let entry = (run.label(), group);
            if run.group() == group && !series.contains(&entry) {
                series.push(entry);
            }
        }
    }
    let mut schedules: Vec<String> = Vec::new();
    for run in runs {
        if !schedules.contains(&run.schedule.to_string()) {
            schedules.push(run.schedule.to_string());
        }
    }
    let frontier = on_frontier(runs, aggregates);
    let float32 = aggregates
        .first()
        .map_or(f64::NAN, |a| a.float32_bytes_per_token);
    let panels = schedules
        .iter()
        .enumerate()
        .map(|(column, schedule)| {
            let placed: Vec<usize> = (0..runs.len().min(aggregates.len()))
                .filter(|&r| {
                    runs[r].schedule.to_string() == *schedule
                        && aggregates[r].kl_mean > 0.0
                        && !runs[r].is_probe()
                })
                .collect();
            let markers = placed
                .iter()
                .map(|&r| {
                    let (run, a) = (&runs[r], &aggregates[r]);
                    let mut strings = match (run.scheme(), run.setting_policy()) {
                        (Some(scheme), _) => vec![("data-scheme", scheme.to_string())],
                        (None, (setting, policy)) => vec![
                            ("data-setting", setting.unwrap_or_default()),
                            ("data-policy", policy.unwrap_or_default()),
                        ],
                    };
                    strings.push(("data-schedule", schedule.clone()));
                    ExpectedMarker {
                        strings,
                        numbers: vec![
                            ("data-bytes-per-token", a.bytes_per_token),
                            ("data-kl-mean", a.kl_mean),
                        ],
                        x: a.bytes_per_token,
                        y: a.kl_mean,
                        config: run.label(),
                        condition: schedule.clone(),
                        tokens: r,
                        series: run.label(),
                    }
                })
                .collect();
            // The frontier markers by bytes per token; a stable sort keeps run order on ties.
            let mut steps: Vec<usize> =
                (0..placed.len()).filter(|&m| frontier[placed[m]]).collect();
            steps.sort_by(|&x, &y| {
                aggregates[placed[x]]
                    .bytes_per_token
                    .total_cmp(&aggregates[placed[y]].bytes_per_token)
            });
            ExpectedPanel {
                attributes: vec![("data-schedule", schedule.clone())],
                title: format!("schedule: {schedule}"),
                first_column: column == 0,
                float32,
                float32_label: format!(
                    "float32 {} B/token",
                    super::tables::whole_or_bytes_cell(float32)
                ),
                empty_note: "every KL is 0: nothing to mark on a log scale",
                markers,
                frontier: steps,
            }
        })
        .collect();
    let legend: Vec<(String, Vec<String>)> = GROUPS
        .iter()
        .map(|(group, heading)| {
            let labels: Vec<String> = series
                .iter()
                .filter(|(_, g)| g == group)
                .map(|(label, _)| label.clone())
                .collect();
            (heading.to_string(), labels)
        })
        .filter(|(_, labels)| !labels.is_empty())
        .collect();
    let mut texts = vec![
        format!("{study}: next-token KL against cache bytes"),
        "KV cache bytes per token (log)".to_string(),
        "one panel per schedule, each on its own scale; the line joins its Pareto frontier"
            .to_string(),
        "KL(p_f32 || p_packed) (log),".to_string(),
        "mean over positions and texts".to_string(),
    ];
    texts.extend(legend.iter().map(|(heading, _)| heading.clone()));
    let expected = ExpectedChart {
        panels,
        legend,
        texts,
        y_label: decimal_label,
    };
    check_panels(svg, &expected, Problem::QualityChart, report);
}
