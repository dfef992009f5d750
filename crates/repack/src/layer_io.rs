//! Between a checkpoint's tensors and `weights`' packed layers: reading a layer's tensors as a
//! GPTQ or AWQ layer (its width from the tensor shapes, held to any declared width), and the
//! tensors a packed layer writes. What the metadata says is [`crate::metadata`]'s to parse.

use std::collections::BTreeMap;

use weights::WeightFormat;
use weights::awq::{AWQ_BITS, AwqLayer};
use weights::gptq::{GPTQ_BITS, GptqLayer, ZeroConvention};
use weights::transcode::PackedLayer;

use crate::checkpoint::Tensor;
use crate::error::{Error, Result};
use crate::layers::Layer;
use crate::metadata::{self, DeclaredBits};
use crate::names::qualified;

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
        WeightFormat::Q4_0 | WeightFormat::Q8_0 | WeightFormat::Nf4 => {
            Err(Error::UnsupportedFormat {
                format,
                action: "read as a qweight/qzeros/scales layer",
                hint: "integer layers are gptq, gptq_v2 or awq",
            })
        }
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
        return Err(Error::BitsShapeConflict {
            layer: layer.prefix.clone(),
            declared,
            bits,
            qweight_rows: qweight.nrows(),
            k: g_idx.len(),
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
        .ok_or_else(|| Error::GptqWidthUnknown {
            layer: layer.prefix.clone(),
            qweight_rows,
            k,
        })
}

fn read_awq(
    layer: &Layer<'_>,
    declared: Option<DeclaredBits>,
    group_size: usize,
    logical: Option<[usize; 2]>,
) -> Result<PackedLayer> {
    if layer.has("g_idx") {
        return Err(Error::GIdxInAwqLayer {
            layer: layer.prefix.clone(),
            tensor: layer.tensor_name("g_idx"),
        });
    }
    if let Some(declared) = declared.filter(|d| d.bits() != AWQ_BITS) {
        return Err(Error::AwqBitsConflict {
            layer: layer.prefix.clone(),
            declared,
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

/// A GPTQ or AWQ layer's group size: the metadata's, else what its shapes say (AWQ: rows of
/// qweight per row of scales; GPTQ: the rows in group 0, which act-order and sequential g_idx
/// alike give, as every group but the last holds exactly group-size rows).
pub fn group_size(
    metadata: &BTreeMap<String, String>,
    layer: &Layer<'_>,
    format: WeightFormat,
) -> Result<usize> {
    if let Some(g) = metadata::recorded_group_size(metadata)? {
        return Ok(g);
    }
    if format == WeightFormat::Awq {
        let rows = |name| Ok::<_, Error>(layer.get(name)?.shape.first().copied().unwrap_or(0));
        return rows("qweight")?
            .checked_div(rows("scales")?)
            .ok_or_else(|| Error::GroupSizeNotInferable {
                layer: layer.prefix.clone(),
            });
    }
    let g_idx = layer
        .get("g_idx")?
        .i32_vector(&layer.tensor_name("g_idx"))?;
    Ok(g_idx.iter().filter(|&&g| g == 0).count())
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
