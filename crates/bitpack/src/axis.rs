//! The axis a quantized layout groups along, named for a KV cache's N x D (tokens x features)
//! matrix. (Named `GroupAxis`, not `Axis`, so it never collides with `ndarray::Axis`.)

use std::fmt;
use std::str::FromStr;

use crate::error::BitsError;

/// The axis along which consecutive elements share one scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum GroupAxis {
    /// Groups run along tokens within one feature column (how K is grouped).
    Token,
    /// Groups run along features within one token row (how V is grouped).
    Feature,
}

impl GroupAxis {
    /// `token` or `feature`.
    pub fn name(self) -> &'static str {
        match self {
            GroupAxis::Token => "token",
            GroupAxis::Feature => "feature",
        }
    }
}

impl fmt::Display for GroupAxis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for GroupAxis {
    type Err = BitsError;
    fn from_str(s: &str) -> Result<Self, BitsError> {
        match s {
            "token" => Ok(GroupAxis::Token),
            "feature" => Ok(GroupAxis::Feature),
            other => Err(BitsError::UnknownAxis {
                found: other.to_string(),
            }),
        }
    }
}
