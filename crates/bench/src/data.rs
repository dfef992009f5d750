//! Deterministic inputs: xorshift64* words, turned into roughly Gaussian f32 values (a sum of
//! four uniforms, so groups have a realistic spread of magnitudes) or b-bit codes.

/// The xorshift64* generator (Vigna 2016); any non-zero seed.
#[derive(Debug, Clone)]
pub struct Xorshift(u64);

impl Xorshift {
    pub fn new(seed: u64) -> Self {
        Xorshift(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// `len` values, mean 0, standard deviation about 1.
pub fn gaussian_like(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = Xorshift::new(seed);
    (0..len)
        .map(|_| (rng.unit() + rng.unit() + rng.unit() + rng.unit() - 2.0) * 1.7)
        .collect()
}

/// `len` codes below 2^bits.
pub fn codes(len: usize, bits: u32, seed: u64) -> Vec<u8> {
    let mut rng = Xorshift::new(seed);
    let mask = ((1u16 << bits) - 1) as u64;
    (0..len).map(|_| (rng.next_u64() & mask) as u8).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_deterministic_and_in_range() {
        assert_eq!(gaussian_like(5, 3), gaussian_like(5, 3));
        let values = gaussian_like(10_000, 7);
        let mean = values.iter().sum::<f32>() / values.len() as f32;
        assert!(mean.abs() < 0.05, "{mean}");
        assert!(values.iter().all(|v| v.abs() <= 3.4));
        assert!(codes(1000, 3, 1).iter().all(|&c| c < 8));
    }
}
