//! AWQ, in AutoAWQ's GEMM layout: 4-bit only.
//!
//! Spec (K = in-features, N = out-features, G = K / group_size):
//! - Container: three tensors, `qweight` int32 [K, N/8], `qzeros` int32 [G, N/8],
//!   `scales` f16 [G, N]. No g_idx: row k is always in group k / group_size.
//! - Axis: packed along N, eight 4-bit columns per word.
//! - Slot order: word c of a row holds logical columns 8c + 0, 2, 4, 6, 1, 3, 5, 7 in slots
//!   0..8 (slot s at bits 4s). Readers such as vLLM undo it with the reverse order
//!   0, 4, 1, 5, 2, 6, 3, 7 (shifts 0, 16, 4, 20, 8, 24, 12, 28). The interleave suits the
//!   dequantization bit tricks of the kernel it was built for; to anyone else it is a
//!   permutation to undo.
//! - qzeros: the same packing and interleave over zeros[g, :]; the field is the true zero point
//!   (no "minus one").
//! - Signedness: int32 words; unpacking reinterprets them as u32, never sign-extends.
//! - Padding: K to a multiple of the group size, N to a multiple of 8, with zero weights; the
//!   logical size travels beside the tensors.
//!
//! Source layout followed: AutoAWQ 0.2.9 `WQLinear_GEMM.from_linear`; the conformance tests hold
//! this module to its bytes.

use half::f16;
use ndarray::{Array2, Axis};

use crate::bpw::Cost;
use crate::error::{FormatError, Result};
use crate::logical::LogicalWeights;
use crate::shape::{check_aligned, check_logical_shape, check_not_empty, check_tensor_shapes};
use bitpack::{Bits, stream as bits};

/// AWQ stores 4-bit codes only.
pub const AWQ_BITS: u32 = 4;

/// Slot s of each word holds logical column `AWQ_ORDER[s]` of its group of eight.
pub const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// Columns per word.
pub const PACK_FACTOR: usize = 8;

/// One AWQ GEMM layer's tensors, with its logical size.
#[derive(Debug, Clone, PartialEq)]
pub struct AwqLayer {
    /// Rows per group; G = K / group_size, row k in group k / group_size.
    pub group_size: usize,
    /// Codes packed along N in interleaved slots: [K, N/8].
    pub qweight: Array2<i32>,
    /// Zero points packed the same way: [G, N/8].
    pub qzeros: Array2<i32>,
    /// Scales: [G, N].
    pub scales: Array2<f16>,
    /// [K, N] before padding.
    pub logical_shape: [usize; 2],
}

/// Packs a logical matrix into AWQ tensors. The rows must already be in sequential groups
/// (AWQ has no g_idx); K is padded to the group size and N to 8 with zero weights.
pub fn pack(weights: &LogicalWeights) -> Result<AwqLayer> {
    check_bits(weights.bits())?;
    if let Some((row, group)) = weights.first_out_of_sequence() {
        return Err(FormatError::NeedsSequentialGroups {
            format: "AWQ",
            group_size: weights.group_size(),
            row,
            group,
        });
    }
    let padded = weights.padded(weights.group_size(), PACK_FACTOR);
    let groups = padded.k() / padded.group_size();
    // A sequential matrix may still carry unused trailing groups; AWQ has exactly K / g.
    let scales = padded.scales().slice(ndarray::s![..groups, ..]).to_owned();
    let zeros = padded.zeros().slice(ndarray::s![..groups, ..]).to_owned();
    Ok(AwqLayer {
        group_size: padded.group_size(),
        qweight: pack_rows(padded.codes())?,
        qzeros: pack_rows(&zeros)?,
        scales,
        logical_shape: [weights.k(), weights.n()],
    })
}

/// Unpacks AWQ tensors into the logical matrix (sequential groups), cropped to the logical
/// shape, after checking every shape against the format.
pub fn unpack(layer: &AwqLayer) -> Result<LogicalWeights> {
    let (_, n) = layer.check_shapes()?;
    let stored = LogicalWeights::with_sequential_groups(
        AWQ_BITS,
        layer.group_size,
        unpack_rows(&layer.qweight, n)?,
        layer.scales.clone(),
        unpack_rows(&layer.qzeros, n)?,
    )?;
    let [k, n] = layer.logical_shape;
    stored.cropped(k, n)
}

impl AwqLayer {
    /// Checks every tensor's shape against the format; returns the stored (padded) K and N.
    pub fn check_shapes(&self) -> Result<(usize, usize)> {
        if self.group_size == 0 {
            return Err(FormatError::ZeroGroupSize);
        }
        let k = self.qweight.nrows();
        let n = self.scales.ncols();
        check_not_empty(k, n)?;
        check_aligned("AWQ", "K (qweight rows)", k, self.group_size)?;
        check_aligned("AWQ", "N (scales columns)", n, PACK_FACTOR)?;
        let groups = k / self.group_size;
        check_tensor_shapes(
            "AWQ",
            [
                (
                    "qweight",
                    self.qweight.shape(),
                    [k, n / PACK_FACTOR],
                    format!("K = {k} rows of N = {n} 4-bit codes packed along N"),
                ),
                (
                    "scales",
                    self.scales.shape(),
                    [groups, n],
                    format!("K / group size = {k} / {} groups", self.group_size),
                ),
                (
                    "qzeros",
                    self.qzeros.shape(),
                    [groups, n / PACK_FACTOR],
                    format!("{groups} groups of N = {n} 4-bit zero points packed along N"),
                ),
            ],
        )?;
        check_logical_shape("AWQ", self.logical_shape, [k, n])?;
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
            g_idx_bytes: 0,
            extra_bytes: 0,
        }
    }
}

fn check_bits(bits: u32) -> Result<()> {
    if bits == AWQ_BITS {
        Ok(())
    } else {
        Err(FormatError::UnsupportedBits {
            format: "AWQ (GEMM)",
            bits,
            supported: "4-bit",
        })
    }
}

/// Packs each row of `values` [rows, N] into N/8 interleaved words: [rows, N/8].
fn pack_rows(values: &Array2<u8>) -> Result<Array2<i32>> {
    let mut packed = Array2::<i32>::zeros((values.nrows(), values.ncols() / PACK_FACTOR));
    for (row, mut out) in values.axis_iter(Axis(0)).zip(packed.axis_iter_mut(Axis(0))) {
        let slots: Vec<u8> = row
            .to_vec()
            .chunks_exact(PACK_FACTOR)
            .flat_map(|eight| AWQ_ORDER.map(|column| eight[column]))
            .collect();
        let stream = bits::pack_i32_words(Bits::FOUR, &slots)?;
        out.assign(&ndarray::ArrayView1::from(&stream));
    }
    Ok(packed)
}

/// Unpacks each row of `packed` [rows, N/8] into N logical columns: [rows, N].
fn unpack_rows(packed: &Array2<i32>, n: usize) -> Result<Array2<u8>> {
    let mut values = Array2::<u8>::zeros((packed.nrows(), n));
    for (row, mut out) in packed.axis_iter(Axis(0)).zip(values.axis_iter_mut(Axis(0))) {
        let slots = bits::unpack_i32_words(Bits::FOUR, &row.to_vec(), n)?;
        for (group, eight) in slots.chunks_exact(PACK_FACTOR).enumerate() {
            for (slot, &value) in eight.iter().enumerate() {
                out[group * PACK_FACTOR + AWQ_ORDER[slot]] = value;
            }
        }
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    fn columns_0_to_7() -> LogicalWeights {
        LogicalWeights::with_sequential_groups(
            4,
            1,
            array![[0, 1, 2, 3, 4, 5, 6, 7]],
            Array2::from_elem((1, 8), f16::ONE),
            array![[1, 2, 3, 4, 5, 6, 7, 8]],
        )
        .unwrap()
    }

    #[test]
    fn columns_0_to_7_land_in_slots_0_2_4_6_1_3_5_7() {
        let layer = pack(&columns_0_to_7()).unwrap();
        // Slot s (bits 4s) holds column AWQ_ORDER[s]: nibbles, low to high, 0 2 4 6 1 3 5 7.
        assert_eq!(layer.qweight, array![[0x7531_6420]]);
        assert_eq!(layer.qzeros, array![[0x8642_7531u32 as i32]]);
        assert_eq!(unpack(&layer).unwrap(), columns_0_to_7());
    }

    #[test]
    fn reverse_order_shifts_read_columns_back() {
        // vLLM's reader: column j of a word is at shift REVERSE_SHIFTS[j].
        const REVERSE_SHIFTS: [u32; 8] = [0, 16, 4, 20, 8, 24, 12, 28];
        let word = pack(&columns_0_to_7()).unwrap().qweight[[0, 0]] as u32;
        let columns: Vec<u32> = REVERSE_SHIFTS.iter().map(|s| (word >> s) & 0xF).collect();
        assert_eq!(columns, (0..8).collect::<Vec<u32>>());
    }

    #[test]
    fn refuses_scattered_groups_and_other_widths() {
        let scattered = LogicalWeights::new(
            4,
            1,
            Array2::zeros((2, 8)),
            Array2::from_elem((2, 8), f16::ONE),
            Array2::zeros((2, 8)),
            vec![1, 0],
        )
        .unwrap();
        assert_eq!(
            pack(&scattered),
            Err(FormatError::NeedsSequentialGroups {
                format: "AWQ",
                group_size: 1,
                row: 0,
                group: 1
            })
        );
        let eight_bit = LogicalWeights::with_sequential_groups(
            8,
            1,
            Array2::zeros((1, 8)),
            Array2::from_elem((1, 8), f16::ONE),
            Array2::zeros((1, 8)),
        )
        .unwrap();
        assert_eq!(
            pack(&eight_bit),
            Err(FormatError::UnsupportedBits {
                format: "AWQ (GEMM)",
                bits: 8,
                supported: "4-bit"
            })
        );
    }

    #[test]
    fn odd_sizes_are_padded_to_the_group_and_to_8_columns() {
        let w = LogicalWeights::with_sequential_groups(
            4,
            32,
            Array2::from_shape_fn((40, 13), |(k, n)| ((k * 7 + n * 3) % 16) as u8),
            Array2::from_elem((2, 13), f16::from_f32(0.25)),
            Array2::from_elem((2, 13), 3),
        )
        .unwrap();
        let layer = pack(&w).unwrap();
        assert_eq!(layer.qweight.dim(), (64, 2));
        assert_eq!(layer.scales.dim(), (2, 16));
        assert_eq!(unpack(&layer).unwrap(), w);
    }

    #[test]
    fn storage_has_no_g_idx() {
        let w = LogicalWeights::with_sequential_groups(
            4,
            32,
            Array2::zeros((128, 64)),
            Array2::from_elem((4, 64), f16::ONE),
            Array2::from_elem((4, 64), 8),
        )
        .unwrap();
        let cost = pack(&w).unwrap().storage();
        assert_eq!((cost.code_bytes, cost.metadata_bytes()), (4096, 128 + 512));
        assert_eq!(cost.bits_per_element(), 4.625);
    }
}
