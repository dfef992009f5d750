//! `runner`: runs a study protocol into a new evidence directory, or pins archived evidence.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use indicatif::{ProgressBar, ProgressStyle};
use runner::evidence;
use runner::manifest::{Counts, Manifest};
use runner::protocol::{FROZEN_PATH, Protocol};
use runner::timing::{self, Operation};
use runner::{study, summary};

/// Runs the packed-KV study (or a user-written protocol) into a new evidence directory.
#[derive(Parser)]
#[command(
    version,
    about,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
struct RunArgs {
    /// Output directory; must not exist.
    #[arg(long, value_name = "DIR", required = true)]
    out: Option<PathBuf>,
    /// Protocol file (JSON); defaults to the frozen packed-KV protocol built into the runner.
    #[arg(long, value_name = "FILE")]
    protocol: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Rewrite the root manifest so it pins the given evidence directories.
    Pin {
        /// Evidence directories, relative to the root manifest's directory.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Root manifest to write.
        #[arg(long, default_value = "manifest.json")]
        manifest: PathBuf,
    },
}

fn main() {
    if let Err(err) = real_main() {
        eprintln!("runner: error: {err:#}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Pin { dirs, manifest }) => {
            let root = runner::pin::pin(&manifest, &dirs)?;
            let mut text = String::new();
            for (dir, pinned) in &root.evidence {
                text.push_str(&format!("pinned {dir}: {} files\n", pinned.files.len()));
            }
            text.push_str(&format!("wrote {}\n", manifest.display()));
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            Ok(())
        }
        None => run(cli.run),
    }
}

fn run(args: RunArgs) -> Result<()> {
    let out = args.out.expect("clap requires --out");
    evidence::check_new(&out)?;
    let (protocol, source) = match &args.protocol {
        None => (Protocol::frozen(), format!("embedded {FROZEN_PATH}")),
        Some(path) => {
            let text = runner::validate::read_protocol_file(path)?;
            let protocol = Protocol::from_json(&text)
                .with_context(|| format!("protocol {}", path.display()))?;
            (protocol, path.display().to_string())
        }
    };
    // Before this run adds its own: runs killed while writing leave their staging directories.
    let cleanup = evidence::remove_stale_staging(&evidence::parent_dir(&out));
    for dir in &cleanup.removed {
        eprintln!(
            "runner: removed {}, the staging directory of a run that is no longer running",
            dir.display()
        );
    }
    for (path, err) in &cleanup.failed {
        eprintln!(
            "runner: warning: could not clean up {}: {err}",
            path.display()
        );
    }
    let total = protocol.comparison_count();
    eprintln!(
        "runner: {} ({source}): {} inputs x {} configurations = {total} comparisons",
        protocol.study,
        protocol.inputs().len(),
        total / protocol.inputs().len()
    );

    let bar = progress_bar(total as u64, "comparisons");
    let run = study::run(&protocol, |done| bar.set_position(done as u64))?;
    bar.finish_and_clear();

    let timings = protocol
        .timing
        .map(|timing| {
            let per_input = total / protocol.inputs().len() * Operation::ALL.len() * timing.repeats;
            let bar = progress_bar((per_input * protocol.inputs().len()) as u64, "timings");
            let timings = timing::measure(&run, &timing, |done| bar.set_position(done as u64));
            bar.finish_and_clear();
            timings
        })
        .transpose()?;

    let rows: Vec<_> = run.comparisons.iter().map(|c| c.row.clone()).collect();
    let summary = summary::summarize(&protocol, &rows, timings.as_ref());
    let manifest = Manifest::new(
        source,
        protocol.clone(),
        Counts {
            inputs: run.inputs.len(),
            comparisons: run.comparisons.len(),
            timings: timings.as_ref().map_or(0, |t| t.measurements.len()),
        },
    );
    evidence::write(&out, &run, &summary, timings.as_ref(), manifest)?;
    let text = format!(
        "{}wrote {}\n",
        summary::render(&protocol, &summary),
        out.display()
    );
    // The run is complete on disk; a closed stdout pipe must not turn it into a panic.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(())
}

/// A progress bar on stderr when it is a terminal; hidden otherwise (logs, pipes, CI).
fn progress_bar(len: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    let template = format!("{{bar:40}} {{pos}}/{{len}} {what} ({{elapsed}})");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar
}
