//! Typed errors for the weight formats. Every message names the format, the tensor or element,
//! and the value that caused it, and says what would make the request possible when something
//! can.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum FormatError {
    #[error("{format} stores {supported} codes, not {bits}-bit codes")]
    UnsupportedBits {
        format: &'static str,
        bits: u32,
        supported: &'static str,
    },

    #[error("group size must be at least 1, got 0")]
    ZeroGroupSize,

    #[error("empty matrix: shape {rows} x {cols} has no elements")]
    EmptyMatrix { rows: usize, cols: usize },

    #[error("{format} {tensor} has shape {found:?}, expected {expected:?} ({why})")]
    ShapeMismatch {
        format: &'static str,
        tensor: &'static str,
        found: Vec<usize>,
        expected: Vec<usize>,
        why: String,
    },

    #[error("{what} [{row}, {col}] is {value}, above the {bits}-bit maximum {max}")]
    CodeOutOfRange {
        what: &'static str,
        row: usize,
        col: usize,
        value: u8,
        bits: u32,
        max: u8,
    },

    #[error("g_idx[{row}] is {group}, but there are only {groups} groups")]
    GroupIndexOutOfRange {
        row: usize,
        group: i64,
        groups: usize,
    },

    #[error(
        "GPTQ v1 stores zero - 1, so the zero point 0 at [group {group}, column {col}] cannot be \
         written (the field would wrap to {wrapped} and AutoGPTQ's reader would see {seen}); \
         write gptq_v2, which stores the zero point itself"
    )]
    V1ZeroUnrepresentable {
        group: usize,
        col: usize,
        wrapped: u8,
        seen: u32,
    },

    #[error(
        "GPTQ v1 qzeros field [group {group}, column {col}] holds {field}: read as zero - 1 that \
         is the zero point {seen}, which no {bits}-bit field can hold; the writer probably stored \
         a zero point of 0 under v1, which is ambiguous, so this layer is refused"
    )]
    V1ZeroFieldAmbiguous {
        group: usize,
        col: usize,
        field: u8,
        seen: u32,
        bits: u32,
    },

    #[error(
        "{format} has no g_idx: its rows must be in sequential groups (row k in group k / {group_size}), \
         but row {row} is in group {group}; sort the rows into contiguous groups first and permute \
         the layer's input activations the same way"
    )]
    NeedsSequentialGroups {
        format: &'static str,
        group_size: usize,
        row: usize,
        group: u32,
    },

    #[error(
        "g_idx cannot be made contiguous in groups of {group_size}: group {group} has {rows} rows, \
         a layout without g_idx needs {expected}"
    )]
    GroupsNotContiguous {
        group_size: usize,
        group: usize,
        rows: usize,
        expected: usize,
    },

    #[error(
        "{format} has a fixed {what}; the value at [group {group}, column {col}] is {found}, not \
         {expected}, so converting would need requantization"
    )]
    FixedParameter {
        format: &'static str,
        what: &'static str,
        group: usize,
        col: usize,
        found: String,
        expected: String,
    },

    #[error("the row permutation has {found} entries for K = {rows} rows")]
    PermutationLength { found: usize, rows: usize },

    #[error(
        "the row permutation is not a permutation of rows 0..{rows}: entry {index} is {value}, \
         {problem}"
    )]
    NotAPermutation {
        rows: usize,
        index: usize,
        value: u32,
        problem: String,
    },

    #[error("{format} needs {what} to be a multiple of {multiple}, got {found}")]
    NotAligned {
        format: &'static str,
        what: &'static str,
        found: usize,
        multiple: usize,
    },

    #[error("{what}: {found} bytes, expected {expected}")]
    ByteLength {
        what: String,
        found: usize,
        expected: usize,
    },

    #[error(transparent)]
    Stream(#[from] bitpack::BitsError),

    #[error(
        "non-finite input: element [{row}, {col}] is {value}; the quantizers need finite values"
    )]
    NonFinite { row: usize, col: usize, value: f32 },

    #[error(
        "{format} block {block} (row {row}, columns {start}..{end}) spans {low:e} to {high:e}: its \
         scale d = {scale:e} {problem}; ggml stores it anyway, this tool refuses"
    )]
    ScaleUnrepresentable {
        format: &'static str,
        block: usize,
        row: usize,
        start: usize,
        end: usize,
        low: f32,
        high: f32,
        scale: f32,
        problem: &'static str,
    },

    #[error(
        "NF4 block {block} (elements {start}..{end} of the flattened matrix) has absmax \
         {absmax:e}, whose inverse overflows f32, so every code in it would be a clamp to -1 or \
         +1 (and each zero a NaN that becomes code 0); bitsandbytes stores it anyway, this tool \
         refuses"
    )]
    AbsmaxTooSmall {
        block: usize,
        start: usize,
        end: usize,
        absmax: f32,
    },

    #[error("{format} block {block} has {what} = {value}; a stored scale must be finite")]
    NonFiniteScale {
        format: &'static str,
        what: &'static str,
        block: usize,
        value: f32,
    },

    #[error(
        "converting NF4 to {to} needs requantization: NF4 codes index 16 fixed, non-uniform levels \
         scaled by a per-block absmax, and no integer code with a scale and zero point reproduces \
         them exactly; this tool only converts what it can prove bit-identical, so it refuses"
    )]
    NeedsRequantization { to: String },
}

pub type Result<T> = std::result::Result<T, FormatError>;
