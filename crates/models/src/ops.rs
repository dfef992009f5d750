//! The numerical building blocks of both forward passes, in f32 with one fixed order of
//! operations each, so the same input gives the same bits on any machine and thread count.
//!
//! - [`dot`]: eight running sums over lanes `i mod 8` (the compiler keeps them in SIMD registers
//!   of any width without changing a bit: no reassociation, no FMA), combined by a fixed tree,
//!   then the tail of fewer than eight products added in order.
//! - [`linear`]: y = x W^T (+ b) with W stored [out, in] as PyTorch and GGUF store it; every
//!   output element is one [`dot`]; rows of the output are split over rayon's threads, which
//!   changes who computes an element, never how.
//! - [`layer_norm`], [`rms_norm`], [`softmax_in_place`], [`gelu`], [`silu`]: the textbook
//!   formulas, sums taken in order, `exp`/`erf` from `libm` (the platform's libm may differ
//!   between machines; `libm` is the same code everywhere).

use ndarray::{Array2, ArrayView2, Axis};
use rayon::prelude::*;

/// Sum of `a[i] * b[i]` in the fixed order described in the module docs. The slices must have
/// the same length.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot of slices of different lengths");
    let body = a.len() / 8 * 8;
    let mut lanes = [0f32; 8];
    for (x, y) in a[..body].chunks_exact(8).zip(b[..body].chunks_exact(8)) {
        for j in 0..8 {
            lanes[j] += x[j] * y[j];
        }
    }
    let mut sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for (x, y) in a[body..].iter().zip(&b[body..]) {
        sum += x * y;
    }
    sum
}

/// y = x W^T + b: `x` is [tokens, in], `weight` is [out, in] (standard layout), `bias` has `out`
/// entries. Each output element is [`dot`] of a row of `x` and a row of `weight`, then `+ b`.
pub fn linear(x: ArrayView2<f32>, weight: ArrayView2<f32>, bias: Option<&[f32]>) -> Array2<f32> {
    let (tokens, inputs) = x.dim();
    let (outputs, weight_inputs) = weight.dim();
    assert_eq!(
        inputs, weight_inputs,
        "linear: x has {inputs} features, W expects {weight_inputs}"
    );
    if let Some(b) = bias {
        assert_eq!(
            b.len(),
            outputs,
            "linear: bias of {} for {outputs} outputs",
            b.len()
        );
    }
    let x = x.as_standard_layout();
    let weight = weight.as_standard_layout();
    let x = x.as_slice().expect("standard layout");
    let w = weight.as_slice().expect("standard layout");
    let mut y = Array2::<f32>::zeros((tokens, outputs));
    if tokens == 0 || outputs == 0 {
        return y;
    }
    // Blocks of output columns, so that a block of W stays in cache across all tokens.
    const BLOCK: usize = 64;
    let mut columns: Vec<Array2<f32>> = (0..outputs.div_ceil(BLOCK))
        .into_par_iter()
        .map(|block| {
            let start = block * BLOCK;
            let end = (start + BLOCK).min(outputs);
            let mut part = Array2::<f32>::zeros((tokens, end - start));
            for t in 0..tokens {
                let row = &x[t * inputs..(t + 1) * inputs];
                for (j, o) in (start..end).enumerate() {
                    let mut value = dot(row, &w[o * inputs..(o + 1) * inputs]);
                    if let Some(b) = bias {
                        value += b[o];
                    }
                    part[[t, j]] = value;
                }
            }
            part
        })
        .collect();
    for (block, part) in columns.drain(..).enumerate() {
        let start = block * BLOCK;
        y.slice_mut(ndarray::s![.., start..start + part.ncols()])
            .assign(&part);
    }
    y
}

/// LayerNorm over each row: (x - mean) / sqrt(var + eps) * gamma + beta, with the biased
/// variance; mean and variance are sums in order divided by the row length.
pub fn layer_norm(x: &mut Array2<f32>, gamma: &[f32], beta: &[f32], eps: f32) {
    let n = x.ncols();
    assert_eq!(gamma.len(), n);
    assert_eq!(beta.len(), n);
    for mut row in x.axis_iter_mut(Axis(0)) {
        let mean = row.iter().fold(0f32, |s, &v| s + v) / n as f32;
        let var = row.iter().fold(0f32, |s, &v| s + (v - mean) * (v - mean)) / n as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for ((v, &g), &b) in row.iter_mut().zip(gamma).zip(beta) {
            *v = (*v - mean) * inv * g + b;
        }
    }
}

/// RMSNorm over each row: x / sqrt(mean(x^2) + eps) * gamma.
pub fn rms_norm(x: &mut Array2<f32>, gamma: &[f32], eps: f32) {
    let n = x.ncols();
    assert_eq!(gamma.len(), n);
    for mut row in x.axis_iter_mut(Axis(0)) {
        let mean_square = row.iter().fold(0f32, |s, &v| s + v * v) / n as f32;
        let inv = 1.0 / (mean_square + eps).sqrt();
        for (v, &g) in row.iter_mut().zip(gamma) {
            *v = *v * inv * g;
        }
    }
}

/// Softmax of a row in place: exp(x - max) / sum, the sum taken in order.
pub fn softmax_in_place(row: &mut [f32]) {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0f32;
    for v in row.iter_mut() {
        *v = libm::expf(*v - max);
        sum += *v;
    }
    for v in row.iter_mut() {
        *v /= sum;
    }
}

/// Exact GELU: 0.5 x (1 + erf(x / sqrt 2)).
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// SiLU: x / (1 + e^-x).
pub fn silu(x: f32) -> f32 {
    x / (1.0 + libm::expf(-x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn dot_matches_a_plain_f64_sum_on_exact_inputs_of_every_tail_length() {
        for n in 0..40 {
            let a: Vec<f32> = (0..n).map(|i| (i % 7) as f32 - 3.0).collect();
            let b: Vec<f32> = (0..n).map(|i| (i % 5) as f32 * 0.5).collect();
            let exact: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            assert_eq!(dot(&a, &b) as f64, exact, "n = {n}");
        }
    }

    #[test]
    fn linear_is_x_times_w_transposed_plus_bias_and_independent_of_threads() {
        let x = array![[1.0f32, 2.0, 3.0], [0.0, -1.0, 0.5]];
        let w = array![[1.0f32, 0.0, 0.0], [0.0, 1.0, 1.0]];
        let y = linear(x.view(), w.view(), Some(&[10.0, 20.0]));
        assert_eq!(y, array![[11.0, 25.0], [10.0, 19.5]]);

        let x = Array2::from_shape_fn((5, 37), |(i, j)| ((i * 37 + j) as f32 * 0.37).sin());
        let w = Array2::from_shape_fn((200, 37), |(i, j)| ((i * 11 + j) as f32 * 0.13).cos());
        let many = linear(x.view(), w.view(), None);
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| linear(x.view(), w.view(), None));
        assert_eq!(many, one);
        for t in 0..5 {
            for o in 0..200 {
                let row: Vec<f32> = x.row(t).to_vec();
                let wr: Vec<f32> = w.row(o).to_vec();
                assert_eq!(many[[t, o]], dot(&row, &wr));
            }
        }
    }

    #[test]
    fn norms_and_activations_follow_their_formulas() {
        let mut x = array![[1.0f32, 3.0]];
        layer_norm(&mut x, &[1.0, 1.0], &[0.0, 0.5], 0.0);
        assert_eq!(x, array![[-1.0, 1.5]]);
        let mut x = array![[3.0f32, 4.0]];
        rms_norm(&mut x, &[1.0, 2.0], 0.0);
        let rms = (12.5f32).sqrt();
        assert_eq!(x, array![[3.0 * (1.0 / rms), 4.0 * (1.0 / rms) * 2.0]]);
        let mut row = [0.0f32, 0.0, f32::NEG_INFINITY];
        softmax_in_place(&mut row);
        assert_eq!(row, [0.5, 0.5, 0.0]);
        assert_eq!(gelu(0.0), 0.0);
        assert!((gelu(1.0) - 0.841_344_7).abs() < 1e-6);
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(2.0) - 2.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-6);
    }
}
