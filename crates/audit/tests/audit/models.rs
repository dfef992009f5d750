//! Runs whose inputs come from a real model's K/V cache. The audit re-runs the model from the
//! pinned weights and requires the archived q, k and v bit for bit, re-tokenizes the texts and
//! requires the recorded ids, checks everything computed from them, and holds the manifest's
//! model record (weight hash, token ids) to its own pins and to the run. A small
//! MiniLM run (one text, N = 40, layers 0 and 5, one KV head, a swapped and an asymmetric
//! setting, two budget policies), made once with the runner's library, altered as a forger would.
//!
//! The model is found as the runner finds it (`$KVPACK_MODELS`, else `model-cache/` at the
//! workspace root) and fetched on first use.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use audit::common::report::{Checked, Note};
use audit::packed_kv::chart::ChartProblem;
use audit::packed_kv::markdown::MarkdownProblem;
use audit::{Models, Options, Problem, Verdict};
use models::ModelName;

use crate::support::{
    array, assert_pass, assert_problem, audit, copy_of, edit_arrays, edit_json, edit_text,
    make_run, make_shard, rehash, workspace,
};

/// ~300 words, long enough for either model's 40 tokens.
const TEXT: &str = include_str!("../data/models/harbour.txt");

/// A MiniLM protocol: an encoder, so two query positions of the head's own query head.
fn minilm_protocol() -> String {
    serde_json::json!({
        "study": "audit-minilm",
        "tokens": [40],
        "features": 32,
        "queries": 2,
        "settings": [
            { "group_size": 8, "bits": 4, "axes": "k_feature_v_token" },
            { "group_size": 8, "bits": 3, "mode": "asymmetric" }
        ],
        "budget": { "group_size": 8, "low_bits": 2, "window": 8,
                    "policies": ["uniform", "recent_f32"] },
        "model": { "name": "minilm", "texts": [{ "name": "harbour", "text": TEXT }],
                   "layers": [0, 5], "kv_heads": [0] }
    })
    .to_string()
}

/// A SmolLM2 protocol: a decoder, so its queries are the 3 query heads of the KV head at the
/// last position; its first and last layers.
fn smollm2_protocol() -> String {
    serde_json::json!({
        "study": "audit-smollm2",
        "tokens": [40],
        "features": 64,
        "queries": 3,
        "settings": [
            { "group_size": 8, "bits": 4, "axes": "k_feature_v_token" },
            { "group_size": 8, "bits": 3, "mode": "asymmetric" }
        ],
        "budget": { "group_size": 8, "low_bits": 2, "window": 8,
                    "policies": ["uniform", "recent8"] },
        "model": { "name": "smollm2", "texts": [{ "name": "harbour", "text": TEXT }],
                   "layers": [0, 29], "kv_heads": [0] }
    })
    .to_string()
}

/// A Gemma 3 protocol: one KV head of 256 read by 4 query heads at the last position; a
/// sliding layer (0) and a global one (5).
fn gemma3_protocol() -> String {
    serde_json::json!({
        "study": "audit-gemma3",
        "tokens": [40],
        "features": 256,
        "queries": 4,
        "settings": [ { "group_size": 32, "bits": 4 } ],
        "model": { "name": "gemma3", "texts": [{ "name": "harbour", "text": TEXT }],
                   "layers": [0, 5], "kv_heads": [0] }
    })
    .to_string()
}

/// The folder holding `<model>/<weight file>`, the model fetched if it is missing.
fn model_cache(model: ModelName) -> PathBuf {
    let files = models::files::locate_or_fetch(model).expect("the model is available");
    files
        .folder
        .parent()
        .expect("a model folder sits in the cache")
        .to_path_buf()
}

/// The MiniLM run, made once per test binary.
fn minilm_run() -> &'static Path {
    static RUN: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, dir) = RUN.get_or_init(|| {
        model_cache(ModelName::MiniLm);
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("minilm");
        make_run(&minilm_protocol(), &dir);
        (tmp, dir)
    });
    dir
}

fn with_models(dir: &Path, models: &Path) -> audit::Report {
    let options = Options {
        models: Models::Cache(models.to_path_buf()),
        sample: None,
        sample_dirs: Vec::new(),
    };
    audit::audit_dir_with(dir, &workspace(), &options)
}

/// The audit without re-running the model, for forgeries another check names (quicker).
fn audit_quick(dir: &Path) -> audit::Report {
    audit::audit_dir_with(dir, &workspace(), &Options::without_models())
}

#[test]
fn a_model_run_passes_with_its_inputs_rederived_by_the_model() {
    let report = audit(minilm_run());
    assert_pass(&report);
    // One pass (the text's first 40 tokens) re-run; its two inputs (layers 0 and 5) re-derived.
    assert_eq!(report.counted(Checked::PassesRerun), 1);
    assert_eq!(report.counted(Checked::InputsFromModel), 2);
    assert_eq!(report.counted(Checked::InputsRederived), 0);
    assert_eq!(report.counted(Checked::Comparisons), 8);
    assert!(
        report
            .notes
            .iter()
            .any(|n| matches!(n, Note::ModelFilesChecked(folder) if folder.ends_with("minilm")))
    );
}

#[test]
fn without_the_model_a_model_run_is_unverified_and_a_wrong_file_fails() {
    // No model in the cache, or told not to use one: UNVERIFIED, never PASS.
    let empty = tempfile::tempdir().unwrap();
    for report in [
        with_models(minilm_run(), empty.path()),
        audit::audit_dir_with(minilm_run(), &workspace(), &Options::without_models()),
    ] {
        assert_eq!(report.verdict(), Verdict::Unverified, "{}", report.render());
        assert!(!report.passed());
        assert!(report.render().starts_with("UNVERIFIED "));
        assert!(report.unverified[0].contains("1 model passes"));
    }

    // Another file under a pinned name: FAIL, naming it.
    let other = tempfile::tempdir().unwrap();
    std::fs::create_dir(other.path().join("minilm")).unwrap();
    std::fs::write(
        other.path().join("minilm/model.safetensors"),
        b"not the weights",
    )
    .unwrap();
    let report = with_models(minilm_run(), other.path());
    assert_problem(
        &report,
        "model file hash",
        |p| matches!(p, Problem::ModelFile { path, reason } if path.ends_with("minilm/model.safetensors") && reason.starts_with("SHA-256 ")),
    );
}

#[test]
fn a_forged_model_input_fails_down_to_one_bit_naming_pass_and_array() {
    for (part, index) in [("q", [1, 3]), ("k", [17, 30]), ("v", [39, 0])] {
        let (_tmp, dir) = copy_of(minilm_run());
        let name = format!("t0_n40_l5_h0_{part}");
        edit_arrays(&dir, |arrays| {
            let x = &mut array(arrays, &name).f32()[index];
            *x = f32::from_bits(x.to_bits() ^ 1);
        });
        rehash(&dir);
        let report = audit(&dir);
        assert_problem(
            &report,
            "one bit",
            |p| matches!(p, Problem::Rerun { pass, array, .. } if pass == "t0_n40" && *array == name),
        );
    }

    // The issue's forgery: queries scaled by 0.25 with everything downstream recomputed by the
    // runner's own code would still need the archived q to be the model's.
    let (_tmp, dir) = copy_of(minilm_run());
    edit_arrays(&dir, |arrays| {
        array(arrays, "t0_n40_l0_h0_q")
            .f32()
            .mapv_inplace(|x| x * 0.25);
    });
    rehash(&dir);
    assert_problem(
        &audit(&dir),
        "scaled queries",
        |p| matches!(p, Problem::Rerun { array, index: 0, .. } if array == "t0_n40_l0_h0_q"),
    );

    // Swapped token ids: the record is no longer the text's tokenization.
    let (_tmp, dir) = copy_of(minilm_run());
    edit_json(&dir, "manifest.json", |m| {
        let ids = m["model"]["ids"]["t0_n40"].as_array_mut().unwrap();
        ids.swap(3, 4);
    });
    assert_problem(
        &audit(&dir),
        "swapped ids",
        |p| matches!(p, Problem::Rerun { pass, array, index: 3, .. } if pass == "t0_n40" && array == "manifest model.ids.t0_n40"),
    );
}

#[test]
fn a_flipped_code_and_altered_inputs_are_caught_downstream() {
    let (_tmp, dir) = copy_of(minilm_run());
    edit_arrays(&dir, |arrays| {
        // A 4-bit code of the swapped setting (K grouped along features) one step off.
        let codes = array(arrays, "t0_n40_l5_h0_g8_b4_swap_k_codes").u8();
        let low = codes[[5]] & 0x0F;
        codes[[5]] = (codes[[5]] & 0xF0) | if low < 14 { low + 1 } else { low - 1 };
        // A changed model input is not the model's, and its reference is no longer its
        // attention.
        array(arrays, "t0_n40_l0_h0_v").f32()[[10, 7]] += 0.5;
    });
    rehash(&dir);
    let report = audit(&dir);
    assert_problem(
        &report,
        "code rule",
        |p| matches!(p, Problem::Code { array, .. } if array == "t0_n40_l5_h0_g8_b4_swap_k_codes"),
    );
    assert_problem(
        &report,
        "reference",
        |p| matches!(p, Problem::Attention { array, .. } if array == "t0_n40_l0_h0_ref"),
    );
    assert_problem(
        &report,
        "model input",
        |p| matches!(p, Problem::Rerun { array, index: 327, .. } if array == "t0_n40_l0_h0_v"),
    );

    let (_tmp, dir) = copy_of(minilm_run());
    edit_arrays(&dir, |arrays| {
        array(arrays, "t0_n40_l5_h0_q").f32()[[1, 3]] = f32::NAN;
    });
    rehash(&dir);
    let report = audit_quick(&dir);
    assert_problem(
        &report,
        "non-finite input",
        |p| matches!(p, Problem::NotFinite { array, first: [1, 3] } if array == "t0_n40_l5_h0_q"),
    );
}

#[test]
fn the_model_record_is_held_to_the_pins_and_the_run() {
    let (_tmp, dir) = copy_of(minilm_run());
    edit_json(&dir, "manifest.json", |m| {
        let model = &mut m["model"];
        model["weight_sha256"] = "0".repeat(64).into();
        // One id dropped: the pass no longer has N ids.
        model["ids"]["t0_n40"].as_array_mut().unwrap().pop();
    });
    let report = audit_quick(&dir);
    assert_problem(
        &report,
        "weight hash",
        |p| matches!(p, Problem::ModelRecord { field, .. } if field == "weight_sha256"),
    );
    assert_problem(
        &report,
        "id count",
        |p| matches!(p, Problem::ModelRecord { field, found, .. } if field == "ids.t0_n40" && found == "39 ids"),
    );

    let (_tmp, dir) = copy_of(minilm_run());
    edit_json(&dir, "manifest.json", |m| {
        let ids = m["model"]["ids"]["t0_n40"].as_array_mut().unwrap();
        // [SEP] no longer last, and an id past MiniLM's vocabulary.
        ids[39] = 2000.into();
        ids[7] = 30_522.into();
    });
    let report = audit_quick(&dir);
    assert_problem(
        &report,
        "vocabulary",
        |p| matches!(p, Problem::ModelRecord { field, found, .. } if field == "ids.t0_n40" && found == "id 30522 at position 7"),
    );
    assert_problem(
        &report,
        "markers",
        |p| matches!(p, Problem::ModelRecord { field, found, .. } if field == "ids.t0_n40" && found.contains("last Some(2000)")),
    );

    let (_tmp, dir) = copy_of(minilm_run());
    edit_json(&dir, "manifest.json", |m| {
        let ids = m["model"]["ids"].as_object_mut().unwrap();
        let list = ids.remove("t0_n40").unwrap();
        ids.insert("t1_n40".into(), list);
    });
    let report = audit_quick(&dir);
    assert_problem(
        &report,
        "passes",
        |p| matches!(p, Problem::ModelRecord { field, .. } if field == "ids"),
    );

    let (_tmp, dir) = copy_of(minilm_run());
    edit_json(&dir, "manifest.json", |m| {
        m.as_object_mut().unwrap().remove("model");
    });
    let report = audit_quick(&dir);
    assert_problem(
        &report,
        "absent record",
        |p| matches!(p, Problem::ModelRecord { field, found, .. } if field == "(record)" && found == "absent"),
    );
}

/// The chart with `from` replaced by `to` in the first marker that holds it (panels carry the
/// same attribute).
fn in_first_marker(svg: &str, from: &str, to: &str) -> String {
    let mut done = false;
    svg.lines()
        .map(|line| {
            if !done && line.starts_with("<g class=\"marker\"") && line.contains(from) {
                done = true;
                line.replacen(from, to, 1)
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

#[test]
fn a_changed_layer_condition_is_named_in_summary_markdown_and_chart() {
    let (_tmp, dir) = copy_of(minilm_run());
    edit_json(&dir, "summary.json", |s| {
        let means = s["packed_kv"][0]["mean_relative_l2"]
            .as_object_mut()
            .unwrap();
        let l5 = means.remove("l5").unwrap();
        means.insert("l4".into(), l5);
    });
    // The per-layer table's header: `| setting | l0 | l5 | payload N=40 |`, padded.
    edit_text(&dir, "summary.md", |md| {
        md.lines()
            .map(|line| match line.starts_with("| setting") {
                true => line.replacen(" l5 ", " l4 ", 1),
                false => line.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n")
            + "\n"
    });
    edit_text(&dir, "error-vs-bytes.svg", |svg| {
        in_first_marker(&svg, r#"data-condition="l5""#, r#"data-condition="l4""#)
            // The y axis would claim a mean over seeds.
            .replace("mean over texts and heads", "mean over seeds")
    });
    rehash(&dir);
    let report = audit_quick(&dir);
    assert_problem(
        &report,
        "summary condition",
        |p| matches!(p, Problem::Summary { place, found, .. } if place == "packed_kv g8_b4_swap mean_relative_l2" && found.contains("\"l4\"")),
    );
    assert_problem(
        &report,
        "markdown condition",
        |p| matches!(p, Problem::Markdown(MarkdownProblem::Cell { found, expected, .. }) if found == "l4" && expected == "l5"),
    );
    assert_problem(
        &report,
        "chart condition",
        |p| matches!(p, Problem::Chart(ChartProblem::Marker { found, .. }) if found.contains(" l4 ")),
    );
    assert_problem(
        &report,
        "y axis description",
        |p| matches!(p, Problem::Chart(ChartProblem::Label { expected }) if expected.contains("texts and heads")),
    );
}

#[test]
fn a_generated_runs_marker_attribute_is_refused_on_a_model_run() {
    // A model run's markers name their layer; a marker naming a distribution as well is not
    // what the runner writes.
    let (_tmp, dir) = copy_of(minilm_run());
    edit_text(&dir, "error-vs-bytes.svg", |svg| {
        in_first_marker(
            &svg,
            r#"data-condition="l0""#,
            r#"data-condition="l0" data-distribution="clean""#,
        )
    });
    rehash(&dir);
    let report = audit_quick(&dir);
    assert_problem(&report, "marker attributes", |p| {
        matches!(p, Problem::Chart(ChartProblem::Marker { index: 0, .. }))
    });
}

#[test]
fn a_smollm2_run_passes_and_its_weight_file_is_checked() {
    let cache = model_cache(ModelName::SmolLm2);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("smollm2");
    make_run(&smollm2_protocol(), &dir);
    let report = with_models(&dir, &cache);
    assert_pass(&report);
    assert_eq!(report.counted(Checked::InputsFromModel), 2);

    // SmolLM2 adds no [CLS]/[SEP]; its ids are only held to the count and the vocabulary.
    let (_tmp, copy) = copy_of(&dir);
    edit_json(&copy, "manifest.json", |m| {
        m["model"]["ids"]["t0_n40"][0] = 49_152.into();
        m["model"]["name"] = "minilm".into();
    });
    let report = audit_quick(&copy);
    assert_problem(
        &report,
        "vocabulary",
        |p| matches!(p, Problem::ModelRecord { field, found, .. } if field == "ids.t0_n40" && found == "id 49152 at position 0"),
    );
    assert_problem(
        &report,
        "name",
        |p| matches!(p, Problem::ModelRecord { field, .. } if field == "name"),
    );
}

#[test]
fn a_gemma3_run_passes_and_needs_its_bos_first_and_its_models_bits() {
    let cache = model_cache(ModelName::Gemma3);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("gemma3");
    make_run(&gemma3_protocol(), &dir);
    let report = with_models(&dir, &cache);
    assert_pass(&report);
    assert_eq!(report.counted(Checked::PassesRerun), 1);
    assert_eq!(report.counted(Checked::InputsFromModel), 2);

    // Gemma 3's passes open with BOS (2); a record without it is refused by name.
    let (_tmp, copy) = copy_of(&dir);
    edit_json(&copy, "manifest.json", |m| {
        m["model"]["ids"]["t0_n40"][0] = 818.into();
    });
    assert_problem(
        &audit_quick(&copy),
        "BOS",
        |p| matches!(p, Problem::ModelRecord { field, found, .. } if field == "ids.t0_n40" && found.starts_with("first Some(818)")),
    );

    // One bit of a global layer's key: not what the model computes.
    let (_tmp, copy) = copy_of(&dir);
    edit_arrays(&copy, |arrays| {
        let x = &mut array(arrays, "t0_n40_l5_h0_k").f32()[[39, 255]];
        *x = f32::from_bits(x.to_bits() ^ 1);
    });
    rehash(&copy);
    assert_problem(
        &with_models(&copy, &cache),
        "one bit",
        |p| matches!(p, Problem::Rerun { pass, array, .. } if pass == "t0_n40" && array == "t0_n40_l5_h0_k"),
    );
}

#[test]
fn a_shard_records_the_ids_of_its_own_passes_only_and_a_merge_all() {
    model_cache(ModelName::MiniLm);
    // Two lengths, so the shards' inputs come from different passes: shard 1 of 2 holds
    // t0_n20 (layers 0 and 5), shard 2 holds t0_n40.
    let mut protocol: serde_json::Value = serde_json::from_str(&minilm_protocol()).unwrap();
    protocol["tokens"] = serde_json::json!([20, 40]);
    let protocol = protocol.to_string();
    let tmp = tempfile::tempdir().unwrap();
    let first = tmp.path().join("first");
    let second = tmp.path().join("second");
    make_shard(&protocol, Some((1, 2)), &first);
    make_shard(&protocol, Some((2, 2)), &second);
    assert_pass(&audit(&first));
    assert_pass(&audit(&second));
    // Their merge records both passes, and audits like a whole run.
    let merged = tmp.path().join("merged");
    kvstudy::merge::merge(&merged, &[first.clone(), second.clone()]).unwrap();
    assert_pass(&audit(&merged));

    // The other shard's pass added to the first's record.
    let other = std::fs::read_to_string(second.join("manifest.json")).unwrap();
    let other: serde_json::Value = serde_json::from_str(&other).unwrap();
    let (_tmp, dir) = copy_of(&first);
    edit_json(&dir, "manifest.json", |m| {
        m["model"]["ids"]["t0_n40"] = other["model"]["ids"]["t0_n40"].clone();
    });
    let report = audit_quick(&dir);
    assert_problem(
        &report,
        "passes",
        |p| matches!(p, Problem::ModelRecord { field, found, .. } if field == "ids" && found.contains("t0_n40")),
    );
}

#[test]
fn a_causal_models_shorter_pass_is_the_longer_passs_prefix() {
    model_cache(ModelName::SmolLm2);
    let mut protocol: serde_json::Value = serde_json::from_str(&smollm2_protocol()).unwrap();
    protocol["tokens"] = serde_json::json!([24, 40]);
    protocol["model"]["layers"] = serde_json::json!([0]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    make_run(&protocol.to_string(), &dir);
    assert_pass(&audit(&dir));

    // Forging only the shorter pass's K is caught even without the model.
    let (_tmp, copy) = copy_of(&dir);
    edit_arrays(&copy, |arrays| {
        array(arrays, "t0_n24_l0_h0_k").f32()[[20, 5]] *= 0.5;
    });
    rehash(&copy);
    let report = audit::audit_dir_with(&copy, &workspace(), &Options::without_models());
    assert_problem(
        &report,
        "prefix",
        |p| matches!(p, Problem::Prefix { array, longer, tokens: 24, index, .. } if array == "t0_n24_l0_h0_k" && longer == "t0_n40_l0_h0_k" && *index == 20 * 64 + 5),
    );
}

#[test]
fn the_command_line_takes_a_model_cache_with_models() {
    let cache = model_cache(ModelName::MiniLm);
    let audit_cli = |args: &[&std::ffi::OsStr]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_audit"))
            .args(args)
            .output()
            .expect("audit starts");
        (out.status.code(), String::from_utf8(out.stdout).unwrap())
    };
    let run = minilm_run().as_os_str();
    let (code, stdout) = audit_cli(&[run, "--models".as_ref(), cache.as_os_str()]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("re-derived by re-running the model"),
        "{stdout}"
    );

    // No model there, or --no-models: UNVERIFIED, exit status 3.
    let empty = tempfile::tempdir().unwrap();
    for args in [
        vec![run, "--models".as_ref(), empty.path().as_os_str()],
        vec![run, "--no-models".as_ref()],
    ] {
        let (code, stdout) = audit_cli(&args);
        assert_eq!(code, Some(3), "{stdout}");
        assert!(stdout.ends_with("\nUNVERIFIED\n"), "{stdout}");
        assert!(
            stdout.contains("not re-derived: 1 model passes"),
            "{stdout}"
        );
    }
}

#[test]
fn a_sample_of_no_pass_and_a_directory_sample_beside_a_directory_are_refused() {
    let audit_cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_audit"))
            .args(args)
            .output()
            .expect("audit starts");
        (out.status.code(), String::from_utf8(out.stderr).unwrap())
    };
    let (code, stderr) = audit_cli(&["--sample", "0"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--no-models is that audit"), "{stderr}");
    let (code, stderr) = audit_cli(&["--sample-dir", "evidence/real-minilm=0"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("`evidence/real-minilm=0`"), "{stderr}");
    // --sample-dir names pinned directories; with one directory given, --sample says it all.
    let (code, stderr) = audit_cli(&["--sample-dir", "evidence/a=1", "evidence/a"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}
