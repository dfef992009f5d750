//! The portable fast kernels: safe Rust written so that the baseline x86-64 target (SSE2)
//! vectorizes each block's 32 lanes, bit-identical to the reference (see the module spec).
//!
//! - `amax` is the largest of the magnitudes `|x|` compared as floats with `>`, which for
//!   finite values is the reference's maximum; a non-finite value is flagged from its exponent
//!   bits instead, and the caller redoes the run with the reference, which names the error.
//! - Q4_0's signed maximum is the first element whose magnitude equals `amax` (a 32-bit mask
//!   and its lowest set bit), and +0 for a block of zeros (the reference never updates it then).
//! - Truncation and rounding use integer conversion instead of `f32::trunc` and `f32::round`
//!   (which may be library calls without SSE4.1): for |y| < 2^23, `y - trunc(y)` is exact, so
//!   round-half-away(y) = trunc(y) + trunc(2 * (y - trunc(y))).

use half::f16;

use super::{BlockQ4_0, BlockQ8_0};

const SIGN: u32 = 0x8000_0000;
const EXPONENT: u32 = 0x7F80_0000;

/// The largest magnitude of a block, and whether any value is NaN or infinite.
#[inline(always)]
fn amax_and_finite(x: &[f32; 32]) -> (f32, bool) {
    let mut amax = [0f32; 8];
    let mut non_finite = [0u32; 8];
    for chunk in x.chunks_exact(8) {
        for lane in 0..8 {
            let bits = chunk[lane].to_bits();
            let a = f32::from_bits(bits & !SIGN);
            amax[lane] = if a > amax[lane] { a } else { amax[lane] };
            non_finite[lane] |= u32::from(bits & EXPONENT == EXPONENT);
        }
    }
    let amax = amax.iter().fold(0f32, |m, &a| if a > m { a } else { m });
    (amax, non_finite.iter().all(|&f| f == 0))
}

/// Whether the stored scale is one the reference accepts for a block whose largest magnitude
/// is `amax`: finite, and not 0 unless every value is 0.
#[inline(always)]
fn scale_accepted(d: f16, amax: f32) -> bool {
    let bits = d.to_bits();
    bits & 0x7C00 != 0x7C00 && (bits & 0x7FFF != 0 || amax == 0.0)
}

/// One Q4_0 block; false when the reference must decide (non-finite input, refused scale).
#[inline(always)]
fn quantize_q4_0(x: &[f32; 32], out: &mut BlockQ4_0) -> bool {
    let (amax, finite) = amax_and_finite(x);
    let mut first = 0u32;
    for (j, &v) in x.iter().enumerate() {
        first |= u32::from(f32::from_bits(v.to_bits() & !SIGN) == amax) << j;
    }
    let max = if amax == 0.0 {
        0.0
    } else {
        x[(first.trailing_zeros() & 31) as usize]
    };
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    // x * id is in [-8, 8] for finite blocks, so y is in [0.5, 16.5]: min(15, trunc(y)) is
    // trunc(min(y, 15)), and the conversion neither saturates nor meets NaN.
    let codes: [u8; 32] = x.map(|v| {
        let y = v * id + 8.5;
        (if y < 15.0 { y } else { 15.0 }) as i32 as u8
    });
    out.qs = std::array::from_fn(|j| codes[j] | (codes[j + 16] << 4));
    out.d = f16::from_f32(d);
    finite && scale_accepted(out.d, amax)
}

/// One Q8_0 block; false when the reference must decide.
#[inline(always)]
fn quantize_q8_0(x: &[f32; 32], out: &mut BlockQ8_0) -> bool {
    let (amax, finite) = amax_and_finite(x);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    // |y| <= 127 (plus rounding) for finite blocks: the conversions are exact truncations.
    out.qs = x.map(|v| {
        let y = v * id;
        let t = y as i32;
        let frac = y - t as f32;
        (t + (frac + frac) as i32) as i8
    });
    out.d = f16::from_f32(d);
    finite && scale_accepted(out.d, amax)
}

/// Quantizes whole Q4_0 blocks; false when some block needs the reference.
pub(super) fn quantize_run_q4_0(x: &[f32], out: &mut [BlockQ4_0]) -> bool {
    let mut ok = true;
    for (values, block) in x.chunks_exact(32).zip(out) {
        ok &= quantize_q4_0(values.try_into().expect("chunks of 32"), block);
    }
    ok
}

/// Quantizes whole Q8_0 blocks; false when some block needs the reference.
pub(super) fn quantize_run_q8_0(x: &[f32], out: &mut [BlockQ8_0]) -> bool {
    let mut ok = true;
    for (values, block) in x.chunks_exact(32).zip(out) {
        ok &= quantize_q8_0(values.try_into().expect("chunks of 32"), block);
    }
    ok
}

/// Dequantizes Q4_0 blocks into `out` (32 values per block).
pub(super) fn dequantize_run_q4_0(blocks: &[BlockQ4_0], out: &mut [f32]) {
    for (block, values) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = block.d.to_f32();
        let (low, high) = values.split_at_mut(16);
        for ((&byte, lo), hi) in block.qs.iter().zip(low).zip(high) {
            *lo = (i32::from(byte & 0x0F) - 8) as f32 * d;
            *hi = (i32::from(byte >> 4) - 8) as f32 * d;
        }
    }
}

/// Dequantizes Q8_0 blocks into `out` (32 values per block).
pub(super) fn dequantize_run_q8_0(blocks: &[BlockQ8_0], out: &mut [f32]) {
    for (block, values) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = block.d.to_f32();
        for (&q, v) in block.qs.iter().zip(values) {
            *v = f32::from(q) * d;
        }
    }
}
