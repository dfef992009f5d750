//! Tests of the Llama model on a tiny random one: batching, threads, the K/V hook and
//! sources, stepping, generation, refused inputs and GGUF loading.

use super::attention::attention;
use super::forward::{KvCache, append_positions};
use super::*;
use crate::capture::Capture;
use crate::ops;
use ndarray::{Array2, Array3, s};

/// A tiny model: 2 layers, hidden 16, 4 query heads and 2 KV heads of 4, FFN 24, vocab 30,
/// with deterministic pseudo-random weights.
fn tiny() -> Llama {
    let config = LlamaConfig {
        layers: 2,
        hidden: 16,
        heads: 4,
        kv_heads: 2,
        head_dim: 4,
        ffn: 24,
        vocab: 30,
        context: 64,
        rope_base: 10000.0,
        rms_eps: 1e-5,
    };
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut matrix = |rows: usize, cols: usize| {
        Array2::from_shape_fn((rows, cols), |_| {
            // xorshift: a fixed stream of values in [-0.5, 0.5).
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
    };
    let layers = (0..2)
        .map(|_| LayerWeights {
            attn_norm: vec![1.0; 16],
            q: matrix(16, 16),
            k: matrix(8, 16),
            v: matrix(8, 16),
            o: matrix(16, 16),
            ffn_norm: vec![1.0; 16],
            gate: matrix(24, 16),
            up: matrix(24, 16),
            down: matrix(16, 24),
        })
        .collect();
    let weights = LlamaWeights {
        token_embd: matrix(30, 16),
        layers,
        output_norm: vec![1.0; 16],
    };
    Llama::from_weights(config, weights).unwrap()
}

#[test]
fn a_later_token_does_not_change_earlier_positions() {
    let model = tiny();
    let a = model.forward(&[1, 2, 3, 4]).unwrap();
    let b = model.forward(&[1, 2, 3, 29]).unwrap();
    for (la, lb) in a.layers.iter().zip(&b.layers) {
        assert_eq!(la.q.slice(s![.., ..3, ..]), lb.q.slice(s![.., ..3, ..]));
        assert_eq!(la.k.slice(s![.., ..3, ..]), lb.k.slice(s![.., ..3, ..]));
        assert_eq!(la.v.slice(s![.., ..3, ..]), lb.v.slice(s![.., ..3, ..]));
    }
    let (la, lb) = (a.logits.unwrap(), b.logits.unwrap());
    assert_eq!(la.slice(s![..3, ..]), lb.slice(s![..3, ..]));
    assert_ne!(la.row(3), lb.row(3));
    // A prefix gives the same numbers as the first positions of a longer input.
    let prefix = model.forward(&[1, 2, 3]).unwrap();
    assert_eq!(prefix.hidden, a.hidden.slice(s![..3, ..]));
}

#[test]
fn rope_at_position_0_is_the_identity_and_rotations_keep_norms() {
    let model = tiny();
    let c = model.forward(&[5, 5, 5]).unwrap();
    let w = &model.weights().layers[0];
    // Recompute layer 0's k before RoPE by hand.
    let mut h = model.weights().token_embd.slice(s![5..6, ..]).to_owned();
    ops::rms_norm(&mut h, &w.attn_norm, 1e-5);
    let k = ops::linear(h.view(), w.k.view(), None);
    let k0 = &c.layers[0].k;
    for head in 0..2 {
        assert_eq!(
            k0.slice(s![head, 0, ..]),
            k.slice(s![0, head * 4..head * 4 + 4])
        );
        // The same token at later positions: rotated, with the same norm of every pair.
        for pos in 1..3 {
            assert_ne!(k0.slice(s![head, pos, ..]), k0.slice(s![head, 0, ..]));
            for pair in 0..2 {
                let norm = |p: usize| {
                    let (a, b) = (k0[[head, p, 2 * pair]], k0[[head, p, 2 * pair + 1]]);
                    (a * a + b * b).sqrt()
                };
                assert!((norm(pos) - norm(0)).abs() < 1e-5);
            }
        }
    }
}

#[test]
fn query_heads_share_kv_heads_in_groups() {
    // With 4 query heads and 2 KV heads, heads 0-1 read KV head 0 and heads 2-3 KV head 1:
    // zeroing KV head 1's values changes only the attention output of heads 2 and 3.
    let model = tiny();
    let c = model.forward(&[3, 7, 11]).unwrap();
    let l = &c.layers[0];
    let full = attention(&l.q, &l.k, &l.v, 0);
    let mut v = l.v.clone();
    v.slice_mut(s![1, .., ..]).fill(0.0);
    let cut = attention(&l.q, &l.k, &v, 0);
    assert_eq!(full.slice(s![.., ..8]), cut.slice(s![.., ..8]));
    assert!(cut.slice(s![.., 8..]).iter().all(|&x| x == 0.0));
    assert!(full.slice(s![.., 8..]).iter().any(|&x| x != 0.0));
}

#[test]
fn the_same_bits_on_one_and_on_two_threads() {
    let model = tiny();
    let ids = [0, 29, 4, 4, 17, 8];
    let on = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| model.forward(&ids).unwrap())
    };
    assert_eq!(on(1), on(2));
}

#[test]
fn the_hook_sees_each_layers_kv_and_its_changes_reach_later_layers() {
    let model = tiny();
    let ids = [1, 2, 3];
    let plain = model.forward(&ids).unwrap();
    let mut seen = Vec::new();
    let hooked = model
        .forward_with(&ids, |layer, k, v| {
            seen.push((layer, k.dim(), v.dim()));
            v.mapv_inplace(|x| x * 0.5);
            Ok(())
        })
        .unwrap();
    assert_eq!(seen, [(0, (2, 3, 4), (2, 3, 4)), (1, (2, 3, 4), (2, 3, 4))]);
    // Layer 0's capture is what it computed; layer 1 already sees the halved values.
    assert_eq!(hooked.layers[0], plain.layers[0]);
    assert_ne!(hooked.layers[1].k, plain.layers[1].k);
    let err = model
        .forward_with(&ids, |_, k, _| {
            *k = Array3::zeros((1, 1, 1));
            Ok(())
        })
        .unwrap_err();
    assert!(matches!(err, ModelError::Hook { layer: 0, .. }), "{err}");
    let err = model
        .forward_with(&ids, |_, _, _| Err("codec refused".into()))
        .unwrap_err();
    assert!(err.to_string().contains("codec refused"), "{err}");
}

#[test]
fn decoding_token_by_token_gives_the_bits_of_one_batched_pass() {
    let model = tiny();
    let ids = [3, 1, 4, 1, 5, 9, 2, 6];
    let batched = model.forward(&ids).unwrap();
    let mut cache = KvCache::new(2);
    let (first, _) = model
        .run(&ids[..3], &mut cache, &mut |_, _, _| Ok(()))
        .unwrap();
    assert_eq!(first, batched.hidden.slice(s![..3, ..]));
    for (pos, id) in ids.iter().enumerate().skip(3) {
        let (row, layers) = model
            .run(&[*id], &mut cache, &mut |_, _, _| Ok(()))
            .unwrap();
        assert_eq!(row, batched.hidden.slice(s![pos..pos + 1, ..]));
        for (mine, all) in layers.iter().zip(&batched.layers) {
            assert_eq!(mine.k, all.k.slice(s![.., pos..pos + 1, ..]));
        }
    }
}

#[test]
fn a_source_of_the_layers_own_rows_and_a_step_loop_give_the_bits_of_forward() {
    let model = tiny();
    let ids = [3, 1, 4, 1, 5, 9, 2, 6];
    let plain = model.forward(&ids).unwrap();
    let sourced = model
        .forward_with_source(&ids, |_, k, v| Ok(Box::new(OwnKv::new(k, v))))
        .unwrap();
    assert_eq!(sourced, plain);
    // A caller-held cache that keeps every row as given.
    let mut cache: Vec<(Array3<f32>, Array3<f32>)> =
        vec![(Array3::zeros((2, 0, 4)), Array3::zeros((2, 0, 4))); 2];
    for (pos, &id) in ids.iter().enumerate() {
        let row = model
            .step(id, pos, |l, k, v| {
                let (past_k, past_v) = &mut cache[l];
                *past_k = append_positions(past_k, k);
                *past_v = append_positions(past_v, v);
                Ok((past_k.clone(), past_v.clone()))
            })
            .unwrap();
        assert_eq!(row, plain.hidden.slice(s![pos..pos + 1, ..]));
    }
}

#[test]
fn a_layer_source_sees_keys_before_rope_and_rotates_them_to_the_passs_own() {
    let model = tiny();
    let ids = [3, 1, 4, 1, 5, 9, 2, 6];
    let plain = model.forward(&ids).unwrap();
    let sourced = model
        .forward_with_layer_source(&ids, |_, kv| {
            assert_ne!(kv.k_pre_rope, kv.k);
            let mut k = kv.k_pre_rope.clone();
            kv.rope(&mut k)?;
            assert_eq!(&k, kv.k);
            Ok(Box::new(OwnKv::new(&k, kv.v)))
        })
        .unwrap();
    assert_eq!(sourced, plain);
    let err = model
        .forward_with_layer_source(&ids, |_, kv| {
            kv.rope(&mut Array3::zeros((2, 3, 4)))?;
            Ok(Box::new(OwnKv::new(kv.k, kv.v)))
        })
        .unwrap_err();
    assert!(err.to_string().contains("keys of shape (2, 3, 4)"), "{err}");
}

#[test]
fn a_source_or_step_cache_of_the_wrong_shape_is_refused() {
    let model = tiny();
    let short = Array3::<f32>::zeros((2, 1, 3));
    let err = model
        .forward_with_source(&[1, 2], |_, _, _| Ok(Box::new(OwnKv::new(&short, &short))))
        .unwrap_err();
    assert!(matches!(err, ModelError::Hook { layer: 0, .. }), "{err}");
    let err = model
        .step(1, 0, |_, _, _| Ok((short.clone(), short.clone())))
        .unwrap_err();
    assert!(err.to_string().contains("expected (2, 1, 4)"), "{err}");
    assert!(matches!(
        model.step(1, 64, |_, k, v| Ok((k.clone(), v.clone()))),
        Err(ModelError::TooManyTokens { .. })
    ));
}

#[test]
fn greedy_generation_extends_with_the_argmax_of_a_full_pass() {
    let model = tiny();
    let out = model.generate_greedy(&[1, 2], 3).unwrap();
    assert_eq!(out.len(), 3);
    let mut all = vec![1, 2];
    all.extend_from_slice(&out[..2]);
    let logits = model.forward(&all).unwrap().logits.unwrap();
    assert_eq!(argmax(logits.row(3).as_slice().unwrap()), out[2]);
}

#[test]
fn bad_inputs_are_refused_by_name() {
    let model = tiny();
    assert!(matches!(model.forward(&[]), Err(ModelError::EmptyInput)));
    assert!(matches!(
        model.forward(&[1, 30]),
        Err(ModelError::UnknownToken {
            id: 30,
            position: 1,
            vocabulary: 30
        })
    ));
    assert!(matches!(
        model.forward(&[1; 65]),
        Err(ModelError::TooManyTokens {
            tokens: 65,
            context: 64
        })
    ));
    assert!(matches!(
        model.generate_greedy(&[1; 60], 5),
        Err(ModelError::TooManyTokens { tokens: 65, .. })
    ));
    // A count from a flag whose sum with the prompt wraps past usize is refused, not wrapped.
    assert!(matches!(
        model.generate_greedy(&[1; 2], usize::MAX),
        Err(ModelError::TooManyTokens {
            tokens: usize::MAX,
            context: 64
        })
    ));
    let mut weights = model.weights().clone();
    weights.layers[1].k = Array2::zeros((4, 16));
    let err = Llama::from_weights(model.config().clone(), weights).unwrap_err();
    assert!(err.to_string().contains("blk.1.attn_k.weight"), "{err}");
    let mut config = model.config().clone();
    config.kv_heads = 3;
    let err = Llama::from_weights(config, model.weights().clone()).unwrap_err();
    assert!(matches!(
        err,
        ModelError::Hyperparameter {
            key: "kv_heads",
            ..
        }
    ));
}

/// A GGUF file (v3) holding `model` as F32 tensors, written by hand from the format's layout
/// (see the `gguf-file` crate's docs); `edit` may change the metadata and tensors first.
fn gguf_of(model: &Llama, edit: impl FnOnce(&mut Vec<(String, u32)>, &mut Vec<Tensor>)) -> Vec<u8> {
    let c = model.config();
    let w = model.weights();
    let mut counts: Vec<(String, u32)> = [
        ("llama.block_count", c.layers),
        ("llama.embedding_length", c.hidden),
        ("llama.attention.head_count", c.heads),
        ("llama.attention.head_count_kv", c.kv_heads),
        ("llama.feed_forward_length", c.ffn),
        ("llama.context_length", c.context),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v as u32))
    .collect();
    let matrix = |name: String, m: &Array2<f32>| Tensor {
        name,
        dims: vec![m.ncols() as u64, m.nrows() as u64],
        ty: 0,
        data: m.iter().flat_map(|x| x.to_le_bytes()).collect(),
    };
    let vector = |name: String, v: &[f32]| Tensor {
        name,
        dims: vec![v.len() as u64],
        ty: 0,
        data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    };
    let mut tensors = vec![
        matrix("token_embd.weight".into(), &w.token_embd),
        vector("output_norm.weight".into(), &w.output_norm),
    ];
    for (l, lw) in w.layers.iter().enumerate() {
        let n = |part: &str| format!("blk.{l}.{part}.weight");
        tensors.push(vector(n("attn_norm"), &lw.attn_norm));
        tensors.push(vector(n("ffn_norm"), &lw.ffn_norm));
        for (part, m) in [
            ("attn_q", &lw.q),
            ("attn_k", &lw.k),
            ("attn_v", &lw.v),
            ("attn_output", &lw.o),
            ("ffn_gate", &lw.gate),
            ("ffn_up", &lw.up),
            ("ffn_down", &lw.down),
        ] {
            tensors.push(matrix(n(part), m));
        }
    }
    edit(&mut counts, &mut tensors);

    let mut out = Vec::new();
    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    };
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((counts.len() as u64 + 3).to_le_bytes());
    string(&mut out, "general.architecture");
    out.extend(8u32.to_le_bytes());
    string(&mut out, "llama");
    for (key, value) in [
        ("llama.rope.freq_base", c.rope_base),
        ("llama.attention.layer_norm_rms_epsilon", c.rms_eps),
    ] {
        string(&mut out, key);
        out.extend(6u32.to_le_bytes());
        out.extend(value.to_le_bytes());
    }
    for (key, value) in &counts {
        string(&mut out, key);
        out.extend(4u32.to_le_bytes());
        out.extend(value.to_le_bytes());
    }
    let mut offset = 0u64;
    for t in &tensors {
        string(&mut out, &t.name);
        out.extend((t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend(d.to_le_bytes());
        }
        out.extend(t.ty.to_le_bytes());
        out.extend(offset.to_le_bytes());
        offset += (t.data.len() as u64).div_ceil(32) * 32;
    }
    for t in &tensors {
        out.resize(out.len().div_ceil(32) * 32, 0);
        out.extend(&t.data);
    }
    out
}

/// Changes to the metadata counts and tensors of [`gguf_of`].
type Edit = dyn Fn(&mut Vec<(String, u32)>, &mut Vec<Tensor>);

struct Tensor {
    name: String,
    dims: Vec<u64>,
    ty: u32,
    data: Vec<u8>,
}

#[test]
fn a_gguf_file_loads_to_the_same_model_and_bad_ones_are_refused_by_tensor_name() {
    let model = tiny();
    let bytes = gguf_of(&model, |_, _| {});
    let gguf = gguf_file::GgufFile::parse(&bytes).unwrap();
    let loaded = Llama::from_gguf(&gguf).unwrap();
    assert_eq!(loaded.config(), model.config());
    assert_eq!(loaded.weights(), model.weights());

    let refuse = |edit: &Edit| {
        let bytes = gguf_of(&model, edit);
        let gguf = gguf_file::GgufFile::parse(&bytes).unwrap();
        Llama::from_gguf(&gguf).unwrap_err().to_string()
    };
    // A projection of the wrong shape.
    let err = refuse(&|_, tensors| {
        let t = tensors
            .iter_mut()
            .find(|t| t.name == "blk.1.attn_k.weight")
            .unwrap();
        t.dims = vec![16, 4];
        t.data.truncate(16 * 4 * 4);
    });
    assert!(err.contains("blk.1.attn_k.weight"), "{err}");
    // A type this loader does not read (I32, ggml type 26).
    let err = refuse(&|_, tensors| {
        let t = tensors
            .iter_mut()
            .find(|t| t.name == "blk.0.ffn_up.weight")
            .unwrap();
        t.ty = 26;
    });
    assert!(
        err.contains("blk.0.ffn_up.weight") && err.contains("I32"),
        "{err}"
    );
    // A missing tensor, a missing key, heads that do not divide the width.
    let err = refuse(&|_, tensors| tensors.retain(|t| t.name != "blk.1.ffn_down.weight"));
    assert!(err.contains("blk.1.ffn_down.weight"), "{err}");
    let err = refuse(&|counts, _| counts.retain(|(k, _)| k != "llama.context_length"));
    assert!(err.contains("llama.context_length"), "{err}");
    let err = refuse(&|counts, _| counts[2].1 = 5);
    assert!(err.contains("head_dim"), "{err}");
}

/// FNV-1a over the bits of everything a capture holds.
fn digest(c: &Capture) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |x: f32| {
        for b in x.to_bits().to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    };
    for l in &c.layers {
        l.q.iter().chain(&l.k).chain(&l.v).for_each(|&x| eat(x));
    }
    c.hidden.iter().for_each(|&x| eat(x));
    c.logits.iter().flatten().for_each(|&x| eat(x));
    h
}

#[test]
fn forward_and_forward_with_keep_the_bits_they_had_before_the_source_api() {
    let model = tiny();
    let ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3];
    let plain = digest(&model.forward(&ids).unwrap());
    let halved = digest(
        &model
            .forward_with(&ids, |_, _, v| {
                v.mapv_inplace(|x| x * 0.5);
                Ok(())
            })
            .unwrap(),
    );
    // Printed by this test run on the code before `forward_with_source` and `step` were
    // added (commit 3f209b0): the refactor into `layer_qkv` / `layer_rest` changed no bit.
    assert_eq!(plain, 0xbbc9_f82b_fc91_6e29);
    assert_eq!(halved, 0xd91f_465b_8df9_3d2e);
    let sourced = model
        .forward_with_source(&ids, |_, k, v| Ok(Box::new(OwnKv::new(k, v))))
        .unwrap();
    assert_eq!(digest(&sourced), plain);
}

/// Attends KV head 1 itself, as twice its query rows (so where each row lands is visible), and
/// leaves head 0 to the rows; a wrong shape when asked to.
struct AttendsHeadOne {
    own: OwnKv,
    wrong_shape: bool,
}

impl KvSource for AttendsHeadOne {
    fn key(&self, head: usize, query: usize, position: usize) -> &[f32] {
        self.own.key(head, query, position)
    }
    fn value(&self, head: usize, query: usize, position: usize) -> &[f32] {
        self.own.value(head, query, position)
    }
    fn attend(
        &self,
        head: usize,
        queries: ndarray::ArrayView2<'_, f32>,
        visible: &[usize],
        scale: f32,
    ) -> Option<Result<Array2<f32>, String>> {
        let t = visible.len() / 2;
        assert_eq!(scale, 0.5, "1 / sqrt(head_dim)");
        assert_eq!(visible, (0..2 * t).map(|r| r % t + 1).collect::<Vec<_>>());
        match (head, self.wrong_shape) {
            (1, false) => Some(Ok(queries.mapv(|x| 2.0 * x))),
            (1, true) => Some(Ok(Array2::zeros((1, 4)))),
            _ => None,
        }
    }
}

#[test]
fn a_source_that_attends_itself_fills_its_query_heads_where_every_query_reads_from_the_start() {
    let fill = |seed: f32, dim| {
        Array3::from_shape_fn(dim, |(h, i, j)| {
            seed * (1 + h + 3 * i + 5 * j) as f32 % 1.7 - 0.8
        })
    };
    let (q, k, v) = (
        fill(0.37, (4, 5, 4)),
        fill(0.61, (2, 5, 4)),
        fill(0.43, (2, 5, 4)),
    );
    let plain = attention(&q, &k, &v, 0);
    let source = AttendsHeadOne {
        own: OwnKv::new(&k, &v),
        wrong_shape: false,
    };
    let out = super::attention_from(&q, &source, 2, &|_| 0).unwrap();
    // Query heads 0 and 1 read KV head 0 from its rows; 2 and 3 take the source's rows.
    assert_eq!(out.slice(s![.., ..8]), plain.slice(s![.., ..8]));
    for h in 2..4 {
        assert_eq!(
            out.slice(s![.., h * 4..(h + 1) * 4]),
            q.index_axis(ndarray::Axis(0), h).mapv(|x| 2.0 * x)
        );
    }
    // A sliding window that hides position 0 from a query: every head reads rows.
    let windowed = super::attention_from(&q, &source, 2, &|i| i.saturating_sub(3)).unwrap();
    assert_eq!(windowed.slice(s![.., 8..]), {
        let from_rows =
            super::attention_from(&q, &source.own, 2, &|i| i.saturating_sub(3)).unwrap();
        from_rows.slice(s![.., 8..]).to_owned()
    });
    let wrong = AttendsHeadOne {
        own: OwnKv::new(&k, &v),
        wrong_shape: true,
    };
    let err = super::attention_from(&q, &wrong, 2, &|_| 0).unwrap_err();
    assert!(
        err.contains("KV head 1 has shape (1, 4), not 10 x 4"),
        "{err}"
    );
}
