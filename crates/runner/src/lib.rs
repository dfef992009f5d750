//! The packed-KV study runner: reads a frozen protocol, draws the inputs, quantizes K and V with
//! the codec under every setting, recomputes attention, and writes a self-describing evidence
//! directory.
//!
//! - [`protocol`]: the protocol file and its validation;
//! - [`archive`]: what arrays.npz will hold, planned from the protocol (members and size);
//! - [`inputs`]: generators and distributions;
//! - [`attention`]: reference attention and error metrics;
//! - [`study`]: the comparisons;
//! - [`timing`]: raw timings of encode, decode and attention;
//! - [`summary`]: the tables; [`report`]: summary.md; [`plot`]: error-vs-bytes.svg;
//! - [`evidence`]: the evidence directory;
//! - [`manifest`]: provenance and hashes;
//! - [`pin`]: the root manifest that pins archived evidence;

pub mod archive;
pub mod attention;
pub mod evidence;
pub mod hashing;
pub mod inputs;
pub mod manifest;
pub mod pin;
pub mod plot;
pub mod protocol;
pub mod report;
pub mod study;
pub mod summary;
pub mod timing;
