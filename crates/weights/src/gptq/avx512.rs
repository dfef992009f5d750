//! GPTQ's 3-bit unpacking with AVX-512 (F, BW and VBMI), 64 columns at a time.
//!
//! A unit of 3 word rows holds 32 code rows: code row r of a column sits at bits 3r of its
//! 96-bit run (word 3r / 32, from bit 3r % 32; rows 10 and 21 straddle two words). For 64
//! columns the unit's 12 vectors of words are loaded once; each code row is then 4 shifts
//! (and, for the two straddling rows, 4 more shifts and ors), two VBMI byte permutations that
//! gather the low byte of each of the 64 words, one insert, one mask to 3 bits and one 64-byte
//! store: a whole line of the output row per store, where the portable kernel's narrowing
//! steps (24-bit pieces, 12-bit halves, 6-bit pairs) go through arrays on the stack.

use core::arch::x86_64::*;

/// Columns per step: four vectors of 16 words.
pub(super) const COLUMNS: usize = 64;

/// Whether this CPU has what [`unpack_three`] needs.
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vbmi")
}

/// Unpacks the whole blocks of [`COLUMNS`] columns of one unit (`words`: its 3 word rows, each
/// as long as every row of `outs`) into its 32 code rows, and returns how many columns it did;
/// the caller unpacks the rest.
///
/// # Safety
/// [`available`]: the CPU has AVX-512 F, BW and VBMI.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
pub(super) unsafe fn unpack_three(words: &[&[i32]; 3], outs: &mut [&mut [u8]; 32]) -> usize {
    let len = outs[0].len();
    debug_assert!(words.iter().all(|w| w.len() == len));
    debug_assert!(outs.iter().all(|o| o.len() == len));
    let full = len - len % COLUMNS;
    // Output byte i < 32: byte 0 of word i of the first operand (i < 16) or of the second.
    let low_bytes: [u8; 64] = std::array::from_fn(|i| if i < 32 { (4 * i) as u8 } else { 0 });
    // SAFETY: reads the 64 bytes of `low_bytes`.
    let gather = unsafe { _mm512_loadu_si512(low_bytes.as_ptr().cast()) };
    let three = _mm512_set1_epi8(7);
    for start in (0..full).step_by(COLUMNS) {
        let w: [[__m512i; 4]; 3] = std::array::from_fn(|j| {
            let row: &[i32; COLUMNS] = words[j][start..start + COLUMNS]
                .try_into()
                .expect("64 words");
            // SAFETY: each load reads 16 of the 64 words of `row`.
            std::array::from_fn(|k| unsafe { _mm512_loadu_si512(row[16 * k..].as_ptr().cast()) })
        });
        for (r, out) in outs.iter_mut().enumerate() {
            let (word, shift) = (3 * r / 32, (3 * r % 32) as u32);
            let count = _mm_cvtsi32_si128(shift as i32);
            let v: [__m512i; 4] = std::array::from_fn(|k| {
                let low = _mm512_srl_epi32(w[word][k], count);
                if shift > 29 {
                    let up = _mm_cvtsi32_si128(32 - shift as i32);
                    _mm512_or_si512(low, _mm512_sll_epi32(w[word + 1][k], up))
                } else {
                    low
                }
            });
            let first = _mm512_permutex2var_epi8(v[0], gather, v[1]);
            let second = _mm512_permutex2var_epi8(v[2], gather, v[3]);
            let row = _mm512_inserti64x4::<1>(first, _mm512_castsi512_si256(second));
            let codes = _mm512_and_si512(row, three);
            let out: &mut [u8; COLUMNS] = (&mut out[start..start + COLUMNS])
                .try_into()
                .expect("64 codes");
            // SAFETY: writes exactly the 64 bytes of `out`.
            unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), codes) };
        }
    }
    full
}
