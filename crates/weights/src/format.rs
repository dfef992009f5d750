//! The names of the layouts this crate reads and writes.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// Every layout this crate reads and writes, by the name checkpoints and the CLI use.
///
/// Deliberately not `#[non_exhaustive]`: code that dispatches on a format (which packer, which
/// reader, which metadata) must match every variant, so that a new layout is a compile error
/// wherever it has to be handled rather than falling into a wildcard arm.
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
    /// Every format, in declaration order (the order fuzz inputs index them in).
    pub const ALL: [WeightFormat; 6] = [
        WeightFormat::Gptq,
        WeightFormat::GptqV2,
        WeightFormat::Awq,
        WeightFormat::Q4_0,
        WeightFormat::Q8_0,
        WeightFormat::Nf4,
    ];

    /// The name checkpoints' metadata and the CLI use (`gptq_v2`, `q4_0`, ...).
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

    /// Whether it is one of the integer layouts (codes with a scale and a zero point per group
    /// and column: gptq, gptq_v2, awq) that [`crate::transcode`] converts between. GGUF blocks
    /// and NF4 are written by their own quantizers from float weights.
    pub fn is_integer(self) -> bool {
        match self {
            WeightFormat::Gptq | WeightFormat::GptqV2 | WeightFormat::Awq => true,
            WeightFormat::Q4_0 | WeightFormat::Q8_0 | WeightFormat::Nf4 => false,
        }
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of [`WeightFormat::ALL`]'s.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown weight format {0:?}: expected one of gptq, gptq_v2, awq, q4_0, q8_0, nf4")]
#[non_exhaustive]
pub struct UnknownFormat(
    /// The name given.
    pub String,
);

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
            "exl2".parse::<WeightFormat>(),
            Err(UnknownFormat("exl2".to_string()))
        );
        // The message lists every name (the CLI prints it for a mistyped --to or --from).
        let message = UnknownFormat("exl2".to_string()).to_string();
        let names: Vec<&str> = WeightFormat::ALL.iter().map(|f| f.name()).collect();
        assert!(message.ends_with(&names.join(", ")), "{message}");
    }
}
