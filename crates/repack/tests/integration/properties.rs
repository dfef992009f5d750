//! Property tests of every reader: arbitrary bytes, and valid files with random mutations
//! (truncated, a byte flipped, a length field or a shape replaced by an arbitrary or huge
//! number), must come back Ok or Err, never panic (proptest turns a panic into a failure and
//! shrinks it) and never abort (which would take the test binary down). Where the answer is
//! known, it is checked too: a valid file reads back what was written, a truncated one is
//! refused, and a shape the bytes cannot back is refused by its size.
//!
//! These complement the coverage-guided fuzz targets in `fuzz/` (docs/fuzzing.md): they run
//! on every `cargo test`, and they start from valid files, which a fuzzer has to discover.

use ndarray::Array2;
use ndarray_npy::WriteNpyExt;
use proptest::prelude::*;
use proptest::sample::Index;
use repack::blockfile::{decode, decode_case, encode};
use repack::checkpoint::{Checkpoint, CheckpointError, Tensor};
use repack::npy::{NpyError, parse_npy_matrix};
use repack::read::read_weight_bytes;
use safetensors::Dtype;
use weights::WeightFormat;

use crate::support::{data, f4_header, npy_bytes};

/// A small float32 matrix, 0 to 6 rows and columns, finite values.
fn matrix() -> impl Strategy<Value = Array2<f32>> {
    (0usize..6, 0usize..6).prop_flat_map(|(rows, cols)| {
        prop::collection::vec(-1e3f32..1e3, rows * cols)
            .prop_map(move |values| Array2::from_shape_vec((rows, cols), values).unwrap())
    })
}

fn npy_of(x: &Array2<f32>) -> Vec<u8> {
    let mut bytes = Vec::new();
    x.write_npy(&mut bytes).unwrap();
    bytes
}

/// A checkpoint of 1 to 4 tensors (int32, f16 or f32 bytes; 1-D or 2-D) and some metadata.
fn checkpoint() -> impl Strategy<Value = Checkpoint> {
    let tensor = (
        prop::sample::select(vec![Dtype::I32, Dtype::F16, Dtype::F32, Dtype::U8]),
        prop::collection::vec(1usize..5, 1..3),
    )
        .prop_flat_map(|(dtype, shape)| {
            let len = shape.iter().product::<usize>() * dtype.bitsize() / 8;
            prop::collection::vec(any::<u8>(), len).prop_map(move |data| Tensor {
                dtype,
                shape: shape.clone(),
                data,
            })
        });
    (
        prop::collection::btree_map("[a-z.]{1,12}", tensor, 1..4),
        prop::collection::btree_map("[a-z_]{1,8}", "[ -~]{0,16}", 0..3),
    )
        .prop_map(|(tensors, metadata)| Checkpoint { tensors, metadata })
}

/// `bytes` with one byte replaced (at a position chosen by `at`).
fn flipped(mut bytes: Vec<u8>, at: Index, value: u8) -> Vec<u8> {
    if !bytes.is_empty() {
        let i = at.index(bytes.len());
        bytes[i] ^= value.max(1);
    }
    bytes
}

/// `bytes` cut short (at a position chosen by `at`, before the end).
fn truncated(mut bytes: Vec<u8>, at: Index) -> Vec<u8> {
    bytes.truncate(at.index(bytes.len()));
    bytes
}

proptest! {
    #[test]
    fn npy_reader_survives_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_npy_matrix(&bytes);
        // The same after a valid preamble, so the header parser sees the rest.
        let mut framed = b"\x93NUMPY\x01\x00".to_vec();
        framed.extend(u16::try_from(bytes.len()).unwrap().to_le_bytes());
        framed.extend(&bytes);
        let _ = parse_npy_matrix(&framed);
    }

    #[test]
    fn npy_reader_reads_valid_files_back(x in matrix()) {
        prop_assert_eq!(parse_npy_matrix(&npy_of(&x)).unwrap(), x);
    }

    #[test]
    fn npy_reader_refuses_every_truncation(x in matrix(), at in any::<Index>()) {
        prop_assert!(parse_npy_matrix(&truncated(npy_of(&x), at)).is_err());
    }

    #[test]
    fn npy_reader_survives_a_flipped_byte(x in matrix(), at in any::<Index>(), value in any::<u8>()) {
        let _ = parse_npy_matrix(&flipped(npy_of(&x), at, value));
    }

    #[test]
    fn npy_reader_refuses_shapes_the_data_cannot_back(
        rows in prop_oneof![Just(usize::MAX), Just(1usize << 40), any::<usize>()],
        cols in prop_oneof![Just(usize::MAX), Just(1usize << 20), any::<usize>()],
        data in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        // Whatever rows x cols is, unless it happens to be exactly the data's length.
        prop_assume!(rows.checked_mul(cols).and_then(|n| n.checked_mul(4)) != Some(data.len()));
        let bytes = npy_bytes(&f4_header(&format!("({rows}, {cols})")), &data);
        let err = parse_npy_matrix(&bytes).unwrap_err();
        prop_assert!(
            matches!(err, NpyError::DataLength { .. } | NpyError::SizeOverflow { .. }),
            "{:?}", err
        );
    }

    #[test]
    fn checkpoint_reader_survives_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = Checkpoint::from_bytes(&bytes);
        // The same behind a length that matches, so the header parser sees the rest.
        let mut framed = (bytes.len() as u64).to_le_bytes().to_vec();
        framed.extend(&bytes);
        let _ = Checkpoint::from_bytes(&framed);
    }

    #[test]
    fn checkpoint_reader_reads_valid_files_back(ckpt in checkpoint()) {
        prop_assert_eq!(Checkpoint::from_bytes(&ckpt.to_bytes().unwrap()).unwrap(), ckpt);
    }

    #[test]
    fn checkpoint_reader_refuses_every_truncation(ckpt in checkpoint(), at in any::<Index>()) {
        prop_assert!(Checkpoint::from_bytes(&truncated(ckpt.to_bytes().unwrap(), at)).is_err());
    }

    #[test]
    fn checkpoint_reader_survives_a_flipped_byte(
        ckpt in checkpoint(), at in any::<Index>(), value in any::<u8>()
    ) {
        let _ = Checkpoint::from_bytes(&flipped(ckpt.to_bytes().unwrap(), at, value));
    }

    #[test]
    fn checkpoint_reader_refuses_a_header_length_past_the_end(
        ckpt in checkpoint(), declared in any::<u64>()
    ) {
        let mut bytes = ckpt.to_bytes().unwrap();
        let available = bytes.len() - 8;
        prop_assume!(declared > available as u64);
        bytes[..8].copy_from_slice(&declared.to_le_bytes());
        let err = Checkpoint::from_bytes(&bytes).unwrap_err();
        prop_assert!(matches!(err, CheckpointError::HeaderPastEnd { .. }), "{:?}", err);
    }

    #[test]
    fn checkpoint_reader_refuses_shapes_their_bytes_cannot_back(
        ckpt in checkpoint(),
        dim in prop_oneof![Just(usize::MAX), Just(1usize << 40), 5usize..1000],
    ) {
        // Every tensor's shapes have dimensions under 5, so `[dim, ...]` always disagrees.
        let bytes = ckpt.to_bytes().unwrap();
        let header_len = usize::try_from(u64::from_le_bytes(bytes[..8].try_into().unwrap())).unwrap();
        let header = std::str::from_utf8(&bytes[8..8 + header_len]).unwrap();
        let edited = header.replacen("\"shape\":[", &format!("\"shape\":[{dim},"), 1);
        let mut out = (edited.len() as u64).to_le_bytes().to_vec();
        out.extend(edited.as_bytes());
        out.extend(&bytes[8 + header_len..]);
        let err = Checkpoint::from_bytes(&out).unwrap_err();
        prop_assert!(
            matches!(
                err,
                CheckpointError::TensorByteCount { .. } | CheckpointError::TensorSizeOverflow { .. }
            ),
            "{:?}", err
        );
    }

    #[test]
    fn block_file_reader_survives_arbitrary_bytes_and_arguments(
        bytes in prop::collection::vec(any::<u8>(), 0..512)
    ) {
        let _ = decode_case(&bytes);
    }

    #[test]
    fn block_file_reader_survives_mutated_valid_files(
        x in matrix(),
        format in prop::sample::select(vec![WeightFormat::Q4_0, WeightFormat::Q8_0, WeightFormat::Nf4]),
        block_size in prop_oneof![Just(64usize), 1usize..8, Just(usize::MAX)],
        cols in prop_oneof![Just(None), Just(Some(usize::MAX)), (0usize..100).prop_map(Some)],
        at in any::<Index>(),
        value in any::<u8>(),
        cut in any::<bool>(),
    ) {
        // GGUF rows are whole blocks of 32: widen the matrix so that it encodes.
        let x = if format == WeightFormat::Nf4 {
            x
        } else {
            Array2::from_shape_fn((x.nrows().max(1), 32), |(r, c)| x.get((r, c % 6)).copied().unwrap_or(1.0))
        };
        prop_assume!(!x.is_empty());
        let Ok((file, _)) = encode(x.view(), format, block_size) else {
            return Ok(());
        };
        let cols = cols.unwrap_or(x.ncols());
        let mutated = if cut { truncated(file, at) } else { flipped(file, at, value) };
        let _ = decode(&mutated, format, cols, block_size);
    }

    #[test]
    fn weight_reader_survives_mutated_valid_files(
        file in prop::sample::select(vec![
            "library/gptq_actorder_b4.safetensors",
            "library/awq_pattern.safetensors",
            "proj_nf4.safetensors",
            "gguf",
        ]),
        format in prop::sample::select(vec![None, Some(WeightFormat::Gptq), Some(WeightFormat::Awq)]),
        at in any::<Index>(),
        value in any::<u8>(),
        cut in any::<bool>(),
    ) {
        let bytes = if file == "gguf" {
            gguf_file_bytes()
        } else {
            std::fs::read(data(file)).unwrap()
        };
        let mutated = if cut { truncated(bytes, at) } else { flipped(bytes, at, value) };
        let _ = read_weight_bytes(std::path::Path::new(file), &mutated, format);
    }
}

/// A small GGUF file of one Q4_0 tensor, as `repack quantize` writes it.
fn gguf_file_bytes() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q.gguf");
    repack::quantfile::quantize_file(
        &data("inputs/gguf_pattern.npy"),
        &out,
        repack::quantfile::Target::Q4_0,
        None,
    )
    .unwrap();
    std::fs::read(out).unwrap()
}
