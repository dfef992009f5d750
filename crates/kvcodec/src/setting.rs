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
//! **Valid**: a group size of 1 to [`MAX_GROUP_SIZE`] and a width the mode can store (symmetric 2
//! to 8 bits, asymmetric 1 to 8: [`Layout::with_mode`]). The maximum is the codec's bound on what
//! a setting may ask for at all (a group alone is then the largest grouped view a study holds, so
//! no size derived from it can wrap); how large a group may be for a given cache is still the
//! caller's bound (the studies bound the grouped view, the model-quality cache the context).

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

/// The largest group size a setting takes: 2^27 elements, the largest grouped view a packed-KV
/// study holds (its `MAX_MATRIX_ELEMENTS`), so every group a study can store fits under it and
/// a label or protocol asking for more (`g4294967296_b4`) is refused before any size is computed.
pub const MAX_GROUP_SIZE: usize = 1 << 27;

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
    /// A setting; refuses a group size of 0 or above [`MAX_GROUP_SIZE`] and a width the mode
    /// cannot store.
    pub fn new(group_size: usize, bits: u32, mode: Mode, axes: Axes) -> Result<KvSetting> {
        if group_size > MAX_GROUP_SIZE {
            return Err(KvError::GroupSizeTooLarge {
                group_size,
                max: MAX_GROUP_SIZE,
            });
        }
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
    /// width or group size the codec refuses) is [`KvError::SettingLabel`], except a group size
    /// of the right form above [`MAX_GROUP_SIZE`], which is [`KvError::GroupSizeTooLarge`] (a
    /// group size too large even for a `usize` says so too, with `group_size` = `usize::MAX`).
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
        let group_part = parts.next();
        let group_size = match number(group_part, 'g') {
            Some(group_size) => group_size,
            // All digits, but past usize: too large, not malformed.
            None if group_part
                .and_then(|p| p.strip_prefix('g'))
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())) =>
            {
                usize::MAX
            }
            None => return Err(bad()),
        };
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
        KvSetting::new(group_size, bits, mode, axes).map_err(|e| match e {
            KvError::GroupSizeTooLarge { .. } => e,
            _ => bad(),
        })
    }
}

#[cfg(feature = "serde")]
mod record {
    //! The JSON form of a setting, as protocols and records have always written it.

    use serde::{Deserialize, Serialize};

    use super::{Axes, KvSetting, MAX_GROUP_SIZE};
    use crate::error::KvError;
    use crate::mode::Mode;

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct SettingRecord {
        /// Bounded as it is read, so that the refusal names this field (`settings[0].group_size`).
        #[serde(deserialize_with = "group_size")]
        group_size: usize,
        bits: u32,
        /// Symmetric unless stated (and then not written, so symmetric records read as before).
        #[serde(default, skip_serializing_if = "is_symmetric")]
        mode: Mode,
        /// K on tokens and V on features unless stated (and then not written).
        #[serde(default, skip_serializing_if = "is_default_axes")]
        axes: Axes,
    }

    /// A group size of at most [`MAX_GROUP_SIZE`].
    fn group_size<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
        let group_size = usize::deserialize(deserializer)?;
        if group_size > MAX_GROUP_SIZE {
            return Err(serde::de::Error::custom(KvError::GroupSizeTooLarge {
                group_size,
                max: MAX_GROUP_SIZE,
            }));
        }
        Ok(group_size)
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

    /// `runner quality --setting g4294967296_b4` aborted on a 128 GiB allocation and
    /// `g18446744073709551615_b4` panicked on a wrapping product: a group size above the maximum
    /// is refused by name, from a label, from `new` and from JSON, before any size is computed.
    #[test]
    fn group_sizes_above_the_maximum_are_refused_by_name() {
        let max = MAX_GROUP_SIZE;
        assert_eq!(
            format!("g{max}_b4")
                .parse::<KvSetting>()
                .unwrap()
                .group_size(),
            max
        );
        for (label, group_size) in [
            (format!("g{}_b4", max + 1), max + 1),
            ("g4294967296_b4".to_string(), 1 << 32),
            ("g18446744073709551615_b4_asym".to_string(), usize::MAX),
            // Past usize: still named as too large, not as malformed.
            ("g99999999999999999999999_b4".to_string(), usize::MAX),
        ] {
            let err = label.parse::<KvSetting>().unwrap_err();
            assert_eq!(
                err,
                KvError::GroupSizeTooLarge { group_size, max },
                "{label}"
            );
            assert!(
                err.to_string().contains(&format!("is above {max}")),
                "{label}: {err}"
            );
        }
        assert_eq!(
            KvSetting::new(max + 1, 4, Mode::Symmetric, Axes::default()),
            Err(KvError::GroupSizeTooLarge {
                group_size: max + 1,
                max
            })
        );
    }

    #[test]
    fn the_label_error_states_the_maximum() {
        // error.rs writes the maximum out (it cannot name this module's constant).
        assert_eq!(MAX_GROUP_SIZE, 1 << 27);
        let err = KvError::SettingLabel("x".into()).to_string();
        assert!(err.contains("group size 1 to 2^27"), "{err}");
    }

    #[test]
    fn axes_name_k_and_v() {
        for axes in [Axes::KTokenVFeature, Axes::KFeatureVToken] {
            assert_ne!(axes.k(), axes.v());
            assert_eq!(Axes::with_k(axes.k()), axes);
        }
    }
}
