//! `repack layer-error`: MiniLM's real linear layers quantized with each weight format, and the
//! matmul error that costs on MiniLM's own activations.
//!
//! For each chosen encoder layer and each of its six linear layers (query, key, value,
//! attention output, FFN up, FFN down), W [out, in] is quantized with every [`Scheme`], stored
//! in its layout, read back, and compared on the layer's real input x [tokens, in] (what the
//! forward pass fed it for the text): relative error ||x Wq^T - x W^T||_F / ||x W^T||_F, bias
//! excluded (it cancels in the difference), every product and sum in f64 so the figure is the
//! weights' error, not f32 accumulation noise. Bits per weight are each layout's stored bytes
//! (codes, scales, zero points, g_idx) from its `storage()` [`Cost`], summed over the matrices.
//!
//! GPTQ and AWQ rows use round-to-nearest codes with min-max zero points ([`weights::rtn`]),
//! not the GPTQ algorithm's error feedback nor AWQ's activation-aware scaling: they measure the
//! layouts' resolution. GGUF and NF4 rows use their formats' own reference quantizers.

use std::fmt::Write as _;

use clap::Args;
use models::bert::{Linear, MiniLm, ModelError};
use models::files::FilesError;
use models::{ModelFiles, ModelName};
use ndarray::{Array2, ArrayView2};
use thiserror::Error;
use weights::bpw::Cost;
use weights::gguf::{self, BlockQ4_0, BlockQ8_0, q4_1};
use weights::gptq::{self, ZeroConvention};
use weights::{FormatError, awq, nf4, rtn};

/// The text whose activations are used unless `--text` says otherwise.
pub const REFERENCE_TEXT: &str = "The quick brown fox jumps over the lazy dog.";

/// Group size (rows of K = in-features per scale) of the GPTQ and AWQ rows.
pub const GROUP_SIZE: usize = 128;

/// The flags of `repack layer-error`.
#[derive(Args, Debug, Clone)]
pub struct LayerErrorArgs {
    /// Encoder layers to measure, comma-separated [default: all].
    #[arg(long, value_delimiter = ',', value_name = "L,L,..")]
    pub layers: Option<Vec<usize>>,
    /// The text whose activations are the layers' inputs.
    #[arg(long, default_value = REFERENCE_TEXT)]
    pub text: String,
}

/// Why the measurement cannot run.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LayerErrorError {
    /// The model's files are missing (the message names `scripts/fetch-models`) or wrong.
    #[error(transparent)]
    Files(#[from] FilesError),
    /// The model cannot be loaded or run on the text.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A layer number past the model's last layer.
    #[error("layer {layer} does not exist: MiniLM has layers 0..{count}")]
    NoSuchLayer {
        /// The layer asked for.
        layer: usize,
        /// How many layers the model has.
        count: usize,
    },
    /// `--layers` named no layer.
    #[error("no layers to measure")]
    NoLayers,
    /// A format refused a matrix.
    #[error("{scheme} cannot quantize layer {layer} {linear}")]
    Format {
        /// The format.
        scheme: Scheme,
        /// The encoder layer.
        layer: usize,
        /// The linear layer's name.
        linear: &'static str,
        /// Why (boxed: the error would otherwise be most of this enum's size).
        source: Box<FormatError>,
    },
}

/// One way to store a weight matrix: a layout with the quantizer that fills it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// GPTQ (AutoGPTQ layout, `gptq_v2` zero points) at `bits`, RTN codes, groups of
    /// [`GROUP_SIZE`] along K, g_idx stored.
    Gptq {
        /// 4 or 8 here (the layout holds 2, 3, 4, 8).
        bits: u32,
    },
    /// AWQ GEMM layout, 4-bit, RTN codes, groups of [`GROUP_SIZE`] along K.
    Awq,
    /// GGUF Q4_0, ggml's quantizer, blocks of 32 along each row of [out, in].
    Q4_0,
    /// GGUF Q4_1, ggml's quantizer.
    Q4_1,
    /// GGUF Q8_0, ggml's quantizer.
    Q8_0,
    /// bitsandbytes NF4, its quantizer, absmax blocks of 64 over the flattened [out, in].
    Nf4,
}

impl Scheme {
    /// Every scheme, in the table's order.
    pub const ALL: [Scheme; 7] = [
        Scheme::Gptq { bits: 4 },
        Scheme::Awq,
        Scheme::Q4_0,
        Scheme::Q4_1,
        Scheme::Nf4,
        Scheme::Gptq { bits: 8 },
        Scheme::Q8_0,
    ];

    /// The table's row label, with the group or block size.
    pub fn label(self) -> String {
        match self {
            Scheme::Gptq { bits } => format!("GPTQ {bits}-bit g{GROUP_SIZE} (RTN)"),
            Scheme::Awq => format!("AWQ 4-bit g{GROUP_SIZE} (RTN)"),
            Scheme::Q4_0 => "GGUF Q4_0 (block 32)".into(),
            Scheme::Q4_1 => "GGUF Q4_1 (block 32)".into(),
            Scheme::Q8_0 => "GGUF Q8_0 (block 32)".into(),
            Scheme::Nf4 => format!("NF4 (block {})", nf4::DEFAULT_BLOCK_SIZE),
        }
    }

    /// Code width.
    pub fn bits(self) -> u32 {
        match self {
            Scheme::Gptq { bits } => bits,
            Scheme::Q8_0 => 8,
            Scheme::Awq | Scheme::Q4_0 | Scheme::Q4_1 | Scheme::Nf4 => 4,
        }
    }

    /// Quantizes `w` [out, in], stores it in the layout and reads it back: the weights a reader
    /// of the layout computes, [out, in], and what the layout stores.
    pub fn round_trip(self, w: ArrayView2<f32>) -> Result<(Array2<f32>, Cost), FormatError> {
        let (rows, cols) = w.dim();
        let row_major = w.as_standard_layout();
        let flat = row_major.as_slice().expect("standard layout");
        let back = |values: Vec<f32>| {
            Array2::from_shape_vec((rows, cols), values).expect("one value per weight")
        };
        Ok(match self {
            Scheme::Gptq { bits } => {
                // The logical matrix is [K = in, N = out].
                let logical = rtn::quantize(w.t(), bits, GROUP_SIZE)?;
                let layer = gptq::pack(&logical, ZeroConvention::V2)?;
                let read = gptq::unpack(&layer)?;
                (read.dequantize().reversed_axes(), layer.storage())
            }
            Scheme::Awq => {
                let logical = rtn::quantize(w.t(), 4, GROUP_SIZE)?;
                let layer = awq::pack(&logical)?;
                let read = awq::unpack(&layer)?;
                (read.dequantize().reversed_axes(), layer.storage())
            }
            Scheme::Q4_0 => {
                let blocks = gguf::quantize::<BlockQ4_0>(flat, cols)?;
                let cost = gguf::storage::<BlockQ4_0>(blocks.len());
                (back(gguf::dequantize(&blocks)), cost)
            }
            Scheme::Q8_0 => {
                let blocks = gguf::quantize::<BlockQ8_0>(flat, cols)?;
                let cost = gguf::storage::<BlockQ8_0>(blocks.len());
                (back(gguf::dequantize(&blocks)), cost)
            }
            Scheme::Q4_1 => {
                let blocks = q4_1::quantize(flat, cols)?;
                (back(q4_1::dequantize(&blocks)), q4_1::storage(blocks.len()))
            }
            Scheme::Nf4 => {
                let tensor = nf4::quantize(w, nf4::DEFAULT_BLOCK_SIZE)?;
                (tensor.dequantize()?, tensor.storage())
            }
        })
    }
}

impl std::fmt::Display for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label())
    }
}

/// ||x Wq^T - x W^T||_F / ||x W^T||_F for x [tokens, in] and weights [out, in], in f64 (0 when
/// x W^T is 0 and so is the difference; infinite when only x W^T is 0).
pub fn relative_error(x: ArrayView2<f32>, w: ArrayView2<f32>, wq: ArrayView2<f32>) -> f64 {
    let (mut diff, mut reference) = (0f64, 0f64);
    for row in x.rows() {
        for (w_row, wq_row) in w.rows().into_iter().zip(wq.rows()) {
            let (mut y, mut d) = (0f64, 0f64);
            for ((&xi, &wi), &qi) in row.iter().zip(w_row).zip(wq_row) {
                y += f64::from(xi) * f64::from(wi);
                d += f64::from(xi) * (f64::from(qi) - f64::from(wi));
            }
            reference += y * y;
            diff += d * d;
        }
    }
    if diff == 0.0 {
        0.0
    } else {
        (diff / reference).sqrt()
    }
}

/// One matrix under one scheme.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// Encoder layer.
    pub layer: usize,
    /// Which linear layer.
    pub linear: Linear,
    /// The format.
    pub scheme: Scheme,
    /// [`relative_error`] on the layer's real input.
    pub relative_error: f64,
    /// What the layout stores for this matrix.
    pub cost: Cost,
}

/// Every measurement of one run, and what it ran on.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerErrorReport {
    /// The text.
    pub text: String,
    /// Its tokens (`[CLS]` and `[SEP]` included): the rows of every x.
    pub tokens: usize,
    /// The encoder layers measured, in order.
    pub layers: Vec<usize>,
    /// One per layer, linear layer and scheme, in that nesting order.
    pub measurements: Vec<Measurement>,
}

/// Mean, max and bits per weight of a set of measurements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Mean relative error.
    pub mean: f64,
    /// Largest relative error.
    pub max: f64,
    /// 8 * stored bytes / weights, over the matrices together.
    pub bits_per_weight: f64,
}

impl LayerErrorReport {
    /// The summary of `scheme` over the measurements `keep` selects; `None` if it selects none.
    pub fn summary(&self, scheme: Scheme, keep: impl Fn(&Measurement) -> bool) -> Option<Summary> {
        let chosen: Vec<&Measurement> = self
            .measurements
            .iter()
            .filter(|m| m.scheme == scheme && keep(m))
            .collect();
        if chosen.is_empty() {
            return None;
        }
        let mean = chosen.iter().map(|m| m.relative_error).sum::<f64>() / chosen.len() as f64;
        let max = chosen.iter().map(|m| m.relative_error).fold(0f64, f64::max);
        let bytes: usize = chosen.iter().map(|m| m.cost.total_bytes()).sum();
        let weights: usize = chosen.iter().map(|m| m.cost.elements).sum();
        Some(Summary {
            mean,
            max,
            bits_per_weight: 8.0 * bytes as f64 / weights as f64,
        })
    }

    /// The markdown tables: every scheme over all matrices, then the mean per linear type.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let layers: Vec<String> = self.layers.iter().map(|l| l.to_string()).collect();
        let matrices = self.layers.len() * Linear::ALL.len();
        let _ = writeln!(
            out,
            "MiniLM (all-MiniLM-L6-v2) layers {} x 6 linear layers = {matrices} matrices; \
             x = each layer's real input for {:?} ({} tokens).",
            layers.join(","),
            self.text,
            self.tokens
        );
        let _ = writeln!(
            out,
            "Relative error ||x Wq^T - x W^T||_F / ||x W^T||_F, bias excluded, in f64. \
             GPTQ/AWQ rows: round-to-nearest codes with min-max zero points per group of \
             {GROUP_SIZE} in-features, not the GPTQ algorithm nor AWQ's activation-aware \
             scaling; GPTQ and AWQ hold the same codes, so their errors are equal and only \
             their bits differ (GPTQ stores g_idx). Bits/weight: stored bytes (codes, scales, \
             zeros, g_idx) * 8 / weights."
        );
        out.push('\n');
        out.push_str(
            "| format | bits/weight | mean rel. error | max rel. error |\n|---|---:|---:|---:|\n",
        );
        for scheme in Scheme::ALL {
            if let Some(s) = self.summary(scheme, |_| true) {
                let _ = writeln!(
                    out,
                    "| {} | {:.3} | {} | {} |",
                    scheme.label(),
                    s.bits_per_weight,
                    percent(s.mean),
                    percent(s.max)
                );
            }
        }
        out.push_str("\nMean relative error per linear type:\n\n| format |");
        for linear in Linear::ALL {
            let _ = write!(out, " {} |", linear.name());
        }
        out.push_str("\n|---|");
        out.push_str(&"---:|".repeat(Linear::ALL.len()));
        out.push('\n');
        for scheme in Scheme::ALL {
            let _ = write!(out, "| {} |", scheme.label());
            for linear in Linear::ALL {
                match self.summary(scheme, |m| m.linear == linear) {
                    Some(s) => {
                        let _ = write!(out, " {} |", percent(s.mean));
                    }
                    None => out.push_str(" - |"),
                }
            }
            out.push('\n');
        }
        out
    }
}

fn percent(x: f64) -> String {
    format!("{:.3}%", 100.0 * x)
}

/// Runs `model` on `text` and measures every scheme on the six linear layers of each of
/// `layers` (all layers when `None`).
pub fn measure(
    model: &MiniLm,
    layers: Option<&[usize]>,
    text: &str,
) -> Result<LayerErrorReport, LayerErrorError> {
    let count = model.bert().config().num_hidden_layers;
    let layers: Vec<usize> = match layers {
        None => (0..count).collect(),
        Some(chosen) => {
            let mut chosen = chosen.to_vec();
            chosen.sort_unstable();
            chosen.dedup();
            chosen
        }
    };
    if layers.is_empty() {
        return Err(LayerErrorError::NoLayers);
    }
    if let Some(&layer) = layers.iter().find(|&&l| l >= count) {
        return Err(LayerErrorError::NoSuchLayer { layer, count });
    }
    let ids = model.tokenizer().encode(text);
    // Keep only the inputs asked for: FFN inputs are [tokens, 1536] per layer.
    let mut inputs: Vec<(usize, Linear, Array2<f32>)> = Vec::new();
    model.bert().forward_with(&ids, |layer, linear, x| {
        if layers.contains(&layer) {
            inputs.push((layer, linear, x.to_owned()));
        }
    })?;
    let mut measurements = Vec::with_capacity(inputs.len() * Scheme::ALL.len());
    for (layer, linear, x) in &inputs {
        let (w, _bias) =
            model
                .bert()
                .linear(*layer, *linear)
                .ok_or(LayerErrorError::NoSuchLayer {
                    layer: *layer,
                    count,
                })?;
        for scheme in Scheme::ALL {
            let (wq, cost) = scheme
                .round_trip(w)
                .map_err(|source| LayerErrorError::Format {
                    scheme,
                    layer: *layer,
                    linear: linear.name(),
                    source: Box::new(source),
                })?;
            measurements.push(Measurement {
                layer: *layer,
                linear: *linear,
                scheme,
                relative_error: relative_error(x.view(), w, wq.view()),
                cost,
            });
        }
    }
    Ok(LayerErrorReport {
        text: text.to_string(),
        tokens: ids.len(),
        layers,
        measurements,
    })
}

/// The command: finds MiniLM in the model cache (never downloads it; a missing model is an
/// error naming `scripts/fetch-models`), measures, and returns the tables.
pub fn run(args: &LayerErrorArgs) -> Result<String, LayerErrorError> {
    let files = ModelFiles::locate(ModelName::MiniLm)?;
    let model = MiniLm::load(&files)?;
    Ok(measure(&model, args.layers.as_deref(), &args.text)?.table())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic [out, in] matrix with a few outliers, like trained weights.
    fn matrix(rows: usize, cols: usize) -> Array2<f32> {
        Array2::from_shape_fn((rows, cols), |(r, c)| {
            let v = ((r * 131 + c * 17) as f32 * 0.37).sin() * 0.05;
            if (r + c) % 97 == 0 { v * 8.0 } else { v }
        })
    }

    #[test]
    fn every_scheme_gives_back_the_matrix_in_its_own_orientation() {
        // out = 64 != in = 256, so a transposed result could not even be compared.
        let w = matrix(64, 256);
        let spread = w.iter().map(|v| v.abs()).fold(0f32, f32::max);
        for scheme in Scheme::ALL {
            let (wq, cost) = scheme.round_trip(w.view()).unwrap();
            assert_eq!(wq.dim(), w.dim(), "{scheme}");
            assert_eq!(cost.elements, 64 * 256, "{scheme}");
            let worst = w
                .iter()
                .zip(&wq)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            // Far below the matrix's spread: a transposed or shuffled result would be of its
            // size.
            assert!(worst < spread / 4.0, "{scheme}: {worst} vs {spread}");
        }
    }

    #[test]
    fn relative_error_is_the_frobenius_ratio_of_the_products() {
        let x = ndarray::array![[1.0f32, 0.0], [0.0, 2.0]];
        let w = ndarray::array![[1.0f32, 0.0], [0.0, 1.0]];
        // x W^T = x, norm sqrt(5); the difference puts 0.5 on y[1][1] only... times x[1][1] = 2.
        let wq = ndarray::array![[1.0f32, 0.0], [0.0, 1.5]];
        let expected = 1.0 / 5f64.sqrt();
        assert!((relative_error(x.view(), w.view(), wq.view()) - expected).abs() < 1e-15);
        assert_eq!(relative_error(x.view(), w.view(), w.view()), 0.0);
    }

    #[test]
    fn eight_bits_beat_four_bits_on_a_synthetic_layer_and_bits_per_weight_are_the_layouts() {
        let w = matrix(128, 256);
        let x = Array2::from_shape_fn((5, 256), |(t, c)| ((t * 7 + c) as f32 * 0.11).cos());
        let error = |scheme: Scheme| {
            let (wq, cost) = scheme.round_trip(w.view()).unwrap();
            (relative_error(x.view(), w.view(), wq.view()), cost)
        };
        let (q8, q8_cost) = error(Scheme::Q8_0);
        let (gptq8, _) = error(Scheme::Gptq { bits: 8 });
        for four in [
            Scheme::Gptq { bits: 4 },
            Scheme::Awq,
            Scheme::Q4_0,
            Scheme::Nf4,
        ] {
            let (e, _) = error(four);
            assert!(q8 < e && gptq8 < e, "{four}: {e} vs {q8}, {gptq8}");
        }
        // Q8_0: 34 bytes per 32 weights.
        assert_eq!(q8_cost.bits_per_element(), 8.5);
    }
}
