//! Bit planes: the fast split and join held to the reference on every width, probe and length.

use crate::support::{self, LENGTHS, probes};
use bitpack::Bits;
use bitpack::BitsError;
use bitpack::planes::{self as bitplane, BitPlanes};
use bitpack::stream as bits;

#[test]
fn every_width_probe_and_length_splits_and_joins_like_the_reference() {
    for bits in Bits::ALL {
        let slots = bitplane::plane_slots(bits);
        for len in LENGTHS {
            for (probe, codes) in probes(bits, len) {
                let config = format!("{bits} {probe} len {len}");
                let planes = bitplane::split(bits, &codes).unwrap();
                assert_eq!(
                    planes,
                    bitplane::split_reference(bits, &codes).unwrap(),
                    "{config}: split"
                );
                assert_eq!(planes.join(), codes, "{config}: join");
                assert_eq!(planes.join_reference(), codes, "{config}: join_reference");
                for (k, (slot, plane)) in slots.iter().zip(planes.planes()).enumerate() {
                    assert_eq!(
                        plane.len(),
                        slot.width.word_count(len),
                        "{config}: plane {k}"
                    );
                }
                let stored = BitPlanes::from_planes(bits, len, planes.planes().to_vec()).unwrap();
                assert_eq!(stored.join(), codes, "{config}: from_planes");
            }
        }
    }
}

#[test]
fn single_plane_widths_are_the_dense_stream() {
    for bits in [1, 2, 4, 8].map(|b| Bits::new(b).unwrap()) {
        let codes = support::patterned(bits, 100);
        let planes = bitplane::split(bits, &codes).unwrap();
        assert_eq!(
            planes.planes(),
            [bits::pack_words(bits, &codes).unwrap()],
            "{bits}"
        );
    }
}

#[test]
fn seven_bit_codes_use_three_aligned_planes() {
    // 0b101_1010 = 90: bits 0..4 = 0b1010, bits 4..6 = 0b01, bit 6 = 1.
    let seven = Bits::new(7).unwrap();
    let planes = bitplane::split(seven, &[90, 127]).unwrap();
    assert_eq!(planes.planes(), [vec![0xFA], vec![0b11_01], vec![0b11]]);
    // 3 words of planes for 64 codes against the dense stream's 14 words: the split pads each
    // plane on its own but stores the same 7 bits per code.
    let codes = vec![127u8; 64];
    assert_eq!(
        bitplane::split(seven, &codes).unwrap().stored_bytes(),
        4 * (8 + 4 + 2)
    );
    assert_eq!(4 * seven.word_count(64), 4 * 14);
}

#[test]
fn bad_codes_and_bad_planes_are_refused() {
    let six = Bits::new(6).unwrap();
    assert_eq!(
        bitplane::split(six, &[63, 64]).unwrap_err(),
        BitsError::CodeTooWide {
            index: 1,
            code: 64,
            bits: 6
        }
    );
    assert!(bitplane::split_reference(six, &[64]).is_err());
    assert_eq!(
        BitPlanes::from_planes(six, 8, vec![vec![0]]).unwrap_err(),
        BitsError::PlaneCount {
            got: 1,
            bits: 6,
            expected: 2
        }
    );
    assert_eq!(
        BitPlanes::from_planes(six, 9, vec![vec![0], vec![0]]).unwrap_err(),
        BitsError::StreamSize {
            len: 9,
            bits: 4,
            got: 1,
            expected: 2,
            unit: "words"
        }
    );
}
