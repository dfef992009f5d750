//! One `.npy` member, read strictly.
//!
//! `numpy.load` parses the header dictionary with `ast.literal_eval` and accepts any spelling of
//! a dtype it knows (`'<f4'`, `'f4'`, `'float32'`, native byte order ...). This reader accepts
//! only the spelling the two writers in play produce, so that what it reads is what NumPy reads:
//!
//! ```text
//! \x93NUMPY \x01 \x00 <u16 header length> {'descr': D, 'fortran_order': False, 'shape': S}<spaces>\n
//! ```
//!
//! (NumPy itself writes `..., 'shape': S, }`, which is accepted too.) D is one of `'<f4'`,
//! `'<f8'`, `'<i4'` and `'|u1'`; S is a Python tuple literal of non-negative integers as `repr`
//! writes it (`()`, `(2048,)`, `(4, 32)`); the header is at most 10,000 bytes (NumPy's own limit
//! for `allow_pickle=False` loads) and ends with spaces and one newline; the data that follows is
//! exactly `prod(S) * itemsize` bytes, little-endian, in C order.

use thiserror::Error;

const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// NumPy refuses longer headers by default (`max_header_size` in `numpy.load`).
pub const MAX_HEADER_BYTES: usize = 10_000;
/// NumPy's limit on the number of dimensions.
const MAX_DIMENSIONS: usize = 64;

/// The element types the evidence uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Dtype {
    /// `'|u1'`: unsigned bytes (code and zero-point streams).
    U8,
    /// `'<i4'`: little-endian int32 (shapes).
    I32,
    /// `'<f4'`: little-endian float32 (inputs, scales, float32 segments).
    F32,
    /// `'<f8'`: little-endian float64 (references and outputs).
    F64,
    /// `'<i8'`: little-endian int64 (token ids and argmaxes of model-quality evidence).
    I64,
}

impl Dtype {
    /// The descriptor string as the header spells it.
    pub fn descr(self) -> &'static str {
        match self {
            Dtype::U8 => "|u1",
            Dtype::I32 => "<i4",
            Dtype::F32 => "<f4",
            Dtype::F64 => "<f8",
            Dtype::I64 => "<i8",
        }
    }

    /// Bytes per element.
    pub fn itemsize(self) -> usize {
        match self {
            Dtype::U8 => 1,
            Dtype::I32 | Dtype::F32 => 4,
            Dtype::F64 | Dtype::I64 => 8,
        }
    }

    fn from_descr(descr: &str) -> Option<Dtype> {
        [Dtype::U8, Dtype::I32, Dtype::F32, Dtype::F64, Dtype::I64]
            .into_iter()
            .find(|d| d.descr() == descr)
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.descr())
    }
}

/// Why a member is not a `.npy` file as the evidence writes it. Each variant names one rule.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum NpyError {
    /// The member does not start with the `.npy` magic string.
    #[error("it does not start with the .npy magic string")]
    Magic,
    /// A format version other than 1.0.
    #[error("it is .npy format version {major}.{minor}, not 1.0")]
    Version {
        /// Major version byte.
        major: u8,
        /// Minor version byte.
        minor: u8,
    },
    /// The header runs past the member or over NumPy's limit.
    #[error("its header length {length} is past the member's end or over {MAX_HEADER_BYTES} bytes")]
    HeaderLength {
        /// Declared header length.
        length: usize,
    },
    /// The header is not the dictionary text the writers produce.
    #[error(
        "its header is not `{{'descr': ..., 'fortran_order': False, 'shape': (...)}}`: {found:?}"
    )]
    Header {
        /// The header text (lossily decoded, padding trimmed).
        found: String,
    },
    /// A dtype other than the four the evidence uses, or another spelling of one.
    #[error("its dtype {found:?} is not one of '<f4', '<f8', '<i4', '|u1'")]
    Dtype {
        /// The descriptor found.
        found: String,
    },
    /// Fortran (column-major) order.
    #[error("it is stored in Fortran order")]
    FortranOrder,
    /// A shape that is not a tuple of plain integers, or whose size overflows.
    #[error(
        "its shape {found:?} is not a tuple of plain non-negative integers with a size that fits"
    )]
    Shape {
        /// The shape text.
        found: String,
    },
    /// The data is not exactly shape x itemsize bytes.
    #[error("its shape and dtype call for {expected} data bytes, the member holds {present}")]
    DataSize {
        /// prod(shape) x itemsize.
        expected: usize,
        /// Bytes after the header.
        present: usize,
    },
}

impl NpyError {
    /// A stable identifier of the rule broken (used by the hostile-archive fixtures).
    pub fn rule(&self) -> &'static str {
        match self {
            NpyError::Magic => "npy_magic",
            NpyError::Version { .. } => "npy_version",
            NpyError::HeaderLength { .. } => "npy_header_length",
            NpyError::Header { .. } => "npy_header",
            NpyError::Dtype { .. } => "npy_dtype",
            NpyError::FortranOrder => "npy_fortran_order",
            NpyError::Shape { .. } => "npy_shape",
            NpyError::DataSize { .. } => "npy_data_size",
        }
    }
}

/// A parsed `.npy` header: what the data is and where it starts within the member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyHeader {
    /// Element type.
    pub dtype: Dtype,
    /// Shape, C order.
    pub shape: Vec<usize>,
    /// Offset of the first data byte within the member.
    pub data_offset: usize,
}

/// Bytes of a member that [`parse_prefix`] reads at most: magic, version, header length and
/// the longest header NumPy accepts.
pub const PREFIX_BYTES: usize = 10 + MAX_HEADER_BYTES;

/// Parses a member's header and checks that exactly the declared data follows it.
pub fn parse(member: &[u8]) -> Result<NpyHeader, NpyError> {
    parse_prefix(&member[..member.len().min(PREFIX_BYTES)], member.len())
}

/// [`parse`] for a member of `len` bytes of which only the first `min(len, PREFIX_BYTES)` are
/// at hand: the rules need no more, so a member's data is never held to read its header.
pub fn parse_prefix(prefix: &[u8], len: usize) -> Result<NpyHeader, NpyError> {
    if len < 10 || prefix.len() < 10 || &prefix[..6] != MAGIC {
        return Err(NpyError::Magic);
    }
    let (major, minor) = (prefix[6], prefix[7]);
    if (major, minor) != (1, 0) {
        return Err(NpyError::Version { major, minor });
    }
    let length = u16::from_le_bytes([prefix[8], prefix[9]]) as usize;
    if length > MAX_HEADER_BYTES || 10 + length > len {
        return Err(NpyError::HeaderLength { length });
    }
    // Within the prefix whenever it is the member's first min(len, PREFIX_BYTES) bytes.
    let header = prefix
        .get(10..10 + length)
        .ok_or(NpyError::HeaderLength { length })?;
    let bad_header = || NpyError::Header {
        found: String::from_utf8_lossy(header).trim_end().to_string(),
    };
    let text = header
        .strip_suffix(b"\n")
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or_else(bad_header)?;
    let dict = text.trim_end_matches(' ');
    let rest = dict.strip_prefix("{'descr': '").ok_or_else(bad_header)?;
    let (descr, rest) = rest.split_once('\'').ok_or_else(bad_header)?;
    let rest = rest
        .strip_prefix(", 'fortran_order': ")
        .ok_or_else(bad_header)?;
    let (fortran, rest) = if let Some(rest) = rest.strip_prefix("False") {
        (false, rest)
    } else if let Some(rest) = rest.strip_prefix("True") {
        (true, rest)
    } else {
        return Err(bad_header());
    };
    let rest = rest.strip_prefix(", 'shape': (").ok_or_else(bad_header)?;
    let (shape_text, rest) = rest.split_once(')').ok_or_else(bad_header)?;
    if rest != "}" && rest != ", }" {
        return Err(bad_header());
    }
    let dtype = Dtype::from_descr(descr).ok_or_else(|| NpyError::Dtype {
        found: descr.to_string(),
    })?;
    if fortran {
        return Err(NpyError::FortranOrder);
    }
    let shape = parse_shape(shape_text).ok_or_else(|| NpyError::Shape {
        found: format!("({shape_text})"),
    })?;
    let expected = shape
        .iter()
        .try_fold(dtype.itemsize(), |n, &d| n.checked_mul(d))
        .ok_or_else(|| NpyError::Shape {
            found: format!("({shape_text})"),
        })?;
    let data_offset = 10 + length;
    let present = len - data_offset;
    if expected != present {
        return Err(NpyError::DataSize { expected, present });
    }
    Ok(NpyHeader {
        dtype,
        shape,
        data_offset,
    })
}

/// A tuple's inside as Python's `repr` writes it: "" -> (), "5," -> (5,), "4, 32" -> (4, 32).
fn parse_shape(text: &str) -> Option<Vec<usize>> {
    if text.is_empty() {
        return Some(Vec::new());
    }
    let parts: Vec<&str> = match text.strip_suffix(',') {
        Some(single) => vec![single],
        None if text.contains(", ") => text.split(", ").collect(),
        None => return None,
    };
    if parts.len() > MAX_DIMENSIONS {
        return None;
    }
    parts
        .into_iter()
        .map(|p| {
            let plain = !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
                && (p == "0" || !p.starts_with('0'));
            plain.then(|| p.parse::<usize>().ok()).flatten()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(dict: &str, data: &[u8]) -> Vec<u8> {
        let mut header = dict.to_string();
        while !(10 + header.len() + 1).is_multiple_of(64) {
            header.push(' ');
        }
        header.push('\n');
        let mut out = MAGIC.to_vec();
        out.extend([1, 0]);
        out.extend((header.len() as u16).to_le_bytes());
        out.extend(header.as_bytes());
        out.extend(data);
        out
    }

    #[test]
    fn both_writers_spellings_are_read() {
        let ours = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2)}",
            &[0; 8],
        );
        let numpy = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), }",
            &[0; 8],
        );
        for member in [ours, numpy] {
            let header = parse(&member).unwrap();
            assert_eq!((header.dtype, header.shape), (Dtype::F32, vec![1, 2]));
            assert_eq!(header.data_offset, 128);
        }
        let vector = npy(
            "{'descr': '|u1', 'fortran_order': False, 'shape': (3,)}",
            &[1, 2, 3],
        );
        assert_eq!(parse(&vector).unwrap().shape, vec![3]);
        let scalar = npy(
            "{'descr': '<f8', 'fortran_order': False, 'shape': ()}",
            &[0; 8],
        );
        assert_eq!(parse(&scalar).unwrap().shape, Vec::<usize>::new());
    }

    #[test]
    fn other_spellings_orders_and_sizes_are_refused() {
        let refuse = |dict: &str, data: &[u8]| parse(&npy(dict, data)).unwrap_err().rule();
        let f = "'fortran_order': False";
        assert_eq!(
            refuse(&format!("{{'descr': 'f4', {f}, 'shape': (2,)}}"), &[0; 8]),
            "npy_dtype"
        );
        assert_eq!(
            refuse(&format!("{{'descr': '>f4', {f}, 'shape': (2,)}}"), &[0; 8]),
            "npy_dtype"
        );
        assert_eq!(
            refuse(
                "{'descr': '<f4', 'fortran_order': True, 'shape': (2,)}",
                &[0; 8]
            ),
            "npy_fortran_order"
        );
        assert_eq!(
            refuse(&format!("{{'shape': (2,), 'descr': '<f4', {f}}}"), &[0; 8]),
            "npy_header"
        );
        assert_eq!(
            refuse(&format!("{{'descr': '<f4', {f}, 'shape': (02,)}}"), &[0; 8]),
            "npy_shape"
        );
        assert_eq!(
            refuse(&format!("{{'descr': '<f4', {f}, 'shape': (2)}}"), &[0; 8]),
            "npy_shape"
        );
        // Extra bytes after the data, and too few.
        assert_eq!(
            refuse(&format!("{{'descr': '<f4', {f}, 'shape': (2,)}}"), &[0; 9]),
            "npy_data_size"
        );
        assert_eq!(
            refuse(&format!("{{'descr': '<f4', {f}, 'shape': (2,)}}"), &[0; 7]),
            "npy_data_size"
        );
        // A huge shape over a few bytes is a size mismatch, found before anything is allocated.
        let huge = format!("{{'descr': '<f8', {f}, 'shape': (4294967296, 4294967296)}}");
        assert!(matches!(
            parse(&npy(&huge, &[0; 16])),
            Err(NpyError::Shape { .. })
        ));
        let big = format!("{{'descr': '<f8', {f}, 'shape': (1099511627776,)}}");
        assert!(matches!(
            parse(&npy(&big, &[0; 16])),
            Err(NpyError::DataSize { present: 16, .. })
        ));
    }
}
