//! `repack`: converts quantized checkpoints between GPTQ, GPTQ v2 and AWQ through the logical
//! matrix, inspects them, quantizes float matrices to GGUF Q4_0/Q8_0/Q4_1 files and NF4
//! safetensors files (and back), and measures
//! each format's matmul error on MiniLM's real layers.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};
use weights::WeightFormat;

use repack::convert::{self, ConvertRequest};
use repack::inspect;
use repack::quantfile::{self, DequantizeFlags, QuantReport, Target, UnknownTarget};
use repack::report::cost_line;

/// Converts quantized weight checkpoints through the logical matrix, and refuses what it cannot
/// prove bit-identical.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Convert every quantized layer of a safetensors checkpoint to another layout.
    Convert {
        /// Layout and zero-point convention of IN: gptq, gptq_v2, awq (nf4 is refused: it needs
        /// requantization).
        #[arg(long, value_parser = parse_format)]
        from: WeightFormat,
        /// Layout to write: gptq, gptq_v2 or awq.
        #[arg(long, value_parser = parse_format)]
        to: WeightFormat,
        /// The checkpoint's group size (kept; changing it would need requantization).
        #[arg(long, value_name = "G")]
        group_size: usize,
        /// The checkpoint's bit width [default: the metadata's `bits`, else the tensor shapes];
        /// refused when the tensor shapes say otherwise.
        #[arg(long, value_name = "B")]
        bits: Option<u32>,
        /// Input checkpoint (.safetensors).
        input: PathBuf,
        /// Output checkpoint; must not exist.
        output: PathBuf,
    },
    /// Print each tensor's layout, shape and effective bits per weight.
    Inspect {
        /// A safetensors checkpoint or a GGUF file.
        file: PathBuf,
    },
    /// Quantize a float32 matrix (.npy) with a block format's own quantizer, into a GGUF file
    /// (q4_0, q8_0, q4_1) or a safetensors file in bitsandbytes' NF4 layout (nf4).
    Quantize {
        /// q4_0, q8_0, q4_1 or nf4.
        #[arg(long, value_parser = parse_target)]
        to: Target,
        /// NF4 absmax block size [default: 64]; nf4 only (the GGUF formats' blocks are 32).
        #[arg(long, value_name = "B")]
        block_size: Option<usize>,
        /// Float32 matrix (.npy).
        input: PathBuf,
        /// Output: OUT.gguf for q4_0, q8_0 and q4_1, OUT.safetensors for nf4; must not exist.
        output: PathBuf,
    },
    /// Effective bits per weight of a storage layout (codes and metadata), or the worked example.
    Bpw(repack::bpw_cmd::BpwArgs),
    /// Matmul error of MiniLM's real linear layers under each weight format, on the model's own
    /// activations, with bits per weight (needs `scripts/fetch-models`).
    LayerError(repack::layer_error::LayerErrorArgs),
    /// Dequantize a GGUF file or an NF4 safetensors file (format and shape from the file), or
    /// with --raw a bare block file, back to a float32 matrix (.npy).
    Dequantize {
        /// The tensor to read, when the file holds several.
        #[arg(long, value_name = "NAME")]
        tensor: Option<String>,
        /// Read a bare block file (no header), as --from and --cols say.
        #[arg(long)]
        raw: bool,
        /// With --raw: q4_0, q8_0, q4_1 or nf4.
        #[arg(long, value_parser = parse_target)]
        from: Option<Target>,
        /// With --raw: values per row.
        #[arg(long, value_name = "C")]
        cols: Option<usize>,
        /// With --raw --from nf4: the absmax block size [default: 64].
        #[arg(long, value_name = "B")]
        block_size: Option<usize>,
        /// A .gguf or .safetensors file (or, with --raw, a bare block file).
        input: PathBuf,
        /// Float32 matrix (.npy); must not exist.
        output: PathBuf,
    },
}

fn parse_format(name: &str) -> std::result::Result<WeightFormat, String> {
    name.parse()
        .map_err(|err: weights::UnknownFormat| err.to_string())
}

fn parse_target(name: &str) -> std::result::Result<Target, String> {
    name.parse().map_err(|err: UnknownTarget| err.to_string())
}

fn main() {
    if let Err(err) = run(Cli::parse()) {
        // Each message leaves its cause to the chain, which `{:#}` prints once: message: cause.
        eprintln!("repack: error: {err:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Bpw(args) => {
            // A closed pipe (`repack bpw | head`) is not an error worth a panic.
            let _ = std::io::Write::write_all(
                &mut std::io::stdout().lock(),
                repack::bpw_cmd::run(&args)?.as_bytes(),
            );
        }
        Command::LayerError(args) => {
            let _ = std::io::Write::write_all(
                &mut std::io::stdout().lock(),
                repack::layer_error::run(&args)?.as_bytes(),
            );
        }
        Command::Convert {
            from,
            to,
            group_size,
            bits,
            input,
            output,
        } => {
            let request = ConvertRequest {
                from,
                to,
                group_size,
                bits,
            };
            let conversion = convert::convert(&input, &output, request)?;
            println!("{conversion}");
            println!("wrote {}", output.display());
        }
        Command::Inspect { file } => {
            let inspection = inspect::inspect(&file)?;
            print!("{}", inspection.report);
            if !inspection.failures.is_empty() {
                let layers: Vec<&str> = inspection
                    .failures
                    .iter()
                    .map(|(layer, _)| layer.as_str())
                    .collect();
                anyhow::bail!(
                    "{}: {} layer(s) failed the check (`check: FAILS` above): {}",
                    file.display(),
                    layers.len(),
                    layers.join(", ")
                );
            }
        }
        Command::Quantize {
            to,
            block_size,
            input,
            output,
        } => {
            let report = quantfile::quantize_file(&input, &output, to, block_size)?;
            print_report(&report);
            println!("wrote {}", output.display());
        }
        Command::Dequantize {
            tensor,
            raw,
            from,
            cols,
            block_size,
            input,
            output,
        } => {
            let flags = DequantizeFlags {
                raw,
                from,
                cols,
                block_size,
                tensor,
            };
            let report = quantfile::dequantize_file(&input, &output, &flags)?;
            print_report(&report);
            println!("wrote {}", output.display());
        }
    }
    Ok(())
}

fn print_report(report: &QuantReport) {
    let [rows, cols] = report.shape;
    println!(
        "{} {rows} x {cols}: {}",
        report.format,
        cost_line(&report.cost)
    );
}
