//! `run`: a packed-KV study protocol into a new evidence directory, through
//! `kvstudy::run::run_protocol`, as the `runner` binary runs it (`runner --out DIR [--protocol
//! FILE] [--threads N]`): the output must not exist, stale staging directories beside it are
//! cleaned up, a model's files are located before anything is computed.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use kvstudy::protocol::{FROZEN_PATH, Protocol};
use kvstudy::run::{Run, run_protocol};

use crate::errors;

/// Runs a protocol into `out`; see `kvpack.run` (python/kvpack/__init__.py), which turns a dict
/// into JSON text. Exactly one of `protocol_json` (with `source`, recorded as the protocol's
/// source) and `protocol_path` may be given; neither runs the frozen protocol. Returns `out`.
#[pyfunction]
#[pyo3(signature = (out, protocol_json = None, protocol_path = None, source = None, threads = None))]
pub fn run(
    py: Python<'_>,
    out: PathBuf,
    protocol_json: Option<String>,
    protocol_path: Option<PathBuf>,
    source: Option<String>,
    threads: Option<i64>,
) -> PyResult<PathBuf> {
    let threads = match threads {
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        Some(n) => match u16::try_from(n) {
            Ok(n) if n >= 1 => usize::from(n),
            _ => {
                return Err(PyValueError::new_err(format!(
                    "threads must be from 1 to {}, got {n}",
                    u16::MAX
                )));
            }
        },
    };
    evidence::check_new(&out).map_err(|e| errors::run(&e))?;
    let (protocol, source) = match (protocol_json, protocol_path) {
        (Some(_), Some(_)) => {
            return Err(PyValueError::new_err(
                "give the protocol as JSON text or as a path, not both",
            ));
        }
        (Some(text), None) => {
            let protocol = Protocol::from_json(&text).map_err(|e| errors::protocol(&e))?;
            (protocol, source.unwrap_or_else(|| "kvpack.run".into()))
        }
        (None, Some(path)) => {
            let text =
                kvstudy::validate::read_protocol_file(&path).map_err(|e| errors::protocol(&e))?;
            let protocol = Protocol::from_json(&text).map_err(|e| {
                errors::ProtocolError::new_err(format!(
                    "protocol {}: {}",
                    path.display(),
                    errors::chain(&e)
                ))
            })?;
            (protocol, path.display().to_string())
        }
        (None, None) => (Protocol::frozen(), format!("embedded {FROZEN_PATH}")),
    };
    clean_up_dead_runs(py, &out);
    if let Some(model) = &protocol.model {
        models::ModelFiles::locate(model.name).map_err(|e| errors::run(&e))?;
    }
    let run = Run {
        protocol: &protocol,
        source: &source,
        shard: None,
        threads,
    };
    py.detach(|| run_protocol(&run, &out, |_| {}))
        .map_err(|e| errors::run(&e))?;
    Ok(out)
}

/// Removes the staging directories of killed runs beside `out`, warning (as the runner does on
/// stderr, here with `warnings.warn`) about any it could not remove.
fn clean_up_dead_runs(py: Python<'_>, out: &std::path::Path) {
    let cleanup = evidence::remove_stale_staging(&evidence::parent_dir(out));
    for (path, err) in &cleanup.failed {
        let message = format!("kvpack.run: could not clean up {}: {err}", path.display());
        let _ = PyErr::warn(
            py,
            &py.get_type::<pyo3::exceptions::PyUserWarning>(),
            &std::ffi::CString::new(message).unwrap_or_default(),
            1,
        );
    }
}
