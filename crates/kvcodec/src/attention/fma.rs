//! `a * b + c` rounded once (to nearest, ties to even), in integer arithmetic: the portable
//! kernel's multiply-add, which must give the bits of the AVX2 kernel's `vfmadd` on every
//! platform.
//!
//! Why not a library's: `f32::mul_add` calls the C library's `fmaf` where the CPU has no FMA
//! (mingw-w64's on Windows), and `libm::fmaf` evaluates `f64(a) * f64(b) + f64(c)` in doubles,
//! which QEMU 7.2's s390x emulation (the big-endian CI check) gets wrong: for (1.5, 2, 0.25) it
//! returned 0.5. Integers round the same way everywhere.
//!
//! How: a, b and c are read as sign, integer significand (< 2^24) and power of two; the exact
//! product has a significand below 2^48. Both terms are placed in a 100-bit window below the
//! larger one's top bit (a term that falls below the window, at least 2^51 times smaller than
//! the other, keeps only a sticky bit), added as integers, and the sum rounded to 24 bits, or to
//! the subnormal grid. Non-finite inputs, and a zero product or addend, take the plain f32
//! operations (or give c), which are exact or rounded once there.

/// Bits kept below the larger term's top bit.
const WINDOW: i32 = 100;

/// `a * b + c` with one rounding.
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    if !(a.is_finite() && b.is_finite()) {
        // The product is infinite or NaN, as the exact one is.
        return a * b + c;
    }
    if !c.is_finite() {
        // A finite exact product added to an infinity or a NaN (even one whose f32 product
        // would overflow).
        return c;
    }
    if a == 0.0 || b == 0.0 {
        // The product is an exact signed zero; one addition rounds once.
        return a * b + c;
    }
    if c == 0.0 {
        // One rounding of the exact product. Its sign decides a zero result's sign, as in
        // fma(a, b, +-0) for a nonzero exact product.
        return a * b;
    }
    let (sa, ma, ea) = split(a);
    let (sb, mb, eb) = split(b);
    let (sc, mc, ec) = split(c);
    let (sp, mp, ep) = (sa ^ sb, u128::from(ma) * u128::from(mb), ea + eb);
    let mc = u128::from(mc);
    let top = (ep + bit_length(mp)).max(ec + bit_length(mc));
    let scale = top - WINDOW;
    let p = place(mp, ep, scale);
    let q = place(mc, ec, scale);
    let sum = signed(sp, p) + signed(sc, q);
    if sum == 0 {
        // An exact zero sum of opposite terms is +0 when rounding to nearest.
        return 0.0;
    }
    round(sum < 0, sum.unsigned_abs(), scale)
}

/// Sign, significand and exponent: x = (-1)^sign * m * 2^e, m < 2^24, e >= -149.
fn split(x: f32) -> (bool, u32, i32) {
    let bits = x.to_bits();
    let sign = bits >> 31 == 1;
    let biased = ((bits >> 23) & 0xFF) as i32;
    let fraction = bits & 0x7F_FFFF;
    if biased == 0 {
        (sign, fraction, -149)
    } else {
        (sign, fraction | 0x80_0000, biased - 150)
    }
}

fn bit_length(m: u128) -> i32 {
    128 - m.leading_zeros() as i32
}

/// m * 2^e on the grid 2^scale: shifted left exactly, or right with the lost bits kept as a
/// sticky lowest bit.
fn place(m: u128, e: i32, scale: i32) -> u128 {
    let shift = e - scale;
    if shift >= 0 {
        m << shift
    } else if -shift >= 128 {
        u128::from(m != 0)
    } else {
        let kept = m >> -shift;
        let lost = m & ((1u128 << -shift) - 1);
        kept | u128::from(lost != 0)
    }
}

fn signed(negative: bool, m: u128) -> i128 {
    // Below 2^(WINDOW + 1): both fit an i128.
    if negative { -(m as i128) } else { m as i128 }
}

/// (-1)^negative * m * 2^scale rounded to the nearest f32, ties to even.
fn round(negative: bool, m: u128, scale: i32) -> f32 {
    let top_bit = bit_length(m) - 1;
    // Keep 24 significant bits, or fewer where the result is subnormal (its last bit 2^-149).
    let drop = (top_bit - 23).max(-149 - scale);
    let (mut kept, mut exponent) = if drop <= 0 {
        (m << -drop, scale + drop)
    } else if drop >= 128 {
        (0, scale + drop)
    } else {
        let kept = m >> drop;
        let rest = m & ((1u128 << drop) - 1);
        let half = 1u128 << (drop - 1);
        let up = rest > half || (rest == half && kept & 1 == 1);
        (kept + u128::from(up), scale + drop)
    };
    if kept == 1 << 24 {
        kept >>= 1;
        exponent += 1;
    }
    let sign = if negative { 1u32 << 31 } else { 0 };
    if kept == 0 {
        return f32::from_bits(sign);
    }
    let bits = if kept >= 1 << 23 {
        let biased = exponent + 150;
        if biased >= 255 {
            return f32::from_bits(sign | 0x7F80_0000);
        }
        ((biased as u32) << 23) | (kept as u32 & 0x7F_FFFF)
    } else {
        // Subnormal: the exponent is -149 here, by the choice of `drop`.
        kept as u32
    };
    f32::from_bits(sign | bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// glibc's `fmaf` (hardware FMA where the CPU has it) through `f32::mul_add`, on x86_64
    /// Linux only: elsewhere no oracle is trusted (see the module comment), and the comparison
    /// is skipped.
    fn oracle(a: f32, b: f32, c: f32) -> Option<f32> {
        (cfg!(target_arch = "x86_64") && cfg!(target_os = "linux")).then(|| a.mul_add(b, c))
    }

    fn same(x: f32, y: f32) -> bool {
        x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
    }

    #[test]
    fn worked_examples_are_rounded_once() {
        assert_eq!(fma(1.5, 2.0, 0.25), 3.25);
        // 3 * 0.1f32 - 0.3f32 is -2^-27 exactly; unfused it is 0.
        assert_eq!(fma(3.0, 0.1, -0.3), -(2f32.powi(-27)));
        assert_eq!(3.0f32 * 0.1 - 0.3, 0.0);
        // (1 + 2^-12)^2 - 1 = 2^-11 + 2^-24: the 2^-24 survives only when fused.
        let x = 1.0 + f32::EPSILON * 2048.0;
        assert_eq!(fma(x, x, -1.0), 2f32.powi(-11) + 2f32.powi(-24));
        assert_eq!(fma(-2.5, 4.0, 1.0), -9.0);
        assert_eq!(fma(f32::MAX, 2.0, -f32::MAX), f32::MAX);
        assert_eq!(fma(f32::MIN_POSITIVE, 0.5, 0.0), f32::MIN_POSITIVE / 2.0);
        assert!(fma(f32::INFINITY, 1.0, 1.0).is_infinite());
        assert!(fma(f32::INFINITY, 0.0, 1.0).is_nan());
        // The f32 product would overflow; the exact one does not.
        assert_eq!(fma(f32::MAX, 2.0, f32::NEG_INFINITY), f32::NEG_INFINITY);
    }

    #[test]
    fn random_and_edge_operands_match_the_hardware() {
        if oracle(1.0, 1.0, 1.0).is_none() {
            return; // no trusted fused multiply-add to compare with here
        }
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let specials = [
            0.0f32,
            -0.0,
            1.0,
            -1.0,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::from_bits(0x80_0001),
            f32::MAX,
            f32::EPSILON,
            0.1,
            3.0,
            0.3,
        ];
        for round in 0..2_000_000u32 {
            let r = next();
            let pick = |k: u32, bits: u32| match (r >> (60 - k)) & 7 {
                0 => specials[(bits % specials.len() as u32) as usize],
                // Near 1: products and sums that cancel and tie.
                1 => f32::from_bits(0x3F80_0000 ^ (bits & 0xFFF)),
                _ => f32::from_bits(bits),
            };
            let (a, b, c) = (
                pick(0, r as u32),
                pick(3, (r >> 16) as u32 ^ round),
                pick(6, (r >> 32) as u32),
            );
            let want = oracle(a, b, c).expect("the oracle is there");
            let got = fma(a, b, c);
            assert!(
                same(got, want),
                "fma({a:e}, {b:e}, {c:e}) = {got:e}, want {want:e}"
            );
        }
    }
}
