//! Timings of encode, decode and attention for every comparison, kept raw.
//!
//! Comparisons are timed one after another, in run order, once the run has computed (and
//! written) them, each with nothing else running, whatever the thread count of the run. For one
//! comparison, K and V are first stored again (untimed), every operation is called `warmup`
//! times untimed, then its `repeats` timed calls of every operation are made in an order
//! shuffled by one ChaCha20 generator seeded from the protocol and carried from comparison to
//! comparison, so slow drifts (clock boost, cache state) do not line up with one operation. Each
//! call is timed alone with the monotonic clock (`Instant`). Only one comparison's stored cache
//! and one decode buffer are held at a time: an encode replaces the stored cache, which is freed
//! (untimed) just before it.
//!
//! The operations: `encode_k` / `encode_v` store the f32 cache as the comparison's plan says;
//! `decode_k` / `decode_v` decode the stored cache to f32 into a buffer made beforehand (as a
//! consumer would); `attention` is the study's attention over the stored cache, which decodes
//! it exactly in f64 a chunk of tokens at a time.
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
use crate::plan::{Plan, SegmentPlan};
use crate::protocol::Axes;
use crate::protocol::Timing;
use crate::study::{Input, Segment, StoredCache, decode_segments_into, encode_segments};

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

/// Times comparisons one at a time, in the order they are handed to it, and keeps every
/// measurement.
pub struct Timer {
    timing: Timing,
    rng: ChaCha20Rng,
    measurements: Vec<Measurement>,
}

impl Timer {
    pub fn new(timing: Timing) -> Timer {
        Timer {
            timing,
            rng: ChaCha20Rng::seed_from_u64(timing.shuffle_seed),
            measurements: Vec::new(),
        }
    }

    /// Measurements made so far.
    pub fn len(&self) -> usize {
        self.measurements.len()
    }

    pub fn is_empty(&self) -> bool {
        self.measurements.is_empty()
    }

    /// Times comparison `id` (`plan` on `input`) with the monotonic clock. Stops at the first
    /// 0 ns measurement.
    pub fn measure(&mut self, input: &Input, plan: &Plan, id: &str) -> Result<(), TimingError> {
        self.measure_with(input, plan, id, |call| {
            let started = Instant::now();
            call();
            started.elapsed()
        })
    }

    /// [`Timer::measure`] with the clock as a parameter (`clock` runs the call it is given and
    /// returns how long it took), so a test can stand in a clock too coarse to see a call.
    fn measure_with(
        &mut self,
        input: &Input,
        plan: &Plan,
        id: &str,
        mut clock: impl FnMut(&mut dyn FnMut()) -> Duration,
    ) -> Result<(), TimingError> {
        let mut workload = Workload::new(input, plan).expect("the run stored this plan already");
        for op in Operation::ALL {
            for _ in 0..self.timing.warmup {
                workload.prepare(op);
                workload.call(op);
            }
        }
        let mut calls: Vec<(Operation, usize)> = Vec::new();
        for op in Operation::ALL {
            calls.extend((0..self.timing.repeats).map(|repeat| (op, repeat)));
        }
        calls.shuffle(&mut self.rng);
        for (op, repeat) in calls {
            workload.prepare(op);
            let elapsed = clock(&mut || workload.call(op));
            // Refused, not clamped: a call would have to run for 584 years to get here.
            let ns = u64::try_from(elapsed.as_nanos()).map_err(|_| TimingError::TooLong {
                comparison: id.to_string(),
                operation: op,
                repeat,
            })?;
            if ns == 0 {
                return Err(TimingError::ZeroDuration {
                    comparison: id.to_string(),
                    operation: op,
                    repeat,
                });
            }
            self.measurements.push(Measurement {
                order: self.measurements.len(),
                comparison: id.to_string(),
                operation: op,
                repeat,
                ns,
                shard: None,
            });
        }
        Ok(())
    }

    /// timings.json's contents.
    pub fn finish(self) -> Timings {
        Timings {
            about: "Raw wall-clock times of each operation, every call kept. Descriptive only: \
                    they depend on the machine and the moment."
                .into(),
            unit: "ns".into(),
            clock: "std::time::Instant (monotonic), one call per measurement, nothing else \
                    running"
                .into(),
            warmup: self.timing.warmup,
            repeats: self.timing.repeats,
            shuffle_seed: self.timing.shuffle_seed,
            measurements: self.measurements,
        }
    }
}

/// Everything one comparison's operations need, prepared before timing starts.
struct Workload<'a, 'b> {
    input: &'a Input<'b>,
    group_size: usize,
    segments: Vec<SegmentPlan>,
    q: Array2<f64>,
    k: Vec<Segment>,
    v: Vec<Segment>,
    /// The axes K and V are grouped along.
    axes: Axes,
    /// Where decode_k and decode_v write (N x D): made once, so no call pays for fresh pages.
    decoded: Array2<f32>,
}

impl<'a, 'b> Workload<'a, 'b> {
    fn new(input: &'a Input<'b>, plan: &Plan) -> kvcodec::Result<Self> {
        let segments = plan.segments(input.spec.tokens);
        let group_size = plan.group_size();
        let axes = plan.axes();
        Ok(Workload {
            input,
            group_size,
            axes,
            q: input.q.mapv(f64::from),
            k: encode_segments(input.k, axes.k(), group_size, &segments)?,
            v: encode_segments(input.v, axes.v(), group_size, &segments)?,
            decoded: Array2::zeros(input.k.dim()),
            segments,
        })
    }

    /// Untimed, before each call: an encode first frees the cache it will replace, so a run
    /// holds one stored K and V at a time (peak memory) and no call pays for freeing.
    fn prepare(&mut self, op: Operation) {
        match op {
            Operation::EncodeK => self.k = Vec::new(),
            Operation::EncodeV => self.v = Vec::new(),
            Operation::DecodeK | Operation::DecodeV | Operation::Attention => {}
        }
    }

    fn call(&mut self, op: Operation) {
        match op {
            // The fresh encode becomes the stored cache (the same bytes: encoding is a pure
            // function), so the old one is never freed inside a timed call.
            Operation::EncodeK => {
                self.k = black_box(encode_segments(
                    black_box(self.input.k),
                    self.axes.k(),
                    self.group_size,
                    &self.segments,
                ))
                .expect("encoded once already");
            }
            Operation::EncodeV => {
                self.v = black_box(encode_segments(
                    black_box(self.input.v),
                    self.axes.v(),
                    self.group_size,
                    &self.segments,
                ))
                .expect("encoded once already");
            }
            Operation::DecodeK => {
                decode_segments_into(black_box(&self.k), self.decoded.view_mut());
                black_box(&self.decoded);
            }
            Operation::DecodeV => {
                decode_segments_into(black_box(&self.v), self.decoded.view_mut());
                black_box(&self.decoded);
            }
            Operation::Attention => {
                black_box(attention(
                    black_box(self.q.view()),
                    &StoredCache(black_box(&self.k)),
                    &StoredCache(black_box(&self.v)),
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
    use crate::protocol::Setting;

    /// A 8-token input and two settings, timed with 2 repeats.
    fn tiny() -> (Array2<f32>, Array2<f64>, Vec<Plan>, Timing) {
        let kv = Array2::from_shape_fn((8, 4), |(t, f)| ((t * 4 + f) as f32 * 0.3).cos());
        let reference = Array2::zeros((1, 4));
        let plans = [(4, 4), (8, 8)]
            .map(|(group_size, bits)| {
                Plan::Packed(Setting {
                    group_size,
                    bits,
                    mode: crate::protocol::Mode::Symmetric,
                    axes: Default::default(),
                })
            })
            .to_vec();
        let timing = Timing {
            warmup: 0,
            repeats: 2,
            shuffle_seed: 3,
        };
        (kv, reference, plans, timing)
    }

    fn input<'a>(kv: &'a Array2<f32>, reference: &'a Array2<f64>) -> Input<'a> {
        Input {
            spec: crate::plan::InputSpec {
                tokens: 8,
                source: crate::plan::InputSource::Drawn {
                    seed: 1,
                    distribution: crate::protocol::Distribution::Clean,
                },
            },
            q: kv.slice(ndarray::s![..1, ..]),
            k: kv.view(),
            v: kv.view(),
            reference,
        }
    }

    #[test]
    fn a_clock_too_coarse_to_see_a_call_is_refused_not_recorded() {
        let (kv, reference, plans, timing) = tiny();
        let input = input(&kv, &reference);
        let mut timer = Timer::new(timing);
        // The clock sees the first three calls and then reads 0 ns.
        let mut calls = 0;
        let result = timer.measure_with(&input, &plans[0], "a", |call| {
            call();
            calls += 1;
            Duration::from_nanos(if calls <= 3 { 100 } else { 0 })
        });
        assert!(
            matches!(&result, Err(TimingError::ZeroDuration { comparison, .. }) if comparison == "a"),
            "{result:?}"
        );
        assert_eq!(calls, 4, "measuring stops at the first 0 ns reading");
    }

    #[test]
    fn a_time_beyond_u64_nanoseconds_is_refused_not_clamped() {
        let (kv, reference, plans, timing) = tiny();
        let input = input(&kv, &reference);
        let result = Timer::new(timing).measure_with(&input, &plans[0], "a", |call| {
            call();
            Duration::MAX
        });
        assert!(
            matches!(result, Err(TimingError::TooLong { .. })),
            "{result:?}"
        );
    }

    #[test]
    fn real_measurements_are_positive_complete_and_in_order() {
        let (kv, reference, plans, timing) = tiny();
        let input = input(&kv, &reference);
        let mut timer = Timer::new(timing);
        timer.measure(&input, &plans[0], "a").unwrap();
        timer.measure(&input, &plans[1], "b").unwrap();
        let timings = timer.finish();
        // 2 comparisons x 5 operations x 2 repeats, one comparison after the other.
        assert_eq!(timings.measurements.len(), 20);
        let ids: Vec<&str> = timings
            .measurements
            .iter()
            .map(|m| m.comparison.as_str())
            .collect();
        assert_eq!(ids, [["a"; 10], ["b"; 10]].concat());
        assert!(
            timings
                .measurements
                .iter()
                .enumerate()
                .all(|(i, m)| m.order == i && m.ns > 0)
        );
        assert_eq!(timings.check_positive(), Ok(()));
    }

    #[test]
    fn check_positive_names_the_first_zero_measurement() {
        let (kv, reference, plans, timing) = tiny();
        let input = input(&kv, &reference);
        let mut timer = Timer::new(timing);
        timer.measure(&input, &plans[0], "a").unwrap();
        let mut timings = timer.finish();
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
