//! The audit's own packed cache: what attention reads at one layer under a run's setting, policy
//! and schedule, written again from the format's rule (the quality crate's `cache.rs`) with the
//! audit's own quantization rule ([`crate::packed_kv::rules`]), and plugged into the model's KV
//! hook ([`models::llama::KvSource`]) to re-run a model-quality pass.
//!
//! Each layer's K and V are [kv_heads, tokens, head_dim]; each head's [tokens, head_dim] matrix
//! is quantized on its own, in groups of G along the side's axis (K along tokens and V along
//! features, or swapped): a group's scale and offset come from its values (a partial last group
//! simply has fewer), each value becomes its code, and attention reads
//! `(code - offset) as f32 * scale`, one f32 product, as the codec decodes.
//!
//! Query position i reads key position j <= i from the tier of j's unit ([`super::bytes::tier`],
//! with n = T under `prefill` and n = i + 1 otherwise):
//! - float32: the layer's own row;
//! - low bits: the row of the whole head quantized at the setting's width, except that
//!   - under `causal` along tokens, the group still filling (e > i + 1) is quantized from tokens
//!     s..=i alone, as re-packing the cache before step i does;
//!   - under `streaming` with `recent8`, the low tier is quantized from the 8-bit values (a unit
//!     leaves the 8-bit window as what the cache held);
//! - 8 bits: the row of the whole head quantized at 8 bits.
//!
//! Under `prefill` with `uniform`, K along tokens in groups that are a multiple of 32 and a head
//! dimension that is a multiple of 8 ([`reads_in_place`]), attention reads the codes in place
//! instead ([`super::packed_attention`]).

use models::llama::{HookError, KvSource, LayerKv};
use ndarray::{Array2, Array3, ArrayView2};

use super::bytes::{Tier, axes, tier};
use super::packed_attention::{Coded, K_GROUP_MULTIPLE, attend_coded, coded_heads};
use super::protocol::{CodecRun, Run, RunCache, Schedule, Window};
use super::schemes::{self, AuditScheme, ReadSchedule, kvquant};
use crate::packed_kv::decoder::GroupAxis;
use crate::packed_kv::rules;

/// `x` [heads, tokens, d] (standard layout, flat) quantized per head in groups of `group` along
/// `axis` at `bits`, and read back.
fn round_trip(
    x: &[f32],
    (heads, tokens, d): (usize, usize, usize),
    run: &CodecRun,
    bits: u32,
    axis: GroupAxis,
) -> Vec<f32> {
    let mode = run.setting.mode;
    let group = run.setting.group_size;
    let mut out = vec![0f32; x.len()];
    // One group: the flat indices of its elements.
    let mut quantize = |indices: &mut dyn Iterator<Item = usize>| {
        let indices: Vec<usize> = indices.collect();
        let (mut lo, mut hi) = (0f32, 0f32);
        for &i in &indices {
            lo = lo.min(x[i]);
            hi = hi.max(x[i]);
        }
        let rule = rules::group_rule(mode, bits, lo, hi);
        for &i in &indices {
            let code = rules::code(mode, bits, x[i], rule.scale, rule.offset);
            out[i] = (i32::from(code) - i32::from(rule.offset)) as f32 * rule.scale;
        }
    };
    for h in 0..heads {
        let at = |t: usize, f: usize| (h * tokens + t) * d + f;
        match axis {
            GroupAxis::Token => {
                for f in 0..d {
                    for s in (0..tokens).step_by(group.max(1)) {
                        let e = s.saturating_add(group).min(tokens);
                        quantize(&mut (s..e).map(|t| at(t, f)));
                    }
                }
            }
            GroupAxis::Feature => {
                for t in 0..tokens {
                    for s in (0..d).step_by(group.max(1)) {
                        let e = s.saturating_add(group).min(d);
                        quantize(&mut (s..e).map(|f| at(t, f)));
                    }
                }
            }
        }
    }
    out
}

/// K or V of one layer, with every tier it may read.
struct Side {
    axis: GroupAxis,
    dims: (usize, usize, usize),
    raw: Vec<f32>,
    low: Vec<f32>,
    high: Option<Vec<f32>>,
    /// `causal` along tokens: per query i, the group holding i quantized from its tokens s..=i,
    /// [heads, i - s + 1, d].
    partial: Vec<Vec<f32>>,
}

impl Side {
    fn new(x: &Array3<f32>, axis: GroupAxis, run: &CodecRun) -> Side {
        let dims = x.dim();
        let raw: Vec<f32> = x.iter().copied().collect();
        let high = matches!(run.policy, Window::Recent8(_) | Window::Early8(_))
            .then(|| round_trip(&raw, dims, run, 8, axis));
        let bits = run.setting.bits;
        let low = match (&high, run.policy, run.schedule) {
            (Some(high), Window::Recent8(_), Schedule::Streaming) => {
                round_trip(high, dims, run, bits, axis)
            }
            _ => round_trip(&raw, dims, run, bits, axis),
        };
        let (heads, tokens, d) = dims;
        let group = run.setting.group_size.max(1);
        let mut partial = Vec::new();
        if run.schedule == Schedule::Causal && axis == GroupAxis::Token {
            for i in 0..tokens {
                let s = i / group * group;
                let len = i - s + 1;
                let mut part = Vec::with_capacity(heads * len * d);
                for h in 0..heads {
                    part.extend_from_slice(&raw[(h * tokens + s) * d..(h * tokens + i + 1) * d]);
                }
                partial.push(round_trip(&part, (heads, len, d), run, bits, axis));
            }
        }
        Side {
            axis,
            dims,
            raw,
            low,
            high,
            partial,
        }
    }

    fn row(&self, run: &CodecRun, head: usize, i: usize, j: usize) -> &[f32] {
        let (_, tokens, d) = self.dims;
        let n = match run.schedule {
            Schedule::Prefill => tokens,
            Schedule::Streaming | Schedule::Causal => i + 1,
        };
        fn at(all: &[f32], head: usize, rows: usize, r: usize, d: usize) -> &[f32] {
            let start = (head * rows + r) * d;
            all.get(start..start + d).unwrap_or(&[])
        }
        match tier(run, self.axis, j, n) {
            Tier::F32 => at(&self.raw, head, tokens, j, d),
            Tier::Low if run.schedule == Schedule::Causal && self.axis == GroupAxis::Token => {
                let group = run.setting.group_size.max(1);
                let s = j / group * group;
                if s.saturating_add(group) > n {
                    let part = self.partial.get(i).map_or(&[][..], Vec::as_slice);
                    at(part, head, i - s + 1, j - s, d)
                } else {
                    at(&self.low, head, tokens, j, d)
                }
            }
            Tier::Low => at(&self.low, head, tokens, j, d),
            Tier::High => self
                .high
                .as_deref()
                .map_or(&[], |h| at(h, head, tokens, j, d)),
        }
    }
}

/// What attention reads at one layer under a run (module docs).
pub struct AuditCache {
    run: CodecRun,
    k: Side,
    v: Side,
    /// Per KV head, K and V as attention reads them in place ([`reads_in_place`]); empty
    /// otherwise.
    coded: Vec<(Coded, Coded)>,
}

/// Whether attention reads a run's cache in place (module docs): `prefill`, `uniform`, K along
/// tokens in groups that are a multiple of 32, and `head_dim` a multiple of 8.
pub fn reads_in_place(run: &CodecRun, head_dim: usize) -> bool {
    run.schedule == Schedule::Prefill
        && run.policy == Window::Uniform
        && axes(run).0 == GroupAxis::Token
        && run.setting.group_size.is_multiple_of(K_GROUP_MULTIPLE)
        && head_dim.is_multiple_of(8)
}

impl AuditCache {
    /// The cache of one layer's K (after RoPE) and V, [kv_heads, tokens, head_dim].
    pub fn new(run: &CodecRun, k: &Array3<f32>, v: &Array3<f32>) -> Result<AuditCache, String> {
        let (k_axis, v_axis) = axes(run);
        let (k, v) = (Side::new(k, k_axis, run), Side::new(v, v_axis, run));
        let coded = if reads_in_place(run, k.dims.2) {
            let s = &run.setting;
            coded_heads(
                (&k.raw, &v.raw),
                k.dims,
                s.mode,
                (s.bits, s.bits),
                s.group_size,
            )?
        } else {
            Vec::new()
        };
        Ok(AuditCache {
            run: *run,
            k,
            v,
            coded,
        })
    }

    /// The same as a boxed source for `Llama::forward_with_source`.
    pub fn boxed(
        run: &CodecRun,
        k: &Array3<f32>,
        v: &Array3<f32>,
    ) -> Result<Box<dyn KvSource>, HookError> {
        Ok(Box::new(AuditCache::new(run, k, v)?))
    }
}

/// Layer `layer` of `layers` under `run`: the audit's codec cache, or its own implementation of
/// the run's scheme ([`super::schemes`]; `causal` reads as `prefill` there, the protocol
/// accepting it only for per-token schemes).
pub fn source(
    run: &Run,
    (layer, layers): (usize, usize),
    k: &Array3<f32>,
    v: &Array3<f32>,
) -> Result<Box<dyn KvSource>, HookError> {
    match &run.cache {
        RunCache::Codec(codec) => AuditCache::boxed(codec, k, v),
        RunCache::Scheme(name) => {
            let scheme = AuditScheme::parse(name)?;
            let reading = match run.schedule {
                Schedule::Streaming => ReadSchedule::Streaming,
                Schedule::Prefill | Schedule::Causal => ReadSchedule::Prefill,
            };
            Ok(schemes::layer(&scheme, reading, (layer, layers), k, v)?)
        }
    }
}

/// Layer `layer` of `layers` under `run`, from the pass's [`LayerKv`]: [`source`]'s cache, or
/// for a KVQuant run the audit's KVQuant cache ([`kvquant::layer`], keys quantized before RoPE
/// against `calibration`, the audit's own re-fit, then rotated as the pass rotates its keys);
/// with the outlier values the layer stores (0 for any other cache).
pub fn layer_source(
    run: &Run,
    calibration: Option<&kvquant::Calibration>,
    (layer, layers): (usize, usize),
    kv: &LayerKv<'_>,
) -> Result<(Box<dyn KvSource>, usize), HookError> {
    match run.kvquant() {
        Some(scheme) => {
            let calibration = calibration.ok_or_else(|| {
                format!(
                    "{}: no calibration was re-fitted, so its cache cannot be built",
                    run.label()
                )
            })?;
            let cache = kvquant::layer(
                scheme,
                calibration,
                (layer, layers),
                kv.k_pre_rope,
                kv.v,
                |keys| kv.rope(keys),
            )?;
            let outliers = cache.outliers();
            Ok((Box::new(cache), outliers))
        }
        None => Ok((source(run, (layer, layers), kv.k, kv.v)?, 0)),
    }
}

impl KvSource for AuditCache {
    fn key(&self, head: usize, query: usize, position: usize) -> &[f32] {
        self.k.row(&self.run, head, query, position)
    }
    fn value(&self, head: usize, query: usize, position: usize) -> &[f32] {
        self.v.row(&self.run, head, query, position)
    }
    fn attend(
        &self,
        head: usize,
        queries: ArrayView2<'_, f32>,
        visible: &[usize],
        scale: f32,
    ) -> Option<Result<Array2<f32>, String>> {
        attend_coded(&self.coded, head, queries, visible, scale)
    }
}
