//! The protocol recorded in a manifest, read as the runner reads it and held to the runner's
//! rules, written out here again so the audit depends on nothing it checks.
//!
//! The schema is the runner's (unknown fields refused); [`Protocol::validate`] applies the same
//! bounds the runner's validator applies before a run (README, "Protocols and generators"). A
//! protocol the runner would refuse cannot have produced the evidence, and one outside these
//! bounds could make the audit itself allocate without limit while re-deriving its inputs.

use std::collections::BTreeSet;
use std::fmt;

use serde::Deserialize;

/// Largest q, k or v matrix, and largest padded grouped view of a stored tensor, in elements.
pub const MAX_MATRIX_ELEMENTS: usize = 1 << 27;
/// Largest number of timed (or warm-up) calls.
pub const MAX_TIMED_CALLS: usize = 1_000_000;
/// Largest number of arrays in arrays.npz: a ZIP without its 64-bit extension.
pub const MAX_ARCHIVE_MEMBERS: usize = 65_535;
/// Largest estimate of arrays.npz's size: a ZIP without its 64-bit extension.
pub const MAX_ARCHIVE_BYTES: u64 = u32::MAX as u64;
/// Longest study name.
pub const MAX_STUDY_NAME: usize = 64;
/// Operations timed per comparison.
pub const TIMED_OPERATIONS: usize = 5;

/// A run's protocol.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Protocol {
    /// The study's name (printed in headings and the chart title).
    pub study: String,
    /// Seeds of the draws.
    pub seeds: Vec<u64>,
    /// Sequence lengths N.
    pub tokens: Vec<usize>,
    /// Head dimension D.
    pub features: usize,
    /// Number of query rows.
    pub queries: usize,
    /// How K is shaped after the draw.
    pub distributions: Vec<Distribution>,
    /// The focus shift of the non-clean distributions.
    pub focus: Focus,
    /// Packed-KV settings.
    pub settings: Vec<Setting>,
    /// Where the inputs come from.
    pub generator: Generator,
    /// The precision-budget study, if any.
    #[serde(default)]
    pub budget: Option<Budget>,
    /// Timing parameters, if timings were taken.
    #[serde(default)]
    pub timing: Option<Timing>,
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

/// A protocol field the runner would refuse, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the runner would refuse its protocol: field `{field}`: {reason}")]
pub struct ProtocolError {
    /// The field, as the runner names it.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

fn refuse(field: impl Into<String>, reason: impl Into<String>) -> ProtocolError {
    ProtocolError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Elements of the padded grouped view of one stored tensor: K (grouped along tokens) is
/// `features` rows of `ceil(tokens / g) * g` codes, V (along features) `tokens` rows of
/// `ceil(features / g) * g`. None if that overflows.
pub fn padded_elements(tokens: usize, features: usize, group_size: usize) -> Option<[usize; 2]> {
    let padded = |len: usize| len.div_ceil(group_size).checked_mul(group_size);
    Some([
        features.checked_mul(padded(tokens)?)?,
        tokens.checked_mul(padded(features)?)?,
    ])
}

impl Protocol {
    /// Applies the runner's rules; the first field it would refuse is named.
    pub fn validate(&self) -> Result<(), ProtocolError> {
        let name_ok = (1..=MAX_STUDY_NAME).contains(&self.study.len())
            && self
                .study
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !name_ok {
            return Err(refuse(
                "study",
                "1 to 64 ASCII letters, digits, '-', '_' or '.'",
            ));
        }
        non_empty_unique("seeds", &self.seeds)?;
        non_empty_unique("tokens", &self.tokens)?;
        non_empty_unique("distributions", &self.distributions)?;
        non_empty_unique("settings", &self.settings)?;
        if self.features == 0 || self.queries == 0 {
            return Err(refuse("features/queries", "must be at least 1"));
        }
        let fits = |rows: usize| {
            rows.checked_mul(self.features)
                .is_some_and(|e| e <= MAX_MATRIX_ELEMENTS)
        };
        if !fits(self.queries) {
            return Err(refuse("queries", "q exceeds 2^27 elements"));
        }
        for (i, &n) in self.tokens.iter().enumerate() {
            if n == 0 || n > i32::MAX as usize || !fits(n) {
                return Err(refuse(
                    format!("tokens[{i}]"),
                    "zero, over i32, or N x D over 2^27 elements",
                ));
            }
        }
        for (i, s) in self.settings.iter().enumerate() {
            if !s.mode.supports(s.bits) || s.group_size == 0 {
                return Err(refuse(
                    format!("settings[{i}]"),
                    "unsupported bit width or group size 0",
                ));
            }
            self.check_padded(
                &format!("settings[{i}].group_size"),
                s.group_size,
                &self.tokens,
            )?;
        }
        if !self.focus.gain.is_finite() {
            return Err(refuse("focus.gain", "not finite"));
        }
        let shortest = self.tokens.iter().copied().min().unwrap_or(0);
        if self.distributions.iter().any(|&d| d != Distribution::Clean)
            && !(1..=shortest).contains(&self.focus.window)
        {
            return Err(refuse(
                "focus.window",
                "0 or longer than the shortest length",
            ));
        }
        if let Some(b) = &self.budget {
            non_empty_unique("budget.policies", &b.policies)?;
            if b.group_size == 0 || !Mode::Symmetric.supports(b.low_bits) {
                return Err(refuse("budget", "group size 0 or unsupported low width"));
            }
            if !(1..=shortest).contains(&b.window) {
                return Err(refuse(
                    "budget.window",
                    "0 or longer than the shortest length",
                ));
            }
        }
        if self
            .archive_members()
            .is_none_or(|m| m > MAX_ARCHIVE_MEMBERS)
        {
            return Err(refuse(
                "(top level)",
                "arrays.npz would exceed 65,535 members",
            ));
        }
        if let Some(b) = &self.budget {
            // Every quantized segment at its own length; float32 segments are not grouped.
            let mut lengths = Vec::new();
            for &n in &self.tokens {
                for &policy in &b.policies {
                    let segments = crate::plan::policy_segments(policy, n, b.window, b.low_bits);
                    lengths.extend(
                        segments
                            .iter()
                            .filter(|s| s.bits.is_some())
                            .map(|s| s.len()),
                    );
                }
            }
            self.check_padded("budget.group_size", b.group_size, &lengths)?;
        }
        if crate::plan::archive_estimate(self).is_none_or(|b| b > MAX_ARCHIVE_BYTES) {
            return Err(refuse("(top level)", "arrays.npz would reach 4 GiB"));
        }
        if let Some(t) = &self.timing {
            let calls = self
                .comparison_count()
                .checked_mul(TIMED_OPERATIONS)
                .and_then(|n| n.checked_mul(t.repeats.max(t.warmup)));
            if t.repeats == 0 || calls.is_none_or(|n| n > MAX_TIMED_CALLS) {
                return Err(refuse("timing", "no repeats, or over 1,000,000 calls"));
            }
        }
        for &seed in &self.seeds {
            for &n in &self.tokens {
                if self.generator.entropy.entropy(seed, n).is_none() {
                    return Err(refuse("generator.entropy", "overflows 128 bits"));
                }
            }
        }
        Ok(())
    }

    fn check_padded(
        &self,
        field: &str,
        group_size: usize,
        lengths: &[usize],
    ) -> Result<(), ProtocolError> {
        for &n in lengths {
            let ok = padded_elements(n, self.features, group_size)
                .is_some_and(|v| v.iter().all(|&e| e <= MAX_MATRIX_ELEMENTS));
            if !ok {
                return Err(refuse(
                    field,
                    format!("the padded grouped view at {n} tokens exceeds 2^27 elements"),
                ));
            }
        }
        Ok(())
    }

    /// Inputs: seeds x lengths x distributions.
    pub fn input_count(&self) -> usize {
        self.seeds.len() * self.tokens.len() * self.distributions.len()
    }

    /// Packed-KV settings and budget policies, per input.
    pub fn configurations(&self) -> usize {
        self.settings.len() + self.budget.as_ref().map_or(0, |b| b.policies.len())
    }

    /// Comparisons a run writes.
    pub fn comparison_count(&self) -> usize {
        self.input_count() * self.configurations()
    }

    /// Arrays a run writes into arrays.npz, or None if the count overflows.
    pub fn archive_members(&self) -> Option<usize> {
        // Per stored tensor segment: codes, scales and shape, plus zero points when asymmetric;
        // a float32 segment stores values and shape.
        let tensor = |mode: Mode| match mode {
            Mode::Symmetric => 3,
            Mode::Asymmetric => 4,
        };
        let packed: usize = self.settings.iter().map(|s| 1 + 2 * tensor(s.mode)).sum();
        let mut total = 0usize;
        for &n in &self.tokens {
            let budget: usize = self.budget.as_ref().map_or(0, |b| {
                b.policies
                    .iter()
                    .map(|&p| {
                        let segments = crate::plan::policy_segments(p, n, b.window, b.low_bits);
                        let arrays: usize = segments
                            .iter()
                            .map(|s| if s.bits.is_some() { 3 } else { 2 })
                            .sum();
                        1 + 2 * arrays
                    })
                    .sum()
            });
            let per_input = 4 + packed + budget;
            let inputs = self.seeds.len() * self.distributions.len();
            total = total.checked_add(inputs.checked_mul(per_input)?)?;
        }
        Some(total)
    }
}

fn non_empty_unique<T: Ord>(field: &str, items: &[T]) -> Result<(), ProtocolError> {
    if items.is_empty() {
        return Err(refuse(field, "must not be empty"));
    }
    if items.iter().collect::<BTreeSet<_>>().len() != items.len() {
        return Err(refuse(field, "lists an entry twice"));
    }
    Ok(())
}
