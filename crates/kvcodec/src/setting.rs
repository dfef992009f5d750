//! One codec setting for a whole K and V cache, written down once: the group size, the code width
//! and the mode of its packed tensors, and the axes K and V are grouped along. Every study takes
//! this one value, parsed and validated where it enters (a label, a protocol's JSON, or
//! [`KvSetting::new`]), and asks it for the [`Layout`] of each tensor.
//!
//! **Label**: `g<GROUP>_b<BITS>[_asym][_swap]`. `g32_b4` is symmetric 4-bit codes in groups of 32,
//! K grouped along tokens (one group = 32 consecutive tokens of one channel: KIVI's per-channel
//! keys) and V along features (32 consecutive features of one token); `_asym` makes the codes
//! asymmetric (a scale and a zero point per group); `_swap` groups K along features and V along
//! tokens.
//!
//! **JSON** (feature `serde`): `{"group_size": 32, "bits": 4}`, with `"mode": "asymmetric"` and
//! `"axes": "k_feature_v_token"` written only when they are not the default, so that records
//! made before either existed read the same. Unknown fields are refused.
//!
//! **Valid**: a group size of at least 1 and a width the mode can store (symmetric 2 to 8 bits,
//! asymmetric 1 to 8: [`Layout::with_mode`]). How large a group may be for a given cache is the
//! caller's bound, not the codec's.

use std::fmt;
use std::str::FromStr;

use crate::error::{KvError, Result};
use crate::layout::{GroupAxis, Layout};
use crate::mode::Mode;

/// Which axis K and V are each grouped along.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Axes {
    /// K per channel along tokens, V per token along features (KIVI's layout; the default).
    #[default]
    KTokenVFeature,
    /// The swap: K per token along features, V per channel along tokens.
    KFeatureVToken,
}

impl Axes {
    /// The axis K is grouped along.
    pub fn k(self) -> GroupAxis {
        match self {
            Axes::KTokenVFeature => GroupAxis::Token,
            Axes::KFeatureVToken => GroupAxis::Feature,
        }
    }

    /// The axis V is grouped along.
    pub fn v(self) -> GroupAxis {
        match self {
            Axes::KTokenVFeature => GroupAxis::Feature,
            Axes::KFeatureVToken => GroupAxis::Token,
        }
    }

    /// The axes whose K is grouped along `k`.
    pub fn with_k(k: GroupAxis) -> Axes {
        match k {
            GroupAxis::Token => Axes::KTokenVFeature,
            GroupAxis::Feature => Axes::KFeatureVToken,
        }
    }
}

/// A codec setting for a whole K and V cache (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "record::SettingRecord", into = "record::SettingRecord")
)]
pub struct KvSetting {
    group_size: usize,
    bits: u32,
    mode: Mode,
    axes: Axes,
}

impl KvSetting {
    /// A setting; refuses a group size of 0 and a width the mode cannot store.
    pub fn new(group_size: usize, bits: u32, mode: Mode, axes: Axes) -> Result<KvSetting> {
        Layout::with_mode(axes.k(), mode, bits, group_size)?;
        Ok(KvSetting {
            group_size,
            bits,
            mode,
            axes,
        })
    }

    /// Consecutive elements per group.
    pub fn group_size(&self) -> usize {
        self.group_size
    }

    /// Code width.
    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// Symmetric or asymmetric codes.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The axes K and V are grouped along.
    pub fn axes(&self) -> Axes {
        self.axes
    }

    /// The same setting at another width (a budget's 8-bit tier, say); refuses a width the mode
    /// cannot store.
    pub fn with_bits(&self, bits: u32) -> Result<KvSetting> {
        KvSetting::new(self.group_size, bits, self.mode, self.axes)
    }

    /// The layout of a tensor grouped along `axis` under this setting.
    pub fn layout(&self, axis: GroupAxis) -> Layout {
        Layout::with_mode(axis, self.mode, self.bits, self.group_size)
            .expect("a setting is validated when it is made")
    }

    /// The layout of K.
    pub fn k_layout(&self) -> Layout {
        self.layout(self.axes.k())
    }

    /// The layout of V.
    pub fn v_layout(&self) -> Layout {
        self.layout(self.axes.v())
    }

    /// The label, `g<GROUP>_b<BITS>[_asym][_swap]` (the same as `to_string`).
    pub fn label(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for KvSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "g{}_b{}", self.group_size, self.bits)?;
        if self.mode == Mode::Asymmetric {
            f.write_str("_asym")?;
        }
        if self.axes == Axes::KFeatureVToken {
            f.write_str("_swap")?;
        }
        Ok(())
    }
}

impl FromStr for KvSetting {
    type Err = KvError;

    /// Parses a label; anything but the exact form (`G32_b4`, `g32_b+4`, `g32_b4_swap_asym`, a
    /// width or group size the codec refuses) is [`KvError::SettingLabel`].
    fn from_str(label: &str) -> Result<KvSetting> {
        let bad = || KvError::SettingLabel(label.to_string());
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
        let (mode, axes) = match rest.as_slice() {
            [] => (Mode::Symmetric, Axes::KTokenVFeature),
            ["asym"] => (Mode::Asymmetric, Axes::KTokenVFeature),
            ["swap"] => (Mode::Symmetric, Axes::KFeatureVToken),
            ["asym", "swap"] => (Mode::Asymmetric, Axes::KFeatureVToken),
            _ => return Err(bad()),
        };
        let bits = u32::try_from(bits).map_err(|_| bad())?;
        KvSetting::new(group_size, bits, mode, axes).map_err(|_| bad())
    }
}

#[cfg(feature = "serde")]
mod record {
    //! The JSON form of a setting, as protocols and records have always written it.

    use serde::{Deserialize, Serialize};

    use super::{Axes, KvSetting};
    use crate::error::KvError;
    use crate::mode::Mode;

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct SettingRecord {
        group_size: usize,
        bits: u32,
        /// Symmetric unless stated (and then not written, so symmetric records read as before).
        #[serde(default, skip_serializing_if = "is_symmetric")]
        mode: Mode,
        /// K on tokens and V on features unless stated (and then not written).
        #[serde(default, skip_serializing_if = "is_default_axes")]
        axes: Axes,
    }

    fn is_symmetric(mode: &Mode) -> bool {
        *mode == Mode::Symmetric
    }

    fn is_default_axes(axes: &Axes) -> bool {
        *axes == Axes::KTokenVFeature
    }

    impl TryFrom<SettingRecord> for KvSetting {
        type Error = KvError;

        fn try_from(r: SettingRecord) -> Result<KvSetting, KvError> {
            KvSetting::new(r.group_size, r.bits, r.mode, r.axes)
        }
    }

    impl From<KvSetting> for SettingRecord {
        fn from(s: KvSetting) -> SettingRecord {
            SettingRecord {
                group_size: s.group_size,
                bits: s.bits,
                mode: s.mode,
                axes: s.axes,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_parse_and_print_back() {
        for label in [
            "g32_b4",
            "g32_b4_asym",
            "g32_b4_swap",
            "g64_b2_asym_swap",
            "g8_b8",
            "g32_b1_asym",
        ] {
            let setting: KvSetting = label.parse().unwrap();
            assert_eq!(setting.to_string(), label);
        }
        let s: KvSetting = "g32_b4_swap".parse().unwrap();
        assert_eq!(s.k_layout().axis, GroupAxis::Feature);
        assert_eq!(s.v_layout().axis, GroupAxis::Token);
        assert_eq!(s.mode(), Mode::Symmetric);
        let s: KvSetting = "g32_b3_asym".parse().unwrap();
        assert_eq!(
            (s.k_layout().axis, s.v_layout().axis),
            (GroupAxis::Token, GroupAxis::Feature)
        );
        assert_eq!(
            (s.mode(), s.bits(), s.group_size()),
            (Mode::Asymmetric, 3, 32)
        );
        assert_eq!(
            s.k_layout(),
            Layout::with_mode(GroupAxis::Token, Mode::Asymmetric, 3, 32).unwrap()
        );
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
            "g32_b99999999999",
        ] {
            let err = label.parse::<KvSetting>().unwrap_err();
            assert_eq!(err, KvError::SettingLabel(label.to_string()));
            assert!(
                err.to_string().contains("g<GROUP>_b<BITS>[_asym][_swap]"),
                "{label}: {err}"
            );
        }
    }

    #[test]
    fn a_setting_is_valid_from_the_start_and_at_every_width_it_gives() {
        assert_eq!(
            KvSetting::new(0, 4, Mode::Symmetric, Axes::default()),
            Err(KvError::ZeroGroupSize)
        );
        assert!(matches!(
            KvSetting::new(32, 1, Mode::Symmetric, Axes::default()),
            Err(KvError::UnsupportedBits { bits: 1, .. })
        ));
        let low: KvSetting = "g32_b2".parse().unwrap();
        assert_eq!(low.with_bits(8).unwrap().to_string(), "g32_b8");
        assert!(low.with_bits(9).is_err());
    }

    #[test]
    fn axes_name_k_and_v() {
        for axes in [Axes::KTokenVFeature, Axes::KFeatureVToken] {
            assert_ne!(axes.k(), axes.v());
            assert_eq!(Axes::with_k(axes.k()), axes);
        }
    }
}
