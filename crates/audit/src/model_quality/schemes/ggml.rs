//! llama.cpp's quantized KV-cache types (`-ctk/-ctv TYPE`) as the audit reads them: ggml's
//! reference block quantizers and their dequantization to f32, and the cache that stores every
//! token's row in those blocks (with `+rot`, rotated first: [`super::hadamard`]).
//!
//! Spec, from ggml-org/ggml d99724f2 `src/ggml-quants.c` (the functions are byte-identical to
//! llama.cpp's `ggml/src/ggml-quants.c`; docs/schemes-sources.md 2.2) and gguf-py 0.19.0
//! `gguf/quants.py`, which writes the same bytes. A block is 32 consecutive values of a row; every
//! operation below is one f32 operation, in the order written (C without FMA contraction, as
//! gguf-py computes it); `f16(x)` is IEEE round-to-nearest-even, `trunc` C's cast to int8
//! (toward zero), `amax`/`max` the largest magnitude and the value that has it, scanning from
//! (0, 0) and replacing only on a strictly larger magnitude (the first wins a tie); `id = 1 / d`,
//! or 0 when d is 0, from the f32 d (not the f16 one):
//! - q4_0, `quantize_row_q4_0_ref` l.113-148 (gguf-py `Q4_0.quantize_blocks` l.220-238): d =
//!   max / -8, q = min(15, trunc(x * id + 8.5)); stored f16(d). Value (`dequantize_row_q4_0`):
//!   (q - 8) * f16(d). 18 bytes.
//! - q4_1, `quantize_row_q4_1_ref` l.150-185 (gguf-py `Q4_1` l.254-273): min and max of the block
//!   (from FLT_MAX and -FLT_MAX, strict comparisons), d = (max - min) / 15, q = min(15,
//!   trunc((x - min) * id + 0.5)); stored f16(d) and m = f16(min). Value
//!   (`dequantize_row_q4_1`): q * f16(d) + f16(m). 20 bytes.
//! - q5_0, `quantize_row_q5_0_ref` l.187-229 (gguf-py `Q5_0` l.291-311): d = max / -16, q =
//!   min(31, trunc(x * id + 16.5)); stored f16(d). Value: (q - 16) * f16(d). 22 bytes.
//! - q8_0, `quantize_row_q8_0_ref` l.276-299 (gguf-py `Q8_0` l.378-393): d = amax / 127, q =
//!   roundf(x * id) (halves away from zero); stored f16(d). Value: q * f16(d). 34 bytes.
//! - iq4_nl, `quantize_row_iq4_nl_ref` l.5100-5113, which runs `quantize_row_iq4_nl_impl`
//!   l.4966-5075 with no importance weights and `ntry = -1` (gguf-py has no IQ4_NL quantizer,
//!   only `IQ4_NL.dequantize_blocks` l.1330-1348): with amax < 1e-15 (`GROUP_MAX_EPS`) the block
//!   stores d = 0 (ggml leaves its indices unwritten; every value is 0 whatever they are, and this
//!   module writes index 8, as kvschemes does); otherwise d0 = max / -127, each index the level of
//!   `kvalues_iq4nl` nearest to d0's inverse times x (`best_index_int8` l.28-37: 0 at or below the
//!   first level, 15 at or above the last, else a binary search and an exact midpoint to the upper
//!   level), then the stored scale is the least-squares fit with weights w = x * x, summed in
//!   index order: sumqx += (w * q) * x, sumq2 += (w * q) * q, d = sumqx / sumq2 (0 when sumq2 is
//!   not positive), stored f16(d); indices are not re-chosen. Value: f16(d) * level. 18 bytes.
//!
//! The cache (ggml `ggml-cpu/ops.cpp` `ggml_compute_forward_set_rows_impl` l.5092-5160; notes
//! 2.4): each token's K and V row goes through the type's quantizer in blocks of 32 when the token
//! arrives; with head_dim a multiple of 32 no block crosses a head, so each head's row of each
//! token is its own run of blocks. Every token, the query's own included, is read as its blocks
//! decode, in every schedule, and the cache stores `block bytes * head_dim / 32` per token, per KV
//! head, for K and for V. With `+rot`, the stored row is H times the row and attention reads H
//! times the decoded row ([`super::hadamard`]).

use half::f16;
use models::llama::KvSource;

use super::Rows;
use super::hadamard::{self, Hadamard};

/// Values per block.
pub const BLOCK: usize = 32;

/// ggml's `kvalues_iq4nl` (`ggml-common.h` l.1120-1122).
pub const IQ4_NL_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// One of llama.cpp's quantized cache types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockType {
    /// 4-bit codes, d = max / -8.
    Q4_0,
    /// 4-bit codes with a scale and a minimum.
    Q4_1,
    /// 5-bit codes, d = max / -16.
    Q5_0,
    /// int8 codes, d = amax / 127.
    Q8_0,
    /// 4-bit indices into a non-linear table, least-squares scale.
    Iq4Nl,
}

impl BlockType {
    /// Every type, in the order the scheme list names them.
    pub const ALL: [BlockType; 5] = [
        BlockType::Q4_0,
        BlockType::Q4_1,
        BlockType::Q5_0,
        BlockType::Q8_0,
        BlockType::Iq4Nl,
    ];

    /// llama.cpp's name (`-ctk q4_0`).
    pub fn name(self) -> &'static str {
        match self {
            BlockType::Q4_0 => "q4_0",
            BlockType::Q4_1 => "q4_1",
            BlockType::Q5_0 => "q5_0",
            BlockType::Q8_0 => "q8_0",
            BlockType::Iq4Nl => "iq4_nl",
        }
    }

    /// The type of a name.
    pub fn from_name(name: &str) -> Option<BlockType> {
        BlockType::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Bytes of one block of 32 values (`ggml-common.h` `block_*`): the f16 scale (and q4_1's
    /// f16 minimum), then the codes: 16 bytes of nibbles (q4_0, q4_1, iq4_nl), 4 bytes of fifth
    /// bits and 16 of nibbles (q5_0), or 32 int8 (q8_0).
    pub fn block_bytes(self) -> usize {
        match self {
            BlockType::Q4_0 | BlockType::Iq4Nl => 2 + 16,
            BlockType::Q4_1 => 2 + 2 + 16,
            BlockType::Q5_0 => 2 + 4 + 16,
            BlockType::Q8_0 => 2 + 32,
        }
    }
}

/// One block as ggml stores it, its codes unpacked: the f16 scale, q4_1's f16 minimum (0 for the
/// other types) and each value's code as the type defines it (q4_0 0..=15, q4_1 0..=15, q5_0
/// 0..=31, q8_0 -127..=127, iq4_nl an index 0..=15).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Block {
    /// The type.
    pub ty: BlockType,
    /// The scale d.
    pub d: f16,
    /// q4_1's minimum m.
    pub m: f16,
    /// The codes.
    pub codes: [i16; BLOCK],
}

/// ggml's largest magnitude and the signed value that has it (module docs).
fn magnitude_and_extreme(x: &[f32; BLOCK]) -> (f32, f32) {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// C's `d ? 1.0f/d : 0.0f`.
fn inverse(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

/// `best_index_int8` over [`IQ4_NL_LEVELS`].
fn nearest_level(x: f32) -> i16 {
    let level = |i: usize| f32::from(IQ4_NL_LEVELS[i]);
    if x <= level(0) {
        return 0;
    }
    if x >= level(15) {
        return 15;
    }
    let (mut low, mut high) = (0usize, 15usize);
    while high - low > 1 {
        let middle = (low + high) / 2;
        if x < level(middle) {
            high = middle;
        } else {
            low = middle;
        }
    }
    if x - level(high - 1) < level(high) - x {
        (high - 1) as i16
    } else {
        high as i16
    }
}

impl Block {
    /// ggml's reference quantizer of `ty` for one block of 32 finite values (module docs).
    pub fn quantize(ty: BlockType, x: &[f32; BLOCK]) -> Block {
        let mut codes = [0i16; BLOCK];
        let mut m = f16::ZERO;
        let d = match ty {
            BlockType::Q4_0 => {
                let d = magnitude_and_extreme(x).1 / -8.0;
                let id = inverse(d);
                for (q, &v) in codes.iter_mut().zip(x) {
                    *q = ((v * id + 8.5).trunc() as i16).min(15);
                }
                d
            }
            BlockType::Q4_1 => {
                let mut min = f32::MAX;
                let mut max = -f32::MAX;
                for &v in x {
                    if v < min {
                        min = v;
                    }
                    if v > max {
                        max = v;
                    }
                }
                let d = (max - min) / 15.0;
                let id = inverse(d);
                for (q, &v) in codes.iter_mut().zip(x) {
                    *q = (((v - min) * id + 0.5).trunc() as i16).min(15);
                }
                m = f16::from_f32(min);
                d
            }
            BlockType::Q5_0 => {
                let d = magnitude_and_extreme(x).1 / -16.0;
                let id = inverse(d);
                for (q, &v) in codes.iter_mut().zip(x) {
                    *q = ((v * id + 16.5).trunc() as i16).min(31);
                }
                d
            }
            BlockType::Q8_0 => {
                let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = inverse(d);
                for (q, &v) in codes.iter_mut().zip(x) {
                    // roundf: halves away from zero.
                    *q = round_half_away(v * id) as i16;
                }
                d
            }
            BlockType::Iq4Nl => {
                let (amax, max) = magnitude_and_extreme(x);
                if amax < 1e-15 {
                    codes = [8; BLOCK];
                    0.0
                } else {
                    let d0 = max / f32::from(IQ4_NL_LEVELS[0]);
                    let id = 1.0 / d0;
                    let mut sumqx = 0f32;
                    let mut sumq2 = 0f32;
                    for (code, &v) in codes.iter_mut().zip(x) {
                        *code = nearest_level(id * v);
                        let q = f32::from(IQ4_NL_LEVELS[*code as usize]);
                        let w = v * v;
                        sumqx += w * q * v;
                        sumq2 += w * q * q;
                    }
                    if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 }
                }
            }
        };
        Block {
            ty,
            d: f16::from_f32(d),
            m,
            codes,
        }
    }

    /// ggml's dequantization of the block to f32 (module docs).
    pub fn dequantize(&self) -> [f32; BLOCK] {
        let d = self.d.to_f32();
        let m = self.m.to_f32();
        self.codes.map(|q| match self.ty {
            BlockType::Q4_0 => f32::from(q - 8) * d,
            BlockType::Q4_1 => f32::from(q) * d + m,
            BlockType::Q5_0 => f32::from(q - 16) * d,
            BlockType::Q8_0 => f32::from(q) * d,
            BlockType::Iq4Nl => d * f32::from(IQ4_NL_LEVELS[q as usize]),
        })
    }
}

/// `row` (a multiple of 32 values) stored in blocks of `ty` and read back.
pub fn round_trip_row(ty: BlockType, row: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(row.len());
    for chunk in row.chunks_exact(BLOCK) {
        let block: &[f32; BLOCK] = chunk.try_into().expect("chunks of 32");
        out.extend_from_slice(&Block::quantize(ty, block).dequantize());
    }
    out
}

/// One side of the cache: every row of every head as its blocks decode, in the original basis.
fn side(ty: BlockType, x: &Rows, rotation: Option<&Hadamard>) -> Rows {
    let mut read = x.clone();
    for head in 0..x.heads {
        for token in 0..x.tokens {
            let row = x.row(head, token);
            let values = match rotation {
                None => round_trip_row(ty, row),
                Some(h) => h.apply(&round_trip_row(ty, &h.apply(row))),
            };
            read.row_mut(head, token).copy_from_slice(&values);
        }
    }
    read
}

/// One layer's cache under `llamacpp-TYPE[+rot]`: what every query reads (module docs).
pub(super) struct LlamaCppLayer {
    k: Rows,
    v: Rows,
}

impl LlamaCppLayer {
    /// The cache of one layer's K (after RoPE) and V; the head size must be a multiple of 32,
    /// and of 64 with `rotate` (checked by the caller).
    pub(super) fn new(ty: BlockType, rotate: bool, k: &Rows, v: &Rows) -> LlamaCppLayer {
        let rotation = |size: Option<usize>| {
            size.filter(|_| rotate)
                .map(|n| Hadamard::new(n).expect("a power of two"))
        };
        let k_rotation = rotation(hadamard::key_size(k.dim));
        let v_rotation = rotation(hadamard::value_size(v.dim));
        LlamaCppLayer {
            k: side(ty, k, k_rotation.as_ref()),
            v: side(ty, v, v_rotation.as_ref()),
        }
    }
}

impl KvSource for LlamaCppLayer {
    fn key(&self, head: usize, _query: usize, position: usize) -> &[f32] {
        self.k.row(head, position)
    }
    fn value(&self, head: usize, _query: usize, position: usize) -> &[f32] {
        self.v.row(head, position)
    }
}

/// Bytes the cache stores after `tokens` tokens: K and V, every token's row of every head in
/// blocks (`None` on overflow).
pub fn stored_bytes(ty: BlockType, heads: usize, head_dim: usize, tokens: usize) -> Option<usize> {
    let blocks_per_side = heads.checked_mul(tokens)?.checked_mul(head_dim / BLOCK)?;
    blocks_per_side
        .checked_mul(ty.block_bytes())?
        .checked_mul(2)
}

/// C's `roundf` (halves away from zero) from exact operations: `f32::round` calls the
/// platform's `roundf`, and mingw-w64's (Windows, GNU) rounds 0.49999997 to 1.
fn round_half_away(y: f32) -> f32 {
    let magnitude = y.abs();
    if magnitude.is_nan() || magnitude >= 8_388_608.0 {
        return y;
    }
    let whole = magnitude as u32 as f32;
    let step = if magnitude - whole >= 0.5 { 1.0 } else { 0.0 };
    (whole + step).copysign(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_q4_0_block_of_a_ramp_decodes_to_its_hand_computed_values() {
        // x = -16, -15, ..., 15. The largest magnitude is -16 (index 0), so d = -16 / -8 = 2,
        // id = 0.5 and q = min(15, trunc(x / 2 + 8.5)): an even x = 2m gives m + 8 and decodes
        // to (m + 8 - 8) * 2 = x; an odd x = 2m + 1 gives trunc(m + 9) = m + 9, read as x + 1
        // (a half rounds up); 15 would be code 16, capped at 15, read as 14.
        let x: [f32; 32] = std::array::from_fn(|i| i as f32 - 16.0);
        let block = Block::quantize(BlockType::Q4_0, &x);
        assert_eq!(block.d, f16::from_f32(2.0));
        assert_eq!(block.codes[0], 0);
        assert_eq!(block.codes[31], 15);
        let expected: [f32; 32] = std::array::from_fn(|i| {
            let x = i as f32 - 16.0;
            match i {
                31 => 14.0,
                _ if i % 2 == 1 => x + 1.0,
                _ => x,
            }
        });
        assert_eq!(block.dequantize(), expected);
        // An all-zero block: d = 0 / -8 = -0.0, every code 8, every value (8 - 8) * -0.0 = -0.0.
        let zero = Block::quantize(BlockType::Q4_0, &[0.0; 32]);
        assert_eq!(zero.d.to_bits(), 0x8000);
        assert!(
            zero.dequantize()
                .iter()
                .all(|v| v.to_bits() == (-0.0f32).to_bits())
        );
    }

    #[test]
    fn the_other_types_follow_their_rules_on_small_examples() {
        // q8_0: amax 127 gives d = 1; 2.5 rounds away from zero to 3, -2.5 to -3.
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        let block = Block::quantize(BlockType::Q8_0, &x);
        assert_eq!(&block.codes[..3], &[127, 3, -3]);
        assert_eq!(&block.dequantize()[..3], &[127.0, 3.0, -3.0]);
        // q5_0: max 2 (at index 3), d = -0.125: 2 -> trunc(-16 + 16.5) = 0, read as 2; 0 -> 16.
        let mut x = [0f32; 32];
        x[3] = 2.0;
        x[5] = -1.0;
        let block = Block::quantize(BlockType::Q5_0, &x);
        assert_eq!(
            (block.codes[3], block.codes[0], block.codes[5]),
            (0, 16, 24)
        );
        assert_eq!(block.dequantize()[5], -1.0);
        // q4_1: 0..31 / 2: min 0, d = 15.5 / 15; the top value reads back as 15 * f16(d).
        let x: [f32; 32] = std::array::from_fn(|i| i as f32 / 2.0);
        let block = Block::quantize(BlockType::Q4_1, &x);
        assert_eq!((block.m.to_f32(), block.codes[31]), (0.0, 15));
        assert_eq!(
            block.dequantize()[31],
            15.0 * f16::from_f32(15.5 / 15.0).to_f32()
        );
        // iq4_nl: the nearest level, a midpoint up.
        assert_eq!(nearest_level(-200.0), 0);
        assert_eq!(nearest_level(7.0), 9);
        assert_eq!(nearest_level(6.9), 8);
        assert_eq!(nearest_level(500.0), 15);
        let tiny = Block::quantize(BlockType::Iq4Nl, &[1e-16; 32]);
        assert_eq!((tiny.d, tiny.dequantize()), (f16::ZERO, [0.0; 32]));
    }

    #[test]
    fn roundf_halves_go_away_from_zero_and_nothing_else_does() {
        let below_half = f32::from_bits(0.5f32.to_bits() - 1); // 0.49999997
        for (y, expect) in [
            (below_half, 0.0),
            (-below_half, -0.0),
            (0.5, 1.0),
            (-0.5, -1.0),
            (1.5, 2.0),
            (2.5, 3.0),
            (-2.5, -3.0),
            (8_388_607.5, 8_388_608.0),
            (16_777_215.0, 16_777_215.0),
            (-0.0, -0.0),
            (f32::INFINITY, f32::INFINITY),
        ] {
            assert_eq!(round_half_away(y).to_bits(), expect.to_bits(), "{y}");
        }
        assert!(round_half_away(f32::NAN).is_nan());
        // Every tie and its neighbours up to 2^10, both signs.
        for n in 0..1024u32 {
            let tie = n as f32 + 0.5;
            for y in [
                tie,
                f32::from_bits(tie.to_bits() - 1),
                f32::from_bits(tie.to_bits() + 1),
            ] {
                let expect = if y >= tie { n as f32 + 1.0 } else { n as f32 };
                assert_eq!(round_half_away(y), expect, "{y}");
                assert_eq!(round_half_away(-y), -expect, "{y}");
            }
        }
    }
}
