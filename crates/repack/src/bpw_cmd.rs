//! `repack bpw`: effective bits per weight of a storage layout, from [`weights::bpw`].
//!
//! With no layout flags it prints the bit-packing seed's worked example: one 4096 x 4096
//! projection under common layouts, and what the gap between 4.125 and 5.0 bits per weight
//! comes to for a 70-billion-parameter model. With `--bits` (and any other layout flags) it
//! prints one layout's cost, part by part.

use bitpack::{Bits, GroupAxis};
use clap::Args;
use weights::bpw::{self, BpwError, Container, Cost, FloatDtype, Format, Padding, ZeroPoints};

use crate::error::{Error, Result};
use crate::report::thousands;

/// Weights in the model the worked example scales up to.
pub const MODEL_WEIGHTS: u64 = 70_000_000_000;

/// The flags of `repack bpw`: a matrix shape, and optionally a layout (with `--bits`).
#[derive(Args, Debug, Clone, Default)]
pub struct BpwArgs {
    /// Matrix shape ROWSxCOLS.
    #[arg(long, value_name = "ROWSxCOLS", default_value = "4096x4096")]
    pub shape: String,
    /// Code width, 1 to 8; without it the worked example table is printed.
    #[arg(long)]
    pub bits: Option<u32>,
    /// Group size (elements per scale) [default: 128].
    #[arg(long, requires = "bits")]
    pub group: Option<usize>,
    /// Axis groups run along: token (down each column) or feature (along each row)
    /// [default: token].
    #[arg(long, requires = "bits")]
    pub axis: Option<GroupAxis>,
    /// Scale dtype: f16, bf16 or f32 [default: f16].
    #[arg(long, requires = "bits")]
    pub scale: Option<FloatDtype>,
    /// Zero points: none, packed (b-bit), f16, bf16 or f32 [default: none].
    #[arg(long, requires = "bits")]
    pub zeros: Option<ZeroPoints>,
    /// Store g_idx: one int32 per element of the grouped dimension.
    #[arg(long, requires = "bits")]
    pub g_idx: bool,
    /// Padding: none, or groups (every line padded to whole groups) [default: none].
    #[arg(long, requires = "bits")]
    pub padding: Option<Padding>,
    /// Container: bytes (one byte stream) or line-words (u32 words per line) [default: bytes].
    #[arg(long, requires = "bits")]
    pub container: Option<Container>,
    /// Extra metadata bytes per group (GGUF K-quants' sub-block scales) [default: 0].
    #[arg(long, requires = "bits")]
    pub extra_bytes_per_group: Option<usize>,
}

/// The command's output.
pub fn run(args: &BpwArgs) -> Result<String> {
    let (rows, cols) = parse_shape(&args.shape)?;
    match args.bits {
        None => worked_example(rows, cols),
        Some(bits) => one_layout(&format_from(args, bits)?, rows, cols),
    }
}

fn format_from(args: &BpwArgs, bits: u32) -> Result<Format> {
    let defaults = Format::new(Bits::new(bits)?, 128, FloatDtype::F16);
    Ok(Format {
        group_size: args.group.unwrap_or(defaults.group_size),
        axis: args.axis.unwrap_or(defaults.axis),
        scale: args.scale.unwrap_or(defaults.scale),
        zero_points: args.zeros.unwrap_or(defaults.zero_points),
        g_idx: args.g_idx,
        padding: args.padding.unwrap_or(defaults.padding),
        container: args.container.unwrap_or(defaults.container),
        extra_bytes_per_group: args
            .extra_bytes_per_group
            .unwrap_or(defaults.extra_bytes_per_group),
        ..defaults
    })
}

fn parse_shape(shape: &str) -> Result<(usize, usize)> {
    let parse = |side: &str| {
        side.trim()
            .parse::<usize>()
            .map_err(|_| Error::ShapeArgumentSide {
                shape: shape.to_string(),
                side: side.to_string(),
            })
    };
    match shape.split_once(['x', 'X']) {
        Some((rows, cols)) => Ok((parse(rows)?, parse(cols)?)),
        None => Err(Error::ShapeArgument {
            shape: shape.to_string(),
        }),
    }
}

fn worked_example(rows: usize, cols: usize) -> Result<String> {
    let overflow = |quantity| BpwError::SizeOverflow {
        quantity,
        rows,
        cols,
    };
    let elements = rows
        .checked_mul(cols)
        .ok_or(overflow("the element count (rows x cols)"))?;
    let fp16_bytes = elements.checked_mul(2).ok_or(overflow("the fp16 bytes"))?;
    let mut out = format!(
        "One {rows} x {cols} matrix: {} weights, {} bytes in fp16.\n\n",
        thousands(elements),
        thousands(fp16_bytes)
    );
    out.push_str(&format!(
        "{:<44}  {:>12}  {:>14}  {:>12}  {}\n",
        "layout", "code bytes", "metadata bytes", "total bytes", "bits/weight"
    ));
    let mut costs = Vec::new();
    for (name, format) in bpw::common_layouts() {
        let cost = bpw::cost(&format, rows, cols)?;
        // Bits left-aligned so the decimal points line up.
        out.push_str(&format!(
            "{name:<44}  {:>12}  {:>14}  {:>12}  {}\n",
            thousands(cost.code_bytes),
            thousands(cost.metadata_bytes()),
            thousands(cost.total_bytes()),
            bits_text(cost.bits_per_element())
        ));
        costs.push(cost);
    }
    // The seed's comparison: 4-bit g128 with f16 scales against g32 with f16 scale and zero.
    let (low, high) = (&costs[0], &costs[3]);
    out.push('\n');
    out.push_str(&model_gap(low, high));
    Ok(out)
}

/// What the gap between two costs per weight comes to at [`MODEL_WEIGHTS`] weights.
fn model_gap(low: &Cost, high: &Cost) -> String {
    let (low_bytes, high_bytes) = (low.bytes_at(MODEL_WEIGHTS), high.bytes_at(MODEL_WEIGHTS));
    let gap = high_bytes - low_bytes;
    format!(
        "{} weights at {} vs {} bits per weight: {} vs {} bytes,\n\
         {} bytes apart = {:.2} GB (10^9 bytes) = {:.2} GiB (2^30 bytes).\n",
        thousands(MODEL_WEIGHTS as usize),
        bits_text(low.bits_per_element()),
        bits_text(high.bits_per_element()),
        thousands(low_bytes.round() as usize),
        thousands(high_bytes.round() as usize),
        thousands(gap.round() as usize),
        gap / 1e9,
        gap / f64::from(1u32 << 30),
    )
}

fn one_layout(format: &Format, rows: usize, cols: usize) -> Result<String> {
    let cost = bpw::cost(format, rows, cols)?;
    let line = |name: &str, bytes: usize| format!("  {name:<16}{:>16} B\n", thousands(bytes));
    let code_bits = 8.0 * cost.code_bytes as f64 / cost.elements as f64;
    let mut out = format!(
        "{format}\non a {rows} x {cols} matrix ({} elements):\n",
        thousands(cost.elements)
    );
    out.push_str(&line("codes", cost.code_bytes));
    out.push_str(&line("scales", cost.scale_bytes));
    out.push_str(&line("zero points", cost.zero_point_bytes));
    out.push_str(&line("g_idx", cost.g_idx_bytes));
    out.push_str(&line("extra metadata", cost.extra_bytes));
    out.push_str(&line("total", cost.total_bytes()));
    out.push_str(&format!(
        "  = {} bits per element ({} for codes, {} for metadata)\n",
        bits_text(cost.bits_per_element()),
        bits_text(code_bits),
        bits_text(cost.bits_per_element() - code_bits)
    ));
    Ok(out)
}

/// Bits with at least 3 decimals and as many more as needed, up to 7 (4.125, 5.000,
/// 4.1640625).
fn bits_text(bits: f64) -> String {
    let text = format!("{bits:.7}");
    let trimmed = text.trim_end_matches('0');
    let decimals = trimmed.len() - trimmed.find('.').map_or(trimmed.len(), |dot| dot + 1);
    format!("{bits:.*}", decimals.max(3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_text_keeps_three_decimals_and_exact_tails() {
        assert_eq!(bits_text(4.125), "4.125");
        assert_eq!(bits_text(5.0), "5.000");
        assert_eq!(bits_text(4.1640625), "4.1640625");
        assert_eq!(bits_text(6.5625), "6.5625");
    }

    #[test]
    fn shapes_parse_or_name_the_problem() {
        assert_eq!(parse_shape("4096x11008").unwrap(), (4096, 11008));
        assert_eq!(parse_shape(" 2 X 3 ").unwrap(), (2, 3));
        let err = parse_shape("4096").unwrap_err();
        assert!(
            matches!(&err, Error::ShapeArgument { shape } if shape == "4096"),
            "{err:?}"
        );
        let err = parse_shape("4096xabc").unwrap_err();
        assert!(
            matches!(&err, Error::ShapeArgumentSide { shape, side }
                if shape == "4096xabc" && side == "abc"),
            "{err:?}"
        );
    }
}
