//! The runner's bounds on a protocol, applied independently: [`Protocol::validate`] refuses
//! what the runner's validator refuses before a run (docs/protocols.md). A
//! protocol the runner would refuse cannot have produced the evidence, and one outside these
//! bounds could make the audit itself allocate without limit while re-deriving its inputs.

use std::collections::BTreeSet;

use crate::common::problem::ProtocolError;
use crate::packed_kv::plan::{archive_estimate, policy_segments};
use crate::packed_kv::protocol::{Distribution, Mode, Protocol};

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

/// Most configurations (settings plus budget policies) a protocol may hold.
pub const MAX_CONFIGURATIONS: usize = 100;

fn refuse(field: impl Into<String>, reason: impl Into<String>) -> ProtocolError {
    ProtocolError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Elements of the padded grouped view of one stored tensor, for each axis: grouped along tokens
/// it is `features` rows of `ceil(tokens / g) * g` codes, along features `tokens` rows of
/// `ceil(features / g) * g`. K and V each take one of the two (which one depends on the setting's
/// axes), so a setting fits when both do. None if that overflows.
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
        self.validate_source()?;
        non_empty_unique("tokens", &self.tokens)?;
        non_empty_unique("settings", &self.settings)?;
        // Each series drawn with its own look: the chart has 100 (and the audit requires
        // distinct series to look distinct).
        if self.configurations() > MAX_CONFIGURATIONS {
            return Err(refuse(
                "settings",
                "more than 100 configurations (settings plus budget policies)",
            ));
        }
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
        let shortest = self.tokens.iter().copied().min().unwrap_or(0);
        let uses_focus = self.distributions.iter().any(|&d| d != Distribution::Clean);
        match self.focus {
            None if uses_focus => {
                return Err(refuse(
                    "focus",
                    "missing: early_focus and recent_focus shift keys by it",
                ));
            }
            None => {}
            Some(focus) => {
                if !(focus.gain.is_finite() && focus.gain >= 0.0) {
                    return Err(refuse("focus.gain", "not a finite number >= 0"));
                }
                if uses_focus && !(1..=shortest).contains(&focus.window) {
                    return Err(refuse(
                        "focus.window",
                        "0 or longer than the shortest length",
                    ));
                }
            }
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
                    let segments = policy_segments(policy, n, b.window, b.low_bits);
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
        if archive_estimate(self).is_none_or(|b| b > MAX_ARCHIVE_BYTES) {
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
        if let Some(generator) = &self.generator {
            for &seed in &self.seeds {
                for &n in &self.tokens {
                    if generator.entropy.entropy(seed, n).is_none() {
                        return Err(refuse("generator.entropy", "overflows 128 bits"));
                    }
                }
            }
        }
        Ok(())
    }

    /// Exactly one input source, as the runner requires: a generator with its seeds and
    /// distributions, or a model with its texts, layers and KV heads, sized to the model (the
    /// audit's own table of sizes, [`crate::common::models::ModelName::shape`]).
    fn validate_source(&self) -> Result<(), ProtocolError> {
        let Some(model) = &self.model else {
            if self.generator.is_none() {
                return Err(refuse(
                    "generator",
                    "missing: a protocol draws its inputs with a generator or takes them from a \
                     model",
                ));
            }
            non_empty_unique("seeds", &self.seeds)?;
            return non_empty_unique("distributions", &self.distributions);
        };
        let generated_only = [
            ("generator", self.generator.is_some()),
            ("seeds", !self.seeds.is_empty()),
            ("distributions", !self.distributions.is_empty()),
            ("focus", self.focus.is_some()),
        ];
        if let Some((field, _)) = generated_only.iter().find(|(_, present)| *present) {
            return Err(refuse(
                *field,
                "applies to generated inputs only; this protocol takes its inputs from a model",
            ));
        }
        let shape = model.name.shape();
        let names: Vec<&String> = model.texts.iter().map(|t| &t.name).collect();
        non_empty_unique("model.texts", &names)?;
        for (i, text) in model.texts.iter().enumerate() {
            let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
            if text.name.is_empty() || text.name.len() > 32 || !text.name.chars().all(plain) {
                return Err(refuse(
                    format!("model.texts[{i}].name"),
                    "must be 1 to 32 ASCII letters, digits, '-', '_' or '.'",
                ));
            }
        }
        non_empty_unique("model.layers", &model.layers)?;
        non_empty_unique("model.kv_heads", &model.kv_heads)?;
        for (field, items, count) in [
            ("model.layers", &model.layers, shape.layers),
            ("model.kv_heads", &model.kv_heads, shape.kv_heads),
        ] {
            if let Some(i) = items.iter().position(|&x| x >= count) {
                return Err(refuse(
                    format!("{field}[{i}]"),
                    format!("{} is not below {}'s {count}", items[i], model.name),
                ));
            }
        }
        if self.features != shape.head_dim {
            return Err(refuse(
                "features",
                format!("{} has head_dim {}", model.name, shape.head_dim),
            ));
        }
        let group = shape.group();
        // A decoder's queries are its query heads at the last position only (the one position
        // whose causal attention reads the whole cache); an encoder's may span positions.
        let queries_ok = if shape.causal {
            self.queries == group
        } else {
            self.queries.is_multiple_of(group)
        };
        if !queries_ok {
            return Err(refuse(
                "queries",
                format!(
                    "{} needs {} {group} (query heads per KV head)",
                    model.name,
                    if shape.causal {
                        "exactly"
                    } else {
                        "a multiple of"
                    }
                ),
            ));
        }
        for (i, &n) in self.tokens.iter().enumerate() {
            if n > shape.max_tokens || n < shape.shortest || n < self.queries / group {
                return Err(refuse(
                    format!("tokens[{i}]"),
                    format!(
                        "{} takes {} to {} tokens per pass, and at least one per query position",
                        model.name, shape.shortest, shape.max_tokens
                    ),
                ));
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

    /// Inputs of one length: seeds x distributions, or texts x layers x KV heads.
    pub fn inputs_per_length(&self) -> usize {
        match &self.model {
            Some(m) => m.texts.len() * m.layers.len() * m.kv_heads.len(),
            None => self.seeds.len() * self.distributions.len(),
        }
    }

    /// Inputs: seeds x lengths x distributions, or texts x lengths x layers x KV heads.
    pub fn input_count(&self) -> usize {
        self.inputs_per_length() * self.tokens.len()
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
                        let segments = policy_segments(p, n, b.window, b.low_bits);
                        let arrays: usize = segments
                            .iter()
                            .map(|s| if s.bits.is_some() { 3 } else { 2 })
                            .sum();
                        1 + 2 * arrays
                    })
                    .sum()
            });
            let per_input = 4 + packed + budget;
            let inputs = self.inputs_per_length();
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

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::packed_kv::protocol::Protocol;

    /// A valid SmolLM2 protocol: queries are the 3 query heads of a KV head at the last position.
    fn smollm2() -> Value {
        json!({
            "study": "real",
            "tokens": [40],
            "features": 64,
            "queries": 3,
            "settings": [{ "group_size": 8, "bits": 4, "axes": "k_feature_v_token" }],
            "model": { "name": "smollm2", "texts": [{ "name": "harbour", "text": "..." }],
                       "layers": [0, 29], "kv_heads": [0] }
        })
    }

    /// One alteration of the valid protocol, with the field it must be refused for.
    type Case = (&'static str, fn(&mut Value));

    /// The field the audit refuses `protocol` for, or None if it accepts it.
    fn refused(protocol: &Value) -> Option<String> {
        let p: Protocol = serde_json::from_value(protocol.clone()).expect("the schema");
        p.validate().err().map(|e| e.field)
    }

    #[test]
    fn a_model_protocol_sized_to_its_model_is_accepted() {
        assert_eq!(refused(&smollm2()), None);
        let mut minilm = smollm2();
        minilm["features"] = 32.into();
        // An encoder's queries may span positions: any multiple of its one query head per KV head.
        minilm["queries"] = 2.into();
        minilm["model"]["name"] = "minilm".into();
        minilm["model"]["layers"] = json!([0, 5]);
        minilm["model"]["kv_heads"] = json!([11]);
        assert_eq!(refused(&minilm), None);
    }

    #[test]
    fn each_field_that_does_not_fit_the_model_is_named() {
        let cases: [Case; 12] = [
            ("generator", |p| {
                p["generator"] = json!({ "name": "numpy", "entropy":
                    { "seed_multiplier": 1, "tokens_multiplier": 1, "offset": 0 } })
            }),
            ("seeds", |p| p["seeds"] = json!([1])),
            ("focus", |p| {
                p["focus"] = json!({ "window": 1, "gain": 1.0 })
            }),
            ("model.texts", |p| p["model"]["texts"] = json!([])),
            ("model.texts[0].name", |p| {
                p["model"]["texts"][0]["name"] = "a b".into()
            }),
            ("model.layers[1]", |p| p["model"]["layers"] = json!([0, 30])),
            ("model.layers", |p| p["model"]["layers"] = json!([3, 3])),
            ("model.kv_heads[0]", |p| p["model"]["kv_heads"] = json!([3])),
            ("features", |p| p["features"] = 32.into()),
            // A decoder's queries are exactly its 3 query heads at the last position.
            ("queries", |p| p["queries"] = 6.into()),
            ("tokens[1]", |p| p["tokens"] = json!([40, 8193])),
            ("tokens[0]", |p| {
                p["model"]["name"] = "minilm".into();
                p["features"] = 32.into();
                p["queries"] = 2.into();
                p["model"]["layers"] = json!([0]);
                // MiniLM's shortest pass is [CLS], one token, [SEP].
                p["tokens"] = json!([2]);
            }),
        ];
        for (field, edit) in cases {
            let mut p = smollm2();
            edit(&mut p);
            assert_eq!(refused(&p).as_deref(), Some(field), "{p}");
        }
    }

    #[test]
    fn a_generated_protocol_needs_its_generator_and_a_focus_only_to_shift_keys() {
        let mut p = json!({
            "study": "drawn",
            "seeds": [1],
            "tokens": [16],
            "features": 8,
            "queries": 2,
            "distributions": ["clean"],
            "settings": [{ "group_size": 8, "bits": 4 }],
            "generator": { "name": "numpy", "entropy":
                { "seed_multiplier": 1, "tokens_multiplier": 1, "offset": 0 } }
        });
        assert_eq!(refused(&p), None);
        p["distributions"] = json!(["clean", "early_focus"]);
        assert_eq!(refused(&p).as_deref(), Some("focus"));
        p["focus"] = json!({ "window": 4, "gain": 2.0 });
        assert_eq!(refused(&p), None);
        // A gain shifts keys towards the mean query: zero is allowed, a negative one is not.
        p["focus"]["gain"] = json!(0.0);
        assert_eq!(refused(&p), None);
        p["focus"]["gain"] = json!(-2.0);
        assert_eq!(refused(&p).as_deref(), Some("focus.gain"));
        p["focus"]["gain"] = json!(2.0);
        p.as_object_mut().unwrap().remove("generator");
        assert_eq!(refused(&p).as_deref(), Some("generator"));
    }
}
