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

/// Proof that the CPU has AVX-512F, AVX2 and FMA (the AVX2 proof, which it carries, is the
/// other two).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx512 {
    _fma: Fma,
}

impl Avx512 {
    /// The proof, if this CPU has all three.
    pub(crate) fn detect() -> Option<Avx512> {
        let fma = Fma::detect()?;
        std::arch::is_x86_feature_detected!("avx512f").then_some(Avx512 { _fma: fma })
    }
}

/// The largest query group whose accumulators the kernels hold in registers: every query tile.
const MAX_GROUP: usize = super::QUERY_TILE;

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

/// The `c - o` of 32 B-bit codes at `at`, as [`run32`] reads them, without a bounds check.
///
/// # Safety
///
/// The run's `32 * B / 8` bytes from `at` must be readable.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn run32_at<const B: u32>(at: *const u8, decoder: __m512) -> (__m512, __m512) {
    let run_bytes = K_GROUP_MULTIPLE * B as usize / 8;
    // SAFETY: the caller vouches for the run's bytes.
    run32::<B>(
        unsafe { std::slice::from_raw_parts(at, run_bytes) },
        0,
        decoder,
    )
}

/// Channels a step of a pass reads side by side (D is a multiple of 8).
const CHANNELS: usize = 8;

/// Step 3 over a 2-, 4- or 8-bit packed K for a pass, for up to [`MAX_GROUP`] queries (every
/// query tile), computing the AVX2 kernel's bits: a step of [`CHANNELS`] channels at a time,
/// each run of 32 tokens' scores loaded once per step, in [`run32`]'s order, while the step's
/// channels add in, in order; put back in token order at the end of the pass. K packed per
/// channel is D streams a row apart: a step reads its channels' runs front to back (streams
/// this machine's caches hold without evicting one another, where a row's worth of channels
/// at one offset all fall in one cache set), and asks for the next step's codes and scales
/// while it works.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) fn packed_scores<const B: u32>(
    _: Avx512,
    head: &PackedHead,
    scaled: &[f32],
    q: usize,
    t0: usize,
    len: usize,
    s: &mut Scratch,
) {
    assert!(
        (1..=MAX_GROUP).contains(&q),
        "a query tile has 1 to {MAX_GROUP} rows"
    );
    let k = &head.k;
    let d_count = head.features;
    let first = t0 / k.group_size;
    let pass_groups = (t0 + len).div_ceil(k.group_size) - first;
    // The step kernels read whole runs of every channel's row: the padded row holds them.
    let runs = len.div_ceil(K_GROUP_MULTIPLE);
    assert!(t0 + runs * K_GROUP_MULTIPLE <= k.row_len);
    assert!(k.codes.len() >= d_count * k.row_len * B as usize / 8);
    assert!(d_count.is_multiple_of(CHANNELS));
    s.pass_scores.clear();
    s.pass_scores.resize(q * PASS_TOKENS, 0.0);
    let pass = Pass {
        t0,
        run_groups: (0..runs)
            .map(|r| (t0 + r * K_GROUP_MULTIPLE) / k.group_size - first)
            .collect(),
        runs,
        pass_groups,
    };
    for d0 in (0..d_count).step_by(CHANNELS) {
        // qs[i][d] * sK[d][g] of the pass's groups for these channels, at [(c * Q + i) *
        // groups + g]: a vector of groups at a time.
        s.k_weights.resize(CHANNELS * q * pass_groups, 0.0);
        let mut weights = s.k_weights.chunks_exact_mut(pass_groups);
        for d in d0..d0 + CHANNELS {
            let scales = &k.scales[d * k.groups_per_row + first..][..pass_groups];
            for (i, weights) in (0..q).zip(&mut weights) {
                let qs = scaled[i * d_count + d];
                // Into slices made once: pushing one value at a time kept this loop scalar.
                for (w, &scale) in weights.iter_mut().zip(scales) {
                    *w = qs * scale;
                }
            }
        }
        // The next step's scales: this pass's next channels, or the next pass's first.
        let (next_d, next_t) = if d0 + CHANNELS < d_count {
            (d0 + CHANNELS, t0)
        } else {
            (0, t0 + len)
        };
        let next_first = next_t / k.group_size;
        for d in next_d..next_d + CHANNELS {
            let at = k
                .scales
                .as_ptr()
                .wrapping_add(d * k.groups_per_row + next_first);
            for line in (0..pass_groups).step_by(16) {
                super::prefetch(at.wrapping_add(line));
            }
        }
        let step = Step {
            d0,
            next: (next_d * k.row_len + next_t) * B as usize / 8,
        };
        macro_rules! queries {
            ($($q:literal)*) => {
                match (q, k.offsets) {
                    $(
                        // SAFETY: the rows hold the pass's runs of every channel (checked above).
                        ($q, Offsets::Constant(o)) => unsafe {
                            channel_scores::<B, $q, true>(head, &pass, &step, o, s)
                        },
                        ($q, Offsets::Stream { .. }) => unsafe {
                            channel_scores::<B, $q, false>(head, &pass, &step, 0, s)
                        },
                    )*
                    _ => unreachable!("1 to {MAX_GROUP} queries"),
                }
            };
        }
        queries!(1 2 3 4 5 6 7 8);
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
    /// Each run's group, counted from the pass's first (the pass may begin inside one).
    run_groups: Vec<usize>,
    /// Runs of 32 tokens it covers.
    runs: usize,
    /// Groups it touches.
    pass_groups: usize,
}

/// A step of [`CHANNELS`] channels of a pass.
struct Step {
    d0: usize,
    /// The byte of the codes where the next step's first channel begins (to prefetch).
    next: usize,
}

/// Runs of 32 tokens whose scores one iteration of [`channel_scores`] holds in registers for Q
/// queries: each score's sum over a step's channels is a chain of dependent multiply-adds, and
/// several runs side by side keep the multiply-add units busy while each chain waits.
const fn step_runs(q: usize) -> usize {
    match q {
        1 | 2 => 4,
        3 | 4 => 2,
        _ => 1,
    }
}

/// Q queries' scores over a step's channels for a whole pass, [`step_runs`] runs at a time (then
/// one at a time for the rest): each run's codes turned into values once per channel for every
/// query, the runs' scores loaded and stored once per step. `s.k_weights` holds the channels'
/// weights at [(c * Q + i) * groups + g].
///
/// # Safety
///
/// Every channel's row must hold the pass's runs.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn channel_scores<const B: u32, const Q: usize, const SYMMETRIC: bool>(
    head: &PackedHead,
    pass: &Pass,
    step: &Step,
    offset: i32,
    s: &mut Scratch,
) {
    let whole = pass.runs / step_runs(Q) * step_runs(Q);
    macro_rules! runs {
        ($runs:literal, $range:expr) => {
            for run in $range.step_by($runs) {
                // SAFETY: the caller vouches for every channel's runs.
                unsafe { step_scores::<B, Q, $runs, SYMMETRIC>(head, pass, step, run, offset, s) }
            }
        };
    }
    match step_runs(Q) {
        4 => runs!(4, 0..whole),
        2 => runs!(2, 0..whole),
        _ => runs!(1, 0..whole),
    }
    runs!(1, whole..pass.runs);
}

/// [`channel_scores`] for runs `run..run + RUNS` of the pass.
///
/// # Safety
///
/// Every channel's row must hold these runs.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn step_scores<const B: u32, const Q: usize, const RUNS: usize, const SYMMETRIC: bool>(
    head: &PackedHead,
    pass: &Pass,
    step: &Step,
    run: usize,
    offset: i32,
    s: &mut Scratch,
) {
    let k = &head.k;
    let b = B as usize;
    let run_bytes = K_GROUP_MULTIPLE * b / 8;
    let row_bytes = k.row_len * b / 8;
    let at = run * run_bytes;
    let codes = k
        .codes
        .as_ptr()
        .wrapping_add((step.d0 * k.row_len + pass.t0) * b / 8 + at);
    // The next step's lines at these offsets, into L2 (a step's lines are more than the L1
    // cache's fill buffers hold).
    let next = k.codes.as_ptr().wrapping_add(step.next + at);
    for line in (at.next_multiple_of(64) - at..RUNS * run_bytes).step_by(64) {
        for c in 0..CHANNELS {
            super::avx2::prefetch_l2(next.wrapping_add(c * row_bytes + line));
        }
    }
    let pg = pass.pass_groups;
    let group: [usize; RUNS] = std::array::from_fn(|r| pass.run_groups[run + r]);
    let weights = s.k_weights[..CHANNELS * Q * pg].as_ptr();
    let offsets = s.k_offsets[step.d0 * pg..][..CHANNELS * pg].as_ptr();
    let symmetric = decoder::<B>(offset);
    let scores = &mut s.pass_scores[..Q * PASS_TOKENS];
    // Loops, not closures, throughout: the `array::from_fn` closures here were not inlined,
    // and the vectors they returned went through memory.
    let zero = _mm512_setzero_ps();
    let mut acc = [[(zero, zero); RUNS]; Q];
    for (i, acc) in acc.iter_mut().enumerate() {
        for (r, acc) in acc.iter_mut().enumerate() {
            let at = i * PASS_TOKENS + (run + r) * K_GROUP_MULTIPLE;
            *acc = (load16(&scores[at..]), load16(&scores[at + 16..]));
        }
    }
    for c in 0..CHANNELS {
        // SAFETY (all three): channel c's codes of these runs are the caller's promise; its
        // weights ([(c * Q + i) * groups + g]) and offsets ([(d0 + c) * groups + g]) lie in the
        // slices above, every run's group being one of the pass's.
        let (codes, weights, offsets) = unsafe {
            (
                codes.add(c * row_bytes),
                weights.add(c * Q * pg),
                offsets.add(c * pg),
            )
        };
        for r in 0..RUNS {
            let decoder = if SYMMETRIC {
                symmetric
            } else {
                // SAFETY: as above.
                decoder::<B>(unsafe { *offsets.add(group[r]) })
            };
            // SAFETY: as above.
            let (ce, co) = unsafe { run32_at::<B>(codes.add(r * run_bytes), decoder) };
            for (i, acc) in acc.iter_mut().enumerate() {
                // SAFETY: as above.
                let w = _mm512_set1_ps(unsafe { *weights.add(i * pg + group[r]) });
                acc[r].0 = _mm512_fmadd_ps(ce, w, acc[r].0);
                acc[r].1 = _mm512_fmadd_ps(co, w, acc[r].1);
            }
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        for (r, &(even, odd)) in acc.iter().enumerate() {
            let at = i * PASS_TOKENS + (run + r) * K_GROUP_MULTIPLE;
            store16(&mut scores[at..], even);
            store16(&mut scores[at + 16..], odd);
        }
    }
}

/// Step 6 over a 2-, 4- or 8-bit packed V whose rows and groups are whole 32-feature runs (see the
/// AVX2 kernel, which it computes bit for bit), for up to [`MAX_GROUP`] queries, with the
/// weights `p[i][t] * sV[t][h]` of [`value_weights`]: each run of 32 features' accumulators in
/// registers for the whole block, in [`run32`]'s order.
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
    assert!(
        (1..=MAX_GROUP).contains(&q),
        "a query tile has 1 to {MAX_GROUP} rows"
    );
    let v = &head.v;
    assert!(v.row_len >= head.features && (t0 + len) * v.row_len * B as usize / 8 <= v.codes.len());
    let symmetric = matches!(v.offsets, Offsets::Constant(_));
    let offset = match v.offsets {
        Offsets::Constant(o) => o,
        Offsets::Stream { .. } => 0,
    };
    macro_rules! accumulate {
        ($symmetric:literal) => {
            // SAFETY: the rows t0..t0 + len lie in the codes (checked above).
            unsafe {
                match (q, head.features / K_GROUP_MULTIPLE) {
                    (1, 2) => rows_accumulate::<B, 2, $symmetric>(head, t0, len, offset, s, acc),
                    (1, 4) => rows_accumulate::<B, 4, $symmetric>(head, t0, len, offset, s, acc),
                    (1, 8) => rows_accumulate::<B, 8, $symmetric>(head, t0, len, offset, s, acc),
                    (1, _) => group_accumulate::<B, 1, $symmetric>(head, t0, len, offset, s, acc),
                    (2, _) => group_accumulate::<B, 2, $symmetric>(head, t0, len, offset, s, acc),
                    (3, _) => group_accumulate::<B, 3, $symmetric>(head, t0, len, offset, s, acc),
                    (4, _) => group_accumulate::<B, 4, $symmetric>(head, t0, len, offset, s, acc),
                    (5, _) => group_accumulate::<B, 5, $symmetric>(head, t0, len, offset, s, acc),
                    (6, _) => group_accumulate::<B, 6, $symmetric>(head, t0, len, offset, s, acc),
                    (7, _) => group_accumulate::<B, 7, $symmetric>(head, t0, len, offset, s, acc),
                    _ => group_accumulate::<B, 8, $symmetric>(head, t0, len, offset, s, acc),
                }
            }
        };
    }
    if symmetric {
        accumulate!(true)
    } else {
        accumulate!(false)
    }
}

/// Whether this module's [`packed_accumulate`] (and [`value_weights`]) read a V of this width,
/// group size and head dimension: whole 32-feature runs, a number of them that divides sixteen
/// (head dimensions 32, 64, 128, 256 and 512).
pub(crate) fn reads_values(head: &PackedHead) -> bool {
    matches!(head.v.bits, 2 | 4 | 8)
        && head.v.group_size.is_multiple_of(K_GROUP_MULTIPLE)
        && head.features.is_multiple_of(K_GROUP_MULTIPLE)
        && 16usize.is_multiple_of(head.features / K_GROUP_MULTIPLE)
}

/// Step 6's weights of tokens t0..t0 + len into `s.v_weights`, one per query, token and run of
/// 32 features: `p[i][t] * sV[t][h]` at [(i * BLOCK_TOKENS + t - t0) * runs + n], h the group
/// of run n (the products [`super::value_weights`] makes, repeated for each run of a group, so
/// that a kernel finds a run's weight without looking up its group), sixteen at a time (the
/// runs of a row divide sixteen: [`reads_values`]).
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) fn value_weights(
    _: Avx512,
    head: &PackedHead,
    q: usize,
    t0: usize,
    len: usize,
    s: &mut Scratch,
) {
    let v = &head.v;
    let groups = v.groups_per_row;
    let runs = head.features / K_GROUP_MULTIPLE;
    let group_of = |n: usize| n * K_GROUP_MULTIPLE / v.group_size;
    s.v_weights.resize(q * BLOCK_TOKENS * runs, 0.0);
    let scales = &v.scales[t0 * groups..][..len * groups];
    // A vector holds the weights of 16 / runs tokens: lane l is token l / runs, run l % runs,
    // read from 16 / runs probabilities and their tokens' scales.
    let tokens_per_vector = 16 / runs;
    let lanes = |f: &dyn Fn(usize) -> usize| {
        let lanes: [i32; 16] = std::array::from_fn(|l| f(l) as i32);
        // SAFETY: reads the 16 i32s of `lanes`.
        unsafe { _mm512_loadu_si512(lanes.as_ptr().cast()) }
    };
    let token_of_lane = lanes(&|l| l / runs);
    let scale_of_lane = lanes(&|l| l / runs * groups + group_of(l % runs));
    let prefix = |count: usize| {
        if count >= 16 {
            0xFFFF
        } else {
            (1u16 << count) - 1
        }
    };
    for i in 0..q {
        let p = &s.scores[i * BLOCK_TOKENS..][..len];
        let weights = &mut s.v_weights[i * BLOCK_TOKENS * runs..][..len * runs];
        for (n, w) in weights.chunks_mut(16).enumerate() {
            let first = n * tokens_per_vector;
            let tokens = w.len() / runs;
            // SAFETY: the masks read and write only lanes within the slices (`tokens` tokens
            // from `first`, their scales, and `w`).
            unsafe {
                let p = _mm512_maskz_loadu_ps(prefix(tokens), p[first..].as_ptr());
                let sc = _mm512_maskz_loadu_ps(
                    prefix(tokens * groups),
                    scales[first * groups..].as_ptr(),
                );
                let product = _mm512_mul_ps(
                    _mm512_permutexvar_ps(token_of_lane, p),
                    _mm512_permutexvar_ps(scale_of_lane, sc),
                );
                _mm512_mask_storeu_ps(w.as_mut_ptr(), prefix(w.len()), product);
            }
        }
    }
}

/// [`packed_accumulate`] for Q queries: for each run of 32 features, every query's
/// accumulators in registers for the whole block, each token's codes turned into values once
/// for all of them.
///
/// # Safety
///
/// Rows t0..t0 + len of the codes must lie in `head.v.codes`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn group_accumulate<const B: u32, const Q: usize, const SYMMETRIC: bool>(
    head: &PackedHead,
    t0: usize,
    len: usize,
    offset: i32,
    s: &Scratch,
    acc: &mut [f32],
) {
    let v = &head.v;
    let d_count = head.features;
    let groups = v.groups_per_row;
    let runs = d_count / K_GROUP_MULTIPLE;
    let b = B as usize;
    let row_bytes = v.row_len * b / 8;
    let symmetric = decoder::<B>(offset);
    let codes = v.codes.as_ptr().wrapping_add(t0 * row_bytes);
    let weights: [&[f32]; Q] =
        std::array::from_fn(|i| &s.v_weights[i * BLOCK_TOKENS * runs..][..len * runs]);
    for n in 0..runs {
        let f = n * K_GROUP_MULTIPLE;
        let h = f / v.group_size;
        let zero = _mm512_setzero_ps();
        let mut halves = [(zero, zero); Q];
        for (i, halves) in halves.iter_mut().enumerate() {
            *halves = load_run::<B>(&acc[i * d_count + f..][..K_GROUP_MULTIPLE]);
        }
        for j in 0..len {
            let decoder = if SYMMETRIC {
                symmetric
            } else {
                decoder::<B>(s.v_offsets[j * groups + h])
            };
            // SAFETY: row j of the block lies in the codes (the caller's promise).
            let (ce, co) = unsafe { run32_at::<B>(codes.add(j * row_bytes + f * b / 8), decoder) };
            for (i, (even, odd)) in halves.iter_mut().enumerate() {
                let w = _mm512_set1_ps(weights[i][j * runs + n]);
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
///
/// # Safety
///
/// As [`group_accumulate`].
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn rows_accumulate<const B: u32, const RUNS: usize, const SYMMETRIC: bool>(
    head: &PackedHead,
    t0: usize,
    len: usize,
    offset: i32,
    s: &Scratch,
    acc: &mut [f32],
) {
    let v = &head.v;
    let groups = v.groups_per_row;
    let b = B as usize;
    let run_bytes = K_GROUP_MULTIPLE * b / 8;
    let acc = &mut acc[..RUNS * K_GROUP_MULTIPLE];
    let weights = s.v_weights[..len * RUNS].as_ptr();
    let symmetric = decoder::<B>(offset);
    // Loops, not closures (see `step_scores`).
    let zero = _mm512_setzero_ps();
    let mut halves = [(zero, zero); RUNS];
    for (n, halves) in halves.iter_mut().enumerate() {
        *halves = load_run::<B>(&acc[n * K_GROUP_MULTIPLE..][..K_GROUP_MULTIPLE]);
    }
    let row_bytes = v.row_len * b / 8;
    let codes = v.codes.as_ptr().wrapping_add(t0 * row_bytes);
    for j in 0..len {
        let at = codes.wrapping_add(j * row_bytes);
        // The row a block ahead.
        for line in (0..row_bytes).step_by(64) {
            super::prefetch(at.wrapping_add(BLOCK_TOKENS * row_bytes + line));
        }
        for (n, (even, odd)) in halves.iter_mut().enumerate() {
            // SAFETY: token j's weights are in the slice above.
            let w = _mm512_set1_ps(unsafe { *weights.add(j * RUNS + n) });
            let decoder = if SYMMETRIC {
                symmetric
            } else {
                decoder::<B>(s.v_offsets[j * groups + n * K_GROUP_MULTIPLE / v.group_size])
            };
            // SAFETY: row j of the block lies in the codes (the caller's promise).
            let (ce, co) = unsafe { run32_at::<B>(at.add(n * run_bytes), decoder) };
            *even = _mm512_fmadd_ps(ce, w, *even);
            *odd = _mm512_fmadd_ps(co, w, *odd);
        }
    }
    for (n, &halves) in halves.iter().enumerate() {
        store_run::<B>(&mut acc[n * K_GROUP_MULTIPLE..][..K_GROUP_MULTIPLE], halves);
    }
}
