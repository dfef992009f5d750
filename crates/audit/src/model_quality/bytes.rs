//! Bytes per token of a packed cache at its end state, written again from the format's rule (the
//! quality crate's `cache.rs`, "Bytes per token"):
//!
//! - per layer, per KV head, for K and for V, token j belongs to a *unit* (s, e): along the
//!   token axis the group holding it (s = G * floor(j / G), e = s + G); along the feature axis
//!   the token alone (s = j, e = j + 1);
//! - at the end state n = T; a unit is complete unless the schedule is `streaming` and e > n;
//! - its tier: not complete → float32; `uniform` → low; `recent_f32:W` → low if e + W <= n,
//!   else float32; `recent8:W` → low if e + W <= n, else 8 bits; `early8:W` → 8 bits if s < W,
//!   else low;
//! - each run of consecutive positions in one tier is one codec tensor of `len` tokens x
//!   head_dim, costing the codec's payload (the same formula the audit holds packed-KV segments
//!   to, [`crate::packed_kv::tensors::Stored`]: packed code bytes of the padded grouped view, 4
//!   bytes per f32 scale, packed zero points when asymmetric, 8 shape bytes), and float32
//!   positions cost 4 bytes per value;
//! - the cache's bytes are the sum times layers times KV heads; bytes per token divides by T;
//! - a sliding layer past its window W (Gemma 3's, [`super::geometry`]) needs no position
//!   before n - W: per side it holds the units that contain a position from n - W on, their
//!   tiers as above by absolute position, and a scheme's sliding layer is billed as the
//!   scheme's cache of its last W tokens alone.
//!
//! A scheme's cache is billed by the audit's own rule for that scheme
//! ([`super::schemes::stored_bytes`]), layer by layer (edge layers may differ), summed.
//!
//! KVQuant's cache stores its outliers apart, so its bytes depend on the values: a layer of T
//! tokens with F first tokens (Q = T - F quantized rows per side, none when T <= F; min(T, F)
//! first rows per side) and rows of W = kv_heads * head_dim values at B bits stores
//! - its shape part ([`kvquant_layer_shape_bytes`]): per quantized row and side, ceil(W B / 8)
//!   bytes of codes and a 2-byte outlier count; per quantized value row, 8 bytes (f32 maxval and
//!   minval); per first-token row and side, W fp16 values, 2 bytes each; once, its calibration,
//!   2 fp16 thresholds per key channel and both tables of 2^B f32 levels, W * 2 * 2 + 2 * 2^B * 4;
//! - and 4 bytes per outlier (fp16 value, 16-bit index), K and V together, as arrays.npz's
//!   `<id>_outliers` archives them ([`kvquant_bytes`]).
//!
//! Sizes are counted in u128, so no protocol can overflow them.

use crate::model_quality::geometry::Geometry;
use crate::model_quality::protocol::{CodecRun, Run, RunCache, Schedule, Window};
use crate::model_quality::schemes::{self, AuditScheme};
use crate::packed_kv::decoder::GroupAxis;
use crate::packed_kv::protocol::Mode;

/// The codec's payload of one `tokens` x `features` tensor of `bits`-bit codes in groups of
/// `group` along `axis`.
pub fn tensor_bytes(
    mode: Mode,
    bits: u32,
    group: usize,
    axis: GroupAxis,
    tokens: usize,
    features: usize,
) -> u128 {
    let (rows, len) = match axis {
        GroupAxis::Token => (features as u128, tokens as u128),
        GroupAxis::Feature => (tokens as u128, features as u128),
    };
    let group = group as u128;
    let groups = rows * len.div_ceil(group);
    let stream = |count: u128| (count * u128::from(bits)).div_ceil(8);
    let zero_points = match mode {
        Mode::Symmetric => 0,
        Mode::Asymmetric => stream(groups),
    };
    stream(groups * group) + 4 * groups + zero_points + 8
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

/// The tier of token j's unit along `axis` when the cache holds n tokens (module docs); the
/// rule the cache-size count and the audit's own packed cache ([`super::cache`]) share.
pub fn tier(run: &CodecRun, axis: GroupAxis, j: usize, n: usize) -> Tier {
    let g = run.setting.group_size;
    let (s, e) = match axis {
        GroupAxis::Token => {
            let s = j / g * g;
            (s, s.saturating_add(g))
        }
        GroupAxis::Feature => (j, j + 1),
    };
    if run.schedule == Schedule::Streaming && e > n {
        return Tier::F32;
    }
    let before_window = |w: usize| e.saturating_add(w) <= n;
    match run.policy {
        Window::Uniform => Tier::Low,
        Window::RecentF32(w) if before_window(w) => Tier::Low,
        Window::RecentF32(_) => Tier::F32,
        Window::Recent8(w) if before_window(w) => Tier::Low,
        Window::Recent8(_) => Tier::High,
        Window::Early8(w) if s < w => Tier::High,
        Window::Early8(_) => Tier::Low,
    }
}

/// One KV head's K or V from the unit holding position `first` on (0 unless a sliding layer
/// dropped the positions before: module docs).
fn side_bytes(
    run: &CodecRun,
    axis: GroupAxis,
    (first, tokens): (usize, usize),
    head_dim: usize,
) -> u128 {
    let s = run.setting;
    let mut bytes = 0;
    let mut start = match axis {
        GroupAxis::Token => first / s.group_size * s.group_size,
        GroupAxis::Feature => first,
    };
    while start < tokens {
        let t = tier(run, axis, start, tokens);
        let mut end = start + 1;
        while end < tokens && tier(run, axis, end, tokens) == t {
            end += 1;
        }
        let len = end - start;
        bytes += match t {
            Tier::F32 => (len * head_dim * 4) as u128,
            Tier::Low => tensor_bytes(s.mode, s.bits, s.group_size, axis, len, head_dim),
            Tier::High => tensor_bytes(s.mode, 8, s.group_size, axis, len, head_dim),
        };
        start = end;
    }
    bytes
}

/// The axes K and V are grouped along: K along tokens and V along features, or swapped.
pub fn axes(run: &CodecRun) -> (GroupAxis, GroupAxis) {
    if run.setting.swap {
        (GroupAxis::Feature, GroupAxis::Token)
    } else {
        (GroupAxis::Token, GroupAxis::Feature)
    }
}

/// The cache's bytes for `tokens` tokens of the decoder `g` under a codec run: per layer and
/// KV head, each side from the first position the layer still holds.
pub fn cache_bytes(run: &CodecRun, g: &Geometry, tokens: usize) -> u128 {
    let (k, v) = axes(run);
    (0..g.layers)
        .map(|layer| {
            let held = (g.first_held(layer, tokens), tokens);
            g.kv_heads as u128
                * (side_bytes(run, k, held, g.head_dim) + side_bytes(run, v, held, g.head_dim))
        })
        .sum()
}

/// The cache's bytes for `tokens` tokens of the decoder `g` under a scheme: the sum over
/// layers, a sliding layer past its window billed as the scheme's cache of its last `window`
/// tokens alone (module docs).
pub fn scheme_bytes(
    name: &str,
    schedule: Schedule,
    g: &Geometry,
    tokens: usize,
) -> Result<u128, String> {
    let scheme = AuditScheme::parse(name)?;
    let reading = match schedule {
        Schedule::Streaming => schemes::ReadSchedule::Streaming,
        // Causal is accepted only for per-token schemes, where it stores what prefill does.
        Schedule::Prefill | Schedule::Causal => schemes::ReadSchedule::Prefill,
    };
    (0..g.layers).try_fold(0u128, |sum, layer| {
        let bytes = schemes::stored_bytes(
            &scheme,
            reading,
            (layer, g.layers),
            g.kv_heads,
            g.head_dim,
            tokens - g.first_held(layer, tokens),
        )?;
        Ok(sum + bytes as u128)
    })
}

/// The bytes one KVQuant layer stores whatever its values (module docs): `tokens` tokens at
/// `bits` bits with `first` first tokens kept in fp16, rows of `width` values; its outliers'
/// 4 bytes each come on top.
pub fn kvquant_layer_shape_bytes(bits: u32, first: usize, width: usize, tokens: usize) -> u128 {
    let (width, tokens, first) = (width as u128, tokens as u128, first as u128);
    let quantized = tokens.saturating_sub(first);
    let kept = tokens.min(first);
    let codes = (width * u128::from(bits)).div_ceil(8);
    let calibration = width * 2 * 2 + 2 * (1u128 << bits) * 4;
    2 * quantized * (codes + 2) + quantized * 8 + 2 * kept * width * 2 + calibration
}

/// A KVQuant cache's bytes for `tokens` tokens of the decoder `g` with each layer's archived
/// outlier count (module docs; a sliding layer past its window billed for its last `window`
/// tokens); refused for counts that are not one per layer, or negative.
pub fn kvquant_bytes(
    (bits, first): (u32, usize),
    g: &Geometry,
    tokens: usize,
    outliers: &[i64],
) -> Result<u128, String> {
    if outliers.len() != g.layers {
        return Err(format!(
            "{} outlier counts, where {} has {} layers",
            outliers.len(),
            g.model.name(),
            g.layers
        ));
    }
    outliers
        .iter()
        .enumerate()
        .try_fold(0u128, |sum, (layer, &n)| {
            let n = u128::try_from(n).map_err(|_| format!("an outlier count of {n}"))?;
            let held = tokens - g.first_held(layer, tokens);
            Ok(sum + kvquant_layer_shape_bytes(bits, first, g.width(), held) + 4 * n)
        })
}

/// Bytes per token: cache bytes as f64 over T as f64 (a KVQuant run's by [`kvquant_bytes`]
/// from its archived outlier counts).
pub fn kvquant_bytes_per_token(
    scheme: (u32, usize),
    g: &Geometry,
    tokens: usize,
    outliers: &[i64],
) -> Result<f64, String> {
    Ok(kvquant_bytes(scheme, g, tokens, outliers)? as f64 / tokens as f64)
}

/// Bytes per token: cache bytes as f64 over T as f64 (KVQuant refused: its bytes need the
/// outlier counts, [`kvquant_bytes_per_token`]).
pub fn bytes_per_token(run: &Run, g: &Geometry, tokens: usize) -> Result<f64, String> {
    let bytes = match &run.cache {
        RunCache::Codec(codec) => cache_bytes(codec, g, tokens),
        RunCache::Scheme(name) => scheme_bytes(name, run.schedule, g, tokens)?,
    };
    Ok(bytes as f64 / tokens as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_quality::protocol::{
        CodecRun, RunCache, RunLabels, parse_policy, parse_schedule, parse_setting,
    };
    use crate::packed_kv::decoder::Grid;

    const HEAD_DIM: usize = 64;

    fn smollm2() -> Geometry {
        Geometry::named("smollm2").unwrap()
    }

    fn run(label: &str, policy: &str, schedule: &str) -> Run {
        let setting = parse_setting(label).unwrap();
        let schedule_parsed = parse_schedule(schedule).unwrap();
        Run {
            written: RunLabels {
                setting: Some(label.into()),
                policy: Some(policy.into()),
                scheme: None,
                schedule: schedule.into(),
            },
            cache: RunCache::Codec(CodecRun {
                setting,
                policy: parse_policy(policy, &setting).unwrap(),
                schedule: schedule_parsed,
            }),
            schedule: schedule_parsed,
        }
    }

    #[test]
    fn a_tensor_costs_what_a_stored_segment_costs() {
        for (mode, bits, group, axis, tokens) in [
            (Mode::Symmetric, 4, 32, GroupAxis::Token, 37),
            (Mode::Asymmetric, 3, 32, GroupAxis::Feature, 37),
            (Mode::Symmetric, 2, 16, GroupAxis::Token, 5),
        ] {
            let grid = Grid {
                tokens,
                features: HEAD_DIM,
                group_size: group,
                bits,
                axis,
                mode,
            };
            let zeros = match mode {
                Mode::Symmetric => 0,
                Mode::Asymmetric => grid.stream_bytes(grid.groups()),
            };
            let stored = grid.stream_bytes(grid.positions()) + 4 * grid.groups() + zeros + 8;
            assert_eq!(
                tensor_bytes(mode, bits, group, axis, tokens, HEAD_DIM),
                stored as u128
            );
        }
    }

    /// Hand-computed: per KV head of SmolLM2 (64 features), times 30 layers x 3 heads = 90.
    #[test]
    fn bytes_per_token_follow_the_rule_by_hand() {
        let cases: [(&str, &str, &str, usize, u128); 7] = [
            // K: 64 rows x 1 group of 32 (5 tokens padded) at 4 bits = 1,024 B + 64 scales x 4
            // + 8 = 1,288; V: 5 rows x 2 groups of 32 = 320 codes = 160 B + 10 x 4 + 8 = 208.
            ("g32_b4", "uniform", "prefill", 5, 90 * (1288 + 208)),
            // Causal ends where prefill does.
            ("g32_b4", "uniform", "causal", 5, 90 * (1288 + 208)),
            // Streaming: K's group 0..32 is not complete at n = 5: float32 5 x 64 x 4 = 1,280;
            // V's units are single tokens, all complete.
            ("g32_b4", "uniform", "streaming", 5, 90 * (1280 + 208)),
            // Asymmetric 2 bits, 64 tokens: K 64 rows x 2 groups: 4,096 codes = 1,024 B, 128
            // scales = 512, 128 zero points = 32 B, + 8 = 1,576; V 64 x 2 groups: the same.
            ("g32_b2_asym", "uniform", "prefill", 64, 90 * (1576 + 1576)),
            // recent_f32:32 at T = 64: K's group 0..32 (32 + 32 <= 64) low = 64 x 32 x 2 / 8
            // = 512 + 256 + 8 = 776, group 32..64 float32 = 8,192; V tokens 0..32 low: 32 rows
            // x 2 groups = 2,048 codes = 512 + 256 + 8 = 776, tokens 32..64 float32 = 8,192.
            (
                "g32_b2",
                "recent_f32:32",
                "prefill",
                64,
                90 * 2 * (776 + 8192),
            ),
            // early8:32 at T = 64: 8-bit first group: 2,048 + 256 + 8 = 2,312, then 776 each.
            ("g32_b2", "early8:32", "prefill", 64, 90 * 2 * (2312 + 776)),
            // swap: K along features (as V above) and V along tokens (as K above).
            ("g32_b4_swap", "uniform", "prefill", 5, 90 * (208 + 1288)),
        ];
        for (setting, policy, schedule, tokens, bytes) in cases {
            let r = run(setting, policy, schedule);
            assert_eq!(
                cache_bytes(r.codec().unwrap(), &smollm2(), tokens),
                bytes,
                "{setting} {policy} {schedule}"
            );
            assert_eq!(
                bytes_per_token(&r, &smollm2(), tokens).unwrap(),
                bytes as f64 / tokens as f64
            );
        }
    }

    /// Hand-computed for Gemma 3 (1 KV head of 256) at T = 600: its 3 global layers hold all
    /// 600 tokens, its 15 sliding layers the units holding positions 88..600.
    #[test]
    fn gemma3_sliding_layers_are_billed_for_their_window() {
        let g = Geometry::named("gemma3").unwrap();
        // g32_b4 prefill. Global: K 256 rows x 19 groups of 32 (600 padded to 608) at 4 bits
        // = 77,824 B + 19 x 256 scales x 4 = 19,456 + 8 = 97,288; V 600 rows x 8 groups:
        // 76,800 B + 4,800 x 4 = 19,200 + 8 = 96,008. Sliding: K from the group 64..96 (it
        // holds 88): 536 tokens, 17 groups: 69,632 + 17,408 + 8 = 87,048; V from 88: 512 rows:
        // 65,536 + 16,384 + 8 = 81,928.
        let r = run("g32_b4", "uniform", "prefill");
        assert_eq!(
            cache_bytes(r.codec().unwrap(), &g, 600),
            3 * (97_288 + 96_008) + 15 * (87_048 + 81_928)
        );
        // llama.cpp q8_0: 8 blocks of 34 bytes per token and side; sliding layers hold 512.
        let q8 = scheme_bytes("llamacpp-q8_0", Schedule::Prefill, &g, 600).unwrap();
        assert_eq!(q8, (3 * 600 + 15 * 512) * 2 * 8 * 34);
        // Below the window every layer holds every token.
        assert_eq!(
            scheme_bytes("llamacpp-q8_0", Schedule::Prefill, &g, 500).unwrap(),
            18 * 500 * 2 * 8 * 34
        );
        // KVQuant: the shape part of 600 tokens for global layers, of 512 for sliding ones.
        let outliers = vec![1i64; 18];
        assert_eq!(
            kvquant_bytes((4, 1), &g, 600, &outliers).unwrap(),
            3 * kvquant_layer_shape_bytes(4, 1, 256, 600)
                + 15 * kvquant_layer_shape_bytes(4, 1, 256, 512)
                + 18 * 4
        );
    }

    /// Hand-computed from the spec, W = 192.
    #[test]
    fn kvquant_bytes_follow_the_rule_by_hand() {
        // kvquant4-first1, T = 10: 9 quantized rows per side: codes 192 x 4 / 8 = 96 and a
        // count of 2 per row and side, 2 x 9 x 98 = 1,764; value metadata 9 x 8 = 72; the first
        // row per side 2 x 192 x 2 = 768; calibration 192 x 4 + 2 x 16 x 4 = 896.
        assert_eq!(
            kvquant_layer_shape_bytes(4, 1, 3 * HEAD_DIM, 10),
            1764 + 72 + 768 + 896
        );
        // kvquant3, W = 5 (codes 15 bits = 2 bytes), T = 3: 2 x 3 x 4 + 24 + 0 + 20 + 64.
        assert_eq!(kvquant_layer_shape_bytes(3, 0, 5, 3), 24 + 24 + 20 + 64);
        // Fewer tokens than first tokens: every row kept, nothing quantized.
        assert_eq!(
            kvquant_layer_shape_bytes(2, 8, 4, 3),
            2 * 3 * 4 * 2 + 4 * 4 + 2 * 4 * 4
        );
        let mut outliers = vec![0i64; 30];
        outliers[3] = 7;
        assert_eq!(
            kvquant_bytes((4, 1), &smollm2(), 10, &outliers).unwrap(),
            30 * 3500 + 28
        );
        assert_eq!(
            kvquant_bytes_per_token((4, 1), &smollm2(), 10, &outliers).unwrap(),
            (30 * 3500 + 28) as f64 / 10.0
        );
        assert!(kvquant_bytes((4, 1), &smollm2(), 10, &outliers[1..]).is_err());
        outliers[0] = -1;
        assert!(kvquant_bytes((4, 1), &smollm2(), 10, &outliers).is_err());
    }

    /// The shape part plus 4 bytes per outlier is what kvschemes' KVQuant cache stores.
    #[test]
    fn kvquant_bytes_equal_what_kvschemes_stores() {
        use kvschemes::kvquant::{Calibration, KvQuantScheme};
        use kvschemes::{LayerCache, Schedule as Theirs};
        use ndarray::Array3;
        use rand::SeedableRng;
        use rand_chacha::ChaCha20Rng;
        use rand_distr::{Distribution as _, StandardNormal};

        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let mut draw = |(h, t, d): (usize, usize, usize)| {
            Array3::from_shape_fn((h, t, d), |_| {
                let x: f64 = StandardNormal.sample(&mut rng);
                x as f32
            })
        };
        for (bits, first, heads, head_dim, tokens) in [
            (4, 1, 3, 64, 17),
            (2, 0, 2, 16, 9),
            (3, 4, 1, 13, 3),
            (5, 2, 2, 8, 40),
        ] {
            let layers: Vec<(Array3<f32>, Array3<f32>)> = (0..2)
                .map(|_| (draw((heads, 96, head_dim)), draw((heads, 96, head_dim))))
                .collect();
            let calibration = Calibration::fit(bits, first, &layers).unwrap();
            let scheme = KvQuantScheme { bits, first };
            let (k, v) = (
                draw((heads, tokens, head_dim)),
                draw((heads, tokens, head_dim)),
            );
            for schedule in [Theirs::Prefill, Theirs::Streaming] {
                let cache = LayerCache::kvquant(
                    scheme,
                    &calibration,
                    schedule,
                    (1, 2),
                    (&k, &v),
                    |_: &mut Array3<f32>| Ok::<(), String>(()),
                )
                .unwrap();
                let ours = kvquant_layer_shape_bytes(bits, first, heads * head_dim, tokens)
                    + 4 * cache.outliers() as u128;
                assert_eq!(
                    ours,
                    cache.stored().total() as u128,
                    "{bits} {first} {heads}x{head_dim} {tokens}"
                );
            }
        }
    }
}
