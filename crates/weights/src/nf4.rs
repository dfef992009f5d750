//! NF4, as bitsandbytes stores it: 4-bit indices into a fixed table of 16 non-uniform levels,
//! scaled by one f32 absmax per block.
//!
//! Spec:
//! - Elements: the tensor flattened in row-major order; blocks of `block_size` consecutive
//!   elements (64 by default) share one f32 `absmax`; a partial last block has its own.
//! - Weight = `NF4_LEVELS[code] * absmax` (f32 multiply).
//! - Packing: two codes per byte, the FIRST element in the HIGH nibble:
//!   `byte i = code[2i] << 4 | code[2i + 1]` (the opposite of GGUF, GPTQ and AWQ); an odd count
//!   gets a zero low nibble in the last byte.
//! - Quantizer (bitsandbytes' reference `quantize_4bit`): absmax = max |x| over the block;
//!   scaled = clamp(x * (1 / absmax), -1, 1) in f32; code = the level nearest to scaled, by
//!   |scaled - level| in f32, and on an exact tie (a midpoint) the LOWER code. An all-zero block
//!   has absmax 0, its scaled values are NaN (0 * inf) and bitsandbytes' argmin then picks
//!   code 0; we write the same byte, which decodes to -1.0 * 0 = -0.0.
//! - Unrepresentable blocks (where this module departs from bitsandbytes, which stores them
//!   silently): non-finite input is refused, and so is a block whose absmax is nonzero but
//!   below 2^-128 (a subnormal f32), whose inverse overflows to infinity and turns every code
//!   into a clamp. absmax is the largest magnitude of finite values, so it is finite itself; a
//!   stored absmax that is not finite is refused on reading ([`Nf4Tensor::check`]).
//! - NF4 is not an integer code: its levels are not evenly spaced, so no scale and zero point
//!   reproduce them, and converting NF4 to GPTQ, AWQ or GGUF needs requantization
//!   ([`FormatError::NeedsRequantization`] says so).
//!
//! Follows bitsandbytes 0.50's `quantize_4bit` / `dequantize_4bit` (CPU reference in
//! <https://github.com/bitsandbytes-foundation/bitsandbytes/blob/0155ecc672fc1523ae8dfd6440060f1c404fc8c3/bitsandbytes/backends/default/ops.py>);
//! the conformance tests hold this module to its bytes.

use ndarray::{Array2, ArrayView2};

use crate::bpw::Cost;
use crate::error::{FormatError, Result};

/// The 16 NF4 levels, as bitsandbytes' `get_4bit_type("nf4")` stores them in f32.
pub const NF4_LEVELS: [f32; 16] = [
    -1.0,
    -0.696_192_8,
    -0.525_073_05,
    -0.394_917_5,
    -0.284_441_38,
    -0.184_773_43,
    -0.091_050_036,
    0.0,
    0.079_580_3,
    0.160_930_2,
    0.246_112_3,
    0.337_915_24,
    0.440_709_83,
    0.562_617,
    0.722_956_84,
    1.0,
];

/// bitsandbytes' default block size.
pub const DEFAULT_BLOCK_SIZE: usize = 64;

/// An NF4 tensor as bitsandbytes stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct Nf4Tensor {
    /// Logical [rows, cols].
    pub shape: [usize; 2],
    /// Elements per absmax, over the flattened matrix.
    pub block_size: usize,
    /// ceil(rows * cols / 2) bytes, first element in the high nibble.
    pub packed: Vec<u8>,
    /// One per block: ceil(rows * cols / block_size).
    pub absmax: Vec<f32>,
}

/// The nearest NF4 level to `scaled`, the lower code on a tie.
pub fn nearest_level(scaled: f32) -> u8 {
    let mut best = 0;
    let mut best_distance = (scaled - NF4_LEVELS[0]).abs();
    for (code, level) in NF4_LEVELS.iter().enumerate().skip(1) {
        let distance = (scaled - level).abs();
        // Strictly smaller: a tie keeps the lower code. NaN never wins, so NaN gives code 0.
        if distance < best_distance {
            best = code as u8;
            best_distance = distance;
        }
    }
    best
}

/// Quantizes `x` in row-major order with one absmax per `block_size` elements.
pub fn quantize(x: ArrayView2<f32>, block_size: usize) -> Result<Nf4Tensor> {
    if block_size == 0 {
        return Err(FormatError::ZeroBlockSize);
    }
    let (rows, cols) = x.dim();
    if rows == 0 || cols == 0 {
        return Err(FormatError::EmptyMatrix { rows, cols });
    }
    if let Some(((row, col), &value)) = x.indexed_iter().find(|(_, v)| !v.is_finite()) {
        return Err(FormatError::NonFinite { row, col, value });
    }
    let flat: Vec<f32> = x.iter().copied().collect();
    let mut codes = Vec::with_capacity(flat.len());
    let mut absmax = Vec::with_capacity(flat.len().div_ceil(block_size));
    for (index, block) in flat.chunks(block_size).enumerate() {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let inverse = 1.0 / amax;
        if amax != 0.0 && inverse.is_infinite() {
            let start = index * block_size;
            return Err(FormatError::AbsmaxTooSmall {
                block: index,
                start,
                end: start + block.len(),
                absmax: amax,
            });
        }
        codes.extend(
            block
                .iter()
                .map(|&v| nearest_level((v * inverse).clamp(-1.0, 1.0))),
        );
        absmax.push(amax);
    }
    Ok(Nf4Tensor {
        shape: [rows, cols],
        block_size,
        packed: pack_codes(&codes),
        absmax,
    })
}

/// Packs codes two per byte, first element in the high nibble.
pub fn pack_codes(codes: &[u8]) -> Vec<u8> {
    codes
        .chunks(2)
        .map(|pair| (pair[0] << 4) | pair.get(1).copied().unwrap_or(0))
        .collect()
}

/// Unpacks `count` codes, first element from the high nibble.
pub fn unpack_codes(packed: &[u8], count: usize) -> Vec<u8> {
    packed
        .iter()
        .flat_map(|&byte| [byte >> 4, byte & 0x0F])
        .take(count)
        .collect()
}

impl Nf4Tensor {
    /// An NF4 tensor from logical codes [rows, cols] (each < 16) and one absmax per block.
    pub fn from_codes(codes: &Array2<u8>, absmax: Vec<f32>, block_size: usize) -> Result<Self> {
        let (rows, cols) = codes.dim();
        if let Some(((row, col), &value)) = codes.indexed_iter().find(|(_, c)| **c > 15) {
            return Err(FormatError::CodeOutOfRange {
                what: "NF4 code",
                row,
                col,
                value,
                bits: 4,
                max: 15,
            });
        }
        let flat: Vec<u8> = codes.iter().copied().collect();
        let tensor = Nf4Tensor {
            shape: [rows, cols],
            block_size,
            packed: pack_codes(&flat),
            absmax,
        };
        tensor.check()?;
        Ok(tensor)
    }

    /// rows * cols, or [`FormatError::ElementCountOverflow`] when the product does not fit (a
    /// shape read from a file is untrusted: `[2^58 + 4, 64]` would wrap to 256 and pass the
    /// byte counts of a 256-element tensor).
    pub fn element_count(&self) -> Result<usize> {
        let [rows, cols] = self.shape;
        rows.checked_mul(cols)
            .ok_or(FormatError::ElementCountOverflow { rows, cols })
    }

    /// Checks the byte and absmax counts against the shape and block size.
    pub fn check(&self) -> Result<()> {
        if self.block_size == 0 {
            return Err(FormatError::ZeroBlockSize);
        }
        let count = self.element_count()?;
        if count == 0 {
            return Err(FormatError::EmptyMatrix {
                rows: self.shape[0],
                cols: self.shape[1],
            });
        }
        if self.packed.len() != count.div_ceil(2) {
            return Err(FormatError::Nf4CodeBytes {
                rows: self.shape[0],
                cols: self.shape[1],
                found: self.packed.len(),
                expected: count.div_ceil(2),
            });
        }
        let blocks = count.div_ceil(self.block_size);
        if self.absmax.len() != blocks {
            return Err(FormatError::Nf4AbsmaxCount {
                blocks,
                block_size: self.block_size,
                found: self.absmax.len(),
            });
        }
        if let Some((block, &value)) = self.absmax.iter().enumerate().find(|(_, a)| !a.is_finite())
        {
            return Err(FormatError::NonFiniteScale {
                format: "NF4",
                what: "absmax",
                block,
                value,
            });
        }
        Ok(())
    }

    /// Logical codes [rows, cols].
    pub fn codes(&self) -> Result<Array2<u8>> {
        self.check()?;
        let [rows, cols] = self.shape;
        let flat = unpack_codes(&self.packed, self.element_count()?);
        Ok(Array2::from_shape_vec((rows, cols), flat).expect("checked length"))
    }

    /// Weights: `NF4_LEVELS[code] * absmax` of the element's block.
    pub fn dequantize(&self) -> Result<Array2<f32>> {
        let codes = self.codes()?;
        let cols = self.shape[1];
        Ok(Array2::from_shape_fn(codes.dim(), |(r, c)| {
            NF4_LEVELS[codes[[r, c]] as usize] * self.absmax[(r * cols + c) / self.block_size]
        }))
    }

    /// What it stores: the packed codes, and one f32 absmax (its scale) per block. (The element
    /// count saturates for a shape [`Nf4Tensor::check`] refuses.)
    pub fn storage(&self) -> Cost {
        Cost {
            elements: self.shape[0].saturating_mul(self.shape[1]),
            code_bytes: self.packed.len(),
            scale_bytes: 4 * self.absmax.len(),
            zero_point_bytes: 0,
            g_idx_bytes: 0,
            extra_bytes: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn levels_have_bitsandbytes_f32_bits() {
        // Bits of bitsandbytes' f32 NF4 code (from its quantize_4bit output fixture).
        let bits: [u32; 16] = [
            0xbf80_0000,
            0xbf32_39b1,
            0xbf06_6b30,
            0xbeca_32a0,
            0xbe91_a24d,
            0xbe3d_353f,
            0xbdba_7871,
            0x0000_0000,
            0x3da2_faff,
            0x3e24_cae3,
            0x3e7c_04dd,
            0x3ead_033a,
            0x3ee1_a4b8,
            0x3f10_07ab,
            0x3f39_13b3,
            0x3f80_0000,
        ];
        assert_eq!(NF4_LEVELS.map(f32::to_bits), bits);
    }

    #[test]
    fn first_element_goes_in_the_high_nibble() {
        assert_eq!(pack_codes(&[0x1, 0x2, 0xF]), vec![0x12, 0xF0]);
        assert_eq!(unpack_codes(&[0x12, 0xF0], 3), vec![0x1, 0x2, 0xF]);
    }

    #[test]
    fn a_midpoint_takes_the_lower_code() {
        // Between levels 7 (0.0) and 8 (0.0795803): an exact f32 midpoint is equidistant.
        let mid = NF4_LEVELS[8] / 2.0;
        assert_eq!((mid - NF4_LEVELS[7]).abs(), (mid - NF4_LEVELS[8]).abs());
        assert_eq!(nearest_level(mid), 7);
        assert_eq!(nearest_level(f32::from_bits(mid.to_bits() + 1)), 8);
        assert_eq!(nearest_level(-1.0), 0);
        assert_eq!(nearest_level(1.0), 15);
    }

    #[test]
    fn blocks_run_over_the_flattened_matrix() {
        // 2 x 3 with blocks of 4: block 0 = row 0 and the first element of row 1.
        let x = array![[1.0f32, -2.0, 0.0], [4.0, 0.5, -0.5]];
        let t = quantize(x.view(), 4).unwrap();
        assert_eq!(t.absmax, vec![4.0, 0.5]);
        assert_eq!(t.codes().unwrap(), array![[10, 2, 7], [15, 15, 0]]);
        assert_eq!(t.packed, vec![0xA2, 0x7F, 0xF0]);
        assert_eq!(
            t.dequantize().unwrap(),
            array![
                [NF4_LEVELS[10] * 4.0, NF4_LEVELS[2] * 4.0, 0.0],
                [4.0, 0.5, -0.5]
            ]
        );
    }

    #[test]
    fn an_all_zero_block_writes_code_0_like_bitsandbytes() {
        let t = quantize(array![[0.0f32, 0.0]].view(), 64).unwrap();
        assert_eq!(
            (t.packed.clone(), t.absmax.clone()),
            (vec![0x00], vec![0.0])
        );
        assert!(t.dequantize().unwrap().iter().all(|v| *v == 0.0));
    }

    #[test]
    fn a_block_whose_absmax_inverse_overflows_is_refused_not_clamped() {
        // absmax 1e-40 (subnormal): 1 / absmax = inf, so 1e-40 and 1e-45 would both take code 15
        // and the zero code 0 (-1.0 * absmax).
        let x = array![[1e-40f32, 1e-45, 0.0, 0.5]];
        assert_eq!(
            quantize(x.view(), 3),
            Err(FormatError::AbsmaxTooSmall {
                block: 0,
                start: 0,
                end: 3,
                absmax: 1e-40
            })
        );
        assert!(quantize(array![[1e-30f32, 0.0]].view(), 64).is_ok());
        assert_eq!(
            quantize(array![[0.0f32, f32::INFINITY]].view(), 64),
            Err(FormatError::NonFinite {
                row: 0,
                col: 1,
                value: f32::INFINITY
            })
        );
        assert_eq!(
            quantize(array![[1.0f32]].view(), 0),
            Err(FormatError::ZeroBlockSize)
        );
    }

    #[test]
    fn stored_counts_and_absmax_are_checked_against_the_shape() {
        let t = quantize(array![[1.0f32, -1.0, 0.5], [0.0, 2.0, -2.0]].view(), 4).unwrap();
        let refused = |edit: &dyn Fn(&mut Nf4Tensor)| {
            let mut edited = t.clone();
            edit(&mut edited);
            edited.dequantize().unwrap_err()
        };
        let err = refused(&|t| t.absmax[1] = f32::NAN);
        assert!(
            matches!(err, FormatError::NonFiniteScale { format: "NF4", what: "absmax", block: 1, value }
                if value.is_nan()),
            "{err:?}"
        );
        assert_eq!(
            refused(&|t| t.packed.push(0)),
            FormatError::Nf4CodeBytes {
                rows: 2,
                cols: 3,
                found: 4,
                expected: 3
            }
        );
        assert_eq!(
            refused(&|t| t.absmax.pop().map(drop).unwrap()),
            FormatError::Nf4AbsmaxCount {
                blocks: 2,
                block_size: 4,
                found: 1
            }
        );
        assert_eq!(
            refused(&|t| t.shape = [0, 3]),
            FormatError::EmptyMatrix { rows: 0, cols: 3 }
        );
    }

    /// A quant state's shape whose product wraps to the codes' count ([2^58 + 4, 64] is
    /// 2^64 + 256 elements, 256 after the wrap) is refused, not read as 256 elements (which
    /// panicked when the codes were shaped).
    #[test]
    fn a_shape_whose_product_wraps_is_refused() {
        let t = quantize(ndarray::Array2::<f32>::ones((4, 64)).view(), 64).unwrap();
        let rows = (1usize << 58) + 4;
        let wrapped = Nf4Tensor {
            shape: [rows, 64],
            ..t.clone()
        };
        assert_eq!(rows.wrapping_mul(64), 256);
        let err = FormatError::ElementCountOverflow { rows, cols: 64 };
        assert_eq!(wrapped.check(), Err(err.clone()));
        assert_eq!(wrapped.codes(), Err(err.clone()));
        assert_eq!(wrapped.dequantize(), Err(err));
        assert_eq!(wrapped.storage().elements, usize::MAX);
        assert_eq!(t.dequantize().unwrap().dim(), (4, 64));
    }
}
