//! Transcoding a quantized layer from one integer layout to another, only through the logical
//! matrix, and only when the result is provably the same weights.
//!
//! The steps, in order:
//! 1. Unpack the source with its own axis, slot order and int32 handling into codes [K, N].
//! 2. Normalise zero points to true zero points (AutoGPTQ's v1 "minus one" added back), so the
//!    rule is w = scale * (q - zero) everywhere.
//! 3. Resolve the row order. A source whose rows an earlier conversion reordered (its recorded
//!    input permutation, passed to [`transcode_recorded`]) first gets them back in their original
//!    order, g_idx travelling with them. Then a target without g_idx (AWQ) gets the rows sorted
//!    into sequential groups, and the permutation that the layer's input activations need
//!    (relative to the original rows) is returned; a target with g_idx (GPTQ) keeps the original
//!    order and its g_idx, so it needs no permutation. Act-order GPTQ -> AWQ -> GPTQ therefore
//!    gives back the original tensors.
//! 4. Pack with the target's axis, order and convention, padding K and N with zero weights as the
//!    target requires and recording the logical size.
//! 5. Unpack the packed target again, dequantize it and the source, and require every weight to
//!    be bit-identical (after the permutation) before returning anything to write.
//!
//! Words are never reinterpreted across layouts: every value goes through the logical matrix.

use ndarray::Array2;
use thiserror::Error;

use crate::awq::{self, AwqLayer};
use crate::bpw::Cost;
use crate::error::FormatError;
use crate::format::WeightFormat;
use crate::gptq::{self, GptqLayer, ZeroConvention};
use crate::logical::LogicalWeights;

/// Why a layer cannot be transcoded.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum TranscodeError {
    /// The source or the target layout refused the layer.
    #[error(transparent)]
    Format(#[from] FormatError),

    /// A target that is not an integer layout.
    #[error(
        "repack writes gptq, gptq_v2 or awq layers, not {0}; GGUF blocks and NF4 are written by \
         `repack quantize` from float weights"
    )]
    UnsupportedTarget(WeightFormat),

    /// The repacked layer unpacks to another number of weights than the source.
    #[error(
        "refusing to write: the repacked layer unpacks to {target_shape:?} weights but the source \
         to {source_shape:?}, so the conversion is not bit-identical"
    )]
    ShapeChanged {
        /// [K, N] of the source's weights.
        source_shape: [usize; 2],
        /// [K, N] of the repacked layer's weights.
        target_shape: [usize; 2],
    },

    /// A weight that changed in the repacking.
    #[error(
        "refusing to write: weight [{row}, {col}] dequantizes to {target:e} after repacking but to \
         {source_value:e} in the source, so the conversion is not bit-identical"
    )]
    NotBitIdentical {
        /// Its row in the repacked layer.
        row: usize,
        /// Its column.
        col: usize,
        /// The source's weight (at the permuted row).
        source_value: f32,
        /// The repacked layer's weight.
        target: f32,
    },
}

/// One quantized layer in an integer layout.
///
/// Not `#[non_exhaustive]`: code that writes or reads a layer's tensors must handle every
/// layout, and a new one should fail to compile there rather than fall into a wildcard arm.
#[derive(Debug, Clone, PartialEq)]
pub enum PackedLayer {
    /// GPTQ, either convention.
    Gptq(GptqLayer),
    /// AWQ GEMM.
    Awq(AwqLayer),
}

/// A repacked layer and what its user must know about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Transcoded {
    /// The layer in the target layout.
    pub layer: PackedLayer,
    /// `Some(perm)` when the new layer's rows are not in their original order: row k of the new
    /// layer is row `perm[k]` of the original (the source's rows after undoing any recorded
    /// permutation), so the input activations must be permuted as `x_new[k] = x[perm[k]]`.
    pub input_permutation: Option<Vec<u32>>,
    /// Whether a recorded permutation was undone and the new layer needs none: its rows are
    /// back in their original order.
    pub rows_restored: bool,
}

impl PackedLayer {
    /// Its layout, the GPTQ convention included.
    pub fn format(&self) -> WeightFormat {
        match self {
            PackedLayer::Gptq(layer) => layer.convention.format(),
            PackedLayer::Awq(_) => WeightFormat::Awq,
        }
    }

    /// Its code width.
    pub fn bits(&self) -> u32 {
        match self {
            PackedLayer::Gptq(layer) => layer.bits,
            PackedLayer::Awq(_) => awq::AWQ_BITS,
        }
    }

    /// Rows per group.
    pub fn group_size(&self) -> usize {
        match self {
            PackedLayer::Gptq(layer) => layer.group_size,
            PackedLayer::Awq(layer) => layer.group_size,
        }
    }

    /// [K, N] before padding.
    pub fn logical_shape(&self) -> [usize; 2] {
        match self {
            PackedLayer::Gptq(layer) => layer.logical_shape,
            PackedLayer::Awq(layer) => layer.logical_shape,
        }
    }

    /// The logical matrix, after checking every shape against the layout.
    pub fn unpack(&self) -> Result<LogicalWeights, FormatError> {
        match self {
            PackedLayer::Gptq(layer) => gptq::unpack(layer),
            PackedLayer::Awq(layer) => awq::unpack(layer),
        }
    }

    /// Bytes its tensors take, by part.
    pub fn storage(&self) -> Cost {
        match self {
            PackedLayer::Gptq(layer) => layer.storage(),
            PackedLayer::Awq(layer) => layer.storage(),
        }
    }
}

/// Packs a logical matrix into `target` (gptq, gptq_v2 or awq).
pub fn pack(weights: &LogicalWeights, target: WeightFormat) -> Result<PackedLayer, TranscodeError> {
    Ok(match target {
        WeightFormat::Gptq => PackedLayer::Gptq(gptq::pack(weights, ZeroConvention::V1)?),
        WeightFormat::GptqV2 => PackedLayer::Gptq(gptq::pack(weights, ZeroConvention::V2)?),
        WeightFormat::Awq => PackedLayer::Awq(awq::pack(weights)?),
        WeightFormat::Q4_0 | WeightFormat::Q8_0 | WeightFormat::Nf4 => {
            return Err(TranscodeError::UnsupportedTarget(target));
        }
    })
}

/// Converts `source` to `target` through the logical matrix and proves the weights unchanged.
/// The source's rows are taken to be in their original order (no recorded permutation).
pub fn transcode(source: &PackedLayer, target: WeightFormat) -> Result<Transcoded, TranscodeError> {
    transcode_recorded(source, None, target)
}

/// Like [`transcode`], for a source that may carry a recorded input permutation: `recorded[k]`
/// is the original row of the source's row k (what an earlier conversion to a layout without
/// g_idx wrote). The rows are put back in their original order before anything else, so a
/// target with g_idx needs no permutation and one without gets a permutation relative to the
/// original rows. A recorded permutation that is not a permutation of the source's K rows is
/// refused ([`crate::logical::check_permutation`]).
pub fn transcode_recorded(
    source: &PackedLayer,
    recorded: Option<&[u32]>,
    target: WeightFormat,
) -> Result<Transcoded, TranscodeError> {
    // Whether the target has g_idx, or must have its rows in sequential groups.
    let needs_sequential_rows = match target {
        WeightFormat::Gptq | WeightFormat::GptqV2 => false,
        WeightFormat::Awq => true,
        WeightFormat::Q4_0 | WeightFormat::Q8_0 | WeightFormat::Nf4 => {
            return Err(TranscodeError::UnsupportedTarget(target));
        }
    };
    let logical = source.unpack()?;
    let source_weights = logical.dequantize();
    let logical = match recorded {
        Some(perm) => logical.with_rows_restored(perm)?,
        None => logical,
    };
    let (logical, input_permutation) = if needs_sequential_rows {
        logical.into_sequential_groups()?
    } else {
        (logical, None)
    };
    let layer = pack(&logical, target)?;
    let target_weights = layer.unpack()?.dequantize();
    // Target row k is original row o = perm[k], which is the source's row s with recorded[s] = o.
    let source_rows = match (recorded, &input_permutation) {
        (None, perm) => perm.clone(),
        (Some(recorded), perm) => {
            let mut stored_row = vec![0u32; recorded.len()];
            for (s, &original) in recorded.iter().enumerate() {
                stored_row[original as usize] = s as u32;
            }
            Some(match perm {
                Some(perm) => perm.iter().map(|&o| stored_row[o as usize]).collect(),
                None => stored_row,
            })
        }
    };
    verify_bit_identical(&source_weights, source_rows.as_deref(), &target_weights)?;
    Ok(Transcoded {
        layer,
        rows_restored: recorded.is_some() && input_permutation.is_none(),
        input_permutation,
    })
}

/// Requires `target[k, n]` to have the same bits as `source[perm[k], n]` for every weight.
pub fn verify_bit_identical(
    source: &Array2<f32>,
    perm: Option<&[u32]>,
    target: &Array2<f32>,
) -> Result<(), TranscodeError> {
    if source.dim() != target.dim() {
        return Err(TranscodeError::ShapeChanged {
            source_shape: [source.nrows(), source.ncols()],
            target_shape: [target.nrows(), target.ncols()],
        });
    }
    for ((row, col), &value) in target.indexed_iter() {
        let source_row = perm.map_or(row, |p| p[row] as usize);
        let expected = source[[source_row, col]];
        if value.to_bits() != expected.to_bits() {
            return Err(TranscodeError::NotBitIdentical {
                row,
                col,
                source_value: expected,
                target: value,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    fn act_order() -> PackedLayer {
        // 4 rows in groups of 2, scattered: rows 0 and 2 in group 1, rows 1 and 3 in group 0.
        let weights = LogicalWeights::new(
            4,
            2,
            Array2::from_shape_fn((4, 8), |(k, n)| ((k * 7 + n * 3) % 16) as u8),
            Array2::from_shape_fn((2, 8), |(g, n)| {
                f16::from_f32(0.01 * (g * 8 + n + 1) as f32)
            }),
            Array2::from_shape_fn((2, 8), |(g, n)| (1 + (g + n) % 15) as u8),
            vec![1, 0, 1, 0],
        )
        .unwrap();
        pack(&weights, WeightFormat::Gptq).unwrap()
    }

    #[test]
    fn act_order_to_awq_reports_the_permutation_and_keeps_every_weight() {
        let source = act_order();
        let to_awq = transcode(&source, WeightFormat::Awq).unwrap();
        assert_eq!(to_awq.input_permutation, Some(vec![1, 3, 0, 2]));
        let back = transcode(&to_awq.layer, WeightFormat::Gptq).unwrap();
        assert_eq!(back.input_permutation, None);
        let perm = [1usize, 3, 0, 2];
        let original = source.unpack().unwrap().dequantize();
        let round_trip = back.layer.unpack().unwrap().dequantize();
        for k in 0..4 {
            for n in 0..8 {
                assert_eq!(
                    round_trip[[k, n]].to_bits(),
                    original[[perm[k], n]].to_bits()
                );
            }
        }
    }

    #[test]
    fn act_order_to_awq_and_back_with_the_recorded_permutation_gives_the_original_layer() {
        let source = act_order();
        let to_awq = transcode(&source, WeightFormat::Awq).unwrap();
        let recorded = to_awq.input_permutation.clone().unwrap();
        let back = transcode_recorded(&to_awq.layer, Some(&recorded), WeightFormat::Gptq).unwrap();
        assert_eq!((back.input_permutation, back.rows_restored), (None, true));
        assert_eq!(back.layer, source);
        // To AWQ again: the permutation is relative to the original rows, not composed.
        let again = transcode_recorded(&to_awq.layer, Some(&recorded), WeightFormat::Awq).unwrap();
        assert_eq!(again.input_permutation, Some(recorded));
        assert_eq!(again.layer, to_awq.layer);
    }

    #[test]
    fn a_recorded_permutation_of_the_wrong_length_is_refused() {
        let to_awq = transcode(&act_order(), WeightFormat::Awq).unwrap();
        assert_eq!(
            transcode_recorded(&to_awq.layer, Some(&[0]), WeightFormat::Gptq),
            Err(TranscodeError::Format(FormatError::PermutationLength {
                found: 1,
                rows: 4
            }))
        );
    }

    #[test]
    fn v2_zero_point_0_cannot_go_to_v1() {
        let weights = LogicalWeights::with_sequential_groups(
            4,
            8,
            Array2::zeros((8, 8)),
            Array2::from_elem((1, 8), f16::ONE),
            Array2::zeros((1, 8)),
        )
        .unwrap();
        let v2 = pack(&weights, WeightFormat::GptqV2).unwrap();
        let err = transcode(&v2, WeightFormat::Gptq).unwrap_err();
        assert!(
            matches!(
                err,
                TranscodeError::Format(FormatError::V1ZeroUnrepresentable {
                    group: 0,
                    col: 0,
                    ..
                })
            ),
            "{err:?}"
        );
        assert!(transcode(&v2, WeightFormat::Awq).is_ok());
    }

    #[test]
    fn a_changed_weight_is_named_in_the_refusal() {
        let source = Array2::from_elem((2, 2), 1.0f32);
        let mut target = source.clone();
        target[[1, 0]] = 1.5;
        assert_eq!(
            verify_bit_identical(&source, None, &target),
            Err(TranscodeError::NotBitIdentical {
                row: 1,
                col: 0,
                source_value: 1.0,
                target: 1.5
            })
        );
        // -0.0 and 0.0 are equal as floats, but not the same bits.
        let mut signed = Array2::from_elem((2, 2), 0.0f32);
        signed[[0, 1]] = -0.0;
        let err = verify_bit_identical(&Array2::zeros((2, 2)), None, &signed).unwrap_err();
        assert!(
            matches!(err, TranscodeError::NotBitIdentical { row: 0, col: 1, .. }),
            "{err:?}"
        );
        assert_eq!(
            verify_bit_identical(&source, None, &Array2::zeros((2, 3))),
            Err(TranscodeError::ShapeChanged {
                source_shape: [2, 2],
                target_shape: [2, 3]
            })
        );
    }

    #[test]
    fn block_formats_are_not_repack_targets() {
        for target in [WeightFormat::Q4_0, WeightFormat::Q8_0, WeightFormat::Nf4] {
            assert_eq!(
                transcode(&act_order(), target),
                Err(TranscodeError::UnsupportedTarget(target))
            );
        }
    }
}
