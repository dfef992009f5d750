//! The frozen study protocol: everything a run needs, read from JSON and validated on load.
//!
//! The packed-KV protocol ships inside the binary ([`FROZEN`]), so `runner --out DIR` works from
//! any directory; `--protocol FILE` runs a user-written one. Unknown fields, empty lists, zero
//! sizes, duplicates and unsupported bit widths are refused with the field named.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The frozen packed-KV protocol, embedded at build time.
pub const FROZEN: &str = include_str!("../../../experiments/packed-kv/protocol.json");

/// Where the frozen protocol lives in the repository (recorded in manifests).
pub const FROZEN_PATH: &str = "experiments/packed-kv/protocol.json";

/// Bit widths a study setting may use: those the evidence format and the audit cover.
pub const STUDY_BITS: [u32; 2] = [4, 8];

#[derive(Debug, Error)]
pub enum ProtocolError {
    #[error("protocol field `{field}`: {message}")]
    Parse { field: String, message: String },
    #[error("protocol field `{field}`: {message}")]
    Invalid { field: String, message: String },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ProtocolError {
    ProtocolError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Protocol {
    /// A name for the study this protocol serves.
    pub study: String,
    pub seeds: Vec<u64>,
    /// Sequence lengths N.
    pub tokens: Vec<usize>,
    /// Head dimension D.
    pub features: usize,
    pub queries: usize,
    pub distributions: Vec<Distribution>,
    pub focus: Focus,
    /// (group size, bits) settings; K is grouped on tokens, V on features, in every one.
    pub settings: Vec<Setting>,
    pub generator: GeneratorSpec,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Setting {
    pub group_size: usize,
    pub bits: u32,
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

impl Protocol {
    /// The protocol compiled into the runner.
    pub fn frozen() -> Protocol {
        Protocol::from_json(FROZEN).expect("the embedded frozen protocol is valid")
    }

    /// Parses and validates a protocol, naming the offending field on error.
    pub fn from_json(text: &str) -> Result<Protocol, ProtocolError> {
        let deserializer = &mut serde_json::Deserializer::from_str(text);
        let protocol: Protocol = serde_path_to_error::deserialize(deserializer).map_err(|err| {
            let field = err.path().to_string();
            ProtocolError::Parse {
                field: if field == "." {
                    "(top level)".into()
                } else {
                    field
                },
                message: err.into_inner().to_string(),
            }
        })?;
        protocol.validate()?;
        Ok(protocol)
    }

    fn validate(&self) -> Result<(), ProtocolError> {
        if self.study.trim().is_empty() {
            return Err(invalid("study", "must name the study"));
        }
        non_empty_unique("seeds", &self.seeds)?;
        non_empty_unique("tokens", &self.tokens)?;
        non_empty_unique("distributions", &self.distributions)?;
        non_empty_unique("settings", &self.settings)?;
        for (i, &n) in self.tokens.iter().enumerate() {
            positive(&format!("tokens[{i}]"), n)?;
            if n > i32::MAX as usize {
                return Err(invalid(
                    format!("tokens[{i}]"),
                    format!("{n} does not fit an i32 shape"),
                ));
            }
        }
        positive("features", self.features)?;
        positive("queries", self.queries)?;
        for (i, s) in self.settings.iter().enumerate() {
            // The codec packs 2- to 8-bit codes, but the evidence format and the audit cover the
            // study's 4 and 8 bits only.
            if !STUDY_BITS.contains(&s.bits) {
                return Err(invalid(
                    format!("settings[{i}]"),
                    format!(
                        "unsupported bit width {}: the study stores 4-bit or 8-bit codes",
                        s.bits
                    ),
                ));
            }
            codec::Layout::new(codec::Axis::Token, s.bits, s.group_size)
                .map_err(|e| invalid(format!("settings[{i}]"), e.to_string()))?;
        }
        self.validate_focus()?;
        for &seed in &self.seeds {
            for &n in &self.tokens {
                if self.generator.entropy.entropy(seed, n).is_none() {
                    return Err(invalid(
                        "generator.entropy",
                        format!("seed {seed} with {n} tokens overflows 128 bits"),
                    ));
                }
            }
        }
        Ok(())
    }

    fn validate_focus(&self) -> Result<(), ProtocolError> {
        if !self.focus.gain.is_finite() {
            return Err(invalid(
                "focus.gain",
                format!("{} is not finite", self.focus.gain),
            ));
        }
        let uses_focus = self.distributions.iter().any(|d| *d != Distribution::Clean);
        if uses_focus {
            positive("focus.window", self.focus.window)?;
            let shortest = self.tokens.iter().copied().min().unwrap_or(0);
            if self.focus.window > shortest {
                return Err(invalid(
                    "focus.window",
                    format!(
                        "{} exceeds the shortest length, {shortest} tokens",
                        self.focus.window
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Inputs in run order: seeds, then lengths, then distributions.
    pub fn inputs(&self) -> Vec<InputSpec> {
        let mut inputs = Vec::new();
        for &seed in &self.seeds {
            for &tokens in &self.tokens {
                for &distribution in &self.distributions {
                    inputs.push(InputSpec {
                        seed,
                        tokens,
                        distribution,
                    });
                }
            }
        }
        inputs
    }

    /// Number of comparisons a run of this protocol writes.
    pub fn comparison_count(&self) -> usize {
        self.seeds.len() * self.tokens.len() * self.distributions.len() * self.settings.len()
    }
}

/// One input: a (seed, length) draw shaped by a distribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputSpec {
    pub seed: u64,
    pub tokens: usize,
    pub distribution: Distribution,
}

impl InputSpec {
    /// Identifier used in arrays.npz and results.json, e.g. `s7_n128_clean`.
    pub fn id(&self) -> String {
        format!("s{}_n{}_{}", self.seed, self.tokens, self.distribution)
    }
}

/// Identifier of one comparison, e.g. `s7_n128_clean_g8_b4`.
pub fn comparison_id(input: &InputSpec, setting: &Setting) -> String {
    format!("{}_g{}_b{}", input.id(), setting.group_size, setting.bits)
}

fn non_empty_unique<T: Ord + fmt::Debug>(field: &str, items: &[T]) -> Result<(), ProtocolError> {
    if items.is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    let mut seen = BTreeSet::new();
    for item in items {
        if !seen.insert(item) {
            return Err(invalid(field, format!("{item:?} is listed twice")));
        }
    }
    Ok(())
}

fn positive(field: &str, value: usize) -> Result<(), ProtocolError> {
    if value == 0 {
        return Err(invalid(field, "must be at least 1, got 0"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(edit: impl FnOnce(&mut serde_json::Value)) -> Result<Protocol, ProtocolError> {
        let mut value: serde_json::Value = serde_json::from_str(FROZEN).unwrap();
        edit(&mut value);
        Protocol::from_json(&value.to_string())
    }

    fn err(edit: impl FnOnce(&mut serde_json::Value)) -> String {
        with(edit).unwrap_err().to_string()
    }

    #[test]
    fn frozen_protocol_has_72_comparisons() {
        let p = Protocol::frozen();
        assert_eq!(p.inputs().len(), 18);
        assert_eq!(p.comparison_count(), 72);
        assert_eq!(p.generator.entropy.entropy(7, 128), Some(70128));
        assert_eq!(p.inputs()[0].id(), "s7_n128_clean");
    }

    #[test]
    fn unknown_fields_are_named() {
        let e = err(|v| v["colour"] = 3.into());
        assert!(e.contains("unknown field `colour`"), "{e}");
        let e = err(|v| v["focus"]["width"] = 3.into());
        assert!(e.contains("focus") && e.contains("width"), "{e}");
    }

    #[test]
    fn negative_or_fractional_entropy_inputs_are_refused() {
        let e = err(|v| v["seeds"][1] = (-19).into());
        assert!(e.contains("seeds[1]") && e.contains("-19"), "{e}");
        let e = err(|v| v["generator"]["entropy"]["offset"] = 2.5.into());
        assert!(
            e.contains("generator.entropy.offset") && e.contains("2.5"),
            "{e}"
        );
        let e = err(|v| v["generator"]["entropy"]["seed_multiplier"] = (-1).into());
        assert!(e.contains("generator.entropy.seed_multiplier"), "{e}");
    }

    #[test]
    fn empty_zero_and_unsupported_values_are_named() {
        assert!(err(|v| v["seeds"] = serde_json::json!([])).contains("`seeds`: must not be empty"));
        assert!(err(|v| v["tokens"][0] = 0.into()).contains("`tokens[0]`: must be at least 1"));
        assert!(err(|v| v["features"] = 0.into()).contains("`features`"));
        assert!(err(|v| v["queries"] = 0.into()).contains("`queries`"));
        let e = err(|v| v["settings"][2]["bits"] = 3.into());
        assert!(
            e.contains("settings[2]") && e.contains("unsupported bit width 3"),
            "{e}"
        );
        let e = err(|v| v["settings"][0]["group_size"] = 0.into());
        assert!(e.contains("settings[0]") && e.contains("group size"), "{e}");
        let e = err(|v| v["distributions"][0] = "spiky".into());
        assert!(e.contains("distributions[0]") && e.contains("spiky"), "{e}");
        let e = err(|v| v["generator"]["name"] = "mt19937".into());
        assert!(e.contains("generator.name"), "{e}");
        let e = err(|v| v["focus"]["window"] = 1000.into());
        assert!(e.contains("focus.window") && e.contains("128"), "{e}");
        let e = err(|v| v["tokens"] = serde_json::json!([128, 128]));
        assert!(e.contains("listed twice"), "{e}");
    }

    #[test]
    fn entropy_overflow_is_refused() {
        let e = err(|v| {
            v["seeds"] = serde_json::json!([u64::MAX]);
            v["generator"]["entropy"]["seed_multiplier"] = u64::MAX.into();
            v["generator"]["entropy"]["tokens_multiplier"] = u64::MAX.into();
        });
        assert!(e.contains("overflows 128 bits"), "{e}");
    }
}
