//! Model-quality evidence (`model-quality-evidence/2`): what a decoder (SmolLM2 or Gemma 3,
//! [`geometry`]) scores when its KV cache is packed, checked from the arrays up.
//!
//! # What a PASS means for this format
//!
//! The audit re-runs the protocol's decoder ([`rerun`]): it re-tokenizes each text and requires the recorded
//! ids, runs the float32 pass and every run's pass with its own implementation of the packed
//! cache ([`cache`]) or of the run's scheme of the literature ([`schemes`]: KIVI, quanto,
//! llama.cpp's block types and rotation, this project's codec as a scheme) in the model's KV
//! hook (where the pass attended straight from the packed codes, with its own implementation of
//! that attention, [`packed_attention`]), and requires every per-position log-prob, KL value and argmax bit for bit, and every
//! generated id; a scheme whose codes were not what its rule gives therefore fails here.
//! KVQuant is calibrated on the protocol's calibration text: the audit re-tokenizes it and
//! requires `calibration_ids`, runs the float32 pass over it, re-fits each KVQuant scheme's
//! calibration with its own KVQuant ([`schemes::kvquant`]: fp16 key thresholds, k-means level
//! tables) and requires the archived calibration bit for bit; each KVQuant pass then reads the
//! audit's KVQuant cache against that calibration, and each layer's outlier count (which, with
//! the shape, decides its bytes) is re-run and required bit for bit too. From
//! those arrays it then re-derives every aggregate of results.json (NLL, perplexity, KL mean and
//! max, top-1 agreement, bits per element, first departure), every bytes-per-token figure (from
//! the setting, policy and T, or the scheme, schedule and T, with its own implementation of
//! each cache-size rule, [`bytes`] and [`schemes::stored_bytes`]; KVQuant's from its shape and
//! archived outlier counts, [`bytes::kvquant_bytes`]), every value of summary.json,
//! every cell of summary.md's tables (the ranked table at matched budgets with its frontier
//! column, [`frontier`]), every chart marker and each panel's frontier staircase, and it checks
//! each file's hash and the run's
//! sources as for packed-KV evidence. Without the model the report is UNVERIFIED (Pinsker's
//! inequality and the first generated token are still checked); with `--sample K` only the
//! passes it names were re-run. Generated text is not re-decoded: its report says so in a note.
//!
//! With an `attention` block ([`attention`]) the float32 pass of each text also measures every
//! (sampled) run's attention error at each layer with the audit's cache of the run and its own
//! attention arithmetic, and every run's error on Gaussian K/V (drawn again through `nprand`,
//! with the audit's caches and KVQuant re-fitted on the calibration draw), and with `matched` on
//! the draws moved to the archived per-channel statistics of the first text (which its float32
//! pass measures again), is re-derived without the model; all are required bit for bit, and summary.json's `attention` rows and summary.md's
//! attention table are derived from them, the Gaussian bits per element from the audit's own
//! byte rules (KVQuant's from its own outlier counts).
//!
//! With a `sensitivity` block ([`sensitivity`]) the named runs' perturbed passes are re-run
//! (each a pass of the sample) with the audit's own perturbation and cache and required bit for
//! bit; summary.json's `sensitivity` and summary.md's two sensitivity tables are derived from the
//! archived arrays.
//!
//! With `mechanisms` ([`mechanisms`]) each re-run float32 pass measures every layer's key
//! outlier ratios, key energy in channel means and first-token attention with the audit's own
//! arithmetic and requires `t{i}_mechanisms` bit for bit; summary.json's `mechanisms` and
//! summary.md's mechanisms table are derived from the archived (range-checked) values.
//!
//! With a `bootstrap` block ([`bootstrap`]) summary.json's intervals (every run's change against
//! the float32 cache, every pair's difference) and summary.md's two interval tables are
//! re-derived from the audit's own per-text values, with the resamples drawn again through
//! `nprand`.
//!
//! The checks:
//! - the protocol: schema and bounds ([`protocol`]), unknown fields refused; a KVQuant run needs
//!   a calibration text that is not evaluated;
//! - the files: exactly manifest.json and [`QUALITY_FILES`], each hashing as recorded; the
//!   sources as for packed-KV manifests ([`crate::common::sources`]); the model record pinned, its
//!   ids `t{i}` one list per text of T = min(max_tokens, the text's length) >= 2 ids below the
//!   model's vocabulary (SmolLM2 49,152, Gemma 3 262,144);
//! - arrays.npz: exactly the members the format lists, in order, each of its dtype and shape;
//!   `t{i}_ids` the manifest's ids; every log-prob finite and <= 0, every KL finite and >= 0
//!   (-1e-12 allowed for rounding), every argmax and generated id below the vocabulary; with a
//!   calibration, `calibration_ids` below it, thresholds finite fp16 values, levels
//!   ascending within [-1, 1], outlier counts within the cache ([`arrays`]);
//! - results.json, summary.json, summary.md and quality-vs-bytes.svg re-derived as above, to
//!   the audit's relative tolerance ([`crate::common::tolerance::close`]) for figures and
//!   exactly for rendered cells.

//!
//! The modules, one concern each: [`protocol`] (schema and bounds), [`geometry`] (the decoder's
//! sizes and sliding layers), [`bytes`] (the cache-size rule), [`cache`] (the packed cache a re-run reads), [`schemes`] (each scheme of the
//! literature, written again from its source), [`frontier`] (the Pareto frontier and the
//! matched-budget ranking), [`rerun`] (the passes re-run, and the
//! checks that need no model), [`manifest`] (the manifest and its model record), [`arrays`] (arrays.npz: members,
//! ranges and what each row derives from them), [`results`] (results.json), [`summary`] (the
//! aggregates over texts and summary.json), [`tables`] (summary.md), [`chart`]
//! (quality-vs-bytes.svg) and [`directory`] (the top-level check, in order).

pub mod arrays;
pub mod attention;
pub mod bootstrap;
pub mod bytes;
pub mod cache;
pub mod chart;
pub mod directory;
pub mod frontier;
pub mod geometry;
pub mod manifest;
pub mod mechanisms;
pub mod optional;
pub mod packed_attention;
pub mod protocol;
pub mod require;
pub mod rerun;
pub mod results;
pub mod schemes;
pub mod sensitivity;
pub mod summary;
pub mod tables;

/// The manifest format of model-quality evidence.
pub const QUALITY_FORMAT: &str = "model-quality-evidence/2";
/// The files a model-quality run writes besides manifest.json.
pub const QUALITY_FILES: [&str; 5] = [
    "arrays.npz",
    "results.json",
    "summary.json",
    "summary.md",
    "quality-vs-bytes.svg",
];
/// The chart.
pub const QUALITY_CHART: &str = "quality-vs-bytes.svg";
