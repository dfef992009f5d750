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
//! - the cache's bytes are the sum times layers times KV heads; bytes per token divides by T.
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

use crate::model_quality::protocol::{CodecRun, Run, RunCache, Schedule, Window};
use crate::model_quality::schemes::{self, AuditScheme};
use crate::packed_kv::decoder::GroupAxis;
use crate::packed_kv::protocol::Mode;

/// SmolLM2's layers.
pub const LAYERS: u128 = 30;
/// SmolLM2's KV heads.
pub const KV_HEADS: u128 = 3;
/// SmolLM2's head dimension.
pub const HEAD_DIM: usize = 64;
/// The float32 cache's bytes per token: 2 * 30 * 3 * 64 * 4.
pub const FLOAT32_BYTES_PER_TOKEN: u128 = 2 * LAYERS * KV_HEADS * HEAD_DIM as u128 * 4;

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

fn side_bytes(run: &CodecRun, axis: GroupAxis, tokens: usize) -> u128 {
    let s = run.setting;
    let mut bytes = 0;
    let mut start = 0;
    while start < tokens {
        let t = tier(run, axis, start, tokens);
        let mut end = start + 1;
        while end < tokens && tier(run, axis, end, tokens) == t {
            end += 1;
        }
        let len = end - start;
        bytes += match t {
            Tier::F32 => (len * HEAD_DIM * 4) as u128,
            Tier::Low => tensor_bytes(s.mode, s.bits, s.group_size, axis, len, HEAD_DIM),
            Tier::High => tensor_bytes(s.mode, 8, s.group_size, axis, len, HEAD_DIM),
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

/// The cache's bytes for `tokens` tokens of SmolLM2 under a codec run.
pub fn cache_bytes(run: &CodecRun, tokens: usize) -> u128 {
    let (k, v) = axes(run);
    LAYERS * KV_HEADS * (side_bytes(run, k, tokens) + side_bytes(run, v, tokens))
}

/// The cache's bytes for `tokens` tokens of SmolLM2 under a scheme: the sum over layers.
pub fn scheme_bytes(name: &str, schedule: Schedule, tokens: usize) -> Result<u128, String> {
    let scheme = AuditScheme::parse(name)?;
    let reading = match schedule {
        Schedule::Streaming => schemes::ReadSchedule::Streaming,
        // Causal is accepted only for per-token schemes, where it stores what prefill does.
        Schedule::Prefill | Schedule::Causal => schemes::ReadSchedule::Prefill,
    };
    let layers = LAYERS as usize;
    (0..layers).try_fold(0u128, |sum, layer| {
        let bytes = schemes::stored_bytes(
            &scheme,
            reading,
            (layer, layers),
            KV_HEADS as usize,
            HEAD_DIM,
            tokens,
        )?;
        Ok(sum + bytes as u128)
    })
}

/// SmolLM2's row width W = kv_heads * head_dim.
pub const WIDTH: usize = KV_HEADS as usize * HEAD_DIM;

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

/// A KVQuant cache's bytes for `tokens` tokens of SmolLM2 with each layer's archived outlier
/// count (module docs); refused for counts that are not one per layer, or negative.
pub fn kvquant_bytes(
    (bits, first): (u32, usize),
    tokens: usize,
    outliers: &[i64],
) -> Result<u128, String> {
    if outliers.len() != LAYERS as usize {
        return Err(format!(
            "{} outlier counts, where SmolLM2 has {LAYERS} layers",
            outliers.len()
        ));
    }
    outliers.iter().try_fold(0u128, |sum, &n| {
        let n = u128::try_from(n).map_err(|_| format!("an outlier count of {n}"))?;
        Ok(sum + kvquant_layer_shape_bytes(bits, first, WIDTH, tokens) + 4 * n)
    })
}

/// Bytes per token: cache bytes as f64 over T as f64 (a KVQuant run's by [`kvquant_bytes`]
/// from its archived outlier counts).
pub fn kvquant_bytes_per_token(
    scheme: (u32, usize),
    tokens: usize,
    outliers: &[i64],
) -> Result<f64, String> {
    Ok(kvquant_bytes(scheme, tokens, outliers)? as f64 / tokens as f64)
}

/// Bytes per token: cache bytes as f64 over T as f64 (KVQuant refused: its bytes need the
/// outlier counts, [`kvquant_bytes_per_token`]).
pub fn bytes_per_token(run: &Run, tokens: usize) -> Result<f64, String> {
    let bytes = match &run.cache {
        RunCache::Codec(codec) => cache_bytes(codec, tokens),
        RunCache::Scheme(name) => scheme_bytes(name, run.schedule, tokens)?,
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
                cache_bytes(r.codec().unwrap(), tokens),
                bytes,
                "{setting} {policy} {schedule}"
            );
            assert_eq!(
                bytes_per_token(&r, tokens).unwrap(),
                bytes as f64 / tokens as f64
            );
        }
        assert_eq!(FLOAT32_BYTES_PER_TOKEN, 46_080);
    }

    /// Hand-computed from the spec, W = 192.
    #[test]
    fn kvquant_bytes_follow_the_rule_by_hand() {
        // kvquant4-first1, T = 10: 9 quantized rows per side: codes 192 x 4 / 8 = 96 and a
        // count of 2 per row and side, 2 x 9 x 98 = 1,764; value metadata 9 x 8 = 72; the first
        // row per side 2 x 192 x 2 = 768; calibration 192 x 4 + 2 x 16 x 4 = 896.
        assert_eq!(
            kvquant_layer_shape_bytes(4, 1, WIDTH, 10),
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
            kvquant_bytes((4, 1), 10, &outliers).unwrap(),
            30 * 3500 + 28
        );
        assert_eq!(
            kvquant_bytes_per_token((4, 1), 10, &outliers).unwrap(),
            (30 * 3500 + 28) as f64 / 10.0
        );
        assert!(kvquant_bytes((4, 1), 10, &outliers[1..]).is_err());
        outliers[0] = -1;
        assert!(kvquant_bytes((4, 1), 10, &outliers).is_err());
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
