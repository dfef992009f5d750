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
//! KVQuant (`kvquant*`) quantizes keys before RoPE against levels fitted on a calibration text:
//! its spec carries the [`Calibration`] ([`SchemeSpec::with_calibration`], fitted by
//! [`calibrate`]), and its cache reads the layer's keys before RoPE and rotates what it reads
//! back with the model's RoPE. Every token is quantized on arrival, so all three schedules store
//! the same bytes.
//!
//! Bytes: the sum over layers of what each layer's cache stores at the end of the text
//! (`kvschemes::LayerCache::stored`), counted from the stored blocks, code words, scales,
//! outliers, calibration and full-precision values.

use std::sync::Arc;

use kvschemes::kvquant::{Calibration, KvQuantScheme};
use kvschemes::{LayerCache, Scheme};
use models::llama::{HookError, KvSource, LayerKv, Llama, OwnKv};

use crate::cache::{self, CacheSpec, PackedLayer};
use crate::error::QualityError;
use crate::setting::Schedule;

/// A scheme under a schedule (and, for KVQuant, its calibration).
#[derive(Debug, Clone, PartialEq)]
pub struct SchemeSpec {
    scheme: Scheme,
    schedule: Schedule,
    calibration: Option<Arc<Calibration>>,
}

impl SchemeSpec {
    /// Checks that the scheme has the schedule (module docs).
    pub fn new(scheme: Scheme, schedule: Schedule) -> Result<SchemeSpec, QualityError> {
        if schedule == Schedule::Causal && matches!(scheme, Scheme::Kivi(_) | Scheme::Quanto(_)) {
            return Err(QualityError::SchemeSchedule { scheme });
        }
        Ok(SchemeSpec {
            scheme,
            schedule,
            calibration: None,
        })
    }

    /// The KVQuant scheme, when it is one (it needs a calibration).
    pub fn kvquant(&self) -> Option<KvQuantScheme> {
        match self.scheme {
            Scheme::KvQuant(kvquant) => Some(kvquant),
            _ => None,
        }
    }

    /// The spec with the calibration a KVQuant scheme reads; refused for another scheme or a
    /// calibration fitted for other widths or first tokens.
    pub fn with_calibration(
        mut self,
        calibration: Arc<Calibration>,
    ) -> Result<SchemeSpec, QualityError> {
        match self.kvquant() {
            Some(k) if k.bits == calibration.bits && k.first == calibration.first => {
                self.calibration = Some(calibration);
                Ok(self)
            }
            _ => Err(kvschemes::SchemeError::Calibration {
                scheme: self.scheme,
                problem: format!(
                    "a calibration fitted at {} bits with {} first tokens does not fit it",
                    calibration.bits, calibration.first
                ),
            }
            .into()),
        }
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

/// What one layer's cache stores: its bytes at the end of the text, and how many of its values
/// are sparse outliers (KVQuant's, which the data decide; 0 for every other cache).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerCost {
    /// Bytes.
    pub bytes: usize,
    /// Outlier values, K and V together.
    pub outliers: usize,
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
#[derive(Debug, Clone, PartialEq)]
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

    /// Layer `layer` of `layers`: its K and V as attention reads them, and what that layer's
    /// cache stores at the end of the text (a setting's bytes by [`cache::cache_bytes`], the
    /// same for every layer).
    pub fn layer(
        &self,
        (layer, layers): (usize, usize),
        kv: &LayerKv<'_>,
    ) -> Result<(Box<dyn KvSource>, LayerCost), HookError> {
        let (k, v) = (kv.k, kv.v);
        match self {
            Cache::Scheme(spec) if spec.kvquant().is_some() => {
                let (Some(kvquant), Some(calibration)) = (spec.kvquant(), &spec.calibration) else {
                    return Err(
                        QualityError::from(kvschemes::SchemeError::NeedsCalibration {
                            scheme: spec.scheme,
                        })
                        .into(),
                    );
                };
                let cache = LayerCache::kvquant(
                    kvquant,
                    calibration,
                    spec.reading(),
                    (layer, layers),
                    (kv.k_pre_rope, v),
                    |keys| kv.rope(keys),
                )
                .map_err(QualityError::from)?;
                let cost = LayerCost {
                    bytes: cache.stored().total(),
                    outliers: cache.outliers(),
                };
                Ok((Box::new(SchemeLayer(cache)), cost))
            }
            Cache::Codec(spec) => {
                let (kv_heads, tokens, head_dim) = k.dim();
                let bytes = cache::cache_bytes(spec, 1, kv_heads, head_dim, tokens)?;
                let cost = LayerCost { bytes, outliers: 0 };
                Ok((Box::new(PackedLayer::new(*spec, k, v)?), cost))
            }
            Cache::Scheme(spec) => {
                let cache = LayerCache::new(spec.scheme, spec.reading(), (layer, layers), k, v)
                    .map_err(QualityError::from)?;
                let cost = LayerCost {
                    bytes: cache.stored().total(),
                    outliers: 0,
                };
                Ok((Box::new(SchemeLayer(cache)), cost))
            }
        }
    }
}

/// Fits each KVQuant scheme's calibration on `ids` (the calibration text): one float32 pass
/// keeps every layer's keys before RoPE and values, and `kvschemes::kvquant::Calibration::fit`
/// fits the thresholds and level tables; one calibration per distinct scheme, in order.
pub fn calibrate(
    model: &Llama,
    ids: &[u32],
    schemes: &[KvQuantScheme],
) -> Result<Vec<(KvQuantScheme, Arc<Calibration>)>, QualityError> {
    let mut layers = Vec::with_capacity(model.config().layers);
    model.hidden_with_layer_source(ids, |_, kv| {
        layers.push((kv.k_pre_rope.clone(), kv.v.clone()));
        Ok(Box::new(OwnKv::new(kv.k, kv.v)))
    })?;
    let mut fitted: Vec<(KvQuantScheme, Arc<Calibration>)> = Vec::new();
    for &scheme in schemes {
        if fitted.iter().all(|(s, _)| *s != scheme) {
            let calibration = Calibration::fit(scheme.bits, scheme.first, &layers)?;
            fitted.push((scheme, Arc::new(calibration)));
        }
    }
    Ok(fitted)
}
