//! Gemma 3 270M's tokenizer (`models::tokenizer::spm`, llama.cpp's SPM) on the real vocabulary,
//! against `tests/data/gemma3_tokens/expected.json`: ids from Google's `sentencepiece` on a model
//! rebuilt from the same GGUF, which llama.cpp's own `llama_tokenize` gave too, and transformers'
//! GGUF tokenizer except on runs of more than 31 spaces (`make_fixture.py` says how and why). The
//! GGUF is fetched by `scripts/fetch-models` on first use.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use models::files;
use models::tokenizer::spm::Spm;
use serde::Deserialize;

const WEIGHT_FILE: &str = "gemma-3-270m-q4_k_m.gguf";
const WEIGHT_SHA256: &str = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";

/// The GGUF in the model cache (`$KVPACK_MODELS`), fetched when missing, hash-checked.
fn gguf_path() -> PathBuf {
    let path = files::default_cache().join("gemma3").join(WEIGHT_FILE);
    if !path.is_file() {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch-models");
        let status = std::process::Command::new(&script)
            .status()
            .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
        assert!(
            status.success(),
            "scripts/fetch-models exited with {status}"
        );
    }
    let found = files::sha256_file(&path).expect("hash the GGUF");
    assert_eq!(found, WEIGHT_SHA256, "{}", path.display());
    path
}

/// The tokenizer and the file's bytes, loaded once for all tests of this file.
fn loaded() -> &'static (Spm, Vec<u8>) {
    static LOADED: OnceLock<(Spm, Vec<u8>)> = OnceLock::new();
    LOADED.get_or_init(|| {
        let bytes = gguf_file::read_file(gguf_path()).expect("read the GGUF");
        let start = Instant::now();
        let spm = Spm::from_gguf(&gguf_file::GgufFile::parse(&bytes).expect("parse")).unwrap();
        eprintln!("tokenizer load: {:.2?}", start.elapsed());
        (spm, bytes)
    })
}

fn spm() -> &'static Spm {
    &loaded().0
}

#[derive(Deserialize)]
struct Fixture {
    gguf: FixtureFile,
    texts: Vec<Case>,
}

#[derive(Deserialize)]
struct FixtureFile {
    sha256: String,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    text: String,
    round_trip: bool,
    ids: Vec<u32>,
}

fn fixture() -> Fixture {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gemma3_tokens/expected.json");
    let json = std::fs::read_to_string(&path).expect("expected.json");
    let fixture: Fixture = serde_json::from_str(&json).expect("expected.json parses");
    assert_eq!(fixture.gguf.sha256, WEIGHT_SHA256);
    fixture
}

#[test]
fn the_public_prompt_and_greedy_continuation_match_the_reference() {
    let spm = spm();
    assert_eq!(spm.vocab_size(), 262_144);
    assert_eq!(spm.bos(), 2);
    assert_eq!(
        spm.encode("The capital of France is"),
        [2, 818, 5279, 529, 7001, 563]
    );
    // The reference's greedy 16 (shared/reference/real-models/gemma3/public.json).
    let greedy = [
        506, 5279, 529, 506, 2891, 529, 7001, 236761, 1030, 563, 506, 7488, 3207, 528, 7001, 532,
    ];
    assert_eq!(
        spm.decode(&greedy).unwrap(),
        " the capital of the country of France. It is the largest city in France and"
    );
}

#[test]
fn every_fixture_text_gets_sentencepieces_ids() {
    let spm = spm();
    let fixture = fixture();
    let mut failures = Vec::new();
    let mut tokens = 0;
    for case in &fixture.texts {
        let ids = spm.encode(&case.text);
        tokens += case.ids.len();
        if ids != case.ids {
            let at = ids
                .iter()
                .zip(&case.ids)
                .position(|(a, b)| a != b)
                .unwrap_or(ids.len().min(case.ids.len()));
            let window = |v: &[u32]| v[at.saturating_sub(2)..(at + 6).min(v.len())].to_vec();
            failures.push(format!(
                "{}: first difference at {at} of {} / {}: got {:?}, expected {:?}",
                case.name,
                ids.len(),
                case.ids.len(),
                window(&ids),
                window(&case.ids)
            ));
        }
    }
    eprintln!(
        "{} texts, {tokens} expected ids, {} mismatched texts",
        fixture.texts.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(fixture.texts.len() >= 25 && tokens > 5000);
}

#[test]
fn decoding_gives_back_every_text_without_control_tokens() {
    let spm = spm();
    let fixture = fixture();
    let mut checked = 0;
    for case in fixture.texts.iter().filter(|c| c.round_trip) {
        assert_eq!(
            spm.decode(&spm.encode(&case.text)).unwrap(),
            case.text,
            "{}",
            case.name
        );
        checked += 1;
    }
    assert!(checked >= 20, "{checked} texts round-tripped");
    // Control tokens (BOS, <start_of_turn>, ...) decode to nothing, the rest to their text.
    let chat = "<start_of_turn>user\nhi<end_of_turn>";
    assert_eq!(spm.decode(&spm.encode(chat)).unwrap(), "user\nhi");
}

#[test]
fn an_8192_token_text_encodes_and_decodes_back() {
    let spm = spm();
    let fixture = fixture();
    // The texts without control tokens, repeated: every kind of piece, and a text decoding gives
    // back whole.
    let mut text = String::new();
    while spm.encode(&text).len() < 8192 {
        for case in fixture.texts.iter().filter(|c| c.round_trip) {
            text.push_str(&case.text);
            text.push('\n');
        }
    }
    let start = Instant::now();
    let ids = spm.encode(&text);
    let took = start.elapsed();
    eprintln!(
        "encode: {} tokens ({} bytes) in {took:.2?}",
        ids.len(),
        text.len()
    );
    // The time is printed, never asserted (a loaded machine is no failure).
    assert!(ids.len() >= 8192);
    assert_eq!(spm.decode(&ids).unwrap(), text);
}

/// The module's docs say the order among special tokens of equal length, which llama.cpp leaves
/// to `std::sort`, cannot change a Gemma 3 tokenization: no two of them can overlap in a text
/// (a proper suffix of one equal to a prefix of the other), so their splits commute.
#[test]
fn no_two_special_tokens_of_equal_length_can_overlap() {
    let gguf = gguf_file::GgufFile::parse(&loaded().1).unwrap();
    let tokens = gguf.get_string_array("tokenizer.ggml.tokens").unwrap();
    let types = gguf.get_i32_array("tokenizer.ggml.token_type").unwrap();
    let specials: Vec<&[u8]> = tokens
        .iter()
        .zip(types)
        .filter(|&(_, &ty)| matches!(ty, 2..=4))
        .map(|(t, _)| t.as_bytes())
        .collect();
    assert_eq!(specials.len(), 6414);
    // (length, prefix) -> the specials of that length starting with it.
    let mut prefixes: HashMap<(usize, &[u8]), Vec<&[u8]>> = HashMap::new();
    for &s in &specials {
        for k in 1..s.len() {
            prefixes.entry((s.len(), &s[..k])).or_default().push(s);
        }
    }
    for &a in &specials {
        for k in 1..a.len() {
            if let Some(bs) = prefixes.get(&(a.len(), &a[a.len() - k..])) {
                let others: Vec<_> = bs.iter().filter(|&&b| b != a).collect();
                assert!(
                    others.is_empty(),
                    "{:?} overlaps {:?}",
                    String::from_utf8_lossy(a),
                    others
                );
            }
        }
    }
}
