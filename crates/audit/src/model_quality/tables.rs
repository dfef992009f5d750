//! summary.md of a model-quality run: the tables it must hold (the run table, the quality table,
//! the ranked table at matched budgets when a run lies near one ([`super::frontier`]), and when
//! generating one table per text), every cell the audit's own rendering, and no figure in free
//! text but the names the protocol bounds.

use super::QUALITY_CHART;
use super::frontier;
use super::protocol::{QualityProtocol, Run};
use super::results::QualityRow;
use super::summary::{Aggregate, POSITION_BANDS};
use crate::common::markdown::{Block, blocks, compare_table, figures};
use crate::common::problem::MarkdownProblem;
use crate::common::report::{Checked, Problem, Report};

/// The float32 cache's bytes per token: "46,080" when whole, else as [`bytes_cell`].
pub(super) fn whole_or_bytes_cell(x: f64) -> String {
    if x.fract() == 0.0 && (0.0..9.0e15).contains(&x) {
        crate::common::text::thousands(x as u64)
    } else {
        bytes_cell(x)
    }
}

/// 46080.0 -> "46,080.0".
pub fn bytes_cell(value: f64) -> String {
    let text = format!("{value:.1}");
    let (whole, fraction) = text.split_once('.').unwrap_or((&text, "0"));
    let (sign, digits) = whole.strip_prefix('-').map_or(("", whole), |d| ("-", d));
    let mut grouped = String::new();
    for (k, c) in digits.chars().enumerate() {
        if k > 0 && (digits.len() - k).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    format!("{sign}{grouped}.{fraction}")
}

/// What summary.md's tables are rendered from: each run's aggregates, and the attention errors,
/// bootstrap intervals and mechanisms when the protocol asks for them.
pub type Expectations<'a> = (
    &'a [Aggregate],
    Option<&'a [super::attention::Expected]>,
    Option<&'a super::bootstrap::Expected>,
    Option<&'a [Vec<super::mechanisms::Measures>]>,
    Option<&'a super::sensitivity::Expected>,
);

/// The tables summary.md must hold, in order: the run table, the quality table, the KL spread
/// table (median, percentiles, band means), the ranked table when a run is near a budget, the
/// attention table with an `attention` block, and when generating one table per text.
pub fn expected_tables(
    p: &QualityProtocol,
    runs: &[Run],
    tokens: &[usize],
    (aggregates, attention, bootstrap, mechanisms, sensitivity): Expectations<'_>,
    rows: &[QualityRow],
) -> Vec<(&'static str, Vec<Vec<String>>)> {
    let join = |items: Vec<String>| items.join(", ");
    let mut run_table = vec![
        vec!["quantity".to_string(), "value".into()],
        vec!["model".into(), p.model.clone()],
        vec![
            "texts".into(),
            join(p.texts.iter().map(|t| t.name.clone()).collect()),
        ],
        vec![
            "tokens scored per text".into(),
            join(tokens.iter().map(|t| (t - 1).to_string()).collect()),
        ],
        vec!["runs".into(), runs.len().to_string()],
        vec![
            "generated tokens".into(),
            p.generate.map_or(0, |g| g.tokens).to_string(),
        ],
    ];
    if let Some(g) = p.generate {
        run_table.push(vec!["prompt tokens".into(), g.prompt_tokens.to_string()]);
    }
    if let Some(block) = &p.attention {
        run_table.push(vec![
            "attention query stride".into(),
            block.stride.to_string(),
        ]);
        run_table.push(vec![
            "Gaussian draws".into(),
            block.gaussian_seeds.len().to_string(),
        ]);
    }
    if let Some(block) = &p.bootstrap {
        run_table.push(vec![
            "bootstrap resamples".into(),
            block.resamples.to_string(),
        ]);
        run_table.push(vec!["bootstrap seed".into(), block.seed.to_string()]);
    }
    if let Some(block) = &p.sensitivity {
        let sizes: Vec<String> = block
            .perturbations
            .iter()
            .map(|q| format!("{:e} seed {}", q.relative, q.seed))
            .collect();
        run_table.push(vec!["perturbations".into(), join(sizes)]);
        run_table.push(vec!["perturbed runs".into(), block.runs.len().to_string()]);
    }
    let mut tables = vec![("run", run_table)];
    let header = [
        "cache",
        "schedule",
        "NLL",
        "perplexity",
        "ppl change",
        "KL mean",
        "KL max",
        "top-1",
        "bytes/token",
        "bits/element",
    ];
    let mut quality = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    if let Some(first) = aggregates.first() {
        quality.push(vec![
            "float32".into(),
            "-".into(),
            format!("{:.6}", first.nll_f32),
            format!("{:.4}", first.perplexity_f32()),
            "0.000%".into(),
            "0".into(),
            "0".into(),
            "100.000%".into(),
            whole_or_bytes_cell(first.float32_bytes_per_token),
            "32.000".into(),
        ]);
    }
    let change = |a: &Aggregate| {
        format!(
            "{:.3}%",
            (a.perplexity() / a.perplexity_f32() - 1.0) * 100.0
        )
    };
    for (run, a) in runs.iter().zip(aggregates) {
        quality.push(vec![
            run.label(),
            run.schedule.to_string(),
            format!("{:.6}", a.nll),
            format!("{:.4}", a.perplexity()),
            change(a),
            format!("{:.6}", a.kl_mean),
            format!("{:.6}", a.kl_max),
            format!("{:.3}%", a.top1_agreement * 100.0),
            bytes_cell(a.bytes_per_token),
            format!("{:.3}", a.bits_per_element()),
        ]);
    }
    tables.push(("quality", quality));
    let mut spread = vec![
        ["cache", "schedule", "KL median", "KL 99%", "KL 99.9%"]
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>(),
    ];
    let count = |n: usize| crate::common::text::thousands(n as u64);
    for (first, last) in POSITION_BANDS {
        spread[0].push(match last {
            Some(last) => format!("KL mean, positions {}-{}", count(first), count(last)),
            None => format!("KL mean, positions {} on", count(first)),
        });
    }
    for (run, a) in runs.iter().zip(aggregates) {
        let (median, p99, p999) = a.kl_statistics;
        let mut row = vec![
            run.label(),
            run.schedule.to_string(),
            format!("{median:.6}"),
            format!("{p99:.6}"),
            format!("{p999:.6}"),
        ];
        for band in &a.kl_band_means {
            row.push(band.map_or("-".into(), |m| format!("{m:.6}")));
        }
        spread.push(row);
    }
    tables.push(("KL spread", spread));
    let lines = frontier::ranked(runs, aggregates);
    if !lines.is_empty() {
        let on = frontier::on_frontier(runs, aggregates);
        let mut ranked = vec![
            [
                "budget (bits)",
                "schedule",
                "rank",
                "cache",
                "bits/element",
                "KL mean",
                "ppl change",
                "top-1",
                "on frontier",
            ]
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>(),
        ];
        for (b, r, rank) in lines {
            let a = &aggregates[r];
            ranked.push(vec![
                format!("{:.1}", frontier::BUDGETS[b]),
                runs[r].schedule.to_string(),
                rank.to_string(),
                runs[r].label(),
                format!("{:.3}", a.bits_per_element()),
                format!("{:.6}", a.kl_mean),
                change(a),
                format!("{:.3}%", a.top1_agreement * 100.0),
                if on[r] { "yes" } else { "no" }.into(),
            ]);
        }
        tables.push(("ranked", ranked));
    }
    if let Some(block) = &p.attention {
        // Without the archived entries there is nothing to render; the table is then
        // expected with its header only, and the arrays' problem is reported with them.
        let expected = attention.unwrap_or(&[]);
        let table = super::attention::table(runs, expected, block.matched);
        tables.push(("attention", table));
    }
    if p.bootstrap.is_some() {
        // Without every run's derived rows there is nothing to render: headers only, the
        // rows' problems reported where they are derived.
        let empty = super::bootstrap::Expected {
            runs: Vec::new(),
            pairs: Vec::new(),
        };
        let [intervals, pairs] = super::bootstrap::tables(runs, bootstrap.unwrap_or(&empty));
        tables.push(("bootstrap intervals", intervals));
        tables.push(("bootstrap pairs", pairs));
    }
    if p.sensitivity.is_some() {
        // Without the archived passes: headers only, their problems reported with the arrays.
        let empty = super::sensitivity::Expected {
            runs: Vec::new(),
            pairs: Vec::new(),
        };
        let [by_run, pairs] = super::sensitivity::tables(runs, sensitivity.unwrap_or(&empty));
        tables.push(("sensitivity runs", by_run));
        tables.push(("sensitivity pairs", pairs));
    }
    if p.mechanisms {
        // Without the archived measures: headers only, their problems reported with the arrays.
        tables.push((
            "mechanisms",
            super::mechanisms::table(mechanisms.unwrap_or(&[])),
        ));
    }
    if p.generate.is_some() {
        let shown = |text: &str| {
            text.replace('\r', "\\r")
                .replace('\n', "\\n")
                .trim()
                .to_string()
        };
        for i in 0..tokens.len() {
            let mut table = vec![
                ["cache", "schedule", "first departure", "generated text"]
                    .iter()
                    .map(|h| h.to_string())
                    .collect::<Vec<_>>(),
            ];
            let text_rows: Vec<&QualityRow> = rows.iter().filter(|r| r.text == i).collect();
            if let Some(first) = text_rows.first() {
                table.push(vec![
                    "float32".into(),
                    "-".into(),
                    "-".into(),
                    shown(first.f32_generated_text.as_deref().unwrap_or("")),
                ]);
            }
            for (row, run) in text_rows.into_iter().zip(runs) {
                let departure = match &row.first_departure {
                    Some(serde_json::Value::Number(n)) => n.to_string(),
                    _ => "none".into(),
                };
                table.push(vec![
                    run.label(),
                    row.schedule.clone(),
                    departure,
                    shown(row.generated_text.as_deref().unwrap_or("")),
                ]);
            }
            tables.push(("generation", table));
        }
    }
    tables
}

pub(super) fn check_markdown(
    text: &str,
    p: &QualityProtocol,
    runs: &[Run],
    tokens: &[usize],
    aggregates: Expectations<'_>,
    rows: &[QualityRow],
    report: &mut Report,
) {
    let fail =
        |report: &mut Report, problem: MarkdownProblem| report.fail(Problem::Markdown(problem));
    let blocks = match blocks(text) {
        Ok(blocks) => blocks,
        Err(problem) => return fail(report, problem),
    };
    // Names the protocol bounds (the study's and the texts') may hold digits; nothing else in
    // free text may.
    let mut names: Vec<&str> = p.texts.iter().map(|t| t.name.as_str()).collect();
    names.push(&p.study);
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    let mut found_tables = Vec::new();
    for block in &blocks {
        let text = match block {
            Block::Heading(_, t) | Block::Paragraph(t) => t.clone(),
            Block::Chart { alt, dest } => {
                if dest != QUALITY_CHART {
                    fail(
                        report,
                        MarkdownProblem::Markup {
                            what: format!("an image of {dest:?}"),
                        },
                    );
                }
                alt.clone()
            }
            Block::Table(rows) => {
                found_tables.push(rows);
                continue;
            }
        };
        let mut stripped = text.clone();
        for name in &names {
            stripped = stripped.replace(name, " ");
        }
        if let Some(figure) = figures(&stripped).into_iter().next() {
            fail(report, MarkdownProblem::Figure { figure, text });
        }
    }
    let expected = expected_tables(p, runs, tokens, aggregates, rows);
    if found_tables.len() != expected.len() {
        fail(
            report,
            MarkdownProblem::Structure {
                position: found_tables.len().min(expected.len()),
                found: format!("{} tables", found_tables.len()),
                expected: format!("{} tables", expected.len()),
            },
        );
    }
    let mut cells = 0;
    for (got, (name, want)) in found_tables.iter().zip(&expected) {
        let (compared, problem) = compare_table(name, got, want);
        cells += compared;
        if let Some(problem) = problem {
            fail(report, problem);
        }
    }
    report.count(Checked::MarkdownCells, cells);
}
