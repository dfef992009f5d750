//! SmolLM2-135M-Instruct with its cache held by the KV codec, against the public reference
//! (`shared/reference/real-models/smollm2/README.md`, "Perplexity reference", arrays `nll_*`,
//! `kl_*` of `crates/models/tests/data/smollm2/smollm2_public.npz`) and against an independent
//! NumPy computation on a second text (`tests/data/quality_check.py`, `quality_check.npz`). The
//! model is fetched by `scripts/fetch-models` on first use.

use std::fs::File;
use std::path::PathBuf;
use std::sync::OnceLock;

use models::llama::{self, Llama};
use models::tokenizer::bpe::Bpe;
use models::{ModelName, files};
use ndarray::{Array1, Ix0, Ix1, OwnedRepr};
use ndarray_npy::NpzReader;
use quality::{CacheSpec, KvSetting, Measurement, Policy, Schedule};

fn model() -> &'static (Llama, Bpe) {
    static MODEL: OnceLock<(Llama, Bpe)> = OnceLock::new();
    MODEL.get_or_init(|| {
        let files = files::locate_or_fetch(ModelName::SmolLm2).expect("SmolLM2 files");
        llama::load_with_tokenizer(&files).expect("SmolLM2 loads")
    })
}

struct Npz(NpzReader<File>);

impl Npz {
    fn open(path: PathBuf) -> Npz {
        Npz(NpzReader::new(File::open(path).expect("npz")).expect("npz"))
    }
    fn scalar(&mut self, name: &str) -> f64 {
        let x = self.0.by_name::<OwnedRepr<f64>, Ix0>(name).unwrap();
        x.into_scalar()
    }
    fn vector(&mut self, name: &str) -> Vec<f64> {
        let x = self.0.by_name::<OwnedRepr<f64>, Ix1>(name).unwrap();
        x.to_vec()
    }
    fn ids(&mut self) -> Vec<u32> {
        let ids: Array1<i64> = self.0.by_name::<OwnedRepr<i64>, Ix1>("ids").unwrap();
        ids.iter().map(|&id| u32::try_from(id).unwrap()).collect()
    }
}

fn run(ids: &[u32], setting: &str, schedule: Schedule) -> Measurement {
    let setting: KvSetting = setting.parse().unwrap();
    let spec = CacheSpec::new(setting, Policy::Uniform, schedule).unwrap();
    let m = quality::measure(&model().0, ids, spec, |_| {}).unwrap();
    eprintln!(
        "{:?} {}: {} tokens, nll_f32 {:.6}, nll {:.6}, kl_mean {:.6}, kl_max {:.6}, top1 {:.4}",
        m.setting, m.schedule, m.tokens, m.nll_f32, m.nll, m.kl_mean, m.kl_max, m.top1_agreement
    );
    m
}

#[test]
fn the_reference_text_gives_the_public_nll_and_kl() {
    let mut npz = Npz::open(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../models/tests/data/smollm2/smollm2_public.npz"),
    );
    let ids = model().1.encode("The capital of France is").unwrap();
    assert_eq!(ids, npz.ids());
    let prefill = run(&ids, "g32_b4", Schedule::Prefill);
    let nll_full = npz.scalar("nll_full");
    assert!(
        ((prefill.nll_f32 - nll_full) / nll_full).abs() < 1e-5,
        "{} vs {nll_full}",
        prefill.nll_f32
    );
    let (nll, kl) = (npz.scalar("nll_q4_prefill"), npz.scalar("kl_q4_prefill"));
    assert!((prefill.nll - nll).abs() < 2e-3, "{} vs {nll}", prefill.nll);
    assert!(
        (prefill.kl_mean - kl).abs() < 2e-3,
        "{} vs {kl}",
        prefill.kl_mean
    );
    // Per position too (i predicts t_(i+1)).
    let close = |mine: Vec<f64>, name: &str, npz: &mut Npz| {
        let reference = npz.vector(name);
        assert_eq!(mine.len(), reference.len());
        for (a, b) in mine.iter().zip(&reference) {
            assert!((a - b).abs() < 2e-3, "{name}: {mine:?} vs {reference:?}");
        }
    };
    let minus = |xs: &[f64]| xs.iter().map(|x| -x).collect::<Vec<_>>();
    close(minus(&prefill.positions.logp_f32), "nll_full_pos", &mut npz);
    close(
        minus(&prefill.positions.logp),
        "nll_q4_prefill_pos",
        &mut npz,
    );
    close(prefill.positions.kl.clone(), "kl_q4_prefill_pos", &mut npz);
    let causal = run(&ids, "g32_b4", Schedule::Causal);
    close(minus(&causal.positions.logp), "nll_q4_causal_pos", &mut npz);
    close(causal.positions.kl.clone(), "kl_q4_causal_pos", &mut npz);
    let (nll, kl) = (npz.scalar("nll_q4_causal"), npz.scalar("kl_q4_causal"));
    assert!((causal.nll - nll).abs() < 2e-3, "{} vs {nll}", causal.nll);
    assert!(
        (causal.kl_mean - kl).abs() < 2e-3,
        "{} vs {kl}",
        causal.kl_mean
    );
    // Streaming: 5 tokens never fill a K group, so K stays float32 and only V is packed.
    let streaming = run(&ids, "g32_b4", Schedule::Streaming);
    assert_eq!(streaming.nll_f32, prefill.nll_f32);
    assert!(streaming.kl_mean < prefill.kl_mean);
}

#[test]
fn a_second_text_matches_an_independent_numpy_computation() {
    let mut npz =
        Npz::open(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/quality_check.npz"));
    let ids = npz.ids();
    assert!(ids.len() >= 50, "{} tokens", ids.len());
    let m = run(&ids, "g32_b4", Schedule::Prefill);
    let nll_f32 = npz.scalar("nll_f32");
    assert!(
        (m.nll_f32 - nll_f32).abs() < 1e-4,
        "{} vs {nll_f32}",
        m.nll_f32
    );
    let (nll, kl) = (npz.scalar("nll_q4_prefill"), npz.scalar("kl_q4_prefill"));
    assert!((m.nll - nll).abs() < 2e-3, "{} vs {nll}", m.nll);
    assert!((m.kl_mean - kl).abs() < 2e-3, "{} vs {kl}", m.kl_mean);
}

#[test]
fn the_float32_distributions_recomputed_from_the_hidden_stream_are_the_kept_rows() {
    use models::CausalLm;
    use quality::reference::{Reference, blocks};
    let (model, bpe) = model();
    // 150 ids: two whole blocks of logits and a partial one.
    let text = "The cache holds every key and value a layer has seen. ".repeat(20);
    let mut ids = bpe.encode(&text).unwrap();
    ids.truncate(150);
    let lm: &dyn CausalLm = model;
    let hidden = || lm.hidden_with(&ids, &mut |_, _, _| Ok(())).unwrap().0;
    let kept = Reference::score(model, &ids, hidden(), usize::MAX).unwrap();
    let recomputed = Reference::score(model, &ids, hidden(), 0).unwrap();
    assert!(matches!(kept.reference, Reference::Rows(_)));
    assert!(matches!(recomputed.reference, Reference::Hidden(_)));
    assert_eq!(kept.argmax, recomputed.argmax);
    let bits = |x: &[f64]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&kept.logp), bits(&recomputed.logp));
    for block in blocks(ids.len() - 1) {
        let a = kept.reference.rows(model, block.clone()).unwrap();
        let b = recomputed.reference.rows(model, block.clone()).unwrap();
        assert_eq!(a.len(), block.len());
        for (a, b) in a.iter().zip(b.iter()) {
            assert_eq!(bits(a), bits(b), "block {block:?}");
        }
    }
}
