//! The chart read as a viewer sees it, and figures in any script (issue 21): the small run's
//! chart (and its summaries) altered the ways that passed a check of structure alone, every
//! manifest hash rewritten to match, each a FAIL naming the rule; and what an honest chart may
//! do (restyle, markers whose data coincide) still a PASS.

use audit::common::problem::{ChartProblem, MarkdownProblem};
use audit::{Problem, Report};

use crate::support::{
    assert_pass, assert_problem, audit, edit_json, edit_text, make_run, rehash, small_copy,
};

/// Edits the small run's chart line by line and audits it, every hash rewritten.
fn chart_edit(edit: impl FnOnce(&mut Vec<String>)) -> Report {
    let (_tmp, dir) = small_copy();
    edit_text(&dir, "error-vs-bytes.svg", |svg| {
        let mut lines: Vec<String> = svg.lines().map(String::from).collect();
        edit(&mut lines);
        lines.join("\n") + "\n"
    });
    rehash(&dir);
    audit(&dir)
}

/// The value of attribute `name` in an SVG line.
fn attribute<'a>(line: &'a str, name: &str) -> &'a str {
    let start = line.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
    &line[start..start + line[start..].find('"').unwrap()]
}

/// The line with attribute `name` set to `value`.
fn with_attribute(line: &str, name: &str, value: &str) -> String {
    let old = format!(" {name}=\"{}\"", attribute(line, name));
    line.replacen(&old, &format!(" {name}=\"{value}\""), 1)
}

/// The lines that start with `prefix`, by number.
fn starting(lines: &[String], prefix: &str) -> Vec<usize> {
    (0..lines.len())
        .filter(|&i| lines[i].starts_with(prefix))
        .collect()
}

/// The swatch line of series `label`.
fn swatch(lines: &[String], label: &str) -> usize {
    lines
        .iter()
        .position(|l| l.starts_with(&format!("<g class=\"swatch\" data-series=\"{label}\"")))
        .unwrap()
}

/// The shape inside a marker's or swatch's line.
fn shape(line: &str) -> &str {
    &line[line.find("><").unwrap() + 1..line.rfind("</g>").unwrap()]
}

/// Draws every marker and the swatch of series `label` as `new`.
fn repaint(lines: &mut [String], label: &str, new: &str) {
    for line in lines.iter_mut() {
        let mine = line.starts_with(&format!("<g class=\"swatch\" data-series=\"{label}\""))
            || (line.starts_with("<g class=\"marker\"") && attribute(line, "data-config") == label);
        if mine {
            let old = shape(line).to_string();
            *line = line.replacen(&old, new, 1);
        }
    }
}

#[track_caller]
fn assert_chart(report: &Report, what: &str, matches: impl Fn(&ChartProblem) -> bool) {
    assert_problem(
        report,
        what,
        |p| matches!(p, Problem::Chart(c) if matches(c)),
    );
}

fn series_problem(series: &str, what: &str) -> impl Fn(&ChartProblem) -> bool {
    move |p| matches!(p, ChartProblem::Series { series: s, what: w } if s == series && w.contains(what))
}

fn hidden(what: &str, why: &str) -> impl Fn(&ChartProblem) -> bool {
    move |p| matches!(p, ChartProblem::Hidden { what: w, why: y } if w.starts_with(what) && y.contains(why))
}

fn element(what: &str) -> impl Fn(&ChartProblem) -> bool {
    move |p| matches!(p, ChartProblem::Element { what: w } if w.contains(what))
}

#[test]
fn a_legend_that_pairs_series_wrongly_fails() {
    // Two labels exchange places: the 4-bit setting's label beside the 8-bit swatch and back,
    // so a reader takes the 4-bit markers for 8-bit ones.
    let report = chart_edit(|lines| {
        let (a, b) = (swatch(lines, "g8_b4") + 1, swatch(lines, "g12_b8") + 1);
        let (la, lb) = (lines[a].clone(), lines[b].clone());
        for name in ["x", "y"] {
            lines[a] = with_attribute(&lines[a], name, attribute(&lb, name));
            lines[b] = with_attribute(&lines[b], name, attribute(&la, name));
        }
    });
    assert_chart(
        &report,
        "label beside another swatch",
        series_problem("g8_b4", "beside the swatch of g12_b8"),
    );
    assert_chart(
        &report,
        "label beside another swatch",
        series_problem("g12_b8", "beside the swatch of g8_b4"),
    );

    // The swatches exchange places instead, the labels staying.
    let report = chart_edit(|lines| {
        let (a, b) = (swatch(lines, "g8_b4"), swatch(lines, "g12_b8"));
        let (ta, tb) = (
            attribute(&lines[a], "transform").to_string(),
            attribute(&lines[b], "transform").to_string(),
        );
        lines[a] = with_attribute(&lines[a], "transform", &tb);
        lines[b] = with_attribute(&lines[b], "transform", &ta);
    });
    assert_chart(
        &report,
        "swatch moved",
        series_problem("g8_b4", "beside the swatch of g12_b8"),
    );

    // A label kept at its anchor but dropped by its dy (an em, as alignment may) towards the
    // next swatch: the line a reader sees it on is what counts.
    let report = chart_edit(|lines| {
        let at = swatch(lines, "g8_b4") + 1;
        let y: f64 = attribute(&lines[at], "y").parse().unwrap();
        lines[at] = with_attribute(&lines[at], "y", &(y + 5.0).to_string());
        lines[at] = with_attribute(&lines[at], "dy", "1em");
    });
    assert_chart(
        &report,
        "label dropped",
        series_problem("g8_b4", "beside the swatch of g16_b3_asym"),
    );

    // The two series' markers exchange paints (the legend left as it is).
    let report = chart_edit(|lines| {
        let four = shape(&lines[swatch(lines, "g8_b4")]).to_string();
        let eight = shape(&lines[swatch(lines, "g12_b8")]).to_string();
        for line in lines.iter_mut() {
            if line.starts_with("<g class=\"marker\"") {
                match attribute(line, "data-config") {
                    "g8_b4" => *line = line.replacen(&four, &eight, 1),
                    "g12_b8" => *line = line.replacen(&eight, &four, 1),
                    _ => {}
                }
            }
        }
    });
    assert_chart(
        &report,
        "markers unlike their swatch",
        series_problem("g8_b4", "drawn unlike its legend swatch"),
    );

    // Two series drawn alike (the swatch too): hollow vs filled and colour are what tell them
    // apart, and a colour one step from another is no colour of its own.
    let report = chart_edit(|lines| {
        repaint(
            lines,
            "recent8",
            "<circle r=\"5\" fill=\"none\" stroke=\"#D62729\" stroke-width=\"2\"/>",
        );
    });
    assert_chart(
        &report,
        "series alike",
        series_problem("uniform", "drawn like recent8"),
    );

    // The headings exchange places: the budget policies read as packed settings.
    let report = chart_edit(|lines| {
        let headings: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].contains("font-weight=\"bold\""))
            .collect();
        let (a, b) = (headings[0], headings[1]);
        let (ya, yb) = (
            attribute(&lines[a], "y").to_string(),
            attribute(&lines[b], "y").to_string(),
        );
        lines[a] = with_attribute(&lines[a], "y", &yb);
        lines[b] = with_attribute(&lines[b], "y", &ya);
    });
    assert_chart(
        &report,
        "heading",
        series_problem("heading \"packed settings\"", "above its group"),
    );
}

#[test]
fn strokes_and_shapes_that_hide_markers_fail() {
    // A grid line redrawn after the first panel's markers, white and 40 px wide.
    let report = chart_edit(|lines| {
        let panel = starting(lines, "<g class=\"panel\"")[0];
        let line = panel
            + lines[panel..]
                .iter()
                .position(|l| l.starts_with("<polyline"))
                .unwrap();
        let end = panel + lines[panel..].iter().position(|l| l == "</g>").unwrap();
        let end = end + 1 + lines[end + 1..].iter().position(|l| l == "</g>").unwrap();
        let wide = lines[line]
            .replacen("stroke=\"#DDDDDD\"", "stroke=\"#FFFFFF\"", 1)
            .replacen("stroke-width=\"1\"", "stroke-width=\"40\"", 1);
        lines.insert(end, wide);
        lines.remove(line);
    });
    assert_chart(
        &report,
        "line over markers",
        hidden("marker", "a polyline is drawn over it"),
    );

    // A series drawn in the background's colour: its markers and swatch show nothing.
    let report = chart_edit(|lines| {
        repaint(
            lines,
            "g12_b8",
            "<circle r=\"5\" fill=\"#FFFFFF\" stroke=\"none\"/>",
        );
    });
    assert_chart(
        &report,
        "white marker",
        hidden("marker g12_b8", "px\u{b2} of it shows"),
    );
    assert_chart(
        &report,
        "white swatch",
        hidden("legend swatch g12_b8", "shows"),
    );

    // A later series grown to a disc that covers its neighbours (within the reach a marker may
    // have): recent8 at (174,151) buries g8_b4 at (171,153), 3.6 px away.
    let report = chart_edit(|lines| {
        repaint(
            lines,
            "recent8",
            "<circle r=\"1\" fill=\"#9467BD\" stroke=\"#FFFFFF\" stroke-width=\"18\"/>",
        );
    });
    assert_chart(
        &report,
        "covered by a later marker",
        hidden(
            "marker g8_b4 recent_focus N=24",
            "uncovered by later markers",
        ),
    );

    // A legend label hidden under a later text: the first panel's title, moved onto it in
    // white. Nothing is drawn over a legend label.
    let report = chart_edit(|lines| {
        let at = lines
            .iter()
            .position(|l| l.starts_with("N=24 · recent_focus"))
            .unwrap()
            - 1;
        for (name, value) in [("x", "788"), ("y", "80"), ("fill", "#FFFFFF")] {
            lines[at] = with_attribute(&lines[at], name, value);
        }
    });
    assert_chart(
        &report,
        "label covered",
        hidden(
            "legend label g8_b4",
            "the text \"N=24 · recent_focus\" is drawn over it",
        ),
    );
}

#[test]
fn shapes_that_look_like_markers_but_are_not_fail() {
    let first_line = |lines: &[String]| {
        lines
            .iter()
            .position(|l| l.starts_with("<polyline"))
            .unwrap()
    };
    // A dot drawn with a short, wide grid line in a series' colour.
    let report = chart_edit(|lines| {
        let at = first_line(lines);
        lines.insert(
            at,
            "<polyline fill=\"none\" stroke=\"#1F77B4\" stroke-width=\"10\" points=\"200,150 201,150 \"/>".into(),
        );
    });
    assert_chart(&report, "dot", element("a mark rather than a line"));

    // A hollow square drawn as a small frame.
    let report = chart_edit(|lines| {
        let at = first_line(lines);
        lines.insert(
            at,
            "<rect x=\"195\" y=\"145\" width=\"9\" height=\"9\" fill=\"none\" stroke=\"#9467BD\"/>"
                .into(),
        );
    });
    assert_problem(
        &report,
        "small frame",
        |p| matches!(p, Problem::Chart(ChartProblem::Mapping { what }) if what.contains("frame")),
    );

    // A dash of the float32 line made a block.
    let report = chart_edit(|lines| {
        let open = lines
            .iter()
            .position(|l| l == "<g class=\"float32\">")
            .unwrap();
        lines[open + 3] = lines[open + 3].replacen("stroke-width=\"1\"", "stroke-width=\"6\"", 1);
    });
    assert_chart(&report, "block dash", element("one thin pen"));

    // A marker whose polygon has more vertices than a point's shape needs (each is weighed at
    // every sample of what a viewer sees), and a marker buried under more lines than a chart
    // draws: both refused, quickly.
    let report = chart_edit(|lines| {
        let first = starting(lines, "<g class=\"marker\"")[0];
        let points: Vec<String> = (0..65)
            .map(|i| {
                let a = f64::from(i) * std::f64::consts::TAU / 65.0;
                format!("{:.3},{:.3}", 5.0 * a.cos(), 5.0 * a.sin())
            })
            .collect();
        let old = shape(&lines[first]).to_string();
        lines[first] = lines[first].replacen(
            &old,
            &format!(
                "<polygon points=\"{}\" fill=\"#1F77B4\"/>",
                points.join(" ")
            ),
            1,
        );
    });
    assert_chart(
        &report,
        "vertices",
        |p| matches!(p, ChartProblem::Shape { what, .. } if what.contains("65 vertices")),
    );
    let report = chart_edit(|lines| {
        let first = starting(lines, "<g class=\"marker\"")[0];
        let x = attribute(&lines[first], "transform")
            .trim_start_matches("translate(")
            .split(',')
            .next()
            .unwrap()
            .to_string();
        let open = lines
            .iter()
            .position(|l| l == "<g class=\"float32\">")
            .unwrap();
        let line = format!(
            "<polyline fill=\"none\" stroke=\"#DDDDDD\" stroke-width=\"1\" points=\"{x},271 {x},72 \"/>"
        );
        for _ in 0..1001 {
            lines.insert(open, line.clone());
        }
    });
    assert_chart(
        &report,
        "buried",
        hidden("marker", "elements lie beneath it"),
    );

    // The real marker's shape put in another namespace (a renderer draws nothing), and a
    // segment drawn with a line element.
    let report = chart_edit(|lines| {
        let first = starting(lines, "<g class=\"marker\"")[0];
        lines[first] = lines[first].replacen("<circle ", "<circle xmlns=\"urn:x\" ", 1);
    });
    assert_chart(&report, "foreign shape", element("a circle element"));
    let report = chart_edit(|lines| {
        let at = first_line(lines);
        lines.insert(
            at,
            "<line x1=\"200\" y1=\"150\" x2=\"201\" y2=\"150\"/>".into(),
        );
    });
    assert_chart(&report, "line", element("a line element"));
}

#[test]
fn text_hidden_from_the_reader_or_placed_by_glyph_fails() {
    let title = |lines: &[String]| {
        lines
            .iter()
            .position(|l| l.starts_with("N=24 · recent_focus"))
            .unwrap()
    };
    // A claim after the panel title, in a comment or a processing instruction: a renderer
    // skips them, but they split the text (the part after would be drawn).
    for (what, hide) in [
        ("a comment", "<!-- -->"),
        ("a processing instruction", "<?x?>"),
    ] {
        let report = chart_edit(|lines| {
            let at = title(lines);
            lines[at] = format!("{}{hide} 4-bit is 12.5% better", lines[at]);
        });
        assert_chart(&report, what, element(what));
    }
    // The same in a CDATA section, which is drawn: the title is no longer the title.
    let report = chart_edit(|lines| {
        let at = title(lines);
        lines[at] = format!("{}<![CDATA[ 4-bit is 12.5% better]]>", lines[at]);
    });
    assert_chart(&report, "cdata", |p| match p {
        ChartProblem::Label { expected } => expected == "N=24 · recent_focus",
        ChartProblem::Element { what } => what.contains("several parts"),
        _ => false,
    });

    // Each glyph of a legend label placed on its own, so that it reads as another series.
    let report = chart_edit(|lines| {
        let at = swatch(lines, "g8_b4") + 1;
        lines[at] = with_attribute(&lines[at], "x", "788 795 802 809 816");
    });
    assert_chart(&report, "per-glyph x", element("x="));

    // A declaration or doctype ahead of the chart; a symbol font.
    let report = chart_edit(|lines| lines.insert(0, "<?xml version=\"1.0\"?>".into()));
    assert_chart(&report, "declaration", element("before its svg element"));
    let report = chart_edit(|lines| {
        let at = swatch(lines, "g8_b4") + 1;
        lines[at] = with_attribute(&lines[at], "font-family", "Symbol");
    });
    assert_chart(&report, "font", element("font-family"));
}

#[test]
fn a_view_box_size_or_transform_that_crops_or_moves_panels_fails() {
    // A viewBox that shows the top-left quarter, scaled up.
    let report = chart_edit(|lines| {
        lines[0] = with_attribute(&lines[0], "viewBox", "0 0 484 452");
    });
    assert_chart(&report, "viewBox", element("viewBox"));
    let report = chart_edit(|lines| {
        lines[0] = lines[0].replacen("<svg ", "<svg preserveAspectRatio=\"none\" ", 1);
    });
    assert_chart(&report, "aspect", element("preserveAspectRatio"));

    // The document made smaller, viewBox and background with it, so the lower panels fall
    // outside it.
    let report = chart_edit(|lines| {
        for at in [0, 1] {
            lines[at] = with_attribute(&lines[at], "height", "400");
        }
        lines[0] = with_attribute(&lines[0], "viewBox", "0 0 968 400");
    });
    assert_chart(
        &report,
        "cropped",
        hidden("panel \"N=24 · clean\"", "outside"),
    );

    // The rotated axis title scaled over the plots; a nested svg.
    let report = chart_edit(|lines| {
        let at = lines.iter().position(|l| l.contains("rotate(270")).unwrap();
        lines[at] = lines[at].replacen("rotate(270, 11, 449)", "rotate(270, 11, 449) scale(9)", 1);
    });
    assert_chart(&report, "scaled title", element("transform"));
    let report = chart_edit(|lines| {
        let last = lines.len() - 1;
        lines.insert(last, "<svg x=\"0\" y=\"0\"></svg>".into());
    });
    assert_chart(&report, "nested svg", element("svg"));
}

#[test]
fn figures_in_any_script_fail_outside_the_tables() {
    // Fullwidth and mathematical digits in summary.md, summary.json's about and the chart.
    let (_tmp, dir) = small_copy();
    edit_text(&dir, "summary.md", |md| {
        md.replacen(
            "## Packed KV\n",
            "## Packed KV\n\nThe error falls by \u{FF14}\u{FF10}% here.\n",
            1,
        )
    });
    edit_json(&dir, "summary.json", |summary| {
        let about = summary["about"].as_str().unwrap().to_string();
        summary["about"] = format!("{about} Error down to \u{1D7CF}\u{1D7D0}.\u{1D7D3}%.").into();
    });
    rehash(&dir);
    let report = audit(&dir);
    assert_problem(
        &report,
        "fullwidth figure in summary.md",
        |p| matches!(p, Problem::Markdown(MarkdownProblem::Figure { figure, .. }) if figure == "\u{FF14}\u{FF10}%"),
    );
    assert_problem(
        &report,
        "mathematical figure in about",
        |p| matches!(p, Problem::Summary { place, found, .. } if place == "about" && found.contains('\u{1D7CF}')),
    );

    let report = chart_edit(|lines| {
        let at = lines.iter().position(|l| l == "1,000").unwrap();
        lines[at] = "\u{FF11},\u{FF10}\u{FF10}\u{FF10}".into();
    });
    assert_chart(
        &report,
        "fullwidth tick",
        |p| matches!(p, ChartProblem::Tick { label, .. } if label.starts_with('\u{FF11}')),
    );
}

#[test]
fn markers_whose_data_coincide_still_pass() {
    // A budget window as long as the input: recent8 and early8 keep every token at 8 bits, so
    // their markers coincide and the later one's ring covers the earlier's. The data put them
    // there; the audit does not count that as hiding.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("coincide");
    make_run(
        r#"{
  "study": "coincide",
  "seeds": [1],
  "tokens": [8],
  "features": 8,
  "queries": 1,
  "distributions": ["clean"],
  "settings": [ { "group_size": 8, "bits": 4 } ],
  "generator": { "name": "chacha20",
                 "entropy": { "seed_multiplier": 1000, "tokens_multiplier": 1, "offset": 0 } },
  "budget": { "group_size": 8, "low_bits": 2, "window": 8,
              "policies": ["recent8", "early8"] }
}"#,
        &dir,
    );
    let svg = std::fs::read_to_string(dir.join("error-vs-bytes.svg")).unwrap();
    let at = |label: &str| {
        let line = svg
            .lines()
            .find(|l| l.contains(&format!("data-config=\"{label}\"")))
            .unwrap();
        attribute(line, "transform").to_string()
    };
    assert_eq!(at("recent8"), at("early8"));
    assert_pass(&audit(&dir));
}

#[test]
fn an_axis_title_wrapped_into_lines_passes_and_one_garbled_in_wrapping_fails() {
    // The runner wraps a long x axis title under a one-panel grid when a tall legend reaches
    // its rows: the same words, in order, on consecutive lines.
    let wrap = |pieces: [&str; 2]| {
        chart_edit(move |lines| {
            let at = starting(lines, "one column per length N")[0];
            // The small run's chart has room for one line there: the pieces share it, 16 px
            // apart, as the runner spaces lines.
            let opening = lines[at - 1].clone();
            let y: i32 = attribute(&opening, "y").parse().unwrap();
            lines[at - 1] = with_attribute(&opening, "y", &(y - 6).to_string());
            let below = with_attribute(&opening, "y", &(y + 10).to_string());
            lines.splice(
                at..at + 1,
                [
                    pieces[0].to_string(),
                    "</text>".into(),
                    below,
                    pieces[1].to_string(),
                ],
            );
        })
    };
    assert_pass(&wrap(["one column per length N,", "each on its own scale"]));
    // Lines out of order, or a word dropped in the wrapping, are not the title.
    let title = "one column per length N, each on its own scale";
    for pieces in [
        ["each on its own scale", "one column per length N,"],
        ["one column per length N,", "each on its scale"],
    ] {
        let report = wrap(pieces);
        assert_chart(&report, "garbled title", |p| match p {
            ChartProblem::Label { expected } => expected == title,
            _ => false,
        });
    }
}
