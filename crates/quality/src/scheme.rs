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
//!
//! Sliding layers (Gemma 3's, whose query reads only the last W = 512 positions): past W tokens
//! such a layer keeps only its last W, and is billed as the scheme's cache of those W tokens
//! built alone (their rows, RoPE at their own positions). Where a scheme aligns its groups or
//! its residual to position 0 they then align to the window's first position instead: KIVI's
//! keys leave the 128-token residual at multiples of 128 and quanto flushes every 128 tokens,
//! so the two agree when n - W is a multiple of 128 (n = 1,024, 2,048 or 8,192 with W = 512);
//! llama.cpp's per-token blocks agree always. A KVQuant scheme with first tokens in fp16 bills
//! the window's first tokens so (an evicting cache would hold no sink there): at most `first`
//! rows of fp16 instead of codes. What attention reads does not change (the positions dropped
//! are the ones the window hides).

use std::sync::Arc;

use kvcodec::attention::LANES;
use kvschemes::kvquant::{Calibration, KvQuantScheme};
use kvschemes::{LayerCache, Scheme};
use models::CausalLm;
use models::llama::{HookError, KvSource, LayerKv, OwnKv};
use ndarray::{Array2, Array3, ArrayView2, s};

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

/// How a run's cache is built for one layer: its source and the bytes it stores
/// ([`Cache::layer`] in a study).
pub type LayerBuilder = dyn Fn(
        &Cache,
        (usize, usize),
        Option<usize>,
        &LayerKv<'_>,
    ) -> Result<(Box<dyn KvSource>, LayerCost), HookError>
    + Sync;

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
    /// The codec scheme under `prefill` without sinks is read in place, as the codec's own
    /// settings are ([`crate::cache`], "Attention").
    fn attend(
        &self,
        head: usize,
        queries: ArrayView2<'_, f32>,
        visible: &[usize],
        scale: f32,
    ) -> Option<Result<Array2<f32>, String>> {
        let (k, v) = self.0.packed_head(head)?;
        let fits = k.shape()[1].is_multiple_of(LANES);
        fits.then(|| cache::attend_packed(k, v, queries, visible, scale))
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
    /// cache stores at the end of the text. `window` is the positions the layer's query reads
    /// when it slides (Gemma 3's sliding layers: 512; `None` for a global layer): such a layer
    /// holds only its last `window` tokens, and is billed for them (module docs, "Sliding
    /// layers").
    pub fn layer(
        &self,
        (layer, layers): (usize, usize),
        window: Option<usize>,
        kv: &LayerKv<'_>,
    ) -> Result<(Box<dyn KvSource>, LayerCost), HookError> {
        let tokens = kv.k.dim().1;
        // The tokens a sliding layer still holds at the end of the text, when it dropped any.
        let evicted = window.filter(|&w| w < tokens).map(|w| tokens - w);
        match self {
            Cache::Codec(spec) => {
                let (kv_heads, _, head_dim) = kv.k.dim();
                let bytes = cache::held_bytes(spec, kv_heads, head_dim, tokens, evicted)?;
                let cost = LayerCost { bytes, outliers: 0 };
                Ok((Box::new(PackedLayer::new(*spec, kv.k, kv.v)?), cost))
            }
            Cache::Scheme(spec) => {
                let cache = spec.layer_cache((layer, layers), kv, |keys| kv.rope(keys))?;
                let cost = match evicted {
                    None => LayerCost {
                        bytes: cache.stored().total(),
                        outliers: cache.outliers(),
                    },
                    Some(first) => {
                        let held = |x: &Array3<f32>| x.slice(s![.., first.., ..]).to_owned();
                        let (k, v, k_pre_rope) = (held(kv.k), held(kv.v), held(kv.k_pre_rope));
                        let window = kv.positions_from(first, (&k, &v, &k_pre_rope))?;
                        let stored =
                            spec.layer_cache((layer, layers), &window, |keys| window.rope(keys))?;
                        LayerCost {
                            bytes: stored.stored().total(),
                            outliers: stored.outliers(),
                        }
                    }
                };
                Ok((Box::new(SchemeLayer(cache)), cost))
            }
        }
    }
}

impl SchemeSpec {
    /// What the scheme's cache of one layer stores for `tokens` tokens of `kv_heads` heads of
    /// `head_dim`, without a model: the cache built on patterned values, since what every
    /// scheme but KVQuant stores (blocks, groups, scales, residual) depends on the shape alone
    /// (`crate::cost`'s test holds it to random values). KVQuant's outliers depend on the
    /// values: refused.
    pub fn shape_bytes(
        &self,
        (layer, layers): (usize, usize),
        (kv_heads, tokens, head_dim): (usize, usize, usize),
    ) -> Result<usize, QualityError> {
        if self.kvquant().is_some() {
            return Err(QualityError::ValueDependent(self.scheme));
        }
        let pattern = Array3::from_shape_fn((kv_heads, tokens, head_dim), |(h, t, c)| {
            ((h * 7919 + t * 31 + c) as f32 * 0.37).sin()
        });
        let cache = LayerCache::new(
            self.scheme,
            self.reading(),
            (layer, layers),
            &pattern,
            &pattern,
        )?;
        Ok(cache.stored().total())
    }

    /// The scheme's cache of one layer; `rope` rotates what a KVQuant cache reads back.
    fn layer_cache(
        &self,
        (layer, layers): (usize, usize),
        kv: &LayerKv<'_>,
        rope: impl FnOnce(&mut Array3<f32>) -> Result<(), HookError>,
    ) -> Result<LayerCache, QualityError> {
        let Some(kvquant) = self.kvquant() else {
            return Ok(LayerCache::new(
                self.scheme,
                self.reading(),
                (layer, layers),
                kv.k,
                kv.v,
            )?);
        };
        let Some(calibration) = &self.calibration else {
            return Err(kvschemes::SchemeError::NeedsCalibration {
                scheme: self.scheme,
            }
            .into());
        };
        Ok(LayerCache::kvquant(
            kvquant,
            calibration,
            self.reading(),
            (layer, layers),
            (kv.k_pre_rope, kv.v),
            rope,
        )?)
    }
}

/// Fits each KVQuant scheme's calibration on `ids` (the calibration text): one float32 pass
/// keeps every layer's keys before RoPE and values, and `kvschemes::kvquant::Calibration::fit`
/// fits the thresholds and level tables; one calibration per distinct scheme, in order.
pub fn calibrate(
    model: &dyn CausalLm,
    ids: &[u32],
    schemes: &[KvQuantScheme],
) -> Result<Vec<(KvQuantScheme, Arc<Calibration>)>, QualityError> {
    let mut layers = Vec::with_capacity(model.layers());
    model.hidden_with_layer_source(ids, &mut |_, kv| {
        layers.push((kv.k_pre_rope.clone(), kv.v.clone()));
        Ok(Box::new(OwnKv::new(kv.k, kv.v)))
    })?;
    fit_calibrations(schemes, &layers)
}

/// The KVQuant schemes of `specs`, in order (repeats kept).
pub fn kvquant_schemes(specs: &[Cache]) -> Vec<KvQuantScheme> {
    specs
        .iter()
        .filter_map(|c| match c {
            Cache::Scheme(s) => s.kvquant(),
            Cache::Codec(_) => None,
        })
        .collect()
}

/// One calibration per distinct scheme of `schemes`, in order, fitted on each layer's keys
/// before RoPE and values.
pub fn fit_calibrations(
    schemes: &[KvQuantScheme],
    layers: &[(Array3<f32>, Array3<f32>)],
) -> Result<Vec<(KvQuantScheme, Arc<Calibration>)>, QualityError> {
    let mut fitted: Vec<(KvQuantScheme, Arc<Calibration>)> = Vec::new();
    for &scheme in schemes {
        if fitted.iter().all(|(s, _)| *s != scheme) {
            let calibration = Calibration::fit(scheme.bits, scheme.first, layers)?;
            fitted.push((scheme, Arc::new(calibration)));
        }
    }
    Ok(fitted)
}

/// `specs` with each KVQuant run reading its scheme's calibration from `calibrations`.
pub fn with_calibrations(
    specs: &[Cache],
    calibrations: &[(KvQuantScheme, Arc<Calibration>)],
) -> Result<Vec<Cache>, QualityError> {
    specs
        .iter()
        .map(|spec| match spec {
            Cache::Scheme(s) => match s
                .kvquant()
                .and_then(|k| calibrations.iter().find(|(c, _)| *c == k))
            {
                Some((_, c)) => Ok(Cache::Scheme(s.clone().with_calibration(c.clone())?)),
                None => Ok(spec.clone()),
            },
            Cache::Codec(_) => Ok(spec.clone()),
        })
        .collect()
}
