//! Greedy generation with a packed cache: `n` tokens after a prompt, each the argmax (lowest id
//! on a tie) of the last position's logits.
//!
//! Each step runs one teacher-forced pass over the prompt and the tokens generated so far with
//! the cache of [`crate::cache`] and takes the last position: under `streaming` that is what a
//! decoder appending one token at a time computes (the cache at step i depends only on tokens
//! 0..=i); under `prefill` the whole cache is quantized again at every step, as a prefill of the
//! longer text would be. The float32 cache's text is [`CausalLm::generate_greedy`].

use models::CausalLm;
use models::llama::argmax;
use ndarray::s;
use serde::Serialize;

use crate::error::QualityError;
use crate::scheme::Cache;

/// `n` greedy tokens after `prompt` with the cache `cache` (a setting or a scheme); `progress`
/// is called with the number of tokens generated so far.
pub fn greedy(
    model: &dyn CausalLm,
    prompt: &[u32],
    n: usize,
    cache: impl Into<Cache>,
    mut progress: impl FnMut(usize),
) -> Result<Vec<u32>, QualityError> {
    let cache = cache.into();
    let layers = model.layers();
    let mut ids = prompt.to_vec();
    for step in 0..n {
        let (hidden, _) = model.hidden_with_layer_source(&ids, &mut |l, kv| {
            Ok(cache.layer((l, layers), model.window(l), kv)?.0)
        })?;
        let logits = model.logits(hidden.slice(s![hidden.nrows() - 1.., ..]));
        let row = logits.row(0);
        ids.push(argmax(row.as_slice().unwrap_or(&[])));
        progress(step + 1);
    }
    Ok(ids.split_off(prompt.len()))
}

/// The greedy texts of both caches.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Generation {
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Generated ids with the float32 cache.
    pub ids_f32: Vec<u32>,
    /// Generated ids with the packed cache.
    pub ids: Vec<u32>,
    /// The first generated position where the two differ, if any.
    pub first_difference: Option<usize>,
}

/// Generates `n` tokens with both caches; `progress` as in [`greedy`] (packed cache only).
pub fn compare(
    model: &dyn CausalLm,
    prompt: &[u32],
    n: usize,
    cache: impl Into<Cache>,
    progress: impl FnMut(usize),
) -> Result<Generation, QualityError> {
    let ids_f32 = model.generate_greedy(prompt, n)?;
    let ids = greedy(model, prompt, n, cache, progress)?;
    Ok(Generation {
        prompt_tokens: prompt.len(),
        first_difference: first_difference(&ids_f32, &ids),
        ids_f32,
        ids,
    })
}

/// The first index where `a` and `b` differ (or where the shorter one ends).
pub fn first_difference(a: &[u32], b: &[u32]) -> Option<usize> {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => Some(i),
        None if a.len() != b.len() => Some(a.len().min(b.len())),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_difference_is_the_first_unequal_token() {
        assert_eq!(first_difference(&[1, 2, 3], &[1, 2, 3]), None);
        assert_eq!(first_difference(&[1, 2, 3], &[1, 5, 3]), Some(1));
        assert_eq!(first_difference(&[1, 2], &[1, 2, 3]), Some(2));
    }
}
