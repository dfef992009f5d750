//! `log1p` as NumPy's tail draws see it on Linux: the algorithm of Sun's fdlibm `s_log1p.c` as
//! glibc (2.35 and later) runs it on an x86_64 CPU with FMA, written here so that the draws do
//! not depend on the platform's C library.
//!
//! Why not `f64::ln_1p`: it calls the platform libm, and libms disagree in the last bit, and each
//! disagreement in the tail changes a normal draw. Measured on this project's machines:
//! mingw-w64's `log1p` (what `ln_1p` calls on Windows, GNU) differs from glibc's on 7.2 % of
//! 2,000,000 tail arguments; the pure-Rust `libm` crate (musl's evaluation order) on about
//! 0.1 %. The fixture hashes are NumPy's on Linux with glibc 2.36 on a CPU with FMA, where
//! glibc's x86_64 build picks a copy of `s_log1p.c` compiled with FMA (`sysdeps/x86_64/fpu/
//! multiarch`), in which the compiler fused the polynomial's multiply-adds. That is what this is,
//! operation for operation: the same code without those fusions differs from it on 186 of
//! 399,997 tail arguments, so NumPy itself draws differently on an x86_64 CPU without FMA.
//!
//! The method (fdlibm's comments): write 1 + x = 2^k (1 + f) with sqrt(2)/2 < 1 + f < sqrt(2);
//! when k != 0, u = 1 + x is rounded, and c = ((1 + x) - u) / u corrects for it. With
//! s = f / (2 + f), z = s^2, hfsq = f^2 / 2 and R(z) the degree-7 polynomial of
//! `polynomial`, log(1 + f) = f - (hfsq - s (hfsq + R)), and log1p(x) = k ln2_hi - ((hfsq -
//! (s (hfsq + R) + (k ln2_lo + c))) - f). |f| < 2^-20 uses R = hfsq (1 - 2f/3) instead, and
//! |x| < 2^-29 returns x - x^2/2 (x itself below 2^-54).

/// ln 2, high part (its last 32 bits zero, so k ln2_hi is exact).
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
/// ln 2 - LN2_HI.
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
/// The polynomial's coefficients, Lp1..Lp7 (fdlibm's hexadecimal values).
const LP: [f64; 7] = [
    f64::from_bits(0x3fe5_5555_5555_5593),
    f64::from_bits(0x3fd9_9999_9997_fa04),
    f64::from_bits(0x3fd2_4924_9422_9359),
    f64::from_bits(0x3fcc_71c5_1d8e_78af),
    f64::from_bits(0x3fc7_4664_96cb_03de),
    f64::from_bits(0x3fc3_9a09_d078_c69f),
    f64::from_bits(0x3fc2_f112_df3e_5244),
];

/// The high 32 bits of `x`'s representation.
fn high_word(x: f64) -> u32 {
    (x.to_bits() >> 32) as u32
}

/// `x` with its high 32 bits replaced by `high`.
fn with_high_word(x: f64, high: u32) -> f64 {
    f64::from_bits((u64::from(high) << 32) | (x.to_bits() & 0xffff_ffff))
}

/// ln(1 + x), bit for bit glibc's `log1p` (see the module docs). NaN below -1, -inf at -1.
pub fn log1p(x: f64) -> f64 {
    let hx = high_word(x);
    let ax = hx & 0x7fff_ffff;
    let negative = hx >> 31 != 0;

    // k = 0: 1 + x lies in [sqrt(2)/2, sqrt(2)) already, and f = x is exact.
    let mut k_is_zero = false;
    if negative || hx < 0x3fda_827a {
        // x < 0.41422
        if ax >= 0x3ff0_0000 {
            // x <= -1
            return if x == -1.0 {
                f64::NEG_INFINITY
            } else {
                f64::NAN
            };
        }
        if ax < 0x3e20_0000 {
            // |x| < 2^-29
            return if ax < 0x3c90_0000 { x } else { x - x * x * 0.5 };
        }
        // -0.2929 < x < 0.41422 (for a negative x, a high word at most 0xbfd2bec3)
        if !negative || hx <= 0xbfd2_bec3 {
            k_is_zero = true;
        }
    }
    if !negative && hx >= 0x7ff0_0000 {
        return x + x; // +inf or NaN
    }

    let (k, f, c, hu) = if k_is_zero {
        (0i32, x, 0.0, 1u32)
    } else {
        let (u, mut k, c) = if negative || hx < 0x4340_0000 {
            let u = 1.0 + x;
            let k = (high_word(u) >> 20) as i32 - 1023;
            let c = if k > 0 { 1.0 - (u - x) } else { x - (u - 1.0) };
            (u, k, c / u)
        } else {
            (x, (hx >> 20) as i32 - 1023, 0.0)
        };
        let mut hu = high_word(u) & 0x000f_ffff;
        let u = if hu < 0x6_a09e {
            with_high_word(u, hu | 0x3ff0_0000) // u in [1, sqrt(2))
        } else {
            k += 1;
            let half = with_high_word(u, hu | 0x3fe0_0000); // u / 2 in [sqrt(2)/2, 1)
            hu = (0x0010_0000 - hu) >> 2;
            half
        };
        (k, u - 1.0, c, hu)
    };

    let dk = f64::from(k);
    let hfsq = 0.5 * f * f;
    if hu == 0 {
        // |f| < 2^-20
        if f == 0.0 {
            return if k == 0 {
                0.0
            } else {
                dk * LN2_HI + (c + dk * LN2_LO)
            };
        }
        let r = hfsq * (1.0 - 0.666_666_666_666_666_6 * f);
        return if k == 0 {
            f - r
        } else {
            dk * LN2_HI - ((r - (dk * LN2_LO + c)) - f)
        };
    }
    let s = f / (2.0 + f);
    let z = s * s;
    let r = polynomial(z);
    if k == 0 {
        f - (hfsq - s * (hfsq + r))
    } else {
        dk * LN2_HI - ((hfsq - (s * (hfsq + r) + (dk * LN2_LO + c))) - f)
    }
}

/// R(z) = z Lp1 + z^2 (Lp2 + z Lp3) + z^4 (Lp4 + z Lp5) + z^6 (Lp6 + z Lp7), summed left to
/// right (glibc's grouping), with each multiply-add fused as glibc's FMA build fuses it: the
/// pairs, then z Lp1 onto z^2 (Lp2 + z Lp3), then the z^4 and z^6 terms.
fn polynomial(z: f64) -> f64 {
    let z2 = z * z;
    let z4 = z2 * z2;
    let z6 = z4 * z2;
    let r2 = fma(z, LP[2], LP[1]);
    let r3 = fma(z, LP[4], LP[3]);
    let r4 = fma(z, LP[6], LP[5]);
    fma(z6, r4, fma(z4, r3, fma(z, LP[0], z2 * r2)))
}

/// A multiply-add rounded once, in pure Rust: `f64::mul_add` calls the platform's `fma`, which
/// is itself a libm function (mingw-w64's, on Windows).
fn fma(a: f64, b: f64, c: f64) -> f64 {
    libm::fma(a, b, c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Arguments where the libm crate (musl's evaluation) differs from glibc's by one ulp;
    /// the expected bits are glibc 2.36's, also what Python's `math.log1p` prints.
    #[test]
    fn where_other_libms_round_differently_this_is_glibc() {
        let cases: [(u64, u64); 6] = [
            (0x3fd2_a118_77d8_eadc, 0xbfd6_045c_2720_356c),
            (0x3fc8_450e_0222_19a0, 0xbfca_e907_0ce6_9d6c),
            (0x3fea_157e_6536_7cd8, 0xbffb_0254_3284_80fe),
            (0x3fd2_35e4_5f7b_12cc, 0xbfd5_6dd5_09e1_0125),
            (0x3fd1_ab6f_66cb_376e, 0xbfd4_ad71_def6_1eaf),
            (0x3fc8_ad6a_a458_fad8, 0xbfcb_6a0f_855b_a99b),
        ];
        for (u, expect) in cases {
            assert_eq!(
                log1p(-f64::from_bits(u)).to_bits(),
                expect,
                "log1p(-{u:#x})"
            );
        }
        // Where mingw-w64's log1p (Windows) differs from glibc's.
        let mingw: [(f64, u64); 3] = [
            (
                -f64::from_bits(0x3fd7_ea7b_0389_3528),
                0xbfdd_f224_f91a_9dd6,
            ),
            (
                -f64::from_bits(0x3fe7_b5c2_e070_852a),
                0xbff5_9c69_76ff_d0a0,
            ),
            (
                -f64::from_bits(0x3fef_37fe_7425_3f62),
                0xc00d_b355_b006_dbfa,
            ),
        ];
        for (x, expect) in mingw {
            assert_eq!(log1p(x).to_bits(), expect, "log1p({x})");
        }
    }

    #[test]
    fn special_values() {
        assert_eq!(log1p(-1.0), f64::NEG_INFINITY);
        assert!(log1p(-1.5).is_nan());
        assert!(log1p(f64::NEG_INFINITY).is_nan());
        assert!(log1p(f64::NAN).is_nan());
        assert_eq!(log1p(f64::INFINITY), f64::INFINITY);
        assert_eq!(log1p(0.0).to_bits(), 0.0f64.to_bits());
        assert_eq!(log1p(-0.0).to_bits(), (-0.0f64).to_bits());
        assert_eq!(log1p(1e-300), 1e-300);
        assert_eq!(log1p(f64::MAX), f64::MAX.ln());
        assert_eq!(log1p(1.0), std::f64::consts::LN_2);
    }

    /// On Linux with glibc, the platform's `log1p` is the reference itself: every argument
    /// class (both signs, each branch: tiny, |f| < 2^-20, k = 0, k != 0, beyond 2^53) agrees.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn agrees_with_glibc_bit_for_bit() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let check = |x: f64| {
            assert_eq!(
                log1p(x).to_bits(),
                x.ln_1p().to_bits(),
                "log1p({x:e} = {:#x})",
                x.to_bits()
            );
        };
        for _ in 0..300_000 {
            let bits = next();
            // Uniform in (-1, 0]: the ziggurat's tail.
            check(-((bits >> 11) as f64 / (1u64 << 53) as f64));
            // Any finite double above -1 (random exponents).
            let x = f64::from_bits(bits & !(1 << 63));
            if x.is_finite() {
                check(x);
                check(-x.min(1.0));
            }
            // Near the branch points.
            for centre in [0.414_213_562_373_095, -0.292_893_218_813_452, 0.0, 1.0] {
                check(centre + ((bits >> 12) as f64 / (1u64 << 52) as f64 - 0.5) * 1e-6);
            }
        }
    }
}
