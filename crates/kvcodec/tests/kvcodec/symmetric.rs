//! The symmetric KV codec, exercised through its public API as a user would.

use kvcodec::{GroupAxis, KvError, Layout, Mode, PackedTensor, decode, decode_exact, encode};
use ndarray::{Array2, array};

fn layout(axis: GroupAxis, bits: u32, group_size: usize) -> Layout {
    Layout::new(axis, bits, group_size).unwrap()
}

/// A deterministic, irregular 35 x 13 test matrix with values in roughly [-3, 3].
fn irregular(tokens: usize, features: usize) -> Array2<f32> {
    Array2::from_shape_fn((tokens, features), |(t, f)| {
        let x = (t * 131 + f * 71 + 17) as f32;
        (x * 0.618_034).sin() * 3.0 + ((t * f) % 5) as f32 * 0.01
    })
}

#[test]
fn worked_example_byte_d2_decodes_to_minus_5_and_6() {
    // Two tokens, one feature, one group of 2 along tokens, scale 1: codes 2 and 13 -> 0xD2.
    let packed = PackedTensor::from_parts(
        layout(GroupAxis::Token, 4, 2),
        [2, 1],
        vec![0xD2],
        array![[1.0]],
    )
    .unwrap();
    assert_eq!(packed.stored_codes(), vec![2, 13]);
    assert_eq!(decode(&packed), array![[-5.0], [6.0]]);
}

#[test]
fn round_trip_35_by_13_stays_within_half_a_scale_and_crops_exactly() {
    let x = irregular(35, 13);
    for axis in [GroupAxis::Token, GroupAxis::Feature] {
        for bits in 2..=8 {
            for group_size in [8, 32] {
                let label = format!("{axis} b{bits} g{group_size}");
                let packed = encode(x.view(), layout(axis, bits, group_size)).unwrap();
                let back = decode_exact(&packed);
                assert_eq!(back.dim(), (35, 13), "{label}: decoded shape");
                for ((t, f), &v) in x.indexed_iter() {
                    let (row, j) = match axis {
                        GroupAxis::Token => (f, t),
                        GroupAxis::Feature => (t, f),
                    };
                    let scale = f64::from(packed.scales()[[row, j / group_size]]);
                    let err = (back[[t, f]] - f64::from(v)).abs();
                    assert!(
                        err <= scale / 2.0 * (1.0 + 1e-6),
                        "{label}: [{t}, {f}] error {err} exceeds half scale {}",
                        scale / 2.0
                    );
                }
            }
        }
    }
}

#[test]
fn payload_counts_codes_scales_and_shape() {
    let x = irregular(35, 13);
    // Token axis, g8: 13 rows x 5 groups; 13 * 40 nibbles = 260 bytes; 65 scales.
    let packed = encode(x.view(), layout(GroupAxis::Token, 4, 8)).unwrap();
    assert_eq!(packed.code_bytes().len(), 260);
    assert_eq!(packed.scales().dim(), (13, 5));
    assert_eq!(packed.payload_bytes(), 260 + 65 * 4 + 8);
    // Feature axis, g32, 8-bit: 35 rows x 1 group of 32 padded features.
    let packed = encode(x.view(), layout(GroupAxis::Feature, 8, 32)).unwrap();
    assert_eq!(packed.payload_bytes(), 35 * 32 + 35 * 4 + 8);
}

#[test]
fn published_payload_at_128_tokens() {
    // The study's K+V payload at N=128, D=32 for (g, bits): K on tokens, V on features.
    let x = irregular(128, 32);
    let expected = [
        ((8, 4), 8208),
        ((32, 4), 5136),
        ((8, 8), 12304),
        ((32, 8), 9232),
    ];
    for ((group_size, bits), bytes) in expected {
        let k = encode(x.view(), layout(GroupAxis::Token, bits, group_size)).unwrap();
        let v = encode(x.view(), layout(GroupAxis::Feature, bits, group_size)).unwrap();
        assert_eq!(
            k.payload_bytes() + v.payload_bytes(),
            bytes,
            "g{group_size} b{bits}"
        );
    }
}

#[test]
fn all_zero_input_gets_scale_one_and_exact_zeros() {
    let x = Array2::<f32>::zeros((35, 13));
    for axis in [GroupAxis::Token, GroupAxis::Feature] {
        for bits in [4, 8] {
            let packed = encode(x.view(), layout(axis, bits, 8)).unwrap();
            assert!(packed.scales().iter().all(|&s| s == 1.0));
            assert!(decode(&packed).iter().all(|&v| v == 0.0));
        }
    }
}

#[test]
fn subnormal_input_round_trips_through_its_own_validation() {
    // max|x| / 7 underflows to 0 in f32: the encoder must still write a tensor that
    // from_parts accepts and that decodes within half a scale.
    let tiny = f32::from_bits(3);
    let x = Array2::<f32>::from_elem((4, 4), tiny);
    let packed = encode(x.view(), layout(GroupAxis::Token, 4, 4)).unwrap();
    let rebuilt = PackedTensor::from_parts(
        packed.layout(),
        packed.shape_i32(),
        packed.code_bytes().to_vec(),
        packed.scales().clone(),
    )
    .unwrap();
    assert!(decode(&rebuilt).iter().all(|&v| v == 0.0));
}

#[test]
fn all_maximum_probe_writes_top_code_and_never_15() {
    // Every element equals the group maximum: every stored code is 2 * qmax.
    let x = Array2::<f32>::from_elem((16, 8), 3.5);
    let packed = encode(x.view(), layout(GroupAxis::Token, 4, 8)).unwrap();
    assert!(packed.code_bytes().iter().all(|&b| b == 0xEE));
    assert!(decode(&packed).iter().all(|&v| v == 3.5));
    let packed = encode(x.view(), layout(GroupAxis::Feature, 8, 8)).unwrap();
    assert!(packed.code_bytes().iter().all(|&b| b == 254));
    // The negative maximum maps to stored code 0.
    let packed = encode((-x).view(), layout(GroupAxis::Token, 4, 8)).unwrap();
    assert!(packed.code_bytes().iter().all(|&b| b == 0x00));
}

#[test]
fn patterned_stream_decodes_to_the_pinned_matrix_on_each_axis() {
    // Stored codes 0, 1, 2, ... with scale 1 decode to code - 7, placed by the axis.
    // Token axis, 3 tokens x 2 features, g2: rows are features, padded to 4 tokens.
    let token = PackedTensor::from_parts(
        layout(GroupAxis::Token, 4, 2),
        [3, 2],
        vec![0x10, 0x32, 0x54, 0x76],
        Array2::ones((2, 2)),
    )
    .unwrap();
    assert_eq!(
        decode(&token),
        array![[-7.0, -3.0], [-6.0, -2.0], [-5.0, -1.0]]
    );
    // Feature axis, same shape, g2: rows are tokens, no padding.
    let feature = PackedTensor::from_parts(
        layout(GroupAxis::Feature, 4, 2),
        [3, 2],
        vec![0x10, 0x32, 0x54],
        Array2::ones((3, 1)),
    )
    .unwrap();
    assert_eq!(
        decode(&feature),
        array![[-7.0, -6.0], [-5.0, -4.0], [-3.0, -2.0]]
    );
}

#[test]
fn patterned_matrix_encodes_to_the_pinned_bytes() {
    // One group of 4 tokens per feature column, each with max |x| = 7, so scale 1.
    let x = array![[7.0f32, -7.0], [1.0, 2.0], [-3.0, 4.0], [0.0, 5.0]];
    let packed = encode(x.view(), layout(GroupAxis::Token, 4, 4)).unwrap();
    // Column 0 -> stored 14, 8, 4, 7; column 1 -> 0, 9, 11, 12.
    assert_eq!(packed.code_bytes(), &[0x8E, 0x74, 0x90, 0xCB]);
    assert_eq!(packed.scales(), &array![[1.0f32], [1.0]]);
    // Grouping along tokens of x is grouping along features of its transpose.
    let transposed = encode(x.t(), layout(GroupAxis::Feature, 4, 4)).unwrap();
    assert_eq!(transposed.code_bytes(), packed.code_bytes());
}

#[test]
fn half_way_values_round_to_even() {
    use kvcodec::symmetric::quantize_value;
    // With scale 1, x / scale is exact: ties go to the even neighbour, then the offset 7.
    for (x, code) in [
        (0.5f32, 0),
        (1.5, 2),
        (2.5, 2),
        (-1.5, -2),
        (-2.5, -2),
        (6.5, 6),
    ] {
        assert_eq!(i32::from(quantize_value(x, 1.0, 7)) - 7, code, "x = {x}");
    }
    // Beyond qmax clamps (a scale smaller than max/qmax never arises from encode, but the
    // clamp is part of the spec).
    assert_eq!(quantize_value(9.0, 1.0, 7), 14);
    assert_eq!(quantize_value(-9.0, 1.0, 7), 0);
}

#[test]
fn bad_input_is_an_error_naming_the_problem() {
    let good = layout(GroupAxis::Token, 4, 8);
    let empty = Array2::<f32>::zeros((0, 4));
    assert_eq!(
        encode(empty.view(), good).unwrap_err(),
        KvError::EmptyMatrix { rows: 0, cols: 4 }
    );
    let mut nan = Array2::<f32>::zeros((3, 4));
    nan[[2, 1]] = f32::NAN;
    let err = encode(nan.view(), good).unwrap_err().to_string();
    assert!(
        err.contains("non-finite") && err.contains("[2, 1]"),
        "{err}"
    );
    let mut inf = Array2::<f32>::zeros((3, 4));
    inf[[0, 3]] = f32::INFINITY;
    assert!(encode(inf.view(), good).is_err());
    assert_eq!(
        Layout::new(GroupAxis::Token, 4, 0),
        Err(KvError::ZeroGroupSize)
    );
    assert!(
        Layout::new(GroupAxis::Feature, 16, 8)
            .unwrap_err()
            .to_string()
            .contains("16")
    );
}

#[test]
fn malformed_packed_tensors_are_refused_by_condition() {
    let l = layout(GroupAxis::Token, 4, 2);
    let from =
        |shape, codes, scales| PackedTensor::from_parts(l, shape, codes, scales).unwrap_err();
    // 3 tokens x 2 features on the token axis: 2 rows of 2 groups of 2 = 8 codes = 4 bytes.
    assert_eq!(
        from([3, 2], vec![0; 3], Array2::ones((2, 2))),
        KvError::CodeBytes {
            got: 3,
            expected: 4
        }
    );
    assert_eq!(
        from([3, 2], vec![0; 4], Array2::ones((2, 1))),
        KvError::ScaleShape {
            got: (2, 1),
            expected: (2, 2)
        }
    );
    assert_eq!(
        from([0, 2], vec![], Array2::ones((2, 0))),
        KvError::Shape { rows: 0, cols: 2 }
    );
    assert_eq!(
        from([-3, 2], vec![0; 4], Array2::ones((2, 2))),
        KvError::Shape { rows: -3, cols: 2 }
    );
    assert_eq!(
        from([3, 2], vec![0xF0, 0, 0, 0], Array2::ones((2, 2))),
        KvError::CodeRange {
            code: 15,
            position: 1,
            max: 14
        }
    );
    assert_eq!(
        from([3, 2], vec![0; 4], array![[1.0, 0.0], [1.0, 1.0]]),
        KvError::Scale {
            row: 0,
            group: 1,
            value: 0.0
        }
    );
    let zeros = PackedTensor::from_parts_with_zero_points(
        l,
        [3, 2],
        vec![0; 4],
        Array2::ones((2, 2)),
        vec![0],
    );
    assert_eq!(
        zeros.unwrap_err(),
        KvError::ZeroPointBytes {
            got: 1,
            expected: 0,
            mode: Mode::Symmetric
        }
    );
}
