//! NumPy's `SeedSequence` with the default pool size of 4 words.
//!
//! Follows `numpy/random/bit_generator.pyx` (class `SeedSequence`, functions
//! `hashmix`, `mix`, `_int_to_uint32_array`), which derives from Melissa
//! O'Neill's `seed_seq` alternative. Entropy is split into little-endian 32-bit
//! words; each word is hashed into a 4-word pool with a multiplier that changes
//! after every use (`hashmix`), every pool word is then mixed into every other
//! one (`mix`), and any words beyond the fourth are mixed into all four.
//! `generate_state` hashes the pool cyclically with a second multiplier chain.
//! All arithmetic is on `u32` and wraps, as it does in the Cython source.
//!
//! Only the unspawned case is implemented (empty `spawn_key`), which is what
//! `numpy.random.default_rng(entropy)` uses.

/// Number of 32-bit words in the entropy pool (NumPy's `DEFAULT_POOL_SIZE`).
pub const POOL_SIZE: usize = 4;

const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
/// Half the word size in bits.
const XSHIFT: u32 = 16;

/// Hashes `value` and advances the multiplier held in `hash_const`, which is
/// shared across all calls of one mixing pass (that is what makes equal input
/// words at different positions hash differently).
fn hashmix(value: u32, hash_const: &mut u32) -> u32 {
    let mut value = value ^ *hash_const;
    *hash_const = hash_const.wrapping_mul(MULT_A);
    value = value.wrapping_mul(*hash_const);
    value ^ (value >> XSHIFT)
}

fn mix(x: u32, y: u32) -> u32 {
    let result = MIX_MULT_L
        .wrapping_mul(x)
        .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
    result ^ (result >> XSHIFT)
}

/// Splits a non-negative integer into 32-bit words, least significant first,
/// as NumPy's `_int_to_uint32_array` does; zero is the single word `[0]`.
pub fn entropy_words(entropy: u128) -> Vec<u32> {
    if entropy == 0 {
        return vec![0];
    }
    let mut words = Vec::with_capacity(4);
    let mut rest = entropy;
    while rest > 0 {
        words.push(rest as u32); // keeps the low 32 bits
        rest >>= 32;
    }
    words
}

/// A NumPy `SeedSequence(entropy)` (pool size 4, no spawn key), reduced to its
/// mixed pool, which is all that `generate_state` needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedSequence {
    pool: [u32; POOL_SIZE],
}

impl SeedSequence {
    /// `numpy.random.SeedSequence(entropy)` for an integer entropy.
    pub fn new(entropy: u128) -> Self {
        Self::from_words(&entropy_words(entropy))
    }

    /// `SeedSequence` from an already assembled entropy array of 32-bit words
    /// (NumPy's `SeedSequence(np.array(words, dtype=np.uint32))`). Use
    /// [`crate::parse_entropy_words`] or [`entropy_words`] to get the words of
    /// an integer; any length is accepted, including integers above 2^128.
    pub fn from_words(words: &[u32]) -> Self {
        let mut hash_const = INIT_A;
        let mut pool = [0u32; POOL_SIZE];

        // The first words fill the pool; a short entropy keeps running the hash
        // on zeros.
        for (i, slot) in pool.iter_mut().enumerate() {
            let word = words.get(i).copied().unwrap_or(0);
            *slot = hashmix(word, &mut hash_const);
        }

        // Mix every pool word into every other one, in place, so that late
        // words influence early ones.
        for i_src in 0..POOL_SIZE {
            for i_dst in 0..POOL_SIZE {
                if i_src != i_dst {
                    let hashed = hashmix(pool[i_src], &mut hash_const);
                    pool[i_dst] = mix(pool[i_dst], hashed);
                }
            }
        }

        // Words beyond the pool size are mixed into every pool word.
        for &word in words.iter().skip(POOL_SIZE) {
            for slot in pool.iter_mut() {
                let hashed = hashmix(word, &mut hash_const);
                *slot = mix(*slot, hashed);
            }
        }

        Self { pool }
    }

    /// The mixed entropy pool (NumPy's `SeedSequence.pool`).
    pub fn pool(&self) -> [u32; POOL_SIZE] {
        self.pool
    }

    /// Fills `out` as `generate_state(out.len(), np.uint32)` does.
    pub fn fill_state_u32(&self, out: &mut [u32]) {
        let mut hash_const = INIT_B;
        for (slot, &word) in out.iter_mut().zip(self.pool.iter().cycle()) {
            let mut value = word ^ hash_const;
            hash_const = hash_const.wrapping_mul(MULT_B);
            value = value.wrapping_mul(hash_const);
            *slot = value ^ (value >> XSHIFT);
        }
    }

    /// `generate_state(n_words, np.uint32)`.
    pub fn generate_state_u32(&self, n_words: usize) -> Vec<u32> {
        let mut out = vec![0; n_words];
        self.fill_state_u32(&mut out);
        out
    }

    /// `generate_state(n_words, np.uint64)`: twice as many 32-bit words, paired
    /// little-endian (the earlier word is the low half) whatever the platform's
    /// endianness, as NumPy specifies.
    pub fn generate_state_u64(&self, n_words: usize) -> Vec<u64> {
        let words = self.generate_state_u32(2 * n_words);
        words
            .chunks_exact(2)
            .map(|pair| u64::from(pair[0]) | (u64::from(pair[1]) << 32))
            .collect()
    }

    /// `generate_state(4, np.uint64)`: the four words PCG64 is seeded from.
    pub fn pcg64_seed_words(&self) -> [u64; 4] {
        let mut words = [0u32; 8];
        self.fill_state_u32(&mut words);
        std::array::from_fn(|i| u64::from(words[2 * i]) | (u64::from(words[2 * i + 1]) << 32))
    }
}

/// `SeedSequence(entropy).generate_state(4, np.uint64)`: the PCG64 seed words
/// `numpy.random.default_rng(entropy)` uses.
pub fn seed_words(entropy: u128) -> [u64; 4] {
    SeedSequence::new(entropy).pcg64_seed_words()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_words_are_little_endian_u32() {
        assert_eq!(entropy_words(0), vec![0]);
        assert_eq!(entropy_words(7), vec![7]);
        assert_eq!(entropy_words(1 << 32), vec![0, 1]);
        assert_eq!(entropy_words(u128::MAX), vec![u32::MAX; 4]);
    }

    #[test]
    fn u64_state_is_paired_u32_state() {
        let seq = SeedSequence::new(12345);
        let w32 = seq.generate_state_u32(8);
        let w64 = seq.generate_state_u64(4);
        assert_eq!(w64.as_slice(), seq.pcg64_seed_words().as_slice());
        for i in 0..4 {
            assert_eq!(w64[i] as u32, w32[2 * i]);
            assert_eq!((w64[i] >> 32) as u32, w32[2 * i + 1]);
        }
    }

    /// Literal values printed by NumPy 2.4.6 (`SeedSequence(e).pool` and
    /// `.generate_state(3)`), covering a one-word entropy, one longer than the
    /// pool (2^200 + 5 is 7 words) and an empty one.
    #[test]
    fn pool_and_state_match_numpy_literals() {
        let cases: [(&[u32], [u32; 4], [u32; 3]); 3] = [
            (
                &[12345],
                [0xf293d734, 0xfd668225, 0xf94ff895, 0x872090a0],
                [0xa03d837c, 0xb5ae6482, 0xfa1f7a2f],
            ),
            (
                &[5, 0, 0, 0, 0, 0, 0x100],
                [0x74337cb1, 0xa6d5564c, 0xa9d67f63, 0x0e3530d2],
                [0x944f61c3, 0x7d9804d1, 0x5094bed2],
            ),
            (
                &[],
                [0xfe40eb07, 0x4f363a36, 0x4eb2009d, 0xc89a7aa7],
                [0xb0f478be, 0xdb2cd7e7, 0x2c71ba49],
            ),
        ];
        for (words, pool, state) in cases {
            let seq = SeedSequence::from_words(words);
            assert_eq!(seq.pool(), pool, "pool of {words:?}");
            assert_eq!(seq.generate_state_u32(3), state, "state of {words:?}");
        }
        assert_eq!(SeedSequence::new(12345), SeedSequence::from_words(&[12345]));
    }

    #[test]
    fn generate_state_prefix_is_stable() {
        // generate_state restarts the hash chain each call, so a shorter request
        // is a prefix of a longer one.
        let seq = SeedSequence::new(99);
        assert_eq!(seq.generate_state_u32(3), seq.generate_state_u32(10)[..3]);
    }
}
