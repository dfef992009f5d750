//! What a viewer sees of a chart: each drawn element's paint and the area it covers, so that the
//! audit can ask what the chart shows rather than what it declares. A marker must show on screen
//! (nothing but later markers drawn over it, and enough of it left uncovered in a colour that
//! stands out from what lies beneath), a legend entry must be readable, and two series must look
//! different. The colours, shapes and sizes themselves stay the chart's to choose: every rule
//! here compares one drawn thing with another, never with a palette.
//!
//! Areas are sampled on a grid of quarter pixels. Text is not rendered (the audit has no fonts):
//! a text covers a box as wide as its characters' advances in the widest faces renderers commonly
//! use for its generic family ([`advance`]) and a font's full height.

use roxmltree::{Node, NodeId};

use crate::common::svg::{number, polygon_points, translate};

/// A colour, as `#RRGGBB` writes it.
pub(crate) type Rgb = [u8; 3];

/// Two colours a viewer tells apart: some channel differs by at least this much of 255 (an
/// eighth of the range). Closer colours read as one on most screens.
pub(crate) const DISTINCT_CHANNEL: f64 = 32.0;

/// Area, in square pixels, that a marker or swatch must show (and by which two series' paints
/// must differ) to be seen: one pixel.
pub(crate) const MIN_AREA: f64 = 1.0;

/// Advance widths of printable ASCII (from the space), in thousandths of an em, regular then
/// bold: the larger of DejaVu Sans's and DejaVu Serif's, the widest of the faces renderers
/// commonly draw `sans-serif` and `serif` with (Arial, Helvetica and Times are narrower).
const ADVANCES: [[u16; 95]; 2] = [REGULAR, BOLD];
const REGULAR: [u16; 95] = [
    318, 402, 460, 838, 637, 951, 891, 275, 391, 391, 500, 838, 318, 361, 318, 337, 637, 637, 637,
    637, 637, 637, 637, 637, 637, 637, 337, 337, 838, 838, 838, 537, 1000, 723, 735, 766, 802, 730,
    694, 799, 873, 396, 401, 748, 665, 1024, 875, 820, 673, 820, 753, 686, 667, 843, 723, 1028,
    712, 661, 695, 391, 337, 391, 838, 500, 500, 613, 641, 561, 641, 616, 371, 641, 645, 320, 311,
    606, 320, 975, 645, 612, 641, 641, 479, 521, 402, 645, 592, 856, 592, 592, 527, 637, 337, 637,
    838,
];
const BOLD: [u16; 95] = [
    349, 457, 521, 838, 696, 1002, 903, 307, 474, 474, 523, 838, 380, 416, 380, 366, 696, 696, 696,
    696, 696, 696, 696, 696, 696, 696, 400, 400, 838, 838, 838, 586, 1000, 776, 846, 796, 868, 763,
    710, 855, 945, 468, 474, 870, 704, 1107, 915, 872, 752, 872, 832, 723, 745, 873, 776, 1124,
    776, 725, 730, 474, 366, 474, 838, 500, 500, 675, 716, 609, 716, 679, 436, 716, 728, 380, 362,
    693, 380, 1059, 728, 688, 716, 716, 527, 596, 479, 728, 652, 924, 646, 652, 583, 712, 366, 712,
    838,
];

/// A character's advance, in em: from [`ADVANCES`], 0.61 em for any character of a monospace
/// face (DejaVu Sans Mono's 0.602 and Courier's 0.6 are the widest common ones), and a full em
/// for any other character (wider than every printable ASCII glyph but `W` and `M` in bold).
pub(crate) fn advance(c: char, monospace: bool, bold: bool) -> f64 {
    if monospace {
        return 0.61;
    }
    match u32::from(c).checked_sub(32) {
        Some(i) if i < 95 => f64::from(ADVANCES[usize::from(bold)][i as usize]) / 1000.0,
        _ => 1.0,
    }
}

/// Sample spacing, in pixels.
const STEP: f64 = 0.25;

/// A paint attribute's value: `none`, or a colour written `#RRGGBB` (either case). Anything else
/// (names, `rgb()`, `transparent`, `currentColor`) is not the chart's form.
pub(crate) fn paint_value(value: &str) -> Option<Option<Rgb>> {
    if value == "none" {
        return Some(None);
    }
    let hex = value.strip_prefix('#')?;
    if hex.len() != 6 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let channel = |i: usize| u8::from_str_radix(&hex[i..i + 2], 16).ok();
    Some(Some([channel(0)?, channel(2)?, channel(4)?]))
}

/// Whether a viewer tells two colours apart.
fn distinct(a: [f64; 3], b: [f64; 3]) -> bool {
    a.iter()
        .zip(&b)
        .any(|(x, y)| (x - y).abs() >= DISTINCT_CHANNEL)
}

fn float(c: Rgb) -> [f64; 3] {
    c.map(f64::from)
}

/// An axis-aligned box.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Bounds {
    pub x0: f64,
    pub y0: f64,
    pub x1: f64,
    pub y1: f64,
}

impl Bounds {
    fn around(x: f64, y: f64, r: f64) -> Bounds {
        Bounds {
            x0: x - r,
            y0: y - r,
            x1: x + r,
            y1: y + r,
        }
    }

    /// Whether the two share some area (touching edges do not).
    pub(crate) fn overlaps(&self, o: &Bounds) -> bool {
        self.x0 < o.x1 && o.x0 < self.x1 && self.y0 < o.y1 && o.y0 < self.y1
    }

    fn contains(&self, x: f64, y: f64) -> bool {
        (self.x0..=self.x1).contains(&x) && (self.y0..=self.y1).contains(&y)
    }

    /// The sample points inside.
    fn samples(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        let count = |a: f64, b: f64| ((b - a) / STEP).ceil().max(0.0) as usize;
        let (nx, ny) = (count(self.x0, self.x1), count(self.y0, self.y1));
        (0..nx).flat_map(move |i| {
            (0..ny).map(move |j| {
                (
                    self.x0 + (i as f64 + 0.5) * STEP,
                    self.y0 + (j as f64 + 0.5) * STEP,
                )
            })
        })
    }
}

/// A marker's or swatch's shape, centred on its group's origin.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Geometry {
    Circle(f64),
    Polygon(Vec<(f64, f64)>),
}

/// How a shape is drawn: its geometry, its fill and its stroke (colour and width) as drawn, so
/// that two paints are equal exactly when they draw the same (an absent fill is black, an absent
/// stroke none, a stroke of width 0 none).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Paint {
    pub geometry: Geometry,
    pub fill: Option<Rgb>,
    pub stroke: Option<(Rgb, f64)>,
}

fn segment_distance(p: (f64, f64), a: (f64, f64), b: (f64, f64)) -> f64 {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let length = dx * dx + dy * dy;
    let t = if length == 0.0 {
        0.0
    } else {
        (((p.0 - a.0) * dx + (p.1 - a.1) * dy) / length).clamp(0.0, 1.0)
    };
    (p.0 - a.0 - t * dx).hypot(p.1 - a.1 - t * dy)
}

impl Paint {
    /// How far it reaches from its centre, stroke included.
    pub(crate) fn reach(&self) -> f64 {
        let radius = match &self.geometry {
            Geometry::Circle(r) => *r,
            Geometry::Polygon(points) => {
                points.iter().map(|(x, y)| x.hypot(*y)).fold(0.0, f64::max)
            }
        };
        radius + self.stroke.map_or(0.0, |(_, w)| w / 2.0)
    }

    fn edges(points: &[(f64, f64)]) -> impl Iterator<Item = ((f64, f64), (f64, f64))> + '_ {
        points
            .iter()
            .zip(points.iter().cycle().skip(1))
            .map(|(a, b)| (*a, *b))
    }

    /// Inside the shape, by SVG's default non-zero rule.
    fn inside(&self, x: f64, y: f64) -> bool {
        match &self.geometry {
            Geometry::Circle(r) => x.hypot(y) <= *r,
            Geometry::Polygon(points) => {
                let mut winding = 0;
                for (a, b) in Self::edges(points) {
                    let cross = (b.0 - a.0) * (y - a.1) - (x - a.0) * (b.1 - a.1);
                    if a.1 <= y && b.1 > y && cross > 0.0 {
                        winding += 1;
                    } else if a.1 > y && b.1 <= y && cross < 0.0 {
                        winding -= 1;
                    }
                }
                winding != 0
            }
        }
    }

    fn edge_distance(&self, x: f64, y: f64) -> f64 {
        match &self.geometry {
            Geometry::Circle(r) => (x.hypot(y) - r).abs(),
            Geometry::Polygon(points) => Self::edges(points)
                .map(|(a, b)| segment_distance((x, y), a, b))
                .fold(f64::INFINITY, f64::min),
        }
    }

    /// The colour drawn at (x, y) from its centre, if any: the stroke over the fill.
    pub(crate) fn at(&self, x: f64, y: f64) -> Option<Rgb> {
        if let Some((colour, width)) = self.stroke
            && self.edge_distance(x, y) <= width / 2.0
        {
            return Some(colour);
        }
        self.fill.filter(|_| self.inside(x, y))
    }

    /// Reads a circle's or polygon's paint; the form's rules (which attributes, which values)
    /// are checked by the caller, so what does not read is an error here.
    pub(crate) fn read(shape: Node) -> Result<Paint, String> {
        let element = shape.tag_name().name();
        let geometry = match element {
            "circle" => match number(shape, "r") {
                Some(r) if r.is_finite() && r > 0.0 => Geometry::Circle(r),
                _ => return Err("a circle without a positive r".into()),
            },
            "polygon" => match shape.attribute("points").and_then(polygon_points) {
                Some(points) if points.len() >= 3 => Geometry::Polygon(points),
                _ => return Err("a polygon without three or more points".into()),
            },
            other => return Err(format!("a {other}, not a circle or polygon")),
        };
        let paint = |name: &str, default: Option<Rgb>| match shape.attribute(name) {
            None => Ok(default),
            Some(v) => paint_value(v).ok_or_else(|| format!("a {name} {v:?}, not none or #RRGGBB")),
        };
        let fill = paint("fill", Some([0, 0, 0]))?;
        let width = match shape.attribute("stroke-width") {
            None => 1.0,
            Some(w) => match w.parse::<f64>() {
                Ok(w) if w.is_finite() && w >= 0.0 => w,
                _ => return Err(format!("stroke-width {w:?}")),
            },
        };
        let stroke = paint("stroke", None)?
            .filter(|_| width > 0.0)
            .map(|c| (c, width));
        if fill.is_none() && stroke.is_none() {
            return Err(format!("an unpainted {element}"));
        }
        Ok(Paint {
            geometry,
            fill,
            stroke,
        })
    }
}

/// Whether a viewer tells two series' paints apart, each drawn alone on `background`: they must
/// differ, in colours a viewer tells apart, over at least [`MIN_AREA`]. A filled and a hollow
/// shape of one colour differ (inside), as do two shapes of one colour (where one reaches and
/// the other does not), as do two colours.
pub(crate) fn paints_differ(a: &Paint, b: &Paint, background: Rgb) -> bool {
    if a == b {
        return false;
    }
    let area = Bounds::around(0.0, 0.0, a.reach().max(b.reach()));
    let back = float(background);
    let seen = |p: &Paint, x, y| p.at(x, y).map_or(back, float);
    // Enough is enough: the count stops at the area that decides.
    let needed = (MIN_AREA / (STEP * STEP)).ceil() as usize;
    area.samples()
        .filter(|&(x, y)| distinct(seen(a, x, y), seen(b, x, y)))
        .take(needed)
        .count()
        == needed
}

/// What an element draws.
#[derive(Debug, Clone)]
pub(crate) enum Look {
    /// A rect: its area, fill and outline.
    Rect {
        area: Bounds,
        fill: Option<Rgb>,
        stroke: Option<(Rgb, f64)>,
    },
    /// A two-point polyline (butt caps).
    Segment {
        from: (f64, f64),
        to: (f64, f64),
        stroke: Option<(Rgb, f64)>,
    },
    /// A text, as its box in its fill.
    Text { fill: Option<Rgb> },
    /// A marker's or swatch's shape at its group's position.
    Shape { centre: (f64, f64), paint: Paint },
}

/// One drawn element, in paint order.
#[derive(Debug, Clone)]
pub(crate) struct Drawn {
    pub look: Look,
    /// Everything it may paint lies inside.
    pub bounds: Bounds,
    pub opacity: f64,
    /// The element (for a shape, its marker's or swatch's group), and how problems name it.
    pub node: NodeId,
    pub name: String,
}

impl Drawn {
    /// The colour it paints at (x, y), if any.
    fn at(&self, x: f64, y: f64) -> Option<Rgb> {
        if !self.bounds.contains(x, y) {
            return None;
        }
        match &self.look {
            Look::Rect { area, fill, stroke } => {
                if let Some((colour, width)) = stroke {
                    let h = width / 2.0;
                    let outer = Bounds {
                        x0: area.x0 - h,
                        y0: area.y0 - h,
                        x1: area.x1 + h,
                        y1: area.y1 + h,
                    };
                    let inner = Bounds {
                        x0: area.x0 + h,
                        y0: area.y0 + h,
                        x1: area.x1 - h,
                        y1: area.y1 - h,
                    };
                    let in_inner = inner.x0 < inner.x1 && inner.y0 < inner.y1 && {
                        x > inner.x0 && x < inner.x1 && y > inner.y0 && y < inner.y1
                    };
                    if outer.contains(x, y) && !in_inner {
                        return Some(*colour);
                    }
                }
                fill.filter(|_| area.contains(x, y))
            }
            Look::Segment { from, to, stroke } => {
                let (colour, width) = (*stroke)?;
                let (dx, dy) = (to.0 - from.0, to.1 - from.1);
                let length = dx.hypot(dy);
                if length == 0.0 {
                    return None;
                }
                let along = ((x - from.0) * dx + (y - from.1) * dy) / length;
                let across = ((x - from.0) * dy - (y - from.1) * dx).abs() / length;
                ((0.0..=length).contains(&along) && across <= width / 2.0).then_some(colour)
            }
            Look::Text { fill } => *fill,
            Look::Shape { centre, paint } => paint.at(x - centre.0, y - centre.1),
        }
    }
}

/// What lies at (x, y) once `below` is drawn, in order, over white (what a viewer's page shows
/// where the chart paints nothing; the chart's background covers it).
fn composite(below: &[&Drawn], x: f64, y: f64) -> [f64; 3] {
    let mut colour = [255.0; 3];
    for d in below {
        if let Some(c) = d.at(x, y) {
            let c = float(c);
            for (k, channel) in colour.iter_mut().enumerate() {
                *channel = d.opacity * c[k] + (1.0 - d.opacity) * *channel;
            }
        }
    }
    colour
}

/// Most elements that may lie beneath a marker: the runner draws a frame, a few grid lines,
/// float32 dashes and neighbouring markers there. More would only make the audit slow.
pub(crate) const MAX_BENEATH: usize = 1000;

/// The area of `drawn[k]` a viewer sees, counted up to [`MIN_AREA`] (which decides): where it
/// paints, nothing in `covers` paints over it, and its colour stands out from what lies beneath
/// (the elements before it) and from the background (a marker in the background's colour reads
/// as a gap in a grid line, not as a mark). `Err` with the count of elements beneath it if there
/// are more than [`MAX_BENEATH`].
pub(crate) fn visible_area(
    drawn: &[Drawn],
    k: usize,
    covers: &[&Drawn],
    background: Rgb,
) -> Result<f64, usize> {
    let me = &drawn[k];
    let below: Vec<&Drawn> = drawn[..k]
        .iter()
        .filter(|d| d.bounds.overlaps(&me.bounds))
        .collect();
    if below.len() > MAX_BENEATH {
        return Err(below.len());
    }
    let needed = (MIN_AREA / (STEP * STEP)).ceil() as usize;
    let seen = me
        .bounds
        .samples()
        .filter(|&(x, y)| {
            let Some(colour) = me.at(x, y) else {
                return false;
            };
            !covers.iter().any(|c| c.at(x, y).is_some())
                && distinct(float(colour), float(background))
                && distinct(float(colour), composite(&below, x, y))
        })
        .take(needed)
        .count();
    Ok(seen as f64 * STEP * STEP)
}

/// Where a reader sees a text's line: the middle of its lower-case letters, a quarter em above
/// its baseline (DejaVu's x-height is 0.55 em), after its `dy`.
pub(crate) fn text_line(text: Node) -> Option<(f64, f64)> {
    let (x, y) = (number(text, "x")?, number(text, "y")?);
    let size = font_size(text)?;
    Some((
        x,
        y + baseline_offset(text.attribute("dy"), size) - 0.27 * size,
    ))
}

/// A text's font size in pixels (SVG's default is 16).
fn font_size(text: Node) -> Option<f64> {
    match text.attribute("font-size") {
        None => Some(16.0),
        Some(s) => s.parse::<f64>().ok().filter(|s| s.is_finite() && *s > 0.0),
    }
}

/// How far a text's `dy` moves its baseline, in pixels (an em is its font size, an ex half).
fn baseline_offset(dy: Option<&str>, size: f64) -> f64 {
    let Some(dy) = dy else {
        return 0.0;
    };
    if let Some(v) = dy.strip_suffix("em").and_then(|v| v.parse::<f64>().ok()) {
        v * size
    } else if let Some(v) = dy.strip_suffix("ex").and_then(|v| v.parse::<f64>().ok()) {
        v * size / 2.0
    } else {
        dy.parse::<f64>().unwrap_or(0.0)
    }
}

/// The box a text may paint: its characters' advances ([`advance`]) from its anchor, a full em
/// above its baseline and 0.3 em below (DejaVu's ascent is 0.93 em, its descent 0.24); rotated
/// about its anchor, the square around every way that box can turn.
pub(crate) fn text_bounds(text: Node) -> Option<Bounds> {
    let (x, y) = (number(text, "x")?, number(text, "y")?);
    let size = font_size(text)?;
    let monospace = text.attribute("font-family") == Some("monospace");
    let bold = text.attribute("font-weight") == Some("bold");
    let width = size
        * text
            .text()
            .unwrap_or("")
            .trim()
            .chars()
            .map(|c| advance(c, monospace, bold))
            .sum::<f64>();
    let baseline = y + baseline_offset(text.attribute("dy"), size);
    let (left, right) = match text.attribute("text-anchor") {
        Some("middle") => (x - width / 2.0, x + width / 2.0),
        Some("end") => (x - width, x),
        _ => (x, x + width),
    };
    let upright = Bounds {
        x0: left,
        y0: baseline - size,
        x1: right,
        y1: baseline + 0.3 * size,
    };
    if text.attribute("transform").is_none() {
        return Some(upright);
    }
    let r = [upright.x0 - x, upright.x1 - x]
        .iter()
        .flat_map(|dx| [upright.y0 - y, upright.y1 - y].map(|dy| dx.hypot(dy)))
        .fold(0.0, f64::max);
    Some(Bounds::around(x, y, r))
}

/// Every element the chart draws, in paint order, as a viewer's renderer would draw it. The
/// form has been checked (the caller stops on a breach), so attributes read; a shape whose paint
/// does not read (a problem already named) draws nothing here.
pub(crate) fn drawn(root: Node) -> Vec<Drawn> {
    let mut out = Vec::new();
    let opacity = |n: Node| number(n, "opacity").unwrap_or(1.0).clamp(0.0, 1.0);
    let paint = |n: Node, name: &str, default: Option<Rgb>| {
        n.attribute(name)
            .map_or(default, |v| paint_value(v).flatten())
    };
    let stroke = |n: Node| {
        let width = number(n, "stroke-width").unwrap_or(1.0);
        paint(n, "stroke", None)
            .filter(|_| width > 0.0)
            .map(|c| (c, width))
    };
    for node in root.descendants().filter(|n| n.is_element()) {
        let element = match node.tag_name().name() {
            "rect" => "rect",
            "polyline" => "polyline",
            "text" => "text",
            "circle" => "circle",
            "polygon" => "polygon",
            _ => continue,
        };
        let (look, bounds, owner) = match element {
            "rect" => {
                let value = |name| number(node, name).unwrap_or(0.0);
                let (x, y) = (value("x"), value("y"));
                let area = Bounds {
                    x0: x,
                    y0: y,
                    x1: x + value("width"),
                    y1: y + value("height"),
                };
                let stroke = stroke(node);
                let h = stroke.map_or(0.0, |(_, w)| w / 2.0);
                let bounds = Bounds {
                    x0: area.x0 - h,
                    y0: area.y0 - h,
                    x1: area.x1 + h,
                    y1: area.y1 + h,
                };
                let fill = paint(node, "fill", Some([0, 0, 0]));
                (Look::Rect { area, fill, stroke }, bounds, node)
            }
            "polyline" => {
                let points = node
                    .attribute("points")
                    .and_then(polygon_points)
                    .unwrap_or_default();
                let [from, to] = points[..] else {
                    continue;
                };
                let stroke = stroke(node);
                let h = stroke.map_or(0.0, |(_, w)| w / 2.0);
                let bounds = Bounds {
                    x0: from.0.min(to.0) - h,
                    y0: from.1.min(to.1) - h,
                    x1: from.0.max(to.0) + h,
                    y1: from.1.max(to.1) + h,
                };
                (Look::Segment { from, to, stroke }, bounds, node)
            }
            "text" => {
                let Some(bounds) = text_bounds(node) else {
                    continue;
                };
                let fill = paint(node, "fill", Some([0, 0, 0]));
                (Look::Text { fill }, bounds, node)
            }
            _ => {
                let Some(group) = node.parent_element() else {
                    continue;
                };
                let (Some(centre), Ok(paint)) = (translate(group), Paint::read(node)) else {
                    continue;
                };
                let bounds = Bounds::around(centre.0, centre.1, paint.reach());
                (Look::Shape { centre, paint }, bounds, group)
            }
        };
        let name = match element {
            "text" => format!("the text {:?}", node.text().unwrap_or("").trim()),
            _ if owner != node => format!(
                "the {} of {}",
                element,
                owner
                    .attribute("data-series")
                    .or(owner.attribute("data-config"))
                    .or(owner.attribute("data-setting"))
                    .unwrap_or("a marker")
            ),
            _ => format!("a {element}"),
        };
        out.push(Drawn {
            look,
            bounds,
            opacity: opacity(node),
            node: owner.id(),
            name,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn circle(r: f64, fill: Option<Rgb>, stroke: Option<(Rgb, f64)>) -> Paint {
        Paint {
            geometry: Geometry::Circle(r),
            fill,
            stroke,
        }
    }

    #[test]
    fn paints_are_hex_colours_or_none() {
        assert_eq!(paint_value("#1f77B4"), Some(Some([0x1F, 0x77, 0xB4])));
        assert_eq!(paint_value("none"), Some(None));
        for other in [
            "red",
            "transparent",
            "#FFF",
            "rgb(0,0,0)",
            "#12345G",
            " #123456",
        ] {
            assert_eq!(paint_value(other), None, "{other}");
        }
    }

    #[test]
    fn series_differ_by_colour_shape_or_fill_as_drawn() {
        let white = [255; 3];
        let blue = [0x1F, 0x77, 0xB4];
        let filled = circle(5.0, Some(blue), None);
        let hollow = circle(5.0, None, Some((blue, 2.0)));
        let square = Paint {
            geometry: Geometry::Polygon(vec![(-4.5, -4.5), (4.5, -4.5), (4.5, 4.5), (-4.5, 4.5)]),
            fill: Some(blue),
            stroke: None,
        };
        assert!(paints_differ(&filled, &hollow, white));
        assert!(paints_differ(&filled, &square, white));
        assert!(paints_differ(
            &filled,
            &circle(5.0, Some([0xFF, 0x7F, 0x0E]), None),
            white
        ));
        // A colour a viewer cannot tell from the other, or a size a viewer cannot see, is the
        // same paint.
        assert!(!paints_differ(
            &filled,
            &circle(5.0, Some([0x1F, 0x77, 0xB5]), None),
            white
        ));
        assert!(!paints_differ(
            &filled,
            &circle(5.01, Some(blue), None),
            white
        ));
        // A stroke in the background's colour draws nothing a viewer sees.
        assert!(!paints_differ(
            &filled,
            &circle(5.0, Some(blue), Some((white, 0.0))),
            white
        ));
    }

    #[test]
    fn advances_are_read_from_the_widest_common_faces() {
        assert_eq!(advance('i', false, false), 0.32);
        assert_eq!(advance('0', false, false), 0.637);
        assert_eq!(advance('W', false, true), 1.124);
        assert_eq!(advance('~', false, false), 0.838);
        assert_eq!(advance('\u{b7}', false, false), 1.0);
        assert_eq!(advance('W', true, true), 0.61);
    }

    #[test]
    fn polygons_fill_by_the_nonzero_rule() {
        let square = Paint {
            geometry: Geometry::Polygon(vec![(-4.0, -4.0), (4.0, -4.0), (4.0, 4.0), (-4.0, 4.0)]),
            fill: Some([0; 3]),
            stroke: None,
        };
        assert_eq!(square.at(0.0, 0.0), Some([0; 3]));
        assert_eq!(square.at(4.5, 0.0), None);
        assert_eq!(square.reach(), 32f64.sqrt());
    }
}
