//! What an audit found: counts of what it checked, notes on what it cannot check, and one
//! [`Problem`] per failure. A report with no problem is a PASS.

use std::fmt::{self, Write as _};

pub use crate::common::problem::Problem;

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
    /// A model's inputs read from the archive (f32, exact shapes, finite), then checked
    /// downstream as any input.
    ModelInputsRead,
    /// A model's inputs, whose q, k and v were re-derived by re-running the model.
    InputsFromModel,
    /// Model passes re-run (a text's first N tokens; for model-quality, one cache's pass).
    PassesRerun,
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
    /// Generated texts decoded from their ids.
    GeneratedTexts,
    /// KVQuant calibration values read and range-checked (ids, fp16 thresholds, levels).
    CalibrationValues,
    /// KVQuant per-layer outlier counts read and range-checked.
    OutlierCounts,
}

impl Checked {
    /// What the count is of, as the report prints it (`source hashes (against the tree)`).
    pub fn label(self) -> &'static str {
        match self {
            Checked::PinnedFiles => "pinned file hashes",
            Checked::OutputHashes => "output hashes",
            Checked::SourceHashes => "source hashes (against the tree)",
            Checked::SourcesAtCommit => "source hashes (against the recorded commit)",
            Checked::ArchiveMembers => "archive members (canonical zip and .npy)",
            Checked::InputsRederived => "inputs re-derived from the protocol (q, k, v bit for bit)",
            Checked::ModelInputsRead => "model inputs read (q, k, v of exact shape, finite)",
            Checked::InputsFromModel => {
                "model inputs re-derived by re-running the model (q, k, v bit for bit)"
            }
            Checked::PassesRerun => "model passes re-run from the pinned weights",
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
            Checked::Positions => "scored positions (log-prob, KL and argmax read and checked)",
            Checked::GeneratedTexts => "generated texts (decoded from their ids)",
            Checked::CalibrationValues => {
                "KVQuant calibration values (ids, fp16 thresholds and ascending levels read)"
            }
            Checked::OutlierCounts => "KVQuant outlier counts (per layer, within the cache)",
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
    /// Model evidence was not re-derived because the audit was told not to use models.
    ModelsNotUsed,
    /// Model evidence was not re-derived: the model is not in the cache (the folder looked in).
    ModelMissing(String),
    /// The model files in this folder were read once, hashed, held to the audit's pins and run.
    ModelFilesChecked(String),
    /// Generated text was not re-decoded (no tokenizer loaded).
    GeneratedTextNotDecoded,
    /// A sampled audit re-ran no KVQuant pass, so KVQuant's calibration was not re-fitted.
    CalibrationNotSampled,
    /// A sampled audit re-ran these passes of that many.
    Sampled {
        /// The passes re-run.
        passes: Vec<String>,
        /// All model passes of the evidence.
        of: usize,
    },
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
            Note::ModelsNotUsed => {
                f.write_str("models not used (--no-models): the model passes were not re-run")
            }
            Note::ModelMissing(folder) => write!(
                f,
                "the model is not in {folder}: the model passes were not re-run (fetch it with \
                 scripts/fetch-models, or name a cache with --models DIR)"
            ),
            Note::ModelFilesChecked(folder) => write!(
                f,
                "model files in {folder} read once, hashed against the audit's pins, and run"
            ),
            Note::GeneratedTextNotDecoded => f.write_str(
                "generated text was not re-decoded (the model's tokenizer was not loaded): only \
                 first_departure was checked against the generated ids",
            ),
            Note::CalibrationNotSampled => f.write_str(
                "no sampled pass runs a KVQuant cache: KVQuant's calibration (its ids, \
                 thresholds and levels) was not re-derived",
            ),
            Note::Sampled { passes, of } => write!(
                f,
                "sampled audit: {} of {of} model passes re-run ({}), chosen by the hash of \
                 arrays.npz; the others were not re-derived",
                passes.len(),
                passes.join(", ")
            ),
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
    /// What the audit could not re-derive (model passes without the models): a report with
    /// no problem but something here is UNVERIFIED, not PASS.
    pub unverified: Vec<String>,
}

/// An audit's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Everything checked and found right.
    Pass,
    /// Nothing wrong was found, but part of the evidence was not re-derived.
    Unverified,
    /// Something is wrong.
    Fail,
}

impl Verdict {
    /// `PASS`, `UNVERIFIED` or `FAIL`.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Unverified => "UNVERIFIED",
            Verdict::Fail => "FAIL",
        }
    }

    /// The audit binary's exit status: 0, 3 or 1 (2 is a usage error).
    pub fn exit_code(self) -> i32 {
        match self {
            Verdict::Pass => 0,
            Verdict::Unverified => 3,
            Verdict::Fail => 1,
        }
    }

    /// The outcome of several audits: the worst of them.
    pub fn of_all<'r>(reports: impl IntoIterator<Item = &'r Report>) -> Verdict {
        reports
            .into_iter()
            .map(Report::verdict)
            .max_by_key(|v| match v {
                Verdict::Pass => 0,
                Verdict::Unverified => 1,
                Verdict::Fail => 2,
            })
            .unwrap_or(Verdict::Pass)
    }
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

    /// Adds what another report found (its counts, notes, problems and gaps), in its order.
    pub fn absorb(&mut self, other: Report) {
        for (what, n) in other.counts {
            self.count(what, n);
        }
        for note in other.notes {
            self.note(note);
        }
        self.problems.extend(other.problems);
        for what in other.unverified {
            self.unverified(what);
        }
    }

    /// Records something the audit could not re-derive.
    pub fn unverified(&mut self, what: impl Into<String>) {
        let what = what.into();
        if !self.unverified.contains(&what) {
            self.unverified.push(what);
        }
    }

    /// PASS, UNVERIFIED or FAIL.
    pub fn verdict(&self) -> Verdict {
        if !self.problems.is_empty() {
            Verdict::Fail
        } else if !self.unverified.is_empty() {
            Verdict::Unverified
        } else {
            Verdict::Pass
        }
    }

    /// Whether everything was checked and nothing failed (PASS).
    pub fn passed(&self) -> bool {
        self.verdict() == Verdict::Pass
    }

    /// Whether something failed.
    pub fn failed(&self) -> bool {
        !self.problems.is_empty()
    }

    /// PASS with what was checked, or FAIL with one line per problem.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{} {}", self.verdict().word(), self.subject);
        for (what, n) in &self.counts {
            let _ = writeln!(out, "  {n:>9} {}", what.label());
        }
        for note in &self.notes {
            let _ = writeln!(out, "  note: {note}");
        }
        for what in &self.unverified {
            let _ = writeln!(out, "  not re-derived: {what}");
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
