//! Packed-KV evidence (`packed-kv-evidence/1`, `runner`): attention outputs of packed K/V
//! against float32, every input, code, scale, output, metric, table cell and chart marker
//! re-derived.

pub mod attention;
pub mod bounds;
pub mod chart;
pub mod comparisons;
pub mod decoder;
pub mod directory;
pub mod inputs;
pub mod manifest;
pub mod markdown;
pub mod model_inputs;
pub mod plan;
pub mod protocol;
pub mod results;
pub mod rules;
pub mod summary;
pub mod tensors;
pub mod timings;

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
