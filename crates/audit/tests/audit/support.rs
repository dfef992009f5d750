//! Shared helpers: a small run made once with the study's library, private copies of evidence,
//! the forger's tools (edit arrays or JSON, then rewrite every hash), and typed assertions.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use audit::{Problem, Report};
use ndarray::{ArrayD, IxDyn, OwnedRepr};
use ndarray_npy::{NpzReader, NpzWriter};
use sha2::{Digest, Sha256};

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// A small protocol touching every feature: both modes, partial groups on both axes, every
/// budget policy, the ChaCha20 generator, a focus distribution listed before `clean`, timings.
pub const SMALL: &str = r#"{
  "study": "small",
  "seeds": [3, 5],
  "tokens": [24, 40],
  "features": 16,
  "queries": 2,
  "distributions": ["recent_focus", "clean", "early_focus"],
  "focus": { "window": 4, "gain": 2.0 },
  "settings": [
    { "group_size": 8, "bits": 4 },
    { "group_size": 16, "bits": 3, "mode": "asymmetric" },
    { "group_size": 12, "bits": 8 }
  ],
  "generator": { "name": "chacha20",
                 "entropy": { "seed_multiplier": 1000, "tokens_multiplier": 1, "offset": 0 } },
  "budget": { "group_size": 8, "low_bits": 2, "window": 8,
              "policies": ["uniform", "recent8", "early8", "recent_f32", "early_f32"] },
  "timing": { "warmup": 0, "repeats": 2, "shuffle_seed": 1 }
}"#;

/// Runs `protocol` with the study's library into `out` (which must not exist).
pub fn make_run(protocol: &str, out: &Path) {
    make_shard(protocol, None, out);
}

/// Runs `protocol`, or the shard `(index, count)` of it, into `out`, as `runner --shard` does
/// (the study's own entry point, on two threads).
pub fn make_shard(protocol: &str, shard: Option<(usize, usize)>, out: &Path) {
    let protocol = kvstudy::protocol::Protocol::from_json(protocol).expect("a valid protocol");
    let run = kvstudy::run::Run {
        protocol: &protocol,
        source: "a test protocol",
        shard: shard.map(|(index, count)| kvstudy::plan::Shard { index, count }),
        threads: 2,
    };
    kvstudy::run::run_protocol(&run, out, |_| {}).expect("the run succeeds");
}

/// The small run, made once per test binary.
pub fn small_run() -> &'static Path {
    static RUN: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, dir) = RUN.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("small");
        make_run(SMALL, &dir);
        (tmp, dir)
    });
    dir
}

/// A private copy of an evidence directory.
pub fn copy_of(source: &Path) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(source).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    (tmp, dir)
}

/// A private copy of the small run.
pub fn small_copy() -> (tempfile::TempDir, PathBuf) {
    copy_of(small_run())
}

pub fn audit(dir: &Path) -> Report {
    audit::audit_dir(dir, &workspace())
}

/// Rewrites manifest.json's output hashes to match the files, as a forger would.
pub fn rehash(dir: &Path) {
    edit_json(dir, "manifest.json", |manifest| {
        for (name, hash) in manifest["outputs"].as_object_mut().unwrap() {
            if let Ok(bytes) = std::fs::read(dir.join(name)) {
                *hash = hex::encode(Sha256::digest(bytes)).into();
            }
        }
    });
}

pub fn edit_json(dir: &Path, file: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join(file);
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut value);
    std::fs::write(&path, serde_json::to_string_pretty(&value).unwrap() + "\n").unwrap();
}

pub fn edit_text(dir: &Path, file: &str, edit: impl FnOnce(String) -> String) {
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, edit(text)).unwrap();
}

/// An array of any of the evidence's dtypes.
#[derive(Clone)]
pub enum AnyArray {
    U8(ArrayD<u8>),
    I32(ArrayD<i32>),
    F32(ArrayD<f32>),
    F64(ArrayD<f64>),
    I64(ArrayD<i64>),
}

impl AnyArray {
    pub fn f32(&mut self) -> &mut ArrayD<f32> {
        match self {
            AnyArray::F32(a) => a,
            _ => panic!("not an f32 array"),
        }
    }

    pub fn f64(&mut self) -> &mut ArrayD<f64> {
        match self {
            AnyArray::F64(a) => a,
            _ => panic!("not an f64 array"),
        }
    }

    pub fn u8(&mut self) -> &mut ArrayD<u8> {
        match self {
            AnyArray::U8(a) => a,
            _ => panic!("not a u8 array"),
        }
    }
}

/// Reads every array (dtype from the audit's own reader), lets `edit` change, add or remove
/// them, and writes them back canonically (stored, fixed timestamps) in the resulting order.
pub fn edit_arrays(dir: &Path, edit: impl FnOnce(&mut Vec<(String, AnyArray)>)) {
    let path = dir.join("arrays.npz");
    let bytes = std::fs::read(&path).unwrap();
    let archive = audit::common::npz::Archive::new(bytes).unwrap();
    let mut reader = NpzReader::new(std::fs::File::open(&path).unwrap()).unwrap();
    let mut arrays = Vec::new();
    for name in archive.names() {
        let array = match archive.info(name).unwrap().dtype {
            audit::common::npz::Dtype::U8 => {
                AnyArray::U8(reader.by_name::<OwnedRepr<u8>, IxDyn>(name).unwrap())
            }
            audit::common::npz::Dtype::I32 => {
                AnyArray::I32(reader.by_name::<OwnedRepr<i32>, IxDyn>(name).unwrap())
            }
            audit::common::npz::Dtype::F32 => {
                AnyArray::F32(reader.by_name::<OwnedRepr<f32>, IxDyn>(name).unwrap())
            }
            audit::common::npz::Dtype::I64 => {
                AnyArray::I64(reader.by_name::<OwnedRepr<i64>, IxDyn>(name).unwrap())
            }
            _ => AnyArray::F64(reader.by_name::<OwnedRepr<f64>, IxDyn>(name).unwrap()),
        };
        arrays.push((name.clone(), array));
    }
    edit(&mut arrays);
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .last_modified_time(zip::DateTime::default())
        .unix_permissions(0o644);
    let mut writer = NpzWriter::new_with_options(std::fs::File::create(&path).unwrap(), options);
    for (name, array) in &arrays {
        match array {
            AnyArray::U8(a) => writer.add_array(name.as_str(), a),
            AnyArray::I32(a) => writer.add_array(name.as_str(), a),
            AnyArray::F32(a) => writer.add_array(name.as_str(), a),
            AnyArray::F64(a) => writer.add_array(name.as_str(), a),
            AnyArray::I64(a) => writer.add_array(name.as_str(), a),
        }
        .unwrap();
    }
    writer.finish().unwrap();
}

/// The array named `name`.
pub fn array<'a>(arrays: &'a mut [(String, AnyArray)], name: &str) -> &'a mut AnyArray {
    &mut arrays
        .iter_mut()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no array {name}"))
        .1
}

/// Asserts the report failed with a problem `matches` accepts, showing the report otherwise.
#[track_caller]
pub fn assert_problem(report: &Report, what: &str, matches: impl Fn(&Problem) -> bool) {
    assert!(
        report.problems.iter().any(matches),
        "no {what} problem:\n{}",
        report.render()
    );
}

/// Asserts the report passed.
#[track_caller]
pub fn assert_pass(report: &Report) {
    assert!(report.passed(), "{}", report.render());
}
