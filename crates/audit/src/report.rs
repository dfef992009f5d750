//! What an audit found: counts of what was checked, and one line per problem.

use std::fmt::Write as _;

#[derive(Debug, Default, Clone)]
pub struct Report {
    /// What was audited (a directory, or a root manifest).
    pub subject: String,
    /// (what, how many) in the order they were checked.
    pub counts: Vec<(String, usize)>,
    pub failures: Vec<String>,
    /// Things the audit cannot check, said plainly.
    pub notes: Vec<String>,
}

impl Report {
    pub fn new(subject: impl Into<String>) -> Report {
        Report {
            subject: subject.into(),
            ..Report::default()
        }
    }

    pub fn fail(&mut self, message: impl Into<String>) {
        self.failures.push(message.into());
    }

    pub fn note(&mut self, message: impl Into<String>) {
        self.notes.push(message.into());
    }

    /// Adds `n` to the count of `what`.
    pub fn count(&mut self, what: &str, n: usize) {
        match self.counts.iter_mut().find(|(w, _)| w == what) {
            Some((_, total)) => *total += n,
            None => self.counts.push((what.to_string(), n)),
        }
    }

    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// PASS with what was checked, or FAIL with one line per problem.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let verdict = if self.passed() { "PASS" } else { "FAIL" };
        writeln!(out, "{verdict} {}", self.subject).unwrap();
        for (what, n) in &self.counts {
            writeln!(out, "  {n:>9} {what}").unwrap();
        }
        for note in &self.notes {
            writeln!(out, "  note: {note}").unwrap();
        }
        for failure in &self.failures {
            writeln!(out, "  FAIL: {failure}").unwrap();
        }
        out
    }
}
