//! GGUF Q6_K: super-blocks of 256 weights with 6-bit codes whose low 4 bits and high 2 bits
//! sit in separate arrays (bit planes), and an int8 scale per 16 weights under one f16 `d`.
//! Read only (dequantization).
//!
//! Spec (ggml `ggml-common.h` `block_q6_K`, `ggml-quants.c` `dequantize_row_q6_K`; gguf-py 0.19
//! `gguf/quants.py` `Q6_K.dequantize_blocks`, l.552-572):
//! - Super-block (210 bytes): 128 bytes `ql` (low 4 bits), 64 bytes `qh` (high 2 bits), 16
//!   int8 `scales`, then f16 `d` (last, unlike the other k-quants).
//! - Codes, in two halves of 128 weights (h = 0, 1), each reading `ql[64h .. 64h + 64]` and
//!   `qh[32h .. 32h + 32]`; for l in 0..32, with `L = ql[64h..]` and `H = qh[32h..]`:
//!
//!   ```text
//!   weight 128h +      l : low nibble of L[l],      bits 0-1 of H[l]
//!   weight 128h + 32 + l : low nibble of L[l + 32], bits 2-3 of H[l]
//!   weight 128h + 64 + l : high nibble of L[l],     bits 4-5 of H[l]
//!   weight 128h + 96 + l : high nibble of L[l + 32], bits 6-7 of H[l]
//!   ```
//!   q = low | high << 4, in 0..64, and the weight's signed code is q - 32.
//! - Weight i = `d * scales[i / 16] * (q - 32)` in f32, multiplied left to right. Every product
//!   is exact (at most 11 + 7 + 5 significant bits), so the order cannot change a bit.
//! - Cost per super-block: 192 code bytes (`ql` and `qh`), 2 scale bytes (`d`), 16 extra bytes
//!   (the int8 sub-block scales): 6.5625 bits per weight.

use half::f16;

use super::q4_k::QK_K;
use super::stored::StoredBlock;
use crate::bpw::Cost;

/// One Q6_K super-block, laid out as ggml's `block_q6_K`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ6K {
    /// Low 4 bits of the codes (see the module spec).
    pub ql: [u8; QK_K / 2],
    /// High 2 bits of the codes (see the module spec).
    pub qh: [u8; QK_K / 4],
    /// One signed scale per 16 weights.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale.
    pub d: f16,
}

impl StoredBlock for BlockQ6K {
    const NAME: &'static str = "Q6_K";
    const BYTES: usize = 210;
    const VALUES: usize = QK_K;

    fn read_from(bytes: &[u8]) -> Self {
        BlockQ6K {
            ql: std::array::from_fn(|i| bytes[i]),
            qh: std::array::from_fn(|i| bytes[128 + i]),
            scales: std::array::from_fn(|i| bytes[192 + i] as i8),
            d: f16::from_le_bytes([bytes[208], bytes[209]]),
        }
    }

    fn write_to(&self, out: &mut [u8]) {
        out[..128].copy_from_slice(&self.ql);
        out[128..192].copy_from_slice(&self.qh);
        for (o, s) in out[192..208].iter_mut().zip(self.scales) {
            *o = s as u8;
        }
        out[208..Self::BYTES].copy_from_slice(&self.d.to_le_bytes());
    }

    fn non_finite(&self) -> Option<(&'static str, f16)> {
        (!self.d.is_finite()).then_some(("scale d", self.d))
    }

    fn dequantize_reference(&self, y: &mut [f32]) {
        // ggml's loop: two halves of 128 weights, four weights per l.
        let d = self.d.to_f32();
        for half in 0..2 {
            let (ql, qh) = (&self.ql[64 * half..], &self.qh[32 * half..]);
            let sc = &self.scales[8 * half..];
            let y = &mut y[128 * half..];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                y[l] = d * f32::from(sc[is]) * f32::from(q1);
                y[l + 32] = d * f32::from(sc[is + 2]) * f32::from(q2);
                y[l + 64] = d * f32::from(sc[is + 4]) * f32::from(q3);
                y[l + 96] = d * f32::from(sc[is + 6]) * f32::from(q4);
            }
        }
    }

    fn dequantize_fast(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        let scale: [f32; 16] = std::array::from_fn(|i| d * f32::from(self.scales[i]));
        let y: &mut [f32; QK_K] = (&mut y[..QK_K]).try_into().expect("256 values");
        // Quarter k of half h: 32 weights from nibble k / 2 of ql[64h + 32 (k % 2) ..] and
        // bits 2k..2k+2 of qh[32h..]; scales 16 apart.
        for (quarter, y) in y.as_chunks_mut::<32>().0.iter_mut().enumerate() {
            let (half, k) = (quarter / 4, quarter % 4);
            let ql = &self.ql[64 * half + 32 * (k % 2)..][..32];
            let qh = &self.qh[32 * half..][..32];
            let (nibble_shift, high_shift) = (4 * (k / 2) as u32, 2 * k as u32);
            let (s0, s1) = (scale[2 * quarter], scale[2 * quarter + 1]);
            for (l, out) in y.iter_mut().enumerate() {
                let low = (ql[l] >> nibble_shift) & 0xF;
                let high = (qh[l] >> high_shift) & 3;
                let q = f32::from(i16::from(low | (high << 4)) - 32);
                *out = if l < 16 { s0 } else { s1 } * q;
            }
        }
    }

    fn cost(blocks: usize) -> Cost {
        Cost {
            elements: blocks * QK_K,
            code_bytes: blocks * (QK_K / 2 + QK_K / 4),
            scale_bytes: blocks * 2,
            zero_point_bytes: 0,
            g_idx_bytes: 0,
            extra_bytes: blocks * QK_K / 16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_and_high_bits_come_from_separate_planes() {
        let mut block = BlockQ6K {
            ql: [0; 128],
            qh: [0xAA; 64], // high bits 2 everywhere: q = low + 32, signed code = low
            scales: [1; 16],
            d: f16::from_f32(0.5),
        };
        block.scales[6] = -2; // weights 96..112
        block.ql[1] = 0x73; // weight 1: low 3; weight 65: low 7
        block.ql[32 + 1] = 0x05; // weight 33: low 5; weight 97: low 0
        block.ql[64 + 32] = 0xF0; // second half, weight 128 + 96: low 15
        let mut y = [0f32; QK_K];
        block.dequantize_reference(&mut y);
        assert_eq!((y[1], y[65], y[33], y[97]), (1.5, 3.5, 2.5, 0.0));
        assert_eq!(y[128 + 96], 7.5);
        block.ql[32 + 1] = 0x15; // weight 97: low 1, scale -2
        block.dequantize_reference(&mut y);
        assert_eq!(y[97], -1.0);
        assert_eq!(BlockQ6K::cost(1).bits_per_element(), 6.5625);
    }
}
