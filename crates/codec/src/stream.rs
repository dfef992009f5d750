//! The code stream of a packed tensor, by bit width: 4-bit codes use the nibble order of
//! [`crate::nibble`]; 8-bit codes are one per byte, in stream order.

use crate::layout::Bits;
use crate::nibble;

/// Packs stored codes (already offset, each <= `bits.max_stored()`) into stream bytes.
pub fn pack(bits: Bits, codes: &[u8]) -> Vec<u8> {
    match bits.get() {
        4 => nibble::pack(codes),
        _ => codes.to_vec(),
    }
}

/// Unpacks `count` stored codes; `bytes` must hold `bits.stream_bytes(count)` bytes.
pub fn unpack(bits: Bits, bytes: &[u8], count: usize) -> Vec<u8> {
    match bits.get() {
        4 => nibble::unpack(bytes, count),
        _ => bytes[..count].to_vec(),
    }
}
