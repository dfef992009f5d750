//! What an audit found: counts of what it checked, notes on what it cannot check, and one
//! [`Problem`] per failure. A report with no problem is a PASS.

use std::fmt::{self, Write as _};

use crate::chart::ChartProblem;
use crate::files::FileError;
use crate::markdown::MarkdownProblem;
use crate::npz::{ArrayError, NpzError};
use crate::protocol::ProtocolError;
use crate::results::ResultsProblem;
use crate::sources::SourceProblem;
use crate::timings::TimingProblem;

/// One reason an audit fails.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// A file could not be read as a confined regular file.
    #[error("{0}")]
    File(FileError),
    /// A JSON file that does not parse into its format.
    #[error("malformed {file}: {message}")]
    Json {
        /// The file.
        file: String,
        /// What the parser said.
        message: String,
    },
    /// A manifest of a format this audit does not read.
    #[error("{file} has format {found:?}; this audit reads {expected:?}")]
    Format {
        /// The manifest.
        file: String,
        /// Its format string.
        found: String,
        /// The format this audit reads.
        expected: &'static str,
    },
    /// A file whose SHA-256 is not the recorded one.
    #[error("output hash mismatch: {file} (recorded {recorded}, file {actual})")]
    Hash {
        /// The file.
        file: String,
        /// First 12 hex digits recorded.
        recorded: String,
        /// First 12 hex digits of the file.
        actual: String,
    },
    /// A file in the directory that a run does not write, or that is not a regular file.
    #[error("{name} in the evidence directory is not one of the files a run writes")]
    UnexpectedFile {
        /// Its name.
        name: String,
    },
    /// A manifest listing a file a run does not write.
    #[error("the manifest lists {name}, which a run of its protocol does not write")]
    UnexpectedListing {
        /// The listed name.
        name: String,
    },
    /// A manifest that does not list a file a run writes.
    #[error("the manifest does not list {name}, which a run of its protocol writes")]
    MissingListing {
        /// The file a run writes.
        name: String,
    },
    /// A root manifest entry that is not a plain relative path, or that pins nothing usable.
    #[error("root manifest: {0}")]
    Pin(String),
    /// A protocol the runner would refuse.
    #[error("{0}")]
    Protocol(ProtocolError),
    /// A manifest field that contradicts the protocol or the tree.
    #[error("manifest.json {field}: {found}, expected {expected}")]
    Manifest {
        /// The field.
        field: &'static str,
        /// What it says.
        found: String,
        /// What it must say.
        expected: String,
    },
    /// Source pinning or provenance.
    #[error("{0}")]
    Source(SourceProblem),
    /// arrays.npz is not a canonical archive.
    #[error("arrays.npz: {0}")]
    Archive(NpzError),
    /// An array missing, or of another dtype or shape.
    #[error("{0}")]
    Array(ArrayError),
    /// Arrays the protocol calls for are missing, or others are present.
    #[error("arrays.npz {what} {first}{}", more_text(*.more))]
    ArrayNames {
        /// "is missing" or "has an unexpected array".
        what: &'static str,
        /// The first such name.
        first: String,
        /// How many more.
        more: usize,
    },
    /// An archived input that is not the protocol's draw.
    #[error(
        "{array} is not the protocol's input: {count} elements differ; first [{}, {}] is {archived}, \
         re-derived {derived}",
        first[0], first[1]
    )]
    Input {
        /// The array.
        array: String,
        /// Differing elements.
        count: usize,
        /// First differing index.
        first: [usize; 2],
        /// The archived value.
        archived: f32,
        /// The re-derived value.
        derived: f32,
    },
    /// An attention output (or reference) that differs from the audit's recomputation.
    #[error("{array} differs from {what} by {diff:.3e} (relative)")]
    Attention {
        /// The array.
        array: String,
        /// What it was recomputed from.
        what: &'static str,
        /// Largest difference relative to the largest magnitude.
        diff: f64,
    },
    /// A stored shape array that is not the segment's shape.
    #[error("{array} is {found:?}, expected {expected:?}")]
    ShapeValues {
        /// The array.
        array: String,
        /// Its values.
        found: Vec<i32>,
        /// The segment's [tokens, features].
        expected: [usize; 2],
    },
    /// Codes above the width's largest stored code.
    #[error(
        "{array}: {count} codes exceed the {bits}-bit maximum {max}; first {code} at stream \
         position {position}"
    )]
    CodeRange {
        /// The codes array.
        array: String,
        /// How many.
        count: usize,
        /// Code width.
        bits: u32,
        /// Largest code the rule writes.
        max: u8,
        /// The first such code.
        code: u8,
        /// Its stream position.
        position: usize,
    },
    /// Padding positions that do not hold their group's zero code, or nonzero unused tail bits.
    #[error(
        "{array}: {count} padding positions do not hold their group's zero code (or the \
         stream's unused bits are not zero)"
    )]
    Padding {
        /// The codes (or zero points) array.
        array: String,
        /// How many.
        count: usize,
    },
    /// Scales (or zero points) that are not the rule's for their group of the input.
    #[error(
        "{array}: {count} scales are not {rule} of their group; first [{}, {}] is {found} \
         (offset {offset}), the rule gives {expected} (offset {expected_offset})",
        first[0], first[1]
    )]
    Scale {
        /// The scales array.
        array: String,
        /// How many.
        count: usize,
        /// The rule, in words.
        rule: String,
        /// First wrong group.
        first: [usize; 2],
        /// Its scale.
        found: f32,
        /// Its offset (qmax or zero point).
        offset: u8,
        /// The rule's scale.
        expected: f32,
        /// The rule's offset.
        expected_offset: u8,
    },
    /// Codes that are not the rule's code for their input element and scale.
    #[error(
        "{array}: {count} codes are not round-half-even(x / scale) under the rule; first at \
         element [{}, {}] is {stored}, the rule gives {expected}",
        first[0], first[1]
    )]
    Code {
        /// The codes array.
        array: String,
        /// How many.
        count: usize,
        /// First wrong element (token, feature) of the segment.
        first: [usize; 2],
        /// The stored code.
        stored: u8,
        /// The rule's code.
        expected: u8,
    },
    /// Decoded elements further than scale/2 from the input.
    #[error(
        "{array}: {count} decoded elements exceed scale/2 from the original; first [{}, {}]: \
         {error:.6e} > {half:.6e}",
        first[0], first[1]
    )]
    Bound {
        /// The tensor segment.
        array: String,
        /// How many.
        count: usize,
        /// First such element.
        first: [usize; 2],
        /// Its error.
        error: f64,
        /// Half its scale.
        half: f64,
    },
    /// A float32 segment that is not the input's values.
    #[error("{array} differs from the input it claims to keep in float32")]
    Float32 {
        /// The values array.
        array: String,
    },
    /// A problem with results.json's rows.
    #[error("results.json: {0}")]
    Results(ResultsProblem),
    /// A number in results.json that is not what the audit recomputes.
    #[error("results.json {id}: {field} is {recorded}, recomputed {recomputed}")]
    Metric {
        /// The comparison.
        id: String,
        /// The field.
        field: &'static str,
        /// Its value.
        recorded: String,
        /// The recomputed value.
        recomputed: String,
    },
    /// A value in summary.json that is not what the audit recomputes.
    #[error("summary.json {place}: {found}, recomputed {expected}")]
    Summary {
        /// Where (table, row and field).
        place: String,
        /// What it says.
        found: String,
        /// What the audit recomputes.
        expected: String,
    },
    /// summary.md does not show exactly what the audit recomputes.
    #[error("summary.md: {0}")]
    Markdown(MarkdownProblem),
    /// The chart does not draw exactly what the audit recomputes.
    #[error("error-vs-bytes.svg: {0}")]
    Chart(ChartProblem),
    /// timings.json is incomplete or malformed, or the medians do not follow from it.
    #[error("{0}")]
    Timings(TimingProblem),
}

fn more_text(more: usize) -> String {
    if more > 0 {
        format!(" (and {more} more)")
    } else {
        String::new()
    }
}

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
        }
    }
}

/// Something the audit says it could not check, or how it checked.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Note {
    /// Source hashes were compared with this tree.
    Tree(String),
    /// Timings cannot be recomputed.
    TimingsForm,
    /// The recorded commit could not be looked up, and why.
    CommitNotChecked(String),
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::Tree(tree) => write!(f, "source hashes compared with the tree at {tree}"),
            Note::TimingsForm => f.write_str(
                "timings cannot be recomputed: timings.json was checked for completeness and \
                 form, and the summary medians against it",
            ),
            Note::CommitNotChecked(why) => {
                write!(f, "the recorded git commit was not checked: {why}")
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
