//! The `runner` binary as a user drives it, in one test binary (each test executable links the
//! whole dependency tree, so they are gathered here).
//!
//! - [`reproduce`]: the frozen protocol prints the published table and rewrites the archived
//!   evidence byte for byte; refusals; fresh sweeps; `runner pin`;
//! - [`crash_safety`]: killed runs, full disks and stale staging directories;
//! - [`shards`]: a protocol's shards merge into its single run, byte for byte;
//! - [`real_models`]: `runner kv` against the models' public references, and model shards
//!   against their archives;
//! - [`model_quality`]: `runner quality --protocol` on a tiny study;
//! - [`quality_shards`]: a model-quality study's shards merge into its single run, byte for byte;
//! - [`paths`]: inputs and paths refused by name (FIFOs, `pin` outside the tree, `merge --out`
//!   inside a shard) and the Slurm merge script's path handling.

mod crash_safety;
mod model_quality;
mod paths;
// The shards run through the Slurm job scripts, which are sh.
#[cfg(unix)]
mod quality_shards;
mod real_models;
mod reproduce;
mod shards;
