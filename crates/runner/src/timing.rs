//! Timings of encode, decode and attention for every comparison, kept raw.
//!
//! For each input, every (comparison, operation) pair is first called `warmup` times untimed,
//! then `repeats` timed calls of every pair are made in an order shuffled by a ChaCha20
//! generator seeded from the protocol, so slow drifts (clock boost, cache state) do not line up
//! with one configuration. Each call is timed alone with the monotonic clock (`Instant`).
//! Inputs are timed one after another, so only one input's decoded arrays are held at a time.
//!
//! Timings are descriptive: they depend on the machine and the moment, and no test asserts them.
//! Every measurement must be positive: no call of these operations takes 0 ns, so a 0 ns reading
//! means the clock is too coarse to time it, and such a run is refused rather than recorded (or
//! rounded up to a time nobody measured).

use std::hint::black_box;
use std::time::{Duration, Instant};

use ndarray::Array2;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::attention::attention;
use crate::plan::{K_AXIS, SegmentPlan, V_AXIS};
use crate::protocol::Timing;
use crate::study::{Comparison, Input, StudyRun, decode_segments, encode_segments};

/// What one measurement timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    EncodeK,
    EncodeV,
    DecodeK,
    DecodeV,
    /// Attention over the decoded K and V.
    Attention,
}

impl Operation {
    pub const ALL: [Operation; 5] = [
        Operation::EncodeK,
        Operation::EncodeV,
        Operation::DecodeK,
        Operation::DecodeV,
        Operation::Attention,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Operation::EncodeK => "encode_k",
            Operation::EncodeV => "encode_v",
            Operation::DecodeK => "decode_k",
            Operation::DecodeV => "decode_v",
            Operation::Attention => "attention",
        }
    }
}

/// One timed call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Measurement {
    /// Position in the order the calls were made (0-based over the whole run).
    pub order: usize,
    pub comparison: String,
    pub operation: Operation,
    /// Which of the `repeats` calls of this (comparison, operation) this was.
    pub repeat: usize,
    /// Nanoseconds.
    pub ns: u64,
    /// In a merged run, the shard (1 to N) that made this measurement; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<usize>,
}

/// A measurement that cannot be a real timing.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TimingError {
    #[error(
        "timing {} of {comparison} (repeat {repeat}) measured 0 ns: the clock is too coarse to \
         time this call, and timings.json records only real, positive times",
        .operation.name()
    )]
    ZeroDuration {
        comparison: String,
        operation: Operation,
        repeat: usize,
    },
    #[error(
        "timing {} of {comparison} (repeat {repeat}) took more than u64::MAX ns (584 years), \
         which timings.json cannot record",
        .operation.name()
    )]
    TooLong {
        comparison: String,
        operation: Operation,
        repeat: usize,
    },
}

/// timings.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    pub about: String,
    pub unit: String,
    pub clock: String,
    pub warmup: usize,
    pub repeats: usize,
    pub shuffle_seed: u64,
    /// Every measurement, in the order made.
    pub measurements: Vec<Measurement>,
}

impl Timings {
    /// Refuses a 0 ns measurement (see the module comment), naming the first one.
    pub fn check_positive(&self) -> Result<(), TimingError> {
        match self.measurements.iter().find(|m| m.ns == 0) {
            Some(m) => Err(TimingError::ZeroDuration {
                comparison: m.comparison.clone(),
                operation: m.operation,
                repeat: m.repeat,
            }),
            None => Ok(()),
        }
    }
}

/// Times every comparison of `run` with the monotonic clock. `progress` is called after each
/// input with the number of measurements made so far. Stops at the first 0 ns measurement.
pub fn measure(
    run: &StudyRun,
    timing: &Timing,
    progress: impl FnMut(usize),
) -> Result<Timings, TimingError> {
    measure_with(run, timing, progress, |call| {
        let started = Instant::now();
        call();
        started.elapsed()
    })
}

/// [`measure`] with the clock as a parameter (`clock` runs the call it is given and returns how
/// long it took), so a test can stand in a clock too coarse to see a call.
fn measure_with(
    run: &StudyRun,
    timing: &Timing,
    mut progress: impl FnMut(usize),
    mut clock: impl FnMut(&mut dyn FnMut()) -> Duration,
) -> Result<Timings, TimingError> {
    let mut rng = ChaCha20Rng::seed_from_u64(timing.shuffle_seed);
    let mut measurements = Vec::new();
    for input in &run.inputs {
        let comparisons: Vec<&Comparison> = run
            .comparisons
            .iter()
            .filter(|c| c.row.input == input.id)
            .collect();
        let workloads: Vec<Workload> = comparisons
            .iter()
            .map(|c| Workload::new(input, c))
            .collect();
        for workload in &workloads {
            for op in Operation::ALL {
                for _ in 0..timing.warmup {
                    workload.call(op);
                }
            }
        }
        let mut calls: Vec<(usize, Operation, usize)> = Vec::new();
        for w in 0..workloads.len() {
            for op in Operation::ALL {
                calls.extend((0..timing.repeats).map(|repeat| (w, op, repeat)));
            }
        }
        calls.shuffle(&mut rng);
        for (w, op, repeat) in calls {
            let elapsed = clock(&mut || workloads[w].call(op));
            let comparison = || comparisons[w].row.id.clone();
            // Refused, not clamped: a call would have to run for 584 years to get here.
            let ns = u64::try_from(elapsed.as_nanos()).map_err(|_| TimingError::TooLong {
                comparison: comparison(),
                operation: op,
                repeat,
            })?;
            if ns == 0 {
                return Err(TimingError::ZeroDuration {
                    comparison: comparison(),
                    operation: op,
                    repeat,
                });
            }
            measurements.push(Measurement {
                order: measurements.len(),
                comparison: comparisons[w].row.id.clone(),
                operation: op,
                repeat,
                ns,
                shard: None,
            });
        }
        progress(measurements.len());
    }
    Ok(Timings {
        about: "Raw wall-clock times of each operation, every call kept. Descriptive only: they \
                depend on the machine and the moment."
            .into(),
        unit: "ns".into(),
        clock: "std::time::Instant (monotonic), one call per measurement".into(),
        warmup: timing.warmup,
        repeats: timing.repeats,
        shuffle_seed: timing.shuffle_seed,
        measurements,
    })
}

/// Everything one comparison's operations need, prepared before timing starts.
struct Workload<'a> {
    input: &'a Input,
    comparison: &'a Comparison,
    segments: Vec<SegmentPlan>,
    q: Array2<f64>,
    k: Array2<f64>,
    v: Array2<f64>,
}

impl<'a> Workload<'a> {
    fn new(input: &'a Input, comparison: &'a Comparison) -> Self {
        Workload {
            input,
            comparison,
            segments: comparison.plan.segments(input.spec.tokens),
            q: input.q.mapv(f64::from),
            k: decode_segments(&comparison.k),
            v: decode_segments(&comparison.v),
        }
    }

    fn call(&self, op: Operation) {
        let c = self.comparison;
        let plan = &self.segments;
        let group_size = c.plan.group_size();
        match op {
            Operation::EncodeK => {
                black_box(encode_segments(
                    black_box(self.input.k.view()),
                    K_AXIS,
                    group_size,
                    plan,
                ))
                .expect("encoded once already");
            }
            Operation::EncodeV => {
                black_box(encode_segments(
                    black_box(self.input.v.view()),
                    V_AXIS,
                    group_size,
                    plan,
                ))
                .expect("encoded once already");
            }
            Operation::DecodeK => {
                black_box(decode_segments(black_box(&c.k)));
            }
            Operation::DecodeV => {
                black_box(decode_segments(black_box(&c.v)));
            }
            Operation::Attention => {
                black_box(attention(
                    black_box(self.q.view()),
                    black_box(self.k.view()),
                    black_box(self.v.view()),
                ));
            }
        }
    }
}

/// The median of a non-empty list of times (the lower middle for an even count, so it is
/// always a measured value).
pub fn median(values: &mut [u64]) -> u64 {
    values.sort_unstable();
    values[(values.len() - 1) / 2]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Protocol;
    use crate::study;

    fn tiny_run() -> (StudyRun, Timing) {
        let protocol = Protocol::from_json(
            r#"{ "study": "t", "seeds": [1], "tokens": [8], "features": 4, "queries": 1,
                 "distributions": ["clean"], "focus": { "window": 1, "gain": 1.0 },
                 "settings": [ { "group_size": 4, "bits": 4 }, { "group_size": 8, "bits": 8 } ],
                 "generator": { "name": "chacha20", "entropy":
                     { "seed_multiplier": 1, "tokens_multiplier": 1, "offset": 0 } },
                 "timing": { "warmup": 0, "repeats": 2, "shuffle_seed": 3 } }"#,
        )
        .unwrap();
        let timing = protocol.timing.unwrap();
        (study::run(&protocol, |_| {}).unwrap(), timing)
    }

    #[test]
    fn a_clock_too_coarse_to_see_a_call_is_refused_not_recorded() {
        let (run, timing) = tiny_run();
        // The clock sees the first three calls and then reads 0 ns.
        let mut calls = 0;
        let result = measure_with(
            &run,
            &timing,
            |_| {},
            |call| {
                call();
                calls += 1;
                Duration::from_nanos(if calls <= 3 { 100 } else { 0 })
            },
        );
        let ids: Vec<&str> = run.comparisons.iter().map(|c| c.row.id.as_str()).collect();
        match result {
            Err(TimingError::ZeroDuration { comparison, .. }) => {
                assert!(ids.contains(&comparison.as_str()), "{comparison}");
            }
            other => panic!("expected a ZeroDuration error, got {other:?}"),
        }
        assert_eq!(calls, 4, "measuring stops at the first 0 ns reading");
    }

    #[test]
    fn a_time_beyond_u64_nanoseconds_is_refused_not_clamped() {
        let (run, timing) = tiny_run();
        let result = measure_with(
            &run,
            &timing,
            |_| {},
            |call| {
                call();
                Duration::MAX
            },
        );
        assert!(
            matches!(result, Err(TimingError::TooLong { .. })),
            "{result:?}"
        );
    }

    #[test]
    fn real_measurements_are_positive_and_complete() {
        let (run, timing) = tiny_run();
        let timings = measure(&run, &timing, |_| {}).unwrap();
        // 2 comparisons x 5 operations x 2 repeats.
        assert_eq!(timings.measurements.len(), 20);
        assert!(timings.measurements.iter().all(|m| m.ns > 0));
        assert_eq!(timings.check_positive(), Ok(()));
    }

    #[test]
    fn check_positive_names_the_first_zero_measurement() {
        let (run, timing) = tiny_run();
        let mut timings = measure(&run, &timing, |_| {}).unwrap();
        timings.measurements[7].ns = 0;
        let m = &timings.measurements[7];
        assert_eq!(
            timings.check_positive(),
            Err(TimingError::ZeroDuration {
                comparison: m.comparison.clone(),
                operation: m.operation,
                repeat: m.repeat,
            })
        );
    }

    #[test]
    fn timing_errors_say_what_was_refused() {
        let zero = TimingError::ZeroDuration {
            comparison: "s1_n8_clean_g4_b4".into(),
            operation: Operation::DecodeV,
            repeat: 1,
        };
        assert_eq!(
            zero.to_string(),
            "timing decode_v of s1_n8_clean_g4_b4 (repeat 1) measured 0 ns: the clock is too \
             coarse to time this call, and timings.json records only real, positive times"
        );
        let long = TimingError::TooLong {
            comparison: "s1_n8_clean_g4_b4".into(),
            operation: Operation::Attention,
            repeat: 0,
        };
        assert_eq!(
            long.to_string(),
            "timing attention of s1_n8_clean_g4_b4 (repeat 0) took more than u64::MAX ns (584 \
             years), which timings.json cannot record"
        );
    }

    #[test]
    fn median_is_a_measured_value() {
        assert_eq!(median(&mut [5, 1, 3]), 3);
        assert_eq!(median(&mut [4, 1, 3, 2]), 2);
        assert_eq!(median(&mut [7]), 7);
    }
}
