//! Symmetric per-group quantization: one float32 scale per group, no zero point.
//!
//! Spec (for the grouped view see [`crate::layout`], for the walk and the streams
//! [`crate::quantize`], for the bit order [`bitpack::stream`]):
//! - Widths: 2 to 8 bits; qmax = 2^(b-1) - 1 (1 at 2 bits, 7 at 4 bits, 127 at 8 bits).
//! - Scale per group: `max|x|` over the group (f32) divided by qmax (f32 division); a group whose
//!   maximum is 0 gets scale 1.0, so all-zero input decodes to exact zeros. So does a group so
//!   tiny that the division underflows to 0 (subnormal maxima): a zero scale could not be stored
//!   or divided by, and with scale 1.0 every code is 0, within scale / 2 of every value.
//! - Code: `clamp(round_half_even(x / scale), -qmax, qmax)`, the division done in f32, stored
//!   unsigned as `code + qmax`: 0..=2^b - 2 (4-bit 0..=14, so 15 is never written; 8-bit
//!   0..=254). This is an offset code, not two's-complement and not a codebook.
//! - Padding elements of a partial last group are zeros and quantize to the stored code qmax.
//! - Decode: `(stored - qmax) as f64 * scale as f64`, so |decoded - x| <= scale / 2 (up to the
//!   f32 division), because |x| <= qmax * scale.
//!
//! The 4-bit and 8-bit streams this writes are the archived evidence's format, byte for byte.

/// Scale of one group: max|x| / qmax in f32, or 1.0 when that is 0 (an all-zero group, or one
/// whose maximum is so small that the division underflows).
pub fn group_scale(group: &[f32], qmax: u8) -> f32 {
    let amax = group.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = amax / f32::from(qmax);
    if scale == 0.0 { 1.0 } else { scale }
}

/// Stored code of one value: round-half-even of x / scale (in f32), clamped, offset by qmax.
pub fn quantize_value(x: f32, scale: f32, qmax: u8) -> u8 {
    let q = f32::from(qmax);
    let code = (x / scale).round_ties_even().clamp(-q, q);
    (code + q) as u8
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_subnormal_group_gets_scale_one() {
        // 1e-45 / 7 underflows to 0 in f32; the group is stored like an all-zero one.
        let tiny = f32::from_bits(1);
        assert_eq!(super::group_scale(&[tiny, -tiny], 7), 1.0);
        assert_eq!(super::group_scale(&[0.0, 0.0], 7), 1.0);
        assert_eq!(super::group_scale(&[7.0, -3.5], 7), 1.0);
        assert_eq!(super::group_scale(&[14.0], 7), 2.0);
    }
}
