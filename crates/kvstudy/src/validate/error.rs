//! Why a protocol is refused: one variant per condition, each naming the field to change.

use thiserror::Error;

use crate::protocol::{
    MAX_CONFIGURATIONS, MAX_MATRIX_ELEMENTS, MAX_STUDY_NAME_CHARS, MAX_TIMED_CALLS,
};
use evidence::format::thousands_u64 as thousands;

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
    /// More settings and budget policies than the chart can draw distinctly.
    #[error(
        "protocol field `settings`: {count} configurations (settings plus budget policies); at \
         most {MAX_CONFIGURATIONS}, each drawn with its own look in the chart: split the sweep \
         into several protocols"
    )]
    TooManyConfigurations {
        /// Settings plus budget policies.
        count: usize,
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
            ProtocolError::TooManyCalls { .. } => "timing",
            ProtocolError::TooManyConfigurations { .. } => "settings",
            ProtocolError::EntropyOverflow { .. } => "generator.entropy",
            ProtocolError::TooManyMembers { .. } | ProtocolError::ArchiveTooLarge { .. } => "",
        }
    }
}
