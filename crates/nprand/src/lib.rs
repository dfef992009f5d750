//! NumPy-identical random draws: `numpy.random.default_rng(entropy)` and its
//! normal draws, reproduced bit for bit.
//!
//! The pipeline is NumPy's: [`SeedSequence`] (`numpy/random/bit_generator.pyx`)
//! turns the entropy into four 64-bit words, which seed [`Pcg64`]
//! (`numpy/random/src/pcg64/`, on top of `rand_pcg::Lcg128Xsl64`), which feeds
//! the 256-layer ziggurat of [`ziggurat`]
//! (`numpy/random/src/distributions/distributions.c`). Arrays are filled in C
//! (row-major) order, as `rng.normal(size=shape)` does.
//!
//! ```
//! use nprand::NumpyRng;
//!
//! // numpy.random.default_rng(70128).normal(size=(4, 32)).astype(np.float32)
//! let mut rng = NumpyRng::default_rng(70128);
//! let q = rng.normal_array_f32((4, 32));
//! assert_eq!(q.shape(), &[4, 32]);
//! ```
//!
//! The checked-in test vectors (`tests/data/numpy-default-rng.json`) were made
//! with NumPy 2.4.6 on Linux/glibc (x86_64 with FMA). No draw depends on the platform's C
//! library ([`ziggurat`], [`log1p`]), so they are the same on Windows, ARM and big-endian CPUs.

#![warn(missing_docs)]

pub mod entropy;
pub mod log1p;
pub mod pcg64;
pub mod seed_sequence;
pub mod tables;
pub mod ziggurat;

pub use entropy::{EntropyError, entropy_from_json, parse_entropy, parse_entropy_words};
pub use pcg64::{Pcg64, pcg64_from_seed_words};
pub use rand_pcg::Lcg128Xsl64;
pub use seed_sequence::{POOL_SIZE, SeedSequence, entropy_words, seed_words};

use ndarray::{Array, IntoDimension};
use rand_core::{Infallible, SeedableRng, TryRng};

/// `numpy.random.Generator(PCG64(SeedSequence(entropy)))`, i.e. what
/// `numpy.random.default_rng(entropy)` returns, for the draws this crate
/// supports.
///
/// It also implements `rand_core`'s [`TryRng`] (hence [`rand_core::Rng`]) and
/// [`SeedableRng`], so the `rand` ecosystem can draw from the same stream:
/// `next_u64` is PCG64's output, `next_u32` splits one output in two (low half
/// first) like NumPy's `next_uint32`, and `fill_bytes` writes `next_u32` words
/// little-endian, which is what `Generator.bytes(n)` returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumpyRng {
    bits: Pcg64,
}

impl NumpyRng {
    /// `numpy.random.default_rng(entropy)` for an integer entropy.
    pub fn default_rng(entropy: u128) -> Self {
        Self::from_seed_words(seed_words(entropy))
    }

    /// `default_rng` for an entropy given as NumPy's 32-bit words (least
    /// significant first), e.g. from [`parse_entropy_words`] for seeds of
    /// 2^128 and above.
    pub fn from_entropy_words(words: &[u32]) -> Self {
        Self::from_seed_sequence(&SeedSequence::from_words(words))
    }

    /// `default_rng(seed_sequence)`.
    pub fn from_seed_sequence(seq: &SeedSequence) -> Self {
        Self::from_seed_words(seq.pcg64_seed_words())
    }

    /// A generator on PCG64 seeded from `generate_state(4, np.uint64)` words.
    pub fn from_seed_words(words: [u64; 4]) -> Self {
        Self::from_bit_generator(Pcg64::from_seed_words(words))
    }

    /// A generator on an existing PCG64 (NumPy's `Generator(bit_generator)`).
    pub fn from_bit_generator(bits: Pcg64) -> Self {
        Self { bits }
    }

    /// The underlying bit generator.
    pub fn bit_generator(&self) -> &Pcg64 {
        &self.bits
    }

    /// Mutable access to the underlying bit generator (e.g. to `advance`).
    pub fn bit_generator_mut(&mut self) -> &mut Pcg64 {
        &mut self.bits
    }

    /// One raw 64-bit output (`bit_generator.random_raw()`).
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.bits.next_u64()
    }

    /// One 32-bit output as NumPy's `next_uint32` gives it.
    #[inline]
    pub fn next_u32(&mut self) -> u32 {
        self.bits.next_u32()
    }

    /// A double in [0, 1) from the top 53 bits of one output
    /// (`Generator.random()`).
    #[inline]
    pub fn next_double(&mut self) -> f64 {
        self.bits.next_double()
    }

    /// `Generator.integers(0, high)` (int64, `endpoint=False`): uniform on `0..high`, drawn as
    /// NumPy's `random_bounded_uint64_fill` does for a range that fits 32 bits: Lemire's
    /// multiply-shift on one `next_uint32`, rejecting a draw whose low word falls below
    /// `(2^32 - high) % high` (`numpy/random/src/distributions/distributions.c`,
    /// `buffered_bounded_lemire_uint32`). `high == 1` consumes nothing, as in NumPy. Successive
    /// calls give `integers(0, high, size=n)` in order.
    ///
    /// # Panics
    /// If `high` is 0 (NumPy raises `ValueError: high <= 0`).
    pub fn integers(&mut self, high: u32) -> u32 {
        assert!(high > 0, "integers(0, high) needs high >= 1");
        if high == 1 {
            return 0;
        }
        let draw = |bits: &mut Pcg64| u64::from(bits.next_u32()) * u64::from(high);
        let mut m = draw(&mut self.bits);
        if (m as u32) < high {
            // (UINT32_MAX - rng) % rng_excl with rng = high - 1.
            let threshold = (u32::MAX - (high - 1)) % high;
            while (m as u32) < threshold {
                m = draw(&mut self.bits);
            }
        }
        (m >> 32) as u32
    }

    /// `Generator.standard_normal()`: one ziggurat draw.
    #[inline]
    pub fn standard_normal(&mut self) -> f64 {
        ziggurat::standard_normal(&mut self.bits)
    }

    /// `Generator.normal(loc, scale)`, computed as NumPy's `random_normal`
    /// does: `loc + scale * z`. With `loc = 0.0, scale = 1.0` this equals
    /// [`Self::standard_normal`] except that a `-0.0` draw becomes `+0.0`.
    #[inline]
    pub fn normal(&mut self, loc: f64, scale: f64) -> f64 {
        loc + scale * self.standard_normal()
    }

    /// Fills `out` in order as `Generator.normal(size=out.len())` does.
    pub fn fill_normal(&mut self, out: &mut [f64]) {
        for slot in out {
            *slot = self.normal(0.0, 1.0);
        }
    }

    /// `Generator.normal(size=shape)`: an array of the given shape (e.g.
    /// `(rows, cols)` or `[a, b, c]`) filled in C (row-major) order.
    ///
    /// # Panics
    /// If the number of elements overflows `isize`.
    pub fn normal_array<Sh>(&mut self, shape: Sh) -> Array<f64, Sh::Dim>
    where
        Sh: IntoDimension,
    {
        // A plain dimension (not a ShapeBuilder with `.f()`) means C order, and
        // from_shape_simple_fn calls the closure in memory order.
        Array::from_shape_simple_fn(shape.into_dimension(), || self.normal(0.0, 1.0))
    }

    /// `Generator.normal(size=shape).astype(np.float32)`: each double rounded
    /// to the nearest float (ties to even), in C order.
    ///
    /// # Panics
    /// If the number of elements overflows `isize`.
    pub fn normal_array_f32<Sh>(&mut self, shape: Sh) -> Array<f32, Sh::Dim>
    where
        Sh: IntoDimension,
    {
        // `as f32` rounds to nearest, ties to even, like NumPy's cast.
        Array::from_shape_simple_fn(shape.into_dimension(), || self.normal(0.0, 1.0) as f32)
    }
}

impl TryRng for NumpyRng {
    type Error = Infallible;

    #[inline]
    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok(self.bits.next_u32())
    }

    #[inline]
    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.bits.next_u64())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        // Generator.bytes(n) draws ceil(n / 4) next_uint32 words and keeps the
        // first n of their little-endian bytes.
        for chunk in dst.chunks_mut(4) {
            let word = self.bits.next_u32().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        Ok(())
    }
}

impl SeedableRng for NumpyRng {
    /// The entropy as a little-endian `u128`.
    type Seed = [u8; 16];

    /// `default_rng(u128::from_le_bytes(seed))`.
    fn from_seed(seed: Self::Seed) -> Self {
        Self::default_rng(u128::from_le_bytes(seed))
    }

    /// `default_rng(state)`, so `seed_from_u64(42)` is NumPy's
    /// `default_rng(42)` (the trait's default would scramble the seed first).
    fn seed_from_u64(state: u64) -> Self {
        Self::default_rng(u128::from(state))
    }
}
