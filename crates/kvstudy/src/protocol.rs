//! The study protocol's schema: everything a run needs, as the JSON file spells it.
//!
//! The packed-KV protocol ships inside the binary ([`FROZEN`]), so `runner --out DIR` works from
//! any directory; `--protocol FILE` runs a user-written one. Reading and validating a protocol is
//! [`crate::validate`]'s job (with the bounds below); what a protocol asks a run to do (inputs,
//! configurations, token segments, ids) is [`crate::plan`]'s.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The frozen packed-KV protocol, embedded at build time.
pub const FROZEN: &str = include_str!("../../../experiments/packed-kv/protocol.json");

/// Where the frozen protocol lives in the repository (recorded in manifests).
pub const FROZEN_PATH: &str = "experiments/packed-kv/protocol.json";

pub use evidence::MAX_STUDY_NAME_CHARS;

/// Largest K, V or q a protocol may ask for, in elements (2^27: 512 MiB as f32; a run holds a
/// few such matrices and their f64 decodings at once). The same bound applies to the padded
/// grouped view (rows x padded row length) of every tensor a run stores, since the encoder
/// allocates the padded codes, and a group far longer than the tensor pads it without limit.
pub const MAX_MATRIX_ELEMENTS: usize = 1 << 27;

/// Most configurations (settings plus budget policies) a protocol may hold: the chart draws each
/// series with its own look, and the audit requires distinct series to look distinct; the
/// chart has that many ([`evidence::chart::DISTINCT_SERIES`]). A larger sweep is split into
/// several protocols.
pub const MAX_CONFIGURATIONS: usize = evidence::chart::DISTINCT_SERIES;
/// Largest number of timed (or warm-up) calls a protocol may ask for; every timed call is one
/// line of timings.json.
pub const MAX_TIMED_CALLS: usize = 1_000_000;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Protocol {
    /// A name for the study this protocol serves.
    pub study: String,
    /// Seeds of the generated draws (empty, and left out, for a model's inputs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seeds: Vec<u64>,
    /// Sequence lengths N.
    pub tokens: Vec<usize>,
    /// Head dimension D.
    pub features: usize,
    /// Query rows per input.
    pub queries: usize,
    /// How generated keys are shaped (empty, and left out, for a model's inputs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub distributions: Vec<Distribution>,
    /// The focus shift; needed only by the non-clean distributions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub focus: Option<Focus>,
    /// (group size, bits, mode, axes) settings; K is grouped on tokens and V on features unless
    /// a setting swaps them.
    pub settings: Vec<KvSetting>,
    /// Where generated inputs come from; absent when a model provides them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator: Option<GeneratorSpec>,
    /// The recent-token precision budget study; absent means no budget comparisons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// How operations are timed; absent means no timings are taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<Timing>,
    /// Inputs taken from a real model's K/V cache instead of a generator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelSource>,
}

/// Real-model inputs: each (text, length N, layer, KV head) is one input whose K and V are that
/// head's cache for the first N tokens of the text and whose queries are the model's own (see
/// [`crate::inputs`] for which rows).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSource {
    /// Which model (`minilm` or `smollm2`).
    pub name: ModelName,
    /// The texts, each long enough for the longest N.
    pub texts: Vec<Text>,
    /// Layers (0-based).
    pub layers: Vec<usize>,
    /// KV heads (0-based; for MiniLM every head is a KV head).
    pub kv_heads: Vec<usize>,
}

/// One text of a real-model protocol, written out in full so the protocol alone fixes the input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Text {
    /// A short name for tables.
    pub name: String,
    /// The text itself.
    pub text: String,
}

pub use models::ModelName;

/// Which axis K and V are each grouped along, and the codec setting: the codec's own types,
/// parsed and validated once when the protocol is read.
pub use kvcodec::{Axes, KvSetting};

/// Whether axes are left out of records (serde's `skip_serializing_if`; results and summaries
/// write a setting's fields themselves).
pub fn is_default_axes(axes: &Axes) -> bool {
    *axes == Axes::KTokenVFeature
}

/// Mixed-precision policies with the codec fixed: a window of W tokens at the start or the end
/// of the cache is kept at higher precision, the rest at `low_bits`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    pub group_size: usize,
    pub low_bits: u32,
    /// W: how many tokens the high-precision window holds.
    pub window: usize,
    pub policies: Vec<Policy>,
}

impl Budget {
    /// The setting every policy's low tier is stored at: symmetric `low_bits` codes in groups of
    /// `group_size`, K along tokens and V along features (its 8-bit tier is the same at 8 bits).
    pub fn setting(&self) -> KvSetting {
        KvSetting::new(
            self.group_size,
            self.low_bits,
            Mode::Symmetric,
            Axes::default(),
        )
        .expect("a budget's codec is validated when the protocol is read")
    }
}

/// Where the high-precision window sits and what it stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Every token at `low_bits`.
    Uniform,
    /// The last W tokens 8-bit, the rest at `low_bits` (a KIVI-style residual window, quantized).
    Recent8,
    /// The first W tokens 8-bit (attention-sink style), the rest at `low_bits`.
    Early8,
    /// The last W tokens kept in float32 (KIVI / Hugging Face quantized cache), the rest at
    /// `low_bits`.
    RecentF32,
    /// The first W tokens kept in float32, the rest at `low_bits`.
    EarlyF32,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::Uniform => "uniform",
            Policy::Recent8 => "recent8",
            Policy::Early8 => "early8",
            Policy::RecentF32 => "recent_f32",
            Policy::EarlyF32 => "early_f32",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Timing parameters. Timings are descriptive: they vary by machine and run, and nothing is
/// asserted about them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timing {
    /// Untimed calls of each operation before any measurement.
    pub warmup: usize,
    /// Timed calls of each operation.
    pub repeats: usize,
    /// Seeds the shuffle of the measurement order.
    pub shuffle_seed: u64,
}

/// How K is shaped after the draw. These are this project's synthetic conditions, not the
/// published study's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Distribution {
    /// The draw as is.
    Clean,
    /// The first `focus.window` keys get `focus.gain * mean(q)` added.
    EarlyFocus,
    /// The last `focus.window` keys get `focus.gain * mean(q)` added.
    RecentFocus,
}

impl Distribution {
    pub fn name(self) -> &'static str {
        match self {
            Distribution::Clean => "clean",
            Distribution::EarlyFocus => "early_focus",
            Distribution::RecentFocus => "recent_focus",
        }
    }
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Focus {
    pub window: usize,
    /// Added in f32 arithmetic.
    pub gain: f32,
}

/// How a group's values become codes: the codec's own mode (serialized `"symmetric"` /
/// `"asymmetric"`, left out of records when symmetric so they read as before).
pub use kvcodec::Mode;

/// Whether a mode is left out of records (serde's `skip_serializing_if`).
pub fn is_symmetric(mode: &Mode) -> bool {
    *mode == Mode::Symmetric
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeneratorSpec {
    pub name: GeneratorName,
    pub entropy: EntropyRule,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GeneratorName {
    /// `numpy.random.default_rng(entropy)`, bit for bit (the published study's inputs).
    Numpy,
    /// ChaCha20 (rand_chacha) seeded with the entropy's 16 little-endian bytes, then zeros.
    Chacha20,
}

impl GeneratorName {
    pub fn name(self) -> &'static str {
        match self {
            GeneratorName::Numpy => "numpy",
            GeneratorName::Chacha20 => "chacha20",
        }
    }
}

/// entropy = seed * seed_multiplier + tokens * tokens_multiplier + offset, evaluated exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntropyRule {
    pub seed_multiplier: u64,
    pub tokens_multiplier: u64,
    pub offset: u64,
}

impl EntropyRule {
    /// The generator's entropy for one (seed, tokens) input; None if it overflows u128.
    pub fn entropy(&self, seed: u64, tokens: usize) -> Option<u128> {
        let seed_part = u128::from(seed).checked_mul(u128::from(self.seed_multiplier))?;
        let tokens_part = (tokens as u128).checked_mul(u128::from(self.tokens_multiplier))?;
        seed_part
            .checked_add(tokens_part)?
            .checked_add(u128::from(self.offset))
    }
}
