//! Generated matrices, shapes, group sizes (1, and longer than either dimension), modes, widths
//! and magnitudes: every element decodes within half its group's scale, every stored code is in
//! range, the payload is what the layout says, the stored parts rebuild the same tensor, and
//! encoding into a spare tensor's memory gives the same tensor.

use kvcodec::{GroupAxis, Layout, Mode, PackedTensor, decode_exact, encode, encode_reusing};
use ndarray::Array2;
use proptest::prelude::*;

/// xorshift64 values in [-magnitude, magnitude], with exact zeros and ties sprinkled in.
fn matrix(tokens: usize, features: usize, magnitude: f32, seed: u64) -> Array2<f32> {
    let mut state = seed | 1;
    Array2::from_shape_fn((tokens, features), |_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        match state % 16 {
            0 => 0.0,
            1 => magnitude,
            2 => -magnitude * 0.5,
            _ => ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * magnitude,
        }
    })
}

fn layouts() -> impl Strategy<Value = (Layout, usize, usize)> {
    (
        1usize..40,
        1usize..20,
        prop_oneof![Just(1usize), 2usize..16, 40usize..100],
        prop::sample::select(vec![Mode::Symmetric, Mode::Asymmetric]),
        1u32..=8,
        prop::sample::select(vec![GroupAxis::Token, GroupAxis::Feature]),
    )
        .prop_filter_map(
            "a width the mode stores",
            |(tokens, features, group, mode, bits, axis)| {
                Layout::with_mode(axis, mode, bits, group)
                    .ok()
                    .map(|layout| (layout, tokens, features))
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_element_decodes_within_half_a_scale(
        (layout, tokens, features) in layouts(),
        magnitude in prop::sample::select(vec![1e-30f32, 1e-3, 1.0, 7.0, 1e3, 1e30]),
        seed in any::<u64>(),
    ) {
        let x = matrix(tokens, features, magnitude, seed);
        let packed = encode(x.view(), layout).unwrap();
        let back = decode_exact(&packed);
        prop_assert_eq!(back.dim(), (tokens, features));
        let scales = packed.scales();
        // Slack for the f32 division before rounding: L * 2^-24 steps.
        let slack = f64::from(layout.max_stored()) / f64::from(1u32 << 22);
        for ((t, f), &v) in x.indexed_iter() {
            let group = match layout.axis {
                GroupAxis::Token => [f, t / layout.group_size],
                GroupAxis::Feature => [t, f / layout.group_size],
            };
            let scale = f64::from(scales[group]);
            let error = (back[[t, f]] - f64::from(v)).abs();
            prop_assert!(error <= scale * (0.5 + slack), "[{t}, {f}]: {error} > {scale} / 2");
        }
        prop_assert!(packed.stored_codes().iter().all(|&c| c <= layout.max_stored()));
    }

    #[test]
    fn encoding_into_a_spare_tensor_gives_the_same_tensor(
        (layout, tokens, features) in layouts(),
        (spare_layout, spare_tokens, spare_features) in layouts(),
        seed in any::<u64>(),
    ) {
        // The spare is of any layout and shape: smaller, larger, the other mode or axis.
        let x = matrix(tokens, features, 3.0, seed);
        let spare_x = matrix(spare_tokens, spare_features, 1e3, seed ^ 1);
        let spare = encode(spare_x.view(), spare_layout).unwrap();
        let fresh = encode(x.view(), layout).unwrap();
        let reused = encode_reusing(x.view(), layout, spare).unwrap();
        prop_assert_eq!(&reused, &fresh);
        // And again into the tensor it just made.
        prop_assert_eq!(encode_reusing(x.view(), layout, reused).unwrap(), fresh);
    }

    #[test]
    fn stored_parts_rebuild_the_same_tensor_and_cost_what_the_layout_says(
        (layout, tokens, features) in layouts(),
        seed in any::<u64>(),
    ) {
        let x = matrix(tokens, features, 3.0, seed);
        let packed = encode(x.view(), layout).unwrap();
        let rebuilt = PackedTensor::from_parts_with_zero_points(
            layout,
            packed.shape_i32(),
            packed.code_bytes().to_vec(),
            packed.scales().clone(),
            packed.zero_point_bytes().to_vec(),
        )
        .unwrap();
        prop_assert_eq!(&rebuilt, &packed);
        let geometry = layout.geometry(tokens, features);
        let zero_bytes = match layout.mode {
            Mode::Symmetric => 0,
            Mode::Asymmetric => layout.bits.byte_count(geometry.scale_count()),
        };
        prop_assert_eq!(
            packed.payload_bytes(),
            layout.bits.byte_count(geometry.code_count()) + 4 * geometry.scale_count() + zero_bytes + 8
        );
    }
}
