//! The packed-KV study runner: reads a protocol, draws the inputs, quantizes K and V with the
//! KV codec under every setting, recomputes attention, and writes a self-describing evidence
//! directory.
//!
//! Modules, each depending only on those listed before it:
//! - [`format`](mod@format): how numbers are printed; [`hashing`]: SHA-256 of outputs and sources;
//! - [`protocol`]: the protocol's schema and bounds;
//! - [`plan`]: what a protocol asks for: inputs, configurations, token segments, ids and labels;
//! - [`archive`]: what arrays.npz will hold, planned from the protocol (members and size);
//! - [`validate`]: reading and validating a protocol file;
//! - [`inputs`]: generators and distributions, and a real model's cache; [`attention`]:
//!   reference attention and metrics;
//! - [`study`]: one comparison; [`timing`]: raw timings of encode, decode and attention;
//!   [`pipeline`]: a run's passes over its inputs, comparisons in parallel, arrays streamed out;
//! - [`summary`]: the tables; [`manifest`]: provenance and hashes; [`report`]: summary.md;
//!   [`plot`]: error-vs-bytes.svg;
//! - [`evidence`]: the evidence directory; [`merge`]: one directory from a protocol's shards;
//!   [`pin`]: the root manifest that pins archived evidence;
//! - [`kv`]: `runner kv`, what a real model computed for one text, as an `.npz`;
//!   [`quality`](mod@quality): `runner quality`, what a packed cache does to SmolLM2 on one text
//!   (the measurements are the `quality` crate's); [`quality_study`]: `runner quality --protocol`,
//!   an archived model-quality study, with its summary.md ([`quality_report`]) and chart
//!   ([`quality_plot`]), written as an evidence directory by [`quality_evidence`].

pub mod archive;
pub mod attention;
pub mod chart_style;
pub mod evidence;
pub mod format;
pub mod hashing;
pub mod inputs;
pub mod kv;
pub mod manifest;
pub mod merge;
pub mod pin;
pub mod pipeline;
pub mod plan;
pub mod plot;
pub mod protocol;
pub mod quality;
pub mod quality_evidence;
pub mod quality_plot;
pub mod quality_report;
pub mod quality_study;
pub mod report;
pub mod study;
pub mod summary;
pub mod timing;
pub mod validate;
