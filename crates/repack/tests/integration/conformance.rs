//! Byte-for-byte against the fixtures in `tests/data/formats` (see its README for which library
//! made which file). Packing is compared tensor by tensor with the library's bytes; reading is
//! compared with the logical input, and its dequantized weights with the SHA-256 of what every
//! library reader of the case produced.

use std::path::PathBuf;

use ::repack::files::read_checkpoint;
use ::repack::layer_io;
use ::repack::layers::find_layers;
use ndarray::Array2;
use weights::gguf::{self, BlockQ4_0, BlockQ8_0, GgufBlock, q4_1};
use weights::gptq::{self, ZeroConvention};
use weights::transcode::{self, PackedLayer};
use weights::{LogicalWeights, WeightFormat, awq, nf4};

use crate::support::{
    data, expected_hash, f16_bytes, i32_bytes, logical_input, raw_tensors, weight_hash,
};

const GROUP_SIZE: usize = 32;

/// (case, bits) of the GPTQ fixtures.
fn gptq_cases() -> Vec<(String, u32)> {
    ["pattern", "all15"]
        .iter()
        .flat_map(|probe| gptq::GPTQ_BITS.map(|bits| (format!("gptq_{probe}_b{bits}"), bits)))
        .collect()
}

/// Compares our tensors (name, bytes) with a library file's, naming every difference.
fn compare_tensors(
    label: &str,
    ours: &[(&str, Vec<u8>)],
    library: &PathBuf,
    failures: &mut Vec<String>,
) {
    let theirs = raw_tensors(library);
    for (name, bytes) in ours {
        match theirs.get(*name) {
            Some((_, _, expected)) if expected == bytes => {}
            Some((_, _, expected)) => {
                let first = bytes.iter().zip(expected).position(|(a, b)| a != b);
                failures.push(format!(
                    "{label}: {name} differs ({} vs {} bytes, first difference at byte {first:?})",
                    bytes.len(),
                    expected.len()
                ));
            }
            None => failures.push(format!("{label}: the library file has no {name}")),
        }
    }
}

fn gptq_tensors(layer: &gptq::GptqLayer) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("qweight", i32_bytes(&layer.qweight)),
        ("qzeros", i32_bytes(&layer.qzeros)),
        ("scales", f16_bytes(&layer.scales)),
        ("g_idx", i32_bytes(&layer.g_idx)),
    ]
}

fn awq_tensors(layer: &awq::AwqLayer) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("qweight", i32_bytes(&layer.qweight)),
        ("qzeros", i32_bytes(&layer.qzeros)),
        ("scales", f16_bytes(&layer.scales)),
    ]
}

/// Reads a library file's only layer with this crate's reader, as `format`.
fn read_library_layer(file: &str, format: WeightFormat) -> PackedLayer {
    let ckpt = read_checkpoint(&data(file)).unwrap();
    let found = find_layers(&ckpt).unwrap();
    assert_eq!(found.layers.len(), 1, "{file}");
    layer_io::read_integer_layer(&found.layers[0], format, None, GROUP_SIZE, None).unwrap()
}

#[test]
fn gptq_packing_matches_autogptq_and_gptqmodel_byte_for_byte() {
    let mut failures = Vec::new();
    for (case, bits) in gptq_cases() {
        let weights = logical_input(&case, bits, GROUP_SIZE);
        for (convention, file) in [
            (ZeroConvention::V1, format!("library/{case}.safetensors")),
            (ZeroConvention::V2, format!("library/{case}_v2.safetensors")),
        ] {
            let layer = gptq::pack(&weights, convention).unwrap();
            compare_tensors(&file, &gptq_tensors(&layer), &data(&file), &mut failures);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn gptq_reading_gives_the_inputs_and_the_libraries_weights() {
    for (case, bits) in gptq_cases() {
        let weights = logical_input(&case, bits, GROUP_SIZE);
        for (format, variant) in [
            (WeightFormat::Gptq, case.clone()),
            (WeightFormat::GptqV2, format!("{case}_v2")),
        ] {
            let read = read_library_layer(&format!("library/{variant}.safetensors"), format);
            let logical = read.unpack().unwrap();
            assert_eq!(logical, weights, "{variant}: logical matrix");
            assert_eq!(
                weight_hash(&logical.dequantize()),
                expected_hash(&variant),
                "{variant}: weights"
            );
        }
    }
}

#[test]
fn act_order_gptq_matches_autogptq_and_keeps_its_g_idx() {
    let weights = logical_input("gptq_actorder_b4", 4, GROUP_SIZE);
    assert!(!weights.has_sequential_groups());
    let layer = gptq::pack(&weights, ZeroConvention::V1).unwrap();
    let mut failures = Vec::new();
    let file = "library/gptq_actorder_b4.safetensors";
    compare_tensors(file, &gptq_tensors(&layer), &data(file), &mut failures);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let read = read_library_layer(file, WeightFormat::Gptq)
        .unpack()
        .unwrap();
    assert_eq!(read, weights);
    assert_eq!(
        weight_hash(&read.dequantize()),
        expected_hash("gptq_actorder_b4")
    );
}

#[test]
fn awq_packing_matches_autoawq_and_its_own_gptq_repack() {
    let mut failures = Vec::new();
    for case in ["awq_pattern", "awq_all15"] {
        let weights = logical_input(case, 4, GROUP_SIZE);
        let layer = awq::pack(&weights).unwrap();
        let file = format!("library/{case}.safetensors");
        compare_tensors(&file, &awq_tensors(&layer), &data(&file), &mut failures);

        let read = read_library_layer(&file, WeightFormat::Awq);
        let logical = read.unpack().unwrap();
        assert_eq!(logical, weights, "{case}: logical matrix");
        assert_eq!(
            weight_hash(&logical.dequantize()),
            expected_hash(case),
            "{case}: weights"
        );

        // AutoAWQ's unpack-reorder-pack to GPTQ (v1) is exactly our repack, byte for byte.
        let repacked = transcode::transcode(&read, WeightFormat::Gptq).unwrap();
        assert_eq!(repacked.input_permutation, None);
        let PackedLayer::Gptq(gptq_layer) = repacked.layer else {
            panic!("{case}: not GPTQ")
        };
        let file = format!("library/{case}_as_gptq.safetensors");
        compare_tensors(
            &file,
            &gptq_tensors(&gptq_layer),
            &data(&file),
            &mut failures,
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn act_order_gptq_converts_to_awq_and_back_with_bit_identical_weights() {
    let source = read_library_layer("library/gptq_actorder_b4.safetensors", WeightFormat::Gptq);
    let original = source.unpack().unwrap();
    let to_awq = transcode::transcode(&source, WeightFormat::Awq).unwrap();
    let perm = to_awq
        .input_permutation
        .clone()
        .expect("act-order rows must be permuted");
    // The permutation sorts rows by group, stably.
    let mut expected: Vec<u32> = (0..128).collect();
    expected.sort_by_key(|&k| original.g_idx()[k as usize]);
    assert_eq!(perm, expected);

    let back = transcode::transcode(&to_awq.layer, WeightFormat::Gptq).unwrap();
    let (before, after) = (
        original.dequantize(),
        back.layer.unpack().unwrap().dequantize(),
    );
    for ((k, n), value) in after.indexed_iter() {
        assert_eq!(
            value.to_bits(),
            before[[perm[k] as usize, n]].to_bits(),
            "[{k}, {n}]"
        );
    }
    // Undoing the permutation gives the library's weights exactly.
    let mut restored = Array2::<f32>::zeros(after.dim());
    for (k, &source_row) in perm.iter().enumerate() {
        restored.row_mut(source_row as usize).assign(&after.row(k));
    }
    assert_eq!(weight_hash(&restored), expected_hash("gptq_actorder_b4"));

    // Given the recorded permutation, the conversion back puts the rows back itself: the
    // library's own layer, tensor for tensor, with its scattered g_idx.
    let restored =
        transcode::transcode_recorded(&to_awq.layer, Some(&perm), WeightFormat::Gptq).unwrap();
    assert!(restored.rows_restored && restored.input_permutation.is_none());
    assert_eq!(restored.layer, source);
}

fn gguf_case<B: GgufBlock>(probe: &str, failures: &mut Vec<String>) {
    let stem = format!("gguf_{probe}_{}", B::NAME);
    let x: Array2<f32> = ndarray_npy::read_npy(data(&format!("inputs/gguf_{probe}.npy"))).unwrap();
    let flat: Vec<f32> = x.iter().copied().collect();
    let blocks = gguf::quantize::<B>(&flat, x.ncols()).unwrap();
    let library = std::fs::read(data(&format!("library/{stem}.bin"))).unwrap();
    if gguf::to_bytes(&blocks) != library {
        failures.push(format!(
            "{stem}: quantized bytes differ from ggml / gguf-py"
        ));
    }
    let deq = Array2::from_shape_vec(x.dim(), gguf::dequantize(&blocks)).unwrap();
    if weight_hash(&deq) != expected_hash(&stem) {
        failures.push(format!("{stem}: dequantized weights differ from gguf-py's"));
    }
    // Through the logical matrix and back gives the same blocks.
    let logical: LogicalWeights = gguf::to_logical(&blocks, x.nrows(), x.ncols()).unwrap();
    if gguf::from_logical::<B>(&logical).unwrap() != blocks {
        failures.push(format!("{stem}: logical round trip changed the blocks"));
    }
}

#[test]
fn gguf_quantization_matches_ggml_and_gguf_py_byte_for_byte() {
    let mut failures = Vec::new();
    for probe in ["pattern", "all15"] {
        gguf_case::<BlockQ4_0>(probe, &mut failures);
        gguf_case::<BlockQ8_0>(probe, &mut failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Q4_1 (a scale and a minimum per block) sits outside `GgufBlock`: quantized bytes, the
/// library's bytes read back, and both dequantizations against gguf-py's.
#[test]
fn gguf_q4_1_matches_ggml_and_gguf_py_byte_for_byte() {
    for probe in ["pattern", "all15"] {
        let stem = format!("gguf_{probe}_Q4_1");
        let x: Array2<f32> =
            ndarray_npy::read_npy(data(&format!("inputs/gguf_{probe}.npy"))).unwrap();
        let flat: Vec<f32> = x.iter().copied().collect();
        let blocks = q4_1::quantize(&flat, x.ncols()).unwrap();
        let library = std::fs::read(data(&format!("library/{stem}.bin"))).unwrap();
        assert_eq!(q4_1::to_bytes(&blocks), library, "{stem}: quantized bytes");
        assert_eq!(
            q4_1::from_bytes(&library).unwrap(),
            blocks,
            "{stem}: bytes read back"
        );
        let deq = Array2::from_shape_vec(x.dim(), q4_1::dequantize(&blocks)).unwrap();
        assert_eq!(
            weight_hash(&deq),
            expected_hash(&stem),
            "{stem}: dequantized weights"
        );
    }
    // The all-15 probe: every block is constant, so d = 0, m = 15 and every code 0, and the
    // weights come back exactly (unlike Q4_0's d = -1.875 with all-zero nibbles).
    let library = std::fs::read(data("library/gguf_all15_Q4_1.bin")).unwrap();
    let blocks = q4_1::from_bytes(&library).unwrap();
    assert!(
        blocks
            .iter()
            .all(|b| b.d.to_f32() == 0.0 && b.m.to_f32() == 15.0 && b.qs == [0; 16])
    );
    assert!(q4_1::dequantize(&blocks).iter().all(|&w| w == 15.0));
}

#[test]
fn nf4_quantization_matches_bitsandbytes_byte_for_byte() {
    for probe in ["pattern", "all15"] {
        let x: Array2<f32> =
            ndarray_npy::read_npy(data(&format!("inputs/nf4_{probe}.npy"))).unwrap();
        let tensor = nf4::quantize(x.view(), nf4::DEFAULT_BLOCK_SIZE).unwrap();
        let packed = std::fs::read(data(&format!("library/nf4_{probe}.bin"))).unwrap();
        assert_eq!(tensor.packed, packed, "nf4_{probe}: packed codes");
        let absmax = std::fs::read(data(&format!("library/nf4_{probe}_absmax.bin"))).unwrap();
        let ours: Vec<u8> = tensor.absmax.iter().flat_map(|a| a.to_le_bytes()).collect();
        assert_eq!(ours, absmax, "nf4_{probe}: absmax");
        let deq = tensor.dequantize().unwrap();
        assert_eq!(
            weight_hash(&deq),
            expected_hash(&format!("nf4_{probe}")),
            "nf4_{probe}: weights"
        );
    }
}
