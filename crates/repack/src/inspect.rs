//! `repack inspect`: what each tensor of a checkpoint (safetensors) or GGUF file is, how it is laid out, and what it costs
//! in effective bits per weight; each quantized layer is also unpacked, when its layout and
//! zero-point convention are known, to check that its shapes and fields are what the format
//! allows.

use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;
use weights::WeightFormat;
use weights::bpw::Cost;
use weights::nf4::{NF4_LEVELS, Nf4Tensor};

use crate::checkpoint::{Checkpoint, Tensor};
use crate::error::{Error, Result, with_causes};
use crate::files::read_input;
use crate::layer_io;
use crate::layers::{Layer, LayerKind, find_layers};
use crate::metadata;
use crate::names::layer_name;
use crate::report::{cost_line, thousands};
use weights::gguf;

/// What `repack inspect FILE` found: the report it prints, and the layers whose check failed
/// (the command then exits non-zero).
#[derive(Debug, Clone, PartialEq)]
pub struct Inspection {
    /// What `repack inspect` prints.
    pub report: String,
    /// Each failed layer's name and why, in file order.
    pub failures: Vec<(String, String)>,
}

/// Inspects a checkpoint: its report, and which layers failed their check.
pub fn inspect(path: &Path) -> Result<Inspection> {
    let bytes = read_input(path)?;
    if bytes.starts_with(b"GGUF") {
        return inspect_gguf(path, &bytes);
    }
    let ckpt = Checkpoint::from_bytes(&bytes).map_err(|source| Error::SafeTensors {
        path: path.to_path_buf(),
        source,
    })?;
    inspect_checkpoint(&path.display().to_string(), &ckpt)
}

/// Inspects a GGUF file: its metadata, then each tensor's name, type, shape (`[rows, cols]`,
/// slowest axis first, and ggml's own order), bytes and effective bits per weight.
pub fn inspect_gguf(path: &Path, bytes: &[u8]) -> Result<Inspection> {
    let file = gguf_file::GgufFile::parse(bytes).map_err(|source| Error::Gguf {
        path: path.to_path_buf(),
        source,
    })?;
    let mut out = String::new();
    writeln!(
        out,
        "{}: GGUF v{}, {} tensor{}",
        path.display(),
        file.version(),
        file.tensors().len(),
        if file.tensors().len() == 1 { "" } else { "s" }
    )
    .unwrap();
    if !file.metadata().is_empty() {
        let pairs: Vec<String> = file
            .metadata()
            .iter()
            .map(|(k, v)| format!("{k}={}", shortened(&gguf_value(v), 60)))
            .collect();
        writeln!(out, "metadata: {}", pairs.join(", ")).unwrap();
    }
    for t in file.tensors() {
        let shape: Vec<u64> = t.dims.iter().rev().copied().collect();
        let elements = usize::try_from(t.n_elements()).unwrap_or(usize::MAX);
        let Some(bytes) = t.n_bytes().and_then(|b| usize::try_from(b).ok()) else {
            writeln!(
                out,
                "tensor {}: {}, shape {shape:?} (ggml dims {:?}), layout unknown to this tool",
                t.name, t.ty, t.dims
            )
            .unwrap();
            continue;
        };
        // Billed from the type's stored layout; a type no dequantizer here reads is billed as
        // its bytes, all code.
        let cost = gguf::tensor_cost(t.ty, elements).unwrap_or(Cost {
            elements,
            code_bytes: bytes,
            scale_bytes: 0,
            zero_point_bytes: 0,
            g_idx_bytes: 0,
            extra_bytes: 0,
        });
        writeln!(
            out,
            "tensor {}: {}, shape {shape:?} (ggml dims {:?}), {} bytes\n  {}",
            t.name,
            t.ty,
            t.dims,
            thousands(bytes),
            cost_line(&cost)
        )
        .unwrap();
    }
    Ok(Inspection {
        report: out,
        failures: Vec::new(),
    })
}

/// A GGUF metadata value as `inspect` prints it.
fn gguf_value(value: &gguf_file::Value<'_>) -> String {
    use gguf_file::Value;
    match value {
        Value::String(s) => (*s).to_string(),
        Value::Array(a) => format!("[{} values]", a.len()),
        Value::U8(v) => v.to_string(),
        Value::I8(v) => v.to_string(),
        Value::U16(v) => v.to_string(),
        Value::I16(v) => v.to_string(),
        Value::U32(v) => v.to_string(),
        Value::I32(v) => v.to_string(),
        Value::F32(v) => v.to_string(),
        Value::Bool(v) => v.to_string(),
        Value::U64(v) => v.to_string(),
        Value::I64(v) => v.to_string(),
        Value::F64(v) => v.to_string(),
    }
}

/// Inspects the checkpoint that `bytes` hold in safetensors format, as [`inspect`] inspects a
/// file (`label` stands for its name in the report). The fuzz target `repack_inspect` runs it.
pub fn inspect_bytes(label: &str, bytes: &[u8]) -> Result<Inspection> {
    let ckpt = Checkpoint::from_bytes(bytes).map_err(|source| Error::SafeTensors {
        path: label.into(),
        source,
    })?;
    inspect_checkpoint(label, &ckpt)
}

/// Inspects a checkpoint in memory (`label` names it in the report's first line).
pub fn inspect_checkpoint(label: &str, ckpt: &Checkpoint) -> Result<Inspection> {
    let found = find_layers(ckpt)?;
    let declared = metadata::declared_format(&ckpt.metadata)?;
    let mut out = String::new();
    let mut failures = Vec::new();
    writeln!(out, "{label}: {} tensors", ckpt.tensors.len()).unwrap();
    if !ckpt.metadata.is_empty() {
        let pairs: Vec<String> = ckpt
            .metadata
            .iter()
            .map(|(k, v)| format!("{k}={}", shortened(v, 60)))
            .collect();
        writeln!(out, "metadata: {}", pairs.join(", ")).unwrap();
    }
    for layer in &found.layers {
        let check = match layer.kind {
            LayerKind::Integer => {
                integer_layer(&mut out, ckpt, layer, declared.as_ref().map(|(_, f)| *f))?
            }
            LayerKind::Bitsandbytes => bnb_layer(&mut out, layer)?,
        };
        match check {
            Check::Passed(what) => writeln!(out, "  check: {what}").unwrap(),
            Check::Failed(why) => {
                writeln!(out, "  check: FAILS: {why}").unwrap();
                failures.push((layer_name(&layer.prefix).to_string(), why));
            }
        }
    }
    for name in &found.passthrough {
        let tensor = &ckpt.tensors[name];
        writeln!(
            out,
            "{name}  {:?} {:?}  {} B  not quantized",
            tensor.dtype,
            tensor.shape,
            thousands(tensor.data.len())
        )
        .unwrap();
    }
    Ok(Inspection {
        report: out,
        failures,
    })
}

/// A layer's check: what it established, or why it failed.
#[derive(Debug, Clone, PartialEq)]
enum Check {
    Passed(String),
    Failed(String),
}

/// At most `max` characters, with an ellipsis when cut.
fn shortened(value: &str, max: usize) -> String {
    if value.chars().count() <= max {
        value.to_string()
    } else {
        let cut: String = value.chars().take(max - 3).collect();
        format!("{cut}...")
    }
}

fn integer_layer(
    out: &mut String,
    ckpt: &Checkpoint,
    layer: &Layer<'_>,
    declared: Option<WeightFormat>,
) -> Result<Check> {
    let is_gptq = layer.has("g_idx");
    // AWQ has one convention; a GPTQ layer's needs the metadata.
    let format = declared
        .filter(|f| (*f == WeightFormat::Awq) != is_gptq)
        .or((!is_gptq).then_some(WeightFormat::Awq));
    let scales = layer.get("scales")?;
    let (stored_n, groups) = (dim(scales, 1), dim(scales, 0));
    let qweight = layer.get("qweight")?;
    let stored_k = if is_gptq {
        dim(layer.get("g_idx")?, 0)
    } else {
        dim(qweight, 0)
    };
    let [k, n] =
        metadata::logical_shape(&ckpt.metadata, &layer.prefix)?.unwrap_or([stored_k, stored_n]);
    let weights = product(&[k, n]).ok_or_else(|| Error::LogicalSizeOverflow {
        layer: layer.prefix.clone(),
        k,
        n,
    })?;
    let group_size = match metadata::recorded_group_size(&ckpt.metadata)? {
        Some(g) => format!("group {g}"),
        None if is_gptq => format!(
            "group {} (inferred)",
            layer_io::group_size(&ckpt.metadata, layer, WeightFormat::Gptq)?
        ),
        None => match stored_k.checked_div(groups) {
            Some(g) => format!("group {g} (inferred)"),
            None => "group unknown (scales has no rows)".to_string(),
        },
    };
    // Bits per stored code, from the shapes: none when they hold no codes (or overflow).
    let bits = product(&[32, dim(qweight, 0), dim(qweight, 1)])
        .zip(product(&[stored_k, stored_n]))
        .and_then(|(bits, codes)| bits.checked_div(codes));
    let width = bits.map_or("unknown width".to_string(), |b| format!("{b}-bit"));
    let name = match format {
        Some(f) => f.to_string(),
        None if is_gptq => "gptq (zero-point convention not recorded: gptq or gptq_v2)".into(),
        None => "awq".into(),
    };
    writeln!(
        out,
        "layer {}: {name}, {width}, {group_size}, K={k} N={n}",
        layer_name(&layer.prefix)
    )
    .unwrap();
    layer_lines(out, layer, weights, |inside| {
        integer_role(inside, is_gptq, &width, format)
    });
    let permutation = match metadata::input_permutation(&ckpt.metadata, &layer.prefix, k) {
        Ok(Some(permutation)) => {
            writeln!(
                out,
                "  rows reordered: the input activations must be permuted ({} indices recorded)",
                permutation.len()
            )
            .unwrap();
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(err) => Err(with_causes(&err)),
    };
    Ok(match (format, permutation) {
        (_, Err(why)) => Check::Failed(why),
        (Some(format), Ok(())) => check_integer_layer(ckpt, layer, format),
        (None, Ok(())) => Check::Passed(
            "not unpacked: pass the convention with `repack convert --from`".to_string(),
        ),
    })
}

fn check_integer_layer(ckpt: &Checkpoint, layer: &Layer<'_>, format: WeightFormat) -> Check {
    let result = (|| {
        let group_size = layer_io::group_size(&ckpt.metadata, layer, format)?;
        let logical = metadata::logical_shape(&ckpt.metadata, &layer.prefix)?;
        let declared = metadata::declared_bits(None, &ckpt.metadata)?;
        let packed = layer_io::read_integer_layer(layer, format, declared, group_size, logical)?;
        packed.unpack()?;
        Ok::<_, Error>(())
    })();
    match result {
        Ok(()) => Check::Passed(format!("unpacks cleanly as {format}")),
        Err(err) => Check::Failed(with_causes(&err)),
    }
}

fn integer_role(
    inside: &str,
    is_gptq: bool,
    width: &str,
    format: Option<WeightFormat>,
) -> (Part, String) {
    // `format` is an integer layout whose g_idx agrees with the tensors (or None).
    let zeros = match format {
        Some(WeightFormat::Gptq) => "zero points stored minus one (gptq v1)",
        Some(WeightFormat::GptqV2) => "zero points stored as is (gptq_v2)",
        Some(WeightFormat::Awq) => "zero points stored as is",
        Some(WeightFormat::Q4_0 | WeightFormat::Q8_0 | WeightFormat::Nf4) | None => "zero points",
    };
    let awq_slots = if is_gptq {
        ""
    } else {
        ", slots 0 2 4 6 1 3 5 7"
    };
    match inside {
        "qweight" if is_gptq => (Part::Codes, format!("codes: {width}, packed along K")),
        "qweight" => (
            Part::Codes,
            format!("codes: 4-bit, packed along N{awq_slots}"),
        ),
        "qzeros" => (
            Part::ZeroPoints,
            format!("{zeros}, packed along N{awq_slots}"),
        ),
        "scales" => (Part::Scales, "f16 scale per group and column".into()),
        "g_idx" => (Part::GIdx, "group of each row".into()),
        _ => (Part::Other, "unrecognised".into()),
    }
}

/// A bitsandbytes quant state, as `Linear4bit` serializes it (JSON); other keys are ignored.
#[derive(Debug, Deserialize)]
struct QuantState {
    quant_type: String,
    blocksize: usize,
    shape: Vec<usize>,
}

/// A bitsandbytes layer's quant-state JSON, with the quant type its tensor name gives.
/// Returns (the state tensor's name inside the layer, the quant type, the state).
fn read_quant_state<'a>(layer: &'a Layer<'_>) -> Result<(&'a str, &'a str, QuantState)> {
    let (state_name, named_type) = layer
        .quant_state()
        .ok_or_else(|| Error::MissingQuantState {
            layer: layer.prefix.clone(),
        })?;
    let state = serde_json::from_slice(&layer.get(state_name)?.data).map_err(|source| {
        Error::QuantStateJson {
            layer: layer.prefix.clone(),
            tensor: layer.tensor_name(state_name),
            source,
        }
    })?;
    Ok((state_name, named_type, state))
}

fn bnb_layer(out: &mut String, layer: &Layer<'_>) -> Result<Check> {
    let (state_name, named_type, state) = read_quant_state(layer)?;
    let weights = product(&state.shape).ok_or_else(|| Error::ShapeSizeOverflow {
        layer: layer.prefix.clone(),
        shape: state.shape.clone(),
    })?;
    let block_size = state.blocksize;
    writeln!(
        out,
        "layer {}: bitsandbytes {}, block {block_size}, shape {:?}",
        layer_name(&layer.prefix),
        state.quant_type,
        state.shape,
    )
    .unwrap();
    let is_nf4 = state.quant_type == "nf4" && named_type == "nf4";
    layer_lines(out, layer, weights, |inside| match inside {
        "weight" if is_nf4 => (
            Part::Codes,
            "NF4 codes, 2 per byte, first element in the high nibble".into(),
        ),
        "weight" => (Part::Codes, format!("{} codes", state.quant_type)),
        "weight.absmax" => (
            Part::Scales,
            format!("f32 absmax per block of {block_size}"),
        ),
        "weight.quant_map" if is_nf4 => (Part::Other, "the 16 NF4 levels".into()),
        "weight.quant_map" => (Part::Other, "the code levels".into()),
        _ if inside == state_name => (Part::Other, "quant state (JSON)".into()),
        _ => (Part::Other, "nested absmax quantization".into()),
    });
    Ok(match check_nf4(layer, named_type, &state) {
        Ok(()) => Check::Passed(
            "codes and absmax agree with the shape; converting to an integer format needs \
             requantization"
                .into(),
        ),
        Err(why) => Check::Failed(why),
    })
}

/// What an NF4 layer must be for this tool to vouch for it; the first thing it is not.
fn check_nf4(
    layer: &Layer<'_>,
    named_type: &str,
    state: &QuantState,
) -> std::result::Result<(), String> {
    nf4_tensor(layer, named_type, state).map(|_| ())
}

/// The NF4 tensor a bitsandbytes layer holds, checked as `inspect` checks it (the quant type,
/// f32 absmax, the 16 levels, the shape against the codes and absmax); else why not, as text.
pub(crate) fn read_nf4_layer(layer: &Layer<'_>) -> Result<std::result::Result<Nf4Tensor, String>> {
    let (_, named_type, state) = read_quant_state(layer)?;
    Ok(nf4_tensor(layer, named_type, &state))
}

fn nf4_tensor(
    layer: &Layer<'_>,
    named_type: &str,
    state: &QuantState,
) -> std::result::Result<Nf4Tensor, String> {
    let not_nf4 = match (named_type, state.quant_type.as_str()) {
        ("nf4", "nf4") => None,
        ("nf4", other) => Some(format!(
            "its quant_type is {other:?}, though the state tensor is named for nf4"
        )),
        (named, _) => Some(format!("its quant_type is {named:?}")),
    };
    if let Some(what) = not_nf4 {
        return Err(format!(
            "{what}; this tool reads only nf4 (fp4 codes index a different table), so it does \
             not vouch for this layer"
        ));
    }
    if layer.has("weight.nested_absmax") {
        return Err(
            "absmax is itself quantized (nested_absmax); this tool reads only f32 absmax".into(),
        );
    }
    let shape = <[usize; 2]>::try_from(state.shape.clone())
        .map_err(|_| format!("the quant state's shape {:?} is not 2-D", state.shape))?;
    let absmax = layer
        .get("weight.absmax")
        .and_then(|t| Ok(t.f32_vector(&layer.tensor_name("weight.absmax"))?))
        .map_err(|err| with_causes(&err))?;
    if let Some(map) = layer.tensors.get("weight.quant_map") {
        let levels = map
            .f32_vector(&layer.tensor_name("weight.quant_map"))
            .map_err(|err| with_causes(&err))?;
        if levels
            .iter()
            .map(|l| l.to_bits())
            .ne(NF4_LEVELS.iter().map(|l| l.to_bits()))
        {
            return Err(format!(
                "quant_map ({} values) is not the 16 NF4 levels bit for bit, so the codes do not \
                 mean NF4",
                levels.len()
            ));
        }
    }
    let tensor = Nf4Tensor {
        shape,
        block_size: state.blocksize,
        packed: layer
            .get("weight")
            .map_err(|err| with_causes(&err))?
            .data
            .clone(),
        absmax,
    };
    tensor.check().map_err(|err| with_causes(&err))?;
    Ok(tensor)
}

/// The product of `dims`, or `None` if it overflows.
fn product(dims: &[usize]) -> Option<usize> {
    dims.iter()
        .try_fold(1usize, |total, &d| total.checked_mul(d))
}

/// Which part of a layer's cost a tensor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Codes,
    Scales,
    ZeroPoints,
    GIdx,
    Other,
}

/// One line per tensor of the layer, then the layer's total; `describe` gives each tensor (by its
/// name inside the layer) its part of the cost and a description.
fn layer_lines(
    out: &mut String,
    layer: &Layer<'_>,
    weights: usize,
    describe: impl Fn(&str) -> (Part, String),
) {
    let width = name_width(layer);
    let mut cost = Cost {
        elements: weights,
        code_bytes: 0,
        scale_bytes: 0,
        zero_point_bytes: 0,
        g_idx_bytes: 0,
        extra_bytes: 0,
    };
    for (inside, tensor) in &layer.tensors {
        let (part, role) = describe(inside);
        let bytes = tensor.data.len();
        *match part {
            Part::Codes => &mut cost.code_bytes,
            Part::Scales => &mut cost.scale_bytes,
            Part::ZeroPoints => &mut cost.zero_point_bytes,
            Part::GIdx => &mut cost.g_idx_bytes,
            Part::Other => &mut cost.extra_bytes,
        } += bytes;
        tensor_line(
            out,
            &layer.tensor_name(inside),
            width,
            tensor,
            weights,
            &role,
        );
    }
    writeln!(out, "  total  {}", cost_line(&cost)).unwrap();
}

fn name_width(layer: &Layer<'_>) -> usize {
    layer
        .tensors
        .keys()
        .map(|inside| layer.tensor_name(inside).len())
        .max()
        .unwrap_or(0)
}

fn tensor_line(
    out: &mut String,
    name: &str,
    width: usize,
    tensor: &Tensor,
    weights: usize,
    role: &str,
) {
    // No weights, no ratio: "n/a" rather than NaN, or a ratio against a made-up count.
    let bits = match weights {
        0 => "n/a".to_string(),
        _ => format!("{:.3}", (tensor.data.len() * 8) as f64 / weights as f64),
    };
    let layout = format!("{:?} {:?}", tensor.dtype, tensor.shape);
    writeln!(
        out,
        "  {name:<width$}  {layout:<14} {:>9} B  {bits:>6} bits/weight  {role}",
        thousands(tensor.data.len())
    )
    .unwrap();
}

fn dim(tensor: &Tensor, axis: usize) -> usize {
    tensor.shape.get(axis).copied().unwrap_or(1)
}
