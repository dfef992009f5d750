//! The reader on small files built here, on damaged copies of them, and on the real SmolLM2
//! GGUF when it is present.

use gguf_file::{Array, Error, GgufFile, TensorType, Value, ValueType};
use proptest::prelude::*;

/// A test-only GGUF writer: metadata entries as raw payloads, tensors laid out aligned.
struct Writer {
    version: u32,
    alignment: u64,
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<Tensor>,
}

/// name, dims, ggml type id, data, offset override
type Tensor = (String, Vec<u64>, u32, Vec<u8>, Option<u64>);

fn string(s: &str) -> Vec<u8> {
    let mut out = (s.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(s.as_bytes());
    out
}

fn array(elem: ValueType, count: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = elem.id().to_le_bytes().to_vec();
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

impl Writer {
    fn new() -> Self {
        Writer {
            version: 3,
            alignment: 32,
            kv: Vec::new(),
            n_kv: 0,
            tensors: Vec::new(),
        }
    }

    fn kv(&mut self, key: &str, ty: ValueType, payload: &[u8]) -> &mut Self {
        self.kv.extend_from_slice(&string(key));
        self.kv.extend_from_slice(&ty.id().to_le_bytes());
        self.kv.extend_from_slice(payload);
        self.n_kv += 1;
        self
    }

    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> &mut Self {
        self.tensors
            .push((name.into(), dims.to_vec(), ty, data, None));
        self
    }

    fn build(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.n_kv.to_le_bytes());
        out.extend_from_slice(&self.kv);
        let align = |n: u64| n.div_ceil(self.alignment) * self.alignment;
        let mut data = Vec::new();
        for (name, dims, ty, bytes, offset) in &self.tensors {
            let at = align(data.len() as u64);
            data.resize(at as usize, 0);
            out.extend_from_slice(&string(name));
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&offset.unwrap_or(at).to_le_bytes());
            data.extend_from_slice(bytes);
        }
        let start = align(out.len() as u64);
        out.resize(start as usize, 0);
        out.extend_from_slice(&data);
        out
    }
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A file with every value type, a nested array and five tensor types, the last tensor ending
/// exactly at the end of the file.
fn sample() -> Vec<u8> {
    let mut w = Writer::new();
    w.alignment = 64;
    w.kv("general.architecture", ValueType::String, &string("llama"))
        .kv("general.alignment", ValueType::U32, &64u32.to_le_bytes())
        .kv("u8", ValueType::U8, &[200])
        .kv("i8", ValueType::I8, &[0x80])
        .kv("u16", ValueType::U16, &65535u16.to_le_bytes())
        .kv("i16", ValueType::I16, &(-2i16).to_le_bytes())
        .kv("i32", ValueType::I32, &(-7i32).to_le_bytes())
        .kv("f32", ValueType::F32, &100000f32.to_le_bytes())
        .kv("bool", ValueType::Bool, &[1])
        .kv("u64", ValueType::U64, &(1u64 << 40).to_le_bytes())
        .kv("i64", ValueType::I64, &(-1i64).to_le_bytes())
        .kv("f64", ValueType::F64, &0.1f64.to_le_bytes());
    let mut words = string("hello");
    words.extend(string("wörld"));
    words.extend(string(""));
    w.kv(
        "tokens",
        ValueType::Array,
        &array(ValueType::String, 3, &words),
    );
    let scores: Vec<u8> = [0.5f32, -1.0]
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    w.kv(
        "scores",
        ValueType::Array,
        &array(ValueType::F32, 2, &scores),
    );
    let mut nested = array(ValueType::U16, 2, &[1, 0, 2, 0]);
    nested.extend(array(ValueType::Bool, 1, &[0]));
    w.kv(
        "nested",
        ValueType::Array,
        &array(ValueType::Array, 2, &nested),
    );
    w.kv("empty", ValueType::Array, &array(ValueType::I64, 0, &[]));
    w.tensor("other", &[7], 99, bytes(7, 9))
        .tensor("norm", &[4], 0, bytes(16, 1))
        .tensor("half", &[2, 3], 1, bytes(12, 2))
        .tensor("q40", &[32, 2], 2, bytes(36, 3))
        .tensor("q41", &[64], 3, bytes(40, 4))
        .tensor("q80", &[32, 1, 1, 2], 8, bytes(68, 5));
    w.build()
}

#[test]
fn a_written_file_reads_back_value_for_value() {
    let file = sample();
    let g = GgufFile::parse(&file).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.alignment(), 64);
    assert_eq!(g.data_start() % 64, 0);
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(g.get("u8"), Some(&Value::U8(200)));
    assert_eq!(g.get("i8"), Some(&Value::I8(-128)));
    assert_eq!(g.get("u16"), Some(&Value::U16(65535)));
    assert_eq!(g.get("i16"), Some(&Value::I16(-2)));
    assert_eq!(g.get_i32("i32").unwrap(), -7);
    assert_eq!(g.get_f32("f32").unwrap(), 100000.0);
    assert!(g.get_bool("bool").unwrap());
    assert_eq!(g.get_u64("u64").unwrap(), 1 << 40);
    assert_eq!(g.get("i64"), Some(&Value::I64(-1)));
    assert_eq!(g.get("f64"), Some(&Value::F64(0.1)));
    assert_eq!(
        g.get_string_array("tokens").unwrap(),
        ["hello", "wörld", ""]
    );
    assert_eq!(g.get_f32_array("scores").unwrap(), [0.5, -1.0]);
    assert_eq!(
        g.get_array("nested").unwrap(),
        &Array::Array(vec![Array::U16(vec![1, 2]), Array::Bool(vec![false])])
    );
    assert!(g.get_array("empty").unwrap().is_empty());
    assert_eq!(g.get_array("empty").unwrap().elem_type(), ValueType::I64);

    // Metadata stays in file order.
    let keys: Vec<&str> = g.metadata().iter().map(|(k, _)| *k).collect();
    assert_eq!(
        keys[..3],
        ["general.architecture", "general.alignment", "u8"]
    );
    assert_eq!(keys.last(), Some(&"empty"));

    let names: Vec<&str> = g.tensors().iter().map(|t| t.name).collect();
    assert_eq!(names, ["other", "norm", "half", "q40", "q41", "q80"]);
    let types: Vec<TensorType> = g.tensors().iter().map(|t| t.ty).collect();
    use TensorType::*;
    assert_eq!(types, [Other(99), F32, F16, Q4_0, Q4_1, Q8_0]);
    assert_eq!(g.tensor("half").unwrap().dims, [2, 3]);
    assert_eq!(g.tensor("q80").unwrap().dims, [32, 1, 1, 2]);
    for (name, len, seed) in [
        ("norm", 16, 1),
        ("half", 12, 2),
        ("q40", 36, 3),
        ("q41", 40, 4),
        ("q80", 68, 5),
    ] {
        let t = g.tensor(name).unwrap();
        assert_eq!(t.offset % 64, 0, "{name}");
        assert_eq!(t.n_bytes(), Some(len as u64), "{name}");
        assert_eq!(g.tensor_bytes(t).unwrap(), bytes(len, seed), "{name}");
    }
    // An unknown type opens but cannot be sliced.
    let other = g.tensor("other").unwrap();
    assert!(matches!(
        g.tensor_bytes(other),
        Err(Error::UnknownTensorType { type_id: 99, .. })
    ));
}

#[test]
fn version_2_reads_and_the_default_alignment_is_32() {
    let mut w = Writer::new();
    w.version = 2;
    w.kv("a", ValueType::U32, &5u32.to_le_bytes())
        .tensor("t", &[3], 0, bytes(12, 0));
    let file = w.build();
    let g = GgufFile::parse(&file).unwrap();
    assert_eq!((g.version(), g.alignment()), (2, 32));
    assert_eq!(g.data_start() % 32, 0);
    assert_eq!(
        g.tensor_bytes(g.tensor("t").unwrap()).unwrap(),
        bytes(12, 0)
    );
}

#[test]
fn getters_name_a_missing_key_or_a_wrong_type() {
    let file = sample();
    let g = GgufFile::parse(&file).unwrap();
    let err = g.get_u32("nope").unwrap_err();
    assert!(matches!(&err, Error::MissingKey(k) if k == "nope"), "{err}");
    let err = g.get_u32("f32").unwrap_err();
    assert_eq!(
        err.to_string(),
        "metadata key \"f32\" holds F32, expected U32"
    );
    let err = g.get_string_array("scores").unwrap_err();
    assert!(err.to_string().contains("holds array of F32"), "{err}");
    assert!(matches!(g.tensor("nope"), Err(Error::MissingTensor(_))));
}

#[test]
fn every_truncation_of_a_valid_file_is_an_error() {
    let file = sample();
    for len in 0..file.len() {
        assert!(
            GgufFile::parse(&file[..len]).is_err(),
            "prefix of {len} bytes parsed"
        );
    }
}

/// Puts `value` at byte `at`.
fn patched(file: &[u8], at: usize, value: &[u8]) -> Vec<u8> {
    let mut out = file.to_vec();
    out[at..at + value.len()].copy_from_slice(value);
    out
}

#[test]
fn header_problems_are_named() {
    let file = sample();
    assert!(matches!(
        GgufFile::parse(b"GGU"),
        Err(Error::BadMagic { .. })
    ));
    assert!(matches!(
        GgufFile::parse(&patched(&file, 0, b"GGML")),
        Err(Error::BadMagic { .. })
    ));
    for version in [1u32, 4, 3 << 24] {
        let err = GgufFile::parse(&patched(&file, 4, &version.to_le_bytes())).unwrap_err();
        assert!(matches!(err, Error::UnsupportedVersion { version: v } if v == version));
    }
    let err = GgufFile::parse(&patched(&file, 4, &(3u32 << 24).to_le_bytes())).unwrap_err();
    assert!(err.to_string().contains("big-endian"), "{err}");
}

#[test]
fn absurd_counts_are_refused_before_allocating() {
    let file = sample();
    let err = GgufFile::parse(&patched(&file, 8, &(1u64 << 60).to_le_bytes())).unwrap_err();
    assert!(
        matches!(err, Error::CountTooLarge { count, .. } if count == 1 << 60),
        "{err}"
    );
    let err = GgufFile::parse(&patched(&file, 16, &u64::MAX.to_le_bytes())).unwrap_err();
    assert!(matches!(err, Error::CountTooLarge { .. }), "{err}");

    let mut w = Writer::new();
    w.kv(
        "big",
        ValueType::Array,
        &array(ValueType::U64, 1 << 61, &[]),
    );
    let err = GgufFile::parse(&w.build()).unwrap_err();
    assert!(
        err.to_string()
            .contains("array value of metadata key \"big\""),
        "{err}"
    );
}

#[test]
fn a_string_longer_than_the_file_is_truncation() {
    let mut w = Writer::new();
    let mut s = u64::MAX.to_le_bytes().to_vec();
    s.extend_from_slice(b"abc");
    w.kv("s", ValueType::String, &s);
    let err = GgufFile::parse(&w.build()).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Truncated {
                needed: u64::MAX,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn invalid_utf8_says_which_string() {
    let mut w = Writer::new();
    w.kv("ok", ValueType::U8, &[0]);
    let mut key = 2u64.to_le_bytes().to_vec();
    key.extend_from_slice(&[0xff, 0xfe]);
    w.kv.extend_from_slice(&key);
    w.kv.extend_from_slice(&0u32.to_le_bytes());
    w.kv.push(0);
    w.n_kv += 1;
    let err = GgufFile::parse(&w.build()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "key of metadata entry 1 is not valid UTF-8"
    );

    let mut w = Writer::new();
    let mut bad = 1u64.to_le_bytes().to_vec();
    bad.push(0xc3);
    w.kv(
        "tokens",
        ValueType::Array,
        &array(ValueType::String, 1, &bad),
    );
    let err = GgufFile::parse(&w.build()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "element 0 of value of metadata key \"tokens\" is not valid UTF-8"
    );

    let mut w = Writer::new();
    w.tensor("\u{e9}", &[1], 0, bytes(4, 0));
    let mut file = w.build();
    let at = file
        .windows(2)
        .position(|p| p == "\u{e9}".as_bytes())
        .unwrap();
    file[at + 1] = 0x41; // a lead byte followed by ASCII
    let err = GgufFile::parse(&file).unwrap_err();
    assert_eq!(err.to_string(), "name of tensor 0 is not valid UTF-8");
}

#[test]
fn tensor_layout_problems_are_named() {
    let build = |dims: &[u64], ty: u32, len: usize, offset: Option<u64>| {
        let mut w = Writer::new();
        w.tensor("t", dims, ty, bytes(len, 0));
        w.tensors[0].4 = offset;
        GgufFile::parse(&w.build()).map(|_| ())
    };
    assert!(build(&[32], 2, 18, None).is_ok());
    assert!(matches!(
        build(&[32], 2, 18, Some(16)),
        Err(Error::MisalignedOffset { offset: 16, .. })
    ));
    assert!(matches!(
        build(&[32], 2, 18, Some(32)),
        Err(Error::TensorOutOfRange { .. })
    ));
    assert!(matches!(
        build(&[32], 2, 17, None),
        Err(Error::TensorOutOfRange { .. })
    ));
    assert!(matches!(
        build(&[16, 2], 8, 34, None),
        Err(Error::RowNotBlockMultiple {
            ne0: 16,
            block_size: 32,
            ..
        })
    ));
    assert!(matches!(
        build(&[1 << 40, 1 << 40], 0, 4, None),
        Err(Error::SizeOverflow { .. })
    ));
    assert!(matches!(
        build(&[1, 1, 1, 1, 1], 0, 4, None),
        Err(Error::BadDimCount { n_dims: 5, .. })
    ));
    assert!(matches!(
        build(&[], 0, 4, None),
        Err(Error::BadDimCount { n_dims: 0, .. })
    ));
    assert!(matches!(
        build(&[1], 0, 4, Some(u64::MAX - 31)),
        Err(Error::SizeOverflow { .. })
    ));
    // Unknown types: only the start is checked.
    assert!(build(&[5], 77, 0, None).is_ok());
    assert!(matches!(
        build(&[5], 77, 0, Some(1 << 20)),
        Err(Error::TensorOutOfRange { .. })
    ));
}

#[test]
fn metadata_problems_are_named() {
    let mut w = Writer::new();
    w.kv("general.alignment", ValueType::U32, &48u32.to_le_bytes());
    assert!(matches!(
        GgufFile::parse(&w.build()),
        Err(Error::BadAlignment(48))
    ));
    let mut w = Writer::new();
    w.kv("general.alignment", ValueType::U64, &64u64.to_le_bytes());
    assert!(matches!(
        GgufFile::parse(&w.build()),
        Err(Error::WrongType { .. })
    ));
    let mut w = Writer::new();
    w.kv("k", ValueType::U8, &[1]).kv("k", ValueType::U8, &[2]);
    assert!(matches!(GgufFile::parse(&w.build()), Err(Error::DuplicateKey(k)) if k == "k"));
    let mut w = Writer::new();
    w.tensor("t", &[1], 0, bytes(4, 0))
        .tensor("t", &[1], 0, bytes(4, 0));
    assert!(matches!(
        GgufFile::parse(&w.build()),
        Err(Error::DuplicateTensor(_))
    ));
    let mut w = Writer::new();
    w.kv("k", ValueType::U8, &[]);
    w.kv.truncate(w.kv.len() - 4);
    w.kv.extend_from_slice(&13u32.to_le_bytes());
    w.kv.push(0);
    assert!(matches!(
        GgufFile::parse(&w.build()),
        Err(Error::UnknownValueType { type_id: 13, .. })
    ));
}

#[test]
fn deeply_nested_arrays_are_refused_without_overflowing_the_stack() {
    // 100 000 levels, each "an array of one array".
    let mut payload = array(ValueType::Array, 1, &[]).repeat(100_000);
    payload.extend(array(ValueType::U8, 0, &[]));
    let mut w = Writer::new();
    w.kv("deep", ValueType::Array, &payload);
    assert!(matches!(
        GgufFile::parse(&w.build()),
        Err(Error::NestingTooDeep { .. })
    ));
}

proptest! {
    #[test]
    fn random_byte_changes_never_panic(changes in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let mut file = sample();
        for (at, value) in changes {
            let i = at.index(file.len());
            file[i] = value;
        }
        if let Ok(g) = GgufFile::parse(&file) {
            for t in g.tensors() {
                let _ = g.tensor_bytes(t);
            }
        }
    }
}

#[test]
fn single_byte_changes_anywhere_never_panic() {
    let file = sample();
    for i in 0..file.len() {
        for value in [0x00, 0x01, 0x7f, 0x80, 0xff] {
            let _ = GgufFile::parse(&patched(&file, i, &[value]));
        }
    }
}

/// The SmolLM2 GGUF, fetched by `scripts/fetch-models` on first use.
fn smollm2_path() -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cache = match std::env::var_os("KVPACK_MODELS") {
        Some(dir) if !dir.is_empty() => std::path::PathBuf::from(dir),
        _ => root.join("model-cache"),
    };
    let path = cache.join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        let status = std::process::Command::new(root.join("scripts/fetch-models"))
            .status()
            .expect("run scripts/fetch-models");
        assert!(status.success(), "scripts/fetch-models failed");
    }
    path
}

/// Facts checked against gguf-py 0.19's GGUFReader on the same file.
#[test]
fn the_smollm2_file_reads_as_gguf_py_reads_it() {
    let file = gguf_file::read_file(smollm2_path()).unwrap();
    let g = GgufFile::parse(&file).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.metadata().len(), 33); // the header's kv_count
    assert_eq!(g.tensors().len(), 272);
    assert_eq!(g.alignment(), 32);
    assert_eq!(g.data_start(), 1_785_664);
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(g.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(g.get_u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(g.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(g.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(g.get_f32("llama.rope.freq_base").unwrap(), 100000.0);
    assert_eq!(
        g.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap(),
        1e-5
    );
    assert!(!g.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    let tokens = g.get_string_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(
        g.get_string_array("tokenizer.ggml.merges").unwrap().len(),
        48900
    );
    assert_eq!(
        g.get_i32_array("tokenizer.ggml.token_type").unwrap().len(),
        49152
    );
    assert_eq!(g.get_string_array("general.languages").unwrap(), ["en"]);

    let embd = g.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (embd.ty, embd.dims.as_slice(), embd.offset),
        (TensorType::Q8_0, &[576, 49152][..], 0)
    );
    assert_eq!(g.tensor_bytes(embd).unwrap().len(), 30_081_024);
    let q = g.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(
        (q.ty, q.dims.as_slice()),
        (TensorType::Q4_1, &[576, 576][..])
    );
    assert_eq!(g.tensor_bytes(q).unwrap().len(), 207_360);
    let count = |ty| g.tensors().iter().filter(|t| t.ty == ty).count();
    assert_eq!(
        (
            count(TensorType::Q4_1),
            count(TensorType::F32),
            count(TensorType::Q8_0)
        ),
        (210, 61, 1)
    );
}
