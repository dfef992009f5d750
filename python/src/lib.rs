//! `kvpack._kvpack`: the Python extension module behind the `kvpack` package (python/kvpack/).
//!
//! A binding only: every rule lives in the workspace's crates, which know nothing of Python.
//! What is exposed, and from where:
//! - [`codec`]: `encode`, `decode` and the `PackedTensor` class, over `kvcodec`;
//! - [`study`]: `run`, over `kvstudy::run::run_protocol`, as the `runner` binary calls it;
//! - [`report`]: `audit` and the `AuditReport` class, over `audit::audit_dir_with`, as the `audit`
//!   binary calls it;
//! - [`capture`]: `models_kv`, a real model's q, k and v for one text, as `runner kv` writes them;
//! - [`schemes`]: `kvpack.schemes.cache`, one layer's K and V under a named scheme of the
//!   literature, over `kvschemes`;
//! - [`weights`]: `kvpack.weights.read`, `convert` and `kvpack.bpw`, over `repack` and `weights`,
//!   as the `repack` binary uses them;
//! - [`errors`]: the exception classes and how each Rust error becomes one.
//!
//! Work runs with the GIL released (`Python::detach`): encoding, decoding, a study run and an
//! audit never hold other Python threads back.

use pyo3::prelude::*;

pub mod capture;
pub mod codec;
pub mod errors;
pub mod report;
pub mod schemes;
pub mod study;
pub mod weights;

/// The extension module: the functions and classes that `kvpack/__init__.py` re-exports.
#[pymodule]
fn _kvpack(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<codec::PyPackedTensor>()?;
    m.add_class::<report::AuditReport>()?;
    m.add_function(wrap_pyfunction!(codec::encode, m)?)?;
    m.add_function(wrap_pyfunction!(codec::decode, m)?)?;
    m.add_function(wrap_pyfunction!(report::audit, m)?)?;
    m.add_function(wrap_pyfunction!(study::run, m)?)?;
    m.add_function(wrap_pyfunction!(capture::models_kv, m)?)?;
    m.add_class::<weights::PyWeightLayer>()?;
    m.add_class::<schemes::SchemeCache>()?;
    m.add_function(wrap_pyfunction!(schemes::scheme_cache, m)?)?;
    m.add_function(wrap_pyfunction!(schemes::scheme_names, m)?)?;
    m.add_function(wrap_pyfunction!(weights::read_weight_file, m)?)?;
    m.add_function(wrap_pyfunction!(weights::convert_weight_file, m)?)?;
    m.add_function(wrap_pyfunction!(weights::layout_cost, m)?)?;
    m.add("CodecError", py.get_type::<errors::CodecError>())?;
    m.add("ProtocolError", py.get_type::<errors::ProtocolError>())?;
    m.add("RunError", py.get_type::<errors::RunError>())?;
    m.add("WeightsError", py.get_type::<errors::WeightsError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("BUILD_TREE", audit::default_tree().display().to_string())?;
    Ok(())
}
