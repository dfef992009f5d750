//! GGUF Q4_0 and Q8_0: blocks of 32 weights that carry their own scale, and ggml's reference
//! quantizers for them. Q4_1 (a scale and a minimum per block) lives in [`q4_1`], outside the
//! [`GgufBlock`] machinery: it has no fixed integer zero point, no logical form and no fast
//! kernel. [`q5_0`] and [`iq4_nl`] are KV-cache types (llama.cpp's `-ctk`/`-ctv`), reference
//! quantizers only. Types read from files but never written here (Q5_0 and Q5_1 weights, and
//! the k-quants [`q4_k`], [`q5_k`], [`q6_k`]) go through [`stored`]; [`tensor`] dequantizes a
//! tensor of any readable type ([`dequantize_tensor`]).
//!
//! Spec:
//! - Container: a tensor of `rows` x `cols` (ggml's ne1 x ne0) is `rows * cols / 32` blocks in
//!   row-major order; blocks run along a row, so `cols` must be a multiple of 32. No separate
//!   scale tensor and no padding: a row length that is not a multiple of 32 is refused.
//! - Q4_0 block (18 bytes): f16 `d` (little-endian), then 16 bytes `qs` where byte j holds
//!   element j in its LOW nibble and element j + 16 in its HIGH nibble. Weight = d * (q - 8).
//! - Q8_0 block (34 bytes): f16 `d`, then 32 int8 `qs`. Weight = d * q.
//! - Q4_0 quantizer (`quantize_row_q4_0_ref`): `max` is the element of largest magnitude with
//!   its sign (the first one on ties); d = max / -8 in f32, so d is often negative; the inverse
//!   comes from the f32 d (id = 1/d, or 0 when d is 0), not from the f16-rounded one;
//!   q = min(15, trunc(x * id + 8.5)). d is stored rounded to f16 (nearest even).
//! - Q8_0 quantizer (`quantize_row_q8_0_ref`): d = amax / 127 in f32, id = 1/d (or 0),
//!   q = round(x * id) with halves rounded away from zero.
//! - Dequantization: `(q - 8) as f32 * f32(d)` and `q as f32 * f32(d)`.
//! - Unrepresentable blocks (where this module departs from ggml, which stores them silently):
//!   [`quantize`] refuses non-finite input and any block whose f32 `d` rounds to infinity in f16
//!   (|d| of 65520 and more: values from about 5.2e5 for Q4_0, 8.3e6 for Q8_0) or to 0 although
//!   the block is not all zeros (|d| at most 2^-25, so every weight would dequantize to 0),
//!   naming the block and its value range. Scales that f16 holds only as subnormals are kept,
//!   as ggml keeps them. Every other block is byte-identical to ggml's. [`from_bytes`] refuses
//!   stored blocks whose `d` is not finite.
//!
//! In the logical form (see [`super::logical`]) a GGUF tensor of `rows` x `cols` is K = cols
//! in-features and N = rows out-features: codes[k, n] = element k of row n, groups of 32 along K,
//! scale = d, and a fixed zero point (8 for Q4_0; Q8_0's int8 q is stored as the code q + 128
//! with zero point 128), so both convert to and from the integer formats exactly.
//!
//! Fast paths (bit-identical to the per-block reference, [`GgufBlock::quantize`] and
//! [`GgufBlock::dequantize`], which stay the oracle): [`quantize_into`] and [`dequantize_into`]
//! run whole slices of blocks through a [`Kernel`], AVX2 (std::arch, detected at run time) or a
//! portable one that vectorizes on baseline x86-64. They compute the same f32 operations in the
//! same order (no FMA; `d` stays a division, its f16 rounding the `half` crate's), find the
//! maximum from the magnitudes' bits, and truncate and round with exact integer conversions
//! (round-half-away(y) = trunc(y) + trunc(2 (y - trunc(y))), exact for |y| < 2^23). A kernel
//! only flags a block the reference might refuse (a non-finite value, a scale f16 rounds to
//! infinity or to 0); then the whole call reruns on the reference, which names the first
//! offending block exactly as before. Speed comes from prefetching the input a little ahead
//! and, in the AVX2 dequantizers, writing outputs of 8 MiB and more with non-temporal stores;
//! neither changes a bit. See `portable.rs` and `avx2.rs` for the details.
//!
//! Ported from ggml (names kept): `quantize_row_q4_0_ref`, `quantize_row_q8_0_ref`,
//! `dequantize_row_q4_0`, `dequantize_row_q8_0` in
//! <https://github.com/ggml-org/llama.cpp/blob/36491e4024b3016e6e2d21afc140add042b44bec/ggml/src/ggml-quants.c>.
//! gguf-py 0.19's `gguf.quants` writes the same bytes (conformance tests).

use std::array::TryFromSliceError;

use half::f16;
use ndarray::Array2;

use crate::bpw::Cost;
use crate::error::{FormatError, Result, ScaledBlock};
use crate::format::WeightFormat;
use crate::logical::LogicalWeights;

#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
mod avx2;
pub mod iq4_nl;
mod portable;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod stored;
pub mod tensor;

pub use q4_1::BlockQ4_1;
pub use q4_k::BlockQ4K;
pub use q5_0::BlockQ5_0;
pub use q5_1::BlockQ5_1;
pub use q5_k::BlockQ5K;
pub use q6_k::BlockQ6K;
pub use stored::StoredBlock;
pub use tensor::{dequantize_tensor, tensor_cost};

/// ggml's largest magnitude of a block and the element that has it, sign kept: starting from
/// 0, an element replaces the maximum only when its magnitude is strictly larger, so the first
/// one wins a tie and an all-zero block gives (0, 0). Q4_0, Q5_0 and IQ4_NL scale by it.
pub fn signed_max(x: &[f32; 32]) -> (f32, f32) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// Which implementation [`quantize_into_with`] and [`dequantize_into_with`] run. All give the
/// same bytes and values; [`Kernel::best`] is what [`quantize`], [`quantize_into`],
/// [`dequantize`] and [`dequantize_into`] use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// The per-block reference ([`GgufBlock::quantize`], [`GgufBlock::dequantize`]).
    Reference,
    /// Safe Rust that the compiler vectorizes for the baseline target.
    Portable,
    /// std::arch AVX2, on CPUs that have it.
    Avx2,
}

impl Kernel {
    /// Whether this CPU can run the kernel.
    pub fn is_available(self) -> bool {
        match self {
            Kernel::Reference | Kernel::Portable => true,
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            Kernel::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
            Kernel::Avx2 => false,
        }
    }

    /// The kernels this CPU can run.
    pub fn available() -> Vec<Kernel> {
        [Kernel::Reference, Kernel::Portable, Kernel::Avx2]
            .into_iter()
            .filter(|k| k.is_available())
            .collect()
    }

    /// The fastest kernel this CPU can run.
    pub fn best() -> Kernel {
        if Kernel::Avx2.is_available() {
            Kernel::Avx2
        } else {
            Kernel::Portable
        }
    }
}

/// Weights per Q4_0 block.
pub const QK4_0: usize = 32;
/// Weights per Q8_0 block.
pub const QK8_0: usize = 32;

/// One Q4_0 block, laid out as ggml's `block_q4_0`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ4_0 {
    /// Delta (scale).
    pub d: f16,
    /// Nibbles: byte j = element j (low) | element j + 16 (high).
    pub qs: [u8; QK4_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == BlockQ4_0::BYTES);

/// One Q8_0 block, laid out as ggml's `block_q8_0`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8_0 {
    /// Delta (scale).
    pub d: f16,
    /// Signed codes.
    pub qs: [i8; QK8_0],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == BlockQ8_0::BYTES);

/// What Q4_0 and Q8_0 share: a block of 32 codes with one f16 scale and a fixed offset.
pub trait GgufBlock: Sized + Copy + PartialEq + std::fmt::Debug {
    /// The format.
    const FORMAT: WeightFormat;
    /// The format's name in messages ("Q4_0").
    const NAME: &'static str;
    /// Bytes per block on disk.
    const BYTES: usize;
    /// One block's bytes on disk: `[u8; Self::BYTES]`. (An associated type, because a trait's
    /// signatures cannot spell `[u8; Self::BYTES]` on stable Rust; each impl does.) Callers cut
    /// bytes with `chunks_exact(B::BYTES)` and convert each chunk with `try_into`.
    type Bytes: Copy + AsRef<[u8]> + for<'a> TryFrom<&'a [u8], Error = TryFromSliceError>;
    /// Width of the logical (unsigned) code.
    const BITS: u32;
    /// The fixed logical zero point: weight = d * (code - ZERO).
    const ZERO: u8;

    /// ggml's f32 scale `d` for one block of 32 finite values, before it is rounded to f16.
    fn scale_of(x: &[f32; 32]) -> f32;
    /// ggml's reference quantizer for one block of 32 finite values, bit for bit, including its
    /// silent infinite or zero `d` for blocks f16 cannot scale; [`quantize`] refuses those.
    fn quantize(x: &[f32; 32]) -> Self;
    /// The block's scale `d`.
    fn scale(&self) -> f16;
    /// Logical unsigned codes, element order.
    fn codes(&self) -> [u8; 32];
    /// The block with scale `d` and these logical codes (each at most 2^BITS - 1).
    fn from_parts(d: f16, codes: &[u8; 32]) -> Self;
    /// The block's bytes as GGUF stores them.
    fn to_bytes(&self) -> Self::Bytes;
    /// The block that GGUF bytes hold.
    fn read_from(bytes: &Self::Bytes) -> Self;

    /// ggml's dequantization of one block.
    fn dequantize(&self) -> [f32; 32] {
        let d = self.scale().to_f32();
        self.codes()
            .map(|code| f32::from(i16::from(code) - i16::from(Self::ZERO)) * d)
    }

    /// Quantizes `x` (whole blocks of 32) into `out` (one block each) with a fast `kernel`, as
    /// [`GgufBlock::quantize`] would block by block. Returns false when the caller must run the
    /// reference instead: the type has no such kernel (the default), or some block may be
    /// refused (then `out` holds anything), or the kernel is not available on this CPU.
    fn quantize_run(kernel: Kernel, x: &[f32], out: &mut [Self]) -> bool {
        let _ = (kernel, x, out);
        false
    }

    /// Dequantizes `blocks` into `out` (32 values each) with a fast `kernel`, as
    /// [`GgufBlock::dequantize`] would; returns false (and writes nothing) when the type has no
    /// such kernel (the default) or the kernel is not available on this CPU.
    fn dequantize_run(kernel: Kernel, blocks: &[Self], out: &mut [f32]) -> bool {
        let _ = (kernel, blocks, out);
        false
    }
}

impl GgufBlock for BlockQ4_0 {
    const FORMAT: WeightFormat = WeightFormat::Q4_0;
    const NAME: &'static str = "Q4_0";
    const BYTES: usize = 18;
    type Bytes = [u8; Self::BYTES];
    const BITS: u32 = 4;
    const ZERO: u8 = 8;

    fn scale_of(x: &[f32; 32]) -> f32 {
        signed_max(x).1 / -8.0
    }

    fn quantize(x: &[f32; 32]) -> Self {
        let d = Self::scale_of(x);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        // ggml: MIN(15, (int8_t)(x*id + 8.5f)); the cast truncates toward zero.
        let codes = x.map(|v| ((v * id + 8.5).trunc() as i8).min(15) as u8);
        Self::from_parts(f16::from_f32(d), &codes)
    }

    fn quantize_run(kernel: Kernel, x: &[f32], out: &mut [Self]) -> bool {
        if !kernel.is_available() {
            return false;
        }
        match kernel {
            Kernel::Reference => false,
            Kernel::Portable => portable::quantize_run_q4_0(x, out),
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            // SAFETY: the kernel is available (checked above): this CPU has AVX2.
            Kernel::Avx2 => unsafe { avx2::quantize_run_q4_0(x, out) },
            #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
            Kernel::Avx2 => false,
        }
    }

    fn dequantize_run(kernel: Kernel, blocks: &[Self], out: &mut [f32]) -> bool {
        if !kernel.is_available() {
            return false;
        }
        match kernel {
            Kernel::Reference => return false,
            Kernel::Portable => portable::dequantize_run_q4_0(blocks, out),
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            // SAFETY: the kernel is available (checked above): this CPU has AVX2.
            Kernel::Avx2 => unsafe { avx2::dequantize_run_q4_0(blocks, out) },
            #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
            Kernel::Avx2 => return false,
        }
        true
    }

    fn scale(&self) -> f16 {
        self.d
    }

    fn codes(&self) -> [u8; 32] {
        std::array::from_fn(|i| {
            let byte = self.qs[i % 16];
            if i < 16 { byte & 0x0F } else { byte >> 4 }
        })
    }

    fn from_parts(d: f16, codes: &[u8; 32]) -> Self {
        BlockQ4_0 {
            d,
            qs: std::array::from_fn(|j| (codes[j] & 0x0F) | (codes[j + 16] << 4)),
        }
    }

    fn to_bytes(&self) -> [u8; Self::BYTES] {
        let [d0, d1] = self.d.to_le_bytes();
        std::array::from_fn(|i| match i {
            0 => d0,
            1 => d1,
            _ => self.qs[i - 2],
        })
    }

    fn read_from(bytes: &[u8; Self::BYTES]) -> Self {
        BlockQ4_0 {
            d: f16::from_le_bytes([bytes[0], bytes[1]]),
            qs: std::array::from_fn(|i| bytes[2 + i]),
        }
    }
}

impl GgufBlock for BlockQ8_0 {
    const FORMAT: WeightFormat = WeightFormat::Q8_0;
    const NAME: &'static str = "Q8_0";
    const BYTES: usize = 34;
    type Bytes = [u8; Self::BYTES];
    const BITS: u32 = 8;
    const ZERO: u8 = 128;

    fn scale_of(x: &[f32; 32]) -> f32 {
        x.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0
    }

    fn quantize(x: &[f32; 32]) -> Self {
        let d = Self::scale_of(x);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        // ggml: roundf, halves away from zero; |x * id| <= 127 so the cast cannot saturate.
        BlockQ8_0 {
            d: f16::from_f32(d),
            qs: x.map(|v| round_half_away(v * id) as i8),
        }
    }

    fn quantize_run(kernel: Kernel, x: &[f32], out: &mut [Self]) -> bool {
        if !kernel.is_available() {
            return false;
        }
        match kernel {
            Kernel::Reference => false,
            Kernel::Portable => portable::quantize_run_q8_0(x, out),
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            // SAFETY: the kernel is available (checked above): this CPU has AVX2.
            Kernel::Avx2 => unsafe { avx2::quantize_run_q8_0(x, out) },
            #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
            Kernel::Avx2 => false,
        }
    }

    fn dequantize_run(kernel: Kernel, blocks: &[Self], out: &mut [f32]) -> bool {
        if !kernel.is_available() {
            return false;
        }
        match kernel {
            Kernel::Reference => return false,
            Kernel::Portable => portable::dequantize_run_q8_0(blocks, out),
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            // SAFETY: the kernel is available (checked above): this CPU has AVX2.
            Kernel::Avx2 => unsafe { avx2::dequantize_run_q8_0(blocks, out) },
            #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
            Kernel::Avx2 => return false,
        }
        true
    }

    fn scale(&self) -> f16 {
        self.d
    }

    fn codes(&self) -> [u8; 32] {
        self.qs.map(|q| (i16::from(q) + 128) as u8)
    }

    fn from_parts(d: f16, codes: &[u8; 32]) -> Self {
        BlockQ8_0 {
            d,
            qs: codes.map(|code| (i16::from(code) - 128) as i8),
        }
    }

    fn to_bytes(&self) -> [u8; Self::BYTES] {
        let [d0, d1] = self.d.to_le_bytes();
        std::array::from_fn(|i| match i {
            0 => d0,
            1 => d1,
            _ => self.qs[i - 2] as u8,
        })
    }

    fn read_from(bytes: &[u8; Self::BYTES]) -> Self {
        BlockQ8_0 {
            d: f16::from_le_bytes([bytes[0], bytes[1]]),
            qs: std::array::from_fn(|i| bytes[2 + i] as i8),
        }
    }
}

/// Quantizes a row-major `rows` x `cols` matrix row by row; `cols` must be a multiple of 32.
/// Refuses non-finite values, and blocks whose scale f16 cannot hold (see the module spec).
pub fn quantize<B: GgufBlock>(x: &[f32], cols: usize) -> Result<Vec<B>> {
    check_row_length::<B>(x.len(), cols)?;
    let zero = B::from_parts(f16::ZERO, &[0; 32]);
    let mut blocks = vec![zero; x.len() / 32];
    quantize_into(x, cols, &mut blocks)?;
    Ok(blocks)
}

/// [`quantize`] into `out`, which must have one block per 32 values. On an error `out` holds
/// anything.
pub fn quantize_into<B: GgufBlock>(x: &[f32], cols: usize, out: &mut [B]) -> Result<()> {
    quantize_into_with(Kernel::best(), x, cols, out)
}

/// [`quantize_into`] with the given kernel (which gives the same bytes as every other one);
/// a kernel this CPU cannot run ([`Kernel::is_available`]) runs as [`Kernel::Portable`].
pub fn quantize_into_with<B: GgufBlock>(
    kernel: Kernel,
    x: &[f32],
    cols: usize,
    out: &mut [B],
) -> Result<()> {
    check_row_length::<B>(x.len(), cols)?;
    if out.len() != x.len() / 32 {
        return Err(FormatError::BlockCount {
            format: B::NAME,
            rows: x.len() / cols,
            cols,
            found: out.len(),
            expected: x.len() / 32,
        });
    }
    let kernel = if kernel.is_available() {
        kernel
    } else {
        Kernel::Portable
    };
    if B::quantize_run(kernel, x, out) {
        return Ok(());
    }
    quantize_reference(x, cols, out)
}

/// The reference: the first non-finite value, else each block by [`GgufBlock::quantize`],
/// refusing the first whose scale f16 cannot hold.
fn quantize_reference<B: GgufBlock>(x: &[f32], cols: usize, out: &mut [B]) -> Result<()> {
    if let Some((index, &value)) = x.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(FormatError::NonFinite {
            row: index / cols,
            col: index % cols,
            value,
        });
    }
    for (index, (values, block)) in x.chunks_exact(32).zip(out).enumerate() {
        let values: &[f32; 32] = values.try_into().expect("chunks of 32");
        *block = B::quantize(values);
        check_scale(index, cols, values, block)?;
    }
    Ok(())
}

/// Refuses a block whose f16 scale is infinite, or 0 for values that are not all zero.
fn check_scale<B: GgufBlock>(index: usize, cols: usize, x: &[f32; 32], block: &B) -> Result<()> {
    let stored = block.scale();
    let rounds_to_infinity = !stored.is_finite();
    let rounds_to_zero = stored.to_f32() == 0.0 && x.iter().any(|&v| v != 0.0);
    if !rounds_to_infinity && !rounds_to_zero {
        return Ok(());
    }
    let start = index * 32 % cols;
    let scaled = ScaledBlock {
        format: B::NAME,
        block: index,
        row: index * 32 / cols,
        start,
        end: start + 32,
        low: x.iter().copied().fold(f32::INFINITY, f32::min),
        high: x.iter().copied().fold(f32::NEG_INFINITY, f32::max),
        scale: B::scale_of(x),
    };
    Err(if rounds_to_infinity {
        FormatError::ScaleRoundsToInfinity(scaled)
    } else {
        FormatError::ScaleRoundsToZero(scaled)
    })
}

/// Dequantizes blocks back to the row-major values.
pub fn dequantize<B: GgufBlock>(blocks: &[B]) -> Vec<f32> {
    let mut out = vec![0f32; blocks.len() * 32];
    dequantize_into(blocks, &mut out).expect("32 values per block");
    out
}

/// [`dequantize`] into `out`, which must hold 32 values per block.
pub fn dequantize_into<B: GgufBlock>(blocks: &[B], out: &mut [f32]) -> Result<()> {
    dequantize_into_with(Kernel::best(), blocks, out)
}

/// [`dequantize_into`] with the given kernel (which gives the same values as every other one);
/// a kernel this CPU cannot run ([`Kernel::is_available`]) runs as [`Kernel::Portable`].
pub fn dequantize_into_with<B: GgufBlock>(
    kernel: Kernel,
    blocks: &[B],
    out: &mut [f32],
) -> Result<()> {
    if out.len() != blocks.len() * 32 {
        return Err(FormatError::ShapeMismatch {
            format: B::NAME,
            tensor: "dequantized output",
            found: vec![out.len()],
            expected: vec![blocks.len() * 32],
            why: format!("32 values for each of {} blocks", blocks.len()),
        });
    }
    let kernel = if kernel.is_available() {
        kernel
    } else {
        Kernel::Portable
    };
    if !B::dequantize_run(kernel, blocks, out) {
        for (block, values) in blocks.iter().zip(out.chunks_exact_mut(32)) {
            values.copy_from_slice(&block.dequantize());
        }
    }
    Ok(())
}

/// The bytes a GGUF file stores for these blocks.
pub fn to_bytes<B: GgufBlock>(blocks: &[B]) -> Vec<u8> {
    let mut out = Vec::with_capacity(blocks.len() * B::BYTES);
    for block in blocks {
        out.extend_from_slice(block.to_bytes().as_ref());
    }
    out
}

/// Blocks from stored bytes; the length must be a whole number of blocks, and every block's
/// scale finite (an infinite or NaN `d` would dequantize to infinities and NaN).
pub fn from_bytes<B: GgufBlock>(bytes: &[u8]) -> Result<Vec<B>> {
    if !bytes.len().is_multiple_of(B::BYTES) {
        return Err(FormatError::PartialBlock {
            format: B::NAME,
            found: bytes.len(),
            block_bytes: B::BYTES,
        });
    }
    let blocks: Vec<B> = bytes
        .chunks_exact(B::BYTES)
        .map(|chunk| B::read_from(&chunk.try_into().expect("chunks of B::BYTES")))
        .collect();
    if let Some((block, stored)) = blocks
        .iter()
        .enumerate()
        .find(|(_, b)| !b.scale().is_finite())
    {
        return Err(FormatError::NonFiniteScale {
            format: B::NAME,
            what: "scale d",
            block,
            value: stored.scale().to_f32(),
        });
    }
    Ok(blocks)
}

/// The logical matrix of a `rows` x `cols` tensor: K = cols, N = rows, groups of 32 along K.
pub fn to_logical<B: GgufBlock>(blocks: &[B], rows: usize, cols: usize) -> Result<LogicalWeights> {
    let elements = rows
        .checked_mul(cols)
        .ok_or(FormatError::ElementCountOverflow { rows, cols })?;
    check_row_length::<B>(elements, cols)?;
    let expected = elements / 32;
    if blocks.len() != expected {
        return Err(FormatError::BlockCount {
            format: B::NAME,
            rows,
            cols,
            found: blocks.len(),
            expected,
        });
    }
    let per_row = cols / 32;
    let codes = Array2::from_shape_fn((cols, rows), |(k, n)| {
        blocks[n * per_row + k / 32].codes()[k % 32]
    });
    let scales = Array2::from_shape_fn((per_row, rows), |(g, n)| blocks[n * per_row + g].scale());
    let zeros = Array2::from_elem((per_row, rows), B::ZERO);
    LogicalWeights::with_sequential_groups(B::BITS, 32, codes, scales, zeros)
}

/// Blocks for a logical matrix that fits the format exactly: its width, groups of 32 in
/// sequence, K a multiple of 32 and every zero point the format's fixed offset.
pub fn from_logical<B: GgufBlock>(weights: &LogicalWeights) -> Result<Vec<B>> {
    if weights.bits() != B::BITS {
        return Err(FormatError::UnsupportedBits {
            format: B::NAME,
            bits: weights.bits(),
            supported: if B::BITS == 4 { "4-bit" } else { "8-bit" },
        });
    }
    if weights.group_size() != 32 {
        return Err(FormatError::BlockGroupSize {
            format: B::NAME,
            found: weights.group_size(),
            block: 32,
        });
    }
    if let Some((row, group)) = weights.first_out_of_sequence() {
        return Err(FormatError::NeedsSequentialGroups {
            format: B::NAME,
            group_size: 32,
            row,
            group,
        });
    }
    check_row_length::<B>(weights.k() * weights.n(), weights.k())?;
    if let Some(((group, col), &zero)) =
        weights.zeros().indexed_iter().find(|(_, z)| **z != B::ZERO)
    {
        return Err(FormatError::FixedZeroPoint {
            format: B::NAME,
            group,
            col,
            found: zero,
            expected: B::ZERO,
        });
    }
    let (k, n) = (weights.k(), weights.n());
    let mut blocks = Vec::with_capacity(k * n / 32);
    for row in 0..n {
        for group in 0..k / 32 {
            let codes = std::array::from_fn(|i| weights.codes()[[group * 32 + i, row]]);
            blocks.push(B::from_parts(weights.scales()[[group, row]], &codes));
        }
    }
    Ok(blocks)
}

/// What `blocks` blocks store: each block's codes, and its f16 scale.
pub fn storage<B: GgufBlock>(blocks: usize) -> Cost {
    Cost {
        elements: blocks * 32,
        code_bytes: blocks * (B::BYTES - 2),
        scale_bytes: blocks * 2,
        zero_point_bytes: 0,
        g_idx_bytes: 0,
        extra_bytes: 0,
    }
}

/// `cols` must be a positive multiple of 32, and `len` values whole rows of it.
fn check_row_length<B: GgufBlock>(len: usize, cols: usize) -> Result<()> {
    if cols == 0 || !cols.is_multiple_of(32) {
        return Err(FormatError::RowLength {
            format: B::NAME,
            cols,
        });
    }
    if !len.is_multiple_of(cols) {
        return Err(FormatError::NotWholeRows { len, cols });
    }
    Ok(())
}

/// C's `roundf` (halves away from zero), from exact operations. Not `f32::round`: that calls
/// the platform's `roundf`, and mingw-w64's (Windows, GNU) rounds 0.49999997 to 1.
fn round_half_away(y: f32) -> f32 {
    let magnitude = y.abs();
    if magnitude.is_nan() || magnitude >= 8_388_608.0 {
        return y; // already an integer (from 2^23 up), infinite or NaN
    }
    let whole = magnitude as u32 as f32; // truncation, exact below 2^23
    let rounded = if magnitude - whole >= 0.5 {
        whole + 1.0
    } else {
        whole
    };
    rounded.copysign(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp() -> [f32; 32] {
        std::array::from_fn(|i| i as f32 - 12.0)
    }

    #[test]
    fn q4_0_byte_j_holds_elements_j_and_j_plus_16() {
        let codes: [u8; 32] = std::array::from_fn(|i| (i % 16) as u8);
        let block = BlockQ4_0::from_parts(f16::ONE, &codes);
        assert_eq!(block.qs[0], 0x00);
        assert_eq!(block.qs[1], 0x11);
        let codes: [u8; 32] = std::array::from_fn(|i| if i < 16 { 1 } else { 2 });
        assert_eq!(BlockQ4_0::from_parts(f16::ONE, &codes).qs, [0x21; 16]);
    }

    #[test]
    fn q4_0_scale_is_the_signed_extreme_over_minus_8() {
        // Ramp -12..19: the largest magnitude is +19, so d = -19/8 (negative).
        let block = BlockQ4_0::quantize(&ramp());
        assert_eq!(block.d, f16::from_f32(-19.0 / 8.0));
        // +19 maps to trunc(19 * (-8/19) + 8.5) = 0; -12 to trunc(13.55...) = 13.
        assert_eq!((block.codes()[31], block.codes()[0]), (0, 13));
        // All 15.0: d = -1.875 and every nibble 0.
        let block = BlockQ4_0::quantize(&[15.0; 32]);
        assert_eq!((block.d.to_f32(), block.qs), (-1.875, [0; 16]));
    }

    #[test]
    fn q4_0_caps_the_code_at_15() {
        // With max = -8, d = 1 and x = 7.6 gives trunc(16.1) = 16, capped to 15.
        let mut x = [0f32; 32];
        x[0] = -8.0;
        x[1] = 7.6;
        assert_eq!(BlockQ4_0::quantize(&x).codes()[1], 15);
    }

    #[test]
    fn q8_0_rounds_halves_away_from_zero() {
        let mut x = [0f32; 32];
        x[0] = 127.0; // d = 1
        x[1] = 2.5;
        x[2] = -2.5;
        let block = BlockQ8_0::quantize(&x);
        assert_eq!(block.d, f16::ONE);
        assert_eq!(&block.qs[..3], &[127, 3, -3]);
    }

    #[test]
    fn zero_blocks_quantize_to_zero_scale() {
        assert_eq!(BlockQ4_0::quantize(&[0.0; 32]).dequantize(), [0.0; 32]);
        assert_eq!(BlockQ8_0::quantize(&[0.0; 32]).dequantize(), [0.0; 32]);
    }

    #[test]
    fn a_scale_f16_cannot_hold_is_refused_not_stored_as_inf_or_0() {
        let row = |scale: f32| -> Vec<f32> { (0..64).map(|i| (i as f32 - 31.5) * scale).collect() };
        // ggml itself stores d = inf here; every weight would come back as inf or NaN.
        assert!(
            BlockQ4_0::quantize(&row(4e4)[..32].try_into().unwrap())
                .d
                .is_infinite()
        );
        assert_eq!(
            quantize::<BlockQ4_0>(&row(4e4), 64),
            Err(FormatError::ScaleRoundsToInfinity(ScaledBlock {
                format: "Q4_0",
                block: 0,
                row: 0,
                start: 0,
                end: 32,
                low: -31.5 * 4e4,
                high: -0.5 * 4e4,
                scale: 31.5 * 4e4 / 8.0,
            }))
        );
        // And d = 0 here, so every weight would come back as 0.
        let err = quantize::<BlockQ8_0>(&row(1e-9), 32).unwrap_err();
        assert!(
            matches!(&err, FormatError::ScaleRoundsToZero(b) if b.scale == 31.5 * 1e-9 / 127.0),
            "{err:?}"
        );
        // The second block of the second row is named by its place.
        let mut x = vec![1.0f32; 128];
        x[64 + 40] = 1e7;
        let err = quantize::<BlockQ4_0>(&x, 64).unwrap_err();
        assert!(
            matches!(
                &err,
                FormatError::ScaleRoundsToInfinity(ScaledBlock {
                    block: 3,
                    row: 1,
                    start: 32,
                    end: 64,
                    low: 1.0,
                    high: 1e7,
                    ..
                })
            ),
            "{err:?}"
        );
        // Small but representable scales (subnormal in f16) are kept, as ggml keeps them.
        assert!(quantize::<BlockQ8_0>(&row(1e-5), 32).is_ok());
    }

    #[test]
    fn non_finite_input_and_stored_scales_are_refused() {
        let mut x = vec![0.5f32; 64];
        x[37] = f32::NAN;
        let err = quantize::<BlockQ4_0>(&x, 32).unwrap_err();
        assert!(
            matches!(err, FormatError::NonFinite { row: 1, col: 5, value } if value.is_nan()),
            "{err:?}"
        );
        let mut bytes = to_bytes(&quantize::<BlockQ8_0>(&[1.0; 64], 32).unwrap());
        bytes[34..36].copy_from_slice(&f16::INFINITY.to_le_bytes());
        assert_eq!(
            from_bytes::<BlockQ8_0>(&bytes),
            Err(FormatError::NonFiniteScale {
                format: "Q8_0",
                what: "scale d",
                block: 1,
                value: f32::INFINITY
            })
        );
    }

    #[test]
    fn bytes_round_trip_and_reject_partial_blocks() {
        let blocks = quantize::<BlockQ4_0>(&ramp(), 32).unwrap();
        let bytes = to_bytes(&blocks);
        assert_eq!(bytes.len(), 18);
        assert_eq!(from_bytes::<BlockQ4_0>(&bytes).unwrap(), blocks);
        assert_eq!(
            from_bytes::<BlockQ8_0>(&bytes),
            Err(FormatError::PartialBlock {
                format: "Q8_0",
                found: 18,
                block_bytes: 34
            })
        );
        assert_eq!(
            quantize::<BlockQ8_0>(&[0.0; 48], 48),
            Err(FormatError::RowLength {
                format: "Q8_0",
                cols: 48
            })
        );
        assert_eq!(
            quantize::<BlockQ8_0>(&[0.0; 48], 32),
            Err(FormatError::NotWholeRows { len: 48, cols: 32 })
        );
        assert_eq!(
            to_logical(&blocks, 2, 32),
            Err(FormatError::BlockCount {
                format: "Q4_0",
                rows: 2,
                cols: 32,
                found: 1,
                expected: 2
            })
        );
    }

    #[test]
    fn logical_form_is_the_transpose_with_a_fixed_zero_point() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let blocks = quantize::<BlockQ4_0>(&x, 32).unwrap(); // 2 rows of 32
        let logical = to_logical(&blocks, 2, 32).unwrap();
        assert_eq!((logical.k(), logical.n()), (32, 2));
        let deq = logical.dequantize();
        let direct = dequantize(&blocks);
        assert!((0..64).all(|i| deq[[i % 32, i / 32]].to_bits() == direct[i].to_bits()));
        assert_eq!(from_logical::<BlockQ4_0>(&logical).unwrap(), blocks);
        // Only groups of exactly 32 with the fixed zero point are blocks.
        let padded = logical.padded(64, 1);
        let groups_of_64 = LogicalWeights::with_sequential_groups(
            4,
            64,
            padded.codes().clone(),
            padded.scales().slice(ndarray::s![..1, ..]).to_owned(),
            padded.zeros().slice(ndarray::s![..1, ..]).to_owned(),
        )
        .unwrap();
        assert_eq!(
            from_logical::<BlockQ4_0>(&groups_of_64),
            Err(FormatError::BlockGroupSize {
                format: "Q4_0",
                found: 64,
                block: 32
            })
        );
        let mut zeros = logical.zeros().clone();
        zeros[[0, 1]] = 7;
        let shifted = LogicalWeights::with_sequential_groups(
            4,
            32,
            logical.codes().clone(),
            logical.scales().clone(),
            zeros,
        )
        .unwrap();
        assert_eq!(
            from_logical::<BlockQ4_0>(&shifted),
            Err(FormatError::FixedZeroPoint {
                format: "Q4_0",
                group: 0,
                col: 1,
                found: 7,
                expected: 8
            })
        );
    }

    #[test]
    fn roundf_halves_go_away_from_zero_and_nothing_else_does() {
        let below_half = f32::from_bits(0.5f32.to_bits() - 1); // 0.49999997
        for (y, expect) in [
            (below_half, 0.0),
            (-below_half, -0.0),
            (0.5, 1.0),
            (-0.5, -1.0),
            (1.5, 2.0),
            (2.5, 3.0),
            (-2.5, -3.0),
            (8_388_607.5, 8_388_608.0),
            (16_777_215.0, 16_777_215.0),
            (-0.0, -0.0),
            (f32::INFINITY, f32::INFINITY),
        ] {
            assert_eq!(round_half_away(y).to_bits(), expect.to_bits(), "{y}");
        }
        assert!(round_half_away(f32::NAN).is_nan());
        // Every tie and its neighbours up to 2^10, both signs.
        for n in 0..1024u32 {
            let tie = n as f32 + 0.5;
            for y in [
                tie,
                f32::from_bits(tie.to_bits() - 1),
                f32::from_bits(tie.to_bits() + 1),
            ] {
                let expect = if y >= tie { n as f32 + 1.0 } else { n as f32 };
                assert_eq!(round_half_away(y), expect, "{y}");
                assert_eq!(round_half_away(-y), -expect, "{y}");
            }
        }
    }
}
