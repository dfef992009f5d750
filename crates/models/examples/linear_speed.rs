//! Times [`models::ops::linear`] against [`models::ops::linear_reference`] on SmolLM2's shapes
//! (`cargo run --release -p models --example linear_speed`): an MLP projection over 512 tokens,
//! [512 x 576] x [1536 x 576]^T, and the LM head over 8 tokens, [8 x 576] x [49152 x 576]^T.
//! Checks that both give the same bits, then prints the best of a few runs of each and the ratio.

use std::time::{Duration, Instant};

use models::ops;
use ndarray::{Array2, ArrayView2};

/// Deterministic values in [-1, 1) from a 64-bit linear congruential generator.
fn filled(rows: usize, cols: usize, seed: u64) -> Array2<f32> {
    let mut state = seed;
    Array2::from_shape_simple_fn((rows, cols), || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    })
}

/// The best of `runs` timings of `f`.
fn best(runs: usize, mut f: impl FnMut() -> Array2<f32>) -> Duration {
    (0..runs)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(f());
            start.elapsed()
        })
        .min()
        .expect("at least one run")
}

fn main() {
    for (tokens, outputs, runs) in [(512, 1536, 5), (8, 49152, 5)] {
        let inputs = 576;
        let x = filled(tokens, inputs, 1);
        let w = filled(outputs, inputs, 2);
        let bias: Vec<f32> = filled(1, outputs, 3).into_iter().collect();
        let (xv, wv): (ArrayView2<f32>, ArrayView2<f32>) = (x.view(), w.view());
        let fast = ops::linear(xv, wv, Some(&bias));
        let reference = ops::linear_reference(xv, wv, Some(&bias));
        assert!(
            fast.iter()
                .zip(&reference)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "linear and linear_reference differ"
        );
        let t_fast = best(runs, || ops::linear(xv, wv, Some(&bias)));
        let t_ref = best(runs, || ops::linear_reference(xv, wv, Some(&bias)));
        println!(
            "[{tokens} x {inputs}] x [{outputs} x {inputs}]^T: linear {t_fast:.2?}, \
             linear_reference {t_ref:.2?}, ratio {:.2}x (best of {runs}; bits identical)",
            t_ref.as_secs_f64() / t_fast.as_secs_f64()
        );
    }
}
