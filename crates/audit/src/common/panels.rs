//! The check of a chart of panels, shared by error-vs-bytes.svg ([`crate::packed_kv::chart`]) and
//! quality-vs-bytes.svg ([`crate::model_quality::chart`]): every marker tied to its numbers, in
//! its own panel, placed where that panel's axes say, and the chart read as a viewer sees it.
//! The audit checks figures and what they look like to a reader, not the style: colours, which
//! shape a marker is, filled or hollow, stroke widths, the float32 line's dashes and the tick
//! labels' anchoring are the chart's to choose, so long as each series looks like itself and
//! unlike the others.
//!
//! Each panel is a `<g class="panel">` that names what it shows in data attributes and declares
//! its log-log axis mapping (`data-x-range`, `data-y-range`: the value range; `data-x-pixels`,
//! `data-y-pixels`: where its ends land; a value v lands at `a + (b - a) * ln(v / lo) / ln(hi /
//! lo)`), and holds its markers, `<g class="marker" ... transform="translate(X,Y)">` around one
//! shape. Given what a chart must hold (`ExpectedChart`, derived by each chart's module), the
//! audit requires:
//! - the form the runner writes (`form`): a closed set of elements and of attributes for each,
//!   values that read one way (paints `none` or `#RRGGBB`, single numbers, generic font
//!   families), no comment, processing instruction, declaration or foreign namespace, a viewBox
//!   of exactly `0 0 width height`, a painted background over the whole document first, no group
//!   but panels, markers, swatches, float32 lines and frontiers, no transform but theirs and a rotation of
//!   a root text about its own anchor, texts of one part (what the audit reads is all that is
//!   drawn), polylines only in panels, each one horizontal or vertical segment at least twice as
//!   long as it is wide (a float32 line's dashes one pen, thinner than half its longest dash; a
//!   frontier's steps any length), no
//!   filled polyline, no rect but the background and one frame per panel equal to its plot area,
//!   and no circle or polygon outside a marker or swatch;
//! - the panels in order, each with its data attributes and titled, not overlapping, inside the
//!   document, all with one y range (so rows compare), and each with one float32 line, a
//!   `<g class="float32">` holding only polylines (plotters draws a dashed line as one per
//!   dash), every point within a pixel of the pixel its mapping gives the float32 size and
//!   together spanning the plot's height, and its label;
//! - in a panel with a frontier (the model-quality chart), a `<g class="frontier">` after its
//!   float32 line and before its markers, holding exactly the staircase through its frontier
//!   markers' own translates (from each, a horizontal segment to the next one's x, then a
//!   vertical one to its y, a segment of zero length left out), one two-point polyline each;
//!   none where the staircase has no segment, and none in a panel without a frontier;
//! - in each panel exactly its markers, in order, each with exactly its data attributes, equal
//!   to the audit's own values;
//! - each marker within one pixel of where its panel's mapping puts its data, inside the plot
//!   area, and drawn as a point there: one circle or polygon centred on its translate (a circle
//!   without `cx`/`cy`, a polygon whose vertices average within a pixel of it), painted (its fill
//!   or its stroke not `none`), reaching at most [`MARKER_REACH`] px from its centre, stroke
//!   included, of at most [`MAX_VERTICES`] vertices, and with no attribute but its geometry,
//!   `fill`, `stroke` and `stroke-width`;
//! - every marker seen (`sight`): nothing but later markers drawn over it, and at least a
//!   pixel of it left uncovered by them in a colour that stands out from the background and
//!   from what lies beneath (a later marker within a pixel of it, where the data coincide at
//!   the chart's resolution, is the data's doing and not counted);
//! - every text in a panel its title, its float32 label, the empty-panel note, or a tick label
//!   at the pixel the panel's mapping gives its value (x labels below the plot, y labels left of
//!   it), shifted by at most one em or ex (`dy`) and by nothing else; at least two x tick labels
//!   per panel and two y tick labels in each row's first panel;
//! - a legend right of the grid, read by relation: a `<g class="swatch" data-series="LABEL">` per
//!   series, in order, holding one point shape as a marker does and followed by its label; each
//!   label beside its own swatch (just right of it, on its line, and nearer to it than to any
//!   other swatch), each heading above its group's swatches and below the group before; every
//!   marker of a series drawn exactly as its swatch; any two series' paints telling apart (by at
//!   least a pixel of distinct colour, each drawn alone on the background: colour, shape, and
//!   filled or hollow all count); swatches and labels seen, nothing drawn over them; and besides
//!   the legend's labels only the chart's titles and headings outside the panels, a title
//!   either on one line or wrapped at spaces into consecutive lines.

mod form;
mod sight;

use roxmltree::{Document, Node, NodeId};

use crate::common::problem::ChartProblem;
use crate::common::report::{Checked, Problem, Report};
use crate::common::svg::{Axis, number, translate, x_label};
use crate::common::tolerance::close;
use sight::{
    Drawn, Look, MAX_BENEATH, MIN_AREA, Paint, Rgb, paint_value, paints_differ, visible_area,
};

/// How far a marker's (or legend swatch's) shape may reach from its centre, stroke included, in
/// pixels: a marker marks a point, and a larger shape could cover the markers around it.
pub const MARKER_REACH: f64 = 10.0;

/// Most vertices a marker's polygon may have: a point's shape needs few, and each is weighed at
/// every sample of what a viewer sees.
pub const MAX_VERTICES: usize = 64;

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
    /// The markers (indices into `markers`) a frontier staircase joins, in its order; fewer
    /// than two: no frontier.
    pub frontier: Vec<usize>,
}

/// One marker the audit expects; `strings` and `numbers` name all its attributes besides
/// `class` and `transform`.
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
    /// Its series' legend label: its paint must be that swatch's.
    pub series: String,
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
/// with no attribute but its geometry and paint; returns its paint. Its colour, its shape and
/// its stroke are free.
fn point_shape(node: Node) -> Result<Paint, String> {
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
    let paint = Paint::read(*child)?;
    if let sight::Geometry::Polygon(points) = &paint.geometry {
        if points.len() > MAX_VERTICES {
            return Err(format!(
                "a polygon of {} vertices; a point's shape has at most {MAX_VERTICES}",
                points.len()
            ));
        }
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
    }
    let reach = paint.reach();
    if reach > MARKER_REACH {
        return Err(format!(
            "a {element} reaching {reach:.1} px from its centre; at most {MARKER_REACH}"
        ));
    }
    Ok(paint)
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

/// A panel's frontier: a `<g class="frontier">` after its float32 line and before its markers,
/// holding exactly the staircase through the frontier markers' own translates (in order: from
/// each, a horizontal segment to the next one's x, then a vertical one to its y; a segment of
/// zero length left out), one two-point polyline per segment; no group when the staircase has
/// no segment.
fn check_frontier(
    panel: Node,
    markers: &[Node],
    expected: &ExpectedPanel,
    fail: &mut dyn FnMut(ChartProblem),
) {
    let corners: Vec<(f64, f64)> = expected
        .frontier
        .iter()
        .filter_map(|&i| markers.get(i).and_then(|m| translate(*m)))
        .collect();
    let mut want = Vec::new();
    for pair in corners.windows(2) {
        let ((x1, y1), (x2, y2)) = (pair[0], pair[1]);
        for segment in [[(x1, y1), (x2, y1)], [(x2, y1), (x2, y2)]] {
            if segment[0] != segment[1] {
                want.push(segment);
            }
        }
    }
    let children: Vec<Node> = panel.children().filter(|n| n.is_element()).collect();
    let groups: Vec<usize> = (0..children.len())
        .filter(|&k| children[k].attribute("class") == Some("frontier"))
        .collect();
    let found: Vec<Option<[(f64, f64); 2]>> = groups
        .first()
        .map(|&k| {
            children[k]
                .children()
                .filter(|n| n.is_element())
                .map(form::segment)
                .collect()
        })
        .unwrap_or_default();
    // Drawn before every marker and after the float32 line.
    let placed = match groups.as_slice() {
        [] => true,
        [k] => {
            let first_marker = children
                .iter()
                .position(|n| n.attribute("class") == Some("marker"));
            let float32 = children
                .iter()
                .position(|n| n.attribute("class") == Some("float32"));
            first_marker.is_none_or(|m| *k < m) && float32.is_some_and(|f| f < *k)
        }
        _ => false,
    };
    let same = found.len() == want.len()
        && found
            .iter()
            .zip(&want)
            .all(|(f, w)| f.is_some_and(|f| f == *w));
    if !placed || !same || (want.is_empty() && !groups.is_empty()) {
        fail(ChartProblem::Mapping {
            what: format!(
                "panel {:?}: the frontier is not the staircase through its {} frontier markers \
                 ({} segments found, {} expected), drawn once between the float32 line and the \
                 markers",
                expected.title,
                corners.len(),
                found.len(),
                want.len()
            ),
        });
    }
}

/// A marker whose shape reads: its group, how problems name it, its series and its paint.
struct Shown {
    group: NodeId,
    name: String,
    series: String,
    paint: Paint,
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
    match form::check_form(svg, &doc, want) {
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
    let document = match form::document_size(root) {
        Ok(size) => size,
        Err(problem) => return fail(problem),
    };
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
    let in_document =
        |x: f64, y: f64| (0.0..=document.0).contains(&x) && (0.0..=document.1).contains(&y);
    for text in root.descendants().filter(|n| n.has_tag_name("text")) {
        let (x, y) = (number(text, "x"), number(text, "y"));
        if !x.zip(y).is_some_and(|(x, y)| in_document(x, y)) {
            fail(ChartProblem::Hidden {
                what: format!("the text {:?}", text.text().unwrap_or("").trim()),
                why: outside(document),
            });
        }
    }

    let mut placed = 0;
    let mut index = 0;
    let mut shown: Vec<Shown> = Vec::new();
    for ((node, expected), &(x_axis, y_axis)) in panels.iter().zip(&want.panels).zip(&axes) {
        let mut fail = |problem: ChartProblem| report.fail(wrap(problem));
        check_panel_texts(*node, expected, x_axis, y_axis, want.y_label, &mut fail);
        check_plot_area(*node, &expected.title, x_axis, y_axis, document, &mut fail);
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
            .filter(|n| {
                n.has_tag_name("g") && !matches!(n.attribute("class"), Some("float32" | "frontier"))
            })
            .collect();
        check_frontier(*node, &found, expected, &mut fail);
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
            let mut wanted: Vec<&str> = w
                .strings
                .iter()
                .map(|(name, _)| *name)
                .chain(w.numbers.iter().map(|(name, _)| *name))
                .collect();
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
            match point_shape(*marker) {
                Ok(paint) => shown.push(Shown {
                    group: marker.id(),
                    name: format!("marker {} {} N={}", w.config, w.condition, w.tokens),
                    series: w.series.clone(),
                    paint,
                }),
                Err(what) => {
                    fail(shape_problem(what));
                    continue;
                }
            }
            placed += 1;
        }
        index += expected
            .markers
            .len()
            .saturating_sub(found.len().min(expected.markers.len()));
    }
    let mut fail = |problem: ChartProblem| report.fail(wrap(problem));
    let legend = check_legend(root, want, grid_right, document, &mut fail);
    check_series(root, &legend, &shown, &mut fail);
    check_sight(root, &legend, &shown, &mut fail);
    report.count(Checked::ChartMarkers, placed);
}

fn outside(document: (f64, f64)) -> String {
    format!(
        "it lies outside the {} x {} px document",
        document.0, document.1
    )
}

/// A panel's plot area inside the document, its frame (if drawn) on the plot area's edge, and
/// its grid lines inside the plot area: so that the panel is shown whole, and nothing in it
/// passes for another mark.
fn check_plot_area(
    panel: Node,
    title: &str,
    x_axis: Axis,
    y_axis: Axis,
    document: (f64, f64),
    fail: &mut dyn FnMut(ChartProblem),
) {
    let ((x0, x1), (y0, y1)) = (x_axis.span(), y_axis.span());
    if x0 < 0.0 || y0 < 0.0 || x1 > document.0 || y1 > document.1 {
        fail(ChartProblem::Hidden {
            what: format!("panel {title:?}"),
            why: outside(document),
        });
    }
    let frames: Vec<Node> = panel
        .children()
        .filter(|n| n.has_tag_name("rect"))
        .collect();
    let on_edge = |f: &Node| {
        let near = |name: &str, v: f64| number(*f, name).is_some_and(|n| (n - v).abs() <= 1.0);
        near("x", x0) && near("y", y0) && near("width", x1 - x0) && near("height", y1 - y0)
    };
    if frames.len() > 1 || !frames.iter().all(on_edge) {
        fail(ChartProblem::Mapping {
            what: format!("panel {title:?}: a frame other than its plot area's edge"),
        });
    }
    let lines_inside = panel
        .children()
        .filter(|n| n.has_tag_name("polyline"))
        .all(|line| {
            form::segment(line).is_some_and(|points| {
                points
                    .iter()
                    .all(|&(x, y)| x_axis.holds(x) && y_axis.holds(y))
            })
        });
    if !lines_inside {
        fail(ChartProblem::Mapping {
            what: format!("panel {title:?}: a line outside its plot area"),
        });
    }
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

/// A legend entry as drawn: its swatch group, its label text and the swatch's paint.
struct Entry {
    label: String,
    swatch: NodeId,
    text: NodeId,
    paint: Paint,
}

/// Where a legend entry is drawn: its swatch's centre, where its label starts on the line a
/// reader sees it on ([`sight::text_line`]), the swatch's reach, and whether the label is
/// anchored at its start.
#[derive(Clone, Copy)]
struct Place {
    swatch: (f64, f64),
    label: (f64, f64),
    reach: f64,
    from_start: bool,
}

/// The legend: the swatches in order, each a point shape followed by its label, right of the
/// grid and inside the document; each label beside its own swatch and each heading above its
/// group; the texts outside the panels exactly the chart's titles, headings and legend labels.
/// Returns the entries (by series, in legend order) whose swatch and label read.
fn check_legend(
    root: Node,
    want: &ExpectedChart,
    grid_right: f64,
    document: (f64, f64),
    fail: &mut dyn FnMut(ChartProblem),
) -> Vec<Option<Entry>> {
    let swatches: Vec<Node> = root
        .children()
        .filter(|n| n.has_tag_name("g") && n.attribute("class") == Some("swatch"))
        .collect();
    let entries: Vec<&String> = want.legend.iter().flat_map(|(_, s)| s).collect();
    let mut labels: Vec<&str> = Vec::new();
    let mut found: Vec<Option<Entry>> = Vec::new();
    let mut places: Vec<Option<Place>> = Vec::new();
    for (i, &label) in entries.iter().enumerate() {
        found.push(None);
        places.push(None);
        let Some(swatch) = swatches.get(i) else {
            fail(ChartProblem::Legend {
                config: label.to_string(),
            });
            continue;
        };
        let text_node = swatch
            .next_sibling_element()
            .filter(|t| t.has_tag_name("text"));
        let text = text_node.and_then(|t| t.text()).unwrap_or("").trim();
        labels.push(text);
        let centre = translate(*swatch);
        let right = centre.is_some_and(|(x, _)| x > grid_right);
        if swatch.attribute("data-series") != Some(label.as_str()) || text != label || !right {
            fail(ChartProblem::Legend {
                config: label.to_string(),
            });
            continue;
        }
        let paint = match point_shape(*swatch) {
            Ok(paint) => paint,
            Err(what) => {
                fail(ChartProblem::Shape {
                    config: label.to_string(),
                    distribution: "legend".into(),
                    tokens: 0,
                    what,
                });
                continue;
            }
        };
        let (Some(centre), Some(text_node)) = (centre, text_node) else {
            continue;
        };
        let reach = paint.reach();
        let inside = centre.0 - reach >= 0.0
            && centre.1 - reach >= 0.0
            && centre.0 + reach <= document.0
            && centre.1 + reach <= document.1;
        if !inside {
            fail(ChartProblem::Hidden {
                what: format!("legend swatch {label}"),
                why: outside(document),
            });
        }
        places[i] = Some(Place {
            swatch: centre,
            label: sight::text_line(text_node).unwrap_or((f64::NAN, f64::NAN)),
            reach,
            from_start: text_node
                .attribute("text-anchor")
                .is_none_or(|a| a == "start"),
        });
        found[i] = Some(Entry {
            label: label.clone(),
            swatch: swatch.id(),
            text: text_node.id(),
            paint,
        });
    }
    let centres: Vec<Option<(f64, f64)>> = swatches.iter().map(|s| translate(*s)).collect();
    check_beside(&entries, &centres, &places, fail);
    check_headings(root, want, grid_right, &places, fail);
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
    let mut wrapped_pieces = vec![false; texts.len()];
    for expected in &want.texts {
        if texts.contains(&expected.as_str()) {
            continue;
        }
        match wrapped_into(&texts, expected) {
            Some(pieces) => wrapped_pieces[pieces].fill(true),
            None => fail(ChartProblem::Label {
                expected: expected.clone(),
            }),
        }
    }
    // Legend labels may appear once each; nothing else may be written outside the panels.
    let mut legend_labels = labels;
    for (text, wrapped) in texts.into_iter().zip(wrapped_pieces) {
        if wrapped || want.texts.iter().any(|t| t == text) {
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
    found
}

/// The run of consecutive texts (at least two) that `expected` was wrapped into: a long axis
/// title under a narrow grid is broken at spaces into lines, which read as its words in order.
fn wrapped_into(texts: &[&str], expected: &str) -> Option<std::ops::Range<usize>> {
    let words: Vec<&str> = expected.split_whitespace().collect();
    (0..texts.len()).find_map(|start| {
        let mut read = 0;
        for (end, text) in texts.iter().enumerate().skip(start) {
            let piece: Vec<&str> = text.split_whitespace().collect();
            if piece.is_empty() || words.get(read..read + piece.len()) != Some(&piece[..]) {
                return None;
            }
            read += piece.len();
            if read == words.len() {
                return (end > start).then_some(start..end + 1);
            }
        }
        None
    })
}

/// Each label beside its own swatch, as a reader pairs them: anchored at its start just right
/// of the swatch's shape (within [`MARKER_REACH`] of its edge), its line (after any `dy`) on the
/// swatch's (within half of [`MARKER_REACH`]), and nearer to it than to any other swatch. The
/// document order (label after swatch) is not what a reader sees; this is.
fn check_beside(
    entries: &[&String],
    centres: &[Option<(f64, f64)>],
    places: &[Option<Place>],
    fail: &mut dyn FnMut(ChartProblem),
) {
    for (i, place) in places.iter().enumerate() {
        let Some(Place {
            swatch: (sx, sy),
            label: (lx, ly),
            reach,
            from_start,
        }) = *place
        else {
            continue;
        };
        let distance = |(x, y): (f64, f64)| (lx - x).hypot(ly - y);
        // The swatch a reader pairs the label with: the nearest (its own, if tied).
        let nearer = centres
            .iter()
            .enumerate()
            .filter_map(|(j, c)| c.filter(|_| j != i).map(|c| (j, distance(c))))
            .filter(|(_, d)| *d <= distance((sx, sy)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(j, _)| j);
        let gap = lx - sx - reach;
        let beside = from_start
            && (0.0..=MARKER_REACH).contains(&gap)
            && (ly - sy).abs() <= MARKER_REACH / 2.0;
        let what = match nearer {
            Some(j) => format!(
                "its label sits beside the swatch of {}",
                entries.get(j).map_or("no series", |l| l.as_str())
            ),
            None if !beside => format!(
                "its label at ({lx}, {ly}) is not just right of its swatch at ({sx}, {sy}), \
                 on its line and anchored at its start"
            ),
            None => continue,
        };
        fail(ChartProblem::Series {
            series: entries[i].to_string(),
            what,
        });
    }
}

/// Each legend heading above its group's swatches and below the previous group's, at the
/// legend's left (right of the grid, not right of its swatches): what a reader takes each group
/// to be.
fn check_headings(
    root: Node,
    want: &ExpectedChart,
    grid_right: f64,
    places: &[Option<Place>],
    fail: &mut dyn FnMut(ChartProblem),
) {
    let mut first = 0;
    let mut above = f64::NEG_INFINITY;
    for (heading, series) in &want.legend {
        let group: Vec<(f64, f64)> = places[first..first + series.len()]
            .iter()
            .flatten()
            .map(|p| p.swatch)
            .collect();
        first += series.len();
        let text = root
            .children()
            .find(|n| n.has_tag_name("text") && n.text().unwrap_or("").trim() == heading);
        // A missing heading is named as a missing text.
        if let Some(text) = text {
            let (x, y) = sight::text_line(text).unwrap_or((f64::NAN, f64::NAN));
            let top = group.iter().map(|c| c.1).fold(f64::INFINITY, f64::min);
            let left = group.iter().map(|c| c.0).fold(f64::INFINITY, f64::min);
            if !(y > above && y < top && x > grid_right && x <= left) {
                fail(ChartProblem::Series {
                    series: format!("heading {heading:?}"),
                    what: "not above its group's swatches and below the group before".into(),
                });
            }
        }
        above = group.iter().map(|c| c.1).fold(above, f64::max);
    }
}

/// What the legend says of the markers: every marker drawn exactly as its series' swatch, and
/// any two series drawn so that a viewer tells them apart.
fn check_series(
    root: Node,
    legend: &[Option<Entry>],
    shown: &[Shown],
    fail: &mut dyn FnMut(ChartProblem),
) {
    let mut named: Vec<&str> = Vec::new();
    for marker in shown {
        let Some(entry) = legend.iter().flatten().find(|e| e.label == marker.series) else {
            continue; // its legend entry is named missing
        };
        if entry.paint != marker.paint && !named.contains(&marker.series.as_str()) {
            named.push(&marker.series);
            fail(ChartProblem::Series {
                series: marker.series.clone(),
                what: format!("{} is drawn unlike its legend swatch", marker.name),
            });
        }
    }
    let background = background(root);
    let entries: Vec<&Entry> = legend.iter().flatten().collect();
    for (i, a) in entries.iter().enumerate() {
        // One problem per series: the first later series it cannot be told from.
        let alike = entries[i + 1..]
            .iter()
            .find(|b| !paints_differ(&a.paint, &b.paint, background));
        if let Some(b) = alike {
            fail(ChartProblem::Series {
                series: a.label.clone(),
                what: format!("drawn like {}: a viewer cannot tell the two apart", b.label),
            });
        }
    }
}

/// The background's colour (the form requires a painted rect over the document, first).
fn background(root: Node) -> Rgb {
    root.first_element_child()
        .filter(|n| n.has_tag_name("rect"))
        .and_then(|r| paint_value(r.attribute("fill").unwrap_or("#000000")).flatten())
        .unwrap_or([255; 3])
}

/// Every marker, swatch and legend label seen: nothing drawn over it later (for a marker,
/// nothing but other markers), and for a marker or swatch at least [`MIN_AREA`] left uncovered
/// by later markers in a colour that stands out from the background and from what lies beneath.
/// A later marker within a pixel of it (the tolerance a marker is placed to) is not counted
/// against it: there the data coincide at the chart's resolution, and no drawing shows both.
fn check_sight(
    root: Node,
    legend: &[Option<Entry>],
    shown: &[Shown],
    fail: &mut dyn FnMut(ChartProblem),
) {
    let drawn = sight::drawn(root);
    let background = background(root);
    let markers: std::collections::HashSet<NodeId> = shown.iter().map(|m| m.group).collect();
    let is_marker = |d: &Drawn| matches!(d.look, Look::Shape { .. }) && markers.contains(&d.node);
    let centre = |d: &Drawn| match d.look {
        Look::Shape { centre, .. } => Some(centre),
        _ => None,
    };
    // (element, how problems name it, whether it is a shape whose area is weighed)
    let mut protected: Vec<(NodeId, String, bool)> = shown
        .iter()
        .map(|m| (m.group, m.name.clone(), true))
        .collect();
    for entry in legend.iter().flatten() {
        protected.push((entry.swatch, format!("legend swatch {}", entry.label), true));
        protected.push((entry.text, format!("legend label {}", entry.label), false));
    }
    for (node, name, shape) in protected {
        let Some(k) = drawn.iter().position(|d| d.node == node) else {
            continue;
        };
        let me = &drawn[k];
        let marker = is_marker(me);
        let over = drawn[k + 1..]
            .iter()
            .find(|d| !(marker && is_marker(d)) && d.bounds.overlaps(&me.bounds));
        if let Some(over) = over {
            fail(ChartProblem::Hidden {
                what: name,
                why: format!("{} is drawn over it", over.name),
            });
            continue;
        }
        if !shape {
            continue;
        }
        let here = centre(me);
        let elsewhere = |d: &&Drawn| match (here, centre(d)) {
            (Some(a), Some(b)) => (a.0 - b.0).abs() > 1.0 || (a.1 - b.1).abs() > 1.0,
            _ => true,
        };
        let covers: Vec<&Drawn> = drawn[k + 1..]
            .iter()
            .filter(|d| marker && is_marker(d) && d.bounds.overlaps(&me.bounds))
            .filter(elsewhere)
            .collect();
        let area = match visible_area(&drawn, k, &covers, background) {
            Ok(area) => area,
            Err(count) => {
                fail(ChartProblem::Hidden {
                    what: name,
                    why: format!(
                        "{count} elements lie beneath it; the chart draws at most {MAX_BENEATH}"
                    ),
                });
                continue;
            }
        };
        if area < MIN_AREA {
            fail(ChartProblem::Hidden {
                what: name,
                why: format!(
                    "{area:.2} px\u{b2} of it shows, uncovered by later markers and in a colour \
                     apart from the background and what lies beneath; at least {MIN_AREA} px\u{b2} must"
                ),
            });
        }
    }
}
