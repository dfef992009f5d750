//! The exponential every attention kernel uses, written out so that the portable and AVX2
//! kernels (and any platform) round the same way: a platform's `expf` differs between libms.
//!
//! For x <= 0 (softmax only ever exponentiates a score minus a running maximum):
//! - x < [`FLUSH_BELOW`] (and -inf) gives 0: e^-87 is 1.6e-38 of the block's largest weight,
//!   which is 1, so nothing a sum of such weights holds is lost;
//! - otherwise n = floor(x * log2(e) + 0.5), r = (x - n * C1) - n * C2 (Cody and Waite's split
//!   of ln 2, C1 + C2 = ln 2 to beyond f32), and e^x = P(r) * 2^n with Cephes' `expf` polynomial
//!   P(r) = ((((((p0 r + p1) r + p2) r + p3) r + p4) r + p5) r^2 + r) + 1, every product and sum
//!   rounded to f32 on its own (no fused multiply-add), and 2^n built from its exponent bits
//!   (n is at least -126, so it is a normal f32).
//!
//! Accuracy: within 2e-7 relative of e^x on [-87, 0] (a test sweeps it against f64 `exp`).
//! Cephes: `cephes/single/expf.c` (Moshier), the constants below.

/// Below this, [`exp`] gives 0.
pub const FLUSH_BELOW: f32 = -87.0;

pub(crate) const LOG2E: f32 = std::f32::consts::LOG2_E;
pub(crate) const C1: f32 = 0.693_359_4;
pub(crate) const C2: f32 = -2.121_944_4e-4;
pub(crate) const P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

/// e^x for x <= 0, as the module comment defines it.
#[inline]
pub fn exp(x: f32) -> f32 {
    // NaN goes to 0 too; the kernels never pass one.
    if x.is_nan() || x < FLUSH_BELOW {
        return 0.0;
    }
    let n = floor(x * LOG2E + 0.5);
    let r = (x - n * C1) - n * C2;
    let r2 = r * r;
    let mut y = P[0];
    for &p in &P[1..] {
        y = y * r + p;
    }
    let y = (y * r2 + r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `y.floor()` for |y| < 2^31 without a libm call (which `f32::floor` is on x86_64 without
/// SSE4.1): truncation, one down for a negative non-integer.
#[inline]
fn floor(y: f32) -> f32 {
    let t = y as i32 as f32;
    if t > y { t - 1.0 } else { t }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_is_within_two_tenths_of_a_millionth_of_exp_on_its_range() {
        let mut worst = 0f64;
        let mut x = 0f32;
        while x >= FLUSH_BELOW {
            let exact = f64::from(x).exp();
            let relative = (f64::from(exp(x)) - exact).abs() / exact;
            worst = worst.max(relative);
            x -= 1.0 / 1024.0 + x.abs() * 1e-4;
        }
        assert!(worst < 2e-7, "worst relative error {worst}");
    }

    #[test]
    fn floor_is_the_floor_on_the_range_it_sees() {
        for y in [
            -126.0f32, -125.5, -1.0, -0.75, -0.0, 0.0, 0.25, 0.5, -3.0e-8,
        ] {
            assert_eq!(floor(y), y.floor(), "{y}");
        }
    }

    #[test]
    fn zero_is_one_and_the_far_tail_is_zero() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert_eq!(exp(-87.5), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(FLUSH_BELOW) > 0.0);
    }
}
