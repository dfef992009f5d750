//! Symmetric per-group quantization: one float32 scale per group, no zero point.
//!
//! Spec (for the grouped view see [`crate::layout`], for the walk and the streams
//! [`crate::quantize`], for the bit order [`crate::bits`]):
//! - Widths: 2 to 8 bits; qmax = 2^(b-1) - 1 (1 at 2 bits, 7 at 4 bits, 127 at 8 bits).
//! - Scale per group: `max|x|` over the group (f32) divided by qmax (f32 division); a group whose
//!   maximum is 0 gets scale 1.0, so all-zero input decodes to exact zeros.
//! - Code: `clamp(round_half_even(x / scale), -qmax, qmax)`, the division done in f32, stored
//!   unsigned as `code + qmax`: 0..=2^b - 2 (4-bit 0..=14, so 15 is never written; 8-bit
//!   0..=254). This is an offset code, not two's-complement and not a codebook.
//! - Padding elements of a partial last group are zeros and quantize to the stored code qmax.
//! - Decode: `(stored - qmax) as f64 * scale as f64`, so |decoded - x| <= scale / 2 (up to the
//!   f32 division), because |x| <= qmax * scale.
//!
//! The 4-bit and 8-bit streams this writes are the archived evidence's format, byte for byte.

/// Scale of one group: max|x| / qmax in f32, or 1.0 for an all-zero group.
pub fn group_scale(group: &[f32], qmax: u8) -> f32 {
    let amax = group.iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 {
        1.0
    } else {
        amax / f32::from(qmax)
    }
}

/// Stored code of one value: round-half-even of x / scale (in f32), clamped, offset by qmax.
pub fn quantize_value(x: f32, scale: f32, qmax: u8) -> u8 {
    let q = f32::from(qmax);
    let code = (x / scale).round_ties_even().clamp(-q, q);
    (code + q) as u8
}
