//! Between a checkpoint's tensors and the codec's packed layers, and the metadata that says what
//! the tensors mean.
//!
//! Metadata keys this tool reads and writes (safetensors metadata is string to string):
//! - `checkpoint_format`: `gptq`, `gptq_v2` or `awq` (GPTQModel's name for the convention).
//!   Written by this tool beside `format: pt` (transformers refuses to load a safetensors file
//!   whose `format` is anything but pt, tf, flax or mlx). When reading, `format` is also
//!   accepted when it names a layout, as the conformance fixtures record it.
//! - `quant_method` (`gptq` or `awq`), `bits`, `group_size`, `converted_from`.
//! - `<layer>.logical_shape`: `[K, N]` when the tensors were padded beyond the logical size.
//! - `<layer>.input_permutation`: `[p0, p1, ...]` when the rows were reordered: the layer's input
//!   activations must be permuted as `x_new[k] = x[p[k]]`. It must be a permutation of the
//!   layer's K rows (checked on every read).

use std::collections::BTreeMap;
use std::fmt;

use weights::WeightFormat;
use weights::awq::AwqLayer;
use weights::gptq::{GPTQ_BITS, GptqLayer, ZeroConvention};
use weights::logical::check_permutation;
use weights::transcode::PackedLayer;

use crate::checkpoint::Tensor;
use crate::error::{Error, Result};
use crate::layers::{Layer, qualified};

pub const LOGICAL_SHAPE: &str = "logical_shape";
pub const INPUT_PERMUTATION: &str = "input_permutation";

/// The layout a checkpoint's metadata declares, with the key that declared it; `None` when it
/// declares none (as AutoAWQ's files and plain `format: pt` files do).
pub fn declared_format(
    metadata: &BTreeMap<String, String>,
) -> Result<Option<(String, WeightFormat)>> {
    if let Some(value) = metadata.get("checkpoint_format") {
        return match integer_format(value) {
            Some(format) => Ok(Some(("checkpoint_format".into(), format))),
            None => Err(Error::BadMetadata {
                key: "checkpoint_format".into(),
                value: value.clone(),
                expected: "gptq, gptq_v2 or awq",
            }),
        };
    }
    Ok(metadata
        .get("format")
        .and_then(|value| integer_format(value))
        .map(|format| ("format".into(), format)))
}

fn integer_format(name: &str) -> Option<WeightFormat> {
    match name.parse() {
        Ok(format @ (WeightFormat::Gptq | WeightFormat::GptqV2 | WeightFormat::Awq)) => {
            Some(format)
        }
        _ => None,
    }
}

/// A usize metadata value, if present.
pub fn metadata_number(metadata: &BTreeMap<String, String>, key: &str) -> Result<Option<usize>> {
    metadata
        .get(key)
        .map(|value| {
            value.trim().parse().map_err(|_| Error::BadMetadata {
                key: key.into(),
                value: value.clone(),
                expected: "a whole number",
            })
        })
        .transpose()
}

/// A bit width the reader was told: the `--bits` flag, or the metadata's `bits`. Either must
/// agree with the tensor shapes ([`read_integer_layer`] refuses it otherwise, naming both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeclaredBits {
    Flag(u32),
    Metadata(u32),
}

impl DeclaredBits {
    pub fn bits(self) -> u32 {
        match self {
            DeclaredBits::Flag(bits) | DeclaredBits::Metadata(bits) => bits,
        }
    }
}

impl fmt::Display for DeclaredBits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeclaredBits::Flag(bits) => write!(f, "--bits {bits} was given"),
            DeclaredBits::Metadata(bits) => write!(f, "the metadata says bits = {bits}"),
        }
    }
}

/// The width to read at: `--bits` when given, else the metadata's `bits` when recorded; `None`
/// leaves it to the tensor shapes.
pub fn declared_bits(
    flag: Option<u32>,
    metadata: &BTreeMap<String, String>,
) -> Result<Option<DeclaredBits>> {
    if let Some(bits) = flag {
        return Ok(Some(DeclaredBits::Flag(bits)));
    }
    metadata_number(metadata, "bits")?
        .map(|bits| {
            u32::try_from(bits)
                .map(DeclaredBits::Metadata)
                .map_err(|_| Error::BadMetadata {
                    key: "bits".into(),
                    value: metadata["bits"].clone(),
                    expected: "a bit width",
                })
        })
        .transpose()
}

/// The recorded group size, if any. AutoGPTQ records -1 for one group spanning all of K; that
/// counts as unrecorded, and the tensor shapes then check `--group-size` (G = ceil(K / g) = 1).
pub fn recorded_group_size(metadata: &BTreeMap<String, String>) -> Result<Option<usize>> {
    if metadata.get("group_size").map(|g| g.trim()) == Some("-1") {
        return Ok(None);
    }
    metadata_number(metadata, "group_size")
}

/// A layer's recorded `[K, N]`, if any.
pub fn logical_shape(
    metadata: &BTreeMap<String, String>,
    prefix: &str,
) -> Result<Option<[usize; 2]>> {
    json_list(
        metadata,
        &qualified(prefix, LOGICAL_SHAPE),
        "a JSON list [K, N]",
    )?
    .map(|dims: Vec<usize>| {
        <[usize; 2]>::try_from(dims.clone()).map_err(|_| Error::BadMetadata {
            key: qualified(prefix, LOGICAL_SHAPE),
            value: format!("{dims:?}"),
            expected: "a JSON list [K, N]",
        })
    })
    .transpose()
}

/// A layer's recorded input permutation, if any, checked to be a permutation of its `rows`
/// (logical K) rows: anything else would index past the rows or drop some of them.
pub fn input_permutation(
    metadata: &BTreeMap<String, String>,
    prefix: &str,
    rows: usize,
) -> Result<Option<Vec<u32>>> {
    let key = qualified(prefix, INPUT_PERMUTATION);
    let Some(permutation) = json_list(metadata, &key, "a JSON list of row indices")? else {
        return Ok(None);
    };
    check_permutation(&permutation, rows).map_err(|source| Error::BadPermutation {
        key,
        source: Box::new(source),
    })?;
    Ok(Some(permutation))
}

fn json_list<T: serde::de::DeserializeOwned>(
    metadata: &BTreeMap<String, String>,
    key: &str,
    expected: &'static str,
) -> Result<Option<Vec<T>>> {
    metadata
        .get(key)
        .map(|value| {
            serde_json::from_str(value).map_err(|_| Error::BadMetadata {
                key: key.into(),
                value: value.clone(),
                expected,
            })
        })
        .transpose()
}

/// Reads an integer layer's tensors as `format` (gptq, gptq_v2 or awq). The width comes from
/// the tensor shapes; a `declared` width that they contradict is refused, naming both.
pub fn read_integer_layer(
    layer: &Layer<'_>,
    format: WeightFormat,
    declared: Option<DeclaredBits>,
    group_size: usize,
    logical: Option<[usize; 2]>,
) -> Result<PackedLayer> {
    match format {
        WeightFormat::Gptq => read_gptq(layer, ZeroConvention::V1, declared, group_size, logical),
        WeightFormat::GptqV2 => read_gptq(layer, ZeroConvention::V2, declared, group_size, logical),
        WeightFormat::Awq => read_awq(layer, declared, group_size, logical),
        other => Err(Error::UnsupportedFormat {
            format: other,
            action: "read as a qweight/qzeros/scales layer",
            hint: "integer layers are gptq, gptq_v2 or awq",
        }),
    }
}

fn read_gptq(
    layer: &Layer<'_>,
    convention: ZeroConvention,
    declared: Option<DeclaredBits>,
    group_size: usize,
    logical: Option<[usize; 2]>,
) -> Result<PackedLayer> {
    let name = |n: &str| layer.tensor_name(n);
    let qweight = layer.get("qweight")?.i32_matrix(&name("qweight"))?;
    let qzeros = layer.get("qzeros")?.i32_matrix(&name("qzeros"))?;
    let scales = layer.get("scales")?.f16_matrix(&name("scales"))?;
    let g_idx = layer.get("g_idx")?.i32_vector(&name("g_idx"))?;
    let bits = gptq_bits_from_shapes(layer, qweight.nrows(), g_idx.len())?;
    if let Some(declared) = declared.filter(|d| d.bits() != bits) {
        return Err(Error::BitsConflict {
            layer: layer.prefix.clone(),
            declared,
            found: format!(
                "its tensor shapes are {bits}-bit (qweight has {} rows for K = {} g_idx entries: \
                 K * {bits} / 32)",
                qweight.nrows(),
                g_idx.len()
            ),
        });
    }
    let logical_shape = logical.unwrap_or([g_idx.len(), scales.ncols()]);
    Ok(PackedLayer::Gptq(GptqLayer {
        bits,
        group_size,
        convention,
        qweight,
        qzeros,
        scales,
        g_idx,
        logical_shape,
    }))
}

/// qweight has K * bits / 32 rows; g_idx has K.
fn gptq_bits_from_shapes(layer: &Layer<'_>, qweight_rows: usize, k: usize) -> Result<u32> {
    GPTQ_BITS
        .into_iter()
        .find(|&bits| k > 0 && qweight_rows * 32 == k * bits as usize)
        .ok_or_else(|| Error::UnknownLayout {
            layer: layer.prefix.clone(),
            why: format!(
                "qweight has {qweight_rows} rows for K = {k} (g_idx length), which is not \
                 K * bits / 32 for 2, 3, 4 or 8 bits"
            ),
        })
}

fn read_awq(
    layer: &Layer<'_>,
    declared: Option<DeclaredBits>,
    group_size: usize,
    logical: Option<[usize; 2]>,
) -> Result<PackedLayer> {
    if layer.has("g_idx") {
        return Err(Error::UnknownLayout {
            layer: layer.prefix.clone(),
            why: format!(
                "it has {:?}, which AWQ layers do not have; is this a GPTQ checkpoint?",
                layer.tensor_name("g_idx")
            ),
        });
    }
    if let Some(declared) = declared.filter(|d| d.bits() != weights::awq::AWQ_BITS) {
        return Err(Error::BitsConflict {
            layer: layer.prefix.clone(),
            declared,
            found: "AWQ (GEMM) layers hold 4-bit codes only".to_string(),
        });
    }
    let name = |n: &str| layer.tensor_name(n);
    let qweight = layer.get("qweight")?.i32_matrix(&name("qweight"))?;
    let qzeros = layer.get("qzeros")?.i32_matrix(&name("qzeros"))?;
    let scales = layer.get("scales")?.f16_matrix(&name("scales"))?;
    let logical_shape = logical.unwrap_or([qweight.nrows(), scales.ncols()]);
    Ok(PackedLayer::Awq(AwqLayer {
        group_size,
        qweight,
        qzeros,
        scales,
        logical_shape,
    }))
}

/// The tensors a packed layer writes, under the layer's prefix.
pub fn layer_tensors(prefix: &str, layer: &PackedLayer) -> Vec<(String, Tensor)> {
    let named = |name: &str, tensor| (qualified(prefix, name), tensor);
    match layer {
        PackedLayer::Gptq(gptq) => vec![
            named("qweight", Tensor::from_i32_matrix(&gptq.qweight)),
            named("qzeros", Tensor::from_i32_matrix(&gptq.qzeros)),
            named("scales", Tensor::from_f16_matrix(&gptq.scales)),
            named("g_idx", Tensor::from_i32_vector(&gptq.g_idx)),
        ],
        PackedLayer::Awq(awq) => vec![
            named("qweight", Tensor::from_i32_matrix(&awq.qweight)),
            named("qzeros", Tensor::from_i32_matrix(&awq.qzeros)),
            named("scales", Tensor::from_f16_matrix(&awq.scales)),
        ],
    }
}

/// The stored [K, N] of a packed layer (after padding).
pub fn stored_shape(layer: &PackedLayer) -> [usize; 2] {
    match layer {
        PackedLayer::Gptq(gptq) => [gptq.g_idx.len(), gptq.scales.ncols()],
        PackedLayer::Awq(awq) => [awq.qweight.nrows(), awq.scales.ncols()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_declared_format_comes_from_checkpoint_format_or_a_layout_named_format() {
        let declared = |pairs| declared_format(&metadata(pairs)).unwrap().map(|(_, f)| f);
        assert_eq!(
            declared(&[("format", "gptq_v2")]),
            Some(WeightFormat::GptqV2)
        );
        assert_eq!(declared(&[("format", "pt")]), None);
        assert_eq!(
            declared(&[("format", "pt"), ("checkpoint_format", "gptq")]),
            Some(WeightFormat::Gptq)
        );
        assert_eq!(
            declared_format(&metadata(&[("checkpoint_format", "marlin")]))
                .unwrap_err()
                .to_string(),
            "metadata \"checkpoint_format\" = \"marlin\" is not gptq, gptq_v2 or awq"
        );
    }

    #[test]
    fn the_width_is_the_flag_else_the_metadata_else_the_shapes() {
        let recorded = metadata(&[("bits", "8")]);
        assert_eq!(
            declared_bits(Some(4), &recorded).unwrap(),
            Some(DeclaredBits::Flag(4))
        );
        assert_eq!(
            declared_bits(None, &recorded).unwrap(),
            Some(DeclaredBits::Metadata(8))
        );
        assert_eq!(declared_bits(None, &metadata(&[])).unwrap(), None);
        assert_eq!(
            declared_bits(None, &metadata(&[("bits", "99999999999")]))
                .unwrap_err()
                .to_string(),
            "metadata \"bits\" = \"99999999999\" is not a bit width"
        );
    }

    #[test]
    fn group_size_minus_one_means_unrecorded() {
        assert_eq!(
            recorded_group_size(&metadata(&[("group_size", "-1")])).unwrap(),
            None
        );
        assert_eq!(
            recorded_group_size(&metadata(&[("group_size", "128")])).unwrap(),
            Some(128)
        );
        assert_eq!(
            recorded_group_size(&metadata(&[("group_size", "x")]))
                .unwrap_err()
                .to_string(),
            "metadata \"group_size\" = \"x\" is not a whole number"
        );
    }

    #[test]
    fn per_layer_metadata_is_json() {
        let m = metadata(&[
            ("proj.logical_shape", "[100, 60]"),
            ("proj.input_permutation", "[1, 0]"),
            ("logical_shape", "[1]"),
        ]);
        assert_eq!(logical_shape(&m, "proj").unwrap(), Some([100, 60]));
        assert_eq!(input_permutation(&m, "proj", 2).unwrap(), Some(vec![1, 0]));
        assert_eq!(logical_shape(&m, "other").unwrap(), None);
        assert_eq!(
            logical_shape(&m, "").unwrap_err().to_string(),
            "metadata \"logical_shape\" = \"[1]\" is not a JSON list [K, N]"
        );
    }

    #[test]
    fn a_malformed_input_permutation_is_refused_with_its_key() {
        let m = metadata(&[
            ("short.input_permutation", "[0]"),
            ("twice.input_permutation", "[0, 0]"),
            ("text.input_permutation", "rows"),
        ]);
        assert_eq!(
            input_permutation(&m, "short", 2).unwrap_err().to_string(),
            "metadata \"short.input_permutation\" cannot be used: the row permutation has 1 \
             entries for K = 2 rows"
        );
        assert_eq!(
            input_permutation(&m, "twice", 2).unwrap_err().to_string(),
            "metadata \"twice.input_permutation\" cannot be used: the row permutation is not a \
             permutation of rows 0..2: entry 1 is 0, which entry 0 already holds"
        );
        assert_eq!(
            input_permutation(&m, "text", 2).unwrap_err().to_string(),
            "metadata \"text.input_permutation\" = \"rows\" is not a JSON list of row indices"
        );
    }
}
