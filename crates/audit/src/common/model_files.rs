//! The real models, loaded for a re-run from exactly the bytes the audit hashed.
//!
//! Re-running a model pass is the only way to check that archived q, K and V (or per-position
//! log-probabilities) are what the model computes, so the audit runs the `models` crate's forward
//! passes and tokenizers. It may: those passes are held by their own tests to the public NumPy
//! references of the three models (`crates/models/tests/`), as `nprand` is held to NumPy's generator.
//! What it must not trust is the model cache: each file the re-run reads (the weight file, and
//! MiniLM's `config.json` and `vocab.txt`) is read once, as a confined regular file under a size
//! cap, hashed, held to the audit's own pin ([`ModelName::pin`]), and parsed from those same
//! bytes, so what was hashed is what runs.

use std::path::Path;

use models::bert::MiniLm;
use models::gemma3::Gemma3;
use models::llama::Llama;
use models::tokenizer::bpe::Bpe;
use models::tokenizer::spm::Spm;
use models::{Capture, CausalLm};

use crate::common::files;
use crate::common::hashes::sha256_hex;
use crate::common::models::ModelName;
use crate::common::options::Models;
use crate::common::report::{Note, Problem, Report};

/// Largest model file the audit reads (the pinned ones are 90 to 250 MB).
pub const MAX_MODEL_BYTES: u64 = 4 << 30;

/// A model ready to re-run passes.
pub enum LoadedModel {
    /// all-MiniLM-L6-v2 and its WordPiece vocabulary.
    MiniLm(Box<MiniLm>),
    /// SmolLM2-135M and its BPE tokenizer, both from the one GGUF file.
    SmolLm2 {
        /// The decoder.
        llama: Box<Llama>,
        /// Its tokenizer.
        bpe: Box<Bpe>,
    },
    /// Gemma 3 270M and its SentencePiece tokenizer, both from the one GGUF file.
    Gemma3 {
        /// The decoder.
        model: Box<Gemma3>,
        /// Its tokenizer.
        spm: Box<Spm>,
    },
}

/// Loads `model` for a re-run. None, with a note saying why, when the models are not to be
/// used or the model is not in the cache: the evidence is then UNVERIFIED. A file that is there
/// but not the pinned one, or does not parse, is a FAIL.
pub fn load(model: ModelName, models: &Models, report: &mut Report) -> Option<LoadedModel> {
    let cache = match models {
        Models::Skip => {
            report.note(Note::ModelsNotUsed);
            return None;
        }
        Models::Cache(cache) => cache,
    };
    let folder = cache.join(model.name());
    if !folder.is_dir() {
        report.note(Note::ModelMissing(folder.display().to_string()));
        return None;
    }
    match read_pinned(model, &folder) {
        Ok(model) => {
            report.note(Note::ModelFilesChecked(folder.display().to_string()));
            Some(model)
        }
        Err(problem) => {
            report.fail(problem);
            None
        }
    }
}

/// Reads each pinned file once, checks its hash, and builds the model from those bytes.
fn read_pinned(model: ModelName, folder: &Path) -> Result<LoadedModel, Problem> {
    let pin = model.pin();
    let read = |name: &str, sha256: &str| -> Result<Vec<u8>, Problem> {
        let shown = folder.join(name).display().to_string();
        let bytes = files::read_confined(folder, name, MAX_MODEL_BYTES).map_err(|e| {
            Problem::ModelFile {
                path: shown.clone(),
                reason: e.to_string(),
            }
        })?;
        let found = sha256_hex(&bytes);
        if found != sha256 {
            return Err(Problem::ModelFile {
                path: shown,
                reason: format!("SHA-256 {found}, pinned {sha256}"),
            });
        }
        Ok(bytes)
    };
    let unparsed = |name: &str, reason: String| Problem::ModelFile {
        path: folder.join(name).display().to_string(),
        reason,
    };
    let weights = read(pin.weight_file, pin.weight_sha256)?;
    match model {
        ModelName::MiniLm => {
            let mut other = pin.other_files.iter();
            let mut next = |want: &str| match other.next() {
                Some(&(name, sha256)) if name == want => read(name, sha256),
                _ => Err(unparsed(want, "not pinned by the audit".into())),
            };
            let config = next("config.json")?;
            let vocab = next("vocab.txt")?;
            MiniLm::from_bytes(&config, &weights, &vocab)
                .map(|m| LoadedModel::MiniLm(Box::new(m)))
                .map_err(|e| unparsed(pin.weight_file, chain(&e)))
        }
        ModelName::SmolLm2 => {
            let gguf = gguf_file::GgufFile::parse(&weights)
                .map_err(|e| unparsed(pin.weight_file, chain(&e)))?;
            let bpe = Bpe::from_gguf(&gguf).map_err(|e| unparsed(pin.weight_file, chain(&e)))?;
            let llama =
                Llama::from_gguf(&gguf).map_err(|e| unparsed(pin.weight_file, chain(&e)))?;
            Ok(LoadedModel::SmolLm2 {
                llama: Box::new(llama),
                bpe: Box::new(bpe),
            })
        }
        ModelName::Gemma3 => {
            let gguf = gguf_file::GgufFile::parse(&weights)
                .map_err(|e| unparsed(pin.weight_file, chain(&e)))?;
            let spm = Spm::from_gguf(&gguf).map_err(|e| unparsed(pin.weight_file, chain(&e)))?;
            let model =
                Gemma3::from_gguf(&gguf).map_err(|e| unparsed(pin.weight_file, chain(&e)))?;
            Ok(LoadedModel::Gemma3 {
                model: Box::new(model),
                spm: Box::new(spm),
            })
        }
    }
}

/// An error and its causes on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl LoadedModel {
    /// The ids of a text's first `tokens` tokens as a run records them, by the evidence format's
    /// rule (written here, not taken from the runner): SmolLM2's first `tokens` BPE ids (no BOS);
    /// Gemma 3's BOS and then its first `tokens - 1` SentencePiece ids; MiniLM's `[CLS]`, the
    /// first `tokens - 2` word pieces and `[SEP]`. None if the text is too short or does not
    /// tokenize.
    pub fn encode_prefix(&self, text: &str, tokens: usize) -> Option<Vec<u32>> {
        match self {
            LoadedModel::Gemma3 { spm, .. } => {
                let mut ids = spm.encode(text);
                (ids.len() >= tokens && ids.first() == Some(&spm.bos())).then(|| {
                    ids.truncate(tokens);
                    ids
                })
            }
            LoadedModel::SmolLm2 { bpe, .. } => {
                let mut ids = bpe.encode(text).ok()?;
                (ids.len() >= tokens).then(|| {
                    ids.truncate(tokens);
                    ids
                })
            }
            LoadedModel::MiniLm(m) => {
                let mut ids = m.tokenizer().encode(text);
                if ids.len() < tokens || tokens < 2 {
                    return None;
                }
                let sep = *ids.last()?;
                ids.truncate(tokens - 1);
                ids.push(sep);
                Some(ids)
            }
        }
    }

    /// One plain forward pass (Gemma 3's without its LM head, which no re-run compares).
    pub fn forward(&self, ids: &[u32]) -> Result<Capture, String> {
        match self {
            LoadedModel::SmolLm2 { llama, .. } => llama.forward(ids).map_err(|e| chain(&e)),
            // Without the LM head: a re-run compares q, K and V only.
            LoadedModel::Gemma3 { model, .. } => model
                .hidden_with(ids, |_, _, _| Ok(()))
                .map(|(hidden, layers)| Capture {
                    ids: ids.to_vec(),
                    layers,
                    hidden,
                    logits: None,
                })
                .map_err(|e| chain(&e)),
            LoadedModel::MiniLm(m) => m.forward(ids).map_err(|e| chain(&e)),
        }
    }

    /// A decoder and its tokenizer, for model-quality re-runs (None for MiniLM).
    pub fn decoder(&self) -> Option<(&dyn CausalLm, DecoderTokenizer<'_>)> {
        match self {
            LoadedModel::SmolLm2 { llama, bpe } => {
                Some((llama.as_ref(), DecoderTokenizer::Bpe(bpe)))
            }
            LoadedModel::Gemma3 { model, spm } => {
                Some((model.as_ref(), DecoderTokenizer::Spm(spm)))
            }
            LoadedModel::MiniLm(_) => None,
        }
    }
}

/// A decoder's tokenizer: SmolLM2's BPE (no BOS) or Gemma 3's SentencePiece (BOS first).
#[derive(Clone, Copy)]
pub enum DecoderTokenizer<'a> {
    /// SmolLM2's.
    Bpe(&'a Bpe),
    /// Gemma 3's.
    Spm(&'a Spm),
}

impl DecoderTokenizer<'_> {
    /// The text's ids as the model reads it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        match self {
            DecoderTokenizer::Bpe(bpe) => bpe.encode(text).map_err(|e| e.to_string()),
            DecoderTokenizer::Spm(spm) => Ok(spm.encode(text)),
        }
    }

    /// Ids as text, invalid UTF-8 replaced (the evidence format's rule for generated text).
    pub fn decode(&self, ids: &[u32]) -> Result<String, String> {
        match self {
            DecoderTokenizer::Bpe(bpe) => bpe
                .decode(ids)
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                .map_err(|e| e.to_string()),
            DecoderTokenizer::Spm(spm) => spm.decode(ids).map_err(|e| e.to_string()),
        }
    }
}
