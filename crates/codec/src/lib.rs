//! Symmetric per-group quantization of KV-cache matrices into packed code streams, and the
//! quantized weight layouts of GPTQ, AWQ, GGUF and NF4 with repacking between them.
//!
//! Where things live:
//! - [`layout`]: axis, bit width, group size and the grouped-view geometry they imply;
//! - [`symmetric`]: scales, codes, encode and decode (the quantizer's spec);
//! - [`nibble`]: the 4-bit nibble order (two codes per byte, even element in the low nibble);
//! - [`stream`]: the code stream by bit width;
//! - [`packed`]: the packed tensor container and its payload bytes;
//! - [`error`]: typed errors;
//! - [`formats`]: weight layouts (GPTQ, AWQ, GGUF Q4_0/Q8_0, NF4) and their logical matrix;
//! - [`repack`]: converting a layer between integer layouts through the logical matrix.
//!
//! ```
//! use codec::{Axis, Layout, decode, encode};
//! use ndarray::array;
//!
//! let k = array![[1.0f32, -2.0], [0.5, 4.0], [-1.0, 0.0]]; // 3 tokens x 2 features
//! let layout = Layout::new(Axis::Token, 4, 2).unwrap();
//! let packed = encode(k.view(), layout).unwrap();
//! // 2 feature rows x 2 groups of 2 tokens (one padded) = 8 nibbles = 4 bytes,
//! // 4 f32 scales, 2 i32 shape values.
//! assert_eq!(packed.payload_bytes(), 4 + 4 * 4 + 8);
//! let back = decode(&packed);
//! assert_eq!(back.dim(), (3, 2));
//! ```

pub mod error;
pub mod formats;
pub mod layout;
pub mod nibble;
pub mod packed;
pub mod repack;
pub mod stream;
pub mod symmetric;

pub use error::{CodecError, Result};
pub use layout::{Axis, Bits, Geometry, Layout};
pub use packed::{PackedTensor, SHAPE_BYTES};
pub use symmetric::{decode, encode};
