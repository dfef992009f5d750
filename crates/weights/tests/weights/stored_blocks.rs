//! The block types `weights::gguf::stored` reads: the fast dequantizer against ggml's loop, both
//! against gguf-py on committed blocks (`tests/data/make_block_fixture.py`), and bad bytes
//! refused with the problem named.

use std::path::Path;

use gguf_file::TensorType;
use half::f16;
use proptest::prelude::*;
use weights::FormatError;
use weights::gguf::stored::{
    StoredBlock, blocks_from_bytes, blocks_to_bytes, dequantize_blocks, dequantize_reference,
};
use weights::gguf::{BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, dequantize_tensor};

/// Byte offsets of each type's f16 fields in a block.
fn f16_fields<B: StoredBlock>() -> &'static [usize] {
    match B::NAME {
        "Q5_0" => &[0],
        "Q6_K" => &[208],
        _ => &[0, 2],
    }
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// gguf-py's values for the committed blocks of type `B`, and ours by both paths, bit for bit;
/// the blocks' bytes also survive a round trip.
fn matches_gguf_py<B: StoredBlock>() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/blocks");
    let stored = std::fs::read(dir.join(format!("{}.bin", B::NAME))).unwrap();
    let expected: Vec<u32> = std::fs::read(dir.join(format!("{}.f32", B::NAME)))
        .unwrap()
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let blocks = blocks_from_bytes::<B>(&stored).unwrap();
    assert_eq!(blocks.len(), 11, "{}", B::NAME);
    assert_eq!(blocks_to_bytes(&blocks), stored, "{}", B::NAME);
    assert!(
        bits(&dequantize_reference(&blocks)) == expected,
        "{} reference",
        B::NAME
    );
    assert!(
        bits(&dequantize_blocks(&blocks)) == expected,
        "{} fast",
        B::NAME
    );
}

#[test]
fn committed_blocks_dequantize_to_gguf_py_bits() {
    matches_gguf_py::<BlockQ5_0>();
    matches_gguf_py::<BlockQ5_1>();
    matches_gguf_py::<BlockQ4K>();
    matches_gguf_py::<BlockQ5K>();
    matches_gguf_py::<BlockQ6K>();
}

/// `count` blocks of `B` from `bytes` (repeated as needed), with every f16 field made finite by
/// clearing its exponent's lowest bit when the exponent is all ones.
fn finite_blocks<B: StoredBlock>(bytes: &[u8], count: usize) -> Vec<u8> {
    let mut out: Vec<u8> = bytes
        .iter()
        .copied()
        .cycle()
        .take(count * B::BYTES)
        .collect();
    for block in out.chunks_exact_mut(B::BYTES) {
        for &at in f16_fields::<B>() {
            if !f16::from_le_bytes([block[at], block[at + 1]]).is_finite() {
                block[at + 1] &= !0x04; // exponent 31 -> 30
            }
        }
    }
    out
}

/// Fast and reference dequantization agree bit for bit on these bytes, and
/// `dequantize_tensor` gives the same values.
fn fast_equals_reference<B: StoredBlock>(ty: TensorType, bytes: &[u8]) {
    let blocks = blocks_from_bytes::<B>(bytes).unwrap();
    let reference = dequantize_reference(&blocks);
    assert!(
        bits(&dequantize_blocks(&blocks)) == bits(&reference),
        "{}",
        B::NAME
    );
    let mut out = vec![0f32; reference.len()];
    let cost = dequantize_tensor(ty, bytes, &mut out).unwrap();
    assert!(
        bits(&out) == bits(&reference),
        "{} dequantize_tensor",
        B::NAME
    );
    assert_eq!(
        cost.total_bytes(),
        bytes.len(),
        "{} bills what is stored",
        B::NAME
    );
    assert_eq!(cost.elements, reference.len());
}

fn every_type(bytes: &[u8], count: usize) {
    fast_equals_reference::<BlockQ5_0>(TensorType::Q5_0, &finite_blocks::<BlockQ5_0>(bytes, count));
    fast_equals_reference::<BlockQ5_1>(TensorType::Q5_1, &finite_blocks::<BlockQ5_1>(bytes, count));
    fast_equals_reference::<BlockQ4K>(TensorType::Q4K, &finite_blocks::<BlockQ4K>(bytes, count));
    fast_equals_reference::<BlockQ5K>(TensorType::Q5K, &finite_blocks::<BlockQ5K>(bytes, count));
    fast_equals_reference::<BlockQ6K>(TensorType::Q6K, &finite_blocks::<BlockQ6K>(bytes, count));
}

#[test]
fn fast_equals_reference_on_patterned_all_maximum_and_tie_heavy_blocks() {
    let patterned: Vec<u8> = (0..4096u32).map(|i| (i * 37 + i / 251) as u8).collect();
    for count in [1, 2, 3, 7] {
        every_type(&patterned, count);
    }
    every_type(&[0xFF], 5); // every code, sub-scale and minimum at its maximum
    every_type(&[0x88], 3); // one code everywhere
    every_type(&[0x00], 1);
}

proptest! {
    #[test]
    fn fast_equals_reference_on_random_blocks(
        bytes in prop::collection::vec(any::<u8>(), 1..1200),
        count in 1usize..6,
    ) {
        every_type(&bytes, 2 * count - 1);
    }
}

#[test]
fn bad_bytes_are_refused_with_the_problem_named() {
    let bytes = finite_blocks::<BlockQ4K>(&[0x12, 0x34], 2);
    let mut out = vec![0f32; 512];
    assert!(matches!(
        dequantize_tensor(TensorType::Q4K, &bytes[..287], &mut out),
        Err(FormatError::PartialBlock {
            format: "Q4_K",
            found: 287,
            block_bytes: 144
        })
    ));
    let err = dequantize_tensor(TensorType::Q4K, &bytes, &mut out[..500]).unwrap_err();
    assert!(
        err.to_string().contains("256 values for each of 2 blocks"),
        "{err}"
    );
    // A NaN dmin in the second block.
    let mut nan = bytes.clone();
    nan[144 + 2..144 + 4].copy_from_slice(&f16::NAN.to_le_bytes());
    assert!(matches!(
        dequantize_tensor(TensorType::Q4K, &nan, &mut out),
        Err(FormatError::NonFiniteScale {
            format: "Q4_K",
            what: "minimum scale dmin",
            block: 1,
            ..
        })
    ));
    // Q6_K keeps d last.
    let mut q6 = finite_blocks::<BlockQ6K>(&[1], 1);
    q6[208..].copy_from_slice(&f16::INFINITY.to_le_bytes());
    assert!(matches!(
        dequantize_tensor(TensorType::Q6K, &q6, &mut out[..256]),
        Err(FormatError::NonFiniteScale {
            format: "Q6_K",
            what: "scale d",
            block: 0,
            ..
        })
    ));
    let err = dequantize_tensor(TensorType::Q2K, &bytes, &mut out).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("ggml type Q2_K cannot be dequantized here"),
        "{err}"
    );
}

#[test]
fn costs_follow_the_stored_bytes() {
    use weights::gguf::tensor_cost;
    let cases = [
        (TensorType::Q4K, 4.5),
        (TensorType::Q5K, 5.5),
        (TensorType::Q6K, 6.5625),
        (TensorType::Q5_0, 5.5),
        (TensorType::Q5_1, 6.0),
        (TensorType::Q8_0, 8.5),
        (TensorType::F32, 32.0),
        (TensorType::BF16, 16.0),
    ];
    for (ty, bits) in cases {
        let cost = tensor_cost(ty, 2048).unwrap();
        assert_eq!(cost.bits_per_element(), bits, "{ty}");
        let (per_block, bytes) = ty.block_layout().unwrap();
        assert_eq!(
            cost.total_bytes() as u64,
            2048 / per_block * bytes,
            "{ty}: gguf-file's layout"
        );
    }
    assert_eq!(
        tensor_cost(TensorType::Q4K, 2048 + 32),
        None,
        "not whole super-blocks"
    );
    assert_eq!(tensor_cost(TensorType::Q2K, 256), None, "no dequantizer");
}
