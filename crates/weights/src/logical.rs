//! The logical matrix: what every integer weight format means, with no layout left in it.
//!
//! Spec:
//! - `codes` [K, N] u8: one unsigned b-bit code per weight, K = in-features (rows), N =
//!   out-features (columns), 1 <= b <= 8, every code <= 2^b - 1.
//! - `scales` [G, N] f16 and `zeros` [G, N] u8: per group and column, the scale and the TRUE zero
//!   point (0..=2^b - 1; no convention's "minus one" in it).
//! - `g_idx` \[K\]: the group of each row, < G. Sequential groups have `g_idx[k] = k / group_size`;
//!   act-order checkpoints scatter them.
//! - Weight: `w[k, n] = f32(scale[g, n]) * ((code[k, n] - zero[g, n]) as f32)` with `g = g_idx[k]`,
//!   exactly as AutoGPTQ, GPTQModel and AutoAWQ's readers compute it (checked against their
//!   outputs in the conformance tests).
//!
//! Packers pad K and N with zero weights (a padded row or column takes its group's zero point as
//! its code, so it dequantizes to exactly zero; a group that holds only padding gets scale 0) and
//! record the logical size; unpackers crop back to it.

use half::f16;
use ndarray::{Array2, Axis, s};

use crate::error::{FormatError, Result};
use crate::shape::check_logical_shape;

/// One layer's weights with no layout left in them: codes, scales, true zero points and g_idx,
/// checked to agree with each other (see the module spec). Build it with [`Self::new`] or
/// [`Self::with_sequential_groups`]; every packer takes it and every unpacker returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct LogicalWeights {
    bits: u32,
    group_size: usize,
    codes: Array2<u8>,
    scales: Array2<f16>,
    zeros: Array2<u8>,
    g_idx: Vec<u32>,
}

impl LogicalWeights {
    /// Checks that the parts agree: shapes, code and zero ranges, and every g_idx below G.
    pub fn new(
        bits: u32,
        group_size: usize,
        codes: Array2<u8>,
        scales: Array2<f16>,
        zeros: Array2<u8>,
        g_idx: Vec<u32>,
    ) -> Result<Self> {
        let weights = LogicalWeights {
            bits,
            group_size,
            codes,
            scales,
            zeros,
            g_idx,
        };
        weights.validate()?;
        Ok(weights)
    }

    /// A matrix whose rows are in sequential groups: `g_idx[k] = k / group_size`.
    pub fn with_sequential_groups(
        bits: u32,
        group_size: usize,
        codes: Array2<u8>,
        scales: Array2<f16>,
        zeros: Array2<u8>,
    ) -> Result<Self> {
        if group_size == 0 {
            return Err(FormatError::ZeroGroupSize);
        }
        let g_idx = sequential_g_idx(codes.nrows(), group_size);
        Self::new(bits, group_size, codes, scales, zeros, g_idx)
    }

    /// [`Self::new`] for codes just decoded from b-bit fields, which are in range by
    /// construction: every check but the scan of the codes' range (a debug assertion), with
    /// the same errors in the same order.
    pub(crate) fn from_decoded(
        bits: u32,
        group_size: usize,
        codes: Array2<u8>,
        scales: Array2<f16>,
        zeros: Array2<u8>,
        g_idx: Vec<u32>,
    ) -> Result<Self> {
        let weights = LogicalWeights {
            bits,
            group_size,
            codes,
            scales,
            zeros,
            g_idx,
        };
        weights.validate_parts()?;
        debug_assert_eq!(check_range("code", &weights.codes, weights.bits), Ok(()));
        check_range("zero point", &weights.zeros, weights.bits)?;
        Ok(weights)
    }

    /// Takes this matrix's codes (as a buffer to reuse), leaving a valid 1 x 1 matrix of the
    /// same width in its place.
    pub(crate) fn take_codes(&mut self) -> Array2<u8> {
        let placeholder = LogicalWeights {
            bits: self.bits,
            group_size: 1,
            codes: Array2::zeros((1, 1)),
            scales: Array2::from_elem((1, 1), f16::ZERO),
            zeros: Array2::zeros((1, 1)),
            g_idx: vec![0],
        };
        std::mem::replace(self, placeholder).codes
    }

    fn validate(&self) -> Result<()> {
        self.validate_parts()?;
        check_range("code", &self.codes, self.bits)?;
        check_range("zero point", &self.zeros, self.bits)
    }

    /// Every check of [`Self::validate`] before the value ranges.
    fn validate_parts(&self) -> Result<()> {
        if !(1..=8).contains(&self.bits) {
            return Err(FormatError::UnsupportedBits {
                format: "the logical matrix",
                bits: self.bits,
                supported: "1- to 8-bit",
            });
        }
        if self.group_size == 0 {
            return Err(FormatError::ZeroGroupSize);
        }
        let (k, n) = self.codes.dim();
        if k == 0 || n == 0 {
            return Err(FormatError::EmptyMatrix { rows: k, cols: n });
        }
        let groups = self.scales.nrows();
        let mismatch = |tensor, found: &[usize], expected: Vec<usize>, why: &str| {
            Err(FormatError::ShapeMismatch {
                format: "logical",
                tensor,
                found: found.to_vec(),
                expected,
                why: why.to_string(),
            })
        };
        if groups == 0 || self.scales.ncols() != n {
            return mismatch(
                "scales",
                self.scales.shape(),
                vec![groups.max(1), n],
                "one row per group, one column per output",
            );
        }
        if self.zeros.dim() != (groups, n) {
            return mismatch(
                "zeros",
                self.zeros.shape(),
                vec![groups, n],
                "the same shape as scales",
            );
        }
        if self.g_idx.len() != k {
            return mismatch("g_idx", &[self.g_idx.len()], vec![k], "one entry per row");
        }
        if let Some((row, &group)) = self
            .g_idx
            .iter()
            .enumerate()
            .find(|(_, g)| **g as usize >= groups)
        {
            return Err(FormatError::GroupIndexOutOfRange { row, group, groups });
        }
        Ok(())
    }

    /// Code width b, 1 to 8.
    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// Rows per group (of sequential groups; act-order groups hold as many, scattered).
    pub fn group_size(&self) -> usize {
        self.group_size
    }

    /// Rows: in-features.
    pub fn k(&self) -> usize {
        self.codes.nrows()
    }

    /// Columns: out-features.
    pub fn n(&self) -> usize {
        self.codes.ncols()
    }

    /// Groups G: rows of scales and zeros.
    pub fn groups(&self) -> usize {
        self.scales.nrows()
    }

    /// Codes [K, N], each at most 2^b - 1.
    pub fn codes(&self) -> &Array2<u8> {
        &self.codes
    }

    /// Scales [G, N].
    pub fn scales(&self) -> &Array2<f16> {
        &self.scales
    }

    /// True zero points [G, N] (no convention applied).
    pub fn zeros(&self) -> &Array2<u8> {
        &self.zeros
    }

    /// The group of each row \[K\].
    pub fn g_idx(&self) -> &[u32] {
        &self.g_idx
    }

    /// Whether row k is in group k / group_size for every k.
    pub fn has_sequential_groups(&self) -> bool {
        self.first_out_of_sequence().is_none()
    }

    /// The first row that is not in group k / group_size, with its group.
    pub fn first_out_of_sequence(&self) -> Option<(usize, u32)> {
        self.g_idx
            .iter()
            .enumerate()
            .find(|(k, g)| **g as usize != k / self.group_size)
            .map(|(k, g)| (k, *g))
    }

    /// The weights as the libraries' readers compute them, in f32.
    pub fn dequantize(&self) -> Array2<f32> {
        Array2::from_shape_fn(self.codes.dim(), |(k, n)| {
            let g = self.g_idx[k] as usize;
            let steps = i16::from(self.codes[[k, n]]) - i16::from(self.zeros[[g, n]]);
            self.scales[[g, n]].to_f32() * f32::from(steps)
        })
    }

    /// Rows reordered so groups are contiguous and sequential, for layouts without g_idx.
    ///
    /// Returns the reordered matrix and the permutation `perm` (row k of the result is row
    /// `perm[k]` of this one), or `None` when the rows already are in sequential groups. The
    /// layer's input activations must be permuted the same way: `x_new[k] = x[perm[k]]`.
    pub fn into_sequential_groups(self) -> Result<(Self, Option<Vec<u32>>)> {
        if self.has_sequential_groups() {
            return Ok((self, None));
        }
        // A stable sort keeps rows of one group in their original order.
        let mut perm: Vec<u32> = (0..self.k() as u32).collect();
        self.check_group_counts()?;
        perm.sort_by_key(|&k| self.g_idx[k as usize]);
        let codes = self.codes.select(Axis(0), &to_usize(&perm));
        let g_idx = sequential_g_idx(self.k(), self.group_size);
        let sorted = Self::new(
            self.bits,
            self.group_size,
            codes,
            self.scales,
            self.zeros,
            g_idx,
        )?;
        Ok((sorted, Some(perm)))
    }

    /// Undoes a recorded row permutation: row k of this matrix goes back to row `perm[k]`, its
    /// g_idx entry with it. It inverts [`Self::into_sequential_groups`] exactly:
    /// `sorted.with_rows_restored(&perm)` is the act-order matrix again, scattered g_idx
    /// included. `perm` must be a permutation of this matrix's rows ([`check_permutation`]).
    pub fn with_rows_restored(self, perm: &[u32]) -> Result<Self> {
        check_permutation(perm, self.k())?;
        let mut inverse = vec![0usize; perm.len()];
        for (k, &original) in perm.iter().enumerate() {
            inverse[original as usize] = k;
        }
        let codes = self.codes.select(Axis(0), &inverse);
        let g_idx = inverse.iter().map(|&k| self.g_idx[k]).collect();
        Self::new(
            self.bits,
            self.group_size,
            codes,
            self.scales,
            self.zeros,
            g_idx,
        )
    }

    /// Sorting rows by group gives sequential groups only when every group but the last holds
    /// exactly group_size rows and the last holds the rest.
    fn check_group_counts(&self) -> Result<()> {
        let mut counts = vec![0usize; self.groups()];
        for &g in &self.g_idx {
            counts[g as usize] += 1;
        }
        let sequential_groups = self.k().div_ceil(self.group_size);
        for (group, &rows) in counts.iter().enumerate() {
            let expected = if group + 1 < sequential_groups {
                self.group_size
            } else if group + 1 == sequential_groups {
                self.k() - group * self.group_size
            } else {
                0
            };
            if rows != expected {
                return Err(FormatError::GroupsNotContiguous {
                    group_size: self.group_size,
                    group,
                    rows,
                    expected,
                });
            }
        }
        Ok(())
    }

    /// Pads K and N up to multiples of `k_multiple` and `n_multiple` with zero weights.
    ///
    /// New rows continue the sequential groups (row k in group k / group_size); a group made of
    /// padding alone, and every padded column, gets scale 0 and the mid-range zero point
    /// 2^(b-1) (valid under every convention); each padded weight's code is its zero point.
    pub fn padded(&self, k_multiple: usize, n_multiple: usize) -> Self {
        let (k, n) = (self.k(), self.n());
        let (padded_k, padded_n) = (
            k.next_multiple_of(k_multiple),
            n.next_multiple_of(n_multiple),
        );
        if (padded_k, padded_n) == (k, n) {
            return self.clone();
        }
        let PaddedParts {
            g_idx,
            scales,
            zeros,
        } = self.padded_parts(padded_k, padded_n);
        let mut codes = Array2::from_shape_fn((padded_k, padded_n), |(row, col)| {
            zeros[[g_idx[row] as usize, col]]
        });
        codes.slice_mut(s![..k, ..n]).assign(&self.codes);
        LogicalWeights {
            bits: self.bits,
            group_size: self.group_size,
            codes,
            scales,
            zeros,
            g_idx,
        }
    }

    /// Everything [`Self::padded`] makes but the codes, for a padded size of `padded_k` x
    /// `padded_n` (at least the current size): g_idx extended with sequential groups, and
    /// scales and zeros grown to the groups it uses and to `padded_n` columns (scale 0 and the
    /// mid-range zero point in every new place). The padded code at (row, col) is
    /// `zeros[g_idx[row], col]`, so packers can write it without building the padded codes.
    pub(crate) fn padded_parts(&self, padded_k: usize, padded_n: usize) -> PaddedParts {
        let (k, n) = (self.k(), self.n());
        debug_assert!(padded_k >= k && padded_n >= n);
        let mut g_idx = self.g_idx.clone();
        g_idx.extend((k..padded_k).map(|row| (row / self.group_size) as u32));
        let groups = self
            .groups()
            .max(g_idx.iter().max().map_or(0, |&g| g as usize + 1));
        let mid = 1u8 << (self.bits - 1);
        let mut scales = Array2::from_elem((groups, padded_n), f16::ZERO);
        let mut zeros = Array2::from_elem((groups, padded_n), mid);
        scales
            .slice_mut(s![..self.groups(), ..n])
            .assign(&self.scales);
        zeros
            .slice_mut(s![..self.groups(), ..n])
            .assign(&self.zeros);
        PaddedParts {
            g_idx,
            scales,
            zeros,
        }
    }

    /// The top-left `k` x `n` of a padded matrix, keeping the groups its rows use.
    pub fn cropped(&self, k: usize, n: usize) -> Result<Self> {
        check_logical_shape("logical", [k, n], [self.k(), self.n()])?;
        if (k, n) == (self.k(), self.n()) {
            return Ok(self.clone());
        }
        let g_idx = self.g_idx[..k].to_vec();
        let groups = g_idx.iter().max().map_or(1, |&g| g as usize + 1);
        Self::new(
            self.bits,
            self.group_size,
            self.codes.slice(s![..k, ..n]).to_owned(),
            self.scales.slice(s![..groups, ..n]).to_owned(),
            self.zeros.slice(s![..groups, ..n]).to_owned(),
            g_idx,
        )
    }
}

/// The metadata of a padded matrix ([`LogicalWeights::padded_parts`]); `scales` and `zeros`
/// are in standard (row-major) layout.
pub(crate) struct PaddedParts {
    pub(crate) g_idx: Vec<u32>,
    pub(crate) scales: Array2<f16>,
    pub(crate) zeros: Array2<u8>,
}

/// g_idx of sequential groups: row k in group k / group_size.
pub fn sequential_g_idx(rows: usize, group_size: usize) -> Vec<u32> {
    (0..rows).map(|k| (k / group_size) as u32).collect()
}

/// Checks that `perm` is a permutation of the rows 0..rows: exactly `rows` entries, each row
/// exactly once. A recorded permutation that fails this cannot be applied (an entry past the
/// last row) or loses rows (a repeated entry), so it is refused rather than used.
pub fn check_permutation(perm: &[u32], rows: usize) -> Result<()> {
    if perm.len() != rows {
        return Err(FormatError::PermutationLength {
            found: perm.len(),
            rows,
        });
    }
    let mut seen_at: Vec<Option<usize>> = vec![None; rows];
    for (index, &value) in perm.iter().enumerate() {
        match seen_at.get_mut(value as usize) {
            None => return Err(FormatError::PermutationPastEnd { rows, index, value }),
            Some(Some(first)) => {
                return Err(FormatError::PermutationRepeatsRow {
                    rows,
                    index,
                    value,
                    first: *first,
                });
            }
            Some(slot) => *slot = Some(index),
        }
    }
    Ok(())
}

fn to_usize(perm: &[u32]) -> Vec<usize> {
    perm.iter().map(|&k| k as usize).collect()
}

fn check_range(what: &'static str, values: &Array2<u8>, bits: u32) -> Result<()> {
    let max = ((1u32 << bits) - 1) as u8;
    // The common case (everything in range) as a vectorizable maximum over the memory; only a
    // matrix with an out-of-range value is searched again, in logical order, for the first one.
    let in_range = match values.as_slice_memory_order() {
        Some(slice) => slice
            .chunks(1 << 12)
            .all(|chunk| chunk.iter().fold(0, |m, &v| m.max(v)) <= max),
        None => values.iter().all(|&v| v <= max),
    };
    if in_range {
        return Ok(());
    }
    match values.indexed_iter().find(|(_, v)| **v > max) {
        Some(((row, col), &value)) => Err(FormatError::CodeOutOfRange {
            what,
            row,
            col,
            value,
            bits,
            max,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    fn f16s(values: &[[f32; 2]]) -> Array2<f16> {
        Array2::from_shape_fn((values.len(), 2), |(g, n)| f16::from_f32(values[g][n]))
    }

    /// 4 rows x 2 columns, 4-bit, groups of 2.
    fn small() -> LogicalWeights {
        LogicalWeights::with_sequential_groups(
            4,
            2,
            array![[0, 15], [7, 8], [1, 2], [3, 4]],
            f16s(&[[0.5, 1.0], [2.0, 0.25]]),
            array![[8, 8], [1, 15]],
        )
        .unwrap()
    }

    #[test]
    fn dequantize_is_scale_times_code_minus_zero() {
        let w = small().dequantize();
        assert_eq!(
            w,
            array![[-4.0, 7.0], [-0.5, 0.0], [0.0, -3.25], [4.0, -2.75]]
        );
    }

    #[test]
    fn padding_adds_zero_weights_and_cropping_removes_them() {
        let w = small();
        let padded = w.padded(8, 8);
        assert_eq!((padded.k(), padded.n(), padded.groups()), (8, 8, 4));
        let deq = padded.dequantize();
        assert_eq!(deq.slice(s![..4, ..2]), w.dequantize());
        assert!(
            deq.indexed_iter()
                .all(|((k, n), v)| (k < 4 && n < 2) || *v == 0.0)
        );
        assert_eq!(padded.cropped(4, 2).unwrap(), w);
    }

    #[test]
    fn act_order_rows_sort_into_sequential_groups_with_their_permutation() {
        let w = LogicalWeights::new(
            4,
            2,
            array![[1, 1], [2, 2], [3, 3], [4, 4]],
            f16s(&[[1.0, 1.0], [2.0, 2.0]]),
            array![[0, 0], [0, 0]],
            vec![1, 0, 1, 0],
        )
        .unwrap();
        let before = w.dequantize();
        let (sorted, perm) = w.into_sequential_groups().unwrap();
        let perm = perm.unwrap();
        assert_eq!(perm, vec![1, 3, 0, 2]);
        assert!(sorted.has_sequential_groups());
        assert_eq!(
            sorted.dequantize(),
            before.select(Axis(0), &to_usize(&perm))
        );
    }

    #[test]
    fn groups_of_the_wrong_size_cannot_be_made_contiguous() {
        let w = LogicalWeights::new(
            4,
            2,
            Array2::zeros((4, 2)),
            f16s(&[[1.0, 1.0], [2.0, 2.0]]),
            Array2::zeros((2, 2)),
            vec![0, 0, 0, 1],
        )
        .unwrap();
        assert_eq!(
            w.into_sequential_groups(),
            Err(FormatError::GroupsNotContiguous {
                group_size: 2,
                group: 0,
                rows: 3,
                expected: 2
            })
        );
    }

    #[test]
    fn rejects_codes_above_the_width_and_stray_group_indices() {
        let err = LogicalWeights::with_sequential_groups(
            2,
            2,
            array![[4, 0], [0, 0]],
            f16s(&[[1.0, 1.0]]),
            array![[1, 1]],
        )
        .unwrap_err();
        assert_eq!(
            err,
            FormatError::CodeOutOfRange {
                what: "code",
                row: 0,
                col: 0,
                value: 4,
                bits: 2,
                max: 3
            }
        );
        let err = LogicalWeights::with_sequential_groups(
            2,
            2,
            array![[0, 0], [0, 0]],
            f16s(&[[1.0, 1.0]]),
            array![[1, 7]],
        )
        .unwrap_err();
        assert_eq!(
            err,
            FormatError::CodeOutOfRange {
                what: "zero point",
                row: 0,
                col: 1,
                value: 7,
                bits: 2,
                max: 3
            }
        );
        let err = LogicalWeights::new(
            4,
            2,
            Array2::zeros((2, 2)),
            f16s(&[[1.0, 1.0]]),
            Array2::zeros((1, 2)),
            vec![0, 1],
        )
        .unwrap_err();
        assert_eq!(
            err,
            FormatError::GroupIndexOutOfRange {
                row: 1,
                group: 1,
                groups: 1
            }
        );
    }

    #[test]
    fn a_malformed_input_permutation_is_refused_by_name() {
        assert_eq!(check_permutation(&[2, 0, 1], 3), Ok(()));
        assert_eq!(
            check_permutation(&[0], 3),
            Err(FormatError::PermutationLength { found: 1, rows: 3 })
        );
        assert_eq!(
            check_permutation(&[0, 3, 1], 3),
            Err(FormatError::PermutationPastEnd {
                rows: 3,
                index: 1,
                value: 3
            })
        );
        let repeated = FormatError::PermutationRepeatsRow {
            rows: 3,
            index: 2,
            value: 1,
            first: 1,
        };
        assert_eq!(check_permutation(&[0, 1, 1], 3), Err(repeated));
        assert_eq!(
            small().with_rows_restored(&[0, 1, 1, 2]),
            Err(FormatError::PermutationRepeatsRow {
                rows: 4,
                index: 2,
                value: 1,
                first: 1
            })
        );
    }

    #[test]
    fn parts_that_disagree_are_refused_by_shape_and_a_logical_size_must_fit() {
        let mismatch = |tensor, found: Vec<usize>, expected: Vec<usize>, why: &str| {
            Err(FormatError::ShapeMismatch {
                format: "logical",
                tensor,
                found,
                expected,
                why: why.to_string(),
            })
        };
        let w = small();
        let zeros_3 = Array2::zeros((3, 2));
        assert_eq!(
            LogicalWeights::new(
                4,
                2,
                w.codes().clone(),
                w.scales().clone(),
                zeros_3,
                vec![0, 0, 1, 1]
            ),
            mismatch("zeros", vec![3, 2], vec![2, 2], "the same shape as scales")
        );
        assert_eq!(
            LogicalWeights::new(
                4,
                2,
                w.codes().clone(),
                w.scales().clone(),
                w.zeros().clone(),
                vec![0, 0, 1]
            ),
            mismatch("g_idx", vec![3], vec![4], "one entry per row")
        );
        assert_eq!(
            w.cropped(5, 2),
            Err(FormatError::LogicalShapeTooLarge {
                format: "logical",
                logical: [5, 2],
                stored: [4, 2]
            })
        );
        assert_eq!(
            w.cropped(0, 2),
            Err(FormatError::EmptyMatrix { rows: 0, cols: 2 })
        );
    }
}
