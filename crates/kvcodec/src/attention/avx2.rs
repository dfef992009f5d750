//! The attention kernels (steps 3 to 6 of [`crate::attention`]) with AVX2 and FMA: eight tokens
//! (scores) or eight features (values) to a vector. Each lane computes what the portable
//! kernel computes for its token or feature, with the same operations in the same order (each
//! multiply-add fused, as [`super::fma::fma`] is), so both give the same bits.
//!
//! Codes become f32 `c - o` without rounding: 4-bit codes are split from their nibbles, the
//! offset subtracted in bytes (|c - o| < 16) and the bytes sign-extended; 8-bit codes are
//! widened and the offset subtracted in i32; other widths go through [`Unpack`].

use core::arch::x86_64::*;

use super::exp::{self, C1, C2, FLUSH_BELOW, LOG2E, P};
use super::{BLOCK_TOKENS, DenseHead, K_GROUP_MULTIPLE, LANES, PackedHead, Scratch, tree_sum};
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
    ($bits:ident, $unpack:expr, $codes:expr, $at:expr, $offset:expr) => {{
        let (codes, at, offset): (&[u8], usize, i32) = ($codes, $at, $offset);
        if $bits == 4 && at + 16 <= codes.len() {
            // SAFETY: reads the 16 bytes codes[at..at + 16], in bounds as just checked.
            let x = unsafe { _mm_loadu_si128(codes.as_ptr().add(at).cast()) };
            let low = _mm_and_si128(x, _mm_set1_epi8(0x0F));
            let high = _mm_and_si128(_mm_srli_epi16::<4>(x), _mm_set1_epi8(0x0F));
            // Even codes sit in the low nibbles: interleaving puts codes 0..15, then 16..31,
            // in order; a 4-bit offset is below 16, so c - o fits a signed byte.
            let o = _mm_set1_epi8(offset as i8);
            let first = _mm_sub_epi8(_mm_unpacklo_epi8(low, high), o);
            let second = _mm_sub_epi8(_mm_unpackhi_epi8(low, high), o);
            [
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(first)),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(first))),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(second)),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(second))),
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

/// `c - offset` of sixteen B-bit codes from `codes[at..]`, as two vectors in order.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn values16<const B: u32>(unpack: &Unpack, codes: &[u8], at: usize, offset: i32) -> [__m256; 2] {
    if B == 4 && at + 8 <= codes.len() {
        // SAFETY: reads the 8 bytes codes[at..at + 8], in bounds as just checked.
        let x = unsafe { _mm_loadl_epi64(codes.as_ptr().add(at).cast()) };
        let low = _mm_and_si128(x, _mm_set1_epi8(0x0F));
        let high = _mm_and_si128(_mm_srli_epi16::<4>(x), _mm_set1_epi8(0x0F));
        let both = _mm_sub_epi8(_mm_unpacklo_epi8(low, high), _mm_set1_epi8(offset as i8));
        [
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(both)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(both))),
        ]
    } else {
        let o = _mm256_set1_epi32(offset);
        [
            values8::<B>(unpack, codes, at, o),
            values8::<B>(unpack, codes, at + B as usize, o),
        ]
    }
}

/// Asks for the bytes of a K row one block of tokens ahead of `at` (a byte of `codes`): K's
/// rows are D separate streams, more than the hardware prefetcher follows.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn prefetch_row(codes: &[u8], at: usize, bits: usize) {
    let ahead = codes.as_ptr().wrapping_add(at + BLOCK_TOKENS * bits / 8);
    // SAFETY: a prefetch is a hint that never faults, whatever the address. (Newer compilers
    // call it safe here; Rust 1.89, the workspace's rust-version, needs the block.)
    #[allow(unused_unsafe)]
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(ahead.cast::<i8>())
    };
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

/// Step 3 over a packed K, 32 tokens (one group's run, since K groups are multiples of 32) and
/// up to two queries at a time, their accumulators in registers across all D features.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn packed_scores<const B: u32>(
    _: Fma,
    head: &PackedHead,
    q: usize,
    t0: usize,
    len: usize,
    s: &mut Scratch,
) {
    let k = &head.k;
    let d_count = head.features;
    let first = t0 / k.group_size;
    let unpack = Unpack::new::<B>();
    for run in (0..len).step_by(K_GROUP_MULTIPLE) {
        let t = t0 + run;
        let g = t / k.group_size - first;
        let keys = Keys {
            codes: k.codes,
            row_len: k.row_len,
            t,
            weights: &s.k_weights[g * d_count * q..][..d_count * q],
            offsets: &s.k_offsets[g * d_count..][..d_count],
            queries: q,
        };
        if q <= 2 {
            match q {
                2 => run_scores::<B, 2>(&unpack, &keys, 0, run, &mut s.scores),
                _ => run_scores::<B, 1>(&unpack, &keys, 0, run, &mut s.scores),
            }
            continue;
        }
        // A query group: half runs, so that six queries' accumulators fit in registers and
        // each code is unpacked once per six queries.
        for half in [run, run + K_GROUP_MULTIPLE / 2] {
            let mut i = 0;
            while i < q {
                let n = (q - i).min(6);
                match n {
                    6 => half_scores::<B, 6>(&unpack, &keys, i, half, &mut s.scores),
                    5 => half_scores::<B, 5>(&unpack, &keys, i, half, &mut s.scores),
                    4 => half_scores::<B, 4>(&unpack, &keys, i, half, &mut s.scores),
                    3 => half_scores::<B, 3>(&unpack, &keys, i, half, &mut s.scores),
                    2 => half_scores::<B, 2>(&unpack, &keys, i, half, &mut s.scores),
                    _ => half_scores::<B, 1>(&unpack, &keys, i, half, &mut s.scores),
                }
                i += n;
            }
        }
    }
}

/// One 32-token run of a packed K, and its block's weights and offsets.
struct Keys<'a> {
    codes: &'a [u8],
    row_len: usize,
    t: usize,
    weights: &'a [f32],
    offsets: &'a [i32],
    queries: usize,
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn run_scores<const B: u32, const N: usize>(
    unpack: &Unpack,
    keys: &Keys,
    i0: usize,
    run: usize,
    scores: &mut [f32],
) {
    let b = B as usize;
    let mut acc = [[_mm256_setzero_ps(); 4]; N];
    for (d, &offset) in keys.offsets.iter().enumerate() {
        // A multiple of 8: rows are whole groups and runs start at multiples of 32.
        let base = d * keys.row_len + keys.t;
        prefetch_row(keys.codes, base * b / 8, b);
        let c = values32!(B, unpack, keys.codes, base * b / 8, offset);
        for (n, acc) in acc.iter_mut().enumerate() {
            let w = _mm256_set1_ps(keys.weights[d * keys.queries + i0 + n]);
            for (a, &c) in acc.iter_mut().zip(&c) {
                *a = _mm256_fmadd_ps(c, w, *a);
            }
        }
    }
    for (n, acc) in acc.iter().enumerate() {
        let row = &mut scores[(i0 + n) * BLOCK_TOKENS + run..][..K_GROUP_MULTIPLE];
        for (dst, &a) in row.as_chunks_mut::<LANES>().0.iter_mut().zip(acc) {
            store(dst, a);
        }
    }
}

/// [`run_scores`] over 16 tokens from `half` (relative to the block) for queries i0..i0 + N.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn half_scores<const B: u32, const N: usize>(
    unpack: &Unpack,
    keys: &Keys,
    i0: usize,
    half: usize,
    scores: &mut [f32],
) {
    let b = B as usize;
    let t = keys.t + (half % K_GROUP_MULTIPLE);
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    for (d, &offset) in keys.offsets.iter().enumerate() {
        let base = d * keys.row_len + t;
        prefetch_row(keys.codes, base * b / 8, b);
        let c = values16::<B>(unpack, keys.codes, base * b / 8, offset);
        let weights = &keys.weights[d * keys.queries + i0..][..N];
        for (acc, &w) in acc.iter_mut().zip(weights) {
            let w = _mm256_set1_ps(w);
            acc[0] = _mm256_fmadd_ps(c[0], w, acc[0]);
            acc[1] = _mm256_fmadd_ps(c[1], w, acc[1]);
        }
    }
    for (n, acc) in acc.iter().enumerate() {
        let row = &mut scores[(i0 + n) * BLOCK_TOKENS + half..][..K_GROUP_MULTIPLE / 2];
        for (dst, &a) in row.as_chunks_mut::<LANES>().0.iter_mut().zip(acc) {
            store(dst, a);
        }
    }
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

/// Step 3 over an unpacked K, four tokens at a time per query.
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
    let mut j = 0;
    while j < len {
        if len - j >= 4 {
            dense_tokens::<4>(head, scaled, q, t0 + j, &mut scores[j..]);
            j += 4;
        } else {
            dense_tokens::<1>(head, scaled, q, t0 + j, &mut scores[j..]);
            j += 1;
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn dense_tokens<const N: usize>(
    head: &DenseHead,
    scaled: &[f32],
    q: usize,
    t: usize,
    scores: &mut [f32],
) {
    let d_count = head.features;
    for i in 0..q {
        let mut acc = [_mm256_setzero_ps(); N];
        for f in (0..d_count).step_by(LANES) {
            let x = load_at(scaled, i * d_count + f);
            for (n, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(x, load_at(head.k, (t + n) * d_count + f), *a);
            }
        }
        for (n, &a) in acc.iter().enumerate() {
            let mut lanes = [0f32; LANES];
            store(&mut lanes, a);
            scores[i * BLOCK_TOKENS + n] = tree_sum(lanes);
        }
    }
}

/// Step 6 over an unpacked V, four tokens at a time.
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
    let mut j = 0;
    while j < len {
        let n_count = if len - j >= 4 { 4 } else { 1 };
        for i in 0..q {
            for f in (0..d_count).step_by(LANES) {
                let at = i * d_count + f;
                let mut a = load_at(acc, at);
                for n in 0..n_count {
                    let x = load_at(head.v, (t0 + j + n) * d_count + f);
                    let w = _mm256_set1_ps(p[i * BLOCK_TOKENS + j + n]);
                    a = _mm256_fmadd_ps(x, w, a);
                }
                store((&mut acc[at..at + LANES]).try_into().expect("8 floats"), a);
            }
        }
        j += n_count;
    }
}
