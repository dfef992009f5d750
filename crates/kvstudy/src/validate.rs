//! Reading and validating a protocol: a file is read only if it is a small regular file, parsed
//! with unknown fields refused, and held to every bound, each refusal naming the field.
//!
//! Every size a run derives from the protocol is bounded here, with checked arithmetic, so that
//! no protocol the validator accepts can make the runner panic or abort on an allocation: the
//! study name ([`MAX_STUDY_NAME_CHARS`]), q, k and v and every stored tensor's padded grouped
//! view ([`MAX_MATRIX_ELEMENTS`]), the number of timed calls ([`MAX_TIMED_CALLS`]), and
//! `arrays.npz`, which must stay a plain ZIP ([`MAX_NPZ_MEMBERS`], [`MAX_NPZ_BYTES`]; see
//! [`crate::archive`]). The audit enforces the same rules independently.

use std::collections::BTreeSet;
use std::fmt;

use thiserror::Error;

use crate::archive::{self, MAX_NPZ_BYTES, MAX_NPZ_MEMBERS};
use crate::plan::Storage;
use crate::protocol::{
    Axes, Distribution, FROZEN, MAX_CONFIGURATIONS, MAX_MATRIX_ELEMENTS, MAX_STUDY_NAME_CHARS,
    MAX_TIMED_CALLS, Protocol,
};
use evidence::format::thousands_u64 as thousands;

/// Largest protocol file the runner reads (a protocol is a few hundred bytes).
pub const MAX_PROTOCOL_FILE_BYTES: u64 = 1 << 20;

/// Why a protocol file could not be read (before it is parsed).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ProtocolFileError {
    /// Not a regular file: a directory, device or FIFO (which could block or never end).
    #[error("protocol {} is not a regular file", path.display())]
    NotAFile {
        /// The path given.
        path: std::path::PathBuf,
    },
    /// Larger than [`MAX_PROTOCOL_FILE_BYTES`].
    #[error("protocol {} holds more than {MAX_PROTOCOL_FILE_BYTES} bytes", path.display())]
    TooLarge {
        /// The path given.
        path: std::path::PathBuf,
    },
    /// Unreadable, or not UTF-8.
    #[error("reading protocol {}", path.display())]
    Io {
        /// The path given.
        path: std::path::PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
}

/// Reads a protocol file's text: a regular file (checked before opening, so a FIFO cannot block
/// the runner, and again once open) of at most [`MAX_PROTOCOL_FILE_BYTES`].
pub fn read_protocol_file(path: &std::path::Path) -> Result<String, ProtocolFileError> {
    use std::io::Read;
    let io = |source| ProtocolFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    let not_a_file = || ProtocolFileError::NotAFile {
        path: path.to_path_buf(),
    };
    if !std::fs::metadata(path).map_err(io)?.is_file() {
        return Err(not_a_file());
    }
    let file = std::fs::File::open(path).map_err(io)?;
    if !file.metadata().map_err(io)?.is_file() {
        return Err(ProtocolFileError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    let mut text = String::new();
    file.take(MAX_PROTOCOL_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(io)?;
    if text.len() as u64 > MAX_PROTOCOL_FILE_BYTES {
        return Err(ProtocolFileError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    Ok(text)
}

/// Why a protocol is refused, one variant per condition, each naming the field to change.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The JSON does not fit the schema: an unknown field, a wrong type, a negative or fractional
    /// number, an unknown name.
    #[error("protocol field `{field}`: {message}")]
    Parse {
        /// The field, as a path (`settings[1].mode`), or `(top level)`.
        field: String,
        /// What the parser said.
        message: String,
    },
    /// An empty list.
    #[error("protocol field `{field}`: must not be empty")]
    Empty {
        /// The list.
        field: String,
    },
    /// A list naming an entry twice.
    #[error("protocol field `{field}`: {item} is listed twice")]
    Duplicate {
        /// The list.
        field: String,
        /// The entry, as written in Rust's debug form.
        item: String,
    },
    /// More settings and budget policies than the chart can tell apart.
    #[error(
        "protocol field `settings`: {count} configurations (settings plus budget policies); at \
         most {MAX_CONFIGURATIONS}, each with its own colour and shape in the chart: split the \
         sweep into several protocols"
    )]
    TooManyConfigurations {
        /// Settings plus budget policies.
        count: usize,
    },
    /// A size or count of 0.
    #[error("protocol field `{field}`: must be at least 1, got 0")]
    Zero {
        /// The field.
        field: String,
    },
    /// A study name too short or too long.
    #[error("protocol field `study`: must be 1 to {MAX_STUDY_NAME_CHARS} characters, got {chars}")]
    StudyNameLength {
        /// Its length in characters.
        chars: usize,
    },
    /// A study name with a character that could break a heading or the chart title.
    #[error(
        "protocol field `study`: character {character:?} at position {position} is not allowed: \
         the name goes into markdown headings and the chart title, so use ASCII letters, digits, \
         '-', '_' and '.'"
    )]
    StudyNameCharacter {
        /// The character.
        character: char,
        /// Its position.
        position: usize,
    },
    /// A length the two i32 shape values cannot hold.
    #[error("protocol field `{field}`: {tokens} does not fit an i32 shape")]
    TokensOverI32 {
        /// `tokens[i]`.
        field: String,
        /// The length.
        tokens: usize,
    },
    /// q, k or v over [`MAX_MATRIX_ELEMENTS`].
    #[error(
        "protocol field `{field}`: {rows} rows x {features} features exceeds {} elements per \
         matrix",
        MAX_MATRIX_ELEMENTS
    )]
    MatrixTooLarge {
        /// `tokens[i]` or `queries`.
        field: String,
        /// Tokens or queries.
        rows: usize,
        /// D.
        features: usize,
    },
    /// A width and group size the KV codec refuses.
    #[error("protocol field `{field}`")]
    Layout {
        /// `settings[i]` or `budget.low_bits`.
        field: String,
        /// The codec's refusal.
        #[source]
        source: kvcodec::KvError,
    },
    /// A focus gain that is negative, NaN or infinite. A negative gain would shift keys away
    /// from the mean query, which is not what a focus distribution means.
    #[error("protocol field `focus.gain`: {gain} is not a finite number >= 0")]
    GainInvalid {
        /// The gain.
        gain: f32,
    },
    /// A window longer than the shortest input.
    #[error("protocol field `{field}`: {window} exceeds the shortest length, {shortest} tokens")]
    WindowTooLong {
        /// `focus.window` or `budget.window`.
        field: String,
        /// The window.
        window: usize,
        /// The shortest length.
        shortest: usize,
    },
    /// More timed (or warm-up) calls than [`MAX_TIMED_CALLS`].
    #[error(
        "protocol field `timing`: {comparisons} comparisons x 5 operations x {calls} repeats (or \
         warm-up calls) exceeds {MAX_TIMED_CALLS} calls"
    )]
    TooManyCalls {
        /// Comparisons per run.
        comparisons: usize,
        /// The larger of repeats and warm-up calls.
        calls: usize,
    },
    /// An input whose entropy does not fit 128 bits.
    #[error(
        "protocol field `generator.entropy`: seed {seed} with {tokens} tokens overflows 128 bits"
    )]
    EntropyOverflow {
        /// The seed.
        seed: u64,
        /// The length.
        tokens: usize,
    },
    /// A stored tensor's padded grouped view exceeds [`MAX_MATRIX_ELEMENTS`] (or overflows).
    #[error(
        "protocol field `{field}`: group size {group_size} at N = {tokens}{}: {tensor} would be \
         stored as {} rows x {} padded codes, more than {} elements",
        segment_note(*.segment, *.tokens),
        thousands(*.rows),
        amount(*.padded_row_len),
        thousands(MAX_MATRIX_ELEMENTS as u64)
    )]
    GroupedViewTooLarge {
        /// `settings[i].group_size` or `budget.group_size`.
        field: String,
        group_size: usize,
        /// The input length N.
        tokens: usize,
        /// The stored token range (start, end): all of 0..N for a packed-KV setting.
        segment: (usize, usize),
        /// `K` (grouped along tokens) or `V` (grouped along features).
        tensor: &'static str,
        rows: u64,
        /// `None` when it overflows u64.
        padded_row_len: Option<u64>,
    },
    /// A field that does not fit the protocol's input source (generated draws or a model).
    #[error("protocol field `{field}`: {reason}")]
    Source {
        /// The field.
        field: String,
        /// Why it does not fit.
        reason: String,
    },
    /// arrays.npz would need ZIP64 for its member count.
    #[error(
        "arrays.npz would hold {} members; a plain ZIP holds at most 65,535 (fewer seeds, \
         lengths, distributions, settings or policies)",
        amount(*.members)
    )]
    TooManyMembers {
        /// `None` when the count overflows u64.
        members: Option<u64>,
    },
    /// arrays.npz could need ZIP64 for its size.
    #[error(
        "arrays.npz would take about {} bytes; a plain ZIP (no ZIP64) must stay below \
         4,294,967,296 bytes",
        amount(*.bytes)
    )]
    ArchiveTooLarge {
        /// The upper-bound estimate; `None` when it overflows u64.
        bytes: Option<u64>,
    },
}

/// A count for a message: the number, or that it overflows.
fn amount(value: Option<u64>) -> String {
    value.map_or_else(|| "more than 2^64".into(), thousands)
}

/// Names the stored segment when it is not the whole cache.
fn segment_note((start, end): (usize, usize), tokens: usize) -> String {
    if (start, end) == (0, tokens) {
        String::new()
    } else {
        format!(" (tokens {start}..{end})")
    }
}

impl ProtocolError {
    /// The protocol field to change (empty for the archive-wide limits).
    pub fn field(&self) -> &str {
        match self {
            ProtocolError::Parse { field, .. }
            | ProtocolError::Empty { field }
            | ProtocolError::Duplicate { field, .. }
            | ProtocolError::Zero { field }
            | ProtocolError::TokensOverI32 { field, .. }
            | ProtocolError::MatrixTooLarge { field, .. }
            | ProtocolError::Layout { field, .. }
            | ProtocolError::WindowTooLong { field, .. }
            | ProtocolError::Source { field, .. }
            | ProtocolError::GroupedViewTooLarge { field, .. } => field,
            ProtocolError::StudyNameLength { .. } | ProtocolError::StudyNameCharacter { .. } => {
                "study"
            }
            ProtocolError::GainInvalid { .. } => "focus.gain",
            ProtocolError::TooManyConfigurations { .. } => "settings",
            ProtocolError::TooManyCalls { .. } => "timing",
            ProtocolError::EntropyOverflow { .. } => "generator.entropy",
            ProtocolError::TooManyMembers { .. } | ProtocolError::ArchiveTooLarge { .. } => "",
        }
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
        self.validate_study()?;
        self.validate_source()?;
        non_empty_unique("tokens", &self.tokens)?;
        non_empty_unique("settings", &self.settings)?;
        let count = self.settings.len() + self.budget.as_ref().map_or(0, |b| b.policies.len());
        if count > MAX_CONFIGURATIONS {
            return Err(ProtocolError::TooManyConfigurations { count });
        }
        for (i, &n) in self.tokens.iter().enumerate() {
            positive(&format!("tokens[{i}]"), n)?;
            if n > i32::MAX as usize {
                return Err(ProtocolError::TokensOverI32 {
                    field: format!("tokens[{i}]"),
                    tokens: n,
                });
            }
        }
        positive("features", self.features)?;
        positive("queries", self.queries)?;
        self.validate_sizes()?;
        for (i, s) in self.settings.iter().enumerate() {
            kvcodec::Layout::with_mode(kvcodec::GroupAxis::Token, s.mode, s.bits, s.group_size)
                .map_err(|source| ProtocolError::Layout {
                    field: format!("settings[{i}]"),
                    source,
                })?;
        }
        self.validate_focus()?;
        self.validate_budget()?;
        // The member count first: it bounds every list, so the loops below stay short.
        let members = archive::member_count(self);
        if members.is_none_or(|m| m > MAX_NPZ_MEMBERS) {
            return Err(ProtocolError::TooManyMembers { members });
        }
        self.validate_grouped_views()?;
        let bytes = archive::estimated_bytes(&archive::members(self));
        if bytes.is_none_or(|b| b > MAX_NPZ_BYTES) {
            return Err(ProtocolError::ArchiveTooLarge { bytes });
        }
        if let Some(timing) = &self.timing {
            positive("timing.repeats", timing.repeats)?;
            let calls = self
                .comparison_count()
                .checked_mul(5)
                .and_then(|n| n.checked_mul(timing.repeats.max(timing.warmup)));
            if calls.is_none_or(|n| n > MAX_TIMED_CALLS) {
                return Err(ProtocolError::TooManyCalls {
                    comparisons: self.comparison_count(),
                    calls: timing.repeats.max(timing.warmup),
                });
            }
        }
        if let Some(generator) = &self.generator {
            for &seed in &self.seeds {
                for &n in &self.tokens {
                    if generator.entropy.entropy(seed, n).is_none() {
                        return Err(ProtocolError::EntropyOverflow { seed, tokens: n });
                    }
                }
            }
        }
        Ok(())
    }

    /// Exactly one input source: a generator with its seeds and distributions (and a focus when
    /// a distribution shifts keys), or a model with its texts, layers and KV heads, sized to the
    /// model.
    fn validate_source(&self) -> Result<(), ProtocolError> {
        let source = |field: &str, reason: String| ProtocolError::Source {
            field: field.into(),
            reason,
        };
        let Some(model) = &self.model else {
            if self.generator.is_none() {
                return Err(source(
                    "generator",
                    "missing: a protocol draws its inputs with a generator or takes them from \
                     a `model`"
                        .into(),
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
            return Err(source(
                field,
                "applies to generated inputs only; this protocol takes its inputs from a `model`"
                    .into(),
            ));
        }
        let shape = model.name.shape();
        non_empty_unique(
            "model.texts",
            &model.texts.iter().map(|t| &t.name).collect::<Vec<_>>(),
        )?;
        for (i, text) in model.texts.iter().enumerate() {
            let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
            if text.name.is_empty() || text.name.len() > 32 || !text.name.chars().all(plain) {
                return Err(source(
                    &format!("model.texts[{i}].name"),
                    "must be 1 to 32 ASCII letters, digits, '-', '_' or '.' (it goes into tables)"
                        .into(),
                ));
            }
        }
        non_empty_unique("model.layers", &model.layers)?;
        non_empty_unique("model.kv_heads", &model.kv_heads)?;
        let in_range = |field: &str, items: &[usize], count: usize, what: &str| match items
            .iter()
            .position(|&x| x >= count)
        {
            Some(i) => Err(source(
                &format!("{field}[{i}]"),
                format!(
                    "{} is not one of {}'s {count} {what} (0-based)",
                    items[i], model.name
                ),
            )),
            None => Ok(()),
        };
        in_range("model.layers", &model.layers, shape.layers, "layers")?;
        in_range(
            "model.kv_heads",
            &model.kv_heads,
            shape.kv_heads,
            "KV heads",
        )?;
        if self.features != shape.head_dim {
            return Err(source(
                "features",
                format!(
                    "{} has head_dim {}, not {}",
                    model.name, shape.head_dim, self.features
                ),
            ));
        }
        let group = shape.group();
        let queries_ok = if shape.causal {
            self.queries == group
        } else {
            self.queries.is_multiple_of(group)
        };
        if !queries_ok {
            let reason = if shape.causal {
                format!(
                    "{} is a decoder: its queries are the {group} query heads of each KV head at \
                     the last position (the only one that sees the whole cache), so queries \
                     must be {group}",
                    model.name
                )
            } else {
                format!("must be a multiple of {group} (query heads per KV head)")
            };
            return Err(source("queries", reason));
        }
        let shortest = if shape.causal { 1 } else { 3 };
        for (i, &n) in self.tokens.iter().enumerate() {
            if n > shape.max_tokens || n < shortest || n < self.queries / group {
                return Err(source(
                    &format!("tokens[{i}]"),
                    format!(
                        "{} takes {shortest} to {} tokens per pass, and at least one per query \
                         position",
                        model.name, shape.max_tokens
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate_study(&self) -> Result<(), ProtocolError> {
        let chars = self.study.chars().count();
        if !(1..=MAX_STUDY_NAME_CHARS).contains(&chars) {
            return Err(ProtocolError::StudyNameLength { chars });
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if let Some((i, c)) = self.study.chars().enumerate().find(|&(_, c)| !allowed(c)) {
            return Err(ProtocolError::StudyNameCharacter {
                character: c,
                position: i,
            });
        }
        Ok(())
    }

    /// Every tensor a run stores is encoded through its padded grouped view, which the encoder
    /// allocates: bound it for every length, setting and quantized budget segment.
    fn validate_grouped_views(&self) -> Result<(), ProtocolError> {
        for (i, setting) in self.settings.iter().enumerate() {
            for &tokens in &self.tokens {
                let field = || format!("settings[{i}].group_size");
                let axes = setting.axes;
                self.check_grouped_view(field, axes, setting.group_size, tokens, (0, tokens))?;
            }
        }
        let Some(budget) = &self.budget else {
            return Ok(());
        };
        for &tokens in &self.tokens {
            for policy in &budget.policies {
                for segment in policy.segments(tokens, budget.window, budget.low_bits) {
                    // A float32 segment is part of the N x D matrix, bounded already.
                    if let Storage::Quantized { .. } = segment.storage {
                        self.check_grouped_view(
                            || "budget.group_size".to_string(),
                            Axes::default(),
                            budget.group_size,
                            tokens,
                            (segment.start, segment.end),
                        )?;
                    }
                }
            }
        }
        Ok(())
    }

    fn check_grouped_view(
        &self,
        field: impl Fn() -> String,
        axes: Axes,
        group_size: usize,
        tokens: usize,
        (start, end): (usize, usize),
    ) -> Result<(), ProtocolError> {
        for (tensor, axis) in [("K", axes.k()), ("V", axes.v())] {
            let len = (end - start) as u64;
            let view = archive::grouped_view(axis, len, self.features as u64, group_size as u64);
            let codes = view.and_then(|v| v.codes());
            if codes.is_none_or(|c| c > MAX_MATRIX_ELEMENTS as u64) {
                return Err(ProtocolError::GroupedViewTooLarge {
                    field: field(),
                    group_size,
                    tokens,
                    segment: (start, end),
                    tensor,
                    rows: view.map_or(0, |v| v.rows),
                    padded_row_len: view.and_then(|v| v.padded_row_len()),
                });
            }
        }
        Ok(())
    }

    /// Every matrix a run holds must fit in memory comfortably: refuse sizes that would abort
    /// the process instead of running.
    fn validate_sizes(&self) -> Result<(), ProtocolError> {
        let elements = |rows: usize| rows.checked_mul(self.features);
        for (i, &n) in self.tokens.iter().enumerate() {
            if elements(n).is_none_or(|e| e > MAX_MATRIX_ELEMENTS) {
                return Err(ProtocolError::MatrixTooLarge {
                    field: format!("tokens[{i}]"),
                    rows: n,
                    features: self.features,
                });
            }
        }
        if elements(self.queries).is_none_or(|e| e > MAX_MATRIX_ELEMENTS) {
            return Err(ProtocolError::MatrixTooLarge {
                field: "queries".into(),
                rows: self.queries,
                features: self.features,
            });
        }
        Ok(())
    }

    fn validate_focus(&self) -> Result<(), ProtocolError> {
        let uses_focus = self.distributions.iter().any(|d| *d != Distribution::Clean);
        let focus = match self.focus {
            Some(focus) => focus,
            None if uses_focus => {
                return Err(ProtocolError::Source {
                    field: "focus".into(),
                    reason: "missing: early_focus and recent_focus shift keys by it".into(),
                });
            }
            None => return Ok(()),
        };
        if !(focus.gain.is_finite() && focus.gain >= 0.0) {
            return Err(ProtocolError::GainInvalid { gain: focus.gain });
        }
        if uses_focus {
            positive("focus.window", focus.window)?;
            let shortest = self.tokens.iter().copied().min().unwrap_or(0);
            if focus.window > shortest {
                return Err(ProtocolError::WindowTooLong {
                    field: "focus.window".into(),
                    window: focus.window,
                    shortest,
                });
            }
        }
        Ok(())
    }

    fn validate_budget(&self) -> Result<(), ProtocolError> {
        let Some(budget) = &self.budget else {
            return Ok(());
        };
        non_empty_unique("budget.policies", &budget.policies)?;
        positive("budget.group_size", budget.group_size)?;
        kvcodec::Layout::new(
            kvcodec::GroupAxis::Token,
            budget.low_bits,
            budget.group_size,
        )
        .map_err(|source| ProtocolError::Layout {
            field: "budget.low_bits".into(),
            source,
        })?;
        positive("budget.window", budget.window)?;
        let shortest = self.tokens.iter().copied().min().unwrap_or(0);
        if budget.window > shortest {
            return Err(ProtocolError::WindowTooLong {
                field: "budget.window".into(),
                window: budget.window,
                shortest,
            });
        }
        Ok(())
    }
}

fn non_empty_unique<T: Ord + fmt::Debug>(field: &str, items: &[T]) -> Result<(), ProtocolError> {
    if items.is_empty() {
        return Err(ProtocolError::Empty {
            field: field.into(),
        });
    }
    let mut seen = BTreeSet::new();
    for item in items {
        if !seen.insert(item) {
            return Err(ProtocolError::Duplicate {
                field: field.into(),
                item: format!("{item:?}"),
            });
        }
    }
    Ok(())
}

fn positive(field: &str, value: usize) -> Result<(), ProtocolError> {
    if value == 0 {
        return Err(ProtocolError::Zero {
            field: field.into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Mode;

    fn with(edit: impl FnOnce(&mut serde_json::Value)) -> Result<Protocol, ProtocolError> {
        let mut value: serde_json::Value = serde_json::from_str(FROZEN).unwrap();
        edit(&mut value);
        Protocol::from_json(&value.to_string())
    }

    fn err(edit: impl FnOnce(&mut serde_json::Value)) -> ProtocolError {
        with(edit).unwrap_err()
    }

    fn parse_field(err: &ProtocolError) -> Option<&str> {
        match err {
            ProtocolError::Parse { field, .. } => Some(field),
            _ => None,
        }
    }

    #[test]
    fn frozen_protocol_has_144_comparisons() {
        let p = Protocol::frozen();
        assert_eq!(p.inputs().len(), 18);
        assert_eq!(p.comparison_count(), 144);
        assert_eq!(
            p.generator.as_ref().unwrap().entropy.entropy(7, 128),
            Some(70128)
        );
        assert_eq!(p.inputs()[0].id(), "s7_n128_clean");
    }

    #[test]
    fn unknown_fields_wrong_types_and_unknown_names_are_parse_errors_naming_the_field() {
        // serde_path_to_error names an unknown field by its own path.
        assert_eq!(
            parse_field(&err(|v| v["colour"] = 3.into())),
            Some("colour")
        );
        for (edit, field) in [
            (
                Box::new(|v: &mut serde_json::Value| v["focus"]["width"] = 3.into())
                    as Box<dyn FnOnce(&mut serde_json::Value)>,
                "focus.width",
            ),
            (Box::new(|v| v["seeds"][1] = (-19).into()), "seeds[1]"),
            (
                Box::new(|v| v["generator"]["entropy"]["offset"] = 2.5.into()),
                "generator.entropy.offset",
            ),
            (
                Box::new(|v| v["generator"]["entropy"]["seed_multiplier"] = (-1).into()),
                "generator.entropy.seed_multiplier",
            ),
            (
                Box::new(|v| v["distributions"][0] = "spiky".into()),
                "distributions[0]",
            ),
            (
                Box::new(|v| v["generator"]["name"] = "mt19937".into()),
                "generator.name",
            ),
            (
                Box::new(|v| v["budget"]["policies"][0] = "recent4".into()),
                "budget.policies[0]",
            ),
            (
                Box::new(|v| v["budget"]["group_size"] = (-32).into()),
                "budget.group_size",
            ),
            (
                Box::new(|v| v["timing"]["warmup"] = 1.5.into()),
                "timing.warmup",
            ),
            (
                Box::new(|v| v["settings"][0]["mode"] = "nf4".into()),
                "settings[0].mode",
            ),
        ] {
            assert_eq!(parse_field(&err(edit)), Some(field));
        }
    }

    #[test]
    fn empty_duplicate_and_zero_values_are_named() {
        let field = |f: &str| f.to_string();
        assert_eq!(
            err(|v| v["seeds"] = serde_json::json!([])),
            ProtocolError::Empty {
                field: field("seeds")
            }
        );
        assert_eq!(
            err(|v| v["budget"]["policies"] = serde_json::json!([])),
            ProtocolError::Empty {
                field: field("budget.policies")
            }
        );
        assert_eq!(
            err(|v| v["tokens"] = serde_json::json!([128, 128])),
            ProtocolError::Duplicate {
                field: field("tokens"),
                item: "128".into()
            }
        );
        for (edit, name) in [
            (
                Box::new(|v: &mut serde_json::Value| v["tokens"][0] = 0.into())
                    as Box<dyn FnOnce(&mut serde_json::Value)>,
                "tokens[0]",
            ),
            (Box::new(|v| v["features"] = 0.into()), "features"),
            (Box::new(|v| v["queries"] = 0.into()), "queries"),
            (
                Box::new(|v| v["budget"]["window"] = 0.into()),
                "budget.window",
            ),
            (
                Box::new(|v| v["timing"]["repeats"] = 0.into()),
                "timing.repeats",
            ),
        ] {
            assert_eq!(err(edit), ProtocolError::Zero { field: field(name) });
        }
    }

    #[test]
    fn widths_group_sizes_and_windows_are_held_to_the_codec_and_the_lengths() {
        use kvcodec::{KvError, Mode};
        let layout = |e: ProtocolError| match e {
            ProtocolError::Layout { field, source } => (field, source),
            other => panic!("not a layout refusal: {other:?}"),
        };
        assert_eq!(
            layout(err(|v| v["settings"][2]["bits"] = 9.into())),
            (
                "settings[2]".into(),
                KvError::UnsupportedBits {
                    bits: 9,
                    mode: Mode::Symmetric
                }
            )
        );
        assert_eq!(
            layout(err(|v| v["settings"][0]["group_size"] = 0.into())),
            ("settings[0]".into(), KvError::ZeroGroupSize)
        );
        // Symmetric 1-bit has no code besides zero; asymmetric 1-bit does.
        assert_eq!(
            layout(err(|v| v["settings"][0]["bits"] = 1.into())),
            (
                "settings[0]".into(),
                KvError::UnsupportedBits {
                    bits: 1,
                    mode: Mode::Symmetric
                }
            )
        );
        assert_eq!(
            layout(err(|v| v["budget"]["low_bits"] = 1.into())),
            (
                "budget.low_bits".into(),
                KvError::UnsupportedBits {
                    bits: 1,
                    mode: Mode::Symmetric
                }
            )
        );
        assert_eq!(
            err(|v| v["focus"]["window"] = 1000.into()),
            ProtocolError::WindowTooLong {
                field: "focus.window".into(),
                window: 1000,
                shortest: 128
            }
        );
        assert_eq!(
            err(|v| v["budget"]["window"] = 129.into()),
            ProtocolError::WindowTooLong {
                field: "budget.window".into(),
                window: 129,
                shortest: 128
            }
        );
        let p = with(|v| {
            v.as_object_mut().unwrap().remove("budget");
            v.as_object_mut().unwrap().remove("timing");
        })
        .unwrap();
        assert_eq!(p.comparison_count(), 72);
    }

    #[test]
    fn settings_take_any_width_and_an_optional_mode() {
        let p = with(|v| {
            v["settings"] = serde_json::json!([
                { "group_size": 32, "bits": 3 },
                { "group_size": 32, "bits": 2, "mode": "asymmetric" },
                { "group_size": 16, "bits": 1, "mode": "asymmetric" }
            ])
        })
        .unwrap();
        assert_eq!(p.settings[0].mode, Mode::Symmetric);
        assert_eq!(p.settings[1].label(), "g32_b2_asym");
        // A symmetric setting serializes as before, with no mode field.
        let text = serde_json::to_string(&p.settings[0]).unwrap();
        assert_eq!(text, r#"{"group_size":32,"bits":3}"#);
    }

    #[test]
    fn sizes_that_would_exhaust_memory_are_refused_by_field() {
        assert_eq!(
            err(|v| v["features"] = (1u64 << 40).into()),
            ProtocolError::MatrixTooLarge {
                field: "tokens[0]".into(),
                rows: 128,
                features: 1 << 40
            }
        );
        let e = err(|v| {
            v["tokens"] = serde_json::json!([i32::MAX]);
            v["features"] = (1u64 << 62).into();
        });
        assert_eq!(e.field(), "tokens[0]");
        assert_eq!(
            err(|v| v["queries"] = (1u64 << 30).into()),
            ProtocolError::MatrixTooLarge {
                field: "queries".into(),
                rows: 1 << 30,
                features: 32
            }
        );
        assert_eq!(
            err(|v| v["timing"]["repeats"] = 1_000_000_000_000_000u64.into()),
            ProtocolError::TooManyCalls {
                comparisons: 144,
                calls: 1_000_000_000_000_000
            }
        );
    }

    #[test]
    fn entropy_overflow_is_refused() {
        let e = err(|v| {
            v["seeds"] = serde_json::json!([u64::MAX]);
            v["generator"]["entropy"]["seed_multiplier"] = u64::MAX.into();
            v["generator"]["entropy"]["tokens_multiplier"] = u64::MAX.into();
        });
        assert_eq!(
            e,
            ProtocolError::EntropyOverflow {
                seed: u64::MAX,
                tokens: 128
            }
        );
    }

    /// A small valid protocol to edit: one seed, one length, clean only, one setting.
    fn small(edit: impl FnOnce(&mut serde_json::Value)) -> Result<Protocol, ProtocolError> {
        let mut value = serde_json::json!({
            "study": "bounds",
            "seeds": [1],
            "tokens": [16],
            "features": 4,
            "queries": 1,
            "distributions": ["clean"],
            "focus": { "window": 1, "gain": 1.0 },
            "settings": [ { "group_size": 4, "bits": 4 } ],
            "generator": { "name": "chacha20",
                           "entropy": { "seed_multiplier": 1, "tokens_multiplier": 1, "offset": 0 } }
        });
        edit(&mut value);
        Protocol::from_json(&value.to_string())
    }

    fn field(err: &ProtocolError) -> &str {
        err.field()
    }

    #[test]
    fn at_most_100_configurations_each_distinct_in_the_chart() {
        let settings = |n: usize| -> Vec<serde_json::Value> {
            (1..=n)
                .map(|g| serde_json::json!({ "group_size": g, "bits": 4 }))
                .collect()
        };
        assert!(small(|v| v["settings"] = settings(100).into()).is_ok());
        let err = small(|v| v["settings"] = settings(101).into()).unwrap_err();
        assert_eq!(err, ProtocolError::TooManyConfigurations { count: 101 });
        // Budget policies are configurations too.
        let err = small(|v| {
            v["settings"] = settings(97).into();
            v["budget"] = serde_json::json!({ "group_size": 4, "low_bits": 4, "window": 1,
                "policies": ["uniform", "recent8", "early8", "recent_f32"] });
        })
        .unwrap_err();
        assert_eq!(err, ProtocolError::TooManyConfigurations { count: 101 });
        assert_eq!(err.field(), "settings");
    }

    #[test]
    fn a_focus_gain_must_be_finite_and_not_negative() {
        for gain in [0.0, 0.5, 2.0, 1e6] {
            assert!(
                small(|v| v["focus"]["gain"] = gain.into()).is_ok(),
                "{gain}"
            );
        }
        for gain in [-2.0, -1e-30] {
            let err = small(|v| v["focus"]["gain"] = gain.into()).unwrap_err();
            assert!(
                matches!(err, ProtocolError::GainInvalid { .. }),
                "{gain}: {err:?}"
            );
            assert_eq!(err.field(), "focus.gain");
        }
        // Beyond f32 (JSON has no NaN or infinity) the parser refuses it, naming the field too.
        let err = small(|v| v["focus"]["gain"] = 1e39.into()).unwrap_err();
        assert_eq!(err.field(), "focus.gain", "{err:?}");
    }

    #[test]
    fn study_names_are_one_to_64_plain_ascii_characters() {
        for name in ["a", "packed-kv", "widths_and.modes-2", &"x".repeat(64)] {
            assert!(small(|v| v["study"] = name.into()).is_ok(), "{name:?}");
        }
        let long = "x".repeat(65);
        for name in [
            "",
            " ",
            "a b",
            "x|y",
            "a\nb",
            "<b>",
            "# h",
            "*x*",
            "caf\u{e9}",
            &long,
        ] {
            let err = small(|v| v["study"] = name.into()).unwrap_err();
            assert_eq!(err.field(), "study", "{name:?}: {err:?}");
        }
    }

    #[test]
    fn group_sizes_far_longer_than_the_tensor_are_refused_by_field_and_length() {
        // K at N = 16, D = 4: 4 rows of 16 tokens padded to one group of g codes.
        for g in [1u64 << 62, 1 << 32, u64::MAX] {
            let err = small(|v| v["settings"][0]["group_size"] = g.into()).unwrap_err();
            assert_eq!(
                err,
                ProtocolError::GroupedViewTooLarge {
                    field: "settings[0].group_size".into(),
                    group_size: g as usize,
                    tokens: 16,
                    segment: (0, 16),
                    tensor: "K",
                    rows: 4,
                    padded_row_len: Some(g),
                }
            );
        }
        // The second setting at the second length: V is 1000 rows of one padded group of 2^20
        // (at N = 16 both fit).
        let err = small(|v| {
            v["tokens"] = serde_json::json!([16, 1000]);
            v["settings"] = serde_json::json!([{ "group_size": 4, "bits": 4 },
                                               { "group_size": 1 << 20, "bits": 8 }]);
        })
        .unwrap_err();
        assert!(
            matches!(&err, ProtocolError::GroupedViewTooLarge {
                field, tokens: 1000, tensor: "V", rows: 1000, padded_row_len: Some(0x10_0000), ..
            } if field == "settings[1].group_size"),
            "{err:?}"
        );
        let err = small(|v| {
            v["budget"] = serde_json::json!({ "group_size": 1u64 << 40, "low_bits": 4,
                                              "window": 4, "policies": ["recent8"] });
        })
        .unwrap_err();
        // The first stored segment of recent8 is the low-precision tokens 0..12.
        assert!(
            matches!(&err, ProtocolError::GroupedViewTooLarge {
                field, tokens: 16, segment: (0, 12), tensor: "K", ..
            } if field == "budget.group_size"),
            "{err:?}"
        );
        // The 8-bit window segment alone is checked too (early8 with the window the whole
        // cache stores one 8-bit segment).
        let err = small(|v| {
            v["budget"] = serde_json::json!({ "group_size": 1u64 << 30, "low_bits": 4,
                                              "window": 16, "policies": ["early8"] });
        })
        .unwrap_err();
        assert!(
            matches!(
                &err,
                ProtocolError::GroupedViewTooLarge {
                    segment: (0, 16),
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn a_padded_grouped_view_of_exactly_the_limit_is_accepted() {
        // D = 1, N = 1: K and V are each 1 row of one group of g codes.
        let limit = MAX_MATRIX_ELEMENTS as u64;
        let at = |g: u64| {
            small(|v| {
                v["features"] = 1.into();
                v["tokens"] = serde_json::json!([1]);
                v["settings"][0]["group_size"] = g.into();
            })
        };
        assert!(at(limit).is_ok());
        assert!(matches!(
            at(limit + 1),
            Err(ProtocolError::GroupedViewTooLarge { rows: 1, padded_row_len: Some(p), .. })
                if p == limit + 1
        ));
    }

    #[test]
    fn arrays_npz_stays_a_plain_zip() {
        // 9 asymmetric settings store 9 members each, + 4 per input: 85 per input; 257 seeds
        // x 3 distributions = 771 inputs hold exactly 65,535 members.
        let with_seeds = |seeds: u64| {
            small(|v| {
                v["seeds"] = (0..seeds).collect::<Vec<_>>().into();
                v["distributions"] = serde_json::json!(["clean", "early_focus", "recent_focus"]);
                v["settings"] = (1..=9)
                    .map(
                        |g| serde_json::json!({ "group_size": g, "bits": 4, "mode": "asymmetric" }),
                    )
                    .collect::<Vec<_>>()
                    .into();
            })
        };
        let p = with_seeds(257).unwrap();
        assert_eq!(archive::member_count(&p), Some(MAX_NPZ_MEMBERS));
        assert_eq!(archive::members(&p).len() as u64, MAX_NPZ_MEMBERS);
        assert_eq!(
            with_seeds(258),
            Err(ProtocolError::TooManyMembers {
                members: Some(258 * 3 * 85)
            })
        );
        // 20 inputs with K and V of 2^27 float32 values each: about 20 GiB.
        let err = small(|v| {
            v["seeds"] = (0..20).collect::<Vec<_>>().into();
            v["tokens"] = serde_json::json!([1 << 14]);
            v["features"] = (1 << 13).into();
            v["settings"][0]["group_size"] = 64.into();
        })
        .unwrap_err();
        assert!(
            matches!(err, ProtocolError::ArchiveTooLarge { bytes: Some(b) } if b > 20 << 30),
            "{err:?}"
        );
    }

    #[test]
    fn every_refusal_names_what_to_change() {
        // One Display check per new variant; the others are covered above by field.
        let view = small(|v| v["settings"][0]["group_size"] = (1u64 << 62).into()).unwrap_err();
        assert_eq!(
            view.to_string(),
            "protocol field `settings[0].group_size`: group size 4611686018427387904 at N = 16: \
             K would be stored as 4 rows x 4,611,686,018,427,387,904 padded codes, more than \
             134,217,728 elements"
        );
        let members = ProtocolError::TooManyMembers { members: None };
        assert_eq!(
            members.to_string(),
            "arrays.npz would hold more than 2^64 members; a plain ZIP holds at most 65,535 \
             (fewer seeds, lengths, distributions, settings or policies)"
        );
        let bytes = ProtocolError::ArchiveTooLarge {
            bytes: Some(1 << 32),
        };
        assert_eq!(
            bytes.to_string(),
            "arrays.npz would take about 4,294,967,296 bytes; a plain ZIP (no ZIP64) must stay \
             below 4,294,967,296 bytes"
        );
        assert_eq!(field(&view), "settings[0].group_size");
    }
}
