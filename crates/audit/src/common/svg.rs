//! The SVG primitives both charts are read with: a panel's declared log axis mapping, a group's
//! `translate(X,Y)`, a polygon's points, and tick labels read as the charts write them.

use roxmltree::Node;

/// One axis's log mapping: values lo..hi land on pixels a..b.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Axis {
    pub(crate) lo: f64,
    pub(crate) hi: f64,
    pub(crate) a: f64,
    pub(crate) b: f64,
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

    /// The pixel span, low to high.
    pub(crate) fn span(&self) -> (f64, f64) {
        (self.a.min(self.b), self.a.max(self.b))
    }

    /// Whether a pixel lies on the axis (within a pixel of its ends).
    pub(crate) fn holds(&self, p: f64) -> bool {
        let (lo, hi) = self.span();
        (lo - 1.0..=hi + 1.0).contains(&p)
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

pub(crate) fn number(node: Node, name: &str) -> Option<f64> {
    node.attribute(name)?.parse().ok()
}

/// A polygon's points (`x,y x,y ...`, commas or spaces between numbers); None if malformed.
pub(crate) fn polygon_points(list: &str) -> Option<Vec<(f64, f64)>> {
    let numbers: Vec<f64> = list
        .split(|c: char| c == ',' || c.is_ascii_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<f64>().ok().filter(|v| v.is_finite()))
        .collect::<Option<_>>()?;
    numbers
        .len()
        .is_multiple_of(2)
        .then(|| numbers.chunks(2).map(|p| (p[0], p[1])).collect())
}

/// Whether a tick label's `dy` only aligns it on its pixel: at most one em or ex, as renderers
/// shift a label to centre or hang it, never a shift that would move it to another value.
pub(crate) fn baseline_shift(dy: &str) -> bool {
    let number = dy.strip_suffix("em").or_else(|| dy.strip_suffix("ex"));
    number
        .and_then(|n| n.parse::<f64>().ok())
        .is_some_and(|v| v.abs() <= 1.0)
}

/// "0.5%" -> 0.005.
pub(crate) fn percent_label(label: &str) -> Option<f64> {
    decimal_label(label.strip_suffix('%')?).map(|v| v / 100.0)
}

/// "0.05" -> 0.05: digits and a point only.
pub(crate) fn decimal_label(label: &str) -> Option<f64> {
    let plain = !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    plain.then(|| label.parse::<f64>().ok()).flatten()
}

/// "5,000" -> 5000.
pub(crate) fn x_label(label: &str) -> Option<f64> {
    let groups: Vec<&str> = label.split(',').collect();
    let plain = !groups[0].is_empty()
        && groups[0].len() <= 3
        && groups
            .iter()
            .all(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()))
        && groups[1..].iter().all(|g| g.len() == 3);
    plain.then(|| groups.concat().parse::<f64>().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::text::thousands;

    #[test]
    fn labels_read_as_the_chart_writes_them() {
        assert_eq!(percent_label("0.5%"), Some(0.005));
        assert_eq!(percent_label("0.5"), None);
        assert_eq!(decimal_label("0.02"), Some(0.02));
        assert_eq!(x_label("65,536"), Some(65536.0));
        assert_eq!(x_label("65536"), None);
        assert_eq!(thousands(46_080u32), "46,080");
        assert_eq!(thousands(500u32), "500");
    }
    #[test]
    fn a_tick_label_may_be_aligned_but_not_moved() {
        assert!(baseline_shift("0.5ex") && baseline_shift("0.76em") && baseline_shift("-0.3em"));
        assert!(!baseline_shift("1.5em") && !baseline_shift("40") && !baseline_shift("4px"));
    }

    #[test]
    fn polygon_points_read_as_svg_writes_them() {
        assert_eq!(
            polygon_points("0,-6 5.2,3 -5.2,3"),
            Some(vec![(0.0, -6.0), (5.2, 3.0), (-5.2, 3.0)])
        );
        assert_eq!(
            polygon_points("0 -6, 6 0"),
            Some(vec![(0.0, -6.0), (6.0, 0.0)])
        );
        assert_eq!(polygon_points("0,-6 5.2"), None);
        assert_eq!(polygon_points("0,x"), None);
    }
}
