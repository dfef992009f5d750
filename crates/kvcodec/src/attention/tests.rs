//! The fused kernels against the f64 oracle (1e-5 relative) and against each other (bit for
//! bit), over patterned, random, all-maximum, tie-heavy and zero caches, odd lengths, both
//! modes, several widths and group sizes, GQA query groups and causal prefill chunks; then
//! thread-count independence and every refusal.

use ndarray::{Array2, ArrayView2};

use super::*;
use crate::differential::{noise, patterns};
use crate::{Layout, encode};

fn layouts(mode: Mode, k_bits: u32, v_bits: u32, k_group: usize, v_group: usize) -> [Layout; 2] {
    [
        Layout::with_mode(GroupAxis::Token, mode, k_bits, k_group).unwrap(),
        Layout::with_mode(GroupAxis::Feature, mode, v_bits, v_group).unwrap(),
    ]
}

/// Largest relative L2 error of a row of `got` against `want` (see below for tiny rows).
fn worst_relative(got: &Array2<f32>, want: &Array2<f64>) -> f64 {
    got.rows()
        .into_iter()
        .zip(want.rows())
        .map(|(g, w)| {
            let diff: f64 = g
                .iter()
                .zip(w)
                .map(|(&g, &w)| (f64::from(g) - w).powi(2))
                .sum();
            // Outputs far below f32's normal range (a cache of subnormal values) are held to
            // an absolute 1e-35: their products underflow in f32, as they would in any f32
            // attention.
            let norm: f64 = w.iter().map(|w| w * w).sum::<f64>().sqrt();
            diff.sqrt() / norm.max(1e-30)
        })
        .fold(0.0, f64::max)
}

/// Runs every kernel on one case, requires the same bits from each, and 1e-5 of the oracle.
fn check(
    queries: ArrayView2<f32>,
    visible: &[usize],
    k: &PackedTensor,
    v: &PackedTensor,
    label: &str,
) {
    let scale = 1.0 / (queries.ncols() as f32).sqrt();
    let want = attend_reference(queries, visible, k, v, scale).unwrap();
    let mut first: Option<Array2<f32>> = None;
    for kernel in kernels() {
        let got = attend_with(kernel, queries, visible, k, v, scale).unwrap();
        let error = worst_relative(&got, &want);
        assert!(
            error <= 1e-5,
            "{label}: {kernel} is {error:e} from the oracle"
        );
        match &first {
            None => first = Some(got),
            Some(bits) => assert_eq!(
                got.mapv(f32::to_bits),
                bits.mapv(f32::to_bits),
                "{label}: {kernel} differs from the portable kernel"
            ),
        }
    }
}

fn decode_step(q: usize, tokens: usize) -> Vec<usize> {
    vec![tokens; q]
}

#[test]
fn every_pattern_width_and_mode_matches_the_oracle_and_every_kernel_agrees() {
    // 300 tokens: a partial block, a partial K group and a partial 32-token run.
    let (tokens, features) = (300, 64);
    let queries = noise(4, features, 3).mapv(|x| 3.0 * x);
    for mode in [Mode::Symmetric, Mode::Asymmetric] {
        for (k_bits, v_bits) in [(2, 2), (3, 5), (4, 4), (4, 8), (8, 8)] {
            if mode == Mode::Symmetric && (k_bits < 2 || v_bits < 2) {
                continue;
            }
            for (k_group, v_group) in [(32, 32), (128, 8), (32, 128), (64, 16)] {
                let [kl, vl] = layouts(mode, k_bits, v_bits, k_group, v_group);
                let k_cases = patterns(tokens, features, kl);
                let v_cases = patterns(tokens, features, vl);
                for ((name, k), (_, v)) in k_cases.iter().zip(&v_cases) {
                    let (Ok(k), Ok(v)) = (encode(k.view(), kl), encode(v.view(), vl)) else {
                        continue; // a pattern the codec refuses (its own tests cover that)
                    };
                    let label = format!("{name}, {mode} K{k_bits}/g{k_group} V{v_bits}/g{v_group}");
                    // One query row, a pair, and a GQA group each have their own AVX2 path:
                    // all three on random data, the group on every pattern (the portable
                    // kernel's integer multiply-add is slow under QEMU, where CI runs this).
                    let row_counts: &[usize] = if *name == "noise" { &[1, 2, 4] } else { &[4] };
                    for &rows in row_counts {
                        let some = queries.slice(ndarray::s![..rows, ..]);
                        check(some, &decode_step(rows, tokens), &k, &v, &label);
                    }
                }
            }
        }
    }
}

#[test]
fn real_head_dimensions_over_several_passes_match_the_oracle_and_every_kernel_agrees() {
    // Head dimensions 128 and 256 have their own one-query paths in the AVX-512 kernel, query
    // groups of 1-2, 3-4 and 5-8 rows their own blocks of scores in registers, and a K group of
    // 96 tokens straddles the boundary between two passes.
    let tokens = PASS_TOKENS + 300;
    let cases = [
        (128, Mode::Symmetric, 4, 32, 32),
        (128, Mode::Asymmetric, 2, 32, 32),
        (128, Mode::Asymmetric, 8, 96, 128),
        (256, Mode::Asymmetric, 4, 64, 32),
        (256, Mode::Symmetric, 8, 96, 32),
    ];
    for (case, (features, mode, bits, k_group, v_group)) in cases.into_iter().enumerate() {
        let [kl, vl] = layouts(mode, bits, bits, k_group, v_group);
        let k = encode(noise(tokens, features, 15).mapv(|x| 3.0 * x).view(), kl).unwrap();
        let v = encode(noise(tokens, features, 16).view(), vl).unwrap();
        let queries = noise(8, features, 17);
        // Every query-group block size on the first case only (the portable kernel is slow
        // under QEMU, where CI runs this).
        let rows: &[usize] = if case == 0 { &[1, 2, 4, 5, 8] } else { &[1, 4] };
        for &rows in rows {
            let label = format!("D {features}, {mode} {bits}-bit, K g{k_group}, V g{v_group}");
            let some = queries.slice(ndarray::s![..rows, ..]);
            check(some, &decode_step(rows, tokens), &k, &v, &label);
        }
    }
}

#[test]
fn a_causal_prefill_chunk_sees_only_its_prefix() {
    let (tokens, features) = (700, 32);
    let [kl, vl] = layouts(Mode::Symmetric, 4, 4, 32, 32);
    let k = encode(noise(tokens, features, 5).view(), kl).unwrap();
    let v = encode(noise(tokens, features, 6).view(), vl).unwrap();
    // Six positions of a chunk, two query heads each, the first seeing one token only.
    let visible: Vec<usize> = [1, 2, 255, 256, 257, 700]
        .iter()
        .flat_map(|&p| [p, p])
        .collect();
    let queries = noise(visible.len(), features, 8);
    check(queries.view(), &visible, &k, &v, "causal chunk");
    // A query that sees one token returns that token's value.
    let out = attend(queries.view(), &visible, &k, &v, 0.5).unwrap();
    let first = crate::decode(&v);
    for (got, want) in out.row(0).iter().zip(first.row(0)) {
        assert!(
            (got - want).abs() <= 1e-6 * want.abs().max(1.0),
            "{got} against {want}"
        );
    }
}

#[test]
fn a_prefill_chunk_of_many_rows_gives_each_row_what_a_call_for_it_alone_gives() {
    // Three query heads by 13 positions (several query tiles, the last one short), over two
    // passes, packed and dense, every kernel: the rows are attended in tiles, and every step
    // is per row.
    let (tokens, features) = (PASS_TOKENS + 200, 64);
    let positions = [
        0,
        1,
        30,
        31,
        32,
        255,
        256,
        700,
        2047,
        2048,
        2049,
        2100,
        PASS_TOKENS + 199,
    ];
    let visible: Vec<usize> = (0..3).flat_map(|_| positions.map(|p| p + 1)).collect();
    let queries = noise(visible.len(), features, 21).mapv(|x| 2.0 * x);
    let (k, v) = (noise(tokens, features, 22), noise(tokens, features, 23));
    for mode in [Mode::Symmetric, Mode::Asymmetric] {
        let [kl, vl] = layouts(mode, 4, 8, 32, 32);
        let (kp, vp) = (encode(k.view(), kl).unwrap(), encode(v.view(), vl).unwrap());
        check(queries.view(), &visible, &kp, &vp, "many rows");
        for kernel in kernels() {
            let packed = attend_with(kernel, queries.view(), &visible, &kp, &vp, 0.125).unwrap();
            let dense =
                attend_dense_with(kernel, queries.view(), &visible, k.view(), v.view(), 0.125)
                    .unwrap();
            for (r, &seen) in visible.iter().enumerate() {
                let row = queries.slice(ndarray::s![r..=r, ..]);
                let alone = attend_with(kernel, row, &[seen], &kp, &vp, 0.125).unwrap();
                assert_eq!(
                    alone.row(0).mapv(f32::to_bits),
                    packed.row(r).mapv(f32::to_bits),
                    "{mode} {kernel}: packed row {r} alone"
                );
                let alone =
                    attend_dense_with(kernel, row, &[seen], k.view(), v.view(), 0.125).unwrap();
                assert_eq!(
                    alone.row(0).mapv(f32::to_bits),
                    dense.row(r).mapv(f32::to_bits),
                    "{mode} {kernel}: dense row {r} alone"
                );
            }
        }
    }
}

#[test]
fn long_caches_across_splits_match_the_oracle_with_every_thread_count() {
    let (tokens, features) = (2 * SPLIT_TOKENS + 1000, 64);
    let [kl, vl] = layouts(Mode::Asymmetric, 4, 4, 32, 32);
    // A strong direction, so attention is peaked and the splits' maxima differ.
    let k = noise(tokens, features, 9).mapv(|x| 4.0 * x);
    let k = encode(k.view(), kl).unwrap();
    let v = encode(noise(tokens, features, 10).view(), vl).unwrap();
    let queries = noise(3, features, 11).mapv(|x| 2.0 * x);
    let visible = [tokens, tokens - 1, SPLIT_TOKENS + 3];
    check(queries.view(), &visible, &k, &v, "long");
    let run = |threads| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| attend(queries.view(), &visible, &k, &v, 0.125).unwrap())
            .mapv(f32::to_bits)
    };
    let one = run(1);
    for threads in [2, 3, 5] {
        assert_eq!(run(threads), one, "{threads} threads");
    }
}

#[test]
fn the_dense_baseline_matches_f64_attention_and_every_kernel_agrees() {
    for (tokens, features) in [(1, 8), (37, 64), (1000, 128), (SPLIT_TOKENS + 5, 32)] {
        let k = noise(tokens, features, 12).mapv(|x| 3.0 * x);
        let v = noise(tokens, features, 13);
        let queries = noise(5, features, 14);
        let visible: Vec<usize> = (0..5).map(|i| tokens - (tokens - 1) * i / 4).collect();
        let scale = 1.0 / (features as f32).sqrt();
        let want = reference::attend_f64(
            queries.view(),
            &visible,
            &k.mapv(f64::from),
            &v.mapv(f64::from),
            f64::from(scale),
        );
        let mut first: Option<Array2<u32>> = None;
        for kernel in kernels() {
            let got =
                attend_dense_with(kernel, queries.view(), &visible, k.view(), v.view(), scale)
                    .unwrap();
            let error = worst_relative(&got, &want);
            assert!(
                error <= 1e-5,
                "{tokens} x {features}: {kernel} is {error:e} off"
            );
            let bits = got.mapv(f32::to_bits);
            match &first {
                None => first = Some(bits),
                Some(b) => assert_eq!(&bits, b, "{tokens} x {features}: {kernel}"),
            }
        }
    }
}

#[test]
fn zero_points_are_read_as_the_packed_tensor_stores_them() {
    for bits in 1..=8 {
        let layout = Layout::with_mode(GroupAxis::Token, Mode::Asymmetric, bits, 32).unwrap();
        let packed = encode(noise(100, 24, u64::from(bits)).view(), layout).unwrap();
        let offsets = Stream::new(&packed).offsets;
        for (index, &zero) in packed.offsets().iter().enumerate() {
            assert_eq!(
                offsets.at(index),
                i32::from(zero),
                "{bits} bits, group {index}"
            );
        }
    }
}

#[test]
fn bad_inputs_are_refused_by_name() {
    let x = noise(64, 16, 1);
    let k = encode(x.view(), Layout::new(GroupAxis::Token, 4, 32).unwrap()).unwrap();
    let v = encode(x.view(), Layout::new(GroupAxis::Feature, 4, 8).unwrap()).unwrap();
    let q = noise(2, 16, 2);
    let all = [64, 64];
    let refused =
        |q: ArrayView2<f32>, visible: &[usize], k: &PackedTensor, v: &PackedTensor, scale| {
            attend(q, visible, k, v, scale).unwrap_err()
        };
    assert!(matches!(
        refused(q.view(), &all, &v, &k, 1.0),
        AttentionError::Axes { .. }
    ));
    let k16 = encode(x.view(), Layout::new(GroupAxis::Token, 4, 16).unwrap()).unwrap();
    assert!(matches!(
        refused(q.view(), &all, &k16, &v, 1.0),
        AttentionError::GroupSize {
            tensor: "K",
            group_size: 16,
            multiple: 32
        }
    ));
    let v4 = encode(x.view(), Layout::new(GroupAxis::Feature, 4, 4).unwrap()).unwrap();
    assert!(matches!(
        refused(q.view(), &all, &k, &v4, 1.0),
        AttentionError::GroupSize { tensor: "V", .. }
    ));
    let short = encode(
        x.slice(ndarray::s![..60, ..]),
        Layout::new(GroupAxis::Feature, 4, 8).unwrap(),
    )
    .unwrap();
    assert!(matches!(
        refused(q.view(), &all, &k, &short, 1.0),
        AttentionError::Shape(_)
    ));
    let odd = noise(64, 12, 1);
    let k12 = encode(odd.view(), Layout::new(GroupAxis::Token, 4, 32).unwrap()).unwrap();
    let v12 = encode(odd.view(), Layout::new(GroupAxis::Feature, 4, 8).unwrap()).unwrap();
    let message = refused(noise(2, 12, 2).view(), &all, &k12, &v12, 1.0).to_string();
    assert_eq!(message, "head dimension 12 is not a multiple of 8");
    assert!(matches!(
        refused(q.view(), &[64], &k, &v, 1.0),
        AttentionError::VisibleCount { got: 1, queries: 2 }
    ));
    assert!(matches!(
        refused(q.view(), &[64, 0], &k, &v, 1.0),
        AttentionError::Visible {
            row: 1,
            visible: 0,
            ..
        }
    ));
    assert!(matches!(
        refused(q.view(), &[65, 64], &k, &v, 1.0),
        AttentionError::Visible {
            row: 0,
            visible: 65,
            tokens: 64
        }
    ));
    let mut bad = q.clone();
    bad[[1, 3]] = f32::NAN;
    assert!(matches!(
        refused(bad.view(), &all, &k, &v, 1.0),
        AttentionError::NonFiniteQuery { row: 1, col: 3, .. }
    ));
    for scale in [0.0, -1.0, f32::INFINITY, f32::NAN] {
        assert!(matches!(
            refused(q.view(), &all, &k, &v, scale),
            AttentionError::Scale(_)
        ));
    }
    assert!(matches!(
        refused(noise(2, 8, 2).view(), &all, &k, &v, 1.0),
        AttentionError::Shape(_)
    ));
    let dense = attend_dense(
        q.view(),
        &all,
        x.view(),
        x.slice(ndarray::s![..60, ..]),
        1.0,
    );
    assert!(matches!(dense, Err(AttentionError::Shape(_))));
}
