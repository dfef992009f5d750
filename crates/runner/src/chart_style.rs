//! What error-vs-bytes.svg and quality-vs-bytes.svg share: the series' colours and shapes, the
//! log axes, the panel grid and the legend, written as plain SVG.
//!
//! Both charts are small multiples: a grid of panels (each with its own log x axis, all sharing
//! one log y axis so rows compare), and a legend right of the grid. The SVG is written here
//! element by element rather than through a plotting library, so that each panel can be an SVG
//! group declaring its own axis mapping, and the file is a function of its rows alone.
//!
//! **Series style.** Series i (in the chart's own order) is drawn in colour
//! `PALETTE[i % 20]` and shape `SHAPES[(i / 20) % 5]`: the first 20 series are circles in 20
//! colours, the next 20 squares, then diamonds, triangles up and triangles down, so 100 series
//! get 100 distinct (colour, shape) pairs. A filled series has `fill="COLOUR" stroke="none"`; a
//! hollow one `fill="none" stroke="COLOUR" stroke-width="2"`. Every shape is a centred `circle`
//! or `polygon`, so every shape can be drawn hollow.
//!
//! **Axes.** A value v on an axis whose values `lo..hi` land on pixels `a..b` is drawn at
//! `a + (b - a) * ln(v / lo) / ln(hi / lo)`, rounded to a tenth of a pixel. Each axis is fitted
//! to what it shows: `[min / 1.25, max * 1.25]`, widened about its geometric middle to at least
//! one decade so that it holds at least two 1-2-5 ticks. Ticks are 1-2-5 times powers of ten
//! where labels fit, else powers of ten only, else every second (third, ...) power of ten.
//!
//! **Panel.** A `<g class="panel" ...data-x-range="LO HI" data-y-range="LO HI"
//! data-x-pixels="A B" data-y-pixels="C D">` holds, in this order: its title (`<text>`), the
//! frame (`<rect>`), grid lines, tick labels (x below each panel, y left of the first column's
//! panels only), the float32 line (`<line class="float32">`, dashed) and its label, then the
//! markers (`<g class="marker" ... transform="translate(X,Y)">` around one shape).
//!
//! **Legend.** For each heading (`<text>`), one entry per series: `<g class="swatch"
//! data-series="LABEL" transform="translate(X,Y)">` around the series' own shape and paint,
//! followed by its label as a `<text>`.

use std::fmt::Write as _;

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
const CELL_WIDTH: f64 = 360.0;
const CELL_HEIGHT: f64 = 270.0;
/// The plot area's offsets inside its cell.
const PLOT_LEFT: f64 = 62.0;
const PLOT_TOP: f64 = 28.0;
const PLOT_WIDTH: f64 = 280.0;
const PLOT_HEIGHT: f64 = 200.0;
/// Room left of the grid (the y axis title) and above it (the chart's title).
const GRID_LEFT: f64 = 36.0;
const GRID_TOP: f64 = 44.0;
/// Room below the grid for the x axis title.
const GRID_BOTTOM: f64 = 50.0;
const FONT: &str = r#"font-family="sans-serif""#;
/// Approximate width of a character of the tick and legend fonts, to keep labels apart.
const CHAR_WIDTH: f64 = 6.6;
const GREY: &str = "#5A5A5A";

/// A log axis: values `lo..hi` land on pixels `a..b`.
#[derive(Debug, Clone, Copy)]
pub struct LogAxis {
    pub lo: f64,
    pub hi: f64,
    pub a: f64,
    pub b: f64,
}

impl LogAxis {
    pub fn pixel(&self, v: f64) -> f64 {
        let p = self.a + (self.b - self.a) * (v / self.lo).ln() / (self.hi / self.lo).ln();
        (p * 10.0).round() / 10.0
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

/// Escapes text for SVG.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A chart's frame: titles, grid shape, the shared y range and the legend.
pub struct Layout<'a> {
    pub title: String,
    /// The x axis title in two lines (what, then how it is scaled), to fit under one panel.
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

    fn legend_height(&self) -> f64 {
        let entries: usize = self.legend.iter().map(|(_, s)| s.len()).sum();
        GRID_TOP + 10.0 + self.legend.len() as f64 * 40.0 + entries as f64 * 18.0
    }

    fn grid_right(&self) -> f64 {
        GRID_LEFT + self.columns as f64 * CELL_WIDTH
    }

    /// The document's size.
    pub fn size(&self) -> (f64, f64) {
        let width = self.grid_right() + self.legend_width() + 10.0;
        let grid = GRID_TOP + self.rows as f64 * CELL_HEIGHT + GRID_BOTTOM;
        (width, grid.max(self.legend_height()))
    }

    /// The panel's axes.
    pub fn axes(&self, panel: &Panel) -> (LogAxis, LogAxis) {
        let left = GRID_LEFT + panel.column as f64 * CELL_WIDTH + PLOT_LEFT;
        let top = GRID_TOP + panel.row as f64 * CELL_HEIGHT + PLOT_TOP;
        (
            LogAxis {
                lo: panel.x_range.0,
                hi: panel.x_range.1,
                a: left,
                b: left + PLOT_WIDTH,
            },
            LogAxis {
                lo: self.y_range.0,
                hi: self.y_range.1,
                a: top + PLOT_HEIGHT,
                b: top,
            },
        )
    }

    /// The document's opening, titles and legend.
    pub fn open(&self) -> String {
        let (width, height) = self.size();
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">"#
        );
        let _ = writeln!(
            out,
            r##"<rect x="0" y="0" width="{width}" height="{height}" fill="#FFFFFF"/>"##
        );
        let _ = writeln!(
            out,
            r#"<text x="{}" y="26" {FONT} font-size="18">{}</text>"#,
            GRID_LEFT,
            escape(&self.title)
        );
        let grid_middle = (GRID_LEFT + self.grid_right()) / 2.0;
        let grid_bottom = GRID_TOP + self.rows as f64 * CELL_HEIGHT;
        for (line, dy) in self.x_title.iter().zip([22.0, 38.0]) {
            let _ = writeln!(
                out,
                r#"<text x="{grid_middle}" y="{}" {FONT} font-size="13" text-anchor="middle">{}</text>"#,
                grid_bottom + dy,
                escape(line)
            );
        }
        let y_middle = GRID_TOP + self.rows as f64 * CELL_HEIGHT / 2.0;
        for (line, x) in self.y_title.iter().zip([14, 30]) {
            let _ = writeln!(
                out,
                r#"<text x="{x}" y="{y_middle}" {FONT} font-size="13" text-anchor="middle" transform="rotate(-90 {x} {y_middle})">{}</text>"#,
                escape(line)
            );
        }
        // The legend.
        let x = self.grid_right() + 10.0;
        let mut y = GRID_TOP + 20.0;
        for (heading, series) in &self.legend {
            let _ = writeln!(
                out,
                r#"<text x="{x}" y="{y}" {FONT} font-size="13" font-weight="bold">{}</text>"#,
                escape(heading)
            );
            y += 20.0;
            for s in series {
                let _ = writeln!(
                    out,
                    r#"<g class="swatch" data-series="{}" transform="translate({},{})">{}</g>"#,
                    escape(&s.label),
                    x + 8.0,
                    y - 4.0,
                    series_shape(s.index, s.hollow)
                );
                let _ = writeln!(
                    out,
                    r#"<text x="{}" y="{y}" {FONT} font-size="12">{}</text>"#,
                    x + 22.0,
                    escape(&s.label)
                );
                y += 18.0;
            }
            y += 20.0;
        }
        out
    }

    /// A panel's opening group, frame, grid, ticks and float32 line; the caller writes its
    /// markers, then `</g>`.
    pub fn open_panel(&self, panel: &Panel) -> String {
        let (x, y) = self.axes(panel);
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<g class="panel" {} data-x-range="{:?} {:?}" data-y-range="{:?} {:?}" data-x-pixels="{} {}" data-y-pixels="{} {}">"#,
            panel.attributes, x.lo, x.hi, y.lo, y.hi, x.a, x.b, y.a, y.b
        );
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" {FONT} font-size="14">{}</text>"#,
            x.a,
            y.b - 8.0,
            escape(&panel.title)
        );
        let _ = writeln!(
            out,
            r##"<rect x="{}" y="{}" width="{PLOT_WIDTH}" height="{PLOT_HEIGHT}" fill="none" stroke="#999999" stroke-width="1"/>"##,
            x.a, y.b
        );
        let x_label = self.x_label;
        let x_gap = |a: f64, b: f64| {
            (x_label(a).chars().count() + x_label(b).chars().count()) as f64 * CHAR_WIDTH / 2.0
                + 8.0
        };
        for t in ticks(&x, &x_gap) {
            let p = x.pixel(t);
            let _ = writeln!(
                out,
                r##"<line x1="{p}" y1="{}" x2="{p}" y2="{}" stroke="#DDDDDD" stroke-width="1"/>"##,
                y.b, y.a
            );
            let _ = writeln!(
                out,
                r#"<text x="{p}" y="{}" {FONT} font-size="11" text-anchor="middle">{}</text>"#,
                y.a + 15.0,
                x_label(t)
            );
        }
        for t in ticks(&y, &|_, _| 16.0) {
            let p = y.pixel(t);
            let _ = writeln!(
                out,
                r##"<line x1="{}" y1="{p}" x2="{}" y2="{p}" stroke="#DDDDDD" stroke-width="1"/>"##,
                x.a, x.b
            );
            if panel.column == 0 {
                let _ = writeln!(
                    out,
                    r#"<text x="{}" y="{p}" {FONT} font-size="11" text-anchor="end" dy="0.5ex">{}</text>"#,
                    x.a - 5.0,
                    (self.y_label)(t)
                );
            }
        }
        let f = x.pixel(panel.float32);
        let _ = writeln!(
            out,
            r#"<line class="float32" x1="{f}" y1="{}" x2="{f}" y2="{}" stroke="{GREY}" stroke-width="1" stroke-dasharray="6 4"/>"#,
            y.b, y.a
        );
        // The label goes above the plot, beside the title, so that it covers no marker: ending
        // at the line when the line is right of the middle (as float32 usually is, the largest
        // size), else starting there; inside the plot's top edge only if the title is in the way.
        let label = panel.float32_label.chars().count() as f64 * 6.2;
        let title_end = x.a + panel.title.chars().count() as f64 * 7.8;
        let (anchor, start) = if f > (x.a + x.b) / 2.0 {
            ("end", f - label)
        } else {
            ("start", f)
        };
        let (at, y_label) = if start > title_end + 8.0 {
            (f, y.b - 8.0)
        } else {
            (if anchor == "end" { f - 4.0 } else { f + 4.0 }, y.b + 13.0)
        };
        let _ = writeln!(
            out,
            r#"<text x="{at}" y="{y_label}" {FONT} font-size="11" fill="{GREY}" text-anchor="{anchor}">{}</text>"#,
            escape(&panel.float32_label)
        );
        if let Some(note) = panel.empty_note {
            let _ = writeln!(
                out,
                r#"<text x="{}" y="{}" {FONT} font-size="11" fill="{GREY}">{}</text>"#,
                x.a + 6.0,
                (y.a + y.b) / 2.0,
                escape(note)
            );
        }
        out
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
