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

mod error;
#[cfg(test)]
mod tests;

pub use error::ProtocolError;

use crate::archive::{self, MAX_NPZ_BYTES, MAX_NPZ_MEMBERS};
use crate::plan::Storage;
use crate::protocol::{
    Axes, Distribution, FROZEN, KvSetting, MAX_CONFIGURATIONS, MAX_MATRIX_ELEMENTS,
    MAX_STUDY_NAME_CHARS, MAX_TIMED_CALLS, Protocol,
};

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

/// Reads a protocol file's text: a regular file (opened non-blocking with [`open_input`], so a
/// FIFO cannot block the runner, and checked once open) of at most [`MAX_PROTOCOL_FILE_BYTES`].
pub fn read_protocol_file(path: &std::path::Path) -> Result<String, ProtocolFileError> {
    use std::io::Read;
    let io = |source| ProtocolFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = open_input(path).map_err(io)?;
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

/// Opens an input file for reading without blocking on it: with `O_NONBLOCK`, a FIFO with no
/// writer opens at once (a plain `open` waits for a writer, so the file's type could never be
/// checked), and the caller then refuses anything that is not a regular file by the open file's
/// own metadata (no check-then-open race). For a regular file the flag changes nothing.
#[cfg(unix)]
pub fn open_input(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

/// [`open_input`] where there are no FIFOs to block on.
#[cfg(not(unix))]
pub fn open_input(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    std::fs::File::open(path)
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
        // Each setting's group size and width were validated as it was read (`KvSetting`).
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
                let (axes, group_size) = (setting.axes(), setting.group_size());
                self.check_grouped_view(field, axes, group_size, tokens, (0, tokens))?;
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
        // The setting the budget's low tier is stored at (`Budget::setting`), so that making it
        // later cannot fail: its group size bound is the setting's, not only the layout's.
        KvSetting::new(
            budget.group_size,
            budget.low_bits,
            kvcodec::Mode::Symmetric,
            Axes::default(),
        )
        .map_err(|source| ProtocolError::Layout {
            field: "budget.group_size".into(),
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
