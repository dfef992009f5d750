//! The fast GGUF kernels (portable, and AVX2 where the CPU has it) against the per-block
//! reference, bit for bit: the same blocks (compared as bytes, so -0 and +0 scales differ),
//! the same errors naming the same block, the same dequantized bits.

use half::f16;
use proptest::prelude::*;
use weights::FormatError;
use weights::gguf::{
    self, BlockQ4_0, BlockQ8_0, GgufBlock, Kernel, dequantize_into_with, quantize_into_with,
};

/// The kernels other than the reference that this CPU runs.
fn fast_kernels() -> Vec<Kernel> {
    let kernels: Vec<Kernel> = Kernel::available()
        .into_iter()
        .filter(|&k| k != Kernel::Reference)
        .collect();
    assert!(kernels.contains(&Kernel::Portable));
    kernels
}

/// Quantizes with every kernel and compares with the reference: result, bytes, and the
/// dequantized values of an accepted run. Returns the reference result.
fn check<B: GgufBlock>(x: &[f32], cols: usize) -> Result<Vec<B>, FormatError> {
    let zero = B::from_parts(f16::ZERO, &[0; 32]);
    let mut expected = vec![zero; x.len() / 32];
    let reference = quantize_into_with(Kernel::Reference, x, cols, &mut expected);
    if reference.is_ok() {
        // The reference kernel is the trait's per-block quantizer.
        for (values, block) in x.chunks_exact(32).zip(&expected) {
            let own = B::quantize(values.try_into().unwrap());
            assert_eq!(own.to_bytes().as_ref(), block.to_bytes().as_ref());
        }
    }
    for kernel in fast_kernels() {
        let mut got = vec![zero; x.len() / 32];
        let result = quantize_into_with(kernel, x, cols, &mut got);
        // Compared as Debug text: a NaN in `NonFinite` is not equal to itself.
        assert_eq!(
            format!("{result:?}"),
            format!("{reference:?}"),
            "{} {kernel:?}",
            B::NAME
        );
        if reference.is_ok() {
            assert_eq!(
                gguf::to_bytes(&got),
                gguf::to_bytes(&expected),
                "{} {kernel:?} bytes",
                B::NAME
            );
        }
    }
    assert_eq!(
        format!(
            "{:?}",
            gguf::quantize::<B>(x, cols).map(|b| gguf::to_bytes(&b))
        ),
        format!(
            "{:?}",
            reference.clone().map(|()| gguf::to_bytes(&expected))
        )
    );
    reference?;
    check_dequantize(&expected);
    Ok(expected)
}

/// Dequantizes with every kernel and compares the bits with the reference.
fn check_dequantize<B: GgufBlock>(blocks: &[B]) {
    let expected: Vec<u32> = blocks
        .iter()
        .flat_map(|b| b.dequantize())
        .map(f32::to_bits)
        .collect();
    for kernel in Kernel::available() {
        let mut out = vec![f32::NAN; blocks.len() * 32];
        dequantize_into_with(kernel, blocks, &mut out).unwrap();
        let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, expected, "{} {kernel:?} dequantize", B::NAME);
    }
    let got: Vec<u32> = gguf::dequantize(blocks)
        .iter()
        .map(|v| v.to_bits())
        .collect();
    assert_eq!(got, expected);
}

/// Both formats.
fn check_both(x: &[f32], cols: usize) {
    let _ = check::<BlockQ4_0>(x, cols);
    let _ = check::<BlockQ8_0>(x, cols);
}

/// A small deterministic generator (splitmix64) with gaussian draws (Box-Muller).
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn gaussian(&mut self) -> f32 {
        let (u, v) = (self.uniform().max(1e-300), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

#[test]
fn gaussian_blocks_at_many_scales_and_odd_block_counts() {
    let mut rng = Rng(7);
    for scale in [1.0f32, 1e-3, 37.5, 2e-4, 3e4] {
        for blocks in [1, 3, 7, 33, 128] {
            let x: Vec<f32> = (0..blocks * 32).map(|_| rng.gaussian() * scale).collect();
            check::<BlockQ4_0>(&x, 32).unwrap();
            check::<BlockQ8_0>(&x, 32).unwrap();
        }
    }
    // Rows of several blocks.
    let x: Vec<f32> = (0..7 * 96).map(|_| rng.gaussian()).collect();
    check::<BlockQ4_0>(&x, 96).unwrap();
    check::<BlockQ8_0>(&x, 96).unwrap();
}

#[test]
fn patterned_and_all_equal_blocks() {
    let ramp: Vec<f32> = (0..33 * 32).map(|i| (i % 32) as f32 - 12.0).collect();
    check_both(&ramp, 32);
    let sine: Vec<f32> = (0..33 * 32).map(|i| (i as f32 * 0.37).sin()).collect();
    check_both(&sine, 32);
    for c in [
        1.0f32, -1.0, 15.0, -3.7, 0.1, 65504.0, -1e-4, 127.0, 8.0, -8.0,
    ] {
        let x = vec![c; 3 * 32];
        check::<BlockQ4_0>(&x, 96).unwrap();
        check::<BlockQ8_0>(&x, 96).unwrap();
    }
}

#[test]
fn zeros_keep_their_scale_bits() {
    // A block of zeros, of negative zeros, and of both: the reference's d is -0 for Q4_0
    // (+0 / -8) and +0 for Q8_0, whatever the signs of the zeros.
    let mut x = vec![0.0f32; 32];
    x.extend([-0.0f32; 32]);
    x.extend((0..32).map(|i| if i % 3 == 0 { -0.0 } else { 0.0 }));
    let q4 = check::<BlockQ4_0>(&x, 32).unwrap();
    assert!(q4.iter().all(|b| b.d.to_bits() == 0x8000));
    let q8 = check::<BlockQ8_0>(&x, 32).unwrap();
    assert!(q8.iter().all(|b| b.d.to_bits() == 0));
}

#[test]
fn q4_0_first_maximum_wins_between_equal_magnitudes() {
    let mut rng = Rng(11);
    let mut x = Vec::new();
    for _ in 0..200 {
        let m = rng.gaussian().abs() + 0.5;
        let mut block: Vec<f32> = (0..32).map(|_| rng.gaussian() * m * 0.3).collect();
        // Several lanes at +m and -m, in random order: the first decides d's sign.
        for _ in 0..1 + rng.below(5) {
            let lane = rng.below(32);
            block[lane] = if rng.below(2) == 0 { m } else { -m };
        }
        x.extend(block);
    }
    // Equal magnitudes in every lane, alternating and reversed signs.
    x.extend((0..32).map(|i| if i % 2 == 0 { 2.0f32 } else { -2.0 }));
    x.extend((0..32).map(|i| if i % 2 == 0 { -2.0f32 } else { 2.0 }));
    x.extend((0..32).map(|i| if i < 31 { 0.25f32 } else { -4.0 }));
    x.extend((0..32).map(|i| if i == 31 || i == 30 { 4.0f32 } else { -1.0 }));
    let blocks = check::<BlockQ4_0>(&x, 32).unwrap();
    let n = blocks.len();
    assert!(blocks[n - 4].d.to_f32() < 0.0 && blocks[n - 3].d.to_f32() > 0.0);
    check::<BlockQ8_0>(&x, 32).unwrap();
}

#[test]
fn values_on_rounding_boundaries() {
    let mut x = Vec::new();
    // Q4_0 with max -8 * 2^e: d = 2^e, id = 2^-e, and x * id + 8.5 hits every integer and
    // half in [0.5, 16.5] exactly, and one ulp either side.
    for e in [-20i32, -3, 0, 5, 12] {
        let s = 2f32.powi(e);
        for start in [0usize, 1] {
            let mut grid: Vec<f32> = (0..33).map(|k| (k as f32 * 0.5 - 8.0) * s).collect();
            grid.rotate_left(start);
            let mut block = vec![-8.0 * s];
            block.extend(grid.iter().take(31));
            x.extend(&block);
            let nudge = |v: f32, up: bool| {
                let bits = v.to_bits();
                match (v == 0.0, up == (v > 0.0)) {
                    (true, _) => v,
                    (false, true) => f32::from_bits(bits + 1),
                    (false, false) => f32::from_bits(bits - 1),
                }
            };
            x.extend(block.iter().enumerate().map(
                |(i, &v)| {
                    if i == 0 { v } else { nudge(v, true) }
                },
            ));
            x.extend(block.iter().enumerate().map(
                |(i, &v)| {
                    if i == 0 { v } else { nudge(v, false) }
                },
            ));
        }
    }
    check::<BlockQ4_0>(&x, 32).unwrap();

    // Q8_0 with amax 127 * 2^e: d = 2^e, and x * id lands on every k + 0.5 (halves away from
    // zero), and one ulp either side (0.49999997 must round to 0).
    let mut y = Vec::new();
    for e in [-18i32, -1, 0, 7] {
        let s = 2f32.powi(e);
        let halves: Vec<f32> = (-127..127).map(|k| (k as f32 + 0.5) * s).collect();
        for chunk in halves.chunks(31) {
            for variant in 0..3 {
                y.push(127.0 * s);
                y.extend(chunk.iter().map(|&v| match variant {
                    0 => v,
                    1 => f32::from_bits(v.to_bits() + 1),
                    _ => f32::from_bits(v.to_bits() - 1),
                }));
                y.resize(y.len().next_multiple_of(32), 0.0);
            }
        }
    }
    check::<BlockQ8_0>(&y, 32).unwrap();
    check::<BlockQ4_0>(&y, 32).unwrap();
}

#[test]
fn subnormal_inputs_and_subnormal_scales() {
    let tiny = f32::from_bits(1); // the smallest subnormal f32
    let mut x = Vec::new();
    // Subnormal f32 inputs beside a normal maximum (accepted).
    x.extend((0..32).map(|i| if i == 5 { 1.0f32 } else { tiny * (i as f32) }));
    x.extend((0..32).map(|i| if i == 0 { -3.0f32 } else { -tiny * (i as f32) }));
    // Scales that f16 holds only as subnormals (accepted).
    x.extend((0..32).map(|i| (i as f32 - 15.5) * 1e-6));
    x.extend((0..32).map(|i| (i as f32 - 15.5) * 3e-7));
    check::<BlockQ4_0>(&x, 32).unwrap();
    check::<BlockQ8_0>(&x, 32).unwrap();
    // Blocks of subnormal f32 only: the scale rounds to 0 (refused, by both).
    let x: Vec<f32> = (0..64).map(|i| tiny * (i % 32) as f32).collect();
    assert!(matches!(
        check::<BlockQ8_0>(&x, 32),
        Err(FormatError::ScaleRoundsToZero(ref b)) if b.block == 0
    ));
    assert!(matches!(
        check::<BlockQ4_0>(&x, 32),
        Err(FormatError::ScaleRoundsToZero(ref b)) if b.block == 0
    ));
}

#[test]
fn scales_below_f32_normals_are_refused_alike() {
    // amax around 1e-38: d is a subnormal f32 and 1 / d overflows to infinity, so x * id is
    // infinite or NaN; every kernel must refuse the block as the reference does.
    for amax in [1e-38f32, 3e-39, 1e-40, 1e-44, 1.2e-38] {
        let mut x = vec![0.25f32; 32];
        x.extend((0..32).map(|i| amax * ((i % 5) as f32 - 2.0) / 2.0));
        x.extend([1.0f32; 32]);
        for result in [
            check::<BlockQ4_0>(&x, 32).map(|_| ()),
            check::<BlockQ8_0>(&x, 32).map(|_| ()),
        ] {
            assert!(
                matches!(&result, Err(FormatError::ScaleRoundsToZero(b)) if b.block == 1),
                "{result:?}"
            );
        }
    }
}

#[test]
fn large_runs_match_including_streamed_and_unaligned_outputs() {
    // 70000 blocks: 8.96 MB of f32 output, past the AVX2 kernel's non-temporal-store threshold.
    let mut rng = Rng(21);
    let n = 70_000 * 32;
    let x: Vec<f32> = (0..n).map(|_| rng.gaussian()).collect();
    let q4 = check::<BlockQ4_0>(&x, 32).unwrap();
    let q8 = check::<BlockQ8_0>(&x, 32).unwrap();
    // Outputs one float off alignment take the plain stores.
    for kernel in Kernel::available() {
        let mut buffer = vec![0f32; n + 1];
        dequantize_into_with(kernel, &q4, &mut buffer[1..]).unwrap();
        let expected: Vec<u32> = q4
            .iter()
            .flat_map(|b| b.dequantize())
            .map(f32::to_bits)
            .collect();
        assert!(buffer[1..].iter().map(|v| v.to_bits()).eq(expected));
        dequantize_into_with(kernel, &q8, &mut buffer[1..]).unwrap();
        let expected: Vec<u32> = q8
            .iter()
            .flat_map(|b| b.dequantize())
            .map(f32::to_bits)
            .collect();
        assert!(buffer[1..].iter().map(|v| v.to_bits()).eq(expected));
    }
}

#[test]
fn magnitudes_sweep_across_both_refusal_thresholds() {
    // Q4_0: |d| = amax / 8 rounds to f16 inf from 65520, to 0 at or below 2^-25.
    // Q8_0: d = amax / 127, the same thresholds. Step through a few thousand ulps around each
    // threshold, one block per amax, a block of accepted values before and after each.
    let mut rng = Rng(3);
    for (format, divisor) in [("Q4_0", 8.0f32), ("Q8_0", 127.0)] {
        for threshold in [65520.0f32, 2f32.powi(-25), 2f32.powi(-24), 65504.0] {
            let centre = (threshold * divisor).to_bits();
            for step in (-3000i64..3000).step_by(37) {
                let amax = f32::from_bits((i64::from(centre) + step) as u32);
                let mut x: Vec<f32> = (0..32).map(|_| rng.gaussian()).collect();
                let mut block: Vec<f32> = (0..32).map(|_| rng.gaussian() * amax * 0.3).collect();
                let lane = rng.below(32);
                block[lane] = if rng.below(2) == 0 { amax } else { -amax };
                block.iter_mut().for_each(|v| *v = v.clamp(-amax, amax));
                x.extend(block);
                x.extend((0..32).map(|_| rng.gaussian()));
                let result = if format == "Q4_0" {
                    check::<BlockQ4_0>(&x, 32).map(|_| ())
                } else {
                    check::<BlockQ8_0>(&x, 32).map(|_| ())
                };
                if let Err(e) = result {
                    assert!(
                        matches!(
                            &e,
                            FormatError::ScaleRoundsToInfinity(b) | FormatError::ScaleRoundsToZero(b)
                                if b.block == 1
                        ),
                        "{e:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn non_finite_values_are_named_where_they_are() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for at in [0usize, 31, 32, 77, 7 * 32 - 1] {
            let mut x: Vec<f32> = (0..7 * 32).map(|i| (i as f32 * 0.1).cos()).collect();
            x[at] = bad;
            let err = check::<BlockQ4_0>(&x, 7 * 32).unwrap_err();
            assert!(
                matches!(err, FormatError::NonFinite { row: 0, col, .. } if col == at),
                "{err:?}"
            );
            let err = check::<BlockQ8_0>(&x, 32).unwrap_err();
            assert!(
                matches!(err, FormatError::NonFinite { row, col, .. } if row * 32 + col == at),
                "{err:?}"
            );
        }
    }
    // A non-finite value is named even after a block whose scale is refused.
    let mut x = vec![1.0f32; 4 * 32];
    x[3] = 1e9;
    x[100] = f32::NAN;
    assert!(matches!(
        check::<BlockQ8_0>(&x, 32),
        Err(FormatError::NonFinite { row: 3, col: 4, .. })
    ));
}

#[test]
fn the_first_refused_block_is_named() {
    let mut x = vec![0.5f32; 6 * 32];
    x[2 * 32..3 * 32].iter_mut().for_each(|v| *v = 1e-12); // block 2: scale rounds to 0
    x[4 * 32 + 9] = 1e8; // block 4: scale rounds to infinity
    assert!(matches!(
        check::<BlockQ4_0>(&x, 64),
        Err(FormatError::ScaleRoundsToZero(ref b)) if b.block == 2 && b.row == 1 && b.start == 0
    ));
    x[2 * 32..3 * 32].iter_mut().for_each(|v| *v = 0.0);
    assert!(matches!(
        check::<BlockQ8_0>(&x, 64),
        Err(FormatError::ScaleRoundsToInfinity(ref b)) if b.block == 4 && b.start == 0
    ));
}

#[test]
fn length_mismatches_are_refused() {
    let x = vec![1.0f32; 96];
    for kernel in Kernel::available() {
        let mut short = vec![BlockQ4_0::quantize(&[0.0; 32]); 2];
        assert_eq!(
            quantize_into_with(kernel, &x, 32, &mut short),
            Err(FormatError::BlockCount {
                format: "Q4_0",
                rows: 3,
                cols: 32,
                found: 2,
                expected: 3
            })
        );
        let mut long = vec![BlockQ8_0::quantize(&[0.0; 32]); 4];
        assert!(matches!(
            quantize_into_with(kernel, &x, 32, &mut long),
            Err(FormatError::BlockCount {
                found: 4,
                expected: 3,
                ..
            })
        ));
        assert_eq!(
            quantize_into_with(kernel, &x, 48, &mut long),
            Err(FormatError::RowLength {
                format: "Q8_0",
                cols: 48
            })
        );
        let blocks = gguf::quantize::<BlockQ8_0>(&x, 32).unwrap();
        for len in [0, 95, 97] {
            let mut out = vec![0f32; len];
            assert!(matches!(
                dequantize_into_with(kernel, &blocks, &mut out),
                Err(FormatError::ShapeMismatch { ref found, ref expected, .. })
                    if found == &[len] && expected == &[96]
            ));
        }
    }
    // The default kernel entry points check the same.
    let mut out = vec![0f32; 10];
    assert!(
        gguf::dequantize_into(&gguf::quantize::<BlockQ4_0>(&x, 32).unwrap(), &mut out).is_err()
    );
}

/// Blocks from arbitrary bytes with a finite scale: every code, every f16 exponent.
#[test]
fn dequantize_arbitrary_blocks() {
    let mut rng = Rng(5);
    let mut q4 = Vec::new();
    let mut q8 = Vec::new();
    for i in 0..4096u32 {
        let mut d = (rng.next_u64() as u16) & 0xFBFF; // exponent never all ones: finite
        if i < 64 {
            d = (i as u16) << 10 | (rng.next_u64() as u16 & 0x83FF);
            d &= 0xFBFF;
        }
        let bytes: Vec<u8> = (0..34).map(|_| rng.next_u64() as u8).collect();
        let mut b4: [u8; 18] = bytes[..18].try_into().unwrap();
        b4[..2].copy_from_slice(&d.to_le_bytes());
        q4.push(BlockQ4_0::read_from(&b4));
        let mut b8: [u8; 34] = bytes[..34].try_into().unwrap();
        b8[..2].copy_from_slice(&d.to_le_bytes());
        q8.push(BlockQ8_0::read_from(&b8));
    }
    for n in [0, 1, 3, 7, 33, 4096] {
        check_dequantize(&q4[..n]);
        check_dequantize(&q8[..n]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Arbitrary f32 bit patterns, scaled blocks of them, and a few blocks: same result and
    /// bytes from every kernel.
    #[test]
    fn arbitrary_values_match_the_reference(
        bits in prop::collection::vec(any::<u32>(), 32..=160),
        exponent in -40i32..40,
        finite_only in any::<bool>(),
    ) {
        let blocks = bits.len() / 32;
        let x: Vec<f32> = bits[..blocks * 32]
            .iter()
            .map(|&b| {
                let v = f32::from_bits(b);
                if finite_only {
                    // A mantissa and sign from the bits, magnitudes within 2^exponent.
                    let m = f32::from_bits((b & 0x807F_FFFF) | 0x3F80_0000);
                    m * 2f32.powi(exponent) * ((b >> 23) % 8) as f32
                } else {
                    v
                }
            })
            .collect();
        check_both(&x, 32);
    }
}

#[test]
fn large_q8_0_quantize_matches_from_every_block_alignment() {
    // 250000 Q8_0 blocks (8.5 MB of output) starting at each of the eight 34-byte offsets
    // modulo 16, a count off every multiple of 8, and one run with a non-finite value late.
    let mut rng = Rng(23);
    let blocks = 250_005;
    let mut x: Vec<f32> = (0..blocks * 32).map(|_| rng.gaussian()).collect();
    let zero = BlockQ8_0::from_parts(f16::ZERO, &[0; 32]);
    let mut expected = vec![zero; blocks];
    quantize_into_with(Kernel::Reference, &x, 32, &mut expected).unwrap();
    for kernel in fast_kernels() {
        let mut buffer = vec![zero; blocks + 8];
        for offset in 0..8 {
            let out = &mut buffer[offset..offset + blocks];
            quantize_into_with(kernel, &x, 32, out).unwrap();
            assert!(
                gguf::to_bytes(out) == gguf::to_bytes(&expected),
                "{kernel:?} offset {offset}"
            );
        }
    }
    x[32 * 249_000 + 7] = f32::INFINITY;
    let mut out = vec![zero; blocks];
    let reference = quantize_into_with(Kernel::Reference, &x, 32, &mut out);
    assert!(reference.is_err());
    for kernel in fast_kernels() {
        let result = quantize_into_with(kernel, &x, 32, &mut out);
        assert_eq!(
            format!("{result:?}"),
            format!("{reference:?}"),
            "{kernel:?}"
        );
    }
}
