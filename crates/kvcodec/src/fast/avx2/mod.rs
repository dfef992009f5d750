//! The AVX2 kernels (x86_64). Every function here has `#[target_feature(enable = "avx2")]`
//! and is reached only through an [`Avx2`] value, which exists only once the CPU was seen to
//! have AVX2: that is the invariant behind every `unsafe` call of them below.
//!
//! Exactness: `x / scale` is `_mm256_div_ps` (IEEE division, the same f32 as the scalar `/`),
//! clamped to the integer bounds and converted with `_mm256_cvtps_epi32`, which rounds to
//! nearest, ties to even, under the default MXCSR that Rust code runs with. Codes then travel
//! as integers, and decoding converts the exact integer `code - offset` to f32 before one
//! multiply.
//!
//! Code layout tricks: eight codes per 64-bit lane are merged into 8b bits with multiply-adds
//! and shifts ([`squeeze4`]); eight codes are pulled out of b bytes with one byte shuffle and a
//! per-lane variable shift ([`Unpack`]). Tiles grouped down columns transpose their codes with
//! byte shuffles (encoding) or their decoded floats with the usual 8 x 8 shuffle network
//! (decoding).
//!
//! [`squeeze4`]: pack::squeeze4
//! [`Unpack`]: unpack::Unpack

mod columns;
pub(crate) mod fit;
pub(crate) mod pack;
mod tables;
pub(crate) mod unpack;
pub(crate) mod vectors;

use core::arch::x86_64::*;

use crate::layout::Layout;

use super::decode::{self, Stored};
use super::encode;
use super::params::{ColumnQuant, GroupQuant};
use super::{ColumnParams, ColumnScratch, ColumnTileOut, Dense, Fit, Kernels, Parts, Stop};
use columns::{fit_quantize_pack_columns, quantize_pack_columns};
use fit::{
    asymmetric_columns, columns_amax, columns_range, group_amax, group_range, symmetric_columns,
};
use pack::{fit_quantize_pack8, quantize_pack};
use unpack::{dequantize_columns, dequantize_group, dequantize_groups, stream_copy};

/// Proof that the CPU has AVX2.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx2 {
    _detected: (),
}

impl Avx2 {
    /// The proof, if this CPU has AVX2.
    pub(crate) fn detect() -> Option<Avx2> {
        std::arch::is_x86_feature_detected!("avx2").then_some(Avx2 { _detected: () })
    }
}

// The drivers, instantiated with AVX2 enabled so that the kernels inline into them.

#[target_feature(enable = "avx2")]
pub(crate) fn encode_along_rows<const B: u32>(
    k: Avx2,
    m: Dense,
    layout: Layout,
    spare: Parts,
) -> Result<Parts, Stop> {
    encode::along_rows::<Avx2, B>(k, m, layout, spare)
}

#[target_feature(enable = "avx2")]
pub(crate) fn encode_down_columns<const B: u32>(
    k: Avx2,
    m: Dense,
    layout: Layout,
    spare: Parts,
) -> Result<Parts, Stop> {
    encode::down_columns::<Avx2, B>(k, m, layout, spare)
}

#[target_feature(enable = "avx2")]
pub(crate) fn decode_along_rows<const B: u32>(
    k: Avx2,
    s: Stored,
    out: &mut [f32],
    row_len: usize,
    streaming: bool,
) {
    decode::along_rows::<Avx2, B>(k, s, out, row_len, streaming)
}

#[target_feature(enable = "avx2")]
pub(crate) fn decode_down_columns<const B: u32>(
    k: Avx2,
    s: Stored,
    out: &mut [f32],
    cols: usize,
    streaming: bool,
) {
    decode::down_columns::<Avx2, B>(k, s, out, cols, streaming)
}

// SAFETY (every method): `self` proves the CPU has AVX2.
impl Kernels for Avx2 {
    #[inline(always)]
    fn group_amax(self, group: &[f32]) -> (f32, bool) {
        unsafe { group_amax(group) }
    }

    #[inline(always)]
    fn group_range(self, group: &[f32]) -> (f32, f32, bool) {
        unsafe { group_range(group) }
    }

    #[inline(always)]
    fn quantize_pack<const B: u32>(self, group: &[f32], q: &GroupQuant, out: &mut [u8]) {
        unsafe { quantize_pack::<B>(group, q, out) }
    }

    #[inline(always)]
    fn fit_quantize_pack8<const B: u32>(
        self,
        values: &[f32],
        group_size: usize,
        fit: Fit,
        scales: &mut [f32],
        zero_points: &mut [u8],
        out: &mut [u8],
    ) -> bool {
        unsafe { fit_quantize_pack8::<B>(values, group_size, fit, scales, zero_points, out) }
    }

    #[inline(always)]
    fn columns_amax(self, tile: &[f32], amax: &mut [f32]) -> bool {
        unsafe { columns_amax(tile, amax) }
    }

    #[inline(always)]
    fn columns_range(self, tile: &[f32], lo: &mut [f32], hi: &mut [f32]) -> bool {
        unsafe { columns_range(tile, lo, hi) }
    }

    #[inline(always)]
    fn symmetric_columns(self, amax: &[f32], qmax: u8, scale: &mut [f32]) {
        unsafe { symmetric_columns(amax, qmax, scale) }
    }

    #[inline(always)]
    fn asymmetric_columns(self, lo: &[f32], hi: &[f32], levels: u8, q: &mut ColumnQuant) -> bool {
        unsafe { asymmetric_columns(lo, hi, levels, q) }
    }

    #[inline(always)]
    fn quantize_pack_columns<const B: u32>(
        self,
        tile: &[f32],
        q: &ColumnQuant,
        group_size: usize,
        codes: &mut [u8],
        row_bytes: usize,
        at: usize,
    ) {
        unsafe { quantize_pack_columns::<B>(tile, q, group_size, codes, row_bytes, at) }
    }

    #[inline(always)]
    fn fit_quantize_pack_columns<const B: u32>(
        self,
        tile: &[f32],
        group_size: usize,
        fit: Fit,
        scratch: &mut ColumnScratch,
        out: ColumnTileOut,
    ) -> Result<(), Stop> {
        unsafe { fit_quantize_pack_columns::<B>(tile, group_size, fit, scratch, out) }
    }

    #[inline(always)]
    fn dequantize_group<const B: u32>(
        self,
        codes: &[u8],
        offset: i32,
        scale: f32,
        out: &mut [f32],
    ) {
        unsafe { dequantize_group::<B>(codes, offset, scale, out) }
    }

    #[inline(always)]
    fn dequantize_groups<const B: u32>(
        self,
        codes: &[u8],
        offsets: decode::GroupOffsets,
        scales: &[f32],
        group_size: usize,
        out: &mut [f32],
        streaming: bool,
    ) {
        unsafe { dequantize_groups::<B>(codes, offsets, scales, group_size, out, streaming) }
    }

    #[inline(always)]
    fn dequantize_columns<const B: u32>(
        self,
        codes: &[u8],
        row_bytes: usize,
        at: usize,
        params: ColumnParams,
        out: &mut [f32],
    ) {
        unsafe { dequantize_columns::<B>(codes, row_bytes, at, params, out) }
    }

    #[inline(always)]
    fn stream_copy(self, src: &[f32], dst: &mut [f32]) {
        unsafe { stream_copy(src, dst) }
    }

    #[inline(always)]
    fn finish_streaming(self) {
        // SAFETY: SSE is part of x86_64.
        unsafe { _mm_sfence() }
    }
}
