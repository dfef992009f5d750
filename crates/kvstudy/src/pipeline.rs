//! How a run walks its inputs, in two passes, so that memory stays near one input's size
//! whatever the protocol's length:
//! 1. Inputs: for each input in run order, draw q, k and v (one draw per (seed, length), shared
//!    by its distributions, whose keys are shaped in place; or one model pass per (text,
//!    length), shared by its layers and heads), compute the f64 reference output, and hand the
//!    input to the sink. Only the references (queries x D each) are kept.
//! 2. Comparisons: for each input again (made again: a draw and a model pass are pure functions
//!    of the protocol),
//!    the configurations run in batches of `threads` on a rayon pool, each comparison storing K
//!    and V and recomputing attention; each batch is handed to the sink in run order and dropped.
//!    Then, when the protocol asks for timings, each of the input's comparisons is timed alone,
//!    with nothing else running ([`crate::timing`]).
//!
//! The sink sees every input before any comparison because arrays.npz lists them so (the
//! archived layout; see [`crate::write`]). Results do not depend on the thread count: each
//! comparison is computed by one thread from the same input, and the sink gets them in run
//! order.

use rayon::prelude::*;
use thiserror::Error;

use crate::inputs::{Draw, InputError, Inputs};
use crate::plan::{InputSpec, plans};
use crate::protocol::Protocol;
use crate::study::{Comparison, Input, ResultRow, compare, reference_output};
use crate::timing::{Timer, TimingError, Timings};

/// Where a run's arrays go, in the order arrays.npz lists them.
pub trait ArraySink {
    type Error;
    /// One input's q, k, v and reference (every input comes before any comparison).
    fn input(&mut self, input: &Input) -> Result<(), Self::Error>;
    /// One comparison's stored segments and output, in run order.
    fn comparison(&mut self, comparison: &Comparison) -> Result<(), Self::Error>;
}

/// Discards the arrays (for callers that want only the rows).
pub struct NoArrays;

impl ArraySink for NoArrays {
    type Error = std::convert::Infallible;
    fn input(&mut self, _: &Input) -> Result<(), Self::Error> {
        Ok(())
    }
    fn comparison(&mut self, _: &Comparison) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// How far a run has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Inputs drawn and handed to the sink so far.
    Inputs(usize),
    /// Comparisons computed so far.
    Comparisons(usize),
    /// Timed calls made so far.
    Timings(usize),
}

/// What a run keeps once its arrays have gone to the sink.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// One row per comparison, in run order.
    pub rows: Vec<ResultRow>,
    /// When the protocol asks for timings.
    pub timings: Option<Timings>,
    /// For a model's inputs: the token ids of each pass, by `t{text}_n{tokens}`.
    pub ids: std::collections::BTreeMap<String, Vec<u32>>,
}

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RunError<E> {
    #[error(transparent)]
    Codec(#[from] kvcodec::KvError),
    #[error(transparent)]
    Timing(#[from] TimingError),
    #[error(transparent)]
    Input(#[from] InputError),
    #[error("starting {threads} worker threads")]
    Threads {
        threads: usize,
        #[source]
        source: rayon::ThreadPoolBuildError,
    },
    /// What the sink reported (writing the archive, say).
    #[error(transparent)]
    Sink(E),
}

/// Runs the comparisons of `specs` (all of `protocol`'s inputs, or a shard's) on `threads`
/// worker threads (at least 1), handing the arrays to `sink` as they are made.
pub fn run<S: ArraySink>(
    protocol: &Protocol,
    specs: &[InputSpec],
    threads: usize,
    sink: &mut S,
    mut progress: impl FnMut(Progress),
) -> Result<Record, RunError<S::Error>> {
    let threads = threads.max(1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("runner-{i}"))
        .build()
        .map_err(|source| RunError::Threads { threads, source })?;
    let plans = plans(protocol);
    let mut inputs = Inputs::new(protocol);

    let mut references = Vec::with_capacity(specs.len());
    for (index, spec) in specs.iter().enumerate() {
        let reference = inputs
            .with(spec, |d| {
                let reference = reference_output(d.q.view(), d.k.view(), d.v.view());
                let input = input(spec, d, &reference);
                sink.input(&input).map(|()| reference)
            })?
            .map_err(RunError::Sink)?;
        references.push(reference);
        progress(Progress::Inputs(index + 1));
    }

    let mut rows = Vec::with_capacity(specs.len() * plans.len());
    let mut timer = protocol.timing.map(Timer::new);
    for (spec, reference) in specs.iter().zip(&references) {
        inputs.with(spec, |d| {
            let input = input(spec, d, reference);
            for batch in plans.chunks(threads) {
                let computed: Vec<kvcodec::Result<Comparison>> = pool.install(|| {
                    batch
                        .par_iter()
                        .map(|plan| compare(protocol, &input, plan))
                        .collect()
                });
                for comparison in computed {
                    let comparison = comparison?;
                    sink.comparison(&comparison).map_err(RunError::Sink)?;
                    rows.push(comparison.row);
                    progress(Progress::Comparisons(rows.len()));
                }
            }
            if let Some(timer) = timer.as_mut() {
                for plan in &plans {
                    timer.measure(&input, plan, &plan.id(spec))?;
                    progress(Progress::Timings(timer.len()));
                }
            }
            Ok::<(), RunError<S::Error>>(())
        })??;
    }
    Ok(Record {
        rows,
        timings: timer.map(Timer::finish),
        ids: inputs.ids().clone(),
    })
}

fn input<'a>(spec: &InputSpec, draw: &'a Draw, reference: &'a ndarray::Array2<f64>) -> Input<'a> {
    Input {
        spec: *spec,
        q: draw.q.view(),
        k: draw.k.view(),
        v: draw.v.view(),
        reference,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROTOCOL: &str = r#"{ "study": "t", "seeds": [1, 2], "tokens": [40, 8], "features": 6,
        "queries": 2, "distributions": ["clean", "early_focus"],
        "focus": { "window": 2, "gain": 1.5 },
        "settings": [ { "group_size": 8, "bits": 4 }, { "group_size": 4, "bits": 3, "mode": "asymmetric" },
                      { "group_size": 32, "bits": 8 } ],
        "generator": { "name": "chacha20",
                       "entropy": { "seed_multiplier": 100, "tokens_multiplier": 1, "offset": 0 } },
        "budget": { "group_size": 8, "low_bits": 2, "window": 8,
                    "policies": ["uniform", "recent8", "early_f32"] } }"#;

    /// Records what the sink is handed, in order.
    #[derive(Default)]
    struct Log(Vec<String>);

    impl ArraySink for Log {
        type Error = std::convert::Infallible;
        fn input(&mut self, input: &Input) -> Result<(), Self::Error> {
            self.0.push(format!("input {}", input.id()));
            Ok(())
        }
        fn comparison(&mut self, c: &Comparison) -> Result<(), Self::Error> {
            self.0.push(format!("comparison {}", c.row.id));
            Ok(())
        }
    }

    #[test]
    fn every_input_reaches_the_sink_before_any_comparison_and_rows_follow_run_order() {
        let protocol = Protocol::from_json(PROTOCOL).unwrap();
        let specs = protocol.inputs();
        let mut log = Log::default();
        let record = run(&protocol, &specs, 2, &mut log, |_| {}).unwrap();
        let inputs: Vec<String> = specs.iter().map(|s| format!("input {}", s.id())).collect();
        assert_eq!(log.0[..inputs.len()], inputs[..]);
        let ids: Vec<String> = specs
            .iter()
            .flat_map(|s| plans(&protocol).into_iter().map(move |p| p.id(s)))
            .collect();
        let logged: Vec<String> = ids.iter().map(|id| format!("comparison {id}")).collect();
        assert_eq!(log.0[inputs.len()..], logged[..]);
        let rows: Vec<&str> = record.rows.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(rows, ids);
        assert_eq!(record.timings, None);
    }

    #[test]
    fn rows_are_the_same_whatever_the_thread_count() {
        let protocol = Protocol::from_json(PROTOCOL).unwrap();
        let specs = protocol.inputs();
        let one = run(&protocol, &specs, 1, &mut NoArrays, |_| {}).unwrap();
        for threads in [2, 3, 8] {
            let many = run(&protocol, &specs, threads, &mut NoArrays, |_| {}).unwrap();
            assert_eq!(many.rows, one.rows, "{threads} threads");
        }
    }
}
