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
//! A series is a cache label (`crate::study::run_label`): first the settings under the
//! `uniform` policy (`g32_b4`), then the settings under a budget policy (`g32_b4 +
//! recent_f32:64`), then the named schemes (`kivi4`, `kvpack-k4v4`), each group in order of first
//! appearance; series i gets [`evidence::chart`]'s colour and shape i, hollow for a budget
//! policy and filled otherwise, and the legend lists them under "settings (uniform policy)",
//! "with a budget policy (hollow)" and "named schemes (--scheme)" (a heading only when it has
//! series). One marker per summary row whose mean KL is positive (a log scale cannot place 0)
//! and whose cache is not a one-layer probe ([`crate::frontier::is_probe`]: sixty of them at one
//! size would hide each other, and they are no cache to choose; a probe has no series either),
//! carrying its data (`data-setting` and `data-policy` for a setting, `data-scheme` for a
//! scheme):
//!
//! ```text
//! <g class="panel" data-schedule="prefill" data-x-range="LO HI" data-y-range="LO HI"
//!    data-x-pixels="A B" data-y-pixels="C D">
//!   <text>schedule: prefill</text> <rect .../> grid lines, tick labels, float32 label ...
//!   <g class="float32"><polyline .../> (one per dash) </g>
//!   <g class="frontier"><polyline points="X1,Y1 X2,Y1" .../> <polyline points="X2,Y1 X2,Y2"
//!      .../> ... </g>
//!   <g class="marker" data-setting="g32_b4" data-policy="uniform" data-schedule="prefill"
//!      data-bytes-per-token="5976.0" data-kl-mean="0.0123..." transform="translate(X,Y)">
//!     <circle r="5" .../>
//!   </g> ...
//! </g>
//! ```
//!
//! The frontier is a staircase through the panel's markers that are on their schedule's Pareto
//! frontier ([`crate::frontier::members`]), taken in order of bytes per token (ties in run
//! order): from each such marker's pixel (X_i, Y_i) a horizontal segment to (X_i+1, Y_i), then
//! a vertical one to (X_i+1, Y_i+1), each a two-point polyline, a segment of zero length left
//! out. Between two frontier caches, the best mean KL a cache of that size reaches is the
//! smaller one's: hence steps, not a slope. The group is drawn after the float32 line and
//! before the markers (so that they sit on it), and only when it has a segment.
//!
//! Values are printed with Rust's `{:?}` for f64; the axis mapping and layout are
//! [`evidence::chart`]'s.

use std::fmt::Write as _;

use crate::frontier::{is_probe, members, schedules};
use crate::study::{QualityProtocol, Summary, SummaryRow};
use evidence::chart::{Layout, Panel, Series, bytes_label, fitted, series_shape, significant};

/// The legend's groups, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Group {
    Uniform,
    Budget,
    Scheme,
}

impl Group {
    const ALL: [Group; 3] = [Group::Uniform, Group::Budget, Group::Scheme];

    fn of(row: &SummaryRow) -> Group {
        match (&row.scheme, row.policy.as_deref()) {
            (Some(_), _) => Group::Scheme,
            (None, Some("uniform")) => Group::Uniform,
            (None, _) => Group::Budget,
        }
    }

    fn heading(self) -> &'static str {
        match self {
            Group::Uniform => "settings (uniform policy)",
            Group::Budget => "with a budget policy (hollow)",
            Group::Scheme => "named schemes (--scheme)",
        }
    }
}

/// The series, in style order: (label, group).
fn series(summary: &Summary) -> Vec<(String, Group)> {
    let mut out: Vec<(String, Group)> = Vec::new();
    for group in Group::ALL {
        for row in summary.rows.iter().filter(|r| !is_probe(r)) {
            let entry = (row.label(), group);
            if Group::of(row) == group && !out.contains(&entry) {
                out.push(entry);
            }
        }
    }
    out
}

/// The frontier's segments through `corners` (module docs).
fn staircase(corners: &[(i32, i32)]) -> Vec<((i32, i32), (i32, i32))> {
    let mut out = Vec::new();
    for pair in corners.windows(2) {
        let ((x1, y1), (x2, y2)) = (pair[0], pair[1]);
        for segment in [((x1, y1), (x2, y1)), ((x2, y1), (x2, y2))] {
            if segment.0 != segment.1 {
                out.push(segment);
            }
        }
    }
    out
}

/// A marker's data attributes naming its cache.
fn naming(row: &SummaryRow) -> String {
    match (&row.scheme, &row.setting, &row.policy) {
        (Some(scheme), _, _) => format!(r#"data-scheme="{scheme}""#),
        (None, setting, policy) => format!(
            r#"data-setting="{}" data-policy="{}""#,
            setting.as_deref().unwrap_or(""),
            policy.as_deref().unwrap_or("")
        ),
    }
}

/// Renders the chart as SVG text.
pub fn quality_vs_bytes(protocol: &QualityProtocol, summary: &Summary) -> Result<String, String> {
    let on_frontier = members(summary);
    let markers: Vec<(&SummaryRow, bool)> = summary
        .rows
        .iter()
        .zip(on_frontier)
        .filter(|(r, _)| r.kl_mean > 0.0 && !is_probe(r))
        .collect();
    let series = series(summary);
    let schedules = schedules(summary);
    let float32 = summary.float32.bytes_per_token;
    let y_range = fitted(markers.iter().map(|(m, _)| m.kl_mean)).unwrap_or((1e-3, 1e-2));
    let legend: Vec<(&str, Vec<Series>)> = Group::ALL
        .into_iter()
        .map(|group| {
            let entries = series
                .iter()
                .enumerate()
                .filter(|(_, (_, g))| *g == group)
                .map(|(index, (label, _))| Series {
                    label: label.clone(),
                    index,
                    hollow: group == Group::Budget,
                })
                .collect::<Vec<_>>();
            (group.heading(), entries)
        })
        .filter(|(_, entries)| !entries.is_empty())
        .collect();
    let layout = Layout {
        title: format!("{}: next-token KL against cache bytes", protocol.study),
        x_title: [
            "KV cache bytes per token (log)",
            "one panel per schedule, each on its own scale; the line joins its Pareto frontier",
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
        let mine: Vec<_> = markers
            .iter()
            .filter(|(m, _)| m.schedule == *schedule)
            .collect();
        let x_range = fitted(mine.iter().map(|(m, _)| m.bytes_per_token).chain([float32]))
            .ok_or("quality-vs-bytes.svg: a float32 cache of 0 bytes per token")?;
        let panel = Panel {
            column,
            row: 0,
            title: format!("schedule: {schedule}"),
            attributes: format!(r#"data-schedule="{schedule}""#),
            x_range,
            float32,
            float32_label: format!("float32 {} B/token", crate::report::bytes_or_whole(float32)),
            empty_note: mine
                .is_empty()
                .then_some("every KL is 0: nothing to mark on a log scale"),
        };
        let points: Vec<(f64, f64)> = mine
            .iter()
            .map(|(m, _)| (m.bytes_per_token, m.kl_mean))
            .collect();
        let (opening, placed) = layout.panel(&panel, &points)?;
        out.push_str(&opening);
        let mut corners: Vec<(f64, (i32, i32))> = mine
            .iter()
            .zip(&placed)
            .filter(|((_, on), _)| *on)
            .map(|((m, _), &xy)| (m.bytes_per_token, xy))
            .collect();
        // A stable sort keeps run order among equal bytes.
        corners.sort_by(|a, b| a.0.total_cmp(&b.0));
        let steps = staircase(&corners.iter().map(|c| c.1).collect::<Vec<_>>());
        if !steps.is_empty() {
            out.push_str("<g class=\"frontier\">\n");
            for ((x1, y1), (x2, y2)) in steps {
                let _ = writeln!(
                    out,
                    r##"<polyline points="{x1},{y1} {x2},{y2}" fill="none" stroke="#444444" stroke-width="1.5"/>"##
                );
            }
            out.push_str("</g>\n");
        }
        for ((m, _), (x, y)) in mine.iter().zip(placed) {
            let group = Group::of(m);
            let entry = (m.label(), group);
            let index = series.iter().position(|s| *s == entry).unwrap_or(0);
            let _ = writeln!(
                out,
                r#"<g class="marker" {} data-schedule="{}" data-bytes-per-token="{:?}" data-kl-mean="{:?}" transform="translate({x},{y})">{}</g>"#,
                naming(m),
                m.schedule,
                m.bytes_per_token,
                m.kl_mean,
                series_shape(index, group == Group::Budget)
            );
        }
        out.push_str("</g>\n");
    }
    out.push_str("</svg>\n");
    Ok(out)
}
