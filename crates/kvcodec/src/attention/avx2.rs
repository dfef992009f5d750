//! The attention kernels (steps 3 to 6 of [`crate::attention`]) with AVX2 and FMA: eight tokens
//! (scores) or eight features (values) to a vector. Each lane computes what the portable
//! kernel computes for its token or feature, with the same operations in the same order (each
//! multiply-add fused, as [`super::fma::fma`] is), so both give the same bits.
//!
//! Codes become f32 `c - o` without rounding: 4-bit codes are split from their nibbles and
//! 2-bit codes from their four bit planes, the offset subtracted in bytes (|c - o| < 16) and the
//! bytes sign-extended; 8-bit codes are widened and the offset subtracted in i32; other widths
//! go through [`Unpack`].

use core::arch::x86_64::*;

use super::exp::{self, C1, C2, FLUSH_BELOW, LOG2E, P};
use super::{
    BLOCK_TOKENS, DenseHead, K_GROUP_MULTIPLE, LANES, PASS_TOKENS, PackedHead, Scratch, Stream,
    tree_sum,
};
use crate::fast::avx2::Avx2;
use crate::fast::avx2::unpack::{Unpack, broadcast_codes};
use crate::fast::avx2::vectors::{load, load_at, store};

/// Proof that the CPU has AVX2 and FMA.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fma {
    _avx2: Avx2,
}

impl Fma {
    /// The proof, if this CPU has both.
    pub(crate) fn detect() -> Option<Fma> {
        let avx2 = Avx2::detect()?;
        std::arch::is_x86_feature_detected!("fma").then_some(Fma { _avx2: avx2 })
    }
}

/// `c - offset` of eight B-bit codes from `codes[at..]` (zero codes past the end of `codes`).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn values8<const B: u32>(unpack: &Unpack, codes: &[u8], at: usize, offset: __m256i) -> __m256 {
    let codes = if B == 8 && at + 8 <= codes.len() {
        // SAFETY: reads the 8 bytes codes[at..at + 8], in bounds as just checked.
        unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(codes.as_ptr().add(at).cast())) }
    } else {
        unpack.spread(broadcast_codes(codes, at))
    };
    _mm256_cvtepi32_ps(_mm256_sub_epi32(codes, offset))
}

/// `c - offset` of thirty-two B-bit codes from `codes[at..]`, as four vectors in order. A
/// macro, not a function, so that it is inlined into every kernel (a `#[target_feature]`
/// function cannot be `#[inline(always)]`, and a call passes the four vectors through memory).
macro_rules! values32 {
    // A run of 2- or 4-bit codes as bytes: (codes 0..15, codes 16..31), in order.
    (@bytes $bits:ident, $codes:expr, $at:expr) => {{
        let (codes, at): (&[u8], usize) = ($codes, $at);
        if $bits == 4 {
            // Even codes sit in the low nibbles: interleaving the nibbles puts them in order.
            let run: &[u8; 16] = codes[at..at + 16].try_into().expect("16 bytes");
            // SAFETY: reads the 16 bytes of `run`.
            let x = unsafe { _mm_loadu_si128(run.as_ptr().cast()) };
            let low = _mm_and_si128(x, _mm_set1_epi8(0x0F));
            let high = _mm_and_si128(_mm_srli_epi16::<4>(x), _mm_set1_epi8(0x0F));
            (_mm_unpacklo_epi8(low, high), _mm_unpackhi_epi8(low, high))
        } else {
            // 2-bit codes: byte j holds codes 4j..4j+3 from its low bits up (a 16-bit shift
            // keeps each byte's bits apart once masked); interleaving the four planes' bytes,
            // then their byte pairs, puts the codes in order.
            let run: &[u8; 8] = codes[at..at + 8].try_into().expect("8 bytes");
            // SAFETY: reads the 8 bytes of `run`.
            let x = unsafe { _mm_loadl_epi64(run.as_ptr().cast()) };
            let plane = |x: __m128i| _mm_and_si128(x, _mm_set1_epi8(0x03));
            let c01 = _mm_unpacklo_epi8(plane(x), plane(_mm_srli_epi16::<2>(x)));
            let c23 =
                _mm_unpacklo_epi8(plane(_mm_srli_epi16::<4>(x)), plane(_mm_srli_epi16::<6>(x)));
            (_mm_unpacklo_epi16(c01, c23), _mm_unpackhi_epi16(c01, c23))
        }
    }};
    ($bits:ident, $unpack:expr, $codes:expr, $at:expr, $offset:expr) => {{
        let (codes, at, offset): (&[u8], usize, i32) = ($codes, $at, $offset);
        // A run of 32 codes lies inside its row, so the 2-, 4- and 8-bit paths index (a failed
        // check panics, out of line) rather than fall back to a call, which would make the
        // compiler keep the callers' accumulators in memory.
        if $bits == 4 || $bits == 2 {
            // Codes 0..15 and 16..31 as bytes `c - o`: |c - o| < 16 fits a signed byte.
            let (ordered, o) = (values32!(@bytes $bits, codes, at), _mm_set1_epi8(offset as i8));
            let (first, second) = (_mm_sub_epi8(ordered.0, o), _mm_sub_epi8(ordered.1, o));
            [
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(first)),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(first))),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(second)),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(second))),
            ]
        } else if $bits == 8 {
            let run: &[u8; 32] = codes[at..at + 32].try_into().expect("32 bytes");
            // SAFETY: reads the 32 bytes of `run`.
            let x = unsafe { _mm256_loadu_si256(run.as_ptr().cast()) };
            let (low, high) = (_mm256_castsi256_si128(x), _mm256_extracti128_si256::<1>(x));
            let o = _mm256_set1_epi32(offset);
            let widen = |bytes: __m128i| {
                _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(bytes), o))
            };
            [
                widen(low),
                widen(_mm_srli_si128::<8>(low)),
                widen(high),
                widen(_mm_srli_si128::<8>(high)),
            ]
        } else {
            let b = $bits as usize;
            let o = _mm256_set1_epi32(offset);
            [
                values8::<$bits>($unpack, codes, at, o),
                values8::<$bits>($unpack, codes, at + b, o),
                values8::<$bits>($unpack, codes, at + 2 * b, o),
                values8::<$bits>($unpack, codes, at + 3 * b, o),
            ]
        }
    }};
}

/// [`exp::exp`] on eight lanes, with the same operations (none fused).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp8(x: __m256) -> __m256 {
    let flush = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(FLUSH_BELOW));
    let n = _mm256_floor_ps(_mm256_add_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        _mm256_set1_ps(0.5),
    ));
    let r = _mm256_sub_ps(
        _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(C1))),
        _mm256_mul_ps(n, _mm256_set1_ps(C2)),
    );
    let r2 = _mm256_mul_ps(r, r);
    let mut y = _mm256_set1_ps(P[0]);
    for &p in &P[1..] {
        y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(p));
    }
    let y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(y, r2), r), _mm256_set1_ps(1.0));
    let n = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    let two_n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(n));
    _mm256_andnot_ps(flush, _mm256_mul_ps(y, two_n))
}

/// Steps 4 and 5 (see the portable kernel): eight tokens at a time, the lanes a vector.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn weights(_: Fma, scores: &mut [f32], seen: usize, m: f32) -> [f32; LANES] {
    let len = scores.len();
    let whole = len / LANES * LANES;
    let max = _mm256_set1_ps(m);
    let seen_v = _mm256_set1_epi32(seen as i32);
    let step = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mut lanes = _mm256_setzero_ps();
    for at in (0..whole).step_by(LANES) {
        let index = _mm256_add_epi32(_mm256_set1_epi32(at as i32), step);
        let visible = _mm256_castsi256_ps(_mm256_cmpgt_epi32(seen_v, index));
        let p = _mm256_and_ps(visible, exp8(_mm256_sub_ps(load_at(scores, at), max)));
        store(
            (&mut scores[at..at + LANES]).try_into().expect("8 floats"),
            p,
        );
        lanes = _mm256_add_ps(lanes, p);
    }
    let mut out = [0f32; LANES];
    store(&mut out, lanes);
    for (t, s) in scores.iter_mut().enumerate().skip(whole) {
        *s = if t < seen { exp::exp(*s - m) } else { 0.0 };
        out[t % LANES] += *s;
    }
    out
}

/// Step 3 over a packed K for a pass of tokens t0..t0 + len (rounded up to whole 32-token
/// runs), channel by channel: each channel's codes and scales are read front to back (the next
/// channel's asked for meanwhile: the channels are D streams a row apart, more than the hardware
/// prefetcher follows), 32 tokens at a time, and every query's scores for those tokens take the
/// channel's term in memory (a pass's scores stay in the L1 cache). Each score still sums the
/// channels in order, and `qs[i][d] * sK[d][g]` is the same one multiply.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn packed_scores<const B: u32>(
    proof: Fma,
    head: &PackedHead,
    scaled: &[f32],
    q: usize,
    t0: usize,
    len: usize,
    s: &mut Scratch,
) {
    let k = &head.k;
    let b = B as usize;
    let d_count = head.features;
    let first = t0 / k.group_size;
    let pass_groups = (t0 + len).div_ceil(k.group_size) - first;
    let unpack = Unpack::new::<B>();
    let runs = len.div_ceil(K_GROUP_MULTIPLE);
    // A multiple of 8 bits: rows are whole groups and passes start at multiples of 32 tokens.
    let row_bytes = runs * K_GROUP_MULTIPLE * b / 8;
    s.pass_scores.clear();
    s.pass_scores.resize(q * PASS_TOKENS, 0.0);
    if q == 1 {
        // One query: four channels at a time, the scores of a run in registers between them.
        for d0 in (0..d_count).step_by(CHANNELS) {
            for d in d0 + CHANNELS..d0 + 2 * CHANNELS {
                prefetch_channel(proof, k, d, t0, first, row_bytes, pass_groups);
            }
            let at: [usize; CHANNELS] =
                std::array::from_fn(|n| ((d0 + n) * k.row_len + t0) * b / 8);
            for g in 0..pass_groups {
                let w: [__m256; CHANNELS] = std::array::from_fn(|n| {
                    let d = d0 + n;
                    _mm256_set1_ps(scaled[d] * k.scales[d * k.groups_per_row + first + g])
                });
                let o: [i32; CHANNELS] =
                    std::array::from_fn(|n| s.k_offsets[(d0 + n) * pass_groups + g]);
                let runs = super::group_runs(k.group_size, t0, runs, g);
                for run in runs {
                    let r = run * K_GROUP_MULTIPLE;
                    let scores = &mut s.pass_scores[r..][..K_GROUP_MULTIPLE];
                    let mut acc = [_mm256_setzero_ps(); 4];
                    for (a, src) in acc.iter_mut().zip(scores.as_chunks::<LANES>().0) {
                        *a = load(src);
                    }
                    for n in 0..CHANNELS {
                        let c = values32!(B, &unpack, k.codes, at[n] + r * b / 8, o[n]);
                        for (a, &c) in acc.iter_mut().zip(&c) {
                            *a = _mm256_fmadd_ps(c, w[n], *a);
                        }
                    }
                    for (dst, &a) in scores.as_chunks_mut::<LANES>().0.iter_mut().zip(&acc) {
                        store(dst, a);
                    }
                }
            }
        }
        return;
    }
    for d in 0..d_count {
        let at = (d * k.row_len + t0) * b / 8;
        let scales = &k.scales[d * k.groups_per_row + first..][..pass_groups];
        let offsets = &s.k_offsets[d * pass_groups..][..pass_groups];
        let next = (d + 1) * k.row_len * b / 8 + t0 * b / 8;
        for line in (0..row_bytes).step_by(64) {
            prefetch(k.codes, next + line);
        }
        let next_scales = ((d + 1) * k.groups_per_row + first) * 4;
        for line in (0..pass_groups * 4).step_by(64) {
            prefetch(bytes_of(k.scales), next_scales + line);
        }
        for g in 0..pass_groups {
            let scale = scales[g];
            let offset = offsets[g];
            let runs = super::group_runs(k.group_size, t0, runs, g);
            for run in runs {
                let r = run * K_GROUP_MULTIPLE;
                let c = values32!(B, &unpack, k.codes, at + r * b / 8, offset);
                for i in 0..q {
                    let w = _mm256_set1_ps(scaled[i * d_count + d] * scale);
                    let scores = &mut s.pass_scores[i * PASS_TOKENS + r..][..K_GROUP_MULTIPLE];
                    for (dst, &c) in scores.as_chunks_mut::<LANES>().0.iter_mut().zip(&c) {
                        store(dst, _mm256_fmadd_ps(c, w, load(dst)));
                    }
                }
            }
        }
    }
}

/// Channels a one-query pass reads at a time (D is a multiple of 8).
const CHANNELS: usize = 4;

/// Asks for channel d's codes (`row_bytes` from token t0) and scales (`groups` from group
/// `first`) of a packed K: the channels are D streams a row apart, more than the hardware
/// prefetcher follows.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn prefetch_channel(
    _: Fma,
    k: &Stream,
    d: usize,
    t0: usize,
    first: usize,
    row_bytes: usize,
    groups: usize,
) {
    let codes = (d * k.row_len + t0) * k.bits as usize / 8;
    // Into L2 rather than L1: a step's lines are more than the L1 cache's fill buffers hold,
    // and measured (paired against f32 attention) the 8-bit kernel ran 5-15% faster so.
    for line in (0..row_bytes).step_by(64) {
        prefetch_l2(k.codes.as_ptr().wrapping_add(codes + line));
    }
    let scales = (d * k.groups_per_row + first) * 4;
    for line in (0..groups * 4).step_by(64) {
        prefetch(bytes_of(k.scales), scales + line);
    }
}

/// Asks for the line at `at` into L2 rather than L1.
#[inline]
pub(crate) fn prefetch_l2(at: *const u8) {
    // SAFETY: a prefetch is a hint that never faults, whatever the address. (Newer compilers
    // call it safe here; Rust 1.89, the workspace's rust-version, needs the block.)
    #[allow(unused_unsafe)]
    unsafe {
        _mm_prefetch::<_MM_HINT_T1>(at.cast::<i8>())
    };
}

/// A slice of f32 as its bytes (for prefetching).
fn bytes_of(values: &[f32]) -> &[u8] {
    // SAFETY: any f32 is four initialised bytes; the length is the same memory's.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(values)) }
}

/// Asks for the line holding `bytes[at]` (a hint that never faults, even past the end).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn prefetch(bytes: &[u8], at: usize) {
    let line = bytes.as_ptr().wrapping_add(at);
    // SAFETY: a prefetch is a hint that never faults, whatever the address. (Newer compilers
    // call it safe here; Rust 1.89, the workspace's rust-version, needs the block.)
    #[allow(unused_unsafe)]
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(line.cast::<i8>())
    };
}

/// Step 6 over a packed V. Rows and groups of whole 32-feature runs are read 32 features at a
/// time, four tokens per load and store of the accumulators for one query, two for a group of
/// queries; other shapes eight features at a time.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn packed_accumulate<const B: u32>(
    _: Fma,
    head: &PackedHead,
    q: usize,
    t0: usize,
    len: usize,
    s: &Scratch,
    acc: &mut [f32],
) {
    let unpack = Unpack::new::<B>();
    let mut j = 0;
    if head.v.group_size.is_multiple_of(K_GROUP_MULTIPLE)
        && head.features.is_multiple_of(K_GROUP_MULTIPLE)
    {
        if q == 1 {
            while j + 4 <= len {
                tokens_accumulate32::<B, 4>(&unpack, head, 0, t0, j, s, acc);
                j += 4;
            }
        } else {
            while j + 2 <= len {
                pair_accumulate32::<B>(&unpack, head, q, t0, j, s, acc);
                j += 2;
            }
        }
        while j < len {
            for i in 0..q {
                tokens_accumulate32::<B, 1>(&unpack, head, i, t0, j, s, acc);
            }
            j += 1;
        }
        return;
    }
    while j < len {
        token_accumulate::<B>(&unpack, head, q, t0, j, s, acc);
        j += 1;
    }
}

/// N tokens from j into query i's accumulators, 32 features at a time: each accumulator takes
/// the tokens in order between one load and one store.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn tokens_accumulate32<const B: u32, const N: usize>(
    unpack: &Unpack,
    head: &PackedHead,
    i: usize,
    t0: usize,
    j: usize,
    s: &Scratch,
    acc: &mut [f32],
) {
    let v = &head.v;
    let b = B as usize;
    let d_count = head.features;
    let groups = v.groups_per_row;
    let weights = &s.v_weights[(i * BLOCK_TOKENS + j) * groups..][..N * groups];
    let offsets = &s.v_offsets[j * groups..][..N * groups];
    for f in (0..d_count).step_by(K_GROUP_MULTIPLE) {
        let h = f / v.group_size;
        let row = &mut acc[i * d_count + f..][..K_GROUP_MULTIPLE];
        let mut a = [_mm256_setzero_ps(); 4];
        for (a, src) in a.iter_mut().zip(row.as_chunks::<LANES>().0) {
            *a = load(src);
        }
        for n in 0..N {
            let w = _mm256_set1_ps(weights[n * groups + h]);
            let at = ((t0 + j + n) * v.row_len + f) * b / 8;
            let c = values32!(B, unpack, v.codes, at, offsets[n * groups + h]);
            for (a, &c) in a.iter_mut().zip(&c) {
                *a = _mm256_fmadd_ps(c, w, *a);
            }
        }
        for (dst, &a) in row.as_chunks_mut::<LANES>().0.iter_mut().zip(&a) {
            store(dst, a);
        }
    }
}

/// Two tokens from j into every query's accumulators, 32 features at a time: the pair's codes
/// are unpacked once, then each query's accumulators take both tokens in order.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn pair_accumulate32<const B: u32>(
    unpack: &Unpack,
    head: &PackedHead,
    q: usize,
    t0: usize,
    j: usize,
    s: &Scratch,
    acc: &mut [f32],
) {
    let v = &head.v;
    let b = B as usize;
    let d_count = head.features;
    let groups = v.groups_per_row;
    for f in (0..d_count).step_by(K_GROUP_MULTIPLE) {
        let h = f / v.group_size;
        let at = ((t0 + j) * v.row_len + f) * b / 8;
        let next = at + v.row_len * b / 8;
        let c0 = values32!(B, unpack, v.codes, at, s.v_offsets[j * groups + h]);
        let c1 = values32!(B, unpack, v.codes, next, s.v_offsets[(j + 1) * groups + h]);
        for i in 0..q {
            let weights = &s.v_weights[(i * BLOCK_TOKENS + j) * groups + h..];
            let (w0, w1) = (_mm256_set1_ps(weights[0]), _mm256_set1_ps(weights[groups]));
            let row = &mut acc[i * d_count + f..][..K_GROUP_MULTIPLE];
            for ((dst, &a), &b) in row.as_chunks_mut::<LANES>().0.iter_mut().zip(&c0).zip(&c1) {
                let x = _mm256_fmadd_ps(a, w0, load(dst));
                store(dst, _mm256_fmadd_ps(b, w1, x));
            }
        }
    }
}

/// One token into every query's accumulators, eight features at a time.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn token_accumulate<const B: u32>(
    unpack: &Unpack,
    head: &PackedHead,
    q: usize,
    t0: usize,
    j: usize,
    s: &Scratch,
    acc: &mut [f32],
) {
    let v = &head.v;
    let b = B as usize;
    let d_count = head.features;
    let groups = v.groups_per_row;
    for f in (0..d_count).step_by(LANES) {
        // Groups are multiples of 8 features, so the 8 share one.
        let h = f / v.group_size;
        let offset = _mm256_set1_epi32(s.v_offsets[j * groups + h]);
        // A multiple of 8: rows are whole groups of a multiple of 8 features.
        let at = ((t0 + j) * v.row_len + f) * b / 8;
        let c = values8::<B>(unpack, v.codes, at, offset);
        for i in 0..q {
            let at = i * d_count + f;
            let w = _mm256_set1_ps(s.v_weights[(i * BLOCK_TOKENS + j) * groups + h]);
            let a = _mm256_fmadd_ps(c, w, load_at(acc, at));
            store((&mut acc[at..at + LANES]).try_into().expect("8 floats"), a);
        }
    }
}

/// Step 3 over an unpacked K, one token at a time: each row is read once, front to back (four
/// rows interleaved read half as fast on this project's machine, whose prefetchers follow one
/// sequential stream far better than four streams a row apart).
#[target_feature(enable = "avx2,fma")]
pub(crate) fn dense_scores(
    _: Fma,
    head: &DenseHead,
    scaled: &[f32],
    q: usize,
    t0: usize,
    len: usize,
    scores: &mut [f32],
) {
    let d_count = head.features;
    for j in 0..len {
        let row = &head.k[(t0 + j) * d_count..][..d_count];
        for i in 0..q {
            let qs = &scaled[i * d_count..][..d_count];
            let mut lanes = _mm256_setzero_ps();
            for (x, k) in qs
                .as_chunks::<LANES>()
                .0
                .iter()
                .zip(row.as_chunks::<LANES>().0)
            {
                lanes = _mm256_fmadd_ps(load(x), load(k), lanes);
            }
            let mut out = [0f32; LANES];
            store(&mut out, lanes);
            scores[i * BLOCK_TOKENS + j] = tree_sum(out);
        }
    }
}

/// Step 6 over an unpacked V, one token at a time, its row read front to back.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn dense_accumulate(
    _: Fma,
    head: &DenseHead,
    q: usize,
    t0: usize,
    len: usize,
    p: &[f32],
    acc: &mut [f32],
) {
    let d_count = head.features;
    for j in 0..len {
        let row = &head.v[(t0 + j) * d_count..][..d_count];
        for i in 0..q {
            let w = _mm256_set1_ps(p[i * BLOCK_TOKENS + j]);
            let acc = &mut acc[i * d_count..][..d_count];
            for (a, x) in acc
                .as_chunks_mut::<LANES>()
                .0
                .iter_mut()
                .zip(row.as_chunks::<LANES>().0)
            {
                store(a, _mm256_fmadd_ps(load(x), w, load(a)));
            }
        }
    }
}
