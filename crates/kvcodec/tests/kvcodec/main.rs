//! The `kvcodec` crate's integration tests, in one test binary (each test executable links the
//! whole dependency tree, so they are gathered here):
//!
//! - `symmetric`: the symmetric codec through its public API: worked examples, pinned bytes,
//!   payloads, rounding and every refusal;
//! - `asymmetric`: both modes at every width, axis and group size, with validated zero points and
//!   the payload counted as `weights::bpw` describes the layout;
//! - `properties`: generated matrices, shapes, modes and magnitudes (proptest; its regression
//!   seeds are in `tests/proptest-regressions/properties.txt`, where proptest looks for a source
//!   file under a directory holding a `main.rs`).

mod asymmetric;
mod properties;
mod symmetric;
