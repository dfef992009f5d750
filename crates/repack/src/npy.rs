//! `.npy` float32 matrices (the input of `repack quantize`), read from bytes with every size
//! checked against the bytes present before anything is allocated.
//!
//! Why not `ndarray_npy::read_npy` directly: it parses the header, then allocates the declared
//! shape (`vec![0.0; rows * cols]`) before reading any data, so a header declaring
//! (2**40, 2**20) over 16 bytes of data aborts the process on the failed allocation. A bounded
//! reader would not help, since the allocation comes from the header, not from the bytes read.
//! Its header reader likewise allocates the declared header length (up to 4 GiB in versions 2
//! and 3) before reading it. So this module reads the preamble itself and checks the header
//! length against the bytes present, lets ndarray-npy parse the header (a Python dict literal),
//! checks the dtype, the order and the rank, requires the data to be exactly
//! `rows * cols * 4` bytes, and only then decodes them. Each refusal says what the file holds
//! and what is needed.
//!
//! Written ([`npy_matrix_bytes`]) little-endian on every machine (`'<f4'`): ndarray-npy writes
//! the machine's byte order, which on a big-endian CPU would make `repack dequantize`'s file
//! differ from the same command's on x86_64.
//!
//! This module works on bytes only and depends on no other of this crate's; reading the file is
//! [`crate::files::read_npy_matrix`].

use ndarray::Array2;
use ndarray_npy::npy::header::{Header, ParseHeaderError, ReadHeaderError};
use thiserror::Error;

/// The first bytes of every `.npy` file.
pub const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// The longest header accepted, in bytes. numpy's own reader refuses longer ones unless told to
/// trust the file (`max_header_size` in `numpy.lib.format`, since numpy 1.24); a float32
/// matrix's header is under 128 bytes.
pub const MAX_HEADER_LEN: usize = 10_000;

/// The deepest bracket nesting accepted in a header. A float32 matrix's header nests 2 deep (the
/// dict, the shape tuple); the parser behind ndarray-npy recurses once per level, so a header of
/// thousands of `[` is refused here instead of being left to its stack guard.
pub const MAX_HEADER_NESTING: usize = 8;

/// Why bytes are not a 2-D float32 matrix in `.npy` format.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum NpyError {
    /// Fewer bytes than the preamble takes.
    #[error(
        "{found} bytes; a .npy file starts with the 6-byte magic string \\x93NUMPY, a 2-byte \
         version and the header's length"
    )]
    TooShort {
        /// Bytes present.
        found: usize,
    },

    /// Bytes that do not start with the magic string.
    #[error("it does not start with the .npy magic string \\x93NUMPY (it starts {found:02x?})")]
    NotNpy {
        /// Its first 6 bytes.
        found: Vec<u8>,
    },

    /// A format version other than 1.0, 2.0 and 3.0.
    #[error(".npy format version {major}.{minor}; this reader knows versions 1.0, 2.0 and 3.0")]
    UnsupportedVersion {
        /// Major version.
        major: u8,
        /// Minor version.
        minor: u8,
    },

    /// A header length past the end of the bytes.
    #[error("its header declares {declared} bytes, but only {available} bytes follow the preamble")]
    HeaderPastEnd {
        /// The header length it declares.
        declared: usize,
        /// Bytes after the preamble.
        available: usize,
    },

    /// A header longer than [`MAX_HEADER_LEN`].
    #[error(
        "its header declares {declared} bytes; headers over {limit} are refused, as numpy itself \
         refuses them (a float32 matrix's header is under 128 bytes)"
    )]
    HeaderTooLong {
        /// The header length it declares.
        declared: usize,
        /// [`MAX_HEADER_LEN`].
        limit: usize,
    },

    /// A header nesting brackets deeper than [`MAX_HEADER_NESTING`].
    #[error(
        "its header nests brackets {depth} deep; a float32 matrix's header nests 2 deep, and \
         more than {limit} is refused"
    )]
    HeaderTooDeep {
        /// Its deepest nesting.
        depth: usize,
        /// [`MAX_HEADER_NESTING`].
        limit: usize,
    },

    /// A header ndarray-npy does not parse as numpy's dictionary. Its message is kept as text,
    /// shortened (the parser's own messages quote the whole header).
    #[error("its header is not the dictionary numpy writes: {why}")]
    Header {
        /// What the parser said, shortened.
        why: String,
    },

    /// A shape of another rank than 2.
    #[error(
        "it has {}; quantize needs a 2-D float32 matrix [rows, cols]{}",
        describe_shape(.shape),
        reshape_hint(.shape)
    )]
    NotAMatrix {
        /// The shape.
        shape: Vec<usize>,
    },

    /// Elements that are not float32.
    #[error(
        "its elements are {} ({found}); quantize needs float32 ('<f4'): convert it with \
         np.save(path, x.astype(np.float32))",
        dtype_name(.found)
    )]
    WrongDtype {
        /// The header's `descr`, shortened.
        found: String,
    },

    /// Fortran (column-major) order.
    #[error(
        "a {rows} x {cols} matrix in Fortran (column-major) order; quantize needs C (row-major) \
         order: save np.ascontiguousarray(x)"
    )]
    FortranOrder {
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
    },

    /// A shape whose size in bytes does not fit in a usize.
    #[error(
        "its header declares a {rows} x {cols} float32 matrix, whose size in bytes does not fit \
         in {} bits",
        usize::BITS
    )]
    SizeOverflow {
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
    },

    /// Data of another length than the shape needs.
    #[error(
        "its header declares a {rows} x {cols} float32 matrix ({expected} bytes of data), but \
         {found} bytes follow the header"
    )]
    DataLength {
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
        /// rows * cols * 4.
        expected: usize,
        /// Bytes after the header.
        found: usize,
    },
}

/// The 2-D float32 matrix (little- or big-endian, C order) that `bytes` hold in `.npy` format.
/// Nothing is allocated from a size the bytes do not back.
pub fn parse_npy_matrix(bytes: &[u8]) -> Result<Array2<f32>, NpyError> {
    let (header, data) = split_header(bytes)?;
    let little_endian = match header.type_descriptor.as_string().map(String::as_str) {
        Some("<f4") => true,
        Some(">f4") => false,
        _ => {
            return Err(NpyError::WrongDtype {
                found: shortened(&header.type_descriptor.to_string(), 60),
            });
        }
    };
    let [rows, cols] =
        <[usize; 2]>::try_from(header.shape.as_slice()).map_err(|_| NpyError::NotAMatrix {
            shape: header.shape.clone(),
        })?;
    if header.layout.is_fortran() {
        return Err(NpyError::FortranOrder { rows, cols });
    }
    let expected = rows
        .checked_mul(cols)
        .and_then(|count| count.checked_mul(4))
        .ok_or(NpyError::SizeOverflow { rows, cols })?;
    if data.len() != expected {
        return Err(NpyError::DataLength {
            rows,
            cols,
            expected,
            found: data.len(),
        });
    }
    let values = data
        .chunks_exact(4)
        .map(|b| {
            let b = b.try_into().expect("4 bytes");
            if little_endian {
                f32::from_le_bytes(b)
            } else {
                f32::from_be_bytes(b)
            }
        })
        .collect();
    // The length was checked against rows * cols just above.
    Ok(Array2::from_shape_vec((rows, cols), values).expect("rows * cols values"))
}

/// The parsed header and the bytes after it, with the header's length checked against the bytes
/// present before ndarray-npy reads (and allocates) it.
fn split_header(bytes: &[u8]) -> Result<(Header, &[u8]), NpyError> {
    let preamble = |len: usize| {
        bytes
            .get(..len)
            .ok_or(NpyError::TooShort { found: bytes.len() })
    };
    let start = preamble(8)?;
    if &start[..6] != MAGIC {
        return Err(NpyError::NotNpy {
            found: start[..6].to_vec(),
        });
    }
    let (major, minor) = (start[6], start[7]);
    // Version 1.0 stores the header length in 2 bytes, 2.0 and 3.0 in 4.
    let (declared, header_start) = match (major, minor) {
        (1, 0) => {
            let len = preamble(10)?;
            (usize::from(u16::from_le_bytes([len[8], len[9]])), 10)
        }
        (2 | 3, 0) => {
            let len = preamble(12)?;
            let declared = u32::from_le_bytes([len[8], len[9], len[10], len[11]]);
            // A u32 that does not fit in usize cannot fit in the bytes present either.
            (usize::try_from(declared).unwrap_or(usize::MAX), 12)
        }
        _ => return Err(NpyError::UnsupportedVersion { major, minor }),
    };
    let available = bytes.len() - header_start;
    if declared > available {
        return Err(NpyError::HeaderPastEnd {
            declared,
            available,
        });
    }
    if declared > MAX_HEADER_LEN {
        return Err(NpyError::HeaderTooLong {
            declared,
            limit: MAX_HEADER_LEN,
        });
    }
    let header_end = header_start + declared;
    let depth = nesting_depth(&bytes[header_start..header_end]);
    if depth > MAX_HEADER_NESTING {
        return Err(NpyError::HeaderTooDeep {
            depth,
            limit: MAX_HEADER_NESTING,
        });
    }
    let header = Header::from_reader(&mut &bytes[..header_end]).map_err(header_error)?;
    Ok((header, &bytes[header_end..]))
}

/// The deepest nesting of brackets of any kind (quotes are not special: a float32 matrix's
/// header has no brackets inside its strings, so this can only overcount for other headers).
fn nesting_depth(header: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    for &byte in header {
        match byte {
            b'(' | b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

fn header_error(err: ReadHeaderError) -> NpyError {
    let why = match err {
        // The parser's own message quotes the whole header line with a caret under it.
        ReadHeaderError::Parse(ParseHeaderError::DictParse(_)) => {
            "it is not a Python literal".to_string()
        }
        other => shortened(&other.to_string(), 120),
    };
    NpyError::Header { why }
}

/// At most `max` characters, with an ellipsis when cut (a header's values can be long).
fn shortened(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let cut: String = text.chars().take(max.saturating_sub(3)).collect();
        format!("{cut}...")
    }
}

/// "0 dimensions (a single value)", "1 dimension (shape [12])", "3 dimensions (shape [2, 3, 4])".
fn describe_shape(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    match shape {
        [] => "0 dimensions (a single value)".to_string(),
        [n] => format!("1 dimension (shape [{n}])"),
        _ => format!(
            "{} dimensions (shape [{}])",
            shape.len(),
            shortened(&dims.join(", "), 80)
        ),
    }
}

/// What to do with an array of another rank: reshape a vector into one row.
fn reshape_hint(shape: &[usize]) -> String {
    match shape {
        [n] => format!(": to quantize it as one row, save x.reshape(1, {n})"),
        [] => ": save x.reshape(1, 1)".to_string(),
        _ => ": save x.reshape(rows, cols)".to_string(),
    }
}

/// numpy's name for a dtype descriptor, for the common ones.
fn dtype_name(descr: &str) -> &'static str {
    let code = descr
        .trim_matches('\'')
        .trim_start_matches(['<', '>', '|', '=']);
    match code {
        "f2" => "float16",
        "f8" => "float64",
        "f16" => "float128",
        "i1" => "int8",
        "i2" => "int16",
        "i4" => "int32",
        "i8" => "int64",
        "u1" => "uint8",
        "u2" => "uint16",
        "u4" => "uint32",
        "u8" => "uint64",
        "b1" => "bool",
        "c8" => "complex64",
        "c16" => "complex128",
        "f4" => "float32, in a byte order this reader does not know",
        _ => "not a plain number type",
    }
}

/// A float32 written little-endian whatever the machine (the module docs).
#[derive(Clone, Copy)]
struct LeF32(f32);

impl ndarray_npy::WritableElement for LeF32 {
    fn type_descriptor() -> py_literal::Value {
        py_literal::Value::String("<f4".into())
    }

    fn write<W: std::io::Write>(&self, mut writer: W) -> Result<(), ndarray_npy::WriteDataError> {
        writer.write_all(&self.0.to_le_bytes())?;
        Ok(())
    }

    fn write_slice<W: std::io::Write>(
        slice: &[Self],
        mut writer: W,
    ) -> Result<(), ndarray_npy::WriteDataError> {
        let bytes: Vec<u8> = slice.iter().flat_map(|v| v.0.to_le_bytes()).collect();
        writer.write_all(&bytes)?;
        Ok(())
    }
}

/// `x` as a `.npy` file (version 1.0, C order, `'<f4'`), the same bytes on every machine.
pub fn npy_matrix_bytes(x: &Array2<f32>) -> Vec<u8> {
    use ndarray_npy::WriteNpyExt;
    let mut out = Vec::new();
    // Into memory, a float32 matrix's header and data cannot fail to format or to write.
    x.mapv(LeF32)
        .write_npy(&mut out)
        .expect("a float32 matrix lays out as .npy in memory");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;
    use ndarray_npy::WriteNpyExt;

    /// A version 1.0 file with `header` (a dict literal), padded as numpy pads it.
    fn npy(header: &str, data: &[u8]) -> Vec<u8> {
        let mut text = header.as_bytes().to_vec();
        let total = 10 + text.len() + 1;
        text.resize(text.len() + (64 - total % 64) % 64, b' ');
        text.push(b'\n');
        let mut out = MAGIC.to_vec();
        out.extend([1, 0]);
        out.extend(u16::try_from(text.len()).unwrap().to_le_bytes());
        out.extend(text);
        out.extend(data);
        out
    }

    fn f4_header(shape: &str) -> String {
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}")
    }

    #[test]
    fn reads_what_ndarray_npy_writes() {
        let x = array![[1.0f32, -2.5, 3.0], [0.0, f32::MIN_POSITIVE, 7.0]];
        let mut bytes = Vec::new();
        x.write_npy(&mut bytes).unwrap();
        assert_eq!(parse_npy_matrix(&bytes).unwrap(), x);
    }

    #[test]
    fn reads_big_endian_float32() {
        let data: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_be_bytes())
            .collect();
        let bytes = npy(
            "{'descr': '>f4', 'fortran_order': False, 'shape': (1, 2), }",
            &data,
        );
        assert_eq!(parse_npy_matrix(&bytes).unwrap(), array![[1.5f32, -2.0]]);
    }

    #[test]
    fn a_huge_declared_shape_over_16_bytes_is_refused_before_allocating() {
        let shape = format!("({}, {})", 1u64 << 40, 1u64 << 20);
        let err = parse_npy_matrix(&npy(&f4_header(&shape), &[0; 16])).unwrap_err();
        assert_eq!(
            err,
            NpyError::DataLength {
                rows: 1 << 40,
                cols: 1 << 20,
                expected: 1 << 62,
                found: 16
            }
        );
    }

    #[test]
    fn a_shape_whose_byte_count_overflows_is_refused() {
        let shape = format!("({}, {})", usize::MAX, 2);
        let err = parse_npy_matrix(&npy(&f4_header(&shape), &[])).unwrap_err();
        assert_eq!(
            err,
            NpyError::SizeOverflow {
                rows: usize::MAX,
                cols: 2
            }
        );
    }

    #[test]
    fn a_vector_is_refused_naming_its_length() {
        let err = parse_npy_matrix(&npy(&f4_header("(12,)"), &[0; 48])).unwrap_err();
        assert_eq!(err, NpyError::NotAMatrix { shape: vec![12] });
        // How NotAMatrix describes each rank.
        assert_eq!(describe_shape(&[]), "0 dimensions (a single value)");
        assert_eq!(describe_shape(&[12]), "1 dimension (shape [12])");
        assert_eq!(describe_shape(&[2, 3, 4]), "3 dimensions (shape [2, 3, 4])");
        assert_eq!(
            err.to_string(),
            "it has 1 dimension (shape [12]); quantize needs a 2-D float32 matrix [rows, cols]: \
             to quantize it as one row, save x.reshape(1, 12)"
        );
    }

    #[test]
    fn float64_is_refused_naming_the_dtype() {
        let header = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }";
        let err = parse_npy_matrix(&npy(header, &[0; 32])).unwrap_err();
        assert!(matches!(&err, NpyError::WrongDtype { found } if found.contains("<f8")));
        assert_eq!(
            err.to_string(),
            "its elements are float64 ('<f8'); quantize needs float32 ('<f4'): convert it with \
             np.save(path, x.astype(np.float32))"
        );
        // How WrongDtype names numpy's dtypes.
        assert_eq!(dtype_name("'<f8'"), "float64");
        assert_eq!(dtype_name("'|u1'"), "uint8");
        assert_eq!(
            dtype_name("'>f4'"),
            "float32, in a byte order this reader does not know"
        );
        assert_eq!(dtype_name("[('a', '<f4')]"), "not a plain number type");
    }

    #[test]
    fn fortran_order_is_refused() {
        let header = "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }";
        let err = parse_npy_matrix(&npy(header, &[0; 24])).unwrap_err();
        assert_eq!(err, NpyError::FortranOrder { rows: 2, cols: 3 });
    }

    #[test]
    fn a_header_length_past_the_end_is_refused_before_reading_it() {
        let mut bytes = MAGIC.to_vec();
        bytes.extend([2, 0]);
        bytes.extend(u32::MAX.to_le_bytes());
        bytes.extend(b"{}");
        let err = parse_npy_matrix(&bytes).unwrap_err();
        assert_eq!(
            err,
            NpyError::HeaderPastEnd {
                declared: u32::MAX as usize,
                available: 2
            }
        );
    }

    #[test]
    fn a_deeply_nested_header_is_refused_before_parsing() {
        let header = format!(
            "{{'descr': {}{}, 'fortran_order': False, 'shape': (2, 2), }}",
            "[".repeat(3000),
            "]".repeat(3000)
        );
        let err = parse_npy_matrix(&npy(&header, &[0; 16])).unwrap_err();
        assert_eq!(
            err,
            NpyError::HeaderTooDeep {
                depth: 3001,
                limit: MAX_HEADER_NESTING
            }
        );
    }

    #[test]
    fn an_unparsable_header_is_not_quoted_whole() {
        let header = format!("{{'descr': '<f4', {}", "x".repeat(5000));
        let err = parse_npy_matrix(&npy(&header, &[])).unwrap_err();
        assert!(matches!(err, NpyError::Header { .. }), "{err:?}");
        assert!(err.to_string().len() < 200, "{err}");
    }

    #[test]
    fn short_or_foreign_bytes_are_refused() {
        assert_eq!(
            parse_npy_matrix(b"\x93NUM").unwrap_err(),
            NpyError::TooShort { found: 4 }
        );
        assert!(matches!(
            parse_npy_matrix(b"PK\x03\x04 not npy").unwrap_err(),
            NpyError::NotNpy { .. }
        ));
        assert_eq!(
            parse_npy_matrix(b"\x93NUMPY\x04\x00\x00\x00").unwrap_err(),
            NpyError::UnsupportedVersion { major: 4, minor: 0 }
        );
    }

    #[test]
    fn writes_little_endian_float32_on_every_machine() {
        let x = array![[1.5f32, -2.0, f32::MIN_POSITIVE], [0.0, -0.0, 1e30]];
        let bytes = npy_matrix_bytes(&x);
        let data: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert!(bytes.ends_with(&data));
        let header = String::from_utf8_lossy(&bytes[10..bytes.len() - data.len()]).into_owned();
        assert!(header.contains("'descr': '<f4'"), "{header}");
        assert_eq!(parse_npy_matrix(&bytes).unwrap(), x);
        // On a little-endian machine, exactly what ndarray-npy writes for the bare type.
        if cfg!(target_endian = "little") {
            let mut native = Vec::new();
            x.write_npy(&mut native).unwrap();
            assert_eq!(bytes, native);
        }
    }
}
