//! Loads, stores and horizontal reductions of 8-lane vectors, and the 8 x 8 float transpose
//! that both the group fitting and the column decoder use.

use core::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn load(v: &[f32; 8]) -> __m256 {
    // SAFETY: reads exactly the 8 floats of `v`.
    unsafe { _mm256_loadu_ps(v.as_ptr()) }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load_i32(v: &[i32; 8]) -> __m256i {
    // SAFETY: reads exactly the 8 integers of `v`.
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn store(dst: &mut [f32; 8], v: __m256) {
    // SAFETY: writes exactly the 8 floats of `dst`.
    unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), v) }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn store_i32(dst: &mut [i32; 8], v: __m256i) {
    // SAFETY: writes exactly the 8 integers of `dst`.
    unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), v) }
}

/// The 8 floats of `s` from `at`.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn load_at(s: &[f32], at: usize) -> __m256 {
    load(s[at..at + 8].try_into().expect("8 floats"))
}

/// Whether every bit of `v` is 0.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn all_zero(v: __m256) -> bool {
    let bits = _mm256_castps_si256(v);
    _mm256_testz_si256(bits, bits) == 1
}

/// Bits of `x - x`: all 0 for a finite x, a NaN for an infinity or a NaN.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn non_finite_bits(x: __m256) -> __m256 {
    _mm256_sub_ps(x, x)
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn magnitude_mask() -> __m256 {
    _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX))
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<0b01>(m, m)))
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hmin(v: __m256) -> f32 {
    let m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_min_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_min_ss(m, _mm_shuffle_ps::<0b01>(m, m)))
}

/// Transposes 8 x 8 floats held as 8 rows.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn transpose8(v: &mut [__m256; 8]) {
    let t = [
        _mm256_unpacklo_ps(v[0], v[1]),
        _mm256_unpackhi_ps(v[0], v[1]),
        _mm256_unpacklo_ps(v[2], v[3]),
        _mm256_unpackhi_ps(v[2], v[3]),
        _mm256_unpacklo_ps(v[4], v[5]),
        _mm256_unpackhi_ps(v[4], v[5]),
        _mm256_unpacklo_ps(v[6], v[7]),
        _mm256_unpackhi_ps(v[6], v[7]),
    ];
    let s = [
        _mm256_shuffle_ps::<0x44>(t[0], t[2]),
        _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
        _mm256_shuffle_ps::<0x44>(t[1], t[3]),
        _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
        _mm256_shuffle_ps::<0x44>(t[4], t[6]),
        _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
        _mm256_shuffle_ps::<0x44>(t[5], t[7]),
        _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
    ];
    for i in 0..4 {
        v[i] = _mm256_permute2f128_ps::<0x20>(s[i], s[i + 4]);
        v[i + 4] = _mm256_permute2f128_ps::<0x31>(s[i], s[i + 4]);
    }
}
