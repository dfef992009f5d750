//! GPTQ, in AutoGPTQ's layout (also GPTQModel's), at 2, 3, 4 or 8 bits.
//!
//! Spec (K = in-features, N = out-features, G = groups, b = bits):
//! - Container: four tensors, `qweight` int32 [K*b/32, N], `qzeros` int32 [G, N*b/32],
//!   `scales` f16 [G, N], `g_idx` int32 \[K\].
//! - qweight axis: packed along K. Column n of qweight is the dense little-endian b-bit stream of
//!   codes[:, n]: row k at bits [k*b, (k+1)*b) of the column's words. At 4 bits that is row
//!   8r + j at bits 4j of word r; at 3 bits 32 rows fill exactly 3 words and rows 10 and 21
//!   straddle a word boundary; at 2 and 8 bits 16 and 4 rows per word.
//! - qzeros axis: packed along N. Row g of qzeros is the same stream over zeros[g, :].
//! - Zero-point convention, recorded by the writer and never guessed:
//!   - `gptq` (AutoGPTQ, "v1"): each field stores (zero - 1) masked to b bits. A true zero point
//!     of 0 would wrap to 2^b - 1, which AutoGPTQ reads back as 2^b; the libraries disagree on
//!     it, so this writer refuses zero 0 under v1 and this reader refuses a field of 2^b - 1.
//!   - `gptq_v2` (GPTQModel): each field stores the zero point itself.
//! - g_idx: the group of each row; sequential (k / group_size) unless the checkpoint was
//!   quantized in activation order, in which case it is scattered and must travel with the rows.
//! - G = ceil(K / group_size) for the stored K.
//! - Signedness: words are stored as int32, so the top slot's high bit is the sign bit; the
//!   unpacker reinterprets them as u32 first and never sign-extends.
//! - Padding: K is padded to a multiple of 32 / gcd(32, b) (so each column is whole words) and N
//!   to the same multiple (so each qzeros row is whole words), with zero weights; the logical
//!   size travels beside the tensors (`logical_shape`) and unpacking crops to it.
//!
//! Source layouts followed: AutoGPTQ 0.7.1 `QuantLinear.pack` (qlinear_cuda) and GPTQModel 7.7.0;
//! the conformance tests hold this module to their bytes.

use half::f16;
use ndarray::Array2;

use crate::bpw::Cost;
use crate::error::{FormatError, Result};
use crate::format::WeightFormat;
use crate::logical::LogicalWeights;
use crate::shape::{check_aligned, check_logical_shape, check_not_empty, check_tensor_shapes};
use bitpack::{Bits, stream as bits};

/// Bit widths AutoGPTQ and GPTQModel write.
pub const GPTQ_BITS: [u32; 4] = [2, 3, 4, 8];

/// How a GPTQ checkpoint stores its zero points. Exhaustive: these are the two conventions the
/// libraries write, and packing and unpacking match on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ZeroConvention {
    /// AutoGPTQ's `gptq` format: stored field = (zero - 1) masked to the field.
    V1,
    /// GPTQModel's `gptq_v2` format: stored field = zero.
    V2,
}

impl ZeroConvention {
    /// The format name this convention is written under (`gptq` or `gptq_v2`).
    pub fn format(self) -> WeightFormat {
        match self {
            ZeroConvention::V1 => WeightFormat::Gptq,
            ZeroConvention::V2 => WeightFormat::GptqV2,
        }
    }

    /// The field value written for a true zero point.
    fn store(self, zero: u8, bits: u32, group: usize, col: usize) -> Result<u8> {
        let mask = max_code(bits);
        match self {
            ZeroConvention::V2 => Ok(zero),
            ZeroConvention::V1 if zero == 0 => Err(FormatError::V1ZeroUnrepresentable {
                group,
                col,
                wrapped: mask,
                seen: u32::from(mask) + 1,
            }),
            ZeroConvention::V1 => Ok(zero - 1),
        }
    }

    /// The true zero point a stored field means.
    fn read(self, field: u8, bits: u32, group: usize, col: usize) -> Result<u8> {
        match self {
            ZeroConvention::V2 => Ok(field),
            ZeroConvention::V1 if field == max_code(bits) => {
                Err(FormatError::V1ZeroFieldAmbiguous {
                    group,
                    col,
                    field,
                    seen: u32::from(field) + 1,
                    bits,
                })
            }
            ZeroConvention::V1 => Ok(field + 1),
        }
    }
}

/// One GPTQ layer's tensors, as a checkpoint stores them, with its logical size.
#[derive(Debug, Clone, PartialEq)]
pub struct GptqLayer {
    /// Code width b: 2, 3, 4 or 8.
    pub bits: u32,
    /// Rows per group; G = ceil(K / group_size).
    pub group_size: usize,
    /// How qzeros stores the zero points.
    pub convention: ZeroConvention,
    /// Codes packed along K, one word stream per column: [K*b/32, N].
    pub qweight: Array2<i32>,
    /// Zero-point fields packed along N, one word stream per group: [G, N*b/32].
    pub qzeros: Array2<i32>,
    /// Scales: [G, N].
    pub scales: Array2<f16>,
    /// The group of each stored row: \[K\].
    pub g_idx: Vec<i32>,
    /// [K, N] before padding; equal to the stored size when nothing was padded.
    pub logical_shape: [usize; 2],
}

/// Rows (of K) and columns (of N) must come in multiples of this many so the streams fill whole
/// words: 16 at 2 bits, 32 at 3, 8 at 4, 4 at 8.
pub fn alignment(bits: u32) -> usize {
    (32 / gcd(32, bits)) as usize
}

/// Packs a logical matrix into GPTQ tensors, padding K and N with zero weights.
///
/// Row-major: each unit of [`alignment`] consecutive rows of the codes becomes one word row of
/// qweight (three at 3 bits), built column by column with elementwise shifts and ors over whole
/// rows. Padded places are written from their group's zero point as they are packed; the
/// padded matrix is never built. Byte-for-byte the output of [`reference::pack`].
pub fn pack(weights: &LogicalWeights, convention: ZeroConvention) -> Result<GptqLayer> {
    let mut layer = GptqLayer {
        bits: weights.bits(),
        group_size: weights.group_size(),
        convention,
        qweight: Array2::zeros((0, 0)),
        qzeros: Array2::zeros((0, 0)),
        scales: Array2::from_elem((0, 0), f16::ZERO),
        g_idx: Vec::new(),
        logical_shape: [0, 0],
    };
    pack_into(weights, convention, &mut layer)?;
    Ok(layer)
}

/// [`pack`] into an existing layer, overwriting every field and reusing the memory of its
/// qweight and qzeros where their shapes already fit (as when packing same-shaped layers one
/// after another: a fresh qweight costs about as much in page faults as the packing itself).
/// On an error `layer` is unchanged.
pub fn pack_into(
    weights: &LogicalWeights,
    convention: ZeroConvention,
    layer: &mut GptqLayer,
) -> Result<()> {
    let bits = weights.bits();
    check_bits(bits)?;
    let (k, n) = (weights.k(), weights.n());
    let step = alignment(bits);
    let (padded_k, padded_n) = (k.next_multiple_of(step), n.next_multiple_of(step));
    let parts = weights.padded_parts(padded_k, padded_n);
    let width = Bits::new(bits)?;

    // Zero points first: the only part that can refuse (v1 and zero 0), before anything is
    // written.
    let stored_zeros = store_zeros(&parts.zeros, convention, bits)?;
    let qzeros = reusable(
        &mut layer.qzeros,
        (stored_zeros.nrows(), width.word_count(padded_n)),
    );
    pack_rows_along_n(width, &stored_zeros, qzeros)?;

    let codes = weights.codes().as_standard_layout();
    let codes = codes
        .as_slice()
        .expect("a standard-layout array has a slice");
    let qweight = reusable(
        &mut layer.qweight,
        (padded_k * bits as usize / 32, padded_n),
    );
    let source = RowSource {
        codes,
        k,
        n,
        pad: parts
            .zeros
            .as_slice()
            .expect("padded zeros are in standard layout"),
        padded_n,
        g_idx: &parts.g_idx,
    };
    match bits {
        2 => pack_qweight::<_, _, kernels::Two, PTWO>(&source, qweight),
        3 => pack_qweight::<_, _, kernels::Three, PTHREE>(&source, qweight),
        4 => pack_qweight::<_, _, kernels::Four, PFOUR>(&source, qweight),
        _ => pack_qweight::<_, _, kernels::Eight, PEIGHT>(&source, qweight),
    }
    layer.bits = bits;
    layer.group_size = weights.group_size();
    layer.convention = convention;
    layer.scales = parts.scales;
    layer.g_idx.clear();
    layer.g_idx.extend(parts.g_idx.iter().map(|&g| g as i32));
    layer.logical_shape = [k, n];
    Ok(())
}

/// The memory of `array` as a row-major slice of `shape`: kept when it already has that shape
/// in standard layout, else a new array of zeros. Every element is then overwritten.
pub(crate) fn reusable(array: &mut Array2<i32>, shape: (usize, usize)) -> &mut [i32] {
    if array.dim() != shape || !array.is_standard_layout() {
        *array = Array2::zeros(shape);
    }
    array
        .as_slice_mut()
        .expect("a standard-layout array has a slice")
}

/// Unpacks GPTQ tensors into the logical matrix, cropped to the logical shape, after checking
/// every shape against the format.
///
/// Decodes only the rows and columns inside the logical shape, straight into the cropped codes;
/// the result, and the error for a malformed layer, are those of [`reference::unpack`].
pub fn unpack(layer: &GptqLayer) -> Result<LogicalWeights> {
    unpack_with(layer, Vec::new())
}

/// [`unpack`] into an existing matrix, reusing the memory of its codes when it is large enough
/// (a fresh [K, N] allocation costs more in page faults than the decoding). On an error `out`
/// is left a valid but unspecified matrix.
pub fn unpack_into(layer: &GptqLayer, out: &mut LogicalWeights) -> Result<()> {
    let (buffer, _) = out.take_codes().into_raw_vec_and_offset();
    *out = unpack_with(layer, buffer)?;
    Ok(())
}

/// A buffer of `len` elements: `buffer` when it holds that many (its contents are stale, to be
/// overwritten), else fresh zeros.
pub(crate) fn reuse_buffer(mut buffer: Vec<u8>, len: usize) -> Vec<u8> {
    if buffer.len() >= len {
        buffer.truncate(len);
        buffer
    } else {
        vec![0u8; len]
    }
}

fn unpack_with(layer: &GptqLayer, buffer: Vec<u8>) -> Result<LogicalWeights> {
    let bits = layer.bits;
    check_bits(bits)?;
    let (stored_k, stored_n) = layer.check_shapes()?;
    let width = Bits::new(bits)?;

    let groups = layer.qzeros.nrows();
    let mut zeros = Array2::<u8>::zeros((groups, stored_n));
    unpack_rows_along_n(width, &layer.qzeros, &mut zeros)?;
    read_zeros(&mut zeros, layer.convention, bits)?;
    let g_idx = layer
        .g_idx
        .iter()
        .enumerate()
        .map(|(row, &group)| {
            u32::try_from(group).map_err(|_| FormatError::NegativeGroupIndex { row, group })
        })
        .collect::<Result<Vec<u32>>>()?;
    // What building the stored (uncropped) matrix would refuse: its codes and zero points are
    // in range by construction, so only a group index past the last group.
    if let Some((row, &group)) = g_idx
        .iter()
        .enumerate()
        .find(|(_, g)| **g as usize >= groups)
    {
        return Err(FormatError::GroupIndexOutOfRange { row, group, groups });
    }

    let [k, n] = layer.logical_shape;
    let qweight = layer.qweight.as_standard_layout();
    let words = qweight
        .as_slice()
        .expect("a standard-layout array has a slice");
    let mut codes = reuse_buffer(buffer, k * n);
    let target = RowTarget {
        codes: &mut codes,
        k,
        n,
        stored_n,
    };
    match bits {
        2 => unpack_qweight::<_, _, kernels::Two, UTWO>(words, target),
        3 => unpack_qweight::<_, _, kernels::Three, UTHREE>(words, target),
        4 => unpack_qweight::<_, _, kernels::Four, UFOUR>(words, target),
        _ => unpack_qweight::<_, _, kernels::Eight, UEIGHT>(words, target),
    }
    let codes = Array2::from_shape_vec((k, n), codes).expect("k * n codes");

    // As LogicalWeights::cropped: the whole stored metadata when nothing was padded, else the
    // groups the kept rows use.
    let (scales, zeros, g_idx) = if (k, n) == (stored_k, stored_n) {
        (layer.scales.clone(), zeros, g_idx)
    } else {
        let used = g_idx[..k].iter().max().map_or(1, |&g| g as usize + 1);
        (
            layer.scales.slice(ndarray::s![..used, ..n]).to_owned(),
            zeros.slice(ndarray::s![..used, ..n]).to_owned(),
            g_idx[..k].to_vec(),
        )
    };
    LogicalWeights::from_decoded(bits, layer.group_size, codes, scales, zeros, g_idx)
}

/// The zero points as qzeros stores them under `convention`; refuses as
/// [`ZeroConvention::store`] does, at the first refused place in row-major order.
fn store_zeros(zeros: &Array2<u8>, convention: ZeroConvention, bits: u32) -> Result<Array2<u8>> {
    let mut stored = zeros.as_standard_layout().into_owned();
    if convention == ZeroConvention::V1 {
        let fields = stored
            .as_slice_mut()
            .expect("an owned standard-layout array has a slice");
        if fields.contains(&0) {
            for ((group, col), &zero) in zeros.indexed_iter() {
                convention.store(zero, bits, group, col)?;
            }
        }
        fields.iter_mut().for_each(|zero| *zero -= 1);
    }
    Ok(stored)
}

/// The true zero points from the fields qzeros stores under `convention`, in place; refuses as
/// [`ZeroConvention::read`] does, at the first refused place in row-major order.
fn read_zeros(fields: &mut Array2<u8>, convention: ZeroConvention, bits: u32) -> Result<()> {
    if convention == ZeroConvention::V1 {
        let max = max_code(bits);
        if fields.iter().any(|&field| field == max) {
            for ((group, col), &field) in fields.indexed_iter() {
                convention.read(field, bits, group, col)?;
            }
        }
        fields.iter_mut().for_each(|field| *field += 1);
    }
    Ok(())
}

/// Packs each row of `values` [rows, cols] (standard layout) into its own dense word stream:
/// `packed` is [rows, cols*b/32], row-major.
fn pack_rows_along_n(width: Bits, values: &Array2<u8>, packed: &mut [i32]) -> Result<()> {
    let cols = values.ncols();
    let words = width.word_count(cols);
    let values = values.as_slice().expect("standard layout");
    for (row, out) in values
        .chunks_exact(cols)
        .zip(packed.chunks_exact_mut(words))
    {
        bits::pack_i32_words_into(width, row, out)?;
    }
    Ok(())
}

/// Unpacks each row of `packed` [rows, cols*b/32] into `values` [rows, cols].
fn unpack_rows_along_n(width: Bits, packed: &Array2<i32>, values: &mut Array2<u8>) -> Result<()> {
    let words = packed.ncols();
    let cols = values.ncols();
    let packed = packed.as_standard_layout();
    let packed = packed.as_slice().expect("standard layout");
    let values = values.as_slice_mut().expect("standard layout");
    for (row, out) in packed
        .chunks_exact(words)
        .zip(values.chunks_exact_mut(cols))
    {
        bits::unpack_i32_words_into(width, row, out)?;
    }
    Ok(())
}

/// The padded codes, row by row, without building them: row k < K is the logical row for its
/// first N columns; every other place (k, c) holds the padded zero point `pad[g_idx[k], c]`.
struct RowSource<'a> {
    /// The logical codes [K, N], row-major.
    codes: &'a [u8],
    k: usize,
    n: usize,
    /// The padded true zero points [groups, padded N], row-major.
    pad: &'a [u8],
    padded_n: usize,
    /// The padded g_idx.
    g_idx: &'a [u32],
}

impl<'a> RowSource<'a> {
    fn pad_row(&self, row: usize) -> &'a [u8] {
        let group = self.g_idx[row] as usize;
        &self.pad[group * self.padded_n..(group + 1) * self.padded_n]
    }

    /// Columns 0..N of padded row `row`.
    fn main(&self, row: usize) -> &'a [u8] {
        if row < self.k {
            &self.codes[row * self.n..(row + 1) * self.n]
        } else {
            &self.pad_row(row)[..self.n]
        }
    }

    /// Columns N..padded N of padded row `row`.
    fn tail(&self, row: usize) -> &'a [u8] {
        &self.pad_row(row)[self.n..]
    }
}

/// Fills qweight [padded K * b/32, padded N] unit by unit: R rows of codes into W word rows.
fn pack_qweight<const R: usize, const W: usize, K: Kernel<R, W>, const L: usize>(
    source: &RowSource<'_>,
    qweight: &mut [i32],
) {
    let (n, padded_n) = (source.n, source.padded_n);
    // One word row per unit (2, 4 and 8 bits), so whole lines of one row stream; three rows
    // (3 bits) streamed measured slower.
    let stream = W == 1 && streams(std::mem::size_of_val(qweight));
    for (unit, words) in qweight.chunks_exact_mut(W * padded_n).enumerate() {
        let first = unit * R;
        let mut rows = words.chunks_exact_mut(padded_n);
        let mut outs: [(&mut [i32], &mut [i32]); W] =
            std::array::from_fn(|_| rows.next().expect("W word rows").split_at_mut(n));
        let main: [&[u8]; R] = std::array::from_fn(|j| source.main(first + j));
        let main_outs = &mut outs.each_mut().map(|(m, _)| &mut **m);
        pack_columns::<R, W, K, L>(&main, main_outs, stream);
        if padded_n > n {
            let tail: [&[u8]; R] = std::array::from_fn(|j| source.tail(first + j));
            pack_columns::<R, W, K, L>(&tail, &mut outs.each_mut().map(|(_, t)| &mut **t), false);
        }
    }
    if stream {
        store_fence();
    }
}

/// Where unpacking writes: the cropped codes [K, N] of a stored matrix N' columns wide.
struct RowTarget<'a> {
    codes: &'a mut [u8],
    k: usize,
    n: usize,
    stored_n: usize,
}

/// Decodes qweight [stored K * b/32, stored N] unit by unit into the cropped codes.
fn unpack_qweight<const R: usize, const W: usize, K: Kernel<R, W>, const L: usize>(
    qweight: &[i32],
    target: RowTarget<'_>,
) {
    let RowTarget {
        codes,
        k,
        n,
        stored_n,
    } = target;
    let whole_units = k / R;
    let (whole, rest) = codes.split_at_mut(whole_units * R * n);
    let mut units = qweight.chunks_exact(W * stored_n);
    fn word_rows<const W: usize>(unit: &[i32], stored_n: usize, n: usize) -> [&[i32]; W] {
        let mut rows = unit.chunks_exact(stored_n);
        std::array::from_fn(|_| &rows.next().expect("W word rows")[..n])
    }
    // The codes' chunks lead the zip, so it stops without taking a unit from `units`.
    for (out, words) in whole.chunks_exact_mut(R * n).zip(units.by_ref()) {
        let mut rows = out.chunks_exact_mut(n);
        let mut outs: [&mut [u8]; R] = std::array::from_fn(|_| rows.next().expect("R rows"));
        unpack_columns::<R, W, K, L>(&word_rows(words, stored_n, n), &mut outs);
    }
    if !rest.is_empty() {
        // The last unit holds padded rows: decode it whole and keep the logical ones.
        let words = units.next().expect("a unit for the last rows");
        let mut scratch = vec![0u8; R * n];
        let mut rows = scratch.chunks_exact_mut(n);
        let mut outs: [&mut [u8]; R] = std::array::from_fn(|_| rows.next().expect("R rows"));
        unpack_columns::<R, W, K, L>(&word_rows(words, stored_n, n), &mut outs);
        rest.copy_from_slice(&scratch[..rest.len()]);
    }
}

// Columns per kernel call (the drivers' `L`), per width and direction, by measurement. The
// kernels work on fixed-size local arrays (no store can alias an input, no bounds checks), so
// their loops vectorize; the drivers copy blocks in and out.
const PTWO: usize = 32;
const PTHREE: usize = 32;
const PFOUR: usize = 32;
const PEIGHT: usize = 32;
const UTWO: usize = 64;
const UTHREE: usize = 64;
const UFOUR: usize = 32;
const UEIGHT: usize = 32;

/// Packed outputs of this many bytes and more are written with non-temporal stores where
/// aligned (no read of the lines about to be overwritten; they would not stay cached anyway).
/// Unpacking does not stream: 8 to 32 code rows of partial lines measured three times slower,
/// and 4 rows of whole 64-byte lines (8 bits) no faster.
const STREAM_BYTES: usize = 8 << 20;

/// Whether an output of `bytes` is streamed (on x86-64, whose baseline SSE2 has the stores).
fn streams(bytes: usize) -> bool {
    cfg!(all(target_arch = "x86_64", target_feature = "sse2")) && bytes >= STREAM_BYTES
}

/// Orders the non-temporal stores before whatever follows.
fn store_fence() {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    // SAFETY: SSE2 is enabled for the whole build (x86-64's baseline).
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Copies `from` into `to` (of the same length); with `stream`, and `to` 16-byte aligned and
/// `from` whole 16-byte pieces, as non-temporal stores (the caller fences after the last).
#[inline(always)]
fn put<T: Copy, const N: usize>(to: &mut [T], from: &[T; N], stream: bool) {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    if stream
        && std::mem::size_of::<[T; N]>().is_multiple_of(16)
        && to
            .as_ptr()
            .cast::<std::arch::x86_64::__m128i>()
            .is_aligned()
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        let to: &mut [T; N] = to.try_into().expect("as long as `from`");
        let (to, from) = (
            to.as_mut_ptr().cast::<__m128i>(),
            from.as_ptr().cast::<__m128i>(),
        );
        for i in 0..std::mem::size_of::<[T; N]>() / 16 {
            // SAFETY: `to` and `from` are arrays of size_of::<[T; N]>() bytes, a multiple of
            // 16, so piece i is in both; `to` is 16-byte aligned (checked above) as the
            // streaming store needs, loadu needs no alignment; SSE2 is enabled for the build.
            unsafe { _mm_stream_si128(to.add(i), _mm_loadu_si128(from.add(i))) };
        }
        return;
    }
    let _ = stream;
    to.copy_from_slice(from);
}

/// One unit of the GPTQ stream: R rows of b-bit codes per column fill W words exactly.
trait Kernel<const R: usize, const W: usize> {
    /// Packs LANES columns of R rows into W words each.
    fn pack<const LANES: usize>(rows: &[&[u8; LANES]; R], words: &mut [[u32; LANES]; W]);
    /// Unpacks LANES columns of W words into R rows of codes.
    fn unpack<const LANES: usize>(words: &[[u32; LANES]; W], rows: &mut [[u8; LANES]; R]);
}

/// Runs a packing kernel over all columns of R equally long rows, writing W word rows of the
/// same length; the last partial block goes through zero-filled copies.
fn pack_columns<const R: usize, const W: usize, K: Kernel<R, W>, const LANES: usize>(
    rows: &[&[u8]; R],
    outs: &mut [&mut [i32]; W],
    stream: bool,
) {
    let len = outs[0].len();
    debug_assert!(rows.iter().all(|r| r.len() == len));
    debug_assert!(outs.iter().all(|o| o.len() == len));
    let full = len - len % LANES;
    let mut words = [[0u32; LANES]; W];
    for start in (0..full).step_by(LANES) {
        let block: [&[u8; LANES]; R] = std::array::from_fn(|j| {
            rows[j][start..start + LANES]
                .try_into()
                .expect("LANES codes")
        });
        K::pack::<LANES>(&block, &mut words);
        for (out, words) in outs.iter_mut().zip(&words) {
            let out = &mut out[start..start + LANES];
            if stream {
                put(out, &words.map(|w| w as i32), true);
            } else {
                for (o, &w) in out.iter_mut().zip(words) {
                    *o = w as i32;
                }
            }
        }
    }
    if full < len {
        let copies: [[u8; LANES]; R] = std::array::from_fn(|j| {
            let mut copy = [0u8; LANES];
            copy[..len - full].copy_from_slice(&rows[j][full..]);
            copy
        });
        K::pack::<LANES>(&copies.each_ref(), &mut words);
        for (out, words) in outs.iter_mut().zip(&words) {
            for (o, &w) in out[full..].iter_mut().zip(words) {
                *o = w as i32;
            }
        }
    }
}

/// Runs an unpacking kernel over all columns of W equally long word rows, writing R rows of
/// codes; the last partial block goes through copies.
fn unpack_columns<const R: usize, const W: usize, K: Kernel<R, W>, const LANES: usize>(
    words: &[&[i32]; W],
    outs: &mut [&mut [u8]; R],
) {
    let len = outs[0].len();
    debug_assert!(words.iter().all(|w| w.len() == len));
    debug_assert!(outs.iter().all(|o| o.len() == len));
    let full = len - len % LANES;
    let mut block = [[0u32; LANES]; W];
    let mut codes = [[0u8; LANES]; R];
    for start in (0..full).step_by(LANES) {
        for (block, words) in block.iter_mut().zip(words) {
            for (b, &w) in block.iter_mut().zip(&words[start..start + LANES]) {
                *b = w as u32;
            }
        }
        K::unpack::<LANES>(&block, &mut codes);
        for (out, codes) in outs.iter_mut().zip(&codes) {
            out[start..start + LANES].copy_from_slice(codes);
        }
    }
    if full < len {
        for (block, words) in block.iter_mut().zip(words) {
            block.fill(0);
            for (b, &w) in block.iter_mut().zip(&words[full..]) {
                *b = w as u32;
            }
        }
        K::unpack::<LANES>(&block, &mut codes);
        for (out, codes) in outs.iter_mut().zip(&codes) {
            out[full..].copy_from_slice(&codes[..len - full]);
        }
    }
}

/// The per-block kernels, one per width. Codes are in range (the logical matrix guarantees
/// it), so packing needs no masks. Both directions go through bytes (or, at 3 bits, 12-bit
/// halves and 6-bit pairs) so that few lanes are ever narrowed from 32 bits.
mod kernels {
    use super::Kernel;

    /// 2 bits: 16 rows per word, row 4i + j at bits 8i + 2j.
    pub(super) struct Two;
    /// 3 bits: 32 rows per three words, row r at bit 3r of the 96-bit little-endian stream.
    pub(super) struct Three;
    /// 4 bits: 8 rows per word, row 2i + j at bits 8i + 4j.
    pub(super) struct Four;
    /// 8 bits: 4 rows per word, row i at bits 8i.
    pub(super) struct Eight;

    impl Kernel<16, 1> for Two {
        #[inline(always)]
        fn pack<const LANES: usize>(rows: &[&[u8; LANES]; 16], words: &mut [[u32; LANES]; 1]) {
            for (c, word) in words[0].iter_mut().enumerate() {
                let byte = |i: usize| {
                    rows[4 * i][c]
                        | rows[4 * i + 1][c] << 2
                        | rows[4 * i + 2][c] << 4
                        | rows[4 * i + 3][c] << 6
                };
                *word = u32::from_le_bytes([byte(0), byte(1), byte(2), byte(3)]);
            }
        }

        #[inline(always)]
        fn unpack<const LANES: usize>(words: &[[u32; LANES]; 1], rows: &mut [[u8; LANES]; 16]) {
            for i in 0..4 {
                let mut bytes = [0u8; LANES];
                for (byte, &word) in bytes.iter_mut().zip(&words[0]) {
                    *byte = (word >> (8 * i)) as u8;
                }
                for j in 0..4 {
                    for (code, byte) in rows[4 * i + j].iter_mut().zip(bytes) {
                        *code = byte >> (2 * j) & 3;
                    }
                }
            }
        }
    }

    impl Kernel<8, 1> for Four {
        #[inline(always)]
        fn pack<const LANES: usize>(rows: &[&[u8; LANES]; 8], words: &mut [[u32; LANES]; 1]) {
            for (c, word) in words[0].iter_mut().enumerate() {
                let byte = |i: usize| rows[2 * i][c] | rows[2 * i + 1][c] << 4;
                *word = u32::from_le_bytes([byte(0), byte(1), byte(2), byte(3)]);
            }
        }

        #[inline(always)]
        fn unpack<const LANES: usize>(words: &[[u32; LANES]; 1], rows: &mut [[u8; LANES]; 8]) {
            for i in 0..4 {
                let mut bytes = [0u8; LANES];
                for (byte, &word) in bytes.iter_mut().zip(&words[0]) {
                    *byte = (word >> (8 * i)) as u8;
                }
                for (code, byte) in rows[2 * i].iter_mut().zip(bytes) {
                    *code = byte & 15;
                }
                for (code, byte) in rows[2 * i + 1].iter_mut().zip(bytes) {
                    *code = byte >> 4;
                }
            }
        }
    }

    /// 8-bit packing on x86-64 with SSE2 (part of the baseline, so no run-time check): a byte
    /// interleave of the four rows, 16 columns at a time. (Unpacking the same way measured no
    /// faster than the compiler's loop.)
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    mod sse2 {
        use std::arch::x86_64::*;

        /// Word c = rows[0][c] | rows[1][c] << 8 | rows[2][c] << 16 | rows[3][c] << 24.
        #[inline]
        #[target_feature(enable = "sse2")]
        pub(super) fn pack_eight<const LANES: usize>(
            rows: &[&[u8; LANES]; 4],
            words: &mut [u32; LANES],
        ) {
            for (c, out) in words.chunks_exact_mut(16).enumerate() {
                let out: &mut [u32; 16] = out.try_into().expect("16 words");
                let r: [__m128i; 4] = std::array::from_fn(|j| {
                    let row: &[u8; 16] = rows[j][16 * c..16 * c + 16].try_into().expect("16");
                    // SAFETY: `row` is 16 readable bytes; loadu needs no alignment.
                    unsafe { _mm_loadu_si128(row.as_ptr().cast()) }
                });
                let (lo01, hi01) = (_mm_unpacklo_epi8(r[0], r[1]), _mm_unpackhi_epi8(r[0], r[1]));
                let (lo23, hi23) = (_mm_unpacklo_epi8(r[2], r[3]), _mm_unpackhi_epi8(r[2], r[3]));
                let w = [
                    _mm_unpacklo_epi16(lo01, lo23),
                    _mm_unpackhi_epi16(lo01, lo23),
                    _mm_unpacklo_epi16(hi01, hi23),
                    _mm_unpackhi_epi16(hi01, hi23),
                ];
                for (q, w) in w.into_iter().enumerate() {
                    // SAFETY: `out[4q..4q + 4]` is 16 writable bytes; storeu needs no alignment.
                    unsafe { _mm_storeu_si128(out[4 * q..].as_mut_ptr().cast(), w) };
                }
            }
        }
    }

    impl Kernel<4, 1> for Eight {
        #[inline(always)]
        fn pack<const LANES: usize>(rows: &[&[u8; LANES]; 4], words: &mut [[u32; LANES]; 1]) {
            #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
            if LANES.is_multiple_of(16) {
                // SAFETY: SSE2 is enabled for the whole build (x86-64's baseline).
                unsafe { sse2::pack_eight(rows, &mut words[0]) };
                return;
            }
            for (c, word) in words[0].iter_mut().enumerate() {
                *word = u32::from_le_bytes([rows[0][c], rows[1][c], rows[2][c], rows[3][c]]);
            }
        }

        #[inline(always)]
        fn unpack<const LANES: usize>(words: &[[u32; LANES]; 1], rows: &mut [[u8; LANES]; 4]) {
            for (i, row) in rows.iter_mut().enumerate() {
                for (code, &word) in row.iter_mut().zip(&words[0]) {
                    *code = (word >> (8 * i)) as u8;
                }
            }
        }
    }

    /// Each eight rows make a 24-bit piece; the pieces sit at bits 0, 24, 48 and 72 of the
    /// three words, so rows 10 and 21 straddle the word boundaries.
    impl Kernel<32, 3> for Three {
        #[inline(always)]
        fn pack<const LANES: usize>(rows: &[&[u8; LANES]; 32], words: &mut [[u32; LANES]; 3]) {
            for c in 0..LANES {
                let pair = |r: usize| u16::from(rows[r][c] | rows[r + 1][c] << 3);
                let piece = |r: usize| {
                    let low = pair(r) | pair(r + 2) << 6;
                    let high = pair(r + 4) | pair(r + 6) << 6;
                    u32::from(low) | u32::from(high) << 12
                };
                let t = [piece(0), piece(8), piece(16), piece(24)];
                words[0][c] = t[0] | t[1] << 24;
                words[1][c] = t[1] >> 8 | t[2] << 16;
                words[2][c] = t[2] >> 16 | t[3] << 8;
            }
        }

        #[inline(always)]
        fn unpack<const LANES: usize>(words: &[[u32; LANES]; 3], rows: &mut [[u8; LANES]; 32]) {
            let [w0, w1, w2] = words;
            let mut pieces = [[0u32; LANES]; 4];
            for c in 0..LANES {
                pieces[0][c] = w0[c] & 0xFF_FFFF;
                pieces[1][c] = (w0[c] >> 24 | w1[c] << 8) & 0xFF_FFFF;
                pieces[2][c] = (w1[c] >> 16 | w2[c] << 16) & 0xFF_FFFF;
                pieces[3][c] = w2[c] >> 8;
            }
            for (p, piece) in pieces.iter().enumerate() {
                for h in 0..2 {
                    // Twelve bits: rows 8p + 4h .. 8p + 4h + 4.
                    let mut half = [0u16; LANES];
                    for (half, &piece) in half.iter_mut().zip(piece) {
                        *half = (piece >> (12 * h)) as u16 & 0xFFF;
                    }
                    for q in 0..2 {
                        let mut pair = [0u8; LANES];
                        for (pair, &half) in pair.iter_mut().zip(&half) {
                            *pair = (half >> (6 * q)) as u8 & 63;
                        }
                        let row = 8 * p + 4 * h + 2 * q;
                        for (code, two) in rows[row].iter_mut().zip(pair) {
                            *code = two & 7;
                        }
                        for (code, two) in rows[row + 1].iter_mut().zip(pair) {
                            *code = two >> 3;
                        }
                    }
                }
            }
        }
    }
}

impl GptqLayer {
    /// Checks every tensor's shape against the format; returns the stored (padded) K and N.
    pub fn check_shapes(&self) -> Result<(usize, usize)> {
        if self.group_size == 0 {
            return Err(FormatError::ZeroGroupSize);
        }
        let bits = self.bits as usize;
        let k = self.g_idx.len();
        let n = self.scales.ncols();
        check_not_empty(k, n)?;
        let groups = k.div_ceil(self.group_size);
        let step = alignment(self.bits);
        check_aligned("GPTQ", "K (g_idx length)", k, step)?;
        check_aligned("GPTQ", "N (scales columns)", n, step)?;
        check_tensor_shapes(
            "GPTQ",
            [
                (
                    "qweight",
                    self.qweight.shape(),
                    [k * bits / 32, n],
                    format!("K = {k} rows of {bits}-bit codes packed along K, N = {n}"),
                ),
                (
                    "scales",
                    self.scales.shape(),
                    [groups, n],
                    format!(
                        "ceil(K / group size) = ceil({k} / {}) groups",
                        self.group_size
                    ),
                ),
                (
                    "qzeros",
                    self.qzeros.shape(),
                    [groups, n * bits / 32],
                    format!("{groups} groups of N = {n} {bits}-bit zero points packed along N"),
                ),
            ],
        )?;
        check_logical_shape("GPTQ", self.logical_shape, [k, n])?;
        Ok((k, n))
    }

    /// Bytes this layer's tensors take, by part, against its logical weights.
    pub fn storage(&self) -> Cost {
        let [k, n] = self.logical_shape;
        Cost {
            elements: k * n,
            code_bytes: 4 * self.qweight.len(),
            scale_bytes: 2 * self.scales.len(),
            zero_point_bytes: 4 * self.qzeros.len(),
            g_idx_bytes: 4 * self.g_idx.len(),
            extra_bytes: 0,
        }
    }
}

fn check_bits(bits: u32) -> Result<()> {
    if GPTQ_BITS.contains(&bits) {
        Ok(())
    } else {
        Err(FormatError::UnsupportedBits {
            format: "GPTQ",
            bits,
            supported: "2-, 3-, 4- or 8-bit",
        })
    }
}

fn max_code(bits: u32) -> u8 {
    ((1u32 << bits) - 1) as u8
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The straightforward implementation, kept as the oracle the fast [`pack`] and [`unpack`]
/// are tested against bit for bit: it pads the whole matrix, then packs column by column
/// through `bitpack`'s word streams (qzeros through transposes). Slow; not for production use.
pub mod reference {
    use ndarray::{Array2, Axis};

    use super::{GptqLayer, ZeroConvention, alignment, check_bits};
    use crate::error::{FormatError, Result};
    use crate::logical::LogicalWeights;
    use bitpack::{Bits, stream as bits};

    /// Packs a logical matrix into GPTQ tensors, padding K and N with zero weights.
    pub fn pack(weights: &LogicalWeights, convention: ZeroConvention) -> Result<GptqLayer> {
        let bits = weights.bits();
        check_bits(bits)?;
        let logical_shape = [weights.k(), weights.n()];
        let step = alignment(bits);
        let padded = weights.padded(step, step);
        let qweight = pack_columns(padded.codes(), bits)?;
        let mut stored_zeros = padded.zeros().clone();
        for ((group, col), zero) in stored_zeros.indexed_iter_mut() {
            *zero = convention.store(*zero, bits, group, col)?;
        }
        let qzeros = transposed(&pack_columns(&transposed(&stored_zeros), bits)?);
        Ok(GptqLayer {
            bits,
            group_size: padded.group_size(),
            convention,
            qweight,
            qzeros,
            scales: padded.scales().clone(),
            g_idx: padded.g_idx().iter().map(|&g| g as i32).collect(),
            logical_shape,
        })
    }

    /// Unpacks GPTQ tensors into the logical matrix, cropped to the logical shape, after checking
    /// every shape against the format.
    pub fn unpack(layer: &GptqLayer) -> Result<LogicalWeights> {
        let bits = layer.bits;
        check_bits(bits)?;
        let (stored_k, stored_n) = layer.check_shapes()?;
        let codes = unpack_columns(&layer.qweight, bits, stored_k)?;
        let mut zeros = transposed(&unpack_columns(&transposed(&layer.qzeros), bits, stored_n)?);
        for ((group, col), zero) in zeros.indexed_iter_mut() {
            *zero = layer.convention.read(*zero, bits, group, col)?;
        }
        let g_idx = layer
            .g_idx
            .iter()
            .enumerate()
            .map(|(row, &group)| {
                u32::try_from(group).map_err(|_| FormatError::NegativeGroupIndex { row, group })
            })
            .collect::<Result<Vec<u32>>>()?;
        let stored = LogicalWeights::new(
            bits,
            layer.group_size,
            codes,
            layer.scales.clone(),
            zeros,
            g_idx,
        )?;
        let [k, n] = layer.logical_shape;
        stored.cropped(k, n)
    }

    /// A row-major copy of the transpose.
    fn transposed<T: Clone>(a: &Array2<T>) -> Array2<T> {
        a.t().as_standard_layout().into_owned()
    }

    /// Packs each column of `values` [rows, cols] into its own word stream: [rows*b/32, cols].
    fn pack_columns(values: &Array2<u8>, bits: u32) -> Result<Array2<i32>> {
        let width = Bits::new(bits)?;
        let rows = values.nrows() * bits as usize / 32;
        let mut packed = Array2::<i32>::zeros((rows, values.ncols()));
        for (column, mut out) in values.axis_iter(Axis(1)).zip(packed.axis_iter_mut(Axis(1))) {
            let stream = bits::pack_i32_words(width, &column.to_vec())?;
            out.assign(&ndarray::ArrayView1::from(&stream));
        }
        Ok(packed)
    }

    /// Unpacks each column of `packed` [rows*b/32, cols] into `rows` values: [rows, cols].
    fn unpack_columns(packed: &Array2<i32>, bits: u32, rows: usize) -> Result<Array2<u8>> {
        let width = Bits::new(bits)?;
        let mut values = Array2::<u8>::zeros((rows, packed.ncols()));
        for (column, mut out) in packed.axis_iter(Axis(1)).zip(values.axis_iter_mut(Axis(1))) {
            let stream = bits::unpack_i32_words(width, &column.to_vec(), rows)?;
            out.assign(&ndarray::ArrayView1::from(&stream));
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpw::{Container, FloatDtype, Format, ZeroPoints};
    use ndarray::array;

    fn ramp(bits: u32, k: usize, n: usize, group_size: usize) -> LogicalWeights {
        let max = (1usize << bits) - 1;
        let groups = k.div_ceil(group_size);
        LogicalWeights::with_sequential_groups(
            bits,
            group_size,
            Array2::from_shape_fn((k, n), |(r, c)| ((r * 7 + c * 3) % (max + 1)) as u8),
            Array2::from_elem((groups, n), f16::from_f32(0.5)),
            Array2::from_shape_fn((groups, n), |(g, c)| (1 + (g + c) % max) as u8),
        )
        .unwrap()
    }

    #[test]
    fn four_bit_row_8r_plus_j_sits_at_bits_4j() {
        // Every column holds rows 0..8 = codes 0..7: word 0 of each column is 0x76543210.
        let codes = Array2::from_shape_fn((8, 8), |(r, _)| r as u8);
        let w = LogicalWeights::with_sequential_groups(
            4,
            8,
            codes,
            Array2::from_elem((1, 8), f16::ONE),
            Array2::from_shape_fn((1, 8), |(_, n)| n as u8),
        )
        .unwrap();
        let layer = pack(&w, ZeroConvention::V2).unwrap();
        assert_eq!(layer.qweight, array![[0x7654_3210; 8]]);
        // qzeros runs along N: column n at bits 4n.
        assert_eq!(layer.qzeros, array![[0x7654_3210]]);
    }

    #[test]
    fn v1_stores_zero_minus_one_and_v2_the_zero_itself() {
        let w = ramp(4, 8, 8, 8);
        let v1 = pack(&w, ZeroConvention::V1).unwrap();
        let v2 = pack(&w, ZeroConvention::V2).unwrap();
        assert_eq!(v1.qweight, v2.qweight);
        // zeros[0, c] = 1 + c: v2 fields 1..8, v1 fields 0..7.
        assert_eq!(v2.qzeros, array![[0x8765_4321u32 as i32]]);
        assert_eq!(v1.qzeros, array![[0x7654_3210]]);
        assert_eq!(unpack(&v1).unwrap(), w);
        assert_eq!(unpack(&v2).unwrap(), w);
    }

    #[test]
    fn reading_one_convention_as_the_other_shifts_every_zero_by_one() {
        let w = ramp(4, 8, 8, 8);
        let mut layer = pack(&w, ZeroConvention::V2).unwrap();
        layer.convention = ZeroConvention::V1;
        // Field 8 under v1 is zero 9, not 8: every weight moves by one step.
        let misread = unpack(&layer).unwrap();
        assert_eq!(misread.zeros()[[0, 7]], 9);
        assert_ne!(misread.dequantize(), w.dequantize());
    }

    #[test]
    fn v1_refuses_to_write_zero_point_0_and_to_read_a_wrapped_field() {
        let mut w = ramp(4, 8, 8, 8);
        let mut zeros = w.zeros().clone();
        zeros[[0, 3]] = 0;
        w = LogicalWeights::with_sequential_groups(
            4,
            8,
            w.codes().clone(),
            w.scales().clone(),
            zeros,
        )
        .unwrap();
        assert_eq!(
            pack(&w, ZeroConvention::V1),
            Err(FormatError::V1ZeroUnrepresentable {
                group: 0,
                col: 3,
                wrapped: 15,
                seen: 16
            })
        );
        let mut layer = pack(&w, ZeroConvention::V2).unwrap();
        layer.convention = ZeroConvention::V1;
        layer.qzeros[[0, 0]] = 0xF000;
        assert_eq!(
            unpack(&layer),
            Err(FormatError::V1ZeroFieldAmbiguous {
                group: 0,
                col: 3,
                field: 15,
                seen: 16,
                bits: 4
            })
        );
    }

    #[test]
    fn odd_sizes_are_padded_with_zero_weights_and_cropped_back() {
        let w = ramp(3, 45, 20, 16);
        let layer = pack(&w, ZeroConvention::V1).unwrap();
        // K 45 -> 64 (two 32-row column streams of 3 words), N 20 -> 32.
        assert_eq!(layer.qweight.dim(), (6, 32));
        assert_eq!(layer.scales.dim(), (4, 32));
        assert_eq!(layer.qzeros.dim(), (4, 3));
        assert_eq!(layer.logical_shape, [45, 20]);
        assert_eq!(unpack(&layer).unwrap(), w);
    }

    #[test]
    fn every_shape_the_format_implies_is_checked() {
        let layer = pack(&ramp(4, 64, 8, 16), ZeroConvention::V2).unwrap();
        let refused = |edit: &dyn Fn(&mut GptqLayer)| {
            let mut edited = layer.clone();
            edit(&mut edited);
            unpack(&edited).unwrap_err()
        };
        // Which tensor a shape mismatch names, with its shape and the expected one.
        let mismatch = |err: FormatError| match err {
            FormatError::ShapeMismatch {
                format: "GPTQ",
                tensor,
                found,
                expected,
                ..
            } => Some((tensor, found, expected)),
            _ => None,
        };
        // A wrong group size shows up as scales of the wrong height.
        assert_eq!(
            mismatch(refused(&|l| l.group_size = 32)),
            Some(("scales", vec![4, 8], vec![2, 8]))
        );
        assert_eq!(
            mismatch(refused(&|l| l.qweight = Array2::zeros((7, 8)))),
            Some(("qweight", vec![7, 8], vec![8, 8]))
        );
        assert_eq!(
            mismatch(refused(&|l| l.qzeros = Array2::zeros((4, 2)))),
            Some(("qzeros", vec![4, 2], vec![4, 1]))
        );
        assert_eq!(
            refused(&|l| l.g_idx.truncate(60)),
            FormatError::NotAligned {
                format: "GPTQ",
                what: "K (g_idx length)",
                found: 60,
                multiple: 8
            }
        );
        assert_eq!(
            refused(&|l| l.g_idx.clear()),
            FormatError::EmptyMatrix { rows: 0, cols: 8 }
        );
        assert_eq!(
            refused(&|l| l.logical_shape = [65, 8]),
            FormatError::LogicalShapeTooLarge {
                format: "GPTQ",
                logical: [65, 8],
                stored: [64, 8]
            }
        );
        assert_eq!(
            refused(&|l| l.g_idx[5] = -1),
            FormatError::NegativeGroupIndex { row: 5, group: -1 }
        );
        assert_eq!(
            refused(&|l| l.bits = 5),
            FormatError::UnsupportedBits {
                format: "GPTQ",
                bits: 5,
                supported: "2-, 3-, 4- or 8-bit"
            }
        );
    }

    #[test]
    fn storage_counts_every_tensor_and_agrees_with_the_bpw_model() {
        let layer = pack(&ramp(4, 128, 64, 32), ZeroConvention::V1).unwrap();
        let cost = layer.storage();
        assert_eq!(
            (cost.code_bytes, cost.metadata_bytes()),
            (4096, 128 + 512 + 512)
        );
        assert_eq!(cost.bits_per_element(), 5.125);
        // weights::bpw's model of GPTQ: one word stream per column, packed zeros, g_idx.
        let model = Format {
            zero_points: ZeroPoints::Packed,
            g_idx: true,
            container: Container::LineWords,
            ..Format::new(Bits::FOUR, 32, FloatDtype::F16)
        };
        assert_eq!(crate::bpw::cost(&model, 128, 64).unwrap(), cost);
    }
}
