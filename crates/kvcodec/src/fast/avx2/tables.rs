//! The per-width byte-shuffle and shift tables, built at compile time: compacting squeezed
//! codes when packing, and pulling eight codes out of b bytes when unpacking.

pub(super) struct Tables<const B: u32>;

impl<const B: u32> Tables<B> {
    pub(super) const COMPACT: [i8; 32] = compact_table(B as usize);
    pub(super) const UNPACK_SHUFFLE: [i8; 32] = unpack_shuffle(B as usize);
    pub(super) const UNPACK_SHIFT: [i32; 8] = unpack_shift(B as usize);
}

/// Per 128-bit half: the low B bytes of both 64-bit lanes, side by side.
const fn compact_table(b: usize) -> [i8; 32] {
    let mut table = [-128i8; 32];
    let mut half = 0;
    while half < 2 {
        let mut i = 0;
        while i < 2 * b {
            table[16 * half + i] = if i < b { i } else { 8 + i - b } as i8;
            i += 1;
        }
        half += 1;
    }
    table
}

/// Dword j takes the byte (or two) holding code j of eight packed B-bit codes.
const fn unpack_shuffle(b: usize) -> [i8; 32] {
    let mut table = [-128i8; 32];
    let mut j = 0;
    while j < 8 {
        let bit = j * b;
        let at = 16 * (j / 4) + 4 * (j % 4);
        table[at] = (bit / 8) as i8;
        if bit % 8 + b > 8 {
            table[at + 1] = (bit / 8 + 1) as i8;
        }
        j += 1;
    }
    table
}

/// Dword j's shift to bring code j to bit 0.
const fn unpack_shift(b: usize) -> [i32; 8] {
    let mut table = [0i32; 8];
    let mut j = 0;
    while j < 8 {
        table[j] = ((j * b) % 8) as i32;
        j += 1;
    }
    table
}
