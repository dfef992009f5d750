//! Gemma 3 270M (Q4_K_M GGUF) against the shared float64 NumPy reference
//! (`tests/data/gemma3/gemma3_public.npz`, see `tests/data/gemma3/README.md`) and a second,
//! independent NumPy pass over a longer text (`kv_check.npz`). The model is fetched by
//! `scripts/fetch-models` on first use. Tolerances are the reference README's for a correct f32
//! port: max |diff| <= 1e-3 on q, k, v, hidden_final and logits.

use std::fs::File;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use models::gemma3::{self, Gemma3};
use models::llama::{KvSource, OwnKv};
use models::{CausalLm, ModelName, files, ops};
use ndarray::{Array, Array1, Dimension, Ix1, Ix2, Ix3, OwnedRepr};
use ndarray_npy::NpzReader;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/gemma3")
        .join(name)
}

/// The model, loaded once for all tests of this file.
fn model() -> &'static Gemma3 {
    static MODEL: OnceLock<Gemma3> = OnceLock::new();
    MODEL.get_or_init(|| {
        let files = files::locate_or_fetch(ModelName::Gemma3).expect("Gemma 3 files");
        let start = Instant::now();
        let loaded = gemma3::load(&files).expect("Gemma 3 loads");
        eprintln!("load: {:.2?}", start.elapsed());
        loaded
    })
}

struct Npz(NpzReader<File>);

impl Npz {
    fn open(name: &str) -> Npz {
        Npz(NpzReader::new(File::open(data(name)).expect("reference npz")).expect("npz"))
    }
    fn get<D: Dimension>(&mut self, name: &str) -> Array<f32, D> {
        self.0
            .by_name::<OwnedRepr<f32>, D>(name)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    }
    /// Token ids stored as int32 (the public reference) or int64 (`kv_check.npz`).
    fn ids(&mut self, name: &str) -> Vec<u32> {
        if let Ok(ids) = self.0.by_name::<OwnedRepr<i32>, Ix1>(name) {
            return ids.iter().map(|&id| u32::try_from(id).unwrap()).collect();
        }
        let ids: Array1<i64> = self.0.by_name::<OwnedRepr<i64>, Ix1>(name).unwrap();
        ids.iter().map(|&id| u32::try_from(id).unwrap()).collect()
    }
}

fn max_diff<D: Dimension>(a: &Array<f32, D>, b: &Array<f32, D>) -> f32 {
    assert_eq!(a.shape(), b.shape());
    a.iter()
        .zip(b)
        .fold(0f32, |m, (&x, &y)| m.max((x - y).abs()))
}

/// The reference README's tolerance for an f32 port.
const TOLERANCE: f32 = 1e-3;

#[test]
fn every_layer_and_the_logits_match_the_public_reference() {
    let model = model();
    let mut npz = Npz::open("gemma3_public.npz");
    let ids = npz.ids("ids");
    assert_eq!(ids, [2, 818, 5279, 529, 7001, 563]);
    let start = Instant::now();
    let capture = model.forward(&ids).unwrap();
    eprintln!("forward of {} tokens: {:.2?}", ids.len(), start.elapsed());
    let (mut q, mut k, mut v) = (0f32, 0f32, 0f32);
    for (l, layer) in capture.layers.iter().enumerate() {
        q = q.max(max_diff(&layer.q, &npz.get::<Ix3>(&format!("l{l}_q"))));
        k = k.max(max_diff(&layer.k, &npz.get::<Ix3>(&format!("l{l}_k"))));
        v = v.max(max_diff(&layer.v, &npz.get::<Ix3>(&format!("l{l}_v"))));
    }
    let hidden = max_diff(&capture.hidden, &npz.get::<Ix2>("hidden_final"));
    let logits = capture.logits.as_ref().unwrap();
    let last = logits.row(ids.len() - 1).to_owned();
    let reference = npz.get::<Ix1>("logits");
    let logit = max_diff(&last, &reference);
    eprintln!(
        "max |diff|: q {q:.3e}, k {k:.3e}, v {v:.3e}, hidden {hidden:.3e}, logits {logit:.3e}"
    );
    for (what, diff) in [
        ("q", q),
        ("k", k),
        ("v", v),
        ("hidden_final", hidden),
        ("logits", logit),
    ] {
        assert!(diff <= TOLERANCE, "{what}: max |diff| {diff}");
    }
}

#[test]
fn greedy_decoding_continues_as_the_reference_does() {
    let text = std::fs::read_to_string(data("gemma3_public.json")).unwrap();
    let public: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids: Vec<u32> = public["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let expected: Vec<u32> = public["greedy_16_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let start = Instant::now();
    let greedy = model().generate_greedy(&ids, 16).unwrap();
    eprintln!("16 greedy tokens: {:.2?}", start.elapsed());
    assert_eq!(greedy, expected);
}

/// The independent NumPy pass over a 675-token text (`kv_check.py`): q, k and v of two sliding
/// layers (0, 4) and two global ones (5, 17), and `hidden_final`, at positions on both sides of
/// the 512-position window's edge; every logit of the last position; and, at each stored
/// position, our logits at the reference's top 20 ids.
#[test]
fn a_675_token_text_across_the_window_edge_matches_the_independent_pass() {
    let model = model();
    let mut npz = Npz::open("kv_check.npz");
    let ids = npz.ids("ids");
    assert_eq!(ids.len(), 675);
    let positions: Vec<usize> = npz.ids("positions").iter().map(|&p| p as usize).collect();
    // The LM head only where the reference has logits: the full head over 675 positions would
    // be most of the test's time.
    let start = Instant::now();
    let (hidden_final, layers) = model.hidden_with(&ids, |_, _, _| Ok(())).unwrap();
    let mut rows = positions.clone();
    rows.push(ids.len() - 1);
    let head_input = hidden_final.select(ndarray::Axis(0), &rows);
    let logits = ops::linear(head_input.view(), model.weights().token_embd.view(), None);
    eprintln!("forward of {} tokens: {:.2?}", ids.len(), start.elapsed());
    let at = |a: &ndarray::Array3<f32>| a.select(ndarray::Axis(1), &positions);
    let mut worst = Vec::new();
    for l in [0, 4, 5, 17] {
        let layer = &layers[l];
        for (part, ours) in [("q", &layer.q), ("k", &layer.k), ("v", &layer.v)] {
            let name = format!("l{l}_{part}");
            worst.push((name.clone(), max_diff(&at(ours), &npz.get::<Ix3>(&name))));
        }
    }
    let hidden = hidden_final.select(ndarray::Axis(0), &positions);
    worst.push((
        "hidden_final".into(),
        max_diff(&hidden, &npz.get::<Ix2>("hidden_final")),
    ));
    let last = logits.row(positions.len()).to_owned();
    worst.push((
        "logits_last".into(),
        max_diff(&last, &npz.get::<Ix1>("logits_last")),
    ));
    let top_ids = npz
        .0
        .by_name::<OwnedRepr<i64>, Ix2>("logits_top_ids")
        .unwrap();
    let top = npz.get::<Ix2>("logits_top");
    let ours =
        ndarray::Array2::from_shape_fn(top.dim(), |(r, j)| logits[[r, top_ids[[r, j]] as usize]]);
    worst.push(("logits_top".into(), max_diff(&ours, &top)));
    eprintln!("max |diff|: {worst:?}");
    for (name, diff) in worst {
        assert!(diff <= TOLERANCE, "{name}: max |diff| {diff}");
    }
}

/// Keys and values a test source hands attention: the layer's own, except that a sliding
/// layer's rows older than its window read as NaN, which would poison any score that used them.
struct WindowedOwn {
    own: OwnKv,
    nan: Vec<f32>,
    window: Option<usize>,
}

impl KvSource for WindowedOwn {
    fn key(&self, head: usize, query: usize, position: usize) -> &[f32] {
        match self.window {
            Some(w) if query - position >= w => &self.nan,
            _ => self.own.key(head, query, position),
        }
    }
    fn value(&self, head: usize, query: usize, position: usize) -> &[f32] {
        match self.window {
            Some(w) if query - position >= w => &self.nan,
            _ => self.own.value(head, query, position),
        }
    }
}

/// The pass whose attention reads a caller's cache (`CausalLm::hidden_with_layer_source`, what
/// the quality study runs) gives the plain pass's bits when the cache is the layer's own K/V,
/// over 675 tokens, so that sliding layers drop positions; rows outside a sliding layer's
/// window are never read; and the keys before RoPE, rotated by the layer's own RoPE, are its
/// keys bit for bit (KVQuant's cache stores them so).
#[test]
fn a_pass_on_its_own_cache_gives_the_plain_pass_bits_and_reads_nothing_outside_the_window() {
    let model: &dyn CausalLm = model();
    let mut npz = Npz::open("kv_check.npz");
    let ids = npz.ids("ids");
    let (plain, plain_layers) = model.hidden_with(&ids, &mut |_, _, _| Ok(())).unwrap();
    let mut windows = Vec::new();
    let (sourced, layers) = model
        .hidden_with_layer_source(&ids, &mut |l, kv| {
            let mut rotated = kv.k_pre_rope.clone();
            kv.rope(&mut rotated)?;
            assert_eq!(&rotated, kv.k, "layer {l}: rope(k before RoPE) is k");
            windows.push(model.window(l));
            Ok(Box::new(WindowedOwn {
                own: OwnKv::new(kv.k, kv.v),
                nan: vec![f32::NAN; kv.k.dim().2],
                window: model.window(l),
            }))
        })
        .unwrap();
    assert_eq!(sourced, plain);
    assert_eq!(layers, plain_layers);
    let sliding = windows.iter().filter(|w| **w == Some(512)).count();
    assert_eq!((windows.len(), sliding), (18, 15));
    // The static shape (what `runner bytes` bills without loading the model) says the same.
    let shape = ModelName::Gemma3.shape();
    assert!((0..18).all(|l| shape.window(l) == windows[l]));
    assert!(ids.len() > 512 + 100, "the text crosses the window's edge");
    // The LM head of a few rows is the rows' slice of the whole head's.
    let rows = plain.slice(ndarray::s![600..603, ..]);
    let logits = model.logits(rows);
    let whole = ops::linear(rows, self::model().weights().token_embd.view(), None);
    assert_eq!(logits, whole);
}
