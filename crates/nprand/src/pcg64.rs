//! NumPy's `PCG64` bit generator, built on `rand_pcg::Lcg128Xsl64`.
//!
//! Follows `numpy/random/_pcg64.pyx` and `numpy/random/src/pcg64/pcg64.{h,c}`
//! (`pcg64_set_seed`, `pcg64_srandom_r`, `pcg64_next64`, `pcg64_next32`) and
//! `numpy/random/_common.pxd` (`uint64_to_double`).
//!
//! PCG64 is a 128-bit LCG (multiplier 0x2360ed051fc65da44385df649fccf645) with
//! the XSL-RR output function. NumPy seeds it from the four
//! `generate_state(4, uint64)` words as `initstate = w[0] << 64 | w[1]`,
//! `initseq = w[2] << 64 | w[3]`, then `inc = initseq << 1 | 1`, `state = 0`,
//! step, `state += initstate`, step. Because a step from zero lands on `inc`,
//! that is the same as `state = initstate + inc` followed by one step, which is
//! exactly what `Lcg128Xsl64::new(initstate, initseq)` does; both step the LCG
//! before producing each output. The test `rand_pcg_matches_numpy_raw_outputs`
//! checks this against NumPy's `random_raw`.

use rand_pcg::Lcg128Xsl64;

/// The PCG64 state that `numpy.random.PCG64` builds from its four seed words.
pub fn pcg64_from_seed_words(words: [u64; 4]) -> Lcg128Xsl64 {
    let initstate = (u128::from(words[0]) << 64) | u128::from(words[1]);
    let initseq = (u128::from(words[2]) << 64) | u128::from(words[3]);
    Lcg128Xsl64::new(initstate, initseq)
}

/// NumPy's `PCG64` bit generator: 64-bit outputs straight from the LCG, and
/// 32-bit outputs that split one 64-bit output in two (low half first, the high
/// half kept for the next call), as `pcg64_next32` does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pcg64 {
    lcg: Lcg128Xsl64,
    /// High half of the last output split by `next_u32`, if not yet used.
    buffered_u32: Option<u32>,
}

impl Pcg64 {
    /// Seeds from `SeedSequence(..).generate_state(4, np.uint64)`.
    pub fn from_seed_words(words: [u64; 4]) -> Self {
        Self::from_lcg(pcg64_from_seed_words(words))
    }

    /// Wraps an already seeded LCG (with no buffered 32-bit half).
    pub fn from_lcg(lcg: Lcg128Xsl64) -> Self {
        Self {
            lcg,
            buffered_u32: None,
        }
    }

    /// The underlying `rand_pcg` generator.
    pub fn lcg(&self) -> &Lcg128Xsl64 {
        &self.lcg
    }

    /// `pcg64_next64`: one LCG step, then the XSL-RR output.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        rand_core::Rng::next_u64(&mut self.lcg)
    }

    /// `pcg64_next32`. Independent of `next_u64`, which neither uses nor clears
    /// the buffered half (as in NumPy).
    #[inline]
    pub fn next_u32(&mut self) -> u32 {
        if let Some(high) = self.buffered_u32.take() {
            return high;
        }
        let next = self.next_u64();
        self.buffered_u32 = Some((next >> 32) as u32);
        next as u32
    }

    /// `next_double`: the top 53 bits of a 64-bit output scaled by 2^-53, a
    /// value in [0, 1).
    #[inline]
    pub fn next_double(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
    }

    /// `PCG64.advance(delta)`: jumps as if `delta` 64-bit outputs had been
    /// drawn. Like NumPy, it drops a buffered 32-bit half.
    pub fn advance(&mut self, delta: u128) {
        self.lcg.advance(delta);
        self.buffered_u32 = None;
    }
}
