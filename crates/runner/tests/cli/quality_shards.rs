//! A model-quality study cut into shards (`runner quality --protocol P --shard I/N`) and merged
//! back (`runner merge`): the merged directory's files are a single run's byte for byte and it
//! passes the audit; a set that is not exactly the N shards of one protocol is refused by name.
//!
//! The protocol has every part a shard must carry or leave to shard 1: a calibration (KVQuant),
//! Gaussian attention draws, perturbed passes, mechanisms, greedy text and a bootstrap.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SHARDED: &str = r#"{
  "study": "sharded-quality",
  "model": "smollm2",
  "texts": [
    { "name": "runner", "text": "The runner writes every result into a new directory, with a manifest that pins each file." },
    { "name": "cache", "text": "A packed cache stores codes, scales and zero points; the audit re-derives every figure." },
    { "name": "shards", "text": "Each shard runs a slice of the texts, and the merge puts the slices back in their order." }
  ],
  "max_tokens": 14,
  "runs": [
    { "setting": "g4_b4", "policy": "uniform", "schedule": "prefill" },
    { "scheme": "kivi2", "schedule": "streaming" },
    { "scheme": "kvquant2", "schedule": "prefill" }
  ],
  "generate": { "prompt_tokens": 4, "tokens": 3 },
  "attention": { "stride": 5, "gaussian_seeds": [7], "calibration_seed": 8, "matched": true },
  "calibration": { "name": "harbour", "text": "The harbour town woke slowly in winter. Before dawn the bakers lit their ovens, and the smell of bread drifted down the narrow streets towards the water, where the fishing boats rocked against the stone quay. Old men in heavy coats gathered by the harbour wall to argue about the weather, the price of diesel and the football results, as their fathers had argued before them." },
  "bootstrap": { "resamples": 100, "seed": 3 },
  "mechanisms": true,
  "sensitivity": {
    "perturbations": [ { "relative": 1e-6, "seed": 1 } ],
    "runs": [0, 2]
  }
}"#;

/// What a single run and a merge must write the same.
const SAME_BYTES: [&str; 5] = [
    "arrays.npz",
    "results.json",
    "summary.json",
    "summary.md",
    "quality-vs-bytes.svg",
];

/// `merged` holds the single run's files byte for byte.
fn assert_same_files(whole: &Path, merged: &Path) {
    for file in SAME_BYTES {
        assert!(
            std::fs::read(whole.join(file)).unwrap() == std::fs::read(merged.join(file)).unwrap(),
            "{file} differs from the single run's"
        );
    }
}

fn runner(args: &[&OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(args)
        .output()
        .expect("runner starts")
}

fn succeeds(output: Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn refused(output: Output) -> String {
    assert!(!output.status.success(), "accepted");
    String::from_utf8(output.stderr).unwrap()
}

fn quality(protocol: &Path, out: &Path, shard: Option<&str>) -> Output {
    let mut args = vec![
        OsStr::new("quality"),
        OsStr::new("--protocol"),
        protocol.as_os_str(),
        OsStr::new("--out"),
        out.as_os_str(),
    ];
    if let Some(shard) = shard {
        args.extend([OsStr::new("--shard"), OsStr::new(shard)]);
    }
    runner(&args)
}

fn merge(out: &Path, shards: &[&PathBuf]) -> Output {
    let mut args = vec![OsStr::new("merge"), OsStr::new("--out"), out.as_os_str()];
    args.extend(shards.iter().map(|s| s.as_os_str()));
    runner(&args)
}

/// A copy of a shard directory whose part.json `edit` changes, with the manifest's hash of it
/// rewritten, as a forger would.
fn forged_part(shard: &Path, into: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let copy = into.join(shard.file_name().unwrap());
    std::fs::create_dir(&copy).unwrap();
    for file in ["arrays.npz", "part.json", "manifest.json"] {
        std::fs::copy(shard.join(file), copy.join(file)).unwrap();
    }
    let mut part: serde_json::Value =
        serde_json::from_slice(&std::fs::read(copy.join("part.json")).unwrap()).unwrap();
    edit(&mut part);
    let bytes = serde_json::to_vec(&part).unwrap();
    std::fs::write(copy.join("part.json"), &bytes).unwrap();
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(copy.join("manifest.json")).unwrap()).unwrap();
    manifest["outputs"]["part.json"] = evidence::hashing::sha256_hex(&bytes).into();
    std::fs::write(
        copy.join("manifest.json"),
        serde_json::to_vec_pretty(&manifest).unwrap(),
    )
    .unwrap();
    copy
}

/// Runs a Slurm job script as Slurm would (`sh`, its environment), with the real runner and a
/// stand-in audit that records its arguments in `calls`.
fn job(script: &str, env: &[(&str, &std::ffi::OsStr)], calls: &Path) -> String {
    let stand_in = calls.with_extension("audit");
    if !stand_in.exists() {
        std::fs::write(
            &stand_in,
            "#!/bin/sh\n{ echo audit; printf '%s\\n' \"$@\"; } >> \"$CALLS\"\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut command = Command::new("sh");
    command
        .arg(root.join("scripts/slurm").join(script))
        .env("RUNNER", env!("CARGO_BIN_EXE_runner"))
        .env("AUDIT", &stand_in)
        .env("CALLS", calls);
    for (key, value) in env {
        command.env(key, value);
    }
    succeeds(command.output().unwrap())
}

#[test]
fn three_shards_merge_into_the_single_runs_files_and_pass_the_audit() {
    let tmp = tempfile::tempdir().unwrap();
    let protocol = tmp.path().join("sharded.json");
    std::fs::write(&protocol, SHARDED).unwrap();
    let whole = tmp.path().join("whole");
    succeeds(quality(&protocol, &whole, None));

    // The shards and the merge as the Slurm jobs run them (scripts/slurm/submit --quality).
    let sweep = tmp.path().join("sweep");
    std::fs::create_dir(&sweep).unwrap();
    let calls = tmp.path().join("calls");
    let env = |extra: &[(&'static str, &'static str)]| {
        let mut env: Vec<(&str, std::ffi::OsString)> = vec![
            ("OUT", sweep.clone().into()),
            ("SHARDS", "3".into()),
            ("PROTOCOL", protocol.clone().into()),
            ("QUALITY", "1".into()),
        ];
        env.extend(extra.iter().map(|(k, v)| (*k, v.into())));
        env
    };
    for index in ["1", "2", "3"] {
        let env = env(&[("SLURM_ARRAY_TASK_ID", index)]);
        let env: Vec<(&str, &OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
        let printed = job("sweep.sbatch", &env, &calls);
        assert!(
            printed.contains(&format!("wrote shard {index}/3 (1 texts)")),
            "{printed}"
        );
    }
    let env = env(&[("AUDIT_SAMPLE", "2")]);
    let env: Vec<(&str, &OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    let printed = job("merge.sbatch", &env, &calls);
    assert!(printed.contains("merged 3 shards"), "{printed}");
    let merged = sweep.join("merged");
    // No shard is audited (a shard is not evidence); the merged run is, sampled.
    assert_eq!(
        std::fs::read_to_string(&calls).unwrap(),
        format!("audit\n--sample\n2\n{}\n", merged.display())
    );
    let shards: Vec<PathBuf> = (1..=3).map(|i| sweep.join(format!("shard-{i}"))).collect();
    assert_same_files(&whole, &merged);
    // Any order on the command line: the merge sorts the shards by index.
    let again = tmp.path().join("again");
    succeeds(merge(&again, &[&shards[2], &shards[0], &shards[1]]));
    assert_same_files(&whole, &again);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(merged.join("manifest.json")).unwrap()).unwrap();
    let indices: Vec<u64> = manifest["merged_from"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indices, [1, 2, 3]);
    let tree = audit::default_tree();
    let report = audit::audit_dir(&merged, &tree);
    assert!(report.passed(), "{}", report.render());

    // Sets that are not exactly the three shards of one protocol.
    let stderr = refused(merge(&tmp.path().join("m1"), &[&shards[0], &shards[2]]));
    assert!(stderr.contains("shards [2] of 3 are missing"), "{stderr}");
    let stderr = refused(merge(
        &tmp.path().join("m2"),
        &[&shards[0], &shards[1], &shards[1], &shards[2]],
    ));
    assert!(stderr.contains("shard 2 of 3 is given twice"), "{stderr}");
    let stderr = refused(merge(&tmp.path().join("m3"), &[&shards[0], &whole]));
    assert!(
        stderr.contains("is not a model-quality shard")
            && stderr.contains("model-quality-evidence"),
        "{stderr}"
    );

    // A part changed without its hash, and one whose hash was rewritten to match.
    let forged = tmp.path().join("forged");
    std::fs::create_dir(&forged).unwrap();
    let copy = forged_part(&shards[1], &forged, |_| {});
    std::fs::write(copy.join("part.json"), b"{}").unwrap();
    let stderr = refused(merge(
        &tmp.path().join("m4"),
        &[&shards[0], &copy, &shards[2]],
    ));
    assert!(
        stderr.contains("part.json does not hash as its manifest records"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&copy).unwrap();
    let copy = forged_part(&shards[1], &forged, |part| {
        part["rows"][0]["result"]["id"] = "t0_g4_b4_uniform_prefill".into();
    });
    let stderr = refused(merge(
        &tmp.path().join("m5"),
        &[&shards[0], &copy, &shards[2]],
    ));
    assert!(
        stderr.contains("part.json is not shard 2/3's: its rows are not the slice's"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&copy).unwrap();
    let copy = forged_part(&shards[1], &forged, |part| {
        let first: serde_json::Value =
            serde_json::from_slice(&std::fs::read(shards[0].join("part.json")).unwrap()).unwrap();
        part["calibration"] = first["calibration"].clone();
    });
    let stderr = refused(merge(
        &tmp.path().join("m6"),
        &[&shards[0], &copy, &shards[2]],
    ));
    assert!(stderr.contains("it holds a calibration"), "{stderr}");
    for out in ["m1", "m2", "m3", "m4", "m5", "m6"] {
        assert!(!tmp.path().join(out).exists(), "{out} was written");
    }

    // Shards a protocol cannot have.
    let stderr = refused(quality(&protocol, &tmp.path().join("s4"), Some("1/4")));
    assert!(stderr.contains("4 shards of 3 texts"), "{stderr}");
    let stderr = refused(quality(&protocol, &tmp.path().join("s5"), Some("4/3")));
    assert!(stderr.contains("the index runs from 1 to 3"), "{stderr}");
    assert!(!tmp.path().join("s4").exists() && !tmp.path().join("s5").exists());
}
