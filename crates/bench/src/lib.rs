//! The `bench` binary's library: throughput of every fast path the workspace has, each as a
//! ratio to memcpy measured in the same process.
//!
//! - [`measure`]: warm-up, repeats, medians, and the memcpy reference (`copy_from_slice` of
//!   256 MiB: smaller copies stay in the cache or take glibc's other path and flatter every
//!   ratio), timed in alternation with each codec and format case ([`measure::Memcpy::paired`]);
//! - [`data`]: deterministic inputs (no file, no generator crate: the numbers only need to be
//!   varied, not drawn from a protocol);
//! - [`cases`]: the operations, by family (KV codec, GGUF blocks, GPTQ and AWQ packing, b-bit
//!   streams), and which bytes each one counts;
//! - [`attention`]: decode-step attention over a packed cache against f32 attention, as
//!   speedups and bandwidths;
//! - [`linear`]: the forward passes' matrix products (`models::ops::linear`) against sgemm on
//!   the same shapes, in GFLOP/s;
//! - [`peer`]: NumPy's (and gguf-py's) version of each case, timed right after it in the same
//!   run (`--numpy`);
//! - [`report`]: the table and the JSON lines;
//! - [`targets`]: the speed goals as ratios to memcpy, and which of them a run met.
//!
//! Timings are descriptive: no test asserts one, and absolute figures vary from machine to
//! machine; ratios to memcpy travel better.

pub mod attention;
pub mod cases;
pub mod data;
pub mod linear;
pub mod measure;
pub mod peer;
pub mod report;
pub mod targets;
