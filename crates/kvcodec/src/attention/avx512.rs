//! The 2-, 4- and 8-bit attention kernels with AVX-512F: sixteen tokens (scores) or features
//! (values) to a vector, the same operations in the same order as the portable kernel, so the
//! same bits. Other widths, and the steps that are not per code, run the AVX2 kernels.
//!
//! An 8-bit code is widened, its offset subtracted in i32 and the difference converted.
//! A 4-bit code becomes `c - o` by a table lookup rather than a conversion: the sixteen values
//! `0 - o, 1 - o, .., 15 - o` (exact in f32) sit in one register, and `vpermps` picks a lane by
//! the low four bits of each index. Widening sixteen bytes gives sixteen lanes that each hold
//! two codes; the lookup reads the low nibble (the even code) and, after a shift by four, the
//! high one (the odd code), so one run of 32 codes comes out as its even and its odd codes. The
//! kernels keep scores and value accumulators in that order while they add, and put them back
//! in token or feature order with two permutes per 32 values.
//!
//! A run of 32 2-bit codes (8 bytes) is first spread to sixteen bytes, one nibble each (byte j
//! holds nibble j: codes 2j and 2j + 1); widened to sixteen lanes, the lookup in the table
//! `(i & 3) - o` reads code 2j from the low two bits and, after a shift by two, code 2j + 1: the
//! same even and odd order as 4-bit codes.

use core::arch::x86_64::*;

use super::avx2::Fma;
use super::{BLOCK_TOKENS, K_GROUP_MULTIPLE, Offsets, PASS_TOKENS, PackedHead, Scratch};

/// Proof that the CPU has AVX-512F, AVX2 and FMA.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx512 {
    fma: Fma,
}

impl Avx512 {
    /// The proof, if this CPU has all three.
    pub(crate) fn detect() -> Option<Avx512> {
        let fma = Fma::detect()?;
        std::arch::is_x86_feature_detected!("avx512f").then_some(Avx512 { fma })
    }
}

/// Channels a pass reads at a time (D is a multiple of 8; `channel_scores` names four).
const CHANNELS: usize = 4;
/// The largest query group whose accumulators the kernels hold in registers.
const MAX_GROUP: usize = 8;

/// The `c - o` of a B-bit code (B 2 or 4) for every index i in 0..16: `(i mod 2^B) - o`, every
/// value exact, so that a lookup reads a code from an index's low B bits whatever lies above.
#[inline]
#[target_feature(enable = "avx512f")]
fn table<const B: u32>(offset: i32) -> __m512 {
    let indices = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let codes = _mm512_and_si512(indices, _mm512_set1_epi32((1 << B) - 1));
    _mm512_cvtepi32_ps(_mm512_sub_epi32(codes, _mm512_set1_epi32(offset)))
}

/// `c - o` of the 32 B-bit codes (B 2 or 4) from byte `at`: (even codes, odd codes). Sixteen
/// lanes each hold one code pair: a 4-bit run's sixteen bytes as they are, a 2-bit run's eight
/// bytes spread to one nibble each; the lookup reads the even code from the low B bits and,
/// after a shift by B, the odd one.
#[inline]
#[target_feature(enable = "avx512f")]
fn even_odd<const B: u32>(codes: &[u8], at: usize, table: __m512) -> (__m512, __m512) {
    let bytes = if B == 4 {
        let run: &[u8; 16] = codes[at..at + 16].try_into().expect("16 bytes");
        // SAFETY: reads the 16 bytes of `run`.
        unsafe { _mm_loadu_si128(run.as_ptr().cast()) }
    } else {
        let run: &[u8; 8] = codes[at..at + 8].try_into().expect("8 bytes");
        // SAFETY: reads the 8 bytes of `run`.
        let x = unsafe { _mm_loadl_epi64(run.as_ptr().cast()) };
        let low = _mm_and_si128(x, _mm_set1_epi8(0x0F));
        let high = _mm_and_si128(_mm_srli_epi16::<4>(x), _mm_set1_epi8(0x0F));
        _mm_unpacklo_epi8(low, high)
    };
    let pairs = _mm512_cvtepu8_epi32(bytes);
    (
        _mm512_permutexvar_ps(pairs, table),
        _mm512_permutexvar_ps(_mm512_srli_epi32::<B>(pairs), table),
    )
}

/// Whether B-bit runs come out as (even, odd) codes rather than in order.
const fn even_odd_order(bits: u32) -> bool {
    bits == 2 || bits == 4
}

/// How a run's codes become `c - o`: a table for 2- and 4-bit codes, the offset (as bits) for
/// 8-bit.
#[inline]
#[target_feature(enable = "avx512f")]
fn decoder<const B: u32>(offset: i32) -> __m512 {
    if even_odd_order(B) {
        table::<B>(offset)
    } else {
        _mm512_castsi512_ps(_mm512_set1_epi32(offset))
    }
}

/// `c - o` of the 32 B-bit codes from byte `at`: (even, odd) codes at 2 and 4 bits, (first 16,
/// last 16) at 8.
#[inline]
#[target_feature(enable = "avx512f")]
fn run32<const B: u32>(codes: &[u8], at: usize, decoder: __m512) -> (__m512, __m512) {
    if even_odd_order(B) {
        return even_odd::<B>(codes, at, decoder);
    }
    let run: &[u8; 32] = codes[at..at + 32].try_into().expect("32 bytes");
    let offset = _mm512_castps_si512(decoder);
    let widen = |half: &[u8]| {
        // SAFETY: reads 16 bytes of `run`.
        let bytes = unsafe { _mm_loadu_si128(half.as_ptr().cast()) };
        _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(bytes), offset))
    };
    (widen(&run[..16]), widen(&run[16..]))
}

/// Indices that put 32 values in order from their (even, odd) halves: lane j of the first
/// result is value j, of the second value 16 + j (`_mm512_permutex2var_ps` reads lanes 16.. from
/// its second operand).
#[inline]
#[target_feature(enable = "avx512f")]
fn interleave(even: __m512, odd: __m512) -> (__m512, __m512) {
    let low = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    let high = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    (
        _mm512_permutex2var_ps(even, low, odd),
        _mm512_permutex2var_ps(even, high, odd),
    )
}

/// The inverse of [`interleave`]: (even, odd) halves of 32 values in order.
#[inline]
#[target_feature(enable = "avx512f")]
fn deinterleave(first: __m512, second: __m512) -> (__m512, __m512) {
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    (
        _mm512_permutex2var_ps(first, even, second),
        _mm512_permutex2var_ps(first, odd, second),
    )
}

/// A run of 32 f32 values (scores or accumulators) in [`run32`]'s order for B-bit codes.
#[inline]
#[target_feature(enable = "avx512f")]
fn load_run<const B: u32>(run: &[f32]) -> (__m512, __m512) {
    let (first, second) = (load16(run), load16(&run[16..]));
    if even_odd_order(B) {
        deinterleave(first, second)
    } else {
        (first, second)
    }
}

/// The inverse of [`load_run`].
#[inline]
#[target_feature(enable = "avx512f")]
fn store_run<const B: u32>(run: &mut [f32], (even, odd): (__m512, __m512)) {
    let (first, second) = if even_odd_order(B) {
        interleave(even, odd)
    } else {
        (even, odd)
    };
    store16(run, first);
    store16(&mut run[16..], second);
}

#[inline]
#[target_feature(enable = "avx512f")]
fn load16(values: &[f32]) -> __m512 {
    let values: &[f32; 16] = values[..16].try_into().expect("16 floats");
    // SAFETY: reads the 16 floats of `values`.
    unsafe { _mm512_loadu_ps(values.as_ptr()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn store16(values: &mut [f32], x: __m512) {
    let values: &mut [f32; 16] = (&mut values[..16]).try_into().expect("16 floats");
    // SAFETY: writes the 16 floats of `values`.
    unsafe { _mm512_storeu_ps(values.as_mut_ptr(), x) }
}

/// Step 3 over a 2-, 4- or 8-bit packed K for a pass (see the AVX2 kernel, which it computes bit
/// for bit): channel by channel, each run of 32 tokens' scores held in [`run32`]'s order while
/// the channels add in, put back in token order at the end of the pass.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) fn packed_scores<const B: u32>(
    proof: Avx512,
    head: &PackedHead,
    scaled: &[f32],
    q: usize,
    t0: usize,
    len: usize,
    s: &mut Scratch,
) {
    let k = &head.k;
    let d_count = head.features;
    let first = t0 / k.group_size;
    let pass_groups = (t0 + len).div_ceil(k.group_size) - first;
    let runs = len.div_ceil(K_GROUP_MULTIPLE);
    let runs_per_group = k.group_size / K_GROUP_MULTIPLE;
    let b = B as usize;
    let row_bytes = runs * K_GROUP_MULTIPLE * b / 8;
    s.pass_scores.clear();
    s.pass_scores.resize(q * PASS_TOKENS, 0.0);
    let channels = if q <= MAX_GROUP { CHANNELS } else { 1 };
    let symmetric = match k.offsets {
        Offsets::Constant(o) => Some(decoder::<B>(o)),
        Offsets::Stream { .. } => None,
    };
    // A step of channels ahead (the first step asked for at the start).
    for d in 0..channels {
        super::avx2::prefetch_channel(proof.fma, k, d, t0, first, row_bytes, pass_groups);
    }
    for d0 in (0..d_count).step_by(channels) {
        for d in d0 + channels..d0 + 2 * channels {
            super::avx2::prefetch_channel(proof.fma, k, d, t0, first, row_bytes, pass_groups);
        }
        if q <= MAX_GROUP {
            // qs[i][d] * sK[d][g] of the pass's groups for these channels, at [(n * Q + i) *
            // groups + g]: a vector of groups at a time.
            s.k_weights.clear();
            for d in d0..d0 + CHANNELS {
                let scales = &k.scales[d * k.groups_per_row + first..][..pass_groups];
                for i in 0..q {
                    let qs = scaled[i * d_count + d];
                    s.k_weights.extend(scales.iter().map(|&scale| qs * scale));
                }
            }
            let pass = Pass {
                t0,
                runs,
                runs_per_group,
                pass_groups,
            };
            macro_rules! queries {
                ($($q:literal)*) => {
                    match (q, symmetric) {
                        $(
                            ($q, Some(o)) => channel_scores::<B, $q, true>(head, &pass, d0, o, s),
                            ($q, None) => {
                                let none = _mm512_setzero_ps();
                                channel_scores::<B, $q, false>(head, &pass, d0, none, s)
                            }
                        )*
                        _ => unreachable!("1 to {MAX_GROUP} queries"),
                    }
                };
            }
            queries!(1 2 3 4 5 6 7 8);
            continue;
        }
        for g in 0..pass_groups {
            let group_runs = super::group_runs(k.group_size, t0, runs, g);
            // Several queries: a channel at a time, its codes turned into values once for all.
            let d = d0;
            let scale = k.scales[d * k.groups_per_row + first + g];
            let decoder =
                symmetric.unwrap_or_else(|| decoder::<B>(s.k_offsets[d * pass_groups + g]));
            for run in group_runs {
                let r = run * K_GROUP_MULTIPLE;
                let at = (d * k.row_len + t0 + r) * b / 8;
                let (ce, co) = run32::<B>(k.codes, at, decoder);
                for i in 0..q {
                    let w = _mm512_set1_ps(scaled[i * d_count + d] * scale);
                    let scores = &mut s.pass_scores[i * PASS_TOKENS + r..][..K_GROUP_MULTIPLE];
                    store16(scores, _mm512_fmadd_ps(ce, w, load16(scores)));
                    let odd = _mm512_fmadd_ps(co, w, load16(&scores[16..]));
                    store16(&mut scores[16..], odd);
                }
            }
        }
    }
    if !even_odd_order(B) {
        return;
    }
    for i in 0..q {
        let row = &mut s.pass_scores[i * PASS_TOKENS..][..runs * K_GROUP_MULTIPLE];
        for run in row.chunks_exact_mut(K_GROUP_MULTIPLE) {
            let (first, second) = interleave(load16(run), load16(&run[16..]));
            store16(run, first);
            store16(&mut run[16..], second);
        }
    }
}

/// Where a pass of a packed K lies.
struct Pass {
    t0: usize,
    runs: usize,
    runs_per_group: usize,
    pass_groups: usize,
}

/// Q queries' scores over channels d0..d0 + CHANNELS of a pass: each run's codes turned into
/// values once, then every query's scores for the run take the four channels in registers.
/// `s.k_weights` holds the channels' weights at [(n * Q + i) * groups + g].
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn channel_scores<const B: u32, const Q: usize, const SYMMETRIC: bool>(
    head: &PackedHead,
    pass: &Pass,
    d0: usize,
    symmetric: __m512,
    s: &mut Scratch,
) {
    let k = &head.k;
    let b = B as usize;
    let run_bytes = K_GROUP_MULTIPLE * b / 8;
    // The four channels' codes for the pass, a run at a time (iterators: no index to check).
    let row = |n: usize| {
        let at = ((d0 + n) * k.row_len + pass.t0) * b / 8;
        k.codes[at..][..pass.runs * run_bytes].chunks_exact(run_bytes)
    };
    let runs = row(0).zip(row(1)).zip(row(2)).zip(row(3));
    let weights = &s.k_weights[..CHANNELS * pass.pass_groups * Q];
    let offsets = &s.k_offsets;
    let scores = &mut s.pass_scores[..Q * PASS_TOKENS];
    // The pass may begin inside a group (group sizes need not divide PASS_TOKENS).
    let (mut g, mut in_group) = (0, pass.t0 % k.group_size / K_GROUP_MULTIPLE);
    let mut decoders = [symmetric; CHANNELS];
    for (run, (((c0, c1), c2), c3)) in runs.enumerate() {
        if !SYMMETRIC && (in_group == 0 || run == 0) {
            decoders =
                std::array::from_fn(|n| decoder::<B>(offsets[(d0 + n) * pass.pass_groups + g]));
        }
        let codes = [c0, c1, c2, c3];
        let values: [(__m512, __m512); CHANNELS] =
            std::array::from_fn(|n| run32::<B>(codes[n], 0, decoders[n]));
        for i in 0..Q {
            let scores =
                &mut scores[i * PASS_TOKENS + run * K_GROUP_MULTIPLE..][..K_GROUP_MULTIPLE];
            let (mut even, mut odd) = (load16(scores), load16(&scores[16..]));
            for (n, &(ce, co)) in values.iter().enumerate() {
                let w = _mm512_set1_ps(weights[(n * Q + i) * pass.pass_groups + g]);
                even = _mm512_fmadd_ps(ce, w, even);
                odd = _mm512_fmadd_ps(co, w, odd);
            }
            store16(scores, even);
            store16(&mut scores[16..], odd);
        }
        in_group += 1;
        if in_group == pass.runs_per_group {
            (g, in_group) = (g + 1, 0);
        }
    }
}

/// Step 6 over a 2-, 4- or 8-bit packed V whose rows and groups are whole 32-feature runs (see the
/// AVX2 kernel, which it computes bit for bit): for each query and run of 32 features, the
/// block's tokens in order into accumulators held in registers, in [`run32`]'s order.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) fn packed_accumulate<const B: u32>(
    _: Avx512,
    head: &PackedHead,
    q: usize,
    t0: usize,
    len: usize,
    s: &Scratch,
    acc: &mut [f32],
) {
    let v = &head.v;
    let d_count = head.features;
    let groups = v.groups_per_row;
    let b = B as usize;
    let symmetric = match v.offsets {
        Offsets::Constant(o) => Some(decoder::<B>(o)),
        Offsets::Stream { .. } => None,
    };
    if weighs_values(head, q) {
        match (q, d_count / K_GROUP_MULTIPLE) {
            (1, 2) => rows_accumulate::<B, 2>(head, t0, len, s, acc, symmetric),
            (1, 4) => rows_accumulate::<B, 4>(head, t0, len, s, acc, symmetric),
            (1, 8) => rows_accumulate::<B, 8>(head, t0, len, s, acc, symmetric),
            (1, _) => group_accumulate::<B, 1>(head, t0, len, s, acc, symmetric),
            (2, _) => group_accumulate::<B, 2>(head, t0, len, s, acc, symmetric),
            (3, _) => group_accumulate::<B, 3>(head, t0, len, s, acc, symmetric),
            (4, _) => group_accumulate::<B, 4>(head, t0, len, s, acc, symmetric),
            (5, _) => group_accumulate::<B, 5>(head, t0, len, s, acc, symmetric),
            (6, _) => group_accumulate::<B, 6>(head, t0, len, s, acc, symmetric),
            (7, _) => group_accumulate::<B, 7>(head, t0, len, s, acc, symmetric),
            _ => group_accumulate::<B, 8>(head, t0, len, s, acc, symmetric),
        }
        return;
    }
    for i in 0..q {
        for f in (0..d_count).step_by(K_GROUP_MULTIPLE) {
            let h = f / v.group_size;
            let row = &mut acc[i * d_count + f..][..K_GROUP_MULTIPLE];
            let (mut even, mut odd) = load_run::<B>(row);
            for j in 0..len {
                let w = _mm512_set1_ps(s.v_weights[(i * BLOCK_TOKENS + j) * groups + h]);
                let decoder =
                    symmetric.unwrap_or_else(|| decoder::<B>(s.v_offsets[j * groups + h]));
                let (ce, co) = run32::<B>(v.codes, ((t0 + j) * v.row_len + f) * b / 8, decoder);
                even = _mm512_fmadd_ps(ce, w, even);
                odd = _mm512_fmadd_ps(co, w, odd);
            }
            store_run::<B>(row, (even, odd));
        }
    }
}

/// Whether this module's [`packed_accumulate`] reads a V of this width, group size and head
/// dimension.
pub(crate) fn reads_values(head: &PackedHead) -> bool {
    matches!(head.v.bits, 2 | 4 | 8)
        && head.v.group_size.is_multiple_of(K_GROUP_MULTIPLE)
        && head.features.is_multiple_of(K_GROUP_MULTIPLE)
}

/// Whether it also computes step 6's weights `p[i][t] * sV[t][h]` itself (up to
/// [`MAX_GROUP`] queries), so that `s.v_weights` need not be written.
pub(crate) fn weighs_values(head: &PackedHead, q: usize) -> bool {
    reads_values(head) && q <= MAX_GROUP
}

/// [`packed_accumulate`] for Q queries: for each run of 32 features, every query's
/// accumulators in registers for the whole block, each token's codes turned into values once
/// for all of them.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn group_accumulate<const B: u32, const Q: usize>(
    head: &PackedHead,
    t0: usize,
    len: usize,
    s: &Scratch,
    acc: &mut [f32],
    symmetric: Option<__m512>,
) {
    let v = &head.v;
    let d_count = head.features;
    let groups = v.groups_per_row;
    let b = B as usize;
    let scales = &v.scales[t0 * groups..][..len * groups];
    for f in (0..d_count).step_by(K_GROUP_MULTIPLE) {
        let h = f / v.group_size;
        let mut halves: [(__m512, __m512); Q] =
            std::array::from_fn(|i| load_run::<B>(&acc[i * d_count + f..][..K_GROUP_MULTIPLE]));
        for j in 0..len {
            let decoder = symmetric.unwrap_or_else(|| decoder::<B>(s.v_offsets[j * groups + h]));
            let (ce, co) = run32::<B>(v.codes, ((t0 + j) * v.row_len + f) * b / 8, decoder);
            let scale = scales[j * groups + h];
            for (i, (even, odd)) in halves.iter_mut().enumerate() {
                let w = _mm512_set1_ps(s.scores[i * BLOCK_TOKENS + j] * scale);
                *even = _mm512_fmadd_ps(ce, w, *even);
                *odd = _mm512_fmadd_ps(co, w, *odd);
            }
        }
        for (i, &halves) in halves.iter().enumerate() {
            store_run::<B>(&mut acc[i * d_count + f..][..K_GROUP_MULTIPLE], halves);
        }
    }
}

/// [`packed_accumulate`] for one query and D = 32 * RUNS: every accumulator in registers for
/// the whole block, each token's row read front to back (one sequential stream, which this
/// machine's prefetchers follow best).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn rows_accumulate<const B: u32, const RUNS: usize>(
    head: &PackedHead,
    t0: usize,
    len: usize,
    s: &Scratch,
    acc: &mut [f32],
    symmetric: Option<__m512>,
) {
    let v = &head.v;
    let groups = v.groups_per_row;
    let b = B as usize;
    let acc = &mut acc[..RUNS * K_GROUP_MULTIPLE];
    let p = &s.scores[..len];
    let scales = &v.scales[t0 * groups..][..len * groups];
    let mut halves: [(__m512, __m512); RUNS] =
        std::array::from_fn(|n| load_run::<B>(&acc[n * K_GROUP_MULTIPLE..][..K_GROUP_MULTIPLE]));
    // Each run's group, found once.
    let group: [usize; RUNS] = std::array::from_fn(|n| n * K_GROUP_MULTIPLE / v.group_size);
    let row_bytes = v.row_len * b / 8;
    for j in 0..len {
        let at = (t0 + j) * row_bytes;
        // The row a block ahead.
        for line in (0..row_bytes).step_by(64) {
            super::avx2::prefetch(v.codes, at + BLOCK_TOKENS * row_bytes + line);
        }
        let scales = &scales[j * groups..][..groups];
        for (n, (even, odd)) in halves.iter_mut().enumerate() {
            let h = group[n];
            let w = _mm512_set1_ps(p[j] * scales[h]);
            let decoder = symmetric.unwrap_or_else(|| decoder::<B>(s.v_offsets[j * groups + h]));
            let (ce, co) = run32::<B>(v.codes, at + n * K_GROUP_MULTIPLE * b / 8, decoder);
            *even = _mm512_fmadd_ps(ce, w, *even);
            *odd = _mm512_fmadd_ps(co, w, *odd);
        }
    }
    for (n, &halves) in halves.iter().enumerate() {
        store_run::<B>(&mut acc[n * K_GROUP_MULTIPLE..][..K_GROUP_MULTIPLE], halves);
    }
}
