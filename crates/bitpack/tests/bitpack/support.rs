//! Probes shared by the stream and bit-plane tests: inputs where a wrong bit position, slot
//! order or sign extension shows up as a visibly wrong code.

use bitpack::Bits;

/// Lengths around every boundary a packer has: empty, a partial first byte, whole groups of 8
/// codes (b bytes), whole blocks of 32 codes (b words), and not multiples of any of them.
pub const LENGTHS: [usize; 16] = [0, 1, 2, 3, 7, 8, 9, 31, 32, 33, 45, 63, 64, 65, 257, 1001];

/// Width of the 2-D grid the patterned probe is laid over (the conformance fixtures' 45).
pub const GRID_COLUMNS: usize = 45;

/// (name, codes) for the patterned, random, all-maximum and ramp probes at one width.
pub fn probes(bits: Bits, len: usize) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("patterned", patterned(bits, len)),
        ("random", random(bits, len, 0x9E37_79B9_7F4A_7C15)),
        ("all-maximum", vec![bits.max_code(); len]),
        (
            "ramp",
            (0..len).map(|i| (i % (1 << bits.get())) as u8).collect(),
        ),
    ]
}

/// (i*7 + j*3) mod 2^b over a grid of `GRID_COLUMNS` columns, read row by row.
pub fn patterned(bits: Bits, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| {
            let (i, j) = (k / GRID_COLUMNS, k % GRID_COLUMNS);
            ((i * 7 + j * 3) % (1 << bits.get())) as u8
        })
        .collect()
}

/// Codes from xorshift64, a dependency-free stream, taking the top b bits of each draw.
pub fn random(bits: Bits, len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> (64 - bits.get())) as u8
        })
        .collect()
}
