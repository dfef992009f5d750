//! Fitting groups: the largest magnitude or the range of a group or of a tile's columns, and
//! the per-lane quantization parameters ([`Quant`]) computed from them, 8 at a time.

use core::arch::x86_64::*;

use super::vectors::{
    all_zero, hmax, hmin, load, magnitude_mask, non_finite_bits, store, store_i32,
};
use crate::fast::params::ColumnQuant;
use crate::fast::{Kernels, portable};

/// How far ahead of the values being fitted the input is prefetched, in floats (along tokens,
/// tiles are contiguous, so this runs into the next tiles). The fitting pass is the first to
/// touch the input; without the hint its loads wait on memory (the
/// hardware prefetcher alone ran encode at about half the speed).
const PREFETCH: usize = 512;

/// Asks for the cache lines [`PREFETCH`] floats ahead of `values`.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn prefetch(values: &[f32]) {
    let ahead = values.as_ptr().wrapping_add(PREFETCH).cast::<i8>();
    let mut at = 0;
    while at < std::mem::size_of_val(values) {
        // SAFETY: a prefetch is a hint that never faults, whatever the address. (Newer
        // compilers call it safe here; Rust 1.89, the workspace's rust-version, needs the block.)
        #[allow(unused_unsafe)]
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(at))
        };
        at += 64;
    }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn group_amax(group: &[f32]) -> (f32, bool) {
    prefetch(group);
    let magnitude = magnitude_mask();
    let (blocks, tail) = group.as_chunks::<8>();
    let (quads, rest) = blocks.as_chunks::<4>();
    // Four accumulators hide the latency of max.
    let mut amax = [_mm256_setzero_ps(); 4];
    let mut bad = _mm256_setzero_ps();
    for quad in quads {
        for i in 0..4 {
            let x = load(&quad[i]);
            amax[i] = _mm256_max_ps(amax[i], _mm256_and_ps(x, magnitude));
            bad = _mm256_or_ps(bad, non_finite_bits(x));
        }
    }
    for block in rest {
        let x = load(block);
        amax[0] = _mm256_max_ps(amax[0], _mm256_and_ps(x, magnitude));
        bad = _mm256_or_ps(bad, non_finite_bits(x));
    }
    let all = _mm256_max_ps(
        _mm256_max_ps(amax[0], amax[1]),
        _mm256_max_ps(amax[2], amax[3]),
    );
    let (tail_amax, tail_finite) = portable::Portable.group_amax(tail);
    (hmax(all).max(tail_amax), all_zero(bad) && tail_finite)
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn group_range(group: &[f32]) -> (f32, f32, bool) {
    prefetch(group);
    let (blocks, tail) = group.as_chunks::<8>();
    let (pairs, rest) = blocks.as_chunks::<2>();
    let mut lo = [_mm256_setzero_ps(); 2];
    let mut hi = [_mm256_setzero_ps(); 2];
    let mut bad = _mm256_setzero_ps();
    for pair in pairs {
        for i in 0..2 {
            let x = load(&pair[i]);
            lo[i] = _mm256_min_ps(lo[i], x);
            hi[i] = _mm256_max_ps(hi[i], x);
            bad = _mm256_or_ps(bad, non_finite_bits(x));
        }
    }
    for block in rest {
        let x = load(block);
        lo[0] = _mm256_min_ps(lo[0], x);
        hi[0] = _mm256_max_ps(hi[0], x);
        bad = _mm256_or_ps(bad, non_finite_bits(x));
    }
    let (tail_lo, tail_hi, tail_finite) = portable::Portable.group_range(tail);
    (
        hmin(_mm256_min_ps(lo[0], lo[1])).min(tail_lo),
        hmax(_mm256_max_ps(hi[0], hi[1])).max(tail_hi),
        all_zero(bad) && tail_finite,
    )
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn columns_amax(tile: &[f32], amax: &mut [f32]) -> bool {
    let cols = amax.len();
    let magnitude = magnitude_mask();
    let mut bad = _mm256_setzero_ps();
    let (acc, _) = amax.as_chunks_mut::<8>();
    for row in tile.chunks_exact(cols) {
        prefetch(row);
        let (xs, _) = row.as_chunks::<8>();
        for (a, x) in acc.iter_mut().zip(xs) {
            let x = load(x);
            store(a, _mm256_max_ps(load(a), _mm256_and_ps(x, magnitude)));
            bad = _mm256_or_ps(bad, non_finite_bits(x));
        }
    }
    let tail_finite = portable::columns_amax(tile, amax, cols / 8 * 8..cols);
    all_zero(bad) && tail_finite
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn columns_range(tile: &[f32], lo: &mut [f32], hi: &mut [f32]) -> bool {
    let cols = lo.len();
    let mut bad = _mm256_setzero_ps();
    let (lo_acc, _) = lo.as_chunks_mut::<8>();
    let (hi_acc, _) = hi.as_chunks_mut::<8>();
    for row in tile.chunks_exact(cols) {
        prefetch(row);
        let (xs, _) = row.as_chunks::<8>();
        for ((l, h), x) in lo_acc.iter_mut().zip(hi_acc.iter_mut()).zip(xs) {
            let x = load(x);
            store(l, _mm256_min_ps(load(l), x));
            store(h, _mm256_max_ps(load(h), x));
            bad = _mm256_or_ps(bad, non_finite_bits(x));
        }
    }
    let tail_finite = portable::columns_range(tile, lo, hi, cols / 8 * 8..cols);
    all_zero(bad) && tail_finite
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn symmetric_columns(amax: &[f32], qmax: u8, scale: &mut [f32]) {
    let q = _mm256_set1_ps(f32::from(qmax));
    let one = _mm256_set1_ps(1.0);
    let (amax_blocks, amax_tail) = amax.as_chunks::<8>();
    let (scale_blocks, scale_tail) = scale.as_chunks_mut::<8>();
    for (a, s) in amax_blocks.iter().zip(scale_blocks) {
        let v = _mm256_div_ps(load(a), q);
        let zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(v, _mm256_setzero_ps());
        store(s, _mm256_blendv_ps(v, one, zero));
    }
    for (s, &a) in scale_tail.iter_mut().zip(amax_tail) {
        *s = crate::fast::params::symmetric(a, qmax).scale;
    }
}

/// A group's (or 8 columns') parameters, one per lane.
pub(crate) struct Quant {
    pub(crate) scale: __m256,
    pub(crate) low: __m256,
    pub(crate) high: __m256,
    pub(crate) offset: __m256i,
}

/// Asymmetric parameters of 8 ranges [`lo`, `hi`] (as [`crate::fast::params::asymmetric`]),
/// and the lanes whose scale is finite (all bits set there).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn asymmetric8(lo: __m256, hi: __m256, levels: u8) -> (Quant, __m256) {
    let l = _mm256_set1_ps(f32::from(levels));
    let one = _mm256_set1_ps(1.0);
    let zero = _mm256_setzero_ps();
    let sign = _mm256_set1_ps(-0.0);
    let scale = _mm256_div_ps(_mm256_sub_ps(hi, lo), l);
    let magnitude = _mm256_and_ps(scale, magnitude_mask());
    let finite = _mm256_cmp_ps::<_CMP_LE_OQ>(magnitude, _mm256_set1_ps(f32::MAX));
    let is_zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(scale, zero);
    let scale = _mm256_blendv_ps(scale, one, is_zero);
    let point = _mm256_div_ps(_mm256_xor_ps(lo, sign), scale);
    let point = _mm256_min_ps(_mm256_max_ps(point, zero), l);
    let point = _mm256_andnot_si256(_mm256_castps_si256(is_zero), _mm256_cvtps_epi32(point));
    let point_f = _mm256_cvtepi32_ps(point);
    let quant = Quant {
        scale,
        low: _mm256_xor_ps(point_f, sign),
        high: _mm256_sub_ps(l, point_f),
        offset: point,
    };
    (quant, finite)
}

/// Symmetric parameters of 8 groups of largest magnitudes `amax` (as
/// [`crate::fast::params::symmetric`]).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn symmetric8(amax: __m256, qmax: u8) -> Quant {
    let q = _mm256_set1_ps(f32::from(qmax));
    let scale = _mm256_div_ps(amax, q);
    let zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(scale, _mm256_setzero_ps());
    Quant {
        scale: _mm256_blendv_ps(scale, _mm256_set1_ps(1.0), zero),
        low: _mm256_xor_ps(q, _mm256_set1_ps(-0.0)),
        high: q,
        offset: _mm256_set1_epi32(i32::from(qmax)),
    }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn asymmetric_columns(lo: &[f32], hi: &[f32], levels: u8, q: &mut ColumnQuant) -> bool {
    let cols = lo.len();
    let mut finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    let blocks = cols / 8;
    let (lo_blocks, _) = lo.as_chunks::<8>();
    let (hi_blocks, _) = hi.as_chunks::<8>();
    for c in 0..blocks {
        let (quant, ok) = asymmetric8(load(&lo_blocks[c]), load(&hi_blocks[c]), levels);
        finite = _mm256_and_ps(finite, ok);
        let at = 8 * c;
        store(
            (&mut q.scale[at..at + 8]).try_into().expect("8"),
            quant.scale,
        );
        store_i32(
            (&mut q.offset[at..at + 8]).try_into().expect("8"),
            quant.offset,
        );
        store((&mut q.low[at..at + 8]).try_into().expect("8"), quant.low);
        store((&mut q.high[at..at + 8]).try_into().expect("8"), quant.high);
    }
    let tail_finite = portable::asymmetric_columns(lo, hi, levels, q, blocks * 8..cols);
    _mm256_movemask_ps(finite) == 0xFF && tail_finite
}
