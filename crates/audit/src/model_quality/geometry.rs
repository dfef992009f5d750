//! The decoder a model-quality protocol names, as far as the checks depend on it: its sizes
//! (the audit's own table, [`crate::common::models`]) and which of its layers slide.
//!
//! Gemma 3's sliding-window layers read only the last 512 positions (GGUF
//! `gemma3.attention.sliding_window`), and every sixth layer (5, 11, 17) is global (llama.cpp
//! `set_swa_pattern(6)`, `src/llama-model.cpp` for `LLM_ARCH_GEMMA3`); SmolLM2 has no sliding
//! layer. A sliding layer past its window needs no position older than it, so the cache-size
//! rules ([`super::bytes`]) bill it for what its window still holds.

use crate::common::models::ModelName;

/// Gemma 3's sliding window, in positions (the query's own included).
pub const GEMMA3_WINDOW: usize = 512;
/// Every this-many-th layer of Gemma 3 is global (layer l is global when l % 6 == 5).
pub const GEMMA3_GLOBAL_EVERY: usize = 6;

/// A decoder's sizes and sliding layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Which model.
    pub model: ModelName,
    /// Layers.
    pub layers: usize,
    /// KV heads per layer.
    pub kv_heads: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Token ids run from 0 to `vocabulary - 1`.
    pub vocabulary: u32,
    /// (window, every): layers slide except each `every`-th; none for SmolLM2.
    sliding: Option<(usize, usize)>,
}

impl Geometry {
    /// The geometry of a decoder; `None` for an encoder, which has no next-token distribution.
    pub fn of(model: ModelName) -> Option<Geometry> {
        let shape = model.shape();
        let sliding = match model {
            ModelName::Gemma3 => Some((GEMMA3_WINDOW, GEMMA3_GLOBAL_EVERY)),
            ModelName::SmolLm2 => None,
            ModelName::MiniLm => return None,
        };
        Some(Geometry {
            model,
            layers: shape.layers,
            kv_heads: shape.kv_heads,
            head_dim: shape.head_dim,
            vocabulary: shape.vocabulary,
            sliding,
        })
    }

    /// The geometry of the decoder a protocol names (`smollm2`, `gemma3`).
    pub fn named(name: &str) -> Option<Geometry> {
        match name {
            "smollm2" => Geometry::of(ModelName::SmolLm2),
            "gemma3" => Geometry::of(ModelName::Gemma3),
            _ => None,
        }
    }

    /// The positions layer `layer`'s query reads when the layer slides.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.sliding
            .filter(|&(_, every)| layer % every != every - 1)
            .map(|(window, _)| window)
    }

    /// The first position layer `layer` still needs after `tokens` tokens: `tokens - window`
    /// for a sliding layer past its window, else 0.
    pub fn first_held(&self, layer: usize, tokens: usize) -> usize {
        self.window(layer)
            .map_or(0, |window| tokens.saturating_sub(window))
    }

    /// A row of one token's K (or V) across the KV heads: kv_heads * head_dim values.
    pub fn width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// The float32 cache's bytes per token at the end of a text of `tokens` tokens: 2 *
    /// kv_heads * head_dim * 4 bytes for each token each layer holds (every token, or a sliding
    /// layer's last `window`), over `tokens`; SmolLM2's 46,080 at any length.
    pub fn float32_bytes_per_token(&self, tokens: usize) -> f64 {
        let held: usize = (0..self.layers)
            .map(|l| tokens - self.first_held(l, tokens))
            .sum();
        (held * 2 * self.width() * 4) as f64 / tokens as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma3_slides_in_all_but_every_sixth_layer_and_smollm2_never() {
        let g = Geometry::named("gemma3").unwrap();
        let global: Vec<usize> = (0..g.layers).filter(|&l| g.window(l).is_none()).collect();
        assert_eq!(global, [5, 11, 17]);
        assert_eq!(g.window(0), Some(512));
        assert_eq!((g.first_held(0, 1024), g.first_held(5, 1024)), (512, 0));
        assert_eq!(g.first_held(0, 300), 0);
        // 3 global layers of 1,024 tokens and 15 of 512, 2,048 bytes each, over 1,024.
        assert_eq!(g.float32_bytes_per_token(1024), 21_504.0);
        assert_eq!(g.float32_bytes_per_token(300), 36_864.0);
        let s = Geometry::named("smollm2").unwrap();
        assert!((0..30).all(|l| s.window(l).is_none()));
        assert_eq!(s.float32_bytes_per_token(5000), 46_080.0);
        assert_eq!(Geometry::named("minilm"), None);
    }
}
