//! The two ways a group's values become codes.

use std::fmt;

/// How a group's values become unsigned codes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Mode {
    /// One scale per group, codes -qmax..=qmax stored as code + qmax: see [`crate::symmetric`].
    #[default]
    Symmetric,
    /// One scale and one integer zero point per group, codes 0..=2^b - 1: see
    /// [`crate::asymmetric`].
    Asymmetric,
}

impl Mode {
    /// `symmetric` or `asymmetric`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Symmetric => "symmetric",
            Mode::Asymmetric => "asymmetric",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
