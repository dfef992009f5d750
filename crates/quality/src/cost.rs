//! What a cache stores for a text of T tokens of a decoder, without running the model
//! (`runner bytes`): the bytes a measurement bills ([`crate::cache`] for a setting,
//! [`crate::scheme`] for a scheme), at the end of the text, for the model's shape.
//!
//! Each layer holds every token, or, when it slides (Gemma 3's 15 of 18 layers), the tokens its
//! window still needs, as a measurement bills them; the float32 reference holds the same tokens,
//! so bits per element are bits per value stored. A scheme's bytes come from its cache built on
//! patterned values ([`SchemeSpec::shape_bytes`]); KVQuant, whose outliers depend on the values,
//! is refused.

use models::ModelName;
use serde::Serialize;

use crate::cache;
use crate::error::QualityError;
use crate::scheme::{Cache, SchemeSpec};

/// The bytes a cache stores at the end of a text.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cost {
    /// The model.
    pub model: String,
    /// Tokens in the text.
    pub tokens: usize,
    /// Bytes the cache stores, every layer.
    pub bytes: usize,
    /// `bytes` / tokens.
    pub bytes_per_token: f64,
    /// The float32 cache's bytes per token, holding the same tokens.
    pub f32_bytes_per_token: f64,
    /// bytes_per_token * 32 / f32_bytes_per_token.
    pub bits_per_element: f64,
}

/// The cost of `cache` for `tokens` tokens of `model` (a decoder); refused for an encoder, 0
/// tokens or more than the model's context, and KVQuant.
pub fn cost(model: ModelName, tokens: usize, cache: &Cache) -> Result<Cost, QualityError> {
    let shape = model.shape();
    if !shape.causal {
        return Err(QualityError::NotDecoder(model));
    }
    if !(1..=shape.max_tokens).contains(&tokens) {
        return Err(QualityError::Tokens {
            tokens,
            context: shape.max_tokens,
        });
    }
    let (layers, kv_heads, head_dim) = (shape.layers, shape.kv_heads, shape.head_dim);
    let mut bytes = 0usize;
    for layer in 0..layers {
        let first = shape.window(layer).map_or(0, |w| tokens.saturating_sub(w));
        bytes += match cache {
            Cache::Codec(spec) => cache::held_bytes(spec, kv_heads, head_dim, tokens, Some(first))?,
            Cache::Scheme(spec) => {
                scheme_layer(spec, (layer, layers), (kv_heads, head_dim), tokens - first)?
            }
        };
    }
    let windows: Vec<Option<usize>> = (0..layers).map(|l| shape.window(l)).collect();
    let f32_bytes_per_token = cache::f32_held_bytes_per_token(&windows, kv_heads, head_dim, tokens);
    let bytes_per_token = bytes as f64 / tokens as f64;
    Ok(Cost {
        model: model.to_string(),
        tokens,
        bytes,
        bytes_per_token,
        f32_bytes_per_token,
        bits_per_element: bytes_per_token * 32.0 / f32_bytes_per_token,
    })
}

fn scheme_layer(
    spec: &SchemeSpec,
    at: (usize, usize),
    (kv_heads, head_dim): (usize, usize),
    held: usize,
) -> Result<usize, QualityError> {
    spec.shape_bytes(at, (kv_heads, held, head_dim))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::one_text::parse_cache;

    fn of(scheme: &str, schedule: &str) -> Cache {
        parse_cache("g32_b4", "uniform", schedule, Some(scheme)).unwrap()
    }

    /// llama.cpp's q8_0: 8 blocks of 34 bytes per 256 values; Gemma 3 at 8,192 tokens holds
    /// 3 x 8,192 + 15 x 512 tokens per side; SmolLM2 holds 30 layers x 3 heads x 2 blocks.
    #[test]
    fn llamacpp_q8_0_costs_its_blocks_for_the_tokens_each_layer_holds() {
        let g = cost(ModelName::Gemma3, 8192, &of("llamacpp-q8_0", "prefill")).unwrap();
        assert_eq!(g.bytes, (3 * 8192 + 15 * 512) * 2 * 8 * 34);
        assert_eq!(
            g.f32_bytes_per_token,
            ((3 * 8192 + 15 * 512) * 2 * 256 * 4) as f64 / 8192.0
        );
        assert!((g.bits_per_element - 8.5).abs() < 1e-12);
        let s = cost(ModelName::SmolLm2, 100, &of("llamacpp-q8_0", "prefill")).unwrap();
        assert_eq!(s.bytes, 100 * 30 * 3 * 2 * 2 * 34);
        assert_eq!(s.f32_bytes_per_token, 46_080.0);
    }

    /// What a scheme stores does not depend on the values: the cache built on pseudo-random values
    /// stores what the patterned one does (KIVI's groups and residual, quanto's, llama.cpp's
    /// blocks with and without rotation, the codec as a scheme).
    #[test]
    fn a_schemes_bytes_depend_on_the_shape_alone() {
        use kvschemes::LayerCache;
        // A 64-bit LCG (Knuth's MMIX constants): values spread over [-3, 3) with no pattern
        // the shape shares.
        let mut state = 11u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 40) as f32 / (1u64 << 24) as f32 * 6.0 - 3.0
        };
        for (name, schedule) in [
            ("kivi2", "streaming"),
            ("kivi4", "prefill"),
            ("hf-quanto4", "streaming"),
            ("llamacpp-q4_0+rot", "prefill"),
            ("llamacpp-q5_0", "prefill"),
            ("kvpack-k4v2-asym-sink4", "streaming"),
        ] {
            let Cache::Scheme(spec) = of(name, schedule) else {
                unreachable!()
            };
            let shape = (2, 300, 64);
            let random = ndarray::Array3::from_shape_fn(shape, |_| next());
            let reading = match schedule {
                "streaming" => kvschemes::Schedule::Streaming,
                _ => kvschemes::Schedule::Prefill,
            };
            let cache = LayerCache::new(spec.scheme(), reading, (1, 4), &random, &random).unwrap();
            assert_eq!(
                spec.shape_bytes((1, 4), shape).unwrap(),
                cache.stored().total(),
                "{name}"
            );
        }
    }

    #[test]
    fn kvquant_an_encoder_and_a_length_past_the_context_are_refused() {
        let kvquant = of("kvquant4", "prefill");
        assert!(matches!(
            cost(ModelName::Gemma3, 10, &kvquant),
            Err(QualityError::ValueDependent(_))
        ));
        let q8 = of("llamacpp-q8_0", "prefill");
        assert!(matches!(
            cost(ModelName::MiniLm, 10, &q8),
            Err(QualityError::NotDecoder(_))
        ));
        for tokens in [0, 8193] {
            assert!(matches!(
                cost(ModelName::SmolLm2, tokens, &q8),
                Err(QualityError::Tokens { .. })
            ));
        }
    }
}
