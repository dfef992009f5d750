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
    /// Pinned directories that re-run another number of passes than `sample` (each path as the
    /// audit opens it, the root manifest's directory joined with its pin, or any path to the
    /// same directory).
    pub sample_dirs: Vec<SampleDir>,
}

/// `audit --sample-dir DIR=K`: re-run K model passes of the pinned directory DIR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleDir {
    /// The directory.
    pub dir: PathBuf,
    /// Passes to re-run, at least 1 (`--no-models` is the audit that re-runs none).
    pub passes: usize,
}

impl std::str::FromStr for SampleDir {
    type Err = String;

    /// `DIR=K`, K a count of passes.
    fn from_str(text: &str) -> Result<SampleDir, String> {
        let (dir, passes) = text.rsplit_once('=').ok_or_else(|| {
            format!("`{text}` is not DIR=K (a directory, `=`, a count of passes)")
        })?;
        if dir.is_empty() {
            return Err(format!("`{text}` names no directory before `=`"));
        }
        let passes = sample_size(passes).map_err(|e| format!("{e} (in `{text}`)"))?;
        Ok(SampleDir {
            dir: PathBuf::from(dir),
            passes,
        })
    }
}

/// A count of model passes to re-run (`--sample K`), at least 1: a sample of none would PASS
/// without re-running a model, which is `--no-models`' UNVERIFIED.
pub fn sample_size(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("a sample of 0 passes re-runs no model; --no-models is that audit".into()),
        Ok(k) => Ok(k),
        Err(_) => Err(format!("`{text}` is not a count of passes")),
    }
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
            sample_dirs: Vec::new(),
        }
    }
}

impl Options {
    /// The options for the pinned directory `dir` (its path as the audit opened it, the root
    /// manifest's directory joined with its pin): its own sample where `sample_dirs` names it.
    pub fn for_pinned(&self, dir: &std::path::Path) -> Options {
        let same =
            |a: &std::path::Path, b: &std::path::Path| match (a.canonicalize(), b.canonicalize()) {
                (Ok(a), Ok(b)) => a == b,
                _ => a == b,
            };
        let mut options = self.clone();
        if let Some(named) = self.sample_dirs.iter().find(|named| same(&named.dir, dir)) {
            options.sample = Some(named.passes);
        }
        options
    }

    /// No model re-runs: quick, and model evidence is UNVERIFIED.
    pub fn without_models() -> Options {
        Options {
            models: Models::Skip,
            sample: None,
            sample_dirs: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_named_with_its_own_sample_takes_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (big, small) = (tmp.path().join("big"), tmp.path().join("small"));
        std::fs::create_dir_all(&big).unwrap();
        std::fs::create_dir_all(&small).unwrap();
        let named = format!("{}=1", big.display()).parse::<SampleDir>().unwrap();
        let options = Options {
            sample: Some(2),
            sample_dirs: vec![named.clone()],
            ..Options::without_models()
        };
        // Any path to the named directory.
        assert_eq!(options.for_pinned(&big.join("../big")).sample, Some(1));
        assert_eq!(options.for_pinned(&small).sample, Some(2));
        // Without --sample, the others re-run every pass.
        let only_big = Options {
            sample_dirs: vec![named],
            ..Options::without_models()
        };
        assert_eq!(only_big.for_pinned(&big).sample, Some(1));
        assert_eq!(only_big.for_pinned(&small).sample, None);
    }

    #[test]
    fn a_sample_dir_is_a_directory_and_a_count() {
        let parsed: SampleDir = "evidence/a=b=3".parse().unwrap();
        assert_eq!(
            (parsed.dir, parsed.passes),
            (PathBuf::from("evidence/a=b"), 3)
        );
        for bad in [
            "evidence/a",
            "=2",
            "evidence/a=",
            "evidence/a=-1",
            "evidence/a=two",
            "evidence/a=0",
        ] {
            let err = bad.parse::<SampleDir>().unwrap_err();
            assert!(err.contains(bad), "{bad}: {err}");
        }
    }
}
