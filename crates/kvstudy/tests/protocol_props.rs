//! Property tests: no protocol the validator accepts can make the runner panic or abort.
//!
//! - Protocols mixing valid values with extreme ones (0, 1, 2^31, 2^32, 2^40, 2^62, u64::MAX
//!   for sizes; widths 0 to 10; empty lists; unicode and markup study names) are either refused
//!   with a `ProtocolError` or accepted, and for every accepted one each size the run would
//!   allocate, recomputed here independently in u128 without allocating, fits the bounds.
//! - Accepted protocols with small dimensions but extreme group sizes, widths and modes run to
//!   completion through `study::run`, the summary and the evidence writer, and the archive they
//!   write holds exactly the planned members within the planned size.
//! - Arbitrary bytes, truncated and corrupted JSON are refused (or, for a corruption that stays
//!   valid, accepted), never a panic.

use std::collections::BTreeSet;

use proptest::prelude::*;
use serde_json::{Value, json};

use kvstudy::archive::{self, MAX_NPZ_BYTES, MAX_NPZ_MEMBERS};
use kvstudy::plan::Storage;
use kvstudy::protocol::{
    FROZEN, MAX_MATRIX_ELEMENTS, MAX_STUDY_NAME_CHARS, MAX_TIMED_CALLS, Mode, Protocol,
};
use kvstudy::run::{Run, run_protocol};
use kvstudy::{summary, write};

const EXTREME: [u64; 7] = [0, 1, 1 << 31, 1 << 32, 1 << 40, 1 << 62, u64::MAX];
const DISTRIBUTIONS: [&str; 3] = ["clean", "early_focus", "recent_focus"];
const POLICIES: [&str; 5] = ["uniform", "recent8", "early8", "recent_f32", "early_f32"];

/// Mostly a valid value, sometimes an extreme or invalid one, so that a good share of the
/// generated protocols is accepted (and checked) while every field still meets its extremes.
fn mostly<T: std::fmt::Debug + Clone>(
    valid: impl Strategy<Value = T> + 'static,
    extreme: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<T> {
    prop_oneof![8 => valid, 1 => extreme].boxed()
}

fn extreme_size() -> impl Strategy<Value = u64> {
    prop::sample::select(EXTREME.to_vec())
}

/// Powers of two up to 2^27: large but plausible sizes, near the bounds.
fn large_size() -> impl Strategy<Value = u64> {
    (5u32..=27).prop_map(|e| 1u64 << e)
}

/// A size: mostly 1 to `valid`, sometimes a power of two up to 2^27, sometimes 0, 1, 2^31,
/// 2^32, 2^40, 2^62 or u64::MAX.
fn size(valid: u64) -> BoxedStrategy<u64> {
    mostly(1..=valid, prop_oneof![large_size(), extreme_size()])
}

/// A list: mostly 1 to 3 distinct values, sometimes empty or with a duplicate.
fn list<T: std::fmt::Debug + Clone + Ord + 'static>(
    item: impl Strategy<Value = T> + Clone + 'static,
) -> BoxedStrategy<Vec<T>> {
    let distinct = prop::collection::btree_set(item.clone(), 1..=3)
        .prop_map(|set| set.into_iter().collect::<Vec<T>>());
    let odd = prop_oneof![Just(Vec::new()), item.prop_map(|x| vec![x.clone(), x]),];
    mostly(distinct, odd)
}

fn study_name() -> BoxedStrategy<String> {
    mostly(
        "[A-Za-z0-9._-]{1,64}",
        prop_oneof![
            any::<String>(),
            prop::sample::select(vec![
                String::new(),
                "a b".into(),
                "x|y".into(),
                "<svg onload=alert(1)>".into(),
                "# title\n".into(),
                "caf\u{e9}".into(),
                "x".repeat(MAX_STUDY_NAME_CHARS + 1),
            ]),
        ],
    )
}

fn mode() -> impl Strategy<Value = Option<&'static str>> {
    prop::sample::select(vec![None, Some("symmetric"), Some("asymmetric")])
}

/// A width: mostly 2 to 8, sometimes anything from 0 to 10.
fn bits() -> BoxedStrategy<u32> {
    mostly(2u32..=8, 0u32..=10)
}

fn setting(group_size: impl Strategy<Value = u64>) -> impl Strategy<Value = Value> {
    (group_size, bits(), mode()).prop_map(|(g, bits, mode)| {
        let mut s = json!({ "group_size": g, "bits": bits });
        if let Some(mode) = mode {
            s["mode"] = mode.into();
        }
        s
    })
}

fn budget() -> impl Strategy<Value = Value> {
    (
        size(64),
        bits(),
        size(4),
        list(prop::sample::select(POLICIES.to_vec())),
    )
        .prop_map(|(g, low_bits, window, policies)| {
            json!({ "group_size": g, "low_bits": low_bits, "window": window,
                    "policies": policies })
        })
}

/// JSON-ish protocols: every field present (budget and timing optional), each mostly valid and
/// sometimes extreme. Valid lengths are 4 to 64 so that a focus or budget window of 1 to 4 fits.
fn any_protocol() -> impl Strategy<Value = Value> {
    let entropy = || mostly(0u64..=10_000, Just(u64::MAX));
    let calls = || mostly(0u64..=3, extreme_size());
    (
        (
            study_name(),
            list(mostly(0u64..1000, Just(u64::MAX))),
            list(mostly(4u64..=64, prop_oneof![large_size(), extreme_size()])),
            size(32),
            size(8),
            list(prop::sample::select(DISTRIBUTIONS.to_vec())),
        ),
        (
            size(4),
            prop::sample::select(vec![0.0f32, 1.0, -2.5, 3.0e38]),
            prop::collection::vec(setting(size(64)), 1..=3),
            prop::sample::select(vec!["numpy", "chacha20"]),
            (entropy(), entropy(), entropy()),
            prop::option::of(budget()),
            prop::option::of((calls(), calls(), any::<u64>())),
        ),
    )
        .prop_map(
            |(
                (study, seeds, tokens, features, queries, distributions),
                (window, gain, settings, generator, (sm, tm, offset), budget, timing),
            )| {
                let mut p = json!({
                    "study": study, "seeds": seeds, "tokens": tokens, "features": features,
                    "queries": queries, "distributions": distributions,
                    "focus": { "window": window, "gain": gain }, "settings": settings,
                    "generator": { "name": generator, "entropy":
                        { "seed_multiplier": sm, "tokens_multiplier": tm, "offset": offset } }
                });
                if let Some(budget) = budget {
                    p["budget"] = budget;
                }
                if let Some((warmup, repeats, shuffle_seed)) = timing {
                    p["timing"] = json!({ "warmup": warmup, "repeats": repeats,
                                          "shuffle_seed": shuffle_seed });
                }
                p
            },
        )
}

/// Elements of a padded grouped view of `rows` rows of `row_len` in groups of `group`, or None
/// past u128.
fn padded(rows: u128, row_len: u128, group: u128) -> Option<u128> {
    rows.checked_mul(row_len.div_ceil(group).checked_mul(group)?)
}

/// One archive member as this test counts it: name length and data bytes.
struct Member {
    name: usize,
    data: u128,
}

/// Every member of arrays.npz, recomputed from the protocol's fields in u128.
fn members(p: &Protocol) -> Vec<Member> {
    let (d, q) = (p.features as u128, p.queries as u128);
    let mut out = Vec::new();
    let mut push = |name: String, data: u128| {
        out.push(Member {
            name: name.len(),
            data,
        })
    };
    // One tensor stored as one segment of `len` tokens.
    let tensor = |push: &mut dyn FnMut(String, u128),
                  id: &str,
                  t: &str,
                  suffix: &str,
                  len: u128,
                  storage: Storage,
                  group: u128| {
        match storage {
            Storage::Quantized { bits, mode } => {
                let bits = u128::from(bits);
                let (rows, row_len) = if t == "k" { (d, len) } else { (len, d) };
                let groups = rows * row_len.div_ceil(group);
                let codes = padded(rows, row_len, group).unwrap();
                push(
                    format!("{id}_{t}_codes{suffix}"),
                    (codes * bits).div_ceil(8),
                );
                push(format!("{id}_{t}_scales{suffix}"), groups * 4);
                push(format!("{id}_{t}_shape{suffix}"), 8);
                if mode == Mode::Asymmetric {
                    push(
                        format!("{id}_{t}_zeros{suffix}"),
                        (groups * bits).div_ceil(8),
                    );
                }
            }
            Storage::Float32 => {
                push(format!("{id}_{t}_values{suffix}"), len * d * 4);
                push(format!("{id}_{t}_shape{suffix}"), 8);
            }
        }
    };
    let inputs: Vec<(String, u128)> = p
        .seeds
        .iter()
        .flat_map(|seed| {
            p.tokens.iter().flat_map(move |n| {
                p.distributions
                    .iter()
                    .map(move |dist| (format!("s{seed}_n{n}_{}", dist.name()), *n as u128))
            })
        })
        .collect();
    for (id, n) in &inputs {
        for (part, data) in [("q", q * d * 4), ("k", n * d * 4), ("v", n * d * 4)] {
            push(format!("{id}_{part}"), data);
        }
        push(format!("{id}_ref"), q * d * 8);
    }
    for (input, n) in &inputs {
        for s in &p.settings {
            let asym = if s.mode == Mode::Asymmetric {
                "_asym"
            } else {
                ""
            };
            let id = format!("{input}_g{}_b{}{asym}", s.group_size, s.bits);
            for t in ["k", "v"] {
                let storage = Storage::Quantized {
                    bits: s.bits,
                    mode: s.mode,
                };
                tensor(&mut push, &id, t, "", *n, storage, s.group_size as u128);
            }
            push(format!("{id}_out"), q * d * 8);
        }
        if let Some(b) = &p.budget {
            for policy in &b.policies {
                let id = format!("{input}_budget_{}", policy.name());
                let segments = policy.segments(*n as usize, b.window, b.low_bits);
                for t in ["k", "v"] {
                    for (i, seg) in segments.iter().enumerate() {
                        let len = (seg.end - seg.start) as u128;
                        let suffix = format!("_s{i}");
                        tensor(
                            &mut push,
                            &id,
                            t,
                            &suffix,
                            len,
                            seg.storage,
                            b.group_size as u128,
                        );
                    }
                }
                push(format!("{id}_out"), q * d * 8);
            }
        }
    }
    out
}

/// What every accepted protocol must satisfy, recomputed independently of the validator.
fn check_bounds(p: &Protocol) -> Result<(), TestCaseError> {
    let max = MAX_MATRIX_ELEMENTS as u128;
    let fits = |v: Option<u128>| v.is_some_and(|v| v <= max);
    let chars = p.study.chars().count();
    prop_assert!((1..=MAX_STUDY_NAME_CHARS).contains(&chars));
    prop_assert!(
        p.study
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    );
    let (d, q) = (p.features as u128, p.queries as u128);
    prop_assert!(q * d <= max, "q");
    let shortest = p.tokens.iter().min().copied().unwrap_or(0);
    for &n in &p.tokens {
        let n = n as u128;
        prop_assert!(n * d <= max, "k, v");
        prop_assert!(n <= i32::MAX as u128);
        for s in &p.settings {
            let g = s.group_size as u128;
            prop_assert!(fits(padded(d, n, g)), "K of {s:?} at N = {n}");
            prop_assert!(fits(padded(n, d, g)), "V of {s:?} at N = {n}");
        }
        if let Some(b) = &p.budget {
            prop_assert!(b.window >= 1 && b.window <= shortest);
            let g = b.group_size as u128;
            for policy in &b.policies {
                for seg in policy.segments(n as usize, b.window, b.low_bits) {
                    if let Storage::Quantized { .. } = seg.storage {
                        let len = (seg.end - seg.start) as u128;
                        prop_assert!(fits(padded(d, len, g)), "K segment {seg:?}");
                        prop_assert!(fits(padded(len, d, g)), "V segment {seg:?}");
                    }
                }
            }
        }
    }
    let members = members(p);
    prop_assert!(members.len() as u128 <= u128::from(MAX_NPZ_MEMBERS));
    // Local header 30 + central entry 46 + an .npy header of at most 128 + the name (with its
    // ".npy") twice + the data; then the 22-byte end record.
    let bytes: u128 = 22
        + members
            .iter()
            .map(|m| 30 + 46 + 128 + 2 * (m.name as u128 + 4) + m.data)
            .sum::<u128>();
    prop_assert!(bytes <= u128::from(MAX_NPZ_BYTES), "{bytes} bytes");
    if let Some(t) = &p.timing {
        let comparisons = p.seeds.len()
            * p.tokens.len()
            * p.distributions.len()
            * (p.settings.len() + p.budget.as_ref().map_or(0, |b| b.policies.len()));
        let calls = comparisons as u128 * 5 * t.repeats.max(t.warmup) as u128;
        prop_assert!(calls <= MAX_TIMED_CALLS as u128);
    }
    let e = p.generator.as_ref().unwrap().entropy;
    for &seed in &p.seeds {
        for &n in &p.tokens {
            let entropy = u128::from(seed)
                .checked_mul(e.seed_multiplier.into())
                .and_then(|a| a.checked_add((n as u128).checked_mul(e.tokens_multiplier.into())?))
                .and_then(|a| a.checked_add(e.offset.into()));
            prop_assert!(entropy.is_some());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn accepted_protocols_fit_every_bound(value in any_protocol()) {
        if let Ok(p) = Protocol::from_json(&value.to_string()) {
            check_bounds(&p)?;
        }
    }
}

/// Group sizes from 1 to u64::MAX; a small tensor cannot hold the largest.
fn extreme_group() -> impl Strategy<Value = u64> + Clone {
    prop_oneof![
        3 => prop::sample::select(vec![1u64, 2, 3, 5, 8, 16, 17, 32, 64, 100, 1000]),
        1 => prop::sample::select(vec![1u64 << 31, 1 << 32, 1 << 40, 1 << 62, u64::MAX]),
    ]
}

/// Small tensors (N <= 64, D <= 16, Q <= 4, one or two seeds, no timing) with extreme group
/// sizes, any width from 0 to 10 and both modes.
fn small_protocol() -> impl Strategy<Value = Value> {
    (
        prop::collection::btree_set(1u64..=64, 1..=2),
        1u64..=16,
        1u64..=4,
        prop::collection::btree_set(0u64..1000, 1..=2),
        prop::sample::subsequence(DISTRIBUTIONS.to_vec(), 1..=3),
        prop::collection::vec(setting(extreme_group()), 1..=3),
        prop::sample::select(vec!["numpy", "chacha20"]),
        prop::option::of((
            extreme_group(),
            bits(),
            prop::sample::subsequence(POLICIES.to_vec(), 1..=5),
        )),
        prop::sample::select(vec![0.0f32, 1.0, -3.5, 100.0]),
    )
        .prop_flat_map(
            |(tokens, features, queries, seeds, dists, settings, generator, budget, gain)| {
                let shortest = *tokens.iter().next().unwrap();
                (1..=shortest, 1..=shortest).prop_map(move |(focus, window)| {
                    let mut p = json!({
                        "study": "props", "seeds": seeds, "tokens": tokens,
                        "features": features, "queries": queries, "distributions": dists,
                        "focus": { "window": focus, "gain": gain }, "settings": settings,
                        "generator": { "name": generator, "entropy":
                            { "seed_multiplier": 1000, "tokens_multiplier": 1, "offset": 0 } }
                    });
                    if let Some((g, low_bits, policies)) = &budget {
                        p["budget"] = json!({ "group_size": g, "low_bits": low_bits,
                                              "window": window, "policies": policies });
                    }
                    p
                })
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn accepted_small_protocols_run_to_completion(value in small_protocol()) {
        let Ok(p) = Protocol::from_json(&value.to_string()) else {
            return Ok(());
        };
        check_bounds(&p)?;
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("run");
        let run = Run { protocol: &p, source: "props", shard: None, threads: 2 };
        let finished = run_protocol(&run, &out, |_| {});
        prop_assert!(finished.is_ok(), "{:?}", finished.err());
        let finished = finished.unwrap();
        prop_assert_eq!(finished.manifest.counts.comparisons, p.comparison_count());
        prop_assert!(!summary::render(&p, &finished.summary).is_empty());
        let planned = archive::members(&p);
        let file = std::fs::File::open(out.join(write::ARRAYS)).unwrap();
        let size = file.metadata().unwrap().len();
        let zip = zip::ZipArchive::new(file).unwrap();
        let names: BTreeSet<String> = zip.file_names().map(str::to_string).collect();
        let want: BTreeSet<String> = planned.iter().map(|m| format!("{}.npy", m.name)).collect();
        prop_assert_eq!(names.len(), planned.len());
        prop_assert_eq!(names, want);
        prop_assert!(size <= archive::estimated_bytes(&planned).unwrap());
    }
}

/// The frozen protocol's text up to (not including) its closing brace.
fn frozen_body() -> &'static str {
    &FROZEN[..FROZEN.rfind('}').unwrap()]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let text = String::from_utf8_lossy(&bytes);
        prop_assert!(Protocol::from_json(&text).is_err());
    }

    #[test]
    fn truncated_json_is_refused(cut in 0usize..10_000) {
        let body = frozen_body();
        let mut cut = cut % (body.len() + 1);
        while !body.is_char_boundary(cut) {
            cut -= 1;
        }
        prop_assert!(Protocol::from_json(&body[..cut]).is_err());
    }

    #[test]
    fn corrupted_json_never_panics(at in 0usize..10_000, byte in any::<u8>()) {
        let mut bytes = FROZEN.as_bytes().to_vec();
        let at = at % bytes.len();
        bytes[at] = byte;
        // Refused or (if the change keeps it valid) accepted and within bounds.
        if let Ok(p) = Protocol::from_json(&String::from_utf8_lossy(&bytes)) {
            check_bounds(&p)?;
        }
    }
}
