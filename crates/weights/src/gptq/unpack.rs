//! The fast unpacker: qweight and qzeros back into the logical matrix, decoding only the rows
//! and columns inside the logical shape.

use ndarray::Array2;

#[cfg(target_arch = "x86_64")]
use super::avx512;
use super::drivers::{UEIGHT, UFOUR, UTHREE, UTWO, Unpack, unpack_columns};
use super::kernels;
use super::{GptqLayer, ZeroConvention, check_bits, max_code};
use crate::error::{FormatError, Result};
use crate::logical::LogicalWeights;
use bitpack::{Bits, stream as bits};

/// Unpacks GPTQ tensors into the logical matrix, cropped to the logical shape, after checking
/// every shape against the format.
///
/// Decodes only the rows and columns inside the logical shape, straight into the cropped codes;
/// the result, and the error for a malformed layer, are those of
/// [`reference::unpack`](super::reference::unpack).
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
        2 => unpack_qweight_best::<_, _, kernels::Two, UTWO>(words, target),
        3 => unpack_three_best(words, target),
        4 => unpack_qweight_best::<_, _, kernels::Four, UFOUR>(words, target),
        _ => unpack_qweight_best::<_, _, kernels::Eight, UEIGHT>(words, target),
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

/// Where unpacking writes: the cropped codes [K, N] of a stored matrix N' columns wide.
struct RowTarget<'a> {
    codes: &'a mut [u8],
    k: usize,
    n: usize,
    stored_n: usize,
}

/// [`unpack_qweight`] compiled for AVX2 where the CPU has it: the same source and integer
/// operations, so the same codes, in 256-bit vectors (faster at 2, 4 and 8 bits on this
/// project's AMD machine; 3 bits, through 12-bit halves and 6-bit pairs, was not, and has a
/// kernel of its own: [`unpack_three_best`]).
fn unpack_qweight_best<const R: usize, const W: usize, K: Unpack<R, W>, const L: usize>(
    qweight: &[i32],
    target: RowTarget<'_>,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, as just checked.
        return unsafe { unpack_qweight_avx2::<R, W, K, L>(qweight, target) };
    }
    unpack_qweight(qweight, target, Blocks::<K, L>::new())
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn unpack_qweight_avx2<const R: usize, const W: usize, K: Unpack<R, W>, const L: usize>(
    qweight: &[i32],
    target: RowTarget<'_>,
) {
    unpack_qweight(qweight, target, Blocks::<K, L>::new())
}

/// 3 bits: AVX-512's kernel ([`avx512`]) where the CPU has F, BW and VBMI, over 64 columns at a
/// time (the rest of each unit, and every other CPU, in the baseline build's loop). In four runs
/// of `bench --only weights` alternating with the baseline loop, 3-bit unpack read 0.62-0.72x
/// memcpy against 0.46-0.52x (docs/speed.md).
fn unpack_three_best(qweight: &[i32], target: RowTarget<'_>) {
    #[cfg(target_arch = "x86_64")]
    if let Some(three) = ThreeAvx512::detect() {
        return unpack_qweight(qweight, target, three);
    }
    unpack_qweight(qweight, target, Blocks::<kernels::Three, UTHREE>::new())
}

/// How one unit's R code rows come from its W word rows (all of one length).
trait UnitDecoder<const R: usize, const W: usize>: Copy {
    fn decode(self, words: &[&[i32]; W], outs: &mut [&mut [u8]; R]);
}

/// The portable loop over kernel `K`, `L` columns at a time.
struct Blocks<K, const L: usize>(std::marker::PhantomData<K>);

impl<K, const L: usize> Blocks<K, L> {
    fn new() -> Self {
        Blocks(std::marker::PhantomData)
    }
}

impl<K, const L: usize> Clone for Blocks<K, L> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K, const L: usize> Copy for Blocks<K, L> {}

impl<const R: usize, const W: usize, K: Unpack<R, W>, const L: usize> UnitDecoder<R, W>
    for Blocks<K, L>
{
    #[inline(always)]
    fn decode(self, words: &[&[i32]; W], outs: &mut [&mut [u8]; R]) {
        unpack_columns::<R, W, K, L>(words, outs)
    }
}

/// [`avx512::unpack_three`] over a unit's whole blocks of 64 columns, the portable loop over the
/// rest; a value exists only where the CPU has what the kernel needs.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct ThreeAvx512 {
    _available: (),
}

#[cfg(target_arch = "x86_64")]
impl ThreeAvx512 {
    fn detect() -> Option<Self> {
        avx512::available().then_some(ThreeAvx512 { _available: () })
    }
}

#[cfg(target_arch = "x86_64")]
impl UnitDecoder<32, 3> for ThreeAvx512 {
    #[inline(always)]
    fn decode(self, words: &[&[i32]; 3], outs: &mut [&mut [u8]; 32]) {
        // SAFETY: `self` exists only where the CPU has AVX-512 F, BW and VBMI.
        let done = unsafe { avx512::unpack_three(words, outs) };
        if done < outs[0].len() {
            let words = words.map(|w| &w[done..]);
            let mut outs = outs.each_mut().map(|o| &mut o[done..]);
            Blocks::<kernels::Three, UTHREE>::new().decode(&words, &mut outs);
        }
    }
}

/// Decodes qweight [stored K * b/32, stored N] unit by unit into the cropped codes, each unit's
/// R code rows from its W word rows by `unit`.
#[inline(always)]
fn unpack_qweight<const R: usize, const W: usize>(
    qweight: &[i32],
    target: RowTarget<'_>,
    unit: impl UnitDecoder<R, W>,
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
        unit.decode(&word_rows(words, stored_n, n), &mut outs);
    }
    if !rest.is_empty() {
        // The last unit holds padded rows: decode it whole and keep the logical ones.
        let words = units.next().expect("a unit for the last rows");
        let mut scratch = vec![0u8; R * n];
        let mut rows = scratch.chunks_exact_mut(n);
        let mut outs: [&mut [u8]; R] = std::array::from_fn(|_| rows.next().expect("R rows"));
        unit.decode(&word_rows(words, stored_n, n), &mut outs);
        rest.copy_from_slice(&scratch[..rest.len()]);
    }
}
