//! The hyperparameters of a Llama model and the relations between them that a model needs.

use super::error::ModelError;

/// The hyperparameters of a Llama model.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// Number of blocks (`llama.block_count`).
    pub layers: usize,
    /// Width of the residual stream (`llama.embedding_length`).
    pub hidden: usize,
    /// Query heads (`llama.attention.head_count`).
    pub heads: usize,
    /// Key/value heads (`llama.attention.head_count_kv`), dividing `heads`.
    pub kv_heads: usize,
    /// Channels per head: hidden / heads, even (RoPE rotates pairs).
    pub head_dim: usize,
    /// Width of the SwiGLU layer (`llama.feed_forward_length`).
    pub ffn: usize,
    /// Number of tokens (rows of `token_embd`).
    pub vocab: usize,
    /// The longest input (`llama.context_length`).
    pub context: usize,
    /// RoPE base (`llama.rope.freq_base`).
    pub rope_base: f32,
    /// RMSNorm epsilon (`llama.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
}

impl LlamaConfig {
    pub(super) fn check(&self) -> Result<(), ModelError> {
        let bad =
            |key: &'static str, problem: String| Err(ModelError::Hyperparameter { key, problem });
        for (key, value) in [
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("ffn", self.ffn),
            ("vocab", self.vocab),
            ("context", self.context),
        ] {
            if value == 0 {
                return bad(key, "is 0".into());
            }
        }
        if self.heads * self.head_dim != self.hidden {
            return bad(
                "head_dim",
                format!(
                    "{} heads of {} do not make hidden {}",
                    self.heads, self.head_dim, self.hidden
                ),
            );
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(
                "head_dim",
                format!("{} is not a positive even number", self.head_dim),
            );
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(
                "kv_heads",
                format!("{} does not divide {} heads", self.kv_heads, self.heads),
            );
        }
        if !(self.rope_base.is_finite() && self.rope_base > 0.0) {
            return bad("rope_base", format!("{} is not positive", self.rope_base));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps >= 0.0) {
            return bad("rms_eps", format!("{} is not a finite eps", self.rms_eps));
        }
        Ok(())
    }
}
