//! The `nprand` crate's integration tests, in one test binary (each test executable links the
//! whole dependency tree, so they are gathered here):
//!
//! - `api`: literal values printed by NumPy 2.4.6, entropy validation, and use through the
//!   `rand` traits;
//! - `fixture`: the tables, seed words, raw outputs, normals and the study's draws against
//!   `tests/data/numpy-default-rng.json`, made by NumPy 2.4.6.

mod api;
mod fixture;
