//! Effective bits per element: the bit-packing seed's worked example, each part of the cost
//! counted apart, and the containers' padding.

use bitpack::{Bits, GroupAxis};
use weights::bpw::{self, BpwError, Container, Cost, FloatDtype, Format, Padding, ZeroPoints};

const SIDE: usize = 4096;

fn cost(format: Format) -> Cost {
    bpw::cost(&format, SIDE, SIDE).unwrap()
}

#[test]
fn worked_example_4096_square_under_common_layouts() {
    let expected = [
        ("4-bit g128, f16 scales", 4.125),
        ("4-bit g128, f16 scales, packed 4-bit zeros", 4.15625),
        ("4-bit g128, f16 scales, packed zeros, g_idx", 4.1640625),
        ("4-bit g32, f16 scale + f16 zero", 5.0),
        ("GGUF Q4_0 (block 32, f16 d)", 4.5),
        ("GGUF Q4_K (256: f16 d, dmin, 12 B scales)", 4.5),
        ("GGUF Q6_K (256: f16 d, 16 B scales)", 6.5625),
        ("GGUF Q8_0 (block 32, f16 d)", 8.5),
        ("NF4 (block 64, f32 absmax)", 4.5),
    ];
    let layouts = bpw::common_layouts();
    assert_eq!(layouts.len(), expected.len());
    for ((name, format), (want_name, want_bits)) in layouts.into_iter().zip(expected) {
        assert_eq!(name, want_name);
        assert_eq!(cost(format).bits_per_element(), want_bits, "{name}");
    }
}

#[test]
fn each_part_is_counted_apart() {
    // 4-bit g128 with packed zeros and g_idx on 4096 x 4096: 32 x 4096 groups.
    let format = bpw::common_layouts()[2].1;
    let cost = cost(format);
    assert_eq!(cost.elements, 16_777_216);
    assert_eq!(cost.code_bytes, 8_388_608);
    assert_eq!(cost.scale_bytes, 131_072 * 2);
    assert_eq!(cost.zero_point_bytes, 131_072 / 2);
    assert_eq!(cost.g_idx_bytes, 4096 * 4);
    assert_eq!(cost.extra_bytes, 0);
    assert_eq!(cost.metadata_bytes(), 262_144 + 65_536 + 16_384);
    assert_eq!(cost.total_bytes(), 8_388_608 + 344_064);
}

#[test]
fn seventy_billion_weights_at_4_125_versus_5_bits_differ_by_7_66_gb() {
    let layouts = bpw::common_layouts();
    let low = cost(layouts[0].1);
    let high = cost(layouts[3].1);
    let gap = high.bytes_at(70_000_000_000) - low.bytes_at(70_000_000_000);
    assert_eq!(gap, 7_656_250_000.0);
    assert_eq!(format!("{:.2}", gap / 1e9), "7.66");
    assert_eq!(format!("{:.2}", gap / f64::from(1u32 << 30)), "7.13");
}

#[test]
fn padding_and_containers_cost_what_they_store() {
    // 3-bit codes, 100 x 45 matrix, groups of 32 along the rows (45 lines of 100 elements).
    let mut format = Format::new(Bits::new(3).unwrap(), 32, FloatDtype::F16);
    let plain = bpw::cost(&format, 100, 45).unwrap();
    assert_eq!(plain.code_bytes, (4500 * 3usize).div_ceil(8));
    assert_eq!(plain.scale_bytes, 45 * 4 * 2);
    // Padded to whole groups: 128 codes per line.
    format.padding = Padding::Groups;
    assert_eq!(
        bpw::cost(&format, 100, 45).unwrap().code_bytes,
        45 * 128 * 3 / 8
    );
    // Each line its own word stream: 128 * 3 = 384 bits = 12 words per line.
    format.container = Container::LineWords;
    assert_eq!(bpw::cost(&format, 100, 45).unwrap().code_bytes, 45 * 12 * 4);
    // Unpadded lines of 100 codes: 300 bits = 10 words (padded), against 37.5 bytes of stream.
    format.padding = Padding::None;
    assert_eq!(bpw::cost(&format, 100, 45).unwrap().code_bytes, 45 * 10 * 4);
    // Packed zeros in line words: one stream of 45 zeros per group index: 135 bits = 5 words.
    format.zero_points = ZeroPoints::Packed;
    assert_eq!(
        bpw::cost(&format, 100, 45).unwrap().zero_point_bytes,
        4 * 5 * 4
    );
    // The feature axis swaps lines and line length; g_idx counts the grouped dimension.
    format.axis = GroupAxis::Feature;
    format.g_idx = true;
    let feature = bpw::cost(&format, 100, 45).unwrap();
    assert_eq!(feature.scale_bytes, 100 * 2 * 2);
    assert_eq!(feature.g_idx_bytes, 45 * 4);
}

#[test]
fn bad_shapes_and_names_are_refused() {
    let format = Format::new(Bits::FOUR, 0, FloatDtype::F16);
    assert_eq!(bpw::cost(&format, 8, 8), Err(BpwError::ZeroGroupSize));
    let format = Format::new(Bits::FOUR, 32, FloatDtype::F16);
    assert_eq!(
        bpw::cost(&format, 0, 8),
        Err(BpwError::EmptyShape { rows: 0, cols: 8 })
    );
    let unknown = |what, got: &str, expected| BpwError::UnknownChoice {
        what,
        got: got.to_string(),
        expected,
    };
    assert_eq!(
        "f8".parse::<FloatDtype>(),
        Err(unknown("float dtype", "f8", "f16, bf16, f32"))
    );
    assert_eq!(
        "bf16".parse::<ZeroPoints>(),
        Ok(ZeroPoints::Float(FloatDtype::Bf16))
    );
    assert_eq!(
        "int4".parse::<ZeroPoints>(),
        Err(unknown(
            "zero-point storage",
            "int4",
            "none, packed, f16, bf16, f32"
        ))
    );
    assert_eq!(
        "pad".parse::<Padding>(),
        Err(unknown("padding", "pad", "none, groups"))
    );
    assert_eq!("line-words".parse::<Container>(), Ok(Container::LineWords));
}

#[test]
fn sizes_that_overflow_are_an_error_naming_the_quantity() {
    let big = 99_999_999_999;
    let format = Format::new(Bits::FOUR, 128, FloatDtype::F16);
    assert_eq!(
        bpw::cost(&format, big, big),
        Err(BpwError::SizeOverflow {
            quantity: "the element count (rows x cols)",
            rows: big,
            cols: big,
        })
    );
    // One group, so the extra bytes fit, but the total does not.
    let extra = Format {
        extra_bytes_per_group: usize::MAX,
        ..format
    };
    assert_eq!(
        bpw::cost(&extra, 128, 1),
        Err(BpwError::SizeOverflow {
            quantity: "the total bytes",
            rows: 128,
            cols: 1,
        })
    );
    // Every group of a 4096 x 4096 matrix: the extra bytes themselves overflow.
    assert_eq!(
        bpw::cost(&extra, 4096, 4096).unwrap_err(),
        BpwError::SizeOverflow {
            quantity: "the extra metadata bytes (groups x extra bytes per group)",
            rows: 4096,
            cols: 4096,
        }
    );
    // A line so long that its codes' bits overflow, though the element count fits.
    assert_eq!(
        bpw::cost(&format, usize::MAX / 2, 1).unwrap_err(),
        BpwError::SizeOverflow {
            quantity: "the code bytes",
            rows: usize::MAX / 2,
            cols: 1,
        }
    );
}
