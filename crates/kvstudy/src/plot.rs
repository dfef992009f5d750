//! error-vs-bytes.svg: mean relative L2 error against K+V payload bytes, both on log scales, as
//! small multiples.
//!
//! A grid of panels: one column per length (the protocol's `tokens`, in order), one row per
//! condition (the distribution for generated inputs, a model's layer for a model's), in protocol
//! order, each titled "N=128 · clean" (or "N=128 · layer 5"). So lengths never share axes. Each
//! panel has its own log x axis, fitted to its markers' payloads and its float32 K+V size, which
//! a dashed vertical marks and labels ("float32 65,536 B"); every panel shares one log y axis
//! (relative L2), fitted to all markers, so rows and columns compare. The legend, right of the
//! grid, lists the configurations under "packed settings" and then "budget policies (hollow)".
//!
//! Series are the configurations in protocol order (packed settings, then budget policies);
//! series i gets [`evidence::chart`]'s colour and shape i (distinct for the first
//! [`DISTINCT_SERIES`]); packed settings are filled, budget policies hollow. One marker per
//! configuration, length and condition with a positive mean error (a log scale cannot show an
//! exact result), the mean over seeds (or over texts and KV heads), carrying its data:
//!
//! ```text
//! <g class="panel" data-tokens="128" data-distribution="clean"
//!    (a model's inputs: data-condition="l5" in place of data-distribution)
//!    data-x-range="LO HI" data-y-range="LO HI" data-x-pixels="A B" data-y-pixels="C D">
//!   <text>N=128 · clean</text> <rect .../> grid lines, tick labels, float32 label ...
//!   <g class="float32"><polyline .../> (one per dash) </g>
//!   <g class="marker" data-config="g8_b4" data-distribution="clean" data-tokens="128"
//!      data-payload-bytes="8208" data-relative-l2="0.0979..." transform="translate(X,Y)">
//!     <circle r="5" .../>
//!   </g> ...
//! </g>
//! ```
//!
//! The axis mapping and layout are [`evidence::chart`]'s. Drawn from results.json's rows
//! only, with no map iteration and no clock, so the same rows give the same bytes.

use std::fmt::Write as _;

use crate::plan::{Plan, float32_kv_bytes, layer_condition, plans};
use crate::protocol::Protocol;
use crate::study::ResultRow;
pub use evidence::chart::DISTINCT_SERIES;
use evidence::chart::{Layout, Panel, Series, bytes_label, fitted, series_shape, significant};

/// A configuration's mean error at one length and condition.
struct Marker {
    /// Its series' index.
    series: usize,
    label: String,
    budget: bool,
    /// The distribution's name, or the layer's (`l5`).
    condition: String,
    tokens: usize,
    payload_bytes: usize,
    relative_l2: f64,
}

/// Renders the chart as SVG text.
pub fn error_vs_bytes(protocol: &Protocol, rows: &[ResultRow]) -> Result<String, String> {
    let configurations: Vec<(String, bool)> = plans(protocol)
        .iter()
        .map(|p| (p.label(), matches!(p, Plan::Budget { .. })))
        .collect();
    let conditions = conditions(protocol);
    let markers: Vec<Marker> = markers(protocol, &configurations, &conditions, rows)
        .into_iter()
        .filter(|m| m.relative_l2 > 0.0)
        .collect();
    // With no positive error at all (every setting exact), the panels keep a decade of error
    // and say why they hold no marker.
    let y_range = fitted(markers.iter().map(|m| m.relative_l2)).unwrap_or((1e-3, 1e-2));
    let series = |budget: bool| -> Vec<Series> {
        configurations
            .iter()
            .enumerate()
            .filter(|(_, (_, b))| *b == budget)
            .map(|(index, (label, _))| Series {
                label: label.clone(),
                index,
                hollow: budget,
            })
            .collect()
    };
    let mut legend = vec![("packed settings", series(false))];
    if configurations.iter().any(|(_, budget)| *budget) {
        legend.push(("budget policies (hollow)", series(true)));
    }
    let y_label = |y: f64| format!("{}%", significant(y * 100.0));
    let layout = Layout {
        title: format!(
            "{}: attention-output error against K+V payload",
            protocol.study
        ),
        x_title: [
            "K+V payload bytes (log)",
            "one column per length N, each on its own scale",
        ],
        y_title: [
            "relative L2 error (log),",
            if protocol.model.is_some() {
                "mean over texts and heads"
            } else {
                "mean over seeds"
            },
        ],
        columns: protocol.tokens.len(),
        rows: conditions.len(),
        y_range,
        y_label: &y_label,
        x_label: &bytes_label,
        legend,
    };
    let attribute = if protocol.model.is_some() {
        "condition"
    } else {
        "distribution"
    };
    let mut out = layout.open()?;
    for (row, (condition, title)) in conditions.iter().enumerate() {
        for (column, &n) in protocol.tokens.iter().enumerate() {
            let mine: Vec<&Marker> = markers
                .iter()
                .filter(|m| m.tokens == n && m.condition == *condition)
                .collect();
            let float32 = float32_kv_bytes(n, protocol.features) as f64;
            let x_range = fitted(mine.iter().map(|m| m.payload_bytes as f64).chain([float32]))
                .ok_or("error-vs-bytes.svg: a float32 size of 0 bytes")?;
            let panel = Panel {
                column,
                row,
                title: format!("N={n} · {title}"),
                attributes: format!(r#"data-tokens="{n}" data-{attribute}="{condition}""#),
                x_range,
                float32,
                float32_label: format!("float32 {} B", bytes_label(float32)),
                empty_note: mine
                    .is_empty()
                    .then_some("every error is 0: nothing to mark on a log scale"),
            };
            let points: Vec<(f64, f64)> = mine
                .iter()
                .map(|m| (m.payload_bytes as f64, m.relative_l2))
                .collect();
            let (opening, placed) = layout.panel(&panel, &points)?;
            out.push_str(&opening);
            for (m, (x, y)) in mine.iter().zip(placed) {
                let _ = writeln!(
                    out,
                    r#"<g class="marker" data-config="{}" data-{attribute}="{}" data-tokens="{}" data-payload-bytes="{}" data-relative-l2="{:?}" transform="translate({x},{y})">{}</g>"#,
                    m.label,
                    m.condition,
                    m.tokens,
                    m.payload_bytes,
                    m.relative_l2,
                    series_shape(m.series, m.budget)
                );
            }
            out.push_str("</g>\n");
        }
    }
    out.push_str("</svg>\n");
    Ok(out)
}

/// The conditions (rows), in protocol order: the name markers carry, and the panel title's.
fn conditions(protocol: &Protocol) -> Vec<(String, String)> {
    match &protocol.model {
        Some(model) => model
            .layers
            .iter()
            .map(|&layer| (layer_condition(layer), format!("layer {layer}")))
            .collect(),
        None => protocol
            .distributions
            .iter()
            .map(|d| (d.to_string(), d.to_string()))
            .collect(),
    }
}

/// Every (configuration, condition, length) with its mean error over seeds (or texts and KV
/// heads), in protocol order.
fn markers(
    protocol: &Protocol,
    configurations: &[(String, bool)],
    conditions: &[(String, String)],
    rows: &[ResultRow],
) -> Vec<Marker> {
    let mut out = Vec::new();
    for (series, (label, budget)) in configurations.iter().enumerate() {
        for (condition, _) in conditions {
            for &n in &protocol.tokens {
                let mine: Vec<&ResultRow> = rows
                    .iter()
                    .filter(|r| r.label() == *label && r.condition() == *condition && r.tokens == n)
                    .collect();
                let Some(first) = mine.first() else {
                    continue;
                };
                let mean = mine.iter().map(|r| r.relative_l2).sum::<f64>() / mine.len() as f64;
                out.push(Marker {
                    series,
                    label: label.clone(),
                    budget: *budget,
                    condition: condition.clone(),
                    tokens: n,
                    payload_bytes: first.payload_bytes,
                    relative_l2: mean,
                });
            }
        }
    }
    out
}
