//! error-vs-bytes.svg: every marker tied to its numbers and placed where the axes say.
//!
//! The runner writes each marker as `<g class="marker" data-config data-distribution
//! data-tokens data-payload-bytes data-relative-l2 transform="translate(X,Y)">` (for a model's
//! inputs `data-condition="l5"` in place of `data-distribution`) around one shape,
//! inside `<g id="markers">`, which declares the log-log axis mapping (`data-x-range`,
//! `data-y-range`: the value range; `data-x-pixels`, `data-y-pixels`: where its ends land). The
//! audit requires:
//! - exactly one marker per configuration, condition (distribution, or a model's layer) and
//!   length with a positive mean error, in run order, whose data equal the audit's own mean over
//!   seeds (or texts and KV heads) and payload;
//! - each marker at the pixel the declared mapping gives its data (within one pixel, plotters'
//!   rounding), with the shape of its condition (a distribution's own: circle `clean`, triangle
//!   `early_focus`, diamond `recent_focus`; a layer's by its position in the protocol: circle,
//!   triangle, diamond, square, then again) and the paint of its study (filled for
//!   packed-KV settings, hollow for budget policies) in its configuration's legend colour;
//! - every tick label on both axes at the pixel the same mapping gives its value, at least two
//!   per axis, so the axes a reader sees are the mapping the markers use;
//! - a legend entry (swatch, then label) per configuration, right of the plot; the condition
//!   legend's heading (`distribution`, or `layer`) and each condition's name, and the y axis's
//!   description (mean over seeds, or over texts and heads), shown as text;
//! - no element outside what the chart uses (no script, image, link or foreign content) and no
//!   other marker-like shape inside the plot.

pub use crate::problem::ChartProblem;
use std::collections::BTreeMap;

use roxmltree::{Document, Node};

use crate::comparisons::{Recomputed, close};
use crate::plan::{ComparisonPlan, Config, InputPlan, Study, layer_condition};
use crate::protocol::{Distribution, Protocol};
use crate::report::{Checked, Problem, Report};

/// Elements the chart may contain.
pub(crate) const ALLOWED: [&str; 8] = [
    "svg", "rect", "line", "polyline", "polygon", "circle", "text", "g",
];

/// One axis's log mapping: values lo..hi land on pixels a..b.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Axis {
    lo: f64,
    hi: f64,
    a: f64,
    b: f64,
}

impl Axis {
    pub(crate) fn pixel(&self, v: f64) -> f64 {
        self.a + (self.b - self.a) * (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln())
    }

    pub(crate) fn parse(range: Option<&str>, pixels: Option<&str>) -> Option<Axis> {
        let pair = |s: Option<&str>| -> Option<(f64, f64)> {
            let mut it = s?.split(' ').map(|x| x.parse::<f64>().ok());
            let pair = (it.next()??, it.next()??);
            it.next().is_none().then_some(pair)
        };
        let (lo, hi) = pair(range)?;
        let (a, b) = pair(pixels)?;
        let sane = lo.is_finite()
            && hi.is_finite()
            && lo > 0.0
            && hi > lo
            && a.is_finite()
            && b.is_finite()
            && a != b;
        sane.then_some(Axis { lo, hi, a, b })
    }

    fn left_or_bottom(&self) -> f64 {
        self.a
    }
}

/// A marker the audit expects: (config label, condition, shape, tokens, payload, mean error,
/// budget).
struct ExpectedMarker {
    config: String,
    /// The distribution's name, or the layer's (`l5`).
    condition: String,
    /// Index into [`SHAPES`].
    shape: usize,
    tokens: usize,
    payload_bytes: usize,
    relative_l2: f64,
    budget: bool,
}

fn expected_markers(
    p: &Protocol,
    inputs: &[InputPlan],
    plan: &[ComparisonPlan],
    configs: &[Config],
    recomputed: &BTreeMap<String, Recomputed>,
) -> Vec<ExpectedMarker> {
    let mut out = Vec::new();
    for config in configs {
        for (shape, condition) in shaped_conditions(p) {
            for &n in &p.tokens {
                let mine: Vec<(&ComparisonPlan, &Recomputed)> = plan
                    .iter()
                    .filter(|e| e.config == *config)
                    .filter(|e| {
                        inputs[e.input].condition() == condition && inputs[e.input].tokens == n
                    })
                    .filter_map(|e| Some((e, recomputed.get(&e.id)?)))
                    .collect();
                let Some((first, r)) = mine.first() else {
                    continue;
                };
                let mean = mine.iter().map(|(_, r)| r.relative_l2).sum::<f64>() / mine.len() as f64;
                if mean > 0.0 {
                    out.push(ExpectedMarker {
                        config: config.label(),
                        condition: condition.clone(),
                        shape,
                        tokens: n,
                        payload_bytes: r.payload_bytes,
                        relative_l2: mean,
                        budget: first.study == Study::Budget,
                    });
                }
            }
        }
    }
    out
}

/// The marker shapes, centred on (0, 0): element name, geometry attribute and its value.
const SHAPES: [(&str, &str, &str); 4] = [
    ("circle", "r", "5"),
    ("polygon", "points", "0,-6 5.2,3 -5.2,3"),
    ("polygon", "points", "0,-6 6,0 0,6 -6,0"),
    ("polygon", "points", "-4.5,-4.5 4.5,-4.5 4.5,4.5 -4.5,4.5"),
];

/// The conditions markers are drawn for, in protocol order, each with its index into
/// [`SHAPES`]: a distribution keeps its own shape whatever its position; a model's layers take
/// the shapes in turn.
fn shaped_conditions(p: &Protocol) -> Vec<(usize, String)> {
    match &p.model {
        Some(m) => m
            .layers
            .iter()
            .enumerate()
            .map(|(i, &layer)| (i % SHAPES.len(), layer_condition(layer)))
            .collect(),
        None => p
            .distributions
            .iter()
            .map(|&d| {
                let shape = match d {
                    Distribution::Clean => 0,
                    Distribution::EarlyFocus => 1,
                    Distribution::RecentFocus => 2,
                };
                (shape, d.name().to_string())
            })
            .collect(),
    }
}

pub(crate) fn translate(node: Node) -> Option<(f64, f64)> {
    let inner = node
        .attribute("transform")?
        .strip_prefix("translate(")?
        .strip_suffix(')')?;
    let (x, y) = inner.split_once(',')?;
    Some((x.parse().ok()?, y.parse().ok()?))
}

pub(crate) fn element_children<'a, 'i>(node: Node<'a, 'i>) -> impl Iterator<Item = Node<'a, 'i>> {
    node.children().filter(|c| c.is_element())
}

/// Checks the chart against the audit's recomputed values.
pub fn check(
    svg: &str,
    p: &Protocol,
    inputs: &[InputPlan],
    plan: &[ComparisonPlan],
    configs: &[Config],
    recomputed: &BTreeMap<String, Recomputed>,
    report: &mut Report,
) {
    let fail = |report: &mut Report, problem: ChartProblem| report.fail(Problem::Chart(problem));
    let doc = match Document::parse(svg) {
        Ok(doc) => doc,
        Err(e) => {
            return fail(
                report,
                ChartProblem::Document {
                    reason: e.to_string(),
                },
            );
        }
    };
    let root = doc.root_element();
    if root.tag_name().name() != "svg"
        || root.tag_name().namespace() != Some("http://www.w3.org/2000/svg")
    {
        return fail(
            report,
            ChartProblem::Document {
                reason: "the root is not an svg element".into(),
            },
        );
    }
    for node in root.descendants().filter(|n| n.is_element()) {
        let name = node.tag_name().name();
        if !ALLOWED.contains(&name) {
            return fail(
                report,
                ChartProblem::Element {
                    what: format!("a {name} element"),
                },
            );
        }
        if let Some(a) = node.attributes().find(|a| {
            let n = a.name().to_ascii_lowercase();
            n.contains("href") || n.starts_with("on") || n == "style" || a.value().contains("url(")
        }) {
            return fail(
                report,
                ChartProblem::Element {
                    what: format!("a {} attribute", a.name()),
                },
            );
        }
    }
    if let Err(problem) = check_moves(root) {
        return fail(report, problem);
    }
    let groups: Vec<Node> = root
        .descendants()
        .filter(|n| n.has_tag_name("g") && n.attribute("id") == Some("markers"))
        .collect();
    let [markers] = groups.as_slice() else {
        return fail(
            report,
            ChartProblem::Mapping {
                what: format!("{} marker groups", groups.len()),
            },
        );
    };
    let x_axis = Axis::parse(
        markers.attribute("data-x-range"),
        markers.attribute("data-x-pixels"),
    );
    let y_axis = Axis::parse(
        markers.attribute("data-y-range"),
        markers.attribute("data-y-pixels"),
    );
    let (Some(x_axis), Some(y_axis)) = (x_axis, y_axis) else {
        return fail(
            report,
            ChartProblem::Mapping {
                what: "data-x/y-range or data-x/y-pixels".into(),
            },
        );
    };
    let plot_right = x_axis.a.max(x_axis.b);

    // Legend: label -> (colour, hollow), from each label's preceding swatch.
    let mut legend: BTreeMap<String, (String, bool)> = BTreeMap::new();
    for text in root.descendants().filter(|n| n.has_tag_name("text")) {
        let label = text.text().unwrap_or("").trim().to_string();
        let swatch = text
            .prev_sibling_element()
            .filter(|s| s.has_tag_name("rect"));
        let x: f64 = text
            .attribute("x")
            .and_then(|x| x.parse().ok())
            .unwrap_or(f64::NAN);
        if let Some(swatch) = swatch.filter(|_| x > plot_right) {
            let fill = swatch.attribute("fill").unwrap_or("none");
            let entry = if fill == "none" {
                (swatch.attribute("stroke").unwrap_or("").to_string(), true)
            } else {
                (fill.to_string(), false)
            };
            legend.entry(label).or_insert(entry);
        }
    }

    let expected = expected_markers(p, inputs, plan, configs, recomputed);
    let found: Vec<Node> = element_children(*markers).collect();
    if found.len() != expected.len() {
        fail(
            report,
            ChartProblem::Marker {
                index: found.len().min(expected.len()),
                found: format!("{} markers", found.len()),
                expected: format!("{} markers", expected.len()),
            },
        );
    }
    for config in configs {
        let label = config.label();
        if !legend.contains_key(&label) {
            fail(report, ChartProblem::Legend { config: label });
        }
    }
    // What a marker's mean is over, and what its shape stands for, must be the protocol's: a
    // model's means are over texts and KV heads and its shapes are layers.
    let texts: Vec<&str> = root
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim())
        .collect();
    let (description, heading) = if p.model.is_some() {
        (
            "relative L2 error, mean over texts and heads (log)",
            "layer",
        )
    } else {
        ("relative L2 error, mean over seeds (log)", "distribution")
    };
    let mut labels = vec![description.to_string(), heading.to_string()];
    labels.extend(shaped_conditions(p).into_iter().map(|(_, c)| c));
    for expected in labels {
        if !texts.contains(&expected.as_str()) {
            fail(report, ChartProblem::Label { expected });
        }
    }
    // A model's markers name their layer as a condition; generated ones their distribution.
    let (condition_attribute, other_attribute) = if p.model.is_some() {
        ("data-condition", "data-distribution")
    } else {
        ("data-distribution", "data-condition")
    };
    let mut placed = 0;
    for (index, (node, want)) in found.iter().zip(&expected).enumerate() {
        let data = |name: &str| node.attribute(name).unwrap_or("");
        let relative_l2: Option<f64> = data("data-relative-l2").parse().ok();
        let same = node.has_tag_name("g")
            && node.attribute("class") == Some("marker")
            && data("data-config") == want.config
            && data(condition_attribute) == want.condition
            && node.attribute(other_attribute).is_none()
            && data("data-tokens") == want.tokens.to_string()
            && data("data-payload-bytes") == want.payload_bytes.to_string()
            && relative_l2.is_some_and(|v| close(v, want.relative_l2));
        if !same {
            fail(
                report,
                ChartProblem::Marker {
                    index,
                    found: format!(
                        "{} {} N={} {} B error {}",
                        data("data-config"),
                        data(condition_attribute),
                        data("data-tokens"),
                        data("data-payload-bytes"),
                        data("data-relative-l2")
                    ),
                    expected: format!(
                        "{} {} N={} {} B error {:?}",
                        want.config,
                        want.condition,
                        want.tokens,
                        want.payload_bytes,
                        want.relative_l2
                    ),
                },
            );
            continue;
        }
        let style = |what: String| ChartProblem::Style {
            config: want.config.clone(),
            distribution: want.condition.clone(),
            tokens: want.tokens,
            what,
        };
        let Some((x, y)) = translate(*node) else {
            fail(report, style("no translate(X,Y) transform".into()));
            continue;
        };
        let (ex, ey) = (
            x_axis.pixel(want.payload_bytes as f64),
            y_axis.pixel(want.relative_l2),
        );
        if (x - ex).abs() > 1.0 || (y - ey).abs() > 1.0 {
            fail(
                report,
                ChartProblem::Position {
                    config: want.config.clone(),
                    distribution: want.condition.clone(),
                    tokens: want.tokens,
                    x,
                    y,
                    ex,
                    ey,
                },
            );
        }
        let children: Vec<Node> = element_children(*node).collect();
        let (element, attribute, geometry) = SHAPES[want.shape];
        let shape_ok = matches!(children.as_slice(), [c] if c.has_tag_name(element)
            && c.attribute(attribute) == Some(geometry)
            && c.attribute("transform").is_none()
            && c.attribute("cx").is_none()
            && c.attribute("cy").is_none());
        if !shape_ok {
            fail(
                report,
                style(format!(
                    "not a centred {element} with {attribute}=\"{geometry}\""
                )),
            );
            continue;
        }
        let child = children[0];
        let (colour, hollow) = if child.attribute("fill") == Some("none") {
            (child.attribute("stroke").unwrap_or(""), true)
        } else {
            (child.attribute("fill").unwrap_or(""), false)
        };
        match legend.get(&want.config) {
            Some((legend_colour, legend_hollow))
                if legend_colour == colour && *legend_hollow == hollow && hollow == want.budget => {
            }
            _ => fail(report, style(format!("colour {colour}, hollow {hollow}"))),
        }
        placed += 1;
    }
    check_ticks(root, x_axis, y_axis, report);
    check_strays(root, *markers, plot_right, report);
    report.count(Checked::ChartMarkers, placed);
}

/// Tick labels: "0.5%" on the y axis (a percentage of the error), "5,000" on the x axis (bytes).
fn check_ticks(root: Node, x_axis: Axis, y_axis: Axis, report: &mut Report) {
    let mut counts = [0usize; 2];
    for text in root.descendants().filter(|n| n.has_tag_name("text")) {
        let label = text.text().unwrap_or("").trim();
        let at = |name: &str| text.attribute(name).and_then(|v| v.parse::<f64>().ok());
        let (axis_name, axis, value, along, across, outside) = if let Some(v) = y_label(label) {
            (
                "y",
                y_axis,
                v,
                at("y"),
                at("x"),
                Box::new(move |c: f64| c < x_axis.left_or_bottom()) as Box<dyn Fn(f64) -> bool>,
            )
        } else if let Some(v) = x_label(label) {
            let bottom = y_axis.left_or_bottom();
            (
                "x",
                x_axis,
                v,
                at("x"),
                at("y"),
                Box::new(move |c: f64| c > bottom) as Box<dyn Fn(f64) -> bool>,
            )
        } else {
            continue;
        };
        counts[usize::from(axis_name == "x")] += 1;
        let tick = |what: String| {
            Problem::Chart(ChartProblem::Tick {
                axis: axis_name,
                label: label.to_string(),
                what,
            })
        };
        match (along, across) {
            (Some(p), Some(c)) => {
                let expected = axis.pixel(value);
                if (p - expected).abs() > 1.0 {
                    report.fail(tick(format!("at {p}, its value maps to {expected:.1}")));
                } else if !outside(c) {
                    report.fail(tick("inside the plot area".into()));
                }
            }
            _ => report.fail(tick("without a position".into())),
        }
    }
    for (axis, count) in [("y", counts[0]), ("x", counts[1])] {
        if count < 2 {
            report.fail(Problem::Chart(ChartProblem::Tick {
                axis,
                label: String::new(),
                what: format!("{count} tick labels; the mapping needs at least two to be read"),
            }));
        }
    }
}

/// Nothing may move or restyle what a reader reads: no group but the markers, no transform but
/// the markers' translations and the rotation of an axis title, tick labels without offsets, and
/// markers with only the attributes the chart writes.
fn check_moves(root: Node) -> Result<(), ChartProblem> {
    let element = |what: &str| ChartProblem::Element {
        what: what.to_string(),
    };
    for node in root.descendants().filter(|n| n.is_element()) {
        let in_markers = node
            .ancestors()
            .skip(1)
            .any(|a| a.attribute("id") == Some("markers"));
        let is_group = node.has_tag_name("g");
        let marker_group = is_group
            && (node.attribute("id") == Some("markers")
                || (in_markers && node.attribute("class") == Some("marker")));
        if is_group && !marker_group {
            return Err(element("a group outside the markers"));
        }
        let label = node.text().unwrap_or("").trim();
        let tick =
            node.has_tag_name("text") && (y_label(label).is_some() || x_label(label).is_some());
        if let Some(t) = node.attribute("transform") {
            let rotated_title = node.has_tag_name("text") && t.starts_with("rotate(") && !tick;
            if !(marker_group || rotated_title) {
                return Err(element(&format!("a transform {t:?}")));
            }
        }
        if tick {
            let plain = node.attributes().all(|a| {
                matches!(
                    a.name(),
                    "x" | "y" | "text-anchor" | "font-family" | "font-size" | "opacity" | "fill"
                ) || (a.name() == "dy" && matches!(a.value(), "0.5ex" | "0.76em" | "-0.5ex"))
            });
            if !plain {
                return Err(element("a tick label with an offset or a transform"));
            }
        }
        if in_markers {
            let known = node.attributes().all(|a| {
                matches!(
                    a.name(),
                    "class"
                        | "transform"
                        | "data-config"
                        | "data-distribution"
                        | "data-condition"
                        | "data-tokens"
                        | "data-payload-bytes"
                        | "data-relative-l2"
                        | "r"
                        | "points"
                        | "fill"
                        | "stroke"
                        | "stroke-width"
                )
            });
            if !known {
                return Err(element("a marker attribute the chart does not write"));
            }
        }
    }
    Ok(())
}

/// "0.5%" -> 0.005.
fn y_label(label: &str) -> Option<f64> {
    let number = label.strip_suffix('%')?;
    let plain = !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    plain
        .then(|| number.parse::<f64>().ok().map(|v| v / 100.0))
        .flatten()
}

/// "5,000" -> 5000.
fn x_label(label: &str) -> Option<f64> {
    let groups: Vec<&str> = label.split(',').collect();
    let plain = !groups[0].is_empty()
        && groups[0].len() <= 3
        && groups
            .iter()
            .all(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()))
        && groups[1..].iter().all(|g| g.len() == 3);
    plain.then(|| groups.concat().parse::<f64>().ok()).flatten()
}

/// Circles and polygons outside the marker group must sit right of the plot (the legend).
fn check_strays(root: Node, markers: Node, plot_right: f64, report: &mut Report) {
    for node in root
        .descendants()
        .filter(|n| n.has_tag_name("circle") || n.has_tag_name("polygon"))
    {
        if node.ancestors().any(|a| a == markers) {
            continue;
        }
        let xs: Vec<f64> = if node.has_tag_name("circle") {
            node.attribute("cx")
                .and_then(|v| v.parse().ok())
                .into_iter()
                .collect()
        } else {
            node.attribute("points")
                .unwrap_or("")
                .split_whitespace()
                .filter_map(|p| p.split_once(',')?.0.parse().ok())
                .collect()
        };
        let y = node
            .attribute("cy")
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN);
        if xs.is_empty() || xs.iter().any(|&x| x <= plot_right) {
            report.fail(Problem::Chart(ChartProblem::Stray {
                element: node.tag_name().name().to_string(),
                x: xs.first().copied().unwrap_or(f64::NAN),
                y,
            }));
        }
    }
}
