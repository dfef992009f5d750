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
use crate::files::{read_checkpoint, write_checkpoint};
use crate::layer_io;
use crate::layers::{LayerKind, find_layers};
use crate::metadata::{self, INPUT_PERMUTATION, LOGICAL_SHAPE};
use crate::names::{layer_name, qualified};
use crate::report::{cost_line, thousands};

/// What `repack convert` was asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvertRequest {
    /// The checkpoint's layout and zero-point convention (`--from`).
    pub from: WeightFormat,
    /// The layout to write (`--to`).
    pub to: WeightFormat,
    /// The checkpoint's group size, kept (`--group-size`).
    pub group_size: usize,
    /// The checkpoint's bit width; when absent, the metadata's `bits`, else the tensor shapes.
    /// Whichever is used must agree with the shapes.
    pub bits: Option<u32>,
}

/// What happened to one layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerConversion {
    /// The layer's prefix.
    pub name: String,
    /// Its code width.
    pub bits: u32,
    /// Its logical [K, N].
    pub logical_shape: [usize; 2],
    /// The [K, N] the written tensors store (padded).
    pub stored_shape: [usize; 2],
    /// What the source's tensors cost.
    pub before: Cost,
    /// What the written tensors cost.
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
    /// The source's layout.
    pub from: WeightFormat,
    /// The layout written.
    pub to: WeightFormat,
    /// The group size, kept.
    pub group_size: usize,
    /// Each converted layer, in file order.
    pub layers: Vec<LayerConversion>,
    /// How many tensors were copied unchanged.
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
    let source = read_checkpoint(input)?;
    let (target, conversion) = convert_checkpoint(&source, input, request)?;
    write_checkpoint(&target, output)?;
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
                FormatError::NeedsRequantization { to: request.to }.into(),
            ),
        });
    }

    let mut target = Checkpoint::default();
    for name in &found.passthrough {
        target
            .tensors
            .insert(name.clone(), source.tensors[name].clone());
    }
    let declared = metadata::declared_bits(request.bits, &source.metadata)?;
    let mut layers = Vec::new();
    for layer in &found.layers {
        let logical = metadata::logical_shape(&source.metadata, &layer.prefix)?;
        let packed = layer_io::read_integer_layer(
            layer,
            request.from,
            declared,
            request.group_size,
            logical,
        )?;
        let recorded = metadata::input_permutation(
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
        return Err(FormatError::NeedsRequantization { to: request.to }.into());
    }
    for (format, action) in [(request.from, "read"), (request.to, "written")] {
        if !format.is_integer() {
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
    if let Some((key, declared)) = metadata::declared_format(metadata)?
        && declared != request.from
    {
        return Err(Error::DeclaredFormatConflict {
            path: path.to_path_buf(),
            key,
            declared,
            from: request.from,
        });
    }
    // AutoGPTQ writes group_size -1 for one group spanning K; the shapes check that one instead.
    if let Some(recorded) = metadata::recorded_group_size(metadata)?
        && recorded != request.group_size
    {
        return Err(Error::GroupSizeConflict {
            path: path.to_path_buf(),
            recorded,
            flag: request.group_size,
        });
    }
    if let (Some(recorded), Some(flag)) =
        (metadata::metadata_number(metadata, "bits")?, request.bits)
        && recorded != flag as usize
    {
        return Err(Error::BitsFlagConflict {
            path: path.to_path_buf(),
            recorded,
            flag,
        });
    }
    Ok(())
}

/// The `quant_method` a layout is written under, for the integer layouts.
fn quant_method(format: WeightFormat) -> Option<&'static str> {
    match format {
        WeightFormat::Gptq | WeightFormat::GptqV2 => Some("gptq"),
        WeightFormat::Awq => Some("awq"),
        WeightFormat::Q4_0 | WeightFormat::Q8_0 | WeightFormat::Nf4 => None,
    }
}

fn output_metadata(
    request: &ConvertRequest,
    layers: &[LayerConversion],
) -> BTreeMap<String, String> {
    let mut metadata: BTreeMap<String, String> = [
        ("format", "pt".to_string()),
        ("checkpoint_format", request.to.to_string()),
        ("group_size", request.group_size.to_string()),
        ("converted_from", request.from.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Some(method) = quant_method(request.to) {
        metadata.insert("quant_method".into(), method.into());
    }
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
            let name = layer_name(&layer.name);
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

    fn request(from: WeightFormat, to: WeightFormat) -> ConvertRequest {
        ConvertRequest {
            from,
            to,
            group_size: 32,
            bits: None,
        }
    }

    #[test]
    fn refuses_nf4_sources_as_needing_requantization() {
        let err = check_request(&request(WeightFormat::Nf4, WeightFormat::Gptq)).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Format(FormatError::NeedsRequantization {
                    to: WeightFormat::Gptq
                })
            ),
            "{err:?}"
        );
    }

    #[test]
    fn refuses_block_formats_on_either_side() {
        for (from, to, refused, action) in [
            (
                WeightFormat::Gptq,
                WeightFormat::Q4_0,
                WeightFormat::Q4_0,
                "written",
            ),
            (
                WeightFormat::Q8_0,
                WeightFormat::Awq,
                WeightFormat::Q8_0,
                "read",
            ),
        ] {
            let err = check_request(&request(from, to)).unwrap_err();
            assert!(
                matches!(err, Error::UnsupportedFormat { format, action: a, .. }
                    if format == refused && a == action),
                "{err:?}"
            );
        }
        let zero = ConvertRequest {
            group_size: 0,
            ..request(WeightFormat::Gptq, WeightFormat::Awq)
        };
        assert!(matches!(
            check_request(&zero),
            Err(Error::Format(FormatError::ZeroGroupSize))
        ));
    }

    #[test]
    fn flags_the_metadata_contradicts_are_refused() {
        let metadata = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let path = Path::new("in.safetensors");
        let gptq_to_awq = request(WeightFormat::Gptq, WeightFormat::Awq);
        let err =
            check_metadata(&metadata(&[("format", "gptq_v2")]), path, &gptq_to_awq).unwrap_err();
        assert!(
            matches!(
                err,
                Error::DeclaredFormatConflict {
                    key: "format",
                    declared: WeightFormat::GptqV2,
                    from: WeightFormat::Gptq,
                    ..
                }
            ),
            "{err:?}"
        );
        let err =
            check_metadata(&metadata(&[("group_size", "64")]), path, &gptq_to_awq).unwrap_err();
        assert!(
            matches!(
                err,
                Error::GroupSizeConflict {
                    recorded: 64,
                    flag: 32,
                    ..
                }
            ),
            "{err:?}"
        );
        // AutoGPTQ's -1 (one group over K) leaves the group size to the shapes.
        assert!(check_metadata(&metadata(&[("group_size", "-1")]), path, &gptq_to_awq).is_ok());
        let with_bits = ConvertRequest {
            bits: Some(8),
            ..gptq_to_awq
        };
        let err = check_metadata(&metadata(&[("bits", "4")]), path, &with_bits).unwrap_err();
        assert!(
            matches!(
                err,
                Error::BitsFlagConflict {
                    recorded: 4,
                    flag: 8,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn quant_method_is_written_for_each_integer_target() {
        for (to, method) in [
            (WeightFormat::Gptq, "gptq"),
            (WeightFormat::GptqV2, "gptq"),
            (WeightFormat::Awq, "awq"),
        ] {
            let written = output_metadata(&request(WeightFormat::Gptq, to), &[]);
            assert_eq!(written["quant_method"], method, "{to}");
            assert_eq!(written["checkpoint_format"], to.name());
        }
    }
}
