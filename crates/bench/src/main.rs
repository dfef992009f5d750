//! `bench`: measures memcpy, then every codec and format operation, each in alternation with
//! memcpy, in one process; prints a table (or JSON lines) of GB/s and ratios to memcpy, then
//! which speed goals were met.

use std::io::Write;

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};

use bench::attention::{self, AttentionRow, Sweep};
use bench::cases::{self, Measured, Scale};
use bench::linear::{self, LinearRow};
use bench::measure::{self, Settings};
use bench::peer::{self, Peer, PeerRow};
use bench::report::{self, Row};
use bench::targets;

/// Throughput of the KV codec, the weight formats and the b-bit streams, as ratios to memcpy
/// (copy_from_slice of 256 MiB) measured in the same run. Build with --release.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Run each operation on N slices of its data at once (N cores); memcpy likewise.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: u16,
    /// A few MiB per case and a few widths: checks in seconds that every case runs.
    #[arg(long)]
    quick: bool,
    /// Print one JSON object per case instead of the table.
    #[arg(long)]
    json: bool,
    /// Only these families (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Family>,
    /// Time NumPy's (and gguf-py's) version of each case right after it, in this run, and
    /// print both in GB/s side by side (one thread only; starts `PYTHON NUMPY_SCRIPT --serve`).
    #[arg(long)]
    numpy: bool,
    /// The Python that runs the NumPy side.
    #[arg(long, default_value = "python3", requires = "numpy")]
    python: String,
    /// The script that runs the NumPy side.
    #[arg(long, default_value = peer::NUMPY_SCRIPT, requires = "numpy")]
    numpy_script: std::path::PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Family {
    Kv,
    Gguf,
    Weights,
    Streams,
    /// Decode-step attention over a packed cache against f32 attention.
    Attention,
    /// The forward passes' matrix products against sgemm on the same shapes.
    Linear,
}

fn main() {
    if let Err(err) = real_main() {
        eprintln!("bench: error: {err:#}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<()> {
    let cli = Cli::parse();
    let threads = usize::from(cli.threads);
    let (scale, settings) = if cli.quick {
        (
            Scale::quick(),
            Settings {
                warmup: 1,
                repeats: 3,
                threads,
            },
        )
    } else {
        (
            Scale::full(),
            Settings {
                warmup: 1,
                repeats: 5,
                threads,
            },
        )
    };
    if cfg!(debug_assertions) {
        eprintln!("bench: warning: a debug build; build with --release for real figures");
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("starting the worker threads")?;
    if cli.numpy && threads != 1 {
        anyhow::bail!("--numpy times NumPy on one thread: leave out --threads {threads}");
    }
    let mut numpy = match cli.numpy {
        true => Some(Peer::start(&cli.python, &cli.numpy_script)?),
        false => None,
    };
    let memcpy_gbps = measure::memcpy_gbps(settings, &pool);
    eprintln!(
        "bench: memcpy (copy_from_slice of {} MiB, {threads} thread(s)): {memcpy_gbps:.2} GB/s",
        measure::MEMCPY_BYTES >> 20
    );
    let numpy_memcpy = match numpy.as_mut() {
        Some(peer) => {
            let gbps = peer.memcpy_gbps(settings)?;
            eprintln!(
                "bench: {} memcpy (np.copyto of 256 MiB): {gbps:.2} GB/s",
                peer.implementation
            );
            gbps
        }
        None => 0.0,
    };
    let mut peer_rows: Vec<PeerRow> = Vec::new();

    let families = if cli.only.is_empty() {
        vec![
            Family::Kv,
            Family::Gguf,
            Family::Weights,
            Family::Streams,
            Family::Attention,
            Family::Linear,
        ]
    } else {
        cli.only.clone()
    };
    let mut rows = Vec::new();
    let mut stdout = std::io::stdout().lock();
    let mut failed: Option<anyhow::Error> = None;
    let mut record = |case: Measured| {
        let row = Row::new(case, threads);
        if cli.json {
            if let Err(err) = json_line(&mut stdout, &row) {
                failed.get_or_insert(anyhow::Error::new(err).context("writing to stdout"));
            }
        } else {
            eprintln!(
                "bench: {} {} {:.2} GB/s ({:.2}x memcpy)",
                row.case.format, row.case.op, row.gbps, row.ratio
            );
        }
        // The peer's version of the case, timed at once, in the same phase of the machine.
        let shape = scale.input_shape(&row.case);
        if let (Some(peer), Some(shape), None) = (numpy.as_mut(), shape, failed.as_ref()) {
            match peer.time(&row, shape, settings, numpy_memcpy) {
                Ok(Some(peer_row)) => {
                    if cli.json {
                        if let Err(err) = json_line(&mut stdout, &peer_row) {
                            failed.get_or_insert(
                                anyhow::Error::new(err).context("writing to stdout"),
                            );
                        }
                    } else {
                        eprintln!(
                            "bench: {}: {:.3} GB/s (bench {:.1}x as fast)",
                            peer_row.implementation, peer_row.row.gbps, peer_row.bench_over_peer
                        );
                    }
                    peer_rows.push(peer_row);
                }
                Ok(None) => {}
                Err(err) => {
                    failed.get_or_insert(anyhow::Error::new(err));
                }
            }
        }
        rows.push(row);
    };
    for &family in &families {
        match family {
            Family::Kv => cases::kv(&scale, settings, &pool, &mut record),
            Family::Gguf => cases::gguf(&scale, settings, &pool, &mut record),
            Family::Weights => cases::packed_weights(&scale, settings, &pool, &mut record),
            Family::Streams => cases::streams(&scale, settings, &pool, &mut record),
            Family::Attention | Family::Linear => {}
        }
    }
    let mut attention_rows = Vec::new();
    if families.contains(&Family::Attention) {
        let sweep = if cli.quick {
            Sweep::quick()
        } else {
            Sweep::full()
        };
        let mut record = |row: AttentionRow| {
            if cli.json {
                if let Err(err) = json_line(&mut stdout, &row) {
                    failed.get_or_insert(anyhow::Error::new(err).context("writing to stdout"));
                }
            } else {
                eprintln!(
                    "bench: attention {} tokens x {}, {} query heads, {} bits g{}: {:.2}x f32",
                    row.tokens,
                    row.head_dim,
                    row.query_heads,
                    row.bits,
                    row.group_size,
                    row.speedup
                );
            }
            attention_rows.push(row);
        };
        // Calls of a few milliseconds move more from run to run than the 128 MiB cases: more
        // of them, for a steadier median.
        let settings = Settings {
            repeats: 3 * settings.repeats,
            ..settings
        };
        attention::run(&sweep, settings, &pool, memcpy_gbps, &mut record);
    }
    let mut linear_rows = Vec::new();
    if families.contains(&Family::Linear) {
        let shapes = if cli.quick {
            linear::quick()
        } else {
            linear::full()
        };
        let mut record = |row: LinearRow| {
            if cli.json {
                if let Err(err) = json_line(&mut stdout, &row) {
                    failed.get_or_insert(anyhow::Error::new(err).context("writing to stdout"));
                }
            } else {
                eprintln!(
                    "bench: linear {} {} {:.1} GFLOP/s, sgemm {:.1} ({:.2}x)",
                    row.model, row.name, row.gflops, row.sgemm_gflops, row.of_peak
                );
            }
            linear_rows.push(row);
        };
        linear::run(&shapes, settings, &pool, &mut record);
    }
    if let Some(err) = failed {
        return Err(err);
    }
    let mut goals = String::new();
    if !rows.is_empty() {
        goals.push_str(&targets::table(&targets::outcomes(&rows)));
    }
    for (goal, outcome) in attention::goals(&attention_rows) {
        let verdict = match outcome {
            Some((speedup, true)) => format!("met (slowest {speedup:.2}x)"),
            Some((speedup, false)) => format!("missed (slowest {speedup:.2}x)"),
            None => "not measured in this run".to_string(),
        };
        goals.push_str(&format!("\n{goal}: {verdict}"));
    }
    if cli.json {
        // stdout stays JSON lines; the goals go to the log.
        eprintln!("{goals}");
    } else {
        if !rows.is_empty() {
            writeln!(stdout, "{}\n", report::table(&rows)).context("writing to stdout")?;
        }
        if let Some(peer) = numpy.as_ref().filter(|_| !peer_rows.is_empty()) {
            writeln!(
                stdout,
                "Against {}, each case timed right after bench's:\n\n{}\n",
                peer.implementation,
                peer::table(&peer_rows, memcpy_gbps, numpy_memcpy)
            )
            .context("writing to stdout")?;
        }
        if !attention_rows.is_empty() {
            writeln!(stdout, "{}\n", attention::table(&attention_rows))
                .context("writing to stdout")?;
        }
        if !linear_rows.is_empty() {
            writeln!(stdout, "{}\n", linear::table(&linear_rows)).context("writing to stdout")?;
        }
        writeln!(stdout, "{goals}").context("writing to stdout")?;
    }
    Ok(())
}

/// One row as a line of JSON.
fn json_line(out: &mut impl Write, row: &impl serde::Serialize) -> std::io::Result<()> {
    let line = serde_json::to_string(row).expect("a row serializes");
    writeln!(out, "{line}")
}
