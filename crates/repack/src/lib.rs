//! Checkpoint IO and the commands behind the `repack` binary. The layouts themselves (pack,
//! unpack, quantizers, the logical matrix and the bit-identical transcoding) live in the
//! `weights` crate, which knows nothing about files; this crate reads and writes safetensors
//! checkpoints, GGUF files (through the `gguf-file` crate), `.npy` matrices and bare block files
//! around it.
//!
//! Where things live:
//! - [`names`]: how layers and the tensors and metadata keys under them are named;
//! - [`checkpoint`]: safetensors bytes to and from named tensors and metadata;
//! - [`npy`]: `.npy` float32 matrices from bytes, every declared size checked against the bytes
//!   present;
//! - [`metadata`]: the metadata keys this tool reads and writes, parsed;
//! - [`error`]: typed errors (the three modules above have their own, which it wraps);
//! - [`files`]: reading an input file whole (its size known before anything is allocated) and
//!   writing an output atomically, never over an existing file;
//! - [`layers`]: finding quantized layers by the tensor names the libraries write;
//! - [`layer_io`]: a layer's tensors to and from `weights`' packed layers;
//! - [`convert`], [`inspect`]: the `convert` and `inspect` commands (`inspect` reads GGUF files
//!   too);
//! - [`quantfile`]: the `quantize`/`dequantize` commands and the files they write (GGUF for
//!   q4_0, q8_0 and q4_1; safetensors in bitsandbytes' layout for nf4), each layout stated there;
//! - [`read`]: a file's quantized layers as their stored parts (what `kvpack.weights.read`
//!   returns);
//! - [`blockfile`]: the bare block bytes (no header) that `dequantize --raw` reads;
//! - [`bpw_cmd`]: the `bpw` command (effective bits per weight of a layout, or the worked
//!   example);
//! - [`report`]: how effective bits per weight are printed;
//! - [`layer_error`]: the `layer-error` command (MiniLM's real linear layers under each format:
//!   matmul error on the model's own activations, and bits per weight).
//!
//! The modules' dependencies form a DAG, each listed after everything it uses: `names`,
//! `report`, `checkpoint` and `npy` use no other module; `metadata` uses `names`; `error` uses
//! `checkpoint`, `npy`, `metadata` and `names`; `files` uses `error`, `checkpoint` and `npy`;
//! `layers` uses `checkpoint`, `error` and `names`; `layer_io` adds `layers` and `metadata`;
//! the commands sit on top (`inspect` and `convert` use the modules above); `read` uses
//! `inspect`'s NF4 checks and `layer_io`; `quantfile` uses `blockfile`, `inspect` and `read`;
//! `layer_error` uses no other module: it needs `models` and `weights` only.

#![warn(missing_docs)]

pub mod blockfile;
pub mod bpw_cmd;
pub mod checkpoint;
pub mod convert;
pub mod error;
pub mod files;
pub mod inspect;
pub mod layer_error;
pub mod layer_io;
pub mod layers;
pub mod metadata;
pub mod names;
pub mod npy;
pub mod quantfile;
pub mod read;
pub mod report;

pub use error::{Error, Result};
