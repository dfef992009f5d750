//! A decoder the quality measurements run (SmolLM2 or Gemma 3) with its tokenizer, both from the
//! model's GGUF file.

use models::gemma3::{self, Gemma3};
use models::llama::{self, Llama};
use models::tokenizer::bpe::Bpe;
use models::tokenizer::spm::Spm;
use models::{CausalLm, ModelFiles, ModelName};

use crate::error::QualityError;

/// A decoder and its tokenizer.
pub enum Decoder {
    /// SmolLM2-135M and its byte-level BPE (no BOS).
    SmolLm2(Box<(Llama, Bpe)>),
    /// Gemma 3 270M and its SentencePiece (BOS first, as the GGUF asks).
    Gemma3(Box<(Gemma3, Spm)>),
}

impl Decoder {
    /// Loads the decoder whose hash-checked files these are; an encoder is refused.
    pub fn load(files: &ModelFiles) -> Result<Decoder, QualityError> {
        match files.model {
            ModelName::SmolLm2 => Ok(Decoder::SmolLm2(Box::new(llama::load_with_tokenizer(
                files,
            )?))),
            ModelName::Gemma3 => Ok(Decoder::Gemma3(Box::new(gemma3::load_with_tokenizer(
                files,
            )?))),
            other => Err(QualityError::NotDecoder(other)),
        }
    }

    /// The model.
    pub fn model(&self) -> &dyn CausalLm {
        match self {
            Decoder::SmolLm2(loaded) => &loaded.0,
            Decoder::Gemma3(loaded) => &loaded.0,
        }
    }

    /// The text's ids as the model reads it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, QualityError> {
        match self {
            Decoder::SmolLm2(loaded) => Ok(loaded.1.encode(text)?),
            Decoder::Gemma3(loaded) => Ok(loaded.1.encode(text)),
        }
    }

    /// Generated ids as text (invalid UTF-8 replaced).
    pub fn decode(&self, ids: &[u32]) -> Result<String, QualityError> {
        match self {
            Decoder::SmolLm2(loaded) => {
                Ok(String::from_utf8_lossy(&loaded.1.decode(ids)?).into_owned())
            }
            Decoder::Gemma3(loaded) => Ok(loaded.1.decode(ids)?),
        }
    }
}
