//! What every fuzz target links: a global allocator that refuses to hold more than
//! [`MEMORY_LIMIT`] bytes at once, so that a reader allocating from a size its input merely
//! declares fails the run: Rust aborts on the refused allocation ("memory allocation of N bytes
//! failed"), and libFuzzer reports a deadly signal and keeps the input.
//!
//! Why it is needed: with sanitizers off (`-s none`, which is what builds on stable),
//! libFuzzer's `-malloc_limit_mb` does nothing, since it relies on the sanitizers' malloc
//! hooks; and Linux hands out a huge zeroed allocation lazily, so `vec![0.0; rows * cols]` sized
//! from a declared shape costs nothing until it is touched and goes unnoticed unless it exceeds
//! RAM plus swap. (Checked: `ndarray_npy`'s `read_npy`, fuzzed without this limit for four
//! minutes, never failed; with it, it failed within a second, on a 12-byte input declaring a
//! 1 GB header.) Readers that reserve with `try_reserve` get an error instead, as they should.
//!
//! Each target names this crate (`use fuzz as _;`) so that it is linked into the target.

use std::alloc::System;

use cap::Cap;

/// Far more than any target needs: inputs are at most a few kilobytes (libFuzzer's default
/// `-max_len` is 4096, or the largest seed), and no reader holds more than a fixed multiple of
/// its input.
pub const MEMORY_LIMIT: usize = 256 << 20;

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, MEMORY_LIMIT);
