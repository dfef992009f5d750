//! What every study writes its evidence with, whatever the study.
//!
//! An evidence directory is made in a hidden staging sibling and renamed into place only when
//! complete ([`staging`]); its arrays are streamed into `arrays.npz` member by member and its
//! other files written beside them ([`writer`]); its manifest records what produced it
//! ([`provenance`]: the tool, the platform, the git commit and the SHA-256 of every source file,
//! hashed at build time) and the SHA-256 of every file it wrote. The charts share one frame
//! ([`chart`]: panels, log axes, legend, drawn with plotters) and the tables one renderer
//! ([`table`]). The root manifest pins archived directories by their files' hashes ([`pin`]),
//! after a check the caller passes in (the runner passes the audit; this crate depends on no
//! study and on no checker). A study cut into shards slices its work and records a merge the
//! same way ([`shard`]).
//!
//! Modules, each depending only on those listed before it: [`format`](mod@format), [`hashing`], [`error`],
//! [`staging`], [`writer`], [`provenance`], [`table`], [`chart`], [`pin`], [`shard`].

pub mod chart;
pub mod error;
pub mod format;
pub mod hashing;
pub mod npy;
pub mod pin;
pub mod provenance;
pub mod shard;
pub mod staging;
pub mod table;
pub mod writer;

pub use error::EvidenceError;
pub use staging::{Cleanup, check_new, parent_dir, remove_stale_staging};
pub use writer::{Writer, json_bytes};

/// Longest study name, in characters, in every study's protocol. The name is printed into
/// markdown headings and the chart title, so it is also limited to ASCII letters, digits, '-',
/// '_' and '.' (no spaces, newlines, '|' or markup).
pub const MAX_STUDY_NAME_CHARS: usize = 64;

/// The arrays of every evidence directory.
pub const ARRAYS: &str = "arrays.npz";
/// One row per comparison (or run).
pub const RESULTS: &str = "results.json";
/// The tables, as numbers.
pub const SUMMARY: &str = "summary.json";
/// The tables, in markdown.
pub const SUMMARY_MD: &str = "summary.md";
/// Provenance and the SHA-256 of every other file.
pub const MANIFEST: &str = "manifest.json";
