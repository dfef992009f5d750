//! GGUF Q4_1: blocks of 32 weights with an f16 scale and an f16 minimum, and ggml's reference
//! quantizer for them.
//!
//! Spec:
//! - Container: as Q4_0 (see [`super`]): `rows * cols / 32` blocks in row-major order, `cols` a
//!   multiple of 32.
//! - Block (20 bytes): f16 `d`, f16 `m` (both little-endian), then 16 bytes `qs` where byte j
//!   holds element j in its LOW nibble and element j + 16 in its HIGH nibble.
//!   Weight = f32(d) * q + f32(m), as ggml's `dequantize_row_q4_1` and gguf-py's
//!   `dequantize_blocks` compute it. The product is exact in f32 (a 4-bit code times an 11-bit
//!   f16 significand), so whether C contracts it into an FMA cannot change a bit.
//! - Quantizer (`quantize_row_q4_1_ref`): min and max of the block; d = (max - min) / 15 in f32;
//!   id = 1/d from the f32 d (0 when d is 0); q = min(15, trunc((x - min) * id + 0.5)) with the
//!   f32 min. `d` and `m = min` are stored rounded to f16 (nearest even); dequantization uses the
//!   rounded values, so an extreme of the block need not come back exactly.
//! - Refusals (where this module departs from ggml, which stores such blocks silently):
//!   [`quantize`] refuses non-finite input; a block whose `d` rounds to infinity in f16 (a range
//!   max - min of about 9.8e5 and more; [`FormatError::ScaleRoundsToInfinity`]); a block whose
//!   `d` rounds to 0 in f16 although its values differ (a range of at most about 4.5e-7, so every
//!   weight would come back as `m`; [`FormatError::RangeScaleRoundsToZero`]); and a block whose
//!   `m` rounds to infinity (a minimum of magnitude 65520 and more;
//!   [`FormatError::MinRoundsToInfinity`]). A constant block (d = 0) is kept: every weight is
//!   `m`. Subnormal f16 values of d or m are kept, as ggml keeps them. Every other block is
//!   byte-identical to ggml's and gguf-py's. [`from_bytes`] refuses stored blocks whose `d` or
//!   `m` is not finite.
//!
//! Q4_1 is not a [`crate::WeightFormat`] and has no logical form: its zero point `-m / d` is a
//! float, which the logical matrix's integer zero points cannot hold exactly. It has no fast
//! kernel either; these functions are the reference.
//!
//! Ported from ggml (names kept): `quantize_row_q4_1_ref` and `dequantize_row_q4_1` in
//! <https://github.com/ggml-org/llama.cpp/blob/36491e4024b3016e6e2d21afc140add042b44bec/ggml/src/ggml-quants.c>;
//! gguf-py 0.19's `gguf.quants.Q4_1` writes the same bytes (conformance tests).

use half::f16;

use crate::bpw::Cost;
use crate::error::{FormatError, Result, ScaledBlock};

/// Weights per Q4_1 block.
pub const QK4_1: usize = 32;
/// The format's name in messages.
pub const NAME: &str = "Q4_1";

/// One Q4_1 block, laid out as ggml's `block_q4_1`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ4_1 {
    /// Delta (scale).
    pub d: f16,
    /// Minimum: the weight of code 0.
    pub m: f16,
    /// Nibbles: byte j = element j (low) | element j + 16 (high).
    pub qs: [u8; QK4_1 / 2],
}

impl BlockQ4_1 {
    /// Bytes per block on disk.
    pub const BYTES: usize = 20;

    /// ggml's f32 `d` and min for one block, before they are rounded to f16.
    pub fn scale_and_min(x: &[f32; 32]) -> (f32, f32) {
        // ggml starts from FLT_MAX / -FLT_MAX and compares with `<` / `>`; the same for finite x.
        let min = x
            .iter()
            .copied()
            .fold(f32::MAX, |m, v| if v < m { v } else { m });
        let max = x
            .iter()
            .copied()
            .fold(-f32::MAX, |m, v| if v > m { v } else { m });
        ((max - min) / 15.0, min)
    }

    /// ggml's reference quantizer for one block of 32 finite values, bit for bit, including
    /// blocks whose `d` or `m` f16 cannot hold (which [`quantize`] refuses).
    pub fn quantize(x: &[f32; 32]) -> Self {
        let (d, min) = Self::scale_and_min(x);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        // ggml: MIN(15, (int8_t)(x0 + 0.5f)); the cast truncates toward zero. `as` saturates
        // (and maps NaN to 0) where C's cast would be undefined, for refused blocks only.
        let codes = x.map(|v| (((v - min) * id + 0.5).trunc() as i8).clamp(0, 15) as u8);
        Self::from_parts(f16::from_f32(d), f16::from_f32(min), &codes)
    }

    /// ggml's dequantization of one block: `q * d + m` in f32.
    pub fn dequantize(&self) -> [f32; 32] {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        self.codes().map(|q| f32::from(q) * d + m)
    }

    /// The 4-bit codes, element order.
    pub fn codes(&self) -> [u8; 32] {
        std::array::from_fn(|i| {
            let byte = self.qs[i % 16];
            if i < 16 { byte & 0x0F } else { byte >> 4 }
        })
    }

    /// The block with scale `d`, minimum `m` and these codes (each masked to 4 bits).
    pub fn from_parts(d: f16, m: f16, codes: &[u8; 32]) -> Self {
        BlockQ4_1 {
            d,
            m,
            qs: std::array::from_fn(|j| (codes[j] & 0x0F) | (codes[j + 16] << 4)),
        }
    }

    /// The block's bytes as GGUF stores them.
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.m.to_le_bytes());
        out[4..].copy_from_slice(&self.qs);
        out
    }

    /// The block that GGUF bytes hold.
    pub fn read_from(bytes: &[u8; Self::BYTES]) -> Self {
        BlockQ4_1 {
            d: f16::from_le_bytes([bytes[0], bytes[1]]),
            m: f16::from_le_bytes([bytes[2], bytes[3]]),
            qs: std::array::from_fn(|i| bytes[4 + i]),
        }
    }
}

/// Quantizes a row-major `rows` x `cols` matrix row by row; `cols` must be a multiple of 32.
/// Refuses non-finite values and blocks whose `d` or `m` f16 cannot hold (see the module spec),
/// naming the first.
pub fn quantize(x: &[f32], cols: usize) -> Result<Vec<BlockQ4_1>> {
    check_row_length(x.len(), cols)?;
    if let Some((index, &value)) = x.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(FormatError::NonFinite {
            row: index / cols,
            col: index % cols,
            value,
        });
    }
    x.chunks_exact(32)
        .enumerate()
        .map(|(index, values)| {
            let values: &[f32; 32] = values.try_into().expect("chunks of 32");
            let block = BlockQ4_1::quantize(values);
            check_block(index, cols, values, &block)?;
            Ok(block)
        })
        .collect()
}

/// Refuses a block whose f16 `d` is infinite, or 0 for values that differ, or whose f16 `m` is
/// infinite.
fn check_block(index: usize, cols: usize, x: &[f32; 32], block: &BlockQ4_1) -> Result<()> {
    let low = x.iter().copied().fold(f32::INFINITY, f32::min);
    let high = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let d_infinite = !block.d.is_finite();
    let d_zero = block.d.to_f32() == 0.0 && low != high;
    let m_infinite = !block.m.is_finite();
    if !d_infinite && !d_zero && !m_infinite {
        return Ok(());
    }
    let start = index * 32 % cols;
    let scaled = ScaledBlock {
        format: NAME,
        block: index,
        row: index * 32 / cols,
        start,
        end: start + 32,
        low,
        high,
        scale: BlockQ4_1::scale_and_min(x).0,
    };
    Err(if d_infinite {
        FormatError::ScaleRoundsToInfinity(scaled)
    } else if d_zero {
        FormatError::RangeScaleRoundsToZero(scaled)
    } else {
        FormatError::MinRoundsToInfinity(scaled)
    })
}

/// Dequantizes blocks back to the row-major values.
pub fn dequantize(blocks: &[BlockQ4_1]) -> Vec<f32> {
    blocks.iter().flat_map(|b| b.dequantize()).collect()
}

/// [`dequantize`] into `out`, which must hold 32 values per block.
pub fn dequantize_into(blocks: &[BlockQ4_1], out: &mut [f32]) -> Result<()> {
    if out.len() != blocks.len() * 32 {
        return Err(FormatError::ShapeMismatch {
            format: NAME,
            tensor: "dequantized output",
            found: vec![out.len()],
            expected: vec![blocks.len() * 32],
            why: format!("32 values for each of {} blocks", blocks.len()),
        });
    }
    for (block, values) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        values.copy_from_slice(&block.dequantize());
    }
    Ok(())
}

/// The bytes a GGUF file stores for these blocks.
pub fn to_bytes(blocks: &[BlockQ4_1]) -> Vec<u8> {
    blocks.iter().flat_map(|b| b.to_bytes()).collect()
}

/// Blocks from stored bytes; the length must be a whole number of blocks, and every block's
/// `d` and `m` finite.
pub fn from_bytes(bytes: &[u8]) -> Result<Vec<BlockQ4_1>> {
    if !bytes.len().is_multiple_of(BlockQ4_1::BYTES) {
        return Err(FormatError::PartialBlock {
            format: NAME,
            found: bytes.len(),
            block_bytes: BlockQ4_1::BYTES,
        });
    }
    let blocks: Vec<BlockQ4_1> = bytes
        .chunks_exact(BlockQ4_1::BYTES)
        .map(|chunk| BlockQ4_1::read_from(chunk.try_into().expect("chunks of 20")))
        .collect();
    for (block, b) in blocks.iter().enumerate() {
        for (what, value) in [("scale d", b.d), ("minimum m", b.m)] {
            if !value.is_finite() {
                return Err(FormatError::NonFiniteScale {
                    format: NAME,
                    what,
                    block,
                    value: value.to_f32(),
                });
            }
        }
    }
    Ok(blocks)
}

/// What `blocks` blocks store: codes, the f16 scale, and the f16 minimum (counted as the zero
/// point).
pub fn storage(blocks: usize) -> Cost {
    Cost {
        elements: blocks * 32,
        code_bytes: blocks * 16,
        scale_bytes: blocks * 2,
        zero_point_bytes: blocks * 2,
        g_idx_bytes: 0,
        extra_bytes: 0,
    }
}

/// `cols` must be a positive multiple of 32, and `len` values whole rows of it.
fn check_row_length(len: usize, cols: usize) -> Result<()> {
    if cols == 0 || !cols.is_multiple_of(32) {
        return Err(FormatError::RowLength { format: NAME, cols });
    }
    if !len.is_multiple_of(cols) {
        return Err(FormatError::NotWholeRows { len, cols });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any bits at all (NaN and infinities included) give blocks or a typed error, never a
        /// panic; accepted blocks survive their bytes.
        #[test]
        fn arbitrary_values_never_panic(bits in prop::collection::vec(any::<u32>(), 64)) {
            let x: Vec<f32> = bits.into_iter().map(f32::from_bits).collect();
            if let Ok(blocks) = quantize(&x, 32) {
                prop_assert_eq!(from_bytes(&to_bytes(&blocks)).unwrap(), blocks);
            }
        }

        /// Each weight comes back within half a step of its value, plus what rounding d and
        /// the minimum to f16 moved (and an ulp or two of f32 arithmetic).
        #[test]
        fn weights_come_back_within_half_a_step(x in prop::collection::vec(-1000f32..1000.0, 32)) {
            let block = quantize(&x, 32).unwrap()[0];
            let (d, min) = BlockQ4_1::scale_and_min(x.as_slice().try_into().unwrap());
            let (d16, m16) = (block.d.to_f32(), block.m.to_f32());
            let bound = 0.5 * d * (1.0 + 1e-5) + 15.0 * (d16 - d).abs() + (m16 - min).abs();
            for (v, w) in x.iter().zip(block.dequantize()) {
                prop_assert!((w - v).abs() <= bound + 4.0 * f32::EPSILON * v.abs().max(w.abs()),
                    "{} came back as {} (d {}, min {})", v, w, d, min);
            }
        }
    }

    #[test]
    fn byte_j_holds_elements_j_and_j_plus_16_after_d_and_m() {
        let codes: [u8; 32] = std::array::from_fn(|i| if i < 16 { 1 } else { 2 });
        let block = BlockQ4_1::from_parts(f16::ONE, f16::from_f32(-2.0), &codes);
        let bytes = block.to_bytes();
        assert_eq!(bytes[..4], [0x00, 0x3C, 0x00, 0xC0]); // 1.0 and -2.0 in f16
        assert_eq!(bytes[4..], [0x21; 16]);
        assert_eq!(BlockQ4_1::read_from(&bytes), block);
        assert_eq!(block.dequantize()[0], -1.0);
        assert_eq!(block.dequantize()[16], 0.0);
    }

    #[test]
    fn the_scale_spans_min_to_max_and_codes_round_half_up() {
        // Ramp 0..31: min 0, max 31, d = 31/15.
        let x: [f32; 32] = std::array::from_fn(|i| i as f32);
        let block = BlockQ4_1::quantize(&x);
        assert_eq!(block.d, f16::from_f32(31.0 / 15.0));
        assert_eq!(block.m, f16::ZERO);
        let codes = block.codes();
        assert_eq!((codes[0], codes[31]), (0, 15));
        // 1 * 15/31 + 0.5 = 0.98: code 0; 2 * 15/31 + 0.5 = 1.47: code 1.
        assert_eq!((codes[1], codes[2]), (0, 1));
        // A constant block: d = 0, every code 0, every weight m.
        let block = BlockQ4_1::quantize(&[-3.25; 32]);
        assert_eq!((block.d, block.codes()), (f16::ZERO, [0; 32]));
        assert_eq!(block.dequantize(), [-3.25; 32]);
    }

    #[test]
    fn dequantization_uses_the_f16_rounded_d_and_m() {
        let mut x = [0.1f32; 32];
        x[0] = 0.1;
        x[1] = 1.7;
        let block = BlockQ4_1::quantize(&x);
        let m = f16::from_f32(0.1).to_f32();
        assert_ne!(m, 0.1);
        assert_eq!(block.dequantize()[0], m); // code 0 comes back as the rounded minimum
        assert_eq!(block.dequantize()[1], 15.0 * block.d.to_f32() + m);
    }

    #[test]
    fn blocks_f16_cannot_hold_are_refused_and_named() {
        let ramp =
            |low: f32, step: f32| -> Vec<f32> { (0..32).map(|i| low + i as f32 * step).collect() };
        // Range 31 * 4e4 = 1.24e6: d = 82667 rounds to infinity.
        let err = quantize(&ramp(0.0, 4e4), 32).unwrap_err();
        assert!(
            matches!(&err, FormatError::ScaleRoundsToInfinity(b) if b.format == "Q4_1"),
            "{err}"
        );
        // Range 31e-9: d = 2e-9 rounds to 0, and the values differ.
        let err = quantize(&ramp(1.0, 1e-9), 32);
        assert!(err.is_ok(), "1 + 1e-9 is 1 in f32: a constant block");
        let err = quantize(&ramp(0.0, 1e-9), 32).unwrap_err();
        assert!(
            matches!(&err, FormatError::RangeScaleRoundsToZero(b) if b.block == 0),
            "{err}"
        );
        assert!(
            err.to_string().contains("dequantize to its minimum"),
            "{err}"
        );
        // Minimum -7e4: m rounds to -infinity although d (about 4.3) is fine; second row named.
        let mut x = vec![0.5f32; 64];
        x[32..].copy_from_slice(&ramp(-7e4, 2.0));
        let err = quantize(&x, 32).unwrap_err();
        assert!(
            matches!(&err, FormatError::MinRoundsToInfinity(b) if (b.row, b.low) == (1, -7e4)),
            "{err}"
        );
        // Non-finite input names its place.
        let mut x = vec![0.5f32; 64];
        x[33] = f32::INFINITY;
        assert!(matches!(
            quantize(&x, 32),
            Err(FormatError::NonFinite { row: 1, col: 1, .. })
        ));
    }

    #[test]
    fn stored_bytes_round_trip_and_bad_ones_are_refused() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let blocks = quantize(&x, 64).unwrap();
        let mut bytes = to_bytes(&blocks);
        assert_eq!(bytes.len(), 40);
        assert_eq!(from_bytes(&bytes).unwrap(), blocks);
        assert!(matches!(
            from_bytes(&bytes[..39]),
            Err(FormatError::PartialBlock { .. })
        ));
        bytes[22..24].copy_from_slice(&f16::NAN.to_le_bytes());
        assert!(matches!(
            from_bytes(&bytes),
            Err(FormatError::NonFiniteScale {
                what: "minimum m",
                block: 1,
                ..
            })
        ));
        assert!(matches!(
            quantize(&x, 48),
            Err(FormatError::RowLength { cols: 48, .. })
        ));
        let mut out = vec![0f32; 63];
        assert!(dequantize_into(&blocks, &mut out).is_err());
        assert_eq!(storage(2).code_bytes + storage(2).metadata_bytes(), 40);
    }
}
