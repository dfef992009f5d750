//! `models_kv`: a real model's per-layer q, k and v for one text, written as `runner kv --model M
//! --text T --out FILE.npz` writes them (`kvstudy::capture::write_npz`, the same members:
//! `ids`, `l<layer>_q`, `l<layer>_k`, `l<layer>_v`, the final hidden state and, for SmolLM2, the
//! logits). `kvpack.models.kv` (python/kvpack/models.py) reads the file back into a dict.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors;

/// Runs `model` on `text` and writes its K/V capture to the new file `out`. Returns the number
/// of tokens and of layers.
#[pyfunction]
pub fn models_kv(
    py: Python<'_>,
    model: &str,
    text: &str,
    out: PathBuf,
) -> PyResult<(usize, usize)> {
    let model: models::ModelName = model
        .parse()
        .map_err(|e: models::files::FilesError| PyValueError::new_err(errors::chain(&e)))?;
    kvstudy::capture::check_new_file(&out).map_err(|e| errors::run(&e))?;
    py.detach(|| -> Result<(usize, usize), String> {
        let files = models::ModelFiles::locate(model).map_err(|e| errors::chain(&e))?;
        let loaded = models::load(&files).map_err(|e| errors::chain(&e))?;
        let ids = loaded.encode(text).map_err(|e| errors::chain(&e))?;
        let capture = loaded.forward(&ids).map_err(|e| errors::chain(&e))?;
        kvstudy::capture::write_npz(&out, model, &capture).map_err(|e| errors::chain(&e))?;
        Ok((capture.ids.len(), capture.layers.len()))
    })
    .map_err(errors::RunError::new_err)
}
