//! llama.cpp's attention rotation (ggml-org/llama.cpp PR #21038, on by default for every
//! quantized cache type since 2026-04): an orthonormal Walsh-Hadamard matrix applied to q and k
//! after RoPE and to v before they are cached, and to the attention output before the output
//! projection.
//!
//! Spec (llama.cpp@0c1e57098, as vendored in llama-cpp-python 0.3.36):
//! - The matrix, `src/llama-kv-cache.cpp` l.21-59 (`ggml_gen_hadamard`): Sylvester doubling from
//!   `H[0][0] = 1/sqrt(n)`, so `H[i][j] = (-1)^popcount(i & j) / sqrt(n)`: symmetric, its own
//!   inverse, entries +-1/sqrt(n), no random signs. The constant is `(float)(1.0 /
//!   (double)sqrtf(n))`, built in f32.
//! - When, l.314-339: for K when the K cache type is quantized and head_dim % 64 == 0; for V
//!   likewise, decided separately; `LLAMA_ATTN_ROT_DISABLE=1` turns both off.
//! - Sizes: K, `build_input_k_rot` l.1447-1466: the largest power of two dividing head_dim (64
//!   for SmolLM2's 64); V, `build_input_v_rot` l.1468-1486: always 64.
//! - Where, `src/llama-graph.cpp` `build_attn` l.2883-2930, through `llama_mul_mat_hadamard`
//!   (`src/llama-impl.h` l.57-75): every run of n consecutive elements of a head's vector is
//!   multiplied by H (n divides head_dim, so runs never cross heads).
//!
//! Here the cache stores quantize(H k) and quantize(H v), exactly as llama.cpp's; attention
//! reads them back in the original basis, H dequantize(H k), since q . (H k') = (H q) . k' and
//! sum p_i H v'_i = H sum p_i v'_i for the symmetric orthonormal H. In exact arithmetic that is
//! llama.cpp's computation; in f32 the sums run in another order (a departure of rounding only,
//! bounded by the test that rotation alone leaves attention unchanged to float precision).

/// The rotation size llama.cpp uses for keys of `head_dim`: the largest power of two dividing
/// it, or `None` when head_dim is not a multiple of 64 (then llama.cpp does not rotate).
pub fn key_size(head_dim: usize) -> Option<usize> {
    if head_dim == 0 || !head_dim.is_multiple_of(64) {
        return None;
    }
    Some(1 << head_dim.trailing_zeros())
}

/// The rotation size for values: 64, when head_dim is a multiple of 64.
pub fn value_size(head_dim: usize) -> Option<usize> {
    (head_dim != 0 && head_dim.is_multiple_of(64)).then_some(64)
}

/// An n x n Walsh-Hadamard matrix, row-major, as llama.cpp builds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Hadamard {
    n: usize,
    entries: Vec<f32>,
}

impl Hadamard {
    /// The matrix of size `n`, a power of two of at least 1.
    pub fn new(n: usize) -> Option<Hadamard> {
        if !n.is_power_of_two() {
            return None;
        }
        // (float)(1.0 / (double)sqrtf(n)), as ggml_gen_hadamard computes it.
        let c = (1.0 / f64::from((n as f32).sqrt())) as f32;
        let mut entries = vec![0f32; n * n];
        entries[0] = c;
        let mut s = 1;
        while s < n {
            for i in 0..s {
                for j in 0..s {
                    let val = entries[i * n + j];
                    entries[(i + s) * n + j] = val;
                    entries[i * n + j + s] = val;
                    entries[(i + s) * n + j + s] = -val;
                }
            }
            s *= 2;
        }
        Some(Hadamard { n, entries })
    }

    /// Its size.
    pub fn size(&self) -> usize {
        self.n
    }

    /// `x` with every run of n consecutive elements multiplied by H (`x.len()` a multiple of n),
    /// each output element summed from 0 in index order in f32. ggml's CPU mat-mul sums in SIMD
    /// lanes, another order: the rotated values can differ from llama.cpp's in the last bit,
    /// which can move a value across a rounding boundary of the code (a departure of rounding
    /// only; gguf_py.json's `+rot` entries rotate in this order).
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        let n = self.n;
        let mut out = vec![0f32; x.len()];
        for (chunk, result) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
            for (i, r) in result.iter_mut().enumerate() {
                let row = &self.entries[i * n..(i + 1) * n];
                *r = row.iter().zip(chunk).fold(0f32, |acc, (h, v)| acc + h * v);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_llama_cpp() {
        assert_eq!(key_size(64), Some(64));
        assert_eq!(key_size(128), Some(128));
        assert_eq!(key_size(192), Some(64));
        assert_eq!(key_size(256), Some(256));
        assert_eq!(key_size(96), None);
        assert_eq!(value_size(128), Some(64));
        assert_eq!(value_size(32), None);
    }

    #[test]
    fn the_matrix_is_sylvesters_and_its_own_inverse() {
        let h = Hadamard::new(64).unwrap();
        for i in 0..64usize {
            for j in 0..64usize {
                let sign = if (i & j).count_ones() % 2 == 0 {
                    1.0
                } else {
                    -1.0
                };
                assert_eq!(h.entries[i * 64 + j], sign * 0.125, "[{i}, {j}]");
            }
        }
        let x: Vec<f32> = (0..128).map(|i| ((i * 37) % 11) as f32 - 5.3).collect();
        let back = h.apply(&h.apply(&x));
        for (a, b) in x.iter().zip(&back) {
            assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "{a} {b}");
        }
        assert!(Hadamard::new(48).is_none());
    }
}
