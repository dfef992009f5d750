//! One [`StoredBlock`] trait for the GGUF block types this crate dequantizes but does not write
//! (Q5_0, Q5_1 and the k-quants Q4_K, Q5_K, Q6_K), and the functions over slices of them;
//! [`super::tensor`] dispatches a whole tensor by its ggml type.
//!
//! Each block type keeps two dequantizers: `dequantize_reference`, ggml's `dequantize_row_*`
//! element by element as the C source writes it, and `dequantize_fast`, which the whole-tensor
//! functions run. They give the same bits (tests in `tests/weights/stored_blocks.rs`, on
//! patterned, random, all-maximum, tie-heavy and odd-count inputs), and both give gguf-py's
//! bits (tests on the real Gemma 3 and SmolLM2 files and on committed fixtures).
//!
//! A stored scale that is NaN or infinite is refused (ggml would spread it over the block).

use half::f16;

use crate::bpw::Cost;
use crate::error::{FormatError, Result};

/// A GGUF block type read from its stored bytes.
pub trait StoredBlock: Sized + Copy + PartialEq + std::fmt::Debug {
    /// ggml's name ("Q4_K").
    const NAME: &'static str;
    /// Bytes per block.
    const BYTES: usize;
    /// Values per block.
    const VALUES: usize;

    /// The block that `bytes` (at least [`Self::BYTES`] long) begin with.
    fn read_from(bytes: &[u8]) -> Self;
    /// The block's bytes, into the first [`Self::BYTES`] of `out`.
    fn write_to(&self, out: &mut [u8]);
    /// The first stored f16 field that is NaN or infinite, named.
    fn non_finite(&self) -> Option<(&'static str, f16)>;
    /// ggml's dequantization, element by element as the C source loops: the oracle.
    fn dequantize_reference(&self, out: &mut [f32]);
    /// The same values, computed a whole sub-block at a time.
    fn dequantize_fast(&self, out: &mut [f32]);
    /// What `blocks` blocks store.
    fn cost(blocks: usize) -> Cost;
}

/// The blocks `bytes` hold: a whole number of blocks, each with finite stored scales.
pub fn blocks_from_bytes<B: StoredBlock>(bytes: &[u8]) -> Result<Vec<B>> {
    if !bytes.len().is_multiple_of(B::BYTES) {
        return Err(FormatError::PartialBlock {
            format: B::NAME,
            found: bytes.len(),
            block_bytes: B::BYTES,
        });
    }
    let blocks: Vec<B> = bytes.chunks_exact(B::BYTES).map(B::read_from).collect();
    for (block, b) in blocks.iter().enumerate() {
        if let Some((what, value)) = b.non_finite() {
            return Err(FormatError::NonFiniteScale {
                format: B::NAME,
                what,
                block,
                value: value.to_f32(),
            });
        }
    }
    Ok(blocks)
}

/// The bytes a GGUF file stores for these blocks.
pub fn blocks_to_bytes<B: StoredBlock>(blocks: &[B]) -> Vec<u8> {
    let mut out = vec![0u8; blocks.len() * B::BYTES];
    for (block, bytes) in blocks.iter().zip(out.chunks_exact_mut(B::BYTES)) {
        block.write_to(bytes);
    }
    out
}

/// Every block's values with the reference dequantizer, in order.
pub fn dequantize_reference<B: StoredBlock>(blocks: &[B]) -> Vec<f32> {
    let mut out = vec![0f32; blocks.len() * B::VALUES];
    for (block, values) in blocks.iter().zip(out.chunks_exact_mut(B::VALUES)) {
        block.dequantize_reference(values);
    }
    out
}

/// Every block's values with the fast dequantizer into `out`, which must hold
/// [`StoredBlock::VALUES`] per block.
pub fn dequantize_blocks_into<B: StoredBlock>(blocks: &[B], out: &mut [f32]) -> Result<()> {
    check_output(B::NAME, B::VALUES, blocks.len(), out.len())?;
    for (block, values) in blocks.iter().zip(out.chunks_exact_mut(B::VALUES)) {
        block.dequantize_fast(values);
    }
    Ok(())
}

/// Every block's values with the fast dequantizer.
pub fn dequantize_blocks<B: StoredBlock>(blocks: &[B]) -> Vec<f32> {
    let mut out = vec![0f32; blocks.len() * B::VALUES];
    dequantize_blocks_into(blocks, &mut out).expect("sized for the blocks");
    out
}

pub(super) fn check_output(
    format: &'static str,
    per_block: usize,
    blocks: usize,
    found: usize,
) -> Result<()> {
    if found == blocks * per_block {
        return Ok(());
    }
    Err(FormatError::ShapeMismatch {
        format,
        tensor: "dequantized output",
        found: vec![found],
        expected: vec![blocks * per_block],
        why: format!("{per_block} values for each of {blocks} blocks"),
    })
}
