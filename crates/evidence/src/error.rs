//! What can go wrong while writing evidence, each cause printed once.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

use crate::ARRAYS;

/// Why an evidence directory could not be written.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum EvidenceError {
    #[error("output directory {0} already exists; choose a new directory (runs never overwrite)")]
    Exists(PathBuf),
    #[error("output path {0} has no final component to name a directory")]
    NoName(PathBuf),
    #[error("cannot create output directory {out}: {ancestor} is not a directory")]
    NotADirectory { out: PathBuf, ancestor: PathBuf },
    /// The cause is the source, so it is printed once, after the context.
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// An archive error that is not an I/O error (those are `Io`), as the npz writer words it.
    #[error("writing {ARRAYS}: {0}")]
    Npz(String),
    /// A chart the study could not draw, as plotters words it.
    #[error("drawing {file}: {message}")]
    Chart { file: &'static str, message: String },
    #[error("encoding {file}")]
    Json {
        file: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> EvidenceError {
    let context = context.into();
    move |source| EvidenceError::Io { context, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_error_prints_its_cause_once() {
        let err = EvidenceError::Io {
            context: "writing x".into(),
            source: io::Error::new(io::ErrorKind::StorageFull, "no space left on device"),
        };
        let chain = format!("{:#}", anyhow::Error::from(err));
        assert_eq!(chain, "writing x: no space left on device");
    }
}
