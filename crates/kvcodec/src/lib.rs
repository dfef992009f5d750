//! Packed KV-cache tensors: an N x D (tokens x features) float32 matrix quantized in groups along
//! tokens or features, symmetric or asymmetric, into b-bit codes with float32 scales (and zero
//! points), and what that costs in bytes.
//!
//! Where things live:
//! - [`mode`]: symmetric or asymmetric;
//! - [`layout`]: grouping axis, mode, bit width, group size and the grouped-view geometry they
//!   imply;
//! - [`setting`]: one setting for a whole K and V cache ([`KvSetting`]: group size, width, mode,
//!   the axes K and V are grouped along, and its label `g32_b4_asym_swap`), parsed and validated
//!   once;
//! - [`symmetric`] and [`asymmetric`]: the two per-group quantizers (scales, zero points, codes);
//! - [`quantize`]: encode and decode a matrix under a layout (the fast paths, with runtime
//!   choice of a [`Kernel`]);
//! - [`reference`](mod@reference): the same codec one value at a time, the oracle the fast paths are tested
//!   against;
//! - [`kernel`]: which implementation of the inner loops runs (portable or AVX2);
//! - [`packed`]: the packed tensor container and its payload bytes;
//! - [`attention`](mod@attention): attention read straight from a packed K and V (scores and
//!   weighted sum dequantized in registers, online softmax), and the f32 baseline it is
//!   measured against;
//! - [`error`]: typed errors.
//!
//! The code streams underneath are `bitpack`'s (where the 4-bit nibble order is written down).
//! With the `serde` feature, [`Mode`] and [`GroupAxis`] serialize as `"symmetric"` /
//! `"asymmetric"` and `"token"` / `"feature"`.
//!
//! ```
//! use kvcodec::{GroupAxis, Layout, Mode, decode, decode_exact, encode};
//! use ndarray::array;
//!
//! let k = array![[1.0f32, -2.0], [0.5, 4.0], [-1.0, 0.0]]; // 3 tokens x 2 features
//! let layout = Layout::new(GroupAxis::Token, 4, 2).unwrap();
//! let packed = encode(k.view(), layout).unwrap();
//! // 2 feature rows x 2 groups of 2 tokens (one padded) = 8 nibbles = 4 bytes,
//! // 4 f32 scales, 2 i32 shape values.
//! assert_eq!(packed.payload_bytes(), 4 + 4 * 4 + 8);
//! let back = decode(&packed); // f32
//! assert_eq!(back.dim(), (3, 2));
//! // Feature 1 (-2, 4, 0) has scale 4 / 7; its codes decode to within half a scale.
//! assert!((back[[1, 1]] - 4.0).abs() <= 2.0 / 7.0);
//! // The exact decode, in f64, agrees with the f32 one to f32 rounding.
//! let exact = decode_exact(&packed);
//! assert_eq!(exact[[1, 1]] as f32, back[[1, 1]]);
//!
//! // The same matrix at 3 bits, asymmetric: one scale and one 3-bit zero point per group.
//! let layout = Layout::with_mode(GroupAxis::Token, Mode::Asymmetric, 3, 2).unwrap();
//! let packed = encode(k.view(), layout).unwrap();
//! // 8 codes x 3 bits = 3 bytes, 4 f32 scales, 4 zero points x 3 bits = 2 bytes, the shape.
//! assert_eq!(packed.payload_bytes(), 3 + 4 * 4 + 2 + 8);
//! ```

#![warn(missing_docs)]

pub mod asymmetric;
pub mod attention;
#[cfg(test)]
mod differential;
pub mod error;
mod fast;
pub mod kernel;
pub mod layout;
pub mod mode;
pub mod packed;
pub mod quantize;
pub mod reference;
pub mod setting;
pub mod symmetric;

/// The repository README's Rust examples ("Use the codec as a library"), run as doc tests so
/// they keep compiling. Rustdoc reads an untagged code block as Rust, so the README tags every
/// other block (`text`, `sh`, `json`).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeExamples;

pub use bitpack::{Bits, GroupAxis};
pub use error::{KvError, Result};
pub use kernel::Kernel;
pub use layout::{Geometry, Layout, Mode};
pub use packed::{PackedTensor, SHAPE_BYTES};
pub use quantize::{
    decode, decode_exact, decode_exact_tokens_into, decode_into, decode_into_with, encode,
    encode_reusing, encode_reusing_with, encode_with,
};
pub use setting::{Axes, KvSetting, MAX_GROUP_SIZE};
