//! error-vs-bytes.svg: mean relative L2 error against K+V payload bytes, both on log scales.
//!
//! One marker per configuration (packed-KV setting or budget policy), length and distribution:
//! the colour names the configuration, the shape the distribution, and each marker is the mean
//! over seeds. Dashed verticals mark the float32 K+V size at each length. Drawn with plotters'
//! SVG backend from results.json's rows only, so the same run gives the same file.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::protocol::{Distribution, Protocol};
use crate::study::{ResultRow, float32_kv_bytes, plans};
use crate::summary::{config_label, row_label, thousands};

const WIDTH: u32 = 960;
const HEIGHT: u32 = 600;

/// Tableau-like palette: distinct, readable on white.
const PALETTE: [RGBColor; 10] = [
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

/// Renders the chart as SVG text.
pub fn error_vs_bytes(protocol: &Protocol, rows: &[ResultRow]) -> Result<String, String> {
    let series = points(protocol, rows);
    let all: Vec<Point> = series
        .iter()
        .flat_map(|(_, _, p)| p.iter().copied())
        .collect();
    if all.is_empty() {
        return Err("no comparisons with a positive error to plot".into());
    }
    let baselines: Vec<(usize, f64)> = protocol
        .tokens
        .iter()
        .map(|&n| (n, float32_kv_bytes(n, protocol.features) as f64))
        .collect();
    let x_min = all.iter().map(|p| p.0).fold(f64::INFINITY, f64::min) * 0.7;
    // Room on the right of the largest float32 line for the legend.
    let x_max = baselines.iter().map(|b| b.1).fold(0.0, f64::max) * 4.0;
    let y_min = all.iter().map(|p| p.1).fold(f64::INFINITY, f64::min) * 0.7;
    let y_max = all.iter().map(|p| p.1).fold(0.0, f64::max) * 1.5;

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        let fail = |e: &dyn std::fmt::Debug| format!("drawing error-vs-bytes.svg: {e:?}");
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let mut chart = ChartBuilder::on(&root)
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
            .y_desc("relative L2 error, mean over seeds (log)")
            .x_label_formatter(&|x| thousands(x.round() as usize))
            .y_label_formatter(&|y| format!("{}%", significant(y * 100.0)))
            .draw()
            .map_err(|e| fail(&e))?;

        for (n, bytes) in &baselines {
            let grey = RGBColor(90, 90, 90);
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

        for (color_index, label) in labels(protocol).iter().enumerate() {
            let color = PALETTE[color_index % PALETTE.len()];
            let budget = is_budget(label);
            // Legend entry for the configuration: a filled square in its colour.
            chart
                .draw_series(std::iter::empty::<Circle<Point, i32>>())
                .map_err(|e| fail(&e))?
                .label(label.clone())
                .legend(move |(x, y)| {
                    let style = if budget {
                        color.stroke_width(2)
                    } else {
                        color.filled()
                    };
                    Rectangle::new([(x, y - 5), (x + 10, y + 5)], style)
                });
            for (config, distribution, points) in &series {
                if config != label {
                    continue;
                }
                // Budget policies are hollow, so `uniform` stays visible on top of the packed
                // setting it equals (g32 b4).
                let style = if is_budget(label) {
                    color.stroke_width(2)
                } else {
                    color.filled()
                };
                let drawn = match distribution {
                    Distribution::Clean => {
                        chart.draw_series(points.iter().map(|&p| Circle::new(p, 5, style)))
                    }
                    Distribution::EarlyFocus => {
                        chart.draw_series(points.iter().map(|&p| TriangleMarker::new(p, 6, style)))
                    }
                    Distribution::RecentFocus => chart.draw_series(
                        points
                            .iter()
                            .map(|&p| Cross::new(p, 5, color.stroke_width(2))),
                    ),
                };
                drawn.map_err(|e| fail(&e))?;
            }
        }
        // Legend entries for the distributions: black markers of each shape.
        for distribution in &protocol.distributions {
            let entry = chart
                .draw_series(std::iter::empty::<Circle<Point, i32>>())
                .map_err(|e| fail(&e))?
                .label(distribution.to_string());
            match distribution {
                Distribution::Clean => {
                    entry.legend(|(x, y)| Circle::new((x + 5, y), 5, BLACK.filled()));
                }
                Distribution::EarlyFocus => {
                    entry.legend(|(x, y)| TriangleMarker::new((x + 5, y), 6, BLACK.filled()));
                }
                Distribution::RecentFocus => {
                    entry.legend(|(x, y)| Cross::new((x + 5, y), 5, BLACK.stroke_width(2)));
                }
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(|e| fail(&e))?;
        root.present().map_err(|e| fail(&e))?;
    }
    Ok(svg)
}

fn is_budget(label: &str) -> bool {
    !label.starts_with('g')
}

/// Two significant digits, without trailing zeros: 10 -> "10", 0.5 -> "0.5", 13.4 -> "13".
fn significant(x: f64) -> String {
    let digits = (1 - x.abs().log10().floor() as i32).max(0) as usize;
    let text = format!("{x:.digits$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// Tick positions 1, 2, 5, 10, 20, 50, ... times powers of ten inside [lo, hi].
fn one_two_five(lo: f64, hi: f64) -> Vec<f64> {
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
    plans(protocol).iter().map(config_label).collect()
}

/// (configuration label, distribution, points) with the mean error over seeds per length.
fn points(protocol: &Protocol, rows: &[ResultRow]) -> Vec<(String, Distribution, Vec<Point>)> {
    let mut out = Vec::new();
    for label in labels(protocol) {
        for &distribution in &protocol.distributions {
            let mut points = Vec::new();
            for &n in &protocol.tokens {
                let mine: Vec<&ResultRow> = rows
                    .iter()
                    .filter(|r| {
                        row_label(r) == label
                            && r.distribution == distribution.name()
                            && r.tokens == n
                    })
                    .collect();
                if mine.is_empty() {
                    continue;
                }
                let mean = mine.iter().map(|r| r.relative_l2).sum::<f64>() / mine.len() as f64;
                if mean > 0.0 {
                    points.push((mine[0].payload_bytes as f64, mean));
                }
            }
            out.push((label.clone(), distribution, points));
        }
    }
    out
}
