//! The 4-bit nibble order: two codes per byte.
//!
//! Spec:
//! - Container: a byte stream (u8), `ceil(count / 2)` bytes for `count` codes.
//! - Slot order: byte i = code[2i] | code[2i + 1] << 4. The even element sits in the LOW nibble
//!   (bits 0..4), the odd element in the HIGH nibble (bits 4..8). This is the little-endian 4-bit
//!   stream: element i occupies bits [4i, 4i + 4) of the stream, LSB first.
//! - Values: unsigned codes 0..=15 (the symmetric codec writes 0..=14).
//! - Padding: an odd count gets one zero pad nibble in the high half of the last byte.
//! - The logical count is recorded by the caller (it follows from the tensor's shape), never
//!   inferred from the byte count.
//!
//! `pack_reference` / `unpack_reference` place one value at a time by bit position: slow and
//! obviously right. `pack` / `unpack` work a byte at a time and are tested against them.

/// Bytes needed to hold `count` nibbles.
pub fn packed_len(count: usize) -> usize {
    count.div_ceil(2)
}

/// Oracle packer: element i goes to bit position 4i of the stream.
pub fn pack_reference(codes: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0u8; packed_len(codes.len())];
    for (i, &code) in codes.iter().enumerate() {
        debug_assert!(code < 16, "code {code} does not fit in a nibble");
        let bit = 4 * i;
        bytes[bit / 8] |= (code & 0x0F) << (bit % 8);
    }
    bytes
}

/// Oracle unpacker: reads `count` nibbles, element i from bit position 4i.
pub fn unpack_reference(bytes: &[u8], count: usize) -> Vec<u8> {
    (0..count)
        .map(|i| {
            let bit = 4 * i;
            (bytes[bit / 8] >> (bit % 8)) & 0x0F
        })
        .collect()
}

/// Packs codes (each < 16) two per byte, even element in the low nibble.
pub fn pack(codes: &[u8]) -> Vec<u8> {
    let mut pairs = codes.chunks_exact(2);
    let mut bytes: Vec<u8> = pairs
        .by_ref()
        .map(|pair| (pair[0] & 0x0F) | (pair[1] << 4))
        .collect();
    if let [last] = pairs.remainder() {
        bytes.push(last & 0x0F);
    }
    bytes
}

/// Unpacks `count` nibbles; `bytes` must hold at least `packed_len(count)` bytes.
pub fn unpack(bytes: &[u8], count: usize) -> Vec<u8> {
    let mut codes = Vec::with_capacity(count + 1);
    for &byte in &bytes[..packed_len(count)] {
        codes.push(byte & 0x0F);
        codes.push(byte >> 4);
    }
    codes.truncate(count);
    codes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_example_codes_2_and_13_form_0xd2() {
        assert_eq!(pack(&[2, 13]), vec![0xD2]);
        assert_eq!(unpack(&[0xD2], 2), vec![2, 13]);
        // Masking and shifting by hand, as the study's exercise asks.
        assert_eq!((0xD2u8 & 15, 0xD2u8 >> 4), (2, 13));
    }

    #[test]
    fn odd_count_gets_one_zero_pad_nibble() {
        assert_eq!(pack(&[1, 2, 3]), vec![0x21, 0x03]);
        assert_eq!(unpack(&[0x21, 0xF3], 3), vec![1, 2, 3]);
    }

    fn probes() -> Vec<(&'static str, Vec<u8>)> {
        let mut rng_state = 0x9E37_79B9_7F4A_7C15u64;
        let random: Vec<u8> = (0..1001)
            .map(|_| {
                // xorshift64: a dependency-free stream of nibbles for the random probe.
                rng_state ^= rng_state << 13;
                rng_state ^= rng_state >> 7;
                rng_state ^= rng_state << 17;
                (rng_state >> 60) as u8
            })
            .collect();
        vec![
            (
                "patterned",
                (0..1001).map(|i| ((i * 7) % 16) as u8).collect(),
            ),
            ("random", random),
            ("all-maximum", vec![15; 1001]),
        ]
    }

    #[test]
    fn fast_path_matches_oracle_on_probes_and_odd_lengths() {
        for (name, codes) in probes() {
            for len in [0, 1, 2, 3, 7, 8, 31, 32, 33, 1000, 1001] {
                let codes = &codes[..len];
                let packed = pack(codes);
                assert_eq!(packed, pack_reference(codes), "{name} len {len}: pack");
                assert_eq!(
                    unpack(&packed, len),
                    unpack_reference(&packed, len),
                    "{name} len {len}: unpack"
                );
                assert_eq!(unpack(&packed, len), codes, "{name} len {len}: round trip");
            }
        }
    }

    #[test]
    fn patterned_probe_pins_slot_order() {
        // A swapped slot order would produce 0x01, 0x23, ... instead.
        let codes: Vec<u8> = (0..8).collect();
        assert_eq!(pack(&codes), vec![0x10, 0x32, 0x54, 0x76]);
    }
}
