//! The fast GPTQ and AWQ packers against the straightforward implementations kept as their
//! oracles (`gptq::reference`, `awq::reference`): bit for bit on random, patterned and
//! all-maximum codes, at every width, under both zero conventions, with sequential and
//! act-order g_idx, at the smallest and at ragged shapes (K and N off every alignment), and
//! on malformed layers (the same error). Matrices stay small so the file runs in well under a
//! second at the test profile's opt-level.

use half::f16;
use ndarray::Array2;
use proptest::prelude::*;
use weights::gptq::{self, GPTQ_BITS, GptqLayer, ZeroConvention};
use weights::logical::sequential_g_idx;
use weights::{LogicalWeights, awq};

/// How the codes of a test matrix are filled.
#[derive(Debug, Clone, Copy)]
enum Fill {
    Random(u64),
    Ramp,
    Max,
    Zero,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A `bits`-wide K x N matrix, zero points in 1..=max (so v1 can store them), sequential or
/// (with `act_order`) reversed-within-pairs g_idx that keeps every group's size.
fn matrix(
    bits: u32,
    k: usize,
    n: usize,
    group_size: usize,
    fill: Fill,
    act_order: bool,
) -> LogicalWeights {
    let max = (1u32 << bits) - 1;
    let mut state = match fill {
        Fill::Random(seed) => seed,
        _ => 1,
    };
    let codes = Array2::from_shape_fn((k, n), |(r, c)| match fill {
        Fill::Random(_) => (splitmix(&mut state) % u64::from(max + 1)) as u8,
        Fill::Ramp => ((r * 7 + c * 3) % (max as usize + 1)) as u8,
        Fill::Max => max as u8,
        Fill::Zero => 0,
    });
    let groups = k.div_ceil(group_size);
    let scales = Array2::from_shape_fn((groups, n), |(g, c)| {
        f16::from_f32((g * 3 + c) as f32 * 0.125)
    });
    let zeros = Array2::from_shape_fn((groups, n), |(g, c)| {
        (1 + (g * 5 + c * 3) % max as usize) as u8
    });
    let mut g_idx = sequential_g_idx(k, group_size);
    if act_order {
        g_idx.reverse();
    }
    LogicalWeights::new(bits, group_size, codes, scales, zeros, g_idx).unwrap()
}

fn check_gptq(w: &LogicalWeights) {
    for convention in [ZeroConvention::V1, ZeroConvention::V2] {
        let fast = gptq::pack(w, convention);
        let oracle = gptq::reference::pack(w, convention);
        assert_eq!(
            fast,
            oracle,
            "pack {convention:?} {}x{} at {} bits",
            w.k(),
            w.n(),
            w.bits()
        );
        let layer = oracle.unwrap();
        assert_eq!(gptq::unpack(&layer), gptq::reference::unpack(&layer));
        assert_eq!(gptq::unpack(&layer).as_ref(), Ok(w));
    }
}

fn check_awq(w: &LogicalWeights) {
    let fast = awq::pack(w);
    let oracle = awq::reference::pack(w);
    assert_eq!(fast, oracle, "pack {}x{}", w.k(), w.n());
    if let Ok(layer) = oracle {
        assert_eq!(awq::unpack(&layer), awq::reference::unpack(&layer));
        assert_eq!(awq::unpack(&layer).as_ref(), Ok(w));
    }
}

const FILLS: [Fill; 4] = [Fill::Random(7), Fill::Ramp, Fill::Max, Fill::Zero];

#[test]
fn gptq_fast_matches_the_oracle_on_fixed_shapes() {
    for bits in GPTQ_BITS {
        let step = gptq::alignment(bits);
        // Aligned, smallest, ragged on either side and past the kernels' 32-column blocks, one
        // whole 2,048-column chunk of the 2- and 3-bit packer, and two and a part of one.
        let shapes = [
            (step, step),
            (1, 1),
            (step + 1, 2 * step - 1),
            (2 * step, 33),
            (3 * step - 5, 67),
            (64, 96),
            (2 * step + 3, 2048),
            (step + 3, 2 * 2048 + 37),
        ];
        for (k, n) in shapes {
            for group_size in [1, 16, k.max(1)] {
                for fill in FILLS {
                    for act_order in [false, true] {
                        check_gptq(&matrix(bits, k, n, group_size, fill, act_order));
                    }
                }
            }
        }
    }
}

#[test]
fn awq_fast_matches_the_oracle_on_fixed_shapes() {
    for (k, n) in [
        (8, 8),
        (1, 1),
        (1, 7),
        (33, 9),
        (64, 96),
        (40, 13),
        (31, 130),
        (3, 1031),
    ] {
        for group_size in [1, 8, 32, k] {
            for fill in FILLS {
                check_awq(&matrix(4, k, n, group_size, fill, false));
            }
        }
    }
    // Scattered groups are refused identically.
    let scattered = matrix(4, 16, 8, 4, Fill::Ramp, true);
    assert_eq!(awq::pack(&scattered), awq::reference::pack(&scattered));
    assert!(awq::pack(&scattered).is_err());
}

#[test]
fn gptq_fast_refuses_what_the_oracle_refuses() {
    // v1 cannot store a zero point of 0; the error names the same place.
    let w = matrix(4, 20, 12, 8, Fill::Ramp, false);
    let mut zeros = w.zeros().clone();
    zeros[[1, 5]] = 0;
    zeros[[2, 0]] = 0;
    let w = LogicalWeights::new(
        4,
        8,
        w.codes().clone(),
        w.scales().clone(),
        zeros,
        w.g_idx().to_vec(),
    )
    .unwrap();
    assert!(gptq::pack(&w, ZeroConvention::V1).is_err());
    assert_eq!(
        gptq::pack(&w, ZeroConvention::V1),
        gptq::reference::pack(&w, ZeroConvention::V1)
    );

    // Malformed layers: every edit gives the oracle's result.
    let layer = gptq::pack(
        &matrix(3, 40, 20, 16, Fill::Random(3), false),
        ZeroConvention::V2,
    )
    .unwrap();
    type Edit = Box<dyn Fn(&mut GptqLayer)>;
    let edits: Vec<Edit> = vec![
        Box::new(|l| l.convention = ZeroConvention::V1),
        Box::new(|l| l.qzeros[[1, 0]] = -1),
        Box::new(|l| l.g_idx[3] = -2),
        Box::new(|l| l.g_idx[50] = 7),
        Box::new(|l| l.g_idx[10] = 2),
        Box::new(|l| l.group_size = 32),
        Box::new(|l| l.bits = 5),
        Box::new(|l| l.logical_shape = [64, 32]),
        Box::new(|l| l.logical_shape = [65, 32]),
        Box::new(|l| l.qweight = Array2::zeros((5, 32))),
    ];
    for edit in edits {
        let mut edited = layer.clone();
        edit(&mut edited);
        assert_eq!(gptq::unpack(&edited), gptq::reference::unpack(&edited));
    }
    // Words with the sign bit set, in a non-standard (transposed-view) layout.
    let mut negative = layer.clone();
    negative.qweight.mapv_inplace(|w| w | i32::MIN);
    negative.qweight = negative
        .qweight
        .reversed_axes()
        .as_standard_layout()
        .reversed_axes()
        .to_owned();
    assert_eq!(gptq::unpack(&negative), gptq::reference::unpack(&negative));
}

#[test]
fn fast_packers_read_non_standard_layouts() {
    let w = matrix(4, 24, 16, 8, Fill::Random(11), false);
    // The same matrix with column-major codes.
    let codes = w
        .codes()
        .t()
        .as_standard_layout()
        .reversed_axes()
        .to_owned();
    assert!(!codes.is_standard_layout());
    let w2 = LogicalWeights::new(
        4,
        8,
        codes,
        w.scales().clone(),
        w.zeros().clone(),
        w.g_idx().to_vec(),
    )
    .unwrap();
    assert_eq!(
        gptq::pack(&w2, ZeroConvention::V1),
        gptq::reference::pack(&w, ZeroConvention::V1)
    );
    assert_eq!(awq::pack(&w2), awq::reference::pack(&w));
}

fn logical(bits: u32, act_order: bool) -> impl Strategy<Value = LogicalWeights> {
    let max = ((1u32 << bits) - 1) as u8;
    (1usize..=80, 1usize..=70)
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
                Just((k, n, group_size)),
                prop::collection::vec(0..=max, k * n),
                prop::collection::vec(1..=max, groups * n),
                g_idx,
            )
        })
        .prop_map(move |((k, n, group_size), codes, zeros, g_idx)| {
            let groups = k.div_ceil(group_size);
            LogicalWeights::new(
                bits,
                group_size,
                Array2::from_shape_vec((k, n), codes).unwrap(),
                Array2::from_elem((groups, n), f16::ONE),
                Array2::from_shape_vec((groups, n), zeros).unwrap(),
                g_idx,
            )
            .unwrap()
        })
}

fn any_gptq() -> impl Strategy<Value = LogicalWeights> {
    (prop::sample::select(GPTQ_BITS.to_vec()), any::<bool>())
        .prop_flat_map(|(bits, act_order)| logical(bits, act_order))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn gptq_fast_is_the_oracle_on_random_matrices(w in any_gptq()) {
        check_gptq(&w);
    }

    #[test]
    fn awq_fast_is_the_oracle_on_random_matrices(w in logical(4, false)) {
        check_awq(&w);
    }
}

#[test]
fn into_variants_reuse_any_previous_output_and_match_the_allocating_ones() {
    // One output reused across shapes, widths and conventions: stale contents, a buffer too
    // small, too large, and exactly the size of the next result.
    let mut layer =
        gptq::pack(&matrix(2, 16, 16, 4, Fill::Max, false), ZeroConvention::V2).unwrap();
    let mut logical = matrix(8, 70, 90, 7, Fill::Random(5), false);
    let cases = [
        (4, 64, 96, 16),
        (4, 64, 96, 16),
        (3, 45, 20, 16),
        (8, 9, 130, 4),
        (2, 3, 3, 1),
        (4, 64, 96, 32),
    ];
    for (i, &(bits, k, n, group_size)) in cases.iter().enumerate() {
        let w = matrix(bits, k, n, group_size, Fill::Random(i as u64), i % 2 == 1);
        for convention in [ZeroConvention::V1, ZeroConvention::V2] {
            gptq::pack_into(&w, convention, &mut layer).unwrap();
            assert_eq!(Ok(&layer), gptq::reference::pack(&w, convention).as_ref());
            gptq::unpack_into(&layer, &mut logical).unwrap();
            assert_eq!(logical, w);
        }
    }
    // A refused pack leaves the layer as it was.
    let before = layer.clone();
    let w = matrix(4, 8, 8, 8, Fill::Ramp, false);
    let mut zeros = w.zeros().clone();
    zeros[[0, 0]] = 0;
    let w = LogicalWeights::new(
        4,
        8,
        w.codes().clone(),
        w.scales().clone(),
        zeros,
        w.g_idx().to_vec(),
    )
    .unwrap();
    assert!(gptq::pack_into(&w, ZeroConvention::V1, &mut layer).is_err());
    assert_eq!(layer, before);

    let mut awq_layer = awq::pack(&matrix(4, 8, 8, 8, Fill::Max, false)).unwrap();
    for (i, &(k, n, group_size)) in [
        (64, 96, 32),
        (64, 96, 32),
        (40, 13, 32),
        (1, 1, 1),
        (33, 130, 8),
    ]
    .iter()
    .enumerate()
    {
        let w = matrix(4, k, n, group_size, Fill::Random(40 + i as u64), false);
        awq::pack_into(&w, &mut awq_layer).unwrap();
        assert_eq!(Ok(&awq_layer), awq::reference::pack(&w).as_ref());
        awq::unpack_into(&awq_layer, &mut logical).unwrap();
        assert_eq!(logical, w);
    }
}

#[test]
fn large_layers_past_the_streaming_threshold_match_the_oracle() {
    // 8 MiB and more of qweight (pack) and of codes (unpack): the non-temporal stores. N is off
    // the 32- and 64-column blocks and the 2,048-column chunks, so each row also ends in a
    // partial block or chunk.
    for (bits, k) in [(8, 2048), (4, 4096), (2, 8192)] {
        let w = matrix(bits, k, 4100, 128, Fill::Random(11), false);
        check_gptq(&w);
    }
}
