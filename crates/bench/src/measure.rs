//! How a case is timed: `warmup` untimed calls, then `repeats` timed calls, each alone with the
//! monotonic clock; the median (the lower middle for an even count, so always a measured call).
//! With more than one thread, one call runs the operation on `threads` slices of the data at
//! once on a rayon pool, so the figure is the throughput of all cores together.

use std::hint::black_box;
use std::ops::Range;
use std::time::Instant;

use rayon::prelude::*;

/// Bytes copied by the memcpy reference: 256 MiB.
pub const MEMCPY_BYTES: usize = 256 << 20;

/// How every case is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Untimed calls first.
    pub warmup: usize,
    /// Timed calls.
    pub repeats: usize,
    /// Slices run at once (1: one core).
    pub threads: usize,
}

/// The median time of `repeats` calls of `call`, in seconds, after `warmup` untimed ones.
pub fn median_seconds(settings: Settings, mut call: impl FnMut()) -> f64 {
    for _ in 0..settings.warmup {
        call();
    }
    let mut times: Vec<f64> = (0..settings.repeats.max(1))
        .map(|_| {
            let started = Instant::now();
            call();
            started.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[(times.len() - 1) / 2]
}

/// Two operations timed in alternation (see [`paired_medians`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Paired {
    /// The median time of `a`, in seconds.
    pub a_seconds: f64,
    /// The median time of `b`, in seconds.
    pub b_seconds: f64,
    /// The median over rounds of `b`'s time over `a`'s in the same round.
    pub b_over_a: f64,
}

/// Times `a` and `b` in `repeats` rounds of one call each (which goes first alternates), after
/// `warmup` untimed calls of each. On a shared machine whose speed drifts over seconds or
/// minutes, the ratio of two calls made moments apart is steadier than the ratio of two
/// medians taken at different times; medians are the lower middle, as in [`median_seconds`].
pub fn paired_medians(settings: Settings, mut a: impl FnMut(), mut b: impl FnMut()) -> Paired {
    for _ in 0..settings.warmup {
        a();
        b();
    }
    let time = |call: &mut dyn FnMut()| {
        let started = Instant::now();
        call();
        started.elapsed().as_secs_f64()
    };
    let rounds: Vec<(f64, f64)> = (0..settings.repeats.max(1))
        .map(|round| {
            if round % 2 == 0 {
                let ta = time(&mut a);
                (ta, time(&mut b))
            } else {
                let tb = time(&mut b);
                (time(&mut a), tb)
            }
        })
        .collect();
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[(values.len() - 1) / 2]
    };
    Paired {
        a_seconds: median(rounds.iter().map(|r| r.0).collect()),
        b_seconds: median(rounds.iter().map(|r| r.1).collect()),
        b_over_a: median(rounds.iter().map(|r| r.1 / r.0).collect()),
    }
}

/// `len` items cut into `pieces` contiguous ranges whose starts are multiples of `align`
/// (the last range takes the rest).
pub fn slices(len: usize, pieces: usize, align: usize) -> Vec<Range<usize>> {
    let units = len / align;
    let pieces = pieces.clamp(1, units.max(1));
    (0..pieces)
        .map(|i| {
            let start = i * units / pieces * align;
            let end = if i + 1 == pieces {
                len
            } else {
                (i + 1) * units / pieces * align
            };
            start..end
        })
        .collect()
}

/// Runs `work` on each slice, on the pool when there is more than one.
pub fn on_slices<T: Send>(
    pool: &rayon::ThreadPool,
    slices: &[Range<usize>],
    work: impl Fn(Range<usize>) -> T + Sync,
) -> Vec<T> {
    if slices.len() == 1 {
        return vec![work(slices[0].clone())];
    }
    pool.install(|| slices.par_iter().map(|r| work(r.clone())).collect())
}

/// Runs `work(inputs[i], outputs[i])` for every slice, on the pool when there is more than one:
/// each call reads its range of the input and writes its own part of `out`.
pub fn on_split<T: Send>(
    pool: &rayon::ThreadPool,
    inputs: &[Range<usize>],
    out: &mut [T],
    outputs: &[Range<usize>],
    work: impl Fn(Range<usize>, &mut [T]) + Sync,
) {
    let targets = split_mut(out, outputs);
    if targets.len() == 1 {
        return targets.into_iter().for_each(|t| work(inputs[0].clone(), t));
    }
    let jobs: Vec<(Range<usize>, &mut [T])> = inputs.iter().cloned().zip(targets).collect();
    pool.install(|| jobs.into_par_iter().for_each(|(r, t)| work(r, t)));
}

/// The memcpy reference: `copy_from_slice` of [`MEMCPY_BYTES`], on every thread's slice at once
/// when `threads` > 1.
pub struct Memcpy<'a> {
    source: Vec<f32>,
    target: Vec<f32>,
    parts: Vec<Range<usize>>,
    pool: &'a rayon::ThreadPool,
}

impl<'a> Memcpy<'a> {
    /// The buffers, allocated and written once.
    pub fn new(settings: Settings, pool: &'a rayon::ThreadPool) -> Memcpy<'a> {
        let len = MEMCPY_BYTES / 4;
        Memcpy {
            source: (0..len).map(|i| i as f32).collect(),
            target: vec![0f32; len],
            parts: slices(len, settings.threads, 1024),
            pool,
        }
    }

    /// One copy.
    pub fn copy(&mut self) {
        if self.parts.len() == 1 {
            self.target.copy_from_slice(black_box(&self.source));
        } else {
            let chunks: Vec<(&mut [f32], &[f32])> = split_mut(&mut self.target, &self.parts)
                .into_iter()
                .zip(self.parts.iter().map(|r| &self.source[r.clone()]))
                .collect();
            self.pool.install(|| {
                chunks
                    .into_par_iter()
                    .for_each(|(to, from)| to.copy_from_slice(black_box(from)))
            });
        }
        black_box(&mut self.target);
    }

    /// Times `call` in alternation with the copy ([`paired_medians`]): its median time, and the
    /// memcpy bandwidth that makes its ratio to memcpy the median of the rounds' ratios (so a
    /// drift of the machine's speed between cases does not move the ratio).
    pub fn paired(&mut self, settings: Settings, call: impl FnMut()) -> Timed {
        Timed::from(paired_medians(settings, || self.copy(), call))
    }
}

impl From<Paired> for Timed {
    /// `a` the copy, `b` the case: the case's GB/s over `memcpy_gbps` is `bytes / (MEMCPY_BYTES
    /// * b_over_a)`, the median of the rounds' ratios.
    fn from(paired: Paired) -> Timed {
        Timed {
            median_s: paired.b_seconds,
            memcpy_gbps: MEMCPY_BYTES as f64 * paired.b_over_a / paired.b_seconds / 1e9,
        }
    }
}

/// A case timed in alternation with memcpy ([`Memcpy::paired`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timed {
    /// The case's median time, in seconds.
    pub median_s: f64,
    /// The memcpy reference of its rounds, in GB/s: the case's GB/s over this is the median of
    /// the rounds' ratios.
    pub memcpy_gbps: f64,
}

/// The memcpy reference in GB/s (10^9 bytes per second), timed alone.
pub fn memcpy_gbps(settings: Settings, pool: &rayon::ThreadPool) -> f64 {
    let mut memcpy = Memcpy::new(settings, pool);
    let seconds = median_seconds(settings, || memcpy.copy());
    MEMCPY_BYTES as f64 / seconds / 1e9
}

/// Disjoint mutable slices of `data` for contiguous, ordered `ranges` that cover it.
pub fn split_mut<'a, T>(mut data: &'a mut [T], ranges: &[Range<usize>]) -> Vec<&'a mut [T]> {
    let mut out = Vec::with_capacity(ranges.len());
    let mut at = 0;
    for range in ranges {
        let (head, tail) = std::mem::take(&mut data).split_at_mut(range.end - at);
        out.push(&mut head[range.start - at..]);
        data = tail;
        at = range.end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_aligned_contiguous_and_cover_everything() {
        assert_eq!(slices(100, 1, 8), vec![0..100]);
        assert_eq!(slices(100, 3, 8), vec![0..32, 32..64, 64..100]);
        // More pieces than aligned units: one per unit.
        assert_eq!(slices(20, 8, 8), vec![0..8, 8..20]);
        assert_eq!(slices(5, 4, 8), vec![0..5]);
    }

    #[test]
    fn split_mut_gives_the_ranges() {
        let mut data: Vec<u32> = (0..10).collect();
        let parts = split_mut(&mut data, &[0..3, 3..7, 7..10]);
        let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
        assert_eq!(lens, [3, 4, 3]);
        assert_eq!(parts[1], &[3, 4, 5, 6]);
    }

    #[test]
    fn paired_rounds_alternate_and_their_ratio_is_a_measured_round() {
        let settings = Settings {
            warmup: 1,
            repeats: 3,
            threads: 1,
        };
        let order = std::cell::RefCell::new(Vec::new());
        let paired = paired_medians(
            settings,
            || order.borrow_mut().push('a'),
            || {
                order.borrow_mut().push('b');
                std::thread::sleep(std::time::Duration::from_millis(2));
            },
        );
        // The warm-up, then a first, b first, a first.
        assert_eq!(order.into_inner(), ['a', 'b', 'a', 'b', 'b', 'a', 'a', 'b']);
        assert!(paired.b_seconds >= 0.002 && paired.b_seconds > paired.a_seconds);
        assert!(paired.b_over_a > 1.0);
    }

    #[test]
    fn a_case_paired_with_memcpy_is_set_against_the_copies_of_its_own_rounds() {
        // Rounds of 0.1 s copies and 0.2 s cases: the copy's own bandwidth.
        let steady = Timed::from(Paired {
            a_seconds: 0.1,
            b_seconds: 0.2,
            b_over_a: 2.0,
        });
        assert_eq!(steady.median_s, 0.2);
        assert!((steady.memcpy_gbps - MEMCPY_BYTES as f64 / 0.1 / 1e9).abs() < 1e-9);
        // The same case time, but its rounds' copies ran twice as fast: a memcpy twice as fast
        // to be set against, whatever the copies' median alone.
        let faster = Timed::from(Paired {
            a_seconds: 0.1,
            b_seconds: 0.2,
            b_over_a: 4.0,
        });
        assert!((faster.memcpy_gbps / steady.memcpy_gbps - 2.0).abs() < 1e-12);
    }

    #[test]
    fn the_median_is_a_measured_call() {
        let settings = Settings {
            warmup: 1,
            repeats: 4,
            threads: 1,
        };
        let mut calls = 0;
        let seconds = median_seconds(settings, || calls += 1);
        assert_eq!(calls, 5);
        assert!(seconds >= 0.0);
    }
}
