//! The protocol recorded in a manifest, read as the runner reads it: the same schema, written out
//! here again so the audit depends on nothing it checks, with unknown fields refused. The
//! runner's bounds are applied by [`crate::packed_kv::bounds`].

use std::fmt;

use serde::Deserialize;

use crate::common::models::ModelName;

/// A run's protocol.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Protocol {
    /// The study's name (printed in headings and the chart title).
    pub study: String,
    /// Seeds of the draws (empty, and left out, for a model's inputs).
    #[serde(default)]
    pub seeds: Vec<u64>,
    /// Sequence lengths N.
    pub tokens: Vec<usize>,
    /// Head dimension D.
    pub features: usize,
    /// Number of query rows.
    pub queries: usize,
    /// How K is shaped after the draw (empty, and left out, for a model's inputs).
    #[serde(default)]
    pub distributions: Vec<Distribution>,
    /// The focus shift of the non-clean distributions; required only when one is listed.
    #[serde(default)]
    pub focus: Option<Focus>,
    /// Packed-KV settings.
    pub settings: Vec<Setting>,
    /// Where generated inputs come from; absent when a model provides them.
    #[serde(default)]
    pub generator: Option<Generator>,
    /// The precision-budget study, if any.
    #[serde(default)]
    pub budget: Option<Budget>,
    /// Timing parameters, if timings were taken.
    #[serde(default)]
    pub timing: Option<Timing>,
    /// Inputs taken from a real model's K/V cache instead of a generator.
    #[serde(default)]
    pub model: Option<ModelSource>,
}

/// Real-model inputs: each (text, length N, layer, KV head) is one input whose K and V are that
/// head's cache for the text's first N tokens, and whose queries are the model's own. The audit
/// does not run the model: it reads these inputs from arrays.npz (see
/// [`crate::packed_kv::inputs`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSource {
    /// Which model.
    pub name: ModelName,
    /// The texts, written out in full.
    pub texts: Vec<Text>,
    /// Layers (0-based).
    pub layers: Vec<usize>,
    /// KV heads (0-based).
    pub kv_heads: Vec<usize>,
}

/// One text of a model protocol.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Text {
    /// A short name for tables.
    pub name: String,
    /// The text itself.
    pub text: String,
}

/// Which axis K and V are each grouped along.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Axes {
    /// K along tokens (per channel), V along features (per token): the default, left out.
    #[default]
    KTokenVFeature,
    /// The swap: K along features, V along tokens.
    KFeatureVToken,
}

/// How K is shaped after the draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Distribution {
    /// The draw as is.
    Clean,
    /// The first `focus.window` keys shifted by `focus.gain * mean(q)`.
    EarlyFocus,
    /// The last `focus.window` keys shifted by `focus.gain * mean(q)`.
    RecentFocus,
}

impl Distribution {
    /// The name used in ids and tables.
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

/// The focus shift.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Focus {
    /// How many keys are shifted.
    pub window: usize,
    /// Multiplier of the mean query, in f32.
    pub gain: f32,
}

/// How a group's values become codes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// One scale per group, codes stored offset by qmax.
    #[default]
    Symmetric,
    /// One scale and one integer zero point per group.
    Asymmetric,
}

impl Mode {
    /// Whether this mode stores codes of `bits` bits.
    pub fn supports(self, bits: u32) -> bool {
        match self {
            Mode::Symmetric => (2..=8).contains(&bits),
            Mode::Asymmetric => (1..=8).contains(&bits),
        }
    }
}

/// One packed-KV setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Setting {
    /// Elements per group.
    pub group_size: usize,
    /// Code width.
    pub bits: u32,
    /// Symmetric when absent.
    #[serde(default)]
    pub mode: Mode,
    /// K on tokens and V on features when absent.
    #[serde(default)]
    pub axes: Axes,
}

/// The generator and its entropy rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generator {
    /// Which generator.
    pub name: GeneratorName,
    /// How each input's entropy follows from its seed and length.
    pub entropy: EntropyRule,
}

/// The generators the runner offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GeneratorName {
    /// `numpy.random.default_rng(entropy).normal(...)`, as `nprand` reproduces it.
    Numpy,
    /// rand_chacha's ChaCha20 seeded with the entropy's 16 little-endian bytes, then zeros.
    Chacha20,
}

impl GeneratorName {
    /// The name as the protocol spells it.
    pub fn name(self) -> &'static str {
        match self {
            GeneratorName::Numpy => "numpy",
            GeneratorName::Chacha20 => "chacha20",
        }
    }
}

/// entropy = seed * seed_multiplier + tokens * tokens_multiplier + offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntropyRule {
    /// Multiplies the seed.
    pub seed_multiplier: u64,
    /// Multiplies the length.
    pub tokens_multiplier: u64,
    /// Added last.
    pub offset: u64,
}

impl EntropyRule {
    /// The entropy of one (seed, length) draw, exactly, or None if it overflows 128 bits.
    pub fn entropy(&self, seed: u64, tokens: usize) -> Option<u128> {
        u128::from(seed)
            .checked_mul(u128::from(self.seed_multiplier))?
            .checked_add((tokens as u128).checked_mul(u128::from(self.tokens_multiplier))?)?
            .checked_add(u128::from(self.offset))
    }
}

/// The precision-budget study.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Group size of every quantized segment.
    pub group_size: usize,
    /// Width outside the window.
    pub low_bits: u32,
    /// W, the window's length in tokens.
    pub window: usize,
    /// The policies compared.
    pub policies: Vec<Policy>,
}

/// Where the high-precision window sits and how it is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// No window.
    Uniform,
    /// The last W tokens at 8 bits.
    Recent8,
    /// The first W tokens at 8 bits.
    Early8,
    /// The last W tokens in float32.
    RecentF32,
    /// The first W tokens in float32.
    EarlyF32,
}

impl Policy {
    /// The name used in ids and tables.
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

/// Timing parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timing {
    /// Untimed calls first.
    pub warmup: usize,
    /// Timed calls of each operation.
    pub repeats: usize,
    /// Seed of the shuffled call order.
    pub shuffle_seed: u64,
}
