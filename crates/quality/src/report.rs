//! summary.md of a model-quality study.
//!
//! As in the packed-KV summary, every figure is in a table and the text between them holds none.
//! The tables: the run (model, texts, tokens scored per text, runs, generated tokens), the
//! quality table (a float32 row, then one row per run averaged over the texts, named by its
//! cache label (`crate::study::run_label`): NLL with 6 decimals, perplexity with 4, the
//! perplexity change against the float32 cache in percent with 3, KL mean and max with 6, top-1
//! agreement in percent with 3, bytes per token with 1 and thousands separators, bits per
//! element with 3), the KL distribution table ([`kl_distribution_table`]), the ranked table ([`crate::frontier`]: per budget of about 2.5, 4.5 and 8.5
//! bits per element, then per schedule, the runs within a bit of it by KL mean, with their rank,
//! bits per element, KL mean, perplexity change, top-1 agreement and whether they lie on their
//! schedule's Pareto frontier), the attention-error table when the protocol asks for it
//! ([`attention_table`]), with a bootstrap the interval and pair tables ([`interval_table`],
//! [`pair_table`]), with `sensitivity` the named runs' spreads under perturbation and their
//! pairs ([`sensitivity_tables`]), with `mechanisms` the mechanisms table ([`mechanisms_table`]), and, when generating, one table per text with each run's first
//! departure from the float32 cache's greedy text and the text itself (in a code span, newlines
//! written `\n`, `|` escaped).

use evidence::format::thousands;
use evidence::table::Table;

use crate::attention_error::AttentionSummary;
use crate::bootstrap::{BootstrapSummary, Interval, RunIntervals};
use crate::frontier::{self, BUDGETS};
use crate::mechanisms::MechanismSummary;
use crate::metrics::POSITION_BANDS;
use crate::sensitivity::SensitivitySummary;
use crate::study::{QualityProtocol, Study, Summary};

/// 1234.5 -> "1,234.5".
fn bytes_cell(x: f64) -> String {
    let text = format!("{x:.1}");
    match text.split_once('.') {
        Some((whole, frac)) => match whole.parse::<usize>() {
            Ok(n) => format!("{}.{frac}", thousands(n)),
            Err(_) => text,
        },
        None => text,
    }
}

/// A byte count per token: "46,080" when whole, else with one decimal ("21,845.3").
pub fn bytes_or_whole(x: f64) -> String {
    if x.fract() == 0.0 && (0.0..9.0e15).contains(&x) {
        thousands(x as usize)
    } else {
        bytes_cell(x)
    }
}

/// `text` as a markdown code span inside a table cell.
pub fn code_cell(text: &str) -> String {
    let body = text
        .replace('\r', "\\r")
        .replace('\n', "\\n")
        .replace('|', "\\|");
    let longest = body.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    if longest == 0 {
        format!("{fence}{body}{fence}")
    } else {
        format!("{fence} {body} {fence}")
    }
}

/// The run table.
pub fn run_table(protocol: &QualityProtocol, study: &Study) -> Table {
    let join = |items: Vec<String>| items.join(", ");
    let mut rows = vec![
        ("model", protocol.model.to_string()),
        (
            "texts",
            join(protocol.texts.iter().map(|t| t.name.clone()).collect()),
        ),
        (
            "tokens scored per text",
            join(
                study
                    .texts
                    .iter()
                    .map(|t| t.ids.len().saturating_sub(1).to_string())
                    .collect(),
            ),
        ),
        ("runs", protocol.runs.len().to_string()),
        (
            "generated tokens",
            protocol.generate.map_or(0, |g| g.tokens).to_string(),
        ),
    ];
    if let Some(g) = protocol.generate {
        rows.push(("prompt tokens", g.prompt_tokens.to_string()));
    }
    if let Some(a) = &protocol.attention {
        rows.push(("attention query stride", a.stride.to_string()));
        rows.push(("Gaussian draws", a.gaussian_seeds.len().to_string()));
    }
    if let Some(b) = &protocol.bootstrap {
        rows.push(("bootstrap resamples", b.resamples.to_string()));
        rows.push(("bootstrap seed", b.seed.to_string()));
    }
    if let Some(spec) = &protocol.sensitivity {
        let sizes = spec
            .perturbations
            .iter()
            .map(|p| format!("{:e} seed {}", p.relative, p.seed))
            .collect();
        rows.push(("perturbations", join(sizes)));
        rows.push(("perturbed runs", spec.runs.len().to_string()));
    }
    Table {
        headers: vec!["quantity".into(), "value".into()],
        rows: rows
            .into_iter()
            .map(|(k, v)| vec![k.to_string(), v])
            .collect(),
    }
}

/// The quality table: the float32 row, then a row per run.
pub fn quality_table(summary: &Summary) -> Table {
    let headers = [
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
    let f = &summary.float32;
    let mut rows = vec![vec![
        "float32".to_string(),
        "-".into(),
        format!("{:.6}", f.nll),
        format!("{:.4}", f.perplexity),
        "0.000%".into(),
        "0".into(),
        "0".into(),
        "100.000%".into(),
        bytes_or_whole(f.bytes_per_token),
        "32.000".into(),
    ]];
    for r in &summary.rows {
        rows.push(vec![
            r.label(),
            r.schedule.clone(),
            format!("{:.6}", r.nll),
            format!("{:.4}", r.perplexity),
            ppl_change(r),
            format!("{:.6}", r.kl_mean),
            format!("{:.6}", r.kl_max),
            format!("{:.3}%", r.top1_agreement * 100.0),
            bytes_cell(r.bytes_per_token),
            format!("{:.3}", r.bits_per_element),
        ]);
    }
    Table {
        headers: headers.iter().map(|h| h.to_string()).collect(),
        rows,
    }
}

fn ppl_change(r: &crate::study::SummaryRow) -> String {
    format!("{:.3}%", (r.perplexity / r.perplexity_f32 - 1.0) * 100.0)
}

/// The KL distribution table: per run, KL's median, 99th and 99.9th percentiles over every
/// scored position of every text, and its mean within each band of positions
/// ([`crate::metrics::POSITION_BANDS`]; a dash for a band no text reaches), all with 6 decimals.
pub fn kl_distribution_table(summary: &Summary) -> Table {
    let mut headers: Vec<String> = ["cache", "schedule", "KL median", "KL 99%", "KL 99.9%"]
        .iter()
        .map(|h| h.to_string())
        .collect();
    for (first, last) in POSITION_BANDS {
        headers.push(match last {
            Some(last) => format!(
                "KL mean, positions {}-{}",
                thousands(first),
                thousands(last)
            ),
            None => format!("KL mean, positions {} on", thousands(first)),
        });
    }
    let rows = summary
        .rows
        .iter()
        .map(|r| {
            let mut row = vec![
                r.label(),
                r.schedule.clone(),
                format!("{:.6}", r.kl_median),
                format!("{:.6}", r.kl_p99),
                format!("{:.6}", r.kl_p999),
            ];
            row.extend(
                r.kl_band_means
                    .iter()
                    .map(|m| m.map_or("-".to_string(), |m| format!("{m:.6}"))),
            );
            row
        })
        .collect();
    Table { headers, rows }
}

/// "2.134% to 7.100%": an interval of fractions, in percent with 3 decimals.
fn percent_interval(i: &Interval) -> String {
    format!("{:.3}% to {:.3}%", i.low * 100.0, i.high * 100.0)
}

/// "0.001234 to 0.005678": an interval with 6 decimals.
fn decimal_interval(i: &Interval) -> String {
    format!("{:.6} to {:.6}", i.low, i.high)
}

/// How reports name an interval row's cache ([`crate::study::run_label`]).
fn interval_label(r: &RunIntervals) -> String {
    crate::study::run_label(
        r.setting.as_deref(),
        r.policy.as_deref(),
        r.scheme.as_deref(),
    )
}

/// The interval table: per run, the perplexity change (percent, 3 decimals), mean KL (6) and
/// top-1 agreement (percent, 3), each beside its 95 % bootstrap interval.
pub fn interval_table(b: &BootstrapSummary) -> Table {
    let headers = [
        "cache",
        "schedule",
        "ppl change",
        "95% interval",
        "KL mean",
        "95% interval",
        "top-1",
        "95% interval",
    ];
    let rows = b
        .runs
        .iter()
        .map(|r| {
            vec![
                interval_label(r),
                r.schedule.clone(),
                format!("{:.3}%", r.perplexity_change.estimate * 100.0),
                percent_interval(&r.perplexity_change),
                format!("{:.6}", r.kl_mean.estimate),
                decimal_interval(&r.kl_mean),
                format!("{:.3}%", r.top1_agreement.estimate * 100.0),
                percent_interval(&r.top1_agreement),
            ]
        })
        .collect();
    Table {
        headers: headers.iter().map(|h| h.to_string()).collect(),
        rows,
    }
}

/// The pair table: per pair of runs (a before b), the difference a - b of NLL (nats, 6
/// decimals), mean KL (6) and top-1 agreement (percentage points, 3), each beside its 95 %
/// bootstrap interval, and which of the three intervals exclude zero (`none` when no one does).
pub fn pair_table(b: &BootstrapSummary) -> Table {
    let headers = [
        "cache a",
        "cache b",
        "NLL a - b",
        "95% interval",
        "KL mean a - b",
        "95% interval",
        "top-1 a - b, points",
        "95% interval",
        "interval excludes zero",
    ];
    let name = |r: usize| format!("{} {}", interval_label(&b.runs[r]), b.runs[r].schedule);
    let points = |i: &Interval| format!("{:.3} to {:.3}", i.low * 100.0, i.high * 100.0);
    let rows = b
        .pairs
        .iter()
        .map(|p| {
            let clear: Vec<&str> = [
                ("NLL", &p.nll_change),
                ("KL", &p.kl_mean),
                ("top-1", &p.top1_agreement),
            ]
            .into_iter()
            .filter(|(_, i)| i.excludes_zero())
            .map(|(n, _)| n)
            .collect();
            vec![
                name(p.a),
                name(p.b),
                format!("{:.6}", p.nll_change.estimate),
                decimal_interval(&p.nll_change),
                format!("{:.6}", p.kl_mean.estimate),
                decimal_interval(&p.kl_mean),
                format!("{:.3}", p.top1_agreement.estimate * 100.0),
                points(&p.top1_agreement),
                if clear.is_empty() {
                    "none".to_string()
                } else {
                    clear.join(", ")
                },
            ]
        })
        .collect();
    Table {
        headers: headers.iter().map(|h| h.to_string()).collect(),
        rows,
    }
}

/// The ranked table: per budget, per schedule, the runs near it by mean KL.
pub fn ranked_table(summary: &Summary) -> Table {
    let on_frontier = frontier::members(summary);
    let mut rows = Vec::new();
    for entry in frontier::ranked(summary) {
        let r = &summary.rows[entry.row];
        rows.push(vec![
            format!("{:.1}", BUDGETS[entry.budget]),
            r.schedule.clone(),
            entry.rank.to_string(),
            r.label(),
            format!("{:.3}", r.bits_per_element),
            format!("{:.6}", r.kl_mean),
            ppl_change(r),
            format!("{:.3}%", r.top1_agreement * 100.0),
            if on_frontier[entry.row] { "yes" } else { "no" }.into(),
        ]);
    }
    Table {
        headers: [
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
        .collect(),
        rows,
    }
}

/// The greedy texts of text `t`: the float32 cache's, then each run's.
pub fn generation_table(study: &Study, t: usize) -> Table {
    let mut rows = Vec::new();
    if let Some(text) = study.texts.get(t).and_then(|x| x.generated_text.as_deref()) {
        rows.push(vec![
            "float32".into(),
            "-".into(),
            "-".into(),
            code_cell(text),
        ]);
    }
    for row in study.rows.iter().filter(|r| r.result.text == t) {
        let r = &row.result;
        let departure = match r.first_departure {
            Some(Some(i)) => i.to_string(),
            _ => "none".into(),
        };
        rows.push(vec![
            r.label(),
            r.schedule.clone(),
            departure,
            code_cell(r.generated_text.as_deref().unwrap_or("")),
        ]);
    }
    Table {
        headers: ["cache", "schedule", "first departure", "generated text"]
            .iter()
            .map(|h| h.to_string())
            .collect(),
        rows,
    }
}

/// The attention-error table: per run, its relative L2 error on the texts' K/V (pooled, least
/// and most) and on the Gaussian draws, in percent with 3 decimals, and the Gaussian caches'
/// bits per element with 3 (dashes without draws); with matched draws, the same four for them.
pub fn attention_table(attention: &AttentionSummary) -> Table {
    let matched = attention.rows.iter().any(|r| r.figures.matched.is_some());
    let mut headers = vec![
        "cache",
        "schedule",
        "model K/V error",
        "least",
        "most",
        "Gaussian error",
        "least",
        "most",
        "Gaussian bits/element",
    ];
    if matched {
        headers.extend(["matched error", "least", "most", "matched bits/element"]);
    }
    let percent = |x: f64| format!("{:.3}%", x * 100.0);
    let bits = |x: f64| format!("{x:.3}");
    let maybe = |x: Option<f64>, f: &dyn Fn(f64) -> String| x.map_or("-".to_string(), f);
    let rows = attention
        .rows
        .iter()
        .map(|r| {
            let f = &r.figures;
            let mut row = vec![
                crate::study::run_label(
                    r.setting.as_deref(),
                    r.policy.as_deref(),
                    r.scheme.as_deref(),
                ),
                r.schedule.clone(),
                percent(f.relative_l2),
                percent(f.relative_l2_min),
                percent(f.relative_l2_max),
                maybe(f.gaussian_relative_l2, &percent),
                maybe(f.gaussian_relative_l2_min, &percent),
                maybe(f.gaussian_relative_l2_max, &percent),
                maybe(f.gaussian_bits_per_element, &bits),
            ];
            if matched {
                let m = f.matched.as_ref();
                row.extend([
                    maybe(m.map(|m| m.matched_relative_l2), &percent),
                    maybe(m.map(|m| m.matched_relative_l2_min), &percent),
                    maybe(m.map(|m| m.matched_relative_l2_max), &percent),
                    maybe(m.map(|m| m.matched_bits_per_element), &bits),
                ]);
            }
            row
        })
        .collect();
    Table {
        headers: headers.iter().map(|h| h.to_string()).collect(),
        rows,
    }
}

/// The mechanisms table: per layer, each measure's mean over the layer's KV heads
/// ([`crate::mechanisms::layer_means`]): the outlier ratios with 2 decimals, the key energy in
/// channel means and the first-token attention in percent with 1.
pub fn mechanisms_table(m: &MechanismSummary) -> Table {
    let headers = [
        "layer",
        "key outlier ratio before RoPE",
        "after RoPE",
        "key energy in channel means",
        "attention on the first token",
    ];
    let rows = m
        .layers
        .iter()
        .enumerate()
        .map(|(l, heads)| {
            let [before, after, energy, sink] = crate::mechanisms::layer_means(heads);
            vec![
                l.to_string(),
                format!("{before:.2}"),
                format!("{after:.2}"),
                format!("{:.1}%", energy * 100.0),
                format!("{:.1}%", sink * 100.0),
            ]
        })
        .collect();
    Table {
        headers: headers.iter().map(|h| h.to_string()).collect(),
        rows,
    }
}

/// The sensitivity tables: per named run its NLL change, KL mean and top-1 agreement, each with
/// its spread under the perturbations (NLL and KL with 6 decimals, top-1 in percent with 3);
/// per pair of named runs (first minus second) the differences and spreads, and the metrics
/// whose difference exceeds its spread.
pub fn sensitivity_tables(protocol: &QualityProtocol, s: &SensitivitySummary) -> [Table; 2] {
    let label = |r: usize| {
        let run = &protocol.runs[r];
        format!("{} {}", run.label(), run.schedule)
    };
    let decimal = |x: f64| format!("{x:.6}");
    let percent = |x: f64| format!("{:.3}%", x * 100.0);
    let runs = Table {
        headers: [
            "cache",
            "NLL change",
            "spread",
            "KL mean",
            "spread",
            "top-1",
            "spread",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect(),
        rows: s
            .runs
            .iter()
            .map(|r| {
                vec![
                    label(r.run),
                    decimal(r.unperturbed.nll_change),
                    decimal(r.spread.nll_change),
                    decimal(r.unperturbed.kl_mean),
                    decimal(r.spread.kl_mean),
                    percent(r.unperturbed.top1_agreement),
                    percent(r.spread.top1_agreement),
                ]
            })
            .collect(),
    };
    let pairs = Table {
        headers: [
            "first",
            "second",
            "NLL difference",
            "spread",
            "KL difference",
            "spread",
            "top-1 difference",
            "spread",
            "beyond the spread",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect(),
        rows: s
            .pairs
            .iter()
            .map(|p| {
                let (d, w) = (p.difference, p.spread);
                let beyond: Vec<&str> = [
                    ("NLL", d.nll_change, w.nll_change),
                    ("KL", d.kl_mean, w.kl_mean),
                    ("top-1", d.top1_agreement, w.top1_agreement),
                ]
                .iter()
                .filter(|(_, d, w)| d.abs() > *w)
                .map(|(name, _, _)| *name)
                .collect();
                vec![
                    label(p.a),
                    label(p.b),
                    decimal(d.nll_change),
                    decimal(w.nll_change),
                    decimal(d.kl_mean),
                    decimal(w.kl_mean),
                    percent(d.top1_agreement),
                    percent(w.top1_agreement),
                    if beyond.is_empty() {
                        "none".to_string()
                    } else {
                        beyond.join(", ")
                    },
                ]
            })
            .collect(),
    };
    [runs, pairs]
}

/// summary.md's text.
pub fn summary_markdown(protocol: &QualityProtocol, study: &Study, summary: &Summary) -> String {
    let mut md = String::new();
    let mut line = |text: &str| {
        md.push_str(text);
        md.push_str("\n\n");
    };
    line(&format!("# Model-quality summary: `{}`", protocol.study));
    line(
        "Every figure of this run is in a table below; the text only says what the tables hold. \
         The model reads each text by teacher forcing, once with the float-precision cache and \
         once per run with a packed cache; NLL is in nats per token, KL is the divergence of the \
         packed cache's next-token distribution from the float-precision one, top-one \
         agreement is the share of positions with the same most likely token, and bytes per \
         token count the cache at the end of the text, from what it stores; bits per element \
         are those bytes over the keys and values they hold. A cache is a setting of this \
         project's codec (with its budget policy after a plus) or a named scheme of the \
         literature. Each row is the mean over the texts (the KL maximum is the largest over \
         them). All per-position numbers are in arrays.npz and every row per text in \
         results.json.",
    );
    line("## Run");
    line(&run_table(protocol, study).to_markdown());
    line("## Quality against the float cache");
    line(&quality_table(summary).to_markdown());
    line("## How KL is spread");
    line(
        "KL over every scored position of every text, as llama.cpp's perplexity tool reports it \
         (its median and upper percentiles, the values sorted and interpolated linearly between \
         neighbours), and its mean within bands of positions, a position being the index of the \
         token a prediction is made from; a dash marks a band that no text reaches. A window or \
         a sink that covers the early positions is judged by the later bands.",
    );
    line(&kl_distribution_table(summary).to_markdown());
    line("## At matched budgets");
    line(
        "For each budget, the runs whose bits per element lie within one bit of it, per \
         schedule, ranked by mean KL (lowest first). A run is on its schedule's frontier when \
         no other run of that schedule, and not the float cache, stores no more bytes with no \
         more KL and is better in one of the two.",
    );
    let ranked = ranked_table(summary);
    if ranked.rows.is_empty() {
        line("No run lies within one bit of a budget.");
    } else {
        line(&ranked.to_markdown());
    }
    if let Some(attention) = &summary.attention {
        line("## Attention error");
        line(
            "What each cache does to every layer's attention output, with the model's own \
             queries: the relative error of the output read from the cache against the output \
             read from the float keys and values, over every layer, query head and query \
             position of the stride in the run table, pooled over the texts, with the smallest \
             and largest text's own. The same for keys, values and queries drawn from a standard \
             normal in the model's shape, pooled over the draws, with their bits per element \
             (the outliers KVQuant keeps depend on the values).",
        );
        if attention.rows.iter().any(|r| r.figures.matched.is_some()) {
            line(
                "The matched draws take the same standard normals and give every channel of \
                 every head and layer the mean and spread of the first text's queries, stored \
                 keys and values: positions stay independent and channels uncorrelated, but \
                 outlier channels and per-channel offsets are the model's.",
            );
        }
        line(&attention_table(attention).to_markdown());
    }
    if let Some(b) = &summary.bootstrap {
        line("## How sure these figures are");
        line(
            "Intervals from a paired bootstrap over the texts: each resample draws as many texts \
             as the study has, with replacement, from the seeded generator in the run table, and \
             every run and every pair of runs is measured on the same draws. An interval holds \
             the central share of the resampled means named in its header. A change or a \
             difference whose interval includes zero is not a finding.",
        );
        line(&interval_table(b).to_markdown());
        let which = match protocol.bootstrap.as_ref().and_then(|b| b.pairs.as_ref()) {
            Some(_) => "Each pair of runs the protocol names",
            None => "Each pair of runs",
        };
        line(&format!(
            "{which}, the first minus the second, with the metrics whose interval excludes zero."
        ));
        line(&pair_table(b).to_markdown());
    }
    if let Some(sensitivity) = &summary.sensitivity {
        line("## How far rounding moves them");
        line(
            "The runs named in the run table read again with every key and value their cache \
             receives multiplied by one plus a seeded normal draw of the relative sizes listed \
             there, about the size of single-precision rounding: how far a correct \
             implementation that rounds differently could move the figures. The spread is the \
             largest move of a mean over the texts. A difference between two runs no larger \
             than its spread is not a finding, whatever its interval.",
        );
        let [runs, pairs] = sensitivity_tables(protocol, sensitivity);
        line(&runs.to_markdown());
        line("Each pair of those runs, the first minus the second.");
        line(&pairs.to_markdown());
    }
    if let Some(m) = &summary.mechanisms {
        line("## What the float keys look like");
        line(
            "Measured on each text's float pass and averaged over the texts and over each \
             layer's key-value heads. A key channel's size is its root mean square over the \
             positions; the outlier ratio is the largest channel's over the median channel's, \
             before and after the rotary position embedding. The key energy in channel means is \
             the share of the keys' mean square carried by each channel's mean, which a \
             per-channel offset puts there and a per-token group must spend its range on. The \
             attention on the first token is the share of every query's attention that goes to \
             the text's first position (an attention sink), over the query heads and every later \
             position. Each head's values are in summary.json and each text's in arrays.npz.",
        );
        line(&mechanisms_table(m).to_markdown());
    }
    if protocol.generate.is_some() {
        line("## Greedy text");
        line(
            "Greedy continuations of each text's first tokens: the float cache's first, then \
             each run's, with the index of the first generated token that departs from it.",
        );
        for (t, text) in protocol.texts.iter().enumerate() {
            line(&format!("### Text `{}`", text.name));
            line(&generation_table(study, t).to_markdown());
        }
    }
    md.push_str("![Mean KL against cache bytes per token](quality-vs-bytes.svg)\n");
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_formatted_as_the_spec_says() {
        assert_eq!(bytes_cell(46080.0), "46,080.0");
        assert_eq!(bytes_cell(5976.25), "5,976.2");
        assert_eq!(code_cell("a|b\nc"), "`a\\|b\\nc`");
        assert_eq!(code_cell("x `y`"), "`` x `y` ``");
    }
}
