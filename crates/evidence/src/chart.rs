//! What error-vs-bytes.svg and quality-vs-bytes.svg share: the series' colours and shapes, the
//! log axes, the panel grid and the legend.
//!
//! Both charts are small multiples: a grid of panels (each with its own log x axis, all sharing
//! one log y axis so rows compare), and a legend right of the grid. plotters draws everything
//! but the data: each piece (the titles, a legend heading or label, a panel's body, its float32
//! line) on its own document-sized SVG, from which the drawn elements are taken, so that they
//! can be placed among the groups written here by hand, which plotters cannot emit: a panel
//! group declaring its axis mapping, the markers carrying their data, and the legend's swatches.
//! No map iteration and no clock: the file is a function of its rows alone.
//!
//! **Series style.** Series i (in the chart's own order) is drawn in colour
//! `PALETTE[i % 20]` and shape `SHAPES[(i / 20) % 5]`: the first 20 series are circles in 20
//! colours, the next 20 squares, then diamonds, triangles up and triangles down, so 100 series
//! get 100 distinct (colour, shape) pairs, as many as a packed-KV protocol may hold
//! configurations (a model-quality protocol holds at most 64 runs): the audit requires distinct
//! series to look distinct, though not any particular colour or shape.
//! A filled series has `fill="COLOUR" stroke="none"`; a
//! hollow one `fill="none" stroke="COLOUR" stroke-width="2"`. Every shape is a centred `circle`
//! or `polygon`, so every shape can be drawn hollow.
//!
//! **Axes.** Each panel is a plotters chart with log-scale coordinates on its plot area (280 x
//! 200 px): a value v on an axis whose values `lo..hi` land on pixels `a..b` is drawn at
//! `a + (b - a) * ln(v / lo) / ln(hi / lo)`, rounded towards `a` to a whole pixel (plotters'
//! mapping, which nudges by 0.001 px first). The panel declares the `lo hi` and the `a b`
//! plotters used, and every marker, grid line and tick label is placed by that chart. Each axis
//! is fitted to what it shows: `[min / 1.25, max * 1.25]`, widened about its geometric middle
//! to at least one decade so that it holds at least two 1-2-5 ticks. Ticks are 1-2-5 times powers of ten
//! where labels fit, else powers of ten only, else every second (third, ...) power of ten.
//!
//! **Panel.** A `<g class="panel" ...data-x-range="LO HI" data-y-range="LO HI"
//! data-x-pixels="A B" data-y-pixels="C D">` holds, in this order, what plotters drew: its title
//! (`<text>`), the frame (`<rect fill="none">`), grid lines (`<polyline>`), tick labels (x below
//! each panel, hanging from their pixel: `text-anchor="middle" dy="0.76em"`; y left of the first
//! column's panels only, centred on theirs: `text-anchor="end" dy="0.5ex"`), the float32 label
//! (and, with no marker, a note why); then the dashed float32 line, `<g class="float32">` around
//! the dashes plotters draws (one `<polyline>` each); then the markers (`<g class="marker" ...
//! transform="translate(X,Y)">` around one shape), at the pixels plotters' mapping gives.
//!
//! **Axis titles.** The x axis title's lines are centred under the grid, 16 px apart. A line
//! wider than the grid (one panel's width holds about 46 characters) overhangs it; where the
//! legend reaches below the grid, into those rows, such a line is wrapped at spaces to the
//! grid's width instead, so that it never runs over a swatch or label.
//!
//! **Legend.** For each heading (a bold `<text>`), one entry per series: `<g class="swatch"
//! data-series="LABEL" transform="translate(X,Y)">` around the series' own shape and paint,
//! followed by its label as a `<text>`. plotters writes a text's content on its own line, between
//! the opening and closing tags.

use std::fmt::Write as _;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{FontDesc, FontStyle, FontTransform};

use crate::format::thousands;

/// 20 categorical colours: Tableau 10, then 10 more, dark enough to read as a 2 px outline on
/// white and apart from the first ten.
pub const PALETTE: [&str; 20] = [
    "#1F77B4", "#FF7F0E", "#2CA02C", "#D62728", "#9467BD", "#8C564B", "#E377C2", "#7F7F7F",
    "#BCBD22", "#17BECF", "#000075", "#800000", "#808000", "#469990", "#F032E6", "#000000",
    "#FFC000", "#1B5E20", "#FA8072", "#6A3D9A",
];

/// The shapes, centred on (0, 0): SVG element and its geometry attribute.
pub const SHAPES: [(&str, &str); 5] = [
    ("circle", r#"r="5""#),
    ("polygon", r#"points="-4.5,-4.5 4.5,-4.5 4.5,4.5 -4.5,4.5""#),
    ("polygon", r#"points="0,-6 6,0 0,6 -6,0""#),
    ("polygon", r#"points="0,-6 5.2,3 -5.2,3""#),
    ("polygon", r#"points="0,6 5.2,-3 -5.2,-3""#),
];

/// How many series get a (colour, shape) pair of their own.
pub const DISTINCT_SERIES: usize = PALETTE.len() * SHAPES.len();

/// Series `index`'s shape element, painted filled or hollow.
pub fn series_shape(index: usize, hollow: bool) -> String {
    let colour = PALETTE[index % PALETTE.len()];
    let (element, geometry) = SHAPES[(index / PALETTE.len()) % SHAPES.len()];
    let paint = if hollow {
        format!(r#"fill="none" stroke="{colour}" stroke-width="2""#)
    } else {
        format!(r#"fill="{colour}" stroke="none""#)
    };
    format!("<{element} {geometry} {paint}/>")
}

/// One series of the legend.
pub struct Series {
    pub label: String,
    /// Its place in the style order.
    pub index: usize,
    pub hollow: bool,
}

/// Panel cell size: the plot area plus room for the title and tick labels.
const CELL_WIDTH: i32 = 360;
const CELL_HEIGHT: i32 = 270;
/// The plot area's offsets inside its cell.
const PLOT_LEFT: i32 = 62;
const PLOT_TOP: i32 = 28;
const PLOT_WIDTH: i32 = 280;
const PLOT_HEIGHT: i32 = 200;
/// Room left of the grid (the y axis title) and above it (the chart's title).
const GRID_LEFT: i32 = 36;
const GRID_TOP: i32 = 44;
/// Room below the grid for the x axis title's two lines; a wrapped title adds a line's height
/// per extra line.
const GRID_BOTTOM: i32 = 50;
const X_TITLE_LINE_HEIGHT: i32 = 16;
/// A generous width of a character of the x axis title (13 px): wider than common faces'
/// average, so that a line wrapped to the grid's width stays inside it whatever face draws it.
const X_TITLE_CHAR_WIDTH: f64 = 7.8;
/// Approximate width of a character of the tick and legend fonts, to keep labels apart.
const CHAR_WIDTH: f64 = 6.6;
const GREY: RGBColor = RGBColor(0x5A, 0x5A, 0x5A);
const FRAME: RGBColor = RGBColor(0x99, 0x99, 0x99);
const GRID: RGBColor = RGBColor(0xDD, 0xDD, 0xDD);

/// A log axis: values `lo..hi` land on pixels `a..b`.
#[derive(Debug, Clone, Copy)]
pub struct LogAxis {
    pub lo: f64,
    pub hi: f64,
    pub a: f64,
    pub b: f64,
}

impl LogAxis {
    /// Where `v` lands, unrounded: plotters places it at most a pixel before this, which is
    /// close enough to tell whether tick labels collide.
    pub fn pixel(&self, v: f64) -> f64 {
        self.a + (self.b - self.a) * (v / self.lo).ln() / (self.hi / self.lo).ln()
    }
}

/// The fitted range of positive values: `[min / 1.25, max * 1.25]`, at least a decade wide
/// (about its geometric middle); `None` for no values.
pub fn fitted(values: impl IntoIterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .into_iter()
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if hi == 0.0 {
        return None;
    }
    let (lo, hi) = (lo / 1.25, hi * 1.25);
    if hi / lo >= 10.0 {
        return Some((lo, hi));
    }
    let middle = (lo * hi).sqrt();
    Some((middle / 10f64.sqrt(), middle * 10f64.sqrt()))
}

/// Ticks 1-2-5 times powers of ten in [lo, hi], thinned until neighbours are at least
/// `gap(a, b)` pixels apart (a and b the labels): 1-2-5, then powers of ten, then every k-th.
fn ticks(axis: &LogAxis, gap: &dyn Fn(f64, f64) -> f64) -> Vec<f64> {
    let (lo, hi) = (axis.lo, axis.hi);
    let first = lo.log10().floor() as i32;
    let last = hi.log10().ceil() as i32;
    let candidates: Vec<Vec<f64>> = std::iter::once(vec![1.0, 2.0, 5.0])
        .chain(std::iter::once(vec![1.0]))
        .map(|steps| {
            (first..=last)
                .flat_map(|e| steps.iter().map(move |s| s * 10f64.powi(e)))
                .filter(|t| (lo..=hi).contains(t))
                .collect()
        })
        .chain((2..=(last - first + 1).max(2)).map(|k| {
            (first..=last)
                .filter(|e| e.rem_euclid(k) == 0)
                .map(|e| 10f64.powi(e))
                .filter(|t| (lo..=hi).contains(t))
                .collect()
        }))
        .collect();
    let fits = |ts: &Vec<f64>| {
        ts.windows(2)
            .all(|w| (axis.pixel(w[1]) - axis.pixel(w[0])).abs() >= gap(w[0], w[1]))
    };
    candidates
        .iter()
        .find(|ts| fits(ts))
        .or(candidates.last())
        .cloned()
        .unwrap_or_default()
}

/// Two significant digits, without trailing zeros: 10 -> "10", 0.5 -> "0.5", 13.4 -> "13".
pub fn significant(x: f64) -> String {
    let digits = (1 - x.abs().log10().floor() as i32).max(0) as usize;
    let text = format!("{x:.digits$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// A whole number of bytes with thousands separators, as the x tick labels read.
pub fn bytes_label(x: f64) -> String {
    thousands(x.round() as usize)
}

/// Escapes text for the hand-written attributes (plotters escapes what it writes).
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

type Area<'a, 'b> = DrawingArea<SVGBackend<'b>, Shift>;
type LogChart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<LogCoord<f64>, LogCoord<f64>>>;

fn drawing(e: impl std::fmt::Debug) -> String {
    format!("drawing a chart with plotters: {e:?}")
}

/// Draws with plotters on an SVG document of `size` and returns its opening `<svg>` tag and
/// what was drawn, so that pieces drawn apart can be placed among the hand-written groups.
fn drawn<T>(
    size: (u32, u32),
    draw: impl FnOnce(&Area) -> Result<T, String>,
) -> Result<(String, String, T), String> {
    let mut svg = String::new();
    let value = {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        let value = draw(&root)?;
        root.present().map_err(drawing)?;
        value
    };
    let (open, body) = svg
        .split_once('\n')
        .and_then(|(open, rest)| Some((open, rest.strip_suffix("</svg>\n")?)))
        .ok_or("plotters' SVG is not an <svg> line, elements and </svg>")?;
    Ok((open.to_string(), body.to_string(), value))
}

/// A font of `px` pixels as written: plotters writes the size it is given divided by 1.24, so
/// this asks for `px * 1.24`, or a neighbouring f64 that comes back as exactly `px` (13 has
/// none, and is written 13.000000000000002).
fn font(px: f64) -> FontDesc<'static> {
    let scaled = px * 1.24;
    let size = [
        scaled,
        f64::from_bits(scaled.to_bits() + 1),
        f64::from_bits(scaled.to_bits() - 1),
    ]
    .into_iter()
    .find(|s| s / 1.24 == px)
    .unwrap_or(scaled);
    ("sans-serif", size).into_font()
}

/// Writes `label` with plotters at pixel `at`, anchored as `style` says.
fn write(area: &Area, label: &str, at: (i32, i32), style: TextStyle) -> Result<(), String> {
    area.draw(&Text::new(label.to_string(), at, style))
        .map_err(drawing)
}

/// `line` broken at spaces into lines of at most `width` characters (a longer word alone on
/// its line).
fn wrapped(line: &str, width: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for word in line.split_whitespace() {
        match out.last_mut() {
            Some(last) if last.chars().count() + 1 + word.chars().count() <= width => {
                last.push(' ');
                last.push_str(word);
            }
            _ => out.push(word.to_string()),
        }
    }
    out
}

/// A text style centred vertically on its pixel, anchored horizontally at `h`.
fn anchored(font: FontDesc<'static>, colour: &'static RGBColor, h: HPos) -> TextStyle<'static> {
    font.color(colour).pos(Pos::new(h, VPos::Center))
}

/// A chart's frame: titles, grid shape, the shared y range and the legend.
pub struct Layout<'a> {
    pub title: String,
    /// The x axis title in two lines (what, then how it is scaled), wrapped further where it
    /// would meet the legend (module docs).
    pub x_title: [&'a str; 2],
    /// The y axis title in two lines, so that it fits beside a single row of panels.
    pub y_title: [&'a str; 2],
    pub columns: usize,
    pub rows: usize,
    /// The y range every panel shares.
    pub y_range: (f64, f64),
    pub y_label: &'a dyn Fn(f64) -> String,
    pub x_label: &'a dyn Fn(f64) -> String,
    /// Legend headings, each with its series.
    pub legend: Vec<(&'a str, Vec<Series>)>,
}

/// One panel's content.
pub struct Panel<'a> {
    pub column: usize,
    pub row: usize,
    pub title: String,
    /// The data attributes naming what the panel shows, e.g. `data-tokens="128"`.
    pub attributes: String,
    pub x_range: (f64, f64),
    /// Where the float32 line goes, and its label.
    pub float32: f64,
    pub float32_label: String,
    /// Written inside the plot area when the panel has no marker.
    pub empty_note: Option<&'a str>,
}

impl Layout<'_> {
    fn legend_width(&self) -> f64 {
        // Headings are bold and a size larger than the labels, which sit 22 px in.
        self.legend
            .iter()
            .flat_map(|(heading, series)| {
                std::iter::once(heading.chars().count() as f64 * 8.0).chain(
                    series
                        .iter()
                        .map(|s| s.label.chars().count() as f64 * CHAR_WIDTH + 22.0),
                )
            })
            .fold(0.0, f64::max)
            + 10.0
    }

    fn legend_height(&self) -> i32 {
        let entries: usize = self.legend.iter().map(|(_, s)| s.len()).sum();
        GRID_TOP + 10 + self.legend.len() as i32 * 40 + entries as i32 * 18
    }

    /// The x axis title's lines as drawn, each centred under the grid. A line wider than the
    /// grid overhangs it on both sides; when the legend reaches below the grid, into the title's
    /// rows, that line would run into the legend (over its swatches and labels), so it is
    /// wrapped at spaces to the grid's width instead.
    fn x_title_lines(&self) -> Vec<String> {
        let grid_width = f64::from(self.columns as i32 * CELL_WIDTH);
        let grid_bottom = GRID_TOP + self.rows as i32 * CELL_HEIGHT;
        let crowded = self.legend_height() > grid_bottom;
        self.x_title
            .iter()
            .flat_map(|line| {
                let width = line.chars().count() as f64 * X_TITLE_CHAR_WIDTH;
                if crowded && width > grid_width {
                    wrapped(line, (grid_width / X_TITLE_CHAR_WIDTH) as usize)
                } else {
                    vec![line.to_string()]
                }
            })
            .collect()
    }

    fn grid_right(&self) -> i32 {
        GRID_LEFT + self.columns as i32 * CELL_WIDTH
    }

    /// The document's size in whole pixels, as plotters takes it.
    pub fn size(&self) -> (u32, u32) {
        let width = self.grid_right() as f64 + self.legend_width() + 10.0;
        let extra_lines = self.x_title_lines().len().saturating_sub(2) as i32;
        let grid = GRID_TOP
            + self.rows as i32 * CELL_HEIGHT
            + GRID_BOTTOM
            + extra_lines * X_TITLE_LINE_HEIGHT;
        (width.ceil() as u32, grid.max(self.legend_height()) as u32)
    }

    /// The document's opening, background, titles and legend: plotters draws all but the
    /// swatches, each of which is written right before its label.
    pub fn open(&self) -> Result<String, String> {
        let size = self.size();
        let grid_middle = (GRID_LEFT + self.grid_right()) / 2;
        let grid_bottom = GRID_TOP + self.rows as i32 * CELL_HEIGHT;
        let y_middle = GRID_TOP + self.rows as i32 * CELL_HEIGHT / 2;
        let (open, mut out, ()) = drawn(size, |root| {
            root.fill(&WHITE).map_err(drawing)?;
            write(
                root,
                &self.title,
                (GRID_LEFT, 21),
                anchored(font(18.0), &BLACK, HPos::Left),
            )?;
            for (i, line) in self.x_title_lines().iter().enumerate() {
                let style = anchored(font(13.0), &BLACK, HPos::Center);
                let dy = 19 + i as i32 * X_TITLE_LINE_HEIGHT;
                write(root, line, (grid_middle, grid_bottom + dy), style)?;
            }
            // Rotated a quarter turn back, the text reads upwards and its 0.5ex drop moves it
            // right: each line's baseline ends up about 3 px right of its x.
            for (line, x) in self.y_title.iter().zip([11, 27]) {
                let style = font(13.0)
                    .transform(FontTransform::Rotate270)
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Center));
                write(root, line, (x, y_middle), style)?;
            }
            Ok(())
        })?;
        out.insert_str(0, &format!("{open}\n"));
        let x = self.grid_right() + 10;
        let mut y = GRID_TOP + 20;
        for (heading, series) in &self.legend {
            let (_, text, ()) = drawn(size, |root| {
                let style = font(13.0)
                    .style(FontStyle::Bold)
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Left, VPos::Center));
                write(root, heading, (x, y - 4), style)
            })?;
            out.push_str(&text);
            y += 20;
            for s in series {
                let _ = writeln!(
                    out,
                    r#"<g class="swatch" data-series="{}" transform="translate({},{})">{}</g>"#,
                    escape(&s.label),
                    x + 8,
                    y - 4,
                    series_shape(s.index, s.hollow)
                );
                let (_, text, ()) = drawn(size, |root| {
                    let style = anchored(font(12.0), &BLACK, HPos::Left);
                    write(root, &s.label, (x + 22, y - 4), style)
                })?;
                out.push_str(&text);
                y += 18;
            }
            y += 20;
        }
        Ok(out)
    }

    /// The panel's plot area on a document-sized drawing area.
    fn plot_area<'b>(&self, root: &Area<'_, 'b>, panel: &Panel) -> Area<'_, 'b> {
        let left = GRID_LEFT + panel.column as i32 * CELL_WIDTH + PLOT_LEFT;
        let top = GRID_TOP + panel.row as i32 * CELL_HEIGHT + PLOT_TOP;
        root.clone().shrink((left, top), (PLOT_WIDTH, PLOT_HEIGHT))
    }

    /// The panel's log-log chart on its plot area: every piece of a panel is drawn through
    /// this, so that all use one mapping.
    fn chart<'a, 'b>(
        &self,
        plot: &'a Area<'_, 'b>,
        panel: &Panel,
    ) -> Result<LogChart<'a, 'b>, String> {
        ChartBuilder::on(plot)
            .build_cartesian_2d(
                (panel.x_range.0..panel.x_range.1).log_scale(),
                (self.y_range.0..self.y_range.1).log_scale(),
            )
            .map_err(drawing)
    }

    /// A panel's opening group, drawn by plotters (title, frame, grid, tick labels, float32
    /// label and line), and where plotters places each of `points`; the caller writes the
    /// markers there, then `</g>`.
    pub fn panel(
        &self,
        panel: &Panel,
        points: &[(f64, f64)],
    ) -> Result<(String, Vec<(i32, i32)>), String> {
        let size = self.size();
        let (_, body, (x, y, placed)) = drawn(size, |root| {
            let plot = self.plot_area(root, panel);
            let chart = self.chart(&plot, panel)?;
            let at = |v: (f64, f64)| chart.backend_coord(&v);
            let ((a, c), (b, d)) = (
                at((panel.x_range.0, self.y_range.0)),
                at((panel.x_range.1, self.y_range.1)),
            );
            let x = LogAxis {
                lo: panel.x_range.0,
                hi: panel.x_range.1,
                a: a as f64,
                b: b as f64,
            };
            let y = LogAxis {
                lo: self.y_range.0,
                hi: self.y_range.1,
                a: c as f64,
                b: d as f64,
            };
            let note = |h| anchored(font(11.0), &GREY, h);
            write(
                root,
                &panel.title,
                (a, d - 12),
                anchored(font(14.0), &BLACK, HPos::Left),
            )?;
            root.draw(&Rectangle::new([(a, d), (b, c)], FRAME.stroke_width(1)))
                .map_err(drawing)?;
            let x_label = self.x_label;
            let x_gap = |l: f64, r: f64| {
                (x_label(l).chars().count() + x_label(r).chars().count()) as f64 * CHAR_WIDTH / 2.0
                    + 8.0
            };
            let area = chart.plotting_area();
            for t in ticks(&x, &x_gap) {
                area.draw(&PathElement::new(
                    vec![(t, y.lo), (t, y.hi)],
                    GRID.stroke_width(1),
                ))
                .map_err(drawing)?;
                let style = font(11.0)
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Top));
                write(root, &x_label(t), (at((t, y.lo)).0, c + 6), style)?;
            }
            for t in ticks(&y, &|_, _| 16.0) {
                area.draw(&PathElement::new(
                    vec![(x.lo, t), (x.hi, t)],
                    GRID.stroke_width(1),
                ))
                .map_err(drawing)?;
                if panel.column == 0 {
                    let style = anchored(font(11.0), &BLACK, HPos::Right);
                    write(root, &(self.y_label)(t), (a - 5, at((x.lo, t)).1), style)?;
                }
            }
            // The label goes above the plot, beside the title, so that it covers no marker:
            // ending at the line when the line is right of the middle (as float32 usually is,
            // the largest size), else starting there; inside the plot's top edge only if the
            // title is in the way.
            let f = at((panel.float32, y.lo)).0;
            let label = panel.float32_label.chars().count() as f64 * 6.2;
            let title_end = a as f64 + panel.title.chars().count() as f64 * 7.8;
            let right = f > (a + b) / 2;
            let (anchor, start, beside) = if right {
                (HPos::Right, f as f64 - label, f - 4)
            } else {
                (HPos::Left, f as f64, f + 4)
            };
            let at_label = if start > title_end + 8.0 {
                (f, d - 11)
            } else {
                (beside, d + 10)
            };
            write(root, &panel.float32_label, at_label, note(anchor))?;
            if let Some(empty) = panel.empty_note {
                write(root, empty, (a + 6, (c + d) / 2), note(HPos::Left))?;
            }
            Ok((x, y, points.iter().map(|p| at(*p)).collect::<Vec<_>>()))
        })?;
        // The dashed line is drawn apart, with the same chart, so that its dashes (plotters
        // writes one polyline each) can be grouped as one line.
        let (_, dashes, ()) = drawn(size, |root| {
            let plot = self.plot_area(root, panel);
            let mut chart = self.chart(&plot, panel)?;
            chart
                .draw_series(DashedLineSeries::new(
                    vec![
                        (panel.float32, self.y_range.0),
                        (panel.float32, self.y_range.1),
                    ],
                    6,
                    4,
                    GREY.stroke_width(1),
                ))
                .map_err(drawing)?;
            Ok(())
        })?;
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<g class="panel" {} data-x-range="{:?} {:?}" data-y-range="{:?} {:?}" data-x-pixels="{} {}" data-y-pixels="{} {}">"#,
            panel.attributes, x.lo, x.hi, y.lo, y.hi, x.a, x.b, y.a, y.b
        );
        out.push_str(&body);
        let _ = write!(out, "<g class=\"float32\">\n{dashes}</g>\n");
        Ok((out, placed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_below_the_limit_has_its_own_colour_and_shape() {
        let shapes: std::collections::BTreeSet<String> = (0..DISTINCT_SERIES)
            .map(|i| series_shape(i, false))
            .collect();
        assert_eq!(shapes.len(), DISTINCT_SERIES);
        assert_eq!(series_shape(DISTINCT_SERIES, false), series_shape(0, false));
        assert_eq!(
            series_shape(21, true),
            r##"<polygon points="-4.5,-4.5 4.5,-4.5 4.5,4.5 -4.5,4.5" fill="none" stroke="#FF7F0E" stroke-width="2"/>"##
        );
    }

    fn layout<'a>(y_label: &'a dyn Fn(f64) -> String) -> Layout<'a> {
        Layout {
            title: "t".into(),
            x_title: ["x", "x"],
            y_title: ["y", "y"],
            columns: 2,
            rows: 1,
            y_range: (0.01, 1.0),
            y_label,
            x_label: &bytes_label,
            legend: vec![],
        }
    }

    fn panel(column: usize) -> Panel<'static> {
        Panel {
            column,
            row: 0,
            title: "p".into(),
            attributes: String::new(),
            x_range: (100.0, 10_000.0),
            float32: 5_000.0,
            float32_label: "float32 5,000 B".into(),
            empty_note: None,
        }
    }

    /// The numbers after `name="` in `svg`.
    fn pair(svg: &str, name: &str) -> (i32, i32) {
        let start = svg.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
        let text = &svg[start..start + svg[start..].find('"').unwrap()];
        let (a, b) = text.split_once(' ').unwrap();
        (a.parse().unwrap(), b.parse().unwrap())
    }

    #[test]
    fn a_panel_declares_the_mapping_plotters_placed_its_markers_by() {
        let y_label = |y: f64| significant(y);
        let layout = layout(&y_label);
        let points = [(100.0, 0.01), (10_000.0, 1.0), (1_000.0, 0.1)];
        let (svg, placed) = layout.panel(&panel(1), &points).unwrap();
        let (a, b) = pair(&svg, "data-x-pixels");
        let (c, d) = pair(&svg, "data-y-pixels");
        // The ends land on the declared pixels, and the middle (a decade in on both axes) where
        // the declared mapping puts it, to the pixel.
        assert_eq!(placed[0], (a, c));
        assert_eq!(placed[1], (b, d));
        // plotters' axis covers the plot area's pixels, first to last.
        assert_eq!((b - a, c - d), (PLOT_WIDTH - 1, PLOT_HEIGHT - 1));
        assert!((f64::from(placed[2].0) - f64::from(a + (b - a) / 2)).abs() <= 1.0);
        assert!((f64::from(placed[2].1) - f64::from(c + (d - c) / 2)).abs() <= 1.0);
        // The float32 line is dashes at one x, inside the plot; a second column's panel has no
        // y tick labels; an x tick label sits at the pixel its value maps to.
        let dashes: Vec<&str> = svg
            .split("<g class=\"float32\">")
            .nth(1)
            .unwrap()
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("<polyline"))
            .collect();
        assert!(dashes.len() >= 2, "{svg}");
        let f = layout.panel(&panel(1), &[(5_000.0, 1.0)]).unwrap().1[0].0;
        assert!(dashes.iter().all(|l| l.contains(&format!("points=\"{f},"))));
        assert!(!svg.contains("text-anchor=\"end\" font-family=\"sans-serif\" font-size=\"11\" opacity=\"1\" fill=\"#000000\""));
        assert!(svg.contains(&format!(
            "<text x=\"{}\" y=\"{}\" dy=\"0.76em\" text-anchor=\"middle\"",
            placed[2].0,
            c + 6
        )));
        let (first, _) = layout.panel(&panel(0), &[]).unwrap();
        assert!(first.contains("dy=\"0.5ex\" text-anchor=\"end\""));
        // A panel with nothing to mark says so inside its plot area, left-aligned in grey.
        let empty = Panel {
            empty_note: Some("nothing here"),
            ..panel(0)
        };
        let (note, _) = layout.panel(&empty, &[]).unwrap();
        let (a, _) = pair(&note, "data-x-pixels");
        assert!(note.contains(&format!(
            "<text x=\"{}\" y=\"{}\" dy=\"0.5ex\" text-anchor=\"start\" font-family=\"sans-serif\" font-size=\"11\" opacity=\"1\" fill=\"#5A5A5A\">\nnothing here\n</text>",
            a + 6,
            (c + d) / 2
        )));
        // The same panel gives the same bytes.
        assert_eq!(layout.panel(&panel(1), &points).unwrap().0, svg);
    }

    /// Each root text's (x, y, content), in document order.
    fn texts(svg: &str) -> Vec<(i32, i32, String)> {
        svg.split("<text x=\"")
            .skip(1)
            .map(|t| {
                let x = t[..t.find('"').unwrap()].parse().unwrap();
                let y_at = t.find("y=\"").unwrap() + 3;
                let y = t[y_at..y_at + t[y_at..].find('"').unwrap()]
                    .parse()
                    .unwrap();
                let body = &t[t.find(">\n").unwrap() + 2..t.find("\n</text>").unwrap()];
                (x, y, body.to_string())
            })
            .collect()
    }

    #[test]
    fn a_long_x_title_wraps_inside_the_grid_only_where_the_legend_reaches_its_rows() {
        let y_label = |y: f64| significant(y);
        let long =
            "one panel per schedule, each on its own scale; the line joins its Pareto frontier";
        let series = |n: usize| {
            (0..n)
                .map(|index| Series {
                    label: format!("series{index}"),
                    index,
                    hollow: false,
                })
                .collect::<Vec<_>>()
        };
        let one_column = |n| Layout {
            x_title: ["bytes (log)", long],
            columns: 1,
            legend: vec![("schemes", series(n))],
            ..layout(&y_label)
        };
        // A short legend leaves the rows under the grid free: the line stays whole.
        let short = one_column(3);
        let svg = short.open().unwrap();
        assert!(texts(&svg).iter().any(|(_, _, t)| t == long));
        let grid_bottom = GRID_TOP + CELL_HEIGHT;
        assert_eq!(short.size().1, (grid_bottom + GRID_BOTTOM) as u32);
        // Twenty series reach below the grid: the line wraps into lines no wider than the grid,
        // stacked under the first line, and the legend's entries keep clear of them.
        let tall = one_column(20);
        let svg = tall.open().unwrap();
        let lines: Vec<(i32, i32, String)> = texts(&svg)
            .into_iter()
            .filter(|(_, y, _)| *y > grid_bottom && *y < grid_bottom + 120)
            .filter(|(x, _, _)| *x < tall.grid_right())
            .collect();
        let words: Vec<&str> = lines[1..].iter().map(|(_, _, t)| t.as_str()).collect();
        assert_eq!(lines[0].2, "bytes (log)");
        assert_eq!(words.join(" "), long);
        assert!(words.len() >= 2);
        for (i, (x, y, text)) in lines.iter().enumerate() {
            let half = text.chars().count() as f64 * X_TITLE_CHAR_WIDTH / 2.0;
            assert_eq!(*x, (GRID_LEFT + tall.grid_right()) / 2);
            assert!(f64::from(*x) - half >= f64::from(GRID_LEFT), "{text}");
            assert!(
                f64::from(*x) + half <= f64::from(tall.grid_right()),
                "{text}"
            );
            assert_eq!(*y, grid_bottom + 19 + i as i32 * X_TITLE_LINE_HEIGHT);
        }
        let bottom = grid_bottom + GRID_BOTTOM + (lines.len() as i32 - 2) * X_TITLE_LINE_HEIGHT;
        assert_eq!(tall.size().1, bottom.max(tall.legend_height()) as u32);
        // Wider grids hold the line whole, however tall the legend.
        let wide = Layout {
            columns: 2,
            ..one_column(20)
        };
        assert!(
            texts(&wide.open().unwrap())
                .iter()
                .any(|(_, _, t)| t == long)
        );
        assert_eq!(wrapped("a bb ccc", 4), ["a bb", "ccc"]);
        assert_eq!(wrapped("abcdefgh ij", 4), ["abcdefgh", "ij"]);
    }

    #[test]
    fn axes_span_a_decade_and_ticks_thin_out_when_crowded() {
        assert_eq!(fitted([]), None);
        let (lo, hi) = fitted([100.0, 200.0]).unwrap();
        assert!((hi / lo - 10.0).abs() < 1e-9 && lo < 100.0 && hi > 200.0);
        assert_eq!(fitted([1.0, 100.0]), Some((0.8, 125.0)));
        let wide = LogAxis {
            lo: 1.0,
            hi: 1e6,
            a: 0.0,
            b: 300.0,
        };
        // 50 px a decade: 1-2-5 labels would collide, powers of ten fit.
        let ts = ticks(&wide, &|_, _| 40.0);
        assert_eq!(ts, vec![1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6]);
        let narrow = LogAxis { b: 3000.0, ..wide };
        assert_eq!(ticks(&narrow, &|_, _| 40.0).len(), 19);
        assert_eq!(ticks(&wide, &|_, _| 80.0), vec![1.0, 100.0, 1e4, 1e6]);
    }
}
