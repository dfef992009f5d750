//! Archive members required to hold re-derived values bit for bit, the first difference named.

use crate::common::npz::{Archive, Element};
use crate::common::report::{Problem, Report};

/// Requires archive member `name` to hold `derived`, bit for bit.
pub(super) fn require<T: Element + Bits>(
    archive: &Archive,
    pass: &str,
    name: &str,
    derived: &[T],
    report: &mut Report,
) -> bool {
    require_shaped(archive, pass, name, &[derived.len()], derived, report)
}

/// [`require`] of a member of `shape` (`derived` in C order).
pub(super) fn require_shaped<T: Element + Bits>(
    archive: &Archive,
    pass: &str,
    name: &str,
    shape: &[usize],
    derived: &[T],
    report: &mut Report,
) -> bool {
    let Ok(archived) = archive.values::<T>(name, shape) else {
        // Its shape and dtype are checked (and reported) with the other arrays.
        return false;
    };
    match archived
        .iter()
        .zip(derived)
        .position(|(a, d)| a.bits() != d.bits())
    {
        None => true,
        Some(i) => {
            report.fail(Problem::Rerun {
                pass: pass.to_string(),
                array: name.to_string(),
                index: i,
                found: archived[i].shown(),
                expected: derived[i].shown(),
            });
            false
        }
    }
}

/// A value compared by its bits and shown in a problem.
pub trait Bits: Copy {
    /// Its bits.
    fn bits(self) -> u64;
    /// As a problem shows it.
    fn shown(self) -> String;
}

impl Bits for f64 {
    fn bits(self) -> u64 {
        self.to_bits()
    }
    fn shown(self) -> String {
        format!("{self:?}")
    }
}

impl Bits for f32 {
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
    fn shown(self) -> String {
        format!("{self:?}")
    }
}

impl Bits for i64 {
    fn bits(self) -> u64 {
        self as u64
    }
    fn shown(self) -> String {
        self.to_string()
    }
}
