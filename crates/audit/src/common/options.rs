//! What an audit may use besides the evidence and the tree.

use std::path::PathBuf;

/// What an audit may use besides the evidence and the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Where the real models are, to re-run every model pass of real-model and model-quality
    /// evidence ([`crate::common::model_files`]).
    pub models: Models,
    /// Re-run only this many model passes per directory, chosen from the evidence's own hash
    /// ([`crate::common::sample`]); None: every pass.
    pub sample: Option<usize>,
}

/// Where the audit finds the models it re-runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Models {
    /// A model cache as `scripts/fetch-models` fills it (`<cache>/<model>/<files>`). A model
    /// that is not there leaves its evidence UNVERIFIED, not PASS.
    Cache(PathBuf),
    /// Do not re-run models (`audit --no-models`): model evidence is UNVERIFIED.
    Skip,
}

impl Default for Options {
    /// The models where `scripts/fetch-models` puts them (`$KVPACK_MODELS`, else `model-cache/`
    /// at the workspace root), every pass re-run.
    fn default() -> Options {
        Options {
            models: Models::Cache(models::files::default_cache()),
            sample: None,
        }
    }
}

impl Options {
    /// No model re-runs: quick, and model evidence is UNVERIFIED.
    pub fn without_models() -> Options {
        Options {
            models: Models::Skip,
            sample: None,
        }
    }
}
