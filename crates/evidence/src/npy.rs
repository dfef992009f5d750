//! `.npy` elements written little-endian on every machine.
//!
//! ndarray-npy writes a number in the machine's byte order and says so in the header (`'<f4'` on
//! x86_64 and ARM, `'>f4'` on s390x). Evidence must be the same bytes wherever it is made, and
//! the audit reads little-endian only, so the writer wraps each element in [`Le`], whose
//! descriptor is always `'<'` (or `'|'` for one byte) and whose bytes are `to_le_bytes`. On a
//! little-endian machine that is exactly what ndarray-npy writes for the bare type (a test).

use std::io::Write;

use ndarray_npy::{WritableElement, WriteDataError};
use py_literal::Value as PyValue;

/// A number with a fixed little-endian `.npy` form.
pub trait LeElement: Copy {
    /// Its `.npy` descriptor.
    const DESCR: &'static str;
    /// Appends its little-endian bytes.
    fn put(self, out: &mut Vec<u8>);
}

macro_rules! le_element {
    ($($t:ty => $descr:expr),* $(,)?) => {$(
        impl LeElement for $t {
            const DESCR: &'static str = $descr;
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}

le_element! {
    u8 => "|u1",
    i8 => "|i1",
    u16 => "<u2",
    i16 => "<i2",
    u32 => "<u4",
    i32 => "<i4",
    u64 => "<u8",
    i64 => "<i8",
    f32 => "<f4",
    f64 => "<f8",
}

/// An element written little-endian (module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Le<T>(pub T);

impl<T: LeElement> WritableElement for Le<T> {
    fn type_descriptor() -> PyValue {
        PyValue::String(T::DESCR.into())
    }

    fn write<W: Write>(&self, mut writer: W) -> Result<(), WriteDataError> {
        let mut bytes = Vec::with_capacity(8);
        self.0.put(&mut bytes);
        writer.write_all(&bytes)?;
        Ok(())
    }

    fn write_slice<W: Write>(slice: &[Self], mut writer: W) -> Result<(), WriteDataError> {
        let mut bytes = Vec::with_capacity(std::mem::size_of_val(slice));
        for x in slice {
            x.0.put(&mut bytes);
        }
        writer.write_all(&bytes)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array1, Array2};
    use ndarray_npy::WriteNpyExt;

    fn npy<A: WritableElement>(array: &Array2<A>) -> Vec<u8> {
        let mut out = Vec::new();
        array.write_npy(&mut out).unwrap();
        out
    }

    #[test]
    fn the_header_says_little_endian_and_the_bytes_are() {
        let x = Array2::from_shape_vec((1, 2), vec![1.5f32, -2.0]).unwrap();
        let bytes = npy(&x.mapv(Le));
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("'descr': '<f4'"), "{text}");
        let data = &bytes[bytes.len() - 8..];
        assert_eq!(data, [0, 0, 0xC0, 0x3F, 0, 0, 0, 0xC0]);
        let ids = Array1::from(vec![258i64]).insert_axis(ndarray::Axis(0));
        let bytes = npy(&ids.mapv(Le));
        assert!(String::from_utf8_lossy(&bytes).contains("'<i8'"));
        assert_eq!(&bytes[bytes.len() - 8..], [2, 1, 0, 0, 0, 0, 0, 0]);
    }

    /// On a little-endian machine, what ndarray-npy writes for the bare type.
    #[test]
    #[cfg(target_endian = "little")]
    fn little_endian_machines_write_what_ndarray_npy_writes() {
        let x = Array2::from_shape_fn((3, 5), |(i, j)| (i * 7 + j) as f64 * 0.37 - 1.0);
        assert_eq!(npy(&x.mapv(Le)), npy(&x));
        let c = Array2::from_shape_fn((2, 9), |(i, j)| (i * 9 + j) as u8);
        assert_eq!(npy(&c.mapv(Le)), npy(&c));
        let n = Array2::from_shape_fn((2, 2), |(i, j)| -(i as i64) * 1000 + j as i64);
        assert_eq!(npy(&n.mapv(Le)), npy(&n));
    }
}
