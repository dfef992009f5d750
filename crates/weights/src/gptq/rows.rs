//! Packing units of many code rows (16 at 2 bits, 32 at 3 bits) a few code rows at a time over a
//! chunk of columns, the chunk's words held in L1.
//!
//! A unit's code rows lie a whole matrix row apart (16 KiB in the benchmark's layer), so a
//! block of columns read from every row at once ([`super::drivers`]) keeps 16 or 32 streams
//! open whose lines fall into the same few L1 sets. Here the words of [`CHUNK`] columns (8 or
//! 24 KiB) stay in L1 while the code rows' runs of the chunk are read in order, four rows at a
//! time where the four fill one word (one load and store of the words for four rows), and the
//! next four rows' runs are prefetched into L1 meanwhile. Row r's codes sit at bit b*r of its
//! column's little-endian stream of W words; a row that straddles two words (rows 10 and 21 at
//! 3 bits) is split between them. Codes are in range (the logical matrix guarantees it), so
//! or-ing each row into place gives the words the column kernels gave.
//!
//! Measured on the benchmark's 2^27 codes (`bench --only weights`, the commit before and this
//! one run in alternation, three runs each, on the AMD machine): 3-bit pack 0.36-0.38x memcpy
//! through the column blocks and 0.52-0.57x here, 2-bit pack 0.50-0.51x and 0.68-0.80x. One row
//! at a time (four loads and stores of the words) gave 0.48-0.52x and 0.57-0.64x; chunks of 512,
//! 1,024 and 4,096 columns, or no prefetches, were slower still. Unpacking the same way was no
//! faster than the column kernels (3 bits) or slower (2 bits), so unpacking stays with them.

/// Columns per chunk.
const CHUNK: usize = 2048;

/// Packs all columns of R equally long code rows into W word rows of the same length.
pub(super) fn pack<const R: usize, const W: usize>(
    rows: &[&[u8]; R],
    outs: &mut [&mut [i32]; W],
    stream: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, as just checked.
        return unsafe { pack_avx2::<R, W>(rows, outs, stream) };
    }
    pack_rows::<R, W>(rows, outs, stream)
}

/// Row r's word, the bit it starts at in that word, and whether it runs into the next word.
#[inline(always)]
fn place(bits: usize, r: usize) -> (usize, usize, bool) {
    let (word, shift) = (bits * r / 32, bits * r % 32);
    (word, shift, shift + bits > 32)
}

/// Asks for the lines of `run` into L1 ahead of their use (the code rows lie a matrix row apart,
/// and the hardware's prefetchers did not keep up with 16 or 32 such runs).
#[inline(always)]
fn prefetch(run: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in run.chunks(64) {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: a prefetch only hints; it never faults, and the address is inside `run`.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = run;
}

/// Row `r`'s run of the chunk at `start`, or for `r` of R and more row `r - R`'s run of the
/// next chunk (empty past the end).
fn run<const R: usize>(rows: [&[u8]; R], r: usize, start: usize) -> &[u8] {
    let len = rows[0].len();
    let (r, start) = if r < R {
        (r, start)
    } else {
        (r - R, start + CHUNK)
    };
    match rows.get(r) {
        Some(row) if start < len => &row[start..(start + CHUNK).min(len)],
        _ => &[],
    }
}

#[inline(always)]
fn pack_rows<const R: usize, const W: usize>(
    rows: &[&[u8]; R],
    outs: &mut [&mut [i32]; W],
    stream: bool,
) {
    let len = outs[0].len();
    debug_assert!(rows.iter().all(|r| r.len() == len));
    debug_assert!(outs.iter().all(|o| o.len() == len));
    let bits = 32 * W / R;
    let mut words = [[0u32; CHUNK]; W];
    for start in (0..len).step_by(CHUNK) {
        let n = CHUNK.min(len - start);
        for word in &mut words {
            word.fill(0);
        }
        for r in (0..R).step_by(4) {
            let quad: [usize; 4] = std::array::from_fn(|i| r + i);
            for &r in &quad {
                prefetch(run(*rows, r + 4, start));
            }
            let places = quad.map(|r| place(bits, r));
            if places
                .iter()
                .all(|&(w, _, straddles)| w == places[0].0 && !straddles)
            {
                // Four rows into one word at once: one load and store of the words, not four.
                let [a, b, c, d] = quad.map(|r| &rows[r][start..start + n]);
                let [sa, sb, sc, sd] = places.map(|(_, shift, _)| shift);
                let codes = a.iter().zip(b).zip(c).zip(d);
                for (word, (((&a, &b), &c), &d)) in words[places[0].0][..n].iter_mut().zip(codes) {
                    *word |= u32::from(a) << sa
                        | u32::from(b) << sb
                        | u32::from(c) << sc
                        | u32::from(d) << sd;
                }
                continue;
            }
            for (r, (w, shift, straddles)) in quad.into_iter().zip(places) {
                let row = &rows[r][start..start + n];
                for (word, &code) in words[w][..n].iter_mut().zip(row) {
                    *word |= u32::from(code) << shift;
                }
                if straddles {
                    for (word, &code) in words[w + 1][..n].iter_mut().zip(row) {
                        *word |= u32::from(code) >> (32 - shift);
                    }
                }
            }
        }
        for (out, words) in outs.iter_mut().zip(&words) {
            let out = &mut out[start..start + n];
            if stream && n == CHUNK {
                super::drivers::put(out, &words.map(|w| w as i32), true);
            } else {
                for (o, &w) in out.iter_mut().zip(&words[..n]) {
                    *o = w as i32;
                }
            }
        }
    }
}

/// [`pack_rows`] compiled for AVX2: the same integer operations, so the same words.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn pack_avx2<const R: usize, const W: usize>(
    rows: &[&[u8]; R],
    outs: &mut [&mut [i32]; W],
    stream: bool,
) {
    pack_rows::<R, W>(rows, outs, stream)
}
