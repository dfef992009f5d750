//! What an audit found: counts of what it checked, notes on what it cannot check, and one
//! [`Problem`] per failure. A report with no problem is a PASS.

use std::fmt::{self, Write as _};

pub use crate::problem::Problem;

/// What the audit counted as checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Checked {
    /// Files whose hash the root manifest pins.
    PinnedFiles,
    /// Output files whose hash manifest.json records.
    OutputHashes,
    /// Source files compared with the tree.
    SourceHashes,
    /// Source files compared with the recorded git commit.
    SourcesAtCommit,
    /// Members of arrays.npz read under the strict rules.
    ArchiveMembers,
    /// Inputs whose q, k and v were re-derived from the protocol.
    InputsRederived,
    /// A model's inputs, whose q, k and v were read from the archive (not re-derived).
    InputsArchived,
    /// Reference outputs recomputed.
    References,
    /// Result rows.
    ResultRows,
    /// Comparisons whose outputs were recomputed from decoded codes.
    Comparisons,
    /// Stored tensor segments.
    Segments,
    /// Codes checked against the quantization rule.
    Codes,
    /// Scales recomputed from the inputs.
    Scales,
    /// Summary rows recomputed.
    SummaryRows,
    /// Cells of summary.md's tables.
    MarkdownCells,
    /// Chart markers placed.
    ChartMarkers,
    /// Raw timings checked for form.
    Timings,
    /// Scored positions of model-quality rows (log-prob, KL and argmax read and checked).
    Positions,
    /// Bytes-per-token figures re-derived from the cache-size rule.
    BytesPerToken,
}

impl Checked {
    fn label(self) -> &'static str {
        match self {
            Checked::PinnedFiles => "pinned file hashes",
            Checked::OutputHashes => "output hashes",
            Checked::SourceHashes => "source hashes (against the tree)",
            Checked::SourcesAtCommit => "source hashes (against the recorded commit)",
            Checked::ArchiveMembers => "archive members (canonical zip and .npy)",
            Checked::InputsRederived => "inputs re-derived from the protocol (q, k, v bit for bit)",
            Checked::InputsArchived => {
                "model inputs taken from the archive (q, k, v finite; the model not re-run)"
            }
            Checked::References => "references (attention recomputed)",
            Checked::ResultRows => "result rows",
            Checked::Comparisons => "comparisons (outputs recomputed from decoded codes)",
            Checked::Segments => "segments",
            Checked::Codes => "codes (the quantization rule, range and padding)",
            Checked::Scales => "scales (recomputed from the inputs)",
            Checked::SummaryRows => "summary rows",
            Checked::MarkdownCells => "summary.md table cells",
            Checked::ChartMarkers => "chart markers (value and position)",
            Checked::Timings => "raw timings (form only)",
            Checked::Positions => {
                "scored positions (log-prob, KL and argmax; the model not re-run)"
            }
            Checked::BytesPerToken => {
                "bytes-per-token figures (re-derived from the cache-size rule)"
            }
        }
    }
}

/// Something the audit says it could not check, or how it checked.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Note {
    /// Source hashes were compared with this tree.
    Tree(String),
    /// Source hashes were compared with the recorded commit; the tree has changed this many of
    /// the sources since (an archive is tied to its commit, not to the working tree).
    Commit {
        /// The commit.
        commit: String,
        /// Sources that differ, are missing or were added in the tree since.
        changed_in_tree: usize,
    },
    /// Timings cannot be recomputed.
    TimingsForm,
    /// The recorded commit could not be looked up, and why.
    CommitNotChecked(String),
    /// A model run's q, k and v were not re-derived: the audit does not run the model.
    ModelNotRerun,
    /// No model directory was given (`--models`), so the model file's hash was not checked.
    ModelFileNotChecked(String),
    /// The model file's hash was checked against the recorded one.
    ModelFileChecked(String),
    /// A model-quality run's log-probs, KL values, argmaxes and generated ids were read, not
    /// recomputed: the audit does not run the model.
    QualityModelNotRerun,
    /// Generated text is not re-decoded (the audit has no tokenizer).
    GeneratedTextNotDecoded,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::Tree(tree) => write!(f, "source hashes compared with the tree at {tree}"),
            Note::Commit {
                commit,
                changed_in_tree: 0,
            } => write!(
                f,
                "source hashes compared with the recorded commit {commit} (the tree's sources \
                 are the same)"
            ),
            Note::Commit {
                commit,
                changed_in_tree,
            } => write!(
                f,
                "source hashes compared with the recorded commit {commit}; the tree has changed \
                 {changed_in_tree} of them since (scripts/refresh-evidence --check says whether \
                 the outputs would change)"
            ),
            Note::TimingsForm => f.write_str(
                "timings cannot be recomputed: timings.json was checked for completeness and \
                 form, and the summary medians against it",
            ),
            Note::CommitNotChecked(why) => {
                write!(f, "the recorded git commit was not checked: {why}")
            }
            Note::ModelNotRerun => f.write_str(
                "the model was not re-run: its inputs (q, k, v) were taken from arrays.npz and \
                 rest on the recorded model hash, the recorded token ids and the runner's \
                 byte-reproducibility test; everything computed from them was checked",
            ),
            Note::ModelFileNotChecked(file) => write!(
                f,
                "the model file {file} was not checked (no --models directory given)"
            ),
            Note::QualityModelNotRerun => f.write_str(
                "the model was not re-run: the per-position log-probs, KL values, argmaxes and \
                 generated ids were taken from arrays.npz and rest on the recorded model hash, \
                 the recorded token ids and the runner's byte-reproducibility test; every \
                 aggregate, table cell, chart marker and bytes-per-token figure was re-derived \
                 from them",
            ),
            Note::GeneratedTextNotDecoded => f.write_str(
                "generated text was not re-decoded (the audit has no tokenizer): only \
                 first_departure was checked against the generated ids",
            ),
            Note::ModelFileChecked(path) => {
                write!(f, "the model file {path} has the recorded SHA-256")
            }
        }
    }
}

/// The outcome of auditing one directory or root manifest.
#[derive(Debug, Default)]
pub struct Report {
    /// What was audited.
    pub subject: String,
    /// (what, how many), in the order first counted.
    pub counts: Vec<(Checked, usize)>,
    /// What could not be checked.
    pub notes: Vec<Note>,
    /// Every failure found.
    pub problems: Vec<Problem>,
}

impl Report {
    /// An empty report about `subject`.
    pub fn new(subject: impl Into<String>) -> Report {
        Report {
            subject: subject.into(),
            ..Report::default()
        }
    }

    /// Records a failure.
    pub fn fail(&mut self, problem: Problem) {
        self.problems.push(problem);
    }

    /// Records a note.
    pub fn note(&mut self, note: Note) {
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    /// Adds `n` to the count of `what`.
    pub fn count(&mut self, what: Checked, n: usize) {
        match self.counts.iter_mut().find(|(w, _)| *w == what) {
            Some((_, total)) => *total += n,
            None => self.counts.push((what, n)),
        }
    }

    /// How many of `what` were counted.
    pub fn counted(&self, what: Checked) -> usize {
        self.counts
            .iter()
            .find(|(w, _)| *w == what)
            .map_or(0, |(_, n)| *n)
    }

    /// Whether nothing failed.
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }

    /// PASS with what was checked, or FAIL with one line per problem.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let verdict = if self.passed() { "PASS" } else { "FAIL" };
        let _ = writeln!(out, "{verdict} {}", self.subject);
        for (what, n) in &self.counts {
            let _ = writeln!(out, "  {n:>9} {}", what.label());
        }
        for note in &self.notes {
            let _ = writeln!(out, "  note: {note}");
        }
        for problem in &self.problems {
            // Messages quote untrusted text; control characters must not forge lines.
            let text: String = problem
                .to_string()
                .chars()
                .map(|c| if c.is_control() { '\u{fffd}' } else { c })
                .collect();
            let _ = writeln!(out, "  FAIL: {text}");
        }
        out
    }
}
