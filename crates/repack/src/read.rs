//! Reading a weight file's quantized layers as their stored parts: what `kvpack.weights.read`
//! returns (python/src/weights.rs), and what `inspect` checks without keeping.
//!
//! Each layer comes back in the form its own library dequantizes it, so a user can compare it
//! with that library directly:
//! - GPTQ (`gptq`, `gptq_v2`) and AWQ safetensors layers: the logical matrix
//!   ([`LogicalWeights`]): codes and the weights they stand for are [K, N] (in-features x
//!   out-features, as AutoGPTQ and AutoAWQ unpack them), scales and true zero points [groups,
//!   N], g_idx \[K\], and the permutation of the rows an earlier conversion to AWQ recorded;
//! - GGUF Q4_0 and Q8_0 tensors: the logical matrix too (weight = d * (code - offset), the
//!   offset 8 or 128 stored in no byte), with K = the tensor's columns; callers that want
//!   gguf-py's [rows, cols] transpose it;
//! - GGUF Q4_1 tensors: the blocks (a code, scale d and minimum m per block of 32 along a row);
//! - bitsandbytes NF4 layers: the [`Nf4Tensor`] (table codes, an f32 absmax per block of the
//!   row-major [rows, cols] tensor, which may span rows).
//!
//! Which layout a safetensors layer is: the tensor names say GPTQ/AWQ or bitsandbytes; a GPTQ
//! layer's zero-point convention is the file's metadata (`checkpoint_format` or `format`), or
//! the caller's `format`, and a layer whose convention is stated by neither is refused rather
//! than guessed (reading one as the other shifts every weight by a step). A GGUF file's float
//! tensors (F32, F16, BF16, ...) are not quantized and are skipped; a block type this tool does
//! not implement is refused by name.

use std::path::Path;

use gguf_file::{GgufFile, TensorInfo, TensorType};
use weights::bpw::Cost;
use weights::gguf::{self, BlockQ4_0, BlockQ8_0, GgufBlock, q4_1};
use weights::nf4::Nf4Tensor;
use weights::{LogicalWeights, WeightFormat};

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::files::read_input;
use crate::inspect::read_nf4_layer;
use crate::layer_io;
use crate::layers::{Layer, LayerKind, find_layers};
use crate::metadata;
use crate::names::layer_name;

/// One quantized layer of a file: its name, what it stores, and its parts.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightLayer {
    /// The layer's prefix in a safetensors file (`(unprefixed)` for a file's only, unprefixed
    /// layer), or the tensor's name in a GGUF file.
    pub name: String,
    /// What its stored tensors cost, counted from them.
    pub cost: Cost,
    /// Its parts.
    pub parts: Parts,
}

/// A layer's parts, by family (see the module spec for each one's orientation).
#[derive(Debug, Clone, PartialEq)]
pub enum Parts {
    /// A GPTQ or AWQ layer: its logical matrix [K, N], and the permutation of its rows that an
    /// earlier conversion to AWQ recorded (row k of the matrix is the original row
    /// `input_permutation[k]`).
    Integer {
        /// gptq, gptq_v2 or awq.
        format: WeightFormat,
        /// Codes, scales, true zero points and g_idx.
        weights: LogicalWeights,
        /// The recorded row permutation, if any.
        input_permutation: Option<Vec<u32>>,
    },
    /// A GGUF Q4_0 or Q8_0 tensor of `rows` x `cols`: its logical matrix, [K = cols, N = rows].
    Gguf {
        /// Q4_0 or Q8_0.
        format: WeightFormat,
        /// Codes, the blocks' d as scales, and the format's fixed offset as zero points.
        weights: LogicalWeights,
    },
    /// A GGUF Q4_1 tensor: `rows` x `cols` values in blocks of 32 along each row.
    Q4_1 {
        /// Rows of the tensor.
        rows: usize,
        /// Columns (values per row).
        cols: usize,
        /// Its blocks, row by row.
        blocks: Vec<q4_1::BlockQ4_1>,
    },
    /// A bitsandbytes NF4 layer.
    Nf4(Nf4Tensor),
}

/// The quantized layers of the safetensors checkpoint or GGUF file at `path`, in file order.
/// `format` names a GPTQ checkpoint's zero-point convention (gptq or gptq_v2) when its metadata
/// does not; given with a file whose metadata says otherwise, it is refused.
pub fn read_weights(path: &Path, format: Option<WeightFormat>) -> Result<Vec<WeightLayer>> {
    let bytes = read_input(path)?;
    read_weight_bytes(path, &bytes, format)
}

/// [`read_weights`] on a file's bytes; `path` names it in messages.
pub fn read_weight_bytes(
    path: &Path,
    bytes: &[u8],
    format: Option<WeightFormat>,
) -> Result<Vec<WeightLayer>> {
    if bytes.starts_with(b"GGUF") {
        if let Some(format) = format {
            return Err(Error::UnsupportedFormat {
                format,
                action: "asked for when reading a GGUF file",
                hint: "a GGUF file names each tensor's type itself",
            });
        }
        return read_gguf(path, bytes);
    }
    let ckpt = Checkpoint::from_bytes(bytes).map_err(|source| Error::SafeTensors {
        path: path.to_path_buf(),
        source,
    })?;
    read_checkpoint_layers(path, &ckpt, format)
}

/// A checkpoint's quantized layers (see [`read_weights`]).
pub fn read_checkpoint_layers(
    path: &Path,
    ckpt: &Checkpoint,
    format: Option<WeightFormat>,
) -> Result<Vec<WeightLayer>> {
    let declared = metadata::declared_format(&ckpt.metadata)?;
    if let (Some((key, declared)), Some(asked)) = (declared, format)
        && declared != asked
    {
        return Err(Error::DeclaredFormatConflict {
            path: path.to_path_buf(),
            key,
            declared,
            from: asked,
        });
    }
    let format = format.or(declared.map(|(_, f)| f));
    let found = find_layers(ckpt)?;
    let mut layers = Vec::with_capacity(found.layers.len());
    for layer in &found.layers {
        let name = layer_name(&layer.prefix).to_string();
        let read = match layer.kind {
            LayerKind::Integer => integer_layer(path, ckpt, layer, format)?,
            LayerKind::Bitsandbytes => {
                let tensor = read_nf4_layer(layer)?.map_err(|why| Error::Nf4Layer {
                    path: path.to_path_buf(),
                    layer: name.clone(),
                    why,
                })?;
                (tensor.storage(), Parts::Nf4(tensor))
            }
        };
        layers.push(WeightLayer {
            name,
            cost: read.0,
            parts: read.1,
        });
    }
    Ok(layers)
}

fn integer_layer(
    path: &Path,
    ckpt: &Checkpoint,
    layer: &Layer<'_>,
    format: Option<WeightFormat>,
) -> Result<(Cost, Parts)> {
    let is_gptq = layer.has("g_idx");
    let format = match format {
        Some(format) => format,
        None if is_gptq => {
            return Err(Error::ConventionNotRecorded {
                path: path.to_path_buf(),
                layer: layer_name(&layer.prefix).to_string(),
            });
        }
        None => WeightFormat::Awq,
    };
    let group_size = layer_io::group_size(&ckpt.metadata, layer, format)?;
    let logical = metadata::logical_shape(&ckpt.metadata, &layer.prefix)?;
    let declared_bits = metadata::declared_bits(None, &ckpt.metadata)?;
    let packed = layer_io::read_integer_layer(layer, format, declared_bits, group_size, logical)?;
    let weights = packed
        .unpack()
        .map_err(|source| Error::in_file(path)(source.into()))?;
    let input_permutation =
        metadata::input_permutation(&ckpt.metadata, &layer.prefix, weights.k())?;
    Ok((
        packed.storage(),
        Parts::Integer {
            format,
            weights,
            input_permutation,
        },
    ))
}

fn read_gguf(path: &Path, bytes: &[u8]) -> Result<Vec<WeightLayer>> {
    let gguf_error = |source| Error::Gguf {
        path: path.to_path_buf(),
        source,
    };
    let file = GgufFile::parse(bytes).map_err(gguf_error)?;
    let mut layers = Vec::new();
    for info in file.tensors() {
        if info.ty.block_layout().is_some_and(|(block, _)| block == 1) {
            continue; // a float or integer tensor: not quantized
        }
        let (rows, cols) = gguf_matrix(path, info)?;
        let data = file.tensor_bytes(info).map_err(gguf_error)?;
        let in_file = Error::in_file(path);
        let (cost, parts) = match info.ty {
            TensorType::Q4_0 => fixed_zero::<BlockQ4_0>(data, rows, cols, WeightFormat::Q4_0),
            TensorType::Q8_0 => fixed_zero::<BlockQ8_0>(data, rows, cols, WeightFormat::Q8_0),
            TensorType::Q4_1 => q4_1::from_bytes(data).map(|blocks| {
                (
                    q4_1::storage(blocks.len()),
                    Parts::Q4_1 { rows, cols, blocks },
                )
            }),
            ty => {
                return Err(Error::GgufTypeNotRead {
                    path: path.to_path_buf(),
                    tensor: info.name.to_string(),
                    ty,
                });
            }
        }
        .map_err(|source| in_file(source.into()))?;
        layers.push(WeightLayer {
            name: info.name.to_string(),
            cost,
            parts,
        });
    }
    Ok(layers)
}

fn fixed_zero<B: GgufBlock>(
    data: &[u8],
    rows: usize,
    cols: usize,
    format: WeightFormat,
) -> std::result::Result<(Cost, Parts), weights::FormatError> {
    let blocks = gguf::from_bytes::<B>(data)?;
    let weights = gguf::to_logical(&blocks, rows, cols)?;
    Ok((
        gguf::storage::<B>(blocks.len()),
        Parts::Gguf { format, weights },
    ))
}

/// A GGUF tensor's (rows, cols): a 1-D tensor is one row; more than 2 dimensions, or an empty
/// one, is refused. The parser has checked the dims against the bytes present, so they fit.
pub(crate) fn gguf_matrix(path: &Path, info: &TensorInfo<'_>) -> Result<(usize, usize)> {
    let (rows, cols) = match info.dims.as_slice() {
        [cols] => (1, *cols),
        [cols, rows] => (*rows, *cols),
        dims => {
            return Err(Error::GgufTensorRank {
                path: path.to_path_buf(),
                tensor: info.name.to_string(),
                dims: dims.to_vec(),
            });
        }
    };
    let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let (rows, cols) = (size(rows), size(cols));
    if rows == 0 || cols == 0 {
        return Err(Error::in_file(path)(
            weights::FormatError::EmptyMatrix { rows, cols }.into(),
        ));
    }
    Ok((rows, cols))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_neither_safetensors_nor_gguf_is_refused_by_name() {
        let err = read_weight_bytes(Path::new("x.bin"), b"not a checkpoint", None).unwrap_err();
        assert!(err.to_string().contains("x.bin"), "{err}");
    }

    #[test]
    fn a_format_for_a_gguf_file_is_refused() {
        let err =
            read_weight_bytes(Path::new("m.gguf"), b"GGUF", Some(WeightFormat::Gptq)).unwrap_err();
        assert!(
            err.to_string().contains("names each tensor's type"),
            "{err}"
        );
    }
}
