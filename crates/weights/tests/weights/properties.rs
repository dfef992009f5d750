//! Properties of the integer layouts over arbitrary logical matrices: codes, zero points and
//! finite scales (signed zeros and subnormals included) drawn at random, K and N ragged (neither
//! a multiple of a pack factor nor of the group size), rows in sequential groups or shuffled as
//! an act-order checkpoint scatters them.
//!
//! - GPTQ (v1 and v2, at 2, 3, 4 and 8 bits) and AWQ unpack exactly what they packed;
//! - padding and cropping the logical matrix are inverse, and padding adds only zero weights;
//! - sorting act-order rows into sequential groups is undone by the permutation it returns;
//! - act-order GPTQ -> AWQ -> GPTQ (with the recorded permutation) gives the original tensors;
//! - transcoding between every pair of integer layouts keeps every dequantized weight's bits.
//!
//! The case counts are kept small (the matrices are at most 72 x 20) so that the whole file runs
//! in well under a second.

use half::f16;
use ndarray::Array2;
use proptest::prelude::*;
use weights::gptq::{self, GPTQ_BITS, ZeroConvention};
use weights::logical::sequential_g_idx;
use weights::transcode::{self, PackedLayer};
use weights::{LogicalWeights, WeightFormat, awq};

/// The integer layouts `transcode` converts between.
const INTEGER: [WeightFormat; 3] = [WeightFormat::Gptq, WeightFormat::GptqV2, WeightFormat::Awq];

/// Any finite f16: every bit pattern but infinities and NaN (whose exponent bits are all set;
/// clearing the top one leaves a finite value of the same sign).
fn finite_f16() -> impl Strategy<Value = f16> {
    any::<u16>().prop_map(|bits| {
        let value = f16::from_bits(bits);
        if value.is_finite() {
            value
        } else {
            f16::from_bits(bits & !0x4000)
        }
    })
}

/// A `bits`-wide logical matrix: K in 1..=72, N in 1..=20, a group size from 1 to K, codes in
/// range, zero points from `min_zero` up (GPTQ v1 cannot store 0), one finite scale per group
/// and column, and g_idx sequential or, with `act_order`, a shuffle of the sequential one (so
/// every group keeps its size, as an act-order checkpoint's do).
fn logical(bits: u32, min_zero: u8, act_order: bool) -> impl Strategy<Value = LogicalWeights> {
    let max = ((1u32 << bits) - 1) as u8;
    (1usize..=72, 1usize..=20)
        .prop_flat_map(|(k, n)| (Just(k), Just(n), 1..=k))
        .prop_flat_map(move |(k, n, group_size)| {
            let groups = k.div_ceil(group_size);
            let sequential = sequential_g_idx(k, group_size);
            let g_idx = if act_order {
                Just(sequential).prop_shuffle().boxed()
            } else {
                Just(sequential).boxed()
            };
            (
                prop::collection::vec(0..=max, k * n),
                prop::collection::vec(finite_f16(), groups * n),
                prop::collection::vec(min_zero..=max, groups * n),
                g_idx,
            )
                .prop_map(move |(codes, scales, zeros, g_idx)| {
                    LogicalWeights::new(
                        bits,
                        group_size,
                        Array2::from_shape_vec((k, n), codes).unwrap(),
                        Array2::from_shape_vec((groups, n), scales).unwrap(),
                        Array2::from_shape_vec((groups, n), zeros).unwrap(),
                        g_idx,
                    )
                    .unwrap()
                })
        })
}

/// The GPTQ convention, its width and a matrix it can store at that width.
fn gptq_case() -> impl Strategy<Value = (ZeroConvention, LogicalWeights)> {
    (
        prop::sample::select(GPTQ_BITS.to_vec()),
        prop::sample::select(vec![ZeroConvention::V1, ZeroConvention::V2]),
        any::<bool>(),
    )
        .prop_flat_map(|(bits, convention, act_order)| {
            let min_zero = u8::from(convention == ZeroConvention::V1);
            (Just(convention), logical(bits, min_zero, act_order))
        })
}

/// Whether `got[k, n]` has the bits of `expected[perm[k], n]` (of `expected[k, n]` without a
/// permutation) everywhere; the first weight that does not, if any.
fn first_changed_weight(
    expected: &Array2<f32>,
    perm: Option<&[u32]>,
    got: &Array2<f32>,
) -> Option<(usize, usize)> {
    if expected.dim() != got.dim() {
        return Some((usize::MAX, usize::MAX));
    }
    got.indexed_iter()
        .find(|&((k, n), value)| {
            let row = perm.map_or(k, |p| p[k] as usize);
            value.to_bits() != expected[[row, n]].to_bits()
        })
        .map(|(at, _)| at)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn gptq_unpacks_what_it_packed((convention, w) in gptq_case()) {
        let layer = gptq::pack(&w, convention).unwrap();
        let step = gptq::alignment(w.bits());
        prop_assert_eq!(layer.g_idx.len() % step, 0);
        prop_assert_eq!(layer.scales.ncols() % step, 0);
        prop_assert_eq!(gptq::unpack(&layer).unwrap(), w);
    }

    #[test]
    fn awq_unpacks_what_it_packed(w in logical(awq::AWQ_BITS, 0, false)) {
        let layer = awq::pack(&w).unwrap();
        prop_assert_eq!(layer.qweight.nrows() % w.group_size(), 0);
        prop_assert_eq!(layer.scales.ncols() % awq::PACK_FACTOR, 0);
        prop_assert_eq!(awq::unpack(&layer).unwrap(), w);
    }

    #[test]
    fn cropping_undoes_padding_and_padding_adds_only_zero_weights(
        w in (1u32..=8, any::<bool>()).prop_flat_map(|(bits, act)| logical(bits, 0, act)),
        k_multiple in 1usize..=40,
        n_multiple in 1usize..=40,
    ) {
        let padded = w.padded(k_multiple, n_multiple);
        let (k, n) = (w.k(), w.n());
        prop_assert_eq!(padded.k(), k.next_multiple_of(k_multiple));
        prop_assert_eq!(padded.n(), n.next_multiple_of(n_multiple));
        prop_assert_eq!(&padded.cropped(k, n).unwrap(), &w);
        let original = w.dequantize();
        let weights = padded.dequantize();
        for ((row, col), value) in weights.indexed_iter() {
            if row < k && col < n {
                prop_assert_eq!(value.to_bits(), original[[row, col]].to_bits());
            } else {
                prop_assert_eq!(*value, 0.0, "padded weight [{}, {}]", row, col);
            }
        }
    }

    #[test]
    fn restoring_rows_undoes_the_sort_into_sequential_groups(
        w in (1u32..=8).prop_flat_map(|bits| logical(bits, 0, true)),
    ) {
        let (sorted, perm) = w.clone().into_sequential_groups().unwrap();
        prop_assert!(sorted.has_sequential_groups());
        match perm {
            None => prop_assert_eq!(sorted, w),
            Some(perm) => {
                prop_assert_eq!(
                    first_changed_weight(&w.dequantize(), Some(&perm), &sorted.dequantize()),
                    None
                );
                prop_assert_eq!(sorted.with_rows_restored(&perm).unwrap(), w);
            }
        }
    }

    #[test]
    fn act_order_gptq_to_awq_and_back_gives_the_original_tensors(
        (convention, w) in prop::sample::select(vec![ZeroConvention::V1, ZeroConvention::V2])
            .prop_flat_map(|convention| {
                let min_zero = u8::from(convention == ZeroConvention::V1);
                (Just(convention), logical(awq::AWQ_BITS, min_zero, true))
            }),
    ) {
        let source = PackedLayer::Gptq(gptq::pack(&w, convention).unwrap());
        let to_awq = transcode::transcode(&source, WeightFormat::Awq).unwrap();
        let recorded = to_awq.input_permutation.as_deref();
        let back =
            transcode::transcode_recorded(&to_awq.layer, recorded, convention.format()).unwrap();
        prop_assert_eq!(back.input_permutation, None);
        prop_assert_eq!(back.rows_restored, recorded.is_some());
        prop_assert_eq!(back.layer, source);
    }
}

proptest! {
    // Nine transcodes per case.
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn every_pair_of_integer_layouts_keeps_every_weights_bits(
        w in any::<bool>().prop_flat_map(|act_order| logical(awq::AWQ_BITS, 1, act_order)),
    ) {
        for from in INTEGER {
            // AWQ has no g_idx: its source holds the rows sorted into sequential groups.
            let (source_weights, source_order) = if from == WeightFormat::Awq {
                w.clone().into_sequential_groups().unwrap()
            } else {
                (w.clone(), None)
            };
            let source = transcode::pack(&source_weights, from).unwrap();
            let expected = source_weights.dequantize();
            for to in INTEGER {
                let converted = transcode::transcode(&source, to).unwrap();
                prop_assert_eq!(converted.layer.format(), to);
                let got = converted.layer.unpack().unwrap().dequantize();
                prop_assert_eq!(
                    first_changed_weight(&expected, converted.input_permutation.as_deref(), &got),
                    None,
                    "{} -> {} (source rows permuted: {})", from, to, source_order.is_some()
                );
            }
        }
    }
}
