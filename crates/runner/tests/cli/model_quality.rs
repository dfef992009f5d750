//! `runner quality --protocol FILE --out DIR` on the real SmolLM2: a tiny study is written as a
//! model-quality evidence directory whose numbers can be recomputed from its own arrays, whose
//! float32 numbers are `quality::measure`'s, and whose files do not depend on the thread count.
//!
//! The model is fetched on first use (`scripts/fetch-models`, pinned and hash-checked).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use models::ModelName;
use ndarray::Array1;
use ndarray_npy::NpzReader;
use quality::study::{self as quality_study, QualityProtocol, ResultRow};

/// One short text (about 40 ids), three runs (a prefill, a streaming and a budget run), four
/// generated tokens.
const TINY: &str = r#"{
  "study": "tiny-quality",
  "model": "smollm2",
  "texts": [ { "name": "short", "text": "The runner writes every result into a new directory, with a manifest that pins the hash of each file it wrote, so a later audit can recompute the tables and check each figure against the arrays it came from." } ],
  "max_tokens": 40,
  "runs": [
    { "setting": "g8_b4", "policy": "uniform", "schedule": "prefill" },
    { "setting": "g8_b2", "policy": "uniform", "schedule": "streaming" },
    { "setting": "g8_b2", "policy": "recent_f32:16", "schedule": "streaming" }
  ],
  "generate": { "prompt_tokens": 8, "tokens": 4 }
}"#;

fn npz(path: &Path) -> NpzReader<std::fs::File> {
    NpzReader::new(std::fs::File::open(path).unwrap()).unwrap()
}

fn f64s(npz: &mut NpzReader<std::fs::File>, name: &str) -> Array1<f64> {
    npz.by_name(name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn i64s(npz: &mut NpzReader<std::fs::File>, name: &str) -> Array1<i64> {
    npz.by_name(name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn runner(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(args)
        .output()
        .expect("runner starts")
}

#[test]
fn a_tiny_study_is_written_recomputable_and_independent_of_threads() {
    let files = models::files::locate_or_fetch(ModelName::SmolLm2).expect("the model is fetched");
    let decoder = quality::decoder::Decoder::load(&files).unwrap();
    let protocol = QualityProtocol::from_json(TINY).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut dirs = Vec::new();
    for threads in [1, 2] {
        let study = quality_study::run_study(&protocol, &decoder, threads, &|_| {}).unwrap();
        let out = tmp.path().join(format!("threads-{threads}"));
        quality::write::write(&out, &protocol, "tiny".into(), &study, threads).unwrap();
        dirs.push(out);
    }
    let dir = &dirs[0];

    // Exactly the spec's files.
    let names: BTreeSet<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let want: BTreeSet<String> = [
        "arrays.npz",
        "manifest.json",
        "quality-vs-bytes.svg",
        "results.json",
        "summary.json",
        "summary.md",
    ]
    .map(String::from)
    .into();
    assert_eq!(names, want);

    // One and two threads: the same bytes.
    for file in ["arrays.npz", "results.json", "summary.json", "summary.md"] {
        let a = std::fs::read(dirs[0].join(file)).unwrap();
        let b = std::fs::read(dirs[1].join(file)).unwrap();
        assert!(a == b, "{file} differs between 1 and 2 threads");
    }

    // The manifest: its format, the ids scored and the hash of every other file.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["format"], "model-quality-evidence/2");
    let ids: Vec<u32> = serde_json::from_value(manifest["model"]["ids"]["t0"].clone()).unwrap();
    assert_eq!(ids.len(), 40, "the text is cut to max_tokens");
    assert_eq!(ids, decoder.encode(&protocol.texts[0].text).unwrap()[..40]);
    assert_eq!(manifest["outputs"].as_object().unwrap().len(), 5);

    // Members in the spec's order.
    let zip = zip::ZipArchive::new(std::fs::File::open(dir.join("arrays.npz")).unwrap()).unwrap();
    let members: Vec<&str> = zip.file_names().collect();
    let mut want = vec![
        "t0_ids.npy",
        "t0_f32_logp.npy",
        "t0_f32_argmax.npy",
        "t0_f32_generated.npy",
    ];
    let row_ids = [
        "t0_g8_b4_uniform_prefill",
        "t0_g8_b2_uniform_streaming",
        "t0_g8_b2_recent_f32-16_streaming",
    ];
    let row_members: Vec<String> = row_ids
        .iter()
        .flat_map(|id| ["logp", "kl", "argmax", "generated"].map(|p| format!("{id}_{p}.npy")))
        .collect();
    want.extend(row_members.iter().map(String::as_str));
    let mut sorted_members = members.clone();
    sorted_members.sort();
    let mut sorted_want = want.clone();
    sorted_want.sort();
    assert_eq!(sorted_members, sorted_want);

    // results.json's aggregates are the arrays', recomputed here as the spec words them.
    let rows: Vec<ResultRow> =
        serde_json::from_slice(&std::fs::read(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(
        rows.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        row_ids
    );
    let mut arrays = npz(&dir.join("arrays.npz"));
    let f32_logp = f64s(&mut arrays, "t0_f32_logp");
    let f32_argmax = i64s(&mut arrays, "t0_f32_argmax");
    let f32_generated = i64s(&mut arrays, "t0_f32_generated");
    assert_eq!(i64s(&mut arrays, "t0_ids").len(), 40);
    let n = 39.0;
    let sum = |xs: &Array1<f64>| xs.iter().fold(0f64, |a, &x| a + x);
    for row in &rows {
        let logp = f64s(&mut arrays, &format!("{}_logp", row.id));
        let kl = f64s(&mut arrays, &format!("{}_kl", row.id));
        let argmax = i64s(&mut arrays, &format!("{}_argmax", row.id));
        let generated = i64s(&mut arrays, &format!("{}_generated", row.id));
        assert_eq!((row.tokens, row.positions), (40, 39));
        assert_eq!(row.nll_f32, -sum(&f32_logp) / n);
        assert_eq!(row.nll, -sum(&logp) / n);
        assert_eq!(row.perplexity, row.nll.exp());
        assert_eq!(row.kl_mean, sum(&kl) / n);
        assert_eq!(
            row.kl_max,
            kl.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x))
        );
        let agree = argmax
            .iter()
            .zip(&f32_argmax)
            .filter(|(a, b)| a == b)
            .count();
        assert_eq!(row.top1_agreement, agree as f64 / n);
        assert_eq!(row.float32_bytes_per_token, 46_080.0);
        assert!(row.bytes_per_token < 46_080.0, "{}", row.bytes_per_token);
        let departure = generated
            .iter()
            .zip(&f32_generated)
            .position(|(a, b)| a != b);
        assert_eq!(row.first_departure, Some(departure));
        let ids: Vec<u32> = generated.iter().map(|&x| x as u32).collect();
        let text = decoder.decode(&ids).unwrap();
        assert_eq!(row.generated_text.as_deref(), Some(text.as_str()));
        assert!(row.kl_mean > 0.0, "a packed cache changes the distribution");
    }

    // The float32 numbers and the first run's numbers are `quality::measure`'s.
    let spec = protocol.specs().unwrap().swap_remove(0);
    let measured = quality::measure(decoder.model(), &ids, spec, |_| {}).unwrap();
    assert_eq!(f32_logp.to_vec(), measured.positions.logp_f32);
    assert_eq!(rows[0].nll_f32, measured.nll_f32);
    assert_eq!(rows[0].nll, measured.nll);
    assert_eq!(rows[0].kl_mean, measured.kl_mean);
    assert_eq!(rows[0].kl_max, measured.kl_max);
    assert_eq!(rows[0].top1_agreement, measured.top1_agreement);
    assert_eq!(rows[0].bytes_per_token, measured.bytes_per_token);
    assert_eq!(
        f64s(&mut arrays, "t0_g8_b4_uniform_prefill_kl").to_vec(),
        measured.positions.kl
    );

    // The summary's single text is the rows themselves; the chart marks every run.
    let summary: quality_study::Summary =
        serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary.rows.len(), 3);
    assert_eq!(summary.rows[1].kl_mean, rows[1].kl_mean);
    let svg = std::fs::read_to_string(dir.join("quality-vs-bytes.svg")).unwrap();
    assert_eq!(svg.matches(r#"<g class="marker""#).count(), 3);
    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(md.contains("| float32 "), "{md}");

    // An existing --out is refused before anything runs.
    let protocol_file = tmp.path().join("tiny.json");
    std::fs::write(&protocol_file, TINY).unwrap();
    let output = runner(&[
        "quality",
        "--protocol",
        protocol_file.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("already exists"), "{stderr}");
}

#[test]
fn a_bad_protocol_is_refused_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    for (edit, field) in [
        (("\"max_tokens\": 40", "\"max_tokens\": 1"), "`max_tokens`"),
        (("\"g8_b2\"", "\"g8_b1x\""), "`runs[1].setting`"),
        (
            ("\"tokens\": 4", "\"tokens\": 4, \"top_k\": 3"),
            "`generate.top_k`",
        ),
    ] {
        let file = tmp.path().join("bad.json");
        std::fs::write(&file, TINY.replacen(edit.0, edit.1, 1)).unwrap();
        let out = tmp.path().join("never");
        let output = runner(&[
            "quality",
            "--protocol",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(field), "{field}: {stderr}");
        assert!(!out.exists());
    }
}

/// Sizes from a flag or a protocol that used to abort (`g4294967296_b4`: a 128 GiB allocation)
/// or panic on a wrapping sum (`g18446744073709551615_b4`, `--generate 18446744073709551615`,
/// a policy window of 2^64 - 1) are refused before the model is loaded: exit status 1, one line
/// naming the problem, no panic.
#[test]
fn sizes_that_used_to_abort_or_panic_are_refused_by_name() {
    let huge = usize::MAX.to_string();
    let window = format!("recent8:{huge}");
    let cases: [(&[&str], &str); 5] = [
        (
            &["--setting", "g4294967296_b4"],
            "group size 4294967296 is above",
        ),
        (
            &["--setting", "g18446744073709551615_b4"],
            "is above 134217728",
        ),
        (&["--setting", "g16384_b4"], "SmolLM2's context length"),
        (&["--setting", "g1_b4", "--policy", &window], "at most 8192"),
        (&["--generate", &huge], "at most 8191"),
    ];
    for (flags, needle) in cases {
        let mut args = vec!["quality", "--model", "smollm2", "--text", "Some words."];
        args.extend_from_slice(flags);
        let output = runner(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{flags:?}: {stderr}");
        assert!(stderr.contains(needle), "{flags:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{flags:?}: {stderr}");
    }
    let tmp = tempfile::tempdir().unwrap();
    for (edit, field) in [
        (("\"g8_b4\"", "\"g4294967296_b4\""), "`runs[0].setting`"),
        (
            ("\"g8_b4\"", "\"g18446744073709551615_b4\""),
            "`runs[0].setting`",
        ),
        (
            ("\"recent_f32:16\"", &*format!("\"recent_f32:{huge}\"")),
            "`runs[2].policy`",
        ),
    ] {
        let file = tmp.path().join("huge.json");
        std::fs::write(&file, TINY.replacen(edit.0, edit.1, 1)).unwrap();
        let out = tmp.path().join("never");
        let output = runner(&[
            "quality",
            "--protocol",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{field}: {stderr}");
        assert!(stderr.contains(field), "{field}: {stderr}");
        assert!(!out.exists());
    }
}

/// `runner quality --scheme NAME --json` on SmolLM2: the same fields as a setting's run, with
/// `scheme` and `bits_per_element`; an unknown name, a setting beside a scheme and KIVI under
/// the causal schedule are refused by name before the model is loaded.
#[test]
fn a_named_scheme_runs_on_smollm2_and_prints_its_bits_per_element() {
    let output = runner(&[
        "quality",
        "--model",
        "smollm2",
        "--text",
        "The quick brown fox jumps over the lazy dog.",
        "--scheme",
        "llamacpp-q8_0+rot",
        "--schedule",
        "prefill",
        "--generate",
        "0",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["scheme"], "llamacpp-q8_0+rot");
    assert_eq!(json["setting"], serde_json::Value::Null);
    assert_eq!(json["policy"], serde_json::Value::Null);
    assert_eq!(json["schedule"], "prefill");
    // 34 bytes per block of 32 values: 8.5 bits, for 30 layers x 3 KV heads x 64 x 2.
    let bits = json["bits_per_element"].as_f64().unwrap();
    assert!((bits - 8.5).abs() < 1e-12, "{bits}");
    assert_eq!(json["bytes_per_token"], 30.0 * 3.0 * 2.0 * 2.0 * 34.0);
    let kl = json["kl_mean"].as_f64().unwrap();
    assert!(kl > 0.0 && kl < 0.01, "{kl}");

    let cases: [(&[&str], &str, i32); 3] = [
        (
            &["--scheme", "kivi3"],
            "unknown scheme \"kivi3\"; the schemes are kivi2, kivi4",
            1,
        ),
        (
            &["--scheme", "kivi4", "--schedule", "causal"],
            "keeps its own full-precision residual",
            1,
        ),
        (
            &["--scheme", "kivi4", "--setting", "g32_b4"],
            "cannot be used with",
            2,
        ),
    ];
    for (flags, needle, code) in cases {
        let mut args = vec!["quality", "--model", "smollm2", "--text", "Some words."];
        args.extend_from_slice(flags);
        let output = runner(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{flags:?}: {stderr}");
        assert!(stderr.contains(needle), "{flags:?}: {stderr}");
    }
}

/// `runner quality --scheme kvquant3 --calibration-file C`: KVQuant fits its levels on the
/// calibration text, then measures the text; a calibration text that overlaps the text is
/// refused by name, and so is `--calibration-file` without a scheme.
#[test]
fn a_kvquant_scheme_is_calibrated_on_another_text() {
    let dir = tempfile::tempdir().unwrap();
    let calibration = dir.path().join("calibration.txt");
    std::fs::write(
        &calibration,
        "Rivers carry sediment from the mountains to the sea. Over thousands of years the \
         sediment settles in deltas, where the water slows and spreads into many channels. \
         Farmers have long settled on these plains, because floods renew the soil each spring, \
         and towns grew where the channels met the coast.",
    )
    .unwrap();
    let text = "The quick brown fox jumps over the lazy dog.";
    let args = |scheme: &str, text: &str| {
        vec![
            "quality".to_string(),
            "--model".into(),
            "smollm2".into(),
            "--text".into(),
            text.into(),
            "--scheme".into(),
            scheme.into(),
            "--calibration-file".into(),
            calibration.display().to_string(),
            "--generate".into(),
            "0".into(),
            "--json".into(),
        ]
    };
    let run = |args: Vec<String>| runner(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let output = run(args("kvquant3", text));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["scheme"], "kvquant3");
    let bits = json["bits_per_element"].as_f64().unwrap();
    // 3-bit codes, outliers, counts, value ranges and the calibration, over 10 tokens.
    assert!(bits > 3.0, "{bits}");
    assert!(json["kl_mean"].as_f64().unwrap() > 0.0);

    let output = run(args("kvquant3", "Rivers carry sediment"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the calibration text and the text overlap"),
        "{stderr}"
    );
    let mut bare = args("kvquant3", text);
    bare.retain(|a| a != "--scheme" && a != "kvquant3");
    let output = run(bare);
    assert_eq!(output.status.code(), Some(2));
}

/// `runner quality --model gemma3` on the 675-token text of the models' independent Gemma check
/// (BOS first): its 15 sliding-window layers hold only their last 512 tokens and are billed so.
/// llama.cpp's q8_0 stores 34 bytes per 32 values, per token: each layer stores 2 x 8 blocks
/// per token it holds, so the bytes are (3 x 675 + 15 x 512) x 2 x 8 x 34, counted here
/// from that arithmetic alone.
#[test]
fn gemma3_is_measured_with_its_sliding_layers_billed_for_their_window() {
    models::files::locate_or_fetch(ModelName::Gemma3).expect("the model is fetched");
    let check =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/data/gemma3/kv_check.npz");
    let text: Array1<u8> = NpzReader::new(std::fs::File::open(check).unwrap())
        .unwrap()
        .by_name("text_utf8")
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("text.txt");
    std::fs::write(&file, text.as_slice().unwrap()).unwrap();
    let output = runner(&[
        "quality",
        "--model",
        "gemma3",
        "--text-file",
        file.to_str().unwrap(),
        "--scheme",
        "llamacpp-q8_0",
        "--schedule",
        "prefill",
        "--generate",
        "0",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["model"], "gemma3");
    assert_eq!(json["tokens"], 675);
    let stored = (3 * 675 + 15 * 512) * 2 * 8 * 34;
    assert_eq!(json["bytes_per_token"], stored as f64 / 675.0);
    // The float32 cache holds the same tokens at 2 x 256 x 4 bytes each: its bits per element
    // are 8.5 (34 bytes per 32 values), not a count that bills float32 for evicted tokens.
    let f32_stored = (3 * 675 + 15 * 512) * 2 * 256 * 4;
    assert_eq!(json["f32_bytes_per_token"], f32_stored as f64 / 675.0);
    let bits = json["bits_per_element"].as_f64().unwrap();
    assert!((bits - 8.5).abs() < 1e-12, "{bits}");
    let kl = json["kl_mean"].as_f64().unwrap();
    assert!(kl > 0.0 && kl < 0.01, "{kl}");
    let top1 = json["top1_agreement"].as_f64().unwrap();
    assert!(top1 > 0.9, "{top1}");
    let (nll_f32, nll) = (
        json["nll_f32"].as_f64().unwrap(),
        json["nll"].as_f64().unwrap(),
    );
    assert!(nll_f32 > 0.5 && nll_f32 < 6.0, "{nll_f32}");
    assert!((nll - nll_f32).abs() < 0.05, "{nll} against {nll_f32}");
}

/// `runner bytes` prints what a cache stores for N tokens without running the model: Gemma 3's
/// sliding layers hold 512 tokens, so at 8,192 tokens llama.cpp's q8_0 stores (3 x 8,192 +
/// 15 x 512) x 2 sides x 8 blocks x 34 bytes; KVQuant and an encoder are refused by name.
#[test]
fn runner_bytes_prints_a_caches_cost_without_the_model() {
    let output = runner(&[
        "bytes",
        "--model",
        "gemma3",
        "--tokens",
        "8192",
        "--scheme",
        "llamacpp-q8_0",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let stored = (3 * 8192 + 15 * 512) * 2 * 8 * 34;
    assert_eq!(json["bytes"], stored);
    assert_eq!(json["bytes_per_token"], stored as f64 / 8192.0);
    let bits = json["bits_per_element"].as_f64().unwrap();
    assert!((bits - 8.5).abs() < 1e-12, "{bits}");
    let line = runner(&["bytes", "--model", "smollm2", "--tokens", "256"]);
    let stdout = String::from_utf8_lossy(&line.stdout);
    assert!(
        stdout.starts_with("smollm2 at 256 tokens, g32_b4 uniform prefill: 7,205.")
            && stdout.contains("float32 46,080 bytes per token"),
        "{stdout}"
    );
    for (args, needle) in [
        (
            &[
                "--model", "gemma3", "--tokens", "100", "--scheme", "kvquant4",
            ][..],
            "depend on the values",
        ),
        (&["--model", "minilm", "--tokens", "100"][..], "encoder"),
        (&["--model", "smollm2", "--tokens", "8193"][..], "1 to 8192"),
    ] {
        let mut all = vec!["bytes"];
        all.extend_from_slice(args);
        let output = runner(&all);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

/// `runner corpus` prints a protocol's texts from the fetched public corpus (CI runs
/// `scripts/fetch-texts` first): documents longer than the asked ids, each a prefix of the
/// cleaned document whose first ids are the document's; asking for more than qualify, or for a
/// domain that does not exist, is refused by name.
#[test]
fn runner_corpus_prints_protocol_texts_cut_to_the_asked_ids() {
    let cache = std::env::var_os("KVPACK_TEXTS").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../text-cache"),
        std::path::PathBuf::from,
    );
    if !cache.join("sotu/SOURCE").exists() {
        eprintln!(
            "skipped: no text cache at {} (scripts/fetch-texts)",
            cache.display()
        );
        return;
    }
    let cache = cache.to_str().unwrap();
    let args = |count: &str, domain: &str| {
        let mut a = vec!["corpus", "--model", "smollm2", "--domain", domain];
        a.extend(["--count", count, "--tokens", "300", "--texts", cache]);
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let run = |a: Vec<String>| runner(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let output = run(args("3", "code"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let texts: Vec<quality::study::QualityText> = serde_json::from_slice(&output.stdout).unwrap();
    let names: Vec<&str> = texts.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names.len(), 3);
    assert!(names.iter().all(|n| n.starts_with("click-")), "{names:?}");

    let documents = quality::corpus::open(Path::new(cache)).unwrap();
    let files = models::files::locate_or_fetch(ModelName::SmolLm2).unwrap();
    let decoder = quality::decoder::Decoder::load(&files).unwrap();
    for text in &texts {
        let module = text.name.trim_start_matches("click-");
        let whole = documents
            .iter()
            .find(|d| d.name == format!("click/{module}.py"))
            .unwrap();
        assert!(whole.text.starts_with(&text.text) && text.text.len() < whole.text.len());
        let (ids, all) = (
            decoder.encode(&text.text).unwrap(),
            decoder.encode(&whole.text).unwrap(),
        );
        assert!(ids.len() > 300 && ids[..300] == all[..300], "{}", text.name);
    }

    for (a, needle) in [
        (args("500", "prose"), "asked for"),
        (args("2", "poetry"), "unknown domain \"poetry\""),
    ] {
        let output = run(a);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && output.stdout.is_empty(),
            "{stderr}"
        );
        assert!(stderr.contains(needle), "{stderr}");
    }
}
