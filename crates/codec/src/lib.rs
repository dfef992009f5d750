//! Packed, quantized KV-cache matrices and the bit layouts under them, and the quantized weight
//! layouts of GPTQ, AWQ, GGUF and NF4 with repacking between them.
//!
//! Where things live:
//! - [`bits`]: dense b-bit streams (1 to 8 bits) in u32 words or bytes, a plain reference
//!   packer (the oracle) and fast packers held to it;
//! - [`bitplane`]: the bit-plane split of odd widths (6 = 4 + 2, ...) into aligned streams;
//! - [`layout`]: axis, mode, bit width, group size and the grouped-view geometry they imply;
//! - [`symmetric`] and [`asymmetric`]: the two per-group quantizers (scales, zero points, codes);
//! - [`quantize`]: encode and decode a matrix under a layout;
//! - [`packed`]: the packed tensor container and its payload bytes;
//! - [`bpw`]: effective bits per element of a storage layout, metadata included;
//! - [`formats`]: weight layouts (GPTQ, AWQ, GGUF Q4_0/Q8_0, NF4) and their logical matrix;
//! - [`repack`]: converting a layer between integer layouts through the logical matrix;
//! - [`error`]: typed errors.
//!
//! ```
//! use codec::{Axis, Layout, Mode, decode, encode};
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
//!
//! // The same matrix at 3 bits, asymmetric: one scale and one 3-bit zero point per group.
//! let layout = Layout::with_mode(Axis::Token, Mode::Asymmetric, 3, 2).unwrap();
//! let packed = encode(k.view(), layout).unwrap();
//! // 8 codes x 3 bits = 3 bytes, 4 f32 scales, 4 zero points x 3 bits = 2 bytes, the shape.
//! assert_eq!(packed.payload_bytes(), 3 + 4 * 4 + 2 + 8);
//! ```
//!
//! A bare stream: element i at bits [i*b, (i+1)*b), here 3-bit codes in u32 words.
//!
//! ```
//! use codec::bits::{self, Bits};
//!
//! let three = Bits::new(3).unwrap();
//! let words = bits::pack_words(three, &[1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 7]).unwrap();
//! // Element 10 (code 7) occupies bits 30..33: two bits in word 0, one in word 1.
//! assert_eq!(words, [0xD11F_58D1, 1]);
//! assert_eq!(bits::unpack_words(three, &words, 11).unwrap()[10], 7);
//! ```

pub mod asymmetric;
pub mod bitplane;
pub mod bits;
pub mod bpw;
pub mod error;
pub mod formats;
pub mod layout;
pub mod packed;
pub mod quantize;
pub mod repack;
pub mod symmetric;

pub use bits::Bits;
pub use error::{CodecError, Result};
pub use layout::{Axis, Geometry, Layout, Mode};
pub use packed::{PackedTensor, SHAPE_BYTES};
pub use quantize::{decode, encode};
