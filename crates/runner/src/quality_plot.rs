//! quality-vs-bytes.svg: a model-quality study's mean KL(p_f32 || p_packed) against cache bytes
//! per token, both on log scales.
//!
//! One marker per summary row (a run averaged over the texts): the shape names the schedule
//! (circle `prefill`, triangle `streaming`, diamond `causal`), the colour the setting (in order
//! of first appearance), and a policy other than `uniform` is hollow. A dashed vertical labelled
//! "float32" marks the float32 cache's bytes per token. Rows whose mean KL is 0 cannot be placed
//! on a log scale and are not drawn. Each marker carries its data:
//!
//! ```text
//! <g id="markers" data-x-range="LO HI" data-y-range="LO HI" data-x-pixels="A B" data-y-pixels="C D">
//!   <g class="marker" data-setting="g32_b4" data-policy="uniform" data-schedule="prefill"
//!      data-bytes-per-token="5976.0" data-kl-mean="0.0123..." transform="translate(X,Y)">
//!     <circle r="5" .../>
//!   </g> ...
//! </g>
//! ```
//!
//! Values are printed with Rust's `{:?}` for f64; the axis mapping is plotters' (as in
//! [`crate::plot`]): value v lands at pixel A + (B - A) * ln(v / LO) / ln(HI / LO), rounded.

use std::fmt::Write as _;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::format::thousands;
use crate::plot::{PALETTE, SHAPES, hex, one_two_five, significant};
use crate::quality_study::{QualityProtocol, Summary};

const WIDTH: u32 = 1040;
const HEIGHT: u32 = 600;
const CHART_WIDTH: u32 = 830;

fn schedule_shape(schedule: &str) -> usize {
    match schedule {
        "prefill" => 0,
        "streaming" => 1,
        _ => 2,
    }
}

/// The settings in order of first appearance in the summary.
fn settings(summary: &Summary) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for row in &summary.rows {
        if !out.contains(&row.setting) {
            out.push(row.setting.clone());
        }
    }
    out
}

/// Renders the chart as SVG text.
pub fn quality_vs_bytes(protocol: &QualityProtocol, summary: &Summary) -> Result<String, String> {
    let markers: Vec<_> = summary.rows.iter().filter(|r| r.kl_mean > 0.0).collect();
    let settings = settings(summary);
    let baseline = summary.float32.bytes_per_token as f64;
    let xs = markers.iter().map(|m| m.bytes_per_token).chain([baseline]);
    let x_min = xs.clone().fold(f64::INFINITY, f64::min) * 0.7;
    let x_max = xs.fold(0.0, f64::max) * 1.5;
    let (y_min, y_max) = if markers.is_empty() {
        (1e-3, 1e-1)
    } else {
        (
            markers
                .iter()
                .map(|m| m.kl_mean)
                .fold(f64::INFINITY, f64::min)
                * 0.7,
            markers.iter().map(|m| m.kl_mean).fold(0.0, f64::max) * 1.5,
        )
    };
    let (x_min, y_min) = (x_min.min(x_max / 10.0), y_min.min(y_max / 10.0));

    let mut svg = String::new();
    let placed: Vec<(i32, i32)>;
    let pixels: [(i32, i32); 2];
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        let fail = |e: &dyn std::fmt::Debug| format!("drawing quality-vs-bytes.svg: {e:?}");
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let (left, legend) = root.split_horizontally(CHART_WIDTH);
        let mut chart = ChartBuilder::on(&left)
            .caption(
                format!("{}: next-token KL against cache bytes", protocol.study),
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
            .x_desc("KV cache bytes per token (log)")
            .y_desc("KL(p_f32 || p_packed), mean over positions and texts (log)")
            .x_label_formatter(&|x| thousands(x.round() as usize))
            .y_label_formatter(&|y| significant(*y))
            .draw()
            .map_err(|e| fail(&e))?;
        let grey = RGBColor(90, 90, 90);
        chart
            .draw_series(DashedLineSeries::new(
                vec![(baseline, y_min), (baseline, y_max)],
                6,
                4,
                grey.stroke_width(1),
            ))
            .map_err(|e| fail(&e))?;
        chart
            .draw_series(std::iter::once(Text::new(
                "float32".to_string(),
                (baseline * 0.97, y_max * 0.93),
                ("sans-serif", 13)
                    .into_font()
                    .color(&grey)
                    .pos(Pos::new(HPos::Right, VPos::Top)),
            )))
            .map_err(|e| fail(&e))?;
        if markers.is_empty() {
            chart
                .draw_series(std::iter::once(Text::new(
                    "every KL is 0: nothing to mark on a log scale".to_string(),
                    (x_min * 1.1, y_max * 0.5),
                    ("sans-serif", 15).into_font().color(&grey),
                )))
                .map_err(|e| fail(&e))?;
        }
        placed = markers
            .iter()
            .map(|m| chart.backend_coord(&(m.bytes_per_token, m.kl_mean)))
            .collect();
        let low = chart.backend_coord(&(x_min, y_min));
        let high = chart.backend_coord(&(x_max, y_max));
        pixels = [(low.0, high.0), (low.1, high.1)];
        draw_legend(&legend, &settings).map_err(|e| fail(&e))?;
        root.present().map_err(|e| fail(&e))?;
    }
    let mut out = svg
        .trim_end()
        .strip_suffix("</svg>")
        .ok_or("plotters' SVG does not end with </svg>")?
        .to_string();
    let _ = writeln!(
        out,
        r#"<g id="markers" data-x-range="{x_min:?} {x_max:?}" data-y-range="{y_min:?} {y_max:?}" data-x-pixels="{} {}" data-y-pixels="{} {}">"#,
        pixels[0].0, pixels[0].1, pixels[1].0, pixels[1].1
    );
    for (m, (x, y)) in markers.iter().zip(placed) {
        let index = settings.iter().position(|s| *s == m.setting).unwrap_or(0);
        let color = hex(PALETTE[index % PALETTE.len()]);
        let paint = if m.policy == "uniform" {
            format!(r#"fill="{color}" stroke="none""#)
        } else {
            format!(r#"fill="none" stroke="{color}" stroke-width="2""#)
        };
        let (element, geometry) = SHAPES[schedule_shape(&m.schedule)];
        let _ = writeln!(
            out,
            r#"<g class="marker" data-setting="{}" data-policy="{}" data-schedule="{}" data-bytes-per-token="{:?}" data-kl-mean="{:?}" transform="translate({x},{y})"><{element} {geometry} {paint}/></g>"#,
            m.setting, m.policy, m.schedule, m.bytes_per_token, m.kl_mean
        );
    }
    out.push_str("</g>\n</svg>\n");
    Ok(out)
}

/// A swatch per setting, then a black marker per schedule, then what hollow means.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    settings: &[String],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let font = ("sans-serif", 13).into_font();
    let mut y = 60;
    area.draw(&Text::new("setting", (10, y - 20), font.clone()))?;
    for (index, label) in settings.iter().enumerate() {
        let color = PALETTE[index % PALETTE.len()];
        area.draw(&Rectangle::new([(10, y), (20, y + 10)], color.filled()))?;
        area.draw(&Text::new(label.clone(), (28, y - 1), font.clone()))?;
        y += 18;
    }
    y += 24;
    area.draw(&Text::new("schedule", (10, y - 20), font.clone()))?;
    for (shape, schedule) in ["prefill", "streaming", "causal"].iter().enumerate() {
        match shape {
            0 => area.draw(&Circle::new((15, y + 5), 5, BLACK.filled()))?,
            1 => area.draw(&Polygon::new(
                vec![(15, y - 1), (20, y + 8), (10, y + 8)],
                BLACK.filled(),
            ))?,
            _ => area.draw(&Polygon::new(
                vec![(15, y - 1), (21, y + 5), (15, y + 11), (9, y + 5)],
                BLACK.filled(),
            ))?,
        }
        area.draw(&Text::new(*schedule, (28, y - 1), font.clone()))?;
        y += 18;
    }
    area.draw(&Text::new("hollow: budget policy", (10, y + 6), font))?;
    Ok(())
}
