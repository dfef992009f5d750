//! `repack quantize` and `repack dequantize`: a float32 matrix (.npy) to and from a file that
//! says its own format and shape.
//!
//! The files `quantize` writes (each layout stated here once):
//! - `q4_0`, `q8_0`, `q4_1` -> a GGUF version 3 file ([`gguf_file::writer`]): metadata
//!   `general.architecture` = `"kvpack"`, `general.name` = the input's file stem and
//!   `kvpack.tool` = `"repack <version>"`, then one tensor, [`TENSOR_NAME`], of ggml type
//!   Q4_0 (2), Q8_0 (8) or Q4_1 (3) with dims `[cols, rows]` (GGUF lists ne0, the row length,
//!   first), alignment 32, its data exactly the blocks the `weights` crate's quantizer produces
//!   (byte-identical to ggml's and gguf-py's). gguf-py's `GGUFReader` opens it,
//!   `gguf.quants.dequantize` gives the same floats as `repack dequantize`, and gguf-py's own
//!   `GGUFWriter`, given the same metadata and tensor, writes the same file byte for byte (the
//!   conformance fixtures under `tests/data/gguf/`, and `scripts/check-gguf-py`).
//! - `nf4` -> a safetensors file in the layout bitsandbytes' `Linear4bit` saves one layer's
//!   weight in (`Params4bit` data plus `QuantState.as_dict(packed=True)`, bitsandbytes
//!   `functional.py`; the keys are prefixed with the parameter name `weight`, as
//!   `Linear4bit._save_to_state_dict` prefixes them):
//!   `weight` U8 `[ceil(n / 2), 1]` (the packed codes, first element in the high nibble),
//!   `weight.absmax` F32 `[ceil(n / block)]`, `weight.quant_map` F32 `[16]` (the NF4 levels),
//!   and `weight.quant_state.bitsandbytes__nf4` U8 `[len]`: the UTF-8 bytes of the JSON
//!   `{"quant_type": "nf4", "blocksize": B, "dtype": "float32", "shape": [rows, cols]}`, byte
//!   for byte as bitsandbytes' `pack_dict_to_tensor` writes it (`json.dumps`, default
//!   separators; `dtype` is the dtype the weight dequantizes to).
//!   File metadata: `format` = `"pt"` (what transformers expects) and `kvpack.tool`. No nested
//!   (double) quantization: the absmax stays f32. The codes and absmax are the bytes
//!   [`weights::nf4::quantize`] produces, byte-identical to bitsandbytes' `quantize_4bit`.
//!
//! `dequantize` reads either file back, its format and shape from the file (a GGUF file with
//! several tensors needs `--tensor NAME`; so does a safetensors file with several NF4 weights).
//! The bare block files older versions wrote (see [`crate::blockfile`]) are read only with an
//! explicit `--raw --from FORMAT --cols C`, and every flag that a file's own header makes
//! redundant is refused rather than ignored.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use gguf_file::writer::GgufWriter;
use gguf_file::{GgufFile, TensorType};
use ndarray::{Array2, ArrayView2};
use safetensors::Dtype;
use weights::WeightFormat;
use weights::bpw::Cost;
use weights::gguf::{self, BlockQ4_0, BlockQ8_0, GgufBlock, q4_1};
use weights::nf4::{self, NF4_LEVELS};

use crate::blockfile;
use crate::checkpoint::{Checkpoint, Tensor};
use crate::error::{Error, Result};
use crate::files::{read_input, read_npy_matrix, write_new_file};
use crate::inspect::read_nf4_layer;
use crate::layers::{LayerKind, find_layers};
use crate::names::layer_name;
use crate::read::gguf_matrix;

/// The name of the one tensor `quantize` writes (GGUF) or of the weight whose quant state it
/// writes (NF4), as a single `Linear4bit`'s state dict names it.
pub const TENSOR_NAME: &str = "weight";

/// What `repack quantize --to` writes and `repack dequantize --raw --from` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// GGUF Q4_0.
    Q4_0,
    /// GGUF Q8_0.
    Q8_0,
    /// GGUF Q4_1.
    Q4_1,
    /// bitsandbytes NF4 (safetensors).
    Nf4,
}

impl Target {
    /// Every target, in the order messages list them.
    pub const ALL: [Target; 4] = [Target::Q4_0, Target::Q8_0, Target::Q4_1, Target::Nf4];

    /// The CLI's name.
    pub fn name(self) -> &'static str {
        match self {
            Target::Q4_0 => "q4_0",
            Target::Q8_0 => "q8_0",
            Target::Q4_1 => "q4_1",
            Target::Nf4 => "nf4",
        }
    }

    /// The ggml type of a GGUF target; `None` for NF4.
    pub fn ggml_type(self) -> Option<TensorType> {
        match self {
            Target::Q4_0 => Some(TensorType::Q4_0),
            Target::Q8_0 => Some(TensorType::Q8_0),
            Target::Q4_1 => Some(TensorType::Q4_1),
            Target::Nf4 => None,
        }
    }

    /// The extension of the file `quantize` writes.
    pub fn extension(self) -> &'static str {
        match self {
            Target::Nf4 => "safetensors",
            _ => "gguf",
        }
    }

    fn container(self) -> &'static str {
        match self {
            Target::Nf4 => "a safetensors file in bitsandbytes' layout",
            _ => "a GGUF file",
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A `--to` or `--from` that names no target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown format {0:?}: quantize writes q4_0, q8_0, q4_1 (GGUF) or nf4 (safetensors); gptq, \
     gptq_v2 and awq come from calibrating quantizers and are repacked with convert"
)]
pub struct UnknownTarget(
    /// The name given.
    pub String,
);

impl FromStr for Target {
    type Err = UnknownTarget;
    fn from_str(s: &str) -> std::result::Result<Self, UnknownTarget> {
        Target::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| UnknownTarget(s.to_string()))
    }
}

/// The layout a tensor was written in or read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One that `quantize` writes.
    Written(Target),
    /// A GGUF tensor type that `dequantize` reads but `quantize` does not write (F32, F16,
    /// BF16, Q5_0, Q5_1 and the k-quants Q4_K, Q5_K, Q6_K).
    Gguf(TensorType),
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::Written(target) => target.fmt(f),
            Layout::Gguf(ty) => ty.fmt(f),
        }
    }
}

/// What was quantized or dequantized.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantReport {
    /// The format.
    pub format: Layout,
    /// [rows, cols] of the float32 matrix.
    pub shape: [usize; 2],
    /// What the quantized weight stores.
    pub cost: Cost,
}

/// Quantizes the float32 matrix in `input` (.npy) into a new `output`: a `.gguf` file for
/// q4_0, q8_0 and q4_1, a `.safetensors` file for nf4. `block_size` is NF4's absmax block
/// (default [`nf4::DEFAULT_BLOCK_SIZE`]); given for another format it is refused.
pub fn quantize_file(
    input: &Path,
    output: &Path,
    target: Target,
    block_size: Option<usize>,
) -> Result<QuantReport> {
    if target != Target::Nf4
        && let Some(size) = block_size
    {
        return Err(Error::FlagNotApplicable {
            flag: format!("--block-size {size}"),
            why: format!(
                "to {target}: its blocks are always 32 values (only nf4 has a block size to \
                 choose)"
            ),
        });
    }
    check_extension(output, target)?;
    if output.exists() {
        return Err(Error::OutputExists(output.to_path_buf()));
    }
    let x = read_npy_matrix(input)?;
    let stem = input
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (bytes, cost) = match gguf_blocks(x.view(), target) {
        Some(blocks) => {
            let (ty, data, cost) = blocks.map_err(Error::in_file(input))?;
            (gguf_bytes(&stem, ty, x.dim(), data, output)?, cost)
        }
        None => {
            let block = block_size.unwrap_or(nf4::DEFAULT_BLOCK_SIZE);
            nf4_bytes(x.view(), block, output).map_err(|err| match err {
                err @ (Error::Serialize { .. } | Error::OutputExists(_)) => err,
                err => Error::in_file(input)(err),
            })?
        }
    };
    write_new_file(output, &bytes)?;
    Ok(QuantReport {
        format: Layout::Written(target),
        shape: [x.nrows(), x.ncols()],
        cost,
    })
}

/// Refuses an output whose extension names the other kind of file (or an old `.bin`).
fn check_extension(output: &Path, target: Target) -> Result<()> {
    let ext = output.extension().and_then(|e| e.to_str()).unwrap_or("");
    if ext != target.extension() {
        return Err(Error::OutputExtension {
            path: output.to_path_buf(),
            format: target.name(),
            container: target.container(),
            extension: target.extension(),
        });
    }
    Ok(())
}

/// The ggml type, the GGUF blocks of `x` as bytes, and their cost; `None` for NF4, which is not
/// a GGUF type.
fn gguf_blocks(x: ArrayView2<f32>, target: Target) -> Option<Result<(TensorType, Vec<u8>, Cost)>> {
    fn blocks<B: GgufBlock>(flat: &[f32], cols: usize) -> Result<(Vec<u8>, Cost)> {
        let blocks = gguf::quantize::<B>(flat, cols)?;
        Ok((gguf::to_bytes(&blocks), gguf::storage::<B>(blocks.len())))
    }
    let ty = target.ggml_type()?;
    let (rows, cols) = x.dim();
    if rows == 0 || cols == 0 {
        return Some(Err(weights::FormatError::EmptyMatrix { rows, cols }.into()));
    }
    let flat: Vec<f32> = x.iter().copied().collect();
    let encoded = match ty {
        TensorType::Q4_0 => blocks::<BlockQ4_0>(&flat, cols),
        TensorType::Q8_0 => blocks::<BlockQ8_0>(&flat, cols),
        _ => q4_1::quantize(&flat, cols)
            .map(|blocks| (q4_1::to_bytes(&blocks), q4_1::storage(blocks.len())))
            .map_err(Error::from),
    };
    Some(encoded.map(|(data, cost)| (ty, data, cost)))
}

/// The `kvpack.tool` value written into every file.
pub fn tool() -> String {
    format!("repack {}", env!("CARGO_PKG_VERSION"))
}

/// A GGUF file holding `data` as [`TENSOR_NAME`], a `[rows, cols]` matrix of type `ty`.
fn gguf_bytes(
    stem: &str,
    ty: TensorType,
    (rows, cols): (usize, usize),
    data: Vec<u8>,
    output: &Path,
) -> Result<Vec<u8>> {
    let write_error = |source| Error::GgufWrite {
        path: output.to_path_buf(),
        source,
    };
    let mut w = GgufWriter::new();
    w.add_string("general.architecture", "kvpack")
        .map_err(write_error)?;
    w.add_string("general.name", stem).map_err(write_error)?;
    w.add_string("kvpack.tool", &tool()).map_err(write_error)?;
    w.add_tensor(TENSOR_NAME, &[cols as u64, rows as u64], ty, data)
        .map_err(write_error)?;
    Ok(w.to_bytes())
}

/// bitsandbytes' quant-state JSON for an NF4 float32 weight of `shape`, byte for byte as
/// `pack_dict_to_tensor` writes it: Python's `json.dumps` of the non-tensor items of
/// `QuantState.as_dict`, in its key order, with its default separators (`", "`, `": "`).
fn nf4_state_json(block_size: usize, [rows, cols]: [usize; 2]) -> Vec<u8> {
    format!(
        "{{\"quant_type\": \"nf4\", \"blocksize\": {block_size}, \"dtype\": \"float32\", \
         \"shape\": [{rows}, {cols}]}}"
    )
    .into_bytes()
}

/// The safetensors bytes of `x` quantized to NF4, and their cost.
fn nf4_bytes(x: ArrayView2<f32>, block_size: usize, output: &Path) -> Result<(Vec<u8>, Cost)> {
    let (rows, cols) = x.dim();
    if rows == 0 || cols == 0 {
        return Err(weights::FormatError::EmptyMatrix { rows, cols }.into());
    }
    let tensor = nf4::quantize(x, block_size)?;
    let cost = tensor.storage();
    let state = nf4_state_json(block_size, tensor.shape);
    let f32s =
        |values: &[f32]| -> Vec<u8> { values.iter().flat_map(|v| v.to_le_bytes()).collect() };
    let mut tensors = BTreeMap::new();
    let name = |part: &str| format!("{TENSOR_NAME}{part}");
    tensors.insert(
        name(""),
        Tensor {
            dtype: Dtype::U8,
            shape: vec![tensor.packed.len(), 1],
            data: tensor.packed.clone(),
        },
    );
    tensors.insert(
        name(".absmax"),
        Tensor {
            dtype: Dtype::F32,
            shape: vec![tensor.absmax.len()],
            data: f32s(&tensor.absmax),
        },
    );
    tensors.insert(
        name(".quant_map"),
        Tensor {
            dtype: Dtype::F32,
            shape: vec![NF4_LEVELS.len()],
            data: f32s(&NF4_LEVELS),
        },
    );
    tensors.insert(
        name(".quant_state.bitsandbytes__nf4"),
        Tensor {
            dtype: Dtype::U8,
            shape: vec![state.len()],
            data: state,
        },
    );
    let metadata = BTreeMap::from([
        ("format".to_string(), "pt".to_string()),
        ("kvpack.tool".to_string(), tool()),
    ]);
    let bytes = Checkpoint { tensors, metadata }
        .to_bytes()
        .map_err(|source| Error::Serialize {
            path: output.to_path_buf(),
            source,
        })?;
    Ok((bytes, cost))
}

/// How `dequantize` is to read a bare block file (`--raw`): nothing in it says its format or
/// shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawSpec {
    /// `--from`.
    pub format: Target,
    /// `--cols`.
    pub cols: usize,
    /// `--block-size` (NF4 only).
    pub block_size: Option<usize>,
}

/// What `dequantize` was told beyond its input and output.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DequantizeFlags {
    /// `--raw`.
    pub raw: bool,
    /// `--from`.
    pub from: Option<Target>,
    /// `--cols`.
    pub cols: Option<usize>,
    /// `--block-size`.
    pub block_size: Option<usize>,
    /// `--tensor`.
    pub tensor: Option<String>,
}

impl DequantizeFlags {
    /// The raw reading these flags ask for (`None` without `--raw`); refuses a flag that does
    /// not apply, naming it.
    pub fn raw_spec(&self) -> Result<Option<RawSpec>> {
        let not_applicable = |flag: String, why: &str| Error::FlagNotApplicable {
            flag,
            why: why.to_string(),
        };
        if !self.raw {
            let from_file = "without --raw: a GGUF or safetensors file says its own format, \
                             shape and block size (give --raw only for a bare block file)";
            if let Some(from) = self.from {
                return Err(not_applicable(format!("--from {from}"), from_file));
            }
            if let Some(cols) = self.cols {
                return Err(not_applicable(format!("--cols {cols}"), from_file));
            }
            if let Some(size) = self.block_size {
                return Err(not_applicable(format!("--block-size {size}"), from_file));
            }
            return Ok(None);
        }
        if let Some(tensor) = &self.tensor {
            return Err(not_applicable(
                format!("--tensor {tensor}"),
                "with --raw: a bare block file holds one unnamed tensor",
            ));
        }
        let (Some(format), Some(cols)) = (self.from, self.cols) else {
            return Err(Error::RawNeedsFlags {
                missing: match (self.from, self.cols) {
                    (None, None) => "--from FORMAT and --cols C",
                    (None, Some(_)) => "--from FORMAT",
                    _ => "--cols C",
                },
            });
        };
        if format != Target::Nf4
            && let Some(size) = self.block_size
        {
            return Err(not_applicable(
                format!("--block-size {size}"),
                &format!(
                    "to {format}: its blocks are always 32 values (only nf4 has a block size)"
                ),
            ));
        }
        Ok(Some(RawSpec {
            format,
            cols,
            block_size: self.block_size,
        }))
    }
}

/// Dequantizes `input` into a new float32 `output` (.npy): a GGUF file or a safetensors file in
/// bitsandbytes' NF4 layout, or with `--raw` a bare block file.
pub fn dequantize_file(
    input: &Path,
    output: &Path,
    flags: &DequantizeFlags,
) -> Result<QuantReport> {
    // The flags first (refused before the input is read; checked again with the bytes).
    flags.raw_spec()?;
    if output.exists() {
        return Err(Error::OutputExists(output.to_path_buf()));
    }
    let bytes = read_input(input)?;
    let (format, x, cost) = dequantize_bytes(&bytes, flags, input)?;
    write_new_file(output, &crate::npy::npy_matrix_bytes(&x))?;
    Ok(QuantReport {
        format,
        shape: [x.nrows(), x.ncols()],
        cost,
    })
}

/// What `dequantize` does with the bytes of `input` (named in errors): the format, the matrix
/// and its storage cost. The `repack_dequantize` fuzz target runs it on whole files
/// ([`dequantize_case`]).
pub fn dequantize_bytes(
    bytes: &[u8],
    flags: &DequantizeFlags,
    input: &Path,
) -> Result<(Layout, Array2<f32>, Cost)> {
    let raw = flags.raw_spec()?;
    let kind = Container::of(bytes);
    Ok(match (raw, kind) {
        (Some(spec), _) => {
            // Refused only when the whole file parses as what its first bytes suggest: bare
            // blocks may start like either by chance (a Q4_0 scale of 7.277 is "GG").
            let parses = match kind {
                Container::Gguf => GgufFile::parse(bytes).is_ok(),
                Container::SafeTensors => Checkpoint::from_bytes(bytes).is_ok(),
                Container::Unknown => false,
            };
            if parses {
                return Err(Error::RawOfSelfDescribingFile {
                    path: input.to_path_buf(),
                    kind: kind.name(),
                });
            }
            let (x, cost) = decode_raw(bytes, spec, input)?;
            (Layout::Written(spec.format), x, cost)
        }
        (None, Container::Gguf) => read_gguf(bytes, flags.tensor.as_deref(), input)?,
        (None, Container::SafeTensors) => {
            let (target, x, cost) = read_nf4(bytes, flags.tensor.as_deref(), input)?;
            (Layout::Written(target), x, cost)
        }
        (None, Container::Unknown) => {
            return Err(Error::UnknownContainer {
                path: input.to_path_buf(),
                len: bytes.len(),
            });
        }
    })
}

/// [`dequantize_bytes`] on a whole file with no flags (`repack dequantize FILE OUT.npy`), as
/// the `repack_dequantize` fuzz target and its kept regressions call it: the GGUF reader, and
/// the NF4 safetensors reader through the quant state's shape to the dequantized matrix.
pub fn dequantize_case(data: &[u8]) -> Result<(Layout, Array2<f32>, Cost)> {
    dequantize_bytes(data, &DequantizeFlags::default(), Path::new("fuzz input"))
}

/// What a file's first bytes say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Container {
    /// Starts with the magic `GGUF`.
    Gguf,
    /// An 8-byte little-endian header length, then a JSON object (`{`).
    SafeTensors,
    /// Neither.
    Unknown,
}

impl Container {
    /// What `bytes` start like.
    pub fn of(bytes: &[u8]) -> Container {
        if bytes.starts_with(b"GGUF") {
            Container::Gguf
        } else if bytes.len() > 8 && bytes[8] == b'{' {
            Container::SafeTensors
        } else {
            Container::Unknown
        }
    }

    fn name(self) -> &'static str {
        match self {
            Container::Gguf => "GGUF",
            Container::SafeTensors => "safetensors",
            Container::Unknown => "bare block",
        }
    }
}

/// The tensor `--tensor` names, or the only one; else an error listing the names.
fn choose(names: &[&str], wanted: Option<&str>, path: &Path, what: &'static str) -> Result<usize> {
    let list = || names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    match wanted {
        Some(name) => names
            .iter()
            .position(|n| *n == name)
            .ok_or_else(|| Error::NoSuchTensor {
                path: path.to_path_buf(),
                name: name.to_string(),
                what,
                names: list(),
            }),
        None if names.len() == 1 => Ok(0),
        None => Err(Error::ChooseTensor {
            path: path.to_path_buf(),
            what,
            names: list(),
        }),
    }
}

/// The tensor `wanted` (or the file's only one) dequantized, whatever its readable type.
fn read_gguf(
    bytes: &[u8],
    wanted: Option<&str>,
    path: &Path,
) -> Result<(Layout, Array2<f32>, Cost)> {
    let gguf_error = |source| Error::Gguf {
        path: path.to_path_buf(),
        source,
    };
    let file = GgufFile::parse(bytes).map_err(gguf_error)?;
    let names: Vec<&str> = file.tensors().iter().map(|t| t.name).collect();
    let info = &file.tensors()[choose(&names, wanted, path, "tensors")?];
    let (rows, cols) = gguf_matrix(path, info)?;
    let data = file.tensor_bytes(info).map_err(gguf_error)?;
    // gguf-file checked that the tensor's bytes are in the file, so rows * cols is bounded by
    // its size.
    let mut values = vec![0f32; rows * cols];
    let cost = match gguf::dequantize_tensor(info.ty, data, &mut values) {
        Ok(cost) => cost,
        Err(weights::FormatError::UnreadableGgufType { .. }) => {
            return Err(Error::GgufTensorType {
                path: path.to_path_buf(),
                tensor: info.name.to_string(),
                ty: info.ty,
            });
        }
        Err(e) => return Err(Error::in_file(path)(e.into())),
    };
    let layout = match Target::ALL
        .into_iter()
        .find(|t| t.ggml_type() == Some(info.ty))
    {
        Some(target) => Layout::Written(target),
        None => Layout::Gguf(info.ty),
    };
    let x = Array2::from_shape_vec((rows, cols), values).expect("rows * cols values");
    Ok((layout, x, cost))
}

fn read_nf4(
    bytes: &[u8],
    wanted: Option<&str>,
    path: &Path,
) -> Result<(Target, Array2<f32>, Cost)> {
    let ckpt = Checkpoint::from_bytes(bytes).map_err(|source| Error::SafeTensors {
        path: path.to_path_buf(),
        source,
    })?;
    let found = find_layers(&ckpt)?;
    let bnb: Vec<_> = found
        .layers
        .iter()
        .filter(|l| l.kind == LayerKind::Bitsandbytes)
        .collect();
    if bnb.is_empty() {
        return Err(Error::NoNf4Weight {
            path: path.to_path_buf(),
        });
    }
    let names: Vec<String> = bnb.iter().map(|l| l.tensor_name("weight")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let layer = bnb[choose(&refs, wanted, path, "NF4 weights")?];
    let tensor = read_nf4_layer(layer)?.map_err(|why| Error::Nf4Layer {
        path: path.to_path_buf(),
        layer: layer_name(&layer.prefix).to_string(),
        why,
    })?;
    let x = tensor
        .dequantize()
        .map_err(|e| Error::in_file(path)(e.into()))?;
    Ok((Target::Nf4, x, tensor.storage()))
}

/// A bare block file read as `spec` says; a length that is not whole rows is explained.
fn decode_raw(bytes: &[u8], spec: RawSpec, path: &Path) -> Result<(Array2<f32>, Cost)> {
    if bytes.is_empty() {
        return Err(Error::EmptyBlockFile {
            path: path.to_path_buf(),
            format: spec.format.name(),
        });
    }
    let in_file = Error::in_file(path);
    let block_bytes = match spec.format {
        Target::Q4_0 => BlockQ4_0::BYTES,
        Target::Q8_0 => BlockQ8_0::BYTES,
        Target::Q4_1 => q4_1::BlockQ4_1::BYTES,
        Target::Nf4 => {
            let block = spec.block_size.unwrap_or(nf4::DEFAULT_BLOCK_SIZE);
            return blockfile::decode(bytes, WeightFormat::Nf4, spec.cols, block).map_err(in_file);
        }
    };
    let cols = spec.cols;
    if cols == 0 || !cols.is_multiple_of(32) {
        return Err(in_file(Error::BlockFileCols {
            format: spec.format.name(),
            cols,
        }));
    }
    let blocks_per_row = cols / 32;
    let row_bytes = blocks_per_row
        .checked_mul(block_bytes)
        .ok_or_else(|| Error::BlockFileOverflow {
            format: spec.format.name(),
            cols,
            block_size: 32,
        })
        .map_err(Error::in_file(path))?;
    if !bytes.len().is_multiple_of(row_bytes) {
        return Err(in_file(Error::RawRows {
            format: spec.format.name(),
            found: bytes.len(),
            cols,
            blocks_per_row,
            block_bytes,
            row_bytes,
        }));
    }
    match spec.format {
        Target::Q4_0 => blockfile::decode(bytes, WeightFormat::Q4_0, cols, 32).map_err(in_file),
        Target::Q8_0 => blockfile::decode(bytes, WeightFormat::Q8_0, cols, 32).map_err(in_file),
        _ => {
            let blocks = q4_1::from_bytes(bytes).map_err(|e| in_file(e.into()))?;
            let x =
                Array2::from_shape_vec((bytes.len() / row_bytes, cols), q4_1::dequantize(&blocks))
                    .expect("whole rows");
            Ok((x, q4_1::storage(blocks.len())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(raw: bool, from: Option<Target>, cols: Option<usize>) -> DequantizeFlags {
        DequantizeFlags {
            raw,
            from,
            cols,
            ..DequantizeFlags::default()
        }
    }

    #[test]
    fn target_names_round_trip_and_unknown_names_say_what_to_use() {
        for target in Target::ALL {
            assert_eq!(target.name().parse::<Target>(), Ok(target));
        }
        let err = "gptq".parse::<Target>().unwrap_err().to_string();
        assert!(err.contains("repacked with convert"), "{err}");
    }

    #[test]
    fn raw_flags_are_all_or_nothing() {
        assert_eq!(flags(false, None, None).raw_spec().unwrap(), None);
        assert!(matches!(
            flags(false, None, Some(64)).raw_spec(),
            Err(Error::FlagNotApplicable { flag, .. }) if flag == "--cols 64"
        ));
        assert!(matches!(
            flags(true, Some(Target::Q4_0), None).raw_spec(),
            Err(Error::RawNeedsFlags {
                missing: "--cols C"
            })
        ));
        assert_eq!(
            flags(true, Some(Target::Q4_1), Some(64))
                .raw_spec()
                .unwrap(),
            Some(RawSpec {
                format: Target::Q4_1,
                cols: 64,
                block_size: None
            })
        );
    }

    #[test]
    fn a_wrong_raw_length_is_explained_in_rows_and_bytes() {
        let spec = RawSpec {
            format: Target::Q4_0,
            cols: 64,
            block_size: None,
        };
        let err = decode_raw(&[0; 512], spec, Path::new("runs/w.bin")).unwrap_err();
        assert_eq!(
            crate::error::with_causes(&err),
            "runs/w.bin: 512 bytes is not a whole number of rows: with --cols 64 a q4_0 row is \
             2 blocks of 18 bytes = 36 bytes; 512 is 14 rows and 8 bytes; check --from and \
             --cols against what wrote the file"
        );
    }

    #[test]
    fn containers_are_told_apart_by_their_first_bytes() {
        assert_eq!(Container::of(b"GGUF\x03\0\0\0"), Container::Gguf);
        assert_eq!(
            Container::of(b"\x02\0\0\0\0\0\0\0{}"),
            Container::SafeTensors
        );
        assert_eq!(Container::of(&[0; 36]), Container::Unknown);
        assert_eq!(Container::of(b""), Container::Unknown);
    }

    /// A q4_1 GGUF file as quantize writes it, then every prefix of it and every single-byte
    /// change in its header: each reads or is refused, never a panic.
    #[test]
    fn damaged_gguf_files_are_refused_not_panicked_on() {
        let x = Array2::from_shape_fn((2, 64), |(r, c)| r as f32 - c as f32 / 16.0);
        let (ty, data, _) = gguf_blocks(x.view(), Target::Q4_1).unwrap().unwrap();
        let whole = gguf_bytes("x", ty, x.dim(), data, Path::new("x.gguf")).unwrap();
        let (target, back, _) = read_gguf(&whole, None, Path::new("x.gguf")).unwrap();
        // A tensor of no rows is refused, not written as an empty matrix.
        let mut w = GgufWriter::new();
        w.add_tensor("e", &[32, 1], TensorType::Q4_1, vec![0; 20])
            .unwrap();
        let mut empty = w.to_bytes();
        // dims[1] of the only tensor: after the header (24), the name (8 + 1), n_dims (4) and
        // dims[0] (8).
        empty[24 + 9 + 4 + 8..24 + 9 + 4 + 16].copy_from_slice(&0u64.to_le_bytes());
        let err = read_gguf(&empty, None, Path::new("e.gguf")).unwrap_err();
        assert!(
            crate::error::with_causes(&err).contains("e.gguf: "),
            "{err:?}"
        );
        assert!(
            matches!(&err, Error::InFile { source, .. }
            if matches!(**source, Error::Format(weights::FormatError::EmptyMatrix { rows: 0, cols: 32 }))),
            "{err:?}"
        );
        assert_eq!(
            (target, back.dim()),
            (Layout::Written(Target::Q4_1), (2, 64))
        );
        // The data: 2 rows of 2 blocks of 20 bytes, then zero padding to the alignment of 32
        // (which a reader does not need).
        let end = whole.len() - (96 - 80);
        for cut in 0..end {
            assert!(
                read_gguf(&whole[..cut], None, Path::new("x.gguf")).is_err(),
                "{cut}"
            );
        }
        let header = whole.len() - 96;
        for at in 0..header {
            for value in [0u8, 1, 0x7f, 0xff] {
                let mut bytes = whole.clone();
                bytes[at] = value;
                let _ = read_gguf(&bytes, None, Path::new("x.gguf"));
            }
        }
    }
}
