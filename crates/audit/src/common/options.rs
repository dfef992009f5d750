//! What an audit may use besides the evidence and the tree.

use std::path::PathBuf;

/// What an audit may use besides the evidence and the tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// A model cache (`audit --models DIR`): for a model run, `DIR/<name>/<weight file>` is
    /// hashed and must have the SHA-256 the manifest records. None (the default): the file is
    /// not checked, and the report says so in a note; the audit never needs the model itself.
    pub models: Option<PathBuf>,
}
