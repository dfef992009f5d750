//! What attention reads in a pass whose cache changes as tokens arrive: the [`KvSource`]
//! interface, and [`OwnKv`], the layer's own keys and values.

use ndarray::{Array2, Array3, ArrayView2};

/// What attention reads at one layer in [`Llama::forward_with_source`]: for query position
/// `query` and key position `position <= query`, the key and value rows (`head_dim` values each)
/// of KV head `head`. Attention asks for every (head, query, position) in order.
///
/// [`Llama::forward_with_source`]: super::Llama::forward_with_source
pub trait KvSource: Sync {
    /// The key row query `query` reads at `position`.
    fn key(&self, head: usize, query: usize, position: usize) -> &[f32];
    /// The value row query `query` reads at `position`.
    fn value(&self, head: usize, query: usize, position: usize) -> &[f32];

    /// Attention over KV head `head` computed by the source itself (a packed cache read in
    /// place, for example), or `None` (the default) to have attention read [`KvSource::key`] and
    /// [`KvSource::value`] rows. `queries` holds the rows of every query head that reads `head`
    /// (rotated, head by head, each head's positions 0..T in order), `visible[r]` the positions
    /// row r attends to (positions 0..visible\[r\], so i + 1 for the row of position i), and
    /// `scale` the softmax scale; the result has one output row per query row. Attention asks
    /// only in a layer whose every query reads from position 0 (not past a sliding window).
    fn attend(
        &self,
        head: usize,
        queries: ArrayView2<'_, f32>,
        visible: &[usize],
        scale: f32,
    ) -> Option<Result<Array2<f32>, String>> {
        let _ = (head, queries, visible, scale);
        None
    }
}

/// The layer's own keys and values, [kv_heads, tokens, head_dim] (standard layout): the source
/// that makes [`Llama::forward_with_source`] [`Llama::forward`].
///
/// [`Llama::forward_with_source`]: super::Llama::forward_with_source
/// [`Llama::forward`]: super::Llama::forward
#[derive(Debug, Clone)]
pub struct OwnKv {
    k: Array3<f32>,
    v: Array3<f32>,
}

impl OwnKv {
    /// Keys and values as attention reads them in a plain pass.
    pub fn new(k: &Array3<f32>, v: &Array3<f32>) -> OwnKv {
        OwnKv {
            k: k.as_standard_layout().into_owned(),
            v: v.as_standard_layout().into_owned(),
        }
    }
}

impl KvSource for OwnKv {
    fn key(&self, head: usize, _query: usize, position: usize) -> &[f32] {
        row_of(&self.k, head, position)
    }
    fn value(&self, head: usize, _query: usize, position: usize) -> &[f32] {
        row_of(&self.v, head, position)
    }
}

/// Row `position` of head `head` of a standard-layout [heads, positions, d] array; empty when
/// out of range (attention then reports the length mismatch).
pub fn row_of(x: &Array3<f32>, head: usize, position: usize) -> &[f32] {
    let (heads, positions, d) = x.dim();
    match x.as_slice() {
        Some(all) if head < heads && position < positions => {
            let start = (head * positions + position) * d;
            &all[start..start + d]
        }
        _ => &[],
    }
}
