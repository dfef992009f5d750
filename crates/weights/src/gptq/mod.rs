//! GPTQ, in AutoGPTQ's layout (also GPTQModel's), at 2, 3, 4 or 8 bits.
//!
//! Spec (K = in-features, N = out-features, G = groups, b = bits):
//! - Container: four tensors, `qweight` int32 [K*b/32, N], `qzeros` int32 [G, N*b/32],
//!   `scales` f16 [G, N], `g_idx` int32 \[K\].
//! - qweight axis: packed along K. Column n of qweight is the dense little-endian b-bit stream of
//!   codes[:, n]: row k at bits [k*b, (k+1)*b) of the column's words. At 4 bits that is row
//!   8r + j at bits 4j of word r; at 3 bits 32 rows fill exactly 3 words and rows 10 and 21
//!   straddle a word boundary; at 2 and 8 bits 16 and 4 rows per word.
//! - qzeros axis: packed along N. Row g of qzeros is the same stream over zeros[g, :].
//! - Zero-point convention, recorded by the writer and never guessed:
//!   - `gptq` (AutoGPTQ, "v1"): each field stores (zero - 1) masked to b bits. A true zero point
//!     of 0 would wrap to 2^b - 1, which AutoGPTQ reads back as 2^b; the libraries disagree on
//!     it, so this writer refuses zero 0 under v1 and this reader refuses a field of 2^b - 1.
//!   - `gptq_v2` (GPTQModel): each field stores the zero point itself.
//! - g_idx: the group of each row; sequential (k / group_size) unless the checkpoint was
//!   quantized in activation order, in which case it is scattered and must travel with the rows.
//! - G = ceil(K / group_size) for the stored K.
//! - Signedness: words are stored as int32, so the top slot's high bit is the sign bit; the
//!   unpacker reinterprets them as u32 first and never sign-extends.
//! - Padding: K is padded to a multiple of 32 / gcd(32, b) (so each column is whole words) and N
//!   to the same multiple (so each qzeros row is whole words), with zero weights; the logical
//!   size travels beside the tensors (`logical_shape`) and unpacking crops to it.
//!
//! Source layouts followed: AutoGPTQ 0.7.1 `QuantLinear.pack` (qlinear_cuda) and GPTQModel 7.7.0;
//! the conformance tests hold this module to their bytes.

use half::f16;
use ndarray::Array2;

use crate::bpw::Cost;
use crate::error::{FormatError, Result};
use crate::format::WeightFormat;
use crate::shape::{check_aligned, check_logical_shape, check_not_empty, check_tensor_shapes};

#[cfg(target_arch = "x86_64")]
mod avx512;
mod drivers;
mod kernels;
mod pack;
pub mod reference;
mod rows;
mod unpack;

pub(crate) use pack::reusable;
pub use pack::{pack, pack_into};
pub(crate) use unpack::reuse_buffer;
pub use unpack::{unpack, unpack_into};

/// Bit widths AutoGPTQ and GPTQModel write.
pub const GPTQ_BITS: [u32; 4] = [2, 3, 4, 8];

/// How a GPTQ checkpoint stores its zero points. Exhaustive: these are the two conventions the
/// libraries write, and packing and unpacking match on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ZeroConvention {
    /// AutoGPTQ's `gptq` format: stored field = (zero - 1) masked to the field.
    V1,
    /// GPTQModel's `gptq_v2` format: stored field = zero.
    V2,
}

impl ZeroConvention {
    /// The format name this convention is written under (`gptq` or `gptq_v2`).
    pub fn format(self) -> WeightFormat {
        match self {
            ZeroConvention::V1 => WeightFormat::Gptq,
            ZeroConvention::V2 => WeightFormat::GptqV2,
        }
    }

    /// The field value written for a true zero point.
    fn store(self, zero: u8, bits: u32, group: usize, col: usize) -> Result<u8> {
        let mask = max_code(bits);
        match self {
            ZeroConvention::V2 => Ok(zero),
            ZeroConvention::V1 if zero == 0 => Err(FormatError::V1ZeroUnrepresentable {
                group,
                col,
                wrapped: mask,
                seen: u32::from(mask) + 1,
            }),
            ZeroConvention::V1 => Ok(zero - 1),
        }
    }

    /// The true zero point a stored field means.
    fn read(self, field: u8, bits: u32, group: usize, col: usize) -> Result<u8> {
        match self {
            ZeroConvention::V2 => Ok(field),
            ZeroConvention::V1 if field == max_code(bits) => {
                Err(FormatError::V1ZeroFieldAmbiguous {
                    group,
                    col,
                    field,
                    seen: u32::from(field) + 1,
                    bits,
                })
            }
            ZeroConvention::V1 => Ok(field + 1),
        }
    }
}

/// One GPTQ layer's tensors, as a checkpoint stores them, with its logical size.
#[derive(Debug, Clone, PartialEq)]
pub struct GptqLayer {
    /// Code width b: 2, 3, 4 or 8.
    pub bits: u32,
    /// Rows per group; G = ceil(K / group_size).
    pub group_size: usize,
    /// How qzeros stores the zero points.
    pub convention: ZeroConvention,
    /// Codes packed along K, one word stream per column: [K*b/32, N].
    pub qweight: Array2<i32>,
    /// Zero-point fields packed along N, one word stream per group: [G, N*b/32].
    pub qzeros: Array2<i32>,
    /// Scales: [G, N].
    pub scales: Array2<f16>,
    /// The group of each stored row: \[K\].
    pub g_idx: Vec<i32>,
    /// [K, N] before padding; equal to the stored size when nothing was padded.
    pub logical_shape: [usize; 2],
}

/// Rows (of K) and columns (of N) must come in multiples of this many so the streams fill whole
/// words: 16 at 2 bits, 32 at 3, 8 at 4, 4 at 8.
pub fn alignment(bits: u32) -> usize {
    (32 / gcd(32, bits)) as usize
}

impl GptqLayer {
    /// Checks every tensor's shape against the format; returns the stored (padded) K and N.
    pub fn check_shapes(&self) -> Result<(usize, usize)> {
        if self.group_size == 0 {
            return Err(FormatError::ZeroGroupSize);
        }
        let bits = self.bits as usize;
        let k = self.g_idx.len();
        let n = self.scales.ncols();
        check_not_empty(k, n)?;
        let groups = k.div_ceil(self.group_size);
        let step = alignment(self.bits);
        check_aligned("GPTQ", "K (g_idx length)", k, step)?;
        check_aligned("GPTQ", "N (scales columns)", n, step)?;
        check_tensor_shapes(
            "GPTQ",
            [
                (
                    "qweight",
                    self.qweight.shape(),
                    [k * bits / 32, n],
                    format!("K = {k} rows of {bits}-bit codes packed along K, N = {n}"),
                ),
                (
                    "scales",
                    self.scales.shape(),
                    [groups, n],
                    format!(
                        "ceil(K / group size) = ceil({k} / {}) groups",
                        self.group_size
                    ),
                ),
                (
                    "qzeros",
                    self.qzeros.shape(),
                    [groups, n * bits / 32],
                    format!("{groups} groups of N = {n} {bits}-bit zero points packed along N"),
                ),
            ],
        )?;
        check_logical_shape("GPTQ", self.logical_shape, [k, n])?;
        Ok((k, n))
    }

    /// Bytes this layer's tensors take, by part, against its logical weights.
    pub fn storage(&self) -> Cost {
        let [k, n] = self.logical_shape;
        Cost {
            elements: k * n,
            code_bytes: 4 * self.qweight.len(),
            scale_bytes: 2 * self.scales.len(),
            zero_point_bytes: 4 * self.qzeros.len(),
            g_idx_bytes: 4 * self.g_idx.len(),
            extra_bytes: 0,
        }
    }
}

fn check_bits(bits: u32) -> Result<()> {
    if GPTQ_BITS.contains(&bits) {
        Ok(())
    } else {
        Err(FormatError::UnsupportedBits {
            format: "GPTQ",
            bits,
            supported: "2-, 3-, 4- or 8-bit",
        })
    }
}

fn max_code(bits: u32) -> u8 {
    ((1u32 << bits) - 1) as u8
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpw::{Container, FloatDtype, Format, ZeroPoints};
    use crate::logical::LogicalWeights;
    use bitpack::Bits;
    use ndarray::array;

    fn ramp(bits: u32, k: usize, n: usize, group_size: usize) -> LogicalWeights {
        let max = (1usize << bits) - 1;
        let groups = k.div_ceil(group_size);
        LogicalWeights::with_sequential_groups(
            bits,
            group_size,
            Array2::from_shape_fn((k, n), |(r, c)| ((r * 7 + c * 3) % (max + 1)) as u8),
            Array2::from_elem((groups, n), f16::from_f32(0.5)),
            Array2::from_shape_fn((groups, n), |(g, c)| (1 + (g + c) % max) as u8),
        )
        .unwrap()
    }

    #[test]
    fn four_bit_row_8r_plus_j_sits_at_bits_4j() {
        // Every column holds rows 0..8 = codes 0..7: word 0 of each column is 0x76543210.
        let codes = Array2::from_shape_fn((8, 8), |(r, _)| r as u8);
        let w = LogicalWeights::with_sequential_groups(
            4,
            8,
            codes,
            Array2::from_elem((1, 8), f16::ONE),
            Array2::from_shape_fn((1, 8), |(_, n)| n as u8),
        )
        .unwrap();
        let layer = pack(&w, ZeroConvention::V2).unwrap();
        assert_eq!(layer.qweight, array![[0x7654_3210; 8]]);
        // qzeros runs along N: column n at bits 4n.
        assert_eq!(layer.qzeros, array![[0x7654_3210]]);
    }

    #[test]
    fn v1_stores_zero_minus_one_and_v2_the_zero_itself() {
        let w = ramp(4, 8, 8, 8);
        let v1 = pack(&w, ZeroConvention::V1).unwrap();
        let v2 = pack(&w, ZeroConvention::V2).unwrap();
        assert_eq!(v1.qweight, v2.qweight);
        // zeros[0, c] = 1 + c: v2 fields 1..8, v1 fields 0..7.
        assert_eq!(v2.qzeros, array![[0x8765_4321u32 as i32]]);
        assert_eq!(v1.qzeros, array![[0x7654_3210]]);
        assert_eq!(unpack(&v1).unwrap(), w);
        assert_eq!(unpack(&v2).unwrap(), w);
    }

    #[test]
    fn reading_one_convention_as_the_other_shifts_every_zero_by_one() {
        let w = ramp(4, 8, 8, 8);
        let mut layer = pack(&w, ZeroConvention::V2).unwrap();
        layer.convention = ZeroConvention::V1;
        // Field 8 under v1 is zero 9, not 8: every weight moves by one step.
        let misread = unpack(&layer).unwrap();
        assert_eq!(misread.zeros()[[0, 7]], 9);
        assert_ne!(misread.dequantize(), w.dequantize());
    }

    #[test]
    fn v1_refuses_to_write_zero_point_0_and_to_read_a_wrapped_field() {
        let mut w = ramp(4, 8, 8, 8);
        let mut zeros = w.zeros().clone();
        zeros[[0, 3]] = 0;
        w = LogicalWeights::with_sequential_groups(
            4,
            8,
            w.codes().clone(),
            w.scales().clone(),
            zeros,
        )
        .unwrap();
        assert_eq!(
            pack(&w, ZeroConvention::V1),
            Err(FormatError::V1ZeroUnrepresentable {
                group: 0,
                col: 3,
                wrapped: 15,
                seen: 16
            })
        );
        let mut layer = pack(&w, ZeroConvention::V2).unwrap();
        layer.convention = ZeroConvention::V1;
        layer.qzeros[[0, 0]] = 0xF000;
        assert_eq!(
            unpack(&layer),
            Err(FormatError::V1ZeroFieldAmbiguous {
                group: 0,
                col: 3,
                field: 15,
                seen: 16,
                bits: 4
            })
        );
    }

    #[test]
    fn odd_sizes_are_padded_with_zero_weights_and_cropped_back() {
        let w = ramp(3, 45, 20, 16);
        let layer = pack(&w, ZeroConvention::V1).unwrap();
        // K 45 -> 64 (two 32-row column streams of 3 words), N 20 -> 32.
        assert_eq!(layer.qweight.dim(), (6, 32));
        assert_eq!(layer.scales.dim(), (4, 32));
        assert_eq!(layer.qzeros.dim(), (4, 3));
        assert_eq!(layer.logical_shape, [45, 20]);
        assert_eq!(unpack(&layer).unwrap(), w);
    }

    #[test]
    fn every_shape_the_format_implies_is_checked() {
        let layer = pack(&ramp(4, 64, 8, 16), ZeroConvention::V2).unwrap();
        let refused = |edit: &dyn Fn(&mut GptqLayer)| {
            let mut edited = layer.clone();
            edit(&mut edited);
            unpack(&edited).unwrap_err()
        };
        // Which tensor a shape mismatch names, with its shape and the expected one.
        let mismatch = |err: FormatError| match err {
            FormatError::ShapeMismatch {
                format: "GPTQ",
                tensor,
                found,
                expected,
                ..
            } => Some((tensor, found, expected)),
            _ => None,
        };
        // A wrong group size shows up as scales of the wrong height.
        assert_eq!(
            mismatch(refused(&|l| l.group_size = 32)),
            Some(("scales", vec![4, 8], vec![2, 8]))
        );
        assert_eq!(
            mismatch(refused(&|l| l.qweight = Array2::zeros((7, 8)))),
            Some(("qweight", vec![7, 8], vec![8, 8]))
        );
        assert_eq!(
            mismatch(refused(&|l| l.qzeros = Array2::zeros((4, 2)))),
            Some(("qzeros", vec![4, 2], vec![4, 1]))
        );
        assert_eq!(
            refused(&|l| l.g_idx.truncate(60)),
            FormatError::NotAligned {
                format: "GPTQ",
                what: "K (g_idx length)",
                found: 60,
                multiple: 8
            }
        );
        assert_eq!(
            refused(&|l| l.g_idx.clear()),
            FormatError::EmptyMatrix { rows: 0, cols: 8 }
        );
        assert_eq!(
            refused(&|l| l.logical_shape = [65, 8]),
            FormatError::LogicalShapeTooLarge {
                format: "GPTQ",
                logical: [65, 8],
                stored: [64, 8]
            }
        );
        assert_eq!(
            refused(&|l| l.g_idx[5] = -1),
            FormatError::NegativeGroupIndex { row: 5, group: -1 }
        );
        assert_eq!(
            refused(&|l| l.bits = 5),
            FormatError::UnsupportedBits {
                format: "GPTQ",
                bits: 5,
                supported: "2-, 3-, 4- or 8-bit"
            }
        );
    }

    #[test]
    fn storage_counts_every_tensor_and_agrees_with_the_bpw_model() {
        let layer = pack(&ramp(4, 128, 64, 32), ZeroConvention::V1).unwrap();
        let cost = layer.storage();
        assert_eq!(
            (cost.code_bytes, cost.metadata_bytes()),
            (4096, 128 + 512 + 512)
        );
        assert_eq!(cost.bits_per_element(), 5.125);
        // weights::bpw's model of GPTQ: one word stream per column, packed zeros, g_idx.
        let model = Format {
            zero_points: ZeroPoints::Packed,
            g_idx: true,
            container: Container::LineWords,
            ..Format::new(Bits::FOUR, 32, FloatDtype::F16)
        };
        assert_eq!(crate::bpw::cost(&model, 128, 64).unwrap(), cost);
    }
}
