//! The packed cache of one layer and what attention reads from it, per schedule and policy.
//!
//! Each layer's K and V are [kv_heads, tokens, head_dim]; each KV head's [tokens, head_dim]
//! matrix is one codec tensor (`kvcodec::encode`). A *unit* is the smallest piece the codec
//! quantizes on its own: under `GroupAxis::Token`, the tokens s..e of one group (s = G*floor(j/G),
//! e = s + G for token j and group size G); under `GroupAxis::Feature`, the single token j
//! (s = j, e = j + 1), whose feature groups are complete as soon as it is appended.
//!
//! With n the number of tokens in the cache and W a policy's window, a unit is *complete* when
//! e <= n (always, in the `prefill` and `causal` schedules), and is held as:
//!
//! | policy         | low bits (the setting's)   | 8 bits                      | float32            |
//! |----------------|----------------------------|-----------------------------|--------------------|
//! | `uniform`      | complete                   | -                           | not complete       |
//! | `recent_f32:W` | complete and e + W <= n    | -                           | otherwise          |
//! | `recent8:W`    | e + W <= n                 | complete, e + W > n         | not complete       |
//! | `early8:W`     | complete and s >= W        | complete and s < W (sinks)  | not complete       |
//!
//! So `recent_f32:W` is a float32 residual window of the last W tokens (W to W + G - 1 under the
//! token axis, since a group leaves the window whole), everything older at low bits; `recent8:W`
//! holds that window at 8 bits (a group still filling stays float32); `early8:W` keeps the first
//! W tokens at 8 bits forever and the rest at low bits. W is a multiple of G.
//!
//! Schedules (query position i reads key positions j <= i):
//! - `prefill`: n = tokens for every query: each layer's K/V for the whole text quantized once
//!   (a token-axis group's scale also sees later tokens; a partial group is zero-padded); then
//!   causal attention on the decoded cache. Uniform low bits is the reference's `prefill`.
//! - `streaming`: n = i + 1 for query i, as if tokens were appended one at a time: a unit is
//!   quantized once it is complete and keeps its codes (a full group's codes depend only on its
//!   own tokens, so they are those of the whole-text encoding); until then its tokens stay in the
//!   float32 residual (KIVI's residual window). Under `recent8` a unit leaving the window is
//!   re-quantized to low bits from its 8-bit values (what the cache holds); in `prefill` the low
//!   tier is quantized from float32 once. `tests/streaming.rs` checks this single pass against a
//!   literal token-by-token loop.
//! - `causal` (uniform only): n = i + 1 and every unit complete: before step i the whole cache of
//!   tokens 0..=i is packed and decoded, so the partial group holding i is quantized from tokens
//!   s..=i only (the reference's `causal`).
//!
//! Bytes per token (the end state, n = tokens, the same for every schedule): per layer, per KV
//! head, for K and for V, each run of consecutive positions in one tier is one codec tensor —
//! its codes, f32 scales, zero points (asymmetric) and 8-byte shape, as
//! `PackedTensor::payload_bytes` counts them — and float32 positions cost 4 bytes per value;
//! the sum is divided by the tokens. The float32 cache costs 2 * layers * kv_heads * head_dim * 4.
//!
//! Attention: under `prefill` with `uniform`, K grouped along tokens in groups that are a
//! multiple of 32 and V along features ([`fused_applies`]), attention reads the packed cache in
//! place (`kvcodec::attention`: scores and weighted sums from the codes, online softmax, its
//! own summation order); otherwise it reads the decoded rows above with the model's attention.
//!
//! Sliding layers (Gemma 3's, whose query reads only the last W = 512 positions): once n > W a
//! layer needs no position before n - W, and holds, per side, only the units that contain a
//! position from n - W on (a token-axis group leaves whole, once its last token is out of the
//! window); the tiers of what it holds are those of the table above, by absolute position. What
//! attention reads does not change (the positions dropped are the ones the window hides).

use kvcodec::attention::{self, K_GROUP_MULTIPLE, LANES};
use kvcodec::{GroupAxis, Layout, Mode, PackedTensor, SHAPE_BYTES};
use models::llama::{HookError, KvSource, row_of};
use ndarray::{Array2, Array3, ArrayView2, Axis, s};

use crate::error::QualityError;
pub use crate::setting::MAX_CACHE_TOKENS;
use crate::setting::{KvSetting, Policy, Schedule};

/// Bits per stored K or V value: `bytes_per_token * 32 / float32_bytes_per_token` (32 for the
/// float32 cache).
pub fn bits_per_element(bytes_per_token: f64, float32_bytes_per_token: f64) -> f64 {
    bytes_per_token * 32.0 / float32_bytes_per_token
}

/// One cache configuration: a setting, a policy and a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSpec {
    /// The codec setting (low tier).
    pub setting: KvSetting,
    /// How bytes are spent over positions.
    pub policy: Policy,
    /// When the cache is quantized.
    pub schedule: Schedule,
}

impl CacheSpec {
    /// Checks that the combination exists (`causal` is defined for `uniform` only), that the
    /// codec accepts its layouts, and that its group size and window are at most
    /// [`MAX_CACHE_TOKENS`].
    pub fn new(
        setting: KvSetting,
        policy: Policy,
        schedule: Schedule,
    ) -> Result<CacheSpec, QualityError> {
        if setting.group_size() > MAX_CACHE_TOKENS {
            return Err(QualityError::GroupSize {
                group_size: setting.group_size(),
                max: MAX_CACHE_TOKENS,
            });
        }
        let window = match policy {
            Policy::Uniform => 0,
            Policy::Recent8 { window }
            | Policy::Early8 { window }
            | Policy::RecentF32 { window } => window,
        };
        if window > MAX_CACHE_TOKENS {
            return Err(QualityError::Policy(policy.to_string()));
        }
        if schedule == Schedule::Causal && policy != Policy::Uniform {
            return Err(QualityError::CausalPolicy(policy.to_string()));
        }
        // The 8-bit tier exists in every mode; the setting itself was validated when made.
        setting.with_bits(8)?;
        Ok(CacheSpec {
            setting,
            policy,
            schedule,
        })
    }
}

/// Where a unit of the cache is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The setting's width.
    Low,
    /// 8 bits.
    High,
    /// float32.
    F32,
}

/// The tier of the unit s..e when the cache holds n tokens (the table in the module docs).
pub fn tier(policy: Policy, start: usize, end: usize, n: usize, complete: bool) -> Tier {
    if !complete {
        return Tier::F32;
    }
    match policy {
        Policy::Uniform => Tier::Low,
        Policy::RecentF32 { window } if end + window <= n => Tier::Low,
        Policy::RecentF32 { .. } => Tier::F32,
        Policy::Recent8 { window } if end + window <= n => Tier::Low,
        Policy::Recent8 { .. } => Tier::High,
        Policy::Early8 { window } if start < window => Tier::High,
        Policy::Early8 { .. } => Tier::Low,
    }
}

/// The unit (s, e) holding token j under `axis` with group size `group`.
fn unit(axis: GroupAxis, group: usize, j: usize) -> (usize, usize) {
    match axis {
        GroupAxis::Token => {
            let s = j / group * group;
            (s, s + group)
        }
        GroupAxis::Feature => (j, j + 1),
    }
}

/// One of K or V at one layer: its float32 rows and the decoded tiers.
#[derive(Debug, Clone)]
struct Side {
    axis: GroupAxis,
    raw: Array3<f32>,
    low: Array3<f32>,
    /// Each head's codec tensor of the low tier, when it is quantized from the float32 rows.
    low_packed: Vec<PackedTensor>,
    high: Option<Array3<f32>>,
    /// `causal`, token axis: for query i, the partial group holding i packed from s..=i alone.
    partial: Vec<Array3<f32>>,
}

/// What attention reads at one layer under a [`CacheSpec`]: a [`KvSource`].
#[derive(Debug, Clone)]
pub struct PackedLayer {
    spec: CacheSpec,
    tokens: usize,
    k: Side,
    v: Side,
    /// Per KV head, its packed K and V, where attention reads them in place ([`fused_applies`]).
    fused: Vec<(PackedTensor, PackedTensor)>,
}

/// Whether attention reads a cache of `spec` with heads of `head_dim` straight from its packed
/// codes (`kvcodec::attention`): `prefill` (one packed tensor per head and side), `uniform`
/// (one tier), K along tokens in groups that are a multiple of 32 (V's, of the same size, along
/// features), and a `head_dim` that is a multiple of 8.
pub fn fused_applies(spec: &CacheSpec, head_dim: usize) -> bool {
    let group = spec.setting.group_size();
    spec.schedule == Schedule::Prefill
        && spec.policy == Policy::Uniform
        && spec.setting.axes().k() == GroupAxis::Token
        && spec.setting.axes().v() == GroupAxis::Feature
        && group.is_multiple_of(K_GROUP_MULTIPLE)
        && head_dim.is_multiple_of(LANES)
}

/// Attention over one KV head's packed K and V, read in place (`kvcodec::attention::attend`).
pub(crate) fn attend_packed(
    k: &PackedTensor,
    v: &PackedTensor,
    queries: ArrayView2<'_, f32>,
    visible: &[usize],
    scale: f32,
) -> Result<Array2<f32>, String> {
    attention::attend(queries, visible, k, v, scale).map_err(|e| e.to_string())
}

/// `x` [heads, tokens, d] quantized under `layout` per head and decoded back, with each head's
/// codec tensor.
fn round_trip(
    x: &Array3<f32>,
    layout: Layout,
) -> Result<(Array3<f32>, Vec<PackedTensor>), QualityError> {
    let mut out = Array3::<f32>::zeros(x.dim());
    let mut heads = Vec::with_capacity(x.dim().0);
    for (h, head) in x.axis_iter(Axis(0)).enumerate() {
        let packed = kvcodec::encode(head, layout)?;
        out.index_axis_mut(Axis(0), h)
            .assign(&kvcodec::decode(&packed));
        heads.push(packed);
    }
    Ok((out, heads))
}

impl Side {
    fn new(raw: &Array3<f32>, axis: GroupAxis, spec: &CacheSpec) -> Result<Side, QualityError> {
        let raw = raw.as_standard_layout().into_owned();
        let low_layout = spec.setting.layout(axis);
        let high = match spec.policy {
            Policy::Recent8 { .. } | Policy::Early8 { .. } => {
                Some(round_trip(&raw, spec.setting.with_bits(8)?.layout(axis))?.0)
            }
            Policy::Uniform | Policy::RecentF32 { .. } => None,
        };
        let (low, low_packed) = match (&high, spec.policy, spec.schedule) {
            // Streaming re-quantizes a unit leaving the 8-bit window from its 8-bit values.
            (Some(high), Policy::Recent8 { .. }, Schedule::Streaming) => {
                (round_trip(high, low_layout)?.0, Vec::new())
            }
            _ => round_trip(&raw, low_layout)?,
        };
        let mut partial = Vec::new();
        if spec.schedule == Schedule::Causal && axis == GroupAxis::Token {
            let group = spec.setting.group_size();
            for i in 0..raw.dim().1 {
                let start = i / group * group;
                partial
                    .push(round_trip(&raw.slice(s![.., start..=i, ..]).to_owned(), low_layout)?.0);
            }
        }
        Ok(Side {
            axis,
            raw,
            low,
            low_packed,
            high,
            partial,
        })
    }

    fn row(&self, spec: &CacheSpec, tokens: usize, head: usize, i: usize, j: usize) -> &[f32] {
        let (start, end) = unit(self.axis, spec.setting.group_size(), j);
        let n = match spec.schedule {
            Schedule::Prefill => tokens,
            Schedule::Streaming | Schedule::Causal => i + 1,
        };
        let complete = spec.schedule != Schedule::Streaming || end <= n;
        match tier(spec.policy, start, end, n, complete) {
            Tier::F32 => row_of(&self.raw, head, j),
            Tier::Low if spec.schedule == Schedule::Causal && end > n => self
                .partial
                .get(i)
                .map_or(&[], |p| row_of(p, head, j - start)),
            Tier::Low => row_of(&self.low, head, j),
            Tier::High => self.high.as_ref().map_or(&[], |h| row_of(h, head, j)),
        }
    }
}

impl PackedLayer {
    /// The cache of one layer's K (after RoPE) and V, [kv_heads, tokens, head_dim].
    pub fn new(
        spec: CacheSpec,
        k: &Array3<f32>,
        v: &Array3<f32>,
    ) -> Result<PackedLayer, QualityError> {
        let mut k_side = Side::new(k, spec.setting.axes().k(), &spec)?;
        let mut v_side = Side::new(v, spec.setting.axes().v(), &spec)?;
        // The low tier's tensors are the whole cache where attention reads it in place.
        let (k_packed, v_packed) = (
            std::mem::take(&mut k_side.low_packed),
            std::mem::take(&mut v_side.low_packed),
        );
        let fused = if fused_applies(&spec, k.dim().2) {
            k_packed.into_iter().zip(v_packed).collect()
        } else {
            Vec::new()
        };
        Ok(PackedLayer {
            spec,
            tokens: k.dim().1,
            k: k_side,
            v: v_side,
            fused,
        })
    }

    /// The same as a boxed source for `Llama::forward_with_source`.
    pub fn boxed(
        spec: CacheSpec,
        k: &Array3<f32>,
        v: &Array3<f32>,
    ) -> Result<Box<dyn KvSource>, HookError> {
        Ok(Box::new(PackedLayer::new(spec, k, v)?))
    }
}

impl KvSource for PackedLayer {
    fn key(&self, head: usize, query: usize, position: usize) -> &[f32] {
        self.k.row(&self.spec, self.tokens, head, query, position)
    }
    fn value(&self, head: usize, query: usize, position: usize) -> &[f32] {
        self.v.row(&self.spec, self.tokens, head, query, position)
    }
    fn attend(
        &self,
        head: usize,
        queries: ArrayView2<'_, f32>,
        visible: &[usize],
        scale: f32,
    ) -> Option<Result<Array2<f32>, String>> {
        let (k, v) = self.fused.get(head)?;
        Some(attend_packed(k, v, queries, visible, scale))
    }
}

/// Bytes of one codec tensor of `tokens` x `features` under `layout`, as
/// `PackedTensor::payload_bytes` counts them.
pub fn tensor_bytes(layout: Layout, tokens: usize, features: usize) -> usize {
    let g = layout.geometry(tokens, features);
    let zero_points = match layout.mode {
        Mode::Symmetric => 0,
        Mode::Asymmetric => layout.bits.byte_count(g.scale_count()),
    };
    layout.bits.byte_count(g.code_count()) + 4 * g.scale_count() + zero_points + SHAPE_BYTES
}

/// Bytes of one KV head's K or V of `tokens` x `head_dim` at the end state (module docs), from
/// the unit holding position `first` on (0 unless a sliding layer dropped the positions before).
fn side_bytes(
    spec: &CacheSpec,
    axis: GroupAxis,
    (first, tokens): (usize, usize),
    head_dim: usize,
) -> Result<usize, QualityError> {
    let complete = |end: usize| spec.schedule != Schedule::Streaming || end <= tokens;
    let tier_of = |j: usize| {
        let (start, end) = unit(axis, spec.setting.group_size(), j);
        tier(spec.policy, start, end, tokens, complete(end))
    };
    let mut bytes = 0;
    let mut run_start = unit(axis, spec.setting.group_size(), first).0;
    while run_start < tokens {
        let t = tier_of(run_start);
        let mut run_end = run_start + 1;
        while run_end < tokens && tier_of(run_end) == t {
            run_end += 1;
        }
        let len = run_end - run_start;
        bytes += match t {
            Tier::F32 => len * head_dim * 4,
            Tier::Low => tensor_bytes(spec.setting.layout(axis), len, head_dim),
            Tier::High => tensor_bytes(spec.setting.with_bits(8)?.layout(axis), len, head_dim),
        };
        run_start = run_end;
    }
    Ok(bytes)
}

/// Cache bytes for `tokens` tokens of a model with `layers` layers of `kv_heads` heads of
/// `head_dim`, under `spec` (module docs).
pub fn cache_bytes(
    spec: &CacheSpec,
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    tokens: usize,
) -> Result<usize, QualityError> {
    Ok(layers * held_bytes(spec, kv_heads, head_dim, tokens, None)?)
}

/// One layer's cache bytes for `tokens` tokens when the layer dropped its first `evicted`
/// positions (a sliding-window layer past its window; module docs, "Sliding layers"): each side
/// keeps every unit that holds a position from `evicted` on.
pub fn held_bytes(
    spec: &CacheSpec,
    kv_heads: usize,
    head_dim: usize,
    tokens: usize,
    evicted: Option<usize>,
) -> Result<usize, QualityError> {
    let first = evicted.unwrap_or(0).min(tokens);
    let per_head = side_bytes(spec, spec.setting.axes().k(), (first, tokens), head_dim)?
        + side_bytes(spec, spec.setting.axes().v(), (first, tokens), head_dim)?;
    Ok(kv_heads * per_head)
}

/// The float32 cache's bytes per token with every layer holding every token: 2 * layers *
/// kv_heads * head_dim * 4.
pub fn f32_bytes_per_token(layers: usize, kv_heads: usize, head_dim: usize) -> usize {
    2 * layers * kv_heads * head_dim * 4
}

/// The float32 cache's bytes per token at the end of a text of `tokens` tokens when layer l
/// holds only its last `windows[l]` tokens (a sliding layer, module docs; `None`: every token):
/// sum over layers of min(tokens, window) * 2 * kv_heads * head_dim * 4, over `tokens`. Without
/// a sliding layer this is [`f32_bytes_per_token`].
pub fn f32_held_bytes_per_token(
    windows: &[Option<usize>],
    kv_heads: usize,
    head_dim: usize,
    tokens: usize,
) -> f64 {
    let held: usize = windows
        .iter()
        .map(|w| w.map_or(tokens, |w| w.min(tokens)))
        .sum();
    (held * 2 * kv_heads * head_dim * 4) as f64 / tokens as f64
}

/// Serializes a byte count per token as an integer when it is whole (SmolLM2's 46,080; Gemma
/// 3's at 1,024 tokens), so that evidence written before sliding layers existed is unchanged.
pub fn whole_as_integer<S: serde::Serializer>(x: &f64, serializer: S) -> Result<S::Ok, S::Error> {
    if x.fract() == 0.0 && x.is_finite() && x.abs() < 9.0e15 {
        serializer.serialize_u64(*x as u64)
    } else {
        serializer.serialize_f64(*x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(setting: &str, policy: &str, schedule: Schedule) -> CacheSpec {
        let setting: KvSetting = setting.parse().unwrap();
        CacheSpec::new(setting, Policy::parse(policy, &setting).unwrap(), schedule).unwrap()
    }

    #[test]
    fn counted_bytes_are_the_codecs_payload_bytes() {
        let x = ndarray::Array2::from_shape_fn((37, 64), |(t, f)| (t * 7 + f) as f32 * 0.01);
        for label in ["g32_b4", "g32_b3_asym", "g16_b2_swap"] {
            let setting: KvSetting = label.parse().unwrap();
            for axis in [GroupAxis::Token, GroupAxis::Feature] {
                let layout = setting.layout(axis);
                let packed = kvcodec::encode(x.view(), layout).unwrap();
                assert_eq!(tensor_bytes(layout, 37, 64), packed.payload_bytes());
            }
        }
    }

    #[test]
    fn recent_f32_keeps_a_float32_window_that_drops_whole_groups() {
        // Group 4, window 8, token axis: at n = 13 the groups ending at 4 (4 + 8 <= 13) are low
        // bits; the group 4..8 ends at 8 and 8 + 8 > 13, so it and everything later is float32.
        let policy = Policy::RecentF32 { window: 8 };
        assert_eq!(tier(policy, 0, 4, 13, true), Tier::Low);
        assert_eq!(tier(policy, 4, 8, 13, true), Tier::F32);
        assert_eq!(tier(policy, 4, 8, 16, true), Tier::Low);
        let early = Policy::Early8 { window: 8 };
        assert_eq!(tier(early, 4, 8, 100, true), Tier::High);
        assert_eq!(tier(early, 8, 12, 100, true), Tier::Low);
        assert_eq!(tier(early, 8, 12, 100, false), Tier::F32);
        let recent = Policy::Recent8 { window: 8 };
        assert_eq!(tier(recent, 4, 8, 13, true), Tier::High);
        assert_eq!(tier(recent, 12, 16, 13, false), Tier::F32);
        assert_eq!(tier(recent, 0, 4, 13, true), Tier::Low);
    }

    /// `runner quality --setting g4294967296_b4` aborted on an allocation, and a window near
    /// usize::MAX wrapped `end + window`: both are refused when the spec is made.
    #[test]
    fn group_sizes_and_windows_past_the_context_are_refused() {
        let _ = spec(
            &format!("g{MAX_CACHE_TOKENS}_b4"),
            "uniform",
            Schedule::Causal,
        );
        let big: KvSetting = format!("g{}_b4", 2 * MAX_CACHE_TOKENS).parse().unwrap();
        let err = CacheSpec::new(big, Policy::Uniform, Schedule::Prefill).unwrap_err();
        assert!(
            matches!(err, QualityError::GroupSize { group_size, max: MAX_CACHE_TOKENS }
                if group_size == 2 * MAX_CACHE_TOKENS),
            "{err:?}"
        );
        assert!(err.to_string().contains("context length"), "{err}");
        let g1: KvSetting = "g1_b4".parse().unwrap();
        for label in [
            format!("recent8:{}", usize::MAX),
            format!("early8:{}", MAX_CACHE_TOKENS + 1),
            format!("recent_f32:{}", usize::MAX),
        ] {
            let err = Policy::parse(&label, &g1).unwrap_err();
            assert!(
                matches!(&err, QualityError::Policy(l) if *l == label),
                "{err:?}"
            );
            assert!(err.to_string().contains("at most 8192"), "{err}");
        }
        // A window built without the parser is held to the same bound.
        let window = usize::MAX;
        let err = CacheSpec::new(g1, Policy::Recent8 { window }, Schedule::Prefill).unwrap_err();
        assert!(matches!(err, QualityError::Policy(_)), "{err:?}");
        assert_eq!(
            MAX_CACHE_TOKENS,
            models::ModelName::SmolLm2.shape().max_tokens
        );
    }

    /// A sliding layer past its window keeps, per side, the units holding its last W positions:
    /// 100 tokens and W = 40 drop positions 0..60; K's token-axis groups of 32 keep 32..100 (the
    /// group 32..64 still holds positions 60..64), V's per-token units keep 60..100.
    #[test]
    fn a_sliding_layer_is_billed_for_the_units_its_window_still_holds() {
        let s = spec("g32_b4", "uniform", Schedule::Prefill);
        let (k, v) = (
            s.setting.layout(GroupAxis::Token),
            s.setting.layout(GroupAxis::Feature),
        );
        assert_eq!(
            held_bytes(&s, 1, 64, 100, Some(60)).unwrap(),
            tensor_bytes(k, 68, 64) + tensor_bytes(v, 40, 64)
        );
        assert_eq!(
            held_bytes(&s, 3, 64, 100, None).unwrap(),
            cache_bytes(&s, 1, 3, 64, 100).unwrap()
        );
        // Tiers stay those of absolute positions: with a float32 window of the last 32 tokens,
        // K holds 32..64 at low bits and 64..100 in float32 (the group 64..96 ends at 96 and
        // 96 + 32 > 100); V holds 60..68 at low bits and 68..100 in float32.
        let r = spec("g32_b4", "recent_f32:32", Schedule::Streaming);
        assert_eq!(
            held_bytes(&r, 1, 64, 100, Some(60)).unwrap(),
            tensor_bytes(k, 32, 64) + 36 * 64 * 4 + tensor_bytes(v, 8, 64) + 32 * 64 * 4
        );
    }

    /// Attention over a prefill cache of one tier reads the codes in place, and gives what
    /// attention over the decoded rows gives, in f64, to 1e-5 relative; the other caches leave
    /// attention to the rows.
    #[test]
    fn a_prefill_cache_of_one_tier_is_attended_in_place() {
        let (heads, tokens, d) = (2, 70, 64);
        let fill = |seed: usize| {
            Array3::from_shape_fn((heads, tokens, d), |(h, t, f)| {
                let x = ((h * 131 + t * 31 + f * 7 + seed) % 97) as f32 / 97.0 - 0.5;
                if f == 5 { 6.0 * x } else { x }
            })
        };
        let (k, v) = (fill(1), fill(2));
        let rows = 2 * tokens;
        let queries = Array2::from_shape_fn((rows, d), |(r, f)| {
            ((r * 13 + f * 5) % 11) as f32 / 5.0 - 1.0
        });
        let visible: Vec<usize> = (0..rows).map(|r| r % tokens + 1).collect();
        let scale = 1.0 / (d as f32).sqrt();
        for label in ["g32_b4", "g32_b8_asym", "g64_b2"] {
            let layer =
                PackedLayer::new(spec(label, "uniform", Schedule::Prefill), &k, &v).unwrap();
            for head in 0..heads {
                let fused = layer
                    .attend(head, queries.view(), &visible, scale)
                    .unwrap()
                    .unwrap();
                for (r, &n) in visible.iter().enumerate() {
                    let q = queries.row(r);
                    let scores: Vec<f64> = (0..n)
                        .map(|j| {
                            let key = layer.key(head, n - 1, j);
                            q.iter()
                                .zip(key)
                                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                                .sum::<f64>()
                                * f64::from(scale)
                        })
                        .collect();
                    let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                    let total: f64 = weights.iter().sum();
                    let mut expected = vec![0f64; d];
                    for (j, w) in weights.iter().enumerate() {
                        for (e, &x) in expected.iter_mut().zip(layer.value(head, n - 1, j)) {
                            *e += w / total * f64::from(x);
                        }
                    }
                    let norm = expected.iter().map(|x| x * x).sum::<f64>().sqrt();
                    let err = expected
                        .iter()
                        .zip(fused.row(r))
                        .map(|(e, &x)| (e - f64::from(x)).powi(2))
                        .sum::<f64>()
                        .sqrt();
                    assert!(
                        err <= 1e-5 * norm,
                        "{label} head {head} row {r}: {err} of {norm}"
                    );
                }
            }
        }
        for (label, policy, schedule) in [
            ("g32_b4", "uniform", Schedule::Streaming),
            ("g32_b4", "uniform", Schedule::Causal),
            ("g32_b4", "recent_f32:32", Schedule::Prefill),
            ("g32_b4_swap", "uniform", Schedule::Prefill),
            ("g8_b4", "uniform", Schedule::Prefill),
        ] {
            let layer = PackedLayer::new(spec(label, policy, schedule), &k, &v).unwrap();
            assert!(
                layer.attend(0, queries.view(), &visible, scale).is_none(),
                "{label} {policy} {schedule}"
            );
        }
    }

    #[test]
    fn causal_is_refused_with_a_budget_policy() {
        let setting: KvSetting = "g32_b4".parse().unwrap();
        let err = CacheSpec::new(setting, Policy::Early8 { window: 32 }, Schedule::Causal);
        assert!(matches!(err, Err(QualityError::CausalPolicy(_))));
        let _ = spec("g32_b4", "uniform", Schedule::Causal);
    }
}
