//! The exceptions the module raises, and how a Rust error becomes one.
//!
//! - `kvpack.CodecError` (a `ValueError`): the codec refused the input or the stored parts
//!   (`kvcodec::KvError`; NaN or an infinity, an empty matrix, a width the mode cannot store, a
//!   group size of 0, a scale that overflows, parts that do not agree);
//! - `kvpack.ProtocolError` (a `ValueError`): a protocol that does not parse or breaks a bound,
//!   naming its field;
//! - `kvpack.WeightsError` (a `ValueError`): `repack` refused a weight file, a layout or a
//!   conversion (`repack::Error`: unreadable or damaged files, a layout it cannot prove, an
//!   unknown block type);
//! - `kvpack.RunError` (a `RuntimeError`): a study run that did not finish (nothing is left
//!   behind);
//! - `TypeError` and `ValueError` for arguments of the wrong type or value, raised here.
//!
//! Every message is the Rust error's, followed by its sources (`: `-separated, as the binaries
//! print them with `{:#}`).

use std::error::Error;

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

create_exception!(
    kvpack,
    CodecError,
    PyValueError,
    "The codec refused the input or the stored parts (the message is kvcodec's)."
);
create_exception!(
    kvpack,
    ProtocolError,
    PyValueError,
    "A study protocol that does not parse or breaks a bound (the message names the field)."
);
create_exception!(
    kvpack,
    WeightsError,
    PyValueError,
    "A weight file, layout or conversion that repack refused (the message is repack's)."
);
create_exception!(
    kvpack,
    RunError,
    PyRuntimeError,
    "A study run that did not finish; nothing is left behind."
);

/// The error's message followed by those of its sources.
pub fn chain(err: &dyn Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let next = cause.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = cause.source();
    }
    text
}

/// A codec error as `kvpack.CodecError`.
pub fn codec(err: kvcodec::KvError) -> PyErr {
    CodecError::new_err(chain(&err))
}

/// A protocol error as `kvpack.ProtocolError`.
pub fn protocol(err: &dyn Error) -> PyErr {
    ProtocolError::new_err(chain(err))
}

/// A run error as `kvpack.RunError`.
pub fn run(err: &dyn Error) -> PyErr {
    RunError::new_err(chain(err))
}

/// A weight-file error as `kvpack.WeightsError`.
pub fn weights(err: &dyn Error) -> PyErr {
    WeightsError::new_err(chain(err))
}
