//! Unpacking and decoding: eight codes out of b bytes at a time, a group or runs of groups
//! along rows (with streaming stores), 8 columns at a time down a tile, and the f32 streaming copy.

use core::arch::x86_64::*;

use super::tables::Tables;
use super::vectors::{load, store, transpose8};
use crate::fast::bits::read_u64;
use crate::fast::{ColumnParams, decode, portable};

/// Eight B-bit codes from the low B bytes of a u64, as i32 lanes.
pub(crate) struct Unpack {
    shuffle: __m256i,
    shift: __m256i,
    mask: __m256i,
}

impl Unpack {
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) fn new<const B: u32>() -> Unpack {
        let shuffle = Tables::<B>::UNPACK_SHUFFLE;
        let shift = Tables::<B>::UNPACK_SHIFT;
        // SAFETY: reads the 32 bytes of each table.
        unsafe {
            Unpack {
                shuffle: _mm256_loadu_si256(shuffle.as_ptr().cast()),
                shift: _mm256_loadu_si256(shift.as_ptr().cast()),
                mask: _mm256_set1_epi32((1 << B) - 1),
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn codes(&self, packed: u64) -> __m256i {
        self.spread(_mm256_set1_epi64x(packed as i64))
    }

    /// [`Unpack::codes`] of packed codes already broadcast to every 64-bit lane.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) fn spread(&self, packed: __m256i) -> __m256i {
        let bytes = _mm256_shuffle_epi8(packed, self.shuffle);
        _mm256_and_si256(_mm256_srlv_epi32(bytes, self.shift), self.mask)
    }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn dequantize_group<const B: u32>(
    codes: &[u8],
    offset: i32,
    scale: f32,
    out: &mut [f32],
) {
    let b = B as usize;
    let unpack = Unpack::new::<B>();
    let offset = _mm256_set1_epi32(offset);
    let scale = _mm256_set1_ps(scale);
    let (blocks, tail) = out.as_chunks_mut::<8>();
    let whole = blocks.len();
    for (k, dst) in blocks.iter_mut().enumerate() {
        store(
            dst,
            dequantize8(&unpack, read_u64(codes, k * b), offset, scale),
        );
    }
    if !tail.is_empty() {
        let mut last = [0f32; 8];
        let packed = read_u64(codes, whole * b);
        store(&mut last, dequantize8(&unpack, packed, offset, scale));
        tail.copy_from_slice(&last[..tail.len()]);
    }
}

/// Plain stores.
const PLAIN: u8 = 0;
/// Non-temporal stores of 32 bytes, at 32-byte boundaries.
const STREAM32: u8 = 1;
/// Non-temporal stores of 16 bytes, at 16-byte boundaries.
const STREAM16: u8 = 2;

/// The store mode for vectors written at `dst` and multiples of 8 floats after it.
#[inline]
fn store_mode(dst: *const f32, streaming: bool) -> Option<u8> {
    match (streaming, dst as usize % 32) {
        (false, _) => Some(PLAIN),
        (true, 0) => Some(STREAM32),
        (true, 16) => Some(STREAM16),
        _ => None,
    }
}

/// Stores `v` to `dst` as `MODE` says.
#[inline]
#[target_feature(enable = "avx2")]
fn put<const MODE: u8>(dst: &mut [f32; 8], v: __m256) {
    let p = dst.as_mut_ptr();
    // SAFETY: writes exactly the 8 floats of `dst`; the streaming stores need `dst` at a 32-
    // (or 16-) byte boundary, which [`store_mode`] checked for the first vector of a run whose
    // vectors are all 8 floats apart.
    unsafe {
        match MODE {
            PLAIN => _mm256_storeu_ps(p, v),
            STREAM32 => {
                debug_assert_eq!(p as usize % 32, 0);
                _mm256_stream_ps(p, v)
            }
            _ => {
                debug_assert_eq!(p as usize % 16, 0);
                _mm_stream_ps(p, _mm256_castps256_ps128(v));
                _mm_stream_ps(p.add(4), _mm256_extractf128_ps::<1>(v));
            }
        }
    }
}

/// Eight packed codes from `codes[at..]` broadcast to every 64-bit lane (zero-filled past the
/// end of `codes`).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn broadcast_codes(codes: &[u8], at: usize) -> __m256i {
    if at + 8 <= codes.len() {
        // SAFETY: reads the 8 bytes codes[at..at + 8], in bounds as just checked.
        unsafe { _mm256_broadcastq_epi64(_mm_loadl_epi64(codes.as_ptr().add(at).cast())) }
    } else {
        _mm256_set1_epi64x(read_u64(codes, at) as i64)
    }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn dequantize_groups<const B: u32>(
    codes: &[u8],
    offsets: decode::GroupOffsets,
    scales: &[f32],
    group_size: usize,
    out: &mut [f32],
    streaming: bool,
) {
    use decode::GroupOffsets::{Constant, PerGroup};
    assert_eq!(out.len(), scales.len() * group_size, "whole groups");
    assert!(group_size.is_multiple_of(8), "groups of a multiple of 8");
    match (store_mode(out.as_ptr(), streaming), offsets) {
        (Some(PLAIN), Constant(o)) => {
            groups_with::<B, PLAIN>(codes, o, &[], scales, group_size, out)
        }
        (Some(PLAIN), PerGroup(z)) => groups_with::<B, PLAIN>(codes, 0, z, scales, group_size, out),
        (Some(STREAM32), Constant(o)) => {
            groups_with::<B, STREAM32>(codes, o, &[], scales, group_size, out)
        }
        (Some(STREAM32), PerGroup(z)) => {
            groups_with::<B, STREAM32>(codes, 0, z, scales, group_size, out)
        }
        (Some(_), Constant(o)) => {
            groups_with::<B, STREAM16>(codes, o, &[], scales, group_size, out)
        }
        (Some(_), PerGroup(z)) => groups_with::<B, STREAM16>(codes, 0, z, scales, group_size, out),
        (None, _) => {
            // Not at a 16-byte boundary: decode a block at a time into a buffer and copy it
            // out with streaming stores.
            let per_block = (4096 / group_size).max(1);
            let mut staging = vec![0f32; per_block * group_size];
            let group_bytes = group_size * B as usize / 8;
            for (block, dst) in out.chunks_mut(per_block * group_size).enumerate() {
                let first = block * per_block;
                let count = dst.len() / group_size;
                let staged = &mut staging[..dst.len()];
                let part = match offsets {
                    Constant(o) => Constant(o),
                    PerGroup(z) => PerGroup(&z[first..first + count]),
                };
                let codes = &codes[first * group_bytes..];
                let scales = &scales[first..first + count];
                dequantize_groups::<B>(codes, part, scales, group_size, staged, false);
                stream_copy(staged, dst);
            }
        }
    }
}

/// [`dequantize_groups`] with stores `MODE`; `zeros` holds the groups' offsets, or is empty
/// when every group's is `offset`.
#[inline]
#[target_feature(enable = "avx2")]
fn groups_with<const B: u32, const MODE: u8>(
    codes: &[u8],
    offset: i32,
    zeros: &[u8],
    scales: &[f32],
    group_size: usize,
    out: &mut [f32],
) {
    let b = B as usize;
    let unpack = Unpack::new::<B>();
    let group_bytes = group_size * b / 8;
    let constant = _mm256_set1_epi32(offset);
    if group_size == 8 && zeros.is_empty() {
        // One vector per group, the same offset for all.
        let (values, _) = out.as_chunks_mut::<8>();
        for (k, (dst, &scale)) in values.iter_mut().zip(scales).enumerate() {
            let difference =
                _mm256_sub_epi32(unpack.spread(broadcast_codes(codes, k * b)), constant);
            put::<MODE>(
                dst,
                _mm256_mul_ps(_mm256_cvtepi32_ps(difference), _mm256_set1_ps(scale)),
            );
        }
        return;
    }
    if group_size == 8 {
        // One vector per group, with its own offset.
        let (values, _) = out.as_chunks_mut::<8>();
        let groups = values.iter_mut().zip(scales.iter().zip(zeros));
        for (k, (dst, (&scale, &zero))) in groups.enumerate() {
            let codes = unpack.spread(broadcast_codes(codes, k * b));
            let difference = _mm256_sub_epi32(codes, _mm256_set1_epi32(i32::from(zero)));
            put::<MODE>(
                dst,
                _mm256_mul_ps(_mm256_cvtepi32_ps(difference), _mm256_set1_ps(scale)),
            );
        }
        return;
    }
    for (k, group) in out.chunks_exact_mut(group_size).enumerate() {
        let offset = match zeros.get(k) {
            Some(&zero) => _mm256_set1_epi32(i32::from(zero)),
            None => constant,
        };
        let scale = _mm256_set1_ps(scales[k]);
        let (vectors, _) = group.as_chunks_mut::<8>();
        for (i, dst) in vectors.iter_mut().enumerate() {
            let codes = unpack.spread(broadcast_codes(codes, k * group_bytes + i * b));
            let difference = _mm256_sub_epi32(codes, offset);
            put::<MODE>(dst, _mm256_mul_ps(_mm256_cvtepi32_ps(difference), scale));
        }
    }
}

/// [`dequantize8`] of packed codes already broadcast to every 64-bit lane.
#[inline]
#[target_feature(enable = "avx2")]
fn dequantize_broadcast(unpack: &Unpack, word: __m256i, offset: i32, scale: f32) -> __m256 {
    let difference = _mm256_sub_epi32(unpack.spread(word), _mm256_set1_epi32(offset));
    _mm256_mul_ps(_mm256_cvtepi32_ps(difference), _mm256_set1_ps(scale))
}

/// The decoded values of eight packed codes: (code - offset) as f32 * scale.
#[inline]
#[target_feature(enable = "avx2")]
fn dequantize8(unpack: &Unpack, packed: u64, offset: __m256i, scale: __m256) -> __m256 {
    let difference = _mm256_sub_epi32(unpack.codes(packed), offset);
    _mm256_mul_ps(_mm256_cvtepi32_ps(difference), scale)
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn dequantize_columns<const B: u32>(
    codes: &[u8],
    row_bytes: usize,
    at: usize,
    params: ColumnParams,
    out: &mut [f32],
) {
    let cols = params.cols;
    let blocks = cols / 8;
    let unpack = Unpack::new::<B>();
    // Whether the last whole block's last column has 8 bytes from `at`: then every column's
    // load is a plain one, and each block's 8 columns are 8 straight-line calls that keep `v`
    // in registers (a loop with the bounds-checked fallback in it went through the stack).
    let in_bounds = blocks == 0 || (8 * blocks - 1) * row_bytes + at + 8 <= codes.len();
    for block in 0..blocks {
        // Column j's 8 rows, then transposed to row i's 8 columns.
        let column = |j: usize| {
            let c = 8 * block + j;
            let word = if in_bounds {
                // SAFETY: codes[c * row_bytes + at..][..8] is in bounds, as checked for the
                // last column of the last whole block.
                unsafe {
                    _mm256_broadcastq_epi64(_mm_loadl_epi64(
                        codes.as_ptr().add(c * row_bytes + at).cast(),
                    ))
                }
            } else {
                broadcast_codes(codes, c * row_bytes + at)
            };
            dequantize_broadcast(&unpack, word, params.offset(c), params.scale(c))
        };
        let mut v = [
            column(0),
            column(1),
            column(2),
            column(3),
            column(4),
            column(5),
            column(6),
            column(7),
        ];
        transpose8(&mut v);
        for (row, value) in out.chunks_exact_mut(cols).zip(v) {
            store(
                (&mut row[8 * block..8 * block + 8]).try_into().expect("8"),
                value,
            );
        }
    }
    portable::dequantize_columns::<B>(codes, row_bytes, at, params, out, blocks * 8..cols);
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn stream_copy(src: &[f32], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "stream_copy needs equal lengths");
    let head = dst.as_ptr().align_offset(32).min(dst.len());
    dst[..head].copy_from_slice(&src[..head]);
    let (src_blocks, src_tail) = src[head..].as_chunks::<8>();
    let (dst_blocks, dst_tail) = dst[head..].as_chunks_mut::<8>();
    for (s, d) in src_blocks.iter().zip(dst_blocks) {
        debug_assert_eq!(d.as_ptr() as usize % 32, 0);
        // SAFETY: `d` is 8 floats at a 32-byte boundary: the head was copied up to that
        // boundary and every block is 32 bytes.
        unsafe { _mm256_stream_ps(d.as_mut_ptr(), load(s)) }
    }
    dst_tail.copy_from_slice(src_tail);
}
