//! Records, at build time, what produced a run: the SHA-256 of every source file that can change
//! a study's output (LF-normalised, so a Windows checkout hashes the same), the rustc version,
//! the target, and the versions of the crates that do the work. A binary run outside the
//! repository still knows them.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

// The crate's own hashing module, so the build and the audit hash sources by one rule.
#[path = "src/hashing.rs"]
#[allow(dead_code)]
mod hashing;

/// Files and directories (relative to the workspace root) whose contents produce a run.
/// Directories are walked recursively. Emitted as `SOURCE_ROOTS` for the manifest.
const SOURCE_ROOTS: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "experiments",
    "crates/bitpack/Cargo.toml",
    "crates/bitpack/src",
    "crates/evidence/Cargo.toml",
    "crates/evidence/build.rs",
    "crates/evidence/src",
    "crates/gguf-file/Cargo.toml",
    "crates/gguf-file/src",
    "crates/kvcodec/Cargo.toml",
    "crates/kvcodec/src",
    "crates/kvschemes/Cargo.toml",
    "crates/kvschemes/src",
    "crates/kvstudy/Cargo.toml",
    "crates/kvstudy/src",
    "crates/models/Cargo.toml",
    "crates/models/src",
    "crates/nprand/Cargo.toml",
    "crates/nprand/src",
    "crates/quality/Cargo.toml",
    "crates/quality/src",
    "crates/runner/Cargo.toml",
    "crates/runner/src",
    "crates/weights/Cargo.toml",
    "crates/weights/src",
];

/// Crates whose versions the manifest records.
const RECORDED_CRATES: &[&str] = &[
    "bitpack",
    "evidence",
    "gguf-file",
    "kvcodec",
    "kvstudy",
    "models",
    "nprand",
    "quality",
    "runner",
    "weights",
    "ndarray",
    "ndarray-npy",
    "zip",
    "rand",
    "rand_chacha",
    "rand_distr",
    "rand_pcg",
    "rand_core",
    "libm",
    "safetensors",
    "half",
    "serde_json",
    "sha2",
];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.join("../..").canonicalize().unwrap();
    let mut code = String::new();

    writeln!(code, "pub const SOURCE_ROOTS: &[&str] = &{SOURCE_ROOTS:?};").unwrap();
    writeln!(code, "pub const SOURCES: &[(&str, &str)] = &[").unwrap();
    for path in source_files(&root) {
        let bytes = fs::read(root.join(&path)).unwrap();
        let hash = hashing::source_hash(&bytes);
        writeln!(code, "    ({path:?}, {hash:?}),").unwrap();
    }
    writeln!(code, "];").unwrap();
    for source_root in SOURCE_ROOTS {
        println!(
            "cargo:rerun-if-changed={}",
            root.join(source_root).display()
        );
    }

    writeln!(code, "pub const CRATE_VERSIONS: &[(&str, &str)] = &[").unwrap();
    for (name, version) in locked_versions(&root.join("Cargo.lock")) {
        writeln!(code, "    ({name:?}, {version:?}),").unwrap();
    }
    writeln!(code, "];").unwrap();

    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc_version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    writeln!(code, "pub const RUSTC_VERSION: &str = {rustc_version:?};").unwrap();
    writeln!(
        code,
        "pub const TARGET: &str = {:?};",
        env::var("TARGET").unwrap()
    )
    .unwrap();
    writeln!(
        code,
        "pub const PROFILE: &str = {:?};",
        env::var("PROFILE").unwrap()
    )
    .unwrap();
    writeln!(
        code,
        "pub const WORKSPACE_ROOT: &str = {:?};",
        root.display().to_string()
    )
    .unwrap();

    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("build_info.rs");
    fs::write(out, code).unwrap();
}

/// Every file under the source roots, as sorted '/'-separated relative paths.
fn source_files(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    for source_root in SOURCE_ROOTS {
        for entry in walkdir::WalkDir::new(root.join(source_root)) {
            let entry = entry.unwrap();
            if entry.file_type().is_file() {
                let relative = entry.path().strip_prefix(root).unwrap();
                let parts: Vec<_> = relative.iter().map(|p| p.to_string_lossy()).collect();
                files.push(parts.join("/"));
            }
        }
    }
    files.sort();
    files.dedup();
    files
}

fn locked_versions(lock: &Path) -> Vec<(String, String)> {
    let text = fs::read_to_string(lock).unwrap_or_default();
    let parsed: toml::Table = text.parse().unwrap_or_default();
    let mut versions = Vec::new();
    if let Some(packages) = parsed.get("package").and_then(|p| p.as_array()) {
        for package in packages {
            let name = package.get("name").and_then(|v| v.as_str()).unwrap_or("");
            let version = package
                .get("version")
                .and_then(|v| v.as_str())
                .unwrap_or("");
            if RECORDED_CRATES.contains(&name) {
                versions.push((name.to_string(), version.to_string()));
            }
        }
    }
    versions.sort();
    versions
}
