//! GGUF Q5_1: blocks of 32 weights with an f16 scale, an f16 minimum and 5-bit codes (as Q5_0's,
//! with a minimum instead of a fixed offset). Read only (dequantization).
//!
//! Spec (ggml `ggml-common.h` `block_q5_1`, `ggml-quants.c` `dequantize_row_q5_1`; gguf-py 0.19
//! `gguf/quants.py` `Q5_1.dequantize_blocks`, l.356-375):
//! - Block (24 bytes): f16 `d`, f16 `m`, `qh` (4 bytes, a little-endian u32 whose bit j is bit
//!   4 of element j), then 16 bytes `qs`: byte j holds the low 4 bits of element j in its LOW
//!   nibble and of element j + 16 in its HIGH nibble.
//! - Weight = `q * d + m` in f32; the product is exact (11 + 5 significant bits), so only the
//!   addition rounds.
//! - Cost per block: 20 code bytes (`qs` and `qh`), 2 scale bytes, 2 zero-point bytes (`m`): 6
//!   bits per weight.

use half::f16;

use super::stored::StoredBlock;
use crate::bpw::Cost;

/// One Q5_1 block, laid out as ggml's `block_q5_1`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ5_1 {
    /// Delta (scale).
    pub d: f16,
    /// Minimum: the weight of code 0.
    pub m: f16,
    /// Bit 4 of each element: bit j of the little-endian u32.
    pub qh: [u8; 4],
    /// Low nibbles: byte j = element j (low) | element j + 16 (high).
    pub qs: [u8; 16],
}

impl BlockQ5_1 {
    /// The 5-bit codes, element order.
    pub fn codes(&self) -> [u8; 32] {
        super::q5_0::five_bit_codes(self.qh, &self.qs)
    }
}

impl StoredBlock for BlockQ5_1 {
    const NAME: &'static str = "Q5_1";
    const BYTES: usize = 24;
    const VALUES: usize = 32;

    fn read_from(bytes: &[u8]) -> Self {
        BlockQ5_1 {
            d: f16::from_le_bytes([bytes[0], bytes[1]]),
            m: f16::from_le_bytes([bytes[2], bytes[3]]),
            qh: [bytes[4], bytes[5], bytes[6], bytes[7]],
            qs: std::array::from_fn(|i| bytes[8 + i]),
        }
    }

    fn write_to(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.m.to_le_bytes());
        out[4..8].copy_from_slice(&self.qh);
        out[8..Self::BYTES].copy_from_slice(&self.qs);
    }

    fn non_finite(&self) -> Option<(&'static str, f16)> {
        [("scale d", self.d), ("minimum m", self.m)]
            .into_iter()
            .find(|(_, v)| !v.is_finite())
    }

    fn dequantize_reference(&self, y: &mut [f32]) {
        // ggml's loop: elements j and j + 16 from byte j.
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        let qh = u32::from_le_bytes(self.qh);
        for j in 0..16 {
            let xh_0 = ((qh >> j) << 4) & 0x10;
            let xh_1 = (qh >> (j + 12)) & 0x10;
            let x0 = u32::from(self.qs[j] & 0x0F) | xh_0;
            let x1 = u32::from(self.qs[j] >> 4) | xh_1;
            y[j] = x0 as f32 * d + m;
            y[j + 16] = x1 as f32 * d + m;
        }
    }

    fn dequantize_fast(&self, y: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (out, q) in y[..32].iter_mut().zip(self.codes()) {
            *out = f32::from(q) * d + m;
        }
    }

    fn cost(blocks: usize) -> Cost {
        Cost {
            elements: blocks * 32,
            code_bytes: blocks * 20,
            scale_bytes: blocks * 2,
            zero_point_bytes: blocks * 2,
            g_idx_bytes: 0,
            extra_bytes: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_j_of_qh_is_the_fifth_bit_of_element_j() {
        let block = BlockQ5_1 {
            d: f16::from_f32(0.5),
            m: f16::from_f32(-1.0),
            qh: (1u32 << 17).to_le_bytes(), // element 17
            qs: [0x10; 16],                 // elements 16..32 have low bits 1
        };
        let mut y = [0f32; 32];
        block.dequantize_reference(&mut y);
        assert_eq!((y[0], y[16], y[17]), (-1.0, -0.5, 7.5));
        assert_eq!(block.codes()[17], 17);
        assert_eq!(BlockQ5_1::cost(1).bits_per_element(), 6.0);
    }
}
