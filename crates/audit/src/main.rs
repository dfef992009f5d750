//! `audit [DIR]`: PASS or FAIL for an evidence directory, or for everything the root manifest
//! pins when no directory is given; `--models DIR` also hashes a model run's weight file. Exit
//! status 0 only for PASS.

use std::io::Write;
use std::path::PathBuf;

use clap::Parser;

/// Independently re-checks packed-KV and model-quality evidence: hashes, every code, attention,
/// payloads, aggregates, tables and charts.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Evidence directory to audit. Without it, audits what the root manifest pins.
    dir: Option<PathBuf>,
    /// Root manifest used when no directory is given [default: manifest.json in the current
    /// directory or the nearest one above it that holds a root manifest].
    #[arg(long, value_name = "FILE")]
    manifest: Option<PathBuf>,
    /// Source tree to compare source hashes with [default: the workspace this audit was built
    /// from].
    #[arg(long, value_name = "DIR")]
    tree: Option<PathBuf>,
    /// Model cache holding `<model>/<weight file>`: a model run's weight file is hashed and
    /// must have the recorded SHA-256. Without it, that file is not checked (the audit never
    /// runs the model).
    #[arg(long, value_name = "DIR")]
    models: Option<PathBuf>,
}

fn main() {
    let cli = Cli::parse();
    let tree = cli.tree.unwrap_or_else(audit::default_tree);
    let options = audit::Options { models: cli.models };
    let reports = match &cli.dir {
        Some(dir) => vec![audit::audit_dir_with(dir, &tree, &options)],
        None => {
            let manifest = match cli.manifest {
                Some(manifest) => manifest,
                None => match root_manifest() {
                    Some(manifest) => manifest,
                    None => {
                        eprintln!(
                            "audit: error: no root manifest (a manifest.json whose format is \
                             `{}`) here or in any directory above; run `audit` inside the \
                             repository, give an evidence directory (`audit DIR`), or name the \
                             root manifest (`audit --manifest FILE`)",
                            audit::ROOT_MANIFEST_FORMAT
                        );
                        std::process::exit(2);
                    }
                },
            };
            audit::audit_pins_with(&manifest, &tree, &options)
        }
    };
    let passed = reports.iter().all(|r| r.passed());
    let mut text: String = reports.iter().map(|r| r.render()).collect();
    text.push_str(if passed { "PASS\n" } else { "FAIL\n" });
    // A closed pipe (`audit | head`) is not a reason to panic; the exit status still tells.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    std::process::exit(if passed { 0 } else { 1 });
}

/// The root manifest found from the current directory upwards.
fn root_manifest() -> Option<PathBuf> {
    let here = std::env::current_dir().ok()?;
    audit::find_root_manifest(&here)
}
