//! The audit reads a protocol as the runner does: for generated protocols mixing valid and
//! extreme values, the audit's validator accepts exactly those the runner's accepts.

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

fn audit_accepts(text: &str) -> bool {
    serde_json::from_str::<audit::protocol::Protocol>(text).is_ok_and(|p| p.validate().is_ok())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn the_audit_accepts_exactly_the_protocols_the_runner_accepts(protocol in any_protocol()) {
        let text = protocol.to_string();
        let runner = runner::protocol::Protocol::from_json(&text);
        prop_assert_eq!(runner.is_ok(), audit_accepts(&text), "runner: {:?}\n{}", runner.err(), text);
    }
}

#[test]
fn the_frozen_and_archived_protocols_are_accepted_by_both() {
    for path in [
        "experiments/packed-kv/protocol.json",
        "experiments/widths-and-modes/protocol.json",
    ] {
        let text = std::fs::read_to_string(crate::support::workspace().join(path)).unwrap();
        assert!(
            runner::protocol::Protocol::from_json(&text).is_ok(),
            "{path}"
        );
        assert!(audit_accepts(&text), "{path}");
    }
}
