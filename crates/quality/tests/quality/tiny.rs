//! The packed-cache decoder on a tiny random Llama (no download): the float32 path gives the bits
//! of the plain pass, the single-pass `streaming` schedule equals a literal token-by-token loop,
//! 8-bit codes stay close to float32, and a budget policy's bytes are those counted by hand.

use kvcodec::GroupAxis;
use models::llama::{LayerWeights, Llama, LlamaConfig, LlamaWeights};
use ndarray::{Array2, Array3, Axis, s};
use quality::cache::{self, Tier, tier};
use quality::{CacheSpec, KvSetting, PackedLayer, Policy, Schedule};

/// 2 layers, hidden 32, 4 query heads and 2 KV heads of 8, FFN 24, vocabulary 30.
fn tiny() -> Llama {
    let config = LlamaConfig {
        layers: 2,
        hidden: 32,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        ffn: 24,
        vocab: 30,
        context: 64,
        rope_base: 10000.0,
        rms_eps: 1e-5,
    };
    random_llama(config, 0x2545_f491_4f6c_dd1d)
}

/// A Llama of `config` whose weights are xorshift draws in [-0.5, 0.5) from `seed` (the token
/// embeddings scaled by 4), unit norms.
pub fn random_llama(config: LlamaConfig, mut seed: u64) -> Llama {
    let mut matrix = |rows: usize, cols: usize| {
        Array2::from_shape_fn((rows, cols), |_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
    };
    let (hidden, q, kv) = (
        config.hidden,
        config.heads * config.head_dim,
        config.kv_heads * config.head_dim,
    );
    let layers = (0..config.layers)
        .map(|_| LayerWeights {
            attn_norm: vec![1.0; hidden],
            q: matrix(q, hidden),
            k: matrix(kv, hidden),
            v: matrix(kv, hidden),
            o: matrix(hidden, q),
            ffn_norm: vec![1.0; hidden],
            gate: matrix(config.ffn, hidden),
            up: matrix(config.ffn, hidden),
            down: matrix(hidden, config.ffn),
        })
        .collect();
    let weights = LlamaWeights {
        token_embd: matrix(config.vocab, hidden) * 4.0,
        layers,
        output_norm: vec![1.0; hidden],
    };
    Llama::from_weights(config, weights).unwrap()
}

const IDS: [u32; 19] = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8];

fn spec(setting: &str, policy: &str, schedule: Schedule) -> CacheSpec {
    let setting: KvSetting = setting.parse().unwrap();
    CacheSpec::new(setting, Policy::parse(policy, &setting).unwrap(), schedule).unwrap()
}

#[test]
fn a_cache_held_in_float32_gives_the_bits_of_the_plain_forward_pass() {
    let model = tiny();
    let plain = model.forward(&IDS).unwrap();
    // A float32 window longer than the text: every unit of K and V stays float32.
    for schedule in [Schedule::Prefill, Schedule::Streaming] {
        let spec = spec("g4_b2", "recent_f32:64", schedule);
        let packed = model
            .forward_with_source(&IDS, |_, k, v| PackedLayer::boxed(spec, k, v))
            .unwrap();
        assert_eq!(packed, plain, "{schedule}");
        let m = quality::measure(&model, &IDS, spec, |_| {}).unwrap();
        assert_eq!((m.nll, m.kl_max, m.top1_agreement), (m.nll_f32, 0.0, 1.0));
    }
}

/// One layer's K or V as a literal streaming cache holds it: the rows attention reads, and each
/// complete unit's tier, changed only when the table of `quality::cache` says so, from the rows
/// the cache holds (8-bit values re-quantized to low bits) or from float32.
struct LiteralSide {
    axis: GroupAxis,
    raw: Vec<Array2<f32>>,    // per head, [n, d]
    held: Vec<Array2<f32>>,   // per head, [n, d]: what attention reads
    tiers: Vec<Option<Tier>>, // per unit start
}

impl LiteralSide {
    fn append(&mut self, spec: &CacheSpec, new: &Array3<f32>) {
        let g = spec.setting.group_size();
        for (h, row) in new.axis_iter(Axis(0)).enumerate() {
            self.raw[h].push_row(row.row(0)).unwrap();
            self.held[h].push_row(row.row(0)).unwrap();
        }
        let n = self.raw[0].nrows();
        self.tiers.resize(n, None);
        let units: Vec<(usize, usize)> = match self.axis {
            GroupAxis::Token => (0..n / g).map(|u| (u * g, u * g + g)).collect(),
            GroupAxis::Feature => (0..n).map(|j| (j, j + 1)).collect(),
        };
        for (start, end) in units {
            let want = tier(spec.policy, start, end, n, true);
            let now = self.tiers[start];
            if now == Some(want) {
                continue;
            }
            for h in 0..self.raw.len() {
                let from = match (now, want) {
                    (Some(Tier::High), Tier::Low) => {
                        self.held[h].slice(s![start..end, ..]).to_owned()
                    }
                    _ => self.raw[h].slice(s![start..end, ..]).to_owned(),
                };
                let rows = match want {
                    Tier::F32 => from,
                    Tier::Low | Tier::High => {
                        let bits = if want == Tier::High {
                            8
                        } else {
                            spec.setting.bits()
                        };
                        let layout = spec.setting.with_bits(bits).unwrap().layout(self.axis);
                        kvcodec::decode(&kvcodec::encode(from.view(), layout).unwrap())
                    }
                };
                self.held[h].slice_mut(s![start..end, ..]).assign(&rows);
            }
            self.tiers[start] = Some(want);
        }
    }

    fn array(&self) -> Array3<f32> {
        let (n, d) = self.held[0].dim();
        Array3::from_shape_fn((self.held.len(), n, d), |(h, j, f)| self.held[h][[j, f]])
    }
}

#[test]
fn streaming_in_one_pass_equals_a_literal_token_by_token_loop() {
    let model = tiny();
    let c = model.config().clone();
    for (setting, policy) in [
        ("g4_b4", "uniform"),
        ("g4_b3_asym_swap", "uniform"),
        ("g4_b2", "recent_f32:8"),
        ("g4_b2_swap", "recent8:4"),
        ("g4_b2", "early8:4"),
    ] {
        let spec = spec(setting, policy, Schedule::Streaming);
        let empty = || LiteralSide {
            axis: GroupAxis::Token,
            raw: vec![Array2::zeros((0, c.head_dim)); c.kv_heads],
            held: vec![Array2::zeros((0, c.head_dim)); c.kv_heads],
            tiers: Vec::new(),
        };
        let mut layers: Vec<(LiteralSide, LiteralSide)> = (0..c.layers)
            .map(|_| {
                let mut k = empty();
                let mut v = empty();
                k.axis = spec.setting.axes().k();
                v.axis = spec.setting.axes().v();
                (k, v)
            })
            .collect();
        let one_pass = model
            .forward_with_source(&IDS, |_, k, v| PackedLayer::boxed(spec, k, v))
            .unwrap();
        for (pos, &id) in IDS.iter().enumerate() {
            let row = model
                .step(id, pos, |l, k, v| {
                    let (lk, lv) = &mut layers[l];
                    lk.append(&spec, k);
                    lv.append(&spec, v);
                    Ok((lk.array(), lv.array()))
                })
                .unwrap();
            assert_eq!(
                row,
                one_pass.hidden.slice(s![pos..pos + 1, ..]),
                "{setting} {policy} at position {pos}"
            );
        }
    }
}

#[test]
fn prefill_with_8_bit_codes_is_close_to_float32_and_2_bits_is_not() {
    let model = tiny();
    let m8 = quality::measure(
        &model,
        &IDS,
        spec("g4_b8", "uniform", Schedule::Prefill),
        |_| {},
    )
    .unwrap();
    let m2 = quality::measure(
        &model,
        &IDS,
        spec("g4_b2", "uniform", Schedule::Prefill),
        |_| {},
    )
    .unwrap();
    eprintln!(
        "nll_f32 {}, 8 bits: nll {} kl_mean {} kl_max {}; 2 bits: nll {} kl_mean {}",
        m8.nll_f32, m8.nll, m8.kl_mean, m8.kl_max, m2.nll, m2.kl_mean
    );
    // The random tiny model is very sure of itself (NLL about 17 nats): closeness is relative.
    assert!((m8.nll - m8.nll_f32).abs() < 1e-3 * m8.nll_f32);
    assert_eq!(m8.top1_agreement, 1.0);
    assert!(m2.kl_mean > 100.0 * m8.kl_mean);
    assert_eq!(m8.positions.kl.len(), IDS.len() - 1);
}

#[test]
fn bytes_per_token_of_a_recent_f32_window_counted_by_hand() {
    // 10 tokens, g4_b4, recent_f32:4 at the end of the text, per layer and KV head (d = 4):
    // K (token axis): group 0..4 ends at 4 and 4 + 4 <= 10, so low bits: a 4 x 4 tensor of
    //   16 nibbles (8 bytes), 4 f32 scales (16) and its shape (8) = 32 bytes; tokens 4..10 stay
    //   float32: 6 * 4 * 4 = 96. K = 128.
    // V (feature axis, one token a unit): token j is low bits when j + 1 + 4 <= 10, j <= 5: a
    //   6 x 4 tensor of 24 nibbles (12), 6 scales (24), shape (8) = 44; tokens 6..10 float32:
    //   4 * 4 * 4 = 64. V = 108.
    // 2 layers x 2 KV heads x 236 = 944 bytes, 94.4 per token; float32: 2*2*2*4*4 = 128.
    let spec = spec("g4_b4", "recent_f32:4", Schedule::Streaming);
    assert_eq!(cache::cache_bytes(&spec, 2, 2, 4, 10).unwrap(), 944);
    assert_eq!(cache::f32_bytes_per_token(2, 2, 4), 128);
    // Prefill uniform: one tensor each: K 4 x 10 padded to 12 -> 48 nibbles (24) + 12 scales
    // (48) + 8 = 80; V 10 x 4 -> 40 nibbles (20) + 10 scales (40) + 8 = 68. 4 x 148 = 592.
    let spec = self::spec("g4_b4", "uniform", Schedule::Prefill);
    assert_eq!(cache::cache_bytes(&spec, 2, 2, 4, 10).unwrap(), 592);
}

#[test]
fn greedy_text_with_a_float32_held_cache_is_the_plain_greedy_text() {
    let model = tiny();
    let spec = spec("g4_b2", "recent_f32:64", Schedule::Streaming);
    let g = quality::generate::compare(&model, &IDS[..5], 6, spec, |_| {}).unwrap();
    assert_eq!(g.ids, g.ids_f32);
    assert_eq!(g.first_difference, None);
    assert_eq!(g.ids_f32, model.generate_greedy(&IDS[..5], 6).unwrap());
    // At 2 bits the greedy text of this tiny model departs somewhere, and the report says where.
    let g2 = quality::generate::compare(
        &model,
        &IDS[..5],
        6,
        self::spec("g4_b2", "uniform", Schedule::Prefill),
        |_| {},
    )
    .unwrap();
    assert_eq!(
        g2.first_difference,
        g2.ids.iter().zip(&g2.ids_f32).position(|(a, b)| a != b)
    );
}
