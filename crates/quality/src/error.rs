//! Typed errors of the quality measurements.

use thiserror::Error;

/// Why a measurement cannot be made.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum QualityError {
    /// A setting label the codec refuses (its message names the form).
    #[error(transparent)]
    Setting(kvcodec::KvError),
    /// A budget policy label that is not one of the known forms.
    #[error(
        "policy {0:?} is not one of uniform, recent8:W, early8:W, recent_f32:W (W a positive \
         multiple of the group size, at most 8192: SmolLM2's context)"
    )]
    Policy(String),
    /// A group size longer than any text the cache can hold.
    #[error(
        "group size {group_size} is above {max}, SmolLM2's context length: no text the model \
         reads fills a longer group"
    )]
    GroupSize {
        /// The setting's group size.
        group_size: usize,
        /// [`crate::setting::MAX_CACHE_TOKENS`].
        max: usize,
    },
    /// A schedule label that is not one of the known ones.
    #[error("schedule {0:?} is not one of prefill, streaming, causal")]
    Schedule(String),
    /// The `causal` schedule re-packs the whole cache at every step; it is defined for the
    /// uniform policy only.
    #[error("the causal schedule is defined for the uniform policy only, not {0}")]
    CausalPolicy(String),
    /// A scheme name that is not one of `kvschemes`'.
    #[error(transparent)]
    Scheme(#[from] kvschemes::UnknownScheme),
    /// A scheme refused the cache (a head size its blocks do not divide, a non-finite value).
    #[error(transparent)]
    SchemeCache(#[from] kvschemes::SchemeError),
    /// The causal schedule for a scheme with its own residual rule (KIVI, quanto).
    #[error(
        "{scheme} under the causal schedule: the scheme keeps its own full-precision residual \
         and decides itself when to quantize (causal re-packs the whole cache before every \
         step); use prefill or streaming"
    )]
    SchemeSchedule {
        /// The scheme.
        scheme: kvschemes::Scheme,
    },
    /// A cache refused a Gaussian draw, or read back rows of another shape.
    #[error("Gaussian K/V: {0}")]
    Gaussian(String),
    /// A KVQuant calibration could not be fitted.
    #[error(transparent)]
    Calibration(#[from] kvschemes::kvquant::CalibrationError),
    /// The codec refused a layout or a tensor.
    #[error("KV codec: {0}")]
    Codec(#[from] kvcodec::KvError),
    /// The model refused the input or the cache.
    #[error(transparent)]
    Model(#[from] models::llama::ModelError),
    /// An encoder has no next-token distribution.
    #[error("{0} is an encoder: it has no next-token distribution; only smollm2 and gemma3")]
    NotDecoder(models::ModelName),
    /// SmolLM2's tokenizer refused a text or ids.
    #[error("tokenizer: {0}")]
    Bpe(#[from] models::tokenizer::bpe::BpeError),
    /// Gemma 3's tokenizer refused ids.
    #[error("tokenizer: {0}")]
    Spm(#[from] models::tokenizer::spm::SpmError),
    /// A length of no text the model reads.
    #[error("{tokens} tokens: a text of 1 to {context} tokens (the model's context)")]
    Tokens {
        /// Tokens asked for.
        tokens: usize,
        /// The model's context.
        context: usize,
    },
    /// A scheme whose bytes depend on the values (KVQuant's outliers) has no bytes by shape.
    #[error(
        "{0} stores its outliers apart, so its bytes depend on the values: measure it with \
         `runner quality`"
    )]
    ValueDependent(kvschemes::Scheme),
    /// Fewer than two tokens: no next token to predict.
    #[error("{0} tokens: teacher forcing needs at least 2")]
    TooFewTokens(usize),
    /// Two logit matrices of different shapes.
    #[error("logits of shapes {0:?} and {1:?} cannot be compared")]
    Shapes((usize, usize), (usize, usize)),
}
