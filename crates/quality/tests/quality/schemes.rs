//! Named schemes of the literature (`kvschemes`) as the cache, on a tiny random Llama with
//! SmolLM2's head size (no download): llama.cpp's per-token types store the same bytes and give
//! the same logits under every schedule; KIVI reads its residual in f32 (a text shorter than it
//! gives the plain pass's bits), bills what it stores, and differs between prefill and streaming;
//! quanto quantizes a prefill at once and keeps a residual while decoding.

use kvschemes::Scheme;
use models::llama::{Llama, LlamaConfig};
use quality::{CacheSpec, KvSetting, Measurement, Policy, QualityError, Schedule, SchemeSpec};

/// 1 layer, hidden 128, 2 query heads and 1 KV head of 64 (SmolLM2's head size), FFN 64,
/// vocabulary 30, context 512.
fn tiny() -> Llama {
    let config = LlamaConfig {
        layers: 1,
        hidden: 128,
        heads: 2,
        kv_heads: 1,
        head_dim: 64,
        ffn: 64,
        vocab: 30,
        context: 512,
        rope_base: 10000.0,
        rms_eps: 1e-5,
    };
    crate::tiny::random_llama(config, 0x9e37_79b9_7f4a_7c15)
}

fn ids(n: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7 + i / 3) % 30) as u32).collect()
}

fn measure(model: &Llama, ids: &[u32], scheme: &str, schedule: Schedule) -> Measurement {
    let spec = SchemeSpec::new(scheme.parse().unwrap(), schedule).unwrap();
    quality::measure(model, ids, spec, |_| {}).unwrap()
}

#[test]
fn llama_cpp_types_store_the_same_bytes_and_logits_under_every_schedule() {
    let model = tiny();
    let ids = ids(40);
    for scheme in Scheme::all()
        .into_iter()
        .filter(|s| matches!(s, Scheme::LlamaCpp { .. }))
    {
        let name = scheme.to_string();
        let prefill = measure(&model, &ids, &name, Schedule::Prefill);
        for schedule in [Schedule::Causal, Schedule::Streaming] {
            let other = measure(&model, &ids, &name, schedule);
            assert_eq!(
                other.bytes_per_token, prefill.bytes_per_token,
                "{name} {schedule}"
            );
            assert_eq!(
                other.nll.to_bits(),
                prefill.nll.to_bits(),
                "{name} {schedule}"
            );
            assert_eq!(
                other.kl_max.to_bits(),
                prefill.kl_max.to_bits(),
                "{name} {schedule}"
            );
        }
        // Blocks of 32 values: 18, 20, 22 or 34 bytes each, nothing else.
        let Scheme::LlamaCpp { ty, .. } = scheme else {
            unreachable!()
        };
        assert_eq!(
            prefill.bytes_per_token,
            (2 * 2 * ty.block_bytes()) as f64,
            "{name}"
        );
        assert_eq!(
            prefill.bits_per_element,
            ty.block_bytes() as f64 / 4.0,
            "{name}"
        );
        assert_eq!(prefill.scheme.as_deref(), Some(name.as_str()));
        assert_eq!((prefill.setting, prefill.policy), (None, None));
        assert!(prefill.kl_mean > 0.0, "{name}");
    }
}

#[test]
fn kivi_reads_its_residual_in_f32_and_bills_what_it_stores() {
    let model = tiny();
    // Shorter than the residual of 128: nothing is quantized, the plain pass's bits.
    let short = ids(100);
    for schedule in [Schedule::Prefill, Schedule::Streaming] {
        let m = measure(&model, &short, "kivi2", schedule);
        assert_eq!((m.nll.to_bits(), m.kl_max), (m.nll_f32.to_bits(), 0.0));
        assert_eq!(m.bits_per_element, 32.0);
    }
    // 300 tokens: K 256 quantized (8 groups of 32 tokens per channel) and 44 in the residual;
    // V 172 quantized (2 groups of 32 channels per token) and the last 128 in the residual.
    let long = ids(300);
    let prefill = measure(&model, &long, "kivi4", Schedule::Prefill);
    let groups = 64 * 256 / 32 + 172 * 64 / 32;
    let stored = groups * (4 * 32 / 8 + 2 + 2) + (44 + 128) * 64 * 4;
    assert_eq!(prefill.bytes_per_token, stored as f64 / 300.0);
    let streaming = measure(&model, &long, "kivi4", Schedule::Streaming);
    assert_eq!(streaming.bytes_per_token, prefill.bytes_per_token);
    assert_ne!(streaming.nll.to_bits(), prefill.nll.to_bits());
    let two = measure(&model, &long, "kivi2", Schedule::Prefill);
    assert!(two.kl_mean > prefill.kl_mean && prefill.kl_mean > 0.0);
}

#[test]
fn quanto_bills_every_prefill_token_and_keeps_a_residual_while_decoding() {
    let model = tiny();
    let ids = ids(300);
    let prefill = measure(&model, &ids, "hf-quanto4", Schedule::Prefill);
    // 300 groups of 64 (one per token) for K and for V: 2 codes a byte, f32 scale and shift.
    assert_eq!(
        prefill.bytes_per_token,
        (2 * (300 * 32 + 300 * 8)) as f64 / 300.0
    );
    assert_eq!(prefill.bits_per_element, 5.0);
    let streaming = measure(&model, &ids, "hf-quanto4", Schedule::Streaming);
    // After 300 tokens 257 are quantized (groups packed 2 to a byte) and 43 are f32.
    let stored = 2 * (257usize.div_ceil(2) * 64 + 257 * 8 + 43 * 64 * 4);
    assert_eq!(streaming.bytes_per_token, stored as f64 / 300.0);
    assert_ne!(streaming.nll.to_bits(), prefill.nll.to_bits());
    assert!(streaming.kl_mean < prefill.kl_mean);
}

#[test]
fn the_codec_as_a_scheme_is_the_codec_setting_bit_for_bit() {
    let model = tiny();
    let ids = ids(77);
    for (scheme, setting) in [
        ("kvpack-k4v4", "g32_b4"),
        ("kvpack-k3v3-asym", "g32_b3_asym"),
    ] {
        for schedule in [Schedule::Prefill, Schedule::Streaming] {
            let named = measure(&model, &ids, scheme, schedule);
            let setting: KvSetting = setting.parse().unwrap();
            let spec = CacheSpec::new(setting, Policy::Uniform, schedule).unwrap();
            let plain = quality::measure(&model, &ids, spec, |_| {}).unwrap();
            assert_eq!(
                named.nll.to_bits(),
                plain.nll.to_bits(),
                "{scheme} {schedule}"
            );
            assert_eq!(
                named.kl_max.to_bits(),
                plain.kl_max.to_bits(),
                "{scheme} {schedule}"
            );
            assert_eq!(
                named.bytes_per_token, plain.bytes_per_token,
                "{scheme} {schedule}"
            );
        }
    }
    // On a one-layer model that layer is an edge: -edge8 is K8V8 there.
    let edge = measure(&model, &ids, "kvpack-k4v2-edge8", Schedule::Prefill);
    let eight = measure(&model, &ids, "kvpack-k8v8", Schedule::Prefill);
    assert_eq!(edge.nll.to_bits(), eight.nll.to_bits());
    assert_eq!(edge.bytes_per_token, eight.bytes_per_token);
    // Sinks: the first 4 tokens f32 in K and V, the 73 after them one codec tensor each.
    let sink = measure(&model, &ids, "kvpack-k8v4-sink4", Schedule::Prefill);
    // K: 8-bit codes of 3 groups of 32 tokens (the last zero-padded) x 64 channels, an f32
    // scale per group, the 8-byte shape; V: 4-bit codes, an f32 scale per 32 channels.
    let k = 96usize * 64 + 3 * 64 * 4 + 8;
    let v = 73usize * 64 / 2 + 73 * 2 * 4 + 8;
    assert_eq!(sink.bytes_per_token, (k + v + 2 * 4 * 64 * 4) as f64 / 77.0);
}

#[test]
fn kivi_and_quanto_under_the_causal_schedule_are_refused_by_name() {
    let err = SchemeSpec::new("hf-quanto2".parse().unwrap(), Schedule::Causal).unwrap_err();
    assert!(matches!(err, QualityError::SchemeSchedule { .. }));
    let err = SchemeSpec::new("kivi4".parse().unwrap(), Schedule::Causal).unwrap_err();
    assert!(matches!(err, QualityError::SchemeSchedule { .. }));
    assert!(
        err.to_string()
            .contains("keeps its own full-precision residual"),
        "{err}"
    );
}

/// KVQuant reads a calibration fitted on another text; every token is quantized on arrival, so
/// the three schedules store the same bytes and give the same logits; its bytes are its layer
/// cache's; without a calibration, or with another width's, it is refused.
#[test]
fn kvquant_is_calibrated_on_another_text_and_reads_the_same_under_every_schedule() {
    let model = tiny();
    let calibration_ids: Vec<u32> = (0..200).map(|i| ((i * 11 + 5) % 30) as u32).collect();
    let scheme: Scheme = "kvquant3-first1".parse().unwrap();
    let Scheme::KvQuant(kvquant) = scheme else {
        unreachable!()
    };
    let fitted = quality::scheme::calibrate(&model, &calibration_ids, &[kvquant, kvquant]).unwrap();
    assert_eq!(fitted.len(), 1, "one calibration per distinct scheme");
    let calibration = fitted[0].1.clone();
    assert_eq!(calibration.layers[0].key_levels.len(), 8);
    let ids = ids(60);
    let run = |schedule| {
        let spec = SchemeSpec::new(scheme, schedule)
            .unwrap()
            .with_calibration(calibration.clone())
            .unwrap();
        quality::measure(&model, &ids, spec, |_| {}).unwrap()
    };
    let prefill = run(Schedule::Prefill);
    for schedule in [Schedule::Streaming, Schedule::Causal] {
        let other = run(schedule);
        assert_eq!(other.nll.to_bits(), prefill.nll.to_bits(), "{schedule}");
        assert_eq!(other.bytes_per_token, prefill.bytes_per_token, "{schedule}");
    }
    assert!(prefill.kl_mean > 0.0);
    // 3-bit codes for 59 of 60 tokens and more: outliers, counts, value ranges, the first
    // token in fp16 and the layer's calibration.
    assert!(prefill.bits_per_element > 3.0 && prefill.bits_per_element < 6.0);

    let bare = SchemeSpec::new(scheme, Schedule::Prefill).unwrap();
    let err = quality::measure(&model, &ids, bare.clone(), |_| {}).unwrap_err();
    assert!(
        err.to_string().contains("calibrated on another text"),
        "{err}"
    );
    let other: Scheme = "kvquant4-first1".parse().unwrap();
    let err = SchemeSpec::new(other, Schedule::Prefill)
        .unwrap()
        .with_calibration(calibration.clone())
        .unwrap_err();
    assert!(err.to_string().contains("fitted at 3 bits"), "{err}");
    let err = SchemeSpec::new("kivi4".parse().unwrap(), Schedule::Prefill)
        .unwrap()
        .with_calibration(calibration)
        .unwrap_err();
    assert!(err.to_string().contains("does not fit it"), "{err}");
}
