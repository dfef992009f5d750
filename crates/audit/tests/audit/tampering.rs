//! A small run altered the ways a forger would, with every manifest hash rewritten to match:
//! several alterations per audit, each named by its own problem.

use audit::packed_kv::chart::ChartProblem;
use audit::packed_kv::markdown::MarkdownProblem;
use audit::packed_kv::results::ResultsProblem;
use audit::packed_kv::timings::TimingProblem;
use audit::{Problem, Report};

use crate::support::{
    array, assert_pass, assert_problem, audit, edit_arrays, edit_json, edit_text, rehash,
    small_copy,
};

fn named(array: &str, name: &str) -> bool {
    array == name
}

#[test]
fn altered_arrays_are_each_caught_by_recomputation() {
    let (_tmp, dir) = small_copy();
    edit_arrays(&dir, |arrays| {
        // A 4-bit code one step off (staying inside 0..=14).
        let codes = array(arrays, "s3_n24_clean_g8_b4_k_codes").u8();
        let low = codes[[5]] & 0x0F;
        codes[[5]] = (codes[[5]] & 0xF0) | if low < 14 { low + 1 } else { low - 1 };
        // A scale off by 0.1 %.
        array(arrays, "s3_n40_early_focus_g12_b8_v_scales").f32()[[3, 0]] *= 1.001;
        // An asymmetric 3-bit zero point moved.
        array(arrays, "s5_n24_clean_g16_b3_asym_k_zeros").u8()[[0]] ^= 0b001;
        // The float32 window of a recent_f32 comparison no longer the input ...
        array(arrays, "s5_n40_clean_budget_recent_f32_k_values_s1").f32()[[3, 5]] += 0.5;
        // ... an archived input and an output changed.
        array(arrays, "s3_n40_recent_focus_v").f32()[[10, 7]] = 0.25;
        array(arrays, "s5_n24_early_focus_g12_b8_out").f64()[[1, 2]] += 1e-9;
    });
    rehash(&dir);
    let report = audit(&dir);
    assert_problem(
        &report,
        "code rule",
        |p| matches!(p, Problem::Code { array, .. } if named(array, "s3_n24_clean_g8_b4_k_codes")),
    );
    assert_problem(
        &report,
        "scale",
        |p| matches!(p, Problem::Scale { array, first: [3, 0], .. } if named(array, "s3_n40_early_focus_g12_b8_v_scales")),
    );
    assert_problem(
        &report,
        "zero point",
        |p| matches!(p, Problem::Scale { array, first: [0, 0], .. } if named(array, "s5_n24_clean_g16_b3_asym_k_scales")),
    );
    assert_problem(
        &report,
        "float32 segment",
        |p| matches!(p, Problem::Float32 { array } if named(array, "s5_n40_clean_budget_recent_f32_k_values_s1")),
    );
    assert_problem(
        &report,
        "input",
        |p| matches!(p, Problem::Input { array, first: [10, 7], count: 1, .. } if named(array, "s3_n40_recent_focus_v")),
    );
    assert_problem(
        &report,
        "output",
        |p| matches!(p, Problem::Attention { array, .. } if named(array, "s5_n24_early_focus_g12_b8_out")),
    );
}

#[test]
fn edited_or_missing_rows_are_named() {
    let (_tmp, dir) = small_copy();
    let mut id9 = String::new();
    edit_json(&dir, "results.json", |rows| {
        let rows = rows.as_array_mut().unwrap();
        id9 = rows[9]["id"].as_str().unwrap().to_string();
        let x = rows[9]["relative_l2"].as_f64().unwrap();
        rows[9]["relative_l2"] = (x * 0.9).into();
        rows[10]["payload_bytes"] = 4096.into();
        let early8 = rows
            .iter_mut()
            .find(|r| r["id"] == "s3_n40_clean_budget_early8")
            .unwrap();
        early8["segments"][0]["end"] = 16.into();
    });
    rehash(&dir);
    let report = audit(&dir);
    assert_problem(
        &report,
        "relative_l2",
        |p| matches!(p, Problem::Metric { id, field: "relative_l2", .. } if *id == id9),
    );
    assert_problem(
        &report,
        "payload",
        |p| matches!(p, Problem::Metric { field: "payload_bytes", recorded, .. } if recorded == "4096"),
    );
    assert_problem(
        &report,
        "moved window",
        |p| matches!(p, Problem::Results(ResultsProblem::Description { id }) if id == "s3_n40_clean_budget_early8"),
    );
    // summary.json is held to the audit's own recomputation, not to the edited rows.
    assert!(
        !report
            .problems
            .iter()
            .any(|p| matches!(p, Problem::Summary { .. }))
    );

    let (_tmp, dir) = small_copy();
    edit_json(&dir, "results.json", |rows| {
        let rows = rows.as_array_mut().unwrap();
        let first = rows.remove(0);
        rows.push(first);
        rows.remove(1);
    });
    rehash(&dir);
    let report = audit(&dir);
    assert_problem(&report, "row count", |p| {
        matches!(
            p,
            Problem::Results(ResultsProblem::Count {
                found: 95,
                expected: 96
            })
        )
    });
    assert_problem(&report, "missing row", |p| {
        matches!(p, Problem::Results(ResultsProblem::Missing { .. }))
    });
}

#[test]
fn rows_out_of_order_are_named() {
    let (_tmp, dir) = small_copy();
    edit_json(&dir, "results.json", |rows| {
        rows.as_array_mut().unwrap().swap(0, 1);
    });
    rehash(&dir);
    assert_problem(&audit(&dir), "order", |p| {
        matches!(
            p,
            Problem::Results(ResultsProblem::Order { position: 0, .. })
        )
    });
}

#[test]
fn timings_incomplete_altered_or_zero_fail() {
    let (_tmp, dir) = small_copy();
    edit_json(&dir, "timings.json", |t| {
        let m = t["measurements"].as_array_mut().unwrap();
        m.pop();
        m[0]["operation"] = "encode_q".into();
        m[1]["ns"] = 0.into();
    });
    rehash(&dir);
    let report = audit(&dir);
    assert_problem(
        &report,
        "measurements",
        |p| matches!(p, Problem::Timings(TimingProblem::Measurements { count, .. }) if *count >= 3),
    );
    assert_problem(&report, "median", |p| {
        matches!(
            p,
            Problem::Timings(TimingProblem::Median { .. } | TimingProblem::Rows { .. })
        )
    });
}

#[test]
fn summary_json_with_extra_keys_or_other_values_fails() {
    let (_tmp, dir) = small_copy();
    edit_json(&dir, "summary.json", |s| {
        s["budget"][1]["mean_relative_l2"]["spiky"] = 0.5.into();
        s["packed_kv"][0]["payload_bytes"]["24"] = 1.into();
    });
    rehash(&dir);
    let report = audit(&dir);
    assert_problem(
        &report,
        "extra key",
        |p| matches!(p, Problem::Summary { place, .. } if place == "budget recent8 mean_relative_l2"),
    );
    assert_problem(
        &report,
        "payload",
        |p| matches!(p, Problem::Summary { place, .. } if place == "packed_kv g8_b4 payload_bytes"),
    );

    let (_tmp, dir) = small_copy();
    edit_json(&dir, "summary.json", |s| s["claims"] = "13% better".into());
    rehash(&dir);
    assert_problem(
        &audit(&dir),
        "unknown field",
        |p| matches!(p, Problem::Json { file, message } if file == "summary.json" && message.contains("claims")),
    );
}

#[test]
fn summary_md_shows_only_checked_figures() {
    let (_tmp, dir) = small_copy();
    edit_text(&dir, "summary.md", |md| {
        md.replacen("| 8     |      4 |", "| 8     |      5 |", 1)
            .replacen(
                "## Packed KV\n",
                "## Packed KV\n\nThe error falls by 40% here.\n",
                1,
            )
    });
    rehash(&dir);
    let report = audit(&dir);
    assert_problem(
        &report,
        "cell",
        |p| matches!(p, Problem::Markdown(MarkdownProblem::Cell { table: "packed-KV", row: 1, column: 1, found, .. }) if found == "5"),
    );
    assert_problem(
        &report,
        "figure in text",
        |p| matches!(p, Problem::Markdown(MarkdownProblem::Figure { figure, .. }) if figure == "40%"),
    );

    // A fake table shown, the real one hidden in an HTML comment.
    let (_tmp, dir) = small_copy();
    edit_text(&dir, "summary.md", |md| {
        let start = md.find("| group |").unwrap();
        let end = start + md[start..].find("\n\n").unwrap();
        let real = md[start..end].to_string();
        let fake = real.replace('%', "0%");
        md.replacen(&real, &format!("{fake}\n\n<!--\n{real}\n-->"), 1)
    });
    rehash(&dir);
    let report = audit(&dir);
    assert_problem(&report, "html", |p| {
        matches!(p, Problem::Markdown(MarkdownProblem::Markup { .. }))
    });
}

/// The chart's marker lines, by line number.
fn marker_lines(lines: &[String]) -> Vec<usize> {
    (0..lines.len())
        .filter(|&i| lines[i].starts_with("<g class=\"marker\""))
        .collect()
}

/// Edits the chart's lines and audits the result, as a forger who rewrites the hash would.
fn audit_chart_edit(edit: impl FnOnce(&mut Vec<String>)) -> Report {
    let (_tmp, dir) = small_copy();
    edit_text(&dir, "error-vs-bytes.svg", |svg| {
        let mut lines: Vec<String> = svg.lines().map(String::from).collect();
        edit(&mut lines);
        lines.join("\n") + "\n"
    });
    rehash(&dir);
    audit(&dir)
}

/// The line of the chart's first y tick label's opening tag.
fn y_tick_line(lines: &[String]) -> usize {
    lines
        .iter()
        .position(|l| l.contains("dy=\"0.5ex\" text-anchor=\"end\""))
        .unwrap()
}

/// The lines of the first float32 line's dashes.
fn dash_lines(lines: &[String]) -> Vec<usize> {
    let open = lines
        .iter()
        .position(|l| l == "<g class=\"float32\">")
        .unwrap();
    (open + 1..lines.len())
        .take_while(|&i| lines[i].starts_with("<polyline"))
        .collect()
}

/// The value of attribute `name` in an SVG line.
fn attribute<'a>(line: &'a str, name: &str) -> &'a str {
    let start = line.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
    &line[start..start + line[start..].find('"').unwrap()]
}

#[test]
fn chart_markers_ticks_and_extras_are_checked() {
    let report = audit_chart_edit(|lines| {
        let markers = marker_lines(lines);
        // Move the first marker 40 px down; change the second one's error.
        let moved = &lines[markers[0]];
        let (head, tail) = moved.split_once("transform=\"translate(").unwrap();
        let (xy, rest) = tail.split_once(')').unwrap();
        let (x, y) = xy.split_once(',').unwrap();
        let y: f64 = y.parse().unwrap();
        lines[markers[0]] = format!("{head}transform=\"translate({x},{}){rest}", y + 40.0);
        lines[markers[1]] =
            lines[markers[1]].replacen("data-relative-l2=\"0.", "data-relative-l2=\"0.0", 1);
        // A stray marker in the plot.
        let last = lines.len() - 1;
        lines.insert(
            last,
            "<circle cx=\"200\" cy=\"200\" r=\"5\" fill=\"#000000\"/>".into(),
        );
    });
    assert_problem(&report, "position", |p| {
        matches!(p, Problem::Chart(ChartProblem::Position { .. }))
    });
    assert_problem(&report, "marker data", |p| {
        matches!(p, Problem::Chart(ChartProblem::Marker { index: 1, .. }))
    });
    assert_problem(&report, "stray", |p| {
        matches!(p, Problem::Chart(ChartProblem::Stray { .. }))
    });

    // A y tick label that does not say what its position means (plotters writes a text's
    // content on the line after its opening tag).
    let report = audit_chart_edit(|lines| {
        let at = y_tick_line(lines) + 1;
        let rest = &lines[at][lines[at].find('%').unwrap()..];
        lines[at] = format!("9{rest}");
    });
    assert_problem(
        &report,
        "tick",
        |p| matches!(p, Problem::Chart(ChartProblem::Tick { axis: "y", label, .. }) if label == "9%"),
    );

    let report = audit_chart_edit(|lines| {
        let last = lines.len() - 1;
        lines.insert(last, "<script>alert(1)</script>".into());
    });
    assert_problem(
        &report,
        "script",
        |p| matches!(p, Problem::Chart(ChartProblem::Element { what }) if what.contains("script")),
    );

    // A tick label shifted by an offset, so it shows a value where another belongs.
    let report = audit_chart_edit(|lines| {
        let at = y_tick_line(lines);
        lines[at] = lines[at].replacen("text-anchor=\"end\"", "dx=\"40\" text-anchor=\"end\"", 1);
    });
    assert_problem(
        &report,
        "offset",
        |p| matches!(p, Problem::Chart(ChartProblem::Element { what }) if what.contains("offset")),
    );

    // A y tick label moved along its axis by a dy of its own, so it shows a value where another
    // belongs (an em or ex of alignment is the chart's to choose; this is not alignment).
    let report = audit_chart_edit(|lines| {
        let at = y_tick_line(lines);
        lines[at] = lines[at].replacen("dy=\"0.5ex\"", "dy=\"40\"", 1);
    });
    assert_problem(
        &report,
        "dy",
        |p| matches!(p, Problem::Chart(ChartProblem::Element { what }) if what.contains("offset")),
    );

    // Just an SVG document is not the chart.
    let (_tmp, dir) = small_copy();
    std::fs::write(
        dir.join("error-vs-bytes.svg"),
        "<svg xmlns=\"http://www.w3.org/2000/svg\"></svg>\n",
    )
    .unwrap();
    rehash(&dir);
    assert_problem(&audit(&dir), "mapping", |p| {
        matches!(p, Problem::Chart(ChartProblem::Mapping { .. }))
    });
}

/// Replaces the shape inside the marker (or swatch) on line `at`.
fn reshape(lines: &mut [String], at: usize, shape: &str) {
    let open = lines[at].find("><").unwrap() + 1;
    let close = lines[at].rfind("</g>").unwrap();
    lines[at].replace_range(open..close, shape);
}

#[test]
fn a_restyled_chart_still_passes() {
    let report = audit_chart_edit(|lines| {
        // Every series repainted, markers and swatch alike, in a palette and shapes of its own:
        // hollow series filled, the first series drawn as squares, the others alternately as
        // circles and diamonds, each with a white outline.
        let palette = [
            "#003F5C", "#7A5195", "#EF5675", "#FFA600", "#2F9E44", "#6C757D", "#A0522D", "#00B4D8",
        ];
        let mut series: Vec<String> = Vec::new();
        for at in 0..lines.len() {
            let line = &lines[at];
            let name = if line.starts_with("<g class=\"marker\"") {
                attribute(line, "data-config")
            } else if line.starts_with("<g class=\"swatch\"") {
                attribute(line, "data-series")
            } else {
                continue;
            }
            .to_string();
            if !series.contains(&name) {
                series.push(name.clone());
            }
            let i = series.iter().position(|s| *s == name).unwrap();
            let geometry = match i {
                0 => "<polygon points=\"-4.5,-4.5 4.5,-4.5 4.5,4.5 -4.5,4.5\"",
                i if i % 2 == 0 => "<circle r=\"4\"",
                _ => "<polygon points=\"0,-5 5,0 0,5 -5,0\"",
            };
            reshape(
                lines,
                at,
                &format!(
                    "{geometry} fill=\"{}\" stroke=\"#FFFFFF\" stroke-width=\"1\"/>",
                    palette[i]
                ),
            );
        }
        assert_eq!(series.len(), palette.len());
        // Every float32 line drawn solid and thicker: one polyline from its dashes' top to their
        // bottom (last panel first, so the earlier lines keep their numbers).
        let opens: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i] == "<g class=\"float32\">")
            .collect();
        assert!(opens.len() > 1 && lines.iter().any(|l| l.contains("#003F5C")));
        for &open in opens.iter().rev() {
            let dashes: Vec<usize> = (open + 1..lines.len())
                .take_while(|&i| lines[i].starts_with("<polyline"))
                .collect();
            let x = attribute(&lines[dashes[0]], "points")
                .split(',')
                .next()
                .unwrap()
                .to_string();
            let ends: Vec<i64> = dashes
                .iter()
                .flat_map(|&i| {
                    attribute(&lines[i], "points")
                        .split_whitespace()
                        .map(|p| p.split_once(',').unwrap().1.parse::<i64>().unwrap())
                        .collect::<Vec<_>>()
                })
                .collect();
            let (top, bottom) = (ends.iter().min().unwrap(), ends.iter().max().unwrap());
            lines[dashes[0]] = format!(
                "<polyline fill=\"none\" stroke=\"#000000\" stroke-width=\"3\" points=\"{x},{bottom} {x},{top} \"/>"
            );
            lines.drain(dashes[0] + 1..=*dashes.last().unwrap());
        }
        // Tick labels anchored otherwise: x labels hung by 0.5ex, y labels from their start
        // (not the float32 labels, which would then run over the legend).
        for at in 0..lines.len() - 1 {
            if lines[at + 1].starts_with("float32") {
                continue;
            }
            lines[at] = lines[at]
                .replace(
                    "dy=\"0.76em\" text-anchor=\"middle\"",
                    "dy=\"0.5ex\" text-anchor=\"start\"",
                )
                .replace(
                    "dy=\"0.5ex\" text-anchor=\"end\"",
                    "dy=\"-0.2em\" text-anchor=\"start\"",
                );
        }
        let solid = |l: &String| l.starts_with("<polyline fill=\"none\" stroke=\"#000000\"");
        assert_eq!(lines.iter().filter(|l| solid(l)).count(), opens.len());
    });
    assert_pass(&report);
}

#[test]
fn a_marker_hidden_moved_by_its_shape_or_in_another_panel_fails() {
    // A circle centred away from its marker's position, an unpainted one, and one grown to
    // cover its neighbours; a polygon centred off its position.
    let report = audit_chart_edit(|lines| {
        let markers = marker_lines(lines);
        reshape(
            lines,
            markers[0],
            "<circle r=\"5\" cx=\"40\" fill=\"#000000\"/>",
        );
        reshape(
            lines,
            markers[1],
            "<circle r=\"5\" fill=\"none\" stroke=\"none\"/>",
        );
        reshape(
            lines,
            markers[2],
            "<circle r=\"5\" stroke=\"#000000\" stroke-width=\"60\"/>",
        );
        reshape(lines, markers[3], "<polygon points=\"30,30 36,30 33,36\"/>");
    });
    for what in ["cx", "unpainted", "reaching", "centred"] {
        assert_problem(
            &report,
            what,
            |p| matches!(p, Problem::Chart(ChartProblem::Shape { what: w, .. }) if w.contains(what)),
        );
    }

    // The first panel's first marker moved into the next panel, at its right pixel there.
    let report = audit_chart_edit(|lines| {
        let first = marker_lines(lines)[0];
        let marker = lines.remove(first);
        let second_panel = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.starts_with("<g class=\"panel\""))
            .map(|(i, _)| i)
            .nth(1)
            .unwrap();
        lines.insert(second_panel + 1, marker);
    });
    assert_problem(
        &report,
        "marker count",
        |p| matches!(p, Problem::Chart(ChartProblem::Marker { found, .. }) if found.contains("markers in panel")),
    );

    // An extra marker: the first one twice.
    let report = audit_chart_edit(|lines| {
        let first = marker_lines(lines)[0];
        let copy = lines[first].clone();
        lines.insert(first, copy);
    });
    assert_problem(&report, "extra marker", |p| {
        matches!(p, Problem::Chart(ChartProblem::Marker { .. }))
    });
}

#[test]
fn panels_legend_and_float32_lines_are_checked() {
    // A panel title that names another length.
    let report = audit_chart_edit(|lines| {
        let at = lines.iter().position(|l| l.starts_with("N=")).unwrap();
        lines[at] = lines[at].replacen("N=", "N=9", 1);
    });
    assert_problem(
        &report,
        "title",
        |p| matches!(p, Problem::Chart(ChartProblem::Label { expected }) if expected.starts_with("N=")),
    );

    // The float32 line moved 30 px; cut to its lower half.
    let moved = |lines: &mut Vec<String>| {
        for at in dash_lines(lines) {
            let x = attribute(&lines[at], "points")
                .split(',')
                .next()
                .unwrap()
                .to_string();
            let shifted = x.parse::<i32>().unwrap() - 30;
            lines[at] = lines[at].replace(&format!("{x},"), &format!("{shifted},"));
        }
    };
    let halved = |lines: &mut Vec<String>| {
        let dashes = dash_lines(lines);
        lines.drain(dashes[dashes.len() / 2]..=*dashes.last().unwrap());
    };
    for (what, edit) in [
        ("moved", &moved as &dyn Fn(&mut Vec<String>)),
        ("halved", &halved),
    ] {
        let report = audit_chart_edit(edit);
        assert_problem(
            &report,
            what,
            |p| matches!(p, Problem::Chart(ChartProblem::Mapping { what }) if what.contains("float32")),
        );
    }

    // Something other than dashes in a float32 line's group, and a filled polyline.
    let report = audit_chart_edit(|lines| {
        let first = dash_lines(lines)[0];
        lines.insert(first, "<text x=\"0\" y=\"0\">x</text>".into());
    });
    assert_problem(
        &report,
        "float32 group",
        |p| matches!(p, Problem::Chart(ChartProblem::Element { what }) if what.contains("float32")),
    );
    let report = audit_chart_edit(|lines| {
        let at = lines
            .iter()
            .position(|l| l.starts_with("<polyline"))
            .unwrap();
        lines[at] = lines[at].replacen("fill=\"none\"", "fill=\"#FFFFFF\"", 1);
    });
    assert_problem(
        &report,
        "filled polyline",
        |p| matches!(p, Problem::Chart(ChartProblem::Element { what }) if what.contains("polyline")),
    );

    // A legend swatch removed; then two swatches swapped, so each labels the other's series.
    let swatches = |lines: &[String]| -> Vec<usize> {
        (0..lines.len())
            .filter(|&i| lines[i].starts_with("<g class=\"swatch\""))
            .collect()
    };
    let report = audit_chart_edit(|lines| {
        let first = swatches(lines)[0];
        lines.remove(first);
    });
    assert_problem(&report, "legend", |p| {
        matches!(p, Problem::Chart(ChartProblem::Legend { .. }))
    });
    let report = audit_chart_edit(|lines| {
        let [a, b, ..] = swatches(lines)[..] else {
            unreachable!()
        };
        let (sa, sb) = (
            attribute(&lines[a], "data-series").to_string(),
            attribute(&lines[b], "data-series").to_string(),
        );
        lines[a] = lines[a].replacen(&sa, &sb, 1);
        lines[b] = lines[b].replacen(&sb, &sa, 1);
    });
    assert_problem(&report, "legend order", |p| {
        matches!(p, Problem::Chart(ChartProblem::Legend { .. }))
    });

    // A white rectangle over the last panel, hiding its markers.
    let report = audit_chart_edit(|lines| {
        let last = lines.len() - 1;
        lines.insert(
            last,
            "<rect x=\"0\" y=\"0\" width=\"2000\" height=\"2000\" fill=\"#FFFFFF\"/>".into(),
        );
    });
    assert_problem(
        &report,
        "cover",
        |p| matches!(p, Problem::Chart(ChartProblem::Element { what }) if what.contains("rect")),
    );

    // A y axis of its own in one panel, so rows would not compare.
    let report = audit_chart_edit(|lines| {
        let at = lines
            .iter()
            .rposition(|l| l.starts_with("<g class=\"panel\""))
            .unwrap();
        let range = attribute(&lines[at], "data-y-range").to_string();
        let (lo, hi) = range.split_once(' ').unwrap();
        let hi: f64 = hi.parse().unwrap();
        lines[at] = lines[at].replacen(&range, &format!("{lo} {:?}", hi * 2.0), 1);
    });
    assert_problem(
        &report,
        "y range",
        |p| matches!(p, Problem::Chart(ChartProblem::Mapping { what }) if what.contains("y axis")),
    );
}

#[test]
fn missing_extra_truncated_and_malformed_files_fail() {
    let (_tmp, dir) = small_copy();
    std::fs::remove_file(dir.join("summary.json")).unwrap();
    std::fs::write(dir.join("notes.txt"), "added later").unwrap();
    let path = dir.join("arrays.npz");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let report = audit(&dir);
    assert_problem(
        &report,
        "missing",
        |p| matches!(p, Problem::File(audit::common::files::FileError::Missing { path }) if path.ends_with("summary.json")),
    );
    assert_problem(
        &report,
        "unlisted",
        |p| matches!(p, Problem::UnexpectedFile { name } if name == "notes.txt"),
    );
    assert_problem(
        &report,
        "hash",
        |p| matches!(p, Problem::Hash { file, .. } if file == "arrays.npz"),
    );
    assert_problem(&report, "archive", |p| matches!(p, Problem::Archive(_)));

    let (_tmp, dir) = small_copy();
    std::fs::write(dir.join("results.json"), "[{\"id\": ").unwrap();
    rehash(&dir);
    assert_problem(
        &audit(&dir),
        "malformed",
        |p| matches!(p, Problem::Json { file, .. } if file == "results.json"),
    );
    std::fs::write(dir.join("manifest.json"), "{}").unwrap();
    assert_problem(
        &audit(&dir),
        "malformed manifest",
        |p| matches!(p, Problem::Json { file, .. } if file == "manifest.json"),
    );
    std::fs::write(
        dir.join("manifest.json"),
        "{\"format\": \"packed-kv-evidence/0\"}",
    )
    .unwrap();
    assert_problem(&audit(&dir), "format", |p| {
        matches!(p, Problem::Format { .. })
    });
}
