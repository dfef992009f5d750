//! The per-block kernels, one per width and direction (2 and 3 bits pack a few rows at a time
//! instead, [`super::rows`]). Codes are in range (the logical matrix guarantees it), so
//! packing needs no masks. Both directions go through bytes (or, at 3 bits, 12-bit
//! halves and 6-bit pairs) so that few lanes are ever narrowed from 32 bits.

use super::drivers::{Pack, Unpack};

/// 2 bits: 16 rows per word, row 4i + j at bits 8i + 2j.
pub(super) struct Two;
/// 3 bits: 32 rows per three words, row r at bit 3r of the 96-bit little-endian stream.
pub(super) struct Three;
/// 4 bits: 8 rows per word, row 2i + j at bits 8i + 4j.
pub(super) struct Four;
/// 8 bits: 4 rows per word, row i at bits 8i.
pub(super) struct Eight;

impl Unpack<16, 1> for Two {
    #[inline(always)]
    fn unpack<const LANES: usize>(words: &[[u32; LANES]; 1], rows: &mut [[u8; LANES]; 16]) {
        for i in 0..4 {
            let mut bytes = [0u8; LANES];
            for (byte, &word) in bytes.iter_mut().zip(&words[0]) {
                *byte = (word >> (8 * i)) as u8;
            }
            for j in 0..4 {
                for (code, byte) in rows[4 * i + j].iter_mut().zip(bytes) {
                    *code = byte >> (2 * j) & 3;
                }
            }
        }
    }
}

impl Pack<8, 1> for Four {
    #[inline(always)]
    fn pack<const LANES: usize>(rows: &[&[u8; LANES]; 8], words: &mut [[u32; LANES]; 1]) {
        for (c, word) in words[0].iter_mut().enumerate() {
            let byte = |i: usize| rows[2 * i][c] | rows[2 * i + 1][c] << 4;
            *word = u32::from_le_bytes([byte(0), byte(1), byte(2), byte(3)]);
        }
    }
}

impl Unpack<8, 1> for Four {
    #[inline(always)]
    fn unpack<const LANES: usize>(words: &[[u32; LANES]; 1], rows: &mut [[u8; LANES]; 8]) {
        for i in 0..4 {
            let mut bytes = [0u8; LANES];
            for (byte, &word) in bytes.iter_mut().zip(&words[0]) {
                *byte = (word >> (8 * i)) as u8;
            }
            for (code, byte) in rows[2 * i].iter_mut().zip(bytes) {
                *code = byte & 15;
            }
            for (code, byte) in rows[2 * i + 1].iter_mut().zip(bytes) {
                *code = byte >> 4;
            }
        }
    }
}

/// 8-bit packing on x86-64 with SSE2 (part of the baseline, so no run-time check): a byte
/// interleave of the four rows, 16 columns at a time. (Unpacking the same way measured no
/// faster than the compiler's loop.)
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
mod sse2 {
    use std::arch::x86_64::*;

    /// Word c = rows[0][c] | rows[1][c] << 8 | rows[2][c] << 16 | rows[3][c] << 24.
    #[inline]
    #[target_feature(enable = "sse2")]
    pub(super) fn pack_eight<const LANES: usize>(
        rows: &[&[u8; LANES]; 4],
        words: &mut [u32; LANES],
    ) {
        for (c, out) in words.chunks_exact_mut(16).enumerate() {
            let out: &mut [u32; 16] = out.try_into().expect("16 words");
            let r: [__m128i; 4] = std::array::from_fn(|j| {
                let row: &[u8; 16] = rows[j][16 * c..16 * c + 16].try_into().expect("16");
                // SAFETY: `row` is 16 readable bytes; loadu needs no alignment.
                unsafe { _mm_loadu_si128(row.as_ptr().cast()) }
            });
            let (lo01, hi01) = (_mm_unpacklo_epi8(r[0], r[1]), _mm_unpackhi_epi8(r[0], r[1]));
            let (lo23, hi23) = (_mm_unpacklo_epi8(r[2], r[3]), _mm_unpackhi_epi8(r[2], r[3]));
            let w = [
                _mm_unpacklo_epi16(lo01, lo23),
                _mm_unpackhi_epi16(lo01, lo23),
                _mm_unpacklo_epi16(hi01, hi23),
                _mm_unpackhi_epi16(hi01, hi23),
            ];
            for (q, w) in w.into_iter().enumerate() {
                // SAFETY: `out[4q..4q + 4]` is 16 writable bytes; storeu needs no alignment.
                unsafe { _mm_storeu_si128(out[4 * q..].as_mut_ptr().cast(), w) };
            }
        }
    }
}

impl Pack<4, 1> for Eight {
    #[inline(always)]
    fn pack<const LANES: usize>(rows: &[&[u8; LANES]; 4], words: &mut [[u32; LANES]; 1]) {
        #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
        if LANES.is_multiple_of(16) {
            // SAFETY: SSE2 is enabled for the whole build (x86-64's baseline).
            unsafe { sse2::pack_eight(rows, &mut words[0]) };
            return;
        }
        for (c, word) in words[0].iter_mut().enumerate() {
            *word = u32::from_le_bytes([rows[0][c], rows[1][c], rows[2][c], rows[3][c]]);
        }
    }
}

impl Unpack<4, 1> for Eight {
    #[inline(always)]
    fn unpack<const LANES: usize>(words: &[[u32; LANES]; 1], rows: &mut [[u8; LANES]; 4]) {
        for (i, row) in rows.iter_mut().enumerate() {
            for (code, &word) in row.iter_mut().zip(&words[0]) {
                *code = (word >> (8 * i)) as u8;
            }
        }
    }
}

/// Each eight rows make a 24-bit piece; the pieces sit at bits 0, 24, 48 and 72 of the
/// three words, so rows 10 and 21 straddle the word boundaries.
impl Unpack<32, 3> for Three {
    #[inline(always)]
    fn unpack<const LANES: usize>(words: &[[u32; LANES]; 3], rows: &mut [[u8; LANES]; 32]) {
        let [w0, w1, w2] = words;
        let mut pieces = [[0u32; LANES]; 4];
        for c in 0..LANES {
            pieces[0][c] = w0[c] & 0xFF_FFFF;
            pieces[1][c] = (w0[c] >> 24 | w1[c] << 8) & 0xFF_FFFF;
            pieces[2][c] = (w1[c] >> 16 | w2[c] << 16) & 0xFF_FFFF;
            pieces[3][c] = w2[c] >> 8;
        }
        for (p, piece) in pieces.iter().enumerate() {
            for h in 0..2 {
                // Twelve bits: rows 8p + 4h .. 8p + 4h + 4.
                let mut half = [0u16; LANES];
                for (half, &piece) in half.iter_mut().zip(piece) {
                    *half = (piece >> (12 * h)) as u16 & 0xFFF;
                }
                for q in 0..2 {
                    let mut pair = [0u8; LANES];
                    for (pair, &half) in pair.iter_mut().zip(&half) {
                        *pair = (half >> (6 * q)) as u8 & 63;
                    }
                    let row = 8 * p + 4 * h + 2 * q;
                    for (code, two) in rows[row].iter_mut().zip(pair) {
                        *code = two & 7;
                    }
                    for (code, two) in rows[row + 1].iter_mut().zip(pair) {
                        *code = two >> 3;
                    }
                }
            }
        }
    }
}
