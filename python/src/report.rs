//! `audit` and `AuditReport`: the `audit` library, called exactly as the `audit` binary calls it
//! for one directory (`::audit::audit_dir_with`, with the binary's default options unless told
//! otherwise).

use std::path::PathBuf;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict};

/// What an audit of one evidence directory found. See `kvpack.AuditReport`.
#[pyclass(frozen, module = "kvpack", name = "AuditReport")]
pub struct AuditReport {
    subject: String,
    verdict: &'static str,
    counts: Vec<(&'static str, usize)>,
    notes: Vec<String>,
    unverified: Vec<String>,
    problems: Vec<String>,
    rendered: String,
}

impl AuditReport {
    fn new(report: &::audit::Report) -> AuditReport {
        AuditReport {
            subject: report.subject.clone(),
            verdict: report.verdict().word(),
            counts: report
                .counts
                .iter()
                .map(|(what, n)| (what.label(), *n))
                .collect(),
            notes: report.notes.iter().map(ToString::to_string).collect(),
            unverified: report.unverified.clone(),
            // As the report prints them: control characters quoted from the evidence cannot
            // forge lines.
            problems: report
                .problems
                .iter()
                .map(|p| {
                    p.to_string()
                        .chars()
                        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
                        .collect()
                })
                .collect(),
            rendered: report.render(),
        }
    }
}

#[pymethods]
impl AuditReport {
    /// True for PASS only: everything checked, nothing wrong, nothing left un-derived.
    #[getter]
    fn passed(&self) -> bool {
        self.verdict == ::audit::Verdict::Pass.word()
    }

    /// "PASS", "UNVERIFIED" or "FAIL".
    #[getter]
    fn verdict(&self) -> &'static str {
        self.verdict
    }

    /// One line per failure found (empty unless FAIL).
    #[getter]
    fn problems(&self) -> Vec<String> {
        self.problems.clone()
    }

    /// What was checked and how many, in the order the report prints them.
    #[getter]
    fn counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (what, n) in &self.counts {
            dict.set_item(what, n)?;
        }
        Ok(dict)
    }

    /// What the audit says about how it checked (the tree or commit, timings).
    #[getter]
    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    /// What it could not re-derive (model passes without the models): UNVERIFIED, not PASS.
    #[getter]
    fn unverified(&self) -> Vec<String> {
        self.unverified.clone()
    }

    /// The directory audited, as given.
    #[getter]
    fn subject(&self) -> &str {
        &self.subject
    }

    /// The report as the `audit` binary prints it.
    fn __str__(&self) -> &str {
        &self.rendered
    }

    fn __repr__(&self) -> String {
        format!(
            "AuditReport(verdict='{}', subject={:?}, problems={})",
            self.verdict,
            self.subject,
            self.problems.len()
        )
    }
}

/// Audits one evidence directory; see `kvpack.audit` (python/kvpack/__init__.py), which
/// chooses the tree.
#[pyfunction]
#[pyo3(signature = (path, tree, models = None, sample = None))]
pub fn audit(
    py: Python<'_>,
    path: PathBuf,
    tree: PathBuf,
    models: Option<&Bound<'_, PyAny>>,
    sample: Option<i64>,
) -> PyResult<AuditReport> {
    let mut options = ::audit::Options::default();
    match models {
        None => {}
        Some(flag) if flag.is_instance_of::<PyBool>() => {
            options = if flag.is_truthy()? {
                ::audit::Options::default()
            } else {
                ::audit::Options::without_models()
            };
        }
        Some(dir) => {
            let dir = dir.extract::<PathBuf>().map_err(|_| {
                PyTypeError::new_err("models must be a bool, a str or an os.PathLike")
            })?;
            options.models = ::audit::Models::Cache(dir);
        }
    }
    if let Some(k) = sample {
        if options.models == ::audit::Models::Skip {
            return Err(PyValueError::new_err(
                "sample re-runs model passes; it cannot go with models=False",
            ));
        }
        options.sample = Some(usize::try_from(k).map_err(|_| {
            PyValueError::new_err(format!("sample must be a count of passes, got {k}"))
        })?);
    }
    let report = py.detach(|| ::audit::audit_dir_with(&path, &tree, &options));
    Ok(AuditReport::new(&report))
}
