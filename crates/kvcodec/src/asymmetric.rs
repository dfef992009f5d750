//! Asymmetric per-group quantization: one float32 scale and one integer zero point per group,
//! codes 0..=2^b - 1 (min/max quantization with an integer zero point, as in KIVI's per-group
//! KV quantization; see the note on zero below).
//!
//! Spec (for the grouped view see [`crate::layout`], for the walk and the streams
//! [`crate::quantize`], for the bit order [`bitpack::stream`]); L = 2^b - 1, b from 1 to 8, all
//! arithmetic in f32 unless stated:
//! - Range: `lo = min(min(group), 0)`, `hi = max(max(group), 0)`. The range always contains 0, so
//!   0 is exactly a code (the zero point) and zero padding decodes to exact zeros. Without this,
//!   a group such as [100, 101] would need a zero point of about -1500 steps, which no b-bit
//!   field holds; KIVI sidesteps that by storing a float minimum instead of an integer zero point,
//!   at the cost of an extra float per group. The price here: a group far from 0 gets a coarser
//!   scale.
//! - Scale: `(hi - lo) / L`. If that is 0 (an all-zero group, or a range so small the division
//!   underflows) the scale is 1.0 and the zero point 0, so every code is 0 and decodes to 0,
//!   within scale / 2 of every value. If it overflows f32 (`hi - lo` beyond f32::MAX), encoding
//!   fails with [`crate::KvError::RangeOverflow`] naming the group.
//! - Zero point: `clamp(round_half_even(-lo / scale), 0, L)`, an integer code. In exact
//!   arithmetic `-lo / scale = L * (-lo) / (hi - lo)` lies in [0, L], so the clamp only guards
//!   against f32 rounding.
//! - Code: `clamp(round_half_even(x / scale) + zero, 0, L)`.
//! - Decode: `(code - zero) as f64 * scale as f64`.
//! - Bound: |decoded - x| <= scale / 2. Write zero = -lo/s + d with |d| <= 1/2. Unclamped,
//!   decoded = round(x/s) * s. Clamped at L (because round(x/s) >= L - zero), decoded =
//!   (L - zero) s = hi - d s (as L s = hi - lo), so x <= hi <= decoded + s/2, and
//!   x/s >= L - zero - 1/2 gives x >= decoded - s/2. Clamped at 0, decoded = -zero s = lo - d s
//!   and the mirror argument holds. In f32 each division is off by at most L * 2^-24 steps, so
//!   the tests allow scale * 1e-4 of slack.
//! - Storage: zero points are b-bit codes in their own stream (see [`crate::packed`]).

use bitpack::Bits;

/// The scale and zero point of one group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupParams {
    /// (hi - lo) / L, or 1.0 for a zero range.
    pub scale: f32,
    /// The integer zero point, a b-bit code.
    pub zero: u8,
}

/// The group's range, widened to contain 0: (min(min, 0), max(max, 0)).
pub fn group_range(group: &[f32]) -> (f32, f32) {
    group
        .iter()
        .fold((0f32, 0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

/// Scale and zero point for the range `lo <= 0 <= hi`, or `None` if the scale overflows f32.
pub fn group_params(lo: f32, hi: f32, bits: Bits) -> Option<GroupParams> {
    let levels = f32::from(bits.max_code());
    let scale = (hi - lo) / levels;
    if !scale.is_finite() {
        return None;
    }
    if scale == 0.0 {
        return Some(GroupParams {
            scale: 1.0,
            zero: 0,
        });
    }
    let zero = (-lo / scale).round_ties_even().clamp(0.0, levels) as u8;
    Some(GroupParams { scale, zero })
}

/// Stored code of one value: round-half-even of x / scale (in f32) plus the zero point,
/// clamped to 0..=2^b - 1.
pub fn quantize_value(x: f32, params: GroupParams, bits: Bits) -> u8 {
    let levels = f32::from(bits.max_code());
    let code = (x / params.scale).round_ties_even() + f32::from(params.zero);
    code.clamp(0.0, levels) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_always_contains_zero() {
        assert_eq!(group_range(&[1.0, 3.0]), (0.0, 3.0));
        assert_eq!(group_range(&[-2.0, -0.5]), (-2.0, 0.0));
        assert_eq!(group_range(&[-2.0, 5.0]), (-2.0, 5.0));
    }

    #[test]
    fn worked_example_4_bit_group_from_minus_1_to_2_75() {
        // L = 15, scale = 3.75 / 15 = 0.25, zero = round(1 / 0.25) = 4 (all exact in f32).
        let params = group_params(-1.0, 2.75, Bits::FOUR).unwrap();
        assert_eq!(
            params,
            GroupParams {
                scale: 0.25,
                zero: 4
            }
        );
        // -1 -> 0, 0 -> 4, 2.75 -> 15; 0.375 / 0.25 = 1.5 and 0.625 / 0.25 = 2.5 both round to
        // the even 2, then + 4.
        let codes: Vec<u8> = [-1.0, 0.0, 2.75, 0.375, 0.625]
            .iter()
            .map(|&x| quantize_value(x, params, Bits::FOUR))
            .collect();
        assert_eq!(codes, vec![0, 4, 15, 6, 6]);
    }

    #[test]
    fn all_zero_group_gets_scale_one_and_zero_point_zero() {
        let params = group_params(0.0, 0.0, Bits::TWO).unwrap();
        assert_eq!(
            params,
            GroupParams {
                scale: 1.0,
                zero: 0
            }
        );
        assert_eq!(quantize_value(0.0, params, Bits::TWO), 0);
    }

    #[test]
    fn constant_positive_group_uses_its_full_range() {
        // A constant group [c, c, ...] has range [0, c]: zero point 0, c at the top code.
        let params = group_params(0.0, 3.0, Bits::new(3).unwrap()).unwrap();
        assert_eq!(params.zero, 0);
        assert_eq!(quantize_value(3.0, params, Bits::new(3).unwrap()), 7);
    }

    #[test]
    fn overflowing_range_has_no_params() {
        assert_eq!(group_params(-f32::MAX, f32::MAX, Bits::ONE), None);
        assert!(group_params(-1e38, 1e38, Bits::ONE).is_some());
    }
}
