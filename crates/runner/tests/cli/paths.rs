//! Inputs and paths the runner must refuse, quickly and by name, before it writes anything:
//! FIFOs given as input files (which used to block the open forever), `runner pin` of a
//! directory outside the root manifest's tree, `runner merge --out` inside one of its shards,
//! and the Slurm merge script's handling of an output path with a space and a bracket.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

#[cfg(unix)]
fn workspace() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `runner` in `dir`, killing it (and failing the test) if it has not ended after 20 s.
fn runner_in(dir: &Path, args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_runner"))
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runner starts");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(20) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("runner {args:?} did not end within 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Requires a refusal (exit status 1, nothing on stdout) and returns stderr.
fn refused(output: &Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{what}: {stderr}");
    assert!(output.stdout.is_empty(), "{what}: printed a result");
    stderr
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A FIFO with no writer as `--text-file` or `--protocol`: opening it for reading used to block
/// until a writer came, so each of these hung. Each is now refused at once, naming the file.
#[cfg(unix)]
#[test]
fn a_fifo_given_as_an_input_is_refused_without_blocking() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    let fifo = fifo.to_str().unwrap();
    let out = tmp.path().join("out");
    let npz = tmp.path().join("kv.npz");
    let (out, npz) = (out.to_str().unwrap(), npz.to_str().unwrap());
    let text_file = format!("{fifo} is not a regular file of at most 1 MiB");
    let protocol = format!("protocol {fifo} is not a regular file");
    let cases: [(&[&str], &str); 4] = [
        (
            &["kv", "--model", "minilm", "--text-file", fifo, "--out", npz],
            &text_file,
        ),
        (
            &["quality", "--model", "smollm2", "--text-file", fifo],
            &text_file,
        ),
        (&["--protocol", fifo, "--out", out], &protocol),
        (&["quality", "--protocol", fifo, "--out", out], &protocol),
    ];
    for (args, needle) in cases {
        let stderr = refused(&runner_in(tmp.path(), args), &format!("{args:?}"));
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert_eq!(names(tmp.path()), ["fifo"], "{args:?} wrote something");
    }
}

/// `runner pin ../x` used to write the key `../x`, which the root audit refuses, so one pin
/// failed the whole root manifest; a link into or out of the tree fails it the same way. Both
/// are refused before anything is audited or written.
#[test]
fn pin_refuses_a_directory_outside_the_root_manifests_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let outside = tmp.path().join("outside/run");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(
        outside.join("manifest.json"),
        r#"{ "format": "packed-kv-evidence/1" }"#,
    )
    .unwrap();
    let root = repo.join("manifest.json");
    let before = r#"{ "format": "evidence-pins/1", "about": "", "evidence": {} }"#;
    std::fs::write(&root, before).unwrap();
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut cases = vec![(
        "../outside/run",
        "is not a directory inside the root manifest's tree (`..` leaves the tree)",
    )];
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&outside, repo.join("link")).unwrap();
        cases.push(("link", "passes through the symbolic link"));
    }
    for (dir, needle) in cases {
        let stderr = refused(&runner_in(&repo, &["pin", dir]), dir);
        assert!(stderr.contains(needle), "{dir}: {stderr}");
        assert!(
            !stderr.contains("auditing"),
            "{dir}: audited before refusing"
        );
        assert_eq!(std::fs::read_to_string(&root).unwrap(), before);
    }
}

/// `runner merge --out` inside one of its shards used to be accepted: the merged directory was
/// written into that shard, which then failed its own audit (an unexpected directory). It is
/// refused, however the path reaches the shard (directly, through `..`, through a link), and
/// the shard is left as it was.
#[test]
fn merge_refuses_an_output_inside_one_of_its_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let protocol = tmp.path().join("protocol.json");
    std::fs::write(
        &protocol,
        r#"{
        "study": "merged-paths",
        "seeds": [1, 2],
        "tokens": [16],
        "features": 8,
        "queries": 2,
        "distributions": ["clean"],
        "settings": [ { "group_size": 8, "bits": 4 } ],
        "generator": { "name": "numpy",
                       "entropy": { "seed_multiplier": 1, "tokens_multiplier": 1, "offset": 0 } }
    }"#,
    )
    .unwrap();
    for index in 1..=2 {
        let result = runner_in(
            tmp.path(),
            &[
                "--shard",
                &format!("{index}/2"),
                "--out",
                &format!("shard-{index}"),
                "--protocol",
                "protocol.json",
            ],
        );
        assert!(
            result.status.success(),
            "{}",
            String::from_utf8_lossy(&result.stderr)
        );
    }
    let shard_files = names(&tmp.path().join("shard-1"));
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut cases = vec![
        ("shard-1/merged", "shard-1"),
        ("shard-2/../shard-1/new/merged", "shard-1"),
        ("./shard-2/merged", "shard-2"),
    ];
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(tmp.path(), tmp.path().join("here")).unwrap();
        cases.push(("here/shard-1/merged", "shard-1"));
    }
    for (out, shard) in cases {
        let output = runner_in(tmp.path(), &["merge", "--out", out, "shard-1", "shard-2"]);
        let stderr = refused(&output, out);
        assert!(
            stderr.contains(&format!("--out {out} is inside the shard {shard}")),
            "{out}: {stderr}"
        );
        assert_eq!(names(&tmp.path().join("shard-1")), shard_files, "{out}");
        assert_eq!(names(&tmp.path().join("shard-2")), shard_files, "{out}");
    }
    // Beside the shards, the same merge is accepted.
    let output = runner_in(
        tmp.path(),
        &["merge", "--out", "merged", "shard-1", "shard-2"],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// scripts/slurm/merge.sbatch without Slurm: stand-in `runner` and `audit` record their
/// arguments, and OUT holds a space and a bracket. The script used to split the shard paths on
/// the space and glob the bracket, merging `b/sweep1/shard-1` (another sweep's shard, made here
/// to be found) instead of this sweep's; each path must now arrive whole and literal.
#[cfg(unix)]
#[test]
fn the_slurm_merge_script_passes_paths_with_spaces_and_brackets_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("a b/sweep[1]");
    std::fs::create_dir_all(&out).unwrap();
    // What an unquoted `b/sweep[1]/shard-1` would glob to, from the job's directory.
    std::fs::create_dir_all(tmp.path().join("b/sweep1/shard-1")).unwrap();
    let log = tmp.path().join("calls");
    let stand_in = tmp.path().join("record");
    std::fs::write(
        &stand_in,
        "#!/bin/sh\n{ echo call; printf '%s\\n' \"$@\"; } >> \"$CALLS\"\n",
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let script = workspace().join("scripts/slurm/merge.sbatch");
    let result = Command::new("sh")
        .arg(&script)
        .current_dir(tmp.path())
        .env("RUNNER", &stand_in)
        .env("AUDIT", &stand_in)
        .env("OUT", &out)
        .env("SHARDS", "3")
        .env("CALLS", &log)
        .output()
        .unwrap();
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let out = out.to_str().unwrap();
    let want = format!(
        "call\nmerge\n--out\n{out}/merged\n{out}/shard-1\n{out}/shard-2\n{out}/shard-3\n\
         call\n{out}/merged\n"
    );
    assert_eq!(std::fs::read_to_string(&log).unwrap(), want);
}

/// The Slurm scripts parse (`sh -n` for the two job scripts, which Slurm runs with /bin/sh;
/// `bash -n` for the two bash scripts), and pass shellcheck where it is installed.
#[cfg(unix)]
#[test]
fn the_slurm_scripts_parse_and_pass_shellcheck_where_installed() {
    let dir = workspace().join("scripts/slurm");
    for (shell, script) in [
        ("sh", "merge.sbatch"),
        ("sh", "sweep.sbatch"),
        ("bash", "submit"),
        ("bash", "smoke-test"),
    ] {
        let result = Command::new(shell)
            .arg("-n")
            .arg(dir.join(script))
            .output()
            .unwrap();
        assert!(
            result.status.success(),
            "{shell} -n {script}: {}",
            String::from_utf8_lossy(&result.stderr)
        );
        let Ok(checked) = Command::new("shellcheck").arg(dir.join(script)).output() else {
            continue; // not installed
        };
        assert!(
            checked.status.success(),
            "shellcheck {script}:\n{}",
            String::from_utf8_lossy(&checked.stdout)
        );
    }
}
