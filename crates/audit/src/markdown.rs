//! summary.md: what a reader sees, checked cell by cell.
//!
//! summary.md is designed to be checkable: every figure is in a table, and the text between the
//! tables has none. The audit parses it as GitHub does (CommonMark with GitHub's tables,
//! footnotes, task lists and strikethrough, through `pulldown-cmark`) and requires:
//! - only headings, paragraphs, tables and the chart image: no HTML (comments included), links,
//!   lists, quotes, code blocks, footnotes or other markup a renderer could show or hide;
//! - the headings and tables in the order the protocol implies, each table's header and every
//!   cell equal to the audit's own rendering of the values it verified (the run table from the
//!   protocol, the error and payload tables from summary.json, the platform from manifest.json,
//!   the medians from summary.json). A model protocol's run table names the model, its texts,
//!   layers and KV heads where a generated one names its generator, seeds and distributions (and
//!   the focus rows appear only when the protocol has a focus); the per-condition tables have a
//!   column per layer (`l5`) instead of per distribution; a swapped setting's bits read `4 swap`;
//! - no figure in any heading or paragraph (see [`figures`]).

pub use crate::problem::MarkdownProblem;
use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

use crate::Scope;
use crate::manifest::Manifest;
use crate::plan::setting_label;
use crate::protocol::{Axes, Mode, Protocol};
use crate::report::{Checked, Problem, Report};
use crate::summary::Summary;
pub use crate::text::figures;
use crate::text::{percent, thousands};
use crate::timings::OPERATIONS;

/// The chart summary.md shows, the last thing in it.
pub const CHART: &str = "error-vs-bytes.svg";

/// A configuration's label with its means by condition and payloads by length.
type DistributionRow<'a> = (
    String,
    &'a std::collections::BTreeMap<String, f64>,
    &'a std::collections::BTreeMap<String, usize>,
);

/// A table as the audit expects it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// Which table, for messages.
    pub name: &'static str,
    /// Header cells.
    pub header: Vec<String>,
    /// Body rows.
    pub rows: Vec<Vec<String>>,
}

/// A block of the document, as far as the checks care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Block {
    Heading(u8, String),
    Paragraph(String),
    Table(Vec<Vec<String>>),
    Chart { alt: String, dest: String },
}

impl Block {
    fn describe(&self) -> String {
        match self {
            Block::Heading(level, text) => format!("heading {level} {text:?}"),
            Block::Paragraph(_) => "a paragraph".into(),
            Block::Table(rows) => format!(
                "a table headed {:?}",
                rows.first().map(|r| r.join(" | ")).unwrap_or_default()
            ),
            Block::Chart { dest, .. } => format!("an image of {dest:?}"),
        }
    }
}

fn percent_cell(value: Option<f64>) -> String {
    value.map_or_else(|| "n/a".into(), |m| format!("{}%", percent(m)))
}

fn bytes_cell(value: Option<&usize>) -> String {
    value.map_or_else(|| "n/a".into(), |b| format!("{} B", thousands(*b as u64)))
}

/// The tables summary.md must hold, in order, rendered from verified values.
pub fn expected_tables(
    p: &Protocol,
    scope: Scope,
    summary: &Summary,
    manifest: &Manifest,
) -> Vec<(Option<&'static str>, Table)> {
    let join = |items: Vec<String>| items.join(", ");
    let mut run = Vec::new();
    // The source's rows first: the model and what it read, or the generator and its seeds.
    match (&p.model, &p.generator) {
        (Some(m), _) => {
            run.push(("model", m.name.to_string()));
            run.push((
                "texts",
                join(m.texts.iter().map(|t| t.name.clone()).collect()),
            ));
            run.push((
                "layers",
                join(m.layers.iter().map(usize::to_string).collect()),
            ));
            run.push((
                "KV heads",
                join(m.kv_heads.iter().map(usize::to_string).collect()),
            ));
        }
        (None, Some(g)) => {
            run.push(("generator", g.name.name().to_string()));
            run.push(("seeds", join(p.seeds.iter().map(u64::to_string).collect())));
        }
        // A validated protocol has one source or the other.
        (None, None) => {}
    }
    run.extend([
        (
            "lengths (N)",
            join(p.tokens.iter().map(usize::to_string).collect()),
        ),
        ("features (D)", p.features.to_string()),
        ("queries", p.queries.to_string()),
    ]);
    if p.model.is_none() {
        run.push((
            "distributions",
            join(p.distributions.iter().map(|d| d.to_string()).collect()),
        ));
    }
    if let Some(focus) = p.focus {
        run.push(("focus window (tokens)", focus.window.to_string()));
        run.push(("focus gain", focus.gain.to_string()));
    }
    if let Some((index, count)) = scope.shard {
        run.push(("shard", format!("{index} of {count}")));
    }
    if let Some(count) = scope.merged {
        run.push(("shards merged", count.to_string()));
    }
    let inputs = crate::plan::inputs_of(p, scope.shard).len();
    run.extend([
        ("inputs", inputs.to_string()),
        ("packed-KV settings", p.settings.len().to_string()),
    ]);
    if let Some(b) = &p.budget {
        run.push(("budget policies", b.policies.len().to_string()));
        run.push(("budget group size", b.group_size.to_string()));
        run.push(("budget low bits", b.low_bits.to_string()));
        run.push(("budget window W (tokens)", b.window.to_string()));
    }
    if let Some(t) = &p.timing {
        run.push(("timing warm-up calls", t.warmup.to_string()));
        run.push(("timing repeats", t.repeats.to_string()));
    }
    run.push(("comparisons", (inputs * p.configurations()).to_string()));
    let mut tables = vec![(
        Some("Run"),
        Table {
            name: "run",
            header: vec!["quantity".into(), "value".into()],
            rows: run
                .into_iter()
                .map(|(k, v)| vec![k.to_string(), v])
                .collect(),
        },
    )];

    let payload_headers = p.tokens.iter().map(|n| format!("payload N={n}"));
    // Every input of a model counts towards the headline (its keys are never shaped), so its
    // column is the plain mean.
    let headline = if p.model.is_some() {
        "rel. error (mean)"
    } else {
        "rel. error (clean mean)"
    };
    let mut header = vec!["group".to_string(), "bits".into(), headline.into()];
    header.extend(payload_headers.clone());
    let mut rows: Vec<Vec<String>> = summary
        .packed_kv
        .iter()
        .map(|r| {
            let asym = if r.mode == Some(Mode::Asymmetric) {
                " asym"
            } else {
                ""
            };
            let swap = if r.axes == Some(Axes::KFeatureVToken) {
                " swap"
            } else {
                ""
            };
            let mut cells = vec![
                r.group_size.to_string(),
                format!("{}{asym}{swap}", r.bits),
                percent_cell(r.mean_relative_l2_clean),
            ];
            cells.extend(
                p.tokens
                    .iter()
                    .map(|n| bytes_cell(r.payload_bytes.get(&n.to_string()))),
            );
            cells
        })
        .collect();
    let mut baseline = vec!["f32".to_string(), "32".into(), "0.000%".into()];
    baseline.extend(
        p.tokens
            .iter()
            .map(|n| bytes_cell(summary.float32_kv_bytes.get(&n.to_string()))),
    );
    rows.push(baseline);
    tables.push((
        Some("Packed KV"),
        Table {
            name: "packed-KV",
            header,
            rows,
        },
    ));

    // Columns by condition: the distributions, or a model's layers (`l5`).
    let conditions = crate::plan::conditions(p);
    let by_distribution = |first: &str, rows: Vec<DistributionRow>| {
        let mut header = vec![first.to_string()];
        header.extend(conditions.iter().cloned());
        header.extend(payload_headers.clone());
        let rows = rows
            .into_iter()
            .map(|(label, means, payloads)| {
                let mut cells = vec![label];
                cells.extend(
                    conditions
                        .iter()
                        .map(|c| percent_cell(means.get(c).copied())),
                );
                cells.extend(
                    p.tokens
                        .iter()
                        .map(|n| bytes_cell(payloads.get(&n.to_string()))),
                );
                cells
            })
            .collect();
        (header, rows)
    };
    let (header, rows) = by_distribution(
        "setting",
        summary
            .packed_kv
            .iter()
            .map(|r| {
                let setting = crate::protocol::Setting {
                    group_size: r.group_size,
                    bits: r.bits,
                    mode: r.mode.unwrap_or_default(),
                    axes: r.axes.unwrap_or_default(),
                };
                (
                    setting_label(&setting),
                    &r.mean_relative_l2,
                    &r.payload_bytes,
                )
            })
            .collect(),
    );
    tables.push((
        None,
        Table {
            name: "per-distribution",
            header,
            rows,
        },
    ));
    if p.budget.is_some() {
        let (header, rows) = by_distribution(
            "policy",
            summary
                .budget
                .iter()
                .map(|r| (r.policy.to_string(), &r.mean_relative_l2, &r.payload_bytes))
                .collect(),
        );
        tables.push((
            Some("Recent-token precision budget"),
            Table {
                name: "budget",
                header,
                rows,
            },
        ));
    }
    if !summary.timings.is_empty() {
        tables.push((
            Some("Median timings"),
            Table {
                name: "platform",
                header: vec!["target".into(), "rustc".into(), "profile".into()],
                rows: vec![vec![
                    manifest.platform.target.clone(),
                    manifest.tool.rustc.clone(),
                    manifest.tool.profile.clone(),
                ]],
            },
        ));
        let mut header = vec!["config".to_string(), "N".into(), "measurements".into()];
        header.extend(OPERATIONS.iter().map(|op| format!("{op} (ns)")));
        let mut rows: Vec<Vec<String>> = Vec::new();
        for t in &summary.timings {
            let key = [t.config.clone(), t.tokens.to_string()];
            if rows.last().is_none_or(|last| last[..2] != key) {
                let mut cells = key.to_vec();
                cells.push(t.measurements.to_string());
                rows.push(cells);
            }
            rows.last_mut()
                .expect("just pushed")
                .push(thousands(t.median_ns));
        }
        tables.push((
            None,
            Table {
                name: "timings",
                header,
                rows,
            },
        ));
    }
    tables
}

/// Reads summary.md into blocks, or names the first element it does not allow.
pub(crate) fn blocks(text: &str) -> Result<Vec<Block>, MarkdownProblem> {
    let options = Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_GFM;
    let markup = |what: String| MarkdownProblem::Markup { what };
    let mut out = Vec::new();
    let mut text_buf = String::new();
    let mut table: Option<Vec<Vec<String>>> = None;
    let mut image: Option<(String, String)> = None;
    let mut in_image = false;
    for event in Parser::new_ext(text, options) {
        match event {
            Event::Start(Tag::Heading { .. } | Tag::Paragraph | Tag::TableCell) => text_buf.clear(),
            Event::Start(Tag::Table(_)) => table = Some(Vec::new()),
            Event::Start(Tag::TableHead | Tag::TableRow) => {
                table.get_or_insert_with(Vec::new).push(Vec::new());
            }
            Event::Start(Tag::Emphasis | Tag::Strong) => {}
            Event::Start(Tag::Image {
                dest_url, title, ..
            }) => {
                if !title.is_empty() || image.is_some() {
                    return Err(markup(format!(
                        "an image with a title or a second image ({dest_url})"
                    )));
                }
                image = Some((String::new(), dest_url.to_string()));
                in_image = true;
            }
            Event::End(TagEnd::Image) => in_image = false,
            Event::Start(other) => return Err(markup(format!("{other:?}"))),
            Event::End(TagEnd::Heading(level)) => {
                out.push(Block::Heading(level as u8, std::mem::take(&mut text_buf)))
            }
            Event::End(TagEnd::Paragraph) => match image.take() {
                Some((alt, dest)) if text_buf.trim() == alt.trim() => {
                    out.push(Block::Chart { alt, dest })
                }
                Some(_) => return Err(markup("an image inside other text".into())),
                None => out.push(Block::Paragraph(std::mem::take(&mut text_buf))),
            },
            Event::End(TagEnd::TableCell) => {
                if let Some(row) = table.as_mut().and_then(|t| t.last_mut()) {
                    row.push(std::mem::take(&mut text_buf).trim().to_string());
                }
            }
            Event::End(TagEnd::Table) => out.push(Block::Table(table.take().unwrap_or_default())),
            Event::End(_) => {}
            Event::Text(t) | Event::Code(t) => {
                text_buf.push_str(&t);
                if in_image && let Some((alt, _)) = image.as_mut() {
                    alt.push_str(&t);
                }
            }
            Event::SoftBreak | Event::HardBreak => text_buf.push(' '),
            other => return Err(markup(format!("{other:?}"))),
        }
    }
    Ok(out)
}

/// Checks summary.md against the tables the audit expects.
pub fn check(
    text: &str,
    p: &Protocol,
    scope: Scope,
    summary: &Summary,
    manifest: &Manifest,
    report: &mut Report,
) {
    let fail =
        |report: &mut Report, problem: MarkdownProblem| report.fail(Problem::Markdown(problem));
    let blocks = match blocks(text) {
        Ok(blocks) => blocks,
        Err(problem) => return fail(report, problem),
    };
    for block in &blocks {
        let text = match block {
            Block::Heading(_, t) | Block::Paragraph(t) => t,
            Block::Chart { alt, .. } => alt,
            Block::Table(_) => continue,
        };
        if let Some(figure) = figures(text).into_iter().next() {
            let title = format!("Run summary: {}", p.study);
            // The study's name is the one figure-like text allowed: it is checked against the
            // protocol, which bounds it to letters, digits, '-', '_' and '.'.
            if *text != title {
                fail(
                    report,
                    MarkdownProblem::Figure {
                        figure,
                        text: text.clone(),
                    },
                );
            }
        }
    }
    let mut expected = vec![Block::Heading(1, format!("Run summary: {}", p.study))];
    let tables = expected_tables(p, scope, summary, manifest);
    for (heading, table) in &tables {
        if let Some(heading) = heading {
            expected.push(Block::Heading(2, heading.to_string()));
        }
        let mut rows = vec![table.header.clone()];
        rows.extend(table.rows.iter().cloned());
        expected.push(Block::Table(rows));
    }
    expected.push(Block::Chart {
        alt: String::new(),
        dest: CHART.into(),
    });
    let found: Vec<&Block> = blocks
        .iter()
        .filter(|b| !matches!(b, Block::Paragraph(_)))
        .collect();
    let mut table_index = 0;
    let mut cells = 0;
    for (position, want) in expected.iter().enumerate() {
        let Some(got) = found.get(position) else {
            fail(
                report,
                MarkdownProblem::Structure {
                    position,
                    found: "the end".into(),
                    expected: want.describe(),
                },
            );
            return;
        };
        match (got, want) {
            (Block::Table(got_rows), Block::Table(want_rows)) => {
                let name = tables[table_index].1.name;
                table_index += 1;
                let dims = |rows: &Vec<Vec<String>>| (rows.len(), rows.first().map_or(0, Vec::len));
                if dims(got_rows) != dims(want_rows)
                    || got_rows.iter().any(|r| r.len() != want_rows[0].len())
                {
                    fail(
                        report,
                        MarkdownProblem::TableShape {
                            table: name,
                            found: dims(got_rows),
                            expected: dims(want_rows),
                        },
                    );
                    continue;
                }
                let mut first = None;
                for (r, (g, w)) in got_rows.iter().zip(want_rows).enumerate() {
                    for (c, (gc, wc)) in g.iter().zip(w).enumerate() {
                        cells += 1;
                        if gc != wc && first.is_none() {
                            first = Some(MarkdownProblem::Cell {
                                table: name,
                                row: r,
                                column: c,
                                found: gc.clone(),
                                expected: wc.clone(),
                            });
                        }
                    }
                }
                if let Some(problem) = first {
                    fail(report, problem);
                }
            }
            (Block::Chart { dest, .. }, Block::Chart { dest: want, .. }) if dest == want => {}
            (got, want) if got == &want => {}
            (got, want) => {
                fail(
                    report,
                    MarkdownProblem::Structure {
                        position,
                        found: got.describe(),
                        expected: want.describe(),
                    },
                );
                return;
            }
        }
    }
    if found.len() > expected.len() {
        fail(
            report,
            MarkdownProblem::Structure {
                position: expected.len(),
                found: found[expected.len()].describe(),
                expected: "the end".into(),
            },
        );
    }
    report.count(Checked::MarkdownCells, cells);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_numbers_not_words_with_digits() {
        assert_eq!(
            figures("L2 error in float32 on x86_64"),
            Vec::<String>::new()
        );
        assert_eq!(
            figures("12 inputs, 8-bit, 13.4% and 1,024 B."),
            vec!["12", "8", "13.4%", "1,024"]
        );
    }

    #[test]
    fn html_and_links_are_refused() {
        for text in [
            "<!-- | 1 | -->\n",
            "[x](http://a)\n",
            "- item\n",
            "```\n1\n```\n",
            "a[^1]\n\n[^1]: 2\n",
        ] {
            assert!(
                matches!(blocks(text), Err(MarkdownProblem::Markup { .. })),
                "{text}"
            );
        }
    }

    #[test]
    fn a_table_reads_as_its_cells() {
        let parsed = blocks("# T\n\n| a | b |\n|---|--:|\n| 1 | 2,048 B |\n").unwrap();
        assert_eq!(
            parsed,
            vec![
                Block::Heading(1, "T".into()),
                Block::Table(vec![
                    vec!["a".into(), "b".into()],
                    vec!["1".into(), "2,048 B".into()]
                ]),
            ]
        );
    }
}
