//! The AVX2 kernels (std::arch, chosen at run time when the CPU has AVX2), bit-identical to the
//! reference (see the module spec). No FMA: `x * id + 8.5` stays a rounded product, then a
//! rounded sum, as in ggml's C.
//!
//! - `amax` is the integer maximum of the magnitudes' bits, which orders finite floats as the
//!   floats compare; NaN and infinity have the largest bits, so `amax >= 0x7F800000` flags a
//!   non-finite value and the caller redoes the run with the reference to name it.
//! - Q4_0's signed maximum is the first lane whose magnitude bits equal `amax` (a movemask and
//!   its lowest set bit), +0 for a block of zeros. Its code is the truncating conversion,
//!   capped at 15 in integers.
//! - Q8_0's round-half-away is trunc(y) + trunc(2 * (y - trunc(y))), exact for |y| < 2^23.
//!
//! Every function here is `unsafe` only because it is compiled with `avx2` enabled; callers
//! check `is_x86_feature_detected!("avx2")` first. Loads and stores are unaligned, through
//! pointers to arrays of exactly the width they move.

#[cfg(target_arch = "x86")]
use std::arch::x86::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use half::f16;

use super::{BlockQ4_0, BlockQ8_0};

/// The four 8-lane vectors of a block, and its largest magnitude's bits (>= 0x7F800000 when a
/// value is not finite).
#[inline]
#[target_feature(enable = "avx2")]
fn load_block(x: &[f32; 32]) -> ([__m256; 4], u32) {
    let v: [__m256; 4] = std::array::from_fn(|i| {
        let lanes: &[f32; 8] = x[8 * i..8 * i + 8].try_into().expect("8 lanes");
        // SAFETY: `lanes` is 8 readable f32 (32 bytes); loadu needs no alignment.
        unsafe { _mm256_loadu_ps(lanes.as_ptr()) }
    });
    let magnitude = _mm256_set1_epi32(0x7FFF_FFFF);
    let bits = v.map(|v| _mm256_and_si256(_mm256_castps_si256(v), magnitude));
    let m = _mm256_max_epi32(
        _mm256_max_epi32(bits[0], bits[1]),
        _mm256_max_epi32(bits[2], bits[3]),
    );
    let m = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256::<1>(m));
    let m = _mm_max_epi32(m, _mm_shuffle_epi32::<0b01_00_11_10>(m));
    let m = _mm_max_epi32(m, _mm_shuffle_epi32::<0b10_11_00_01>(m));
    (v, _mm_cvtsi128_si32(m) as u32)
}

/// Asks for the input [`PREFETCH`] floats ahead of `values` (the hardware prefetcher alone
/// leaves the loads of a block waiting on memory).
#[inline]
#[target_feature(enable = "avx2")]
fn prefetch(values: &[f32]) {
    let ahead = values.as_ptr().wrapping_add(PREFETCH).cast::<i8>();
    // SAFETY: a prefetch is a hint that never faults, whatever the address. (Newer compilers
    // call it safe here; Rust 1.89, the workspace's rust-version, needs the block.)
    #[allow(unused_unsafe)]
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(ahead);
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
    }
}

/// How far ahead the quantizers prefetch, in floats.
const PREFETCH: usize = 768;

/// Whether the reference accepts the stored scale of a block with magnitude bits `amax`.
#[inline]
fn accepted(d: f16, amax: u32) -> bool {
    let bits = d.to_bits();
    amax < 0x7F80_0000 && bits & 0x7C00 != 0x7C00 && (bits & 0x7FFF != 0 || amax == 0)
}

/// One Q4_0 block; false when the reference must decide.
#[inline]
#[target_feature(enable = "avx2")]
fn quantize_q4_0(x: &[f32; 32], out: &mut BlockQ4_0) -> bool {
    let (v, amax) = load_block(x);
    let max = if amax == 0 {
        0.0
    } else {
        let target = _mm256_set1_epi32(amax as i32);
        let magnitude = _mm256_set1_epi32(0x7FFF_FFFF);
        let mut mask = 0u32;
        for (i, &v) in v.iter().enumerate() {
            let bits = _mm256_and_si256(_mm256_castps_si256(v), magnitude);
            let eq = _mm256_castsi256_ps(_mm256_cmpeq_epi32(bits, target));
            mask |= (_mm256_movemask_ps(eq) as u32) << (8 * i);
        }
        x[(mask.trailing_zeros() & 31) as usize]
    };
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let (id, half) = (_mm256_set1_ps(id), _mm256_set1_ps(8.5));
    let fifteen = _mm256_set1_epi32(15);
    let q = v.map(|v| {
        let y = _mm256_add_ps(_mm256_mul_ps(v, id), half);
        _mm256_min_epi32(_mm256_cvttps_epi32(y), fifteen)
    });
    // Byte j = code j | code j + 16 << 4: lanes 0..8 with 16..24, 8..16 with 24..32.
    let w0 = _mm256_or_si256(q[0], _mm256_slli_epi32::<4>(q[2]));
    let w1 = _mm256_or_si256(q[1], _mm256_slli_epi32::<4>(q[3]));
    // packs interleaves 128-bit halves: [0..4, 8..12, 4..8, 12..16]; the permute restores order.
    let w = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(w0, w1));
    let bytes = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w));
    // SAFETY: `out.qs` is 16 writable bytes; storeu needs no alignment.
    unsafe { _mm_storeu_si128(out.qs.as_mut_ptr().cast(), bytes) };
    out.d = f16::from_f32(d);
    accepted(out.d, amax)
}

/// One Q8_0 block; false when the reference must decide.
#[inline]
#[target_feature(enable = "avx2")]
fn quantize_q8_0(x: &[f32; 32], out: &mut BlockQ8_0) -> bool {
    let (v, amax) = load_block(x);
    let d = f32::from_bits(amax) / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let id = _mm256_set1_ps(id);
    const TRUNC: i32 = _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC;
    let q = v.map(|v| {
        let y = _mm256_mul_ps(v, id);
        let t = _mm256_round_ps::<TRUNC>(y);
        let frac = _mm256_sub_ps(y, t);
        let away = _mm256_round_ps::<TRUNC>(_mm256_add_ps(frac, frac));
        _mm256_cvttps_epi32(_mm256_add_ps(t, away))
    });
    // Saturating packs keep the codes in -127..=127; the permute undoes the lane interleave.
    let w = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: `out.qs` is 32 writable bytes; storeu needs no alignment.
    unsafe { _mm256_storeu_si256(out.qs.as_mut_ptr().cast(), w) };
    out.d = f16::from_f32(d);
    accepted(out.d, amax)
}

/// Quantizes whole Q4_0 blocks; false when some block needs the reference.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_run_q4_0(x: &[f32], out: &mut [BlockQ4_0]) -> bool {
    let mut ok = true;
    for (values, block) in x.chunks_exact(32).zip(out) {
        prefetch(values);
        ok &= quantize_q4_0(values.try_into().expect("chunks of 32"), block);
    }
    ok
}

/// Quantizes whole Q8_0 blocks; false when some block needs the reference.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_run_q8_0(x: &[f32], out: &mut [BlockQ8_0]) -> bool {
    let mut ok = true;
    for (values, block) in x.chunks_exact(32).zip(out) {
        prefetch(values);
        ok &= quantize_q8_0(values.try_into().expect("chunks of 32"), block);
    }
    ok
}

/// Stores 32 lanes of i32 codes, times `d`, into `out`; with `STREAM`, as non-temporal
/// stores, which need `out` 16-byte aligned.
#[inline]
#[target_feature(enable = "avx2")]
fn store_scaled<const STREAM: bool>(q: [__m256i; 4], d: f32, out: &mut [f32]) {
    let d = _mm256_set1_ps(d);
    for (q, lanes) in q.into_iter().zip(out.chunks_exact_mut(8)) {
        let value = _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
        if STREAM {
            let (low, high) = lanes.split_at_mut(4);
            assert!(low.as_ptr().cast::<__m128>().is_aligned(), "see `streams`");
            // SAFETY: `low` and `high` are 4 writable f32 each, 16-byte aligned (asserted).
            unsafe {
                _mm_stream_ps(low.as_mut_ptr(), _mm256_castps256_ps128(value));
                _mm_stream_ps(high.as_mut_ptr(), _mm256_extractf128_ps::<1>(value));
            }
        } else {
            // SAFETY: `lanes` is 8 writable f32 (chunks_exact_mut(8)); storeu needs no alignment.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), value) };
        }
    }
}

/// Outputs from this many bytes on are written with non-temporal stores: they would not stay in
/// cache anyway, and streaming them skips reading each destination line before writing it.
const STREAM_BYTES: usize = 8 << 20;

/// Whether to stream `out`: large, and 16-byte aligned as `_mm_stream_ps` needs (each block
/// then starts a multiple of 128 bytes, each half-vector of 4 lanes a multiple of 16, after it).
fn streams(out: &[f32]) -> bool {
    out.len() * 4 >= STREAM_BYTES && out.as_ptr().cast::<__m128>().is_aligned()
}

/// Dequantizes Q4_0 blocks into `out` (32 values per block).
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dequantize_run_q4_0(blocks: &[BlockQ4_0], out: &mut [f32]) {
    if streams(out) {
        dequantize_q4_0::<true>(blocks, out);
        // SAFETY: SSE is part of x86_64 (the block is for Rust 1.89, as above).
        #[allow(unused_unsafe)]
        unsafe {
            _mm_sfence()
        };
    } else {
        dequantize_q4_0::<false>(blocks, out);
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn dequantize_q4_0<const STREAM: bool>(blocks: &[BlockQ4_0], out: &mut [f32]) {
    let (low, eight) = (_mm_set1_epi8(0x0F), _mm256_set1_epi32(8));
    for (block, values) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        // SAFETY: `block.qs` is 16 readable bytes; loadu needs no alignment.
        let bytes = unsafe { _mm_loadu_si128(block.qs.as_ptr().cast()) };
        let lo = _mm_and_si128(bytes, low);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(bytes), low);
        let widen = |v: __m128i| _mm256_sub_epi32(_mm256_cvtepu8_epi32(v), eight);
        let q = [
            widen(lo),
            widen(_mm_srli_si128::<8>(lo)),
            widen(hi),
            widen(_mm_srli_si128::<8>(hi)),
        ];
        store_scaled::<STREAM>(q, block.d.to_f32(), values);
    }
}

/// Dequantizes Q8_0 blocks into `out` (32 values per block).
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dequantize_run_q8_0(blocks: &[BlockQ8_0], out: &mut [f32]) {
    if streams(out) {
        dequantize_q8_0::<true>(blocks, out);
        // SAFETY: SSE is part of x86_64 (the block is for Rust 1.89, as above).
        #[allow(unused_unsafe)]
        unsafe {
            _mm_sfence()
        };
    } else {
        dequantize_q8_0::<false>(blocks, out);
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn dequantize_q8_0<const STREAM: bool>(blocks: &[BlockQ8_0], out: &mut [f32]) {
    for (block, values) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        // SAFETY: `block.qs` is 32 readable bytes; loadu needs no alignment.
        let bytes = unsafe { _mm256_loadu_si256(block.qs.as_ptr().cast()) };
        let (lo, hi) = (
            _mm256_castsi256_si128(bytes),
            _mm256_extracti128_si256::<1>(bytes),
        );
        let q = [
            _mm256_cvtepi8_epi32(lo),
            _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(lo)),
            _mm256_cvtepi8_epi32(hi),
            _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(hi)),
        ];
        store_scaled::<STREAM>(q, block.d.to_f32(), values);
    }
}
