//! error-vs-bytes.svg: mean relative L2 error against K+V payload bytes, both on log scales.
//!
//! One marker per configuration (packed-KV setting or budget policy), length and condition:
//! the colour names the configuration, the shape the condition (for generated inputs the
//! distribution: circle `clean`, triangle `early_focus`, diamond `recent_focus`; for a model's
//! inputs the layer, in protocol order: circle, triangle, diamond, square, then again), budget
//! policies are hollow, and each marker is the mean over seeds (or over texts and KV heads).
//! Dashed verticals mark the float32 K+V size at each length.
//!
//! plotters draws the axes, ticks, labels, float32 lines and the legend (to the right of the
//! plot, so nothing covers a marker). The markers are written as SVG elements by this module,
//! because each one carries its data so that a reader, or the audit, can tie it to its rows:
//!
//! ```text
//! <g id="markers" data-x-range="LO HI" data-y-range="LO HI" data-x-pixels="A B" data-y-pixels="C D">
//!   <g class="marker" data-config="g8_b4" data-distribution="clean" data-tokens="128"
//!      (a model's inputs: data-condition="l5" in place of data-distribution)
//!      data-payload-bytes="8208" data-relative-l2="0.0979..." transform="translate(X,Y)">
//!     <circle r="5" .../>
//!   </g> ...
//! </g>
//! ```
//!
//! The axis mapping is plotters': value v lands at pixel A + (B - A) * ln(v / LO) / ln(HI / LO)
//! (rounded to a whole pixel), on both axes. Drawn from results.json's rows only, so the same run
//! gives the same file.

use std::fmt::Write as _;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::plan::{Plan, float32_kv_bytes, layer_condition, plans};
use crate::protocol::{Distribution, Protocol};
use crate::study::ResultRow;
use crate::summary::thousands;

const WIDTH: u32 = 1040;
const HEIGHT: u32 = 600;
/// Pixels left of the legend, which takes the rest of the width.
const CHART_WIDTH: u32 = 830;

/// Tableau-like palette: distinct, readable on white.
pub(crate) const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// One plotted point: (payload bytes, mean relative L2).
type Point = (f64, f64);

/// A configuration's mean error over seeds at one length and distribution.
struct Marker {
    label: String,
    /// The distribution's name, or the layer's (`l5`).
    condition: String,
    /// Which shape: the distribution's, or the layer's position in the protocol.
    shape: usize,
    tokens: usize,
    payload_bytes: usize,
    relative_l2: f64,
}

/// The shapes, centred on (0, 0): SVG element name and geometry.
pub(crate) const SHAPES: [(&str, &str); 4] = [
    ("circle", r#"r="5""#),
    ("polygon", r#"points="0,-6 5.2,3 -5.2,3""#),
    ("polygon", r#"points="0,-6 6,0 0,6 -6,0""#),
    ("polygon", r#"points="-4.5,-4.5 4.5,-4.5 4.5,4.5 -4.5,4.5""#),
];

/// The marker shape of a distribution, centred on (0, 0): SVG element name and geometry.
pub fn marker_shape(distribution: Distribution) -> (&'static str, &'static str) {
    SHAPES[distribution_shape(distribution)]
}

fn distribution_shape(distribution: Distribution) -> usize {
    match distribution {
        Distribution::Clean => 0,
        Distribution::EarlyFocus => 1,
        Distribution::RecentFocus => 2,
    }
}

/// Renders the chart as SVG text.
pub fn error_vs_bytes(protocol: &Protocol, rows: &[ResultRow]) -> Result<String, String> {
    // A log scale cannot show an exact result: markers are drawn for positive errors only.
    let markers: Vec<Marker> = markers(protocol, rows)
        .into_iter()
        .filter(|m| m.relative_l2 > 0.0)
        .collect();
    let labels = labels(protocol);
    let baselines: Vec<(usize, f64)> = protocol
        .tokens
        .iter()
        .map(|&n| (n, float32_kv_bytes(n, protocol.features) as f64))
        .collect();
    let all: Vec<Point> = markers
        .iter()
        .map(|m| (m.payload_bytes as f64, m.relative_l2))
        .collect();
    // With no positive error at all (every setting exact), the axes still span the float32
    // sizes and a decade of error, and the chart says why it holds no marker.
    let x_min = all
        .iter()
        .map(|p| p.0)
        .chain(baselines.iter().map(|b| b.1))
        .fold(f64::INFINITY, f64::min)
        * 0.7;
    let x_max = all
        .iter()
        .map(|p| p.0)
        .chain(baselines.iter().map(|b| b.1))
        .fold(0.0, f64::max)
        * 1.5;
    let (y_min, y_max) = if all.is_empty() {
        (1e-3, 1e-1)
    } else {
        (
            all.iter().map(|p| p.1).fold(f64::INFINITY, f64::min) * 0.7,
            all.iter().map(|p| p.1).fold(0.0, f64::max) * 1.5,
        )
    };
    // Each axis spans at least a decade, so it has at least two 1-2-5 ticks to be read by.
    let (x_min, y_min) = (x_min.min(x_max / 10.0), y_min.min(y_max / 10.0));

    let mut svg = String::new();
    let placed: Vec<(i32, i32)>;
    let pixels: [(i32, i32); 2];
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        let fail = |e: &dyn std::fmt::Debug| format!("drawing error-vs-bytes.svg: {e:?}");
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let (left, legend) = root.split_horizontally(CHART_WIDTH);
        let mut chart = ChartBuilder::on(&left)
            .caption(
                format!(
                    "{}: attention-output error against K+V payload",
                    protocol.study
                ),
                ("sans-serif", 20),
            )
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(
                (x_min..x_max)
                    .log_scale()
                    .with_key_points(one_two_five(x_min, x_max)),
                (y_min..y_max)
                    .log_scale()
                    .with_key_points(one_two_five(y_min, y_max)),
            )
            .map_err(|e| fail(&e))?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .bold_line_style(BLACK.mix(0.12))
            .x_desc("K+V payload bytes (log)")
            .y_desc(if protocol.model.is_some() {
                "relative L2 error, mean over texts and heads (log)"
            } else {
                "relative L2 error, mean over seeds (log)"
            })
            .x_label_formatter(&|x| thousands(x.round() as usize))
            .y_label_formatter(&|y| format!("{}%", significant(y * 100.0)))
            .draw()
            .map_err(|e| fail(&e))?;

        let grey = RGBColor(90, 90, 90);
        for (n, bytes) in &baselines {
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(*bytes, y_min), (*bytes, y_max)],
                    6,
                    4,
                    grey.stroke_width(1),
                ))
                .map_err(|e| fail(&e))?;
            chart
                .draw_series(std::iter::once(Text::new(
                    format!("float32, N={n}"),
                    (*bytes * 0.97, y_max * 0.93),
                    ("sans-serif", 13)
                        .into_font()
                        .color(&grey)
                        .pos(Pos::new(HPos::Right, VPos::Top)),
                )))
                .map_err(|e| fail(&e))?;
        }
        if all.is_empty() {
            chart
                .draw_series(std::iter::once(Text::new(
                    "every error is 0: nothing to mark on a log scale".to_string(),
                    (x_min * 1.1, y_max * 0.5),
                    ("sans-serif", 15).into_font().color(&grey),
                )))
                .map_err(|e| fail(&e))?;
        }
        placed = all.iter().map(|p| chart.backend_coord(p)).collect();
        let low = chart.backend_coord(&(x_min, y_min));
        let high = chart.backend_coord(&(x_max, y_max));
        pixels = [(low.0, high.0), (low.1, high.1)];

        draw_legend(&legend, protocol, &labels).map_err(|e| fail(&e))?;
        root.present().map_err(|e| fail(&e))?;
    }

    // The markers, each with its data, after everything plotters drew.
    let body = svg
        .trim_end()
        .strip_suffix("</svg>")
        .ok_or("plotters' SVG does not end with </svg>")?
        .to_string();
    let mut out = body;
    let _ = writeln!(
        out,
        r#"<g id="markers" data-x-range="{x_min:?} {x_max:?}" data-y-range="{y_min:?} {y_max:?}" data-x-pixels="{} {}" data-y-pixels="{} {}">"#,
        pixels[0].0, pixels[0].1, pixels[1].0, pixels[1].1
    );
    for (m, (x, y)) in markers.iter().zip(placed) {
        let index = labels.iter().position(|l| *l == m.label).unwrap_or(0);
        let color = hex(PALETTE[index % PALETTE.len()]);
        let paint = if is_budget(&m.label) {
            format!(r#"fill="none" stroke="{color}" stroke-width="2""#)
        } else {
            format!(r#"fill="{color}" stroke="none""#)
        };
        let (element, geometry) = SHAPES[m.shape % SHAPES.len()];
        let attribute = if protocol.model.is_some() {
            "condition"
        } else {
            "distribution"
        };
        let _ = writeln!(
            out,
            r#"<g class="marker" data-config="{}" data-{attribute}="{}" data-tokens="{}" data-payload-bytes="{}" data-relative-l2="{:?}" transform="translate({x},{y})"><{element} {geometry} {paint}/></g>"#,
            m.label, m.condition, m.tokens, m.payload_bytes, m.relative_l2
        );
    }
    out.push_str("</g>\n</svg>\n");
    Ok(out)
}

/// The legend, right of the chart: a swatch per configuration (hollow for budget policies), then
/// a black marker per distribution. Each swatch is drawn just before its label.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    protocol: &Protocol,
    labels: &[String],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let font = ("sans-serif", 13).into_font();
    let mut y = 60;
    area.draw(&Text::new("configuration", (10, y - 20), font.clone()))?;
    for (index, label) in labels.iter().enumerate() {
        let color = PALETTE[index % PALETTE.len()];
        let style = if is_budget(label) {
            color.stroke_width(2)
        } else {
            color.filled()
        };
        area.draw(&Rectangle::new([(10, y), (20, y + 10)], style))?;
        area.draw(&Text::new(label.clone(), (28, y - 1), font.clone()))?;
        y += 18;
    }
    y += 24;
    let heading = if protocol.model.is_some() {
        "layer"
    } else {
        "distribution"
    };
    area.draw(&Text::new(heading, (10, y - 20), font.clone()))?;
    for (shape, condition) in conditions(protocol) {
        let center = (15, y + 5);
        match shape % SHAPES.len() {
            0 => area.draw(&Circle::new(center, 5, BLACK.filled()))?,
            1 => area.draw(&Polygon::new(
                vec![(15, y - 1), (20, y + 8), (10, y + 8)],
                BLACK.filled(),
            ))?,
            2 => area.draw(&Polygon::new(
                vec![(15, y - 1), (21, y + 5), (15, y + 11), (9, y + 5)],
                BLACK.filled(),
            ))?,
            _ => area.draw(&Rectangle::new([(11, y + 1), (19, y + 9)], BLACK.filled()))?,
        }
        area.draw(&Text::new(condition, (28, y - 1), font.clone()))?;
        y += 18;
    }
    area.draw(&Text::new("hollow: budget policy", (10, y + 6), font))?;
    Ok(())
}

pub(crate) fn hex(color: RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", color.0, color.1, color.2)
}

fn is_budget(label: &str) -> bool {
    !label.starts_with('g')
}

/// Two significant digits, without trailing zeros: 10 -> "10", 0.5 -> "0.5", 13.4 -> "13".
pub(crate) fn significant(x: f64) -> String {
    let digits = (1 - x.abs().log10().floor() as i32).max(0) as usize;
    let text = format!("{x:.digits$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// Tick positions 1, 2, 5, 10, 20, 50, ... times powers of ten inside [lo, hi].
pub(crate) fn one_two_five(lo: f64, hi: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    let mut decade = 10f64.powi(lo.log10().floor() as i32);
    while decade <= hi {
        for step in [1.0, 2.0, 5.0] {
            let tick = decade * step;
            if (lo..=hi).contains(&tick) {
                ticks.push(tick);
            }
        }
        decade *= 10.0;
    }
    ticks
}

fn labels(protocol: &Protocol) -> Vec<String> {
    plans(protocol).iter().map(Plan::label).collect()
}

/// The conditions markers are drawn for, in protocol order, with their shapes.
fn conditions(protocol: &Protocol) -> Vec<(usize, String)> {
    match &protocol.model {
        Some(model) => model
            .layers
            .iter()
            .enumerate()
            .map(|(i, &layer)| (i, layer_condition(layer)))
            .collect(),
        None => protocol
            .distributions
            .iter()
            .map(|&d| (distribution_shape(d), d.to_string()))
            .collect(),
    }
}

/// Every (configuration, condition, length) with its mean error over seeds (or texts and KV
/// heads), in protocol order.
fn markers(protocol: &Protocol, rows: &[ResultRow]) -> Vec<Marker> {
    let mut out = Vec::new();
    for label in labels(protocol) {
        for (shape, condition) in conditions(protocol) {
            for &n in &protocol.tokens {
                let mine: Vec<&ResultRow> = rows
                    .iter()
                    .filter(|r| r.label() == label && r.condition() == condition && r.tokens == n)
                    .collect();
                let Some(first) = mine.first() else {
                    continue;
                };
                let mean = mine.iter().map(|r| r.relative_l2).sum::<f64>() / mine.len() as f64;
                out.push(Marker {
                    label: label.clone(),
                    condition: condition.clone(),
                    shape,
                    tokens: n,
                    payload_bytes: first.payload_bytes,
                    relative_l2: mean,
                });
            }
        }
    }
    out
}
