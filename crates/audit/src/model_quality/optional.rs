//! summary.json's optional blocks (attention, bootstrap, mechanisms, sensitivity): each is there
//! exactly when the protocol asks for it.

use crate::common::report::{Problem, Report};

/// A block of summary.json that is there exactly when the protocol asks for it: `found` when
/// both are there; otherwise `None`, the mismatch reported at `name`.
pub fn block_present<'a, T>(
    name: &str,
    asked: bool,
    found: Option<&'a T>,
    report: &mut Report,
) -> Option<&'a T> {
    if asked == found.is_some() {
        return found;
    }
    report.fail(Problem::Summary {
        place: name.to_string(),
        found: if found.is_some() { "present" } else { "absent" }.into(),
        expected: if asked {
            "present (the protocol asks for it)"
        } else {
            "absent (the protocol does not ask for it)"
        }
        .into(),
    });
    None
}
