//! The audit reads a protocol as the runner does: for generated protocols mixing valid and
//! extreme values, the audit's validator accepts exactly those the runner's accepts; the same for
//! model protocols (sizes near each model's limits, names and lists both valid and not, fields of
//! generated protocols mixed in, swapped axes).

use proptest::prelude::*;
use serde_json::{Value, json};

const EXTREME: [u64; 8] = [0, 1, 3, 1 << 20, 1 << 31, 1 << 32, 1 << 40, u64::MAX];

fn size(valid: u64) -> BoxedStrategy<u64> {
    prop_oneof![6 => 1..=valid, 1 => prop::sample::select(EXTREME.to_vec()), 1 => (5u32..=27).prop_map(|e| 1u64 << e)].boxed()
}

fn list<T: std::fmt::Debug + Clone + Ord + 'static>(
    item: impl Strategy<Value = T> + Clone + 'static,
) -> BoxedStrategy<Vec<T>> {
    prop_oneof![
        8 => prop::collection::btree_set(item.clone(), 1..=3).prop_map(|s| s.into_iter().collect::<Vec<T>>()),
        1 => Just(Vec::new()),
        1 => item.prop_map(|x| vec![x.clone(), x]),
    ]
    .boxed()
}

fn any_protocol() -> impl Strategy<Value = Value> {
    let setting = (
        size(40),
        0u32..=9,
        prop::sample::select(vec![None, Some("symmetric"), Some("asymmetric")]),
    )
        .prop_map(|(g, bits, mode)| {
            let mut s = json!({ "group_size": g, "bits": bits });
            if let Some(mode) = mode {
                s["mode"] = mode.into();
            }
            s
        });
    let budget = (size(40), 0u32..=9, size(6), list(prop::sample::select(vec!["uniform", "recent8", "early8", "recent_f32", "early_f32"])))
        .prop_map(|(g, low, window, policies)| json!({ "group_size": g, "low_bits": low, "window": window, "policies": policies }));
    (
        (
            prop_oneof![4 => "[a-z0-9._-]{1,64}", 1 => any::<String>()],
            list(prop_oneof![9 => 0u64..1000, 1 => Just(u64::MAX)]),
            list(prop_oneof![8 => 4u64..=48, 1 => prop::sample::select(EXTREME.to_vec())]),
            size(24),
            size(4),
            list(prop::sample::select(vec![
                "clean",
                "early_focus",
                "recent_focus",
            ])),
        ),
        (
            size(5),
            prop::sample::select(vec![0.0f32, 2.0, -1.5]),
            prop::collection::vec(setting, 1..=3),
            prop::sample::select(vec!["numpy", "chacha20"]),
            prop_oneof![9 => 0u64..=10_000, 1 => Just(u64::MAX)],
            prop::option::of(budget),
            prop::option::of((
                0u64..=3,
                prop_oneof![5 => 1u64..=3, 1 => prop::sample::select(EXTREME.to_vec())],
            )),
        ),
    )
        .prop_map(
            |(
                (study, seeds, tokens, features, queries, distributions),
                (window, gain, settings, generator, multiplier, budget, timing),
            )| {
                let mut p = json!({
                    "study": study, "seeds": seeds, "tokens": tokens, "features": features,
                    "queries": queries, "distributions": distributions,
                    "focus": { "window": window, "gain": gain }, "settings": settings,
                    "generator": { "name": generator, "entropy":
                        { "seed_multiplier": multiplier, "tokens_multiplier": 1, "offset": 0 } }
                });
                if let Some(budget) = budget {
                    p["budget"] = budget;
                }
                if let Some((warmup, repeats)) = timing {
                    p["timing"] =
                        json!({ "warmup": warmup, "repeats": repeats, "shuffle_seed": 1 });
                }
                p
            },
        )
}

/// A model protocol around both models' sizes (MiniLM: 6 layers, 12 KV heads, head_dim 32,
/// 3 to 512 tokens; SmolLM2: 30 layers, 3 KV heads, head_dim 64, queries exactly 3, 1 to 8192).
fn any_model_protocol() -> impl Strategy<Value = Value> {
    let name = prop_oneof![
        24 => "[a-z0-9._-]{1,8}",
        1 => Just(String::new()),
        1 => Just("x".repeat(33)),
        1 => Just("a b".to_string()),
    ];
    let texts = prop_oneof![
        8 => prop::collection::vec(name, 1..=2),
        1 => Just(Vec::new()),
    ];
    let index = |max: usize| {
        prop_oneof![
            8 => prop::collection::btree_set(0..max, 1..=3).prop_map(|s| s.into_iter().collect::<Vec<_>>()),
            1 => Just(Vec::new()),
            1 => (0..max).prop_map(|x| vec![x, x]),
        ]
    };
    let setting = (
        prop_oneof![8 => prop::sample::select(vec![8u64, 16, 32, 64]), 1 => Just(0u64)],
        prop_oneof![8 => 2u32..=8, 1 => Just(1u32)],
        prop::sample::select(vec![None, Some("asymmetric")]),
        prop::sample::select(vec![
            None,
            Some("k_token_v_feature"),
            Some("k_feature_v_token"),
        ]),
    )
        .prop_map(|(g, bits, mode, axes)| {
            let mut s = json!({ "group_size": g, "bits": bits });
            if let Some(mode) = mode {
                s["mode"] = mode.into();
            }
            if let Some(axes) = axes {
                s["axes"] = axes.into();
            }
            s
        });
    (
        prop::sample::select(vec!["minilm", "smollm2"]),
        texts,
        prop_oneof![4 => index(6), 1 => index(31)],
        prop_oneof![4 => index(3), 1 => index(13)],
        prop_oneof![4 => prop::sample::select(vec![32usize, 64]), 1 => Just(16usize)],
        prop_oneof![4 => Just(3usize), 2 => prop::sample::select(vec![1usize, 2, 4, 6, 12, 80])],
        prop::collection::vec(
            prop_oneof![
                6 => prop::sample::select(vec![3usize, 40, 100]),
                1 => prop::sample::select(vec![1usize, 2, 512, 513, 8192, 8193])
            ],
            1..=2,
        ),
        prop::collection::vec(setting, 1..=2),
        prop_oneof![
            8 => Just(None),
            1 => prop::sample::select(vec![Some("seeds"), Some("distributions"), Some("focus"), Some("generator")])
        ],
    )
        .prop_map(
            |(model, texts, layers, kv_heads, features, queries, tokens, settings, extra)| {
                let texts: Vec<Value> = texts
                    .into_iter()
                    .map(|name| json!({ "name": name, "text": "a text" }))
                    .collect();
                let mut p = json!({
                    "study": "m", "tokens": tokens, "features": features, "queries": queries,
                    "settings": settings,
                    "model": { "name": model, "texts": texts, "layers": layers, "kv_heads": kv_heads }
                });
                match extra {
                    Some("seeds") => p["seeds"] = json!([1]),
                    Some("distributions") => p["distributions"] = json!(["clean"]),
                    Some("focus") => p["focus"] = json!({ "window": 1, "gain": 1.0 }),
                    Some("generator") => {
                        p["generator"] = json!({ "name": "numpy", "entropy":
                            { "seed_multiplier": 1, "tokens_multiplier": 1, "offset": 0 } })
                    }
                    _ => {}
                }
                p
            },
        )
}

fn audit_accepts(text: &str) -> bool {
    serde_json::from_str::<audit::packed_kv::protocol::Protocol>(text)
        .is_ok_and(|p| p.validate().is_ok())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn the_audit_accepts_exactly_the_protocols_the_runner_accepts(protocol in any_protocol()) {
        let text = protocol.to_string();
        let runner = kvstudy::protocol::Protocol::from_json(&text);
        prop_assert_eq!(runner.is_ok(), audit_accepts(&text), "runner: {:?}\n{}", runner.err(), text);
    }

    #[test]
    fn the_audit_accepts_exactly_the_model_protocols_the_runner_accepts(protocol in any_model_protocol()) {
        let text = protocol.to_string();
        let runner = kvstudy::protocol::Protocol::from_json(&text);
        prop_assert_eq!(runner.is_ok(), audit_accepts(&text), "runner: {:?}\n{}", runner.err(), text);
    }
}

#[test]
fn the_frozen_and_archived_protocols_are_accepted_by_both() {
    for path in [
        "experiments/packed-kv/protocol.json",
        "experiments/widths-and-modes/protocol.json",
        "experiments/real-models/minilm.json",
        "experiments/real-models/smollm2.json",
    ] {
        let text = std::fs::read_to_string(crate::support::workspace().join(path)).unwrap();
        assert!(
            kvstudy::protocol::Protocol::from_json(&text).is_ok(),
            "{path}"
        );
        assert!(audit_accepts(&text), "{path}");
    }
}

#[test]
fn both_refuse_more_configurations_than_the_chart_draws_distinctly() {
    let protocol = |settings: usize| {
        let settings: Vec<Value> = (1..=settings)
            .map(|g| json!({ "group_size": g, "bits": 4 }))
            .collect();
        json!({
            "study": "wide", "seeds": [1], "tokens": [16], "features": 4, "queries": 1,
            "distributions": ["clean"], "settings": settings,
            "budget": { "group_size": 4, "low_bits": 4, "window": 4, "policies": ["uniform"] },
            "generator": { "name": "chacha20",
                           "entropy": { "seed_multiplier": 1, "tokens_multiplier": 1, "offset": 0 } }
        })
        .to_string()
    };
    // 99 settings and one budget policy: 100 series, each drawn distinctly.
    assert!(kvstudy::protocol::Protocol::from_json(&protocol(99)).is_ok());
    assert!(audit_accepts(&protocol(99)));
    assert!(kvstudy::protocol::Protocol::from_json(&protocol(100)).is_err());
    assert!(!audit_accepts(&protocol(100)));
}
