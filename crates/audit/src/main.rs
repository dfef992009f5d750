//! `audit [DIR]`: PASS, UNVERIFIED or FAIL for an evidence directory, or for everything the root
//! manifest pins when no directory is given. Model evidence is re-derived by re-running the
//! models from the model cache; without them it is UNVERIFIED. Exit status 0 only for PASS, 3
//! for UNVERIFIED, 1 for FAIL, 2 for a usage error.

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
    /// Model cache holding `<model>/<files>`, as scripts/fetch-models fills it: every model
    /// pass of real-model and model-quality evidence is re-run from these (hash-checked) files
    /// [default: $KVPACK_MODELS, else model-cache/ in the workspace]. Evidence whose model is
    /// missing is UNVERIFIED, not PASS.
    #[arg(long, value_name = "DIR", conflicts_with = "no_models")]
    models: Option<PathBuf>,
    /// Do not re-run models: quick, and model evidence is UNVERIFIED (exit status 3).
    #[arg(long)]
    no_models: bool,
    /// Re-run only K model passes per directory, chosen from the hash of its arrays.npz; the
    /// report names them, and a PASS covers only those passes.
    #[arg(long, value_name = "K", conflicts_with = "no_models", value_parser = audit::sample_size)]
    sample: Option<usize>,
    /// With no DIR: re-run K model passes (at least 1) of the pinned directory DIR (repeatable;
    /// a path as from the current directory), whatever --sample says for the others. Without
    /// --sample, the other directories re-run every pass.
    #[arg(long, value_name = "DIR=K", conflicts_with_all = ["dir", "no_models"])]
    sample_dir: Vec<audit::SampleDir>,
}

fn main() {
    let cli = Cli::parse();
    let tree = cli.tree.unwrap_or_else(audit::default_tree);
    let mut options = if cli.no_models {
        audit::Options::without_models()
    } else {
        audit::Options::default()
    };
    if let Some(dir) = cli.models {
        options.models = audit::Models::Cache(dir);
    }
    options.sample = cli.sample;
    options.sample_dirs = cli.sample_dir;
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
    let verdict = audit::Verdict::of_all(&reports);
    let mut text: String = reports.iter().map(|r| r.render()).collect();
    text.push_str(verdict.word());
    text.push('\n');
    // A closed pipe (`audit | head`) is not a reason to panic; the exit status still tells.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    std::process::exit(verdict.exit_code());
}

/// The root manifest found from the current directory upwards.
fn root_manifest() -> Option<PathBuf> {
    let here = std::env::current_dir().ok()?;
    audit::find_root_manifest(&here)
}
