//! Every fast path against the oracle in [`crate::reference`], bit for bit: each kernel this
//! CPU runs, streaming stores on and off, row-major, column-major and strided inputs and
//! outputs, both axes and modes, every width, group sizes 1, 3, 8, 32, 128 and longer than the
//! rows, odd shapes, and random, patterned, all-maximum, tie-heavy, subnormal and zero data;
//! then the same on generated cases.

use ndarray::{Array2, ArrayView2, ShapeBuilder, s};
use proptest::prelude::*;

use crate::quantize::decode_into_stores;
use crate::{
    GroupAxis, Kernel, KvError, Layout, Mode, decode_exact, decode_exact_tokens_into, encode_with,
    reference,
};

/// Every supported (mode, bits) pair.
fn modes_and_widths() -> Vec<(Mode, u32)> {
    let symmetric = (2..=8).map(|b| (Mode::Symmetric, b));
    let asymmetric = (1..=8).map(|b| (Mode::Asymmetric, b));
    symmetric.chain(asymmetric).collect()
}

fn bits_of(a: &Array2<f32>) -> Array2<u32> {
    a.mapv(f32::to_bits)
}

/// Encodes with every kernel and input layout, checks the bytes against the oracle, then
/// decodes with every kernel, output layout and store kind against the oracle's decode.
fn check(x: ArrayView2<f32>, layout: Layout, label: &str) {
    let expected = reference::encode(x, layout);
    let transposed_copy = x.t().to_owned(); // x^T row-major: x.t() of it is column-major x
    let strided_source = {
        let (n, d) = x.dim();
        let mut wide = Array2::<f32>::from_elem((n, 2 * d), f32::NAN);
        wide.slice_mut(s![.., ..;2]).assign(&x);
        wide
    };
    let inputs = [
        ("row-major", x.to_owned()),
        ("column-major", transposed_copy.t().to_owned()),
    ];
    for kernel in Kernel::available() {
        let mut views: Vec<(&str, ArrayView2<f32>)> =
            inputs.iter().map(|(name, a)| (*name, a.view())).collect();
        views.push(("column-major view", transposed_copy.t()));
        views.push(("strided", strided_source.slice(s![.., ..;2])));
        for (input, view) in views {
            let got = encode_with(kernel, view, layout);
            if expected.is_ok() {
                assert_eq!(got, expected, "{label}: {kernel} encode of a {input} input");
            } else {
                // Debug forms, so that errors naming a NaN compare equal. Only errors: formatting
                // every packed tensor took 40% of these tests' time (most of it under QEMU).
                assert_eq!(
                    format!("{got:?}"),
                    format!("{expected:?}"),
                    "{label}: {kernel} encode of a {input} input"
                );
            }
        }
        let Ok(packed) = &expected else { continue };
        let want = bits_of(&reference::decode(packed));
        let (n, d) = x.dim();
        for streaming in [false, true] {
            let mut row_major = Array2::<f32>::from_elem((n, d), f32::NAN);
            decode_into_stores(kernel, packed, row_major.view_mut(), streaming).unwrap();
            assert_eq!(
                bits_of(&row_major),
                want,
                "{label}: {kernel} {streaming} row-major"
            );
            let mut column_major = Array2::<f32>::from_elem((n, d).f(), f32::NAN);
            decode_into_stores(kernel, packed, column_major.view_mut(), streaming).unwrap();
            assert_eq!(
                bits_of(&column_major),
                want,
                "{label}: {kernel} column-major"
            );
            let mut wide = Array2::<f32>::from_elem((n, 2 * d), f32::NAN);
            decode_into_stores(kernel, packed, wide.slice_mut(s![.., ..;2]), streaming).unwrap();
            let strided = wide.slice(s![.., ..;2]).to_owned();
            assert_eq!(bits_of(&strided), want, "{label}: {kernel} strided output");
        }
    }
    if let Ok(packed) = &expected {
        let want = reference::decode_exact(packed);
        let got = decode_exact(packed);
        assert_eq!(
            got.mapv(f64::to_bits),
            want.mapv(f64::to_bits),
            "{label}: exact"
        );
        let n = x.nrows();
        for (start, end) in [(0, n), (n / 3, n - n / 4), (n - 1, n), (n / 2, n / 2)] {
            let mut out = Array2::<f64>::from_elem((end - start, x.ncols()), f64::NAN);
            decode_exact_tokens_into(packed, start..end, out.view_mut()).unwrap();
            let rows = want.slice(s![start..end, ..]).mapv(f64::to_bits);
            assert_eq!(
                out.mapv(f64::to_bits),
                rows,
                "{label}: tokens {start}..{end}"
            );
        }
    }
}

/// xorshift64 values in [-1, 1).
pub(crate) fn noise(tokens: usize, features: usize, seed: u64) -> Array2<f32> {
    let mut state = seed | 1;
    Array2::from_shape_fn((tokens, features), |_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    })
}

/// Data that puts many values exactly on half steps of their group's scale: every group's
/// largest magnitude is qmax * 2^-2 (symmetric) or its range spans L steps of 2^-2 with 0 on
/// a step (asymmetric), and the other values are (k + 1/2) steps.
fn ties(tokens: usize, features: usize, layout: Layout) -> Array2<f32> {
    let step = 0.25f32;
    let (q, levels) = (
        f32::from(layout.bits.qmax()),
        f32::from(layout.bits.max_code()),
    );
    Array2::from_shape_fn((tokens, features), |(t, f)| {
        let j = match layout.axis {
            GroupAxis::Token => t,
            GroupAxis::Feature => f,
        };
        let position = j % layout.group_size;
        match layout.mode {
            Mode::Symmetric => match position {
                0 => q * step,
                _ => ((position as f32 * 7.0) % (2.0 * q) - q + 0.5) * step,
            },
            Mode::Asymmetric => {
                let zero = (levels / 3.0).floor();
                match position {
                    0 => -zero * step,
                    1 => (levels - zero) * step,
                    _ => ((position as f32 * 5.0) % levels - zero + 0.5) * step,
                }
            }
        }
    })
}

/// Data patterns by name.
pub(crate) fn patterns(
    tokens: usize,
    features: usize,
    layout: Layout,
) -> Vec<(&'static str, Array2<f32>)> {
    let tiny = f32::from_bits(3);
    vec![
        ("noise", noise(tokens, features, 7)),
        (
            "ramp",
            Array2::from_shape_fn((tokens, features), |(t, f)| {
                (t as f32 - 7.0) * 0.37 + f as f32 * 1.5
            }),
        ),
        ("all maximum", Array2::from_elem((tokens, features), 3.5)),
        (
            "all negative maximum",
            Array2::from_elem((tokens, features), -3.5),
        ),
        ("ties", ties(tokens, features, layout)),
        ("zeros", Array2::zeros((tokens, features))),
        (
            "subnormal and zero groups",
            Array2::from_shape_fn((tokens, features), |(t, f)| match (t / 5 + f / 3) % 3 {
                0 => 0.0,
                1 => tiny * if (t + f) % 2 == 0 { 1.0 } else { -1.0 },
                _ => -0.0,
            }),
        ),
        (
            "all positive, far from 0",
            noise(tokens, features, 11).mapv(|v| 100.0 + v),
        ),
        ("huge", noise(tokens, features, 13).mapv(|v| v * 1.5e38)),
    ]
}

#[test]
fn fixed_shapes_patterns_and_layouts_match_the_oracle() {
    let shapes = [
        (35, 13),
        (1, 1),
        (8, 8),
        (130, 37),
        (37, 130),
        (64, 24),
        (3, 200),
    ];
    for (tokens, features) in shapes {
        for (mode, bits) in modes_and_widths() {
            for axis in [GroupAxis::Token, GroupAxis::Feature] {
                for group_size in [1, 3, 8, 32, 128, 256] {
                    let layout = Layout::with_mode(axis, mode, bits, group_size).unwrap();
                    // Every pattern on the first shapes, noise and ties on the rest.
                    let every = (tokens, features) == (35, 13) || (tokens, features) == (130, 37);
                    for (name, x) in patterns(tokens, features, layout) {
                        if !every && !matches!(name, "noise" | "ties") {
                            continue;
                        }
                        let label = format!(
                            "{tokens}x{features} {mode} b{bits} {axis} g{group_size} {name}"
                        );
                        check(x.view(), layout, &label);
                    }
                }
            }
        }
    }
}

/// Rows along the feature axis long enough for whole batches of groups (fitted and packed 8 at a
/// time up to groups of 128, and groups of 8 sixteen at a time with AVX-512), with and without
/// leftover groups and a partial last group, every pattern.
#[test]
fn batched_feature_groups_match_the_oracle() {
    for group_size in [8, 16, 32, 64, 128] {
        let lengths: &[usize] = if group_size == 8 {
            &[8, 56, 64, 72, 127, 128, 200, 520]
        } else {
            &[
                7 * group_size,
                8 * group_size,
                8 * group_size + 3,
                17 * group_size,
            ]
        };
        for &features in lengths {
            for (mode, bits) in modes_and_widths() {
                let layout = Layout::with_mode(GroupAxis::Feature, mode, bits, group_size).unwrap();
                for (name, x) in patterns(3, features, layout) {
                    let label = format!("3x{features} {mode} b{bits} g{group_size} {name}");
                    check(x.view(), layout, &label);
                }
            }
        }
    }
}

/// Decoding into outputs that start at every float offset from a 32-byte boundary (the fast
/// paths pick 32-byte, 16-byte or no streaming stores by alignment), both axes, row-major and
/// column-major, streaming on and off, rows of whole groups and not, odd token counts.
#[test]
fn decoding_at_every_alignment_matches_the_oracle() {
    let shapes = [
        (3, 8),
        (5, 56),
        (7, 64),
        (9, 72),
        (33, 200),
        (67, 128),
        (131, 40),
        (16, 13),
    ];
    for (tokens, features) in shapes {
        for (mode, bits) in modes_and_widths() {
            for axis in [GroupAxis::Token, GroupAxis::Feature] {
                for group_size in [8, 32, 128] {
                    let layout = Layout::with_mode(axis, mode, bits, group_size).unwrap();
                    let x = noise(tokens, features, (tokens * 1000 + features) as u64);
                    let packed = reference::encode(x.view(), layout).unwrap();
                    let want = bits_of(&reference::decode(&packed));
                    let len = tokens * features;
                    for kernel in Kernel::available() {
                        for streaming in [false, true] {
                            for shift in 0..8 {
                                let label = format!(
                                    "{tokens}x{features} {mode} b{bits} {axis} g{group_size} \
                                     {kernel} streaming {streaming} shift {shift}"
                                );
                                let mut buffer = vec![f32::NAN; len + 16];
                                let base = buffer.as_ptr().align_offset(32);
                                let memory = &mut buffer[base + shift..base + shift + len];
                                let mut out = ndarray::ArrayViewMut2::from_shape(
                                    (tokens, features),
                                    &mut memory[..],
                                )
                                .unwrap();
                                decode_into_stores(kernel, &packed, out.view_mut(), streaming)
                                    .unwrap();
                                assert_eq!(bits_of(&out.to_owned()), want, "{label} row-major");
                                let mut out = ndarray::ArrayViewMut2::from_shape(
                                    (tokens, features).f(),
                                    &mut memory[..],
                                )
                                .unwrap();
                                decode_into_stores(kernel, &packed, out.view_mut(), streaming)
                                    .unwrap();
                                assert_eq!(bits_of(&out.to_owned()), want, "{label} column-major");
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Errors met inside a batch of 8 groups: whichever group comes first decides, a non-finite
/// value before an overflowing range in the same group.
/// Token-axis decoding gathers each column's codes a pass of about 512 tokens at a time:
/// several passes, the last one partial, groups that do and do not divide a pass, and (for
/// AVX-512's decoder) blocks of 16 columns, tiles of 16 tokens cut by groups of 24 and 40, and
/// a group longer than the usual pass.
#[test]
fn token_axis_decoding_over_several_passes_matches_the_oracle() {
    for (tokens, features) in [(1100, 24), (1601, 16), (1100, 48), (613, 128)] {
        for (mode, bits) in modes_and_widths() {
            for group_size in [3, 8, 24, 32, 40, 128, 384, 1000] {
                let layout = Layout::with_mode(GroupAxis::Token, mode, bits, group_size).unwrap();
                let x = noise(tokens, features, (tokens + group_size) as u64);
                let packed = reference::encode(x.view(), layout).unwrap();
                let want = bits_of(&reference::decode(&packed));
                for kernel in Kernel::available() {
                    for streaming in [false, true] {
                        let mut out = Array2::<f32>::from_elem((tokens, features), f32::NAN);
                        decode_into_stores(kernel, &packed, out.view_mut(), streaming).unwrap();
                        assert_eq!(
                            bits_of(&out),
                            want,
                            "{tokens}x{features} {mode} b{bits} g{group_size} {kernel} \
                             streaming {streaming}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn errors_inside_batches_are_the_oracles() {
    for group_size in [8, 32, 128] {
        for mode in [Mode::Symmetric, Mode::Asymmetric] {
            let layout = Layout::with_mode(GroupAxis::Feature, mode, 4, group_size).unwrap();
            // Groups 0-7 fill a batch of 8; at 8 values a group, 0-15 one of 16 (AVX-512).
            let cases: [&[(usize, f32)]; 8] = [
                &[(5, f32::NAN)],
                &[(2, 3e38), (3, -3e38), (5, f32::INFINITY)],
                &[(1, f32::NEG_INFINITY), (6, 3e38), (7, -3e38)],
                &[(4, 3e38), (4, -3e38), (4, f32::NAN)],
                &[(7, -3e38), (7, 3e38)],
                &[(12, f32::NAN)],
                &[(9, 3e38), (9, -3e38), (14, f32::INFINITY)],
                &[(15, -3e38), (15, 3e38)],
            ];
            for cells in cases {
                for row in [0, 2] {
                    let mut x = noise(3, 16 * group_size + 5, 9);
                    for (i, &(group, value)) in cells.iter().enumerate() {
                        x[(row, group * group_size + (3 * i) % group_size)] = value;
                    }
                    check(x.view(), layout, &format!("{layout:?} row {row} {cells:?}"));
                }
            }
        }
    }
}

/// An overflowing group met before a non-finite value further on (a later row, or a later
/// group of the same row): the non-finite value is refused, as the reference checks the whole
/// input for one first. Every group size path, both axes.
#[test]
fn a_non_finite_value_anywhere_comes_before_an_overflow() {
    for axis in [GroupAxis::Feature, GroupAxis::Token] {
        for group_size in [3, 8, 32, 128] {
            let layout = Layout::with_mode(axis, Mode::Asymmetric, 4, group_size).unwrap();
            for (late, value) in [((5, 2), f32::NAN), ((0, 9), f32::INFINITY)] {
                let mut x = noise(6, 10, 5);
                // The group of (0, 0) overflows along either axis.
                x[(0, 0)] = 3e38;
                x[(0, 1)] = -3e38;
                x[(1, 0)] = -3e38;
                x[late] = value;
                check(x.view(), layout, &format!("{layout:?} {late:?}"));
            }
        }
    }
}

#[test]
fn errors_are_the_oracles() {
    let layouts = [
        Layout::new(GroupAxis::Token, 4, 8).unwrap(),
        Layout::new(GroupAxis::Feature, 4, 32).unwrap(),
        Layout::with_mode(GroupAxis::Token, Mode::Asymmetric, 3, 8).unwrap(),
        Layout::with_mode(GroupAxis::Feature, Mode::Asymmetric, 8, 3).unwrap(),
        Layout::with_mode(GroupAxis::Token, Mode::Asymmetric, 8, 16).unwrap(),
    ];
    for layout in layouts {
        // Non-finite values: the first in row-major order is named, wherever the fast path
        // meets one first.
        for (cells, value) in [
            (vec![(20, 3)], f32::NAN),
            (vec![(30, 1), (2, 12)], f32::INFINITY),
            (vec![(0, 12), (34, 0)], f32::NEG_INFINITY),
        ] {
            let mut x = noise(35, 13, 3);
            for &cell in &cells {
                x[cell] = value;
            }
            check(
                x.view(),
                layout,
                &format!("{layout:?} non-finite at {cells:?}"),
            );
        }
        // Overflowing groups: the first in grouped-view order is named.
        let mut x = noise(35, 13, 5);
        for cell in [(33, 2), (34, 2), (1, 11), (2, 11), (16, 7), (17, 8)] {
            x[cell] = if cell.0 % 2 == 0 { 3e38 } else { -3e38 };
        }
        check(x.view(), layout, &format!("{layout:?} overflow"));
    }
    let empty = Array2::<f32>::zeros((0, 4));
    for kernel in Kernel::available() {
        assert_eq!(
            encode_with(kernel, empty.view(), layouts[0]),
            Err(KvError::EmptyMatrix { rows: 0, cols: 4 })
        );
    }
}

#[test]
fn decoding_refuses_wrong_shapes_and_ranges() {
    let x = noise(35, 13, 1);
    let packed = crate::encode(x.view(), Layout::new(GroupAxis::Token, 4, 8).unwrap()).unwrap();
    let mut wrong = Array2::<f32>::zeros((13, 35));
    assert_eq!(
        crate::decode_into(&packed, wrong.view_mut()),
        Err(KvError::OutputShape {
            got: (13, 35),
            expected: (35, 13)
        })
    );
    let mut out = Array2::<f64>::zeros((5, 13));
    assert_eq!(
        decode_exact_tokens_into(&packed, 32..37, out.view_mut()),
        Err(KvError::TokenRange {
            start: 32,
            end: 37,
            tokens: 35
        })
    );
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = 6..1;
    assert!(matches!(
        decode_exact_tokens_into(&packed, reversed, out.view_mut()),
        Err(KvError::TokenRange { .. })
    ));
    assert_eq!(
        decode_exact_tokens_into(&packed, 0..4, out.view_mut()),
        Err(KvError::OutputShape {
            got: (5, 13),
            expected: (4, 13)
        })
    );
    assert_eq!(
        decode_exact_tokens_into(&packed, 30..35, out.view_mut()),
        Ok(())
    );
}

#[test]
fn every_kernel_this_machine_lacks_is_refused() {
    let x = noise(4, 4, 1);
    let layout = Layout::new(GroupAxis::Token, 4, 8).unwrap();
    for kernel in Kernel::ALL {
        if !kernel.is_available() {
            assert_eq!(
                encode_with(kernel, x.view(), layout),
                Err(KvError::KernelUnavailable { kernel })
            );
        }
    }
    assert!(Kernel::available().contains(&Kernel::Portable));
    assert!(Kernel::detect().is_available());
}

fn layouts() -> impl Strategy<Value = (Layout, usize, usize)> {
    (
        1usize..70,
        1usize..40,
        prop_oneof![
            Just(1usize),
            2usize..12,
            prop::sample::select(vec![8usize, 16, 24, 32, 40, 64, 128]),
            60usize..140
        ],
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
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn generated_cases_match_the_oracle(
        (layout, tokens, features) in layouts(),
        magnitude in prop::sample::select(vec![1e-40f32, 1e-3, 1.0, 7.0, 1e30]),
        ties_instead in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let x = if ties_instead {
            ties(tokens, features, layout)
        } else {
            noise(tokens, features, seed).mapv(|v| v * magnitude)
        };
        check(x.view(), layout, &format!("{tokens}x{features} {layout:?}"));
    }
}

/// Columns along the token axis long enough for several batches of tiles (the encoder stages
/// a batch of tiles, 1024 tokens or 16 tiles, before writing each column's part), with a
/// partial last batch and a partial last tile, narrow and wide matrices.
#[test]
fn batched_token_tiles_match_the_oracle() {
    for group_size in [8, 16, 64, 128] {
        let batch_tokens = if group_size >= 64 {
            16 * group_size
        } else {
            1024
        };
        for (tokens, features, every) in [
            (batch_tokens, 9, false),
            (2 * batch_tokens + group_size + 5, 13, true),
            (batch_tokens + 3, 130, false),
        ] {
            check_token_axis(tokens, features, group_size, every, every);
        }
    }
}

/// [`check`] of a `tokens x features` matrix along tokens in groups of `group_size`, both
/// modes, on noise and ties (every pattern when `every_pattern`), at 2, 3 and 8 bits (every
/// width when `every_width`).
fn check_token_axis(
    tokens: usize,
    features: usize,
    group_size: usize,
    every_pattern: bool,
    every_width: bool,
) {
    for (mode, bits) in modes_and_widths() {
        if !every_width && ![2, 3, 8].contains(&bits) {
            continue;
        }
        let layout = Layout::with_mode(GroupAxis::Token, mode, bits, group_size).unwrap();
        for (name, x) in patterns(tokens, features, layout) {
            if !every_pattern && !matches!(name, "noise" | "ties") {
                continue;
            }
            let label = format!("{tokens}x{features} {mode} b{bits} g{group_size} {name}");
            check(x.view(), layout, &label);
        }
    }
}

/// AVX-512's pass-by-pass token-axis encoder and decoder (BW and VBMI, whole blocks of 16
/// columns): several passes of about 512 tokens, the last one partial, groups that cut the
/// 16-token tiles (8, 24, 40) and groups of one or more tiles (32, 128, and 1000, longer than
/// the usual pass), up to 64 groups a pass, every pattern on some shapes, and errors in a
/// later pass (a non-finite value anywhere before an overflow). x86_64 only, as below.
#[cfg(target_arch = "x86_64")]
#[test]
fn token_axis_passes_match_the_oracle() {
    for (tokens, features) in [(1100, 48), (613, 128), (1601, 16)] {
        for group_size in [8, 24, 32, 40, 128, 1000] {
            let every = (tokens, features) == (1100, 48) && [8, 40].contains(&group_size);
            check_token_axis(tokens, features, group_size, every, true);
        }
    }
    for group_size in [8, 32] {
        for mode in [Mode::Symmetric, Mode::Asymmetric] {
            let layout = Layout::with_mode(GroupAxis::Token, mode, 4, group_size).unwrap();
            let cases: [&[((usize, usize), f32)]; 3] = [
                &[((700, 17), f32::NAN)],
                &[
                    ((900, 3), 3e38),
                    ((901, 3), -3e38),
                    ((1099, 47), f32::INFINITY),
                ],
                &[((520, 40), 3e38), ((521, 40), -3e38)],
            ];
            for cells in cases {
                let mut x = noise(1100, 48, 9);
                for &(cell, value) in cells {
                    x[cell] = value;
                }
                check(x.view(), layout, &format!("{layout:?} {cells:?}"));
            }
        }
    }
}

/// Token-axis tiles wide enough for AVX-512's 16-column encoder (at least 8,192 floats, whole
/// blocks of 16 columns): 1 to 16 blocks (fitted 8, 4, 2 and 1 at a time), a partial last
/// tile both above and below that size (zero padding), every pattern on some shapes, and
/// errors inside such tiles (the first tile decides, a non-finite value before an overflow).
/// x86_64 only: elsewhere the portable kernel alone would run, whose tiles of every size the
/// tests above cover (and QEMU's emulation of CI's other platforms would take minutes here).
#[cfg(target_arch = "x86_64")]
#[test]
fn wide_token_tiles_match_the_oracle() {
    for (tokens, features, group_size, every) in [
        (2 * 128 + 100, 256, 128, false),
        (3 * 64 + 5, 128, 64, true),
        (2 * 128 + 1, 64, 128, false),
        (2 * 64 + 33, 192, 64, false),
        (2 * 256 + 7, 48, 256, false),
        (3 * 32, 256, 32, false),
    ] {
        check_token_axis(tokens, features, group_size, every, true);
    }
    for mode in [Mode::Symmetric, Mode::Asymmetric] {
        let layout = Layout::with_mode(GroupAxis::Token, mode, 4, 64).unwrap();
        let cases: [&[((usize, usize), f32)]; 4] = [
            &[((100, 77), f32::NAN)],
            &[((70, 1), 3e38), ((71, 1), -3e38), ((190, 0), f32::INFINITY)],
            &[
                ((130, 17), 3e38),
                ((131, 17), -3e38),
                ((65, 127), f32::NEG_INFINITY),
            ],
            &[((10, 5), 3e38), ((11, 5), -3e38), ((12, 120), f32::NAN)],
        ];
        for cells in cases {
            let mut x = noise(3 * 64 + 5, 128, 9);
            for &(cell, value) in cells {
                x[cell] = value;
            }
            check(x.view(), layout, &format!("{layout:?} {cells:?}"));
        }
    }
}

/// A large token-axis code stream (8-bit codes in groups of 8: runs of 1 KiB per column and
/// batch of tiles), with columns that start off 32-byte boundaries (encode only: the oracle is
/// slow at this size).
#[test]
fn large_token_streams_match_the_oracle() {
    let x = noise(32771, 129, 17);
    for mode in [Mode::Symmetric, Mode::Asymmetric] {
        let layout = Layout::with_mode(GroupAxis::Token, mode, 8, 8).unwrap();
        let expected = reference::encode(x.view(), layout);
        assert!(expected.is_ok());
        for kernel in Kernel::available() {
            assert_eq!(
                encode_with(kernel, x.view(), layout),
                expected,
                "{kernel} {layout:?}"
            );
        }
    }
}

/// Errors along the token axis in later batches of tiles: whichever tile comes first
/// decides, a non-finite value before an overflowing range in the same tile.
#[test]
fn errors_in_later_token_batches_are_the_oracles() {
    for group_size in [8, 32, 128] {
        for mode in [Mode::Symmetric, Mode::Asymmetric] {
            let layout = Layout::with_mode(GroupAxis::Token, mode, 4, group_size).unwrap();
            let cases: [&[((usize, usize), f32)]; 4] = [
                &[((2500, 3), f32::NAN)],
                &[
                    ((2100, 1), 3e38),
                    ((2101, 1), -3e38),
                    ((4000, 0), f32::INFINITY),
                ],
                &[((4000, 2), 3e38), ((4001, 2), -3e38), ((2100, 7), f32::NAN)],
                &[((3000, 5), 3e38), ((3001, 5), -3e38), ((3002, 5), f32::NAN)],
            ];
            for cells in cases {
                let mut x = noise(4100, 11, 9);
                for &(cell, value) in cells {
                    x[cell] = value;
                }
                check(x.view(), layout, &format!("{layout:?} {cells:?}"));
            }
        }
    }
}
