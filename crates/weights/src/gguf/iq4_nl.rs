//! GGUF IQ4_NL: blocks of 32 values, an f16 scale and 4-bit indices into a fixed non-linear table
//! of 16 int8 levels, with the reference quantizer llama.cpp's KV cache writes. Used as a
//! KV-cache type (`llama.cpp -ctk iq4_nl`, crates/kvschemes).
//!
//! Spec (ggml-org/ggml d99724f2: `ggml-common.h` l.447-452 `block_iq4_nl` and l.1120-1122
//! `kvalues_iq4nl`; `ggml-quants.c` l.5100-5113 `quantize_row_iq4_nl_ref`, which calls
//! `quantize_row_iq4_nl_impl` (l.4966-5075) with no importance weights and `ntry = -1`):
//! - Block (18 bytes): f16 `d`, then 16 bytes `qs`: byte j holds index j in its LOW nibble and
//!   index j + 16 in its HIGH nibble. Value = d * `LEVELS[q]`.
//! - Quantizer: weights w = x^2; `max` the element of largest magnitude with its sign (first on
//!   ties); a block with |max| < 1e-15 stores d = 0; otherwise d0 = max / -127, id = 1/d0, and
//!   each q is the level nearest to x * id (`best_index_int8`: 0 at or below the first level, 15
//!   at or above the last, otherwise binary search, an exact midpoint to the upper level). The
//!   stored d is then the weighted least-squares fit sum(w q_v x) / sum(w q_v^2) over the chosen
//!   levels q_v (0 when the denominator is 0), each sum in f32 from 0 in element order of the
//!   products `(w * q_v) * x` and `(w * q_v) * q_v`, as ggml writes them, the quotient rounded
//!   to f16; the indices are not re-chosen
//!   (with `ntry = -1` the search loop and the re-assignment never run).
//! - Departure: for a block with |max| < 1e-15 ggml writes d = 0 and leaves the indices
//!   unwritten (they are whatever its buffer held, the previous block's for a row); this module
//!   writes index 8 (level 1, the nearest to 0) there, so the bytes are a function of the block.
//!   Every value such a block stands for is 0 either way.
//!
//! gguf-py 0.19 has no IQ4_NL quantizer (its `IQ4_NL` class only dequantizes), so these bytes
//! are checked against the C rule written out above and gguf-py's dequantization.

use half::f16;

/// The 16 levels (ggml's `kvalues_iq4nl`).
pub const LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// ggml's `GROUP_MAX_EPS`: below it a block is stored as zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// One IQ4_NL block, laid out as ggml's `block_iq4_nl`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockIq4Nl {
    /// Scale.
    pub d: f16,
    /// Indices: byte j = index j (low) | index j + 16 (high).
    pub qs: [u8; 16],
}

/// ggml's `best_index_int8` over [`LEVELS`].
fn best_index(x: f32) -> u8 {
    let level = |i: usize| f32::from(LEVELS[i]);
    if x <= level(0) {
        return 0;
    }
    if x >= level(15) {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < level(mav) { mu = mav } else { ml = mav }
    }
    if x - level(mu - 1) < level(mu) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

impl BlockIq4Nl {
    /// Bytes per block.
    pub const BYTES: usize = 18;

    /// The reference quantizer for one block of 32 finite values (see the module spec).
    pub fn quantize(x: &[f32; 32]) -> Self {
        let (amax, max) = super::signed_max(x);
        if amax < GROUP_MAX_EPS {
            return Self::from_parts(f16::ZERO, &[8; 32]);
        }
        let d = max / f32::from(LEVELS[0]);
        let id = 1.0 / d;
        let mut codes = [0u8; 32];
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for (j, &v) in x.iter().enumerate() {
            let l = best_index(id * v);
            codes[j] = l;
            let q = f32::from(LEVELS[usize::from(l)]);
            let w = v * v;
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        let d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        Self::from_parts(f16::from_f32(d), &codes)
    }

    /// The block with scale `d` and these indices (each masked to 4 bits).
    pub fn from_parts(d: f16, codes: &[u8; 32]) -> Self {
        BlockIq4Nl {
            d,
            qs: std::array::from_fn(|j| (codes[j] & 0x0F) | (codes[j + 16] << 4)),
        }
    }

    /// The indices, element order.
    pub fn codes(&self) -> [u8; 32] {
        std::array::from_fn(|i| {
            let byte = self.qs[i % 16];
            if i < 16 { byte & 0x0F } else { byte >> 4 }
        })
    }

    /// ggml's dequantization: `d * LEVELS[q]` in f32.
    pub fn dequantize(&self) -> [f32; 32] {
        let d = self.d.to_f32();
        self.codes().map(|q| d * f32::from(LEVELS[usize::from(q)]))
    }

    /// The block's bytes.
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..].copy_from_slice(&self.qs);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_level_is_chosen_and_a_midpoint_goes_up() {
        assert_eq!(best_index(-200.0), 0);
        assert_eq!(best_index(500.0), 15);
        assert_eq!(best_index(1.0), 8);
        assert_eq!(best_index(7.0), 9); // midpoint of 1 and 13
        assert_eq!(best_index(6.9), 8);
        assert_eq!(best_index(-115.5), 1); // midpoint of -127 and -104
    }

    #[test]
    fn the_stored_scale_is_the_least_squares_fit_of_the_chosen_levels() {
        let x: [f32; 32] = std::array::from_fn(|i| (i as f32 - 15.5) / 4.0);
        let block = BlockIq4Nl::quantize(&x);
        let codes = block.codes();
        let (mut num, mut den) = (0f32, 0f32);
        for (v, q) in x.iter().zip(codes) {
            let level = f32::from(LEVELS[usize::from(q)]);
            num += v * v * level * v;
            den += v * v * level * level;
        }
        assert_eq!(block.d, f16::from_f32(num / den));
        // The first element is the largest magnitude: level -127 at d0 = max / -127.
        assert_eq!(codes[0], 0);
        let zero = BlockIq4Nl::quantize(&[0.0; 32]);
        assert_eq!(zero.dequantize(), [0.0; 32]);
    }
}
