//! Bare block files: a float32 matrix to and from the raw bytes of a block format, with no
//! header. `repack quantize` wrote these before it wrote GGUF and safetensors files
//! ([`crate::quantfile`]); `repack dequantize --raw --from FORMAT --cols C` still reads them,
//! and [`decode`] is the fuzz target `repack_blockfile`. Nothing in such a file says its format
//! or shape, so a wrong `--from` or `--cols` of the right length reads as a wrong matrix: hence
//! the explicit `--raw`. (Q4_1's bare blocks are read by [`crate::quantfile`] directly.)
//!
//! The `.bin` layouts (no header; the shape comes from `--cols` and the file length):
//! - `q4_0`, `q8_0`: exactly the GGUF tensor data, `rows * cols / 32` blocks of 18 or 34 bytes,
//!   blocks running along each row (so `cols` must be a multiple of 32). These are the bytes
//!   gguf-py's `quants.quantize` returns and a GGUF file stores for the tensor.
//! - `nf4`: the packed codes exactly as bitsandbytes' `quantize_4bit` returns them,
//!   `ceil(rows * cols / 2)` bytes, first element in the high nibble; then, immediately after,
//!   the absmax: one little-endian f32 per block of `--block-size` elements (default 64),
//!   `4 * ceil(rows * cols / block)` bytes. The codes part is byte-identical to bitsandbytes'.

use ndarray::{Array2, ArrayView2};
use weights::bpw::Cost;
use weights::gguf::{self, BlockQ4_0, BlockQ8_0, GgufBlock};
use weights::nf4::{self, Nf4Tensor};
use weights::{FormatError, WeightFormat};

use crate::error::{Error, Result};

fn not_a_block_format(format: WeightFormat, action: &'static str) -> Error {
    Error::UnsupportedFormat {
        format,
        action,
        hint: "quantize and dequantize handle q4_0, q8_0 and nf4; gptq and awq come from \
               calibrating quantizers and are repacked with convert",
    }
}

/// One block format's encoder: the `.bin` bytes of a matrix and their cost, given the block size.
type Encoder = fn(ArrayView2<f32>, usize) -> Result<(Vec<u8>, Cost)>;

/// One block format's decoder: the matrix a `.bin` holds and its cost, given `cols` and the
/// block size.
type Decoder = fn(&[u8], usize, usize) -> Result<(Array2<f32>, Cost)>;

/// The `.bin` bytes of `x` in `format` (q4_0, q8_0 or nf4), and what they cost.
pub fn encode(
    x: ArrayView2<f32>,
    format: WeightFormat,
    block_size: usize,
) -> Result<(Vec<u8>, Cost)> {
    let encoder: Encoder = match format {
        WeightFormat::Q4_0 => encode_gguf::<BlockQ4_0>,
        WeightFormat::Q8_0 => encode_gguf::<BlockQ8_0>,
        WeightFormat::Nf4 => encode_nf4,
        WeightFormat::Gptq | WeightFormat::GptqV2 | WeightFormat::Awq => {
            return Err(not_a_block_format(format, "produced by quantize"));
        }
    };
    let (rows, cols) = x.dim();
    if rows == 0 || cols == 0 {
        return Err(FormatError::EmptyMatrix { rows, cols }.into());
    }
    encoder(x, block_size)
}

/// GGUF blocks run along each row; they have no block size to choose.
fn encode_gguf<B: GgufBlock>(x: ArrayView2<f32>, _block_size: usize) -> Result<(Vec<u8>, Cost)> {
    let flat: Vec<f32> = x.iter().copied().collect();
    let blocks = gguf::quantize::<B>(&flat, x.ncols())?;
    Ok((gguf::to_bytes(&blocks), gguf::storage::<B>(blocks.len())))
}

fn encode_nf4(x: ArrayView2<f32>, block_size: usize) -> Result<(Vec<u8>, Cost)> {
    let tensor = nf4::quantize(x, block_size)?;
    let mut bytes = tensor.packed.clone();
    bytes.extend(tensor.absmax.iter().flat_map(|a| a.to_le_bytes()));
    Ok((bytes, tensor.storage()))
}

/// The float32 matrix a `.bin` in `format` (q4_0, q8_0 or nf4) holds, `cols` values per row,
/// and what it costs. Empty input is refused: it holds no rows. The row count comes from the
/// length, so the matrix is never larger than a fixed multiple of `bytes` (8 bytes of float32
/// per byte at most, for NF4's two codes per byte).
pub fn decode(
    bytes: &[u8],
    format: WeightFormat,
    cols: usize,
    block_size: usize,
) -> Result<(Array2<f32>, Cost)> {
    let decoder: Decoder = match format {
        WeightFormat::Q4_0 => decode_gguf::<BlockQ4_0>,
        WeightFormat::Q8_0 => decode_gguf::<BlockQ8_0>,
        WeightFormat::Nf4 => decode_nf4,
        WeightFormat::Gptq | WeightFormat::GptqV2 | WeightFormat::Awq => {
            return Err(not_a_block_format(format, "read by dequantize"));
        }
    };
    if bytes.is_empty() {
        return Err(FormatError::EmptyMatrix { rows: 0, cols }.into());
    }
    decoder(bytes, cols, block_size)
}

/// GGUF blocks run along each row; they have no block size to choose.
fn decode_gguf<B: GgufBlock>(
    bytes: &[u8],
    cols: usize,
    _block_size: usize,
) -> Result<(Array2<f32>, Cost)> {
    let format = B::FORMAT;
    let blocks = gguf::from_bytes::<B>(bytes)?;
    if cols == 0 || !cols.is_multiple_of(32) {
        return Err(Error::BlockFileCols {
            format: format.name(),
            cols,
        });
    }
    let values = blocks.len() * 32;
    if !values.is_multiple_of(cols) {
        return Err(Error::BlockFileRows {
            format: format.name(),
            cols,
            values,
        });
    }
    let x = Array2::from_shape_vec((values / cols, cols), gguf::dequantize(&blocks))
        .expect("whole rows");
    Ok((x, gguf::storage::<B>(blocks.len())))
}

fn decode_nf4(bytes: &[u8], cols: usize, block_size: usize) -> Result<(Array2<f32>, Cost)> {
    if block_size == 0 {
        return Err(FormatError::ZeroBlockSize.into());
    }
    let rows = match nf4_rows(bytes.len(), cols, block_size) {
        Ok(rows) => rows,
        Err(Some(nearest)) => {
            return Err(Error::Nf4FileLength {
                cols,
                block_size,
                found: bytes.len(),
                nearest,
            });
        }
        Err(None) => {
            return Err(Error::BlockFileOverflow {
                format: "nf4",
                cols,
                block_size,
            });
        }
    };
    // nf4_rows found rows * cols values whose file is exactly bytes.len() long, so neither the
    // product nor the split below can overflow or fall outside the bytes.
    let count = rows * cols;
    let (packed, absmax) = bytes.split_at(count.div_ceil(2));
    let tensor = Nf4Tensor {
        shape: [rows, cols],
        block_size,
        packed: packed.to_vec(),
        absmax: absmax
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect(),
    };
    Ok((tensor.dequantize()?, tensor.storage()))
}

/// The length of an NF4 file of `rows` rows, or `None` if it does not fit in a usize.
fn nf4_file_len(rows: usize, cols: usize, block_size: usize) -> Option<usize> {
    let count = rows.checked_mul(cols)?;
    count
        .div_ceil(block_size)
        .checked_mul(4)?
        .checked_add(count.div_ceil(2))
}

/// The row count whose NF4 file is exactly `len` bytes; else the nearest shorter valid length
/// (the file length grows with the row count), or `None` when not even one row's length fits
/// in a usize (a `cols` no file can hold).
fn nf4_rows(
    len: usize,
    cols: usize,
    block_size: usize,
) -> std::result::Result<usize, Option<usize>> {
    nf4_file_len(1, cols, block_size).ok_or(None)?;
    // Every row holds at least half a byte per value, so no file of len bytes has more rows.
    let (mut low, mut high) = (
        1usize,
        (len / cols.max(1)).saturating_mul(2).saturating_add(1),
    );
    while cols > 0 && low <= high {
        let mid = low + (high - low) / 2;
        // A length past usize::MAX is longer than any file.
        match nf4_file_len(mid, cols, block_size)
            .map_or(std::cmp::Ordering::Greater, |l| l.cmp(&len))
        {
            std::cmp::Ordering::Equal => return Ok(mid),
            std::cmp::Ordering::Less => low = mid + 1,
            std::cmp::Ordering::Greater => high = mid - 1,
        }
    }
    Err(nf4_file_len(high.max(1), cols, block_size))
}

/// One [`decode`] call spelled as bytes, so that a single byte string (a fuzz input, or a
/// regression file kept from one) is a complete call: byte 0 picks the format (its value modulo
/// the number of formats, in [`WeightFormat::ALL`] order, so non-block formats are tried too),
/// bytes 1..9 are `cols` and 9..17 `block_size` (little-endian u64, as the CLI's usize flags
/// can be), and the rest is the file. Input shorter than 17 bytes is zero-padded.
pub fn decode_case(data: &[u8]) -> Result<(Array2<f32>, Cost)> {
    let mut head = [0u8; 17];
    let split = data.len().min(17);
    head[..split].copy_from_slice(&data[..split]);
    let format = WeightFormat::ALL[usize::from(head[0]) % WeightFormat::ALL.len()];
    let number = |at: usize| {
        let le = u64::from_le_bytes(head[at..at + 8].try_into().expect("8 bytes"));
        usize::try_from(le).unwrap_or(usize::MAX)
    };
    decode(&data[split..], format, number(1), number(9))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn nf4_file_is_codes_then_absmax() {
        let x = array![[1.0f32, -1.0, 0.0], [0.0, 2.0, -2.0]];
        let (bytes, cost) = encode(x.view(), WeightFormat::Nf4, 4).unwrap();
        // 6 codes -> 3 bytes; 2 blocks of 4 -> 2 f32.
        assert_eq!(bytes.len(), 3 + 8);
        assert_eq!(&bytes[3..7], &1.0f32.to_le_bytes());
        assert_eq!(&bytes[7..], &2.0f32.to_le_bytes());
        assert_eq!((cost.code_bytes, cost.metadata_bytes()), (3, 8));
        let (back, _) = decode(&bytes, WeightFormat::Nf4, 3, 4).unwrap();
        assert_eq!(back, x);
    }

    #[test]
    fn nf4_rows_come_from_the_length_or_the_length_is_refused() {
        assert_eq!(nf4_rows(nf4_file_len(8, 128, 64).unwrap(), 128, 64), Ok(8));
        assert_eq!(nf4_rows(nf4_file_len(1, 3, 64).unwrap(), 3, 64), Ok(1));
        assert_eq!(nf4_rows(576 + 1, 128, 64), Err(Some(576)));
        let err = decode(&[0; 577], WeightFormat::Nf4, 128, 64).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Nf4FileLength {
                    cols: 128,
                    block_size: 64,
                    found: 577,
                    nearest: 576
                }
            ),
            "{err:?}"
        );
        assert!(matches!(
            decode(&[0; 8], WeightFormat::Nf4, 4, 0),
            Err(Error::Format(FormatError::ZeroBlockSize))
        ));
    }

    #[test]
    fn an_empty_block_file_decodes_to_an_error_not_an_empty_matrix() {
        for format in [WeightFormat::Q4_0, WeightFormat::Q8_0, WeightFormat::Nf4] {
            let err = decode(&[], format, 32, 64).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::Format(FormatError::EmptyMatrix { rows: 0, cols: 32 })
                ),
                "{format}: {err:?}"
            );
        }
    }

    #[test]
    fn gguf_needs_whole_blocks_per_row() {
        let x = Array2::<f32>::zeros((2, 48));
        let err = encode(x.view(), WeightFormat::Q4_0, 64).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Format(FormatError::RowLength {
                    format: "Q4_0",
                    cols: 48
                })
            ),
            "{err:?}"
        );
        // Two rows of 64 are four blocks: 128 values.
        let (bytes, _) =
            encode(Array2::<f32>::zeros((2, 64)).view(), WeightFormat::Q8_0, 64).unwrap();
        for cols in [0, 48] {
            let err = decode(&bytes, WeightFormat::Q8_0, cols, 64).unwrap_err();
            assert!(
                matches!(err, Error::BlockFileCols { format: "q8_0", cols: c } if c == cols),
                "{err:?}"
            );
        }
        let err = decode(&bytes, WeightFormat::Q8_0, 96, 64).unwrap_err();
        assert!(
            matches!(
                err,
                Error::BlockFileRows {
                    format: "q8_0",
                    cols: 96,
                    values: 128
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            decode(&bytes, WeightFormat::Q8_0, 128, 64).unwrap().0.dim(),
            (1, 128)
        );
        let err = decode(&bytes[..40], WeightFormat::Q8_0, 32, 64).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Format(FormatError::PartialBlock {
                    format: "Q8_0",
                    found: 40,
                    block_bytes: 34
                })
            ),
            "{err:?}"
        );
    }

    #[test]
    fn nf4_cols_whose_row_size_overflows_are_refused_not_multiplied() {
        // --cols 18446744073709551615 --block-size 1 overflowed `4 * ceil(count / block)`.
        let err = decode(&[0; 8], WeightFormat::Nf4, usize::MAX, 1).unwrap_err();
        assert!(
            matches!(
                err,
                Error::BlockFileOverflow {
                    format: "nf4",
                    cols: usize::MAX,
                    block_size: 1
                }
            ),
            "{err:?}"
        );
        // Large but representable: refused as a length mismatch, with no overflow on the way.
        let err = decode(&[0; 8], WeightFormat::Nf4, usize::MAX / 16, 1).unwrap_err();
        assert!(
            matches!(err, Error::Nf4FileLength { found: 8, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn non_block_formats_are_refused_by_the_library_too() {
        // decode used to read anything that was not q4_0 or q8_0 as NF4.
        for format in [WeightFormat::Gptq, WeightFormat::GptqV2, WeightFormat::Awq] {
            let err = decode(&[0; 40], format, 16, 64).unwrap_err();
            assert!(
                matches!(err, Error::UnsupportedFormat { format: f, .. } if f == format),
                "{err:?}"
            );
            let err = encode(Array2::<f32>::zeros((1, 32)).view(), format, 64).unwrap_err();
            assert!(
                matches!(err, Error::UnsupportedFormat { format: f, .. } if f == format),
                "{err:?}"
            );
        }
    }

    #[test]
    fn decode_case_spells_the_arguments_in_its_first_17_bytes() {
        let x = array![[1.0f32, -1.0, 0.0, 0.5], [2.0, 0.0, 0.25, -2.0]];
        let (file, _) = encode(x.view(), WeightFormat::Nf4, 4).unwrap();
        let nf4 = WeightFormat::ALL
            .iter()
            .position(|&f| f == WeightFormat::Nf4)
            .unwrap();
        let mut case = vec![u8::try_from(nf4).unwrap()];
        case.extend(4u64.to_le_bytes());
        case.extend(4u64.to_le_bytes());
        case.extend(&file);
        let direct = decode(&file, WeightFormat::Nf4, 4, 4).unwrap();
        assert_eq!(decode_case(&case).unwrap(), direct);
        // Too short to hold the arguments: zero-padded, so cols = 0 and nothing to decode.
        assert!(decode_case(&[5, 1]).is_err());
    }
}
