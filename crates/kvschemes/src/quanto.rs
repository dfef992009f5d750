//! The Hugging Face `QuantizedCache` with its quanto backend (transformers 5.23.0
//! `cache_utils.py`; optimum-quanto @e33f8202), at its defaults: 2 or 4 bits, `q_group_size` 64,
//! `residual_length` R = 128, `axis_key` = `axis_value` = 0.
//!
//! Spec:
//! - Groups, `optimum/quanto/tensor/grouped.py` l.17-36: with axis 0 a group is 64 consecutive
//!   elements of the contiguous [batch, heads, tokens, head_dim] tensor: one token's vector of one
//!   head when head_dim is 64 (SmolLM2), so keys and values are both quantized per token along
//!   head_dim (the docstring's "per-channel" notwithstanding). Head sizes that are not a multiple
//!   of 64 are refused here (a group would span tokens).
//! - Scale and shift, `tensor/optimizers/max_optimizer.py` l.26-37: `scale = (max - min) /
//!   (2^b - 1)`, `shift = -min`, both in the input's dtype (f32 for this f32 model: 4 bytes each,
//!   billed so).
//! - Codes, `library/quantize.py` l.64-78: `clamp(round_half_even((x + shift) / scale), 0,
//!   2^b - 1)`; dequantization `tensor/qbits.py` l.42-45: `scale * q - shift`. A constant group
//!   divides 0 by 0 in quanto (its code is the platform's NaN conversion); every code decodes to
//!   the group's value, and this module writes 0.
//! - Storage, `tensor/packed.py` l.24-69: the codes of all groups of the cached tensor packed
//!   `8 / b` to a byte, planar (code rows `ceil(groups / (8 / b))` apart share a byte), so the
//!   packed tensor is `ceil(groups / (8 / b)) * 64` bytes.
//! - The cache, `cache_utils.py` `QuantizedLayer.update` l.781-822: the first call (the prefill)
//!   quantizes all its tokens at once and attends in full precision; each later token joins a
//!   full-precision residual and the step attends to the dequantized cache, the residual and the
//!   token; when the residual would reach R, everything (the dequantized cache, the residual and
//!   the token) is quantized again as one tensor and the residual emptied. Decoding from token 0,
//!   the flushes come after steps R, 2R, ...: query i >= 1 reads the first
//!   1 + R floor((i - 1) / R) tokens quantized, each re-quantized (quantize after dequantize) once
//!   per flush since its first.

/// Values per group.
pub const GROUP: usize = 64;
/// The residual length R.
pub const RESIDUAL: usize = 128;

/// One group's codes and its f32 scale and shift.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// Codes, 0 to 2^b - 1.
    pub codes: Vec<u8>,
    /// `(max - min) / (2^b - 1)`.
    pub scale: f32,
    /// `-min`.
    pub shift: f32,
}

impl Group {
    /// quanto's affine quantizer on a group of finite values at `bits` (2 or 4).
    pub fn quantize(x: &[f32], bits: u32) -> Group {
        let min = x.iter().copied().fold(f32::INFINITY, f32::min);
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let levels = ((1u32 << bits) - 1) as f32;
        let scale = (max - min) / levels;
        let shift = -min;
        let codes = x
            .iter()
            .map(|&v| {
                if scale == 0.0 {
                    return 0;
                }
                ((v + shift) / scale).round_ties_even().clamp(0.0, levels) as u8
            })
            .collect();
        Group {
            codes,
            scale,
            shift,
        }
    }

    /// What the group decodes to: `scale * q - shift` in f32.
    pub fn dequantize(&self) -> Vec<f32> {
        self.codes
            .iter()
            .map(|&q| self.scale * f32::from(q) - self.shift)
            .collect()
    }
}

/// Tokens quantized when query `query` reads the cache while decoding from token 0 (module
/// docs): none for the first (the prefill attends in full precision), then
/// 1 + floor((query - 1) / R) * R.
pub fn quantized_prefix(query: usize) -> usize {
    match query {
        0 => 0,
        i => 1 + (i - 1) / RESIDUAL * RESIDUAL,
    }
}

/// Flushes done before query `query` reads (the prefill's quantization counts as flush 0).
pub fn flushes_before(query: usize) -> usize {
    query.saturating_sub(1) / RESIDUAL
}

/// The flush that first quantizes token `token`.
pub fn first_flush(token: usize) -> usize {
    match token {
        0 => 0,
        j => (j - 1) / RESIDUAL + 1,
    }
}

/// Bytes of the packed codes of `groups` groups at `bits`.
pub fn packed_code_bytes(groups: usize, bits: u32) -> usize {
    groups.div_ceil((8 / bits) as usize) * GROUP
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_affine_rule_and_a_constant_group_decodes_to_itself() {
        let x: Vec<f32> = (0..64).map(|i| i as f32 * 0.5 - 3.0).collect();
        let g = Group::quantize(&x, 4);
        assert_eq!((g.scale, g.shift), (31.5 / 15.0, 3.0));
        assert_eq!((g.codes[0], g.codes[63]), (0, 15));
        assert_eq!(g.dequantize()[0], -3.0);
        let c = Group::quantize(&[0.75; 64], 2);
        assert_eq!(c.dequantize(), vec![0.75; 64]);
    }

    #[test]
    fn flushes_come_every_residual_after_the_prefill() {
        assert_eq!((quantized_prefix(0), quantized_prefix(1)), (0, 1));
        assert_eq!((quantized_prefix(128), quantized_prefix(129)), (1, 129));
        assert_eq!((flushes_before(128), flushes_before(129)), (0, 1));
        assert_eq!(
            (first_flush(0), first_flush(1), first_flush(128)),
            (0, 1, 1)
        );
        assert_eq!(first_flush(129), 2);
        assert_eq!(packed_code_bytes(3, 4), 128);
        assert_eq!(packed_code_bytes(4, 2), 64);
    }
}
