//! `runner`: runs a study protocol (or one shard of it) into a new evidence directory, merges
//! shards, or pins archived evidence.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use indicatif::{ProgressBar, ProgressStyle};
use kvstudy::plan::Shard;
use kvstudy::protocol::{FROZEN_PATH, Protocol};
use kvstudy::run::{Run, run_protocol};
use kvstudy::summary;

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
    /// Run only the I-th of N slices of the protocol's inputs (1 <= I <= N), for `runner merge`.
    #[arg(long, value_name = "I/N")]
    shard: Option<Shard>,
    /// Worker threads for the comparisons (default: one per core). The output does not depend
    /// on it; timed calls always run alone.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: Option<u16>,
}

// Parsed once per process, so the size of its largest variant (`quality`'s many flags) costs
// nothing; boxing fields to shrink it would only obscure the flags.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Merge the N shards of one protocol (a packed-KV sweep's, or a model-quality study's from
    /// `quality --shard`) into one evidence directory, byte-identical in its arrays and results
    /// to a single run.
    Merge {
        /// Output directory; must not exist.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// The shards' evidence directories, in any order.
        #[arg(required = true, value_name = "SHARD_DIR")]
        shards: Vec<PathBuf>,
    },
    /// Dump what a real model computes for one text: token ids, every layer's q, k and v (K after
    /// RoPE, as a cache holds it), the last hidden state and (decoders) the logits, as an .npz.
    Kv {
        /// `minilm` (all-MiniLM-L6-v2), `smollm2` (SmolLM2-135M-Instruct) or `gemma3` (Gemma 3
        /// 270M).
        #[arg(long)]
        model: models::ModelName,
        /// The text.
        #[arg(
            long,
            required_unless_present = "text_file",
            conflicts_with = "text_file"
        )]
        text: Option<String>,
        /// A UTF-8 file holding the text.
        #[arg(long, value_name = "FILE")]
        text_file: Option<PathBuf>,
        /// Output .npz; must not exist.
        #[arg(long, value_name = "FILE.npz")]
        out: PathBuf,
    },
    /// Measure what a packed KV cache does to a decoder (SmolLM2 or Gemma 3) on one text
    /// (teacher forcing): NLL and perplexity with the float32 and the packed cache, KL, top-1
    /// agreement, cache bytes per token, and greedy text from a prompt with both caches.
    Quality {
        /// `smollm2` or `gemma3` (an encoder such as `minilm` has no next-token distribution).
        #[arg(long, required_unless_present = "protocol")]
        model: Option<models::ModelName>,
        /// A model-quality study protocol (JSON): runs it into a new evidence directory (`--out`)
        /// instead of measuring one text.
        #[arg(
            long,
            value_name = "FILE",
            requires = "out",
            conflicts_with_all = ["model", "text", "text_file", "prompt", "json"]
        )]
        protocol: Option<PathBuf>,
        /// The study's output directory; must not exist.
        #[arg(long, value_name = "DIR", requires = "protocol")]
        out: Option<PathBuf>,
        /// Worker threads for the study's runs (default: one per core). The output does not
        /// depend on it.
        #[arg(long, value_name = "N", requires = "protocol",
              value_parser = clap::value_parser!(u16).range(1..=1024))]
        threads: Option<u16>,
        /// Run only the I-th of N slices of the protocol's texts (1 <= I <= N) into a shard
        /// directory, for `runner merge`.
        #[arg(long, value_name = "I/N", requires = "protocol")]
        shard: Option<Shard>,
        /// The text.
        #[arg(
            long,
            required_unless_present_any = ["text_file", "protocol"],
            conflicts_with = "text_file"
        )]
        text: Option<String>,
        /// A UTF-8 file holding the text.
        #[arg(long, value_name = "FILE")]
        text_file: Option<PathBuf>,
        /// Codec setting, `g<GROUP>_b<BITS>[_asym][_swap]` (K along tokens and V along features;
        /// `_swap`: K along features, V along tokens).
        #[arg(long, default_value = "g32_b4")]
        setting: String,
        /// Budget policy: uniform, recent8:W, early8:W or recent_f32:W.
        #[arg(long, default_value = "uniform")]
        policy: String,
        /// When the cache is quantized: prefill, streaming or causal.
        #[arg(long, default_value = "prefill")]
        schedule: String,
        // The help is an attribute, not a doc comment: the name pattern's brackets are not links.
        #[arg(
            long,
            value_name = "NAME",
            conflicts_with_all = ["setting", "policy", "protocol"],
            help = "A named scheme instead of --setting and --policy: kivi2, kivi4, hf-quanto2, \
                    hf-quanto4, llamacpp-TYPE[+rot] with TYPE q4_0, q4_1, q5_0, q8_0 or iq4_nl, \
                    kvquant<B>[-first<N>] (B 2 to 5), or this project's codec as \
                    kvpack-k<KB>v<VB>[-asym][-sink<S>][-edge8][-layer<L>] (docs/schemes.md)"
        )]
        scheme: Option<String>,
        /// A UTF-8 file of calibration text for a KVQuant scheme (default: the built-in one,
        /// docs/audit.md as of this release); it must not overlap the text.
        #[arg(long, value_name = "FILE", requires = "scheme")]
        calibration_file: Option<PathBuf>,
        /// Greedy tokens to generate after the prompt with both caches (0: none).
        #[arg(long, default_value_t = 16)]
        generate: usize,
        /// The prompt for generation (default: the text's first 32 tokens).
        #[arg(long)]
        prompt: Option<String>,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print the `texts` of a model-quality protocol from the public corpus (docs/texts.md;
    /// `scripts/fetch-texts`), as a JSON array: COUNT evaluation documents of a domain longer
    /// than TOKENS ids of the model, spread over the set, each cut to a prefix whose first TOKENS
    /// ids are the document's.
    Corpus {
        /// `smollm2` or `gemma3`: whose tokenizer counts the ids.
        #[arg(long)]
        model: models::ModelName,
        /// `prose` (State of the Union addresses) or `code` (click's modules).
        #[arg(long)]
        domain: quality::corpus::Domain,
        /// Documents wanted.
        #[arg(long)]
        count: usize,
        /// Ids each document must exceed.
        #[arg(long)]
        tokens: usize,
        /// The text cache (default: $KVPACK_TEXTS, else text-cache/ in the current directory).
        #[arg(long, value_name = "DIR")]
        texts: Option<PathBuf>,
    },
    /// Print what a cache stores for a text of N tokens of a decoder, without running it: bytes
    /// per token, the float32 cache's for the same tokens, and bits per element (a sliding
    /// layer holds its window only). KVQuant, whose bytes depend on the values, is refused.
    Bytes {
        /// `smollm2` or `gemma3`.
        #[arg(long)]
        model: models::ModelName,
        /// Tokens in the text.
        #[arg(long)]
        tokens: usize,
        /// Codec setting, as for `quality`.
        #[arg(long, default_value = "g32_b4")]
        setting: String,
        /// Budget policy, as for `quality`.
        #[arg(long, default_value = "uniform")]
        policy: String,
        /// Schedule, as for `quality`.
        #[arg(long, default_value = "prefill")]
        schedule: String,
        /// A named scheme instead of --setting and --policy, as for `quality`.
        #[arg(long, value_name = "NAME", conflicts_with_all = ["setting", "policy"])]
        scheme: Option<String>,
        /// Print one JSON object instead of a line.
        #[arg(long)]
        json: bool,
    },
    /// Pin evidence directories in the root manifest (add or update their file hashes, keep the
    /// other pins), after each passes the audit.
    Pin {
        /// Evidence directories, relative to the root manifest's directory.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Root manifest to write.
        #[arg(long, default_value = "manifest.json")]
        manifest: PathBuf,
        /// Make the given directories the whole pinned set, dropping every other pin.
        #[arg(long)]
        replace_all: bool,
    },
}

fn main() {
    one_malloc_arena();
    if let Err(err) = real_main() {
        eprintln!("runner: error: {err:#}");
        std::process::exit(1);
    }
}

/// One glibc malloc arena for every thread. The worker threads free each comparison's buffers
/// into arenas of their own, which the timing block (on the main thread) cannot reuse, so with
/// the default per-thread arenas a run's peak memory grew by tens of MiB past 2x its K+V (README,
/// "Speed"). Large buffers are few, so sharing one arena costs no measurable time.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn one_malloc_arena() {
    use std::ffi::c_int;
    /// glibc's `M_ARENA_MAX` (malloc.h).
    const M_ARENA_MAX: c_int = -8;
    unsafe extern "C" {
        fn mallopt(param: c_int, value: c_int) -> c_int;
    }
    // SAFETY: mallopt is glibc's malloc tuning call, with the signature malloc.h declares; it
    // is made before any other thread exists. A refusal (0) leaves the default, which is safe.
    unsafe {
        mallopt(M_ARENA_MAX, 1);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn one_malloc_arena() {}

fn real_main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Pin {
            dirs,
            manifest,
            replace_all,
        }) => pin(&manifest, &dirs, replace_all),
        Some(Command::Merge { out, shards })
            if shards
                .first()
                .is_some_and(|dir| quality::shard::is_quality_shard(dir)) =>
        {
            let (_, protocol, study) = quality::shard::merge(&out, &shards)?;
            let summary = quality::study::summarize(&protocol, &study);
            let text = format!(
                "{}\nmerged {} shards into {}\n",
                quality::report::quality_table(&summary).to_text(),
                shards.len(),
                out.display()
            );
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            Ok(())
        }
        Some(Command::Merge { out, shards }) => {
            let merged = kvstudy::merge::merge(&out, &shards)?;
            let text = format!(
                "{}merged {} shards into {}\n",
                summary::render(&merged.protocol, &merged.summary),
                shards.len(),
                out.display()
            );
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            Ok(())
        }
        Some(Command::Kv {
            model,
            text,
            text_file,
            out,
        }) => kv(model, text, text_file, &out),
        Some(Command::Corpus {
            model,
            domain,
            count,
            tokens,
            texts,
        }) => {
            let dir = texts
                .or_else(|| std::env::var_os("KVPACK_TEXTS").map(PathBuf::from))
                .unwrap_or_else(|| PathBuf::from("text-cache"));
            let documents = quality::corpus::open(&dir)
                .with_context(|| format!("the text cache {}", dir.display()))?;
            let files = models::files::locate_or_fetch(model)?;
            let decoder = quality::decoder::Decoder::load(&files)?;
            let picked =
                quality::corpus::protocol_texts(&documents, &decoder, domain, count, tokens)?;
            if picked.len() < count {
                anyhow::bail!(
                    "only {} {domain} evaluation documents exceed {tokens} ids, {count} asked for",
                    picked.len()
                );
            }
            let out = format!("{}\n", serde_json::to_string_pretty(&picked)?);
            let _ = std::io::stdout().lock().write_all(out.as_bytes());
            Ok(())
        }
        Some(Command::Bytes {
            model,
            tokens,
            setting,
            policy,
            schedule,
            scheme,
            json,
        }) => {
            let cache =
                quality::one_text::parse_cache(&setting, &policy, &schedule, scheme.as_deref())?;
            let cost = quality::cost::cost(model, tokens, &cache)?;
            let out = if json {
                format!("{}\n", serde_json::to_string(&cost)?)
            } else {
                format!(
                    "{} at {} tokens, {}: {} bytes per token ({} bytes in all); float32 {} bytes \
                     per token for the same tokens; {:.3} bits per element\n",
                    cost.model,
                    cost.tokens,
                    scheme.unwrap_or(format!("{setting} {policy} {schedule}")),
                    quality::report::bytes_or_whole(cost.bytes_per_token),
                    quality::report::bytes_or_whole(cost.bytes as f64),
                    quality::report::bytes_or_whole(cost.f32_bytes_per_token),
                    cost.bits_per_element
                )
            };
            let _ = std::io::stdout().lock().write_all(out.as_bytes());
            Ok(())
        }
        Some(Command::Quality {
            protocol: Some(protocol),
            out,
            threads,
            shard,
            ..
        }) => quality_study(&protocol, out, threads, shard),
        Some(Command::Quality {
            model,
            text,
            text_file,
            setting,
            policy,
            schedule,
            scheme,
            calibration_file,
            generate,
            prompt,
            json,
            ..
        }) => {
            let model = model.context("--model is required without --protocol")?;
            let text = match (text, text_file) {
                (Some(text), _) => text,
                (None, Some(path)) => kvstudy::capture::read_text_file(&path)?,
                (None, None) => unreachable!("clap requires --text or --text-file"),
            };
            let calibration = calibration_file
                .map(|path| kvstudy::capture::read_text_file(&path))
                .transpose()?;
            let request = quality::one_text::Request {
                model,
                setting: &setting,
                policy: &policy,
                schedule: &schedule,
                scheme: scheme.as_deref(),
                calibration: calibration.as_deref(),
                text: &text,
                prompt: prompt.as_deref(),
                generate,
            };
            let steps = quality::one_text::steps(&request);
            let bar = progress_bar(steps as u64, "passes");
            let start = std::time::Instant::now();
            let report = quality::one_text::run(&request, |done| bar.set_position(done as u64))?;
            bar.finish_and_clear();
            let out = if json {
                format!("{}\n", serde_json::to_string(&report)?)
            } else {
                quality::one_text::render(&report)
            };
            let _ = std::io::stdout().lock().write_all(out.as_bytes());
            eprintln!(
                "runner: quality took {:.1} s",
                start.elapsed().as_secs_f64()
            );
            Ok(())
        }
        None => run(cli.run),
    }
}

/// `runner pin`: each directory must PASS the audit (against the workspace the binaries were
/// built from, re-running the models for model evidence) before its files are hashed; an
/// UNVERIFIED directory (its model not in the cache) is refused too.
fn pin(manifest: &std::path::Path, dirs: &[PathBuf], replace_all: bool) -> Result<()> {
    use evidence::pin::{PinChange, PinScope};
    let scope = if replace_all {
        PinScope::ReplaceAll
    } else {
        PinScope::Update
    };
    let tree = audit::default_tree();
    let check = |dir: &std::path::Path| {
        eprintln!("runner: auditing {}", dir.display());
        let report = audit::audit_dir(dir, &tree);
        if report.passed() {
            return Ok(());
        }
        // The failures and what was not re-derived, not the pages of checks that passed.
        let rendered = report.render();
        let failures: Vec<&str> = rendered
            .lines()
            .filter(|line| {
                let line = line.trim_start();
                line.starts_with("FAIL") || line.starts_with("not re-derived")
            })
            .take(20)
            .collect();
        Err(failures.join("\n"))
    };
    // The formats the audit knows how to check: the two studies' evidence.
    let formats = [
        kvstudy::manifest::MANIFEST_FORMAT,
        quality::study::QUALITY_MANIFEST_FORMAT,
    ];
    let pinned = evidence::pin::pin(manifest, dirs, scope, &formats, &check)?;
    let mut text = String::new();
    for (dir, change) in &pinned.changes {
        let files = pinned
            .manifest
            .evidence
            .get(dir)
            .map_or(0, |p| p.files.len());
        let line = match change {
            PinChange::Added => format!("pinned {dir}: {files} files (new)"),
            PinChange::Updated => format!("pinned {dir}: {files} files (updated)"),
            PinChange::Unchanged => format!("pinned {dir}: {files} files (unchanged)"),
            PinChange::Kept => format!("kept {dir}: pinned before, not given"),
            PinChange::Dropped => format!("dropped {dir} (--replace-all)"),
        };
        text.push_str(&line);
        text.push('\n');
    }
    text.push_str(&format!("wrote {}\n", manifest.display()));
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(())
}

/// `runner quality --protocol FILE --out DIR [--shard I/N]`.
fn quality_study(
    protocol_path: &std::path::Path,
    out: Option<PathBuf>,
    threads: Option<u16>,
    shard: Option<Shard>,
) -> Result<()> {
    use quality::study::{self as quality_study, QualityProtocol};
    use quality::write as quality_evidence;
    let out = out.context("--out is required with --protocol")?;
    evidence::check_new(&out)?;
    let text = kvstudy::validate::read_protocol_file(protocol_path)?;
    let protocol = QualityProtocol::from_json(&text)
        .with_context(|| format!("protocol {}", protocol_path.display()))?;
    let threads = threads_or_cores(threads);
    warn_if_stale();
    clean_up_dead_runs(&out);
    let texts = match shard {
        Some(shard) => shard.slice(protocol.texts.len(), "texts")?.len(),
        None => protocol.texts.len(),
    };
    let slice = shard.map_or_else(String::new, |s| format!(", shard {s}"));
    eprintln!(
        "runner: {} ({}{slice}): {texts} texts x {} runs on {threads} threads",
        protocol.study,
        protocol_path.display(),
        protocol.runs.len()
    );
    let bar = progress_bar(quality_study::steps(&protocol, shard) as u64, "passes");
    let start = std::time::Instant::now();
    let progress = |done: usize| bar.set_position(done as u64);
    if let Some(shard) = shard {
        let files = models::ModelFiles::locate(protocol.model)?;
        let decoder = quality::decoder::Decoder::load(&files)?;
        let part = quality_study::run_study_shard(&protocol, &decoder, threads, &progress, shard)?;
        bar.finish_and_clear();
        quality::shard::write_shard(
            &out,
            &protocol,
            protocol_path.display().to_string(),
            (shard, &part),
            threads,
        )?;
        let text = format!(
            "wrote shard {shard} ({texts} texts) into {}; merge the {} shards with `runner merge`\n",
            out.display(),
            shard.count
        );
        let _ = std::io::stdout().lock().write_all(text.as_bytes());
        eprintln!(
            "runner: model-quality shard took {:.1} s",
            start.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    let (_, study) = quality_evidence::run(
        &protocol,
        protocol_path.display().to_string(),
        &out,
        threads,
        &progress,
    )?;
    bar.finish_and_clear();
    let summary = quality_study::summarize(&protocol, &study);
    let text = format!(
        "{}\nwrote {}\n",
        quality::report::quality_table(&summary).to_text(),
        out.display()
    );
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    eprintln!(
        "runner: model-quality study took {:.1} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn kv(
    model: models::ModelName,
    text: Option<String>,
    text_file: Option<PathBuf>,
    out: &std::path::Path,
) -> Result<()> {
    kvstudy::capture::check_new_file(out)?;
    let text = match (text, text_file) {
        (Some(text), _) => text,
        (None, Some(path)) => kvstudy::capture::read_text_file(&path)?,
        (None, None) => unreachable!("clap requires --text or --text-file"),
    };
    let files = models::ModelFiles::locate(model)?;
    let loaded = models::load(&files)?;
    let ids = loaded.encode(&text)?;
    let capture = loaded.forward(&ids)?;
    kvstudy::capture::write_npz(out, model, &capture)?;
    let message = format!(
        "{model}: {} tokens, {} layers; wrote {}\n",
        capture.ids.len(),
        capture.layers.len(),
        out.display()
    );
    let _ = std::io::stdout().lock().write_all(message.as_bytes());
    Ok(())
}

fn run(args: RunArgs) -> Result<()> {
    let out = args.out.expect("clap requires --out");
    evidence::check_new(&out)?;
    let (protocol, source) = match &args.protocol {
        None => (Protocol::frozen(), format!("embedded {FROZEN_PATH}")),
        Some(path) => {
            let text = kvstudy::validate::read_protocol_file(path)?;
            let protocol = Protocol::from_json(&text)
                .with_context(|| format!("protocol {}", path.display()))?;
            (protocol, path.display().to_string())
        }
    };
    warn_if_stale();
    clean_up_dead_runs(&out);
    // A model's run needs its files: say how to fetch them before anything is computed.
    if let Some(model) = &protocol.model {
        models::ModelFiles::locate(model.name)?;
    }
    let threads = threads_or_cores(args.threads);
    let run = Run {
        protocol: &protocol,
        source: &source,
        shard: args.shard,
        threads,
    };
    let inputs = run.inputs()?.len();
    let configurations = run.configurations();
    let slice = args
        .shard
        .map_or_else(String::new, |s| format!(", shard {s}"));
    eprintln!(
        "runner: {} ({source}{slice}): {inputs} inputs x {configurations} configurations = {} \
         comparisons",
        protocol.study,
        inputs * configurations,
    );
    let bar = progress_bar(run.steps()? as u64, "steps");
    let finished = run_protocol(&run, &out, |done| bar.set_position(done as u64))?;
    bar.finish_and_clear();
    let summary = finished.summary;
    let text = format!(
        "{}wrote {}\n",
        summary::render(&protocol, &summary),
        out.display()
    );
    // The run is complete on disk; a closed stdout pipe must not turn it into a panic.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(())
}

/// Warns when this binary is older than the checkout it was built in: what it writes would
/// record sources that are not the commit's, and the audit would refuse it.
fn warn_if_stale() {
    if let Some(difference) = evidence::provenance::build_differs_from_checkout() {
        eprintln!(
            "runner: warning: this runner was built from other sources than its checkout \
             ({difference}); what it writes will not pass the audit. Rebuild it first \
             (cargo build --release -p runner)."
        );
    }
}

/// The worker threads asked for, or one per core.
fn threads_or_cores(threads: Option<u16>) -> usize {
    threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        usize::from,
    )
}

/// Removes, beside `out`, the staging directories of runs that were killed while writing (before
/// this run adds its own), saying what it removed and what it could not.
fn clean_up_dead_runs(out: &std::path::Path) {
    let cleanup = evidence::remove_stale_staging(&evidence::parent_dir(out));
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
