//! The `bitpack` crate's integration tests, in one test binary (each test executable links the
//! whole dependency tree, so they are gathered here):
//!
//! - `support`: probes shared by both: lengths around every packer boundary, and patterned,
//!   random, all-maximum and ramp codes;
//! - `streams`: b-bit streams against the oracle on every kernel, dirty and misaligned buffers,
//!   the i32 view, refusals, and compressed-tensors' `pack_to_int32` byte for byte;
//! - `planes`: bit planes, the fast split and join against the reference.

mod planes;
mod streams;
mod support;
