//! GGUF Q5_K: Q4_K's super-blocks with a fifth bit per weight. Read only (dequantization).
//!
//! Spec (ggml `ggml-common.h` `block_q5_K`, `ggml-quants.c` `dequantize_row_q5_K`; gguf-py 0.19
//! `gguf/quants.py` `Q5_K.dequantize_blocks`, l.525-549):
//! - Super-block (176 bytes): f16 `d`, f16 `dmin`, 12 bytes `scales` (packed exactly as Q4_K's,
//!   [`super::q4_k::scale_min`]), 32 bytes `qh`, then 128 bytes `qs`.
//! - Codes: as Q4_K, chunk c of 64 weights reads `qs[32c .. 32c + 32]`, low nibbles for
//!   sub-block 2c and high nibbles for sub-block 2c + 1; the fifth bit of weight l of sub-block
//!   j (l in 0..32) is bit j of `qh[l]`: the high bits are bit planes, one per sub-block.
//! - Weight = `(d * sc[j]) * q - (dmin * m[j])` in f32, q in 0..32; both products are exact (at
//!   most 11 + 6 + 5 significant bits), so only the subtraction rounds.
//! - Cost per super-block: 160 code bytes (`qs` and `qh`), 2 scale bytes, 2 zero-point bytes,
//!   12 extra bytes: 5.5 bits per weight.

use half::f16;

use super::q4_k::{K_SCALE_SIZE, QK_K, scale_min, sub_block_scales};
use super::stored::StoredBlock;
use crate::bpw::Cost;

/// One Q5_K super-block, laid out as ggml's `block_q5_K`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ5K {
    /// Super-block scale of the sub-block scales.
    pub d: f16,
    /// Super-block scale of the sub-block minimums.
    pub dmin: f16,
    /// Packed 6-bit scales and minimums (as Q4_K's).
    pub scales: [u8; K_SCALE_SIZE],
    /// Fifth bits: bit j of byte l belongs to weight l of sub-block j.
    pub qh: [u8; QK_K / 8],
    /// Low 4 bits, two per byte (as Q4_K's codes).
    pub qs: [u8; QK_K / 2],
}

impl StoredBlock for BlockQ5K {
    const NAME: &'static str = "Q5_K";
    const BYTES: usize = 176;
    const VALUES: usize = QK_K;

    fn read_from(bytes: &[u8]) -> Self {
        BlockQ5K {
            d: f16::from_le_bytes([bytes[0], bytes[1]]),
            dmin: f16::from_le_bytes([bytes[2], bytes[3]]),
            scales: std::array::from_fn(|i| bytes[4 + i]),
            qh: std::array::from_fn(|i| bytes[16 + i]),
            qs: std::array::from_fn(|i| bytes[48 + i]),
        }
    }

    fn write_to(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.dmin.to_le_bytes());
        out[4..16].copy_from_slice(&self.scales);
        out[16..48].copy_from_slice(&self.qh);
        out[48..Self::BYTES].copy_from_slice(&self.qs);
    }

    fn non_finite(&self) -> Option<(&'static str, f16)> {
        [("scale d", self.d), ("minimum scale dmin", self.dmin)]
            .into_iter()
            .find(|(_, v)| !v.is_finite())
    }

    fn dequantize_reference(&self, y: &mut [f32]) {
        // ggml's loop, with its two moving masks u1 and u2 over the qh bit planes.
        let (d, min) = (self.d.to_f32(), self.dmin.to_f32());
        let (mut is, mut u1, mut u2) = (0, 1u8, 2u8);
        for (step, ql) in self.qs.chunks_exact(32).enumerate() {
            let (sc, m) = scale_min(is, &self.scales);
            let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
            let (sc, m) = scale_min(is + 1, &self.scales);
            let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
            let y = &mut y[64 * step..];
            for l in 0..32 {
                let high = if self.qh[l] & u1 != 0 { 16 } else { 0 };
                y[l] = d1 * f32::from((ql[l] & 0xF) + high) - m1;
            }
            for l in 0..32 {
                let high = if self.qh[l] & u2 != 0 { 16 } else { 0 };
                y[32 + l] = d2 * f32::from((ql[l] >> 4) + high) - m2;
            }
            is += 2;
            u1 <<= 2;
            u2 <<= 2;
        }
    }

    fn dequantize_fast(&self, y: &mut [f32]) {
        let (dl, ml) = sub_block_scales(self.d, self.dmin, &self.scales);
        let y: &mut [f32; QK_K] = (&mut y[..QK_K]).try_into().expect("256 values");
        for (c, (q, y)) in self
            .qs
            .as_chunks::<32>()
            .0
            .iter()
            .zip(y.as_chunks_mut::<64>().0)
            .enumerate()
        {
            let (low, high) = y.split_at_mut(32);
            let (j1, j2) = (2 * c, 2 * c + 1);
            for (l, (lo, hi)) in low.iter_mut().zip(high.iter_mut()).enumerate() {
                let (byte, h) = (q[l], self.qh[l]);
                let q1 = (byte & 0xF) | (((h >> j1) & 1) << 4);
                let q2 = (byte >> 4) | (((h >> j2) & 1) << 4);
                *lo = dl[j1] * f32::from(q1) - ml[j1];
                *hi = dl[j2] * f32::from(q2) - ml[j2];
            }
        }
    }

    fn cost(blocks: usize) -> Cost {
        Cost {
            elements: blocks * QK_K,
            code_bytes: blocks * (QK_K / 2 + QK_K / 8),
            scale_bytes: blocks * 2,
            zero_point_bytes: blocks * 2,
            g_idx_bytes: 0,
            extra_bytes: blocks * K_SCALE_SIZE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fifth_bit_of_sub_block_j_is_bit_plane_j_of_qh() {
        let mut block = BlockQ5K {
            d: f16::ONE,
            dmin: f16::ZERO,
            scales: [1, 1, 1, 1, 0, 0, 0, 0, 0x01, 0x01, 0x01, 0x01], // every sc 1, every m 0
            qh: [0; 32],
            qs: [0; 128],
        };
        block.qh[3] = 0b1000_0001; // weight 3 of sub-block 0 and of sub-block 7
        block.qs[32 * 3 + 3] = 0x20; // sub-block 7 (high nibbles of chunk 3): low bits 2
        let mut y = [0f32; QK_K];
        block.dequantize_reference(&mut y);
        assert_eq!((y[3], y[7 * 32 + 3]), (16.0, 18.0));
        assert_eq!(y.iter().filter(|&&v| v != 0.0).count(), 2);
        assert_eq!(BlockQ5K::cost(2).bits_per_element(), 5.5);
    }
}
