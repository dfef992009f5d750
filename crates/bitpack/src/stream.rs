//! Dense b-bit code streams, for every width b from 1 to 8.
//!
//! Spec:
//! - Codes: unsigned integers 0..=2^b - 1, one per logical element. A public packer refuses a
//!   code that does not fit the width ([`BitsError::CodeTooWide`]); nothing is masked silently.
//! - Bit position: logical element i occupies bits [i*b, (i+1)*b) of the stream, least
//!   significant bit first. Bit p of the stream is bit p % 32 of 32-bit word p / 32, which is
//!   bit p % 8 of byte p / 8: the word stream read as little-endian bytes IS the byte stream.
//! - Straddling: when b does not divide 32 (3, 5, 6, 7 bits) an element may straddle two words
//!   (and two bytes); its low bits end the first word and its high bits start the next.
//! - Containers: `u32` words, padded with zero bits to whole words (`word_count`), or bytes,
//!   padded with zero bits to whole bytes (`byte_count`); bit positions are identical.
//!   Checkpoints often store the words as signed `i32`: [`unpack_i32_words`] reinterprets each
//!   word's bits, so the top slot's high bit is never sign-extended into the code.
//! - Length: the logical number of codes is recorded by the caller and passed to every
//!   unpacker; it is never inferred from the container's size (padding could pass for codes).
//!   An unpacker refuses a stream whose size is not exactly what that length needs, and ignores
//!   the padding bits.
//!
//! Every container has a plain reference implementation (`*_reference`: one value at a time,
//! the straddle branch spelled out, as in the bit-packing seed's `pack_bits` / `unpack_bits`),
//! which is the oracle, and a fast one that handles eight codes (exactly b bytes) at a time with
//! shifts and masks in a u64. The tests hold each fast path to its oracle on patterned, random
//! and all-maximum codes at lengths that are not multiples of 8 or 32.

use std::fmt;

use crate::error::{BitsError, Result};

/// Bits in one container word.
pub const WORD_BITS: usize = 32;

/// A code width from 1 to 8 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Bits(u32);

impl Bits {
    /// 1-bit codes.
    pub const ONE: Bits = Bits(1);
    /// 2-bit codes.
    pub const TWO: Bits = Bits(2);
    /// 4-bit codes (two to a byte: the nibble order).
    pub const FOUR: Bits = Bits(4);
    /// 8-bit codes (one per byte).
    pub const EIGHT: Bits = Bits(8);

    /// Every width a stream can hold, narrowest first.
    pub const ALL: [Bits; 8] = [
        Bits(1),
        Bits(2),
        Bits(3),
        Bits(4),
        Bits(5),
        Bits(6),
        Bits(7),
        Bits(8),
    ];

    /// A width of `bits` bits, 1 to 8.
    pub fn new(bits: u32) -> Result<Self> {
        match bits {
            1..=8 => Ok(Bits(bits)),
            other => Err(BitsError::UnsupportedBits { bits: other }),
        }
    }

    /// The width in bits.
    pub fn get(self) -> u32 {
        self.0
    }

    /// Largest code the width holds: 2^b - 1.
    pub fn max_code(self) -> u8 {
        ((1u16 << self.0) - 1) as u8
    }

    /// Largest symmetric code magnitude: 2^(b-1) - 1 (0 at 1 bit, 7 at 4 bits, 127 at 8 bits).
    pub fn qmax(self) -> u8 {
        ((1u16 << (self.0 - 1)) - 1) as u8
    }

    /// Bytes that hold `len` codes (zero-padded to a whole byte).
    pub fn byte_count(self, len: usize) -> usize {
        (len * self.0 as usize).div_ceil(8)
    }

    /// Words that hold `len` codes (zero-padded to a whole word).
    pub fn word_count(self, len: usize) -> usize {
        (len * self.0 as usize).div_ceil(WORD_BITS)
    }
}

impl fmt::Display for Bits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-bit", self.0)
    }
}

// ---------------------------------------------------------------------------------------------
// The oracle: one value at a time.

/// Reference word packer: code i is ORed in at bit offset (i*b) % 32 of word (i*b) / 32, and its
/// high bits go to the next word when it straddles.
pub fn pack_words_reference(bits: Bits, codes: &[u8]) -> Result<Vec<u32>> {
    check_codes(bits, codes)?;
    let b = bits.get() as usize;
    let mut words = vec![0u32; bits.word_count(codes.len())];
    for (i, &code) in codes.iter().enumerate() {
        let (word, offset) = ((i * b) / WORD_BITS, (i * b) % WORD_BITS);
        words[word] |= u32::from(code) << offset;
        if offset + b > WORD_BITS {
            // The value straddles two words: its high bits start the next one.
            words[word + 1] |= u32::from(code) >> (WORD_BITS - offset);
        }
    }
    Ok(words)
}

/// Reference word unpacker: reads `len` codes, stitching the straddling ones.
pub fn unpack_words_reference(bits: Bits, words: &[u32], len: usize) -> Result<Vec<u8>> {
    check_stream_size(bits, len, words.len(), bits.word_count(len), "words")?;
    let b = bits.get() as usize;
    let mask = u32::from(bits.max_code());
    let codes = (0..len)
        .map(|i| {
            let (word, offset) = ((i * b) / WORD_BITS, (i * b) % WORD_BITS);
            let mut value = words[word] >> offset;
            if offset + b > WORD_BITS {
                value |= words[word + 1] << (WORD_BITS - offset);
            }
            (value & mask) as u8
        })
        .collect();
    Ok(codes)
}

/// Reference byte packer: the reference word stream, viewed as little-endian bytes and cut to
/// whole bytes. That the fast byte packer agrees with it is the spec's claim that both
/// containers put every bit in the same place.
pub fn pack_bytes_reference(bits: Bits, codes: &[u8]) -> Result<Vec<u8>> {
    let mut bytes = words_to_bytes(&pack_words_reference(bits, codes)?);
    bytes.truncate(bits.byte_count(codes.len()));
    Ok(bytes)
}

/// Reference byte unpacker: the bytes regrouped into little-endian words, zero-padded to a
/// whole word, read by the reference word unpacker.
pub fn unpack_bytes_reference(bits: Bits, bytes: &[u8], len: usize) -> Result<Vec<u8>> {
    check_stream_size(bits, len, bytes.len(), bits.byte_count(len), "bytes")?;
    let mut padded = bytes.to_vec();
    padded.resize(4 * bits.word_count(len), 0);
    unpack_words_reference(bits, &bytes_to_words(&padded), len)
}

// ---------------------------------------------------------------------------------------------
// The fast path: eight codes (exactly b bytes) at a time.

/// Calls `$function::<B>(args)` with the width as a constant, so each width gets its own
/// straight-line shifts and masks.
macro_rules! with_width {
    ($bits:expr, $function:ident, $($arg:expr),*) => {
        match $bits.get() {
            1 => $function::<1>($($arg),*),
            2 => $function::<2>($($arg),*),
            3 => $function::<3>($($arg),*),
            4 => $function::<4>($($arg),*),
            5 => $function::<5>($($arg),*),
            6 => $function::<6>($($arg),*),
            7 => $function::<7>($($arg),*),
            8 => $function::<8>($($arg),*),
            _ => unreachable!("Bits holds 1 to 8"),
        }
    };
}

/// Packs codes (each <= `bits.max_code()`) into `bits.byte_count(codes.len())` bytes.
pub fn pack_bytes(bits: Bits, codes: &[u8]) -> Result<Vec<u8>> {
    check_codes(bits, codes)?;
    let mut bytes = vec![0u8; bits.byte_count(codes.len())];
    with_width!(bits, pack_into, codes, &mut bytes);
    Ok(bytes)
}

/// Unpacks `len` codes from exactly `bits.byte_count(len)` bytes.
pub fn unpack_bytes(bits: Bits, bytes: &[u8], len: usize) -> Result<Vec<u8>> {
    check_stream_size(bits, len, bytes.len(), bits.byte_count(len), "bytes")?;
    let mut codes = vec![0u8; len];
    with_width!(bits, unpack_into, bytes, &mut codes);
    Ok(codes)
}

/// Packs codes (each <= `bits.max_code()`) into `bits.word_count(codes.len())` words.
pub fn pack_words(bits: Bits, codes: &[u8]) -> Result<Vec<u32>> {
    check_codes(bits, codes)?;
    let mut bytes = vec![0u8; 4 * bits.word_count(codes.len())];
    with_width!(bits, pack_into, codes, &mut bytes);
    Ok(bytes_to_words(&bytes))
}

/// Unpacks `len` codes from exactly `bits.word_count(len)` words.
pub fn unpack_words(bits: Bits, words: &[u32], len: usize) -> Result<Vec<u8>> {
    check_stream_size(bits, len, words.len(), bits.word_count(len), "words")?;
    let mut codes = vec![0u8; len];
    with_width!(bits, unpack_into, &words_to_bytes(words), &mut codes);
    Ok(codes)
}

/// Packs codes into words and labels them signed, as checkpoints store them. The bits are
/// unchanged: eight 4-bit codes of 15 are the word 0xFFFF_FFFF, stored as -1.
pub fn pack_i32_words(bits: Bits, codes: &[u8]) -> Result<Vec<i32>> {
    Ok(pack_words(bits, codes)?
        .into_iter()
        .map(|word| word as i32)
        .collect())
}

/// Unpacks `len` codes from words stored as signed `i32`. Each word's bits are reinterpreted
/// as `u32` before any shift, so a set top bit stays a code bit instead of being copied into
/// the high bits by an arithmetic shift.
pub fn unpack_i32_words(bits: Bits, words: &[i32], len: usize) -> Result<Vec<u8>> {
    let unsigned: Vec<u32> = words.iter().map(|&word| word as u32).collect();
    unpack_words(bits, &unsigned, len)
}

/// Lays words out as the little-endian byte stream they hold.
pub fn words_to_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|word| word.to_le_bytes()).collect()
}

/// Groups a byte stream (a whole number of words long) into little-endian words.
fn bytes_to_words(bytes: &[u8]) -> Vec<u32> {
    debug_assert_eq!(bytes.len() % 4, 0);
    bytes
        .chunks_exact(4)
        .map(|word| u32::from_le_bytes([word[0], word[1], word[2], word[3]]))
        .collect()
}

/// Packs eight codes at a time into `B` bytes; a partial last group is zero-filled and only the
/// bytes the stream has room for are written (the rest of `out` is padding and stays zero).
fn pack_into<const B: u32>(codes: &[u8], out: &mut [u8]) {
    let b = B as usize;
    let mut groups = codes.chunks_exact(8);
    for (group, slot) in groups.by_ref().zip(out.chunks_exact_mut(b)) {
        let lanes = u64::from_le_bytes(group.try_into().expect("chunks of 8"));
        slot.copy_from_slice(&squeeze::<B>(lanes).to_le_bytes()[..b]);
    }
    let rest = groups.remainder();
    if !rest.is_empty() {
        let mut group = [0u8; 8];
        group[..rest.len()].copy_from_slice(rest);
        let packed = squeeze::<B>(u64::from_le_bytes(group)).to_le_bytes();
        let start = (codes.len() - rest.len()) / 8 * b;
        let used = (rest.len() * b).div_ceil(8);
        out[start..start + used].copy_from_slice(&packed[..used]);
    }
}

/// Unpacks `codes.len()` codes, eight at a time from `B` bytes.
fn unpack_into<const B: u32>(bytes: &[u8], codes: &mut [u8]) {
    let b = B as usize;
    let whole_groups = codes.len() / 8;
    let mut slots = codes.chunks_exact_mut(8);
    for (slot, group) in slots.by_ref().zip(bytes.chunks_exact(b)) {
        slot.copy_from_slice(&spread::<B>(read_le(group)).to_le_bytes());
    }
    let rest = slots.into_remainder();
    if !rest.is_empty() {
        let start = whole_groups * b;
        let lanes = spread::<B>(read_le(&bytes[start..])).to_le_bytes();
        rest.copy_from_slice(&lanes[..rest.len()]);
    }
}

/// Up to 8 bytes as a little-endian u64, zero-filled.
fn read_le(bytes: &[u8]) -> u64 {
    let mut buffer = [0u8; 8];
    let n = bytes.len().min(8);
    buffer[..n].copy_from_slice(&bytes[..n]);
    u64::from_le_bytes(buffer)
}

/// Ones in the low `n` bits of a u64 (`n` <= 32 here).
const fn low_bits(n: u32) -> u64 {
    (1u64 << n) - 1
}

/// Eight codes, one per byte lane (code k in bits 8k..8k+B, every lane < 2^B), moved to bits
/// kB..(k+1)B: neighbouring lanes are merged in three halving steps (bytes into 16-bit lanes
/// of 2B bits, those into 32-bit lanes of 4B bits, those into 8B bits).
#[inline(always)]
fn squeeze<const B: u32>(lanes: u64) -> u64 {
    let v = lanes;
    let v = (v & 0x00FF_00FF_00FF_00FF) | ((v & 0xFF00_FF00_FF00_FF00) >> (8 - B));
    let v = (v & 0x0000_FFFF_0000_FFFF) | ((v & 0xFFFF_0000_FFFF_0000) >> (16 - 2 * B));
    (v & 0x0000_0000_FFFF_FFFF) | ((v & 0xFFFF_FFFF_0000_0000) >> (32 - 4 * B))
}

/// The inverse of [`squeeze`]: 8B packed bits (anything above them is ignored) spread to one
/// code per byte lane, each masked to B bits.
#[inline(always)]
fn spread<const B: u32>(packed: u64) -> u64 {
    let half = low_bits(4 * B);
    let v = (packed & half) | ((packed << (32 - 4 * B)) & (half << 32));
    let quarter = low_bits(2 * B) * 0x0000_0001_0000_0001;
    let v = (v & quarter) | ((v << (16 - 2 * B)) & (quarter << 16));
    let eighth = low_bits(B) * 0x0001_0001_0001_0001;
    (v & eighth) | ((v << (8 - B)) & (eighth << 8))
}

// ---------------------------------------------------------------------------------------------
// Checks shared by both paths.

/// Refuses the first code that does not fit in `bits`.
pub fn check_codes(bits: Bits, codes: &[u8]) -> Result<()> {
    // The OR of all codes fits iff every code does; this folds without branching.
    if codes.iter().fold(0u8, |acc, &code| acc | code) <= bits.max_code() {
        return Ok(());
    }
    let (index, &code) = codes
        .iter()
        .enumerate()
        .find(|(_, code)| **code > bits.max_code())
        .expect("some code is too wide");
    Err(BitsError::CodeTooWide {
        index,
        code,
        bits: bits.get(),
    })
}

fn check_stream_size(
    bits: Bits,
    len: usize,
    got: usize,
    expected: usize,
    unit: &'static str,
) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(BitsError::StreamSize {
            len,
            bits: bits.get(),
            got,
            expected,
            unit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_bit_byte_stream_is_the_nibble_order_codes_2_and_13_form_0xd2() {
        // Byte i = code[2i] | code[2i + 1] << 4: the even element in the low nibble.
        assert_eq!(pack_bytes(Bits::FOUR, &[2, 13]).unwrap(), vec![0xD2]);
        assert_eq!(unpack_bytes(Bits::FOUR, &[0xD2], 2).unwrap(), vec![2, 13]);
        // Masking and shifting by hand, as the study's exercise asks.
        assert_eq!((0xD2u8 & 15, 0xD2u8 >> 4), (2, 13));
        // A swapped slot order would produce 0x01, 0x23, ... instead.
        let ramp: Vec<u8> = (0..8).collect();
        assert_eq!(
            pack_bytes(Bits::FOUR, &ramp).unwrap(),
            vec![0x10, 0x32, 0x54, 0x76]
        );
        assert_eq!(pack_words(Bits::FOUR, &ramp).unwrap(), vec![0x7654_3210]);
    }

    #[test]
    fn odd_count_gets_zero_padding_and_padding_bits_are_ignored_on_read() {
        assert_eq!(
            pack_bytes(Bits::FOUR, &[1, 2, 3]).unwrap(),
            vec![0x21, 0x03]
        );
        assert_eq!(
            unpack_bytes(Bits::FOUR, &[0x21, 0xF3], 3).unwrap(),
            vec![1, 2, 3]
        );
        assert_eq!(
            unpack_bytes_reference(Bits::FOUR, &[0x21, 0xF3], 3).unwrap(),
            vec![1, 2, 3]
        );
    }

    #[test]
    fn three_bit_element_10_straddles_words_0_and_1() {
        // Element 10 occupies bits 30..33: its low two bits end word 0, its top bit starts
        // word 1. Element 21 occupies bits 63..66 and straddles words 1 and 2.
        let mut codes = vec![0u8; 32];
        codes[10] = 0b111;
        assert_eq!(
            pack_words(Bits::new(3).unwrap(), &codes).unwrap(),
            [0xC000_0000, 1, 0]
        );
        codes[10] = 0;
        codes[21] = 0b101;
        assert_eq!(
            pack_words(Bits::new(3).unwrap(), &codes).unwrap(),
            [0, 0x8000_0000, 0b10]
        );
    }

    #[test]
    fn squeeze_and_spread_are_inverse_for_every_width() {
        for bits in Bits::ALL {
            // Lane k holds max_code - k (saturating), so every lane differs where it can.
            let lanes = u64::from_le_bytes(
                [0u8, 1, 2, 3, 4, 5, 6, 7].map(|k| bits.max_code().saturating_sub(k)),
            );
            let packed = with_width!(bits, squeeze, lanes);
            if bits.get() < 8 {
                assert_eq!(
                    packed >> (8 * bits.get()),
                    0,
                    "{bits}: nothing above 8b bits"
                );
            }
            assert_eq!(with_width!(bits, spread, packed), lanes, "{bits}");
        }
    }
}
