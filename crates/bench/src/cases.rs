//! The operations measured, by family, and the bytes each one counts:
//! - KV codec (`kvcodec`): encode counts the f32 input, decode the f32 output (decoded into a
//!   buffer made beforehand, as a consumer would);
//! - GGUF Q4_0 and Q8_0 blocks (`weights::gguf`): quantize and dequantize count the f32 side;
//! - GPTQ and AWQ layers (`weights::gptq`, `weights::awq`) and b-bit streams (`bitpack`): pack
//!   and unpack count one byte per code, the codes' unpacked size.
//!
//! Each family makes its inputs once, runs every case on them, and hands each result to
//! `record` as it is measured.

use half::f16;
use ndarray::{Array2, ArrayViewMut2, s};
use serde::Serialize;

use bitpack::Bits;
use bitpack::stream as bits;
use kvcodec::{GroupAxis, Layout, Mode, PackedTensor};
use weights::LogicalWeights;
use weights::gguf::{self, BlockQ4_0, BlockQ8_0, GgufBlock};
use weights::{awq, gptq};

use crate::data;
use crate::measure::{Memcpy, Settings, Timed, on_slices, on_split, slices};

/// Sizes and sweeps: the full run measures 128 MiB of data per case; `--quick` a few MiB and a
/// few widths, to check in seconds that every case still runs.
#[derive(Debug, Clone)]
pub struct Scale {
    /// KV matrices are `kv_tokens` x 128 features.
    pub kv_tokens: usize,
    pub kv_bits: Vec<u32>,
    pub kv_groups: Vec<usize>,
    /// f32 values quantized to GGUF blocks, in rows of [`GGUF_COLUMNS`].
    pub gguf_values: usize,
    /// GPTQ and AWQ layers are K x N codes.
    pub weights_k: usize,
    pub weights_n: usize,
    pub gptq_bits: Vec<u32>,
    /// Codes per b-bit stream.
    pub stream_codes: usize,
    pub stream_bits: Vec<u32>,
}

/// Features of every KV matrix (a common head dimension).
pub const KV_FEATURES: usize = 128;
/// Columns of the matrix quantized to GGUF blocks.
pub const GGUF_COLUMNS: usize = 4096;
/// Group size of the GPTQ and AWQ layers (the common choice).
pub const WEIGHTS_GROUP: usize = 128;

impl Scale {
    /// 128 MiB per case: 2^25 f32 values or 2^27 codes.
    pub fn full() -> Scale {
        Scale {
            kv_tokens: 1 << 18,
            kv_bits: (2..=8).collect(),
            kv_groups: vec![8, 32, 128],
            gguf_values: 1 << 25,
            weights_k: 1 << 13,
            weights_n: 1 << 14,
            gptq_bits: vec![2, 3, 4, 8],
            stream_codes: 1 << 27,
            stream_bits: (1..=8).collect(),
        }
    }

    /// 1 to 4 MiB per case, a few widths.
    pub fn quick() -> Scale {
        Scale {
            kv_tokens: 1 << 13,
            kv_bits: vec![3, 4, 8],
            kv_groups: vec![32],
            gguf_values: 1 << 20,
            weights_k: 1 << 10,
            weights_n: 1 << 11,
            gptq_bits: vec![3, 4],
            stream_codes: 1 << 22,
            stream_bits: vec![3, 4, 8],
        }
    }
}

/// One measured case, before it is set against memcpy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measured {
    /// `encode`, `decode`, `quantize`, `dequantize`, `pack`, `unpack`, ...
    pub op: &'static str,
    /// `kv`, `Q4_0`, `gptq`, `stream_bytes`, ...
    pub format: &'static str,
    pub mode: Option<&'static str>,
    pub axis: Option<&'static str>,
    pub bits: Option<u32>,
    pub group_size: Option<usize>,
    /// Bytes the throughput counts (see the module comment).
    pub bytes: usize,
    pub median_s: f64,
    /// The memcpy reference timed in alternation with the case ([`Timed`]); reported by the row.
    #[serde(skip)]
    pub memcpy_gbps: f64,
}

impl Measured {
    fn new(op: &'static str, format: &'static str, bytes: usize, timed: Timed) -> Measured {
        Measured {
            op,
            format,
            mode: None,
            axis: None,
            bits: None,
            group_size: None,
            bytes,
            median_s: timed.median_s,
            memcpy_gbps: timed.memcpy_gbps,
        }
    }
}

impl Scale {
    /// The shape of the input a case of this scale runs on, as a peer makes it again
    /// ([`crate::peer`]): KV tokens x features, GGUF rows x [`GGUF_COLUMNS`], GPTQ and AWQ K x
    /// N codes; `None` for the streams, which no peer runs.
    pub fn input_shape(&self, case: &Measured) -> Option<[usize; 2]> {
        match case.format {
            "kv" => Some([self.kv_tokens, KV_FEATURES]),
            "Q4_0" | "Q8_0" => Some([self.gguf_values / GGUF_COLUMNS, GGUF_COLUMNS]),
            "gptq" | "awq" => Some([self.weights_k, self.weights_n]),
            _ => None,
        }
    }
}

/// Where each result goes.
pub type Record<'a> = dyn FnMut(Measured) + 'a;

/// KV encode and decode: both modes, both axes, every width and group size of the scale.
pub fn kv(scale: &Scale, settings: Settings, pool: &rayon::ThreadPool, record: &mut Record) {
    let mut memcpy = Memcpy::new(settings, pool);
    let tokens = scale.kv_tokens;
    let x = Array2::from_shape_vec(
        (tokens, KV_FEATURES),
        data::gaussian_like(tokens * KV_FEATURES, 11),
    )
    .expect("tokens x features values");
    let mut out = Array2::<f32>::zeros((tokens, KV_FEATURES));
    // Slices of whole 1024-token blocks, so every group size divides a slice's start.
    let parts = slices(tokens, settings.threads, 1024);
    let bytes = x.len() * 4;
    for mode in [Mode::Symmetric, Mode::Asymmetric] {
        for axis in [GroupAxis::Feature, GroupAxis::Token] {
            for &b in &scale.kv_bits {
                for &group_size in &scale.kv_groups {
                    let layout =
                        Layout::with_mode(axis, mode, b, group_size).expect("a valid layout");
                    let encode = |r: std::ops::Range<usize>| {
                        kvcodec::encode(x.slice(s![r, ..]), layout).expect("finite input")
                    };
                    // Each call re-encodes into the memory of the slice's previous tensor, as
                    // a cache stored again and again would (no fresh pages to fault in).
                    let mut stored: Vec<Option<PackedTensor>> = on_slices(pool, &parts, encode)
                        .into_iter()
                        .map(Some)
                        .collect();
                    let slots: Vec<_> = (0..parts.len()).map(|i| i..i + 1).collect();
                    let encoded = memcpy.paired(settings, || {
                        on_split(pool, &parts, &mut stored, &slots, |r, slot| {
                            let spare = slot[0].take().expect("the slice's last tensor");
                            let fresh = kvcodec::encode_reusing(x.slice(s![r, ..]), layout, spare);
                            slot[0] = Some(fresh.expect("finite input"));
                        });
                    });
                    let packed: Vec<PackedTensor> = stored.into_iter().flatten().collect();
                    let decoded = memcpy.paired(settings, || {
                        decode_slices(pool, &packed, &parts, out.view_mut());
                        std::hint::black_box(&mut out);
                    });
                    for (op, seconds) in [("encode", encoded), ("decode", decoded)] {
                        record(Measured {
                            mode: Some(mode.name()),
                            axis: Some(axis.name()),
                            bits: Some(b),
                            group_size: Some(group_size),
                            ..Measured::new(op, "kv", bytes, seconds)
                        });
                    }
                }
            }
        }
    }
}

/// Decodes each slice's tensor into its rows of `out`.
fn decode_slices(
    pool: &rayon::ThreadPool,
    packed: &[PackedTensor],
    parts: &[std::ops::Range<usize>],
    mut out: ArrayViewMut2<f32>,
) {
    let flat = out.as_slice_mut().expect("a standard-layout buffer");
    let tensors: Vec<_> = (0..packed.len()).map(|i| i..i + 1).collect();
    let rows: Vec<_> = parts
        .iter()
        .map(|r| r.start * KV_FEATURES..r.end * KV_FEATURES)
        .collect();
    on_split(pool, &tensors, flat, &rows, |i, target| {
        let view = ArrayViewMut2::from_shape((target.len() / KV_FEATURES, KV_FEATURES), target)
            .expect("whole rows");
        kvcodec::decode_into(&packed[i.start], view).expect("the slice has the tensor's shape");
    });
}

/// GGUF Q4_0 and Q8_0: quantize and dequantize.
pub fn gguf(scale: &Scale, settings: Settings, pool: &rayon::ThreadPool, record: &mut Record) {
    let x = data::gaussian_like(scale.gguf_values, 13);
    let bytes = x.len() * 4;
    let parts = slices(x.len(), settings.threads, GGUF_COLUMNS);
    gguf_format::<BlockQ4_0>(&x, bytes, &parts, settings, pool, record);
    gguf_format::<BlockQ8_0>(&x, bytes, &parts, settings, pool, record);
}

fn gguf_format<B: GgufBlock + Send + Sync>(
    x: &[f32],
    bytes: usize,
    parts: &[std::ops::Range<usize>],
    settings: Settings,
    pool: &rayon::ThreadPool,
    record: &mut Record,
) {
    let mut memcpy = Memcpy::new(settings, pool);
    // Each slice writes its own blocks, then its own values, into buffers allocated once.
    let block_parts: Vec<std::ops::Range<usize>> =
        parts.iter().map(|r| r.start / 32..r.end / 32).collect();
    let mut blocks = gguf::quantize::<B>(x, GGUF_COLUMNS).expect("finite, scalable blocks");
    let quantized = memcpy.paired(settings, || {
        on_split(pool, parts, &mut blocks, &block_parts, |r, out| {
            gguf::quantize_into(&x[r], GGUF_COLUMNS, out).expect("finite, scalable blocks")
        });
        std::hint::black_box(&mut blocks);
    });
    let mut values = vec![0f32; x.len()];
    let dequantized = memcpy.paired(settings, || {
        on_split(pool, &block_parts, &mut values, parts, |r, out| {
            gguf::dequantize_into(&blocks[r], out).expect("32 values per block")
        });
        std::hint::black_box(&mut values);
    });
    record(Measured::new("quantize", B::NAME, bytes, quantized));
    record(Measured::new("dequantize", B::NAME, bytes, dequantized));
}

/// A K x N layer with random codes, scales and zero points in 1..=2^b - 1 (so GPTQ's v1
/// convention can store them), in `pieces` column slices of whole 32-column blocks.
fn layers(scale: &Scale, b: u32, pieces: usize) -> Vec<LogicalWeights> {
    let (k, n) = (scale.weights_k, scale.weights_n);
    let groups = k.div_ceil(WEIGHTS_GROUP);
    slices(n, pieces, 32)
        .into_iter()
        .enumerate()
        .map(|(i, cols)| {
            let width = cols.len();
            let seed = 17 + i as u64;
            let codes = Array2::from_shape_vec((k, width), data::codes(k * width, b, seed))
                .expect("k x n codes");
            let scales = Array2::from_shape_fn((groups, width), |(g, c)| {
                f16::from_f32(0.001 + ((g * 31 + c * 7) % 97) as f32 * 1e-4)
            });
            let max = (1u16 << b) - 1;
            let zeros =
                Array2::from_shape_fn((groups, width), |(g, c)| (1 + (g + c) % max as usize) as u8);
            LogicalWeights::with_sequential_groups(b, WEIGHTS_GROUP, codes, scales, zeros)
                .expect("a valid layer")
        })
        .collect()
}

/// GPTQ (AutoGPTQ's v1 zero points) at every width of the scale, and AWQ (4 bits): pack and
/// unpack. Every call writes into outputs allocated once (`pack_into`, `unpack_into`), as a
/// converter working through same-shaped layers would; a fresh allocation per call would add
/// the page faults of the output to each figure.
pub fn packed_weights(
    scale: &Scale,
    settings: Settings,
    pool: &rayon::ThreadPool,
    record: &mut Record,
) {
    let mut memcpy = Memcpy::new(settings, pool);
    let bytes = scale.weights_k * scale.weights_n;
    for &b in &scale.gptq_bits {
        let pieces = layers(scale, b, settings.threads);
        let all: Vec<std::ops::Range<usize>> = (0..pieces.len()).map(|i| i..i + 1).collect();
        let convention = gptq::ZeroConvention::V1;
        let mut packed: Vec<gptq::GptqLayer> = pieces
            .iter()
            .map(|w| gptq::pack(w, convention).expect("packs"))
            .collect();
        let packed_s = memcpy.paired(settings, || {
            on_split(pool, &all, &mut packed, &all, |r, out| {
                gptq::pack_into(&pieces[r.start], convention, &mut out[0]).expect("packs")
            });
            std::hint::black_box(&mut packed);
        });
        let mut unpacked = pieces.clone();
        let unpacked_s = memcpy.paired(settings, || {
            on_split(pool, &all, &mut unpacked, &all, |r, out| {
                gptq::unpack_into(&packed[r.start], &mut out[0]).expect("unpacks")
            });
            std::hint::black_box(&mut unpacked);
        });
        assert!(unpacked == pieces, "GPTQ {b}-bit round trip");
        for (op, seconds) in [("pack", packed_s), ("unpack", unpacked_s)] {
            record(Measured {
                bits: Some(b),
                group_size: Some(WEIGHTS_GROUP),
                ..Measured::new(op, "gptq", bytes, seconds)
            });
        }
    }
    let pieces = layers(scale, 4, settings.threads);
    let all: Vec<std::ops::Range<usize>> = (0..pieces.len()).map(|i| i..i + 1).collect();
    let mut packed: Vec<awq::AwqLayer> = pieces
        .iter()
        .map(|w| awq::pack(w).expect("packs"))
        .collect();
    let packed_s = memcpy.paired(settings, || {
        on_split(pool, &all, &mut packed, &all, |r, out| {
            awq::pack_into(&pieces[r.start], &mut out[0]).expect("packs")
        });
        std::hint::black_box(&mut packed);
    });
    let mut unpacked = pieces.clone();
    let unpacked_s = memcpy.paired(settings, || {
        on_split(pool, &all, &mut unpacked, &all, |r, out| {
            awq::unpack_into(&packed[r.start], &mut out[0]).expect("unpacks")
        });
        std::hint::black_box(&mut unpacked);
    });
    assert!(unpacked == pieces, "AWQ round trip");
    for (op, seconds) in [("pack", packed_s), ("unpack", unpacked_s)] {
        record(Measured {
            bits: Some(4),
            group_size: Some(WEIGHTS_GROUP),
            ..Measured::new(op, "awq", bytes, seconds)
        });
    }
}

/// b-bit streams in both containers (bytes and u32 words): pack and unpack.
pub fn streams(scale: &Scale, settings: Settings, pool: &rayon::ThreadPool, record: &mut Record) {
    let mut memcpy = Memcpy::new(settings, pool);
    let len = scale.stream_codes;
    // Slices of whole 32-code blocks, so every slice's stream is whole bytes and whole words.
    let parts = slices(len, settings.threads, 32);
    for &b in &scale.stream_bits {
        let width = Bits::new(b).expect("1 to 8 bits");
        let codes = data::codes(len, b, 19 + u64::from(b));
        let mut measure = |format, op, seconds| {
            record(Measured {
                bits: Some(b),
                ..Measured::new(op, format, len, seconds)
            })
        };
        let byte_parts: Vec<_> = parts
            .iter()
            .map(|r| r.start * b as usize / 8..width.byte_count(r.end))
            .collect();
        let word_parts: Vec<_> = parts
            .iter()
            .map(|r| r.start * b as usize / 32..width.word_count(r.end))
            .collect();

        // Every call writes into buffers allocated once, as a consumer streaming a cache would.
        let mut bytes = vec![0u8; width.byte_count(len)];
        let seconds = memcpy.paired(settings, || {
            on_split(pool, &parts, &mut bytes, &byte_parts, |r, out| {
                bits::pack_bytes_into(width, &codes[r], out).unwrap()
            });
        });
        measure("stream_bytes", "pack", seconds);
        let mut back = vec![0u8; len];
        let seconds = memcpy.paired(settings, || {
            on_split(pool, &byte_parts, &mut back, &parts, |r, out| {
                bits::unpack_bytes_into(width, &bytes[r], out).unwrap()
            });
        });
        measure("stream_bytes", "unpack", seconds);
        assert_eq!(back, codes, "the byte stream round-trips");

        let mut words = vec![0u32; width.word_count(len)];
        let seconds = memcpy.paired(settings, || {
            on_split(pool, &parts, &mut words, &word_parts, |r, out| {
                bits::pack_words_into(width, &codes[r], out).unwrap()
            });
        });
        measure("stream_words", "pack", seconds);
        back.fill(0);
        let seconds = memcpy.paired(settings, || {
            on_split(pool, &word_parts, &mut back, &parts, |r, out| {
                bits::unpack_words_into(width, &words[r], out).unwrap()
            });
        });
        measure("stream_words", "unpack", seconds);
        assert_eq!(back, codes, "the word stream round-trips");
    }
}
