//! SHA-256 as the evidence records it: raw bytes for outputs, LF-normalised bytes for sources.

use sha2::{Digest, Sha256};

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// SHA-256 of a source file with every CRLF pair read as LF (so a Windows checkout hashes the
/// same as the tree the run was built from).
pub fn source_hash(bytes: &[u8]) -> String {
    let mut normalised = Vec::with_capacity(bytes.len());
    let mut iter = bytes.iter().peekable();
    while let Some(&b) = iter.next() {
        if b == b'\r' && iter.peek() == Some(&&b'\n') {
            continue;
        }
        normalised.push(b);
    }
    sha256_hex(&normalised)
}

/// The first 12 characters of a hash, for messages.
pub fn short(hash: &str) -> String {
    hash.chars().take(12).collect()
}
