//! Quantized weight layouts, each converted to and from one logical matrix, transcoding between
//! them through that matrix, and what a layout costs in bits per weight.
//!
//! Where things live (each layout's module opens with its written spec):
//! - [`format`](mod@format): the layouts by name ([`WeightFormat`]);
//! - [`logical`]: the layout-free matrix every integer format unpacks to: codes [K, N], scales
//!   and true zero points [groups, N], g_idx \[K\]; dequantization, padding, cropping and the
//!   act-order permutation;
//! - [`gptq`]: AutoGPTQ / GPTQModel qweight, qzeros, scales, g_idx at 2, 3, 4 and 8 bits, with
//!   both zero-point conventions (`gptq` and `gptq_v2`);
//! - [`awq`]: AutoAWQ's GEMM layout (4-bit, packed along N, interleaved slots);
//! - [`gguf`]: GGUF Q4_0, Q8_0 and Q4_1 blocks and ggml's reference quantizers;
//! - [`nf4`]: bitsandbytes NF4 (table codes, absmax per block, high nibble first);
//! - [`transcode`]: converting a layer between integer layouts through the logical matrix, proven
//!   bit-identical before anything is written;
//! - [`bpw`]: effective bits per element of any storage layout, metadata included;
//! - [`error`]: the layouts' typed errors ([`transcode`] and [`bpw`] have their own).
//!
//! The shape checks GPTQ and AWQ share live in a private `shape` module. Modules depend on each
//! other without cycles: `format` and `bpw` are leaves, `error` needs only `format`, the layouts
//! build on `error`, `logical` and `bpw`, and `transcode` sits on top.
//!
//! Every layer reports what it stores as a [`bpw::Cost`], counted from its actual tensors.
//! Reading and writing checkpoint files does not live in this crate at all (see the `repack`
//! crate); the code streams underneath are `bitpack`'s.

#![warn(missing_docs)]

pub mod awq;
pub mod bpw;
pub mod error;
pub mod format;
pub mod gguf;
pub mod gptq;
pub mod logical;
pub mod nf4;
mod shape;
pub mod transcode;

pub use error::FormatError;
pub use format::{UnknownFormat, WeightFormat};
pub use logical::LogicalWeights;
