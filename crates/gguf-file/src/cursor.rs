//! The bounds-checked cursor that reads the header's integers, strings and metadata values.

use crate::MAX_ARRAY_DEPTH;
use crate::error::Error;
use crate::value::{Array, Value, ValueType};

/// A position in the file; every read is checked against the bytes left.
pub(crate) struct Cursor<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], Error> {
        let available = self.remaining();
        match usize::try_from(n) {
            Ok(n) if n <= available => {
                let out = &self.bytes[self.pos..self.pos + n];
                self.pos += n;
                Ok(out)
            }
            _ => Err(Error::Truncated {
                what: what(),
                offset: self.pos,
                needed: n,
                available,
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: impl FnOnce() -> String) -> Result<[u8; N], Error> {
        let b = self.take(N as u64, what)?;
        Ok(b.try_into().expect("take returned N bytes"))
    }

    pub(crate) fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, Error> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, Error> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Refuses a count whose smallest encoding exceeds the bytes left, before anything sized
    /// by it is allocated.
    pub(crate) fn check_count(
        &self,
        count: u64,
        min_size: u64,
        what: impl Fn() -> String,
    ) -> Result<usize, Error> {
        let available = self.remaining();
        match count.checked_mul(min_size) {
            Some(total) if total <= available as u64 => Ok(count as usize),
            _ => Err(Error::CountTooLarge {
                what: what(),
                count,
                min_size,
                available,
            }),
        }
    }

    pub(crate) fn string(&mut self, what: &dyn Fn() -> String) -> Result<&'a str, Error> {
        let len = self.u64(|| format!("length of {}", what()))?;
        let raw = self.take(len, what)?;
        std::str::from_utf8(raw).map_err(|_| Error::InvalidUtf8 { what: what() })
    }

    pub(crate) fn value(
        &mut self,
        ty: ValueType,
        what: &dyn Fn() -> String,
        depth: usize,
    ) -> Result<Value<'a>, Error> {
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array(what)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            // ggml reads a bool as a byte and takes any nonzero value as true.
            ValueType::Bool => Value::Bool(self.array::<1>(what)?[0] != 0),
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => Value::Array(self.array_value(what, depth + 1)?),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
        })
    }

    fn array_value(&mut self, what: &dyn Fn() -> String, depth: usize) -> Result<Array<'a>, Error> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(Error::NestingTooDeep { what: what() });
        }
        let type_id = self.u32(|| format!("element type of {}", what()))?;
        let elem = ValueType::from_id(type_id).ok_or_else(|| Error::UnknownValueType {
            what: format!("element of {}", what()),
            type_id,
        })?;
        let count = self.u64(|| format!("element count of {}", what()))?;
        let n = self.check_count(count, elem.min_size(), || format!("array {}", what()))?;
        macro_rules! scalars {
            ($variant:ident, $t:ty) => {{
                let raw = self.take(n as u64 * elem.min_size(), what)?;
                Array::$variant(
                    raw.chunks_exact(size_of::<$t>())
                        .map(|c| {
                            <$t>::from_le_bytes(c.try_into().expect("chunk of the type's size"))
                        })
                        .collect(),
                )
            }};
        }
        Ok(match elem {
            ValueType::U8 => scalars!(U8, u8),
            ValueType::I8 => scalars!(I8, i8),
            ValueType::U16 => scalars!(U16, u16),
            ValueType::I16 => scalars!(I16, i16),
            ValueType::U32 => scalars!(U32, u32),
            ValueType::I32 => scalars!(I32, i32),
            ValueType::F32 => scalars!(F32, f32),
            ValueType::U64 => scalars!(U64, u64),
            ValueType::I64 => scalars!(I64, i64),
            ValueType::F64 => scalars!(F64, f64),
            ValueType::Bool => {
                Array::Bool(self.take(n as u64, what)?.iter().map(|&b| b != 0).collect())
            }
            ValueType::String => {
                let mut out = Vec::with_capacity(n);
                for i in 0..n {
                    out.push(self.string(&|| format!("element {i} of {}", what()))?);
                }
                Array::String(out)
            }
            ValueType::Array => {
                let mut out = Vec::with_capacity(n);
                for i in 0..n {
                    out.push(
                        self.array_value(&|| format!("element {i} of {}", what()), depth + 1)?,
                    );
                }
                Array::Array(out)
            }
        })
    }
}
