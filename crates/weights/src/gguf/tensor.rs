//! A GGUF tensor of any readable ggml type, dequantized to f32 and billed from what it stores:
//! F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K. The block types' layouts
//! are in their own modules; this one only dispatches.

use gguf_file::TensorType;
use half::{bf16, f16};

use super::q4_k::BlockQ4K;
use super::q5_0::BlockQ5_0;
use super::q5_1::BlockQ5_1;
use super::q5_k::BlockQ5K;
use super::q6_k::BlockQ6K;
use super::stored::{StoredBlock, blocks_from_bytes, check_output, dequantize_blocks_into};
use super::{BlockQ4_0, BlockQ8_0, q4_1};
use crate::bpw::Cost;
use crate::error::{FormatError, Result};

/// Dequantizes one stored tensor of type `ty` into `out` (its element count, in the stored
/// order: rows of ne0 values) and returns what it stores. Refuses a type without a dequantizer
/// here, bytes that are not whole blocks, an `out` of another length and non-finite stored
/// scales, each naming the problem.
pub fn dequantize_tensor(ty: TensorType, bytes: &[u8], out: &mut [f32]) -> Result<Cost> {
    fn read<B: StoredBlock>(bytes: &[u8], out: &mut [f32]) -> Result<Cost> {
        let blocks = blocks_from_bytes::<B>(bytes)?;
        dequantize_blocks_into(&blocks, out)?;
        Ok(B::cost(blocks.len()))
    }
    fn plain<const N: usize>(
        bytes: &[u8],
        out: &mut [f32],
        name: &'static str,
        decode: impl Fn([u8; N]) -> f32,
    ) -> Result<Cost> {
        if !bytes.len().is_multiple_of(N) {
            return Err(FormatError::PartialBlock {
                format: name,
                found: bytes.len(),
                block_bytes: N,
            });
        }
        check_output(name, 1, bytes.len() / N, out.len())?;
        for (o, b) in out.iter_mut().zip(bytes.as_chunks::<N>().0) {
            *o = decode(*b);
        }
        Ok(Cost {
            elements: out.len(),
            code_bytes: bytes.len(),
            scale_bytes: 0,
            zero_point_bytes: 0,
            g_idx_bytes: 0,
            extra_bytes: 0,
        })
    }
    match ty {
        TensorType::F32 => plain::<4>(bytes, out, "F32", f32::from_le_bytes),
        TensorType::F16 => plain::<2>(bytes, out, "F16", |b| f16::from_le_bytes(b).to_f32()),
        TensorType::BF16 => plain::<2>(bytes, out, "BF16", |b| bf16::from_le_bytes(b).to_f32()),
        TensorType::Q4_0 => {
            let blocks = super::from_bytes::<BlockQ4_0>(bytes)?;
            super::dequantize_into(&blocks, out)?;
            Ok(super::storage::<BlockQ4_0>(blocks.len()))
        }
        TensorType::Q8_0 => {
            let blocks = super::from_bytes::<BlockQ8_0>(bytes)?;
            super::dequantize_into(&blocks, out)?;
            Ok(super::storage::<BlockQ8_0>(blocks.len()))
        }
        TensorType::Q4_1 => {
            let blocks = q4_1::from_bytes(bytes)?;
            q4_1::dequantize_into(&blocks, out)?;
            Ok(q4_1::storage(blocks.len()))
        }
        TensorType::Q5_0 => read::<BlockQ5_0>(bytes, out),
        TensorType::Q5_1 => read::<BlockQ5_1>(bytes, out),
        TensorType::Q4K => read::<BlockQ4K>(bytes, out),
        TensorType::Q5K => read::<BlockQ5K>(bytes, out),
        TensorType::Q6K => read::<BlockQ6K>(bytes, out),
        other => Err(FormatError::UnreadableGgufType {
            ty: other.to_string(),
        }),
    }
}

/// What a stored tensor of type `ty` and `elements` values costs, from its type and size
/// alone; `None` for a type [`dequantize_tensor`] cannot read or a count that is not whole
/// blocks.
pub fn tensor_cost(ty: TensorType, elements: usize) -> Option<Cost> {
    fn blocks_of<B: StoredBlock>(elements: usize) -> Option<Cost> {
        elements
            .is_multiple_of(B::VALUES)
            .then(|| B::cost(elements / B::VALUES))
    }
    let plain = |bytes: usize| {
        elements.checked_mul(bytes).map(|code_bytes| Cost {
            elements,
            code_bytes,
            scale_bytes: 0,
            zero_point_bytes: 0,
            g_idx_bytes: 0,
            extra_bytes: 0,
        })
    };
    let whole_32 = elements.is_multiple_of(32);
    match ty {
        TensorType::F32 => plain(4),
        TensorType::F16 | TensorType::BF16 => plain(2),
        TensorType::Q4_0 => whole_32.then(|| super::storage::<BlockQ4_0>(elements / 32)),
        TensorType::Q8_0 => whole_32.then(|| super::storage::<BlockQ8_0>(elements / 32)),
        TensorType::Q4_1 => whole_32.then(|| q4_1::storage(elements / 32)),
        TensorType::Q5_0 => blocks_of::<BlockQ5_0>(elements),
        TensorType::Q5_1 => blocks_of::<BlockQ5_1>(elements),
        TensorType::Q4K => blocks_of::<BlockQ4K>(elements),
        TensorType::Q5K => blocks_of::<BlockQ5K>(elements),
        TensorType::Q6K => blocks_of::<BlockQ6K>(elements),
        _ => None,
    }
}
