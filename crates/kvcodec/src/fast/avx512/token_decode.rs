//! Token-axis decoding (groups down the output's columns) for CPUs with AVX-512 BW and VBMI,
//! 16 columns at a time.
//!
//! A pass covers about [`PASS_TOKENS`] tokens (a whole number of groups and of 16-token tiles):
//! - each column's codes of the pass, one contiguous run of its stream, are unpacked to one
//!   byte each, 64 at a time (a byte permutation puts each run of 8 codes in a 64-bit lane, a
//!   multishift moves code i to byte i, a mask clears the rest), into tiles of 16 columns x 16
//!   tokens, 256 bytes each;
//! - the pass's scales and offsets (zero points, or qmax for symmetric codes, as f32) are
//!   transposed 16 x 16 into one row of the block's 16 columns per group;
//! - each tile's bytes are transposed to 16 rows of 16 columns (a byte permutation, then
//!   32- and 64-bit interleaves), and each row is widened, offset and scaled in one vector:
//!   `(code - offset) as f32 * scale`, which is exact in f32 however it is ordered, since the
//!   difference of two codes is a small integer. So the values are the oracle's bit for bit.
//!
//! Why: the stream of each column lies a whole column of codes apart from the next (a power of
//! two for the benchmark's shapes, so the runs of all columns fall in the same few cache sets).
//! Reading each run once, whole, and doing every transpose in registers on bytes (a tile of 256
//! codes costs 12 permutations) leaves AVX2's 8 x 8 float transposes and its per-column gathers
//! behind; in cache AVX2's loop decoded 4.8-10 GB/s, against 18-34 GB/s along features.

use core::arch::x86_64::*;

use super::Avx512;
use crate::fast::Kernels;
use crate::fast::bits::unpack_range;

/// About this many tokens per pass: a 4-bit column's run is then 256 bytes, four cache lines.
const PASS_TOKENS: usize = 512;

/// Passes ahead whose runs are prefetched (into L2), column by column as each run of the
/// current pass is unpacked. The runs of all columns share a few cache sets, so the lines
/// are gone from L2 by the time they are read; on AMD's Zen 4, whose L3 takes what L2
/// evicts, they are then read from L3 instead of memory. Measured on bench's shape in
/// alternation with no prefetch (asymmetric 8-bit groups of 8): 0.81-0.92x memcpy two passes
/// ahead, against 0.62-0.74x with none, 0.71-0.88x three or four ahead, and 0.71-0.86x with
/// the hints for L1 or L3 instead.
const PASSES_AHEAD: usize = 2;

/// Columns of a block: the lanes of a vector of f32.
const LANES: usize = 16;

/// The widest rows (columns) and largest unpacked pass the pass-by-pass kernels (this decoder
/// and [`super::token_encode`]'s encoder) take; AVX2's loops take the rest.
const MAX_COLS: usize = 1024;
const MAX_PASS_BYTES: usize = 1 << 20;

/// Tokens per pass for groups of `group_size` (a multiple of 8): a multiple of the group size
/// and of 16, about [`PASS_TOKENS`].
pub(super) fn pass_tokens(group_size: usize) -> usize {
    let unit = if group_size.is_multiple_of(16) {
        group_size
    } else {
        2 * group_size
    };
    unit * (PASS_TOKENS / unit).max(1)
}

/// Whether the pass-by-pass kernels take a matrix `cols` wide with groups of `group_size` (a
/// multiple of 8).
pub(crate) fn takes(cols: usize, group_size: usize) -> bool {
    cols.is_multiple_of(LANES)
        && cols > 0
        && cols <= MAX_COLS
        && cols * pass_tokens(group_size) <= MAX_PASS_BYTES
}

/// A packed tensor's streams as this decoder reads them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Streams<'a> {
    pub codes: &'a [u8],
    /// Scales, [rows * groups] in row-major group order.
    pub scales: &'a [f32],
    pub offsets: Offsets<'a>,
    pub group_size: usize,
}

/// What decoding subtracts from each group's codes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Offsets<'a> {
    /// qmax, for every group of a symmetric tensor.
    Constant(i32),
    /// The packed zero points of an asymmetric tensor (B bits each, row-major group order),
    /// unpacked a pass at a time: unpacking them all first cost a fresh allocation of
    /// `rows * groups` bytes per call, whose page faults and clearing were a tenth of a profile
    /// of 4-bit groups of 8.
    Packed(&'a [u8]),
}

/// Decodes into `out`, `rows x cols` row-major, whose columns are the grouped rows.
///
/// # Safety
/// `k.has_bytes()`, and [`takes`]`(cols, s.group_size)`.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
pub(crate) unsafe fn decode_down_columns<const B: u32>(
    k: Avx512,
    s: Streams,
    out: &mut [f32],
    cols: usize,
    streaming: bool,
) {
    let g = s.group_size;
    let rows = out.len() / cols;
    let groups = rows.div_ceil(g);
    let group_bytes = g * B as usize / 8;
    let column_bytes = groups * group_bytes;
    let pass = pass_tokens(g);
    let pass_groups = pass / g;
    // Tiles of 16 tokens per pass, rounded up to whole runs of 64 codes.
    let tiles = pass.div_ceil(64) * 4;
    let blocks = cols / LANES;
    let mut codes = vec![0u8; blocks * tiles * 256];
    let mut scales = vec![0f32; pass_groups * cols];
    let mut offsets = vec![0f32; pass_groups * cols];
    let mut zero_points = vec![
        0u8;
        if let Offsets::Packed(_) = s.offsets {
            pass_groups * cols
        } else {
            0
        }
    ];
    if let Offsets::Constant(offset) = s.offsets {
        offsets.fill(offset as f32);
    }
    let mut buffer = vec![0f32; if streaming { LANES * cols + LANES } else { 0 }];
    let aligned = buffer.as_ptr().align_offset(64).min(buffer.len());
    let staging = &mut buffer[aligned..];
    let unpack = Unpack::new::<B>();
    for (p, part) in out.chunks_mut(pass * cols).enumerate() {
        let first_group = p * pass_groups;
        let part_groups = (part.len() / cols).div_ceil(g);
        let run_bytes = part_groups * group_bytes;
        let ahead = first_group + PASSES_AHEAD * pass_groups;
        for c in 0..cols {
            prefetch_run(s.codes, c * column_bytes + ahead * group_bytes, run_bytes);
            prefetch_run(s.scales, c * groups + ahead, part_groups);
            if let Offsets::Packed(packed) = s.offsets {
                let bit = (c * groups + ahead) * B as usize;
                prefetch_run(packed, bit / 8, (part_groups * B as usize).div_ceil(8));
            }
            let from = c * column_bytes + first_group * group_bytes;
            let run = &s.codes[from..from + run_bytes];
            let (block, lane) = (c / LANES, c % LANES);
            let block_tiles = &mut codes[block * tiles * 256..(block + 1) * tiles * 256];
            unpack.column::<B>(run, block_tiles, lane);
        }
        if let Offsets::Packed(packed) = s.offsets {
            for c in 0..cols {
                let run = &mut zero_points[c * pass_groups..][..part_groups];
                unpack_range(B, packed, c * groups + first_group, run);
            }
        }
        for block in 0..blocks {
            for first in (0..part_groups).step_by(LANES) {
                let count = (part_groups - first).min(LANES);
                let column = |lane: usize| (block * LANES + lane) * groups + first_group + first;
                let into = first * cols + block * LANES;
                transpose_params(s.scales, column, count, &mut scales[into..], cols);
                if let Offsets::Packed(_) = s.offsets {
                    let column = |lane: usize| (block * LANES + lane) * pass_groups + first;
                    transpose_zeros(&zero_points, column, count, &mut offsets[into..], cols);
                }
            }
        }
        for (tile, rows_out) in part.chunks_mut(LANES * cols).enumerate() {
            let tile_rows = rows_out.len() / cols;
            let dst: &mut [f32] = if streaming {
                &mut staging[..rows_out.len()]
            } else {
                &mut *rows_out
            };
            // A tile's 16 rows span at most two groups (groups are 8 tokens or more).
            let first_group_of_tile = tile * LANES / g;
            let next_group_row = (first_group_of_tile + 1) * g - tile * LANES;
            for block in 0..blocks {
                let bytes = &codes[(block * tiles + tile) * 256..][..256];
                let rows = transpose_bytes(bytes.try_into().expect("a tile of 256 codes"));
                let params = Params {
                    scales: &scales[block * LANES..],
                    offsets: &offsets[block * LANES..],
                    cols,
                    first_group: first_group_of_tile,
                    next_group_row,
                };
                let dst = &mut dst[block * LANES..];
                if tile_rows == LANES {
                    // SAFETY: the tile's 16 rows are in `dst`, its groups in `params`.
                    unsafe { emit_rows::<LANES>(rows, params, dst) };
                } else {
                    // SAFETY: as above, for the tile's rows.
                    unsafe { emit_rows_partial(rows, params, dst, tile_rows) };
                }
            }
            if streaming {
                k.stream_copy(&staging[..rows_out.len()], rows_out);
            }
        }
    }
    if streaming {
        k.finish_streaming();
    }
}

/// One tile's parameters: rows of 16 scales and offsets per group of the pass, `cols` apart,
/// from the tile's block; row i of the tile is in group `first_group`, or the next one from
/// row `next_group_row` on (groups are 8 tokens or more, so a tile of 16 spans at most two).
#[derive(Clone, Copy)]
struct Params<'a> {
    scales: &'a [f32],
    offsets: &'a [f32],
    cols: usize,
    first_group: usize,
    next_group_row: usize,
}

/// Decodes one row: `(code - offset) * scale` of the 16 codes in `lane`, stored at `to`.
///
/// # Safety
/// Row `i`'s group's 16 parameters are in `p`, and `to..to + 16` is writable.
#[inline(always)]
unsafe fn emit_row(lane: __m128i, p: Params, i: usize, to: *mut f32) {
    let group = p.first_group + usize::from(i >= p.next_group_row);
    // SAFETY: as the caller promises.
    unsafe {
        let scale = _mm512_loadu_ps(p.scales.as_ptr().add(group * p.cols));
        let offset = _mm512_loadu_ps(p.offsets.as_ptr().add(group * p.cols));
        let code = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lane));
        _mm512_storeu_ps(to, _mm512_mul_ps(_mm512_sub_ps(code, offset), scale));
    }
}

/// Prefetches, into L2, the lines of `values[from..from + len]` (those in bounds).
#[inline(always)]
pub(super) fn prefetch_run<T>(values: &[T], from: usize, len: usize) {
    let end = (from + len).min(values.len());
    let step = 64 / std::mem::size_of::<T>();
    for at in (from..end).step_by(step) {
        // SAFETY: `at` is in bounds; a prefetch has no architectural effect.
        unsafe { _mm_prefetch::<_MM_HINT_T1>((&raw const values[at]).cast()) };
    }
}

/// The 16-byte lanes of the transposed tile, in row order.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn lanes([a, b, c, d]: [__m512i; 4]) -> [__m128i; 16] {
    [
        _mm512_castsi512_si128(a),
        _mm512_extracti32x4_epi32::<1>(a),
        _mm512_extracti32x4_epi32::<2>(a),
        _mm512_extracti32x4_epi32::<3>(a),
        _mm512_castsi512_si128(b),
        _mm512_extracti32x4_epi32::<1>(b),
        _mm512_extracti32x4_epi32::<2>(b),
        _mm512_extracti32x4_epi32::<3>(b),
        _mm512_castsi512_si128(c),
        _mm512_extracti32x4_epi32::<1>(c),
        _mm512_extracti32x4_epi32::<2>(c),
        _mm512_extracti32x4_epi32::<3>(c),
        _mm512_castsi512_si128(d),
        _mm512_extracti32x4_epi32::<1>(d),
        _mm512_extracti32x4_epi32::<2>(d),
        _mm512_extracti32x4_epi32::<3>(d),
    ]
}

/// Decodes the tile's first `N` rows into `dst` (row i at `dst[i * cols..]`).
///
/// # Safety
/// The CPU has AVX-512 BW; the rows' groups are in `p`; `dst` holds `(N - 1) * cols + 16`
/// floats.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
unsafe fn emit_rows<const N: usize>(rows: [__m512i; 4], p: Params, dst: &mut [f32]) {
    debug_assert!(dst.len() >= (N - 1) * p.cols + LANES);
    let to = dst.as_mut_ptr();
    for (i, lane) in lanes(rows).into_iter().enumerate().take(N) {
        // SAFETY: as the caller promises.
        unsafe { emit_row(lane, p, i, to.add(i * p.cols)) };
    }
}

/// [`emit_rows`] of the first `count` rows (fewer than 16: the last tile).
///
/// # Safety
/// As [`emit_rows`], for `count` rows.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
unsafe fn emit_rows_partial(rows: [__m512i; 4], p: Params, dst: &mut [f32], count: usize) {
    assert!(count == 0 || dst.len() >= (count - 1) * p.cols + LANES);
    let to = dst.as_mut_ptr();
    for (i, lane) in lanes(rows).into_iter().enumerate().take(count) {
        // SAFETY: as the caller promises.
        unsafe { emit_row(lane, p, i, to.add(i * p.cols)) };
    }
}

/// Unpacks runs of B-bit codes into a block's tiles.
struct Unpack {
    /// Byte i of 64-bit lane q takes byte `q * B + i` of the run: lane q holds codes 8q..8q+7.
    spread: __m512i,
    /// Byte i of each lane takes the 8 bits from bit `B * i`.
    shifts: __m512i,
    mask: __m512i,
}

impl Unpack {
    #[inline]
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
    fn new<const B: u32>() -> Unpack {
        let spread: [u8; 64] = std::array::from_fn(|i| ((i / 8) * B as usize + i % 8) as u8);
        let shifts: [u8; 64] = std::array::from_fn(|i| ((i % 8) * B as usize) as u8);
        // SAFETY: each table is 64 bytes.
        unsafe {
            Unpack {
                spread: _mm512_loadu_si512(spread.as_ptr().cast()),
                shifts: _mm512_loadu_si512(shifts.as_ptr().cast()),
                mask: _mm512_set1_epi8(((1u32 << B) - 1) as u8 as i8),
            }
        }
    }

    /// Column `lane`'s codes `run` (whole runs of 8 codes) into lane `lane` of `tiles`
    /// (`tiles[256 t + 16 lane..][..16]` holds tokens 16t..16t+15).
    #[inline]
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
    fn column<const B: u32>(&self, run: &[u8], tiles: &mut [u8], lane: usize) {
        let b = B as usize;
        for (i, chunk) in run.chunks(8 * b).enumerate() {
            let mask = if chunk.len() >= 64 {
                u64::MAX
            } else {
                (1u64 << chunk.len()) - 1
            };
            // SAFETY: the mask reads chunk's bytes only.
            let packed = unsafe { _mm512_maskz_loadu_epi8(mask, chunk.as_ptr().cast()) };
            let codes = if B == 8 {
                packed
            } else {
                let lanes = _mm512_permutexvar_epi8(self.spread, packed);
                _mm512_and_si512(_mm512_multishift_epi64_epi8(self.shifts, lanes), self.mask)
            };
            let to = &mut tiles[4 * i * 256..][..4 * 256];
            // SAFETY: each store is 16 bytes inside `to` (tile 4i + q, lane `lane`).
            unsafe {
                let base = to.as_mut_ptr();
                let at = |q: usize| base.add(q * 256 + 16 * lane).cast();
                _mm_storeu_si128(at(0), _mm512_extracti32x4_epi32::<0>(codes));
                _mm_storeu_si128(at(1), _mm512_extracti32x4_epi32::<1>(codes));
                _mm_storeu_si128(at(2), _mm512_extracti32x4_epi32::<2>(codes));
                _mm_storeu_si128(at(3), _mm512_extracti32x4_epi32::<3>(codes));
            }
        }
    }
}

/// Within a vector of 4 columns x 16 tokens: byte 4t + j takes column j's token t.
const BY_TOKEN: [u8; 64] = {
    let mut table = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        table[i] = ((i % 4) * 16 + i / 4) as u8;
        i += 1;
    }
    table
};

/// A tile of 16 columns x 16 tokens (`tile[16 c + t]`) as 16 rows of 16 columns: row t in
/// 16-byte lane `t % 4` of vector `t / 4`.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vbmi")]
pub(super) fn transpose_bytes(tile: &[u8; 256]) -> [__m512i; 4] {
    // Within each vector of 4 columns: byte 4t + j takes column j's token t.
    // 32-bit lanes: 2t + h takes token t (of the first 8, or of the last 8) of columns
    // 4h..4h+3.
    let first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    let second = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    let (low, high) = (
        _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11),
        _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15),
    );
    // SAFETY: 64-byte loads inside the 256-byte tile and the 64-byte table.
    let (index, v) = unsafe {
        let p = tile.as_ptr();
        (
            _mm512_loadu_si512(BY_TOKEN.as_ptr().cast()),
            [
                _mm512_loadu_si512(p.cast()),
                _mm512_loadu_si512(p.add(64).cast()),
                _mm512_loadu_si512(p.add(128).cast()),
                _mm512_loadu_si512(p.add(192).cast()),
            ],
        )
    };
    let a = [
        _mm512_permutexvar_epi8(index, v[0]),
        _mm512_permutexvar_epi8(index, v[1]),
        _mm512_permutexvar_epi8(index, v[2]),
        _mm512_permutexvar_epi8(index, v[3]),
    ];
    // Tokens 0-7 (or 8-15) of columns 0-7 and of columns 8-15.
    let low01 = _mm512_permutex2var_epi32(a[0], first, a[1]);
    let low23 = _mm512_permutex2var_epi32(a[2], first, a[3]);
    let high01 = _mm512_permutex2var_epi32(a[0], second, a[1]);
    let high23 = _mm512_permutex2var_epi32(a[2], second, a[3]);
    [
        _mm512_permutex2var_epi64(low01, low, low23),
        _mm512_permutex2var_epi64(low01, high, low23),
        _mm512_permutex2var_epi64(high01, low, high23),
        _mm512_permutex2var_epi64(high01, high, high23),
    ]
}

/// Transposes `count` (at most 16) groups' parameters of 16 columns into rows of 16: column
/// `lane`'s run starts at `values[column(lane)]`, and group j's row goes to `rows[j * cols..]`.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn transpose_params(
    values: &[f32],
    column: impl Fn(usize) -> usize,
    count: usize,
    rows: &mut [f32],
    cols: usize,
) {
    let mask = ((1u32 << count) - 1) as u16;
    let mut v = [_mm512_setzero_ps(); LANES];
    for (lane, x) in v.iter_mut().enumerate() {
        let run = &values[column(lane)..][..count];
        // SAFETY: the mask reads `run` only.
        *x = unsafe { _mm512_maskz_loadu_ps(mask, run.as_ptr()) };
    }
    transpose_rows(v, count, rows, cols);
}

/// [`transpose_params`] of zero points, as f32.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
fn transpose_zeros(
    zeros: &[u8],
    column: impl Fn(usize) -> usize,
    count: usize,
    rows: &mut [f32],
    cols: usize,
) {
    let mask = (1u64 << count) - 1;
    let mut v = [_mm512_setzero_ps(); LANES];
    for (lane, x) in v.iter_mut().enumerate() {
        let run = &zeros[column(lane)..][..count];
        // SAFETY: the mask reads `run` only.
        let bytes = unsafe { _mm512_maskz_loadu_epi8(mask, run.as_ptr().cast()) };
        *x = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm512_castsi512_si128(bytes)));
    }
    transpose_rows(v, count, rows, cols);
}

/// Transposes 16 columns' runs of `count` values (`v[lane]`) and stores the first `count` rows
/// of 16 at `rows[j * cols..]`.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn transpose_rows(mut v: [__m512; LANES], count: usize, rows: &mut [f32], cols: usize) {
    transpose16(&mut v);
    for (j, row) in v.iter().take(count).enumerate() {
        let to = &mut rows[j * cols..][..LANES];
        // SAFETY: `to` is 16 floats.
        unsafe { _mm512_storeu_ps(to.as_mut_ptr(), *row) };
    }
}

/// Transposes 16 x 16 floats in place (row i, lane j becomes row j, lane i).
#[inline]
#[target_feature(enable = "avx2,avx512f")]
pub(super) fn transpose16(r: &mut [__m512; LANES]) {
    // Interleave 32-bit lanes of row pairs, then 64-bit lanes of pairs of those: each 128-bit
    // lane of t[4k + m] holds a 4 x 4 block; two 128-bit shuffles gather the blocks.
    let mut t = [_mm512_setzero_ps(); LANES];
    for k in 0..8 {
        t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for k in 0..4 {
        let (a, b, c, d) = (t[4 * k], t[4 * k + 1], t[4 * k + 2], t[4 * k + 3]);
        r[4 * k] = pd(_mm512_unpacklo_pd(ps(a), ps(c)));
        r[4 * k + 1] = pd(_mm512_unpackhi_pd(ps(a), ps(c)));
        r[4 * k + 2] = pd(_mm512_unpacklo_pd(ps(b), ps(d)));
        r[4 * k + 3] = pd(_mm512_unpackhi_pd(ps(b), ps(d)));
    }
    // r[4k + m] lane block q: rows 4k..4k+3, columns 4q + m's... gathered across k.
    for m in 0..4 {
        t[m] = _mm512_shuffle_f32x4::<0x88>(r[m], r[4 + m]);
        t[4 + m] = _mm512_shuffle_f32x4::<0xdd>(r[m], r[4 + m]);
        t[8 + m] = _mm512_shuffle_f32x4::<0x88>(r[8 + m], r[12 + m]);
        t[12 + m] = _mm512_shuffle_f32x4::<0xdd>(r[8 + m], r[12 + m]);
    }
    for m in 0..4 {
        r[m] = _mm512_shuffle_f32x4::<0x88>(t[m], t[8 + m]);
        r[4 + m] = _mm512_shuffle_f32x4::<0x88>(t[4 + m], t[12 + m]);
        r[8 + m] = _mm512_shuffle_f32x4::<0xdd>(t[m], t[8 + m]);
        r[12 + m] = _mm512_shuffle_f32x4::<0xdd>(t[4 + m], t[12 + m]);
    }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn ps(v: __m512) -> __m512d {
    _mm512_castps_pd(v)
}

#[inline]
#[target_feature(enable = "avx512f")]
fn pd(v: __m512d) -> __m512 {
    _mm512_castpd_ps(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn avx512() -> Option<Avx512> {
        Avx512::detect().filter(|k| k.has_bytes())
    }

    #[test]
    fn transpose16_swaps_rows_and_lanes() {
        if avx512().is_none() {
            return;
        }
        let m: Vec<f32> = (0..256).map(|i| i as f32).collect();
        let mut got = [[0f32; 16]; 16];
        // SAFETY: the CPU has AVX-512F (checked above).
        unsafe {
            let mut r: [__m512; 16] =
                std::array::from_fn(|i| _mm512_loadu_ps(m[16 * i..].as_ptr()));
            transpose16(&mut r);
            for (i, row) in got.iter_mut().enumerate() {
                _mm512_storeu_ps(row.as_mut_ptr(), r[i]);
            }
        }
        for (i, row) in got.iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                assert_eq!(v, m[16 * j + i], "row {i} lane {j}");
            }
        }
    }

    #[test]
    fn transpose_bytes_gives_rows_of_columns() {
        if avx512().is_none() {
            return;
        }
        let tile: [u8; 256] = std::array::from_fn(|i| i as u8);
        let mut got = [0u8; 256];
        // SAFETY: the CPU has AVX-512 BW and VBMI (checked above).
        unsafe {
            let rows = transpose_bytes(&tile);
            for (k, v) in rows.iter().enumerate() {
                _mm512_storeu_si512(got[64 * k..].as_mut_ptr().cast(), *v);
            }
        }
        for t in 0..16 {
            for c in 0..16 {
                assert_eq!(got[16 * t + c], tile[16 * c + t], "token {t} column {c}");
            }
        }
    }
}
