//! quality-vs-bytes.svg: a model-quality study's mean KL(p_f32 || p_packed) against cache bytes
//! per token, both on log scales, as small multiples.
//!
//! One panel per schedule (`prefill`, `streaming`, `causal`), in order of first appearance in
//! the summary, side by side, each titled "schedule: prefill": a schedule changes what a cache
//! holds when, so schedules do not share axes. Each panel has its own log x axis, fitted to its
//! markers and the float32 cache's bytes per token, which a dashed vertical marks and labels
//! ("float32 46,080 B/token"); all panels share one log y axis (mean KL), fitted to every
//! marker.
//!
//! A series is a (setting, policy) pair: first the pairs with policy `uniform`, labelled by
//! their setting (`g32_b4`), then the others, labelled `g32_b4 + recent_f32:64`, each group in
//! order of first appearance; series i gets [`evidence::chart`]'s colour and shape i, filled
//! for `uniform` and hollow otherwise, and the legend lists them under "settings (uniform
//! policy)" and "with a budget policy (hollow)". One marker per summary row whose mean KL is
//! positive (a log scale cannot place 0), carrying its data:
//!
//! ```text
//! <g class="panel" data-schedule="prefill" data-x-range="LO HI" data-y-range="LO HI"
//!    data-x-pixels="A B" data-y-pixels="C D">
//!   <text>schedule: prefill</text> <rect .../> grid lines, tick labels, float32 label ...
//!   <g class="float32"><polyline .../> (one per dash) </g>
//!   <g class="marker" data-setting="g32_b4" data-policy="uniform" data-schedule="prefill"
//!      data-bytes-per-token="5976.0" data-kl-mean="0.0123..." transform="translate(X,Y)">
//!     <circle r="5" .../>
//!   </g> ...
//! </g>
//! ```
//!
//! Values are printed with Rust's `{:?}` for f64; the axis mapping and layout are
//! [`evidence::chart`]'s.

use std::fmt::Write as _;

use crate::study::{QualityProtocol, Summary};
use evidence::chart::{Layout, Panel, Series, bytes_label, fitted, series_shape, significant};

/// The series, in style order: (setting, policy), uniform pairs first.
fn series(summary: &Summary) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for uniform in [true, false] {
        for row in &summary.rows {
            let pair = (row.setting.clone(), row.policy.clone());
            if (row.policy == "uniform") == uniform && !out.contains(&pair) {
                out.push(pair);
            }
        }
    }
    out
}

/// The schedules in order of first appearance.
fn schedules(summary: &Summary) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for row in &summary.rows {
        if !out.contains(&row.schedule) {
            out.push(row.schedule.clone());
        }
    }
    out
}

/// Renders the chart as SVG text.
pub fn quality_vs_bytes(protocol: &QualityProtocol, summary: &Summary) -> Result<String, String> {
    let markers: Vec<_> = summary.rows.iter().filter(|r| r.kl_mean > 0.0).collect();
    let series = series(summary);
    let schedules = schedules(summary);
    let float32 = summary.float32.bytes_per_token as f64;
    let y_range = fitted(markers.iter().map(|m| m.kl_mean)).unwrap_or((1e-3, 1e-2));
    let legend_group = |uniform: bool| -> Vec<Series> {
        series
            .iter()
            .enumerate()
            .filter(|(_, (_, policy))| (policy == "uniform") == uniform)
            .map(|(index, (setting, policy))| Series {
                label: if uniform {
                    setting.clone()
                } else {
                    format!("{setting} + {policy}")
                },
                index,
                hollow: !uniform,
            })
            .collect()
    };
    let mut legend = vec![("settings (uniform policy)", legend_group(true))];
    if series.iter().any(|(_, policy)| policy != "uniform") {
        legend.push(("with a budget policy (hollow)", legend_group(false)));
    }
    let layout = Layout {
        title: format!("{}: next-token KL against cache bytes", protocol.study),
        x_title: [
            "KV cache bytes per token (log)",
            "one panel per schedule, each on its own scale",
        ],
        y_title: [
            "KL(p_f32 || p_packed) (log),",
            "mean over positions and texts",
        ],
        columns: schedules.len().max(1),
        rows: 1,
        y_range,
        y_label: &significant,
        x_label: &bytes_label,
        legend,
    };
    let mut out = layout.open()?;
    for (column, schedule) in schedules.iter().enumerate() {
        let mine: Vec<_> = markers.iter().filter(|m| m.schedule == *schedule).collect();
        let x_range = fitted(mine.iter().map(|m| m.bytes_per_token).chain([float32]))
            .ok_or("quality-vs-bytes.svg: a float32 cache of 0 bytes per token")?;
        let panel = Panel {
            column,
            row: 0,
            title: format!("schedule: {schedule}"),
            attributes: format!(r#"data-schedule="{schedule}""#),
            x_range,
            float32,
            float32_label: format!("float32 {} B/token", bytes_label(float32)),
            empty_note: mine
                .is_empty()
                .then_some("every KL is 0: nothing to mark on a log scale"),
        };
        let points: Vec<(f64, f64)> = mine
            .iter()
            .map(|m| (m.bytes_per_token, m.kl_mean))
            .collect();
        let (opening, placed) = layout.panel(&panel, &points)?;
        out.push_str(&opening);
        for (m, (x, y)) in mine.iter().zip(placed) {
            let pair = (m.setting.clone(), m.policy.clone());
            let index = series.iter().position(|s| *s == pair).unwrap_or(0);
            let _ = writeln!(
                out,
                r#"<g class="marker" data-setting="{}" data-policy="{}" data-schedule="{}" data-bytes-per-token="{:?}" data-kl-mean="{:?}" transform="translate({x},{y})">{}</g>"#,
                m.setting,
                m.policy,
                m.schedule,
                m.bytes_per_token,
                m.kl_mean,
                series_shape(index, m.policy != "uniform")
            );
        }
        out.push_str("</g>\n");
    }
    out.push_str("</svg>\n");
    Ok(out)
}
