//! The packed-KV study: reads a protocol, draws the inputs (or takes a real model's K/V),
//! quantizes K and V with the KV codec under every setting, recomputes attention, and writes a
//! self-describing evidence directory; a protocol's shards run apart and merge byte-identically.
//!
//! [`run::run_protocol`] is the one entry point the `runner` binary and the tests share.
//!
//! Modules, each depending only on those listed before it:
//! - [`protocol`]: the protocol's schema and bounds;
//! - [`plan`]: what a protocol asks for: inputs, configurations, token segments, ids and labels;
//! - [`archive`]: what arrays.npz will hold, planned from the protocol (members and size);
//! - [`validate`]: reading and validating a protocol file;
//! - [`inputs`]: generators and distributions, and a real model's cache; [`attention`]:
//!   reference attention and metrics;
//! - [`study`]: one comparison; [`timing`]: raw timings of encode, decode and attention;
//!   [`pipeline`]: a run's passes over its inputs, comparisons in parallel, arrays streamed out;
//! - [`summary`]: the tables; [`manifest`]: the run's manifest (provenance is the `evidence`
//!   crate's); [`report`]: summary.md; [`plot`]: error-vs-bytes.svg;
//! - [`write`](mod@write): the evidence directory's files; [`run`]: a protocol (or one shard) from start to
//!   finish; [`merge`]: one directory from a protocol's shards;
//! - [`capture`]: `runner kv`, what a real model computed for one text, as an `.npz`.

pub mod archive;
pub mod attention;
pub mod capture;
pub mod inputs;
pub mod manifest;
pub mod merge;
pub mod pipeline;
pub mod plan;
pub mod plot;
pub mod protocol;
pub mod report;
pub mod run;
pub mod study;
pub mod summary;
pub mod timing;
pub mod validate;
pub mod write;
