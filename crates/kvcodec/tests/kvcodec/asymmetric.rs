//! The KV codec in both modes, through its public API: every mode x width x axis x group size
//! round-trips within half a scale, the payload counts exactly what is stored, and asymmetric
//! tensors carry validated zero points.

use kvcodec::{
    GroupAxis, KvError, Layout, Mode, PackedTensor, SHAPE_BYTES, decode, decode_exact, encode,
};
use ndarray::{Array2, array};
use weights::bpw::{self, Format, Padding, ZeroPoints};

fn asymmetric(axis: GroupAxis, bits: u32, group_size: usize) -> Layout {
    Layout::with_mode(axis, Mode::Asymmetric, bits, group_size).unwrap()
}

/// Every supported (mode, bits) pair.
fn modes_and_widths() -> Vec<(Mode, u32)> {
    let symmetric = (2..=8).map(|b| (Mode::Symmetric, b));
    let asymmetric = (1..=8).map(|b| (Mode::Asymmetric, b));
    symmetric.chain(asymmetric).collect()
}

/// A deterministic, irregular matrix: a sine in roughly [-3, 3] plus `offset`, so a positive
/// offset makes whole groups lie away from 0.
fn irregular(tokens: usize, features: usize, offset: f32) -> Array2<f32> {
    Array2::from_shape_fn((tokens, features), |(t, f)| {
        let x = (t * 131 + f * 71 + 17) as f32;
        (x * 0.618_034).sin() * 3.0 + ((t * f) % 5) as f32 * 0.01 + offset
    })
}

/// (row, group) of element [t, f] in the grouped view.
/// How `weights::bpw` describes this codec's layout: f32 scales, packed zero points when
/// asymmetric, rows padded to whole groups, one byte stream.
fn kv_format(layout: Layout) -> Format {
    Format {
        axis: layout.axis,
        zero_points: match layout.mode {
            Mode::Symmetric => ZeroPoints::None,
            Mode::Asymmetric => ZeroPoints::Packed,
        },
        padding: Padding::Groups,
        ..Format::new(layout.bits, layout.group_size, bpw::FloatDtype::F32)
    }
}

fn group_of(axis: GroupAxis, group_size: usize, t: usize, f: usize) -> [usize; 2] {
    match axis {
        GroupAxis::Token => [f, t / group_size],
        GroupAxis::Feature => [t, f / group_size],
    }
}

#[test]
fn every_mode_width_axis_and_group_round_trips_within_half_a_scale() {
    for offset in [0.0, 5.0] {
        let x = irregular(35, 13, offset);
        for (mode, bits) in modes_and_widths() {
            for axis in [GroupAxis::Token, GroupAxis::Feature] {
                for group_size in [1, 8, 32] {
                    let config = format!("{mode} b{bits} {axis} g{group_size} offset {offset}");
                    let layout = Layout::with_mode(axis, mode, bits, group_size).unwrap();
                    let packed = encode(x.view(), layout).unwrap();
                    let back = decode_exact(&packed);
                    assert_eq!(back.dim(), (35, 13), "{config}: decoded shape");
                    for ((t, f), &v) in x.indexed_iter() {
                        let scale = f64::from(packed.scales()[group_of(axis, group_size, t, f)]);
                        let err = (back[[t, f]] - f64::from(v)).abs();
                        assert!(
                            err <= scale * (0.5 + 1e-4),
                            "{config}: [{t}, {f}] error {err} exceeds half scale {}",
                            scale / 2.0
                        );
                    }
                    // The payload is what bpw says this layout stores, plus the shape.
                    let cost = bpw::cost(&kv_format(layout), 35, 13).unwrap();
                    assert_eq!(
                        packed.payload_bytes(),
                        cost.total_bytes() + SHAPE_BYTES,
                        "{config}: payload"
                    );
                    // Reassembling from the stored parts validates and gives the same tensor.
                    let shape = packed.shape_i32();
                    let again = PackedTensor::from_parts_with_zero_points(
                        layout,
                        shape,
                        packed.code_bytes().to_vec(),
                        packed.scales().clone(),
                        packed.zero_point_bytes().to_vec(),
                    )
                    .unwrap();
                    assert_eq!(again, packed, "{config}: from_parts");
                }
            }
        }
    }
}

#[test]
fn worked_example_one_4_bit_group_pins_codes_zero_point_and_decode() {
    // Four tokens, one feature, one group on the token axis: range [-1, 2.75], scale 0.25,
    // zero point 4; codes 0, 4, 15 and round(0.375 / 0.25 = 1.5) = 2 (ties to even) + 4 = 6.
    let x = array![[-1.0f32], [0.0], [2.75], [0.375]];
    let packed = encode(x.view(), asymmetric(GroupAxis::Token, 4, 4)).unwrap();
    assert_eq!(packed.scales(), &array![[0.25f32]]);
    assert_eq!(packed.offsets(), array![[4u8]]);
    assert_eq!(packed.zero_point_bytes(), &[0x04]);
    assert_eq!(packed.stored_codes(), vec![0, 4, 15, 6]);
    assert_eq!(packed.code_bytes(), &[0x40, 0x6F]);
    assert_eq!(decode(&packed), array![[-1.0], [0.0], [2.75], [0.5]]);
    // Codes + 1 f32 scale + 1 zero-point byte (one 4-bit zero, padded) + 8 shape bytes.
    assert_eq!(packed.payload_bytes(), 2 + 4 + 1 + 8);
}

#[test]
fn zero_padding_and_zeros_decode_exactly_because_the_range_contains_zero() {
    // All-positive values far from 0: the range is widened to [0, max], so zero point 0 and
    // the padding (3 tokens in a group of 4) decodes to exactly 0.
    let x = array![[100.0f32, 3.0], [101.0, 0.0], [102.0, -3.0]];
    let packed = encode(x.view(), asymmetric(GroupAxis::Token, 3, 4)).unwrap();
    assert_eq!(packed.offsets()[[0, 0]], 0);
    let codes = packed.stored_codes();
    // Feature 0's padding code and feature 1's padding code both equal their zero points.
    assert_eq!(codes[3], 0);
    assert_eq!(codes[7], packed.offsets()[[1, 0]]);
    assert_eq!(decode(&packed)[[1, 1]], 0.0);
}

#[test]
fn all_zero_input_gets_scale_one_zero_point_zero_and_exact_zeros() {
    let x = Array2::<f32>::zeros((35, 13));
    for bits in 1..=8 {
        let packed = encode(x.view(), asymmetric(GroupAxis::Feature, bits, 8)).unwrap();
        assert!(packed.scales().iter().all(|&s| s == 1.0), "b{bits}");
        assert!(packed.offsets().iter().all(|&z| z == 0), "b{bits}");
        assert!(decode(&packed).iter().all(|&v| v == 0.0), "b{bits}");
    }
}

#[test]
fn one_bit_asymmetric_codes_are_a_sign_split() {
    // At 1 bit, L = 1: a group [-2, 1] has scale 3, zero point round(2 / 3) = 1.
    let x = array![[-2.0f32, 1.0]];
    let packed = encode(x.view(), asymmetric(GroupAxis::Feature, 1, 2)).unwrap();
    assert_eq!(packed.scales(), &array![[3.0f32]]);
    assert_eq!(packed.offsets(), array![[1u8]]);
    assert_eq!(packed.stored_codes(), vec![0, 1]);
    assert_eq!(decode(&packed), array![[-3.0, 0.0]]);
}

#[test]
fn a_range_beyond_f32_is_an_error_naming_the_group() {
    let x = array![[-3.0e38f32, 3.0e38]];
    let err = encode(x.view(), asymmetric(GroupAxis::Feature, 8, 2)).unwrap_err();
    assert!(matches!(
        err,
        KvError::RangeOverflow {
            row: 0,
            group: 0,
            ..
        }
    ));
    assert!(
        err.to_string().contains("too wide for a float32 scale"),
        "{err}"
    );
}

#[test]
fn zero_points_are_validated_by_mode() {
    let layout = asymmetric(GroupAxis::Token, 4, 2);
    let scales = Array2::<f32>::ones((2, 2));
    // 3 tokens x 2 features, g2: 2 rows x 2 groups = 4 zero points = 2 bytes at 4 bits.
    let symmetric = Layout::new(GroupAxis::Token, 4, 2).unwrap();
    for (layout, zero_points, expected, mode) in [
        (layout, vec![0], 2, Mode::Asymmetric),
        (layout, vec![], 2, Mode::Asymmetric),
        (symmetric, vec![0, 0], 0, Mode::Symmetric),
    ] {
        let got = zero_points.len();
        let err = PackedTensor::from_parts_with_zero_points(
            layout,
            [3, 2],
            vec![0; 4],
            scales.clone(),
            zero_points,
        )
        .unwrap_err();
        assert_eq!(
            err,
            KvError::ZeroPointBytes {
                got,
                expected,
                mode
            }
        );
    }
    // from_parts (no zero points) refuses an asymmetric layout for the same reason.
    let err = PackedTensor::from_parts(layout, [3, 2], vec![0; 4], scales.clone()).unwrap_err();
    assert_eq!(
        err,
        KvError::ZeroPointBytes {
            got: 0,
            expected: 2,
            mode: Mode::Asymmetric
        }
    );
    // The top code 15 is valid asymmetric, invalid symmetric.
    let valid = PackedTensor::from_parts_with_zero_points(
        layout,
        [3, 2],
        vec![0xFF; 4],
        scales.clone(),
        vec![0x00, 0xFF],
    )
    .unwrap();
    assert_eq!(valid.offsets(), array![[0u8, 0], [15, 15]]);
    let err = PackedTensor::from_parts(
        Layout::new(GroupAxis::Token, 4, 2).unwrap(),
        [3, 2],
        vec![0xFF; 4],
        scales,
    )
    .unwrap_err();
    assert_eq!(
        err,
        KvError::CodeRange {
            code: 15,
            position: 0,
            max: 14
        }
    );
}
