//! A protocol, or one shard of it, from start to finish: the inputs, every comparison (arrays
//! streamed into the evidence directory as they are made), the tables, the manifest, and the
//! directory moved into place. The `runner` binary and the tests call this one function, so what
//! a test checks is what a user runs.

use std::path::Path;

use evidence::{EvidenceError, Writer};
use thiserror::Error;

use crate::manifest::{Counts, Manifest, ModelRecord, ShardRecord, protocol_sha256};
use crate::pipeline::{self, Progress};
use crate::plan::{Shard, ShardError};
use crate::protocol::Protocol;
use crate::summary::{self, Summary};
use crate::timing::Operation;
use crate::write::{self, Outputs, WriteError};

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct Run<'a> {
    pub protocol: &'a Protocol,
    /// Where the protocol came from (recorded in the manifest): `embedded ...` or a path.
    pub source: &'a str,
    /// One slice of the protocol's inputs, or all of them.
    pub shard: Option<Shard>,
    /// Worker threads for the comparisons (at least 1); the output does not depend on it.
    pub threads: usize,
}

impl Run<'_> {
    /// The inputs this run covers, in run order.
    pub fn inputs(&self) -> Result<Vec<crate::plan::InputSpec>, ShardError> {
        match self.shard {
            Some(shard) => crate::plan::shard_inputs(shard, self.protocol),
            None => Ok(self.protocol.inputs()),
        }
    }

    /// The steps [`run_protocol`] reports progress in: inputs, then comparisons, then timed
    /// calls.
    pub fn steps(&self) -> Result<usize, ShardError> {
        let inputs = self.inputs()?.len();
        let comparisons = inputs * self.configurations();
        let timed = self
            .protocol
            .timing
            .map_or(0, |t| comparisons * Operation::ALL.len() * t.repeats);
        Ok(inputs + comparisons + timed)
    }

    /// Configurations (settings and budget policies) per input.
    pub fn configurations(&self) -> usize {
        self.protocol.comparison_count() / self.protocol.inputs().len()
    }
}

/// A finished run: its manifest (with every output's hash) and its tables.
#[derive(Debug, Clone)]
pub struct Finished {
    pub manifest: Manifest,
    pub summary: Summary,
}

/// Why a run did not finish; nothing is left behind.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RunError {
    #[error(transparent)]
    Shard(#[from] ShardError),
    #[error(transparent)]
    Evidence(#[from] EvidenceError),
    #[error(transparent)]
    Pipeline(#[from] pipeline::RunError<EvidenceError>),
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// Runs `run` into the new directory `out`, calling `progress` with the steps done so far (see
/// [`Run::steps`]).
pub fn run_protocol(
    run: &Run<'_>,
    out: &Path,
    progress: impl Fn(usize),
) -> Result<Finished, RunError> {
    let protocol = run.protocol;
    let inputs = run.inputs()?;
    let comparisons = inputs.len() * run.configurations();
    let mut writer = Writer::create(out)?;
    let record = pipeline::run(protocol, &inputs, run.threads, &mut writer, |step| {
        progress(match step {
            Progress::Inputs(n) => n,
            Progress::Comparisons(n) => inputs.len() + n,
            Progress::Timings(n) => inputs.len() + comparisons + n,
        })
    })?;
    let summary = summary::summarize(protocol, &record.rows, record.timings.as_ref());
    let mut manifest = Manifest::new(
        run.source.to_string(),
        protocol.clone(),
        Counts {
            inputs: inputs.len(),
            comparisons: record.rows.len(),
            timings: record.timings.as_ref().map_or(0, |t| t.measurements.len()),
        },
    );
    manifest.threads = Some(run.threads);
    manifest.model = protocol
        .model
        .as_ref()
        .map(|m| ModelRecord::new(m.name, record.ids.clone()));
    manifest.shard = run.shard.map(|shard| ShardRecord {
        index: shard.index,
        count: shard.count,
        protocol_sha256: protocol_sha256(protocol),
    });
    let outputs = Outputs {
        protocol,
        rows: &record.rows,
        summary: &summary,
        timings: record.timings.as_ref(),
    };
    let manifest = write::finish(writer, outputs, manifest)?;
    Ok(Finished { manifest, summary })
}
