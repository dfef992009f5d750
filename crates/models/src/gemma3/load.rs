//! Gemma 3's weights in f32 and loading them from its GGUF file: hyperparameters from the
//! `gemma3.*` metadata, keys this pass does not implement refused, every tensor's type and
//! shape checked (errors name the tensor), then dequantized ([`weights::gguf::dequantize_tensor`]:
//! Q8_0, Q5_0, Q4_K, Q6_K and F32 in this file).

use ndarray::Array2;

use super::{Gemma3, Gemma3Config};
use crate::files::{ModelFiles, ModelName};
use crate::llama::{ModelError, read_matrix};
use crate::tokenizer::spm::Spm;

/// One block's weights in f32, matrices [out, in].
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma3LayerWeights {
    /// RMSNorm gain before attention `[hidden]`.
    pub attn_norm: Vec<f32>,
    /// Query projection [heads * head_dim, hidden].
    pub q: Array2<f32>,
    /// Key projection [kv_heads * head_dim, hidden].
    pub k: Array2<f32>,
    /// Value projection [kv_heads * head_dim, hidden].
    pub v: Array2<f32>,
    /// QK-norm gain of each query head `[head_dim]`.
    pub q_norm: Vec<f32>,
    /// QK-norm gain of each key head `[head_dim]`.
    pub k_norm: Vec<f32>,
    /// Attention output projection [hidden, heads * head_dim].
    pub o: Array2<f32>,
    /// RMSNorm gain of the attention branch before its residual add `[hidden]`.
    pub post_attention_norm: Vec<f32>,
    /// RMSNorm gain before the FFN `[hidden]`.
    pub ffn_norm: Vec<f32>,
    /// Gate projection [ffn, hidden].
    pub gate: Array2<f32>,
    /// Up projection [ffn, hidden].
    pub up: Array2<f32>,
    /// Down projection [hidden, ffn].
    pub down: Array2<f32>,
    /// RMSNorm gain of the FFN branch before its residual add `[hidden]`.
    pub post_ffw_norm: Vec<f32>,
}

/// All weights of a Gemma 3 model in f32.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma3Weights {
    /// Token embeddings [vocab, hidden], also the LM head (tied).
    pub token_embd: Array2<f32>,
    /// The blocks, in order.
    pub layers: Vec<Gemma3LayerWeights>,
    /// Final RMSNorm gain `[hidden]`.
    pub output_norm: Vec<f32>,
}

impl Gemma3 {
    /// A model from a parsed GGUF file of architecture `gemma3`.
    pub fn from_gguf(gguf: &gguf_file::GgufFile<'_>) -> Result<Gemma3, ModelError> {
        let bad =
            |key: &'static str, problem: String| Err(ModelError::Hyperparameter { key, problem });
        let arch = gguf.get_str("general.architecture")?;
        if arch != "gemma3" {
            return bad(
                "general.architecture",
                format!("is {arch:?}, not \"gemma3\""),
            );
        }
        let count = |key: &str| -> Result<usize, ModelError> {
            Ok(usize::try_from(gguf.get_u32(key)?).unwrap_or(usize::MAX))
        };
        // Keys that would change the computation in ways this pass does not implement.
        for key in [
            "gemma3.rope.freq_base_swa",
            "gemma3.final_logit_softcapping",
            "gemma3.attn_logit_softcapping",
            "gemma3.rope.scaling.type",
            "gemma3.attention.sliding_window_pattern",
        ] {
            if gguf.get(key).is_some() {
                return Err(ModelError::Hyperparameter {
                    key: "gemma3.*",
                    problem: format!("the file sets {key}, which this pass does not implement"),
                });
            }
        }
        let head_dim = count("gemma3.attention.key_length")?;
        if count("gemma3.attention.value_length")? != head_dim {
            return bad(
                "gemma3.attention.value_length",
                "differs from key_length".into(),
            );
        }
        if gguf.get("gemma3.rope.dimension_count").is_some()
            && count("gemma3.rope.dimension_count")? != head_dim
        {
            return bad(
                "gemma3.rope.dimension_count",
                format!("is not head_dim {head_dim}: a partial rotation"),
            );
        }
        let embd = gguf.tensor("token_embd.weight")?;
        let config = Gemma3Config {
            layers: count("gemma3.block_count")?,
            hidden: count("gemma3.embedding_length")?,
            heads: count("gemma3.attention.head_count")?,
            kv_heads: count("gemma3.attention.head_count_kv")?,
            head_dim,
            ffn: count("gemma3.feed_forward_length")?,
            vocab: embd
                .dims
                .get(1)
                .map_or(0, |&d| usize::try_from(d).unwrap_or(usize::MAX)),
            context: count("gemma3.context_length")?,
            rope_base_global: gguf.get_f32("gemma3.rope.freq_base")?,
            rope_base_sliding: 10_000.0,
            sliding_window: count("gemma3.attention.sliding_window")?,
            sliding_pattern: 6,
            rms_eps: gguf.get_f32("gemma3.attention.layer_norm_rms_epsilon")?,
        };
        check(&config)?;
        if gguf.tensor("output.weight").is_ok() {
            return bad(
                "output.weight",
                "an untied LM head; this loader reads tied embeddings only".into(),
            );
        }
        let c = &config;
        let (h, f, q_out, kv_out) = (
            c.hidden,
            c.ffn,
            c.heads * c.head_dim,
            c.kv_heads * c.head_dim,
        );
        let matrix = |name: &str, rows: usize, cols: usize| read_matrix(gguf, name, rows, cols);
        let vector = |name: &str, len: usize| -> Result<Vec<f32>, ModelError> {
            Ok(read_matrix(gguf, name, 1, len)?.into_raw_vec_and_offset().0)
        };
        let layers = (0..c.layers)
            .map(|l| {
                let name = |part: &str| format!("blk.{l}.{part}.weight");
                Ok(Gemma3LayerWeights {
                    attn_norm: vector(&name("attn_norm"), h)?,
                    q: matrix(&name("attn_q"), q_out, h)?,
                    k: matrix(&name("attn_k"), kv_out, h)?,
                    v: matrix(&name("attn_v"), kv_out, h)?,
                    q_norm: vector(&name("attn_q_norm"), c.head_dim)?,
                    k_norm: vector(&name("attn_k_norm"), c.head_dim)?,
                    o: matrix(&name("attn_output"), h, q_out)?,
                    post_attention_norm: vector(&name("post_attention_norm"), h)?,
                    ffn_norm: vector(&name("ffn_norm"), h)?,
                    gate: matrix(&name("ffn_gate"), f, h)?,
                    up: matrix(&name("ffn_up"), f, h)?,
                    down: matrix(&name("ffn_down"), h, f)?,
                    post_ffw_norm: vector(&name("post_ffw_norm"), h)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let weights = Gemma3Weights {
            token_embd: matrix("token_embd.weight", c.vocab, h)?,
            layers,
            output_norm: vector("output_norm.weight", h)?,
        };
        Ok(Gemma3 { config, weights })
    }

    /// The hyperparameters.
    pub fn config(&self) -> &Gemma3Config {
        &self.config
    }

    /// The weights.
    pub fn weights(&self) -> &Gemma3Weights {
        &self.weights
    }
}

/// The relations between hyperparameters the pass needs.
fn check(c: &Gemma3Config) -> Result<(), ModelError> {
    let bad = |key: &'static str, problem: String| Err(ModelError::Hyperparameter { key, problem });
    for (key, value) in [
        ("gemma3.block_count", c.layers),
        ("gemma3.embedding_length", c.hidden),
        ("gemma3.attention.head_count", c.heads),
        ("gemma3.attention.head_count_kv", c.kv_heads),
        ("gemma3.feed_forward_length", c.ffn),
        ("token_embd.weight rows", c.vocab),
        ("gemma3.context_length", c.context),
        ("gemma3.attention.sliding_window", c.sliding_window),
    ] {
        if value == 0 {
            return bad(key, "is 0".into());
        }
    }
    if c.head_dim == 0 || !c.head_dim.is_multiple_of(2) {
        return bad(
            "gemma3.attention.key_length",
            format!("{} is not a positive even number", c.head_dim),
        );
    }
    if !c.heads.is_multiple_of(c.kv_heads) {
        return bad(
            "gemma3.attention.head_count_kv",
            format!("{} does not divide {} heads", c.kv_heads, c.heads),
        );
    }
    if !(c.rope_base_global.is_finite() && c.rope_base_global > 0.0) {
        return bad(
            "gemma3.rope.freq_base",
            format!("{} is not positive", c.rope_base_global),
        );
    }
    if !(c.rms_eps.is_finite() && c.rms_eps >= 0.0) {
        return bad(
            "gemma3.attention.layer_norm_rms_epsilon",
            format!("{} is not a finite eps", c.rms_eps),
        );
    }
    Ok(())
}

/// Gemma 3 from its fetched, hash-checked GGUF file.
pub fn load(files: &ModelFiles) -> Result<Gemma3, ModelError> {
    Ok(load_with_tokenizer(files)?.0)
}

/// Gemma 3 and its tokenizer from one read of the GGUF file.
pub fn load_with_tokenizer(files: &ModelFiles) -> Result<(Gemma3, Spm), ModelError> {
    if files.model != ModelName::Gemma3 {
        return Err(ModelError::NotModel {
            model: files.model,
            expected: ModelName::Gemma3,
        });
    }
    let bytes = gguf_file::read_file(files.weights())?;
    let gguf = gguf_file::GgufFile::parse(&bytes)?;
    let tokenizer = Spm::from_gguf(&gguf)?;
    Ok((Gemma3::from_gguf(&gguf)?, tokenizer))
}
