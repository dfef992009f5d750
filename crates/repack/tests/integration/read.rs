//! `repack::read`: a file's quantized layers as their parts, each the form its library
//! dequantizes (the Python package's `kvpack.weights.read` is this function; its pytest suite
//! checks it against gguf-py, safetensors and the libraries' fixtures in full).

use ::repack::quantfile::{Target, dequantize_bytes, quantize_file};
use ::repack::read::{Parts, read_weights};
use weights::WeightFormat;

use crate::support::{data, expected_hash, weight_hash};

#[test]
fn gptq_and_awq_layers_unpack_to_what_the_libraries_dequantize() {
    for (file, format) in [
        ("library/gptq_pattern_b3.safetensors", WeightFormat::Gptq),
        (
            "library/gptq_pattern_b3_v2.safetensors",
            WeightFormat::GptqV2,
        ),
        ("library/awq_all15.safetensors", WeightFormat::Awq),
    ] {
        let layers = read_weights(&data(file), None).unwrap();
        let [layer] = layers.as_slice() else {
            panic!("{file}: {} layers", layers.len())
        };
        let Parts::Integer {
            format: read_as,
            weights,
            input_permutation: None,
        } = &layer.parts
        else {
            panic!("{file}: {:?}", layer.parts)
        };
        assert_eq!(*read_as, format, "{file}");
        let case = file
            .trim_start_matches("library/")
            .trim_end_matches(".safetensors");
        assert_eq!(weight_hash(&weights.dequantize()), expected_hash(case));
    }
}

#[test]
fn a_gguf_tensor_reads_as_dequantize_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    for target in [Target::Q4_0, Target::Q8_0, Target::Q4_1] {
        let file = dir.path().join(format!("{}.gguf", target.name()));
        quantize_file(&data("inputs/gguf_pattern.npy"), &file, target, None).unwrap();
        let layers = read_weights(&file, None).unwrap();
        let bytes = std::fs::read(&file).unwrap();
        let (_, expected, cost) = dequantize_bytes(&bytes, &Default::default(), &file).unwrap();
        assert_eq!(layers[0].cost, cost);
        let values = match &layers[0].parts {
            // The logical matrix is [K = cols, N = rows].
            Parts::Gguf { weights, .. } => weights.dequantize().t().to_owned(),
            Parts::Q4_1 { rows, cols, blocks } => ndarray::Array2::from_shape_vec(
                (*rows, *cols),
                weights::gguf::q4_1::dequantize(blocks),
            )
            .unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(values, expected, "{}", target.name());
    }
}

#[test]
fn a_gptq_layer_whose_convention_is_recorded_nowhere_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let source =
        ::repack::files::read_checkpoint(&data("library/gptq_pattern_b4.safetensors")).unwrap();
    let mut bare = source.clone();
    bare.metadata.clear();
    let file = dir.path().join("bare.safetensors");
    ::repack::files::write_checkpoint(&bare, &file).unwrap();
    let err = read_weights(&file, None).unwrap_err().to_string();
    assert!(
        err.contains("zero-point convention is recorded nowhere"),
        "{err}"
    );
    assert!(read_weights(&file, Some(WeightFormat::Gptq)).is_ok());
    let err = read_weights(
        &data("library/gptq_pattern_b4.safetensors"),
        Some(WeightFormat::GptqV2),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("says format = \"gptq\""), "{err}");
}
