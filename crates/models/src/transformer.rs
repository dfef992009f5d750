//! One interface over the three models, for callers that take the model from a name (the runner's
//! `kv` command and real-model protocols).

use crate::bert::MiniLm;
use crate::capture::Capture;
use crate::files::{FilesError, ModelFiles, ModelName};
use crate::gemma3::Gemma3;
use crate::llama::Llama;
use crate::tokenizer::bpe::Bpe;
use crate::tokenizer::spm::Spm;

/// The sizes of a model that a protocol is checked against before anything is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelShape {
    /// Transformer layers.
    pub layers: usize,
    /// Query heads per layer.
    pub query_heads: usize,
    /// KV heads per layer (query head h reads KV head h / (query_heads / kv_heads)).
    pub kv_heads: usize,
    /// Features per head.
    pub head_dim: usize,
    /// Whether attention is causal (a decoder): position p sees tokens 0..=p only.
    pub causal: bool,
    /// Most tokens one pass takes.
    pub max_tokens: usize,
    /// (window, every): each layer but every `every`-th reads only the last `window`
    /// positions (Gemma 3: 512 and 6, `gemma3::Gemma3Config`); `None`: every layer is global.
    pub sliding: Option<(usize, usize)>,
}

impl ModelShape {
    /// The positions layer `layer`'s query reads when the layer slides.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.sliding
            .filter(|&(_, every)| layer % every != every - 1)
            .map(|(window, _)| window)
    }

    /// Query heads that read one KV head.
    pub fn group(&self) -> usize {
        self.query_heads / self.kv_heads
    }
}

impl ModelName {
    /// The model's sizes (the loaders check the files against them).
    pub fn shape(self) -> ModelShape {
        match self {
            ModelName::MiniLm => ModelShape {
                layers: 6,
                query_heads: 12,
                kv_heads: 12,
                head_dim: 32,
                causal: false,
                max_tokens: 512,
                sliding: None,
            },
            ModelName::SmolLm2 => ModelShape {
                layers: 30,
                query_heads: 9,
                kv_heads: 3,
                head_dim: 64,
                causal: true,
                max_tokens: 8192,
                sliding: None,
            },
            ModelName::Gemma3 => ModelShape {
                layers: 18,
                query_heads: 4,
                kv_heads: 1,
                head_dim: 256,
                causal: true,
                max_tokens: 32768,
                sliding: Some((512, 6)),
            },
        }
    }
}

/// A loaded model: text to ids, ids to a [`Capture`].
pub trait Transformer: Send + Sync {
    /// Which model.
    fn name(&self) -> ModelName;
    /// The text's token ids as the model sees them (special tokens included).
    fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError>;
    /// Exactly `tokens` ids from the start of the text, as the model would see that prefix:
    /// for MiniLM `[CLS]`, the first `tokens - 2` word pieces and `[SEP]`; for SmolLM2 the first
    /// `tokens` ids.
    fn encode_prefix(&self, text: &str, tokens: usize) -> Result<Vec<u32>, ModelError>;
    /// One forward pass.
    fn forward(&self, ids: &[u32]) -> Result<Capture, ModelError>;
    /// One forward pass for its q, k and v: the LM head may be left out ([`Capture::logits`]
    /// `None`), as Gemma 3's is, whose 262,144 rows cost more than its blocks.
    fn forward_kv(&self, ids: &[u32]) -> Result<Capture, ModelError> {
        self.forward(ids)
    }
}

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The files are missing or not the pinned ones.
    #[error(transparent)]
    Files(#[from] FilesError),
    /// A text has fewer tokens than asked for.
    #[error("the text has {available} tokens for {model}, fewer than the {needed} asked for")]
    TextTooShort {
        /// The model.
        model: ModelName,
        /// Tokens the text gives.
        available: usize,
        /// Tokens asked for.
        needed: usize,
    },
    /// MiniLM's loader or forward pass refused.
    #[error("minilm")]
    Bert(#[from] crate::bert::ModelError),
    /// SmolLM2's loader or forward pass refused.
    #[error("smollm2")]
    Llama(#[from] crate::llama::ModelError),
    /// SmolLM2's tokenizer refused the text.
    #[error("smollm2's tokenizer")]
    Bpe(#[from] crate::tokenizer::bpe::BpeError),
    /// Gemma 3's loader or forward pass refused.
    #[error("gemma3")]
    Gemma3(#[source] crate::llama::ModelError),
}

/// Loads the model whose hash-checked files these are.
pub fn load(files: &ModelFiles) -> Result<Box<dyn Transformer>, ModelError> {
    match files.model {
        ModelName::MiniLm => Ok(Box::new(MiniLm::load(files)?)),
        ModelName::SmolLm2 => {
            let (llama, bpe) = crate::llama::load_with_tokenizer(files)?;
            Ok(Box::new(SmolLm2Model { llama, bpe }))
        }
        ModelName::Gemma3 => {
            let (model, spm) =
                crate::gemma3::load_with_tokenizer(files).map_err(ModelError::Gemma3)?;
            Ok(Box::new(Gemma3Model { model, spm }))
        }
    }
}

/// Gemma 3 with its tokenizer (both from the GGUF file).
struct Gemma3Model {
    model: Gemma3,
    spm: Spm,
}

impl Transformer for Gemma3Model {
    fn name(&self) -> ModelName {
        ModelName::Gemma3
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        Ok(self.spm.encode(text))
    }

    fn encode_prefix(&self, text: &str, tokens: usize) -> Result<Vec<u32>, ModelError> {
        // BOS first (the GGUF says add_bos_token = true), then the text's first pieces.
        let mut ids = self.spm.encode(text);
        if ids.len() < tokens {
            return Err(ModelError::TextTooShort {
                model: ModelName::Gemma3,
                available: ids.len(),
                needed: tokens,
            });
        }
        ids.truncate(tokens);
        Ok(ids)
    }

    fn forward(&self, ids: &[u32]) -> Result<Capture, ModelError> {
        self.model.forward(ids).map_err(ModelError::Gemma3)
    }

    fn forward_kv(&self, ids: &[u32]) -> Result<Capture, ModelError> {
        let (hidden, layers) = self
            .model
            .hidden_with(ids, |_, _, _| Ok(()))
            .map_err(ModelError::Gemma3)?;
        Ok(Capture {
            ids: ids.to_vec(),
            layers,
            hidden,
            logits: None,
        })
    }
}

/// SmolLM2 with its tokenizer (both from the GGUF file).
struct SmolLm2Model {
    llama: Llama,
    bpe: Bpe,
}

impl Transformer for SmolLm2Model {
    fn name(&self) -> ModelName {
        ModelName::SmolLm2
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        Ok(self.bpe.encode(text)?)
    }

    fn encode_prefix(&self, text: &str, tokens: usize) -> Result<Vec<u32>, ModelError> {
        // No BOS (the GGUF says add_bos_token = false): the prefix is the first ids.
        let mut ids = self.bpe.encode(text)?;
        if ids.len() < tokens {
            return Err(ModelError::TextTooShort {
                model: ModelName::SmolLm2,
                available: ids.len(),
                needed: tokens,
            });
        }
        ids.truncate(tokens);
        Ok(ids)
    }

    fn forward(&self, ids: &[u32]) -> Result<Capture, ModelError> {
        Ok(self.llama.forward(ids)?)
    }
}

impl Transformer for MiniLm {
    fn name(&self) -> ModelName {
        ModelName::MiniLm
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        Ok(self.tokenizer().encode(text))
    }

    fn encode_prefix(&self, text: &str, tokens: usize) -> Result<Vec<u32>, ModelError> {
        // `[CLS] pieces... [SEP]`: keep [CLS] and the first `tokens - 2` pieces, end on [SEP],
        // as a tokenizer truncating to `tokens` does.
        let mut ids = self.tokenizer().encode(text);
        if ids.len() < tokens || tokens < 2 {
            return Err(ModelError::TextTooShort {
                model: ModelName::MiniLm,
                available: ids.len(),
                needed: tokens,
            });
        }
        let sep = *ids.last().expect("at least [CLS] and [SEP]");
        ids.truncate(tokens - 1);
        ids.push(sep);
        Ok(ids)
    }

    fn forward(&self, ids: &[u32]) -> Result<Capture, ModelError> {
        Ok(MiniLm::forward(self, ids)?)
    }
}
