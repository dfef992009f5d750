//! The shape checks every packed layout shares: sizes that must be multiples of a pack factor
//! or group size, tensors that must have exactly the shape the format implies, and a recorded
//! logical size that must fit inside the stored one. Each error names the format and the tensor.

use crate::error::{FormatError, Result};

/// A stored [K, N] with no element is an empty matrix, before any other check can say more.
pub(crate) fn check_not_empty(k: usize, n: usize) -> Result<()> {
    if k == 0 || n == 0 {
        return Err(FormatError::EmptyMatrix { rows: k, cols: n });
    }
    Ok(())
}

/// `size` must be a multiple of `multiple`.
pub(crate) fn check_aligned(
    format: &'static str,
    what: &'static str,
    size: usize,
    multiple: usize,
) -> Result<()> {
    if !size.is_multiple_of(multiple) {
        return Err(FormatError::NotAligned {
            format,
            what,
            found: size,
            multiple,
        });
    }
    Ok(())
}

/// Each (tensor, its shape, the shape the format implies, why) must agree.
pub(crate) fn check_tensor_shapes<const N: usize>(
    format: &'static str,
    expectations: [(&'static str, &[usize], [usize; 2], String); N],
) -> Result<()> {
    for (tensor, found, expected, why) in expectations {
        if found != expected {
            return Err(FormatError::ShapeMismatch {
                format,
                tensor,
                found: found.to_vec(),
                expected: expected.to_vec(),
                why,
            });
        }
    }
    Ok(())
}

/// Checks that a layer's recorded logical [K, N] is positive and fits inside its stored [K, N].
pub(crate) fn check_logical_shape(
    format: &'static str,
    logical: [usize; 2],
    stored: [usize; 2],
) -> Result<()> {
    let [k, n] = logical;
    check_not_empty(k, n)?;
    if k > stored[0] || n > stored[1] {
        return Err(FormatError::LogicalShapeTooLarge {
            format,
            logical,
            stored,
        });
    }
    Ok(())
}
