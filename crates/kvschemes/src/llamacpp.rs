//! llama.cpp's quantized KV-cache types (`-ctk` / `-ctv`): each token's K and V row quantized on
//! arrival in blocks of 32 along head_dim, with ggml's reference quantizers.
//!
//! Spec:
//! - What is stored (`ggml-cpu/ops.cpp` `ggml_compute_forward_set_rows_impl`, l.5092-5160 at
//!   ggml-org/ggml d99724f2): each token's row of `head_dim * kv_heads` values goes through the
//!   type's `from_float` in blocks of 32; with head_dim a multiple of 32 every block lies inside
//!   one head, so this module quantizes each head's row of one token on its own. A token's
//!   blocks depend on that token alone, so prefill, one-token decoding and any schedule store the
//!   same bytes.
//! - The block rules are `weights::gguf`'s, ported from `ggml-quants.c` (`quantize_row_*_ref`):
//!   q4_0, q4_1, q8_0 (byte-identical to gguf-py 0.19's `quants.quantize`), q5_0 and iq4_nl.
//!   Departure: on x86 with AVX, llama.cpp's CPU backend writes q8_0 with its SIMD quantizer
//!   (`127/amax` and round-half-even, `ggml-cpu/arch/x86/quants.c` l.333-343) rather than the
//!   reference; this module follows the reference, as gguf-py does.
//! - With `+rot` ([`crate::hadamard`]) the row is multiplied by the Walsh-Hadamard matrix before
//!   it is quantized, and the decoded row multiplied by it again, so attention reads it in the
//!   original basis.
//! - Bytes: the blocks, per token, per KV head, for K and for V: 18 (q4_0, iq4_nl), 20 (q4_1),
//!   22 (q5_0) or 34 (q8_0) bytes per 32 values. The rotation matrix is a constant of the
//!   model, not of the cache, and is not billed per token.

use std::fmt;

use weights::gguf::iq4_nl::BlockIq4Nl;
use weights::gguf::q4_1::BlockQ4_1;
use weights::gguf::q5_0::BlockQ5_0;
use weights::gguf::{BlockQ4_0, BlockQ8_0, GgufBlock};

/// One of llama.cpp's quantized cache types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CacheType {
    /// 4-bit codes, scale d = max / -8: 4.5 bits per value.
    Q4_0,
    /// 4-bit codes with a scale and a minimum: 5.0 bits per value.
    Q4_1,
    /// 5-bit codes, d = max / -16: 5.5 bits per value.
    Q5_0,
    /// int8 codes, d = amax / 127: 8.5 bits per value.
    Q8_0,
    /// 4-bit indices into a non-linear table, least-squares scale: 4.5 bits per value.
    Iq4Nl,
}

impl CacheType {
    /// Every type, in the order of the scheme list.
    pub const ALL: [CacheType; 5] = [
        CacheType::Q4_0,
        CacheType::Q4_1,
        CacheType::Q5_0,
        CacheType::Q8_0,
        CacheType::Iq4Nl,
    ];

    /// llama.cpp's name (`-ctk q4_0`).
    pub fn name(self) -> &'static str {
        match self {
            CacheType::Q4_0 => "q4_0",
            CacheType::Q4_1 => "q4_1",
            CacheType::Q5_0 => "q5_0",
            CacheType::Q8_0 => "q8_0",
            CacheType::Iq4Nl => "iq4_nl",
        }
    }

    /// Bytes per block of 32 values.
    pub fn block_bytes(self) -> usize {
        match self {
            CacheType::Q4_0 => BlockQ4_0::BYTES,
            CacheType::Q4_1 => BlockQ4_1::BYTES,
            CacheType::Q5_0 => BlockQ5_0::BYTES,
            CacheType::Q8_0 => BlockQ8_0::BYTES,
            CacheType::Iq4Nl => BlockIq4Nl::BYTES,
        }
    }

    /// Quantizes `row` (a multiple of 32 finite values) into `blocks` (its block bytes, appended)
    /// and writes what they decode to into `decoded`.
    pub fn quantize_row(self, row: &[f32], blocks: &mut Vec<u8>, decoded: &mut [f32]) {
        for (chunk, out) in row.chunks_exact(32).zip(decoded.chunks_exact_mut(32)) {
            let x: &[f32; 32] = chunk.try_into().expect("chunks of 32");
            let values = match self {
                CacheType::Q4_0 => {
                    let b = BlockQ4_0::quantize(x);
                    blocks.extend_from_slice(b.to_bytes().as_ref());
                    b.dequantize()
                }
                CacheType::Q8_0 => {
                    let b = BlockQ8_0::quantize(x);
                    blocks.extend_from_slice(b.to_bytes().as_ref());
                    b.dequantize()
                }
                CacheType::Q4_1 => {
                    let b = BlockQ4_1::quantize(x);
                    blocks.extend_from_slice(&b.to_bytes());
                    b.dequantize()
                }
                CacheType::Q5_0 => {
                    let b = BlockQ5_0::quantize(x);
                    blocks.extend_from_slice(&b.to_bytes());
                    b.dequantize()
                }
                CacheType::Iq4Nl => {
                    let b = BlockIq4Nl::quantize(x);
                    blocks.extend_from_slice(&b.to_bytes());
                    b.dequantize()
                }
            };
            out.copy_from_slice(&values);
        }
    }
}

impl fmt::Display for CacheType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_stores_its_block_bytes_and_decodes_near_its_input() {
        let row: Vec<f32> = (0..64)
            .map(|i| ((i * 29) % 17) as f32 / 4.0 - 2.0)
            .collect();
        for ty in CacheType::ALL {
            let mut blocks = Vec::new();
            let mut decoded = vec![0f32; 64];
            ty.quantize_row(&row, &mut blocks, &mut decoded);
            assert_eq!(blocks.len(), 2 * ty.block_bytes(), "{ty}");
            let worst = row
                .iter()
                .zip(&decoded)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 0.3, "{ty}: {worst}");
        }
    }
}
