//! The chart's form: the closed set of elements, attributes and values the runner writes, so
//! that what the audit reads is what a viewer is shown. Nothing is hidden from the reader of the
//! tree (no comment or processing instruction, which a renderer skips but which split a text
//! into parts the audit would not read together; no element or attribute of another namespace),
//! nothing moves what the audit places (no transform, viewBox or per-glyph position but the
//! computed ones), and every value reads one way (paints are `none` or `#RRGGBB`, numbers are
//! single numbers). Style stays free within the form: colours, widths, sizes, anchors and fonts
//! of the generic families.

use roxmltree::{Document, Node, NodeType};

use crate::common::problem::ChartProblem;
use crate::common::svg::{baseline_shift, number, polygon_points, x_label};

use super::ExpectedChart;
use super::sight::paint_value;

const SVG: &str = "http://www.w3.org/2000/svg";

/// Elements the chart may contain.
const ALLOWED: [&str; 7] = ["svg", "rect", "polyline", "polygon", "circle", "text", "g"];

/// Attributes of each element that draws (circles and polygons are read as markers' shapes).
fn attributes_of(element: &str) -> &'static [&'static str] {
    match element {
        "svg" => &["width", "height", "viewBox"],
        "rect" => &["x", "y", "width", "height", "opacity", "fill", "stroke"],
        "polyline" => &["points", "fill", "stroke", "stroke-width", "opacity"],
        "text" => &[
            "x",
            "y",
            "dy",
            "text-anchor",
            "font-family",
            "font-size",
            "font-weight",
            "opacity",
            "fill",
            "transform",
        ],
        _ => &[],
    }
}

/// Font families a viewer's renderer maps to a face that draws letters and digits as such (a
/// named face could be a symbol font).
const FAMILIES: [&str; 3] = ["sans-serif", "serif", "monospace"];

/// Whether `value` is one finite number within `range`.
fn number_in(value: &str, range: std::ops::RangeInclusive<f64>) -> bool {
    value
        .parse::<f64>()
        .is_ok_and(|v| v.is_finite() && range.contains(&v))
}

/// `rotate(A, X, Y)` (commas or spaces) about the text's own anchor: it turns the text in place.
fn rotation_in_place(text: Node, transform: &str) -> bool {
    let Some(inner) = transform
        .strip_prefix("rotate(")
        .and_then(|t| t.strip_suffix(')'))
    else {
        return false;
    };
    let values: Vec<Option<f64>> = inner
        .split(|c: char| c == ',' || c.is_ascii_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<f64>().ok().filter(|v| v.is_finite()))
        .collect();
    matches!(values[..], [Some(_), Some(x), Some(y)]
        if Some(x) == number(text, "x") && Some(y) == number(text, "y"))
}

/// The document's size: `width` and `height` plain positive numbers, and a `viewBox` of exactly
/// `0 0 width height`, so the document shows every pixel the panels' mappings name, unscaled and
/// uncropped.
pub(super) fn document_size(root: Node) -> Result<(f64, f64), ChartProblem> {
    let element = |what: String| ChartProblem::Element { what };
    let size = |name| {
        number(root, name)
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or_else(|| element(format!("an svg {name} other than a number of pixels")))
    };
    let (width, height) = (size("width")?, size("height")?);
    let view: Vec<Option<f64>> = root
        .attribute("viewBox")
        .unwrap_or("")
        .split(|c: char| c == ',' || c.is_ascii_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<f64>().ok())
        .collect();
    if view != [Some(0.0), Some(0.0), Some(width), Some(height)] {
        return Err(element(format!(
            "a viewBox {:?} other than \"0 0 {width} {height}\", which would scale or crop the panels",
            root.attribute("viewBox").unwrap_or("")
        )));
    }
    Ok((width, height))
}

/// Checks the form: the first breach is the error. Returns the circles and polygons outside
/// markers and swatches (strays), which are named and the rest still checked.
pub(super) fn check_form(
    svg: &str,
    doc: &Document,
    want: &ExpectedChart,
) -> Result<Vec<ChartProblem>, ChartProblem> {
    let element = |what: String| ChartProblem::Element { what };
    if !svg.starts_with("<svg") {
        return Err(element(
            "something before its svg element (a declaration, comment or doctype)".into(),
        ));
    }
    for node in doc.descendants() {
        match node.node_type() {
            NodeType::Comment => return Err(element("a comment".into())),
            NodeType::PI => return Err(element("a processing instruction".into())),
            _ => {}
        }
    }
    let root = doc.root_element();
    let mut strays = Vec::new();
    for node in root.descendants().filter(|n| n.is_element()) {
        let name = node.tag_name().name();
        if !ALLOWED.contains(&name) || node.tag_name().namespace() != Some(SVG) {
            return Err(element(format!("a {name} element")));
        }
        if let Some(a) = node.attributes().find(|a| {
            let n = a.name().to_ascii_lowercase();
            a.namespace().is_some()
                || n.contains("href")
                || n.starts_with("on")
                || n == "style"
                || a.value().contains("url(")
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
        let frontier =
            group && class_of(Some(node)) == Some("frontier") && class_of(parent) == Some("panel");
        if group && !(panel || swatch || marker || float32 || frontier) {
            return Err(element(
                "a group other than a panel, marker, swatch, float32 line or frontier".into(),
            ));
        }
        // The frontier's group holds its segments only, and carries nothing else.
        let in_frontier =
            parent.is_some_and(|p| p.has_tag_name("g")) && class_of(parent) == Some("frontier");
        if (frontier && node.attributes().any(|a| a.name() != "class"))
            || (in_frontier && name != "polyline")
        {
            return Err(element("a frontier other than segments".into()));
        }
        // The float32 line's group holds its dashes only, and carries nothing else.
        let in_float32 =
            parent.is_some_and(|p| p.has_tag_name("g")) && class_of(parent) == Some("float32");
        if (float32 && node.attributes().any(|a| a.name() != "class"))
            || (in_float32 && name != "polyline")
        {
            return Err(element("a float32 line other than dashes".into()));
        }
        if float32 {
            check_dashes(node)?;
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
        if matches!(name, "circle" | "polygon") {
            if !matches!(class_of(parent), Some("marker" | "swatch")) {
                let x = number(node, "cx").unwrap_or(f64::NAN);
                let y = number(node, "cy").unwrap_or(f64::NAN);
                strays.push(ChartProblem::Stray {
                    element: name.to_string(),
                    x,
                    y,
                });
            }
            // Its attributes and paint are a marker's (or swatch's) shape's, checked with it.
            continue;
        }
        let label = node.text().unwrap_or("").trim();
        let tick = node.has_tag_name("text")
            && ((want.y_label)(label).is_some() || x_label(label).is_some());
        if let Some(t) = node.attribute("transform") {
            let rotated_title =
                node.has_tag_name("text") && at_root && !tick && rotation_in_place(node, t);
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
        // The marker's own attributes are checked against its expected data.
        if !group {
            check_drawing(node, root, at_root)?;
        }
    }
    let loose = doc.descendants().any(|n| {
        n.is_text()
            && !n.parent().is_some_and(|p| p.has_tag_name("text"))
            && !n.text().unwrap_or("").trim().is_empty()
    });
    if loose {
        return Err(element("text outside a text element".into()));
    }
    Ok(strays)
}

/// A drawing element's attributes and values, and where it may be.
fn check_drawing(node: Node, root: Node, at_root: bool) -> Result<(), ChartProblem> {
    let element = |what: String| ChartProblem::Element { what };
    let name = node.tag_name().name();
    for a in node.attributes() {
        let (attribute, value) = (a.name(), a.value());
        if !attributes_of(name).contains(&attribute) {
            return Err(element(format!("a {attribute} attribute on a {name}")));
        }
        let fine = match attribute {
            "fill" | "stroke" => paint_value(value).is_some(),
            "opacity" => number_in(value, 0.0..=1.0),
            "stroke-width" => number_in(value, 0.0..=f64::MAX),
            "width" | "height" | "font-size" => number_in(value, f64::MIN_POSITIVE..=f64::MAX),
            // One position: a list would place each glyph on its own.
            "x" | "y" => number_in(value, f64::MIN..=f64::MAX),
            "dy" => baseline_shift(value),
            "text-anchor" => matches!(value, "start" | "middle" | "end"),
            "font-weight" => matches!(value, "normal" | "bold"),
            "font-family" => FAMILIES.contains(&value),
            _ => true,
        };
        if !fine {
            return Err(element(format!("a {name} with {attribute}={value:?}")));
        }
    }
    let background = at_root && root.first_element_child() == Some(node);
    let in_panel = node
        .parent_element()
        .is_some_and(|p| p.has_tag_name("g") && p.attribute("class") == Some("panel"));
    match name {
        "text" => {
            // One text node and nothing else: what the audit reads is the whole of what is drawn.
            let mut children = node.children();
            let one = match (children.next(), children.next()) {
                (None, _) => true,
                (Some(only), None) => only.is_text(),
                _ => false,
            };
            if !one {
                return Err(element("a text of several parts".into()));
            }
            if number(node, "x").is_none() || number(node, "y").is_none() {
                return Err(element("a text without a position".into()));
            }
        }
        "polyline" => {
            let parent = node.parent_element();
            let in_panel = parent.is_some_and(|p| {
                p.has_tag_name("g")
                    && matches!(p.attribute("class"), Some("panel" | "float32" | "frontier"))
            });
            if !in_panel {
                return Err(element("a polyline outside the panels".into()));
            }
            // A float32 dash or a frontier step may be short: each is held to its line.
            let float32 = parent
                .is_some_and(|p| matches!(p.attribute("class"), Some("float32" | "frontier")));
            let Some([from, to]) = segment(node) else {
                return Err(element(
                    "a polyline other than one horizontal or vertical segment".into(),
                ));
            };
            // A line reads as a line, not as a mark: twice as long as it is wide (a float32
            // line's dashes are held to that as one pen, in check_dashes).
            let width = number(node, "stroke-width").unwrap_or(1.0);
            let length = (to.0 - from.0).hypot(to.1 - from.1);
            if !float32 && length < 2.0 * width {
                return Err(element(format!(
                    "a polyline {length} px long and {width} px wide, a mark rather than a line"
                )));
            }
        }
        "rect" if background => {
            // The background: the whole document, painted, so that every marker's colour is
            // seen against it.
            let whole = [("x", 0.0), ("y", 0.0)]
                .iter()
                .all(|(n, v)| number(node, n) == Some(*v))
                && number(node, "width") == number(root, "width")
                && number(node, "height") == number(root, "height")
                && node
                    .attribute("fill")
                    .is_none_or(|f| paint_value(f).flatten().is_some());
            if !whole {
                return Err(element(
                    "a background other than a painted rect over the whole document".into(),
                ));
            }
        }
        // Besides the background, a rect is a panel's frame (held to its plot area there).
        "rect" if !in_panel => {
            return Err(element(
                "a rect other than the background or a frame".into(),
            ));
        }
        "svg" if node != root => return Err(element("an svg inside the chart".into())),
        _ => {}
    }
    Ok(())
}

/// A polyline's two points, if it is one horizontal or vertical segment.
pub(super) fn segment(node: Node) -> Option<[(f64, f64); 2]> {
    let points = node.attribute("points").and_then(polygon_points)?;
    let [from, to] = points[..] else {
        return None;
    };
    (from.0 == to.0 || from.1 == to.1).then_some([from, to])
}

/// A float32 line's dashes: drawn with one pen (stroke, width, opacity), narrower than half its
/// longest dash, so that no dash stands out as a mark.
fn check_dashes(group: Node) -> Result<(), ChartProblem> {
    let dashes: Vec<Node> = group.children().filter(|n| n.is_element()).collect();
    let pen = |n: &Node| {
        ["stroke", "stroke-width", "opacity"].map(|a| n.attribute(a).map(str::to_string))
    };
    let one_pen = dashes.windows(2).all(|w| pen(&w[0]) == pen(&w[1]));
    let longest = dashes
        .iter()
        .filter_map(|d| segment(*d))
        .map(|[a, b]| (b.0 - a.0).hypot(b.1 - a.1))
        .fold(0.0, f64::max);
    let width = dashes
        .first()
        .and_then(|d| number(*d, "stroke-width"))
        .unwrap_or(1.0);
    if !one_pen || longest < 2.0 * width {
        return Err(ChartProblem::Element {
            what: "a float32 line whose dashes are not one thin pen".into(),
        });
    }
    Ok(())
}
