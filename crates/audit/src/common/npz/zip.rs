//! The ZIP container of `arrays.npz`, read strictly.
//!
//! `numpy.load` reads an npz with Python's `zipfile`, which finds the last end record, tolerates
//! bytes before the first member and between members, and reads each member through the central
//! directory. A lenient reader here could therefore see different arrays from the same bytes
//! (say, an honest archive followed by a forged one with its own end record). So this reader
//! accepts only the one layout the runner writes, where every reading agrees, and names the rule
//! any other layout breaks.
//!
//! The accepted layout (integers little-endian; PKWARE APPNOTE 6.3, sections 4.3.7, 4.3.12 and
//! 4.3.16):
//! - local file headers, each followed at once by its member's bytes, from offset 0, with no byte
//!   between them;
//! - then the central directory, one entry per member in the same order, each agreeing with its
//!   local header field for field (offset, name, version needed, flags, method, time, date,
//!   CRC-32, sizes);
//! - then one end-of-central-directory record of 22 bytes, without a comment, ending at the last
//!   byte of the file, on disk 0, counting exactly the members;
//! - every member stored (method 0, compressed size = size), general-purpose flags 0 (no
//!   encryption, no data descriptor, no UTF-8 names), no extra field, no file comment, a CRC-32
//!   that matches its bytes, and a name `<stem>.npy` whose stem is ASCII letters, digits and
//!   underscores, unique in the archive;
//! - no ZIP64 record or field (the archive is below 4 GiB and 65,535 members).
//!
//! The headers are read by position ([`layout`]): the end record, each local header and its
//! name, each central entry and its name, every offset and size checked against the archive's
//! length before it is read, so an archive of any size is never held whole. What needs the
//! members' bytes (their CRC-32s) comes from one sequential pass over the file made by the
//! caller ([`crate::common::npz`]), after which [`Layout::finish`] applies the last rules in the
//! same order as ever: for each member, agreement with its central entry, then its name, then
//! uniqueness, then its CRC-32. So each archive is refused by the same rule as when it was held
//! in memory.

use std::io;
use std::ops::Range;

use sha2::{Digest, Sha256};
use thiserror::Error;

use super::source::ReadAt;

/// The largest archive this reader accepts: the ZIP format without its 64-bit extension.
pub const MAX_ARCHIVE_BYTES: u64 = u32::MAX as u64;

const LOCAL_SIGNATURE: u32 = 0x0403_4b50;
const CENTRAL_SIGNATURE: u32 = 0x0201_4b50;
const END_SIGNATURE: u32 = 0x0605_4b50;
const LOCAL_HEADER_BYTES: usize = 30;
const CENTRAL_HEADER_BYTES: usize = 46;
const END_RECORD_BYTES: usize = 22;
/// Versions "needed to extract" that a plain stored member can carry: 1.0 (the runner's writer)
/// and 2.0 (Python's `zipfile.writestr`). `numpy.savez` itself writes every member with ZIP64
/// sizes (version 4.5), which this reader refuses as ZIP64: it reads the runner's archives, not
/// every npz.
const VERSIONS_NEEDED: [u16; 2] = [10, 20];

/// Why a ZIP container is not the canonical layout. Each variant names one rule.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ZipError {
    /// The file is larger than [`MAX_ARCHIVE_BYTES`].
    #[error("it holds {bytes} bytes, more than a ZIP without its 64-bit extension can")]
    TooLarge {
        /// Size of the file.
        bytes: u64,
    },
    /// The last 22 bytes are not an end-of-central-directory record without a comment.
    #[error(
        "its last 22 bytes are not an end-of-central-directory record without a comment \
         (bytes after the archive, a comment, or no archive at all)"
    )]
    EndRecord,
    /// The end record describes more than one disk, or counts differ between its fields.
    #[error("its end record describes a multi-disk archive or inconsistent entry counts")]
    Disk,
    /// A ZIP64 marker value in the end record or a header.
    #[error("it uses ZIP64 fields (at byte {offset})")]
    Zip64 {
        /// Where the marker was found.
        offset: usize,
    },
    /// The central directory does not end exactly where the end record starts.
    #[error(
        "its central directory ({size} bytes at byte {offset}) does not end where the end record \
         starts (byte {end_record}): bytes before the first member or after the directory"
    )]
    DirectoryBounds {
        /// Recorded start of the central directory.
        offset: u64,
        /// Recorded size of the central directory.
        size: u64,
        /// Where the end record starts.
        end_record: usize,
    },
    /// Something other than a local header where the next member must start.
    #[error(
        "byte {offset} is neither the next local header nor the start of the central directory \
         (byte {directory}): a gap, leading bytes or an unreferenced member"
    )]
    Layout {
        /// Where a local header was expected.
        offset: usize,
        /// Where the central directory starts.
        directory: usize,
    },
    /// A header or a member's bytes run past the region that must hold them.
    #[error("the {what} at byte {offset} runs past byte {limit}")]
    Truncated {
        /// Which structure.
        what: &'static str,
        /// Where it starts.
        offset: usize,
        /// Where it must end at the latest.
        limit: usize,
    },
    /// A member with non-zero general-purpose flags.
    #[error(
        "member {member:?} has general-purpose flags {flags:#06x} (encrypted, streamed or UTF-8)"
    )]
    Flags {
        /// The member's name.
        member: String,
        /// The flags found.
        flags: u16,
    },
    /// A member that is not stored uncompressed.
    #[error("member {member:?} is compressed (method {method}, {compressed} of {size} bytes)")]
    Compressed {
        /// The member's name.
        member: String,
        /// Compression method found.
        method: u16,
        /// Compressed size.
        compressed: u64,
        /// Uncompressed size.
        size: u64,
    },
    /// A member whose "version needed to extract" is not one a stored member carries.
    #[error("member {member:?} needs version {version} to extract")]
    Version {
        /// The member's name.
        member: String,
        /// The version field.
        version: u16,
    },
    /// An extra field or a file comment.
    #[error("member {member:?} carries an extra field or a comment")]
    ExtraField {
        /// The member's name.
        member: String,
    },
    /// The central directory holds more or fewer entries than the local headers, or more bytes.
    #[error("the central directory does not list exactly the {members} members that precede it")]
    DirectoryEntries {
        /// Members found by walking the local headers.
        members: usize,
    },
    /// A central directory entry that is not one.
    #[error("central directory entry {index} has no central header signature")]
    DirectorySignature {
        /// Position in the directory.
        index: usize,
    },
    /// A central entry disagrees with its local header.
    #[error(
        "member {member:?}: the central directory and the local header disagree on its {field}"
    )]
    HeaderMismatch {
        /// The member's name (from the local header).
        member: String,
        /// Which field.
        field: &'static str,
    },
    /// The CRC-32 recorded for a member is not that of its bytes.
    #[error("member {member:?}: CRC-32 {recorded:#010x} recorded, {actual:#010x} computed")]
    Crc {
        /// The member's name.
        member: String,
        /// CRC-32 in the headers.
        recorded: u32,
        /// CRC-32 of the bytes.
        actual: u32,
    },
    /// A member name that is not `<stem>.npy` with a plain stem.
    #[error(
        "member name {name:?} is not `<stem>.npy` with a stem of ASCII letters, digits, \
         underscores and hyphens"
    )]
    Name {
        /// The name as stored (lossily decoded).
        name: String,
    },
    /// Two members with the same name.
    #[error("member {name:?} appears more than once")]
    DuplicateName {
        /// The repeated name.
        name: String,
    },
}

impl ZipError {
    /// A stable identifier of the rule broken (used by the hostile-archive fixtures).
    pub fn rule(&self) -> &'static str {
        match self {
            ZipError::TooLarge { .. } => "too_large",
            ZipError::EndRecord => "end_record",
            ZipError::Disk => "disk",
            ZipError::Zip64 { .. } => "zip64",
            ZipError::DirectoryBounds { .. } => "directory_bounds",
            ZipError::Layout { .. } => "layout",
            ZipError::Truncated { .. } => "truncated",
            ZipError::Flags { .. } => "flags",
            ZipError::Compressed { .. } => "compressed",
            ZipError::Version { .. } => "version",
            ZipError::ExtraField { .. } => "extra_field",
            ZipError::DirectoryEntries { .. } => "directory_entries",
            ZipError::DirectorySignature { .. } => "directory_signature",
            ZipError::HeaderMismatch { .. } => "header_mismatch",
            ZipError::Crc { .. } => "crc",
            ZipError::Name { .. } => "name",
            ZipError::DuplicateName { .. } => "duplicate_name",
        }
    }
}

/// Why [`layout`] stopped: a rule broken, or bytes that could not be read.
#[derive(Debug)]
pub enum LayoutError {
    /// The container breaks a rule.
    Rule(ZipError),
    /// A read failed (for a file: an I/O error, or a file shortened since its length was taken).
    Read(io::Error),
}

impl From<ZipError> for LayoutError {
    fn from(e: ZipError) -> Self {
        LayoutError::Rule(e)
    }
}

impl From<io::Error> for LayoutError {
    fn from(e: io::Error) -> Self {
        LayoutError::Read(e)
    }
}

/// One member of a canonical archive: its name without `.npy`, and where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The member's name without the `.npy` suffix, as `numpy.load` keys it.
    pub stem: String,
    /// Its bytes (the whole `.npy` file) within the archive.
    pub data: Range<u64>,
}

/// The fields a local header and its central entry must share.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Header {
    offset: usize,
    version: u16,
    flags: u16,
    method: u16,
    time: u16,
    date: u16,
    crc: u32,
    compressed: u32,
    size: u32,
    name: Vec<u8>,
}

impl Header {
    /// Where the member's bytes start: after the local header and the name (no extra field).
    fn data(&self) -> Range<u64> {
        let start = (self.offset + LOCAL_HEADER_BYTES + self.name.len()) as u64;
        start..start + u64::from(self.size)
    }
}

/// One member as the headers describe it.
#[derive(Debug, Clone)]
struct Member {
    local: Header,
    /// The first field on which its central entry disagrees with its local header.
    mismatch: Option<&'static str>,
}

/// What a stretch of the archive holds, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Header bytes: a local header with its name, or the central directory and end record.
    Headers(Range<u64>),
    /// Member `index`'s bytes (its whole `.npy` file).
    Member(usize, Range<u64>),
}

/// An archive's layout as its headers give it: every rule of this module checked except those
/// that need the members' bytes, which [`Layout::finish`] checks in the same order as before.
#[derive(Debug, Clone)]
pub struct Layout {
    len: u64,
    directory: Range<usize>,
    members: Vec<Member>,
    headers_sha256: [u8; 32],
}

impl Layout {
    /// The archive's length, as it was when the layout was read.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it has no member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Members, in archive order.
    pub fn members(&self) -> usize {
        self.members.len()
    }

    /// Member `index`'s bytes (its whole `.npy` file).
    pub fn member(&self, index: usize) -> Range<u64> {
        self.members[index].local.data()
    }

    /// SHA-256 of every header byte the layout was read from, in file order: a later pass over
    /// the file hashes the same [`Piece::Headers`] to show it read the same headers.
    pub fn headers_sha256(&self) -> [u8; 32] {
        self.headers_sha256
    }

    /// The archive from its first byte to its last, in order: each member's local header and
    /// bytes, then the central directory with the end record.
    pub fn pieces(&self) -> Vec<Piece> {
        let mut out = Vec::with_capacity(2 * self.members.len() + 1);
        for (index, member) in self.members.iter().enumerate() {
            let data = member.local.data();
            out.push(Piece::Headers(member.local.offset as u64..data.start));
            out.push(Piece::Member(index, data));
        }
        out.push(Piece::Headers(self.directory.start as u64..self.len));
        out
    }

    /// The rules that need the members' bytes, member by member in archive order as ever: the
    /// central entry agrees with the local header, the name is `<stem>.npy` with a plain stem
    /// and unique, and `crcs[i]` (member i's CRC-32, computed by the caller) is the one recorded.
    pub fn finish(&self, crcs: &[u32]) -> Result<Vec<Entry>, ZipError> {
        let mut seen = std::collections::BTreeSet::new();
        let mut out = Vec::with_capacity(self.members.len());
        for (member, &actual) in self.members.iter().zip(crcs) {
            let local = &member.local;
            let name = String::from_utf8_lossy(&local.name).into_owned();
            if let Some(field) = member.mismatch {
                return Err(ZipError::HeaderMismatch {
                    member: name,
                    field,
                });
            }
            let stem =
                plain_stem(&local.name).ok_or_else(|| ZipError::Name { name: name.clone() })?;
            if !seen.insert(stem.to_string()) {
                return Err(ZipError::DuplicateName { name });
            }
            if actual != local.crc {
                return Err(ZipError::Crc {
                    member: name,
                    recorded: local.crc,
                    actual,
                });
            }
            out.push(Entry {
                stem: stem.to_string(),
                data: local.data(),
            });
        }
        Ok(out)
    }
}

/// A bounds-checked little-endian reader over one header read from the archive.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    /// The fields a local header and a central entry share, from "version needed" to the
    /// sizes, with the header's offset and an empty name (read later).
    fn shared_fields(&mut self, offset: usize) -> Header {
        Header {
            offset,
            version: self.u16(),
            flags: self.u16(),
            method: self.u16(),
            time: self.u16(),
            date: self.u16(),
            crc: self.u32(),
            compressed: self.u32(),
            size: self.u32(),
            name: Vec::new(),
        }
    }

    fn u16(&mut self) -> u16 {
        let v = u16::from_le_bytes([self.bytes[self.at], self.bytes[self.at + 1]]);
        self.at += 2;
        v
    }

    fn u32(&mut self) -> u32 {
        let b = &self.bytes[self.at..self.at + 4];
        self.at += 4;
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

/// Reads the headers of an archive of `len` bytes by position and checks every rule they carry,
/// or names the first rule broken, in the order the rules have always been checked: size, end
/// record, local headers, central directory. Each size is checked against `len` before anything
/// is read or allocated for it.
pub fn layout<R: ReadAt + ?Sized>(source: &R, len: u64) -> Result<Layout, LayoutError> {
    if len > MAX_ARCHIVE_BYTES {
        return Err(ZipError::TooLarge { bytes: len }.into());
    }
    // At most u32::MAX, so it fits.
    let size = len as usize;
    let (directory, total, end) = end_record(source, size)?;
    let mut headers = Sha256::new();
    let (locals, members) = walk_local_headers(source, directory.start, total, &mut headers)?;
    let mismatches = walk_central_directory(
        source,
        directory.clone(),
        total,
        members,
        &locals,
        &mut headers,
    )?;
    headers.update(end);
    Ok(Layout {
        len,
        directory,
        members: locals
            .into_iter()
            .zip(mismatches)
            .map(|(local, mismatch)| Member { local, mismatch })
            .collect(),
        headers_sha256: headers.finalize().into(),
    })
}

/// Checks the end record; returns where the central directory lies, the member count it gives,
/// and the record's bytes.
fn end_record<R: ReadAt + ?Sized>(
    source: &R,
    len: usize,
) -> Result<(Range<usize>, usize, [u8; END_RECORD_BYTES]), LayoutError> {
    if len < END_RECORD_BYTES {
        return Err(ZipError::EndRecord.into());
    }
    let at = len - END_RECORD_BYTES;
    let mut bytes = [0u8; END_RECORD_BYTES];
    source.read_exact_at(&mut bytes, at as u64)?;
    let mut c = Cursor {
        bytes: &bytes,
        at: 0,
    };
    if c.u32() != END_SIGNATURE {
        return Err(ZipError::EndRecord.into());
    }
    let (disk, directory_disk, on_disk, total) = (c.u16(), c.u16(), c.u16(), c.u16());
    let (size, offset, comment) = (c.u32(), c.u32(), c.u16());
    if comment != 0 {
        return Err(ZipError::EndRecord.into());
    }
    if total == u16::MAX || size == u32::MAX || offset == u32::MAX {
        return Err(ZipError::Zip64 { offset: at }.into());
    }
    if disk != 0 || directory_disk != 0 || on_disk != total {
        return Err(ZipError::Disk.into());
    }
    let (offset, size) = (offset as usize, size as usize);
    if offset.checked_add(size) != Some(at) {
        return Err(ZipError::DirectoryBounds {
            offset: offset as u64,
            size: size as u64,
            end_record: at,
        }
        .into());
    }
    Ok((offset..at, total as usize, bytes))
}

/// Walks local headers from offset 0 to the central directory; they must tile it exactly.
/// Returns the headers and how many there are. Only the first `total` (the end record's count)
/// are kept: more fail the directory's count anyway, and so cannot make the walk hold more than
/// 65,535 headers.
fn walk_local_headers<R: ReadAt + ?Sized>(
    source: &R,
    directory: usize,
    total: usize,
    hash: &mut Sha256,
) -> Result<(Vec<Header>, usize), LayoutError> {
    let mut headers = Vec::new();
    let mut count = 0;
    let mut at = 0;
    let mut fixed = [0u8; LOCAL_HEADER_BYTES];
    while at < directory {
        if at + LOCAL_HEADER_BYTES > directory {
            return Err(ZipError::Layout {
                offset: at,
                directory,
            }
            .into());
        }
        source.read_exact_at(&mut fixed, at as u64)?;
        if u32::from_le_bytes([fixed[0], fixed[1], fixed[2], fixed[3]]) != LOCAL_SIGNATURE {
            return Err(ZipError::Layout {
                offset: at,
                directory,
            }
            .into());
        }
        let mut c = Cursor {
            bytes: &fixed,
            at: 4,
        };
        let mut header = c.shared_fields(at);
        let (version, flags, method) = (header.version, header.flags, header.method);
        let (compressed, size) = (header.compressed, header.size);
        let (name_len, extra_len) = (c.u16() as usize, c.u16() as usize);
        let name_end = at + LOCAL_HEADER_BYTES + name_len;
        if name_end > directory {
            return Err(ZipError::Truncated {
                what: "local header",
                offset: at,
                limit: directory,
            }
            .into());
        }
        let mut name = vec![0u8; name_len];
        source.read_exact_at(&mut name, (at + LOCAL_HEADER_BYTES) as u64)?;
        let member = String::from_utf8_lossy(&name).into_owned();
        if compressed == u32::MAX || size == u32::MAX {
            return Err(ZipError::Zip64 { offset: at }.into());
        }
        if flags != 0 {
            return Err(ZipError::Flags { member, flags }.into());
        }
        if method != 0 || compressed != size {
            return Err(ZipError::Compressed {
                member,
                method,
                compressed: compressed.into(),
                size: size.into(),
            }
            .into());
        }
        if !VERSIONS_NEEDED.contains(&version) {
            return Err(ZipError::Version { member, version }.into());
        }
        if extra_len != 0 {
            return Err(ZipError::ExtraField { member }.into());
        }
        let data_end = name_end + size as usize;
        if data_end > directory {
            return Err(ZipError::Truncated {
                what: "member",
                offset: at,
                limit: directory,
            }
            .into());
        }
        hash.update(fixed);
        hash.update(&name);
        if count < total {
            header.name = name;
            headers.push(header);
        }
        count += 1;
        at = data_end;
    }
    Ok((headers, count))
}

/// Reads the central directory; it must list exactly `members` entries and fill its region.
/// Returns, per entry, the first field on which it disagrees with its local header (reported
/// only once the whole directory has passed, as before).
fn walk_central_directory<R: ReadAt + ?Sized>(
    source: &R,
    directory: Range<usize>,
    total: usize,
    members: usize,
    locals: &[Header],
    hash: &mut Sha256,
) -> Result<Vec<Option<&'static str>>, LayoutError> {
    if total != members {
        return Err(ZipError::DirectoryEntries { members }.into());
    }
    let mut mismatches = Vec::with_capacity(total);
    let mut at = directory.start;
    let mut fixed = [0u8; CENTRAL_HEADER_BYTES];
    for (index, local) in locals.iter().enumerate() {
        if at + CENTRAL_HEADER_BYTES > directory.end {
            return Err(ZipError::Truncated {
                what: "central directory entry",
                offset: at,
                limit: directory.end,
            }
            .into());
        }
        source.read_exact_at(&mut fixed, at as u64)?;
        let mut c = Cursor {
            bytes: &fixed,
            at: 0,
        };
        if c.u32() != CENTRAL_SIGNATURE {
            return Err(ZipError::DirectorySignature { index }.into());
        }
        let _made_by = c.u16();
        let mut header = c.shared_fields(0);
        let (compressed, size) = (header.compressed, header.size);
        let (name_len, extra_len, comment_len) =
            (c.u16() as usize, c.u16() as usize, c.u16() as usize);
        let (disk_start, _internal, _external) = (c.u16(), c.u16(), c.u32());
        let offset = c.u32();
        let name_end = at + CENTRAL_HEADER_BYTES + name_len;
        if name_end > directory.end {
            return Err(ZipError::Truncated {
                what: "central directory entry",
                offset: at,
                limit: directory.end,
            }
            .into());
        }
        let mut name = vec![0u8; name_len];
        source.read_exact_at(&mut name, (at + CENTRAL_HEADER_BYTES) as u64)?;
        if compressed == u32::MAX || size == u32::MAX || offset == u32::MAX {
            return Err(ZipError::Zip64 { offset: at }.into());
        }
        if extra_len != 0 || comment_len != 0 {
            return Err(ZipError::ExtraField {
                member: String::from_utf8_lossy(&name).into_owned(),
            }
            .into());
        }
        if disk_start != 0 {
            return Err(ZipError::Disk.into());
        }
        hash.update(fixed);
        hash.update(&name);
        header.offset = offset as usize;
        header.name = name;
        mismatches.push(mismatch(local, &header));
        at = name_end;
    }
    if at != directory.end {
        return Err(ZipError::DirectoryEntries { members }.into());
    }
    Ok(mismatches)
}

/// A central entry must repeat its local header: the first field on which it does not.
fn mismatch(local: &Header, central: &Header) -> Option<&'static str> {
    if central.offset != local.offset {
        Some("offset")
    } else if central.name != local.name {
        Some("name")
    } else if central.version != local.version {
        Some("version needed")
    } else if central.flags != local.flags {
        Some("flags")
    } else if central.method != local.method {
        Some("compression method")
    } else if (central.time, central.date) != (local.time, local.date) {
        Some("modification time")
    } else if central.crc != local.crc {
        Some("CRC-32")
    } else if (central.compressed, central.size) != (local.compressed, local.size) {
        Some("sizes")
    } else {
        None
    }
}

/// The stem of `<stem>.npy` when the stem is non-empty ASCII letters, digits, underscores and
/// hyphens (model-quality row ids write a policy's ':' as '-'): nothing a path or NumPy could
/// read otherwise.
fn plain_stem(name: &[u8]) -> Option<&str> {
    let stem = name.strip_suffix(b".npy")?;
    let plain = !stem.is_empty()
        && stem
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    // ASCII, so the conversion cannot fail.
    plain.then(|| std::str::from_utf8(stem).ok()).flatten()
}
