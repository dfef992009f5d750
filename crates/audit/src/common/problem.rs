//! Every way an audit can fail, in one place: [`Problem`] and the problems of each check. The
//! checks (in their own modules) push these into a [`crate::common::report::Report`].

use crate::common::files::FileError;
use crate::common::npz::{ArrayError, NpzError};

/// A protocol field the runner would refuse, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the runner would refuse its protocol: field `{field}`: {reason}")]
pub struct ProtocolError {
    /// The field, as the runner names it.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

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
    /// An archived model input (q, k or v, which the audit cannot re-derive) holding a value
    /// that is not finite.
    #[error("{array} holds a value that is not finite, first at [{}, {}]", first[0], first[1])]
    NotFinite {
        /// The array.
        array: String,
        /// First such index.
        first: [usize; 2],
    },
    /// The manifest's `model` record contradicts the protocol, the audit's pins or the run.
    #[error("manifest.json model.{field}: {found}, expected {expected}")]
    ModelRecord {
        /// The field (`ids.t0_n40` for one pass's ids).
        field: String,
        /// What it says.
        found: String,
        /// What it must say.
        expected: String,
    },
    /// The model file given with `--models` is missing, unreadable or has another hash than
    /// the one recorded.
    #[error("model file {path}: {reason}")]
    ModelFile {
        /// Where the audit looked.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A model pass whose re-run does not give the archived bits: the recorded ids are not the
    /// text's, or an array differs from what the model computes from them.
    #[error(
        "model pass {pass}: {array}[{index}] is {found} in the evidence; the model re-run gives {expected}"
    )]
    Rerun {
        /// The pass (`t0_n128`, or a model-quality row id).
        pass: String,
        /// The array (or `ids`).
        array: String,
        /// The first differing element (flat index).
        index: usize,
        /// What the evidence holds.
        found: String,
        /// What the re-run gives.
        expected: String,
    },
    /// The model could not run a recorded pass.
    #[error("model pass {pass} could not be re-run: {reason}")]
    RerunFailed {
        /// The pass.
        pass: String,
        /// Why.
        reason: String,
    },
    /// Two passes of one text that must agree on a prefix (a causal model's K and V, both
    /// models' ids) do not.
    #[error(
        "{array} differs from {longer} at element {index} of its first {tokens} rows; passes of one text must agree there"
    )]
    Prefix {
        /// The shorter pass's array.
        array: String,
        /// The longer pass's array.
        longer: String,
        /// The shorter pass's tokens.
        tokens: usize,
        /// The first differing element (flat index).
        index: usize,
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
    /// A value of model-quality evidence outside its range or contradicting another record
    /// (a log-prob above 0, a KL below 0, an id that is not the manifest's, ...).
    #[error("{array}[{index}] is {found}; expected {expected}")]
    Value {
        /// The array (or record).
        array: String,
        /// Position in it.
        index: usize,
        /// What it holds.
        found: String,
        /// What it must hold.
        expected: String,
    },
    /// The model-quality chart does not draw exactly what the audit recomputes.
    #[error("quality-vs-bytes.svg: {0}")]
    QualityChart(ChartProblem),
}

fn more_text(more: usize) -> String {
    if more > 0 {
        format!(" (and {more} more)")
    } else {
        String::new()
    }
}

/// A problem with results.json's rows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResultsProblem {
    /// Another number of rows.
    #[error("{found} rows, the protocol calls for {expected}")]
    Count {
        /// Rows found.
        found: usize,
        /// Comparisons the protocol calls for.
        expected: usize,
    },
    /// An id listed twice.
    #[error("{id} is listed more than once")]
    Duplicate {
        /// The id.
        id: String,
    },
    /// A comparison without a row.
    #[error("missing comparison {id}")]
    Missing {
        /// The id.
        id: String,
    },
    /// A row the protocol does not call for.
    #[error("unexpected comparison {id}")]
    Unexpected {
        /// The id.
        id: String,
    },
    /// A row whose descriptive fields are not what its id and the protocol give.
    #[error("row {id}: its descriptive fields do not match its id and the protocol")]
    Description {
        /// The id.
        id: String,
    },
    /// Rows out of the run's order.
    #[error("row {position} is {found}, the run writes {expected} there")]
    Order {
        /// Position in the file.
        position: usize,
        /// The id there.
        found: String,
        /// The id the run writes there.
        expected: String,
    },
}

/// A problem with the recorded sources or their provenance.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SourceProblem {
    /// No source hashes at all.
    #[error("the manifest pins no sources; a run's sources are always recorded")]
    NoSources,
    /// Roots other than the runner's.
    #[error("source roots {found:?} are not the runner's (`audit::sources::SOURCE_ROOTS`)")]
    Roots {
        /// The roots recorded.
        found: Vec<String>,
    },
    /// A source path that is not a plain path under one of the roots.
    #[error("source {path:?} is not a plain path under the runner's source roots")]
    OutsideRoots {
        /// The path recorded.
        path: String,
    },
    /// A root missing from the tree.
    #[error("source root {root} is missing from the tree {tree}")]
    RootMissing {
        /// The root.
        root: String,
        /// The tree.
        tree: String,
    },
    /// A source whose hash differs from the tree's file.
    #[error(
        "source hash mismatch: {path} differs from the tree (manifest {recorded}, tree {tree})"
    )]
    Differs {
        /// The source.
        path: String,
        /// First 12 hex digits recorded.
        recorded: String,
        /// First 12 hex digits of the tree's file.
        tree: String,
    },
    /// A listed source the tree does not hold as a regular file.
    #[error("source hash mismatch: {path} is not in the tree ({why})")]
    NotInTree {
        /// The source.
        path: String,
        /// Why it could not be read.
        why: String,
    },
    /// A file under the roots that the manifest does not list.
    #[error("source hash mismatch: {path} is in the tree but not in the manifest")]
    Unlisted {
        /// The file.
        path: String,
    },
    /// A file under the roots at the recorded commit that the manifest does not list.
    #[error("source hash mismatch: {path} is in commit {commit} but not in the manifest")]
    UnlistedAtCommit {
        /// The commit.
        commit: String,
        /// The file.
        path: String,
    },
    /// A commit that is not a full hexadecimal object id.
    #[error("the recorded git commit {commit:?} is not a full hexadecimal object id")]
    CommitForm {
        /// What was recorded.
        commit: String,
    },
    /// A commit the tree's repository does not hold.
    #[error("the recorded git commit {commit} does not exist in the tree's repository")]
    CommitMissing {
        /// The commit.
        commit: String,
    },
    /// A source that differs from the recorded commit although the manifest says it matches.
    #[error("the manifest says the sources match commit {commit}, but {path} {how} at that commit")]
    DiffersFromCommit {
        /// The commit.
        commit: String,
        /// The source.
        path: String,
        /// "differs" or "does not exist".
        how: &'static str,
    },
}

/// A problem with timings.json or the medians drawn from it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TimingProblem {
    /// Parameters that differ from the protocol's, or another unit.
    #[error("timings.json: warmup, repeats, shuffle seed or unit differ from the protocol")]
    Parameters,
    /// Free text holding a figure.
    #[error("timings.json: its {field} holds the figure {figure}")]
    Figure {
        /// Which field.
        field: &'static str,
        /// The figure.
        figure: String,
    },
    /// Measurements that are incomplete, repeated, out of order or malformed.
    #[error("timings.json: {count} problems; first: {first}")]
    Measurements {
        /// How many.
        count: usize,
        /// The first, in words.
        first: String,
    },
    /// A median in summary.json that is not the median of timings.json.
    #[error(
        "summary.json timing {config} N={tokens} {operation}: median {recorded} of {recorded_count} \
         recorded, {median} of {count} in timings.json"
    )]
    Median {
        /// Configuration.
        config: String,
        /// N.
        tokens: usize,
        /// Operation.
        operation: String,
        /// Median recorded.
        recorded: u64,
        /// Count recorded.
        recorded_count: usize,
        /// Median of the raw measurements.
        median: u64,
        /// How many there are.
        count: usize,
    },
    /// summary.json's timing rows are not one per configuration, length and operation, in order.
    #[error(
        "summary.json timings: {found} rows, expected {expected} (one per configuration, length and operation, in run order)"
    )]
    Rows {
        /// Rows found.
        found: usize,
        /// Rows expected.
        expected: usize,
    },
    /// Timing medians without timings.
    #[error("summary.json has timing medians but the run has no timings.json")]
    Unexpected,
}

/// A problem with summary.md.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MarkdownProblem {
    /// An element summary.md does not use.
    #[error("it holds {what}, which a run's summary does not use")]
    Markup {
        /// What was found.
        what: String,
    },
    /// A figure outside the tables.
    #[error("the text {text:?} holds the figure {figure}; every figure belongs in a checked table")]
    Figure {
        /// The figure.
        figure: String,
        /// The heading or paragraph.
        text: String,
    },
    /// Headings, tables and the chart not in the order the protocol implies.
    #[error("block {position} is {found}, expected {expected}")]
    Structure {
        /// Position among headings, tables and the chart.
        position: usize,
        /// What is there.
        found: String,
        /// What belongs there.
        expected: String,
    },
    /// A table cell (or header) that is not what the audit renders.
    #[error("the {table} table, row {row}, column {column}: {found:?}, expected {expected:?}")]
    Cell {
        /// Which table.
        table: &'static str,
        /// Row, 0 for the header.
        row: usize,
        /// Column.
        column: usize,
        /// The cell.
        found: String,
        /// The audit's rendering.
        expected: String,
    },
    /// A table with other dimensions.
    #[error("the {table} table is {found:?} (rows x columns), expected {expected:?}")]
    TableShape {
        /// Which table.
        table: &'static str,
        /// Rows and columns found (header included).
        found: (usize, usize),
        /// Rows and columns expected.
        expected: (usize, usize),
    },
}

/// A problem with the chart.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ChartProblem {
    /// Not an SVG document.
    #[error("it is not an SVG document: {reason}")]
    Document {
        /// Why.
        reason: String,
    },
    /// An element or attribute the chart does not use.
    #[error("it holds {what}, which the chart does not use")]
    Element {
        /// What.
        what: String,
    },
    /// The marker group or its axis mapping is missing or malformed.
    #[error("its marker group or axis mapping is missing or malformed ({what})")]
    Mapping {
        /// What is wrong.
        what: String,
    },
    /// Markers that are not one per configuration, condition and length, in order.
    #[error("marker {index}: {found}, expected {expected}")]
    Marker {
        /// Position among the markers.
        index: usize,
        /// What it says.
        found: String,
        /// What the audit recomputes.
        expected: String,
    },
    /// A marker away from where its data map.
    #[error(
        "marker {config} {distribution} N={tokens} sits at ({x}, {y}); its data map to ({ex:.1}, {ey:.1})"
    )]
    Position {
        /// Its configuration.
        config: String,
        /// Its condition: a distribution, or a model's layer (`l5`).
        distribution: String,
        /// Its length.
        tokens: usize,
        /// Where it is.
        x: f64,
        /// Where it is.
        y: f64,
        /// Where it belongs.
        ex: f64,
        /// Where it belongs.
        ey: f64,
    },
    /// A marker (or legend swatch) not drawn as a point at its position: not one circle or
    /// polygon centred on it, unpainted, or reaching further than a marker may.
    #[error(
        "marker {config} {distribution} N={tokens} is not one point shape at its position ({what})"
    )]
    Shape {
        /// Its configuration.
        config: String,
        /// Its condition: a distribution, or a model's layer (`l5`).
        distribution: String,
        /// Its length.
        tokens: usize,
        /// What differs.
        what: String,
    },
    /// A tick label away from where its value maps, or too few of them.
    #[error("tick label {label:?} on the {axis} axis: {what}")]
    Tick {
        /// The axis.
        axis: &'static str,
        /// The label.
        label: String,
        /// What is wrong.
        what: String,
    },
    /// A text the chart must show to be read right (the y axis's description, or the
    /// condition legend's heading or one of its entries) that it does not show.
    #[error("the chart does not show the text {expected:?}")]
    Label {
        /// The text.
        expected: String,
    },
    /// A configuration without its legend entry.
    #[error("the legend has no swatch and label for {config}")]
    Legend {
        /// The configuration.
        config: String,
    },
    /// A marker, legend swatch, legend label, text or panel a viewer does not see as drawn:
    /// something drawn over it, too little of it showing, or outside the document.
    #[error("{what} is not seen: {why}")]
    Hidden {
        /// What.
        what: String,
        /// Why not.
        why: String,
    },
    /// A series the legend misnames or does not tell apart: a label beside another series'
    /// swatch, a marker drawn unlike its swatch, or two series drawn alike.
    #[error("legend, series {series}: {what}")]
    Series {
        /// The series' label (or the heading).
        series: String,
        /// What a viewer would read wrong.
        what: String,
    },
    /// A marker-like shape in the plot that is not a marker.
    #[error("a {element} inside the plot at ({x}, {y}) is not one of the markers")]
    Stray {
        /// Element name.
        element: String,
        /// Where.
        x: f64,
        /// Where.
        y: f64,
    },
}
