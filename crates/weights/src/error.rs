//! Typed errors for the weight formats. Every message names the format, the tensor or element,
//! and the value that caused it, and says what would make the request possible when something
//! can. One variant stands for one condition; none repeats a source in its message (the only
//! wrapped source, [`FormatError::Stream`], is transparent).

use std::fmt;

use thiserror::Error;

use crate::format::WeightFormat;

/// Why a layout cannot be packed, unpacked, quantized, read or converted.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum FormatError {
    /// A code width the format does not store.
    #[error("{format} stores {supported} codes, not {bits}-bit codes")]
    UnsupportedBits {
        /// The format (or "the logical matrix").
        format: &'static str,
        /// The width asked for.
        bits: u32,
        /// The widths it stores, as a phrase ("2-, 3-, 4- or 8-bit").
        supported: &'static str,
    },

    /// A group size of 0.
    #[error("group size must be at least 1, got 0")]
    ZeroGroupSize,

    /// An NF4 block size (elements per absmax) of 0.
    #[error("NF4 block size must be at least 1, got 0")]
    ZeroBlockSize,

    /// A matrix, or a recorded logical size, with no element.
    #[error("empty matrix: shape {rows} x {cols} has no elements")]
    EmptyMatrix {
        /// Rows (K for the integer layouts).
        rows: usize,
        /// Columns (N for the integer layouts).
        cols: usize,
    },

    /// A recorded shape whose element count does not fit in a `usize` (a product that would
    /// wrap, e.g. an NF4 quant state's `[2^58 + 4, 64]`, which wraps to 256).
    #[error(
        "shape {rows} x {cols} has more elements than this machine can count (rows x cols overflows)"
    )]
    ElementCountOverflow {
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
    },

    /// A tensor whose shape is not the one the format implies for it.
    #[error("{format} {tensor} has shape {found:?}, expected {expected:?} ({why})")]
    ShapeMismatch {
        /// The format ("GPTQ", "AWQ", "logical").
        format: &'static str,
        /// The tensor's name in that format.
        tensor: &'static str,
        /// Its shape.
        found: Vec<usize>,
        /// The shape the format implies.
        expected: Vec<usize>,
        /// How the expected shape follows from the layer's K, N, groups and bits.
        why: String,
    },

    /// A recorded logical [K, N] larger than the stored (padded) tensors.
    #[error(
        "{format} logical shape {logical:?} does not fit inside the stored tensors' [K, N] = \
         {stored:?}"
    )]
    LogicalShapeTooLarge {
        /// The format ("GPTQ", "AWQ", "logical").
        format: &'static str,
        /// The recorded [K, N].
        logical: [usize; 2],
        /// The stored [K, N].
        stored: [usize; 2],
    },

    /// A code or zero point above the largest value its width holds.
    #[error("{what} [{row}, {col}] is {value}, above the {bits}-bit maximum {max}")]
    CodeOutOfRange {
        /// "code", "zero point" or "NF4 code".
        what: &'static str,
        /// Its row (a group, for a zero point).
        row: usize,
        /// Its column.
        col: usize,
        /// The value.
        value: u8,
        /// The width.
        bits: u32,
        /// 2^bits - 1.
        max: u8,
    },

    /// A g_idx entry at or past the number of groups.
    #[error("g_idx[{row}] is {group}, but there are only {groups} groups")]
    GroupIndexOutOfRange {
        /// The row.
        row: usize,
        /// Its group index.
        group: u32,
        /// The number of groups (rows of scales).
        groups: usize,
    },

    /// A stored (int32) g_idx entry below 0.
    #[error("g_idx[{row}] is {group}, a negative group index")]
    NegativeGroupIndex {
        /// The row.
        row: usize,
        /// Its stored group index.
        group: i32,
    },

    /// A true zero point of 0, which GPTQ v1's "zero - 1" field cannot hold.
    #[error(
        "GPTQ v1 stores zero - 1, so the zero point 0 at [group {group}, column {col}] cannot be \
         written (the field would wrap to {wrapped} and AutoGPTQ's reader would see {seen}); \
         write gptq_v2, which stores the zero point itself"
    )]
    V1ZeroUnrepresentable {
        /// The group.
        group: usize,
        /// The column.
        col: usize,
        /// The field the wrap would store: 2^b - 1.
        wrapped: u8,
        /// What AutoGPTQ would read back: 2^b.
        seen: u32,
    },

    /// A GPTQ v1 field of 2^b - 1, which means a zero point of 2^b (one a writer of zero 0
    /// wraps to, and which the libraries read differently).
    #[error(
        "GPTQ v1 qzeros field [group {group}, column {col}] holds {field}: read as zero - 1 that \
         is the zero point {seen}, which no {bits}-bit field can hold; the writer probably stored \
         a zero point of 0 under v1, which is ambiguous, so this layer is refused"
    )]
    V1ZeroFieldAmbiguous {
        /// The group.
        group: usize,
        /// The column.
        col: usize,
        /// The stored field: 2^b - 1.
        field: u8,
        /// The zero point it would mean: 2^b.
        seen: u32,
        /// The width.
        bits: u32,
    },

    /// Rows not in sequential groups, for a format without g_idx.
    #[error(
        "{format} has no g_idx: its rows must be in sequential groups (row k in group k / {group_size}), \
         but row {row} is in group {group}; sort the rows into contiguous groups first and permute \
         the layer's input activations the same way"
    )]
    NeedsSequentialGroups {
        /// The format.
        format: &'static str,
        /// The group size.
        group_size: usize,
        /// The first row out of sequence.
        row: usize,
        /// Its group.
        group: u32,
    },

    /// An act-order g_idx whose groups do not have the sizes sequential groups would.
    #[error(
        "g_idx cannot be made contiguous in groups of {group_size}: group {group} has {rows} rows, \
         a layout without g_idx needs {expected}"
    )]
    GroupsNotContiguous {
        /// The group size.
        group_size: usize,
        /// The first group of the wrong size.
        group: usize,
        /// Its rows.
        rows: usize,
        /// The rows sequential groups give it.
        expected: usize,
    },

    /// A zero point other than the fixed one of a format that stores none (GGUF).
    #[error(
        "{format} has a fixed zero point; the value at [group {group}, column {col}] is {found}, \
         not {expected}, so converting would need requantization"
    )]
    FixedZeroPoint {
        /// The format.
        format: &'static str,
        /// The group.
        group: usize,
        /// The column.
        col: usize,
        /// The zero point there.
        found: u8,
        /// The format's fixed zero point.
        expected: u8,
    },

    /// A group size other than a block format's fixed block of weights.
    #[error(
        "{format} blocks hold exactly {block} weights each, so the group size must be {block}, got {found}"
    )]
    BlockGroupSize {
        /// The format.
        format: &'static str,
        /// The group size given.
        found: usize,
        /// Weights per block.
        block: usize,
    },

    /// A row permutation with a length other than the rows'.
    #[error("the row permutation has {found} entries for K = {rows} rows")]
    PermutationLength {
        /// Its length.
        found: usize,
        /// The rows it should permute.
        rows: usize,
    },

    /// A row permutation entry past the last row.
    #[error(
        "the row permutation is not a permutation of rows 0..{rows}: entry {index} is {value}, \
         past the last row {}",
        .rows.saturating_sub(1)
    )]
    PermutationPastEnd {
        /// The rows it should permute.
        rows: usize,
        /// The entry.
        index: usize,
        /// Its value.
        value: u32,
    },

    /// A row permutation that names a row twice.
    #[error(
        "the row permutation is not a permutation of rows 0..{rows}: entry {index} is {value}, \
         which entry {first} already holds"
    )]
    PermutationRepeatsRow {
        /// The rows it should permute.
        rows: usize,
        /// The later entry.
        index: usize,
        /// The row both name.
        value: u32,
        /// The earlier entry.
        first: usize,
    },

    /// Sizes that are not whole multiples of a pack factor or group size.
    #[error("{format} needs {what} to be a multiple of {multiple}, got {found}")]
    NotAligned {
        /// The format.
        format: &'static str,
        /// The size, as the tensors give it ("K (g_idx length)").
        what: &'static str,
        /// Its value.
        found: usize,
        /// What it must be a multiple of.
        multiple: usize,
    },

    /// A GGUF row length that is not whole blocks of 32 (or is 0).
    #[error(
        "{format} needs the row length (blocks of 32 run along a row) to be a multiple of 32, \
         got {cols}"
    )]
    RowLength {
        /// The format.
        format: &'static str,
        /// The row length.
        cols: usize,
    },

    /// Row-major values whose count is not whole rows.
    #[error("{len} values are not whole rows of {cols}")]
    NotWholeRows {
        /// The values.
        len: usize,
        /// The row length.
        cols: usize,
    },

    /// GGUF bytes that are not whole blocks.
    #[error(
        "{format} data is whole {block_bytes}-byte blocks: {found} bytes, expected {}",
        .found.next_multiple_of(*.block_bytes)
    )]
    PartialBlock {
        /// The format.
        format: &'static str,
        /// The bytes given.
        found: usize,
        /// Bytes per block.
        block_bytes: usize,
    },

    /// GGUF blocks whose count is not the one a tensor's shape implies.
    #[error("{format} has {found} blocks, but a {rows} x {cols} tensor is {expected} blocks of 32")]
    BlockCount {
        /// The format.
        format: &'static str,
        /// Rows of the tensor.
        rows: usize,
        /// Columns of the tensor.
        cols: usize,
        /// Blocks given.
        found: usize,
        /// rows * cols / 32.
        expected: usize,
    },

    /// NF4 packed codes that are not ceil(rows * cols / 2) bytes.
    #[error("NF4 codes for {rows} x {cols}: {found} bytes, expected {expected}")]
    Nf4CodeBytes {
        /// Rows of the tensor.
        rows: usize,
        /// Columns of the tensor.
        cols: usize,
        /// Bytes given.
        found: usize,
        /// ceil(rows * cols / 2).
        expected: usize,
    },

    /// An NF4 absmax count other than one per block.
    #[error(
        "NF4 absmax for {blocks} blocks of {block_size}: {} bytes, expected {}",
        4 * .found,
        4 * .blocks
    )]
    Nf4AbsmaxCount {
        /// Blocks the shape has.
        blocks: usize,
        /// Elements per block.
        block_size: usize,
        /// Absmax values given.
        found: usize,
    },

    /// A code stream that does not pack or unpack (from `bitpack`).
    #[error(transparent)]
    Stream(#[from] bitpack::BitsError),

    /// A NaN or infinite value given to a quantizer.
    #[error(
        "non-finite input: element [{row}, {col}] is {value}; the quantizers need finite values"
    )]
    NonFinite {
        /// Its row.
        row: usize,
        /// Its column.
        col: usize,
        /// The value.
        value: f32,
    },

    /// An RTN group whose scale (range / (2^b - 1)) rounds to infinity in f16.
    #[error(
        "RTN group {group} of column {col} spans {low:e}..{high:e}, whose {bits}-bit scale \
         rounds to infinity in f16 (largest finite value 65504)"
    )]
    GroupScaleRoundsToInfinity {
        /// The group.
        group: usize,
        /// The column (out-feature).
        col: usize,
        /// The group's range, 0 included.
        low: f32,
        /// Its top.
        high: f32,
        /// The code width.
        bits: u32,
    },

    /// A GGUF block whose scale rounds to infinity in f16 (ggml stores it anyway).
    #[error(
        "{0} rounds to infinity in f16 (largest finite value 65504), so the block's weights \
         would dequantize to infinities and NaN; ggml stores it anyway, this tool refuses"
    )]
    ScaleRoundsToInfinity(ScaledBlock),

    /// A GGUF block of nonzero values whose scale rounds to 0 in f16 (ggml stores it anyway).
    #[error(
        "{0} rounds to 0 in f16 (smallest positive value 2^-24 = 5.96e-8), so every weight of \
         the block would dequantize to 0; ggml stores it anyway, this tool refuses"
    )]
    ScaleRoundsToZero(ScaledBlock),

    /// A GGUF Q4_1 block of differing values whose scale rounds to 0 in f16 (ggml stores it
    /// anyway).
    #[error(
        "{0} rounds to 0 in f16 (smallest positive value 2^-24 = 5.96e-8), so every weight of \
         the block would dequantize to its minimum m; ggml stores it anyway, this tool refuses"
    )]
    RangeScaleRoundsToZero(ScaledBlock),

    /// A GGUF Q4_1 block whose minimum rounds to infinity in f16 (ggml stores it anyway).
    #[error(
        "{0}, and its minimum m = {low:e} rounds to infinity in f16 (largest finite value \
         65504), so the block's weights would dequantize to infinities and NaN; ggml stores it \
         anyway, this tool refuses",
        low = .0.low
    )]
    MinRoundsToInfinity(ScaledBlock),

    /// An NF4 block whose absmax is so small that its inverse overflows f32.
    #[error(
        "NF4 block {block} (elements {start}..{end} of the flattened matrix) has absmax \
         {absmax:e}, whose inverse overflows f32, so every code in it would be a clamp to -1 or \
         +1 (and each zero a NaN that becomes code 0); bitsandbytes stores it anyway, this tool \
         refuses"
    )]
    AbsmaxTooSmall {
        /// The block.
        block: usize,
        /// Its first element in the flattened matrix.
        start: usize,
        /// One past its last.
        end: usize,
        /// Its absmax.
        absmax: f32,
    },

    /// A GGUF tensor type with no dequantizer in this crate.
    #[error(
        "ggml type {ty} cannot be dequantized here: readable types are F32, F16, BF16, Q4_0, \
         Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K"
    )]
    UnreadableGgufType {
        /// The type's name.
        ty: String,
    },

    /// A stored scale (GGUF d, NF4 absmax) that is NaN or infinite.
    #[error("{format} block {block} has {what} = {value}; a stored scale must be finite")]
    NonFiniteScale {
        /// The format.
        format: &'static str,
        /// "scale d" or "absmax".
        what: &'static str,
        /// The block.
        block: usize,
        /// The stored value.
        value: f32,
    },

    /// NF4 to an integer format, which no exact conversion reaches.
    #[error(
        "converting NF4 to {to} needs requantization: NF4 codes index 16 fixed, non-uniform levels \
         scaled by a per-block absmax, and no integer code with a scale and zero point reproduces \
         them exactly; this tool only converts what it can prove bit-identical, so it refuses"
    )]
    NeedsRequantization {
        /// The format asked for.
        to: WeightFormat,
    },
}

/// A GGUF block whose f32 scale `d` f16 cannot hold: where it is, what it spans and `d`.
/// Printed as `Q4_0 block 3 (row 1, columns 32..64) spans 1e0 to 1e7: its scale d = -1.25e6`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaledBlock {
    /// The format ("Q4_0", "Q8_0", "Q4_1").
    pub format: &'static str,
    /// The block, counted over the whole tensor.
    pub block: usize,
    /// Its row.
    pub row: usize,
    /// Its first column.
    pub start: usize,
    /// One past its last column.
    pub end: usize,
    /// Its smallest value.
    pub low: f32,
    /// Its largest value.
    pub high: f32,
    /// ggml's f32 `d` for it, before rounding to f16.
    pub scale: f32,
}

impl fmt::Display for ScaledBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} block {} (row {}, columns {}..{}) spans {:e} to {:e}: its scale d = {:e}",
            self.format,
            self.block,
            self.row,
            self.start,
            self.end,
            self.low,
            self.high,
            self.scale
        )
    }
}

/// Results of the layouts' functions.
pub type Result<T> = std::result::Result<T, FormatError>;
