//! Dense b-bit code streams, the leaf every quantized layout in this workspace packs through.
//!
//! - [`stream`]: b-bit streams (1 to 8 bits) in u32 words or bytes, element i at bits
//!   [i*b, (i+1)*b) counting from bit 0 of byte 0, so the 4-bit nibble order is
//!   `byte i = code[2i] | code[2i+1] << 4`; a plain one-value-at-a-time packer (the oracle) and
//!   fast packers held to it;
//! - [`planes`]: odd widths split into aligned bit planes (6 = 4 + 2, 5 = 4 + 1, 3 = 2 + 1,
//!   7 = 4 + 2 + 1), as GGUF's Q6_K stores them;
//! - [`axis`]: the axis a layout groups along ([`GroupAxis`]);
//! - [`error`]: typed errors.
//!
//! ```
//! use bitpack::{Bits, stream};
//!
//! let three = Bits::new(3).unwrap();
//! let words = stream::pack_words(three, &[1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 7]).unwrap();
//! // Element 10 (code 7) occupies bits 30..33: two bits in word 0, one in word 1.
//! assert_eq!(words, [0xD11F_58D1, 1]);
//! assert_eq!(stream::unpack_words(three, &words, 11).unwrap()[10], 7);
//!
//! // Codes 2 and 13 at 4 bits: the even element in the low nibble.
//! assert_eq!(stream::pack_bytes(Bits::FOUR, &[2, 13]).unwrap(), [0xD2]);
//! ```

#![warn(missing_docs)]

pub mod axis;
pub mod error;
pub mod planes;
pub mod stream;

pub use axis::GroupAxis;
pub use error::{BitsError, Result};
pub use stream::{Bits, WORD_BITS};
