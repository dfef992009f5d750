//! What is measured besides the codec setting: a budget policy and a schedule, each parsed from
//! its label into a type and printed back by the same rule.
//!
//! The codec setting is the codec's own [`KvSetting`] (label `g<GROUP>_b<BITS>[_asym][_swap]`,
//! parsed and validated by `kvcodec`). The 8-bit tier of a budget policy uses the same mode,
//! group size and axes at 8 bits ([`KvSetting::with_bits`]).

use std::fmt;
use std::str::FromStr;

pub use kvcodec::KvSetting;

use crate::error::QualityError;

/// The most tokens a cache holds: SmolLM2's context length. A group size or a policy's window
/// is at most this (a longer one would change nothing but the padding, and sizes derived from
/// it, such as a group's zero-padded view, stay small and cannot wrap). Checked by
/// [`Policy::parse`] and `CacheSpec::new`.
pub const MAX_CACHE_TOKENS: usize = 8192;

/// How a cache spends its bytes over positions (the rules are in [`crate::cache`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Every position at the setting's width.
    Uniform,
    /// `recent8:W`: the last W tokens at 8 bits, older ones at the setting's width.
    Recent8 {
        /// W, a multiple of the group size.
        window: usize,
    },
    /// `early8:W`: the first W tokens (attention sinks) at 8 bits forever, the rest at the
    /// setting's width.
    Early8 {
        /// W, a multiple of the group size.
        window: usize,
    },
    /// `recent_f32:W`: a float32 residual window of the last W tokens, older ones at the
    /// setting's width.
    RecentF32 {
        /// W, a multiple of the group size.
        window: usize,
    },
}

impl Policy {
    /// Parses `uniform`, `recent8:W`, `early8:W` or `recent_f32:W` for a setting whose group size
    /// must divide W (so a token-axis group is never split between two tiers); W is at most
    /// [`MAX_CACHE_TOKENS`].
    pub fn parse(label: &str, setting: &KvSetting) -> Result<Policy, QualityError> {
        let bad = || QualityError::Policy(label.to_string());
        if label == "uniform" {
            return Ok(Policy::Uniform);
        }
        let (name, window) = label.split_once(':').ok_or_else(bad)?;
        if window.is_empty() || !window.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let window: usize = window.parse().map_err(|_| bad())?;
        if window == 0 || window > MAX_CACHE_TOKENS || !window.is_multiple_of(setting.group_size())
        {
            return Err(bad());
        }
        match name {
            "recent8" => Ok(Policy::Recent8 { window }),
            "early8" => Ok(Policy::Early8 { window }),
            "recent_f32" => Ok(Policy::RecentF32 { window }),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Uniform => f.write_str("uniform"),
            Policy::Recent8 { window } => write!(f, "recent8:{window}"),
            Policy::Early8 { window } => write!(f, "early8:{window}"),
            Policy::RecentF32 { window } => write!(f, "recent_f32:{window}"),
        }
    }
}

/// When the cache is quantized (the rules are in [`crate::cache`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Each layer's K/V for the whole text quantized once, partial groups zero-padded.
    Prefill,
    /// Tokens appended one at a time; a token-axis group quantized when it fills, the rest in a
    /// float32 residual.
    Streaming,
    /// The reference's `causal`: the whole cache re-packed before each step (a partial group's
    /// scale sees the tokens so far).
    Causal,
}

impl FromStr for Schedule {
    type Err = QualityError;

    fn from_str(label: &str) -> Result<Schedule, QualityError> {
        match label {
            "prefill" => Ok(Schedule::Prefill),
            "streaming" => Ok(Schedule::Streaming),
            "causal" => Ok(Schedule::Causal),
            _ => Err(QualityError::Schedule(label.to_string())),
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Schedule::Prefill => "prefill",
            Schedule::Streaming => "streaming",
            Schedule::Causal => "causal",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_need_a_window_that_is_a_multiple_of_the_group() {
        let s: KvSetting = "g32_b2".parse().unwrap();
        assert_eq!(
            Policy::parse("recent_f32:64", &s).unwrap(),
            Policy::RecentF32 { window: 64 }
        );
        assert_eq!(Policy::parse("uniform", &s).unwrap(), Policy::Uniform);
        for label in [
            "recent8:48",
            "early8:0",
            "recent8",
            "late8:32",
            "early8:-32",
        ] {
            assert!(Policy::parse(label, &s).is_err(), "{label}");
        }
        for label in ["recent8:32", "early8:128", "recent_f32:32", "uniform"] {
            assert_eq!(Policy::parse(label, &s).unwrap().to_string(), label);
        }
        assert_eq!(
            "streaming".parse::<Schedule>().unwrap(),
            Schedule::Streaming
        );
        assert!("stream".parse::<Schedule>().is_err());
    }
}
