//! Private stand-in for `codec::bits` (being written on branch `bits`), so GPTQ can pack before
//! it lands; replace every use with `codec::bits` once it is on main. Not a general bit-stream
//! module: just the oracle loop, which is all GPTQ and AWQ need.
//!
//! Spec: element i of a b-bit stream (1 <= b <= 8) occupies bits [i*b, (i+1)*b) of a sequence of
//! little-endian 32-bit words; a value whose bits cross a word boundary continues in the low bits
//! of the next word. Checkpoints store the words as int32: converting with `as` reinterprets the
//! bits, so the top slot's high bit becomes the sign bit and is never sign-extended on the way back.

/// Packs `codes` (each < 2^bits) into ceil(len * bits / 32) words.
pub(crate) fn pack(codes: &[u8], bits: u32) -> Vec<u32> {
    let mut words = vec![0u32; (codes.len() * bits as usize).div_ceil(32)];
    for (i, &code) in codes.iter().enumerate() {
        let bit = i * bits as usize;
        let (word, offset) = (bit / 32, (bit % 32) as u32);
        let value = u64::from(code) << offset;
        words[word] |= value as u32;
        if offset + bits > 32 {
            words[word + 1] |= (value >> 32) as u32;
        }
    }
    words
}

/// Reads `count` b-bit values from `words`.
pub(crate) fn unpack(words: &[u32], bits: u32, count: usize) -> Vec<u8> {
    let mask = (1u64 << bits) - 1;
    (0..count)
        .map(|i| {
            let bit = i * bits as usize;
            let (word, offset) = (bit / 32, (bit % 32) as u32);
            let mut window = u64::from(words[word]);
            if offset + bits > 32 {
                window |= u64::from(words[word + 1]) << 32;
            }
            ((window >> offset) & mask) as u8
        })
        .collect()
}

/// The int32 a checkpoint stores for a word: the same 32 bits.
pub(crate) fn to_i32(words: Vec<u32>) -> Vec<i32> {
    words.into_iter().map(|w| w as i32).collect()
}

/// The word an int32 stores: the same 32 bits, no sign extension.
pub(crate) fn from_i32(stored: &[i32]) -> Vec<u32> {
    stored.iter().map(|&w| w as u32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_bit_value_10_straddles_words_0_and_1() {
        // Value 10 sits at bits 30..33: its low two bits end word 0, its high bit starts word 1.
        let mut codes = vec![0u8; 32];
        codes[10] = 0b101;
        assert_eq!(pack(&codes, 3), vec![0b01 << 30, 0b1, 0]);
        assert_eq!(unpack(&pack(&codes, 3), 3, 32), codes);
    }

    #[test]
    fn all_ones_word_survives_the_int32_view() {
        let words = pack(&[15; 8], 4);
        assert_eq!(to_i32(words.clone()), vec![-1]);
        assert_eq!(unpack(&from_i32(&[-1]), 4, 8), vec![15; 8]);
    }
}
