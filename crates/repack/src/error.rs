//! Typed errors for checkpoint IO and the commands. Each names the file or layer it is about.
//!
//! Messages never include their source: a variant that wraps a cause (`#[source]`) says only
//! what it adds (the file, the layer, the metadata key), and whoever prints the error prints
//! the chain once, each message followed by `: ` and its cause, as anyhow's `{:#}` does (the
//! binary) or [`with_causes`] does (`inspect`'s report). Format-level problems keep the
//! `weights` crate's own messages.
//!
//! This module depends only on the leaf modules whose error types it wraps
//! ([`crate::checkpoint`], [`crate::npy`], [`crate::metadata`]) and on [`crate::names`].

use std::path::{Path, PathBuf};

use thiserror::Error;
use weights::bpw::BpwError;
use weights::transcode::TranscodeError;
use weights::{FormatError, WeightFormat};

use crate::checkpoint::{CheckpointError, SafetensorsError, TensorError};
use crate::metadata::{DeclaredBits, MetadataError};
use crate::names::layer_label;
use crate::npy::NpyError;

/// Everything `repack`'s commands refuse, and why.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// A file that cannot be opened, read, written or renamed.
    #[error("{}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },

    /// An input that is not a safetensors file this tool reads.
    #[error("{}: not a readable safetensors file", path.display())]
    SafeTensors {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: CheckpointError,
    },

    /// A checkpoint the `safetensors` crate cannot lay out.
    #[error("{}: could not lay out a safetensors file", path.display())]
    Serialize {
        /// The file it was meant for.
        path: PathBuf,
        /// The crate's refusal.
        source: SafetensorsError,
    },

    /// An input that is not a float32 matrix in `.npy` format.
    #[error("{}: not a float32 matrix in .npy format", path.display())]
    Npy {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: NpyError,
    },

    /// An output whose directory does not exist.
    #[error(
        "{}: directory {} does not exist; create it first (mkdir -p {})",
        path.display(),
        dir.display(),
        dir.display()
    )]
    OutputDirMissing {
        /// The output.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
    },

    /// An input that does not exist.
    #[error("{}: no such file", path.display())]
    Missing {
        /// The file.
        path: PathBuf,
    },

    /// An input that is not a GGUF file this tool reads.
    #[error("{}: not a readable GGUF file", path.display())]
    Gguf {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: gguf_file::Error,
    },

    /// A GGUF file that cannot be laid out.
    #[error("{}: could not lay out a GGUF file", path.display())]
    GgufWrite {
        /// The file it was meant for.
        path: PathBuf,
        /// The writer's refusal.
        source: gguf_file::writer::WriteError,
    },

    /// A flag given where it does not apply.
    #[error("{flag} does not apply {why}")]
    FlagNotApplicable {
        /// The flag and its value.
        flag: String,
        /// Why it does not apply.
        why: String,
    },

    /// `dequantize --raw` without `--from` or `--cols`.
    #[error("--raw needs {missing}: a bare block file does not say its format or its row length")]
    RawNeedsFlags {
        /// The flags missing.
        missing: &'static str,
    },

    /// An output of `quantize` whose extension names another kind of file.
    #[error(
        "{}: quantize --to {format} writes {container}; name the output *.{extension}",
        path.display()
    )]
    OutputExtension {
        /// The output.
        path: PathBuf,
        /// `--to`.
        format: &'static str,
        /// What it writes.
        container: &'static str,
        /// The extension expected.
        extension: &'static str,
    },

    /// `dequantize --raw` given a file that says its own format.
    #[error(
        "{}: this is a {kind} file, which says its own format and shape; drop --raw, --from, \
         --cols and --block-size",
        path.display()
    )]
    RawOfSelfDescribingFile {
        /// The file.
        path: PathBuf,
        /// GGUF or safetensors.
        kind: &'static str,
    },

    /// `dequantize` given a file that is neither GGUF nor safetensors, without `--raw`.
    #[error(
        "{}: {len} bytes that are neither a GGUF file (magic \"GGUF\") nor a safetensors file; a \
         bare block file (what repack quantize wrote before it wrote GGUF) is read only with \
         --raw --from FORMAT --cols C",
        path.display()
    )]
    UnknownContainer {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: usize,
    },

    /// A file with several tensors and no `--tensor`.
    #[error(
        "{}: holds {} {what} ({}); choose one with --tensor NAME",
        path.display(),
        names.len(),
        names.join(", ")
    )]
    ChooseTensor {
        /// The file.
        path: PathBuf,
        /// What was looked for ("tensors", "NF4 weights").
        what: &'static str,
        /// The names found.
        names: Vec<String>,
    },

    /// A `--tensor` the file does not hold.
    #[error(
        "{}: no tensor {name:?} among its {what} ({})",
        path.display(),
        names.join(", ")
    )]
    NoSuchTensor {
        /// The file.
        path: PathBuf,
        /// `--tensor`.
        name: String,
        /// What was looked for.
        what: &'static str,
        /// The names found.
        names: Vec<String>,
    },

    /// A GGUF tensor of a type `dequantize` does not read.
    #[error(
        "{}: tensor {tensor:?} is {ty}; dequantize reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, \
         Q8_0, Q4_K, Q5_K and Q6_K",
        path.display()
    )]
    GgufTensorType {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: gguf_file::TensorType,
    },

    /// A GGUF tensor of a block type `kvpack.weights.read` does not implement.
    #[error(
        "{}: tensor {tensor:?} is {ty}; this tool reads GGUF tensors of type Q4_0, Q8_0 and Q4_1 \
         (float tensors are skipped)",
        path.display()
    )]
    GgufTypeNotRead {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: gguf_file::TensorType,
    },

    /// A GPTQ layer whose zero-point convention neither the file nor the caller states.
    #[error(
        "{}: layer {layer} is GPTQ, and its zero-point convention is recorded nowhere (no \
         checkpoint_format or format metadata); name it: gptq (stored zero = zero - 1, AutoGPTQ) \
         or gptq_v2 (stored as is, GPTQModel); reading one as the other shifts every weight by a \
         step",
        path.display()
    )]
    ConventionNotRecorded {
        /// The file.
        path: PathBuf,
        /// The layer.
        layer: String,
    },

    /// A GGUF tensor of more than 2 dimensions.
    #[error(
        "{}: tensor {tensor:?} has dims {dims:?} (ggml order); dequantize writes a matrix, from \
         a tensor of 1 or 2 dimensions",
        path.display()
    )]
    GgufTensorRank {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its dims, ne0 first.
        dims: Vec<u64>,
    },

    /// A safetensors file without a bitsandbytes NF4 weight.
    #[error(
        "{}: no bitsandbytes NF4 weight in it (looked for NAME with \
         NAME.quant_state.bitsandbytes__nf4); dequantize reads NF4 safetensors and GGUF files",
        path.display()
    )]
    NoNf4Weight {
        /// The file.
        path: PathBuf,
    },

    /// An NF4 layer this tool does not vouch for.
    #[error("{}: layer {layer}: {why}", path.display())]
    Nf4Layer {
        /// The file.
        path: PathBuf,
        /// The layer.
        layer: String,
        /// Why.
        why: String,
    },

    /// A bare GGUF block file whose length is not whole rows.
    #[error(
        "{found} bytes is not a whole number of rows: with --cols {cols} a {format} row is \
         {blocks_per_row} blocks of {block_bytes} bytes = {row_bytes} bytes; {found} is {} rows \
         and {} bytes; check --from and --cols against what wrote the file",
        found / row_bytes,
        found % row_bytes
    )]
    RawRows {
        /// `--from`.
        format: &'static str,
        /// The file's length.
        found: usize,
        /// `--cols`.
        cols: usize,
        /// cols / 32.
        blocks_per_row: usize,
        /// Bytes per block.
        block_bytes: usize,
        /// Bytes per row.
        row_bytes: usize,
    },

    /// An input that is not a regular file (a device, a FIFO, a directory).
    #[error(
        "{}: not a regular file; inputs are read whole, and only a regular file's size is known \
         before reading it",
        path.display()
    )]
    NotARegularFile {
        /// The file.
        path: PathBuf,
    },

    /// An input too large to hold in memory.
    #[error("{}: {bytes} bytes cannot be held in memory", path.display())]
    InputTooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        bytes: u64,
    },

    /// An empty block file given to `dequantize`.
    #[error(
        "{}: the file is empty; a {format} block file holds at least one row (nothing was written)",
        path.display()
    )]
    EmptyBlockFile {
        /// The file.
        path: PathBuf,
        /// The format it was read as.
        format: &'static str,
    },

    /// A problem found in an input's contents, with the file it was found in.
    #[error("{}", path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// The problem.
        #[source]
        source: Box<Error>,
    },

    /// An output that already exists.
    #[error("{} already exists; refusing to overwrite it (nothing was written)", .0.display())]
    OutputExists(
        /// The output.
        PathBuf,
    ),

    /// A tensor that is not what its layout stores there.
    #[error(transparent)]
    Tensor(#[from] TensorError),

    /// A `--cols` and `--block-size` whose row size in bytes overflows.
    #[error(
        "{format} rows of {cols} values with --block-size {block_size}: one row's size in bytes \
         does not fit in {} bits",
        usize::BITS
    )]
    BlockFileOverflow {
        /// The block format.
        format: &'static str,
        /// `--cols`.
        cols: usize,
        /// `--block-size`.
        block_size: usize,
    },

    /// A GGUF block file read with a `--cols` that is not whole blocks.
    #[error(
        "{format} needs --cols to be a positive multiple of 32 (rows are whole blocks of 32), \
         got {cols}"
    )]
    BlockFileCols {
        /// The block format.
        format: &'static str,
        /// `--cols`.
        cols: usize,
    },

    /// A GGUF block file whose values are not whole rows of `--cols`.
    #[error("{format} file holds {values} values, which are not whole rows of --cols {cols}")]
    BlockFileRows {
        /// The block format.
        format: &'static str,
        /// `--cols`.
        cols: usize,
        /// Values the file holds: 32 per block.
        values: usize,
    },

    /// An NF4 block file whose length is not that of whole rows.
    #[error(
        "{found} bytes is not a whole number of rows: with --cols {cols} and --block-size \
         {block_size}, an nf4 bare file is the codes (half a byte per value) then an f32 absmax \
         per {block_size} values, and the nearest shorter length of whole rows is {nearest} \
         bytes; check --cols and --block-size against what wrote the file"
    )]
    Nf4FileLength {
        /// `--cols`.
        cols: usize,
        /// `--block-size`.
        block_size: usize,
        /// The file's length.
        found: usize,
        /// The nearest shorter length of whole rows.
        nearest: usize,
    },

    /// An integer layer without one of the tensors its layout needs.
    #[error(
        "layer {}: unknown layout: tensor {tensor:?} is missing",
        layer_label(layer)
    )]
    MissingTensor {
        /// The layer's prefix.
        layer: String,
        /// The missing tensor's full name.
        tensor: String,
    },

    /// A tensor under an integer layer's prefix that no integer layout has.
    #[error(
        // The names of `layers::INTEGER_TENSORS`.
        "layer {}: unknown layout: tensor {tensor:?} is not one of qweight, qzeros, scales, g_idx \
         (or bias); refusing rather than dropping it",
        layer_label(layer)
    )]
    UnknownTensor {
        /// The layer's prefix.
        layer: String,
        /// The tensor's full name.
        tensor: String,
    },

    /// A layer read as AWQ that has a g_idx.
    #[error(
        "layer {}: unknown layout: it has {tensor:?}, which AWQ layers do not have; is this a \
         GPTQ checkpoint?",
        layer_label(layer)
    )]
    GIdxInAwqLayer {
        /// The layer's prefix.
        layer: String,
        /// The g_idx tensor's full name.
        tensor: String,
    },

    /// A layer with two bitsandbytes quant states.
    #[error(
        "layer {}: unknown layout: it has two bitsandbytes quant states, for {first:?} and \
         {second:?}",
        layer_label(layer)
    )]
    TwoQuantStates {
        /// The layer's prefix.
        layer: String,
        /// The first state's quant type.
        first: String,
        /// The second's.
        second: String,
    },

    /// A bitsandbytes layer without a quant state.
    #[error(
        "layer {}: unknown layout: no bitsandbytes quant state",
        layer_label(layer)
    )]
    MissingQuantState {
        /// The layer's prefix.
        layer: String,
    },

    /// A GPTQ layer whose qweight rows fit no width for its K.
    #[error(
        "layer {}: unknown layout: qweight has {qweight_rows} rows for K = {k} (g_idx length), \
         which is not K * bits / 32 for 2, 3, 4 or 8 bits",
        layer_label(layer)
    )]
    GptqWidthUnknown {
        /// The layer's prefix.
        layer: String,
        /// Rows of qweight.
        qweight_rows: usize,
        /// K: entries of g_idx.
        k: usize,
    },

    /// An AWQ layer whose scales have no rows, so no group size follows from its shapes.
    #[error(
        "layer {}: unknown layout: scales has no rows, so there is no group size to infer",
        layer_label(layer)
    )]
    GroupSizeNotInferable {
        /// The layer's prefix.
        layer: String,
    },

    /// A layer the `weights` crate refused to unpack, pack or transcode.
    #[error("layer {}", layer_label(layer))]
    Layer {
        /// The layer's prefix.
        layer: String,
        /// Why.
        #[source]
        source: Box<TranscodeError>,
    },

    /// A bitsandbytes 4-bit layer of a type other than nf4.
    #[error(
        "layer {}: a bitsandbytes {quant_type:?} 4-bit layer; this tool reads only nf4, so it \
         refuses the layer rather than copy or label it as something it has not checked",
        layer_label(layer)
    )]
    UnsupportedQuantType {
        /// The layer's prefix.
        layer: String,
        /// The quant type its state names.
        quant_type: String,
    },

    /// A bitsandbytes quant state that is not the JSON bitsandbytes writes.
    #[error(
        "layer {}: quant state {tensor:?} is unusable: not bitsandbytes' quant-state JSON",
        layer_label(layer)
    )]
    QuantStateJson {
        /// The layer's prefix.
        layer: String,
        /// The state tensor's full name.
        tensor: String,
        /// What the JSON parser said.
        source: serde_json::Error,
    },

    /// A recorded logical K x N whose element count overflows.
    #[error(
        "layer {}: K x N = {k} x {n} weights does not fit in {} bits",
        layer_label(layer),
        usize::BITS
    )]
    LogicalSizeOverflow {
        /// The layer's prefix.
        layer: String,
        /// K.
        k: usize,
        /// N.
        n: usize,
    },

    /// A bitsandbytes quant state's shape whose element count overflows.
    #[error(
        "layer {}: the element count of shape {shape:?} does not fit in {} bits",
        layer_label(layer),
        usize::BITS
    )]
    ShapeSizeOverflow {
        /// The layer's prefix.
        layer: String,
        /// The shape.
        shape: Vec<usize>,
    },

    /// A checkpoint without quantized layers.
    #[error(
        "{}: no quantized layers found (looked for <layer>.qweight and bitsandbytes NF4 quant \
         states)",
        .0.display()
    )]
    NoLayers(
        /// The file.
        PathBuf,
    ),

    /// A `--from` other than the layout the metadata declares.
    #[error(
        "{}: its metadata says {key} = \"{declared}\", but --from {from} was given; reading one \
         layout or zero-point convention as another shifts or scrambles every weight",
        path.display()
    )]
    DeclaredFormatConflict {
        /// The file.
        path: PathBuf,
        /// The key that declares it (`checkpoint_format` or `format`).
        key: &'static str,
        /// The layout it declares.
        declared: WeightFormat,
        /// `--from`.
        from: WeightFormat,
    },

    /// A `--group-size` other than the metadata's.
    #[error(
        "{}: its metadata says group_size = \"{recorded}\", but --group-size {flag} was given; \
         changing the group size would need requantization",
        path.display()
    )]
    GroupSizeConflict {
        /// The file.
        path: PathBuf,
        /// The metadata's `group_size`.
        recorded: usize,
        /// `--group-size`.
        flag: usize,
    },

    /// A `--bits` other than the metadata's.
    #[error(
        "{}: its metadata says bits = \"{recorded}\", but --bits {flag} was given; the codes \
         cannot be read at another width",
        path.display()
    )]
    BitsFlagConflict {
        /// The file.
        path: PathBuf,
        /// The metadata's `bits`.
        recorded: usize,
        /// `--bits`.
        flag: u32,
    },

    /// A declared width that a GPTQ layer's tensor shapes contradict.
    #[error(
        "layer {}: {declared}, but its tensor shapes are {bits}-bit (qweight has {qweight_rows} \
         rows for K = {k} g_idx entries: K * {bits} / 32); the codes cannot be read at another \
         width",
        layer_label(layer)
    )]
    BitsShapeConflict {
        /// The layer's prefix.
        layer: String,
        /// The width declared, and by what.
        declared: DeclaredBits,
        /// The width the shapes give.
        bits: u32,
        /// Rows of qweight.
        qweight_rows: usize,
        /// K: entries of g_idx.
        k: usize,
    },

    /// A declared width other than 4 for an AWQ layer.
    #[error(
        "layer {}: {declared}, but AWQ (GEMM) layers hold 4-bit codes only; the codes cannot be \
         read at another width",
        layer_label(layer)
    )]
    AwqBitsConflict {
        /// The layer's prefix.
        layer: String,
        /// The width declared, and by what.
        declared: DeclaredBits,
    },

    /// Metadata that cannot be used.
    #[error(transparent)]
    Metadata(#[from] MetadataError),

    /// A format a command does not take.
    #[error("{format} cannot be {action} by this command; {hint}")]
    UnsupportedFormat {
        /// The format.
        format: WeightFormat,
        /// What was asked ("read", "produced by quantize").
        action: &'static str,
        /// Which command or format to use instead.
        hint: &'static str,
    },

    /// `repack bpw --shape` that is not ROWSxCOLS.
    #[error("shape {shape:?}: expected ROWSxCOLS, e.g. 4096x4096")]
    ShapeArgument {
        /// The argument.
        shape: String,
    },

    /// `repack bpw --shape` with a side that is not a whole number.
    #[error("shape {shape:?}: {side:?} is not a whole number")]
    ShapeArgumentSide {
        /// The argument.
        shape: String,
        /// The side that does not parse.
        side: String,
    },

    /// A code width `bitpack` does not store (`repack bpw --bits`).
    #[error(transparent)]
    Bits(#[from] bitpack::BitsError),

    /// A layout whose cost cannot be counted (`repack bpw`).
    #[error(transparent)]
    Bpw(#[from] BpwError),

    /// A layout refused by the `weights` crate.
    #[error(transparent)]
    Format(#[from] FormatError),
}

/// Results of this crate's functions.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }

    /// Names the input file a problem was found in.
    pub(crate) fn in_file(path: &Path) -> impl FnOnce(Error) -> Error + '_ {
        move |source| Error::InFile {
            path: path.to_path_buf(),
            source: Box::new(source),
        }
    }

    /// Names the layer a problem was found in.
    pub(crate) fn in_layer(layer: &str) -> impl FnOnce(TranscodeError) -> Error + '_ {
        move |source| Error::Layer {
            layer: layer.to_string(),
            source: Box::new(source),
        }
    }
}

/// `err`'s message followed by each of its causes, joined by `: `, as anyhow's `{:#}` prints an
/// error (for reports that carry an error as text, such as `inspect`'s `check: FAILS` lines).
pub fn with_causes(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(next) = cause {
        text.push_str(": ");
        text.push_str(&next.to_string());
        cause = next.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    /// Every variant that wraps a cause leaves it to the chain: its own message does not
    /// contain the cause's, and printed with its causes, each appears once.
    #[test]
    fn no_variant_repeats_its_source() {
        let permutation = MetadataError::BadPermutation {
            key: "proj.input_permutation".into(),
            source: Box::new(FormatError::PermutationLength { found: 1, rows: 2 }),
        };
        let checkpoint = crate::checkpoint::Checkpoint::from_bytes(b"\x02\0\0\0\0\0\0\0{]")
            .expect_err("not JSON");
        let json = serde_json::from_str::<u32>("{").expect_err("not a number");
        let wrappers = [
            Error::from(permutation),
            Error::in_layer("proj")(TranscodeError::UnsupportedTarget(WeightFormat::Nf4)),
            Error::io("missing.safetensors")(std::io::Error::other("gone")),
            Error::Npy {
                path: "x.npy".into(),
                source: NpyError::TooShort { found: 3 },
            },
            Error::in_file(Path::new("x.npy"))(FormatError::ZeroGroupSize.into()),
            Error::SafeTensors {
                path: "c.safetensors".into(),
                source: checkpoint,
            },
            Error::QuantStateJson {
                layer: "proj".into(),
                tensor: "proj.weight.quant_state.bitsandbytes__nf4".into(),
                source: json,
            },
        ];
        for err in &wrappers {
            let own = err.to_string();
            let cause = err.source().expect("a wrapper has a source").to_string();
            assert!(
                !own.contains(&cause),
                "{err:?} repeats {cause:?} in {own:?}"
            );
            assert_eq!(
                with_causes(err),
                format!("{own}: {}", with_causes(err.source().unwrap()))
            );
            assert_eq!(with_causes(err).matches(&cause).count(), 1, "{err:?}");
        }
    }

    /// The safetensors crate's messages name their cause and also return it as their source;
    /// the chain ends at its message, so the cause is printed once.
    #[test]
    fn a_safetensors_error_ends_the_chain() {
        let err = crate::checkpoint::Checkpoint::from_bytes(b"\x02\0\0\0\0\0\0\0{]")
            .expect_err("not JSON");
        let text = with_causes(&err);
        assert!(text.starts_with("invalid JSON in header: "), "{text}");
        assert_eq!(text.matches("at line 1 column").count(), 1, "{text}");
    }
}
