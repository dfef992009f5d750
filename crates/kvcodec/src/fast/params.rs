//! Per-group quantization parameters, computed exactly as [`crate::symmetric`] and
//! [`crate::asymmetric`] specify but without libm: the baseline x86_64 target has no rounding
//! instruction, so `round_ties_even` is a function call per value there.
//!
//! Every code is `round_half_even(clamp(x / scale, low, high)) + offset` with integer bounds
//! `low = -offset` and `high = max_stored - offset`. Clamping before rounding gives the same
//! integer as the specs' rounding before clamping (the bounds are integers and rounding is
//! monotonic), and after the clamp |v| <= 255, where adding and subtracting 1.5 * 2^23 rounds
//! half to even exactly (the sum lies in [2^23, 2^24), where the f32 spacing is 1).

/// What quantizing one group needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct GroupQuant {
    /// The group's scale, as stored.
    pub scale: f32,
    /// `-offset`: the smallest code before the offset.
    pub low: f32,
    /// `max_stored - offset`: the largest code before the offset.
    pub high: f32,
    /// qmax (symmetric) or the zero point (asymmetric).
    pub offset: i32,
}

/// 1.5 * 2^23: adding and subtracting it rounds an f32 of magnitude below 2^22 half to even.
pub(crate) const ROUNDING_SHIFT: f32 = 12_582_912.0;

/// Round half to even, for |v| < 2^22.
#[inline(always)]
pub(crate) fn round_half_even(v: f32) -> f32 {
    (v + ROUNDING_SHIFT) - ROUNDING_SHIFT
}

/// A symmetric group of largest magnitude `amax`: scale `amax / qmax`, or 1.0 when that is 0.
#[inline(always)]
pub(crate) fn symmetric(amax: f32, qmax: u8) -> GroupQuant {
    let q = f32::from(qmax);
    let scale = amax / q;
    GroupQuant {
        scale: if scale == 0.0 { 1.0 } else { scale },
        low: -q,
        high: q,
        offset: i32::from(qmax),
    }
}

/// An asymmetric group of range `lo <= 0 <= hi` at `levels` = 2^b - 1, or `None` when the
/// scale overflows f32.
#[inline(always)]
pub(crate) fn asymmetric(lo: f32, hi: f32, levels: u8) -> Option<GroupQuant> {
    let l = f32::from(levels);
    let scale = (hi - lo) / l;
    if !scale.is_finite() {
        return None;
    }
    if scale == 0.0 {
        return Some(GroupQuant {
            scale: 1.0,
            low: 0.0,
            high: l,
            offset: 0,
        });
    }
    let zero = round_half_even((-lo / scale).max(0.0).min(l));
    Some(GroupQuant {
        scale,
        low: -zero,
        high: l - zero,
        offset: zero as i32,
    })
}

/// The stored code of `x`. A NaN (only seen while an input with a non-finite value is being
/// refused) gives some code without panicking.
#[inline(always)]
pub(crate) fn quantize(x: f32, q: &GroupQuant) -> u8 {
    let v = (x / q.scale).max(q.low).min(q.high);
    (round_half_even(v) as i32 + q.offset) as u8
}

/// The decoded f32: `(code - offset) as f32 * scale`.
#[inline(always)]
pub(crate) fn dequantize(code: u8, offset: i32, scale: f32) -> f32 {
    (i32::from(code) - offset) as f32 * scale
}

/// Per-column parameters of one tile of a matrix grouped down its columns.
#[derive(Debug, Clone)]
pub(crate) struct ColumnQuant {
    /// Scales.
    pub scale: Vec<f32>,
    /// `-offset` per column.
    pub low: Vec<f32>,
    /// `max_stored - offset` per column.
    pub high: Vec<f32>,
    /// Offsets.
    pub offset: Vec<i32>,
}

impl ColumnQuant {
    /// Room for `cols` columns, set up for symmetric groups at `qmax` (whose bounds and offset
    /// never change) or for asymmetric ones (filled per tile).
    pub(crate) fn new(cols: usize, qmax: u8) -> Self {
        let q = f32::from(qmax);
        ColumnQuant {
            scale: vec![1.0; cols],
            low: vec![-q; cols],
            high: vec![q; cols],
            offset: vec![i32::from(qmax); cols],
        }
    }

    /// Column `c`'s parameters.
    #[inline(always)]
    pub(crate) fn get(&self, c: usize) -> GroupQuant {
        GroupQuant {
            scale: self.scale[c],
            low: self.low[c],
            high: self.high[c],
            offset: self.offset[c],
        }
    }

    /// Sets column `c`'s parameters.
    #[inline(always)]
    pub(crate) fn set(&mut self, c: usize, q: GroupQuant) {
        self.scale[c] = q.scale;
        self.low[c] = q.low;
        self.high[c] = q.high;
        self.offset[c] = q.offset;
    }

    /// Columns.
    pub(crate) fn cols(&self) -> usize {
        self.scale.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{asymmetric, symmetric};
    use bitpack::Bits;

    /// Values on and around every half step, and the edges of the rounding trick's range.
    fn probes() -> Vec<f32> {
        let mut v = vec![0.0, -0.0, 1e-45, -1e-45, 4194303.5, -4194303.5];
        for k in -300..=300 {
            let half = k as f32 + 0.5;
            v.extend([half, half.next_up(), half.next_down(), k as f32]);
        }
        v
    }

    #[test]
    fn rounding_trick_is_round_half_even_below_2_pow_22() {
        for v in probes() {
            assert_eq!(round_half_even(v), v.round_ties_even(), "{v}");
        }
    }

    #[test]
    fn symmetric_codes_match_the_spec() {
        for bits in 2..=8 {
            let qmax = Bits::new(bits).unwrap().qmax();
            for amax in [0.0f32, 1e-45, 3e-45, 1.0, 7.0, 0.3, 1e30, f32::MAX] {
                let q = symmetric(amax, qmax);
                assert_eq!(q.scale, symmetric::group_scale(&[amax], qmax));
                for x in probes() {
                    let x = x * q.scale / 2.0;
                    assert_eq!(
                        quantize(x, &q),
                        symmetric::quantize_value(x, q.scale, qmax),
                        "b{bits} amax {amax} x {x}"
                    );
                }
            }
        }
    }

    #[test]
    fn asymmetric_parameters_and_codes_match_the_spec() {
        for bits in 1..=8 {
            let b = Bits::new(bits).unwrap();
            let ranges = [
                (0.0f32, 0.0f32),
                (-1e-45, 0.0),
                (-1.0, 2.75),
                (-3.0, 0.0),
                (0.0, 5.0),
                (-0.7, 0.3),
                (-1e38, 1e38),
                (-3e38, 3e38),
                (-f32::MAX, 0.0),
                (-2.5, 2.5),
                (-1.0, 14.0),
            ];
            for (lo, hi) in ranges {
                let spec = asymmetric::group_params(lo, hi, b);
                let fast = asymmetric(lo, hi, b.max_code());
                assert_eq!(fast.is_none(), spec.is_none(), "b{bits} [{lo}, {hi}]");
                let (Some(spec), Some(fast)) = (spec, fast) else {
                    continue;
                };
                assert_eq!(
                    (fast.scale, fast.offset),
                    (spec.scale, i32::from(spec.zero))
                );
                for x in probes() {
                    let x = x * spec.scale / 2.0;
                    assert_eq!(
                        quantize(x, &fast),
                        asymmetric::quantize_value(x, spec, b),
                        "b{bits} [{lo}, {hi}] x {x}"
                    );
                }
            }
        }
    }
}
