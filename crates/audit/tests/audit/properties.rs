//! Generated inputs: the npz reader never panics and accepts only what it can read back; the
//! audit's decoder and rule agree with the codec on everything the codec encodes (the codec is a
//! dev-dependency only, as a second implementation to test against).

use audit::common::npz::Archive;
use audit::packed_kv::decoder::{Grid, GroupAxis, decode, offsets};
use audit::packed_kv::protocol::Mode;
use ndarray::Array2;
use proptest::prelude::*;

fn honest_archive(values: &[f32]) -> Vec<u8> {
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .last_modified_time(zip::DateTime::default());
    let mut writer =
        ndarray_npy::NpzWriter::new_with_options(std::io::Cursor::new(Vec::new()), options);
    let a = ndarray::Array1::from(values.to_vec());
    writer.add_array("x", &a).unwrap();
    writer
        .add_array("y_codes", &ndarray::Array1::from(vec![1u8, 2, 3]))
        .unwrap();
    writer.finish().unwrap().into_inner()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = Archive::new(bytes);
    }

    #[test]
    fn mutated_archives_are_refused_or_read_consistently(
        values in proptest::collection::vec(-10.0f32..10.0, 1..16),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut bytes = honest_archive(&values);
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        }
        if let Ok(archive) = Archive::new(bytes) {
            // Whatever is accepted reads back with sizes that fit its data.
            for name in archive.names() {
                let info = archive.info(name).unwrap();
                let count: usize = info.shape.iter().product();
                prop_assert_eq!(archive.data(name).unwrap().len(), count * info.dtype.itemsize());
            }
        }
    }

    #[test]
    fn the_audit_decodes_what_the_codec_encodes(
        tokens in 1usize..40,
        features in 1usize..12,
        group_size in 1usize..48,
        bits in 1u32..=8,
        asymmetric in any::<bool>(),
        token_axis in any::<bool>(),
        magnitude in prop::sample::select(vec![1e-30f32, 1e-3, 1.0, 1e3, 1e30]),
        seed in any::<u64>(),
    ) {
        let mode = if asymmetric { Mode::Asymmetric } else { Mode::Symmetric };
        prop_assume!(mode.supports(bits));
        let mut state = seed;
        let x = Array2::from_shape_fn((tokens, features), |_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * magnitude
        });
        let (codec_axis, axis) = if token_axis {
            (kvcodec::GroupAxis::Token, GroupAxis::Token)
        } else {
            (kvcodec::GroupAxis::Feature, GroupAxis::Feature)
        };
        let codec_mode = if asymmetric { kvcodec::Mode::Asymmetric } else { kvcodec::Mode::Symmetric };
        let layout = kvcodec::Layout::with_mode(codec_axis, codec_mode, bits, group_size).unwrap();
        let packed = kvcodec::encode(x.view(), layout).unwrap();
        let grid = Grid { tokens, features, group_size, bits, axis, mode };
        let offsets = offsets(&grid, packed.zero_point_bytes());
        let ours = decode(&grid, packed.code_bytes(), packed.scales().view(), &offsets);
        prop_assert_eq!(ours, kvcodec::decode_exact(&packed));
        // And every code is the audit's rule's code.
        for ((t, f), &v) in x.indexed_iter() {
            let (position, g) = grid.locate(t, f);
            let stored = audit::packed_kv::decoder::code_at(packed.code_bytes(), bits, position);
            let rule = audit::packed_kv::rules::code(mode, bits, v, packed.scales()[g], offsets[g]);
            prop_assert_eq!(stored, rule);
        }
    }
}
