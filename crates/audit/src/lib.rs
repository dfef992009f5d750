//! Independent audit of packed-KV evidence.
//!
//! The audit trusts nothing the runner wrote. From the protocol recorded in `manifest.json` it
//! re-derives every generated input (q, k and v of every seed, length and distribution, bit for
//! bit), re-decodes every code with its own decoder and holds it to the quantization rule,
//! recomputes every scale, attention output, metric, payload, summary figure, table cell and
//! chart marker, checks every hash, and requires the run's sources to be exactly the runner's
//! own, matching the tree it is given. Of the charts it checks the figures, not the style: each
//! marker's data, panel and position, the axes, ticks, float32 line and legend entries, and that
//! nothing hides, moves or fakes a marker; colours, marker shapes and paint are the runner's to
//! choose ([`chart`]). It reads arrays.npz only in the canonical layout on which
//! NumPy and it cannot disagree, and it opens only regular files inside the directory and tree it
//! was given, with size caps.
//!
//! Inputs from a real model (a protocol with `model`: one input per text, length, layer and KV
//! head) are the one thing it does not re-derive: **the audit does not re-run the model.** It
//! takes their q, k and v from arrays.npz (f32, exact shapes, every value finite) and checks
//! everything downstream exactly as for generated inputs (reference attention, codes, scales,
//! outputs, metrics, payloads, tables, chart). What the recorded q, k and v rest on is the
//! model's weight hash (the manifest's `model` record, held to the audit's own pins, and with
//! `--models DIR` ([`Options::models`]) the file itself hashed), the token ids the manifest
//! records for each pass (one list per text and length, of the right length and range), and the
//! runner's own test that a model run is byte-reproducible. Every report on a model run says so
//! in a note ([`report::Note::ModelNotRerun`]).
//!
//! What it depends on, and why it may: `nprand` (NumPy's generator, pinned to NumPy's own vectors
//! by its tests) and `rand_chacha`/`rand_distr` to re-derive inputs; `serde_json` to parse JSON,
//! `sha2` to hash, `crc32fast` for the ZIP checksums, `pulldown-cmark` to read markdown as a
//! renderer does, `roxmltree` to read the SVG, `ndarray` for arrays, `walkdir` to list source
//! trees, `clap` and `anyhow` for the binary. It never depends on the codec or the runner, and
//! shares no code with them: the decoder, the quantization rule, attention, the strict npz reader
//! and every table are written here again from the evidence format's spec; the models' sizes and
//! pinned hashes are its own copy too ([`protocol::ModelName`]). (Its tests use the runner, the
//! codec and the models crate as dev-dependencies, to make runs to tamper with and to find the
//! model files.)
//!
//! # Model-quality evidence
//!
//! A directory whose manifest has format `model-quality-evidence/1` (a SmolLM2 run scoring
//! next-token quality with a packed KV cache, `runner quality`) is checked by [`quality`]
//! instead: [`audit_dir`] chooses the checker by the manifest's `format`, and [`audit_pins`]
//! audits every pinned directory whatever its format.
//!
//! **What a PASS means for this format.** The per-position log-probs, KL values and argmaxes
//! (and generated ids) rest on the model's hash, the recorded token ids and the runner's
//! byte-reproducibility test: the audit does not run the model (no second forward pass). It
//! re-derives every aggregate of results.json, every bytes-per-token figure (its own
//! implementation of the cache-size rule, [`quality::bytes`]), every value of summary.json,
//! every cell of summary.md's tables and every chart marker from them, checks every file's hash,
//! the sources and the model record, and holds the arrays to their ranges. Generated text is not
//! re-decoded (no tokenizer): only `first_departure` is checked against the generated ids, and
//! the report says so in a note.
//!
//! - [`audit_dir`]: one evidence directory (`audit DIR`);
//! - [`audit_pins`]: everything a root manifest pins (`audit`);
//! - [`audit_dir_with`], [`audit_pins_with`]: the same with [`Options`] (`audit --models DIR`).

pub mod attention;
pub mod bounds;
pub mod chart;
pub mod comparisons;
pub mod decoder;
pub mod files;
pub mod hashes;
pub mod inputs;
pub mod manifest;
pub mod markdown;
pub mod npz;
pub mod plan;
pub mod problem;
pub mod protocol;
pub mod quality;
pub mod report;
pub mod results;
pub mod rules;
pub mod sources;
pub mod summary;
pub mod tensors;
pub mod text;
pub mod timings;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use files::{EntryKind, FileError, MAX_TEXT_BYTES};
use manifest::{MANIFEST_FORMAT, Manifest, ROOT_MANIFEST_FORMAT, RootManifest};
pub use report::{Checked, Note, Problem, Report};

/// The files a run writes besides manifest.json (timings.json only when the protocol times).
pub const RUN_FILES: [&str; 5] = [
    "arrays.npz",
    "results.json",
    "summary.json",
    "summary.md",
    "error-vs-bytes.svg",
];
/// The raw timings file.
pub const TIMINGS: &str = "timings.json";
/// The manifest.
pub const MANIFEST: &str = "manifest.json";

/// The workspace this audit was built from: where source hashes are checked by default.
pub fn default_tree() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub(crate) fn parse_json<T: DeserializeOwned>(file: &str, bytes: &[u8]) -> Result<T, Problem> {
    serde_json::from_slice(bytes).map_err(|e| Problem::Json {
        file: file.to_string(),
        message: e.to_string(),
    })
}

/// What an audit may use besides the evidence and the tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// A model cache (`audit --models DIR`): for a model run, `DIR/<name>/<weight file>` is
    /// hashed and must have the SHA-256 the manifest records. None (the default): the file is
    /// not checked, and the report says so in a note; the audit never needs the model itself.
    pub models: Option<PathBuf>,
}

/// Audits one evidence directory; source hashes are compared with the files in `tree`.
pub fn audit_dir(dir: &Path, tree: &Path) -> Report {
    audit_dir_with(dir, tree, &Options::default())
}

/// [`audit_dir`] with [`Options`].
pub fn audit_dir_with(dir: &Path, tree: &Path, options: &Options) -> Report {
    let mut report = Report::new(dir.display().to_string());
    let dir = match dir.canonicalize() {
        Ok(d) if d.is_dir() => d,
        _ => {
            report.fail(Problem::File(FileError::NotRegular {
                path: dir.to_path_buf(),
            }));
            return report;
        }
    };
    let tree = tree.canonicalize().unwrap_or_else(|_| tree.to_path_buf());
    let manifest_bytes = match files::read_confined(&dir, MANIFEST, MAX_TEXT_BYTES) {
        Ok(bytes) => bytes,
        Err(e) => {
            report.fail(Problem::File(e));
            return report;
        }
    };
    // The format first, so an older or foreign manifest is named as such.
    let format = serde_json::from_slice::<serde_json::Value>(&manifest_bytes)
        .ok()
        .and_then(|v| v.get("format").and_then(|f| f.as_str()).map(String::from));
    if format.as_deref() == Some(quality::QUALITY_FORMAT) {
        quality::audit(&dir, &tree, options, &manifest_bytes, &mut report);
        return report;
    }
    if let Some(found) = format.filter(|f| f != MANIFEST_FORMAT) {
        report.fail(Problem::Format {
            file: MANIFEST.into(),
            found,
            expected: MANIFEST_FORMAT,
        });
        return report;
    }
    let manifest: Manifest = match parse_json(MANIFEST, &manifest_bytes) {
        Ok(m) => m,
        Err(problem) => {
            report.fail(problem);
            return report;
        }
    };
    if let Err(e) = manifest.protocol.validate() {
        report.fail(Problem::Protocol(e));
        return report;
    }
    let Some(scope) = check_scope(&manifest, &manifest_bytes, &mut report) else {
        return report;
    };
    let (outputs, archive) = read_outputs(&dir, &manifest, &mut report);
    sources::check(&tree, &manifest, &mut report);
    check_manifest_fields(&tree, &manifest, scope, &mut report);
    manifest::check_model(
        &manifest,
        &plan::inputs_of(&manifest.protocol, scope.shard),
        options.models.as_deref(),
        &mut report,
    );
    check_contents(&manifest, scope, outputs, archive, &mut report);
    report
}

/// What part of its protocol a directory holds: all of it (a run or a merge of N shards), or
/// one shard's slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope {
    /// `(index, count)` for a shard's run.
    pub shard: Option<(usize, usize)>,
    /// N for a merged run.
    pub merged: Option<usize>,
}

/// Checks the manifest's shard or merge record against the protocol; None if the directory
/// cannot be checked further.
fn check_scope(manifest: &Manifest, manifest_bytes: &[u8], report: &mut Report) -> Option<Scope> {
    let inputs = manifest.protocol.input_count();
    let mut fail = |field, found: String, expected: String| {
        report.fail(Problem::Manifest {
            field,
            found,
            expected,
        })
    };
    let shard = match &manifest.shard {
        None => None,
        Some(record) => {
            if record.count == 0
                || !(1..=record.count).contains(&record.index)
                || record.count > inputs
            {
                fail(
                    "shard",
                    format!("{} of {}", record.index, record.count),
                    format!("1 <= index <= count <= {inputs} inputs"),
                );
                return None;
            }
            // The hash of the protocol object exactly as recorded: compact, keys sorted.
            let recorded = serde_json::from_slice::<serde_json::Value>(manifest_bytes)
                .ok()
                .and_then(|v| v.get("protocol").map(|p| p.to_string()))
                .map(|text| hashes::sha256_hex(text.as_bytes()));
            if recorded.as_deref() != Some(record.protocol_sha256.as_str()) {
                fail(
                    "shard.protocol_sha256",
                    record.protocol_sha256.clone(),
                    recorded.unwrap_or_default(),
                );
            }
            Some((record.index, record.count))
        }
    };
    let merged = match &manifest.merged_from {
        None => None,
        Some(shards) => {
            let indices: Vec<usize> = shards.iter().map(|s| s.index).collect();
            let hex = shards.iter().all(|s| {
                s.manifest_sha256.len() == 64
                    && s.manifest_sha256
                        .bytes()
                        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            });
            if indices != (1..=shards.len()).collect::<Vec<_>>() || shards.len() > inputs || !hex {
                fail(
                    "merged_from",
                    format!("shards {indices:?}"),
                    "shards 1 to N, each once, in order, with their manifests' SHA-256".into(),
                );
                return None;
            }
            Some(shards.len())
        }
    };
    if shard.is_some() && merged.is_some() {
        fail(
            "shard",
            "both a shard and a merge".into(),
            "one or the other".into(),
        );
        return None;
    }
    // A run records the worker threads it used; a merge computed nothing (its shards' manifests
    // record theirs).
    match (merged, manifest.threads) {
        (None, Some(1..)) | (Some(_), None) => {}
        (None, found) => fail(
            "threads",
            format!("{found:?}"),
            "the worker thread count, at least 1".into(),
        ),
        (Some(_), Some(found)) => fail(
            "threads",
            found.to_string(),
            "absent in a merged run".into(),
        ),
    }
    Some(Scope { shard, merged })
}

/// The files a run of this manifest's protocol writes, besides the manifest.
fn run_files(manifest: &Manifest) -> Vec<&'static str> {
    let mut files = RUN_FILES.to_vec();
    if manifest.protocol.timing.is_some() {
        files.push(TIMINGS);
    }
    files
}

/// The text files of a run, read whole (each is parsed whole, under [`MAX_TEXT_BYTES`]).
type Texts = BTreeMap<&'static str, Vec<u8>>;

/// Checks the directory holds exactly the run's files, that the manifest lists exactly those,
/// and that each hashes as recorded; returns the bytes of the text files that could be read, and
/// arrays.npz opened and checked (or the rule it breaks) if it could be read.
///
/// arrays.npz is never read whole: its one sequential pass ([`npz::Archive::open`]) computes the
/// hash checked here and checks the archive's rules, and its arrays are read when the checks of
/// [`comparisons`] ask for them, each verified to be the bytes that pass hashed.
fn read_outputs(
    dir: &Path,
    manifest: &Manifest,
    report: &mut Report,
) -> (Texts, Option<Result<npz::Archive, npz::NpzError>>) {
    read_files(dir, &run_files(manifest), &manifest.outputs, report)
}

/// The shared part of every format's file check: the directory holds exactly `expected` (and
/// manifest.json), the manifest's `outputs` list exactly those, and each hashes as recorded;
/// returns the text files' bytes and arrays.npz opened (or the rule it breaks).
fn read_files(
    dir: &Path,
    expected: &[&'static str],
    outputs: &BTreeMap<String, String>,
    report: &mut Report,
) -> (Texts, Option<Result<npz::Archive, npz::NpzError>>) {
    let expected = expected.to_vec();
    let listed: BTreeSet<&str> = outputs.keys().map(String::as_str).collect();
    for name in &listed {
        if !expected.contains(name) {
            report.fail(Problem::UnexpectedListing {
                name: name.to_string(),
            });
        }
    }
    for name in &expected {
        if !listed.contains(name) {
            report.fail(Problem::MissingListing {
                name: name.to_string(),
            });
        }
    }
    match files::list_dir(dir) {
        Ok(entries) => {
            for (name, kind) in entries {
                let known = name == MANIFEST || expected.contains(&name.as_str());
                if !known || kind != EntryKind::File {
                    report.fail(Problem::UnexpectedFile { name });
                }
            }
        }
        Err(e) => report.fail(Problem::File(e)),
    }
    let mut texts = BTreeMap::new();
    let mut archive = None;
    for name in expected {
        let read = if name == "arrays.npz" {
            open_archive(dir, name).map(|scanned| {
                archive = Some(scanned.archive);
                scanned.sha256
            })
        } else {
            files::read_confined(dir, name, MAX_TEXT_BYTES).map(|bytes| {
                let hash = hashes::sha256_hex(&bytes);
                texts.insert(name, bytes);
                hash
            })
        };
        match read {
            Ok(actual) => {
                if let Some(recorded) = outputs.get(name) {
                    if &actual != recorded {
                        report.fail(Problem::Hash {
                            file: name.to_string(),
                            recorded: hashes::short(recorded),
                            actual: hashes::short(&actual),
                        });
                    }
                    report.count(Checked::OutputHashes, 1);
                }
            }
            Err(e) => report.fail(Problem::File(e)),
        }
    }
    (texts, archive)
}

/// Opens arrays.npz confined and makes its one pass: its hash and its reading.
pub(crate) fn open_archive(dir: &Path, name: &str) -> Result<npz::Scanned, FileError> {
    let (file, len) = files::open_confined(dir, name, npz::zip::MAX_ARCHIVE_BYTES)?;
    npz::Archive::open(file, len).map_err(|e| match e {
        npz::ScanError::Io(error) => FileError::Io {
            path: dir.join(name),
            error,
        },
        npz::ScanError::Length { before, after } => FileError::Changed {
            path: dir.join(name),
            before,
            after,
        },
    })
}

/// The manifest's counts, tool, and (for a protocol from the tree) the protocol itself.
fn check_manifest_fields(tree: &Path, manifest: &Manifest, scope: Scope, report: &mut Report) {
    let p = &manifest.protocol;
    let inputs = plan::inputs_of(p, scope.shard).len();
    let comparisons = inputs * p.configurations();
    let timings = p
        .timing
        .map_or(0, |t| comparisons * timings::OPERATIONS.len() * t.repeats);
    for (field, found, expected) in [
        ("counts.inputs", manifest.counts.inputs, inputs),
        (
            "counts.comparisons",
            manifest.counts.comparisons,
            comparisons,
        ),
        ("counts.timings", manifest.counts.timings, timings),
    ] {
        if found != expected {
            report.fail(Problem::Manifest {
                field,
                found: found.to_string(),
                expected: expected.to_string(),
            });
        }
    }
    if manifest.tool.name != "runner" {
        report.fail(Problem::Manifest {
            field: "tool.name",
            found: manifest.tool.name.clone(),
            expected: "runner".into(),
        });
    }
    // A protocol read from a file of the tree must be that file's protocol.
    let source = manifest.protocol_source.as_str();
    let path = source.strip_prefix("embedded ").unwrap_or(source);
    if path.starts_with("experiments/") {
        let from_tree = files::read_confined(tree, path, MAX_TEXT_BYTES)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<protocol::Protocol>(&bytes).ok());
        if from_tree.as_ref() != Some(p) {
            report.fail(Problem::Manifest {
                field: "protocol",
                found: "the protocol recorded".into(),
                expected: format!("the tree's {path}"),
            });
        }
    }
}

/// Everything inside the files: results, arrays, summary, markdown, chart, timings.
fn check_contents(
    manifest: &Manifest,
    scope: Scope,
    outputs: Texts,
    archive: Option<Result<npz::Archive, npz::NpzError>>,
    report: &mut Report,
) {
    let p = &manifest.protocol;
    let inputs = plan::inputs_of(p, scope.shard);
    let comparisons = plan::comparisons(p, &inputs);
    let configs = plan::configs(p);
    let labels: Vec<String> = configs.iter().map(|c| c.label()).collect();
    let parsed = |name: &'static str| outputs.get(name).map(|bytes| (name, bytes));

    let rows =
        match parsed("results.json").map(|(n, b)| parse_json::<Vec<results::ResultRow>>(n, b)) {
            Some(Ok(rows)) => results::check(p, &inputs, &comparisons, rows, report),
            Some(Err(problem)) => {
                report.fail(problem);
                BTreeMap::new()
            }
            None => BTreeMap::new(),
        };
    let recomputed = match archive {
        Some(Ok(archive)) => {
            report.count(Checked::ArchiveMembers, archive.names().len());
            comparisons::check(p, &inputs, &comparisons, &rows, &archive, report)
        }
        Some(Err(e)) => {
            report.fail(Problem::Archive(e));
            BTreeMap::new()
        }
        None => BTreeMap::new(),
    };
    let timings = match (p.timing, parsed(TIMINGS)) {
        (Some(timing), Some((name, bytes))) => match parse_json::<timings::Timings>(name, bytes) {
            Ok(t) => {
                // In a merged run each measurement records the shard that made it.
                let shard_of = scope.merged.map(|count| {
                    let all = inputs.len();
                    comparisons
                        .iter()
                        .map(|e| {
                            let shard = (1..=count)
                                .find(|i| {
                                    ((i - 1) * all / count..i * all / count).contains(&e.input)
                                })
                                .unwrap_or(0);
                            (e.id.clone(), shard)
                        })
                        .collect::<BTreeMap<String, usize>>()
                });
                timings::check(&timing, &comparisons, &t, shard_of.as_ref(), report);
                Some(t)
            }
            Err(problem) => {
                report.fail(problem);
                None
            }
        },
        _ => None,
    };
    let complete = recomputed.len() == comparisons.len();
    let summary = match parsed("summary.json").map(|(n, b)| parse_json::<summary::Summary>(n, b)) {
        Some(Ok(s)) => s,
        Some(Err(problem)) => return report.fail(problem),
        None => return,
    };
    let tables = summary::Tables::new(p, &inputs, &comparisons, &recomputed);
    if complete {
        summary::check(p, &tables, &summary, report);
    }
    timings::check_medians(
        &inputs,
        &comparisons,
        &labels,
        &p.tokens,
        timings.as_ref(),
        &summary,
        report,
    );
    if let Some(md) = outputs.get("summary.md") {
        match std::str::from_utf8(md) {
            Ok(text) => markdown::check(text, p, scope, &summary, manifest, report),
            Err(_) => report.fail(Problem::Markdown(markdown::MarkdownProblem::Markup {
                what: "bytes that are not UTF-8".into(),
            })),
        }
    }
    if let Some(svg) = outputs.get("error-vs-bytes.svg")
        && complete
    {
        match std::str::from_utf8(svg) {
            Ok(text) => chart::check(
                text,
                p,
                &inputs,
                &comparisons,
                &configs,
                &recomputed,
                report,
            ),
            Err(_) => report.fail(Problem::Chart(chart::ChartProblem::Document {
                reason: "not UTF-8".into(),
            })),
        }
    }
}

/// The root manifest `audit` uses when given no directory: `manifest.json` in `start` or the
/// nearest directory above it whose `format` is the root manifest's (a run's own manifest.json,
/// met inside an evidence directory, is passed over). The path is `start`-relative (`../..`), so
/// reports name it as a user in `start` would.
pub fn find_root_manifest(start: &Path) -> Option<PathBuf> {
    let mut relative = PathBuf::new();
    for dir in start.ancestors() {
        let candidate = dir.join(MANIFEST);
        let is_root = files::read_regular(&candidate, MAX_TEXT_BYTES)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .is_some_and(|v| {
                v.get("format").and_then(|f| f.as_str()) == Some(ROOT_MANIFEST_FORMAT)
            });
        if is_root {
            return Some(relative.join(MANIFEST));
        }
        relative.push("..");
    }
    None
}

/// Audits what a root manifest pins: each pinned file's hash, then each directory in full.
pub fn audit_pins(root_manifest: &Path, tree: &Path) -> Vec<Report> {
    audit_pins_with(root_manifest, tree, &Options::default())
}

/// [`audit_pins`] with [`Options`] (used for every pinned directory).
pub fn audit_pins_with(root_manifest: &Path, tree: &Path, options: &Options) -> Vec<Report> {
    let mut pins = Report::new(root_manifest.display().to_string());
    let root: RootManifest = match files::read_regular(root_manifest, MAX_TEXT_BYTES) {
        Ok(bytes) => {
            let format = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.get("format").and_then(|f| f.as_str()).map(String::from));
            if let Some(found) = format.filter(|f| f != ROOT_MANIFEST_FORMAT) {
                pins.fail(Problem::Format {
                    file: root_manifest.display().to_string(),
                    found,
                    expected: ROOT_MANIFEST_FORMAT,
                });
                return vec![pins];
            }
            match parse_json(&root_manifest.display().to_string(), &bytes) {
                Ok(root) => root,
                Err(problem) => {
                    pins.fail(problem);
                    return vec![pins];
                }
            }
        }
        Err(e) => {
            pins.fail(Problem::File(e));
            return vec![pins];
        }
    };
    if root.evidence.is_empty() {
        pins.fail(Problem::Pin("it pins no evidence".into()));
    }
    // Relative to the root manifest's directory (the current one for a bare `manifest.json`).
    let base = root_manifest.parent().unwrap_or(Path::new(""));
    let mut reports = Vec::new();
    for (dir, pinned) in &root.evidence {
        let path = match files::confined_path(base, dir) {
            Ok(path) => path,
            Err(e) => {
                pins.fail(Problem::Pin(e.to_string()));
                continue;
            }
        };
        if !pinned.files.contains_key(MANIFEST) {
            pins.fail(Problem::Pin(format!(
                "{dir}: its manifest.json is not pinned"
            )));
        }
        let present: BTreeSet<String> = match files::list_dir(&path) {
            Ok(entries) => entries.into_iter().map(|(name, _)| name).collect(),
            Err(e) => {
                pins.fail(Problem::File(e));
                BTreeSet::new()
            }
        };
        for name in present.iter().filter(|n| !pinned.files.contains_key(*n)) {
            pins.fail(Problem::Pin(format!("{dir}/{name} is not pinned")));
        }
        for (name, recorded) in &pinned.files {
            let cap = npz::zip::MAX_ARCHIVE_BYTES;
            match files::plain_components(name)
                .ok()
                .filter(|parts| parts.len() == 1)
                .map(|_| files::sha256_confined(&path, name, cap))
            {
                Some(Ok(actual)) => {
                    if &actual != recorded {
                        pins.fail(Problem::Hash {
                            file: format!("{dir}/{name}"),
                            recorded: hashes::short(recorded),
                            actual: hashes::short(&actual),
                        });
                    }
                }
                Some(Err(e)) => pins.fail(Problem::File(e)),
                None => pins.fail(Problem::Pin(format!(
                    "{dir}: {name:?} is not a plain file name"
                ))),
            }
            pins.count(Checked::PinnedFiles, 1);
        }
        reports.push(audit_dir_with(&path, tree, options));
    }
    reports.insert(0, pins);
    reports
}
