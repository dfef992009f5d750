//! `kvpack.weights`: quantized weight files read into their parts, converted between layouts,
//! and a layout's cost, over the `repack` and `weights` crates exactly as the `repack` binary
//! uses them (`read` is what `repack inspect` checks, `convert` is `repack convert`, `bpw` is
//! `repack bpw --bits`).
//!
//! A layer's arrays are NumPy copies made when an attribute is read (a layer holds the Rust
//! parts; nothing is shared with the file). Every orientation is its library's: GPTQ and AWQ
//! layers are [K, N] (in-features x out-features), GGUF and NF4 tensors [rows, cols] (see
//! `repack::read` for each layout, and python/kvpack/weights.py for the Python-facing spec).

use std::path::PathBuf;

use half::f16;
use numpy::ndarray::{Array1, Array2};
use numpy::{IntoPyArray, PyArray1, PyArray2};
use pyo3::exceptions::{PyFileExistsError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use bitpack::{Bits, GroupAxis};
use repack::convert::{self, ConvertRequest};
use repack::read::{Parts, WeightLayer, read_weights};
use weights::WeightFormat;
use weights::bpw::{self, Cost};
use weights::nf4::NF4_LEVELS;

use crate::errors;

/// One quantized layer of a weight file. See `kvpack.weights.WeightLayer`
/// (python/kvpack/_kvpack.pyi).
#[pyclass(frozen, module = "kvpack.weights", name = "WeightLayer")]
pub struct PyWeightLayer {
    inner: WeightLayer,
}

/// A GGUF tensor's logical matrix is [K = cols, N = rows]: its arrays are handed out transposed,
/// in gguf-py's [rows, cols].
fn transposed<T: Clone>(a: &Array2<T>) -> Array2<T> {
    a.t().as_standard_layout().into_owned()
}

fn format_of(parts: &Parts) -> &'static str {
    match parts {
        Parts::Integer { format, .. } | Parts::Gguf { format, .. } => format.name(),
        Parts::Q4_1 { .. } => "q4_1",
        Parts::Nf4(_) => WeightFormat::Nf4.name(),
    }
}

#[pymethods]
impl PyWeightLayer {
    /// The layer's prefix (safetensors) or the tensor's name (GGUF).
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// gptq, gptq_v2, awq, q4_0, q8_0, q4_1 or nf4.
    #[getter]
    fn format(&self) -> &'static str {
        format_of(&self.inner.parts)
    }

    /// Bits per code.
    #[getter]
    fn bits(&self) -> u32 {
        match &self.inner.parts {
            Parts::Integer { weights, .. } | Parts::Gguf { weights, .. } => weights.bits(),
            Parts::Q4_1 { .. } | Parts::Nf4(_) => 4,
        }
    }

    /// Elements per scale: the group size, GGUF's block of 32, NF4's absmax block.
    #[getter]
    fn group_size(&self) -> usize {
        match &self.inner.parts {
            Parts::Integer { weights, .. } | Parts::Gguf { weights, .. } => weights.group_size(),
            Parts::Q4_1 { .. } => weights::gguf::q4_1::QK4_1,
            Parts::Nf4(tensor) => tensor.block_size,
        }
    }

    /// The shape of `codes` and of `dequantize()`: [K, N] for GPTQ and AWQ, [rows, cols] for
    /// GGUF and NF4.
    #[getter]
    fn shape(&self) -> (usize, usize) {
        match &self.inner.parts {
            Parts::Integer { weights, .. } => (weights.k(), weights.n()),
            Parts::Gguf { weights, .. } => (weights.n(), weights.k()),
            Parts::Q4_1 { rows, cols, .. } => (*rows, *cols),
            Parts::Nf4(tensor) => (tensor.shape[0], tensor.shape[1]),
        }
    }

    /// The codes, one uint8 per weight, unpacked, in `shape`.
    #[getter]
    fn codes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<u8>>> {
        let codes = match &self.inner.parts {
            Parts::Integer { weights, .. } => weights.codes().clone(),
            Parts::Gguf { weights, .. } => transposed(weights.codes()),
            Parts::Q4_1 { rows, cols, blocks } => {
                let flat: Vec<u8> = blocks.iter().flat_map(|b| b.codes()).collect();
                Array2::from_shape_vec((*rows, *cols), flat).map_err(shape_error)?
            }
            Parts::Nf4(tensor) => tensor.codes().map_err(|e| errors::weights(&e))?,
        };
        Ok(codes.into_pyarray(py))
    }

    /// The scales: float16 [groups, N] (GPTQ, AWQ), float16 d [rows, cols / 32] (GGUF), or
    /// NF4's float32 absmax, one per block of the row-major tensor (1-D).
    #[getter]
    fn scales<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(match &self.inner.parts {
            Parts::Integer { weights, .. } => weights.scales().clone().into_pyarray(py).into_any(),
            Parts::Gguf { weights, .. } => transposed(weights.scales()).into_pyarray(py).into_any(),
            Parts::Q4_1 { rows, blocks, .. } => q4_1_field(*rows, blocks, |b| b.d)?
                .into_pyarray(py)
                .into_any(),
            Parts::Nf4(tensor) => Array1::from(tensor.absmax.clone())
                .into_pyarray(py)
                .into_any(),
        })
    }

    /// The true zero points, uint8 in the shape of `scales` (weight = scale * (code - zero)):
    /// stored ones for GPTQ (v1 stores zero - 1; this is the zero itself) and AWQ, the fixed
    /// offset (8 for q4_0, 128 for q8_0) that GGUF stores in no byte; None for q4_1 and nf4.
    #[getter]
    fn zero_points<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray2<u8>>> {
        match &self.inner.parts {
            Parts::Integer { weights, .. } => Some(weights.zeros().clone().into_pyarray(py)),
            Parts::Gguf { weights, .. } => Some(transposed(weights.zeros()).into_pyarray(py)),
            Parts::Q4_1 { .. } | Parts::Nf4(_) => None,
        }
    }

    /// q4_1's float16 minimum m per block, [rows, cols / 32] (weight = d * code + m); else None.
    #[getter]
    fn minimums<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyArray2<f16>>>> {
        match &self.inner.parts {
            Parts::Q4_1 { rows, blocks, .. } => {
                Ok(Some(q4_1_field(*rows, blocks, |b| b.m)?.into_pyarray(py)))
            }
            _ => Ok(None),
        }
    }

    /// GPTQ's and AWQ's group of each of the K rows (uint32; AWQ stores none, so its groups are
    /// sequential); None for GGUF and NF4.
    #[getter]
    fn g_idx<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<u32>>> {
        match &self.inner.parts {
            Parts::Integer { weights, .. } => Some(weights.g_idx().to_vec().into_pyarray(py)),
            _ => None,
        }
    }

    /// The row permutation an earlier conversion to AWQ recorded (row k is the original row
    /// `input_permutation[k]`), or None.
    #[getter]
    fn input_permutation<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<u32>>> {
        match &self.inner.parts {
            Parts::Integer {
                input_permutation: Some(p),
                ..
            } => Some(p.clone().into_pyarray(py)),
            _ => None,
        }
    }

    /// NF4's 16 levels (float32, the table the codes index); None for the other layouts.
    #[getter]
    fn levels<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<f32>>> {
        match &self.inner.parts {
            Parts::Nf4(_) => Some(NF4_LEVELS.to_vec().into_pyarray(py)),
            _ => None,
        }
    }

    /// What the stored tensors cost, in bytes by part, counted from them: a dict as
    /// `kvpack.bpw` returns.
    #[getter]
    fn cost<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        cost_dict(py, &self.inner.cost)
    }

    /// Effective bits per weight: every stored byte (codes and metadata) over the weights.
    #[getter]
    fn bits_per_weight(&self) -> f64 {
        self.inner.cost.bits_per_element()
    }

    /// The weights the layer stands for, float32 in `shape`, as its library dequantizes them.
    fn dequantize<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let parts = &self.inner.parts;
        let values = py.detach(|| -> PyResult<Array2<f32>> {
            Ok(match parts {
                Parts::Integer { weights, .. } => weights.dequantize(),
                Parts::Gguf { weights, .. } => transposed(&weights.dequantize()),
                Parts::Q4_1 { rows, cols, blocks } => {
                    let flat = weights::gguf::q4_1::dequantize(blocks);
                    Array2::from_shape_vec((*rows, *cols), flat).map_err(shape_error)?
                }
                Parts::Nf4(tensor) => tensor.dequantize().map_err(|e| errors::weights(&e))?,
            })
        })?;
        Ok(values.into_pyarray(py))
    }

    fn __repr__(&self) -> String {
        let (rows, cols) = self.shape();
        format!(
            "WeightLayer(name={:?}, format={:?}, bits={}, group_size={}, shape=({rows}, {cols}), \
             bits_per_weight={:.4})",
            self.inner.name,
            self.format(),
            self.bits(),
            self.group_size(),
            self.bits_per_weight()
        )
    }
}

/// One float16 field of every q4_1 block, [rows, blocks per row].
fn q4_1_field(
    rows: usize,
    blocks: &[weights::gguf::q4_1::BlockQ4_1],
    field: impl Fn(&weights::gguf::q4_1::BlockQ4_1) -> f16,
) -> PyResult<Array2<f16>> {
    let values: Vec<f16> = blocks.iter().map(field).collect();
    let per_row = values.len() / rows.max(1);
    Array2::from_shape_vec((rows, per_row), values).map_err(shape_error)
}

fn shape_error(err: numpy::ndarray::ShapeError) -> PyErr {
    PyValueError::new_err(format!("internal shape mismatch: {err}"))
}

fn cost_dict<'py>(py: Python<'py>, cost: &Cost) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("elements", cost.elements)?;
    dict.set_item("code_bytes", cost.code_bytes)?;
    dict.set_item("scale_bytes", cost.scale_bytes)?;
    dict.set_item("zero_point_bytes", cost.zero_point_bytes)?;
    dict.set_item("g_idx_bytes", cost.g_idx_bytes)?;
    dict.set_item("extra_bytes", cost.extra_bytes)?;
    dict.set_item("metadata_bytes", cost.metadata_bytes())?;
    dict.set_item("total_bytes", cost.total_bytes())?;
    dict.set_item("bits_per_element", cost.bits_per_element())?;
    Ok(dict)
}

fn parse_format(name: &str, what: &str) -> PyResult<WeightFormat> {
    name.parse()
        .map_err(|e: weights::UnknownFormat| PyValueError::new_err(format!("{what}: {e}")))
}

/// The quantized layers of a safetensors checkpoint or GGUF file; see `kvpack.weights.read`.
#[pyfunction]
#[pyo3(signature = (path, format = None))]
pub fn read_weight_file(
    py: Python<'_>,
    path: PathBuf,
    format: Option<&str>,
) -> PyResult<Vec<PyWeightLayer>> {
    let format = format.map(|f| parse_format(f, "format")).transpose()?;
    let layers = py
        .detach(|| read_weights(&path, format))
        .map_err(|e| errors::weights(&e))?;
    Ok(layers
        .into_iter()
        .map(|inner| PyWeightLayer { inner })
        .collect())
}

/// `repack convert` on one checkpoint; see `kvpack.weights.convert`. The source's layout and
/// group size, when not given, are what `kvpack.weights.read` takes them to be.
#[pyfunction]
#[pyo3(signature = (src, dst, to, source_format = None, group_size = None, bits = None))]
pub fn convert_weight_file<'py>(
    py: Python<'py>,
    src: PathBuf,
    dst: PathBuf,
    to: &str,
    source_format: Option<&str>,
    group_size: Option<usize>,
    bits: Option<u32>,
) -> PyResult<Bound<'py, PyDict>> {
    let to = parse_format(to, "to")?;
    let source_format = source_format
        .map(|f| parse_format(f, "source_format"))
        .transpose()?;
    if dst.exists() {
        return Err(PyFileExistsError::new_err(format!(
            "{} already exists; refusing to overwrite it (nothing was written)",
            dst.display()
        )));
    }
    let conversion = py
        .detach(|| -> repack::Result<convert::Conversion> {
            let layers = read_weights(&src, source_format)?;
            let first = layers.first().and_then(|l| match &l.parts {
                Parts::Integer {
                    format, weights, ..
                } => Some((*format, weights.group_size())),
                _ => None,
            });
            let (from, found_group) = match (source_format, first) {
                (Some(from), Some((_, g))) => (from, g),
                (None, Some((from, g))) => (from, g),
                // No integer layer: let convert say what it refuses, naming the file.
                (from, None) => (from.unwrap_or(WeightFormat::Gptq), group_size.unwrap_or(1)),
            };
            let request = ConvertRequest {
                from,
                to,
                group_size: group_size.unwrap_or(found_group),
                bits,
            };
            convert::convert(&src, &dst, request)
        })
        .map_err(|e| errors::weights(&e))?;
    let dict = PyDict::new(py);
    dict.set_item("from", conversion.from.name())?;
    dict.set_item("to", conversion.to.name())?;
    dict.set_item("group_size", conversion.group_size)?;
    let mut layers = Vec::with_capacity(conversion.layers.len());
    for layer in &conversion.layers {
        let entry = PyDict::new(py);
        entry.set_item("name", &layer.name)?;
        entry.set_item("bits", layer.bits)?;
        entry.set_item("logical_shape", layer.logical_shape.to_vec())?;
        entry.set_item("stored_shape", layer.stored_shape.to_vec())?;
        entry.set_item("before", cost_dict(py, &layer.before)?)?;
        entry.set_item("after", cost_dict(py, &layer.after)?)?;
        entry.set_item("permuted", layer.permuted)?;
        entry.set_item("restored", layer.restored)?;
        layers.push(entry);
    }
    dict.set_item("layers", layers)?;
    dict.set_item("passed_through", conversion.passed_through)?;
    dict.set_item("kept_metadata", conversion.kept_metadata.clone())?;
    Ok(dict)
}

/// The cost of a `rows` x `cols` matrix under one storage layout, as `repack bpw --bits` prints
/// it; see `kvpack.bpw`.
#[pyfunction]
#[pyo3(signature = (rows, cols, bits, group_size, axis, scale, zero_points, g_idx, padding, container, extra_bytes_per_group))]
#[allow(clippy::too_many_arguments)]
pub fn layout_cost<'py>(
    py: Python<'py>,
    rows: usize,
    cols: usize,
    bits: u32,
    group_size: usize,
    axis: &str,
    scale: &str,
    zero_points: &str,
    g_idx: bool,
    padding: &str,
    container: &str,
    extra_bytes_per_group: usize,
) -> PyResult<Bound<'py, PyDict>> {
    // Each parse error names its field and the values it takes.
    let value = |err: &dyn std::fmt::Display| PyValueError::new_err(err.to_string());
    let bits = Bits::new(bits).map_err(|e| value(&e))?;
    let format = bpw::Format {
        group_size,
        axis: axis.parse::<GroupAxis>().map_err(|e| value(&e))?,
        zero_points: zero_points.parse().map_err(|e: bpw::BpwError| value(&e))?,
        g_idx,
        padding: padding.parse().map_err(|e: bpw::BpwError| value(&e))?,
        container: container.parse().map_err(|e: bpw::BpwError| value(&e))?,
        extra_bytes_per_group,
        ..bpw::Format::new(
            bits,
            group_size,
            scale.parse().map_err(|e: bpw::BpwError| value(&e))?,
        )
    };
    let cost = bpw::cost(&format, rows, cols).map_err(|e| errors::weights(&e))?;
    cost_dict(py, &cost)
}
