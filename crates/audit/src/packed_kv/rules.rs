//! The quantization rule, written from the evidence format's spec: the scale and zero point of a
//! group, and the code of an element. The audit holds every stored scale, zero point and code to
//! it exactly, not only to the `scale / 2` bound it implies.
//!
//! All arithmetic in f32, as the spec states it; L = 2^b - 1.
//! - Symmetric (qmax = 2^(b-1) - 1): scale = max|x| / qmax, or 1.0 when that is 0; stored code
//!   = clamp(round_half_even(x / scale), -qmax, qmax) + qmax.
//! - Asymmetric: lo = min(min x, 0), hi = max(max x, 0); scale = (hi - lo) / L, or 1.0 with zero
//!   point 0 when that is 0; zero = clamp(round_half_even(-lo / scale), 0, L); code =
//!   clamp(round_half_even(x / scale) + zero, 0, L).

use crate::packed_kv::protocol::Mode;

/// A group's scale and offset (qmax when symmetric, the zero point when asymmetric).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupRule {
    /// The scale.
    pub scale: f32,
    /// The offset subtracted from codes when decoding.
    pub offset: u8,
}

/// The largest stored code of a width and mode: 2 * qmax, or L.
pub fn max_code(mode: Mode, bits: u32) -> u8 {
    let all_ones = ((1u16 << bits) - 1) as u8;
    match mode {
        Mode::Symmetric => all_ones - 1,
        Mode::Asymmetric => all_ones,
    }
}

/// qmax = 2^(b-1) - 1.
pub fn qmax(bits: u32) -> u8 {
    ((1u16 << (bits - 1)) - 1) as u8
}

/// The scale and offset the rule gives a group whose smallest and largest values, each widened
/// to contain 0, are `lo <= 0 <= hi`.
pub fn group_rule(mode: Mode, bits: u32, lo: f32, hi: f32) -> GroupRule {
    match mode {
        Mode::Symmetric => {
            let q = qmax(bits);
            let scale = (-lo).max(hi) / f32::from(q);
            GroupRule {
                scale: if scale == 0.0 { 1.0 } else { scale },
                offset: q,
            }
        }
        Mode::Asymmetric => {
            let levels = f32::from(max_code(mode, bits));
            let scale = (hi - lo) / levels;
            if scale == 0.0 {
                return GroupRule {
                    scale: 1.0,
                    offset: 0,
                };
            }
            let zero = (-lo / scale).round_ties_even().clamp(0.0, levels);
            GroupRule {
                scale,
                offset: zero as u8,
            }
        }
    }
}

/// The stored code the rule gives `x` in a group of `scale` and `offset`.
pub fn code(mode: Mode, bits: u32, x: f32, scale: f32, offset: u8) -> u8 {
    let rounded = (x / scale).round_ties_even();
    match mode {
        Mode::Symmetric => {
            let q = f32::from(qmax(bits));
            (rounded.clamp(-q, q) + q) as u8
        }
        Mode::Asymmetric => {
            let levels = f32::from(max_code(mode, bits));
            (rounded + f32::from(offset)).clamp(0.0, levels) as u8
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symmetric_ties_round_to_even_codes() {
        // Scale 1 at 4 bits: 2.5 -> 2, 3.5 -> 4, -2.5 -> -2; stored offset by 7.
        let rule = group_rule(Mode::Symmetric, 4, -7.0, 7.0);
        assert_eq!(
            rule,
            GroupRule {
                scale: 1.0,
                offset: 7
            }
        );
        let codes: Vec<u8> = [2.5f32, 3.5, -2.5, 7.0, -7.0]
            .iter()
            .map(|&x| code(Mode::Symmetric, 4, x, 1.0, 7))
            .collect();
        assert_eq!(codes, vec![9, 11, 5, 14, 0]);
    }

    #[test]
    fn asymmetric_zero_points_and_clamps() {
        // Range [-1, 2] at 2 bits: scale 1, zero round(1) = 1; 2 -> 3, -1 -> 0, 5 clamps to 3.
        let rule = group_rule(Mode::Asymmetric, 2, -1.0, 2.0);
        assert_eq!(
            rule,
            GroupRule {
                scale: 1.0,
                offset: 1
            }
        );
        let codes: Vec<u8> = [2.0f32, -1.0, 5.0, 0.0]
            .iter()
            .map(|&x| code(Mode::Asymmetric, 2, x, 1.0, 1))
            .collect();
        assert_eq!(codes, vec![3, 0, 3, 1]);
        assert_eq!(
            group_rule(Mode::Asymmetric, 3, 0.0, 0.0),
            GroupRule {
                scale: 1.0,
                offset: 0
            }
        );
    }
}
