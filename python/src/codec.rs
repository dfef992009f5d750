//! `encode`, `decode` and `PackedTensor`: `kvcodec` with NumPy arrays in and out.
//!
//! Input: a 2-D `numpy.ndarray` of float32 (tokens x features), of any memory layout. It is
//! read in place; `kvcodec::encode` takes the strided view and makes one C-order copy only when
//! the array is neither C- nor Fortran-contiguous (its dense fast paths take both). An unaligned
//! array is copied once first (a Rust view must be aligned). Other dtypes are refused with a
//! `TypeError`, never converted: the rule is defined on float32 values, and a silent conversion
//! from float64 would round before quantizing.
//!
//! Output: a `PackedTensor`, the codec's own type, whose parts (`codes`, `scales`,
//! `zero_points`) are read-only NumPy views of its memory, without a copy.
//!
//! One bound is the binding's own, not the codec's: a group longer than the rows it groups is
//! padded with zeros to the group size, and that padding may add at most [`MAX_PADDING`] codes,
//! or as many codes as the input has elements if that is more. Without it a huge group size (say
//! 2**40) would ask for terabytes, and an allocation failure aborts the process, which takes the
//! interpreter with it. (The studies bound the whole padded view by the same 2^27,
//! `kvstudy::protocol::MAX_MATRIX_ELEMENTS`; a library call bounds only the padding, so that
//! no input the codec takes is refused for its size.)

use numpy::ndarray::{Array2, ArrayView1};
use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyArrayDescrMethods, PyReadonlyArray2, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use kvcodec::{GroupAxis, Layout, Mode, PackedTensor};

use crate::errors;

/// The most padding codes a group longer than its rows may add, unless the input is larger.
pub const MAX_PADDING: usize = 1 << 27;

/// A packed N x D (tokens x features) matrix: its codes, float32 scales and (asymmetric)
/// zero points, under one layout. See `kvpack.PackedTensor` (python/kvpack/_kvpack.pyi).
#[pyclass(frozen, eq, module = "kvpack", name = "PackedTensor")]
#[derive(PartialEq)]
pub struct PyPackedTensor {
    inner: PackedTensor,
}

#[pymethods]
impl PyPackedTensor {
    /// Assembles a packed tensor from stored parts, checked as `kvcodec` checks them.
    #[staticmethod]
    #[pyo3(signature = (codes, scales, shape, bits, group_size, axis = "token", mode = "symmetric", zero_points = None))]
    #[allow(clippy::too_many_arguments)]
    fn from_parts(
        codes: &Bound<'_, PyAny>,
        scales: &Bound<'_, PyAny>,
        shape: (i64, i64),
        bits: &Bound<'_, PyAny>,
        group_size: &Bound<'_, PyAny>,
        axis: &str,
        mode: &str,
        zero_points: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let layout = layout(bits, group_size, axis, mode)?;
        let stored_shape = |v: i64| {
            i32::try_from(v).map_err(|_| {
                PyValueError::new_err(format!(
                    "shape {shape:?} is not two positive dimensions that fit an i32"
                ))
            })
        };
        let shape = [stored_shape(shape.0)?, stored_shape(shape.1)?];
        let codes = bytes_arg("codes", codes)?;
        let zero_points = match zero_points {
            Some(z) => bytes_arg("zero_points", z)?,
            None => Vec::new(),
        };
        let scales = scales
            .extract::<PyReadonlyArray2<'_, f32>>()
            .map_err(|_| PyTypeError::new_err("scales must be a 2-D numpy.ndarray of float32"))?
            .as_array()
            .to_owned();
        let inner =
            PackedTensor::from_parts_with_zero_points(layout, shape, codes, scales, zero_points)
                .map_err(errors::codec)?;
        Ok(PyPackedTensor { inner })
    }

    /// The packed code stream, uint8, read-only (a view of this tensor's memory).
    #[getter]
    fn codes<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let view = ArrayView1::from(slf.get().inner.code_bytes());
        // SAFETY: the class is frozen, so the stream is never changed or reallocated while the
        // tensor, which the array keeps alive as its base, lives.
        let array = unsafe { PyArray1::borrow_from_array(&view, slf.clone().into_any()) };
        read_only(array)
    }

    /// The float32 scales, [rows, groups per row] of the grouped view, read-only.
    #[getter]
    fn scales<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        // SAFETY: as for `codes`.
        let array = unsafe {
            PyArray2::borrow_from_array(slf.get().inner.scales(), slf.clone().into_any())
        };
        read_only(array)
    }

    /// The packed zero point stream, uint8, read-only; None for a symmetric tensor.
    #[getter]
    fn zero_points<'py>(slf: Bound<'py, Self>) -> PyResult<Option<Bound<'py, PyArray1<u8>>>> {
        if slf.get().inner.layout().mode == Mode::Symmetric {
            return Ok(None);
        }
        let view = ArrayView1::from(slf.get().inner.zero_point_bytes());
        // SAFETY: as for `codes`.
        let array = unsafe { PyArray1::borrow_from_array(&view, slf.clone().into_any()) };
        read_only(array).map(Some)
    }

    /// The logical shape (tokens, features).
    #[getter]
    fn shape(&self) -> (usize, usize) {
        let [n, d] = self.inner.shape();
        (n, d)
    }

    /// The code width in bits.
    #[getter]
    fn bits(&self) -> u32 {
        self.inner.layout().bits.get()
    }

    /// Consecutive elements per group.
    #[getter]
    fn group_size(&self) -> usize {
        self.inner.layout().group_size
    }

    /// The axis groups run along: "token" or "feature".
    #[getter]
    fn axis(&self) -> &'static str {
        axis_name(self.inner.layout().axis)
    }

    /// "symmetric" or "asymmetric".
    #[getter]
    fn mode(&self) -> &'static str {
        mode_name(self.inner.layout().mode)
    }

    /// Bytes stored: code bytes, 4 per scale, zero point bytes and the two i32 shape values.
    #[getter]
    fn payload_bytes(&self) -> usize {
        self.inner.payload_bytes()
    }

    /// The stored codes unpacked, uint8 [rows, padded row length] of the grouped view, padding
    /// included (a new array).
    fn stored_codes<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray2<u8>> {
        let geometry = self.inner.geometry();
        let codes = py.detach(|| self.inner.stored_codes());
        Array2::from_shape_vec((geometry.rows, geometry.padded_row_len), codes)
            .expect("one stored code per element of the padded grouped view")
            .into_pyarray(py)
    }

    /// What decoding subtracts from each group's codes, uint8 [rows, groups per row]: qmax for a
    /// symmetric tensor, the unpacked zero points of an asymmetric one (a new array).
    fn offsets<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray2<u8>> {
        self.inner.offsets().into_pyarray(py)
    }

    /// The float32 matrix the codes stand for, [tokens, features] (a new C-order array).
    fn decode<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray2<f32>> {
        decode_tensor(py, &self.inner)
    }

    /// Pickling (and so multiprocessing): the stored parts, rebuilt and checked by `from_parts`.
    fn __reduce__<'py>(
        slf: Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let constructor = py.get_type::<PyPackedTensor>().getattr("from_parts")?;
        let tensor = slf.get();
        let layout = tensor.inner.layout();
        let zero_points = match PyPackedTensor::zero_points(slf.clone())? {
            Some(z) => z.into_any(),
            None => py.None().into_bound(py),
        };
        let args = (
            PyPackedTensor::codes(slf.clone())?,
            PyPackedTensor::scales(slf.clone())?,
            tensor.shape(),
            layout.bits.get(),
            layout.group_size,
            axis_name(layout.axis),
            mode_name(layout.mode),
            zero_points,
        )
            .into_pyobject(py)?;
        Ok((constructor, args))
    }

    fn __repr__(&self) -> String {
        let [n, d] = self.inner.shape();
        let layout = self.inner.layout();
        format!(
            "PackedTensor(shape=({n}, {d}), bits={}, group_size={}, axis='{}', mode='{}', \
             payload_bytes={})",
            layout.bits.get(),
            layout.group_size,
            axis_name(layout.axis),
            mode_name(layout.mode),
            self.inner.payload_bytes()
        )
    }
}

/// Quantizes a 2-D float32 array of N tokens x D features into b-bit codes in groups.
///
/// `bits`: 2 to 8 (symmetric) or 1 to 8 (asymmetric). `group_size`: consecutive elements per
/// group, at least 1. `axis`: "token" groups run down each feature column (K, as in KIVI),
/// "feature" groups run along each token row (V). `mode`: "symmetric" (scale = max|x| / qmax,
/// stored code = round_half_even(x / scale) + qmax) or "asymmetric" (a scale and an integer zero
/// point per group, the range widened to contain 0).
///
/// `x` must be a float32 numpy.ndarray (TypeError otherwise: nothing is converted); any strides
/// or order. Raises kvpack.CodecError (a ValueError) with the codec's message for NaN or an
/// infinity, an empty matrix, an unsupported width or a group size of 0, and ValueError for a
/// bad axis or mode, or a group so long that its padding would exceed both 2^27 codes and the
/// input's size. The GIL is released while encoding; do not write to `x` from another thread
/// meanwhile.
#[pyfunction]
#[pyo3(signature = (x, bits, group_size, axis = "token", mode = "symmetric"))]
pub fn encode(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    bits: &Bound<'_, PyAny>,
    group_size: &Bound<'_, PyAny>,
    axis: &str,
    mode: &str,
) -> PyResult<PyPackedTensor> {
    let layout = layout(bits, group_size, axis, mode)?;
    let x = float32_matrix(x)?;
    let view = x.as_array();
    check_padding(layout, view.nrows(), view.ncols())?;
    let inner = py
        .detach(|| kvcodec::encode(view, layout))
        .map_err(errors::codec)?;
    Ok(PyPackedTensor { inner })
}

/// The float32 matrix a packed tensor stands for, N x D (a new C-order array):
/// (stored code - offset) * scale per element, offset qmax (symmetric) or the group's zero point.
#[pyfunction]
pub fn decode<'py>(
    py: Python<'py>,
    packed: &Bound<'py, PyPackedTensor>,
) -> Bound<'py, PyArray2<f32>> {
    decode_tensor(py, &packed.get().inner)
}

fn decode_tensor<'py>(py: Python<'py>, packed: &PackedTensor) -> Bound<'py, PyArray2<f32>> {
    py.detach(|| kvcodec::decode(packed)).into_pyarray(py)
}

/// The array, borrowed read-only for the call: float32, 2-D, aligned (else copied once).
fn float32_matrix<'py>(x: &Bound<'py, PyAny>) -> PyResult<PyReadonlyArray2<'py, f32>> {
    let py = x.py();
    let array = x.cast::<PyUntypedArray>().map_err(|_| {
        let type_name = x
            .get_type()
            .name()
            .map_or_else(|_| "?".to_string(), |n| n.to_string());
        PyTypeError::new_err(format!(
            "x must be a numpy.ndarray of float32, got {type_name} (use np.asarray(x, dtype=np.float32))"
        ))
    })?;
    let dtype = array.dtype();
    if !dtype.is_equiv_to(&numpy::dtype::<f32>(py)) {
        return Err(PyTypeError::new_err(format!(
            "x has dtype {}; kvpack takes native float32 only, since the codec's rule is defined \
             on float32 values (convert with x.astype(np.float32), which rounds)",
            dtype.str()?
        )));
    }
    if array.ndim() != 2 {
        return Err(PyValueError::new_err(format!(
            "x must be 2-D (tokens x features), got shape {:?}",
            array.shape()
        )));
    }
    let aligned = if array.is_aligned() {
        x.clone()
    } else {
        x.call_method0("copy")?
    };
    aligned.extract::<PyReadonlyArray2<'py, f32>>()
}

/// The layout named by the arguments, refused with the codec's message where the codec refuses.
fn layout(
    bits: &Bound<'_, PyAny>,
    group_size: &Bound<'_, PyAny>,
    axis: &str,
    mode: &str,
) -> PyResult<Layout> {
    let axis = match axis {
        "token" => GroupAxis::Token,
        "feature" => GroupAxis::Feature,
        other => {
            return Err(PyValueError::new_err(format!(
                "axis must be 'token' or 'feature', got {other:?}"
            )));
        }
    };
    let mode = match mode {
        "symmetric" => Mode::Symmetric,
        "asymmetric" => Mode::Asymmetric,
        other => {
            return Err(PyValueError::new_err(format!(
                "mode must be 'symmetric' or 'asymmetric', got {other:?}"
            )));
        }
    };
    let bits = int_arg("bits", bits)?;
    let group_size = int_arg("group_size", group_size)?;
    // Outside u32 or usize, the codec's own refusal of a width or a size it cannot take.
    let Ok(bits) = u32::try_from(bits) else {
        return Err(errors::CodecError::new_err(format!(
            "unsupported bit width {bits}: {} codes take {} to 8 bits",
            mode_name(mode),
            if mode == Mode::Symmetric { 2 } else { 1 }
        )));
    };
    let Ok(group_size) = usize::try_from(group_size) else {
        return Err(errors::CodecError::new_err(format!(
            "group size must be at least 1, got {group_size}"
        )));
    };
    Layout::with_mode(axis, mode, bits, group_size).map_err(errors::codec)
}

/// An integer argument (a Python int or anything with `__index__`), as i64.
fn int_arg(name: &str, value: &Bound<'_, PyAny>) -> PyResult<i64> {
    value.extract::<i64>().map_err(|err| {
        if err.is_instance_of::<PyOverflowError>(value.py()) {
            PyValueError::new_err(format!("{name} {value} is out of range"))
        } else {
            let type_name = value
                .get_type()
                .name()
                .map_or_else(|_| "?".to_string(), |n| n.to_string());
            PyTypeError::new_err(format!("{name} must be an int, got {type_name}"))
        }
    })
}

/// A 1-D uint8 array's bytes (any layout).
fn bytes_arg(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let array = value
        .extract::<numpy::PyReadonlyArray1<'_, u8>>()
        .map_err(|_| {
            PyTypeError::new_err(format!("{name} must be a 1-D numpy.ndarray of uint8"))
        })?;
    Ok(array.as_array().to_vec())
}

/// Refuses a group so much longer than its rows that the padding would exceed [`MAX_PADDING`]
/// codes and the input's size.
fn check_padding(layout: Layout, tokens: usize, features: usize) -> PyResult<()> {
    let (rows, row_len, along) = match layout.axis {
        GroupAxis::Token => (features, tokens, "tokens"),
        GroupAxis::Feature => (tokens, features, "features"),
    };
    if rows == 0 || row_len == 0 || layout.group_size <= row_len {
        return Ok(());
    }
    let limit = MAX_PADDING.max(tokens * features);
    let padding = rows.checked_mul(layout.group_size - row_len);
    if padding.is_some_and(|p| p <= limit) {
        return Ok(());
    }
    Err(PyValueError::new_err(format!(
        "group size {} is longer than the {row_len} {along} it groups: padding {rows} rows to it \
         would add {} zero codes, more than the {limit} allowed",
        layout.group_size,
        padding.map_or_else(|| "more than 2^64".to_string(), |p| p.to_string()),
    )))
}

/// Makes an array read-only (its memory is a frozen tensor's).
fn read_only<'py, T>(array: Bound<'py, T>) -> PyResult<Bound<'py, T>> {
    array
        .as_any()
        .getattr("flags")?
        .setattr("writeable", false)?;
    Ok(array)
}

fn axis_name(axis: GroupAxis) -> &'static str {
    match axis {
        GroupAxis::Token => "token",
        GroupAxis::Feature => "feature",
    }
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Symmetric => "symmetric",
        Mode::Asymmetric => "asymmetric",
    }
}
