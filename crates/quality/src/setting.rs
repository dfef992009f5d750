//! What is measured: a codec setting (label `g<GROUP>_b<BITS>[_asym][_swap]`), a budget policy
//! and a schedule, each parsed from its label into a type and printed back by the same rule.
//!
//! Setting labels are the runner's: `g32_b4` is symmetric 4-bit codes in groups of 32 with K
//! grouped along tokens (one group = 32 consecutive tokens of one channel of one KV head) and V
//! along features (one group = 32 consecutive features of one token of one KV head);
//! `_asym` makes the codes asymmetric (a scale and a zero point per group); `_swap` groups K along
//! features and V along tokens. The 8-bit tier of a budget policy uses the same mode, group size
//! and axes at 8 bits.

use std::fmt;
use std::str::FromStr;

use kvcodec::{GroupAxis, Layout, Mode};

use crate::error::QualityError;

/// A codec setting for the whole cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// Consecutive elements per group.
    pub group_size: usize,
    /// Code width of the low tier.
    pub bits: u32,
    /// Symmetric or asymmetric codes.
    pub mode: Mode,
    /// K grouped along features and V along tokens (instead of K along tokens, V along features).
    pub swap: bool,
}

impl Setting {
    /// The axis K's groups run along.
    pub fn k_axis(&self) -> GroupAxis {
        if self.swap {
            GroupAxis::Feature
        } else {
            GroupAxis::Token
        }
    }

    /// The axis V's groups run along.
    pub fn v_axis(&self) -> GroupAxis {
        if self.swap {
            GroupAxis::Token
        } else {
            GroupAxis::Feature
        }
    }

    /// The layout of `axis` at `bits` in this setting's mode and group size.
    pub fn layout(&self, axis: GroupAxis, bits: u32) -> Result<Layout, QualityError> {
        Ok(Layout::with_mode(axis, self.mode, bits, self.group_size)?)
    }
}

impl FromStr for Setting {
    type Err = QualityError;

    fn from_str(label: &str) -> Result<Setting, QualityError> {
        let bad = || QualityError::Setting(label.to_string());
        let mut parts = label.split('_');
        let number = |part: Option<&str>, prefix: char| -> Option<usize> {
            let digits = part?.strip_prefix(prefix)?;
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            digits.parse().ok()
        };
        let group_size = number(parts.next(), 'g').ok_or_else(bad)?;
        let bits = number(parts.next(), 'b').ok_or_else(bad)?;
        let rest: Vec<&str> = parts.collect();
        let (mode, swap) = match rest.as_slice() {
            [] => (Mode::Symmetric, false),
            ["asym"] => (Mode::Asymmetric, false),
            ["swap"] => (Mode::Symmetric, true),
            ["asym", "swap"] => (Mode::Asymmetric, true),
            _ => return Err(bad()),
        };
        let bits = u32::try_from(bits).map_err(|_| bad())?;
        let setting = Setting {
            group_size,
            bits,
            mode,
            swap,
        };
        // The codec decides which widths and group sizes exist.
        setting.layout(GroupAxis::Token, bits).map_err(|_| bad())?;
        Ok(setting)
    }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "g{}_b{}", self.group_size, self.bits)?;
        if self.mode == Mode::Asymmetric {
            f.write_str("_asym")?;
        }
        if self.swap {
            f.write_str("_swap")?;
        }
        Ok(())
    }
}

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
    /// must divide W (so a token-axis group is never split between two tiers).
    pub fn parse(label: &str, setting: &Setting) -> Result<Policy, QualityError> {
        let bad = || QualityError::Policy(label.to_string());
        if label == "uniform" {
            return Ok(Policy::Uniform);
        }
        let (name, window) = label.split_once(':').ok_or_else(bad)?;
        if window.is_empty() || !window.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let window: usize = window.parse().map_err(|_| bad())?;
        if window == 0 || !window.is_multiple_of(setting.group_size) {
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
    fn runner_labels_parse_and_print_back() {
        for label in [
            "g32_b4",
            "g32_b4_asym",
            "g32_b4_swap",
            "g64_b2_asym_swap",
            "g8_b8",
        ] {
            let setting: Setting = label.parse().unwrap();
            assert_eq!(setting.to_string(), label);
        }
        let s: Setting = "g32_b4_swap".parse().unwrap();
        assert_eq!(
            (s.k_axis(), s.v_axis()),
            (GroupAxis::Feature, GroupAxis::Token)
        );
        assert_eq!(s.mode, Mode::Symmetric);
        let s: Setting = "g32_b3_asym".parse().unwrap();
        assert_eq!(
            (s.k_axis(), s.v_axis()),
            (GroupAxis::Token, GroupAxis::Feature)
        );
        assert_eq!((s.mode, s.bits, s.group_size), (Mode::Asymmetric, 3, 32));
    }

    #[test]
    fn other_labels_are_refused_with_the_form() {
        for label in [
            "",
            "g32",
            "g32_b4_",
            "g0_b4",
            "g32_b1",
            "g32_b9",
            "g32_b4_swap_asym",
            "G32_b4",
            "g32_b+4",
            "g32_b4_q",
        ] {
            let err = label.parse::<Setting>().unwrap_err().to_string();
            assert!(
                err.contains("g<GROUP>_b<BITS>[_asym][_swap]"),
                "{label}: {err}"
            );
        }
        assert!("g32_b1_asym".parse::<Setting>().is_ok());
    }

    #[test]
    fn policies_need_a_window_that_is_a_multiple_of_the_group() {
        let s: Setting = "g32_b2".parse().unwrap();
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
