//! `repack convert`: every integer layer of a checkpoint from one layout to another, through the
//! logical matrix, each proven bit-identical before anything is written.
//!
//! Row order: a layer's recorded `input_permutation` (written by an earlier conversion to AWQ)
//! is checked to be a permutation of its K rows and undone first, so a target with g_idx gets
//! the original rows and g_idx back and needs no permutation; a target without g_idx gets one
//! relative to the original rows.
//!
//! Refused, with nothing written: an existing output; NF4 layers or `--from nf4` (needs
//! requantization); metadata that contradicts the flags (a declared convention, bit width or
//! group size other than the one asked for: reading one GPTQ convention as the other shifts
//! every weight by a step); a layer with tensors this tool does not know; a shape that does not
//! match its format; and anything the target cannot hold exactly (zero point 0 under GPTQ v1,
//! act-order groups that cannot be made contiguous for AWQ, widths AWQ does not store).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use weights::bpw::Cost;
use weights::transcode;
use weights::{FormatError, WeightFormat};

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::layer_io::{self, INPUT_PERMUTATION, LOGICAL_SHAPE};
use crate::layers::{LayerKind, find_layers, qualified};
use crate::report::{cost_line, thousands};

/// What `repack convert` was asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvertRequest {
    pub from: WeightFormat,
    pub to: WeightFormat,
    pub group_size: usize,
    /// The checkpoint's bit width; when absent, the metadata's `bits`, else the tensor shapes.
    /// Whichever is used must agree with the shapes.
    pub bits: Option<u32>,
}

/// What happened to one layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerConversion {
    pub name: String,
    pub bits: u32,
    pub logical_shape: [usize; 2],
    pub stored_shape: [usize; 2],
    pub before: Cost,
    pub after: Cost,
    /// Whether the written rows are not in their original order (see the layer's
    /// `input_permutation`, relative to the original rows).
    pub permuted: bool,
    /// Whether the source's recorded `input_permutation` was undone and the output needs none:
    /// its rows are back in their original order, g_idx with them.
    pub restored: bool,
}

/// What `repack convert` did.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversion {
    pub from: WeightFormat,
    pub to: WeightFormat,
    pub group_size: usize,
    pub layers: Vec<LayerConversion>,
    pub passed_through: usize,
    /// The source's metadata keys written unchanged: all but the ones convert sets itself
    /// ([`OWNED_KEYS`], and each converted layer's `logical_shape` and `input_permutation`).
    pub kept_metadata: Vec<String>,
}

/// File-level metadata keys convert writes itself, replacing the source's.
pub const OWNED_KEYS: [&str; 6] = [
    "format",
    "quant_method",
    "checkpoint_format",
    "bits",
    "group_size",
    "converted_from",
];

/// Converts `input` into a new file `output`.
pub fn convert(input: &Path, output: &Path, request: ConvertRequest) -> Result<Conversion> {
    if output.exists() {
        return Err(Error::OutputExists(output.to_path_buf()));
    }
    // Before reading the file, so that a request that cannot succeed costs nothing.
    check_request(&request)?;
    let source = Checkpoint::read(input)?;
    let (target, conversion) = convert_checkpoint(&source, input, request)?;
    target.write_new(output)?;
    Ok(conversion)
}

/// Converts a checkpoint in memory: what [`convert`] writes, and what it did. `input` names
/// the source in messages.
pub fn convert_checkpoint(
    source: &Checkpoint,
    input: &Path,
    request: ConvertRequest,
) -> Result<(Checkpoint, Conversion)> {
    check_request(&request)?;
    check_metadata(&source.metadata, input, &request)?;
    let found = find_layers(source)?;
    if found.layers.is_empty() {
        return Err(Error::NoLayers(input.to_path_buf()));
    }
    if let Some(bnb) = found
        .layers
        .iter()
        .find(|l| l.kind == LayerKind::Bitsandbytes)
    {
        return Err(match bnb.quant_state() {
            Some((_, quant_type)) if quant_type != "nf4" => Error::UnsupportedQuantType {
                layer: bnb.prefix.clone(),
                quant_type: quant_type.to_string(),
            },
            _ => Error::in_layer(&bnb.prefix)(
                FormatError::NeedsRequantization {
                    to: request.to.to_string(),
                }
                .into(),
            ),
        });
    }

    let mut target = Checkpoint::default();
    for name in &found.passthrough {
        target
            .tensors
            .insert(name.clone(), source.tensors[name].clone());
    }
    let declared = layer_io::declared_bits(request.bits, &source.metadata)?;
    let mut layers = Vec::new();
    for layer in &found.layers {
        let logical = layer_io::logical_shape(&source.metadata, &layer.prefix)?;
        let packed = layer_io::read_integer_layer(
            layer,
            request.from,
            declared,
            request.group_size,
            logical,
        )?;
        let recorded = layer_io::input_permutation(
            &source.metadata,
            &layer.prefix,
            packed.logical_shape()[0],
        )?;
        let repacked = transcode::transcode_recorded(&packed, recorded.as_deref(), request.to)
            .map_err(Error::in_layer(&layer.prefix))?;
        let stored_shape = layer_io::stored_shape(&repacked.layer);
        let logical_shape = repacked.layer.logical_shape();
        if stored_shape != logical_shape {
            target.metadata.insert(
                qualified(&layer.prefix, LOGICAL_SHAPE),
                format!("[{}, {}]", logical_shape[0], logical_shape[1]),
            );
        }
        if let Some(permutation) = &repacked.input_permutation {
            target.metadata.insert(
                qualified(&layer.prefix, INPUT_PERMUTATION),
                serde_json::to_string(permutation).expect("a list of numbers"),
            );
        }
        target
            .tensors
            .extend(layer_io::layer_tensors(&layer.prefix, &repacked.layer));
        layers.push(LayerConversion {
            name: layer.prefix.clone(),
            bits: packed.bits(),
            logical_shape,
            stored_shape,
            before: packed.storage(),
            after: repacked.layer.storage(),
            permuted: repacked.input_permutation.is_some(),
            restored: repacked.rows_restored,
        });
    }
    target.metadata.extend(output_metadata(&request, &layers));
    // Everything else the source says about itself travels unchanged (its library, versions,
    // quantization settings); what convert owns was rewritten above.
    let owned = |key: &str| {
        OWNED_KEYS.contains(&key)
            || found.layers.iter().any(|layer| {
                [LOGICAL_SHAPE, INPUT_PERMUTATION]
                    .iter()
                    .any(|name| key == qualified(&layer.prefix, name))
            })
    };
    let kept_metadata: Vec<String> = source
        .metadata
        .keys()
        .filter(|key| !owned(key))
        .cloned()
        .collect();
    for key in &kept_metadata {
        target
            .metadata
            .insert(key.clone(), source.metadata[key].clone());
    }
    let conversion = Conversion {
        from: request.from,
        to: request.to,
        group_size: request.group_size,
        layers,
        passed_through: found.passthrough.len(),
        kept_metadata,
    };
    Ok((target, conversion))
}

/// One [`convert_checkpoint`] call spelled as bytes, so that a single byte string (a fuzz
/// input, or a regression file kept from one) is a complete call: byte 0 picks `--from` and
/// byte 1 `--to` (modulo the number of formats, in [`WeightFormat::ALL`] order), bytes 2..4
/// are `--group-size` (little-endian u16), byte 4 is `--bits` (0 for none), and the rest is the
/// safetensors file; the converted checkpoint is then laid out as `convert` would write it.
/// Input shorter than 5 bytes is zero-padded.
pub fn convert_case(data: &[u8]) -> Result<Conversion> {
    let mut head = [0u8; 5];
    let split = data.len().min(5);
    head[..split].copy_from_slice(&data[..split]);
    let format = |byte: u8| WeightFormat::ALL[usize::from(byte) % WeightFormat::ALL.len()];
    let request = ConvertRequest {
        from: format(head[0]),
        to: format(head[1]),
        group_size: usize::from(u16::from_le_bytes([head[2], head[3]])),
        bits: (head[4] != 0).then_some(u32::from(head[4])),
    };
    let input = Path::new("fuzz input");
    let source = Checkpoint::from_bytes(&data[split..]).map_err(|source| Error::SafeTensors {
        path: input.to_path_buf(),
        source,
    })?;
    let (target, conversion) = convert_checkpoint(&source, input, request)?;
    target.to_bytes().map_err(|source| Error::Serialize {
        path: input.to_path_buf(),
        source,
    })?;
    Ok(conversion)
}

fn check_request(request: &ConvertRequest) -> Result<()> {
    if request.from == WeightFormat::Nf4 {
        return Err(FormatError::NeedsRequantization {
            to: request.to.to_string(),
        }
        .into());
    }
    for (format, action) in [(request.from, "read"), (request.to, "written")] {
        if !matches!(
            format,
            WeightFormat::Gptq | WeightFormat::GptqV2 | WeightFormat::Awq
        ) {
            return Err(Error::UnsupportedFormat {
                format,
                action,
                hint: "convert works on gptq, gptq_v2 and awq checkpoints; use quantize and \
                       dequantize for q4_0, q8_0 and nf4",
            });
        }
    }
    if request.group_size == 0 {
        return Err(FormatError::ZeroGroupSize.into());
    }
    Ok(())
}

/// Refuses flags that contradict what the file says about itself.
fn check_metadata(
    metadata: &BTreeMap<String, String>,
    path: &Path,
    request: &ConvertRequest,
) -> Result<()> {
    let conflict = |key: &str, file: String, flag: String, why| Error::MetadataConflict {
        path: path.to_path_buf(),
        key: key.to_string(),
        file,
        flag,
        why,
    };
    if let Some((key, declared)) = layer_io::declared_format(metadata)?
        && declared != request.from
    {
        return Err(conflict(
            &key,
            declared.to_string(),
            format!("--from {}", request.from),
            "reading one layout or zero-point convention as another shifts or scrambles every weight",
        ));
    }
    // AutoGPTQ writes group_size -1 for one group spanning K; the shapes check that one instead.
    let one_group = metadata.get("group_size").map(|g| g.trim()) == Some("-1");
    let recorded = if one_group {
        None
    } else {
        layer_io::metadata_number(metadata, "group_size")?
    };
    if let Some(group_size) = recorded
        && group_size != request.group_size
    {
        return Err(conflict(
            "group_size",
            group_size.to_string(),
            format!("--group-size {}", request.group_size),
            "changing the group size would need requantization",
        ));
    }
    if let (Some(bits), Some(requested)) =
        (layer_io::metadata_number(metadata, "bits")?, request.bits)
        && bits != requested as usize
    {
        return Err(conflict(
            "bits",
            bits.to_string(),
            format!("--bits {requested}"),
            "the codes cannot be read at another width",
        ));
    }
    Ok(())
}

fn output_metadata(
    request: &ConvertRequest,
    layers: &[LayerConversion],
) -> BTreeMap<String, String> {
    let quant_method = match request.to {
        WeightFormat::Awq => "awq",
        _ => "gptq",
    };
    let mut metadata: BTreeMap<String, String> = [
        ("format", "pt".to_string()),
        ("quant_method", quant_method.to_string()),
        ("checkpoint_format", request.to.to_string()),
        ("group_size", request.group_size.to_string()),
        ("converted_from", request.from.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Some(first) = layers.first()
        && layers.iter().all(|l| l.bits == first.bits)
    {
        metadata.insert("bits".into(), first.bits.to_string());
    }
    metadata
}

impl fmt::Display for Conversion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self.from.name().len().max(self.to.name().len());
        for layer in &self.layers {
            let [k, n] = layer.logical_shape;
            let name = if layer.name.is_empty() {
                "(unprefixed)"
            } else {
                &layer.name
            };
            writeln!(
                f,
                "layer {name}: K={k} N={n}, {}-bit, group {}",
                layer.bits, self.group_size
            )?;
            writeln!(
                f,
                "  before {:width$}  {}",
                self.from.name(),
                cost_line(&layer.before)
            )?;
            writeln!(
                f,
                "  after  {:width$}  {}",
                self.to.name(),
                cost_line(&layer.after)
            )?;
            if layer.stored_shape != layer.logical_shape {
                let [pk, pn] = layer.stored_shape;
                writeln!(
                    f,
                    "  padded to K={pk} N={pn} with zero weights; logical size recorded"
                )?;
            }
            if layer.restored {
                writeln!(
                    f,
                    "  rows put back in their original order from the recorded `{}`, g_idx with them: no input permutation needed",
                    qualified(&layer.name, INPUT_PERMUTATION)
                )?;
            }
            if layer.permuted {
                writeln!(
                    f,
                    "  rows reordered into contiguous groups: permute the input activations by `{}`",
                    qualified(&layer.name, INPUT_PERMUTATION)
                )?;
            }
        }
        if !self.kept_metadata.is_empty() {
            writeln!(
                f,
                "metadata copied unchanged: {}",
                self.kept_metadata.join(", ")
            )?;
        }
        write!(
            f,
            "{} layer(s) converted {} -> {}, every weight verified bit-identical; {} other tensor(s) copied unchanged",
            self.layers.len(),
            self.from,
            self.to,
            thousands(self.passed_through)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weights::transcode::TranscodeError;

    #[test]
    fn refuses_nf4_sources_with_the_requantization_explanation() {
        let request = ConvertRequest {
            from: WeightFormat::Nf4,
            to: WeightFormat::Gptq,
            group_size: 64,
            bits: None,
        };
        let err = check_request(&request).unwrap_err().to_string();
        assert!(
            err.starts_with("converting NF4 to gptq needs requantization"),
            "{err}"
        );
    }

    #[test]
    fn refuses_block_formats_as_convert_targets() {
        let request = ConvertRequest {
            from: WeightFormat::Gptq,
            to: WeightFormat::Q4_0,
            group_size: 32,
            bits: None,
        };
        assert_eq!(
            check_request(&request).unwrap_err().to_string(),
            "q4_0 cannot be written by this command; convert works on gptq, gptq_v2 and awq \
             checkpoints; use quantize and dequantize for q4_0, q8_0 and nf4"
        );
    }

    #[test]
    fn a_declared_convention_that_contradicts_from_is_refused() {
        let metadata: BTreeMap<String, String> = [("format".to_string(), "gptq_v2".to_string())]
            .into_iter()
            .collect();
        let request = ConvertRequest {
            from: WeightFormat::Gptq,
            to: WeightFormat::Awq,
            group_size: 32,
            bits: None,
        };
        assert_eq!(
            check_metadata(&metadata, Path::new("in.safetensors"), &request)
                .unwrap_err()
                .to_string(),
            "in.safetensors: its metadata says format = \"gptq_v2\", but --from gptq was given; \
             reading one layout or zero-point convention as another shifts or scrambles every weight"
        );
    }

    #[test]
    fn layer_error_unwraps_to_the_codec_message() {
        let err = Error::in_layer("proj")(TranscodeError::UnsupportedTarget(WeightFormat::Nf4));
        assert!(
            err.to_string()
                .starts_with("layer \"proj\": repack writes gptq")
        );
    }
}
