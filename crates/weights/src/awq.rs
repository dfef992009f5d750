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
use ndarray::Array2;

use crate::bpw::Cost;
use crate::error::{FormatError, Result};
use crate::gptq::{reusable, reuse_buffer};
use crate::logical::{LogicalWeights, sequential_g_idx};
use crate::shape::{check_aligned, check_logical_shape, check_not_empty, check_tensor_shapes};

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
///
/// Row by row, eight codes (one little-endian u64) into one word with shifts and masks; padded
/// places are written from their group's zero point as they are packed, without building the
/// padded matrix. Byte-for-byte the output of [`reference::pack`].
pub fn pack(weights: &LogicalWeights) -> Result<AwqLayer> {
    let mut layer = AwqLayer {
        group_size: weights.group_size(),
        qweight: Array2::zeros((0, 0)),
        qzeros: Array2::zeros((0, 0)),
        scales: Array2::from_elem((0, 0), f16::ZERO),
        logical_shape: [0, 0],
    };
    pack_into(weights, &mut layer)?;
    Ok(layer)
}

/// [`pack`] into an existing layer, overwriting every field and reusing the memory of its
/// qweight and qzeros where their shapes already fit (a fresh qweight costs about as much in
/// page faults as the packing itself). On an error `layer` is unchanged.
pub fn pack_into(weights: &LogicalWeights, layer: &mut AwqLayer) -> Result<()> {
    check_bits(weights.bits())?;
    if let Some((row, group)) = weights.first_out_of_sequence() {
        return Err(FormatError::NeedsSequentialGroups {
            format: "AWQ",
            group_size: weights.group_size(),
            row,
            group,
        });
    }
    let (k, n) = (weights.k(), weights.n());
    let group_size = weights.group_size();
    let (padded_k, padded_n) = (
        k.next_multiple_of(group_size),
        n.next_multiple_of(PACK_FACTOR),
    );
    let parts = weights.padded_parts(padded_k, padded_n);
    let groups = padded_k / group_size;
    // A sequential matrix may still carry unused trailing groups; AWQ has exactly K / g.
    let scales = parts.scales.slice(ndarray::s![..groups, ..]).to_owned();
    let zeros = parts.zeros.slice(ndarray::s![..groups, ..]).to_owned();
    let pad = parts
        .zeros
        .as_slice()
        .expect("padded zeros are in standard layout");
    let pad_row = |row: usize| {
        let group = parts.g_idx[row] as usize;
        &pad[group * padded_n..(group + 1) * padded_n]
    };

    let words = padded_n / PACK_FACTOR;
    let codes = weights.codes().as_standard_layout();
    let codes = codes
        .as_slice()
        .expect("a standard-layout array has a slice");
    let out = reusable(&mut layer.qweight, (padded_k, words));
    let whole = n / PACK_FACTOR;
    for (row, out) in out.chunks_exact_mut(words).enumerate() {
        if row < k {
            let logical = &codes[row * n..(row + 1) * n];
            let (main, last) = out.split_at_mut(whole);
            pack_words(&logical[..whole * PACK_FACTOR], main);
            if let Some(last) = last.first_mut() {
                // The last word mixes the row's last codes and padded columns.
                let mut eight = [0u8; PACK_FACTOR];
                let split = n - whole * PACK_FACTOR;
                eight[..split].copy_from_slice(&logical[whole * PACK_FACTOR..]);
                eight[split..].copy_from_slice(&pad_row(row)[n..]);
                *last = pack_word(eight);
            }
        } else {
            pack_words(pad_row(row), out);
        }
    }
    pack_words(
        zeros
            .as_slice()
            .expect("an owned slice is in standard layout"),
        reusable(&mut layer.qzeros, (groups, words)),
    );
    layer.group_size = group_size;
    layer.scales = scales;
    layer.logical_shape = [k, n];
    Ok(())
}

/// Unpacks AWQ tensors into the logical matrix (sequential groups), cropped to the logical
/// shape, after checking every shape against the format.
///
/// Decodes only the logical rows and columns, straight into the cropped codes; the result, and
/// the error for a malformed layer, are those of [`reference::unpack`].
pub fn unpack(layer: &AwqLayer) -> Result<LogicalWeights> {
    unpack_with(layer, Vec::new())
}

/// [`unpack`] into an existing matrix, reusing the memory of its codes when it is large enough
/// (a fresh [K, N] allocation costs more in page faults than the decoding). On an error `out`
/// is left a valid but unspecified matrix.
pub fn unpack_into(layer: &AwqLayer, out: &mut LogicalWeights) -> Result<()> {
    let (buffer, _) = out.take_codes().into_raw_vec_and_offset();
    *out = unpack_with(layer, buffer)?;
    Ok(())
}

fn unpack_with(layer: &AwqLayer, buffer: Vec<u8>) -> Result<LogicalWeights> {
    let (stored_k, stored_n) = layer.check_shapes()?;
    let [k, n] = layer.logical_shape;
    let words = stored_n / PACK_FACTOR;
    let qweight = layer.qweight.as_standard_layout();
    let qweight = qweight
        .as_slice()
        .expect("a standard-layout array has a slice");
    let mut codes = reuse_buffer(buffer, k * n);
    let whole = n / PACK_FACTOR;
    for (out, words) in codes.chunks_exact_mut(n).zip(qweight.chunks_exact(words)) {
        let (main, last) = out.split_at_mut(whole * PACK_FACTOR);
        unpack_words(&words[..whole], main);
        if !last.is_empty() {
            last.copy_from_slice(&unpack_word(words[whole])[..last.len()]);
        }
    }
    let codes = Array2::from_shape_vec((k, n), codes).expect("k * n codes");

    let groups = layer.qzeros.nrows();
    let qzeros = layer.qzeros.as_standard_layout();
    let mut zeros = vec![0u8; groups * stored_n];
    unpack_words(
        qzeros
            .as_slice()
            .expect("a standard-layout array has a slice"),
        &mut zeros,
    );
    let zeros = Array2::from_shape_vec((groups, stored_n), zeros).expect("groups * N zeros");
    // As LogicalWeights::cropped: the stored metadata when nothing was padded, else the groups
    // the kept rows use.
    let (scales, zeros) = if (k, n) == (stored_k, stored_n) {
        (layer.scales.clone(), zeros)
    } else {
        let used = (k - 1) / layer.group_size + 1;
        (
            layer.scales.slice(ndarray::s![..used, ..n]).to_owned(),
            zeros.slice(ndarray::s![..used, ..n]).to_owned(),
        )
    };
    LogicalWeights::from_decoded(
        AWQ_BITS,
        layer.group_size,
        codes,
        scales,
        zeros,
        sequential_g_idx(k, layer.group_size),
    )
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

/// Eight codes (each at most 15), columns 8c..8c+8, into word c: slot s (bits 4s) holds
/// column [`AWQ_ORDER`]\[s\].
///
/// As a little-endian u64, byte i is column i. `x | x >> 12` puts columns (0, 2), (1, 3),
/// (4, 6), (5, 7) as nibble pairs in bytes 0, 1, 4, 5; the word's bytes are those pairs in the
/// order 0, 4, 1, 5.
#[inline(always)]
fn pack_word(eight: [u8; PACK_FACTOR]) -> i32 {
    let x = u64::from_le_bytes(eight);
    let y = x | x >> 12;
    let word = (y & 0xFF) | (y >> 24 & 0xFF00) | (y << 8 & 0xFF_0000) | (y >> 16 & 0xFF00_0000);
    word as u32 as i32
}

/// The inverse of [`pack_word`]: the word's bytes back to bytes 0, 4, 1, 5 of a u64, then each
/// nibble pair split into two bytes.
#[inline(always)]
fn unpack_word(word: i32) -> [u8; PACK_FACTOR] {
    let w = u64::from(word as u32);
    let y = (w & 0xFF) | (w & 0xFF00) << 24 | (w >> 8 & 0xFF00) | (w & 0xFF00_0000) << 16;
    const LOW: u64 = 0x0000_0F0F_0000_0F0F;
    ((y & LOW) | (y >> 4 & LOW) << 16).to_le_bytes()
}

/// Packs `codes` (8 per word) into `words`, one word per eight columns.
fn pack_words(codes: &[u8], words: &mut [i32]) {
    debug_assert_eq!(codes.len(), PACK_FACTOR * words.len());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { pack_words_avx2(codes, words) };
        return;
    }
    for (word, eight) in words.iter_mut().zip(codes.chunks_exact(PACK_FACTOR)) {
        *word = pack_word(eight.try_into().expect("eight codes"));
    }
}

/// [`pack_words`] eight words (64 codes) at a time with AVX2: [`pack_word`]'s `x | x >> 12` on
/// each u64, then a byte shuffle picks bytes 0, 4, 1, 5 of each u64; the rest as
/// [`pack_word`].
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn pack_words_avx2(codes: &[u8], words: &mut [i32]) {
    use std::arch::x86_64::*;
    // Within each 128-bit lane: bytes 0, 4, 1, 5 of the first u64, 8, 12, 9, 13 of the second.
    let order = _mm256_setr_epi8(
        0, 4, 1, 5, 8, 12, 9, 13, -1, -1, -1, -1, -1, -1, -1, -1, //
        0, 4, 1, 5, 8, 12, 9, 13, -1, -1, -1, -1, -1, -1, -1, -1,
    );
    let mut codes = codes.chunks_exact(8 * PACK_FACTOR);
    let mut words = words.chunks_exact_mut(8);
    for (codes, words) in (&mut codes).zip(&mut words) {
        let codes: &[u8; 8 * PACK_FACTOR] = codes.try_into().expect("64 codes");
        let words: &mut [i32; 8] = words.try_into().expect("8 words");
        // SAFETY: `codes` is 64 readable bytes; loadu needs no alignment.
        let (a, b) = unsafe {
            (
                _mm256_loadu_si256(codes.as_ptr().cast()),
                _mm256_loadu_si256(codes.as_ptr().add(32).cast()),
            )
        };
        let pa = _mm256_shuffle_epi8(_mm256_or_si256(a, _mm256_srli_epi64::<12>(a)), order);
        let pb = _mm256_shuffle_epi8(_mm256_or_si256(b, _mm256_srli_epi64::<12>(b)), order);
        // Words 0-1 and 2-3 of `a` (then `b`) sit in the low halves of the two lanes.
        let w = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_unpacklo_epi64(pa, pb));
        // SAFETY: `words` is 32 writable bytes; storeu needs no alignment.
        unsafe { _mm256_storeu_si256(words.as_mut_ptr().cast(), w) };
    }
    for (word, eight) in words
        .into_remainder()
        .iter_mut()
        .zip(codes.remainder().chunks_exact(8))
    {
        *word = pack_word(eight.try_into().expect("eight codes"));
    }
}

/// Unpacks `words` into `codes`, eight columns per word.
fn unpack_words(words: &[i32], codes: &mut [u8]) {
    debug_assert_eq!(codes.len(), PACK_FACTOR * words.len());
    for (eight, &word) in codes.chunks_exact_mut(PACK_FACTOR).zip(words) {
        eight.copy_from_slice(&unpack_word(word));
    }
}

/// The straightforward implementation, kept as the oracle the fast [`pack`] and [`unpack`] are
/// tested against bit for bit: it pads the whole matrix, then packs row by row through
/// `bitpack`'s word streams. Slow; not for production use.
pub mod reference {
    use ndarray::{Array2, Axis};

    use super::{AWQ_BITS, AWQ_ORDER, AwqLayer, PACK_FACTOR, check_bits};
    use crate::error::{FormatError, Result};
    use crate::logical::LogicalWeights;
    use bitpack::{Bits, stream as bits};

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
