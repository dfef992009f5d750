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
    /// When not empty, the sample applies only to these pinned directories (as the root
    /// manifest names them, relative to it); every other directory re-runs every pass.
    pub sample_only: Vec<PathBuf>,
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
            sample_only: Vec::new(),
        }
    }
}

impl Options {
    /// The options for the pinned directory `dir` (its path as the audit opened it, the root
    /// manifest's directory joined with its pin): without the sample when `sample_only` names
    /// other directories.
    pub fn for_pinned(&self, dir: &std::path::Path) -> Options {
        let mut options = self.clone();
        if !self.sample_only.is_empty() {
            let same = |a: &std::path::Path, b: &std::path::Path| match (
                a.canonicalize(),
                b.canonicalize(),
            ) {
                (Ok(a), Ok(b)) => a == b,
                _ => a == b,
            };
            if !self.sample_only.iter().any(|named| same(named, dir)) {
                options.sample = None;
            }
        }
        options
    }

    /// No model re-runs: quick, and model evidence is UNVERIFIED.
    pub fn without_models() -> Options {
        Options {
            models: Models::Skip,
            sample: None,
            sample_only: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_limited_to_one_directory_leaves_the_others_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let (big, small) = (tmp.path().join("big"), tmp.path().join("small"));
        std::fs::create_dir_all(&big).unwrap();
        std::fs::create_dir_all(&small).unwrap();
        let options = Options {
            sample: Some(4),
            sample_only: vec![big.clone()],
            ..Options::without_models()
        };
        assert_eq!(options.for_pinned(&big.join("../big")).sample, Some(4));
        assert_eq!(options.for_pinned(&small).sample, None);
        // Without a list, the sample applies everywhere.
        let everywhere = Options {
            sample: Some(4),
            ..Options::without_models()
        };
        assert_eq!(everywhere.for_pinned(&small).sample, Some(4));
    }
}
