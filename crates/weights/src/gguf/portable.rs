//! The portable fast kernels: safe Rust (but for a prefetch hint on x86-64) written so that the baseline x86-64 target (SSE2)
//! vectorizes each block's 32 lanes, bit-identical to the reference (see the module spec).
//!
//! - `amax` is the integer maximum of the magnitudes' bits, which orders finite floats as the
//!   floats compare; NaN and infinity have the largest bits, so `amax >= 0x7F800000` flags a
//!   non-finite value and the caller redoes the run with the reference to name it.
//! - Q4_0's signed maximum is the first element whose magnitude equals `amax` (a 32-bit mask
//!   and its lowest set bit), and +0 for a block of zeros (the reference never updates it then).
//! - Truncation and rounding avoid `f32::trunc`, `f32::round` (library calls without SSE4.1)
//!   and saturating `as` conversions (scalar code on SSE2): for 0 <= y < 2^22, `y + 2^23` is
//!   2^23 plus y rounded to the nearest integer, ties to even, exactly, and its mantissa bits
//!   are that integer n. Then trunc(y) = n - (n > y) for y >= 0 (Q4_0's codes), and
//!   round-half-away(|y|) = n + (|y| - n == 0.5) (Q8_0's, sign restored after); both
//!   differences are exact.

use half::f16;

use super::{BlockQ4_0, BlockQ8_0};

const MAGNITUDE: u32 = 0x7FFF_FFFF;
/// 2^23: for 0 <= y < 2^22, `y + MAGIC` is 2^23 plus y rounded to the nearest integer (ties to
/// even), exactly, and its low mantissa bits are that integer.
const MAGIC: f32 = 8_388_608.0;

/// The bits of a block's largest magnitude: the integer maximum of the magnitudes' bits, which
/// orders finite floats as they compare, and is 0x7F800000 or more when a value is NaN or
/// infinite.
#[inline(always)]
fn amax_bits(x: &[f32; 32]) -> u32 {
    let mut amax = [0u32; 8];
    for chunk in x.chunks_exact(8) {
        for (m, &v) in amax.iter_mut().zip(chunk) {
            *m = (*m).max(v.to_bits() & MAGNITUDE);
        }
    }
    amax.into_iter().fold(0, u32::max)
}

/// Whether the reference accepts a block with largest magnitude bits `amax` and stored scale
/// `d`: finite values, a finite scale, and a scale of 0 only for a block of zeros.
#[inline(always)]
fn accepted(d: f16, amax: u32) -> bool {
    let bits = d.to_bits();
    amax < 0x7F80_0000 && bits & 0x7C00 != 0x7C00 && (bits & 0x7FFF != 0 || amax == 0)
}

/// One Q4_0 block; false when the reference must decide (non-finite input, refused scale).
#[inline(always)]
fn quantize_q4_0(x: &[f32; 32], out: &mut BlockQ4_0) -> bool {
    let amax = amax_bits(x);
    let mut first = 0u32;
    for (j, &v) in x.iter().enumerate() {
        first |= u32::from(v.to_bits() & MAGNITUDE == amax) << j;
    }
    let max = if amax == 0 {
        0.0
    } else {
        x[(first.trailing_zeros() & 31) as usize]
    };
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    // x * id is in [-8, 8] for finite blocks, so y is in [0.5, 16.5] and min(15, trunc(y)) is
    // floor(min(y, 15)). (The clamp below 0 and the NaN case are for refused blocks only.)
    let mut codes = [0u8; 32];
    for (code, &v) in codes.iter_mut().zip(x) {
        let y = v * id + 8.5;
        let y = if y < 15.0 { y } else { 15.0 };
        let y = if y > 0.0 { y } else { 0.0 };
        let t = y + MAGIC; // 2^23 + y rounded to the nearest integer, exactly
        let below = u32::from(t - MAGIC > y);
        *code = (t
            .to_bits()
            .wrapping_sub(MAGIC.to_bits())
            .wrapping_sub(below)) as u8;
    }
    for (j, q) in out.qs.iter_mut().enumerate() {
        *q = codes[j] | (codes[j + 16] << 4);
    }
    out.d = f16::from_f32(d);
    accepted(out.d, amax)
}

/// One Q8_0 block; false when the reference must decide.
#[inline(always)]
fn quantize_q8_0(x: &[f32; 32], out: &mut BlockQ8_0) -> bool {
    let amax = amax_bits(x);
    let d = f32::from_bits(amax) / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    // |y| <= 127 (plus rounding) for finite blocks: the conversions are exact truncations.
    // |y| <= 127 (plus rounding) for finite blocks; the clamp at 128 is for refused ones.
    for (q, &v) in out.qs.iter_mut().zip(x) {
        let y = (v * id).to_bits();
        let a = f32::from_bits(y & MAGNITUDE);
        let a = if a < 128.0 { a } else { 128.0 };
        let t = a + MAGIC; // 2^23 + a rounded to the nearest integer (ties to even), exactly
        let tie = u32::from(a - (t - MAGIC) == 0.5); // a tie rounded down: round up instead
        let n = t.to_bits().wrapping_sub(MAGIC.to_bits()).wrapping_add(tie);
        let sign = ((y as i32) >> 31) as u32;
        *q = ((n ^ sign).wrapping_sub(sign)) as i8;
    }
    out.d = f16::from_f32(d);
    accepted(out.d, amax)
}

/// Asks for the input 512 floats (2 KiB) ahead of `values` on x86 (SSE's prefetch is in the
/// baseline target); elsewhere nothing.
#[inline(always)]
fn prefetch(values: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let ahead = values.as_ptr().wrapping_add(512).cast::<i8>();
        // SAFETY: SSE is part of every x86-64 target's baseline, so the CPU has it; a prefetch
        // is a hint that never faults, whatever the address.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = values;
}

/// Quantizes whole Q4_0 blocks; false when some block needs the reference.
pub(super) fn quantize_run_q4_0(x: &[f32], out: &mut [BlockQ4_0]) -> bool {
    let mut ok = true;
    for (values, block) in x.chunks_exact(32).zip(out) {
        prefetch(values);
        ok &= quantize_q4_0(values.try_into().expect("chunks of 32"), block);
    }
    ok
}

/// Quantizes whole Q8_0 blocks; false when some block needs the reference.
pub(super) fn quantize_run_q8_0(x: &[f32], out: &mut [BlockQ8_0]) -> bool {
    let mut ok = true;
    for (values, block) in x.chunks_exact(32).zip(out) {
        prefetch(values);
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
