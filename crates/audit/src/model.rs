//! The audit's own reading of an evidence directory's JSON files. It does not share types with
//! the runner: fields are declared here from the evidence format, and unknown fields in the
//! protocol and results are refused, since the audit cannot vouch for what it does not read.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

pub const MANIFEST_FORMAT: &str = "packed-kv-evidence/1";
pub const ROOT_MANIFEST_FORMAT: &str = "evidence-pins/1";

#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub protocol: Protocol,
    pub source_roots: Vec<String>,
    pub sources: BTreeMap<String, String>,
    pub outputs: BTreeMap<String, String>,
    pub git: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Protocol {
    pub study: String,
    pub seeds: Vec<u64>,
    pub tokens: Vec<usize>,
    pub features: usize,
    pub queries: usize,
    pub distributions: Vec<String>,
    pub focus: Focus,
    pub settings: Vec<Setting>,
    pub generator: serde_json::Value,
    #[serde(default)]
    pub budget: Option<Budget>,
    #[serde(default)]
    pub timing: Option<Timing>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    pub group_size: usize,
    pub low_bits: u32,
    pub window: usize,
    pub policies: Vec<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timing {
    pub warmup: usize,
    pub repeats: usize,
    pub shuffle_seed: u64,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Focus {
    pub window: usize,
    pub gain: f32,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Setting {
    pub group_size: usize,
    pub bits: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultRow {
    pub id: String,
    pub study: String,
    pub input: String,
    pub seed: u64,
    pub tokens: usize,
    pub features: usize,
    pub queries: usize,
    pub distribution: String,
    pub group_size: usize,
    pub bits: u32,
    pub policy: Option<String>,
    pub window: Option<usize>,
    pub segments: Vec<SegmentRow>,
    pub k_axis: String,
    pub v_axis: String,
    pub relative_l2: f64,
    pub max_abs: f64,
    pub k_payload_bytes: usize,
    pub v_payload_bytes: usize,
    pub payload_bytes: usize,
    pub baseline_bytes: usize,
}

/// One token segment of a comparison, as results.json describes it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SegmentRow {
    pub start: usize,
    pub end: usize,
    /// `quantized` or `float32`.
    pub storage: String,
    #[serde(default)]
    pub bits: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    pub about: String,
    pub float32_kv_bytes: BTreeMap<String, usize>,
    pub packed_kv: Vec<PackedRow>,
    pub budget: Vec<BudgetRow>,
    pub timings: Vec<TimingRow>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackedRow {
    pub group_size: usize,
    pub bits: u32,
    pub clean_inputs: usize,
    pub mean_relative_l2_clean: Option<f64>,
    pub mean_relative_l2_clean_percent: Option<String>,
    pub mean_relative_l2: BTreeMap<String, f64>,
    pub payload_bytes: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetRow {
    pub policy: String,
    pub group_size: usize,
    pub low_bits: u32,
    pub window: usize,
    pub mean_relative_l2: BTreeMap<String, f64>,
    pub payload_bytes: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimingRow {
    pub config: String,
    pub tokens: usize,
    pub operation: String,
    pub median_ns: u64,
    pub measurements: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timings {
    pub about: String,
    pub unit: String,
    pub clock: String,
    pub warmup: usize,
    pub repeats: usize,
    pub shuffle_seed: u64,
    pub measurements: Vec<Measurement>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measurement {
    pub order: usize,
    pub comparison: String,
    pub operation: String,
    pub repeat: usize,
    pub ns: u64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RootManifest {
    pub format: String,
    pub evidence: BTreeMap<String, PinnedDir>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PinnedDir {
    pub files: BTreeMap<String, String>,
}

/// Reads and parses a JSON file, or says in one line why it cannot.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("malformed {}: {e}", path.display()))
}

/// Identifier of an input, as the evidence names it.
pub fn input_id(seed: u64, tokens: usize, distribution: &str) -> String {
    format!("s{seed}_n{tokens}_{distribution}")
}

/// Identifier of a packed-KV comparison, as the evidence names it.
pub fn comparison_id(input: &str, setting: &Setting) -> String {
    format!("{input}_g{}_b{}", setting.group_size, setting.bits)
}

/// Identifier of a budget comparison, as the evidence names it.
pub fn budget_id(input: &str, policy: &str) -> String {
    format!("{input}_budget_{policy}")
}
