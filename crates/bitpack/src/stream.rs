//! Dense b-bit code streams, for every width b from 1 to 8.
//!
//! Spec:
//! - Codes: unsigned integers 0..=2^b - 1, one per logical element. A public packer refuses a
//!   code that does not fit the width ([`BitsError::CodeTooWide`]); nothing is masked silently.
//! - Bit position: logical element i occupies bits [i*b, (i+1)*b) of the stream, least
//!   significant bit first. Bit p of the stream is bit p % 32 of 32-bit word p / 32, which is
//!   bit p % 8 of byte p / 8: the word stream read as little-endian bytes IS the byte stream.
//! - Straddling: when b does not divide 32 (3, 5, 6, 7 bits) an element may straddle two words
//!   (and two bytes); its low bits end the first word and its high bits start the next.
//! - Containers: `u32` words, padded with zero bits to whole words (`word_count`), or bytes,
//!   padded with zero bits to whole bytes (`byte_count`); bit positions are identical.
//!   Checkpoints often store the words as signed `i32`: [`unpack_i32_words`] reinterprets each
//!   word's bits, so the top slot's high bit is never sign-extended into the code.
//! - Length: the logical number of codes is recorded by the caller and passed to every
//!   unpacker; it is never inferred from the container's size (padding could pass for codes).
//!   An unpacker refuses a stream whose size is not exactly what that length needs, and ignores
//!   the padding bits.
//!
//! Every container has a plain reference implementation (`*_reference`: one value at a time,
//! the straddle branch spelled out, as in the bit-packing seed's `pack_bits` / `unpack_bits`),
//! which is the oracle, and fast kernels ([`imp::Kernel`]) that move 64 codes (exactly b u64
//! words) at a time, eight codes per u64 of byte lanes: portable shifts and masks, or on x86-64
//! with BMI2 one `pext` / `pdep` per eight codes, with non-temporal stores once the output is
//! large enough that ordinary stores would mostly wait on reading the lines they overwrite. The
//! public functions take the best kernel the CPU has (detected at run time); the `_into`
//! variants write into the caller's buffers, since the page faults of a fresh large output can
//! cost more than packing it. The word containers are packed as their little-endian bytes. The
//! tests hold every kernel the machine has to the oracle on patterned, random, ramp and
//! all-maximum codes at lengths that are not multiples of 8, 32 or 64, into dirty and misaligned
//! buffers.

use std::fmt;

use crate::error::{BitsError, Result};

/// Bits in one container word.
pub const WORD_BITS: usize = 32;

/// A code width from 1 to 8 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Bits(u32);

impl Bits {
    /// 1-bit codes.
    pub const ONE: Bits = Bits(1);
    /// 2-bit codes.
    pub const TWO: Bits = Bits(2);
    /// 4-bit codes (two to a byte: the nibble order).
    pub const FOUR: Bits = Bits(4);
    /// 8-bit codes (one per byte).
    pub const EIGHT: Bits = Bits(8);

    /// Every width a stream can hold, narrowest first.
    pub const ALL: [Bits; 8] = [
        Bits(1),
        Bits(2),
        Bits(3),
        Bits(4),
        Bits(5),
        Bits(6),
        Bits(7),
        Bits(8),
    ];

    /// A width of `bits` bits, 1 to 8.
    pub fn new(bits: u32) -> Result<Self> {
        match bits {
            1..=8 => Ok(Bits(bits)),
            other => Err(BitsError::UnsupportedBits { bits: other }),
        }
    }

    /// The width in bits.
    pub fn get(self) -> u32 {
        self.0
    }

    /// Largest code the width holds: 2^b - 1.
    pub fn max_code(self) -> u8 {
        ((1u16 << self.0) - 1) as u8
    }

    /// Largest symmetric code magnitude: 2^(b-1) - 1 (0 at 1 bit, 7 at 4 bits, 127 at 8 bits).
    pub fn qmax(self) -> u8 {
        ((1u16 << (self.0 - 1)) - 1) as u8
    }

    /// Bytes that hold `len` codes (zero-padded to a whole byte).
    pub fn byte_count(self, len: usize) -> usize {
        (len * self.0 as usize).div_ceil(8)
    }

    /// Words that hold `len` codes (zero-padded to a whole word).
    pub fn word_count(self, len: usize) -> usize {
        (len * self.0 as usize).div_ceil(WORD_BITS)
    }
}

impl fmt::Display for Bits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-bit", self.0)
    }
}

// ---------------------------------------------------------------------------------------------
// The oracle: one value at a time.

/// Reference word packer: code i is ORed in at bit offset (i*b) % 32 of word (i*b) / 32, and its
/// high bits go to the next word when it straddles.
pub fn pack_words_reference(bits: Bits, codes: &[u8]) -> Result<Vec<u32>> {
    check_codes(bits, codes)?;
    let b = bits.get() as usize;
    let mut words = vec![0u32; bits.word_count(codes.len())];
    for (i, &code) in codes.iter().enumerate() {
        let (word, offset) = ((i * b) / WORD_BITS, (i * b) % WORD_BITS);
        words[word] |= u32::from(code) << offset;
        if offset + b > WORD_BITS {
            // The value straddles two words: its high bits start the next one.
            words[word + 1] |= u32::from(code) >> (WORD_BITS - offset);
        }
    }
    Ok(words)
}

/// Reference word unpacker: reads `len` codes, stitching the straddling ones.
pub fn unpack_words_reference(bits: Bits, words: &[u32], len: usize) -> Result<Vec<u8>> {
    check_stream_size(bits, len, words.len(), bits.word_count(len), "words")?;
    let b = bits.get() as usize;
    let mask = u32::from(bits.max_code());
    let codes = (0..len)
        .map(|i| {
            let (word, offset) = ((i * b) / WORD_BITS, (i * b) % WORD_BITS);
            let mut value = words[word] >> offset;
            if offset + b > WORD_BITS {
                value |= words[word + 1] << (WORD_BITS - offset);
            }
            (value & mask) as u8
        })
        .collect();
    Ok(codes)
}

/// Reference byte packer: the reference word stream, viewed as little-endian bytes and cut to
/// whole bytes. That the fast byte packer agrees with it is the spec's claim that both
/// containers put every bit in the same place.
pub fn pack_bytes_reference(bits: Bits, codes: &[u8]) -> Result<Vec<u8>> {
    let mut bytes = words_to_bytes(&pack_words_reference(bits, codes)?);
    bytes.truncate(bits.byte_count(codes.len()));
    Ok(bytes)
}

/// Reference byte unpacker: the bytes regrouped into little-endian words, zero-padded to a
/// whole word, read by the reference word unpacker.
pub fn unpack_bytes_reference(bits: Bits, bytes: &[u8], len: usize) -> Result<Vec<u8>> {
    check_stream_size(bits, len, bytes.len(), bits.byte_count(len), "bytes")?;
    let mut padded = bytes.to_vec();
    padded.resize(4 * bits.word_count(len), 0);
    unpack_words_reference(bits, &bytes_to_words(&padded), len)
}

// ---------------------------------------------------------------------------------------------
// The public packers: checked, then run on the best kernel this CPU has.

/// Calls `$function::<B>(args)` with the width as a constant, so each width gets its own
/// straight-line shifts and masks.
macro_rules! with_width {
    ($bits:expr, $function:ident, $($arg:expr),*) => {
        match $bits.get() {
            1 => $function::<1>($($arg),*),
            2 => $function::<2>($($arg),*),
            3 => $function::<3>($($arg),*),
            4 => $function::<4>($($arg),*),
            5 => $function::<5>($($arg),*),
            6 => $function::<6>($($arg),*),
            7 => $function::<7>($($arg),*),
            8 => $function::<8>($($arg),*),
            _ => unreachable!("Bits holds 1 to 8"),
        }
    };
}

/// Packs codes (each <= `bits.max_code()`) into `bits.byte_count(codes.len())` bytes.
pub fn pack_bytes(bits: Bits, codes: &[u8]) -> Result<Vec<u8>> {
    let mut bytes = vec![0u8; bits.byte_count(codes.len())];
    pack_bytes_into(bits, codes, &mut bytes)?;
    Ok(bytes)
}

/// Unpacks `len` codes from exactly `bits.byte_count(len)` bytes.
pub fn unpack_bytes(bits: Bits, bytes: &[u8], len: usize) -> Result<Vec<u8>> {
    check_stream_size(bits, len, bytes.len(), bits.byte_count(len), "bytes")?;
    let mut codes = vec![0u8; len];
    unpack_bytes_into(bits, bytes, &mut codes)?;
    Ok(codes)
}

/// Packs codes (each <= `bits.max_code()`) into `bits.word_count(codes.len())` words.
pub fn pack_words(bits: Bits, codes: &[u8]) -> Result<Vec<u32>> {
    let mut words = vec![0u32; bits.word_count(codes.len())];
    pack_words_into(bits, codes, &mut words)?;
    Ok(words)
}

/// Unpacks `len` codes from exactly `bits.word_count(len)` words.
pub fn unpack_words(bits: Bits, words: &[u32], len: usize) -> Result<Vec<u8>> {
    check_stream_size(bits, len, words.len(), bits.word_count(len), "words")?;
    let mut codes = vec![0u8; len];
    unpack_words_into(bits, words, &mut codes)?;
    Ok(codes)
}

/// Packs codes into words and labels them signed, as checkpoints store them. The bits are
/// unchanged: eight 4-bit codes of 15 are the word 0xFFFF_FFFF, stored as -1.
pub fn pack_i32_words(bits: Bits, codes: &[u8]) -> Result<Vec<i32>> {
    let mut words = vec![0i32; bits.word_count(codes.len())];
    pack_i32_words_into(bits, codes, &mut words)?;
    Ok(words)
}

/// Unpacks `len` codes from words stored as signed `i32`. Each word's bits are reinterpreted
/// as `u32` before any shift, so a set top bit stays a code bit instead of being copied into
/// the high bits by an arithmetic shift.
pub fn unpack_i32_words(bits: Bits, words: &[i32], len: usize) -> Result<Vec<u8>> {
    check_stream_size(bits, len, words.len(), bits.word_count(len), "words")?;
    let mut codes = vec![0u8; len];
    unpack_i32_words_into(bits, words, &mut codes)?;
    Ok(codes)
}

/// [`pack_bytes`] into a caller's buffer of exactly `bits.byte_count(codes.len())` bytes, every
/// one of which is written (padding bits zero). Reusing a buffer saves the page faults of a
/// fresh allocation, which on large streams cost more than the packing. On a refused code the
/// buffer holds unspecified bytes.
pub fn pack_bytes_into(bits: Bits, codes: &[u8], bytes: &mut [u8]) -> Result<()> {
    imp::pack_bytes_into(Kernel::best_for(bytes.len()), bits, codes, bytes)
}

/// [`unpack_bytes`] into a caller's buffer: `codes.len()` is the recorded length, and `bytes`
/// must be exactly `bits.byte_count(codes.len())` long.
pub fn unpack_bytes_into(bits: Bits, bytes: &[u8], codes: &mut [u8]) -> Result<()> {
    imp::unpack_bytes_into(Kernel::best_for(codes.len()), bits, bytes, codes)
}

/// [`pack_words`] into a caller's buffer of exactly `bits.word_count(codes.len())` words, every
/// one of which is written (padding bits zero). On a refused code the buffer holds unspecified
/// words.
pub fn pack_words_into(bits: Bits, codes: &[u8], words: &mut [u32]) -> Result<()> {
    imp::pack_words_into(Kernel::best_for(4 * words.len()), bits, codes, words)
}

/// [`unpack_words`] into a caller's buffer: `codes.len()` is the recorded length, and `words`
/// must be exactly `bits.word_count(codes.len())` long.
pub fn unpack_words_into(bits: Bits, words: &[u32], codes: &mut [u8]) -> Result<()> {
    imp::unpack_words_into(Kernel::best_for(codes.len()), bits, words, codes)
}

/// [`pack_i32_words`] into a caller's buffer, as [`pack_words_into`].
pub fn pack_i32_words_into(bits: Bits, codes: &[u8], words: &mut [i32]) -> Result<()> {
    imp::pack_words_into(Kernel::best_for(4 * words.len()), bits, codes, words)
}

/// [`unpack_i32_words`] into a caller's buffer, as [`unpack_words_into`].
pub fn unpack_i32_words_into(bits: Bits, words: &[i32], codes: &mut [u8]) -> Result<()> {
    imp::unpack_words_into(Kernel::best_for(codes.len()), bits, words, codes)
}

/// Lays words out as the little-endian byte stream they hold.
pub fn words_to_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|word| word.to_le_bytes()).collect()
}

/// Groups a byte stream (a whole number of words long) into little-endian words.
fn bytes_to_words(bytes: &[u8]) -> Vec<u32> {
    debug_assert_eq!(bytes.len() % 4, 0);
    bytes
        .chunks_exact(4)
        .map(|word| u32::from_le_bytes([word[0], word[1], word[2], word[3]]))
        .collect()
}

pub use imp::Kernel;

/// Every implementation of the packers by name, for the differential tests and benchmarks: the
/// public functions are these with [`Kernel::best_for`] their output's size. Not a stable
/// interface.
#[doc(hidden)]
pub mod imp {
    use super::*;

    /// One implementation of the stream kernels.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum Kernel {
        /// Shifts and masks on u64 lanes in safe Rust, for any target.
        Portable,
        /// x86-64 with BMI2: `pext` squeezes a group of eight codes and `pdep` spreads it, one
        /// instruction each.
        #[cfg(target_arch = "x86_64")]
        Bmi2,
        /// [`Kernel::Bmi2`] writing its output with non-temporal stores (when the output is
        /// 8-aligned): a large output then costs no read-for-ownership of lines it overwrites
        /// whole, but ends up out of cache.
        #[cfg(target_arch = "x86_64")]
        Bmi2Stream,
    }

    /// Outputs from this size on are written with non-temporal stores where the CPU has them:
    /// far beyond the private caches (L2 is 2 MiB a core here), where the reader would miss
    /// anyway and the read-for-ownership traffic of ordinary stores is the bottleneck.
    pub const STREAM_MIN_BYTES: usize = 8 << 20;

    impl Kernel {
        /// The kernels this CPU can run, [`Kernel::Portable`] first.
        pub fn available() -> Vec<Kernel> {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("bmi2") {
                return vec![Kernel::Portable, Kernel::Bmi2, Kernel::Bmi2Stream];
            }
            vec![Kernel::Portable]
        }

        /// The fastest kernel this CPU has for an output of `bytes` bytes (the feature
        /// detection is cached by std).
        pub fn best_for(bytes: usize) -> Kernel {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("bmi2") {
                return if bytes >= STREAM_MIN_BYTES {
                    Kernel::Bmi2Stream
                } else {
                    Kernel::Bmi2
                };
            }
            let _ = bytes;
            Kernel::Portable
        }
    }

    /// [`super::pack_bytes_into`] on a chosen kernel.
    pub fn pack_bytes_into(
        kernel: Kernel,
        bits: Bits,
        codes: &[u8],
        bytes: &mut [u8],
    ) -> Result<()> {
        check_stream_size(
            bits,
            codes.len(),
            bytes.len(),
            bits.byte_count(codes.len()),
            "bytes",
        )?;
        let seen = pack(kernel, bits, codes, bytes);
        check_seen(bits, codes, seen)
    }

    /// [`super::unpack_bytes_into`] on a chosen kernel.
    pub fn unpack_bytes_into(
        kernel: Kernel,
        bits: Bits,
        bytes: &[u8],
        codes: &mut [u8],
    ) -> Result<()> {
        check_stream_size(
            bits,
            codes.len(),
            bytes.len(),
            bits.byte_count(codes.len()),
            "bytes",
        )?;
        unpack(kernel, bits, bytes, codes);
        Ok(())
    }

    /// [`super::pack_words_into`] (and the i32 variant) on a chosen kernel.
    pub fn pack_words_into<W: Word>(
        kernel: Kernel,
        bits: Bits,
        codes: &[u8],
        words: &mut [W],
    ) -> Result<()> {
        check_stream_size(
            bits,
            codes.len(),
            words.len(),
            bits.word_count(codes.len()),
            "words",
        )?;
        let used = bits.byte_count(codes.len());
        let (stream, padding) = as_bytes_mut(words).split_at_mut(used);
        let seen = pack(kernel, bits, codes, stream);
        padding.fill(0);
        // The bytes are the little-endian stream; a big-endian CPU reads its words swapped.
        #[cfg(target_endian = "big")]
        words
            .iter_mut()
            .for_each(|word| *word = word.le_to_native());
        check_seen(bits, codes, seen)
    }

    /// [`super::unpack_words_into`] (and the i32 variant) on a chosen kernel.
    pub fn unpack_words_into<W: Word>(
        kernel: Kernel,
        bits: Bits,
        words: &[W],
        codes: &mut [u8],
    ) -> Result<()> {
        check_stream_size(
            bits,
            codes.len(),
            words.len(),
            bits.word_count(codes.len()),
            "words",
        )?;
        #[cfg(target_endian = "little")]
        let bytes = as_bytes(words);
        #[cfg(target_endian = "big")]
        let owned: Vec<u8> = words.iter().flat_map(|word| word.to_le_bytes()).collect();
        #[cfg(target_endian = "big")]
        let bytes = &owned[..];
        unpack(kernel, bits, &bytes[..bits.byte_count(codes.len())], codes);
        Ok(())
    }

    /// A 32-bit container word: `u32`, or `i32` as checkpoints store it.
    pub trait Word: Copy + sealed::Sealed {
        /// The word whose little-endian bytes are this word's bytes in memory.
        fn le_to_native(self) -> Self;
        /// The word's little-endian bytes.
        fn to_le_bytes(self) -> [u8; 4];
    }

    impl Word for u32 {
        fn le_to_native(self) -> Self {
            u32::from_le(self)
        }
        fn to_le_bytes(self) -> [u8; 4] {
            u32::to_le_bytes(self)
        }
    }

    impl Word for i32 {
        fn le_to_native(self) -> Self {
            i32::from_le(self)
        }
        fn to_le_bytes(self) -> [u8; 4] {
            i32::to_le_bytes(self)
        }
    }

    mod sealed {
        pub trait Sealed {}
        impl Sealed for u32 {}
        impl Sealed for i32 {}
    }

    /// The words' memory as bytes.
    #[cfg(target_endian = "little")]
    fn as_bytes<W: Word>(words: &[W]) -> &[u8] {
        // SAFETY: `Word` is sealed to u32 and i32, four bytes with no padding, so the memory of
        // `words` is `4 * words.len()` initialised bytes; u8 needs no alignment; the returned
        // slice borrows `words` for its whole lifetime.
        unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), 4 * words.len()) }
    }

    /// The words' memory as bytes, writable.
    fn as_bytes_mut<W: Word>(words: &mut [W]) -> &mut [u8] {
        // SAFETY: as in `as_bytes`; besides, every byte pattern is a valid u32 and i32, so any
        // bytes written through the view leave valid words, and the view borrows `words`
        // exclusively for its lifetime.
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), 4 * words.len()) }
    }

    /// Packs with `kernel`; `out` is exactly `bits.byte_count(codes.len())` bytes. Returns the
    /// OR of every code, so the width check costs no second pass over the codes.
    fn pack(kernel: Kernel, bits: Bits, codes: &[u8], out: &mut [u8]) -> u64 {
        match kernel {
            Kernel::Portable => with_width!(bits, pack_portable, codes, out),
            #[cfg(target_arch = "x86_64")]
            Kernel::Bmi2 => {
                assert!(
                    std::arch::is_x86_feature_detected!("bmi2"),
                    "this CPU has no BMI2"
                );
                // SAFETY: the CPU has BMI2, checked just above.
                unsafe { with_width!(bits, pack_bmi2, codes, out) }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Bmi2Stream => {
                assert!(
                    std::arch::is_x86_feature_detected!("bmi2"),
                    "this CPU has no BMI2"
                );
                // SAFETY: the CPU has BMI2, checked just above.
                unsafe { with_width!(bits, pack_bmi2_stream, codes, out) }
            }
        }
    }

    /// Unpacks `codes.len()` codes from exactly `bits.byte_count(codes.len())` bytes.
    fn unpack(kernel: Kernel, bits: Bits, bytes: &[u8], codes: &mut [u8]) {
        match kernel {
            Kernel::Portable => with_width!(bits, unpack_portable, bytes, codes),
            #[cfg(target_arch = "x86_64")]
            Kernel::Bmi2 => {
                assert!(
                    std::arch::is_x86_feature_detected!("bmi2"),
                    "this CPU has no BMI2"
                );
                // SAFETY: the CPU has BMI2, checked just above.
                unsafe { with_width!(bits, unpack_bmi2, bytes, codes) }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Bmi2Stream => {
                assert!(
                    std::arch::is_x86_feature_detected!("bmi2"),
                    "this CPU has no BMI2"
                );
                // SAFETY: the CPU has BMI2, checked just above.
                unsafe { with_width!(bits, unpack_bmi2_stream, bytes, codes) }
            }
        }
    }

    /// Refuses the first too-wide code when the OR of all of them has a bit outside the width.
    fn check_seen(bits: Bits, codes: &[u8], seen: u64) -> Result<()> {
        if seen & !lane_mask(bits.get()) == 0 {
            Ok(())
        } else {
            check_codes(bits, codes)
        }
    }

    fn pack_portable<const B: u32>(codes: &[u8], out: &mut [u8]) -> u64 {
        if B == 8 {
            // Every byte is an 8-bit code, and the stream is the codes.
            out.copy_from_slice(codes);
            return 0;
        }
        pack_with::<B>(codes, out, squeeze::<B>, store_le)
    }

    fn unpack_portable<const B: u32>(bytes: &[u8], codes: &mut [u8]) {
        if B == 8 {
            codes.copy_from_slice(bytes);
            return;
        }
        unpack_with::<B>(bytes, codes, spread::<B>, store_le)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "bmi2")]
    fn pack_bmi2<const B: u32>(codes: &[u8], out: &mut [u8]) -> u64 {
        use std::arch::x86_64::_pext_u64;
        if B == 8 {
            out.copy_from_slice(codes);
            return 0;
        }
        pack_with::<B>(codes, out, |lanes| _pext_u64(lanes, lane_mask(B)), store_le)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "bmi2")]
    fn unpack_bmi2<const B: u32>(bytes: &[u8], codes: &mut [u8]) {
        use std::arch::x86_64::_pdep_u64;
        if B == 8 {
            codes.copy_from_slice(bytes);
            return;
        }
        unpack_with::<B>(
            bytes,
            codes,
            |packed| _pdep_u64(packed, lane_mask(B)),
            store_le,
        )
    }

    /// Writes 8 bytes with a non-temporal store. The caller guarantees that `slot` is 8 bytes
    /// at an 8-aligned address, and fences with `_mm_sfence` before the output is read.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn store_streaming(slot: &mut [u8], value: u64) {
        use std::arch::x86_64::_mm_stream_si64;
        debug_assert!(slot.len() == 8 && slot.as_ptr().addr().is_multiple_of(8));
        // SAFETY: the callers pass 8-byte slots at multiples of 8 from the start of an output
        // they checked is 8-aligned, so the pointer is valid, writable and aligned for an i64
        // (x86-64 stores little-endian, as the stream is laid out).
        unsafe { _mm_stream_si64(slot.as_mut_ptr().cast::<i64>(), value as i64) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "bmi2,sse2")]
    fn pack_bmi2_stream<const B: u32>(codes: &[u8], out: &mut [u8]) -> u64 {
        use std::arch::x86_64::_pext_u64;
        if !out.as_ptr().addr().is_multiple_of(8) {
            return pack_bmi2::<B>(codes, out);
        }
        let squeeze = |lanes| {
            if B == 8 {
                lanes
            } else {
                _pext_u64(lanes, lane_mask(B))
            }
        };
        let seen = pack_with::<B>(codes, out, squeeze, store_streaming);
        // Non-temporal stores are weakly ordered: fence them before the output is read.
        sfence();
        seen
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "bmi2,sse2")]
    fn unpack_bmi2_stream<const B: u32>(bytes: &[u8], codes: &mut [u8]) {
        use std::arch::x86_64::_pdep_u64;
        if !codes.as_ptr().addr().is_multiple_of(8) {
            return unpack_bmi2::<B>(bytes, codes);
        }
        let spread = |packed| {
            if B == 8 {
                packed
            } else {
                _pdep_u64(packed, lane_mask(B))
            }
        };
        unpack_with::<B>(bytes, codes, spread, store_streaming);
        sfence();
    }

    /// `_mm_sfence`: a safe call inside an sse2 function for newer compilers (1.95 here), an
    /// unsafe one for Rust 1.89, the workspace's rust-version; the block serves both.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "sse2")]
    #[allow(unused_unsafe)]
    fn sfence() {
        // SAFETY: sse2 is enabled here, and every x86_64 CPU has it.
        unsafe { std::arch::x86_64::_mm_sfence() }
    }
}

/// Codes per block of the fast path: 64 codes are exactly B u64 words, so every block starts
/// on a word boundary and its bit offsets are constants.
const BLOCK: usize = 64;

/// The low B bits of every byte lane: where a group of eight codes may have set bits.
const fn lane_mask(bits: u32) -> u64 {
    low_bits(bits) * 0x0101_0101_0101_0101
}

/// Writes a u64 as 8 little-endian bytes into an 8-byte slot of the output.
fn store_le(slot: &mut [u8], value: u64) {
    slot.copy_from_slice(&value.to_le_bytes());
}

/// Packs whole blocks of 64 codes into B words each, then the rest eight codes at a time;
/// writes every byte of `out` (`byte_count(codes.len())` long). `squeeze` maps eight codes in
/// byte lanes to their 8B packed bits; `store` writes each whole block's words, 8 bytes at
/// offsets that are multiples of 8 from `out`'s start. Returns the OR of all codes.
#[inline(always)]
fn pack_with<const B: u32>(
    codes: &[u8],
    out: &mut [u8],
    squeeze: impl Fn(u64) -> u64,
    mut store: impl FnMut(&mut [u8], u64),
) -> u64 {
    let b = B as usize;
    let whole = codes.len() / BLOCK;
    let (block_codes, rest_codes) = codes.split_at(whole * BLOCK);
    let (block_out, rest_out) = out.split_at_mut(whole * 8 * b);
    let mut seen = 0u64;
    for (group, slot) in block_codes
        .chunks_exact(BLOCK)
        .zip(block_out.chunks_exact_mut(8 * b))
    {
        let mut words = [0u64; 8];
        for k in 0..8 {
            let lanes = u64::from_le_bytes(group[8 * k..8 * k + 8].try_into().expect("8 bytes"));
            seen |= lanes;
            let packed = squeeze(lanes);
            // Constant after unrolling: group k starts at bit 8Bk of the block.
            let (word, shift) = (8 * b * k / 64, 8 * b * k % 64);
            words[word] |= packed << shift;
            if shift + 8 * b > 64 {
                words[word + 1] |= packed >> (64 - shift);
            }
        }
        for (bytes, word) in slot.chunks_exact_mut(8).zip(words) {
            store(bytes, word);
        }
    }
    for (group, start) in rest_codes.chunks(8).zip((0..).step_by(b)) {
        let mut lanes = [0u8; 8];
        lanes[..group.len()].copy_from_slice(group);
        let lanes = u64::from_le_bytes(lanes);
        seen |= lanes;
        // A partial last group's empty lanes are zero, so are its padding bits.
        let packed = squeeze(lanes).to_le_bytes();
        let end = (start + b).min(rest_out.len());
        rest_out[start..end].copy_from_slice(&packed[..end - start]);
    }
    seen
}

/// Unpacks `codes.len()` codes from `byte_count(codes.len())` bytes: whole blocks of B words,
/// then eight codes at a time. `spread` maps 8B packed bits (ignoring any above) to eight
/// byte lanes; `store` writes each whole block's codes, 8 bytes at offsets that are multiples
/// of 8 from `codes`' start.
#[inline(always)]
fn unpack_with<const B: u32>(
    bytes: &[u8],
    codes: &mut [u8],
    spread: impl Fn(u64) -> u64,
    mut store: impl FnMut(&mut [u8], u64),
) {
    let b = B as usize;
    let whole = codes.len() / BLOCK;
    let (block_codes, rest_codes) = codes.split_at_mut(whole * BLOCK);
    let (block_bytes, rest_bytes) = bytes.split_at(whole * 8 * b);
    for (slot, group) in block_codes
        .chunks_exact_mut(BLOCK)
        .zip(block_bytes.chunks_exact(8 * b))
    {
        let mut words = [0u64; 8];
        for (word, bytes) in words.iter_mut().zip(group.chunks_exact(8)) {
            *word = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
        }
        for (k, lanes) in slot.chunks_exact_mut(8).enumerate() {
            let (word, shift) = (8 * b * k / 64, 8 * b * k % 64);
            let mut packed = words[word] >> shift;
            if shift + 8 * b > 64 {
                packed |= words[word + 1] << (64 - shift);
            }
            store(lanes, spread(packed));
        }
    }
    for (group, start) in rest_codes.chunks_mut(8).zip((0..).step_by(b)) {
        let lanes = spread(read_le(&rest_bytes[start.min(rest_bytes.len())..])).to_le_bytes();
        group.copy_from_slice(&lanes[..group.len()]);
    }
}

/// Up to 8 bytes as a little-endian u64, zero-filled.
fn read_le(bytes: &[u8]) -> u64 {
    let mut buffer = [0u8; 8];
    let n = bytes.len().min(8);
    buffer[..n].copy_from_slice(&bytes[..n]);
    u64::from_le_bytes(buffer)
}

/// Ones in the low `n` bits of a u64 (`n` <= 32 here).
const fn low_bits(n: u32) -> u64 {
    (1u64 << n) - 1
}

/// Eight codes, one per byte lane (code k in bits 8k..8k+B, every lane < 2^B), moved to bits
/// kB..(k+1)B: neighbouring lanes are merged in three halving steps (bytes into 16-bit lanes
/// of 2B bits, those into 32-bit lanes of 4B bits, those into 8B bits).
#[inline(always)]
fn squeeze<const B: u32>(lanes: u64) -> u64 {
    let v = lanes;
    let v = (v & 0x00FF_00FF_00FF_00FF) | ((v & 0xFF00_FF00_FF00_FF00) >> (8 - B));
    let v = (v & 0x0000_FFFF_0000_FFFF) | ((v & 0xFFFF_0000_FFFF_0000) >> (16 - 2 * B));
    (v & 0x0000_0000_FFFF_FFFF) | ((v & 0xFFFF_FFFF_0000_0000) >> (32 - 4 * B))
}

/// The inverse of [`squeeze`]: 8B packed bits (anything above them is ignored) spread to one
/// code per byte lane, each masked to B bits.
#[inline(always)]
fn spread<const B: u32>(packed: u64) -> u64 {
    let half = low_bits(4 * B);
    let v = (packed & half) | ((packed << (32 - 4 * B)) & (half << 32));
    let quarter = low_bits(2 * B) * 0x0000_0001_0000_0001;
    let v = (v & quarter) | ((v << (16 - 2 * B)) & (quarter << 16));
    let eighth = low_bits(B) * 0x0001_0001_0001_0001;
    (v & eighth) | ((v << (8 - B)) & (eighth << 8))
}

// ---------------------------------------------------------------------------------------------
// Checks shared by both paths.

/// Refuses the first code that does not fit in `bits`.
pub fn check_codes(bits: Bits, codes: &[u8]) -> Result<()> {
    // The OR of all codes fits iff every code does; this folds without branching.
    if codes.iter().fold(0u8, |acc, &code| acc | code) <= bits.max_code() {
        return Ok(());
    }
    let (index, &code) = codes
        .iter()
        .enumerate()
        .find(|(_, code)| **code > bits.max_code())
        .expect("some code is too wide");
    Err(BitsError::CodeTooWide {
        index,
        code,
        bits: bits.get(),
    })
}

fn check_stream_size(
    bits: Bits,
    len: usize,
    got: usize,
    expected: usize,
    unit: &'static str,
) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(BitsError::StreamSize {
            len,
            bits: bits.get(),
            got,
            expected,
            unit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_bit_byte_stream_is_the_nibble_order_codes_2_and_13_form_0xd2() {
        // Byte i = code[2i] | code[2i + 1] << 4: the even element in the low nibble.
        assert_eq!(pack_bytes(Bits::FOUR, &[2, 13]).unwrap(), vec![0xD2]);
        assert_eq!(unpack_bytes(Bits::FOUR, &[0xD2], 2).unwrap(), vec![2, 13]);
        // Masking and shifting by hand, as the study's exercise asks.
        assert_eq!((0xD2u8 & 15, 0xD2u8 >> 4), (2, 13));
        // A swapped slot order would produce 0x01, 0x23, ... instead.
        let ramp: Vec<u8> = (0..8).collect();
        assert_eq!(
            pack_bytes(Bits::FOUR, &ramp).unwrap(),
            vec![0x10, 0x32, 0x54, 0x76]
        );
        assert_eq!(pack_words(Bits::FOUR, &ramp).unwrap(), vec![0x7654_3210]);
    }

    #[test]
    fn odd_count_gets_zero_padding_and_padding_bits_are_ignored_on_read() {
        assert_eq!(
            pack_bytes(Bits::FOUR, &[1, 2, 3]).unwrap(),
            vec![0x21, 0x03]
        );
        assert_eq!(
            unpack_bytes(Bits::FOUR, &[0x21, 0xF3], 3).unwrap(),
            vec![1, 2, 3]
        );
        assert_eq!(
            unpack_bytes_reference(Bits::FOUR, &[0x21, 0xF3], 3).unwrap(),
            vec![1, 2, 3]
        );
    }

    #[test]
    fn three_bit_element_10_straddles_words_0_and_1() {
        // Element 10 occupies bits 30..33: its low two bits end word 0, its top bit starts
        // word 1. Element 21 occupies bits 63..66 and straddles words 1 and 2.
        let mut codes = vec![0u8; 32];
        codes[10] = 0b111;
        assert_eq!(
            pack_words(Bits::new(3).unwrap(), &codes).unwrap(),
            [0xC000_0000, 1, 0]
        );
        codes[10] = 0;
        codes[21] = 0b101;
        assert_eq!(
            pack_words(Bits::new(3).unwrap(), &codes).unwrap(),
            [0, 0x8000_0000, 0b10]
        );
    }

    #[test]
    fn squeeze_and_spread_are_inverse_for_every_width() {
        for bits in Bits::ALL {
            // Lane k holds max_code - k (saturating), so every lane differs where it can.
            let lanes = u64::from_le_bytes(
                [0u8, 1, 2, 3, 4, 5, 6, 7].map(|k| bits.max_code().saturating_sub(k)),
            );
            let packed = with_width!(bits, squeeze, lanes);
            if bits.get() < 8 {
                assert_eq!(
                    packed >> (8 * bits.get()),
                    0,
                    "{bits}: nothing above 8b bits"
                );
            }
            assert_eq!(with_width!(bits, spread, packed), lanes, "{bits}");
        }
    }
}
