//! The numerical building blocks of both forward passes, in f32 with one fixed order of
//! operations each, so the same input gives the same bits on any machine and thread count.
//!
//! - [`dot`]: eight running sums over lanes `i mod 8` (the compiler keeps them in SIMD registers
//!   of any width without changing a bit: no reassociation, no FMA), combined by a fixed tree,
//!   then the tail of fewer than eight products added in order.
//! - [`linear`]: y = x W^T (+ b) with W stored [out, in] as PyTorch and GGUF store it; every
//!   output element is one [`dot`] (computed by a micro-kernel of several outputs at once that
//!   keeps [`dot`]'s operations for each, checked bit for bit against [`linear_reference`]);
//!   blocks of output columns are split over rayon's threads, which changes who computes an
//!   element, never how.
//! - [`attend_row`]: one query's softmax attention over its key and value rows, every score a
//!   [`dot`], the softmax [`softmax_in_place`]'s, every output a sum over the rows in order
//!   (checked bit for bit against [`attend_row_reference`], the same steps one value at a time);
//!   [`attend_rows`] gives several queries over the same rows (a KV head's query heads) the
//!   same bits each, reading the rows once for all of them.
//! - [`layer_norm`], [`rms_norm`], [`softmax_in_place`], [`gelu`], [`gelu_tanh`], [`silu`]: the textbook
//!   formulas, sums taken in order, `exp`/`erf`/`tanh` from `libm` (the platform's libm may differ
//!   between machines; `libm` is the same code everywhere).

use ndarray::{Array2, ArrayView2, Axis};
use rayon::prelude::*;

mod attend;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use attend::{attend_row, attend_row_reference, attend_rows};

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
/// entries. Each output element is [`dot`] of a row of `x` and a row of `weight`, then `+ b`:
/// bit for bit the result of [`linear_reference`], only faster. A micro-kernel computes a tile of
/// 2 tokens by 2 rows of `weight` at once, sharing the loads of both and keeping four
/// independent dependency chains in flight, while every output element keeps its own eight lane
/// sums, the same tree and the same tail, in the same order as [`dot`] (no FMA, no
/// reassociation; safe Rust, vectorized by the compiler).
///
/// On x86_64 CPUs with AVX2 (or AVX-512VL) the block kernel is `ops/x86.rs`'s (4 tokens by 2 or 4
/// rows, eight lane sums to a register), with the same operations for every element.
pub fn linear(x: ArrayView2<f32>, weight: ArrayView2<f32>, bias: Option<&[f32]>) -> Array2<f32> {
    linear_with(x, weight, bias, Kernel::detect())
}

/// Which block kernel [`linear`] runs: the portable one, or one of [`x86`]'s where the CPU has
/// it (all give the same bits).
#[derive(Debug, Clone, Copy)]
enum Kernel {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2(x86::Avx2),
    #[cfg(target_arch = "x86_64")]
    Avx512(x86::Avx512),
}

impl Kernel {
    /// Every kernel this CPU can run (the tests hold each to [`linear_reference`]).
    #[cfg(test)]
    fn available() -> Vec<Kernel> {
        #[cfg(target_arch = "x86_64")]
        let x86 = [
            x86::Avx2::detect().map(Kernel::Avx2),
            x86::Avx512::detect().map(Kernel::Avx512),
        ];
        #[cfg(not(target_arch = "x86_64"))]
        let x86: [Option<Kernel>; 0] = [];
        std::iter::once(Kernel::Portable)
            .chain(x86.into_iter().flatten())
            .collect()
    }

    /// The fastest kernel this CPU can run.
    fn detect() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(proof) = x86::Avx512::detect() {
                return Kernel::Avx512(proof);
            }
            if let Some(proof) = x86::Avx2::detect() {
                return Kernel::Avx2(proof);
            }
        }
        Kernel::Portable
    }
}

/// Tokens per micro-kernel tile of [`linear`].
const TILE_TOKENS: usize = 2;
/// Rows of the weight (outputs) per micro-kernel tile of [`linear`].
const TILE_ROWS: usize = 2;

/// [`dot`] of each of `T` rows of `x` with each of `R` rows of `W` at once; `xs` and `ws` hold the
/// first `body` (a multiple of 8) entries of each row as chunks of 8, `x_tails` and `w_tails` the
/// rest. Returns `out[t][r] = dot(x row t, W row r)`, with exactly [`dot`]'s operations.
#[inline(always)]
fn dot_tile<const T: usize, const R: usize>(
    xs: [&[[f32; 8]]; T],
    ws: [&[[f32; 8]]; R],
    x_tails: [&[f32]; T],
    w_tails: [&[f32]; R],
) -> [[f32; R]; T] {
    let chunks = xs.iter().chain(&ws).map(|c| c.len()).min().unwrap_or(0);
    let xs = xs.map(|s| &s[..chunks]);
    let ws = ws.map(|s| &s[..chunks]);
    let mut lanes = [[[0f32; 8]; R]; T];
    for c in 0..chunks {
        let xc: [[f32; 8]; T] = std::array::from_fn(|t| xs[t][c]);
        let wc: [[f32; 8]; R] = std::array::from_fn(|r| ws[r][c]);
        for t in 0..T {
            for r in 0..R {
                for j in 0..8 {
                    lanes[t][r][j] += xc[t][j] * wc[r][j];
                }
            }
        }
    }
    // An optimisation barrier, not a change of value: without it LLVM lays the lane sums out
    // across registers to suit the tree below, at the cost of shuffles in every iteration.
    let lanes = std::hint::black_box(lanes);
    let mut out = [[0f32; R]; T];
    for t in 0..T {
        for r in 0..R {
            let l = &lanes[t][r];
            let mut sum = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
            for (x, y) in x_tails[t].iter().zip(w_tails[r]) {
                sum += x * y;
            }
            out[t][r] = sum;
        }
    }
    out
}

/// One tile: tokens `t0..t0 + T`, weight rows `o0..o0 + R`, written to `part` ([tokens, width]
/// row-major, columns counted from `start`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn tile<const T: usize, const R: usize>(
    x: &[f32],
    w: &[f32],
    inputs: usize,
    bias: Option<&[f32]>,
    t0: usize,
    o0: usize,
    start: usize,
    width: usize,
    part: &mut [f32],
) {
    let body = inputs / 8 * 8;
    fn split(m: &[f32], i: usize, inputs: usize, body: usize) -> (&[[f32; 8]], &[f32]) {
        let r = &m[i * inputs..(i + 1) * inputs];
        (r[..body].as_chunks::<8>().0, &r[body..])
    }
    let row = |m, i| split(m, i, inputs, body);
    let xr: [(&[[f32; 8]], &[f32]); T] = std::array::from_fn(|t| row(x, t0 + t));
    let wr: [(&[[f32; 8]], &[f32]); R] = std::array::from_fn(|r| row(w, o0 + r));
    let out = dot_tile::<T, R>(
        xr.map(|p| p.0),
        wr.map(|p| p.0),
        xr.map(|p| p.1),
        wr.map(|p| p.1),
    );
    for (t, values) in out.iter().enumerate() {
        for (r, &v) in values.iter().enumerate() {
            let o = o0 + r;
            let mut value = v;
            if let Some(b) = bias {
                value += b[o];
            }
            part[(t0 + t) * width + (o - start)] = value;
        }
    }
}

/// Tokens `t0..t0 + T` against weight rows `start..end`: tiles of `R` rows, then single rows.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn tile_row<const T: usize, const R: usize>(
    x: &[f32],
    w: &[f32],
    inputs: usize,
    bias: Option<&[f32]>,
    t0: usize,
    start: usize,
    end: usize,
    part: &mut [f32],
) {
    let width = end - start;
    let mut o = start;
    while o + R <= end {
        tile::<T, R>(x, w, inputs, bias, t0, o, start, width, part);
        o += R;
    }
    while o < end {
        tile::<T, 1>(x, w, inputs, bias, t0, o, start, width, part);
        o += 1;
    }
}

/// The portable block kernel: tiles of [`TILE_TOKENS`] by [`TILE_ROWS`], written to `part`
/// ([tokens, end - start], row-major).
#[allow(clippy::too_many_arguments)]
fn portable_block(
    x: &[f32],
    w: &[f32],
    inputs: usize,
    tokens: usize,
    bias: Option<&[f32]>,
    start: usize,
    end: usize,
    part: &mut [f32],
) {
    const T: usize = TILE_TOKENS;
    const R: usize = TILE_ROWS;
    let mut t = 0;
    while t + T <= tokens {
        tile_row::<T, R>(x, w, inputs, bias, t, start, end, part);
        t += T;
    }
    while t < tokens {
        tile_row::<1, R>(x, w, inputs, bias, t, start, end, part);
        t += 1;
    }
}

/// [`linear`] with the given block kernel.
fn linear_with(
    x: ArrayView2<f32>,
    weight: ArrayView2<f32>,
    bias: Option<&[f32]>,
    kernel: Kernel,
) -> Array2<f32> {
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
    let parts: Vec<Vec<f32>> = (0..outputs.div_ceil(BLOCK))
        .into_par_iter()
        .map(|block| {
            let start = block * BLOCK;
            let end = (start + BLOCK).min(outputs);
            let mut part = vec![0f32; tokens * (end - start)];
            #[cfg(target_arch = "x86_64")]
            let block = x86::Block {
                x,
                w,
                inputs,
                tokens,
                bias,
                start,
                end,
            };
            match kernel {
                Kernel::Portable => {
                    portable_block(x, w, inputs, tokens, bias, start, end, &mut part)
                }
                #[cfg(target_arch = "x86_64")]
                Kernel::Avx2(proof) => proof.block(&block, &mut part),
                #[cfg(target_arch = "x86_64")]
                Kernel::Avx512(proof) => proof.block(&block, &mut part),
            }
            part
        })
        .collect();
    for (block, part) in parts.iter().enumerate() {
        let start = block * BLOCK;
        let width = part.len() / tokens;
        for (t, values) in part.chunks_exact(width).enumerate() {
            y.row_mut(t)
                .as_slice_mut()
                .expect("standard layout")
                .get_mut(start..start + width)
                .expect("block inside the row")
                .copy_from_slice(values);
        }
    }
    y
}

/// The oracle for [`linear`]: the same y = x W^T + b computed the plain way, one [`dot`] call per
/// output element (then `+ b`). [`linear`] must agree with it bit for bit on every input; the
/// tests check `to_bits()` equality. Slower, kept as the definition of the result.
pub fn linear_reference(
    x: ArrayView2<f32>,
    weight: ArrayView2<f32>,
    bias: Option<&[f32]>,
) -> Array2<f32> {
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

/// GELU with the tanh approximation (Gemma's `gelu_pytorch_tanh`, ggml's `ggml_gelu_f32`):
/// 0.5 x (1 + tanh(sqrt(2 / pi) x (1 + 0.044715 x^2))).
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const GELU_COEF_A: f32 = 0.044_715;
    0.5 * x * (1.0 + libm::tanhf(SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)))
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

    /// Deterministic pseudo-random bits from a 64-bit linear congruential generator.
    pub(super) struct Lcg(pub(super) u64);

    impl Lcg {
        pub(super) fn next(&mut self) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 32) as u32
        }
        pub(super) fn unit(&mut self) -> f32 {
            (self.next() >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        }
    }

    /// An input pattern for [`linear`] against [`linear_reference`]: value of entry `(i, j)` of
    /// the matrix numbered `which` (0: x, 1: W, 2: bias).
    fn pattern(kind: usize, rng: &mut Lcg, which: usize, i: usize, j: usize) -> f32 {
        match kind {
            // Random values over a wide range of exponents, signs and a few subnormals.
            0 => {
                let scale = match rng.next() % 8 {
                    0 => 1e-39,
                    1 => 1e-20,
                    2 => 1e3,
                    3 => 1e12,
                    _ => 1.0,
                };
                rng.unit() * scale
            }
            // Smooth patterns, as in the forward passes.
            1 => ((i * 37 + j * 11 + which * 5) as f32 * 0.37).sin(),
            // All at the maximum magnitude, or large enough to overflow in products and sums.
            2 => {
                let big = [f32::MAX, -f32::MAX, 3e38, 1.5e19, -1.5e19, 1e30];
                big[(i * 3 + j * 7 + which + rng.next() as usize % 2) % big.len()]
            }
            // Exact binary values whose sums round at ties (2^24 + 1 and the like).
            3 => {
                let ties = [
                    16_777_216.0,
                    1.0,
                    -1.0,
                    3.0,
                    0.5,
                    1.5,
                    -16_777_216.0,
                    8_388_608.0,
                ];
                ties[rng.next() as usize % ties.len()]
            }
            // Random ordinary values.
            _ => rng.unit(),
        }
    }

    fn assert_same_bits(fast: &Array2<f32>, reference: &Array2<f32>, what: &str) {
        assert_eq!(fast.dim(), reference.dim(), "{what}");
        for ((index, a), b) in fast.indexed_iter().zip(reference) {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{what}, element {index:?}: {a} vs {b}"
            );
        }
    }

    #[test]
    fn linear_matches_linear_reference_bit_for_bit_on_odd_shapes_and_hard_values() {
        let outputs_set = [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 63, 64, 65, 67, 70];
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let mut rng = Lcg(threads as u64);
                for tokens in 1..=9 {
                    for inputs in 0..=40 {
                        for (n, &outputs) in outputs_set.iter().enumerate() {
                            // Every pattern on every shape would be slow in debug builds: the
                            // pattern rotates over the shapes, every shape sees two of them.
                            for kind in [(tokens + inputs + n) % 5, (tokens * 3 + n) % 5] {
                                let x = Array2::from_shape_fn((tokens, inputs), |(i, j)| {
                                    pattern(kind, &mut rng, 0, i, j)
                                });
                                let w = Array2::from_shape_fn((outputs, inputs), |(i, j)| {
                                    pattern(kind, &mut rng, 1, i, j)
                                });
                                let b: Vec<f32> = (0..outputs)
                                    .map(|o| pattern(kind, &mut rng, 2, 0, o))
                                    .collect();
                                for (bias, kernel) in
                                    [None, Some(&b[..])].into_iter().flat_map(|b| {
                                        Kernel::available().into_iter().map(move |k| (b, k))
                                    })
                                {
                                    let what = format!(
                                        "{kernel:?}, {threads} threads, pattern {kind}, \
                                         [{tokens} x {inputs}] x [{outputs} x {inputs}]^T, bias {}",
                                        bias.is_some()
                                    );
                                    assert_same_bits(
                                        &linear_with(x.view(), w.view(), bias, kernel),
                                        &linear_reference(x.view(), w.view(), bias),
                                        &what,
                                    );
                                }
                            }
                        }
                    }
                }
            });
        }
    }

    #[test]
    fn linear_matches_linear_reference_on_a_large_random_shape_and_transposed_views() {
        let mut rng = Lcg(7);
        let x = Array2::from_shape_fn((13, 200), |_| rng.unit());
        let w = Array2::from_shape_fn((150, 200), |_| rng.unit());
        let b: Vec<f32> = (0..150).map(|_| rng.unit()).collect();
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                for kernel in Kernel::available() {
                    assert_same_bits(
                        &linear_with(x.view(), w.view(), Some(&b), kernel),
                        &linear_reference(x.view(), w.view(), Some(&b)),
                        &format!("{kernel:?}, standard layout"),
                    );
                }
                // Column-major views go through `as_standard_layout`.
                let xt = x.t().to_owned();
                let wt = w.t().to_owned();
                assert_same_bits(
                    &linear(xt.t(), wt.t(), None),
                    &linear_reference(x.view(), w.view(), None),
                    "transposed views",
                );
            });
        }
        let empty = linear(
            Array2::<f32>::zeros((0, 5)).view(),
            w.slice(ndarray::s![.., ..5]),
            None,
        );
        assert_eq!(empty.dim(), (0, 150));
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
