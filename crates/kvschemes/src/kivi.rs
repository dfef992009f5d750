//! KIVI (Liu et al., 2024; github jy-yuan/KIVI at 876b4d2d): asymmetric 2- or 4-bit codes, keys
//! per channel and values per token, with a full-precision residual of the most recent tokens.
//!
//! Spec:
//! - The quantizer, `quant/new_pack.py` `triton_quantize_and_pack_along_last_dim` l.217-252,
//!   over groups of G = 32 values: mn and mx the group's minimum and maximum; `scale = (mx -
//!   mn) / (2^b - 1)` (l.238); `q = round_half_even(clamp((x - mn) / scale, 0, 2^b - 1))`
//!   (l.239-241); scale and mn stored in the model's dtype, fp16 (l.228-229). KIVI runs its model
//!   in fp16 (README l.82), so every one of those operations is an fp16 operation: here the
//!   input is rounded to f16 and each step computed in f32 and rounded to f16, which gives the
//!   correctly rounded fp16 result (f32 has more than twice f16's precision plus two bits).
//! - A constant group (mx = mn) divides 0 by 0 in KIVI, and the code is whatever its GPU's NaN
//!   conversion gives; every code decodes to mn there, so this module writes code 0.
//! - Dequantization, the CUDA kernel `quant/csrc/gemv_cuda.cu` l.323-329: `q * scale + mn` in
//!   f32 from the fp16 scale and mn.
//! - Packing, l.133-154: `32 / b` codes per int32 word, code i of a run at bits [i*b, (i+1)*b).
//!   Keys are packed transposed, so a word holds consecutive tokens of one channel; values hold
//!   consecutive channels of one token.
//! - The cache, `models/llama_kivi.py` (`LlamaFlashAttention_KIVI.forward` l.264-466), keys after
//!   RoPE, residual length R = 128 and G = 32 (`docs/long_bench.md` l.7 and l.30, the setting of
//!   the published LongBench tables):
//!   - keys leave the residual R tokens at a time (l.343-352): after L tokens the first
//!     floor(L / R) * R keys are quantized, per channel in groups of 32 tokens, and the last
//!     L mod R stay full precision;
//!   - values leave it one token at a time (l.386-391): the first max(0, L - R) are quantized,
//!     per token in groups of 32 channels, and the last min(L, R) stay full precision;
//!   - a decoding step appends its token to the residual before attention (l.333-337, l.377),
//!     so query i reads a cache in which the tokens before it hold the state after i tokens;
//!   - prefill quantizes the prompt's cache in the same proportions (l.425-452).
//! - Departures: the model here runs in f32, so the full-precision residual is f32 (4 bytes per
//!   value, billed as such) where KIVI's is fp16; and the codes come from the f32 model's K and
//!   V rounded to fp16, where KIVI's model computes them in fp16 throughout.
//! - Bytes: per quantized group, b * 32 / 8 bytes of codes (whole int32 words) plus 2 bytes of
//!   scale and 2 of mn (b + 1 bits per value at G = 32: 3.0 for KIVI-2, 5.0 for KIVI-4); per
//!   residual value, 4 bytes.

use half::f16;

/// Values per group.
pub const GROUP: usize = 32;
/// The full-precision residual length R.
pub const RESIDUAL: usize = 128;

/// One quantized group: its codes and its fp16 scale and minimum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Group {
    /// Codes, 0 to 2^b - 1, in group order.
    pub codes: [u8; GROUP],
    /// The fp16 scale.
    pub scale: f16,
    /// The fp16 minimum.
    pub min: f16,
}

/// An fp16 operation: the f32 result rounded to f16.
fn h(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

impl Group {
    /// KIVI's quantizer on 32 finite values at `bits` (2, 4 or 8).
    pub fn quantize(x: &[f32; GROUP], bits: u32) -> Group {
        let x = x.map(h);
        let mn = x.iter().copied().fold(f32::INFINITY, f32::min);
        let mx = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let levels = ((1u32 << bits) - 1) as f32;
        let scale = h(h(mx - mn) / levels);
        let codes = x.map(|v| {
            if scale == 0.0 {
                return 0;
            }
            let t = h(h(v - mn) / scale);
            t.clamp(0.0, levels).round_ties_even() as u8
        });
        Group {
            codes,
            scale: f16::from_f32(scale),
            min: f16::from_f32(mn),
        }
    }

    /// What the group decodes to: `q * scale + mn` in f32.
    pub fn dequantize(&self) -> [f32; GROUP] {
        let (scale, min) = (self.scale.to_f32(), self.min.to_f32());
        self.codes.map(|q| f32::from(q) * scale + min)
    }

    /// The group's codes packed as KIVI packs them: `32 / bits` per u32 word, least significant
    /// first.
    pub fn packed(&self, bits: u32) -> Vec<u32> {
        let per_word = (32 / bits) as usize;
        self.codes
            .chunks(per_word)
            .map(|run| {
                run.iter()
                    .enumerate()
                    .fold(0u32, |w, (i, &q)| w | (u32::from(q) << (i as u32 * bits)))
            })
            .collect()
    }
}

/// Keys quantized after `tokens` tokens: whole residuals of R.
pub fn quantized_keys(tokens: usize) -> usize {
    tokens / RESIDUAL * RESIDUAL
}

/// Values quantized after `tokens` tokens: all but the last R.
pub fn quantized_values(tokens: usize) -> usize {
    tokens.saturating_sub(RESIDUAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_min_max_rule_with_ties_to_even() {
        // 0, 1, ..., 31 at 4 bits: scale = 31 / 15 in fp16, (x - 0) / scale rounded half to even.
        let x: [f32; GROUP] = std::array::from_fn(|i| i as f32);
        let g = Group::quantize(&x, 4);
        assert_eq!(g.min.to_f32(), 0.0);
        assert_eq!(g.scale, f16::from_f32(31.0 / 15.0));
        assert_eq!(g.codes[0], 0);
        assert_eq!(g.codes[31], 15);
        let s = g.scale.to_f32();
        for (i, &q) in g.codes.iter().enumerate() {
            let exact = h(i as f32 / s);
            assert_eq!(q, exact.round_ties_even() as u8, "{i}");
        }
        // A constant group decodes to its value.
        let c = Group::quantize(&[1.5; GROUP], 2);
        assert_eq!(c.dequantize(), [1.5; GROUP]);
    }

    #[test]
    fn words_hold_consecutive_codes_least_significant_first() {
        let mut g = Group::quantize(&[0.0; GROUP], 2);
        g.codes = std::array::from_fn(|i| (i % 4) as u8);
        let words = g.packed(2);
        assert_eq!(words.len(), 2);
        assert_eq!(words[0] & 0b11, 0);
        assert_eq!((words[0] >> 2) & 0b11, 1);
        assert_eq!(words[0] >> 30, 3);
        assert_eq!(g.packed(4).len(), 4);
    }

    #[test]
    fn the_residual_holds_what_the_source_leaves_in_full_precision() {
        assert_eq!((quantized_keys(127), quantized_values(127)), (0, 0));
        assert_eq!((quantized_keys(128), quantized_values(128)), (128, 0));
        assert_eq!((quantized_keys(300), quantized_values(300)), (256, 172));
    }
}
