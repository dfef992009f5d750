//! Quantized weight layouts, each converted to and from one logical matrix.
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
//! - [`error`]: typed errors.
//!
//! Converting between layouts lives in [`crate::repack`]; reading and writing checkpoint files
//! does not live in this crate at all (see the `repack` crate).

pub mod awq;
pub mod error;
pub mod gguf;
pub mod gptq;
pub mod logical;
pub mod nf4;
mod words;

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

/// What a stored layer costs: code bytes and metadata bytes (scales, zero points, g_idx,
/// absmax), against the logical number of weights (padding is paid for, not counted as weights).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageCost {
    pub code_bytes: usize,
    pub metadata_bytes: usize,
    pub logical_weights: usize,
}

impl StorageCost {
    pub fn total_bytes(&self) -> usize {
        self.code_bytes + self.metadata_bytes
    }

    /// Total stored bits per logical weight: the effective bit width.
    pub fn bits_per_weight(&self) -> f64 {
        bits_per(self.total_bytes(), self.logical_weights)
    }

    pub fn code_bits_per_weight(&self) -> f64 {
        bits_per(self.code_bytes, self.logical_weights)
    }

    pub fn metadata_bits_per_weight(&self) -> f64 {
        bits_per(self.metadata_bytes, self.logical_weights)
    }
}

fn bits_per(bytes: usize, weights: usize) -> f64 {
    (bytes * 8) as f64 / weights as f64
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

    #[test]
    fn effective_bits_split_codes_from_metadata() {
        // 4096 x 4096 at 4 bits with an f16 scale and a 4-bit zero per 128: 4.15625 bits.
        let weights = 4096 * 4096;
        let cost = StorageCost {
            code_bytes: weights / 2,
            metadata_bytes: (weights / 128) * 2 + (weights / 128) / 2,
            logical_weights: weights,
        };
        assert_eq!(cost.code_bits_per_weight(), 4.0);
        assert_eq!(cost.metadata_bits_per_weight(), 0.15625);
        assert_eq!(cost.bits_per_weight(), 4.15625);
    }
}
