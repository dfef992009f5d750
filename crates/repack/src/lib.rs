//! Checkpoint IO and the commands behind the `repack` binary. The layouts themselves (pack,
//! unpack, quantizers, the logical matrix and the bit-identical transcoding) live in the
//! `weights` crate, which knows nothing about files; this crate reads and writes safetensors
//! checkpoints, `.npy` matrices and raw block files around it.
//!
//! Where things live:
//! - [`input`]: reading an input file whole, its size known before anything is allocated;
//! - [`checkpoint`]: safetensors in memory; deterministic, atomic, never-overwriting writes;
//! - [`npy`]: `.npy` float32 matrices, every declared size checked against the bytes present;
//! - [`layers`]: finding quantized layers by the tensor names the libraries write;
//! - [`layer_io`]: tensors to and from `weights`' packed layers, and the metadata keys;
//! - [`convert`], [`inspect`], [`blockfile`]: the `convert`, `inspect` and
//!   `quantize`/`dequantize` commands;
//! - [`bpw_cmd`]: the `bpw` command (effective bits per weight of a layout, or the worked
//!   example);
//! - [`report`]: how effective bits per weight are printed;
//! - [`error`]: typed errors.

pub mod blockfile;
pub mod bpw_cmd;
pub mod checkpoint;
pub mod convert;
pub mod error;
pub mod input;
pub mod inspect;
pub mod layer_io;
pub mod layers;
pub mod npy;
pub mod report;

pub use error::{Error, Result};
