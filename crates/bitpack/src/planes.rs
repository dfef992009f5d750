//! Bit-plane split: the bits of each b-bit code spread over several dense streams whose widths
//! divide 32, so no value straddles a word (GGUF's Q6_K keeps the low 4 bits and the high 2 bits
//! of its 6-bit codes in separate arrays the same way).
//!
//! Spec:
//! - Planes: b written as a sum of distinct powers of two, widest first; plane k holds the next
//!   `width_k` bits of every code, lowest bits first: 3 = 2 + 1, 5 = 4 + 1, 6 = 4 + 2,
//!   7 = 4 + 2 + 1 (three planes: a 4 + 3 split would leave a straddling 3-bit plane). Widths 1,
//!   2, 4 and 8 are a single plane, identical to the dense stream.
//! - Plane k of code c is `(c >> shift_k) & (2^width_k - 1)`, where `shift_k` is the sum of the
//!   widths before it (6 bits: plane 0 = bits 0..4, plane 1 = bits 4..6).
//! - Container: each plane is a [`crate::stream`] word stream of its own width: element i at bits
//!   [i*w, (i+1)*w), little-endian u32 words, zero-padded to a whole word. Its bytes are the
//!   same stream (see [`crate::stream::words_to_bytes`]).
//! - Length: recorded with the planes, never inferred. Unlike Q6_K, the planes are plain
//!   sequential streams with no block interleave.
//! - Join: code = OR over planes of `plane_k << shift_k`: one more load and a shift-and-OR per
//!   plane, every access aligned.
//!
//! `split_reference` / `BitPlanes::join_reference` move one bit field of one value at a time;
//! `split` / `BitPlanes::join` use the fast stream packers. Tests hold them to each other.

use crate::error::{BitsError, Result};
use crate::stream::{self as bits, Bits, WORD_BITS};

/// Where one plane's bits sit in the code: `width` bits starting at bit `shift`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlaneSlot {
    /// The lowest code bit this plane holds.
    pub shift: u32,
    /// How many bits it holds.
    pub width: Bits,
}

impl PlaneSlot {
    fn field(self, code: u8) -> u8 {
        (code >> self.shift) & self.width.max_code()
    }
}

/// The planes a b-bit code is split into, lowest code bits (widest plane) first.
pub fn plane_slots(bits: Bits) -> Vec<PlaneSlot> {
    let mut slots = Vec::new();
    let mut shift = 0;
    for width in [8, 4, 2, 1] {
        if bits.get() & width != 0 {
            slots.push(PlaneSlot {
                shift,
                width: Bits::new(width).expect("1, 2, 4 or 8"),
            });
            shift += width;
        }
    }
    slots
}

/// The codes of a b-bit stream, held as aligned planes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BitPlanes {
    bits: Bits,
    len: usize,
    planes: Vec<Vec<u32>>,
}

/// Splits codes (each <= `bits.max_code()`) into planes with the fast stream packer.
pub fn split(bits: Bits, codes: &[u8]) -> Result<BitPlanes> {
    bits::check_codes(bits, codes)?;
    let planes = plane_slots(bits)
        .into_iter()
        .map(|slot| {
            let fields: Vec<u8> = codes.iter().map(|&code| slot.field(code)).collect();
            bits::pack_words(slot.width, &fields)
        })
        .collect::<Result<_>>()?;
    Ok(BitPlanes {
        bits,
        len: codes.len(),
        planes,
    })
}

/// Reference split: each bit field of each value ORed into its plane at bit i*w.
pub fn split_reference(bits: Bits, codes: &[u8]) -> Result<BitPlanes> {
    bits::check_codes(bits, codes)?;
    let planes = plane_slots(bits)
        .into_iter()
        .map(|slot| {
            let w = slot.width.get() as usize;
            let mut words = vec![0u32; slot.width.word_count(codes.len())];
            for (i, &code) in codes.iter().enumerate() {
                // w divides 32, so the field never straddles a word.
                words[i * w / WORD_BITS] |= u32::from(slot.field(code)) << (i * w % WORD_BITS);
            }
            words
        })
        .collect();
    Ok(BitPlanes {
        bits,
        len: codes.len(),
        planes,
    })
}

impl BitPlanes {
    /// Planes read back from storage: one word stream per slot of [`plane_slots`], each exactly
    /// `width.word_count(len)` words.
    pub fn from_planes(bits: Bits, len: usize, planes: Vec<Vec<u32>>) -> Result<Self> {
        let slots = plane_slots(bits);
        if planes.len() != slots.len() {
            return Err(BitsError::PlaneCount {
                got: planes.len(),
                bits: bits.get(),
                expected: slots.len(),
            });
        }
        for (slot, plane) in slots.iter().zip(&planes) {
            let expected = slot.width.word_count(len);
            if plane.len() != expected {
                return Err(BitsError::StreamSize {
                    len,
                    bits: slot.width.get(),
                    got: plane.len(),
                    expected,
                    unit: "words",
                });
            }
        }
        Ok(BitPlanes { bits, len, planes })
    }

    /// The width of the codes the planes split.
    pub fn bits(&self) -> Bits {
        self.bits
    }

    /// The logical number of codes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no codes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The planes' word streams, in the order of [`plane_slots`].
    pub fn planes(&self) -> &[Vec<u32>] {
        &self.planes
    }

    /// Bytes the planes occupy as words (each plane padded to whole words on its own).
    pub fn stored_bytes(&self) -> usize {
        self.planes.iter().map(|plane| 4 * plane.len()).sum()
    }

    /// Joins the planes back into codes with the fast stream unpacker.
    pub fn join(&self) -> Vec<u8> {
        let mut codes = vec![0u8; self.len];
        for (slot, plane) in plane_slots(self.bits).into_iter().zip(&self.planes) {
            let fields = bits::unpack_words(slot.width, plane, self.len)
                .expect("plane sizes are checked on construction");
            for (code, field) in codes.iter_mut().zip(fields) {
                *code |= field << slot.shift;
            }
        }
        codes
    }

    /// Reference join: each code ORed together field by field from bit i*w of each plane.
    pub fn join_reference(&self) -> Vec<u8> {
        let slots = plane_slots(self.bits);
        (0..self.len)
            .map(|i| {
                slots
                    .iter()
                    .zip(&self.planes)
                    .fold(0u8, |code, (slot, plane)| {
                        let w = slot.width.get() as usize;
                        let word = plane[i * w / WORD_BITS] >> (i * w % WORD_BITS);
                        code | ((word as u8 & slot.width.max_code()) << slot.shift)
                    })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn widths(bits: u32) -> Vec<(u32, u32)> {
        plane_slots(Bits::new(bits).unwrap())
            .into_iter()
            .map(|slot| (slot.shift, slot.width.get()))
            .collect()
    }

    #[test]
    fn planes_are_the_powers_of_two_of_the_width_lowest_bits_widest() {
        assert_eq!(widths(3), [(0, 2), (2, 1)]);
        assert_eq!(widths(5), [(0, 4), (4, 1)]);
        assert_eq!(widths(6), [(0, 4), (4, 2)]);
        assert_eq!(widths(7), [(0, 4), (4, 2), (6, 1)]);
        for single in [1, 2, 4, 8] {
            assert_eq!(widths(single), [(0, single)]);
        }
    }

    #[test]
    fn six_bit_codes_split_like_q6_k_low_nibbles_and_high_pairs() {
        // 0b10_1101 = 45: low plane gets 0b1101 = 13, high plane 0b10 = 2.
        let planes = split(Bits::new(6).unwrap(), &[45, 63, 0, 1]).unwrap();
        assert_eq!(planes.planes(), [vec![0x10FD], vec![0b00_00_11_10]]);
        assert_eq!(planes.join(), vec![45, 63, 0, 1]);
    }
}
