//! llama.cpp's attention rotation (`llamacpp-TYPE+rot`, PR #21038, on by default for quantized
//! cache types) as the audit reads it: the row is multiplied by a Walsh-Hadamard matrix H before
//! it is quantized, and attention reads H times the decoded row (H is symmetric and its own
//! inverse, so that is the original basis).
//!
//! Spec, from llama.cpp@0c1e57098 (docs/schemes-sources.md 2.5):
//! - The matrix, `src/llama-kv-cache.cpp` l.21-59 `ggml_gen_hadamard`: Sylvester doubling from
//!   `H[0][0] = c`, so `H[i][j] = c` when popcount(i & j) is even and -c when odd, with the f32
//!   constant c = `(float)(1.0 / (double)sqrtf(n))`.
//! - The sizes, l.1447-1486: for K the largest power of two dividing head_dim
//!   (`build_input_k_rot`), for V always 64 (`build_input_v_rot`); both only when head_dim is a
//!   multiple of 64 (l.314-339; the audit, like kvschemes, refuses other head sizes for `+rot`
//!   rather than not rotating).
//! - Where, `src/llama-impl.h` l.57-75 `llama_mul_mat_hadamard`: every run of n consecutive
//!   elements of a head's row is multiplied by H.
//! - The arithmetic, as kvschemes fixes it (ggml sums in its own order; this is a rounding-only
//!   departure of kvschemes from llama.cpp that the audit follows): each output element
//!   `(H x)[i]` is summed in f32 from +0.0, adding `H[i][j] * x[j]` for j = 0, 1, ..., n - 1 in
//!   that order, each product and sum rounded to f32 (no FMA).

/// The rotation size for keys of `head_dim`: the largest power of two dividing it, when
/// head_dim is a positive multiple of 64.
pub fn key_size(head_dim: usize) -> Option<usize> {
    (head_dim > 0 && head_dim.is_multiple_of(64)).then(|| 1 << head_dim.trailing_zeros())
}

/// The rotation size for values: 64, when head_dim is a positive multiple of 64.
pub fn value_size(head_dim: usize) -> Option<usize> {
    (head_dim > 0 && head_dim.is_multiple_of(64)).then_some(64)
}

/// An n x n Walsh-Hadamard matrix, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Hadamard {
    n: usize,
    entries: Vec<f32>,
}

impl Hadamard {
    /// The matrix of size `n`, a power of two: `H[i][j]` = c, negated when popcount(i & j) is odd.
    pub fn new(n: usize) -> Option<Hadamard> {
        if !n.is_power_of_two() {
            return None;
        }
        let c = (1.0 / f64::from((n as f32).sqrt())) as f32;
        let entries = (0..n * n)
            .map(|k| {
                let (i, j) = (k / n, k % n);
                if (i & j).count_ones() % 2 == 0 { c } else { -c }
            })
            .collect();
        Some(Hadamard { n, entries })
    }

    /// `H[i][j]`.
    pub fn entry(&self, i: usize, j: usize) -> f32 {
        self.entries[i * self.n + j]
    }

    /// `x` (a multiple of n values) with every run of n multiplied by H, summed as the module
    /// docs say. (The sums of a run advance together, j outermost, reading column j as row j of
    /// the symmetric H: each output still adds its terms in index order.)
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        let n = self.n;
        let mut out = vec![0f32; x.len()];
        for (run, sums) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
            for (column, &xj) in self.entries.chunks_exact(n).zip(run) {
                for (sum, &h) in sums.iter_mut().zip(column) {
                    *sum += h * xj;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_entries_follow_llama_cpp() {
        assert_eq!(key_size(64), Some(64));
        assert_eq!(key_size(192), Some(64));
        assert_eq!(key_size(256), Some(256));
        assert_eq!(key_size(96), None);
        assert_eq!(value_size(128), Some(64));
        assert_eq!(value_size(32), None);
        // n = 4: c = 1/2, rows (+ + + +), (+ - + -), (+ + - -), (+ - - +).
        let h = Hadamard::new(4).unwrap();
        let signs: Vec<f32> = (0..16).map(|k| h.entry(k / 4, k % 4) * 2.0).collect();
        assert_eq!(
            signs,
            [
                1., 1., 1., 1., 1., -1., 1., -1., 1., 1., -1., -1., 1., -1., -1., 1.
            ]
        );
        assert_eq!(
            h.apply(&[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0]),
            [0.5, 0.5, 0.5, 0.5, 1.0, -1.0, -1.0, 1.0]
        );
        assert!(Hadamard::new(48).is_none());
    }
}
