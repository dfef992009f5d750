//! Round-to-nearest (RTN) quantization of a float matrix into the logical matrix, with
//! per-group min-max asymmetric zero points: what GPTQ and AWQ checkpoints store before their
//! own steps (GPTQ's error feedback, AWQ's activation-aware scaling), so packing the result
//! with [`crate::gptq`] or [`crate::awq`] measures those layouts' resolution, not those methods.
//!
//! Spec, for weights `w` [K, N] (K = in-features, N = out-features; a PyTorch weight [out, in]
//! transposed), b bits, `maxq = 2^b - 1`, groups of `group_size` consecutive rows (the last may
//! be partial):
//! - per group g and column n: `lo = min(0, min w)`, `hi = max(0, max w)` over the group's rows
//!   (the range always holds 0, as GPTQ's `Quantizer` does, so the zero point is a code);
//! - `scale = f16((hi - lo) / maxq)` (f32 division, rounded to nearest even);
//! - `zero = clamp(round(-lo / scale), 0, maxq)` and
//!   `code = clamp(round(w / scale) + zero, 0, maxq)`, both from the f16-rounded scale (as
//!   AutoGPTQ's packer recomputes the codes from its f16 scales), rounding halves to even as
//!   `torch.round` does;
//! - a group whose scale is 0 (all weights 0, or a range too small for f16) stores zero point
//!   and codes `2^(b-1)`, which dequantize to 0 (a midpoint rather than 0, so that AutoGPTQ's
//!   "zero - 1" convention can store it too).
//!
//! Refused: non-finite weights, and a scale that rounds to infinity in f16 (a range above
//! about 65504 * maxq).

use half::f16;
use ndarray::{Array2, ArrayView2};

use crate::error::{FormatError, Result};
use crate::logical::LogicalWeights;

/// Quantizes `w` [K, N] to `bits`-bit codes with sequential groups of `group_size` rows (see
/// the module spec).
pub fn quantize(w: ArrayView2<f32>, bits: u32, group_size: usize) -> Result<LogicalWeights> {
    if !(1..=8).contains(&bits) {
        return Err(FormatError::UnsupportedBits {
            format: "RTN",
            bits,
            supported: "1- to 8-bit",
        });
    }
    if group_size == 0 {
        return Err(FormatError::ZeroGroupSize);
    }
    let (k, n) = w.dim();
    if k == 0 || n == 0 {
        return Err(FormatError::EmptyMatrix { rows: k, cols: n });
    }
    if let Some(((row, col), &value)) = w.indexed_iter().find(|(_, v)| !v.is_finite()) {
        return Err(FormatError::NonFinite { row, col, value });
    }
    let maxq = ((1u32 << bits) - 1) as f32;
    let midpoint = 1u8 << (bits - 1);
    let groups = k.div_ceil(group_size);
    let mut codes = Array2::<u8>::zeros((k, n));
    let mut scales = Array2::from_elem((groups, n), f16::ZERO);
    let mut zeros = Array2::<u8>::zeros((groups, n));
    for g in 0..groups {
        let rows = g * group_size..((g + 1) * group_size).min(k);
        for col in 0..n {
            let (mut lo, mut hi) = (0f32, 0f32);
            for row in rows.clone() {
                lo = lo.min(w[[row, col]]);
                hi = hi.max(w[[row, col]]);
            }
            let scale = f16::from_f32((hi - lo) / maxq);
            if scale.is_infinite() {
                return Err(FormatError::GroupScaleRoundsToInfinity {
                    group: g,
                    col,
                    low: lo,
                    high: hi,
                    bits,
                });
            }
            let s = scale.to_f32();
            if s == 0.0 {
                zeros[[g, col]] = midpoint;
                for row in rows.clone() {
                    codes[[row, col]] = midpoint;
                }
                continue;
            }
            let zero = (-lo / s).round_ties_even().clamp(0.0, maxq);
            scales[[g, col]] = scale;
            zeros[[g, col]] = zero as u8;
            for row in rows.clone() {
                let code = ((w[[row, col]] / s).round_ties_even() + zero).clamp(0.0, maxq);
                codes[[row, col]] = code as u8;
            }
        }
    }
    LogicalWeights::with_sequential_groups(bits, group_size, codes, scales, zeros)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn one_group_of_four_values_at_two_bits() {
        // Column 0: lo -1, hi 2, scale 1, zero 1: codes round(w) + 1.
        // Column 1: all positive, so lo is 0: scale 3/3 = 1, zero 0.
        let w = array![[-1.0f32, 0.0], [0.4, 1.0], [1.6, 2.9], [2.0, 3.0]];
        let q = quantize(w.view(), 2, 4).unwrap();
        assert_eq!(q.codes(), array![[0u8, 0], [1, 1], [3, 3], [3, 3]]);
        assert_eq!(q.scales(), array![[f16::ONE, f16::ONE]]);
        assert_eq!(q.zeros(), array![[1u8, 0]]);
        // 1.6 rounds to 2, then + zero 1 is 3; 2.0 + 1 = 3 as well.
        assert_eq!(
            q.dequantize(),
            array![[-1.0f32, 0.0], [0.0, 1.0], [2.0, 3.0], [2.0, 3.0]]
        );
    }

    #[test]
    fn groups_run_down_the_rows_and_each_weight_is_within_half_a_step() {
        let w = Array2::from_shape_fn((10, 3), |(k, n)| ((k * 7 + n * 3) as f32).sin() * 0.1);
        let q = quantize(w.view(), 4, 4).unwrap();
        assert_eq!(q.groups(), 3);
        assert_eq!(q.g_idx(), [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]);
        let back = q.dequantize();
        for ((k, n), &v) in w.indexed_iter() {
            let step = q.scales()[[k / 4, n]].to_f32();
            assert!((back[[k, n]] - v).abs() <= step / 2.0 + 1e-6, "[{k}, {n}]");
        }
    }

    #[test]
    fn a_zero_group_dequantizes_to_zero_and_bad_input_is_refused() {
        let q = quantize(Array2::zeros((3, 2)).view(), 4, 2).unwrap();
        assert!(q.dequantize().iter().all(|&v| v == 0.0));
        assert_eq!(q.zeros()[[0, 0]], 8);
        let nan = array![[1.0f32, f32::NAN]];
        assert!(matches!(
            quantize(nan.view(), 4, 1),
            Err(FormatError::NonFinite { row: 0, col: 1, .. })
        ));
        let huge = array![[-1e6f32], [1e6]];
        let err = quantize(huge.view(), 4, 2).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::GroupScaleRoundsToInfinity {
                    group: 0,
                    col: 0,
                    ..
                }
            ),
            "{err}"
        );
        assert!(quantize(array![[1.0f32]].view(), 9, 1).is_err());
        assert!(quantize(array![[1.0f32]].view(), 4, 0).is_err());
    }
}
