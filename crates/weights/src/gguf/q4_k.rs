//! GGUF Q4_K: super-blocks of 256 weights in 8 sub-blocks of 32, each sub-block with a 6-bit
//! scale and a 6-bit minimum, both scaled by the super-block's f16 `d` and `dmin`. Read only
//! (dequantization); [`scale_min`] is shared with Q5_K.
//!
//! Spec (ggml `ggml-common.h` `block_q4_K`, `ggml-quants.c` `get_scale_min_k4` and
//! `dequantize_row_q4_K`; gguf-py 0.19 `gguf/quants.py` `Q4_K.get_scale_min` and
//! `Q4_K.dequantize_blocks`, l.475-522):
//! - Super-block (144 bytes): f16 `d`, f16 `dmin` (little-endian), 12 bytes `scales`, then 128
//!   bytes `qs`.
//! - `scales` packs 8 six-bit scales `sc[j]` and 8 six-bit minimums `m[j]` (bit 7 is the high
//!   bit of each byte):
//!
//!   ```text
//!   byte 0..4   sc[j] in bits 0-5,  bits 4-5 of sc[j + 4] in bits 6-7      (j = 0..3)
//!   byte 4..8   m[j]  in bits 0-5,  bits 4-5 of m[j + 4]  in bits 6-7
//!   byte 8..12  bits 0-3 of sc[j + 4] in bits 0-3, bits 0-3 of m[j + 4] in bits 4-7
//!   ```
//! - Codes: the 256 weights are 4 chunks of 64; chunk c reads bytes `qs[32c .. 32c + 32]`, whose
//!   LOW nibbles are weights 64c .. 64c + 32 (sub-block 2c) and HIGH nibbles weights
//!   64c + 32 .. 64c + 64 (sub-block 2c + 1).
//! - Weight i of sub-block j = `(d * sc[j]) * q - (dmin * m[j])`, each product in f32. Both
//!   products are exact (an 11-bit f16 significand times a 6-bit integer, then times a 4-bit
//!   code), so the only rounding is the subtraction's, and C's contraction into an FMA cannot
//!   change a bit.
//! - Cost per super-block: 128 code bytes, 2 scale bytes (`d`), 2 zero-point bytes (`dmin`), 12
//!   extra bytes (the sub-block scales and minimums): 4.5 bits per weight.
//!
//! [`BlockQ4K::dequantize_reference`] is ggml's loop, element by element;
//! [`BlockQ4K::dequantize_fast`] unpacks whole sub-blocks into fixed-size arrays, which the
//! compiler vectorizes, and gives the same bits (tests).

use half::f16;

use super::stored::StoredBlock;
use crate::bpw::Cost;

/// Weights per k-quant super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;
/// Bytes of packed sub-block scales and minimums in Q4_K and Q5_K (ggml's `K_SCALE_SIZE`).
pub const K_SCALE_SIZE: usize = 12;

/// ggml's `get_scale_min_k4`: sub-block `j`'s 6-bit scale and 6-bit minimum, `j` in 0..8.
pub fn scale_min(j: usize, scales: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// The eight sub-blocks' `d * sc[j]` and `dmin * m[j]`, in f32 (exact products).
pub(super) fn sub_block_scales(
    d: f16,
    dmin: f16,
    scales: &[u8; K_SCALE_SIZE],
) -> ([f32; 8], [f32; 8]) {
    let (d, dmin) = (d.to_f32(), dmin.to_f32());
    let mut dl = [0f32; 8];
    let mut ml = [0f32; 8];
    for j in 0..8 {
        let (sc, m) = scale_min(j, scales);
        dl[j] = d * f32::from(sc);
        ml[j] = dmin * f32::from(m);
    }
    (dl, ml)
}

/// One Q4_K super-block, laid out as ggml's `block_q4_K`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ4K {
    /// Super-block scale of the sub-block scales.
    pub d: f16,
    /// Super-block scale of the sub-block minimums.
    pub dmin: f16,
    /// Packed 6-bit scales and minimums (see the module spec).
    pub scales: [u8; K_SCALE_SIZE],
    /// 4-bit codes, two per byte (see the module spec).
    pub qs: [u8; QK_K / 2],
}

impl StoredBlock for BlockQ4K {
    const NAME: &'static str = "Q4_K";
    const BYTES: usize = 144;
    const VALUES: usize = QK_K;

    fn read_from(bytes: &[u8]) -> Self {
        BlockQ4K {
            d: f16::from_le_bytes([bytes[0], bytes[1]]),
            dmin: f16::from_le_bytes([bytes[2], bytes[3]]),
            scales: std::array::from_fn(|i| bytes[4 + i]),
            qs: std::array::from_fn(|i| bytes[16 + i]),
        }
    }

    fn write_to(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.dmin.to_le_bytes());
        out[4..16].copy_from_slice(&self.scales);
        out[16..Self::BYTES].copy_from_slice(&self.qs);
    }

    fn non_finite(&self) -> Option<(&'static str, f16)> {
        [("scale d", self.d), ("minimum scale dmin", self.dmin)]
            .into_iter()
            .find(|(_, v)| !v.is_finite())
    }

    fn dequantize_reference(&self, y: &mut [f32]) {
        // ggml's loop: 64 weights per step, two sub-blocks sharing 32 code bytes.
        let (d, min) = (self.d.to_f32(), self.dmin.to_f32());
        let mut is = 0;
        for (step, q) in self.qs.chunks_exact(32).enumerate() {
            let (sc, m) = scale_min(is, &self.scales);
            let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
            let (sc, m) = scale_min(is + 1, &self.scales);
            let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
            let y = &mut y[64 * step..];
            for l in 0..32 {
                y[l] = d1 * f32::from(q[l] & 0xF) - m1;
            }
            for l in 0..32 {
                y[32 + l] = d2 * f32::from(q[l] >> 4) - m2;
            }
            is += 2;
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
            let (d1, m1, d2, m2) = (dl[2 * c], ml[2 * c], dl[2 * c + 1], ml[2 * c + 1]);
            for ((lo, hi), &byte) in low.iter_mut().zip(high.iter_mut()).zip(q) {
                *lo = d1 * f32::from(byte & 0xF) - m1;
                *hi = d2 * f32::from(byte >> 4) - m2;
            }
        }
    }

    fn cost(blocks: usize) -> Cost {
        Cost {
            elements: blocks * QK_K,
            code_bytes: blocks * QK_K / 2,
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

    /// Packs eight 6-bit scales and minimums as the module spec lays them out.
    fn pack_scales(sc: [u8; 8], m: [u8; 8]) -> [u8; K_SCALE_SIZE] {
        let mut out = [0u8; K_SCALE_SIZE];
        for j in 0..4 {
            out[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            out[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
            out[j + 8] = (sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4);
        }
        out
    }

    #[test]
    fn six_bit_scales_and_minimums_unpack_from_their_three_places() {
        let sc = [1, 2, 3, 63, 17, 32, 48, 63];
        let m = [63, 0, 5, 40, 33, 1, 62, 16];
        let packed = pack_scales(sc, m);
        for j in 0..8 {
            assert_eq!(scale_min(j, &packed), (sc[j], m[j]), "sub-block {j}");
        }
    }

    #[test]
    fn low_nibbles_are_the_first_half_of_each_64_weight_chunk() {
        let mut qs = [0u8; 128];
        qs[0] = 0x52; // weight 0 has code 2, weight 32 code 5
        qs[32] = 0xF1; // weight 64 has code 1, weight 96 code 15
        let block = BlockQ4K {
            d: f16::from_f32(0.5),
            dmin: f16::from_f32(0.25),
            scales: pack_scales([2, 4, 1, 1, 1, 1, 1, 1], [1, 2, 3, 0, 0, 0, 0, 0]),
            qs,
        };
        let mut y = [0f32; QK_K];
        block.dequantize_reference(&mut y);
        assert_eq!(y[0], 0.5 * 2.0 * 2.0 - 0.25); // sub-block 0: scale 2, min 1
        assert_eq!(y[32], 0.5 * 4.0 * 5.0 - 0.5); // sub-block 1: scale 4, min 2
        assert_eq!(y[64], 0.5 * 1.0 - 0.75); // sub-block 2
        assert_eq!(y[96], 0.5 * 15.0); // sub-block 3: min 0
        assert_eq!(y[1], -0.25);
        assert_eq!(BlockQ4K::cost(1).bits_per_element(), 4.5);
    }
}
