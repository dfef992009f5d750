//! One read per file: the root-manifest audit opens each pinned directory once, audits it through
//! that handle, and compares the pins with the hashes of the bytes the audit read. The attack it
//! closes: a directory whose files match the pins but fail their own audit (the pinned one) and
//! a directory that passes its own audit but is not the pinned one (a valid run of something
//! else), swapped by an atomic rename between the pins' hashing and the audit's reading, used to
//! PASS. Every way of mixing the two must FAIL.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use audit::common::files::ConfinedDir;
use audit::{Options, Problem, Report};

use crate::support::{copy_of, make_run, workspace};

/// A run small enough to audit many times.
const TINY: &str = r#"{
  "study": "pins",
  "seeds": [1],
  "tokens": [16],
  "features": 8,
  "queries": 2,
  "distributions": ["clean"],
  "settings": [ { "group_size": 8, "bits": 4 } ],
  "generator": { "name": "numpy",
                 "entropy": { "seed_multiplier": 1, "tokens_multiplier": 1, "offset": 0 } }
}"#;

/// The tiny run, and a valid run of the same protocol with another seed, made once.
fn runs() -> &'static (PathBuf, PathBuf) {
    static RUNS: OnceLock<(tempfile::TempDir, (PathBuf, PathBuf))> = OnceLock::new();
    let (_, runs) = RUNS.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let honest = tmp.path().join("honest");
        let other = tmp.path().join("other");
        make_run(TINY, &honest);
        make_run(&TINY.replace("\"seeds\": [1]", "\"seeds\": [2]"), &other);
        (tmp, (honest, other))
    });
    runs
}

/// A tree holding `evidence/run` (a copy of `pinned`) pinned by `manifest.json` with its files'
/// hashes as they are (written without the audit, as a forger would), and `aside` (a copy of
/// `other`) beside it. Returns (tree, root manifest).
fn pinned_tree(pinned: &Path, other: &Path) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let evidence = tmp.path().join("evidence");
    std::fs::create_dir(&evidence).unwrap();
    let (_copy, run) = copy_of(pinned);
    std::fs::rename(&run, evidence.join("run")).unwrap();
    let (_copy, aside) = copy_of(other);
    std::fs::rename(&aside, tmp.path().join("aside")).unwrap();
    let root = tmp.path().join("manifest.json");
    let skip_audit = |_: &Path| Ok(());
    evidence::pin::pin(
        &root,
        &[PathBuf::from("evidence/run")],
        evidence::pin::PinScope::Update,
        &["packed-kv-evidence/1"],
        &skip_audit,
    )
    .unwrap();
    (tmp, root)
}

/// The pinned run made to fail its own audit: a byte of results.json changed, the manifest's
/// hash of it left as it was. Its files are what the pins record.
fn broken_copy() -> (tempfile::TempDir, PathBuf) {
    let (tmp, dir) = copy_of(&runs().0);
    let results = dir.join("results.json");
    let text = std::fs::read_to_string(&results).unwrap();
    std::fs::write(
        &results,
        text.replacen("\"tokens\": 16", "\"tokens\": 17", 1),
    )
    .unwrap();
    (tmp, dir)
}

fn passed(reports: &[Report]) -> bool {
    reports.iter().all(Report::passed)
}

fn render(reports: &[Report]) -> String {
    reports.iter().map(Report::render).collect()
}

/// The audit of an honest pinned run reads each of its files exactly once, through the handle,
/// and the pins are compared with those reads (no second read: every recorded file has one
/// hash, and the pin check adds none).
#[test]
fn each_pinned_file_is_read_once_and_the_pins_are_what_the_audit_read() {
    let (honest, other) = runs();
    let (tmp, root) = pinned_tree(honest, other);
    let files: Vec<String> = std::fs::read_dir(tmp.path().join("evidence/run"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let seen = std::cell::RefCell::new(None);
    let reports = audit::common::pins::audit_pins(&root, |dir: &ConfinedDir| {
        let report = audit::audit_opened(dir, &workspace(), &Options::default());
        *seen.borrow_mut() = Some(dir.hashes());
        report
    });
    assert!(passed(&reports), "{}", render(&reports));
    let seen = seen.into_inner().expect("the directory was audited");
    let mut read: Vec<&String> = seen.keys().collect();
    read.sort();
    let mut want: Vec<&String> = files.iter().collect();
    want.sort();
    assert_eq!(read, want, "every file read");
    for (name, hashes) in &seen {
        assert_eq!(hashes.len(), 1, "{name} read {} times", hashes.len());
    }
}

/// The swap, made deterministic: after the pinned directory is opened and before anything in it
/// is read, the directory that passes its own audit is renamed into its path. The audit still
/// reads the pinned directory (its handle), which fails its own audit: FAIL. (The same closure
/// auditing by path, as the audit used to, PASSes: shown last, so the test proves the swap.)
#[test]
fn a_directory_swapped_in_after_it_is_opened_is_not_what_is_audited() {
    let (broken_tmp, broken) = broken_copy();
    let (tmp, root) = pinned_tree(&broken, &runs().1);
    drop(broken_tmp);
    let run = tmp.path().join("evidence/run");
    let aside = tmp.path().join("aside");
    let swap = || {
        let between = tmp.path().join("between");
        std::fs::rename(&run, &between).unwrap();
        std::fs::rename(&aside, &run).unwrap();
        std::fs::rename(&between, &aside).unwrap();
    };
    let reports = audit::common::pins::audit_pins(&root, |dir: &ConfinedDir| {
        swap();
        audit::audit_opened(dir, &workspace(), &Options::default())
    });
    assert!(!passed(&reports), "{}", render(&reports));
    assert!(reports[0].passed(), "the pins match what was read");
    assert!(
        reports[1]
            .problems
            .iter()
            .any(|p| matches!(p, Problem::Hash { file, .. } if file == "results.json")),
        "{}",
        reports[1].render()
    );
    // Now `evidence/run` holds the valid run of the other seed, `aside` the pinned one. Audited
    // in full, each FAILs: pins that do not match, or a run that fails its audit.
    let reports = audit::audit_pins(&root, &workspace());
    assert!(!passed(&reports), "{}", render(&reports));
    assert!(!reports[0].passed());
    // What the audit used to do: hash the pinned files by path, then audit the path again.
    swap();
    let pins_hold = audit::audit_pins(&root, &workspace())[0].passed();
    swap();
    let by_path = audit::audit_dir(&run, &workspace());
    assert!(
        pins_hold && by_path.passed(),
        "the two reads a path-based audit made would have PASSed"
    );
}

/// The swap as an attacker runs it: for each audit of the root manifest, a second thread
/// exchanges the pinned directory and the valid one (renameat2 RENAME_EXCHANGE, atomic) once,
/// at a delay swept over the first 300 µs of the audit (every 5 µs), and the pair is exchanged
/// back after it. No audit may PASS: whenever the swap lands, the pins are compared with exactly
/// what was audited. This is a probe, not the proof (the deterministic test above is): an
/// emulation of the old, path-based audit under this schedule PASSed about once in a hundred
/// audits, its window being the few microseconds between hashing the pins and reading the
/// manifest again; 60 audits keep the test to seconds.
#[cfg(target_os = "linux")]
#[test]
fn a_directory_swapped_by_another_thread_never_passes() {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    let (broken_tmp, broken) = broken_copy();
    let (tmp, root) = pinned_tree(&broken, &runs().1);
    drop(broken_tmp);
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).unwrap();
    let (run, aside) = (
        c(&tmp.path().join("evidence/run")),
        c(&tmp.path().join("aside")),
    );
    let exchange = || {
        // SAFETY: two NUL-terminated paths; renameat2 touches nothing else.
        let done = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                run.as_ptr(),
                libc::AT_FDCWD,
                aside.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        assert_eq!(done, 0, "{}", std::io::Error::last_os_error());
    };
    let (start, delays) = mpsc::channel::<Duration>();
    let (swapped, wait_for_swap) = mpsc::channel::<()>();
    let outcomes = std::thread::scope(|scope| {
        scope.spawn(move || {
            for delay in delays {
                let at = Instant::now();
                while at.elapsed() < delay {}
                exchange();
                swapped.send(()).unwrap();
            }
        });
        let outcomes: Vec<bool> = (0..60u64)
            .map(|i| {
                start.send(Duration::from_micros(i * 5)).unwrap();
                let passed = passed(&audit::audit_pins(&root, &workspace()));
                wait_for_swap.recv().unwrap();
                exchange();
                passed
            })
            .collect();
        drop(start);
        outcomes
    });
    assert!(
        outcomes.iter().all(|passed| !passed),
        "{} of {} audits PASSed under the swap",
        outcomes.iter().filter(|p| **p).count(),
        outcomes.len()
    );
}

/// A pinned directory that is a symbolic link (to a run that would PASS), or lies under one, is
/// refused by the pins and not audited.
#[cfg(unix)]
#[test]
fn a_pinned_directory_that_is_a_symbolic_link_fails() {
    let (honest, other) = runs();
    let (tmp, root) = pinned_tree(honest, other);
    let evidence = tmp.path().join("evidence");
    // The pin's key `evidence/run` now names a link to the same, honest files.
    std::fs::rename(evidence.join("run"), tmp.path().join("real")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("real"), evidence.join("run")).unwrap();
    let reports = audit::audit_pins(&root, &workspace());
    assert!(!passed(&reports), "{}", render(&reports));
    assert_eq!(reports.len(), 1, "a linked directory is not audited");
    assert!(
        reports[0]
            .problems
            .iter()
            .any(|p| matches!(p, Problem::Pin(why) if why.contains("is a symbolic link"))),
        "{}",
        reports[0].render()
    );
    // A real directory under a linked one: `evidence` itself a link.
    std::fs::remove_file(evidence.join("run")).unwrap();
    std::fs::rename(tmp.path().join("real"), evidence.join("run")).unwrap();
    std::fs::rename(&evidence, tmp.path().join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("elsewhere"), &evidence).unwrap();
    let reports = audit::audit_pins(&root, &workspace());
    assert!(!passed(&reports), "{}", render(&reports));
    assert!(
        reports[0]
            .problems
            .iter()
            .any(|p| matches!(p, Problem::Pin(why) if why.contains("is a symbolic link"))),
        "{}",
        reports[0].render()
    );
    // The same tree without links PASSes.
    std::fs::remove_file(&evidence).unwrap();
    std::fs::rename(tmp.path().join("elsewhere"), &evidence).unwrap();
    let reports = audit::audit_pins(&root, &workspace());
    assert!(passed(&reports), "{}", render(&reports));
}
