//! What the runner leaves on disk when a run dies or cannot write, driven through the binary:
//!
//! - a staging directory left by a dead run (its lock file unlocked) is removed by the next run
//!   into the same parent, which says so; one whose lock is held is left alone, and so is one
//!   without a lock file;
//! - a run killed with SIGKILL while writing leaves exactly such a staging directory;
//! - a full disk gives exactly one error and leaves nothing behind;
//! - `--out` under a regular file fails before the study runs.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Small: a few kilobytes of output.
const SMALL: &str = r#"{
    "study": "small", "seeds": [1], "tokens": [64], "features": 8, "queries": 2,
    "distributions": ["clean"], "focus": { "window": 1, "gain": 1.0 },
    "settings": [ { "group_size": 32, "bits": 4 } ],
    "generator": { "name": "chacha20",
                   "entropy": { "seed_multiplier": 1, "tokens_multiplier": 1, "offset": 0 } }
}"#;

/// About 1 MB of arrays: more than the 256 KiB disk of the full-disk test.
const MEDIUM: &str = r#"{
    "study": "full-disk", "seeds": [1], "tokens": [4096], "features": 32, "queries": 2,
    "distributions": ["clean"], "focus": { "window": 1, "gain": 1.0 },
    "settings": [ { "group_size": 32, "bits": 4 } ],
    "generator": { "name": "chacha20",
                   "entropy": { "seed_multiplier": 1, "tokens_multiplier": 1, "offset": 0 } }
}"#;

/// About 85 MB of arrays, so writing (and syncing) takes long enough to be interrupted.
const LARGE: &str = r#"{
    "study": "killed", "seeds": [1], "tokens": [262144], "features": 32, "queries": 1,
    "distributions": ["clean"], "focus": { "window": 1, "gain": 1.0 },
    "settings": [ { "group_size": 32, "bits": 8 } ],
    "generator": { "name": "chacha20",
                   "entropy": { "seed_multiplier": 1, "tokens_multiplier": 1, "offset": 0 } }
}"#;

/// The files of a finished run of a protocol without timings.
const RUN_FILES: [&str; 6] = [
    "arrays.npz",
    "error-vs-bytes.svg",
    "manifest.json",
    "results.json",
    "summary.json",
    "summary.md",
];

fn protocol(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("protocol.json");
    std::fs::write(&path, text).unwrap();
    path
}

fn run(out: &Path, protocol: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runner"))
        .arg("--out")
        .arg(out)
        .arg("--protocol")
        .arg(protocol)
        .output()
        .expect("runner starts")
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn stderr_lines(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The lines of stderr that say a staging directory was removed.
fn removal_lines(output: &Output) -> Vec<String> {
    stderr_lines(output)
        .into_iter()
        .filter(|l| l.starts_with("runner: removed "))
        .collect()
}

fn assert_success(output: &Output) {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A staging directory with a file in it and an (unlocked) lock file beside it, as a run that
/// died leaves them.
fn dead_run(parent: &Path, stem: &str) -> (PathBuf, PathBuf) {
    let dir = parent.join(stem);
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("arrays.npz"), b"half an archive").unwrap();
    let lock = parent.join(format!("{stem}.lock"));
    File::create(&lock).unwrap();
    (dir, lock)
}

#[test]
fn the_next_run_removes_the_staging_directory_of_a_dead_run_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let protocol = protocol(tmp.path(), SMALL);
    let parent = tmp.path().join("runs");
    std::fs::create_dir(&parent).unwrap();
    let (dir, lock) = dead_run(&parent, ".run.partial-Dead01");

    let output = run(&parent.join("next"), &protocol);
    assert_success(&output);
    assert_eq!(
        removal_lines(&output),
        vec![format!(
            "runner: removed {}, the staging directory of a run that is no longer running",
            dir.display()
        )]
    );
    assert!(!dir.exists() && !lock.exists());
    // Only the new run is left, holding exactly its files (its lock file was beside it).
    assert_eq!(names(&parent), vec!["next"]);
    assert_eq!(names(&parent.join("next")), RUN_FILES);
}

#[test]
fn a_staging_directory_whose_run_is_alive_is_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let protocol = protocol(tmp.path(), SMALL);
    let parent = tmp.path().join("runs");
    std::fs::create_dir(&parent).unwrap();
    // A live run: its lock is held, here by this process on its own open file (flock locks
    // belong to an open file description, so the runner's own open conflicts with it).
    let (live, live_lock) = dead_run(&parent, ".run.partial-Live01");
    let holder = File::open(&live_lock).unwrap();
    holder.lock().unwrap();
    // Not made by this protocol (no lock file): never touched.
    let unlocked = parent.join(".run.partial-NoLck1");
    std::fs::create_dir(&unlocked).unwrap();
    // A lock file whose directory is gone and whose owner died: removed.
    let orphan = parent.join(".run.partial-Orph01.lock");
    File::create(&orphan).unwrap();
    // Names outside the pattern, even with an unlocked lock file beside them, and a regular
    // file named like a staging directory: never touched.
    let unrelated_dirs = ["run.partial-abc123", ".run.partial-", ".run.fresh"];
    let unrelated_files = [
        "run.partial-abc123.lock",
        ".run.partial-.lock",
        ".other.partial-abc123",
        ".other.partial-abc123.lock",
    ];
    for name in unrelated_dirs {
        std::fs::create_dir(parent.join(name)).unwrap();
    }
    for name in unrelated_files {
        File::create(parent.join(name)).unwrap();
    }

    let output = run(&parent.join("next"), &protocol);
    assert_success(&output);
    assert_eq!(removal_lines(&output), Vec::<String>::new());
    assert!(live.join("arrays.npz").is_file() && live_lock.is_file());
    assert!(unlocked.is_dir());
    assert!(!orphan.exists());
    for name in unrelated_dirs {
        assert!(parent.join(name).is_dir(), "{name}");
    }
    for name in unrelated_files {
        assert!(parent.join(name).is_file(), "{name}");
    }

    // Once its run has gone (the lock released), the next run removes it.
    drop(holder);
    let output = run(&parent.join("later"), &protocol);
    assert_success(&output);
    assert_eq!(
        removal_lines(&output).len(),
        1,
        "{:?}",
        stderr_lines(&output)
    );
    assert!(!live.exists() && !live_lock.exists());
    assert!(unlocked.is_dir());
}

#[test]
fn a_run_killed_while_writing_leaves_a_staging_directory_the_next_run_removes() {
    let tmp = tempfile::tempdir().unwrap();
    let large = protocol(tmp.path(), LARGE);
    let parent = tmp.path().join("runs");
    std::fs::create_dir(&parent).unwrap();
    let out = parent.join("run");
    let mut child = Command::new(env!("CARGO_BIN_EXE_runner"))
        .arg("--out")
        .arg(&out)
        .arg("--protocol")
        .arg(&large)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    // Wait until the run has its lock file and its staging directory, that is, it is writing
    // the evidence (the study itself takes a few seconds first).
    let is_staging = |name: &str| name.starts_with(".run.partial-") && !name.ends_with(".lock");
    let started = Instant::now();
    let staging = loop {
        let found = std::fs::read_dir(&parent)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().into_string().unwrap())
            .find(|n| is_staging(n) && parent.join(format!("{n}.lock")).exists());
        if let Some(name) = found {
            break parent.join(name);
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before it was seen writing");
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no staging seen"
        );
        std::thread::sleep(Duration::from_micros(200));
    };
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        !out.exists(),
        "the run finished before it was killed: make LARGE larger"
    );
    assert!(staging.is_dir());
    let lock = PathBuf::from(format!("{}.lock", staging.display()));
    assert!(lock.is_file());

    let small = protocol(tmp.path(), SMALL);
    let output = run(&out, &small);
    assert_success(&output);
    assert_eq!(
        removal_lines(&output),
        vec![format!(
            "runner: removed {}, the staging directory of a run that is no longer running",
            staging.display()
        )]
    );
    assert_eq!(names(&parent), vec!["run"]);
    assert_eq!(names(&out), RUN_FILES);
}

/// A 256 KiB tmpfs, unmounted when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(dir: &Path) -> Option<SmallDisk> {
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
            .arg(dir)
            .stderr(Stdio::null())
            .status()
            .ok()?;
        status.success().then(|| SmallDisk(dir.to_path_buf()))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Runs MEDIUM into `disk/run` and requires a failed run that says so once and leaves `disk`
/// empty.
fn assert_one_error_and_nothing_left(output: &Output, disk: &Path, cause: &str) {
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(output.stdout.is_empty());
    let lines = stderr_lines(output);
    let errors: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("runner: error: "))
        .collect();
    assert_eq!(errors.len(), 1, "{lines:?}");
    assert_eq!(errors[0].matches(cause).count(), 1, "{lines:?}");
    // Besides the error, only the line announcing the run (printed before it starts).
    let others: Vec<&String> = lines
        .iter()
        .filter(|l| !l.starts_with("runner: error: "))
        .collect();
    assert_eq!(others.len(), 1, "{lines:?}");
    assert!(
        others[0].starts_with("runner: full-disk (") && others[0].ends_with(" comparisons"),
        "{lines:?}"
    );
    assert_eq!(names(disk), Vec::<String>::new());
}

#[test]
fn a_full_disk_gives_one_error_and_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let protocol = protocol(tmp.path(), MEDIUM);
    let disk = tmp.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    match SmallDisk::mount(&disk) {
        Some(_mounted) => {
            println!("full disk: a 256 KiB tmpfs");
            // Also into parents the run creates: they go too.
            for out in [disk.join("run"), disk.join("a/b/run")] {
                let output = run(&out, &protocol);
                assert_one_error_and_nothing_left(&output, &disk, "No space left on device");
            }
        }
        None => {
            println!("full disk: mounting a tmpfs is not permitted here; RLIMIT_FSIZE instead");
            let output = run_with_file_size_limit(&disk.join("run"), &protocol);
            assert_one_error_and_nothing_left(&output, &disk, "File too large");
        }
    }
}

/// Runs the runner with a 32 KiB file size limit (`ulimit -f 64` counts 512-byte blocks in sh),
/// SIGXFSZ ignored, so a write past the limit fails with EFBIG instead of killing the process.
fn run_with_file_size_limit(out: &Path, protocol: &Path) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(r#"trap "" XFSZ; ulimit -f 64; exec "$0" "$@""#)
        .arg(env!("CARGO_BIN_EXE_runner"))
        .arg("--out")
        .arg(out)
        .arg("--protocol")
        .arg(protocol)
        .output()
        .expect("sh starts")
}

#[test]
fn a_file_size_limit_gives_one_error_and_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let protocol = protocol(tmp.path(), MEDIUM);
    let parent = tmp.path().join("runs");
    std::fs::create_dir(&parent).unwrap();
    let output = run_with_file_size_limit(&parent.join("run"), &protocol);
    assert_one_error_and_nothing_left(&output, &parent, "File too large");
}

#[test]
fn an_output_under_a_regular_file_fails_before_the_study_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let protocol = protocol(tmp.path(), SMALL);
    let file = tmp.path().join("somefile");
    std::fs::write(&file, "mine").unwrap();
    let output = run(&file.join("run"), &protocol);
    assert_eq!(output.status.code(), Some(1));
    // One line, the error: the line announcing the study never came.
    assert_eq!(
        stderr_lines(&output),
        vec![format!(
            "runner: error: cannot create output directory {}: {} is not a directory",
            file.join("run").display(),
            file.display()
        )]
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
    assert_eq!(names(tmp.path()), vec!["protocol.json", "somefile"]);
}
