//! NumPy's 256-layer ziggurat for the standard normal distribution.
//!
//! Follows `random_standard_normal` in
//! `numpy/random/src/distributions/distributions.c` (the `Generator` version,
//! not the legacy `RandomState` polar method), with the tables of
//! `numpy/random/src/distributions/ziggurat_constants.h` (see [`crate::tables`]).
//!
//! One 64-bit draw is split as: bits 0..8 pick the layer `idx`, bit 8 is the
//! sign, bits 9..61 are a 52-bit magnitude `rabs`; `x = ±rabs * wi[idx]`. The
//! draw is accepted at once when `rabs < ki[idx]` (about 99.3% of the time).
//! Otherwise layer 0 samples the tail beyond `r` with Marsaglia's exponential
//! method (two uniforms per try, sign taken from bit 8 of `rabs`), and the other
//! layers accept the wedge point when a uniform height falls under the density,
//! else the whole draw starts over.
//!
//! The rejection paths call `log1p` (tail) and `exp` (wedge), which NumPy takes from the C
//! library. Neither comes from the platform here, so the draws are the same on every OS and CPU:
//! `log1p` is [`crate::log1p`], glibc's arithmetic operation for operation (its value flows into
//! the returned tail draw; platform libms differ from glibc on 0.1 % to 7 % of tail arguments),
//! and `exp` is the pure-Rust `libm` crate's. Its value is only compared with a uniform height,
//! so where it and glibc's differ in the last bit (rarely), a draw changes only if the height
//! falls in that one-ulp gap; the 1,000,000-draw fixture hashes show no such case.
use crate::log1p::log1p;
use crate::tables;

const fn from_bits_256(bits: &[u64; 256]) -> [f64; 256] {
    let mut out = [0.0; 256];
    let mut i = 0;
    while i < 256 {
        out[i] = f64::from_bits(bits[i]);
        i += 1;
    }
    out
}

/// NumPy's `ki_double`.
pub const KI_DOUBLE: [u64; 256] = tables::KI_DOUBLE;
/// NumPy's `wi_double`.
pub const WI_DOUBLE: [f64; 256] = from_bits_256(&tables::WI_DOUBLE_BITS);
/// NumPy's `fi_double`.
pub const FI_DOUBLE: [f64; 256] = from_bits_256(&tables::FI_DOUBLE_BITS);
/// NumPy's `ziggurat_nor_r`, about 3.6541528853610088.
pub const ZIGGURAT_NOR_R: f64 = f64::from_bits(tables::ZIGGURAT_NOR_R_BITS);
/// NumPy's `ziggurat_nor_inv_r`, about 0.27366123732975828.
pub const ZIGGURAT_NOR_INV_R: f64 = f64::from_bits(tables::ZIGGURAT_NOR_INV_R_BITS);

/// `random_standard_normal`: one standard normal from a source of 64-bit
/// outputs and of doubles in [0, 1) (NumPy's `next_uint64` / `next_double`,
/// which must come from the same stream for NumPy's sequence).
pub fn standard_normal<R: ZigguratSource + ?Sized>(rng: &mut R) -> f64 {
    loop {
        let r = rng.next_u64();
        let idx = (r & 0xff) as usize;
        let r = r >> 8;
        let sign = r & 0x1;
        let rabs = (r >> 1) & 0x000f_ffff_ffff_ffff;
        // rabs < 2^52, so the conversion is exact.
        let mut x = rabs as f64 * WI_DOUBLE[idx];
        if sign & 0x1 != 0 {
            x = -x;
        }
        if rabs < KI_DOUBLE[idx] {
            return x;
        }
        if idx == 0 {
            // Tail: 1 - U rather than U keeps log away from 0 (NumPy GH 13361),
            // written as log1p(-U).
            loop {
                let xx = -ZIGGURAT_NOR_INV_R * log1p(-rng.next_double());
                let yy = -log1p(-rng.next_double());
                if yy + yy > xx * xx {
                    return if (rabs >> 8) & 0x1 != 0 {
                        -(ZIGGURAT_NOR_R + xx)
                    } else {
                        ZIGGURAT_NOR_R + xx
                    };
                }
            }
        } else if (FI_DOUBLE[idx - 1] - FI_DOUBLE[idx]) * rng.next_double() + FI_DOUBLE[idx]
            < libm::exp(-0.5 * x * x)
        {
            return x;
        }
    }
}

/// What the ziggurat draws from: NumPy's `bitgen_t` `next_uint64` and
/// `next_double`.
pub trait ZigguratSource {
    /// A uniformly random 64-bit word.
    fn next_u64(&mut self) -> u64;
    /// A uniformly random double in [0, 1), made from one `next_u64`.
    fn next_double(&mut self) -> f64;
}

impl ZigguratSource for crate::pcg64::Pcg64 {
    #[inline]
    fn next_u64(&mut self) -> u64 {
        crate::pcg64::Pcg64::next_u64(self)
    }

    #[inline]
    fn next_double(&mut self) -> f64 {
        crate::pcg64::Pcg64::next_double(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replays a fixed list of 64-bit words, to steer the ziggurat into each
    /// branch.
    struct Replay(std::vec::IntoIter<u64>);

    impl ZigguratSource for Replay {
        fn next_u64(&mut self) -> u64 {
            self.0.next().expect("replay ran out of words")
        }
        fn next_double(&mut self) -> f64 {
            (self.next_u64() >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
        }
    }

    fn word(idx: u64, sign: u64, rabs: u64) -> u64 {
        idx | (sign << 8) | (rabs << 9)
    }

    #[test]
    fn fast_path_is_rabs_times_wi() {
        let mut src = Replay(vec![word(5, 0, 1000), word(5, 1, 1000)].into_iter());
        assert_eq!(standard_normal(&mut src), 1000.0 * WI_DOUBLE[5]);
        assert_eq!(standard_normal(&mut src), -1000.0 * WI_DOUBLE[5]);
    }

    #[test]
    fn tail_takes_sign_from_bit_8_of_rabs() {
        // Layer 0 with rabs at its maximum always misses ki[0]. Uniforms of 0
        // give xx = 0 and yy = 0, which fails `yy + yy > xx * xx`; a second
        // pair (u1 = 0, u2 = 1/2) succeeds with xx = 0.
        let half = 1u64 << 63;
        for (rabs, expect) in [
            (0x000f_ffff_ffff_fe00_u64, ZIGGURAT_NOR_R), // bit 8 clear
            (0x000f_ffff_ffff_ffff_u64, -ZIGGURAT_NOR_R), // bit 8 set
        ] {
            let mut src = Replay(vec![word(0, 0, rabs), 0, 0, 0, half].into_iter());
            assert!(rabs >= KI_DOUBLE[0]);
            assert_eq!(standard_normal(&mut src), expect);
        }
    }

    #[test]
    fn wedge_rejection_restarts_the_draw() {
        // Layer 1 (the narrowest, x up to about 0.215) has ki = 0, so every
        // draw goes to the wedge test. Near the layer's edge, a uniform just
        // below 1 puts the height near fi[0] = 1, above exp(-x^2/2), so the
        // draw is rejected and the next word starts over.
        let edge = 0x000f_ffff_ffff_ffff_u64;
        let almost_one = u64::MAX;
        let mut src = Replay(vec![word(1, 0, edge), almost_one, word(7, 0, 999)].into_iter());
        assert_eq!(standard_normal(&mut src), 999.0 * WI_DOUBLE[7]);
        // A zero uniform puts the height at fi[1], the density at the layer's
        // edge, which is under the density at any x inside it.
        let mid = 1u64 << 51;
        let mut src = Replay(vec![word(1, 1, mid), 0].into_iter());
        assert_eq!(standard_normal(&mut src), -(mid as f64) * WI_DOUBLE[1]);
    }
}
