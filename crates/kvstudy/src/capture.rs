//! `runner kv`: what a real model computed for one text, as an `.npz` that NumPy reads directly.
//!
//! Members (ndarray-npy appends `.npy`): `ids` (int64, `[tokens]`); per layer L `l{L}_q`
//! [query heads, tokens, head_dim], `l{L}_k` and `l{L}_v` [KV heads, tokens, head_dim] (float32;
//! q and K after RoPE for a rotary model, as a cache holds K); the last residual stream,
//! `last_hidden` for MiniLM (after its last LayerNorm), `hidden_final` for SmolLM2 (before
//! `output_norm`) and for Gemma 3 (after `output_norm`), [tokens, hidden]; and for the decoders
//! `logits` [tokens, vocabulary]. The names and meanings are those of each model's public
//! reference, so a dump and its reference compare member by member.
//!
//! The file is written next to its destination under a temporary name and moved into place
//! only when complete, never over an existing file.

use std::path::{Path, PathBuf};

use evidence::npy::Le;
use models::{Capture, ModelName};
use ndarray::Array1;
use ndarray_npy::NpzWriter;
use thiserror::Error;

/// Why the dump could not be written.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum KvDumpError {
    /// The destination exists.
    #[error("{} exists; `runner kv` never overwrites a file", .0.display())]
    Exists(PathBuf),
    /// The destination's directory is missing or not a directory.
    #[error(
        "cannot write {}: {} is not an existing directory (to create it: mkdir -p {})",
        .path.display(),
        .parent.display(),
        .parent.display()
    )]
    NoDirectory {
        /// The destination.
        path: PathBuf,
        /// Its parent.
        parent: PathBuf,
    },
    /// The text file is not a regular file of at most [`MAX_TEXT_FILE_BYTES`].
    #[error("{} is not a regular file of at most 1 MiB", .0.display())]
    TextFile(PathBuf),
    /// Reading or writing failed.
    #[error("{}", .path.display())]
    Io {
        /// The destination.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Serializing an array failed.
    #[error("writing {} (member {member})", .path.display())]
    Npz {
        /// The destination.
        path: PathBuf,
        /// The member being written.
        member: String,
        /// The cause.
        #[source]
        source: ndarray_npy::WriteNpzError,
    },
}

/// Largest text file `runner kv` reads (a model pass takes at most a few thousand tokens).
pub const MAX_TEXT_FILE_BYTES: u64 = 1 << 20;

/// Reads a text file: a regular file of at most [`MAX_TEXT_FILE_BYTES`], in UTF-8 (a FIFO,
/// device or directory is refused without blocking).
pub fn read_text_file(path: &Path) -> Result<String, KvDumpError> {
    use std::io::Read;
    let io = |source| KvDumpError::Io {
        path: path.to_path_buf(),
        source,
    };
    // Non-blocking, so a FIFO with no writer is refused here instead of hanging the open.
    let file = crate::validate::open_input(path).map_err(io)?;
    let metadata = file.metadata().map_err(io)?;
    if !metadata.is_file() || metadata.len() > MAX_TEXT_FILE_BYTES {
        return Err(KvDumpError::TextFile(path.to_path_buf()));
    }
    let mut text = String::new();
    file.take(MAX_TEXT_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(io)?;
    Ok(text)
}

/// The name of the last residual stream in a dump of `model`.
pub fn hidden_name(model: ModelName) -> &'static str {
    match model {
        ModelName::MiniLm => "last_hidden",
        ModelName::SmolLm2 | ModelName::Gemma3 => "hidden_final",
    }
}

/// Writes `capture` as described in the module docs to `path`, which must not exist.
pub fn write_npz(path: &Path, model: ModelName, capture: &Capture) -> Result<(), KvDumpError> {
    if path.symlink_metadata().is_ok() {
        return Err(KvDumpError::Exists(path.to_path_buf()));
    }
    let io = |source| KvDumpError::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let staged = tempfile::Builder::new()
        .prefix(".kv-")
        .suffix(".npz.partial")
        .tempfile_in(dir)
        .map_err(io)?;
    let npz_error = |member: &str| {
        let member = member.to_string();
        move |source| KvDumpError::Npz {
            path: path.to_path_buf(),
            member,
            source,
        }
    };
    {
        let mut npz = NpzWriter::new(staged.as_file());
        let ids: Array1<i64> = capture.ids.iter().map(|&id| i64::from(id)).collect();
        npz.add_array("ids", &ids.mapv(Le))
            .map_err(npz_error("ids"))?;
        for (l, layer) in capture.layers.iter().enumerate() {
            for (part, array) in [("q", &layer.q), ("k", &layer.k), ("v", &layer.v)] {
                let name = format!("l{l}_{part}");
                npz.add_array(name.as_str(), &array.mapv(Le))
                    .map_err(npz_error(&name))?;
            }
        }
        let hidden = hidden_name(model);
        npz.add_array(hidden, &capture.hidden.mapv(Le))
            .map_err(npz_error(hidden))?;
        if let Some(logits) = &capture.logits {
            npz.add_array("logits", &logits.mapv(Le))
                .map_err(npz_error("logits"))?;
        }
        npz.finish().map_err(npz_error("(end of archive)"))?;
    }
    staged.as_file().sync_all().map_err(io)?;
    staged
        .persist_noclobber(path)
        .map_err(|e| match e.error.kind() {
            std::io::ErrorKind::AlreadyExists => KvDumpError::Exists(path.to_path_buf()),
            _ => io(e.error),
        })?;
    Ok(())
}

/// Refuses, before the model runs, a destination that exists or whose directory does not.
pub fn check_new_file(out: &Path) -> Result<(), KvDumpError> {
    if out.symlink_metadata().is_ok() {
        return Err(KvDumpError::Exists(out.to_path_buf()));
    }
    let parent = evidence::parent_dir(out);
    if !parent.is_dir() {
        return Err(KvDumpError::NoDirectory {
            path: out.to_path_buf(),
            parent,
        });
    }
    Ok(())
}

#[cfg(test)]
mod destination_tests {
    use super::*;

    #[test]
    fn a_destination_under_a_file_or_an_existing_one_is_refused_before_any_work() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        std::fs::write(&file, "").unwrap();
        let under_file = file.join("kv.npz");
        assert!(matches!(
            check_new_file(&under_file),
            Err(KvDumpError::NoDirectory { parent, .. }) if parent == file
        ));
        assert!(matches!(check_new_file(&file), Err(KvDumpError::Exists(_))));
        assert!(check_new_file(&tmp.path().join("kv.npz")).is_ok());
    }
}
