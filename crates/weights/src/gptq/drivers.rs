//! The block drivers: how many columns each kernel call takes, the non-temporal stores for
//! large outputs, and the loops that run a [`Pack`] or [`Unpack`] over whole rows of columns.

// Columns per kernel call (the drivers' `L`), per width and direction, by measurement. The
// kernels work on fixed-size local arrays (no store can alias an input, no bounds checks), so
// their loops vectorize; the drivers copy blocks in and out.
pub(super) const PFOUR: usize = 32;
pub(super) const PEIGHT: usize = 32;
pub(super) const UTWO: usize = 64;
pub(super) const UTHREE: usize = 64;
pub(super) const UFOUR: usize = 32;
pub(super) const UEIGHT: usize = 32;

/// Packed outputs of this many bytes and more are written with non-temporal stores where
/// aligned (no read of the lines about to be overwritten; they would not stay cached anyway).
/// Unpacking does not stream: 8 to 32 code rows of partial lines measured three times slower,
/// and 4 rows of whole 64-byte lines (8 bits) no faster.
const STREAM_BYTES: usize = 8 << 20;

/// Whether an output of `bytes` is streamed (on x86-64, whose baseline SSE2 has the stores).
pub(super) fn streams(bytes: usize) -> bool {
    cfg!(all(target_arch = "x86_64", target_feature = "sse2")) && bytes >= STREAM_BYTES
}

/// Orders the non-temporal stores before whatever follows.
pub(super) fn store_fence() {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    // SAFETY: SSE2 is enabled for the whole build (x86-64's baseline).
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Copies `from` into `to` (of the same length); with `stream`, and `to` 16-byte aligned and
/// `from` whole 16-byte pieces, as non-temporal stores (the caller fences after the last).
#[inline(always)]
pub(super) fn put<T: Copy, const N: usize>(to: &mut [T], from: &[T; N], stream: bool) {
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

/// Packing one unit of the GPTQ stream: R rows of b-bit codes per column fill W words exactly.
pub(super) trait Pack<const R: usize, const W: usize> {
    /// Packs LANES columns of R rows into W words each.
    fn pack<const LANES: usize>(rows: &[&[u8; LANES]; R], words: &mut [[u32; LANES]; W]);
}

/// Unpacking one unit of the GPTQ stream.
pub(super) trait Unpack<const R: usize, const W: usize> {
    /// Unpacks LANES columns of W words into R rows of codes.
    fn unpack<const LANES: usize>(words: &[[u32; LANES]; W], rows: &mut [[u8; LANES]; R]);
}

/// Runs a packing kernel over all columns of R equally long rows, writing W word rows of the
/// same length; the last partial block goes through zero-filled copies.
#[inline(always)]
pub(super) fn pack_columns<const R: usize, const W: usize, K: Pack<R, W>, const LANES: usize>(
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
#[inline(always)]
pub(super) fn unpack_columns<
    const R: usize,
    const W: usize,
    K: Unpack<R, W>,
    const LANES: usize,
>(
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

/// [`pack_columns`] compiled for AVX2 where the CPU has it: the same source and integer
/// operations, so the same words, in 256-bit vectors (the baseline build's 128-bit ones packed
/// 2 and 3 bits, which went this way then, at a sixth to a third of memcpy on this project's
/// AMD machine).
pub(super) fn pack_columns_best<const R: usize, const W: usize, K: Pack<R, W>, const L: usize>(
    rows: &[&[u8]; R],
    outs: &mut [&mut [i32]; W],
    stream: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, as just checked.
        return unsafe { pack_columns_avx2::<R, W, K, L>(rows, outs, stream) };
    }
    pack_columns::<R, W, K, L>(rows, outs, stream)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn pack_columns_avx2<const R: usize, const W: usize, K: Pack<R, W>, const L: usize>(
    rows: &[&[u8]; R],
    outs: &mut [&mut [i32]; W],
    stream: bool,
) {
    pack_columns::<R, W, K, L>(rows, outs, stream)
}
