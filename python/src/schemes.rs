//! `kvpack.schemes`: one layer's K and V under a named scheme of the literature (`kvschemes`:
//! KIVI, llama.cpp's cache types with and without their rotation), NumPy arrays in and out.
//!
//! A scheme treats K and V differently (KIVI groups keys per channel and values per token, and
//! keeps a residual), so it takes both at once, [kv_heads, tokens, head_dim] (or one head's
//! [tokens, head_dim]), float32, K after RoPE. The result is what the cache the whole text leaves
//! holds (the `prefill` schedule of `runner quality --scheme`): the values attention reads, how
//! many positions are quantized, and the bytes stored.

use numpy::ndarray::{Array3, Ix3};
use numpy::{IntoPyArray, PyArray3, PyArrayDyn, PyArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use kvschemes::{LayerCache, Schedule, Scheme};

/// One layer's cache under a scheme. See `kvpack.schemes.SchemeCache`.
#[pyclass(frozen, module = "kvpack.schemes", name = "SchemeCache")]
pub struct SchemeCache {
    scheme: Scheme,
    k: Array3<f32>,
    v: Array3<f32>,
    one_head: bool,
    quantized: (usize, usize),
    stored: kvschemes::Stored,
    values: usize,
}

/// A float32 array of 2 or 3 dimensions as [heads, tokens, head_dim], and whether it was 2-D.
fn heads(x: &Bound<'_, PyAny>, name: &str) -> PyResult<(Array3<f32>, bool)> {
    let array = x.cast::<PyArrayDyn<f32>>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{name} must be a numpy.ndarray of float32 (convert with .astype(numpy.float32))"
        ))
    })?;
    let view = array.readonly();
    let view = view.as_array();
    match view.ndim() {
        3 => Ok((
            view.into_dimensionality::<Ix3>().expect("3-D").to_owned(),
            false,
        )),
        2 => Ok((
            view.insert_axis(numpy::ndarray::Axis(0))
                .into_dimensionality::<Ix3>()
                .expect("3-D")
                .to_owned(),
            true,
        )),
        n => Err(PyValueError::new_err(format!(
            "{name} has {n} dimensions; give [kv_heads, tokens, head_dim] or [tokens, head_dim]"
        ))),
    }
}

/// `kvpack.schemes.cache`: K and V under `scheme`.
#[pyfunction]
#[pyo3(signature = (k, v, scheme, layer = 0, layers = 1))]
pub fn scheme_cache(
    py: Python<'_>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    scheme: &str,
    layer: usize,
    layers: usize,
) -> PyResult<SchemeCache> {
    if layer >= layers {
        return Err(PyValueError::new_err(format!(
            "layer {layer} is not one of the {layers} layers (0 to {})",
            layers.saturating_sub(1)
        )));
    }
    let scheme: Scheme = scheme
        .parse()
        .map_err(|e: kvschemes::UnknownScheme| PyValueError::new_err(e.to_string()))?;
    let (k, one_head) = heads(k, "k")?;
    let (v, _) = heads(v, "v")?;
    let cache = py
        .detach(|| LayerCache::new(scheme, Schedule::Prefill, (layer, layers), &k, &v))
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let last = k.dim().1.saturating_sub(1);
    let (k_read, v_read) = py.detach(|| cache.read(last));
    Ok(SchemeCache {
        scheme,
        quantized: cache.quantized(last),
        stored: cache.stored(),
        values: 2 * k.len(),
        k: k_read,
        v: v_read,
        one_head,
    })
}

impl SchemeCache {
    fn out<'py>(&self, py: Python<'py>, x: &Array3<f32>) -> Bound<'py, PyAny> {
        if self.one_head {
            x.index_axis(numpy::ndarray::Axis(0), 0)
                .to_owned()
                .into_pyarray(py)
                .into_any()
        } else {
            let array: Bound<'py, PyArray3<f32>> = x.clone().into_pyarray(py);
            array.into_any()
        }
    }
}

#[pymethods]
impl SchemeCache {
    /// The scheme's name.
    #[getter]
    fn scheme(&self) -> String {
        self.scheme.to_string()
    }

    /// K as attention reads it (float32, the input's shape).
    #[getter]
    fn k<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        self.out(py, &self.k)
    }

    /// V as attention reads it.
    #[getter]
    fn v<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        self.out(py, &self.v)
    }

    /// Positions quantized, (keys, values); the rest are held in full precision.
    #[getter]
    fn quantized(&self) -> (usize, usize) {
        self.quantized
    }

    /// Bytes stored, by part: `codes`, `metadata` (scales, minimums), `full_precision` (4 per
    /// value), `outliers` (KVQuant's sparse values; 0 for the schemes this call builds),
    /// `total`.
    #[getter]
    fn stored<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        dict.set_item("codes", self.stored.codes)?;
        dict.set_item("metadata", self.stored.metadata)?;
        dict.set_item("full_precision", self.stored.full_precision)?;
        dict.set_item("outliers", self.stored.outliers)?;
        dict.set_item("total", self.stored.total())?;
        Ok(dict)
    }

    /// Every stored byte over the K and V values, in bits.
    #[getter]
    fn bits_per_element(&self) -> f64 {
        self.stored.total() as f64 * 8.0 / self.values as f64
    }

    fn __repr__(&self) -> String {
        format!(
            "SchemeCache(scheme={:?}, quantized={:?}, bits_per_element={:.4})",
            self.scheme.to_string(),
            self.quantized,
            self.bits_per_element()
        )
    }
}

/// Every scheme's name.
#[pyfunction]
pub fn scheme_names() -> Vec<String> {
    Scheme::all().iter().map(ToString::to_string).collect()
}
