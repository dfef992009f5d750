//! Typed errors for checkpoint IO and the commands. Each names the file or layer it is about;
//! format-level problems keep the codec's own message.

use std::path::PathBuf;

use thiserror::Error;
use weights::transcode::TranscodeError;
use weights::{FormatError, WeightFormat};

use crate::checkpoint::CheckpointError;
use crate::layer_io::DeclaredBits;
use crate::npy::NpyError;

#[derive(Debug, Error)]
pub enum Error {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("{}: not a readable safetensors file: {source}", path.display())]
    SafeTensors {
        path: PathBuf,
        source: CheckpointError,
    },

    #[error("{}: could not lay out a safetensors file: {source}", path.display())]
    Serialize {
        path: PathBuf,
        source: safetensors::SafeTensorError,
    },

    #[error("{}: not a float32 matrix in .npy format: {source}", path.display())]
    Npy { path: PathBuf, source: NpyError },

    #[error(
        "{}: not a regular file; inputs are read whole, and only a regular file's size is known \
         before reading it",
        path.display()
    )]
    NotARegularFile { path: PathBuf },

    #[error("{}: {bytes} bytes cannot be held in memory", path.display())]
    InputTooLarge { path: PathBuf, bytes: u64 },

    #[error("{}: the file is empty; {what} (nothing was written)", path.display())]
    EmptyInput { path: PathBuf, what: String },

    #[error("{}: {source}", path.display())]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<Error>,
    },

    #[error("{} already exists; refusing to overwrite it (nothing was written)", .0.display())]
    OutputExists(PathBuf),

    #[error("tensor {tensor:?} is {found} with shape {shape:?}; {expected}")]
    TensorType {
        tensor: String,
        found: String,
        shape: Vec<usize>,
        expected: String,
    },

    #[error("tensor {tensor:?} is {dtype} with shape {shape:?}, but holds {found} bytes of data")]
    TensorData {
        tensor: String,
        dtype: String,
        shape: Vec<usize>,
        found: usize,
    },

    #[error(
        "{format} rows of {cols} values with --block-size {block_size}: one row's size in bytes \
         does not fit in {} bits",
        usize::BITS
    )]
    BlockFileOverflow {
        format: WeightFormat,
        cols: usize,
        block_size: usize,
    },

    #[error("layer {}: unknown layout: {why}", label(layer))]
    UnknownLayout { layer: String, why: String },

    #[error("layer {}: {source}", label(layer))]
    Layer {
        layer: String,
        #[source]
        source: Box<TranscodeError>,
    },

    #[error(
        "layer {}: a bitsandbytes {quant_type:?} 4-bit layer; this tool reads only nf4, so it \
         refuses the layer rather than copy or label it as something it has not checked",
        label(layer)
    )]
    UnsupportedQuantType { layer: String, quant_type: String },

    #[error("layer {}: quant state {tensor:?} is unusable: {why}", label(layer))]
    QuantState {
        layer: String,
        tensor: String,
        why: String,
    },

    #[error("layer {}: {what} does not fit in {} bits", label(layer), usize::BITS)]
    SizeOverflow { layer: String, what: String },

    #[error("{}: no quantized layers found (looked for <layer>.qweight and bitsandbytes NF4 quant states)", .0.display())]
    NoLayers(PathBuf),

    #[error(
        "{}: its metadata says {key} = {file:?}, but {flag} was given; {why}",
        path.display()
    )]
    MetadataConflict {
        path: PathBuf,
        key: String,
        file: String,
        flag: String,
        why: &'static str,
    },

    #[error(
        "layer {}: {declared}, but {found}; the codes cannot be read at another width",
        label(layer)
    )]
    BitsConflict {
        layer: String,
        declared: DeclaredBits,
        found: String,
    },

    #[error("metadata {key:?} = {value:?} is not {expected}")]
    BadMetadata {
        key: String,
        value: String,
        expected: &'static str,
    },

    #[error("metadata {key:?} cannot be used: {source}")]
    BadPermutation {
        key: String,
        #[source]
        source: Box<FormatError>,
    },

    #[error("{format} cannot be {action} by this command; {hint}")]
    UnsupportedFormat {
        format: WeightFormat,
        action: &'static str,
        hint: &'static str,
    },

    #[error(transparent)]
    Format(#[from] FormatError),
}

pub type Result<T> = std::result::Result<T, Error>;

/// A layer as messages name it: its quoted prefix, or `(unprefixed)` for a file's only layer.
fn label(prefix: &str) -> String {
    if prefix.is_empty() {
        "(unprefixed)".to_string()
    } else {
        format!("{prefix:?}")
    }
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }

    /// Names the input file a problem was found in.
    pub(crate) fn in_file(path: &std::path::Path) -> impl FnOnce(Error) -> Error + '_ {
        move |source| Error::InFile {
            path: path.to_path_buf(),
            source: Box::new(source),
        }
    }

    pub(crate) fn in_layer(layer: &str) -> impl FnOnce(TranscodeError) -> Error + '_ {
        move |source| Error::Layer {
            layer: layer.to_string(),
            source: Box::new(source),
        }
    }
}
