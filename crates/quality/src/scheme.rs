//! A named scheme of the literature (`kvschemes`: KIVI, llama.cpp's cache types) as the cache a
//! measurement runs on, beside the project's own settings ([`crate::cache`]). [`Cache`] is the
//! one value a measurement or a generation takes: either one.
//!
//! Schedules: `prefill` and `streaming` are `kvschemes::Schedule`'s (every query reads the cache
//! the whole text leaves; or query i reads it as token-by-token decoding leaves it). `causal`
//! (the whole cache re-packed before every step) is this project's rule for its own settings:
//! for llama.cpp's types, whose blocks are per token, it stores what `prefill` stores and is
//! accepted as such; KIVI and quanto keep a residual and re-pack on their own terms, so
//! `causal` is refused for them. The project's codec as a scheme (`kvpack-*`) reads `causal` as
//! `prefill` (use `--setting` for the codec's own causal rule, which re-packs partial groups).
//!
//! Bytes: the sum over layers of what each layer's cache stores at the end of the text
//! (`kvschemes::LayerCache::stored`), counted from the stored blocks, code words, scales and
//! full-precision values.

use kvschemes::{LayerCache, Scheme};
use models::llama::{HookError, KvSource};
use ndarray::Array3;

use crate::cache::{self, CacheSpec, PackedLayer};
use crate::error::QualityError;
use crate::setting::Schedule;

/// A scheme under a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemeSpec {
    scheme: Scheme,
    schedule: Schedule,
}

impl SchemeSpec {
    /// Checks that the scheme has the schedule (module docs).
    pub fn new(scheme: Scheme, schedule: Schedule) -> Result<SchemeSpec, QualityError> {
        if schedule == Schedule::Causal && matches!(scheme, Scheme::Kivi(_) | Scheme::Quanto(_)) {
            return Err(QualityError::SchemeSchedule { scheme });
        }
        Ok(SchemeSpec { scheme, schedule })
    }

    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The schedule.
    pub fn schedule(&self) -> Schedule {
        self.schedule
    }

    fn reading(&self) -> kvschemes::Schedule {
        match self.schedule {
            Schedule::Streaming => kvschemes::Schedule::Streaming,
            // Causal only for per-token schemes, where it is prefill (checked in `new`).
            Schedule::Prefill | Schedule::Causal => kvschemes::Schedule::Prefill,
        }
    }
}

/// One layer's cache under a scheme, as attention reads it.
#[derive(Debug, Clone)]
pub struct SchemeLayer(LayerCache);

impl KvSource for SchemeLayer {
    fn key(&self, head: usize, query: usize, position: usize) -> &[f32] {
        self.0.key(head, query, position)
    }
    fn value(&self, head: usize, query: usize, position: usize) -> &[f32] {
        self.0.value(head, query, position)
    }
}

/// The cache of a measurement: one of the project's settings under a policy and schedule, or a
/// named scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cache {
    /// A codec setting, policy and schedule ([`crate::cache`]).
    Codec(CacheSpec),
    /// A scheme of the literature.
    Scheme(SchemeSpec),
}

impl From<CacheSpec> for Cache {
    fn from(spec: CacheSpec) -> Cache {
        Cache::Codec(spec)
    }
}

impl From<SchemeSpec> for Cache {
    fn from(spec: SchemeSpec) -> Cache {
        Cache::Scheme(spec)
    }
}

impl Cache {
    /// The schedule.
    pub fn schedule(&self) -> Schedule {
        match self {
            Cache::Codec(spec) => spec.schedule,
            Cache::Scheme(spec) => spec.schedule,
        }
    }

    /// Layer `layer` of `layers`: its K (after RoPE) and V as attention reads them, and the
    /// bytes that layer's cache stores at the end of the text (a setting's by
    /// [`cache::cache_bytes`], the same for every layer).
    pub fn layer(
        &self,
        (layer, layers): (usize, usize),
        k: &Array3<f32>,
        v: &Array3<f32>,
    ) -> Result<(Box<dyn KvSource>, usize), HookError> {
        match self {
            Cache::Codec(spec) => {
                let (kv_heads, tokens, head_dim) = k.dim();
                let bytes = cache::cache_bytes(spec, 1, kv_heads, head_dim, tokens)?;
                Ok((Box::new(PackedLayer::new(*spec, k, v)?), bytes))
            }
            Cache::Scheme(spec) => {
                let cache = LayerCache::new(spec.scheme, spec.reading(), (layer, layers), k, v)
                    .map_err(QualityError::from)?;
                let bytes = cache.stored().total();
                Ok((Box::new(SchemeLayer(cache)), bytes))
            }
        }
    }
}
