//! Independent audit of packed-KV evidence.
//!
//! The audit trusts nothing the runner wrote. From the protocol recorded in `manifest.json` it
//! re-derives every generated input (q, k and v of every seed, length and distribution, bit for
//! bit), re-decodes every code with its own decoder and holds it to the quantization rule,
//! recomputes every scale, attention output, metric, payload, summary figure, table cell and
//! chart marker, checks every hash, and requires the run's sources to be exactly the runner's
//! own, at the git commit the run records (or, without one, in the tree it is given:
//! [`common::sources`]). Of the charts it checks the figures, not the style: each
//! marker's data, panel and position, the axes, ticks, float32 line and legend entries, and that
//! nothing hides, moves or fakes a marker; colours, marker shapes and paint are the runner's to
//! choose ([`common::panels`]). It reads arrays.npz only in the canonical layout on which
//! NumPy and it cannot disagree, and it opens only regular files inside the directory and tree it
//! was given, with size caps; each file of an evidence directory is opened once, through one
//! handle on the directory, so what it hashes is what it parses ([`common::files::ConfinedDir`]).
//!
//! Inputs from a real model (a protocol with `model`: one input per text, length, layer and KV
//! head) are re-derived by **re-running the model** ([`packed_kv::model_inputs`]): the text is
//! re-tokenized and must give the recorded ids, and each pass's q, k and v must be the archived
//! arrays bit for bit. The model files are read once from the model cache
//! ([`Options::models`]), hashed against the audit's own pins and parsed from those same bytes
//! ([`common::model_files`]). Without the model the report is UNVERIFIED ([`Verdict`]), not
//! PASS; `--sample K` ([`Options::sample`]) re-runs K passes chosen from the evidence's hash.
//!
//! What it depends on, and why it may: `nprand` (NumPy's generator, pinned to NumPy's own vectors
//! by its tests) and `rand_chacha`/`rand_distr` to re-derive inputs (packed-KV draws, and the
//! Gaussian K/V of a model-quality study's attention error); `models` (the two models'
//! forward passes and tokenizers, pinned to the models' public NumPy references by their own
//! tests) with `gguf-file` (to parse the GGUF file it hashed) to re-run model passes, `libm` for
//! the format's log-softmax and KL arithmetic and `rayon` to re-run passes on every core;
//! `serde_json` to parse JSON, `sha2` to hash, `crc32fast` for the ZIP checksums, `pulldown-cmark` to read markdown as a
//! renderer does, `roxmltree` to read the SVG, `ndarray` for arrays, `walkdir` to list source
//! trees, `clap` and `anyhow` for the binary; `half` for IEEE 754's binary16 conversion (round
//! to nearest even), in which the literature's schemes store scales and KIVI computes
//! ([`model_quality::schemes`]): a conversion the standard defines, not a thing the audit checks.
//! It never depends on the codec, the studies or the runner, and shares no code with them: the
//! decoder, the quantization rule, the packed cache a model-quality pass reads, the literature's
//! schemes, attention, the strict npz reader and every table are written here again from the
//! evidence format's spec and the schemes' sources; the models' sizes and pinned hashes are its
//! own copy too ([`common::models::ModelName`]). (Its tests use the two studies' libraries
//! (`kvstudy`, `quality`), `evidence`, the codec and `kvschemes` as dev-dependencies, to make runs
//! to tamper with and to hold the audit's own implementations to theirs bit for bit; never the
//! runner.)
//!
//! # Model-quality evidence
//!
//! A directory whose manifest has format `model-quality-evidence/2` (a SmolLM2 run scoring
//! next-token quality with a packed KV cache or a scheme of the literature, `runner quality`) is checked by [`model_quality`]
//! instead: [`audit_dir`] chooses the checker by the manifest's `format`, and [`audit_pins`]
//! audits every pinned directory whatever its format.
//!
//! **What a PASS means for this format.** The audit re-runs SmolLM2 with its own packed cache
//! (its own implementation of each scheme, [`model_quality::schemes`]) and requires every per-position log-prob, KL value and argmax bit for bit, and every
//! generated id and text ([`model_quality::rerun`]); from those arrays it re-derives every
//! aggregate, bytes-per-token figure (its own cache-size rule, [`model_quality::bytes`]), value of
//! summary.json, cell of summary.md and chart marker, and checks every file's hash, the sources
//! and the model record.
//!
//! - [`audit_dir`]: one evidence directory (`audit DIR`);
//! - [`audit_pins`]: everything a root manifest pins (`audit`);
//! - [`audit_dir_with`], [`audit_pins_with`]: the same with [`Options`] (`audit --models DIR`);
//! - [`audit_opened`]: one directory already opened ([`common::files::ConfinedDir`]), as the
//!   root manifest's audit opens each pinned one.
//!
//! # Modules
//!
//! Three folders, each file one concern, with imports running one way only: `packed_kv` and
//! `model_quality` use `common`, `model_quality` uses `packed_kv`'s definition of a packed
//! setting (its mode and group axis, [`packed_kv::protocol::Mode`],
//! [`packed_kv::decoder::GroupAxis`]) and its study-name bound ([`packed_kv::bounds`]), and
//! nothing uses `model_quality` but this file (`scripts/check-module-cycles` holds every
//! folder's modules to a DAG).
//!
//! - [`common`]: what every evidence format needs: the strict npz reader ([`common::npz`]),
//!   confined reads ([`common::files`]), hashes, the output files listed and hashed
//!   ([`common::outputs`]), summary.md read as a renderer reads it ([`common::markdown`]), the
//!   SVG primitives and the chart-of-panels check both charts share ([`common::svg`],
//!   [`common::panels`]), the manifest pieces and provenance both formats record
//!   ([`common::manifest`], [`common::sources`], [`common::models`]), the root manifest's pins
//!   ([`common::pins`]), the report and every problem ([`common::report`],
//!   [`common::problem`]), tolerances and text helpers;
//! - [`packed_kv`]: packed-KV evidence, from its directory's top-level check
//!   ([`packed_kv::directory`]) down to the protocol, plan, bounds, inputs, decoder, attention,
//!   comparisons, tensors, rules, results, summary, timings, summary.md and chart;
//! - [`model_quality`]: model-quality evidence, its top-level check
//!   ([`model_quality::directory`]), protocol, cache-size rule, manifest, arrays, results,
//!   summary, tables and chart.
//!
//! This file holds only the entry points: it chooses a directory's checker by its manifest's
//! `format`, and audits what a root manifest pins.

pub mod common;
pub mod model_quality;
pub mod packed_kv;

use std::path::{Path, PathBuf};

use common::files::{ConfinedDir, MAX_TEXT_BYTES};
pub use common::manifest::ROOT_MANIFEST_FORMAT;
pub use common::options::{Models, Options, SampleDir, sample_size};
pub use common::outputs::MANIFEST;
pub use common::pins::find_root_manifest;
pub use common::report::{Checked, Note, Problem, Report, Verdict};
pub use model_quality::QUALITY_FORMAT;
pub use packed_kv::manifest::MANIFEST_FORMAT;
pub use packed_kv::{RUN_FILES, TIMINGS};

/// The workspace this audit was built from: where source hashes are checked by default.
pub fn default_tree() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Audits one evidence directory; source hashes are compared with the files in `tree`.
pub fn audit_dir(dir: &Path, tree: &Path) -> Report {
    audit_dir_with(dir, tree, &Options::default())
}

/// [`audit_dir`] with [`Options`]: `dir` is opened once ([`ConfinedDir::open`]) and audited
/// through that handle ([`audit_opened`]).
pub fn audit_dir_with(dir: &Path, tree: &Path, options: &Options) -> Report {
    match ConfinedDir::open(dir) {
        Ok(handle) => audit_opened(&handle, tree, options),
        Err(e) => {
            let mut report = Report::new(dir.display().to_string());
            report.fail(Problem::File(e));
            report
        }
    }
}

/// Audits an evidence directory already opened: every file in it is opened through `dir` and
/// read once (what is hashed is what is parsed), and `dir` records each file's hash
/// ([`ConfinedDir::hashes`]) for the root manifest's pins ([`audit_pins`]).
pub fn audit_opened(dir: &ConfinedDir, tree: &Path, options: &Options) -> Report {
    let mut report = Report::new(dir.path().display().to_string());
    let tree = tree.canonicalize().unwrap_or_else(|_| tree.to_path_buf());
    let manifest_bytes = match dir.read(MANIFEST, MAX_TEXT_BYTES) {
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
    if format.as_deref() == Some(QUALITY_FORMAT) {
        model_quality::directory::audit(dir, &tree, options, &manifest_bytes, &mut report);
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
    packed_kv::directory::audit(dir, &tree, options, &manifest_bytes, &mut report);
    report
}

/// Audits what a root manifest pins: each pinned file's hash, then each directory in full.
pub fn audit_pins(root_manifest: &Path, tree: &Path) -> Vec<Report> {
    audit_pins_with(root_manifest, tree, &Options::default())
}

/// [`audit_pins`] with [`Options`] (used for every pinned directory).
pub fn audit_pins_with(root_manifest: &Path, tree: &Path, options: &Options) -> Vec<Report> {
    common::pins::audit_pins(root_manifest, |dir| {
        audit_opened(dir, tree, &options.for_pinned(dir.path()))
    })
}
