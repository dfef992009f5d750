//! The weights in f32 and loading them: from a GGUF file (every tensor's type and shape
//! checked, then dequantized) or from arrays, with the shapes checked against the config.

use ndarray::Array2;

use super::Llama;
use super::config::LlamaConfig;
use super::error::ModelError;
use crate::files::{ModelFiles, ModelName};
use crate::tokenizer::bpe::Bpe;

/// One block's weights in f32, matrices [out, in].
#[derive(Debug, Clone, PartialEq)]
pub struct LayerWeights {
    /// RMSNorm gain before attention `[hidden]`.
    pub attn_norm: Vec<f32>,
    /// Query projection [heads * head_dim, hidden], rows in GGUF (permuted) order.
    pub q: Array2<f32>,
    /// Key projection [kv_heads * head_dim, hidden], rows in GGUF (permuted) order.
    pub k: Array2<f32>,
    /// Value projection [kv_heads * head_dim, hidden].
    pub v: Array2<f32>,
    /// Attention output projection [hidden, heads * head_dim].
    pub o: Array2<f32>,
    /// RMSNorm gain before the feed-forward layer `[hidden]`.
    pub ffn_norm: Vec<f32>,
    /// SwiGLU gate [ffn, hidden].
    pub gate: Array2<f32>,
    /// SwiGLU up [ffn, hidden].
    pub up: Array2<f32>,
    /// SwiGLU down [hidden, ffn].
    pub down: Array2<f32>,
}

/// All weights of a Llama model in f32.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaWeights {
    /// Token embeddings [vocab, hidden], also the LM head (tied).
    pub token_embd: Array2<f32>,
    /// The blocks, in order.
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm gain `[hidden]`.
    pub output_norm: Vec<f32>,
}

impl Llama {
    /// Loads a fetched, hash-checked Llama model (SmolLM2) from its GGUF file.
    pub fn load(files: &ModelFiles) -> Result<Llama, ModelError> {
        Ok(load_with_tokenizer(files)?.0)
    }

    /// A model from a parsed GGUF file: hyperparameters from the `llama.*` metadata, every
    /// tensor's type and shape checked (errors name the tensor), weights dequantized to f32.
    pub fn from_gguf(gguf: &gguf_file::GgufFile<'_>) -> Result<Llama, ModelError> {
        let arch = gguf.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(ModelError::Hyperparameter {
                key: "general.architecture",
                problem: format!("is {arch:?}, not \"llama\""),
            });
        }
        let count = |key: &str| -> Result<usize, ModelError> {
            Ok(usize::try_from(gguf.get_u32(key)?).unwrap_or(usize::MAX))
        };
        let hidden = count("llama.embedding_length")?;
        let heads = count("llama.attention.head_count")?;
        let embd = gguf.tensor("token_embd.weight")?;
        let config = LlamaConfig {
            layers: count("llama.block_count")?,
            hidden,
            heads,
            kv_heads: count("llama.attention.head_count_kv")?,
            head_dim: hidden.checked_div(heads).unwrap_or(0),
            ffn: count("llama.feed_forward_length")?,
            vocab: embd
                .dims
                .get(1)
                .map_or(0, |&d| usize::try_from(d).unwrap_or(usize::MAX)),
            context: count("llama.context_length")?,
            rope_base: gguf.get_f32("llama.rope.freq_base")?,
            rms_eps: gguf.get_f32("llama.attention.layer_norm_rms_epsilon")?,
        };
        config.check()?;
        // RoPE here rotates every channel of a head; a partial rotation would be another model.
        if gguf.get("llama.rope.dimension_count").is_some() {
            let rotated = count("llama.rope.dimension_count")?;
            if rotated != config.head_dim {
                return Err(ModelError::Hyperparameter {
                    key: "llama.rope.dimension_count",
                    problem: format!("{rotated}, but head_dim is {}", config.head_dim),
                });
            }
        }
        if gguf.get("llama.vocab_size").is_some() {
            let vocab = count("llama.vocab_size")?;
            if vocab != config.vocab {
                return Err(ModelError::Hyperparameter {
                    key: "llama.vocab_size",
                    problem: format!("{vocab}, but token_embd has {} rows", config.vocab),
                });
            }
        }
        // Frequency factors (Llama 3's long-context RoPE) would change every angle.
        if gguf.tensor("rope_freqs.weight").is_ok() {
            return Err(ModelError::Hyperparameter {
                key: "rope_freqs.weight",
                problem: "RoPE frequency factors; this loader implements plain RoPE only".into(),
            });
        }
        if gguf.tensor("output.weight").is_ok() {
            return Err(ModelError::Hyperparameter {
                key: "output.weight",
                problem: "an untied LM head; this loader reads tied embeddings only".into(),
            });
        }
        let (h, f, q_out, kv_out) = (
            config.hidden,
            config.ffn,
            config.heads * config.head_dim,
            config.kv_heads * config.head_dim,
        );
        let matrix = |name: &str, rows: usize, cols: usize| read_matrix(gguf, name, rows, cols);
        let vector = |name: &str| -> Result<Vec<f32>, ModelError> {
            Ok(read_matrix(gguf, name, 1, h)?.into_raw_vec_and_offset().0)
        };
        let layers = (0..config.layers)
            .map(|l| {
                let name = |part: &str| format!("blk.{l}.{part}.weight");
                Ok(LayerWeights {
                    attn_norm: vector(&name("attn_norm"))?,
                    q: matrix(&name("attn_q"), q_out, h)?,
                    k: matrix(&name("attn_k"), kv_out, h)?,
                    v: matrix(&name("attn_v"), kv_out, h)?,
                    o: matrix(&name("attn_output"), h, q_out)?,
                    ffn_norm: vector(&name("ffn_norm"))?,
                    gate: matrix(&name("ffn_gate"), f, h)?,
                    up: matrix(&name("ffn_up"), f, h)?,
                    down: matrix(&name("ffn_down"), h, f)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let weights = LlamaWeights {
            token_embd: matrix("token_embd.weight", config.vocab, h)?,
            layers,
            output_norm: vector("output_norm.weight")?,
        };
        Llama::from_weights(config, weights)
    }

    /// A model from f32 weights (e.g. a tiny model built in a test), checking every shape
    /// against `config`.
    pub fn from_weights(config: LlamaConfig, weights: LlamaWeights) -> Result<Llama, ModelError> {
        config.check()?;
        let (h, f, q_out, kv_out) = (
            config.hidden,
            config.ffn,
            config.heads * config.head_dim,
            config.kv_heads * config.head_dim,
        );
        let shape = |name: String, found: &[usize], expected: &[usize]| {
            if found == expected {
                Ok(())
            } else {
                Err(ModelError::TensorShape {
                    tensor: name,
                    expected: expected.to_vec(),
                    found: found.iter().map(|&d| d as u64).collect(),
                })
            }
        };
        if weights.layers.len() != config.layers {
            return Err(ModelError::Hyperparameter {
                key: "layers",
                problem: format!(
                    "{} layers of weights for {} layers",
                    weights.layers.len(),
                    config.layers
                ),
            });
        }
        shape(
            "token_embd.weight".into(),
            weights.token_embd.shape(),
            &[config.vocab, h],
        )?;
        shape(
            "output_norm.weight".into(),
            &[weights.output_norm.len()],
            &[h],
        )?;
        for (l, w) in weights.layers.iter().enumerate() {
            let name = |part: &str| format!("blk.{l}.{part}.weight");
            shape(name("attn_norm"), &[w.attn_norm.len()], &[h])?;
            shape(name("ffn_norm"), &[w.ffn_norm.len()], &[h])?;
            shape(name("attn_q"), w.q.shape(), &[q_out, h])?;
            shape(name("attn_k"), w.k.shape(), &[kv_out, h])?;
            shape(name("attn_v"), w.v.shape(), &[kv_out, h])?;
            shape(name("attn_output"), w.o.shape(), &[h, q_out])?;
            shape(name("ffn_gate"), w.gate.shape(), &[f, h])?;
            shape(name("ffn_up"), w.up.shape(), &[f, h])?;
            shape(name("ffn_down"), w.down.shape(), &[h, f])?;
        }
        Ok(Llama { config, weights })
    }

    /// The hyperparameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The weights.
    pub fn weights(&self) -> &LlamaWeights {
        &self.weights
    }
}

/// SmolLM2 and its tokenizer from one read of the GGUF file.
pub fn load_with_tokenizer(files: &ModelFiles) -> Result<(Llama, Bpe), ModelError> {
    if files.model != ModelName::SmolLm2 {
        return Err(ModelError::NotLlama(files.model));
    }
    let bytes = gguf_file::read_file(files.weights())?;
    let gguf = gguf_file::GgufFile::parse(&bytes)?;
    let tokenizer = Bpe::from_gguf(&gguf)?;
    Ok((Llama::from_gguf(&gguf)?, tokenizer))
}

/// A GGUF tensor as an f32 matrix [rows, cols] (a 1-D tensor as [1, cols]), after checking its
/// shape (ggml's ne0 is the row length) and type.
pub(crate) fn read_matrix(
    gguf: &gguf_file::GgufFile<'_>,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<Array2<f32>, ModelError> {
    let info = gguf.tensor(name)?;
    let expected: Vec<u64> = if rows == 1 && info.dims.len() == 1 {
        vec![cols as u64]
    } else {
        vec![cols as u64, rows as u64]
    };
    if info.dims != expected {
        return Err(ModelError::TensorShape {
            tensor: name.to_string(),
            expected: if info.dims.len() == 1 {
                vec![cols]
            } else {
                vec![rows, cols]
            },
            found: info.dims.iter().rev().copied().collect(),
        });
    }
    let bytes = gguf.tensor_bytes(info)?;
    let data = |problem: String| ModelError::TensorData {
        tensor: name.to_string(),
        problem,
    };
    // The shape was checked against the hyperparameters and gguf-file checked that the bytes
    // are in the file, so this allocation is bounded by the file's size.
    let mut out = vec![0f32; rows * cols];
    match weights::gguf::dequantize_tensor(info.ty, bytes, &mut out) {
        Ok(_) => {}
        Err(weights::FormatError::UnreadableGgufType { .. }) => {
            return Err(ModelError::TensorType {
                tensor: name.to_string(),
                ty: info.ty.to_string(),
            });
        }
        Err(e) => return Err(data(e.to_string())),
    }
    Ok(Array2::from_shape_vec((rows, cols), out).expect("rows * cols values"))
}
