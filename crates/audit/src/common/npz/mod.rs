//! `arrays.npz`, read so that the audit and NumPy cannot disagree about it, and never held whole.
//!
//! [`zip`] accepts only the canonical container and [`npy`] only the canonical member header;
//! [`Archive`] then gives typed arrays by name, checking dtype and shape before it reads a byte
//! of their data.
//!
//! An archive can be 4 GiB, several times the inputs it stores, so it is read from its file by
//! position ([`source`]), in three steps:
//! 1. [`zip::layout`] reads and checks the headers: the end record, each local header and each
//!    central entry, with their names;
//! 2. one sequential pass over the whole file, [`CHUNK_BYTES`] at a time, computes the file's
//!    SHA-256 (the hash the manifest records), each member's CRC-32 and SHA-256, each member's
//!    `.npy` header (from its first bytes), and a SHA-256 of the header bytes; then the last ZIP
//!    rules ([`zip::Layout::finish`]) and the `.npy` rules are applied, in the order they always
//!    were, so every archive is refused by the same rule as when it was held in memory;
//! 3. an array's data is read only when it is asked for, a chunk at a time.
//!
//! What is held at once: per member its name, header fields, dtype, shape and a 32-byte digest
//! (at most 65,535 members); one chunk; and the arrays the caller asks for, which are checked
//! against the dtype and shape the caller expects before anything is allocated for them.
//!
//! The file could change while it is read. It is read through the one descriptor it was opened
//! with, and every byte the audit uses is a byte it hashed: the headers are hashed when they are
//! parsed and again in the pass that computes the file's hash, and must agree
//! ([`NpzError::Changed`]); each member's bytes are hashed in that pass and again each time the
//! member is read, and must agree ([`ArrayError::Changed`]); the length must be the same at the
//! end of the pass as at the start. So an archive rewritten during the audit fails it rather than
//! passing with bytes the manifest's hash does not cover.

pub mod npy;
pub mod source;
pub mod zip;

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::ops::Range;

use ndarray::{Array1, Array2};
use sha2::{Digest, Sha256};
use thiserror::Error;

pub use npy::{Dtype, NpyError};
pub use source::{CHUNK_BYTES, ReadAt};
pub use zip::ZipError;

use source::for_each_chunk;
use zip::{LayoutError, Piece};

/// Why bytes are not a canonical npz archive.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum NpzError {
    /// The container breaks a rule of [`zip`].
    #[error("{0}")]
    Zip(#[from] ZipError),
    /// A member breaks a rule of [`npy`].
    #[error("member {member}.npy: {error}")]
    Npy {
        /// The member's name without `.npy`.
        member: String,
        /// The rule it breaks.
        error: NpyError,
    },
    /// The headers read to check the layout are not the headers read to hash the file: it
    /// changed while it was read.
    #[error("its headers changed while it was read")]
    Changed,
    /// Bytes held in memory could not be read: every read is checked against their length
    /// first, so this is never seen; it is an error rather than a panic all the same.
    #[error("its bytes could not be read: {message}")]
    Unreadable {
        /// What went wrong.
        message: String,
    },
}

impl NpzError {
    /// A stable identifier of the rule broken (see [`ZipError::rule`] and [`NpyError::rule`]).
    pub fn rule(&self) -> &'static str {
        match self {
            NpzError::Zip(e) => e.rule(),
            NpzError::Npy { error, .. } => error.rule(),
            NpzError::Changed => "changed",
            NpzError::Unreadable { .. } => "unreadable",
        }
    }
}

/// Why one pass over an archive file could not be made.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ScanError {
    /// A read failed (an I/O error, or the file shortened while it was read).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The file's length at the end of the pass is not its length at the start.
    #[error("its length changed from {before} to {after} bytes while it was read")]
    Length {
        /// Bytes when it was opened.
        before: u64,
        /// Bytes after the pass.
        after: u64,
    },
}

/// Why one array cannot be had as the caller expects it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ArrayError {
    /// No member of that name.
    #[error("arrays.npz has no array {name}")]
    Missing {
        /// The array's name.
        name: String,
    },
    /// Another element type.
    #[error("array {name} is {found}, expected {expected}")]
    Dtype {
        /// The array's name.
        name: String,
        /// Its dtype.
        found: Dtype,
        /// The dtype the evidence format gives it.
        expected: Dtype,
    },
    /// Another shape.
    #[error("array {name} has shape {found:?}, expected {expected:?}")]
    Shape {
        /// The array's name.
        name: String,
        /// Its shape.
        found: Vec<usize>,
        /// The shape the protocol gives it.
        expected: Vec<usize>,
    },
    /// Its bytes could not be read again.
    #[error("array {name} could not be read: {message}")]
    Read {
        /// The array's name.
        name: String,
        /// What the system said.
        message: String,
    },
    /// Its bytes are not the ones hashed with the file: the file changed during the audit.
    #[error("array {name} changed after arrays.npz was hashed")]
    Changed {
        /// The array's name.
        name: String,
    },
}

/// An element type the evidence stores, read from little-endian bytes.
pub trait Element: Copy {
    /// Its dtype.
    const DTYPE: Dtype;
    /// One element from exactly `DTYPE.itemsize()` little-endian bytes.
    fn from_le(bytes: &[u8]) -> Self;
}

impl Element for u8 {
    const DTYPE: Dtype = Dtype::U8;
    fn from_le(bytes: &[u8]) -> Self {
        bytes[0]
    }
}

impl Element for i32 {
    const DTYPE: Dtype = Dtype::I32;
    fn from_le(bytes: &[u8]) -> Self {
        i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn from_le(bytes: &[u8]) -> Self {
        f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }
}

impl Element for f64 {
    const DTYPE: Dtype = Dtype::F64;
    fn from_le(bytes: &[u8]) -> Self {
        let mut b = [0u8; 8];
        b.copy_from_slice(bytes);
        f64::from_le_bytes(b)
    }
}

impl Element for i64 {
    const DTYPE: Dtype = Dtype::I64;
    fn from_le(bytes: &[u8]) -> Self {
        let mut b = [0u8; 8];
        b.copy_from_slice(bytes);
        i64::from_le_bytes(b)
    }
}

/// One array's description and where its member lies in the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrayInfo {
    /// Element type.
    pub dtype: Dtype,
    /// Shape, C order.
    pub shape: Vec<usize>,
    /// The member's bytes (its `.npy` header, then the data).
    member: Range<u64>,
    /// Where the data starts within the member.
    data_offset: u64,
    /// SHA-256 of the member's bytes when the file was hashed.
    sha256: [u8; 32],
}

impl ArrayInfo {
    /// Bytes of data: elements x itemsize (the `.npy` rules made it so).
    pub fn data_bytes(&self) -> u64 {
        self.member.end - self.member.start - self.data_offset
    }
}

/// Where an archive's bytes are.
#[derive(Debug)]
enum Bytes {
    Memory(Vec<u8>),
    File(File),
}

impl ReadAt for Bytes {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match self {
            Bytes::Memory(bytes) => bytes.as_slice().read_exact_at(buf, offset),
            Bytes::File(file) => file.read_exact_at(buf, offset),
        }
    }

    fn current_len(&self) -> io::Result<u64> {
        match self {
            Bytes::Memory(bytes) => Ok(bytes.len() as u64),
            Bytes::File(file) => file.current_len(),
        }
    }
}

/// A canonical npz archive: every member checked, arrays read by name when asked for.
#[derive(Debug)]
pub struct Archive {
    bytes: Bytes,
    arrays: BTreeMap<String, ArrayInfo>,
    order: Vec<String>,
}

/// An archive file after its one pass: the file's SHA-256, and the archive or the first rule
/// it breaks.
#[derive(Debug)]
pub struct Scanned {
    /// Lower-case hex SHA-256 of the file's bytes, as they were read.
    pub sha256: String,
    /// The archive, if it is canonical.
    pub archive: Result<Archive, NpzError>,
}

/// Arrays by name, in archive order.
type Arrays = Vec<(String, ArrayInfo)>;

/// What the pass over one member found.
struct MemberPass {
    crc: u32,
    sha256: [u8; 32],
    header: Option<npy::NpyHeader>,
}

/// Reads the headers, makes the one pass, and applies every rule in order: see the module
/// documentation. Returns the file's SHA-256 and its arrays in archive order.
fn scan<R: ReadAt + ?Sized>(
    source: &R,
    len: u64,
) -> Result<(String, Result<Arrays, NpzError>), ScanError> {
    let mut file_hash = Sha256::new();
    let mut buf = Vec::new();
    let layout = match zip::layout(source, len) {
        Ok(layout) => layout,
        Err(LayoutError::Read(e)) => return Err(e.into()),
        Err(LayoutError::Rule(rule)) => {
            // Not an archive, but its hash is still checked against the manifest.
            for_each_chunk(source, 0..len, &mut buf, |c| file_hash.update(c))?;
            same_length(source, len)?;
            return Ok((hex::encode(file_hash.finalize()), Err(rule.into())));
        }
    };
    let mut header_hash = Sha256::new();
    let mut members = Vec::with_capacity(layout.members());
    let mut first_npy_error = None;
    let mut prefix = Vec::new();
    for piece in layout.pieces() {
        match piece {
            Piece::Headers(range) => for_each_chunk(source, range, &mut buf, |c| {
                file_hash.update(c);
                header_hash.update(c);
            })?,
            Piece::Member(index, range) => {
                let size = range.end - range.start;
                let wanted = size.min(npy::PREFIX_BYTES as u64) as usize;
                let mut crc = crc32fast::Hasher::new();
                let mut sha = Sha256::new();
                prefix.clear();
                for_each_chunk(source, range, &mut buf, |c| {
                    file_hash.update(c);
                    crc.update(c);
                    sha.update(c);
                    let take = (wanted - prefix.len()).min(c.len());
                    prefix.extend_from_slice(&c[..take]);
                })?;
                // The member fits the archive, which is below 4 GiB.
                let header = match npy::parse_prefix(&prefix, size as usize) {
                    Ok(header) => Some(header),
                    Err(error) => {
                        // Only the first is reported, so only the first is kept.
                        first_npy_error.get_or_insert((index, error));
                        None
                    }
                };
                members.push(MemberPass {
                    crc: crc.finalize(),
                    sha256: sha.finalize().into(),
                    header,
                });
            }
        }
    }
    same_length(source, len)?;
    let sha256 = hex::encode(file_hash.finalize());
    if <[u8; 32]>::from(header_hash.finalize()) != layout.headers_sha256() {
        return Ok((sha256, Err(NpzError::Changed)));
    }
    let crcs: Vec<u32> = members.iter().map(|m| m.crc).collect();
    let entries = match layout.finish(&crcs) {
        Ok(entries) => entries,
        Err(rule) => return Ok((sha256, Err(rule.into()))),
    };
    if let Some((index, error)) = first_npy_error {
        let member = entries[index].stem.clone();
        return Ok((sha256, Err(NpzError::Npy { member, error })));
    }
    let arrays = entries
        .into_iter()
        .zip(members)
        .map(|(entry, pass)| {
            let header = pass
                .header
                .expect("every member's header parsed: the first that did not returned above");
            let info = ArrayInfo {
                dtype: header.dtype,
                shape: header.shape,
                member: entry.data,
                data_offset: header.data_offset as u64,
                sha256: pass.sha256,
            };
            (entry.stem, info)
        })
        .collect();
    Ok((sha256, Ok(arrays)))
}

/// The length at the end of the pass must be the length it was made over.
fn same_length<R: ReadAt + ?Sized>(source: &R, len: u64) -> Result<(), ScanError> {
    let after = source.current_len()?;
    if after != len {
        return Err(ScanError::Length { before: len, after });
    }
    Ok(())
}

/// Checks every rule of [`zip`] and [`npy`] on `bytes` and describes each array, in archive order.
pub fn parse(bytes: &[u8]) -> Result<Arrays, NpzError> {
    match scan(bytes, bytes.len() as u64) {
        Ok((_, arrays)) => arrays,
        Err(e) => Err(NpzError::Unreadable {
            message: e.to_string(),
        }),
    }
}

impl Archive {
    fn from_arrays(bytes: Bytes, parsed: Arrays) -> Archive {
        let order = parsed.iter().map(|(name, _)| name.clone()).collect();
        Archive {
            bytes,
            arrays: parsed.into_iter().collect(),
            order,
        }
    }

    /// Parses and checks an archive held in memory.
    pub fn new(bytes: Vec<u8>) -> Result<Archive, NpzError> {
        let parsed = parse(&bytes)?;
        Ok(Archive::from_arrays(Bytes::Memory(bytes), parsed))
    }

    /// Checks an archive file of `len` bytes (its length when opened) in one pass, which also
    /// hashes it; its arrays are read later, when asked for, through the same descriptor.
    pub fn open(file: File, len: u64) -> Result<Scanned, ScanError> {
        let (sha256, parsed) = scan(&file, len)?;
        Ok(Scanned {
            sha256,
            archive: parsed.map(|parsed| Archive::from_arrays(Bytes::File(file), parsed)),
        })
    }

    /// Array names (without `.npy`), in archive order.
    pub fn names(&self) -> &[String] {
        &self.order
    }

    /// The description of array `name`, if there is one.
    pub fn info(&self, name: &str) -> Option<&ArrayInfo> {
        self.arrays.get(name)
    }

    fn find(&self, name: &str) -> Result<&ArrayInfo, ArrayError> {
        self.arrays.get(name).ok_or_else(|| ArrayError::Missing {
            name: name.to_string(),
        })
    }

    /// Reads member `info`'s data a chunk at a time (every chunk but the last [`CHUNK_BYTES`],
    /// a multiple of any itemsize), then requires the member's bytes to be those hashed with
    /// the file. `each` has seen the chunks by then: a caller reports what it found only once
    /// this returns Ok.
    fn read_data(
        &self,
        name: &str,
        info: &ArrayInfo,
        mut each: impl FnMut(&[u8]),
    ) -> Result<(), ArrayError> {
        let unreadable = |e: io::Error| ArrayError::Read {
            name: name.to_string(),
            message: e.to_string(),
        };
        let mut sha = Sha256::new();
        let mut buf = Vec::new();
        let data = info.member.start + info.data_offset;
        for_each_chunk(&self.bytes, info.member.start..data, &mut buf, |c| {
            sha.update(c)
        })
        .map_err(unreadable)?;
        for_each_chunk(&self.bytes, data..info.member.end, &mut buf, |c| {
            sha.update(c);
            each(c);
        })
        .map_err(unreadable)?;
        if <[u8; 32]>::from(sha.finalize()) != info.sha256 {
            return Err(ArrayError::Changed {
                name: name.to_string(),
            });
        }
        Ok(())
    }

    /// The raw little-endian data bytes of array `name`.
    pub fn data(&self, name: &str) -> Result<Vec<u8>, ArrayError> {
        let info = self.find(name)?;
        let mut out = Vec::with_capacity(info.data_bytes() as usize);
        self.read_data(name, info, |c| out.extend_from_slice(c))?;
        Ok(out)
    }

    fn checked<T: Element>(
        &self,
        name: &str,
        expected: &[usize],
    ) -> Result<&ArrayInfo, ArrayError> {
        let info = self.find(name)?;
        if info.dtype != T::DTYPE {
            return Err(ArrayError::Dtype {
                name: name.to_string(),
                found: info.dtype,
                expected: T::DTYPE,
            });
        }
        if info.shape != expected {
            return Err(ArrayError::Shape {
                name: name.to_string(),
                found: info.shape.clone(),
                expected: expected.to_vec(),
            });
        }
        Ok(info)
    }

    /// Array `name`, of exactly `shape`, a chunk of elements at a time in C order: `each` gets
    /// the index of the chunk's first element and the chunk. Nothing larger than a chunk is held.
    pub fn for_each<T: Element>(
        &self,
        name: &str,
        shape: &[usize],
        mut each: impl FnMut(usize, &[T]),
    ) -> Result<(), ArrayError> {
        let info = self.checked::<T>(name, shape)?;
        let mut values = Vec::new();
        let mut first = 0;
        self.read_data(name, info, |c| {
            values.clear();
            values.extend(c.chunks_exact(T::DTYPE.itemsize()).map(T::from_le));
            each(first, &values);
            first += values.len();
        })
    }

    /// Array `name`, of exactly `shape`, as a flat vector in C order.
    pub fn values<T: Element>(&self, name: &str, shape: &[usize]) -> Result<Vec<T>, ArrayError> {
        let info = self.checked::<T>(name, shape)?;
        // The shape is the caller's and the data's size matches it: no allocation beyond it.
        let mut out = Vec::with_capacity(info.data_bytes() as usize / T::DTYPE.itemsize());
        self.read_data(name, info, |c| {
            out.extend(c.chunks_exact(T::DTYPE.itemsize()).map(T::from_le))
        })?;
        Ok(out)
    }

    /// Array `name` as a matrix of exactly `shape`.
    pub fn matrix<T: Element>(
        &self,
        name: &str,
        shape: [usize; 2],
    ) -> Result<Array2<T>, ArrayError> {
        let values = self.values::<T>(name, &shape)?;
        Ok(Array2::from_shape_vec(shape, values).expect("the shape was checked against the data"))
    }

    /// Array `name` as a vector of exactly `len` elements.
    pub fn vector<T: Element>(&self, name: &str, len: usize) -> Result<Array1<T>, ArrayError> {
        Ok(Array1::from(self.values::<T>(name, &[len])?))
    }
}
