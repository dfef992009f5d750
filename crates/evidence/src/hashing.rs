//! SHA-256 helpers shared by the build script (source hashes) and the studies (output hashes).

use sha2::{Digest, Sha256};

/// Lower-case hex SHA-256 of raw bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Drops the CR of every CRLF pair, so a Windows checkout hashes like a Unix one.
pub fn lf_normalised(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for (i, &b) in bytes.iter().enumerate() {
        if !(b == b'\r' && bytes.get(i + 1) == Some(&b'\n')) {
            out.push(b);
        }
    }
    out
}

/// SHA-256 of a source file's LF-normalised bytes.
pub fn source_hash(bytes: &[u8]) -> String {
    sha256_hex(&lf_normalised(bytes))
}

/// Lower-case hex SHA-256 of a file's raw bytes.
pub fn sha256_file(path: &std::path::Path) -> std::io::Result<String> {
    // Streamed: arrays.npz can be far larger than anything else a run holds.
    let mut hasher = Sha256::new();
    let mut file = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}
