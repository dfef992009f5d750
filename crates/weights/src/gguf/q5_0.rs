//! GGUF Q5_0: blocks of 32 values with an f16 scale and 5-bit codes (4 low bits in nibbles, the
//! fifth in a 32-bit mask), and ggml's reference quantizer for them. Used as a KV-cache type
//! (`llama.cpp -ctk q5_0`, crates/kvschemes); no weight conversion reads it.
//!
//! Spec (ggml `ggml-common.h` `block_q5_0`; `ggml-quants.c` `quantize_row_q5_0_ref` and
//! `dequantize_row_q5_0`, ggml-org/ggml d99724f2 l.187-229):
//! - Block (22 bytes): f16 `d`, then `qh` (4 bytes, a little-endian u32 whose bit j is bit 4 of
//!   element j), then 16 bytes `qs`: byte j holds the low 4 bits of element j in its LOW nibble
//!   and of element j + 16 in its HIGH nibble. Value = d * (q - 16).
//! - Quantizer: `max` is the element of largest magnitude with its sign (the first on ties);
//!   d = max / -16 in f32; id = 1/d from the f32 d (0 when d is 0); q = min(31, trunc(x * id +
//!   16.5)). d is stored rounded to f16 (nearest even). An all-zero block stores d = -0.0 and
//!   codes 16, as ggml does.
//!
//! gguf-py 0.19's `gguf.quants.Q5_0` writes the same bytes (crates/kvschemes tests, on real
//! SmolLM2 keys and values). The quantizer is the reference only; weights stored as Q5_0 (Gemma
//! 3's attention and FFN projections) are read through [`StoredBlock`]: 20 code bytes and a
//! 2-byte scale per block, 5.5 bits per weight.

use half::f16;

use super::stored::StoredBlock;
use crate::bpw::Cost;

/// Values per Q5_0 block.
pub const QK5_0: usize = 32;

/// One Q5_0 block, laid out as ggml's `block_q5_0`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ5_0 {
    /// Delta (scale).
    pub d: f16,
    /// Bit 4 of each element: bit j of the little-endian u32.
    pub qh: [u8; 4],
    /// Low nibbles: byte j = element j (low) | element j + 16 (high).
    pub qs: [u8; QK5_0 / 2],
}

impl BlockQ5_0 {
    /// Bytes per block.
    pub const BYTES: usize = 22;

    /// ggml's reference quantizer for one block of 32 finite values, bit for bit.
    pub fn quantize(x: &[f32; 32]) -> Self {
        let d = super::signed_max(x).1 / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        // ggml: MIN(31, (int8_t)(x*id + 16.5f)); the cast truncates toward zero.
        let codes = x.map(|v| ((v * id + 16.5).trunc() as i8).clamp(0, 31) as u8);
        Self::from_parts(f16::from_f32(d), &codes)
    }

    /// The block with scale `d` and these 5-bit codes (each masked to 5 bits).
    pub fn from_parts(d: f16, codes: &[u8; 32]) -> Self {
        let mut qh = 0u32;
        for (j, &q) in codes.iter().enumerate() {
            qh |= u32::from((q >> 4) & 1) << j;
        }
        BlockQ5_0 {
            d,
            qh: qh.to_le_bytes(),
            qs: std::array::from_fn(|j| (codes[j] & 0x0F) | ((codes[j + 16] & 0x0F) << 4)),
        }
    }

    /// The 5-bit codes, element order.
    pub fn codes(&self) -> [u8; 32] {
        five_bit_codes(self.qh, &self.qs)
    }

    /// ggml's dequantization: `(q - 16) * d` in f32.
    pub fn dequantize(&self) -> [f32; 32] {
        let d = self.d.to_f32();
        self.codes().map(|q| f32::from(i16::from(q) - 16) * d)
    }

    /// The block's bytes.
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..6].copy_from_slice(&self.qh);
        out[6..].copy_from_slice(&self.qs);
        out
    }

    /// The block that bytes hold.
    pub fn read_from(bytes: &[u8; Self::BYTES]) -> Self {
        BlockQ5_0 {
            d: f16::from_le_bytes([bytes[0], bytes[1]]),
            qh: [bytes[2], bytes[3], bytes[4], bytes[5]],
            qs: std::array::from_fn(|i| bytes[6 + i]),
        }
    }
}

/// Q5_0's and Q5_1's 32 codes: the low 4 bits of element j from byte j % 16 of `qs` (low nibble
/// for j < 16), bit 4 from bit j of the little-endian `qh`.
pub(super) fn five_bit_codes(qh: [u8; 4], qs: &[u8; 16]) -> [u8; 32] {
    let qh = u32::from_le_bytes(qh);
    std::array::from_fn(|i| {
        let byte = qs[i % 16];
        let low = if i < 16 { byte & 0x0F } else { byte >> 4 };
        low | ((((qh >> i) & 1) as u8) << 4)
    })
}

impl StoredBlock for BlockQ5_0 {
    const NAME: &'static str = "Q5_0";
    const BYTES: usize = Self::BYTES;
    const VALUES: usize = QK5_0;

    fn read_from(bytes: &[u8]) -> Self {
        Self::read_from(bytes[..Self::BYTES].try_into().expect("22 bytes"))
    }

    fn write_to(&self, out: &mut [u8]) {
        out[..Self::BYTES].copy_from_slice(&self.to_bytes());
    }

    fn non_finite(&self) -> Option<(&'static str, f16)> {
        (!self.d.is_finite()).then_some(("scale d", self.d))
    }

    fn dequantize_reference(&self, y: &mut [f32]) {
        // ggml's loop: elements j and j + 16 from byte j, minus the offset 16 in int32.
        let d = self.d.to_f32();
        let qh = u32::from_le_bytes(self.qh);
        for j in 0..16 {
            let xh_0 = ((qh >> j) << 4) & 0x10;
            let xh_1 = (qh >> (j + 12)) & 0x10;
            let x0 = (u32::from(self.qs[j] & 0x0F) | xh_0) as i32 - 16;
            let x1 = (u32::from(self.qs[j] >> 4) | xh_1) as i32 - 16;
            y[j] = x0 as f32 * d;
            y[j + 16] = x1 as f32 * d;
        }
    }

    fn dequantize_fast(&self, y: &mut [f32]) {
        y[..QK5_0].copy_from_slice(&self.dequantize());
    }

    fn cost(blocks: usize) -> Cost {
        Cost {
            elements: blocks * QK5_0,
            code_bytes: blocks * 20,
            scale_bytes: blocks * 2,
            zero_point_bytes: 0,
            g_idx_bytes: 0,
            extra_bytes: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_survive_the_split_into_nibbles_and_the_high_bit_mask() {
        let codes: [u8; 32] = std::array::from_fn(|i| (i as u8 * 7) % 32);
        let block = BlockQ5_0::from_parts(f16::ONE, &codes);
        assert_eq!(block.codes(), codes);
        assert_eq!(BlockQ5_0::read_from(&block.to_bytes()), block);
    }

    #[test]
    fn the_largest_magnitude_maps_to_code_zero_and_zeros_to_sixteen() {
        let mut x = [0.0f32; 32];
        x[3] = 2.0;
        x[5] = -1.0;
        let block = BlockQ5_0::quantize(&x);
        assert_eq!(block.d.to_f32(), -0.125);
        assert_eq!(block.codes()[3], 0);
        assert_eq!(block.codes()[0], 16);
        assert_eq!(block.dequantize()[3], 2.0);
        assert_eq!(block.dequantize()[5], -1.0);
        // An all-zero block: d = 0 / -16 = -0.0, every code 16.
        let zero = BlockQ5_0::quantize(&[0.0; 32]);
        assert_eq!(zero.d.to_bits(), 0x8000);
        assert_eq!(zero.to_bytes()[2..6], [0xFF; 4]);
    }
}
