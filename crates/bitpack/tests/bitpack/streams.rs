//! b-bit streams: the fast packers held to the oracle for every width, probe and length, on every
//! kernel this CPU has and into dirty, misaligned buffers; the i32 view; refusals; and
//! byte-for-byte conformance with compressed-tensors' pack_to_int32.

use std::path::PathBuf;

use crate::support::{self, LENGTHS, probes};
use bitpack::Bits;
use bitpack::BitsError;
use bitpack::stream::{self as bits, imp};
use ndarray::{Array1, Array2};
use ndarray_npy::read_npy;

#[test]
fn every_width_probe_and_length_matches_the_oracle_in_both_containers() {
    for bits in Bits::ALL {
        for len in LENGTHS {
            for (probe, codes) in probes(bits, len) {
                let config = format!("{bits} {probe} len {len}");
                let words = bits::pack_words(bits, &codes).unwrap();
                let oracle_words = bits::pack_words_reference(bits, &codes).unwrap();
                assert_eq!(words, oracle_words, "{config}: pack_words");
                assert_eq!(words.len(), bits.word_count(len), "{config}: word count");
                let bytes = bits::pack_bytes(bits, &codes).unwrap();
                let oracle_bytes = bits::pack_bytes_reference(bits, &codes).unwrap();
                assert_eq!(bytes, oracle_bytes, "{config}: pack_bytes");
                assert_eq!(bytes.len(), bits.byte_count(len), "{config}: byte count");
                // Same bit positions: the bytes are the words' little-endian bytes, and the
                // words' padding beyond the last byte is zero.
                let word_bytes = bits::words_to_bytes(&words);
                assert_eq!(&word_bytes[..bytes.len()], bytes, "{config}: containers");
                assert!(
                    word_bytes[bytes.len()..].iter().all(|&b| b == 0),
                    "{config}: word padding"
                );
                let unpacked = [
                    ("unpack_words", bits::unpack_words(bits, &words, len)),
                    (
                        "unpack_words_reference",
                        bits::unpack_words_reference(bits, &words, len),
                    ),
                    ("unpack_bytes", bits::unpack_bytes(bits, &bytes, len)),
                    (
                        "unpack_bytes_reference",
                        bits::unpack_bytes_reference(bits, &bytes, len),
                    ),
                    (
                        "unpack_i32_words",
                        bits::unpack_i32_words(
                            bits,
                            &bits::pack_i32_words(bits, &codes).unwrap(),
                            len,
                        ),
                    ),
                ];
                for (unpacker, result) in unpacked {
                    assert_eq!(result.unwrap(), codes, "{config}: {unpacker}");
                }
            }
        }
    }
}

/// Lengths with several whole 64-code blocks as well as a ragged tail.
const LONG_LENGTHS: [usize; 3] = [64 * 37, 64 * 37 + 1, 64 * 37 + 63];

#[test]
fn every_kernel_matches_the_oracle_into_dirty_and_misaligned_buffers() {
    let kernels = imp::Kernel::available();
    assert_eq!(kernels[0], imp::Kernel::Portable);
    for kernel in kernels {
        for bits in Bits::ALL {
            for len in LENGTHS.into_iter().chain(LONG_LENGTHS) {
                for (probe, codes) in probes(bits, len) {
                    let config = format!("{kernel:?} {bits} {probe} len {len}");
                    let oracle_bytes = bits::pack_bytes_reference(bits, &codes).unwrap();
                    let oracle_words = bits::pack_words_reference(bits, &codes).unwrap();
                    // Offsets 0..8 put the output at every alignment a streaming store cares
                    // about; 0xA5 everywhere shows a byte (padding included) left unwritten.
                    for offset in [0, 1, 3, 4, 7] {
                        let mut buffer = vec![0xA5u8; oracle_bytes.len() + offset];
                        imp::pack_bytes_into(kernel, bits, &codes, &mut buffer[offset..]).unwrap();
                        assert_eq!(buffer[offset..], oracle_bytes, "{config} +{offset}: pack");
                        let mut stream = vec![0u8; offset];
                        stream.extend_from_slice(&oracle_bytes);
                        let mut out = vec![0xA5u8; len + offset];
                        imp::unpack_bytes_into(kernel, bits, &stream[offset..], &mut out[offset..])
                            .unwrap();
                        assert_eq!(out[offset..], codes, "{config} +{offset}: unpack");
                    }
                    let mut words = vec![0xDEAD_BEEFu32; oracle_words.len()];
                    imp::pack_words_into(kernel, bits, &codes, &mut words).unwrap();
                    assert_eq!(words, oracle_words, "{config}: pack words");
                    let mut signed = vec![-0x2152_4111i32; oracle_words.len()];
                    imp::pack_words_into(kernel, bits, &codes, &mut signed).unwrap();
                    let oracle_signed: Vec<i32> = oracle_words.iter().map(|&w| w as i32).collect();
                    assert_eq!(signed, oracle_signed, "{config}: pack i32 words");
                    let mut out = vec![0xA5u8; len];
                    imp::unpack_words_into(kernel, bits, &oracle_words, &mut out).unwrap();
                    assert_eq!(out, codes, "{config}: unpack words");
                    out.fill(0xA5);
                    imp::unpack_words_into(kernel, bits, &oracle_signed, &mut out).unwrap();
                    assert_eq!(out, codes, "{config}: unpack i32 words");
                }
            }
        }
    }
}

#[test]
fn every_kernel_ignores_padding_and_refuses_wide_codes_and_wrong_sizes() {
    for kernel in imp::Kernel::available() {
        for bits in Bits::ALL {
            for len in [1, 9, 33, 64, 65, 64 * 5 + 3] {
                let config = format!("{kernel:?} {bits} len {len}");
                let mut out = vec![0u8; len];
                let words = vec![u32::MAX; bits.word_count(len)];
                imp::unpack_words_into(kernel, bits, &words, &mut out).unwrap();
                assert!(out.iter().all(|&c| c == bits.max_code()), "{config}: words");
                let bytes = vec![0xFF; bits.byte_count(len)];
                imp::unpack_bytes_into(kernel, bits, &bytes, &mut out).unwrap();
                assert!(out.iter().all(|&c| c == bits.max_code()), "{config}: bytes");
                if bits.get() < 8 {
                    // A too-wide code inside a whole block, and in the ragged tail.
                    for index in [0, len / 2, len - 1] {
                        let mut codes = vec![bits.max_code(); len];
                        codes[index] = bits.max_code() + 1;
                        let expected = bits::pack_bytes_reference(bits, &codes).unwrap_err();
                        let mut buffer = vec![0u8; bits.byte_count(len)];
                        let err = imp::pack_bytes_into(kernel, bits, &codes, &mut buffer);
                        assert_eq!(err, Err(expected.clone()), "{config} at {index}");
                        let mut buffer = vec![0u32; bits.word_count(len)];
                        let err = imp::pack_words_into(kernel, bits, &codes, &mut buffer);
                        assert_eq!(err, Err(expected), "{config} at {index}: words");
                    }
                }
                let codes = vec![0u8; len];
                let too_long = bits.byte_count(len) + 1;
                assert_eq!(
                    imp::pack_bytes_into(kernel, bits, &codes, &mut vec![0; too_long]),
                    Err(BitsError::StreamSize {
                        len,
                        bits: bits.get(),
                        got: too_long,
                        expected: too_long - 1,
                        unit: "bytes"
                    }),
                    "{config}"
                );
                let short = bits.word_count(len) - 1;
                assert!(
                    matches!(
                        imp::pack_words_into(kernel, bits, &codes, &mut vec![0u32; short]),
                        Err(BitsError::StreamSize { got, unit: "words", .. }) if got == short
                    ),
                    "{config}"
                );
                assert!(
                    imp::unpack_bytes_into(kernel, bits, &vec![0; too_long], &mut out).is_err(),
                    "{config}"
                );
                assert!(
                    imp::unpack_words_into(kernel, bits, &vec![0u32; short], &mut out).is_err(),
                    "{config}"
                );
            }
        }
    }
}

#[test]
fn streams_past_the_streaming_threshold_match_the_portable_kernel() {
    // The public functions switch to non-temporal stores from imp::STREAM_MIN_BYTES of output
    // on; check them there against the portable kernel (the oracle is too slow at this size).
    let len = imp::STREAM_MIN_BYTES + 67;
    for bits in [Bits::new(3).unwrap(), Bits::EIGHT] {
        let codes = support::random(bits, len * 8 / bits.get() as usize, 0x1234_5678);
        let mut portable = vec![0u8; bits.byte_count(codes.len())];
        imp::pack_bytes_into(imp::Kernel::Portable, bits, &codes, &mut portable).unwrap();
        assert_eq!(bits::pack_bytes(bits, &codes).unwrap(), portable, "{bits}");
        assert_eq!(
            bits::unpack_bytes(bits, &portable, codes.len()).unwrap(),
            codes,
            "{bits}"
        );
    }
}

#[test]
fn padding_bits_are_ignored_when_reading() {
    // Set every bit, then read fewer codes than the stream has room for: the padding bits
    // beyond the logical length must not leak into the last code.
    for bits in Bits::ALL {
        for len in [1, 3, 9, 33] {
            let words = vec![u32::MAX; bits.word_count(len)];
            let expected = vec![bits.max_code(); len];
            assert_eq!(
                bits::unpack_words(bits, &words, len).unwrap(),
                expected,
                "{bits} len {len}"
            );
            let bytes = vec![0xFF; bits.byte_count(len)];
            assert_eq!(
                bits::unpack_bytes(bits, &bytes, len).unwrap(),
                expected,
                "{bits} len {len}"
            );
        }
    }
}

#[test]
fn signed_words_do_not_sign_extend_the_top_slot() {
    // Eight 4-bit codes of 15 fill one word: 0xFFFF_FFFF, which a checkpoint stores as -1.
    let codes = [15u8; 8];
    assert_eq!(bits::pack_words(Bits::FOUR, &codes).unwrap(), [0xFFFF_FFFF]);
    assert_eq!(bits::pack_i32_words(Bits::FOUR, &codes).unwrap(), [-1]);
    assert_eq!(bits::unpack_i32_words(Bits::FOUR, &[-1], 8).unwrap(), codes);
    // (The bug this prevents: an arithmetic shift of the signed word copies the sign bit into
    // the top slot's high bits, so an unmasked read of slot 7 would give -1 instead of 15.)
    // Every width's all-maximum stream, read back through the signed view.
    for bits in Bits::ALL {
        for len in [32, 33, 100] {
            let codes = vec![bits.max_code(); len];
            let signed = bits::pack_i32_words(bits, &codes).unwrap();
            assert!(signed.contains(&-1), "{bits} len {len}: a full word is -1");
            assert_eq!(
                bits::unpack_i32_words(bits, &signed, len).unwrap(),
                codes,
                "{bits} len {len}"
            );
        }
    }
}

#[test]
fn codes_that_do_not_fit_are_refused_by_every_packer() {
    let three = Bits::new(3).unwrap();
    let codes = [0u8, 7, 8, 1];
    let expected = BitsError::CodeTooWide {
        index: 2,
        code: 8,
        bits: 3,
    };
    assert_eq!(bits::pack_words(three, &codes).unwrap_err(), expected);
    assert_eq!(bits::pack_bytes(three, &codes).unwrap_err(), expected);
    assert_eq!(bits::pack_i32_words(three, &codes).unwrap_err(), expected);
    assert_eq!(
        bits::pack_words_reference(three, &codes).unwrap_err(),
        expected
    );
    assert_eq!(
        bits::pack_bytes_reference(three, &codes).unwrap_err(),
        expected
    );
    assert_eq!(
        expected.to_string(),
        "code 8 at position 2 does not fit in 3 bits"
    );
}

#[test]
fn a_stream_of_the_wrong_size_is_refused_naming_what_it_needs() {
    let four = Bits::FOUR;
    // 9 four-bit codes need 2 words or 5 bytes: not 1 or 3 words, not 4 or 6 bytes.
    for words in [vec![0u32; 1], vec![0u32; 3]] {
        let err = bits::unpack_words(four, &words, 9).unwrap_err();
        assert!(
            matches!(err, BitsError::StreamSize { expected: 2, .. }),
            "{err}"
        );
        assert_eq!(
            err,
            bits::unpack_words_reference(four, &words, 9).unwrap_err()
        );
    }
    let err = bits::unpack_bytes(four, &[0; 4], 9).unwrap_err();
    assert_eq!(
        err.to_string(),
        "a stream of 4 bytes cannot hold 9 codes of 4 bits: they need exactly 5 bytes"
    );
    assert_eq!(
        err,
        bits::unpack_bytes_reference(four, &[0; 4], 9).unwrap_err()
    );
    assert!(bits::unpack_i32_words(four, &[0; 3], 9).is_err());
}

#[test]
fn widths_outside_1_to_8_are_refused() {
    for bad in [0, 9, 16, 32] {
        let err = Bits::new(bad).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("unsupported bit width {bad}: bit streams hold 1- to 8-bit codes")
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Conformance: fixtures written by compressed-tensors' pack_to_int32 (tests/data/bitpack).

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/bitpack")
        .join(name)
}

fn read_words(name: &str) -> Vec<u32> {
    let bytes = std::fs::read(fixture(name)).unwrap();
    assert_eq!(bytes.len() % 4, 0, "{name}: whole words");
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

fn to_codes(values: impl IntoIterator<Item = i64>) -> Vec<u8> {
    values
        .into_iter()
        .map(|v| u8::try_from(v).expect("fixture codes are 0..=255"))
        .collect()
}

/// The fixture's codes as rows: one row for `_1d`, six for `_2d`; each row is its own stream.
fn fixture_rows(name: &str) -> Vec<Vec<u8>> {
    let path = fixture(name);
    if name.contains("_1d") {
        let codes: Array1<i64> = read_npy(&path).unwrap();
        vec![to_codes(codes)]
    } else {
        let codes: Array2<i64> = read_npy(&path).unwrap();
        codes
            .rows()
            .into_iter()
            .map(|row| to_codes(row.iter().copied()))
            .collect()
    }
}

#[test]
fn compressed_tensors_fixtures_match_byte_for_byte() {
    let mut checked = 0;
    for bits in Bits::ALL {
        for probe in ["pattern", "allmax"] {
            for dims in ["1d", "2d"] {
                let stem = format!("bitpack_{probe}_b{}_{dims}", bits.get());
                let rows = fixture_rows(&format!("{stem}.npy"));
                let unpacked = fixture_rows(&format!("{stem}_unpacked.npy"));
                let words = read_words(&format!("{stem}.bin"));
                let per_row = bits.word_count(rows[0].len());
                assert_eq!(words.len(), rows.len() * per_row, "{stem}: word count");
                for (r, (codes, row_words)) in rows.iter().zip(words.chunks(per_row)).enumerate() {
                    let config = format!("{stem} row {r}");
                    assert_eq!(
                        bits::pack_words(bits, codes).unwrap(),
                        row_words,
                        "{config}: fast"
                    );
                    assert_eq!(
                        bits::pack_words_reference(bits, codes).unwrap(),
                        row_words,
                        "{config}: oracle"
                    );
                    for kernel in imp::Kernel::available() {
                        let mut words = vec![0u32; per_row];
                        imp::pack_words_into(kernel, bits, codes, &mut words).unwrap();
                        assert_eq!(words, row_words, "{config}: {kernel:?}");
                        let mut back = vec![0u8; codes.len()];
                        imp::unpack_words_into(kernel, bits, row_words, &mut back).unwrap();
                        assert_eq!(back, unpacked[r], "{config}: {kernel:?} unpacked");
                    }
                    let back = bits::unpack_words(bits, row_words, codes.len()).unwrap();
                    assert_eq!(back, unpacked[r], "{config}: unpacked");
                    let signed: Vec<i32> = row_words.iter().map(|&w| w as i32).collect();
                    assert_eq!(
                        bits::unpack_i32_words(bits, &signed, codes.len()).unwrap(),
                        unpacked[r],
                        "{config}: as int32"
                    );
                    checked += 1;
                }
            }
        }
    }
    // 8 widths x 2 probes x (1 + 6) rows.
    assert_eq!(checked, 8 * 2 * 7);
}
