//! The check of a chart of panels, shared by error-vs-bytes.svg ([`crate::packed_kv::chart`]) and
//! quality-vs-bytes.svg ([`crate::model_quality::chart`]): every marker tied to its numbers, in
//! its own panel, placed where that panel's axes say. The audit checks the figures, not the
//! style: colours, which shape a marker is, filled or hollow, stroke widths, the float32 line's
//! dashes and the tick labels' anchoring are the chart's to choose.
//!
//! Each panel is a `<g class="panel">` that names what it shows in data attributes and declares
//! its log-log axis mapping (`data-x-range`, `data-y-range`: the value range; `data-x-pixels`,
//! `data-y-pixels`: where its ends land; a value v lands at `a + (b - a) * ln(v / lo) / ln(hi /
//! lo)`), and holds its markers, `<g class="marker" ... transform="translate(X,Y)">` around one
//! shape. Given what a chart must hold (`ExpectedChart`, derived by each chart's module), the
//! audit requires:
//! - the panels in order, each with its data attributes and titled, not overlapping, all with
//!   one y range (so rows compare), and each with one float32 line, a `<g class="float32">`
//!   holding only polylines (plotters draws a dashed line as one per dash), every point within a
//!   pixel of the pixel its mapping gives the float32 size and together spanning the plot's
//!   height, and its label;
//! - in each panel exactly its markers, in order, each with exactly its data attributes, equal
//!   to the audit's own values;
//! - each marker within one pixel of where its panel's mapping puts its data, inside the plot
//!   area, and drawn as a point there: one circle or polygon centred on its translate (a circle
//!   without `cx`/`cy`, a polygon whose vertices average within a pixel of it), painted (its fill
//!   or its stroke not `none`), reaching at most [`MARKER_REACH`] px from its centre, stroke
//!   included, and with no attribute but its geometry, `fill`, `stroke` and `stroke-width` (so
//!   nothing moves, hides or enlarges it over its neighbours);
//! - every text in a panel its title, its float32 label, the empty-panel note, or a tick label
//!   at the pixel the panel's mapping gives its value (x labels below the plot, y labels left of
//!   it), shifted by at most one em or ex (`dy`) and by nothing else; at least two x tick labels
//!   per panel and two y tick labels in each row's first panel;
//! - a legend right of the grid: a `<g class="swatch" data-series="LABEL">` per series, in
//!   order, holding one point shape as a marker does and followed by its label; and besides the
//!   legend's labels only the chart's titles and headings outside the panels;
//! - no element outside what the chart uses (no script, image, link or foreign content), no
//!   group but panels, markers, swatches and float32 lines, no transform but theirs and the
//!   rotated y title, no filled rect but the background nor any filled polyline, and no circle
//!   or polygon outside a marker or swatch.

use roxmltree::{Document, Node};

use crate::common::problem::ChartProblem;
use crate::common::report::{Checked, Problem, Report};
use crate::common::svg::{Axis, baseline_shift, number, polygon_points, translate, x_label};
use crate::common::tolerance::close;

/// Elements the chart may contain.
const ALLOWED: [&str; 8] = [
    "svg", "rect", "line", "polyline", "polygon", "circle", "text", "g",
];

/// How far a marker's (or legend swatch's) shape may reach from its centre, stroke included, in
/// pixels: a marker marks a point, and a larger shape could cover the markers around it.
pub const MARKER_REACH: f64 = 10.0;

/// A legend heading and its series' labels, in order.
pub(crate) type LegendGroup = (String, Vec<String>);

/// What a chart of panels must hold, as the audit derives it.
pub(crate) struct ExpectedChart {
    /// The panels in document order.
    pub panels: Vec<ExpectedPanel>,
    /// Legend headings in order, each with its series' labels.
    pub legend: Vec<LegendGroup>,
    /// Every text outside the panels and legend labels: title, axis titles, headings.
    pub texts: Vec<String>,
    /// The names of a marker's attributes, besides `class` and `transform`.
    pub marker_attributes: Vec<&'static str>,
    /// Reads a y tick label ("0.5%" -> 0.005).
    pub y_label: fn(&str) -> Option<f64>,
}

/// One panel the audit expects.
pub(crate) struct ExpectedPanel {
    /// Its data attributes naming what it shows, e.g. `data-tokens`, `128`.
    pub attributes: Vec<(&'static str, String)>,
    pub title: String,
    /// Whether it is the first of its row (which carries the y tick labels).
    pub first_column: bool,
    pub float32: f64,
    pub float32_label: String,
    pub empty_note: &'static str,
    pub markers: Vec<ExpectedMarker>,
}

/// One marker the audit expects.
pub(crate) struct ExpectedMarker {
    /// Attributes that must read exactly so.
    pub strings: Vec<(&'static str, String)>,
    /// Attributes that must be numbers close to these.
    pub numbers: Vec<(&'static str, f64)>,
    /// Its data: where the panel's mapping must place it.
    pub x: f64,
    pub y: f64,
    /// How problems name it: configuration, condition, length (or index).
    pub config: String,
    pub condition: String,
    pub tokens: usize,
}

impl ExpectedMarker {
    fn describe(&self) -> String {
        self.strings
            .iter()
            .map(|(_, v)| v.clone())
            .chain(self.numbers.iter().map(|(_, v)| format!("{v:?}")))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Whether `node` (a marker or a swatch) holds exactly one circle or polygon drawn as a point at
/// its origin: centred on it, painted, reaching at most [`MARKER_REACH`] px, stroke included, and
/// with no attribute but its geometry and paint. Its colour, its shape and its stroke are free.
fn point_shape(node: Node) -> Result<(), String> {
    let children: Vec<Node> = node.children().filter(|c| c.is_element()).collect();
    let [child] = children.as_slice() else {
        return Err(format!("{} shapes", children.len()));
    };
    let (element, geometry) = match child.tag_name().name() {
        "circle" => ("circle", "r"),
        "polygon" => ("polygon", "points"),
        other => return Err(format!("a {other}, not a circle or polygon")),
    };
    if let Some(a) = child
        .attributes()
        .find(|a| a.name() != geometry && !matches!(a.name(), "fill" | "stroke" | "stroke-width"))
    {
        return Err(format!("a {element} with a {} attribute", a.name()));
    }
    let stroke_width = match child.attribute("stroke-width") {
        None => 1.0,
        Some(w) => match w.parse::<f64>() {
            Ok(w) if w.is_finite() && w >= 0.0 => w,
            _ => return Err(format!("stroke-width {w:?}")),
        },
    };
    let unpainted = |paint: Option<&str>| matches!(paint, Some("none" | "transparent"));
    // SVG fills black and strokes nothing by default.
    let stroked = !unpainted(child.attribute("stroke").or(Some("none"))) && stroke_width > 0.0;
    if unpainted(child.attribute("fill")) && !stroked {
        return Err(format!("an unpainted {element}"));
    }
    let radius = if element == "circle" {
        match child.attribute("r").and_then(|r| r.parse::<f64>().ok()) {
            Some(r) if r.is_finite() && r > 0.0 => r,
            _ => return Err("a circle without a positive r".into()),
        }
    } else {
        let points = child.attribute("points").and_then(polygon_points);
        let Some(points) = points.filter(|p| p.len() >= 3) else {
            return Err("a polygon without three or more points".into());
        };
        let n = points.len() as f64;
        let centre = (
            points.iter().map(|p| p.0).sum::<f64>() / n,
            points.iter().map(|p| p.1).sum::<f64>() / n,
        );
        if centre.0.abs() > 1.0 || centre.1.abs() > 1.0 {
            return Err(format!(
                "a polygon centred on ({:.1}, {:.1}), not on its position",
                centre.0, centre.1
            ));
        }
        points.iter().map(|(x, y)| x.hypot(*y)).fold(0.0, f64::max)
    };
    let reach = radius + if stroked { stroke_width / 2.0 } else { 0.0 };
    if reach > MARKER_REACH {
        return Err(format!(
            "a {element} reaching {reach:.1} px from its centre; at most {MARKER_REACH}"
        ));
    }
    Ok(())
}

/// Whether a float32 group draws one vertical line at pixel `at` across the plot, solid or
/// dashed: at least one polyline (the elements check allows nothing else in it), every point
/// within a pixel of `at` and on the y axis, together reaching within 10 px of both ends.
fn vertical_line(group: Node, at: f64, y_axis: Axis) -> bool {
    let dashes: Vec<Node> = group.children().filter(|n| n.is_element()).collect();
    let mut points = Vec::new();
    for dash in &dashes {
        let Some(list) = dash.attribute("points") else {
            return false;
        };
        for point in list.split_whitespace() {
            let parsed = point
                .split_once(',')
                .and_then(|(x, y)| Some((x.parse::<f64>().ok()?, y.parse::<f64>().ok()?)));
            let Some((x, y)) = parsed else {
                return false;
            };
            points.push((x, y));
        }
    }
    let (low, high) = y_axis.span();
    let reach = |end: f64| points.iter().any(|(_, y)| (y - end).abs() <= 10.0);
    !dashes.is_empty()
        && points
            .iter()
            .all(|&(x, y)| (x - at).abs() <= 1.0 && y_axis.holds(y))
        && reach(low)
        && reach(high)
}

/// Checks a chart of panels against what the audit expects; problems are wrapped by `wrap`.
pub(crate) fn check_panels(
    svg: &str,
    want: &ExpectedChart,
    wrap: fn(ChartProblem) -> Problem,
    report: &mut Report,
) {
    let mut fail = |problem: ChartProblem| report.fail(wrap(problem));
    let doc = match Document::parse(svg) {
        Ok(doc) => doc,
        Err(e) => {
            return fail(ChartProblem::Document {
                reason: e.to_string(),
            });
        }
    };
    let root = doc.root_element();
    if root.tag_name().name() != "svg"
        || root.tag_name().namespace() != Some("http://www.w3.org/2000/svg")
    {
        return fail(ChartProblem::Document {
            reason: "the root is not an svg element".into(),
        });
    }
    match check_elements(root, want) {
        // A stray shape is named, and the rest still checked.
        Ok(strays) => strays.into_iter().for_each(&mut fail),
        Err(problem) => return fail(problem),
    }
    let panels: Vec<Node> = root
        .children()
        .filter(|n| n.has_tag_name("g") && n.attribute("class") == Some("panel"))
        .collect();
    if panels.len() != want.panels.len() {
        return fail(ChartProblem::Mapping {
            what: format!("{} panels, expected {}", panels.len(), want.panels.len()),
        });
    }
    let mut axes: Vec<(Axis, Axis)> = Vec::new();
    for (node, expected) in panels.iter().zip(&want.panels) {
        let axis =
            |range: &str, pixels: &str| Axis::parse(node.attribute(range), node.attribute(pixels));
        let named = expected
            .attributes
            .iter()
            .all(|(name, value)| node.attribute(*name) == Some(value.as_str()));
        match (
            named,
            axis("data-x-range", "data-x-pixels"),
            axis("data-y-range", "data-y-pixels"),
        ) {
            (true, Some(x), Some(y)) => axes.push((x, y)),
            _ => {
                return fail(ChartProblem::Mapping {
                    what: format!(
                        "panel {:?}: its data or its data-x/y-range or data-x/y-pixels",
                        expected.title
                    ),
                });
            }
        }
    }
    // One y range for every panel, so that rows and columns compare; no panel over another.
    let first_y = axes[0].1;
    for (i, (x, y)) in axes.iter().enumerate() {
        let title = &want.panels[i].title;
        if (y.lo, y.hi) != (first_y.lo, first_y.hi) || (y.a - y.b) != (first_y.a - first_y.b) {
            fail(ChartProblem::Mapping {
                what: format!("panel {title:?}: a y axis unlike the first panel's"),
            });
        }
        for (other, (ox, oy)) in axes.iter().enumerate().skip(i + 1) {
            let apart = |p: (f64, f64), q: (f64, f64)| p.1 <= q.0 || q.1 <= p.0;
            if !apart(x.span(), ox.span()) && !apart(y.span(), oy.span()) {
                fail(ChartProblem::Mapping {
                    what: format!(
                        "panel {title:?} overlaps panel {:?}",
                        want.panels[other].title
                    ),
                });
            }
        }
    }
    let grid_right = axes
        .iter()
        .map(|(x, _)| x.span().1)
        .fold(f64::NEG_INFINITY, f64::max);

    let mut placed = 0;
    let mut index = 0;
    for ((node, expected), &(x_axis, y_axis)) in panels.iter().zip(&want.panels).zip(&axes) {
        let mut fail = |problem: ChartProblem| report.fail(wrap(problem));
        check_panel_texts(*node, expected, x_axis, y_axis, want.y_label, &mut fail);
        let lines: Vec<Node> = node
            .children()
            .filter(|n| n.has_tag_name("g") && n.attribute("class") == Some("float32"))
            .collect();
        let at = x_axis.pixel(expected.float32);
        let line_ok = x_axis.holds(at)
            && matches!(lines.as_slice(), [line] if vertical_line(*line, at, y_axis));
        if !line_ok {
            fail(ChartProblem::Mapping {
                what: format!(
                    "panel {:?}: not one float32 line at x {at:.1}",
                    expected.title
                ),
            });
        }
        let found: Vec<Node> = node
            .children()
            .filter(|n| n.has_tag_name("g") && n.attribute("class") != Some("float32"))
            .collect();
        if found.len() != expected.markers.len() {
            fail(ChartProblem::Marker {
                index: index + found.len().min(expected.markers.len()),
                found: format!("{} markers in panel {:?}", found.len(), expected.title),
                expected: format!("{} markers", expected.markers.len()),
            });
        }
        for (marker, w) in found.iter().zip(&expected.markers) {
            let i = index;
            index += 1;
            let mut names: Vec<&str> = marker
                .attributes()
                .map(|a| a.name())
                .filter(|n| !matches!(*n, "class" | "transform"))
                .collect();
            let mut wanted = want.marker_attributes.clone();
            names.sort_unstable();
            wanted.sort_unstable();
            let same = marker.attribute("class") == Some("marker")
                && names == wanted
                && w.strings
                    .iter()
                    .all(|(name, value)| marker.attribute(*name) == Some(value.as_str()))
                && w.numbers
                    .iter()
                    .all(|(name, value)| number(*marker, name).is_some_and(|v| close(v, *value)));
            if !same {
                let found = w
                    .strings
                    .iter()
                    .map(|(name, _)| *name)
                    .chain(w.numbers.iter().map(|(name, _)| *name))
                    .map(|name| marker.attribute(name).unwrap_or("-"))
                    .collect::<Vec<_>>()
                    .join(" ");
                fail(ChartProblem::Marker {
                    index: i,
                    found,
                    expected: w.describe(),
                });
                continue;
            }
            let shape_problem = |what: String| ChartProblem::Shape {
                config: w.config.clone(),
                distribution: w.condition.clone(),
                tokens: w.tokens,
                what,
            };
            let Some((x, y)) = translate(*marker) else {
                fail(shape_problem("no translate(X,Y) transform".into()));
                continue;
            };
            let (ex, ey) = (x_axis.pixel(w.x), y_axis.pixel(w.y));
            let inside = x_axis.holds(ex) && y_axis.holds(ey);
            if (x - ex).abs() > 1.0 || (y - ey).abs() > 1.0 || !inside {
                fail(ChartProblem::Position {
                    config: w.config.clone(),
                    distribution: w.condition.clone(),
                    tokens: w.tokens,
                    x,
                    y,
                    ex,
                    ey,
                });
            }
            if let Err(what) = point_shape(*marker) {
                fail(shape_problem(what));
                continue;
            }
            placed += 1;
        }
        index += expected
            .markers
            .len()
            .saturating_sub(found.len().min(expected.markers.len()));
    }
    check_legend(root, want, grid_right, &mut |p| report.fail(wrap(p)));
    report.count(Checked::ChartMarkers, placed);
}

/// Texts in a panel: its title, its float32 label, the empty-panel note, and tick labels at
/// their pixel (x below the plot area, y left of it), however anchored; at least two x tick
/// labels, and two y tick labels in the first panel of a row.
fn check_panel_texts(
    panel: Node,
    want: &ExpectedPanel,
    x_axis: Axis,
    y_axis: Axis,
    y_label: fn(&str) -> Option<f64>,
    fail: &mut dyn FnMut(ChartProblem),
) {
    let mut counts = [0usize; 2];
    let mut titled = false;
    let mut float32 = false;
    for text in panel.children().filter(|n| n.has_tag_name("text")) {
        let label = text.text().unwrap_or("").trim();
        if label == want.title {
            titled = true;
            continue;
        }
        if label == want.float32_label {
            float32 = true;
            continue;
        }
        if label == want.empty_note && want.markers.is_empty() {
            continue;
        }
        let tick = |axis: &'static str, what: String| ChartProblem::Tick {
            axis,
            label: label.to_string(),
            what,
        };
        let (Some(x), Some(y)) = (number(text, "x"), number(text, "y")) else {
            fail(tick("x", "without a position".into()));
            continue;
        };
        let left = x < x_axis.span().0;
        let below = y > y_axis.span().1;
        let (axis_name, axis, value, along) = match (left, below) {
            (true, false) => ("y", y_axis, y_label(label), y),
            (false, true) => ("x", x_axis, x_label(label), x),
            _ => {
                fail(ChartProblem::Element {
                    what: format!("a text {label:?} in panel {:?}", want.title),
                });
                continue;
            }
        };
        let Some(value) = value else {
            fail(tick(axis_name, "not a tick label of this axis".into()));
            continue;
        };
        counts[usize::from(axis_name == "x")] += 1;
        let expected = axis.pixel(value);
        if (along - expected).abs() > 1.0 || !axis.holds(along) {
            fail(tick(
                axis_name,
                format!("at {along}, its value maps to {expected:.1}"),
            ));
        }
    }
    for (ok, expected) in [(titled, &want.title), (float32, &want.float32_label)] {
        if !ok {
            fail(ChartProblem::Label {
                expected: expected.clone(),
            });
        }
    }
    let need = [usize::from(want.first_column) * 2, 2];
    for ((axis, count), need) in [("y", counts[0]), ("x", counts[1])].into_iter().zip(need) {
        if count < need {
            fail(ChartProblem::Tick {
                axis,
                label: String::new(),
                what: format!(
                    "{count} tick labels in panel {:?}; the mapping needs at least two to be read",
                    want.title
                ),
            });
        }
    }
}

/// The legend: the swatches in order, each a point shape followed by its label, right of the
/// grid; the texts outside the panels exactly the chart's titles, headings and legend labels.
fn check_legend(
    root: Node,
    want: &ExpectedChart,
    grid_right: f64,
    fail: &mut dyn FnMut(ChartProblem),
) {
    let swatches: Vec<Node> = root
        .children()
        .filter(|n| n.has_tag_name("g") && n.attribute("class") == Some("swatch"))
        .collect();
    let entries: Vec<&String> = want.legend.iter().flat_map(|(_, s)| s).collect();
    let mut labels: Vec<&str> = Vec::new();
    for (i, &label) in entries.iter().enumerate() {
        let Some(swatch) = swatches.get(i) else {
            fail(ChartProblem::Legend {
                config: label.to_string(),
            });
            continue;
        };
        let text = swatch
            .next_sibling_element()
            .filter(|t| t.has_tag_name("text"))
            .and_then(|t| t.text())
            .unwrap_or("")
            .trim();
        labels.push(text);
        let right = translate(*swatch).is_some_and(|(x, _)| x > grid_right);
        if swatch.attribute("data-series") != Some(label.as_str()) || text != label || !right {
            fail(ChartProblem::Legend {
                config: label.to_string(),
            });
            continue;
        }
        if let Err(what) = point_shape(*swatch) {
            fail(ChartProblem::Shape {
                config: label.to_string(),
                distribution: "legend".into(),
                tokens: 0,
                what,
            });
        }
    }
    if swatches.len() > entries.len() {
        fail(ChartProblem::Element {
            what: format!(
                "{} legend swatches for {} series",
                swatches.len(),
                entries.len()
            ),
        });
    }
    let texts: Vec<&str> = root
        .children()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim())
        .collect();
    for expected in &want.texts {
        if !texts.contains(&expected.as_str()) {
            fail(ChartProblem::Label {
                expected: expected.clone(),
            });
        }
    }
    // Legend labels may appear once each; nothing else may be written outside the panels.
    let mut legend_labels = labels;
    for text in texts {
        if want.texts.iter().any(|t| t == text) {
            continue;
        }
        if let Some(at) = legend_labels.iter().position(|l| *l == text) {
            legend_labels.remove(at);
            continue;
        }
        fail(ChartProblem::Element {
            what: format!("a text {text:?} outside the panels"),
        });
    }
}

/// The elements and attributes: only what the chart uses, groups only for panels (children of
/// the root), their markers and the legend's swatches, transforms only theirs and the rotated y
/// axis title, tick-like texts shifted by at most one em or ex (`dy`) and by nothing else, and
/// no filled rect but the background (first); the error is the first breach. Returns the
/// circles and polygons outside markers and swatches (strays).
fn check_elements(root: Node, want: &ExpectedChart) -> Result<Vec<ChartProblem>, ChartProblem> {
    let element = |what: String| ChartProblem::Element { what };
    let mut strays = Vec::new();
    for node in root.descendants().filter(|n| n.is_element()) {
        let name = node.tag_name().name();
        if !ALLOWED.contains(&name) {
            return Err(element(format!("a {name} element")));
        }
        if let Some(a) = node.attributes().find(|a| {
            let n = a.name().to_ascii_lowercase();
            n.contains("href") || n.starts_with("on") || n == "style" || a.value().contains("url(")
        }) {
            return Err(element(format!("a {} attribute", a.name())));
        }
        let parent = node.parent_element();
        fn class_of<'a>(n: Option<Node<'a, '_>>) -> Option<&'a str> {
            n.and_then(|n| n.attribute("class"))
        }
        let at_root = parent == Some(root);
        let group = node.has_tag_name("g");
        let panel = group && at_root && class_of(Some(node)) == Some("panel");
        let swatch = group && at_root && class_of(Some(node)) == Some("swatch");
        let marker =
            group && class_of(Some(node)) == Some("marker") && class_of(parent) == Some("panel");
        let float32 =
            group && class_of(Some(node)) == Some("float32") && class_of(parent) == Some("panel");
        if group && !(panel || swatch || marker || float32) {
            return Err(element(
                "a group other than a panel, marker, swatch or float32 line".into(),
            ));
        }
        // The float32 line's group holds its dashes only, and carries nothing else.
        let in_float32 =
            parent.is_some_and(|p| p.has_tag_name("g")) && class_of(parent) == Some("float32");
        if (float32 && node.attributes().any(|a| a.name() != "class"))
            || (in_float32 && name != "polyline")
        {
            return Err(element("a float32 line other than dashes".into()));
        }
        // A filled polyline could cover markers as a filled rect could; plotters draws none.
        if name == "polyline" && node.attribute("fill") != Some("none") {
            return Err(element("a filled polyline".into()));
        }
        // A filled rectangle could cover markers: only the background, first, may be filled;
        // a panel's frame is an outline.
        let background = at_root && root.first_element_child() == Some(node);
        if name == "rect" && !background && node.attribute("fill") != Some("none") {
            return Err(element("a filled rect over the chart".into()));
        }
        if matches!(name, "circle" | "polygon")
            && !matches!(class_of(parent), Some("marker" | "swatch"))
        {
            let x = number(node, "cx").unwrap_or(f64::NAN);
            let y = number(node, "cy").unwrap_or(f64::NAN);
            strays.push(ChartProblem::Stray {
                element: name.to_string(),
                x,
                y,
            });
        }
        let label = node.text().unwrap_or("").trim();
        let tick = node.has_tag_name("text")
            && ((want.y_label)(label).is_some() || x_label(label).is_some());
        if let Some(t) = node.attribute("transform") {
            let rotated_title =
                node.has_tag_name("text") && at_root && t.starts_with("rotate(") && !tick;
            if !(marker || swatch || rotated_title) {
                return Err(element(format!("a transform {t:?}")));
            }
        }
        if tick {
            let plain = node.attributes().all(|a| {
                matches!(
                    a.name(),
                    "x" | "y" | "text-anchor" | "font-family" | "font-size" | "opacity" | "fill"
                ) || (a.name() == "dy" && baseline_shift(a.value()))
            });
            if !plain {
                return Err(element("a tick label with an offset or a transform".into()));
            }
        }
        if panel {
            let known = node.attributes().all(|a| {
                a.name() == "class"
                    || matches!(
                        a.name(),
                        "data-x-range" | "data-y-range" | "data-x-pixels" | "data-y-pixels"
                    )
                    || want
                        .panels
                        .first()
                        .is_some_and(|p| p.attributes.iter().any(|(n, _)| *n == a.name()))
            });
            if !known {
                return Err(element("a panel attribute the chart does not write".into()));
            }
        }
        if swatch
            && node
                .attributes()
                .any(|a| !matches!(a.name(), "class" | "data-series" | "transform"))
        {
            return Err(element(
                "a swatch attribute the chart does not write".into(),
            ));
        }
    }
    Ok(strays)
}
