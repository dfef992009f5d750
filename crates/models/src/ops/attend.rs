//! One query's softmax attention over a list of key and value rows, the inner loop of both
//! forward passes' attention, in one fixed order of operations:
//!
//! 1. score_j = [`super::dot`]`(q, key_j) * scale`, for j in order;
//! 2. m = the largest score (`f32::max`, so a NaN score is passed over);
//! 3. e_j = `libm::expf(score_j - m)`; sum = e_0 + e_1 + ... in order; p_j = e_j / sum;
//! 4. out\[c\] = 0 + p_0 * value_0\[c\] + p_1 * value_1\[c\] + ..., in order, each product and
//!    each sum rounded on its own (no FMA).
//!
//! [`attend_row_reference`] is that, one value at a time. [`attend_row`] gives the same bits
//! faster: four keys' dot products at once (each keeps its own eight lane sums, tree and tail),
//! the maximum over eight lanes (the maximum of a set does not depend on the order it is
//! taken in; a score of -0 or +0 as the maximum changes no `score_j - m` that `expf` sees
//! differently, since `expf(+0) = expf(-0) = 1` and `x - 0 = x - (-0)` for every other x),
//! [`expf8`] (`libm::expf`'s own operations, lane by lane), and the weighted sum with a
//! block of 64 output columns held in registers over every row. [`attend_rows`] does this for
//! several queries over the same rows: each quad of keys is scored against up to three queries
//! while it is loaded (twelve independent sums), and the value rows are taken in blocks of 16 KiB
//! by every query in turn, a query's running sums carried from block to block in its output.
//! The rows' softmax sums, each a chain of dependent additions, are taken four rows at a time so
//! that the chains overlap. Only the order of work that is independent changes, never an
//! operation. On x86_64 it runs AVX-512F kernels where the CPU has them (two queries' eight lanes
//! to a 512-bit register in the scores, sixteen columns to one in the weighted sums; a probe on
//! the development machine, with other work beside it, gave about 1.45x over AVX2 at
//! Gemma 3's head size of 256, a few per cent at SmolLM2's 64, where a row of 64 sums takes four
//! registers), else AVX2 ones (run-time checks), else plain Rust. The tests hold every path this
//! CPU has to the reference bit for bit.

#[cfg(target_arch = "x86_64")]
mod x86;

/// Lanes of the dot product ([`super::dot`]'s eight running sums).
const LANES: usize = 8;
/// Output columns of the weighted sum held at once (eight registers of eight).
const COLUMNS: usize = 64;
/// Bytes of value rows the weighted sums of several queries take in turn (they stay in the
/// first-level cache while every query adds them).
const VALUE_BLOCK_BYTES: usize = 16 * 1024;

/// One query's attention over `keys` and `values` (one row each per position, `q.len()` values
/// each) into `out` (`q.len()` values), exactly as [`attend_row_reference`]; `scores` is
/// scratch space, resized as needed. The rows must all have `q.len()` values.
pub fn attend_row(
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_rows(&[q], keys, values, scale, scores, out);
}

/// [`attend_row`] for several queries over the same rows (the query heads that share a KV
/// head, at one position): query g's output is `out[g * d..(g + 1) * d]`, bit for bit what
/// [`attend_row`] gives it alone. The keys and values are read once for all of them: each key
/// is scored against every query while it is loaded, and the weighted sums take the value rows
/// in blocks that stay in cache. `scores` is scratch space, resized as needed.
pub fn attend_rows(
    queries: &[&[f32]],
    keys: &[&[f32]],
    values: &[&[f32]],
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    check(queries, keys, values, out);
    scores.clear();
    scores.resize(queries.len() * keys.len(), 0.0);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx2")
    {
        // SAFETY: this CPU has AVX-512F and AVX2 (checked just above).
        unsafe { attend_rows_avx512(queries, keys, values, scale, scores, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: this CPU has AVX2 (checked just above).
        unsafe { attend_rows_avx2(queries, keys, values, scale, scores, out) };
        return;
    }
    attend_rows_body(queries, keys, values, scale, scores, out);
}

/// The module's steps one value at a time: the definition [`attend_row`] is held to.
pub fn attend_row_reference(
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    scale: f32,
    out: &mut [f32],
) {
    check(&[q], keys, values, out);
    let mut scores: Vec<f32> = keys.iter().map(|k| super::dot(q, k) * scale).collect();
    super::softmax_in_place(&mut scores);
    out.fill(0.0);
    for (&p, v) in scores.iter().zip(values) {
        for (o, &x) in out.iter_mut().zip(v.iter()) {
            *o += p * x;
        }
    }
}

fn check(queries: &[&[f32]], keys: &[&[f32]], values: &[&[f32]], out: &[f32]) {
    let d = queries.first().map_or(0, |q| q.len());
    assert!(
        queries.iter().all(|q| q.len() == d),
        "queries of one length"
    );
    assert_eq!(keys.len(), values.len(), "as many keys as values");
    assert_eq!(out.len(), queries.len() * d, "one output per query value");
    assert!(
        keys.iter().chain(values).all(|r| r.len() == d),
        "every key and value row has the query's length"
    );
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn attend_rows_avx2(
    queries: &[&[f32]],
    keys: &[&[f32]],
    values: &[&[f32]],
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let kernels = (
        |q: &[&[f32]], k: &[&[f32]], scale, s: &mut [f32]| x86::scores(q, k, scale, s),
        columns::<COLUMNS>,
    );
    // SAFETY: this function runs only where the CPU has AVX2.
    unsafe { attend_rows_x86(queries, (keys, values), scale, scores, out, kernels) };
}

/// [`attend_rows_avx2`] with two queries to a 512-bit register in the scores and sixteen columns
/// to one in the weighted sums.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn attend_rows_avx512(
    queries: &[&[f32]],
    keys: &[&[f32]],
    values: &[&[f32]],
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let kernels = (
        |q: &[&[f32]], k: &[&[f32]], scale, s: &mut [f32]| x86::scores_avx512(q, k, scale, s),
        |p: &[f32], v: &[&[f32]], start, out: &mut [f32]| x86::columns_avx512(p, v, start, out),
    );
    // SAFETY: this function runs only where the CPU has AVX2.
    unsafe { attend_rows_x86(queries, (keys, values), scale, scores, out, kernels) };
}

/// The x86 paths' steps around their scores and column kernels (inlined into each path, so
/// compiled with its target features; each runs only where the CPU has AVX2).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn attend_rows_x86(
    queries: &[&[f32]],
    (keys, values): (&[&[f32]], &[&[f32]]),
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
    (scores_of, columns_of): (
        impl Fn(&[&[f32]], &[&[f32]], f32, &mut [f32]),
        impl Fn(&[f32], &[&[f32]], usize, &mut [f32]) + Copy,
    ),
) {
    if keys.is_empty() {
        out.fill(0.0);
        return;
    }
    scores_of(queries, keys, scale, scores);
    // SAFETY: the caller runs on a CPU with AVX2.
    softmax_rows(scores, keys.len(), |chunks, max| unsafe {
        x86::exp_chunks(chunks, max)
    });
    weighted_sums(scores, values, out, columns_of);
}

#[inline(always)]
fn attend_rows_body(
    queries: &[&[f32]],
    keys: &[&[f32]],
    values: &[&[f32]],
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    if keys.is_empty() {
        out.fill(0.0);
        return;
    }
    scores_into(queries, keys, scale, scores);
    softmax_rows(scores, keys.len(), |chunks, max| {
        for c in chunks.chunks_exact_mut(LANES) {
            let mut x = [0f32; LANES];
            for j in 0..LANES {
                x[j] = c[j] - max;
            }
            c.copy_from_slice(&expf8(x));
        }
    });
    weighted_sums(scores, values, out, columns::<COLUMNS>);
}

/// score\[g * n + j\] = dot(query_g, key_j) * scale, four keys at a time, each quad of keys
/// against every query while it is in cache.
#[inline(always)]
fn scores_into(queries: &[&[f32]], keys: &[&[f32]], scale: f32, scores: &mut [f32]) {
    let n = keys.len();
    let body = n / 4 * 4;
    for (quad, k) in keys[..body].chunks_exact(4).enumerate() {
        for (g, q) in queries.iter().enumerate() {
            let dots = dot4(q, [k[0], k[1], k[2], k[3]]);
            for (s, d) in scores[g * n + quad * 4..][..4].iter_mut().zip(dots) {
                *s = d * scale;
            }
        }
    }
    for (j, k) in keys.iter().enumerate().skip(body) {
        for (g, q) in queries.iter().enumerate() {
            scores[g * n + j] = dot4(q, [k, k, k, k])[0] * scale;
        }
    }
}

/// [`super::dot`] of `q` with four rows, each with its own lane sums, tree and tail.
#[inline(always)]
fn dot4(q: &[f32], rows: [&[f32]; 4]) -> [f32; 4] {
    let body = q.len() / LANES * LANES;
    let mut lanes = [[0f32; LANES]; 4];
    for (c, x) in q[..body].chunks_exact(LANES).enumerate() {
        let at = c * LANES;
        for (lane, row) in lanes.iter_mut().zip(rows) {
            let y = &row[at..at + LANES];
            for j in 0..LANES {
                lane[j] += x[j] * y[j];
            }
        }
    }
    let mut out = [0f32; 4];
    for ((o, l), row) in out.iter_mut().zip(&lanes).zip(rows) {
        let mut sum = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
        for (x, y) in q[body..].iter().zip(&row[body..]) {
            sum += x * y;
        }
        *o = sum;
    }
    out
}

/// [`super::softmax_in_place`]'s values for each row of `n` scores: the maximum over eight
/// lanes, `exp_chunks(whole chunks of eight, max)` ([`expf8`]'s values of `score - max`),
/// `libm::expf` for the rest, the sum in order, the divisions. The rows' sums, each one chain of
/// dependent additions, are taken four rows at a time, so that their chains overlap.
#[inline(always)]
fn softmax_rows(scores: &mut [f32], n: usize, exp_chunks: impl Fn(&mut [f32], f32)) {
    for row in scores.chunks_exact_mut(n) {
        let mut lanes = [f32::NEG_INFINITY; LANES];
        let mut chunks = row.chunks_exact(LANES);
        for c in &mut chunks {
            for j in 0..LANES {
                lanes[j] = lanes[j].max(c[j]);
            }
        }
        let max = chunks
            .remainder()
            .iter()
            .chain(&lanes)
            .fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let body = n / LANES * LANES;
        exp_chunks(&mut row[..body], max);
        for v in &mut row[body..] {
            *v = libm::expf(*v - max);
        }
    }
    for rows in scores.chunks_mut(4 * n) {
        let mut sums = [0f32; 4];
        let used = rows.len() / n;
        for j in 0..n {
            for (g, sum) in sums.iter_mut().enumerate().take(used) {
                *sum += rows[g * n + j];
            }
        }
        for (row, sum) in rows.chunks_exact_mut(n).zip(sums) {
            for v in row.iter_mut() {
                *v /= sum;
            }
        }
    }
}

/// Each query's weighted sum (its `n` probabilities in `p`, one row of `out` of `d` values):
/// out\[c\] = 0 + p_0 * value_0\[c\] + ... in order. The value rows are taken in blocks of
/// [`VALUE_BLOCK_BYTES`], each block by every query in turn; a query's sums carry over from one
/// block to the next through `out`, so each is still one running sum in position order.
#[inline(always)]
fn weighted_sums(
    p: &[f32],
    values: &[&[f32]],
    out: &mut [f32],
    block: impl Fn(&[f32], &[&[f32]], usize, &mut [f32]) + Copy,
) {
    let n = values.len();
    let queries = p.len() / n;
    if queries == 0 {
        return;
    }
    let d = out.len() / queries;
    out.fill(0.0);
    let rows = (VALUE_BLOCK_BYTES / (4 * d.max(1))).max(1);
    let mut first = 0;
    while first < n {
        let last = (first + rows).min(n);
        for (p, out) in p.chunks_exact(n).zip(out.chunks_exact_mut(d)) {
            weighted_sum_onto(&p[first..last], &values[first..last], out, block);
        }
        first = last;
    }
}

/// out\[c\] += p_0 * value_0\[c\] + ..., one sum per column in order, [`COLUMNS`] columns at a
/// time.
#[inline(always)]
fn weighted_sum_onto(
    p: &[f32],
    values: &[&[f32]],
    out: &mut [f32],
    block: impl Fn(&[f32], &[&[f32]], usize, &mut [f32]),
) {
    let d = out.len();
    let mut start = 0;
    while start + COLUMNS <= d {
        block(p, values, start, &mut out[start..start + COLUMNS]);
        start += COLUMNS;
    }
    while start + LANES <= d {
        columns::<LANES>(p, values, start, &mut out[start..start + LANES]);
        start += LANES;
    }
    for (c, o) in (start..d).zip(&mut out[start..]) {
        let mut acc = *o;
        for (&pj, v) in p.iter().zip(values) {
            acc += pj * v[c];
        }
        *o = acc;
    }
}

/// out\[start + c\] += p_0 * value_0\[start + c\] + ... for c in 0..N, in order.
#[inline(always)]
fn columns<const N: usize>(p: &[f32], values: &[&[f32]], start: usize, out: &mut [f32]) {
    let mut acc = [0f32; N];
    acc.copy_from_slice(out);
    for (&pj, v) in p.iter().zip(values) {
        let v = &v[start..start + N];
        for c in 0..N {
            acc[c] += pj * v[c];
        }
    }
    out.copy_from_slice(&acc);
}

// libm 0.2's `expf` (FreeBSD's e_expf.c), whose constants and steps `expf8` repeats.
const HALF: [f32; 2] = [0.5, -0.5];
// (The same values as libm's decimal literals, written by their bits.)
const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
const INV_LN2: f32 = f32::from_bits(0x3fb8_aa3b);
const P1: f32 = f32::from_bits(0x3e2a_aa8f);
const P2: f32 = f32::from_bits(0xbb35_5215);

/// `libm::expf` of eight values, bit for bit. Where every |x| lies in (2^-14, 87.33655) (the
/// `|x|` bits strictly between 0x39000000 and 0x42aeac50), this is libm's main path written
/// without branches: k = trunc(x / ln 2 +- 1/2) beyond 1.5 ln 2, +-1 beyond 0.5 ln 2, else 0;
/// the reduction r = (x - k ln2_hi) - k ln2_lo (exact for k = 0), the rational approximation
/// y = 1 + (r c / (2 - c) - lo + hi), and y * 2^k, which is libm's `scalbnf` for the k this
/// range gives (-126 to 126: one multiply). Any other lane sends all eight to `libm::expf`.
#[inline(always)]
pub fn expf8(x: [f32; 8]) -> [f32; 8] {
    let main = x.iter().all(|v| {
        let h = v.to_bits() & 0x7fff_ffff;
        h > 0x3900_0000 && h < 0x42ae_ac50
    });
    if !main {
        return x.map(libm::expf);
    }
    let mut out = [0f32; 8];
    for (o, &v) in out.iter_mut().zip(&x) {
        let bits = v.to_bits();
        let h = bits & 0x7fff_ffff;
        let sign = (bits >> 31) as i32;
        let half = if sign == 0 { HALF[0] } else { HALF[1] };
        let k = if h > 0x3f85_1592 {
            (INV_LN2 * v + half) as i32
        } else if h > 0x3eb1_7218 {
            1 - sign - sign
        } else {
            0
        };
        let kf = k as f32;
        let hi = v - kf * LN2_HI;
        let lo = kf * LN2_LO;
        let r = hi - lo;
        let rr = r * r;
        let c = r - rr * (P1 + rr * P2);
        let y = 1. + (r * c / (2. - c) - lo + hi);
        *o = y * f32::from_bits(((0x7f + k) as u32) << 23);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tests::Lcg;

    /// Every 61st f32 bit pattern (all signs, both ranges and the special values), eight at a
    /// time, against `libm::expf`.
    #[test]
    fn expf8_is_libms_expf_bit_for_bit() {
        check_expf_bits(61);
    }

    /// Every f32 (about a minute in release): `cargo test --release -p models expf8_every -- --ignored`.
    #[test]
    #[ignore]
    fn expf8_every_f32_is_libms_expf() {
        check_expf_bits(1);
    }

    fn check_expf_bits(step: usize) {
        let mut batch = [0f32; 8];
        let mut bits = (0..=u32::MAX).step_by(step).peekable();
        while bits.peek().is_some() {
            for b in batch.iter_mut() {
                *b = f32::from_bits(bits.next().unwrap_or(0));
            }
            // A batch of one range only, so the main path is taken where it applies.
            for x in batch {
                let got = expf8([x; 8])[0];
                let want = libm::expf(x);
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "expf({x:e} = {:#010x}): {got:e} against libm's {want:e}",
                    x.to_bits()
                );
            }
            let mixed = expf8(batch);
            for (x, got) in batch.iter().zip(mixed) {
                let want = libm::expf(*x);
                assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()));
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                for lanes in [[batch[0]; 8], batch] {
                    let mut got = lanes;
                    // SAFETY: this CPU has AVX2 (checked).
                    unsafe { x86::exp_chunks(&mut got, 0.0) };
                    for (x, got) in lanes.iter().zip(got) {
                        let want = libm::expf(*x - 0.0);
                        assert!(
                            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                            "AVX2 expf({x:e}): {got:e} against libm's {want:e}"
                        );
                    }
                }
            }
        }
    }

    /// Rows of `d` values from `fill(position, column)`.
    fn rows(n: usize, d: usize, mut fill: impl FnMut(usize, usize) -> f32) -> Vec<Vec<f32>> {
        (0..n)
            .map(|i| (0..d).map(|c| fill(i, c)).collect())
            .collect()
    }

    fn same_bits(q: &[f32], k: &[Vec<f32>], v: &[Vec<f32>], scale: f32, what: &str) {
        same_bits_rows(&[q.to_vec()], k, v, scale, what);
    }

    #[test]
    fn attend_row_is_the_reference_bit_for_bit() {
        let mut rng = Lcg(20261205);
        // Head dimensions of both models (64, 256) and odd ones; odd numbers of positions.
        for d in [1, 7, 8, 13, 64, 72, 130, 256] {
            for n in [1, 2, 3, 5, 8, 9, 31, 64, 129] {
                let scale = 1.0 / (d as f32).sqrt();
                let q: Vec<f32> = (0..d).map(|_| rng.unit() * 3.0).collect();
                let k = rows(n, d, |_, _| rng.unit() * 3.0);
                let v = rows(n, d, |_, _| rng.unit() * 3.0);
                same_bits(&q, &k, &v, scale, &format!("random d={d} n={n}"));
                // Patterned, tie-heavy (equal keys: equal scores), all at the largest finite
                // value, and spread so that most weights underflow or sit near expf's edges.
                let pattern = rows(n, d, |i, c| ((i * 7 + c * 3) % 11) as f32 - 5.0);
                same_bits(&q, &pattern, &pattern, scale, "patterned");
                let ties = rows(n, d, |_, c| (c % 3) as f32);
                same_bits(&q, &ties, &v, scale, "ties");
                let big = rows(n, d, |_, _| f32::MAX);
                same_bits(&vec![1e-30; d], &big, &big, scale, "largest");
                let spread = rows(n, d, |i, _| i as f32 * 9.0 - 300.0);
                same_bits(&vec![1.0; d], &spread, &v, 1.0, "spread");
                let zero = rows(n, d, |_, _| 0.0);
                same_bits(&q, &zero, &zero, scale, "zeros");
            }
        }
    }

    /// Several queries over the same rows (a KV head's query heads; SmolLM2 has three, Gemma 3
    /// four): each output is what [`attend_row`] gives that query alone, bit for bit, on the
    /// fast path and the portable one. Lengths cross the value blocks (64 rows of 64 values).
    #[test]
    fn attend_rows_is_each_row_alone() {
        let mut rng = Lcg(20261206);
        for d in [1, 7, 64, 72, 256] {
            for n in [1, 3, 4, 5, 63, 64, 65, 129, 300] {
                for queries in 1..=5 {
                    let scale = 1.0 / (d as f32).sqrt();
                    let random = rows(n, d, |_, _| rng.unit() * 3.0);
                    let values = rows(n, d, |_, _| rng.unit() * 3.0);
                    let ties = rows(n, d, |_, c| (c % 3) as f32);
                    let big = rows(n, d, |_, _| f32::MAX);
                    let qs = rows(queries, d, |_, _| rng.unit() * 3.0);
                    let tiny = rows(queries, d, |g, _| 1e-30 * (g + 1) as f32);
                    let cases = [
                        ("random", &qs, &random, &values),
                        ("ties", &qs, &ties, &values),
                        ("largest", &tiny, &big, &big),
                    ];
                    for (what, qs, k, v) in cases {
                        let what = format!("{what} d={d} n={n} queries={queries}");
                        same_bits_rows(qs, k, v, scale, &what);
                    }
                }
            }
        }
    }

    /// Each path this CPU has (the portable body always; AVX2 and AVX-512 where present) on
    /// the same input: (name, outputs).
    fn every_path(
        queries: &[&[f32]],
        keys: &[&[f32]],
        values: &[&[f32]],
        scale: f32,
    ) -> Vec<(&'static str, Vec<f32>)> {
        let d = keys[0].len();
        let run = |path: &dyn Fn(&mut [f32], &mut [f32])| {
            let mut out = vec![f32::NAN; queries.len() * d];
            let mut s = vec![0f32; queries.len() * keys.len()];
            path(&mut s, &mut out);
            out
        };
        let mut paths = vec![(
            "portable",
            run(&|s, out| attend_rows_body(queries, keys, values, scale, s, out)),
        )];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: this CPU has AVX2 (checked).
            let avx2 =
                run(&|s, out| unsafe { attend_rows_avx2(queries, keys, values, scale, s, out) });
            paths.push(("AVX2", avx2));
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: this CPU has AVX-512F and AVX2 (checked).
                let avx512 = run(&|s, out| unsafe {
                    attend_rows_avx512(queries, keys, values, scale, s, out)
                });
                paths.push(("AVX-512", avx512));
            }
        }
        let mut scratch = Vec::new();
        let mut dispatched = vec![f32::NAN; queries.len() * d];
        attend_rows(queries, keys, values, scale, &mut scratch, &mut dispatched);
        paths.push(("attend_rows", dispatched));
        paths
    }

    fn same_bits_rows(qs: &[Vec<f32>], k: &[Vec<f32>], v: &[Vec<f32>], scale: f32, what: &str) {
        let d = k[0].len();
        let queries: Vec<&[f32]> = qs.iter().map(Vec::as_slice).collect();
        let keys: Vec<&[f32]> = k.iter().map(Vec::as_slice).collect();
        let values: Vec<&[f32]> = v.iter().map(Vec::as_slice).collect();
        let paths = every_path(&queries, &keys, &values, scale);
        for (g, q) in queries.iter().enumerate() {
            let mut alone = vec![f32::NAN; d];
            attend_row_reference(q, &keys, &values, scale, &mut alone);
            for (c, w) in alone.iter().enumerate() {
                for (path, out) in &paths {
                    let x = out[g * d + c];
                    assert!(
                        x.to_bits() == w.to_bits() || (x.is_nan() && w.is_nan()),
                        "{what}: {path} path, query {g} column {c}: {x:e} against {w:e}"
                    );
                }
            }
        }
    }

    #[test]
    fn nothing_to_read_gives_zeros() {
        let mut out = [1f32; 4];
        attend_row(&[1.0; 4], &[], &[], 0.5, &mut Vec::new(), &mut out);
        assert_eq!(out, [0.0; 4]);
    }
}
