//! Model-quality studies of the literature's schemes: the audit re-runs each scheme family
//! (KIVI, quanto, llama.cpp with its rotation, this project's codec, KVQuant with its calibration
//! re-fitted on the protocol's calibration text) with its own implementation and requires every
//! value bit for bit, so a study whose scheme's codes were changed FAILs, for each family, even
//! with every downstream figure recomputed by the study's own code and every hash rewritten.
//! The same holds for each run's attention error, on the text's K/V, on a Gaussian draw and on
//! the draw matched to the text's per-channel statistics.

use std::path::Path;
use std::sync::OnceLock;

use audit::Problem;
use audit::common::problem::ChartProblem;
use models::llama::{HookError, KvSource, LayerKv};
use quality::scheme::{Cache, LayerCost};
use quality::study::{QualityProtocol, run_study_with};

use crate::support::{
    AnyArray, array, assert_pass, assert_problem, copy_of, edit_arrays, rehash, workspace,
};

/// One run per family, on 140 ids: more than KIVI's residual of 128, so that prefill quantizes
/// the first tokens' values under KIVI and quanto's first flush has happened while decoding; and
/// the codec with float32 values (keys only) and on one layer only.
const SCHEMES: &str = r#"{
  "study": "tiny-schemes",
  "model": "smollm2",
  "texts": [ { "name": "formats", "text": "**Bit streams** (`bitpack/src/stream.rs`): a b-bit code stream, b from 1 to 8, puts element i at bits [i*b, (i+1)*b) of a little-endian stream, counting from bit 0 of byte 0 (equivalently of 32-bit word 0). At 4 bits that is the nibble order: `byte i = code[2i] | code[2i+1] << 4`, the even element in the low nibble; codes 2 and 13 form byte `0xD2`, which decodes to -5 and 6 before scaling. 3-, 5-, 6- and 7-bit codes straddle bytes and words. A plain one-value-at-a-time packer is the oracle; the fast packers are tested against it on patterned, random and all-maximum codes at every width and on odd lengths." } ],
  "max_tokens": 140,
  "runs": [
    { "scheme": "kivi2", "schedule": "prefill" },
    { "scheme": "hf-quanto4", "schedule": "streaming" },
    { "scheme": "llamacpp-q4_0+rot", "schedule": "prefill" },
    { "scheme": "llamacpp-iq4_nl", "schedule": "causal" },
    { "scheme": "kvpack-k4v4-sink4", "schedule": "streaming" },
    { "scheme": "kvquant4-first1", "schedule": "prefill" },
    { "scheme": "kvpack-k4v32", "schedule": "prefill" },
    { "scheme": "kvpack-k2v2-layer3", "schedule": "streaming" }
  ],
  "attention": { "stride": 20, "gaussian_seeds": [7], "calibration_seed": 8, "matched": true },
  "calibration": { "name": "harbour", "text": "The harbour town woke slowly in winter. Before dawn the bakers lit their ovens, and the smell of bread drifted down the narrow streets towards the water, where the fishing boats rocked against the stone quay. Old men in heavy coats gathered by the harbour wall to argue about the weather, the price of diesel and the football results, as their fathers had argued before them. By eight o'clock the children were running to school along the sea front, their bags bouncing, stopping only to throw pebbles at the gulls that sat on the railings. The ferry to the islands left at nine, twice a week in the cold months, carrying post, groceries, a doctor on Tuesdays and whatever visitors had come to walk the cliffs. Most of the shops on the high street kept short hours until Easter: the bookshop opened at eleven, the chandlery when its owner remembered, and the cafe only on days when the sun came out. In the afternoons the light turned silver over the bay and the tide went out across the sands, leaving pools where herons stood without moving for an hour at a time. Walkers came down from the hills with muddy boots and red faces, asking for tea and directions to the bus. When the lamps came on along the promenade the town grew quiet again; a few windows glowed above the harbour, a radio played somewhere behind a curtain, and the boats knocked gently against their moorings until morning." }
}"#;

/// The run ids, in protocol order.
const IDS: [&str; 8] = [
    "t0_kivi2_prefill",
    "t0_hf-quanto4_streaming",
    "t0_llamacpp-q4_0-rot_prefill",
    "t0_llamacpp-iq4_nl_causal",
    "t0_kvpack-k4v4-sink4_streaming",
    "t0_kvquant4-first1_prefill",
    "t0_kvpack-k4v32_prefill",
    "t0_kvpack-k2v2-layer3_streaming",
];

/// A layer's cache with one code changed: at layer 0, head 0, the value of position 0 reads
/// feature 0 as the first of features 1..32 (its block or group) that reads differently, for
/// every query, as if its code had been written as that one's.
struct Forged {
    inner: Box<dyn KvSource>,
    rows: Vec<Vec<f32>>,
}

impl KvSource for Forged {
    fn key(&self, head: usize, query: usize, position: usize) -> &[f32] {
        self.inner.key(head, query, position)
    }
    fn value(&self, head: usize, query: usize, position: usize) -> &[f32] {
        match self.rows.get(query) {
            Some(row) if head == 0 && position == 0 => row,
            _ => self.inner.value(head, query, position),
        }
    }
}

fn forged_layer(
    cache: &Cache,
    (layer, layers): (usize, usize),
    window: Option<usize>,
    kv: &LayerKv<'_>,
) -> Result<(Box<dyn KvSource>, LayerCost), HookError> {
    let (inner, bytes) = cache.layer((layer, layers), window, kv)?;
    if layer != 0 {
        return Ok((inner, bytes));
    }
    let tokens = kv.k.dim().1;
    let rows = (0..tokens)
        .map(|q| {
            let mut row = inner.value(0, q, 0).to_vec();
            let other = (1..32)
                .find(|&f| row[f] != row[0])
                .expect("a code that differs");
            row[0] = row[other];
            row
        })
        .collect();
    Ok((Box::new(Forged { inner, rows }), bytes))
}

/// The honest study and the forged one, each written by the study's own code.
fn studies() -> &'static (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    static STUDIES: OnceLock<(tempfile::TempDir, std::path::PathBuf, std::path::PathBuf)> =
        OnceLock::new();
    STUDIES.get_or_init(|| {
        let files = models::files::locate_or_fetch(models::ModelName::SmolLm2)
            .expect("the model is available");
        let decoder = quality::decoder::Decoder::load(&files).unwrap();
        let protocol = QualityProtocol::from_json(SCHEMES).unwrap();
        let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let write = |name: &str, study| {
            let dir = tmp.path().join(name);
            quality::write::write(&dir, &protocol, "a test protocol".into(), study, 2).unwrap();
            dir
        };
        let honest = quality::study::run_study(&protocol, &decoder, 2, &|_| {}).unwrap();
        let forged = run_study_with(&protocol, &decoder, 2, &|_| {}, &forged_layer).unwrap();
        // The forgery changed what every run scored.
        for (a, b) in honest.rows.iter().zip(&forged.rows) {
            assert_ne!(a.logp, b.logp, "{}", a.result.id);
        }
        let honest = write("honest", &honest);
        let forged = write("forged", &forged);
        (tmp, honest, forged)
    })
}

fn audit(dir: &Path) -> audit::Report {
    audit::audit_dir(dir, &workspace())
}

#[test]
fn a_study_of_every_scheme_family_passes_with_every_pass_re_run() {
    let report = audit(&studies().1);
    assert_pass(&report);
    // The float32 pass, each run's, the calibration pass, the Gaussian draw and its matched
    // twin.
    assert_eq!(
        report.counted(audit::common::report::Checked::PassesRerun),
        1 + IDS.len() + 1 + 2
    );
    assert_eq!(
        report.counted(audit::common::report::Checked::OutlierCounts),
        30
    );
    // The one-layer probe is scored and tabled but not charted; the float32-value run is.
    let chart = std::fs::read_to_string(studies().1.join("quality-vs-bytes.svg")).unwrap();
    assert!(!chart.contains("kvpack-k2v2-layer3"));
    assert!(chart.contains(r#"data-scheme="kvpack-k4v32""#));
}

#[test]
fn a_probe_drawn_into_the_chart_fails() {
    let (_tmp, dir) = copy_of(&studies().1);
    let path = dir.join("quality-vs-bytes.svg");
    let chart = std::fs::read_to_string(&path).unwrap();
    // The k4v32 marker, its scheme renamed to the probe's: a marker the chart must not hold.
    let start = chart
        .find(r#"<g class="marker" data-scheme="kvpack-k4v32""#)
        .unwrap();
    let end = start + chart[start..].find("</g>").unwrap() + "</g>".len();
    let probe = chart[start..end].replace("kvpack-k4v32", "kvpack-k2v2-layer3");
    std::fs::write(&path, format!("{}{probe}{}", &chart[..end], &chart[end..])).unwrap();
    rehash(&dir);
    // The chart is re-drawn from the arrays without the model.
    let report = audit::audit_dir_with(&dir, &workspace(), &audit::Options::without_models());
    // One marker too many in the prefill panel.
    assert_problem(&report, "probe marker", |p| {
        matches!(p, Problem::QualityChart(ChartProblem::Marker { .. }))
    });
}

#[test]
fn a_changed_code_fails_the_re_run_for_each_scheme_family() {
    let report = audit(&studies().2);
    for id in IDS {
        let logp = format!("{id}_logp");
        assert_problem(
            &report,
            id,
            |p| matches!(p, Problem::Rerun { pass, array, .. } if pass == id && *array == logp),
        );
        // The attention error at layer 0 (the forged one), on the text and on both draws.
        for member in [
            format!("{id}_attention"),
            format!("g0{}_attention", &id[2..]),
            format!("m0{}_attention", &id[2..]),
        ] {
            assert_problem(
                &report,
                &member,
                |p| matches!(p, Problem::Rerun { array, index: 0, .. } if *array == member),
            );
        }
    }
    // The forgery touched layer 0's cache, not the calibration; layer 0's outliers are the
    // honest cache's (later layers read what the forged layer passed on, so theirs may differ).
    let touched = |p: &Problem| match p {
        Problem::Rerun {
            pass, array, index, ..
        } => pass == "calibration" || (array.ends_with("_outliers") && *index == 0),
        Problem::Value { array, .. } => array.starts_with("calibration"),
        _ => false,
    };
    assert!(!report.problems.iter().any(touched), "{}", report.render());
}

/// A forger who edits KVQuant's archived calibration and outlier counts (and rewrites the
/// hashes) is caught by the calibration re-fit and the pass's own counts; the outlier counts
/// also decide the bytes, so results.json's figure no longer derives from the arrays.
#[test]
fn an_edited_calibration_or_outlier_count_fails_the_re_run() {
    let (_tmp, dir) = copy_of(&studies().1);
    let id = "t0_kvquant4-first1_prefill";
    edit_arrays(&dir, |arrays| {
        let AnyArray::F32(levels) = array(arrays, "calibration_kvquant4-first1_value_levels")
        else {
            panic!("float32 levels")
        };
        levels[[3, 5]] = f32::from_bits(levels[[3, 5]].to_bits() + 1);
        let AnyArray::F32(upper) = array(arrays, "calibration_kvquant4-first1_key_upper") else {
            panic!("float32 thresholds")
        };
        // The next fp16 value, widened.
        let x = half::f16::from_f32(upper[[7, 11]]);
        upper[[7, 11]] = half::f16::from_bits(x.to_bits() + 1).to_f32();
        let AnyArray::I64(outliers) = array(arrays, &format!("{id}_outliers")) else {
            panic!("int64 counts")
        };
        outliers[[0]] += 1;
    });
    rehash(&dir);
    let report = audit(&dir);
    for (name, index) in [
        ("calibration_kvquant4-first1_key_upper", 7 * 192 + 11),
        ("calibration_kvquant4-first1_value_levels", 3 * 16 + 5),
    ] {
        assert_problem(&report, name, |p| {
            matches!(p, Problem::Rerun { pass, array, index: i, .. }
                if pass == "calibration" && array == name && *i == index)
        });
    }
    let outliers = format!("{id}_outliers");
    assert_problem(
        &report,
        &outliers,
        |p| matches!(p, Problem::Rerun { pass, array, index: 0, .. } if pass == id && *array == outliers),
    );
    assert_problem(
        &report,
        "bytes_per_token",
        |p| matches!(p, Problem::Metric { id: row, field: "bytes_per_token", .. } if row == id),
    );
}

/// A sampled audit re-fits KVQuant's calibration exactly when it re-runs a KVQuant pass, and
/// says so when it does not; every sample of the honest study passes.
#[test]
fn a_sample_without_a_kvquant_pass_leaves_the_calibration_out_and_says_so() {
    let dir = &studies().1;
    let kvquant = "t0_kvquant4-first1_prefill";
    let mut seen = Vec::new();
    // Of this study's 9 passes, growing samples until one misses the KVQuant run and one holds
    // it (the sample is chosen by arrays.npz's hash, so which k does which is the archive's).
    for k in 1..9 {
        if seen.contains(&true) && seen.contains(&false) {
            break;
        }
        let options = audit::Options {
            sample: Some(k),
            ..audit::Options::default()
        };
        let report = audit::audit_dir_with(dir, &workspace(), &options);
        assert_pass(&report);
        let chosen: Vec<String> = report
            .notes
            .iter()
            .find_map(|n| match n {
                audit::Note::Sampled { passes, .. } => Some(passes.clone()),
                _ => None,
            })
            .expect("a sample of fewer than all 9 passes");
        let sampled_kvquant = chosen.iter().any(|p| p == kvquant);
        let left_out = report.notes.contains(&audit::Note::CalibrationNotSampled);
        assert_eq!(left_out, !sampled_kvquant, "sample of {k}: {chosen:?}");
        seen.push(sampled_kvquant);
    }
    // Both cases occurred.
    assert!(seen.contains(&true) && seen.contains(&false), "{seen:?}");
}

/// A forger who edits one run's attention error (one bit of one layer's entry, on the text or
/// on the Gaussian draw), or its figure in summary.json or summary.md, is named; the Gaussian
/// draw is re-derived without the model.
#[test]
fn an_edited_attention_error_is_named_where_it_was_edited() {
    let id = "t0_llamacpp-q4_0-rot_prefill";
    let gaussian = "g0_llamacpp-q4_0-rot_prefill_attention";
    let (_tmp, dir) = copy_of(&studies().1);
    edit_arrays(&dir, |arrays| {
        for name in [format!("{id}_attention"), gaussian.to_string()] {
            let AnyArray::F64(entries) = array(arrays, &name) else {
                panic!("float64 entries")
            };
            entries[[4, 1]] = f64::from_bits(entries[[4, 1]].to_bits() ^ 1);
        }
    });
    rehash(&dir);
    let report = audit(&dir);
    let text_member = format!("{id}_attention");
    assert_problem(
        &report,
        &text_member,
        |p| matches!(p, Problem::Rerun { array, index: 9, .. } if *array == text_member),
    );
    let without_model =
        audit::audit_dir_with(&dir, &workspace(), &audit::Options::without_models());
    assert_problem(
        &without_model,
        gaussian,
        |p| matches!(p, Problem::Rerun { array, index: 9, .. } if array == gaussian),
    );

    let (_tmp, dir) = copy_of(&studies().1);
    crate::support::edit_json(&dir, "summary.json", |s| {
        let row = &mut s["attention"]["rows"][2];
        let x = row["gaussian_relative_l2"].as_f64().unwrap();
        row["gaussian_relative_l2"] = serde_json::json!(x * 0.9);
    });
    crate::support::edit_text(&dir, "summary.md", |md| {
        let table = md.find("## Attention error").expect("the attention table");
        let at = table + md[table..].find("| llamacpp-q4_0+rot").expect("its row");
        let at = at + md[at..].find('%').expect("a percent cell");
        let mut md = md;
        // The digit before the first percent sign of the row: its model K/V error.
        md.replace_range(at - 1..at, if &md[at - 1..at] == "7" { "8" } else { "7" });
        md
    });
    rehash(&dir);
    let report = audit::audit_dir_with(&dir, &workspace(), &audit::Options::without_models());
    assert_problem(&report, "summary", |p| {
        matches!(p, Problem::Summary { place, .. }
            if place == "attention llamacpp-q4_0+rot prefill gaussian_relative_l2")
    });
    assert_problem(&report, "cell", |p| {
        matches!(
            p,
            Problem::Markdown(audit::common::problem::MarkdownProblem::Cell {
                table: "attention",
                row: 3,
                ..
            })
        )
    });
}

/// The matched draw follows the first text's per-channel statistics, which the archive holds: a
/// forger who edits one (and rewrites the hashes) is caught twice, by the matched entries
/// re-derived from the edited statistics (without the model), and by the float32 pass that
/// measures them again; an edited matched entry is named. Refused before anything is drawn: a
/// negative spread.
#[test]
fn an_edited_matched_statistic_or_entry_is_named() {
    let matched = "m0_llamacpp-q4_0-rot_prefill_attention";
    let (_tmp, dir) = copy_of(&studies().1);
    edit_arrays(&dir, |arrays| {
        let AnyArray::F64(stats) = array(arrays, "matched_k_stats") else {
            panic!("float64 statistics")
        };
        // Layer 2, KV head 1, channel 5: its mean moved by one part in a thousand.
        stats[[2, 1, 5, 0]] *= 1.001;
    });
    rehash(&dir);
    let report = audit(&dir);
    // Flattened [layers, kv_heads, head_dim, 2] of SmolLM2 (3 KV heads of 64).
    let index = ((2 * 3 + 1) * 64 + 5) * 2;
    assert_problem(&report, "matched_k_stats", |p| {
        matches!(p, Problem::Rerun { pass, array, index: i, .. }
            if pass == "t0_f32" && array == "matched_k_stats" && *i == index)
    });
    let without_model =
        audit::audit_dir_with(&dir, &workspace(), &audit::Options::without_models());
    // Layer 2's entry of every run moves (layers 0 and 1 do not).
    assert_problem(
        &without_model,
        matched,
        |p| matches!(p, Problem::Rerun { array, index, .. } if array == matched && *index >= 4),
    );

    let (_tmp, dir) = copy_of(&studies().1);
    edit_arrays(&dir, |arrays| {
        let AnyArray::F64(entries) = array(arrays, matched) else {
            panic!("float64 entries")
        };
        entries[[7, 0]] = f64::from_bits(entries[[7, 0]].to_bits() ^ 1);
    });
    rehash(&dir);
    let report = audit::audit_dir_with(&dir, &workspace(), &audit::Options::without_models());
    assert_problem(
        &report,
        matched,
        |p| matches!(p, Problem::Rerun { array, index: 14, .. } if array == matched),
    );

    let (_tmp, dir) = copy_of(&studies().1);
    edit_arrays(&dir, |arrays| {
        let AnyArray::F64(stats) = array(arrays, "matched_v_stats") else {
            panic!("float64 statistics")
        };
        stats[[0, 0, 3, 1]] = -0.5;
    });
    rehash(&dir);
    let report = audit::audit_dir_with(&dir, &workspace(), &audit::Options::without_models());
    assert_problem(
        &report,
        "matched_v_stats",
        |p| matches!(p, Problem::Value { array, index: 7, .. } if array == "matched_v_stats"),
    );
}
