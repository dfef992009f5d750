//! `repack quantize` and `repack dequantize`: a float32 matrix (.npy) to and from the raw bytes
//! of a block format, with that format's own fixed quantizer.
//!
//! The `.bin` layouts (no header; the shape comes from `--cols` and the file length):
//! - `q4_0`, `q8_0`: exactly the GGUF tensor data, `rows * cols / 32` blocks of 18 or 34 bytes,
//!   blocks running along each row (so `cols` must be a multiple of 32). These are the bytes
//!   gguf-py's `quants.quantize` returns and a GGUF file stores for the tensor.
//! - `nf4`: the packed codes exactly as bitsandbytes' `quantize_4bit` returns them,
//!   `ceil(rows * cols / 2)` bytes, first element in the high nibble; then, immediately after,
//!   the absmax: one little-endian f32 per block of `--block-size` elements (default 64),
//!   `4 * ceil(rows * cols / block)` bytes. The codes part is byte-identical to bitsandbytes'.

use std::path::Path;

use codec::bpw::Cost;
use codec::formats::gguf::{self, BlockQ4_0, BlockQ8_0, GgufBlock};
use codec::formats::nf4::{self, Nf4Tensor};
use codec::formats::{FormatError, WeightFormat};
use ndarray::{Array2, ArrayView2};
use ndarray_npy::WriteNpyExt;

use crate::checkpoint::write_new_file;
use crate::error::{Error, Result};

/// What was quantized or dequantized.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockFileReport {
    pub format: WeightFormat,
    pub shape: [usize; 2],
    pub cost: Cost,
}

/// Quantizes the float32 matrix in `input` (.npy) into a new `output` (.bin).
pub fn quantize_file(
    input: &Path,
    output: &Path,
    format: WeightFormat,
    block_size: usize,
) -> Result<BlockFileReport> {
    if output.exists() {
        return Err(Error::OutputExists(output.to_path_buf()));
    }
    check_block_format(format, "produced by quantize")?;
    let x: Array2<f32> = ndarray_npy::read_npy(input).map_err(|source| Error::Npy {
        path: input.to_path_buf(),
        source,
    })?;
    let (bytes, cost) = encode(x.view(), format, block_size).map_err(Error::in_file(input))?;
    write_new_file(output, &bytes)?;
    Ok(BlockFileReport {
        format,
        shape: [x.nrows(), x.ncols()],
        cost,
    })
}

/// Dequantizes `input` (.bin, `cols` per row) into a new float32 `output` (.npy).
pub fn dequantize_file(
    input: &Path,
    output: &Path,
    format: WeightFormat,
    cols: usize,
    block_size: usize,
) -> Result<BlockFileReport> {
    if output.exists() {
        return Err(Error::OutputExists(output.to_path_buf()));
    }
    check_block_format(format, "read by dequantize")?;
    let bytes = std::fs::read(input).map_err(Error::io(input))?;
    if bytes.is_empty() {
        return Err(Error::EmptyInput {
            path: input.to_path_buf(),
            what: format!("a {format} block file holds at least one row"),
        });
    }
    let (x, cost) = decode(&bytes, format, cols, block_size).map_err(Error::in_file(input))?;
    let mut npy = Vec::new();
    x.write_npy(&mut npy).map_err(|err| Error::Io {
        path: output.to_path_buf(),
        source: std::io::Error::other(err),
    })?;
    write_new_file(output, &npy)?;
    Ok(BlockFileReport {
        format,
        shape: [x.nrows(), x.ncols()],
        cost,
    })
}

fn check_block_format(format: WeightFormat, action: &'static str) -> Result<()> {
    match format {
        WeightFormat::Q4_0 | WeightFormat::Q8_0 | WeightFormat::Nf4 => Ok(()),
        other => Err(Error::UnsupportedFormat {
            format: other,
            action,
            hint: "quantize and dequantize handle q4_0, q8_0 and nf4; gptq and awq come from \
                   calibrating quantizers and are repacked with convert",
        }),
    }
}

/// The `.bin` bytes of `x` in `format`, and what they cost.
pub fn encode(
    x: ArrayView2<f32>,
    format: WeightFormat,
    block_size: usize,
) -> Result<(Vec<u8>, Cost)> {
    let (rows, cols) = x.dim();
    if rows == 0 || cols == 0 {
        return Err(FormatError::EmptyMatrix { rows, cols }.into());
    }
    let flat: Vec<f32> = x.iter().copied().collect();
    Ok(match format {
        WeightFormat::Q4_0 => encode_gguf::<BlockQ4_0>(&flat, cols)?,
        WeightFormat::Q8_0 => encode_gguf::<BlockQ8_0>(&flat, cols)?,
        _ => {
            let tensor = nf4::quantize(x, block_size)?;
            let mut bytes = tensor.packed.clone();
            bytes.extend(tensor.absmax.iter().flat_map(|a| a.to_le_bytes()));
            (bytes, tensor.storage())
        }
    })
}

fn encode_gguf<B: GgufBlock>(flat: &[f32], cols: usize) -> Result<(Vec<u8>, Cost)> {
    let blocks = gguf::quantize::<B>(flat, cols)?;
    Ok((gguf::to_bytes(&blocks), gguf::storage::<B>(blocks.len())))
}

/// The float32 matrix a `.bin` holds, `cols` values per row, and what it costs. Empty input
/// is refused: it holds no rows.
pub fn decode(
    bytes: &[u8],
    format: WeightFormat,
    cols: usize,
    block_size: usize,
) -> Result<(Array2<f32>, Cost)> {
    if bytes.is_empty() {
        return Err(FormatError::EmptyMatrix { rows: 0, cols }.into());
    }
    match format {
        WeightFormat::Q4_0 => decode_gguf::<BlockQ4_0>(bytes, cols),
        WeightFormat::Q8_0 => decode_gguf::<BlockQ8_0>(bytes, cols),
        _ => decode_nf4(bytes, cols, block_size),
    }
}

fn decode_gguf<B: GgufBlock>(bytes: &[u8], cols: usize) -> Result<(Array2<f32>, Cost)> {
    let blocks = gguf::from_bytes::<B>(bytes)?;
    let count = blocks.len() * 32;
    if cols == 0 || cols % 32 != 0 || count % cols != 0 {
        return Err(FormatError::NotAligned {
            format: B::NAME,
            what: "--cols (rows are whole blocks of 32, and the file whole rows)",
            found: cols,
            multiple: 32,
        }
        .into());
    }
    let values = gguf::dequantize(&blocks);
    let x = Array2::from_shape_vec((count / cols, cols), values).expect("whole rows");
    Ok((x, gguf::storage::<B>(blocks.len())))
}

fn decode_nf4(bytes: &[u8], cols: usize, block_size: usize) -> Result<(Array2<f32>, Cost)> {
    if block_size == 0 {
        return Err(FormatError::ZeroGroupSize.into());
    }
    let rows =
        nf4_rows(bytes.len(), cols, block_size).map_err(|nearest| FormatError::ByteLength {
            what: format!(
                "NF4 file of whole rows of {cols} (codes, then an f32 absmax per {block_size})"
            ),
            found: bytes.len(),
            expected: nearest,
        })?;
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

fn nf4_file_len(rows: usize, cols: usize, block_size: usize) -> usize {
    let count = rows * cols;
    count.div_ceil(2) + 4 * count.div_ceil(block_size)
}

/// The row count whose NF4 file is exactly `len` bytes, or else the nearest shorter valid length
/// (the file length grows with the row count).
fn nf4_rows(len: usize, cols: usize, block_size: usize) -> std::result::Result<usize, usize> {
    let (mut low, mut high) = (1usize, 2 * len / cols.max(1) + 1);
    while cols > 0 && low <= high {
        let mid = low + (high - low) / 2;
        match nf4_file_len(mid, cols, block_size).cmp(&len) {
            std::cmp::Ordering::Equal => return Ok(mid),
            std::cmp::Ordering::Less => low = mid + 1,
            std::cmp::Ordering::Greater => high = mid - 1,
        }
    }
    Err(nf4_file_len(high.max(1), cols, block_size))
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
        assert_eq!(nf4_rows(nf4_file_len(8, 128, 64), 128, 64), Ok(8));
        assert_eq!(nf4_rows(nf4_file_len(1, 3, 64), 3, 64), Ok(1));
        assert_eq!(nf4_rows(576 + 1, 128, 64), Err(576));
        assert_eq!(
            decode(&[0; 577], WeightFormat::Nf4, 128, 64)
                .unwrap_err()
                .to_string(),
            "NF4 file of whole rows of 128 (codes, then an f32 absmax per 64): 577 bytes, expected 576"
        );
    }

    #[test]
    fn an_empty_block_file_decodes_to_an_error_not_an_empty_matrix() {
        for format in [WeightFormat::Q4_0, WeightFormat::Q8_0, WeightFormat::Nf4] {
            assert_eq!(
                decode(&[], format, 32, 64).unwrap_err().to_string(),
                "empty matrix: shape 0 x 32 has no elements",
                "{format}"
            );
        }
    }

    #[test]
    fn gguf_needs_whole_blocks_per_row() {
        let x = Array2::<f32>::zeros((2, 48));
        assert_eq!(
            encode(x.view(), WeightFormat::Q4_0, 64)
                .unwrap_err()
                .to_string(),
            "Q4_0 needs the row length (blocks of 32 run along a row) to be a multiple of 32, got 48"
        );
        let (bytes, _) =
            encode(Array2::<f32>::zeros((2, 64)).view(), WeightFormat::Q8_0, 64).unwrap();
        assert_eq!(
            decode(&bytes, WeightFormat::Q8_0, 48, 64)
                .unwrap_err()
                .to_string(),
            "Q8_0 needs --cols (rows are whole blocks of 32, and the file whole rows) to be a \
             multiple of 32, got 48"
        );
    }
}
