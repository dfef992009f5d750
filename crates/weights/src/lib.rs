//! Quantized weight layouts, each converted to and from one logical matrix, transcoding between
//! them through that matrix, and what a layout costs in bits per weight.
//!
//! Where things live (each module opens with its layout's written spec):
//! - [`logical`]: the layout-free matrix every integer format unpacks to: codes [K, N], scales
//!   and true zero points [groups, N], g_idx [K]; dequantization, padding, cropping and the
//!   act-order permutation;
//! - [`gptq`]: AutoGPTQ / GPTQModel qweight, qzeros, scales, g_idx at 2, 3, 4 and 8 bits, with
//!   both zero-point conventions (`gptq` and `gptq_v2`);
//! - [`awq`]: AutoAWQ's GEMM layout (4-bit, packed along N, interleaved slots);
//! - [`gguf`]: GGUF Q4_0 and Q8_0 blocks and ggml's reference quantizers;
//! - [`nf4`]: bitsandbytes NF4 (table codes, absmax per block, high nibble first);
//! - [`shape`]: the shape checks the packed layouts share;
//! - [`transcode`]: converting a layer between integer layouts through the logical matrix, proven
//!   bit-identical before anything is written;
//! - [`bpw`]: effective bits per element of any storage layout, metadata included;
//! - [`error`]: typed errors.
//!
//! Every layer reports what it stores as a [`bpw::Cost`], counted from its actual tensors.
//! Reading and writing checkpoint files does not live in this crate at all (see the `repack`
//! crate); the code streams underneath are `bitpack`'s.

#![warn(missing_docs)]

pub mod awq;
pub mod bpw;
pub mod error;
pub mod gguf;
pub mod gptq;
pub mod logical;
pub mod nf4;
pub mod shape;
pub mod transcode;

use std::fmt;
use std::str::FromStr;

pub use error::FormatError;
pub use logical::LogicalWeights;

/// Every layout this crate reads and writes, by the name checkpoints and the CLI use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// AutoGPTQ's GPTQ, zero points stored minus one.
    Gptq,
    /// GPTQModel's GPTQ v2, zero points stored as they are.
    GptqV2,
    /// AutoAWQ GEMM.
    Awq,
    /// GGUF Q4_0 blocks.
    Q4_0,
    /// GGUF Q8_0 blocks.
    Q8_0,
    /// bitsandbytes NF4.
    Nf4,
}

impl WeightFormat {
    pub const ALL: [WeightFormat; 6] = [
        WeightFormat::Gptq,
        WeightFormat::GptqV2,
        WeightFormat::Awq,
        WeightFormat::Q4_0,
        WeightFormat::Q8_0,
        WeightFormat::Nf4,
    ];

    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::Gptq => "gptq",
            WeightFormat::GptqV2 => "gptq_v2",
            WeightFormat::Awq => "awq",
            WeightFormat::Q4_0 => "q4_0",
            WeightFormat::Q8_0 => "q8_0",
            WeightFormat::Nf4 => "nf4",
        }
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown weight format {0:?}: expected one of gptq, gptq_v2, awq, q4_0, q8_0, nf4")]
pub struct UnknownFormat(pub String);

impl FromStr for WeightFormat {
    type Err = UnknownFormat;
    fn from_str(s: &str) -> Result<Self, UnknownFormat> {
        WeightFormat::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| UnknownFormat(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_names_round_trip_and_unknown_names_are_listed() {
        for format in WeightFormat::ALL {
            assert_eq!(format.name().parse::<WeightFormat>(), Ok(format));
        }
        assert_eq!(
            "exl2".parse::<WeightFormat>().unwrap_err().to_string(),
            "unknown weight format \"exl2\": expected one of gptq, gptq_v2, awq, q4_0, q8_0, nf4"
        );
    }
}
