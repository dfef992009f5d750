//! Decoding drivers for group sizes that are a multiple of 8, into a dense row-major f32
//! matrix: group by group along rows, or 8 rows of a tile at a time down columns. With
//! `streaming`, each block of output is decoded into a small buffer that stays in L1 and then
//! copied out with non-temporal stores (whole cache lines, no read for ownership), for outputs
//! too large to stay in cache anyway.

use crate::packed::PackedTensor;

use super::{ColumnParams, Kernels};

/// Floats decoded before a streaming copy: 16 KiB, well inside L1.
const STAGING_FLOATS: usize = 4096;

/// What decoding subtracts from each group's codes.
#[derive(Debug, Clone)]
pub(crate) enum Offsets {
    /// qmax, for every group of a symmetric tensor.
    Constant(i32),
    /// The zero points of an asymmetric tensor, one per group in row-major group order.
    PerGroup(Vec<u8>),
}

impl Offsets {
    pub(crate) fn of(packed: &PackedTensor) -> Offsets {
        let layout = packed.layout();
        match layout.mode {
            crate::Mode::Symmetric => Offsets::Constant(i32::from(layout.bits.qmax())),
            crate::Mode::Asymmetric => Offsets::PerGroup(
                bitpack::stream::unpack_bytes(
                    layout.bits,
                    packed.zero_point_bytes(),
                    packed.geometry().scale_count(),
                )
                .expect("the zero point stream's size is checked on construction"),
            ),
        }
    }

    /// The offset of group `index` in row-major group order.
    #[inline(always)]
    pub(crate) fn get(&self, index: usize) -> i32 {
        match self {
            Offsets::Constant(offset) => *offset,
            Offsets::PerGroup(zeros) => i32::from(zeros[index]),
        }
    }
}

/// The offsets of a run of consecutive groups.
#[derive(Debug, Clone, Copy)]
pub(crate) enum GroupOffsets<'a> {
    /// The same offset for every group.
    Constant(i32),
    /// One zero point per group.
    PerGroup(&'a [u8]),
}

impl GroupOffsets<'_> {
    #[inline(always)]
    pub(crate) fn get(&self, index: usize) -> i32 {
        match self {
            GroupOffsets::Constant(offset) => *offset,
            GroupOffsets::PerGroup(zeros) => i32::from(zeros[index]),
        }
    }
}

impl Offsets {
    /// The offsets of groups `range` (in row-major group order).
    pub(crate) fn run(&self, range: std::ops::Range<usize>) -> GroupOffsets<'_> {
        match self {
            Offsets::Constant(offset) => GroupOffsets::Constant(*offset),
            Offsets::PerGroup(zeros) => GroupOffsets::PerGroup(&zeros[range]),
        }
    }
}

/// [`Kernels::dequantize_groups`] one [`Kernels::dequantize_group`] at a time, with plain
/// stores.
#[inline(always)]
pub(crate) fn groups_one_by_one<K: Kernels, const B: u32>(
    k: K,
    codes: &[u8],
    offsets: GroupOffsets,
    scales: &[f32],
    group_size: usize,
    out: &mut [f32],
) {
    let group_bytes = group_size * B as usize / 8;
    for (i, part) in out.chunks_exact_mut(group_size).enumerate() {
        k.dequantize_group::<B>(&codes[i * group_bytes..], offsets.get(i), scales[i], part);
    }
}

/// A packed tensor's streams, borrowed for decoding.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stored<'a> {
    pub codes: &'a [u8],
    /// Scales, [rows * groups] in row-major group order.
    pub scales: &'a [f32],
    pub offsets: &'a Offsets,
    pub group_size: usize,
}

/// Decodes into `out`, `rows x row_len`, whose rows are the grouped rows.
#[inline(always)]
pub(crate) fn along_rows<K: Kernels, const B: u32>(
    k: K,
    s: Stored,
    out: &mut [f32],
    row_len: usize,
    streaming: bool,
) {
    let g = s.group_size;
    let groups = row_len.div_ceil(g);
    let group_bytes = g * B as usize / 8;
    let row_bytes = groups * group_bytes;
    if row_len.is_multiple_of(g) {
        // Rows of whole groups: the matrix is one long run of groups, and so is the stream.
        let count = out.len() / g;
        let offsets = s.offsets.run(0..count);
        k.dequantize_groups::<B>(s.codes, offsets, &s.scales[..count], g, out, streaming);
        if streaming {
            k.finish_streaming();
        }
        return;
    }
    let decode_rows = |first_row: usize, dst: &mut [f32]| {
        for (i, row) in dst.chunks_exact_mut(row_len).enumerate() {
            let r = first_row + i;
            for (group_index, part) in row.chunks_mut(g).enumerate() {
                let index = r * groups + group_index;
                k.dequantize_group::<B>(
                    &s.codes[r * row_bytes + group_index * group_bytes..],
                    s.offsets.get(index),
                    s.scales[index],
                    part,
                );
            }
        }
    };
    if !streaming {
        decode_rows(0, out);
        return;
    }
    let rows_per_block = (STAGING_FLOATS / row_len).max(1);
    let mut staging = vec![0f32; rows_per_block * row_len];
    for (block_index, block) in out.chunks_mut(rows_per_block * row_len).enumerate() {
        let staged = &mut staging[..block.len()];
        decode_rows(block_index * rows_per_block, staged);
        k.stream_copy(staged, block);
    }
    k.finish_streaming();
}

/// At most this many tokens per pass of [`down_columns`]: each column's codes are read in runs
/// of `PASS_TOKENS * bits / 8` bytes (at 64 tokens, a 4-bit column's 32-byte visits to 128
/// streams read at a fraction of the speed of longer runs on the AMD EPYC this was tuned on).
const PASS_TOKENS: usize = 512;

/// At most about this many bytes of codes gathered per pass of [`down_columns`].
const PASS_BYTES: usize = 64 << 10;

/// How many passes beyond the next one [`down_columns`] prefetches.
const PASSES_AHEAD: usize = 2;

/// Copies a column's few codes of a pass, 8 bytes at a time (a call to memcpy per column
/// costs more than the copy).
#[inline(always)]
fn copy_codes(dst: &mut [u8], src: &[u8]) {
    let (dst_words, dst_rest) = dst.as_chunks_mut::<8>();
    let (src_words, src_rest) = src.as_chunks::<8>();
    for (d, s) in dst_words.iter_mut().zip(src_words) {
        *d = std::hint::black_box(*s);
    }
    for (d, s) in dst_rest.iter_mut().zip(src_rest) {
        *d = *s;
    }
}

/// Hints that `s[at]` will be read soon (nothing if `at` is past the end).
#[inline(always)]
fn prefetch<T>(s: &[T], at: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(x) = s.get(at) {
        use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: SSE is part of x86_64, and a prefetch has no architectural effect.
        unsafe { _mm_prefetch::<_MM_HINT_T0>((x as *const T).cast()) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (s, at);
}

/// Decodes into `out`, `rows x cols`, whose columns are the grouped rows, 8 rows at a time.
#[inline(always)]
pub(crate) fn down_columns<K: Kernels, const B: u32>(
    k: K,
    s: Stored,
    out: &mut [f32],
    cols: usize,
    streaming: bool,
) {
    let g = s.group_size;
    let rows = out.len() / cols;
    let groups = rows.div_ceil(g);
    let group_bytes = g * B as usize / 8;
    let row_bytes = groups * group_bytes;
    // Column c's parameters and codes lie in a stream of their own (a page or more apart from
    // the next column's): a pass over several tiles gathers each column's share of the pass
    // into small buffers first, one visit per column and stream rather than one per tile
    // (and per block of 8 rows), and prefetches the next pass's share meanwhile.
    let tiles_per_pass = (PASS_TOKENS / g)
        .min(PASS_BYTES / (cols * group_bytes.max(4)))
        .max(1);
    let pass_bytes = tiles_per_pass * group_bytes;
    let mut offsets = vec![0i32; tiles_per_pass * cols];
    let mut scales = vec![0f32; tiles_per_pass * cols];
    // Slack of 8 bytes, so that the last column's last 8-byte load is in bounds too.
    let mut local_codes = vec![0u8; cols * pass_bytes + 8];
    let mut staging = vec![0f32; if streaming { 8 * cols } else { 0 }];
    let zeros: &[u8] = match s.offsets {
        Offsets::Constant(_) => &[],
        Offsets::PerGroup(zeros) => zeros,
    };
    for (pass, part) in out.chunks_mut(tiles_per_pass * g * cols).enumerate() {
        let first = pass * tiles_per_pass;
        let tiles = part.len().div_ceil(g * cols);
        let next = first + tiles + PASSES_AHEAD * tiles_per_pass;
        let cols_per_block = cols.div_ceil(part.len().div_ceil(8 * cols));
        for c in 0..cols {
            // Column c's parameters of the pass, contiguous on both sides.
            let column = c * groups + first;
            let local = c * tiles_per_pass;
            for (j, offset) in offsets[local..local + tiles].iter_mut().enumerate() {
                *offset = s.offsets.get(column + j);
            }
            scales[local..local + tiles].copy_from_slice(&s.scales[column..column + tiles]);
            let from = c * row_bytes + first * group_bytes;
            copy_codes(
                &mut local_codes[c * pass_bytes..c * pass_bytes + tiles * group_bytes],
                &s.codes[from..from + tiles * group_bytes],
            );
        }
        for (j, tile) in part.chunks_mut(g * cols).enumerate() {
            let params = ColumnParams {
                offsets: &offsets[j..],
                scales: &scales[j..],
                stride: tiles_per_pass,
                cols,
            };
            for (block_index, block) in tile.chunks_mut(8 * cols).enumerate() {
                let at = j * group_bytes + block_index * B as usize;
                // The next pass's lines, a share of the columns per block of 8 rows, so that
                // the misses overlap the decoding rather than queue up at once.
                let share = j * g.div_ceil(8) + block_index;
                for c in
                    (share * cols_per_block..(share + 1) * cols_per_block).take_while(|&c| c < cols)
                {
                    // Whole runs: a column's runs are a stream's length apart, so the
                    // hardware prefetcher does not follow them past a line.
                    for ahead in (0..tiles_per_pass).step_by(16) {
                        prefetch(s.scales, c * groups + next + ahead);
                    }
                    for ahead in (0..tiles_per_pass).step_by(64) {
                        prefetch(zeros, c * groups + next + ahead);
                    }
                    for ahead in (0..pass_bytes).step_by(64) {
                        prefetch(s.codes, c * row_bytes + next * group_bytes + ahead);
                    }
                }
                let codes = &local_codes[..];
                if streaming {
                    let staged = &mut staging[..block.len()];
                    k.dequantize_columns::<B>(codes, pass_bytes, at, params, staged);
                    k.stream_copy(staged, block);
                } else {
                    k.dequantize_columns::<B>(codes, pass_bytes, at, params, block);
                }
            }
        }
    }
    if streaming {
        k.finish_streaming();
    }
}
