//! The validator's refusals, one condition at a time, each naming its field.

use super::*;
use crate::protocol::Mode;

fn with(edit: impl FnOnce(&mut serde_json::Value)) -> Result<Protocol, ProtocolError> {
    let mut value: serde_json::Value = serde_json::from_str(FROZEN).unwrap();
    edit(&mut value);
    Protocol::from_json(&value.to_string())
}

fn err(edit: impl FnOnce(&mut serde_json::Value)) -> ProtocolError {
    with(edit).unwrap_err()
}

fn parse_field(err: &ProtocolError) -> Option<&str> {
    match err {
        ProtocolError::Parse { field, .. } => Some(field),
        _ => None,
    }
}

#[test]
fn frozen_protocol_has_144_comparisons() {
    let p = Protocol::frozen();
    assert_eq!(p.inputs().len(), 18);
    assert_eq!(p.comparison_count(), 144);
    assert_eq!(
        p.generator.as_ref().unwrap().entropy.entropy(7, 128),
        Some(70128)
    );
    assert_eq!(p.inputs()[0].id(), "s7_n128_clean");
}

#[test]
fn unknown_fields_wrong_types_and_unknown_names_are_parse_errors_naming_the_field() {
    // serde_path_to_error names an unknown field by its own path.
    assert_eq!(
        parse_field(&err(|v| v["colour"] = 3.into())),
        Some("colour")
    );
    for (edit, field) in [
        (
            Box::new(|v: &mut serde_json::Value| v["focus"]["width"] = 3.into())
                as Box<dyn FnOnce(&mut serde_json::Value)>,
            "focus.width",
        ),
        (Box::new(|v| v["seeds"][1] = (-19).into()), "seeds[1]"),
        (
            Box::new(|v| v["generator"]["entropy"]["offset"] = 2.5.into()),
            "generator.entropy.offset",
        ),
        (
            Box::new(|v| v["generator"]["entropy"]["seed_multiplier"] = (-1).into()),
            "generator.entropy.seed_multiplier",
        ),
        (
            Box::new(|v| v["distributions"][0] = "spiky".into()),
            "distributions[0]",
        ),
        (
            Box::new(|v| v["generator"]["name"] = "mt19937".into()),
            "generator.name",
        ),
        (
            Box::new(|v| v["budget"]["policies"][0] = "recent4".into()),
            "budget.policies[0]",
        ),
        (
            Box::new(|v| v["budget"]["group_size"] = (-32).into()),
            "budget.group_size",
        ),
        (
            Box::new(|v| v["timing"]["warmup"] = 1.5.into()),
            "timing.warmup",
        ),
        (
            Box::new(|v| v["settings"][0]["mode"] = "nf4".into()),
            "settings[0].mode",
        ),
    ] {
        assert_eq!(parse_field(&err(edit)), Some(field));
    }
}

#[test]
fn empty_duplicate_and_zero_values_are_named() {
    let field = |f: &str| f.to_string();
    assert_eq!(
        err(|v| v["seeds"] = serde_json::json!([])),
        ProtocolError::Empty {
            field: field("seeds")
        }
    );
    assert_eq!(
        err(|v| v["budget"]["policies"] = serde_json::json!([])),
        ProtocolError::Empty {
            field: field("budget.policies")
        }
    );
    assert_eq!(
        err(|v| v["tokens"] = serde_json::json!([128, 128])),
        ProtocolError::Duplicate {
            field: field("tokens"),
            item: "128".into()
        }
    );
    for (edit, name) in [
        (
            Box::new(|v: &mut serde_json::Value| v["tokens"][0] = 0.into())
                as Box<dyn FnOnce(&mut serde_json::Value)>,
            "tokens[0]",
        ),
        (Box::new(|v| v["features"] = 0.into()), "features"),
        (Box::new(|v| v["queries"] = 0.into()), "queries"),
        (
            Box::new(|v| v["budget"]["window"] = 0.into()),
            "budget.window",
        ),
        (
            Box::new(|v| v["timing"]["repeats"] = 0.into()),
            "timing.repeats",
        ),
    ] {
        assert_eq!(err(edit), ProtocolError::Zero { field: field(name) });
    }
}

#[test]
fn widths_group_sizes_and_windows_are_held_to_the_codec_and_the_lengths() {
    use kvcodec::{KvError, Mode};
    let layout = |e: ProtocolError| match e {
        ProtocolError::Layout { field, source } => (field, source),
        other => panic!("not a layout refusal: {other:?}"),
    };
    // A setting is refused as it is read (`KvSetting`), naming the setting and the codec's
    // reason.
    let refused_setting = |e: ProtocolError, want: KvError| match e {
        ProtocolError::Parse { field, message } => {
            assert!(message.starts_with(&want.to_string()), "{message}");
            field
        }
        other => panic!("not a refusal of the setting: {other:?}"),
    };
    let symmetric = |bits| KvError::UnsupportedBits {
        bits,
        mode: Mode::Symmetric,
    };
    assert_eq!(
        refused_setting(err(|v| v["settings"][2]["bits"] = 9.into()), symmetric(9)),
        "settings[2]"
    );
    assert_eq!(
        refused_setting(
            err(|v| v["settings"][0]["group_size"] = 0.into()),
            KvError::ZeroGroupSize
        ),
        "settings[0]"
    );
    // A group size above the codec's maximum is refused at the field itself, before any view
    // is computed from it.
    assert_eq!(
        refused_setting(
            err(|v| v["settings"][1]["group_size"] = (1u64 << 32).into()),
            KvError::GroupSizeTooLarge {
                group_size: 1 << 32,
                max: kvcodec::MAX_GROUP_SIZE
            }
        ),
        "settings[1].group_size"
    );
    // Symmetric 1-bit has no code besides zero; asymmetric 1-bit does.
    assert_eq!(
        refused_setting(err(|v| v["settings"][0]["bits"] = 1.into()), symmetric(1)),
        "settings[0]"
    );
    assert_eq!(
        layout(err(|v| v["budget"]["low_bits"] = 1.into())),
        (
            "budget.low_bits".into(),
            KvError::UnsupportedBits {
                bits: 1,
                mode: Mode::Symmetric
            }
        )
    );
    // A budget group size the layout accepts but no setting can have (found by a property
    // test: making the budget's setting later panicked).
    assert_eq!(
        layout(err(|v| v["budget"]["group_size"] = (1u64 << 62).into())),
        (
            "budget.group_size".into(),
            KvError::GroupSizeTooLarge {
                group_size: 1 << 62,
                max: kvcodec::MAX_GROUP_SIZE
            }
        )
    );
    assert_eq!(
        err(|v| v["focus"]["window"] = 1000.into()),
        ProtocolError::WindowTooLong {
            field: "focus.window".into(),
            window: 1000,
            shortest: 128
        }
    );
    assert_eq!(
        err(|v| v["budget"]["window"] = 129.into()),
        ProtocolError::WindowTooLong {
            field: "budget.window".into(),
            window: 129,
            shortest: 128
        }
    );
    let p = with(|v| {
        v.as_object_mut().unwrap().remove("budget");
        v.as_object_mut().unwrap().remove("timing");
    })
    .unwrap();
    assert_eq!(p.comparison_count(), 72);
}

#[test]
fn settings_take_any_width_and_an_optional_mode() {
    let p = with(|v| {
        v["settings"] = serde_json::json!([
            { "group_size": 32, "bits": 3 },
            { "group_size": 32, "bits": 2, "mode": "asymmetric" },
            { "group_size": 16, "bits": 1, "mode": "asymmetric" }
        ])
    })
    .unwrap();
    assert_eq!(p.settings[0].mode(), Mode::Symmetric);
    assert_eq!(p.settings[1].label(), "g32_b2_asym");
    // A symmetric setting serializes as before, with no mode field.
    let text = serde_json::to_string(&p.settings[0]).unwrap();
    assert_eq!(text, r#"{"group_size":32,"bits":3}"#);
}

#[test]
fn sizes_that_would_exhaust_memory_are_refused_by_field() {
    assert_eq!(
        err(|v| v["features"] = (1u64 << 40).into()),
        ProtocolError::MatrixTooLarge {
            field: "tokens[0]".into(),
            rows: 128,
            features: 1 << 40
        }
    );
    let e = err(|v| {
        v["tokens"] = serde_json::json!([i32::MAX]);
        v["features"] = (1u64 << 62).into();
    });
    assert_eq!(e.field(), "tokens[0]");
    assert_eq!(
        err(|v| v["queries"] = (1u64 << 30).into()),
        ProtocolError::MatrixTooLarge {
            field: "queries".into(),
            rows: 1 << 30,
            features: 32
        }
    );
    assert_eq!(
        err(|v| v["timing"]["repeats"] = 1_000_000_000_000_000u64.into()),
        ProtocolError::TooManyCalls {
            comparisons: 144,
            calls: 1_000_000_000_000_000
        }
    );
}

#[test]
fn entropy_overflow_is_refused() {
    let e = err(|v| {
        v["seeds"] = serde_json::json!([u64::MAX]);
        v["generator"]["entropy"]["seed_multiplier"] = u64::MAX.into();
        v["generator"]["entropy"]["tokens_multiplier"] = u64::MAX.into();
    });
    assert_eq!(
        e,
        ProtocolError::EntropyOverflow {
            seed: u64::MAX,
            tokens: 128
        }
    );
}

/// A small valid protocol to edit: one seed, one length, clean only, one setting.
fn small(edit: impl FnOnce(&mut serde_json::Value)) -> Result<Protocol, ProtocolError> {
    let mut value = serde_json::json!({
        "study": "bounds",
        "seeds": [1],
        "tokens": [16],
        "features": 4,
        "queries": 1,
        "distributions": ["clean"],
        "focus": { "window": 1, "gain": 1.0 },
        "settings": [ { "group_size": 4, "bits": 4 } ],
        "generator": { "name": "chacha20",
                       "entropy": { "seed_multiplier": 1, "tokens_multiplier": 1, "offset": 0 } }
    });
    edit(&mut value);
    Protocol::from_json(&value.to_string())
}

fn field(err: &ProtocolError) -> &str {
    err.field()
}

#[test]
fn at_most_100_configurations_each_distinct_in_the_chart() {
    let settings = |n: usize| -> Vec<serde_json::Value> {
        (1..=n)
            .map(|g| serde_json::json!({ "group_size": g, "bits": 4 }))
            .collect()
    };
    assert!(small(|v| v["settings"] = settings(100).into()).is_ok());
    let err = small(|v| v["settings"] = settings(101).into()).unwrap_err();
    assert_eq!(err, ProtocolError::TooManyConfigurations { count: 101 });
    assert_eq!(err.field(), "settings");
    // Budget policies are configurations too.
    let err = small(|v| {
        v["settings"] = settings(99).into();
        v["budget"] = serde_json::json!({ "group_size": 4, "low_bits": 4, "window": 4,
            "policies": ["uniform", "recent8"] });
    })
    .unwrap_err();
    assert_eq!(err, ProtocolError::TooManyConfigurations { count: 101 });
}

#[test]
fn a_focus_gain_must_be_finite_and_not_negative() {
    for gain in [0.0, 0.5, 2.0, 1e6] {
        assert!(
            small(|v| v["focus"]["gain"] = gain.into()).is_ok(),
            "{gain}"
        );
    }
    for gain in [-2.0, -1e-30] {
        let err = small(|v| v["focus"]["gain"] = gain.into()).unwrap_err();
        assert!(
            matches!(err, ProtocolError::GainInvalid { .. }),
            "{gain}: {err:?}"
        );
        assert_eq!(err.field(), "focus.gain");
    }
    // Beyond f32 (JSON has no NaN or infinity) the parser refuses it, naming the field too.
    let err = small(|v| v["focus"]["gain"] = 1e39.into()).unwrap_err();
    assert_eq!(err.field(), "focus.gain", "{err:?}");
}

#[test]
fn study_names_are_one_to_64_plain_ascii_characters() {
    for name in ["a", "packed-kv", "widths_and.modes-2", &"x".repeat(64)] {
        assert!(small(|v| v["study"] = name.into()).is_ok(), "{name:?}");
    }
    let long = "x".repeat(65);
    for name in [
        "",
        " ",
        "a b",
        "x|y",
        "a\nb",
        "<b>",
        "# h",
        "*x*",
        "caf\u{e9}",
        &long,
    ] {
        let err = small(|v| v["study"] = name.into()).unwrap_err();
        assert_eq!(err.field(), "study", "{name:?}: {err:?}");
    }
}

#[test]
fn group_sizes_far_longer_than_the_tensor_are_refused_by_field_and_length() {
    // K at N = 16, D = 4: 4 rows of 16 tokens padded to one group of g codes. A group size the
    // codec takes (at most 2^27) but whose view is too large is refused by the view's bound...
    for g in [1u64 << 26, 1 << 27] {
        let err = small(|v| v["settings"][0]["group_size"] = g.into()).unwrap_err();
        assert_eq!(
            err,
            ProtocolError::GroupedViewTooLarge {
                field: "settings[0].group_size".into(),
                group_size: g as usize,
                tokens: 16,
                segment: (0, 16),
                tensor: "K",
                rows: 4,
                padded_row_len: Some(g),
            }
        );
    }
    // ... and one above the codec's maximum as it is read, at the same field.
    for g in [(1u64 << 27) + 1, 1 << 32, 1 << 62, u64::MAX] {
        let err = small(|v| v["settings"][0]["group_size"] = g.into()).unwrap_err();
        assert!(
            matches!(&err, ProtocolError::Parse { field, message }
                if field == "settings[0].group_size"
                    && message.starts_with(&format!("group size {g} is above 134217728"))),
            "{err:?}"
        );
    }
    // The second setting at the second length: V is 1000 rows of one padded group of 2^20
    // (at N = 16 both fit).
    let err = small(|v| {
        v["tokens"] = serde_json::json!([16, 1000]);
        v["settings"] = serde_json::json!([{ "group_size": 4, "bits": 4 },
                                           { "group_size": 1 << 20, "bits": 8 }]);
    })
    .unwrap_err();
    assert!(
        matches!(&err, ProtocolError::GroupedViewTooLarge {
            field, tokens: 1000, tensor: "V", rows: 1000, padded_row_len: Some(0x10_0000), ..
        } if field == "settings[1].group_size"),
        "{err:?}"
    );
    let err = small(|v| {
        v["budget"] = serde_json::json!({ "group_size": 1u64 << 27, "low_bits": 4,
                                          "window": 4, "policies": ["recent8"] });
    })
    .unwrap_err();
    // The first stored segment of recent8 is the low-precision tokens 0..12.
    assert!(
        matches!(&err, ProtocolError::GroupedViewTooLarge {
            field, tokens: 16, segment: (0, 12), tensor: "K", ..
        } if field == "budget.group_size"),
        "{err:?}"
    );
    // The 8-bit window segment alone is checked too (early8 with the window the whole
    // cache stores one 8-bit segment).
    let err = small(|v| {
        v["budget"] = serde_json::json!({ "group_size": 1u64 << 27, "low_bits": 4,
                                          "window": 16, "policies": ["early8"] });
    })
    .unwrap_err();
    assert!(
        matches!(
            &err,
            ProtocolError::GroupedViewTooLarge {
                segment: (0, 16),
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn a_padded_grouped_view_of_exactly_the_limit_is_accepted() {
    // D = 1, N = 1: K and V are each 1 row of one group of g codes.
    let limit = MAX_MATRIX_ELEMENTS as u64;
    let at = |g: u64| {
        small(|v| {
            v["features"] = 1.into();
            v["tokens"] = serde_json::json!([1]);
            v["settings"][0]["group_size"] = g.into();
        })
    };
    assert!(at(limit).is_ok());
    // One more is above the codec's maximum group size (the limit itself).
    assert!(matches!(
        at(limit + 1),
        Err(ProtocolError::Parse { field, .. }) if field == "settings[0].group_size"
    ));
    // With two features K is 2 rows: half the limit fits, one more does not.
    let at2 = |g: u64| {
        small(|v| {
            v["features"] = 2.into();
            v["tokens"] = serde_json::json!([1]);
            v["settings"][0]["group_size"] = g.into();
        })
    };
    assert!(at2(limit / 2).is_ok());
    assert!(matches!(
        at2(limit / 2 + 1),
        Err(ProtocolError::GroupedViewTooLarge { rows: 2, padded_row_len: Some(p), .. })
            if p == limit / 2 + 1
    ));
}

#[test]
fn arrays_npz_stays_a_plain_zip() {
    // 9 asymmetric settings store 9 members each, + 4 per input: 85 per input; 257 seeds
    // x 3 distributions = 771 inputs hold exactly 65,535 members.
    let with_seeds = |seeds: u64| {
        small(|v| {
            v["seeds"] = (0..seeds).collect::<Vec<_>>().into();
            v["distributions"] = serde_json::json!(["clean", "early_focus", "recent_focus"]);
            v["settings"] = (1..=9)
                .map(|g| serde_json::json!({ "group_size": g, "bits": 4, "mode": "asymmetric" }))
                .collect::<Vec<_>>()
                .into();
        })
    };
    let p = with_seeds(257).unwrap();
    assert_eq!(archive::member_count(&p), Some(MAX_NPZ_MEMBERS));
    assert_eq!(archive::members(&p).len() as u64, MAX_NPZ_MEMBERS);
    assert_eq!(
        with_seeds(258),
        Err(ProtocolError::TooManyMembers {
            members: Some(258 * 3 * 85)
        })
    );
    // 20 inputs with K and V of 2^27 float32 values each: about 20 GiB.
    let err = small(|v| {
        v["seeds"] = (0..20).collect::<Vec<_>>().into();
        v["tokens"] = serde_json::json!([1 << 14]);
        v["features"] = (1 << 13).into();
        v["settings"][0]["group_size"] = 64.into();
    })
    .unwrap_err();
    assert!(
        matches!(err, ProtocolError::ArchiveTooLarge { bytes: Some(b) } if b > 20 << 30),
        "{err:?}"
    );
}

#[test]
fn every_refusal_names_what_to_change() {
    // One Display check per new variant; the others are covered above by field.
    let view = small(|v| v["settings"][0]["group_size"] = (1u64 << 27).into()).unwrap_err();
    assert_eq!(
        view.to_string(),
        "protocol field `settings[0].group_size`: group size 134217728 at N = 16: \
         K would be stored as 4 rows x 134,217,728 padded codes, more than \
         134,217,728 elements"
    );
    let members = ProtocolError::TooManyMembers { members: None };
    assert_eq!(
        members.to_string(),
        "arrays.npz would hold more than 2^64 members; a plain ZIP holds at most 65,535 \
         (fewer seeds, lengths, distributions, settings or policies)"
    );
    let bytes = ProtocolError::ArchiveTooLarge {
        bytes: Some(1 << 32),
    };
    assert_eq!(
        bytes.to_string(),
        "arrays.npz would take about 4,294,967,296 bytes; a plain ZIP (no ZIP64) must stay \
         below 4,294,967,296 bytes"
    );
    assert_eq!(field(&view), "settings[0].group_size");
}
