//! Code streams at the scalar level: eight codes at a time in a u64 (the same shifts and masks
//! as `bitpack::stream`'s fast path, whose helpers are private), and reading codes that start
//! at any bit.

/// Eight codes, one per byte lane (each < 2^B), moved to bits kB..(k+1)B.
#[inline(always)]
pub(crate) fn squeeze<const B: u32>(lanes: u64) -> u64 {
    let v = lanes;
    let v = (v & 0x00FF_00FF_00FF_00FF) | ((v & 0xFF00_FF00_FF00_FF00) >> (8 - B));
    let v = (v & 0x0000_FFFF_0000_FFFF) | ((v & 0xFFFF_0000_FFFF_0000) >> (16 - 2 * B));
    (v & 0x0000_0000_FFFF_FFFF) | ((v & 0xFFFF_FFFF_0000_0000) >> (32 - 4 * B))
}

/// The inverse of [`squeeze`]: 8B packed bits (anything above is ignored) to one code per byte.
#[inline(always)]
pub(crate) fn spread<const B: u32>(packed: u64) -> u64 {
    let half = low_bits(4 * B);
    let v = (packed & half) | ((packed << (32 - 4 * B)) & (half << 32));
    let quarter = low_bits(2 * B) * 0x0000_0001_0000_0001;
    let v = (v & quarter) | ((v << (16 - 2 * B)) & (quarter << 16));
    let eighth = low_bits(B) * 0x0001_0001_0001_0001;
    (v & eighth) | ((v << (8 - B)) & (eighth << 8))
}

const fn low_bits(n: u32) -> u64 {
    (1u64 << n) - 1
}

/// Up to 8 bytes from `at` as a little-endian u64, zero-filled past the end of `bytes`.
#[inline(always)]
pub(crate) fn read_u64(bytes: &[u8], at: usize) -> u64 {
    match bytes.get(at..at + 8) {
        Some(word) => u64::from_le_bytes(word.try_into().expect("8 bytes")),
        None => {
            let mut buffer = [0u8; 8];
            let rest = bytes.get(at..).unwrap_or(&[]);
            buffer[..rest.len()].copy_from_slice(rest);
            u64::from_le_bytes(buffer)
        }
    }
}

/// Writes the low `B` bytes of `packed` (eight B-bit codes) at the start of `out`.
#[inline(always)]
pub(crate) fn write_packed<const B: u32>(out: &mut [u8], packed: u64) {
    out[..B as usize].copy_from_slice(&packed.to_le_bytes()[..B as usize]);
}

/// Reads `out.len()` codes of `bits` bits starting at code index `first` of the stream.
pub(crate) fn unpack_range(bits: u32, bytes: &[u8], first: usize, out: &mut [u8]) {
    let b = bits as usize;
    if (first * b).is_multiple_of(8) {
        // From a byte boundary: the stream's fast unpacker, on exactly the bytes it needs.
        let width = bitpack::Bits::new(bits).expect("widths are 1 to 8");
        let start = first * b / 8;
        let end = start + width.byte_count(out.len());
        if let Some(stream) = bytes.get(start..end) {
            bitpack::stream::unpack_bytes_into(width, stream, out)
                .expect("whole codes of this width");
            return;
        }
    }
    let mask = ((1u16 << bits) - 1) as u8;
    for (i, slot) in out.iter_mut().enumerate() {
        let bit = (first + i) * b;
        let byte = bit / 8;
        // A code spans at most two bytes (b <= 8, offset <= 7).
        let window =
            u16::from(bytes[byte]) | u16::from(bytes.get(byte + 1).copied().unwrap_or(0)) << 8;
        *slot = (window >> (bit % 8)) as u8 & mask;
    }
}

/// Calls `$function::<B>(args)` with the width as a constant.
macro_rules! with_width {
    ($bits:expr, $function:ident $(:: <$($generic:ty),*>)?, $($arg:expr),*) => {
        match $bits {
            1 => $function::<$($($generic,)*)? 1>($($arg),*),
            2 => $function::<$($($generic,)*)? 2>($($arg),*),
            3 => $function::<$($($generic,)*)? 3>($($arg),*),
            4 => $function::<$($($generic,)*)? 4>($($arg),*),
            5 => $function::<$($($generic,)*)? 5>($($arg),*),
            6 => $function::<$($($generic,)*)? 6>($($arg),*),
            7 => $function::<$($($generic,)*)? 7>($($arg),*),
            8 => $function::<$($($generic,)*)? 8>($($arg),*),
            _ => unreachable!("widths are 1 to 8"),
        }
    };
}
pub(crate) use with_width;

#[cfg(test)]
mod tests {
    use super::*;
    use bitpack::{Bits, stream};

    #[test]
    fn squeeze_and_spread_agree_with_the_stream_packer() {
        for bits in Bits::ALL {
            let codes: Vec<u8> = (0..8u8)
                .map(|k| bits.max_code().wrapping_sub(k * 3) & bits.max_code())
                .collect();
            let lanes = u64::from_le_bytes(codes.clone().try_into().unwrap());
            let packed = with_width!(bits.get(), squeeze, lanes);
            let bytes = stream::pack_bytes(bits, &codes).unwrap();
            assert_eq!(packed.to_le_bytes()[..bytes.len()], bytes[..], "{bits}");
            assert_eq!(with_width!(bits.get(), spread, packed), lanes, "{bits}");
        }
    }

    #[test]
    fn unpack_range_reads_from_any_code() {
        for bits in Bits::ALL {
            let codes: Vec<u8> = (0..61u32)
                .map(|i| (i * 7 + 3) as u8 & bits.max_code())
                .collect();
            let bytes = stream::pack_bytes(bits, &codes).unwrap();
            for first in 0..codes.len() {
                let mut out = vec![0u8; codes.len() - first];
                unpack_range(bits.get(), &bytes, first, &mut out);
                assert_eq!(out, codes[first..], "{bits} from {first}");
            }
        }
    }

    #[test]
    fn read_u64_zero_fills_past_the_end() {
        let bytes = [1u8, 2, 3];
        assert_eq!(read_u64(&bytes, 1), 0x0302);
        assert_eq!(read_u64(&bytes, 3), 0);
        assert_eq!(read_u64(&[9; 9], 1), 0x0909_0909_0909_0909);
    }
}
