//! Why a model (SmolLM2 or Gemma 3, which share this type) cannot be loaded or run, and what a
//! K/V hook may fail with.

use thiserror::Error;

use crate::files::{FilesError, ModelName};
use crate::tokenizer::bpe::BpeError;

/// Why a model cannot be loaded or run.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The model's files are missing or not the pinned ones.
    #[error(transparent)]
    Files(#[from] FilesError),
    /// The GGUF container cannot be read, or lacks a key or tensor.
    #[error("GGUF: {0}")]
    Gguf(#[from] gguf_file::Error),
    /// The tokenizer in the file cannot be built.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] BpeError),
    /// `files` is not a Llama model.
    #[error("{0} is not a Llama model")]
    NotLlama(ModelName),
    /// `files` are another model's than the loader's.
    #[error("{model}'s files given to the {expected} loader")]
    NotModel {
        /// The files' model.
        model: ModelName,
        /// The loader's.
        expected: ModelName,
    },
    /// The SentencePiece tokenizer in the file cannot be built.
    #[error("tokenizer: {0}")]
    Spm(#[from] crate::tokenizer::spm::SpmError),
    /// A hyperparameter is missing a required relation or is out of range.
    #[error("hyperparameter {key}: {problem}")]
    Hyperparameter {
        /// The metadata key (or config field).
        key: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// A tensor's dimensions are not what the hyperparameters imply.
    #[error(
        "tensor {tensor} has shape {found:?}, expected {expected:?} (rows x columns, [out, in])"
    )]
    TensorShape {
        /// The tensor.
        tensor: String,
        /// The expected shape.
        expected: Vec<usize>,
        /// Its shape (ggml order reversed: rows first).
        found: Vec<u64>,
    },
    /// A tensor is stored in a type this loader does not dequantize.
    #[error(
        "tensor {tensor} is {ty}; this loader reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, \
         Q4_K, Q5_K and Q6_K"
    )]
    TensorType {
        /// The tensor.
        tensor: String,
        /// Its ggml type.
        ty: String,
    },
    /// A tensor's blocks cannot be dequantized (e.g. a scale that is not finite).
    #[error("tensor {tensor}: {problem}")]
    TensorData {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        problem: String,
    },
    /// A forward pass over no tokens.
    #[error("no tokens to run")]
    EmptyInput,
    /// A token id outside the vocabulary.
    #[error("token {id} at position {position} is not below the vocabulary size {vocabulary}")]
    UnknownToken {
        /// The id.
        id: u32,
        /// Its position in the input.
        position: usize,
        /// The vocabulary size.
        vocabulary: usize,
    },
    /// More tokens than the model's context length.
    #[error("{tokens} tokens exceed the context length {context}")]
    TooManyTokens {
        /// The number of tokens.
        tokens: usize,
        /// The context length.
        context: usize,
    },
    /// A K/V hook failed or changed the shape of what it was given.
    #[error("the K/V hook at layer {layer}: {problem}")]
    Hook {
        /// The layer.
        layer: usize,
        /// What went wrong.
        problem: String,
    },
}

/// What a K/V hook may fail with.
pub type HookError = Box<dyn std::error::Error + Send + Sync>;
