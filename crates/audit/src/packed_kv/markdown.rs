//! summary.md: what a reader sees, checked cell by cell.
//!
//! summary.md is designed to be checkable: every figure is in a table, and the text between the
//! tables has none. The audit parses it as GitHub does (CommonMark with GitHub's tables,
//! footnotes, task lists and strikethrough, through `pulldown-cmark`: [`crate::common::markdown`])
//! and requires:
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

pub use crate::common::problem::MarkdownProblem;

use crate::common::markdown::{Block, blocks, compare_table};
use crate::common::report::{Checked, Problem, Report};
pub use crate::common::text::figures;
use crate::common::text::{percent, thousands};
use crate::packed_kv::manifest::{Manifest, Scope};
use crate::packed_kv::plan::setting_label;
use crate::packed_kv::protocol::{Axes, Mode, Protocol};
use crate::packed_kv::summary::Summary;
use crate::packed_kv::timings::OPERATIONS;

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
    let inputs = crate::packed_kv::plan::inputs_of(p, scope.shard).len();
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
    let conditions = crate::packed_kv::plan::conditions(p);
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
                let setting = crate::packed_kv::protocol::Setting {
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
                let (compared, problem) = compare_table(name, got_rows, want_rows);
                cells += compared;
                if let Some(problem) = problem {
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
