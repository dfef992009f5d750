//! SentencePiece ("SPM", `tokenizer.ggml.model = "llama"`) as llama.cpp runs it, for Gemma 3's
//! GGUF: the same ids as `llama_tokenize(text, add_special = true, parse_special = true)`.
//!
//! Source: llama.cpp commit `0c1e57098bba43ac29e6e3b677cdceebdd22334f` as vendored in PyPI
//! `llama-cpp-python==0.3.36` (`vendor/llama.cpp/src/llama-vocab.cpp`; line numbers below are
//! that file's). `llm_tokenizer_spm_session` reads the same in `ggml-org/llama.cpp@00ad355e`,
//! whose loader also refuses duplicate token texts (as this module does; the vendored copy lets
//! the last one win).
//!
//! Loading (`:1971-1980`, `:2430-2435`, `:2457`, `:2461-2543`, `:2615-2648`, `:3035-3047`):
//! - `tokenizer.ggml.tokens` (id = position; an empty text becomes `[EMPTY_<id>]`),
//!   `tokenizer.ggml.scores` (f32) and `tokenizer.ggml.token_type` (0 undefined, 1 normal,
//!   2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte). Here all three must be present and
//!   of one length, scores must not be NaN, types must be 0..=6, byte tokens must read `<0xXX>`,
//!   and every byte must have a token (`<0xXX>`, or the byte itself for ASCII: `:4001-4015`).
//! - `tokenizer.ggml.add_space_prefix` (default true), `tokenizer.ggml.add_bos_token` (default
//!   true), `tokenizer.ggml.bos_token_id` (default 1). `tokenizer.ggml.add_eos_token = true` is
//!   refused (not implemented), as are files named like Phi-3, whose special tokens llama.cpp
//!   gives an RSTRIP attribute by model name (`:3108-3135`); no other SPM file gets one.
//! - The special tokens are those of type control, user-defined or unknown, sorted by byte
//!   length, longest first. llama.cpp sorts with `std::sort`, which leaves the order of equal
//!   lengths unspecified; here they are ordered by id. In Gemma 3 no two special tokens of equal
//!   length can overlap in a text (a test checks it), so there the order cannot matter.
//!
//! Encoding a text (`tokenize`, `:3418-3483`):
//! 1. Partition (`tokenizer_st_partition`, `:3255-3371`): for each special token in the order
//!    above, every raw-text fragment left is split at each occurrence of the token's text,
//!    leftmost first and non-overlapping, the occurrences becoming that token. So a longer
//!    special wins over a shorter one that starts earlier and overlaps it ("abcd" with specials
//!    "bcd" and "ab" is `a`, `bcd`). With `parse_special = true`, control and unknown tokens are
//!    matched too, not only user-defined ones. (Only specials that occur in the whole text are
//!    scanned for, found in one pass over a trie: a token absent from the text is absent from
//!    every fragment, so the result is the same.)
//! 2. Each raw fragment: a space is put in front if `add_space_prefix` and the previous fragment
//!    was a special token or there was none (`:3452-3455`); then every `' '` becomes U+2581
//!    (`llama_escape_whitespace`, `:3390-3392`).
//! 3. SPM merge (`llm_tokenizer_spm_session`, `:97-239`): the fragment is cut into UTF-8
//!    characters; every adjacent pair whose concatenation is a token (of any type) goes into a
//!    max-heap keyed by that token's score, ties to the smaller left index (the comparator,
//!    `:99-101`). The top pair is popped; if either side was merged since it was pushed (its
//!    length changed or is 0) it is skipped, else the right symbol joins the left one and the
//!    pairs with the new neighbours are pushed. Until the heap is empty.
//! 4. Each final symbol that is a token is that token; any other (a character with no token)
//!    becomes one byte token per UTF-8 byte (`resegment`, `:177-201`; the `rev_merge` branch
//!    is never taken, as every merged symbol is a token).
//! 5. BOS is put first when `add_bos_token` (`:3442-3446`); no EOS.
//!
//! Scores are compared as C++ compares floats: `-0.0` equals `0.0` (Gemma 3 has a normal token
//! scored `-0.0` and byte tokens scored `0.0`), so scores are stored with `-0.0` made `0.0`.
//!
//! Decoding (`token_to_piece` with `special = false`, `:3660-3666`, `:3700-3716`): a normal token's text with
//! U+2581 turned back into a space; a user-defined token's text as is; a byte token's byte;
//! control, unknown, unused and undefined tokens give nothing (so BOS disappears). Bytes that do
//! not form UTF-8 (a cut inside a character) become U+FFFD.
//!
//! Checked on the real vocabulary (`tests/models/gemma3_tokenizer.rs`) against the ids that
//! `tests/data/gemma3_tokens/make_fixture.py` wrote with Google's `sentencepiece`, which llama.cpp
//! 0c1e5709 itself (through llama-cpp-python) gave too on every text, and transformers' GGUF
//! tokenizer on all but runs of more than 31 spaces.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use thiserror::Error;

/// Why a vocabulary cannot be used, or ids cannot be decoded.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SpmError {
    /// The GGUF's tokenizer is not the one this module implements.
    #[error("GGUF {key} is {found:?}; this tokenizer implements {expected}")]
    Unsupported {
        /// The metadata key.
        key: &'static str,
        /// Its value in the file.
        found: String,
        /// What this module implements.
        expected: &'static str,
    },
    /// The GGUF's tokenizer metadata is missing or of the wrong type.
    #[error("GGUF tokenizer metadata: {0}")]
    Gguf(#[from] gguf_file::Error),
    /// The vocabulary has no tokens, or more than `u32` ids can number.
    #[error("an SPM vocabulary needs between 1 and 2^32 - 1 tokens, got {0}")]
    VocabularySize(usize),
    /// An array has another length than `tokenizer.ggml.tokens`.
    #[error("{key} has {found} entries for {expected} tokens")]
    LengthMismatch {
        /// The metadata key.
        key: &'static str,
        /// Its length.
        found: usize,
        /// The number of tokens.
        expected: usize,
    },
    /// A score is NaN, which has no place in the merge order.
    #[error("token {id} has score {score}")]
    BadScore {
        /// The token id.
        id: u32,
        /// Its score.
        score: f32,
    },
    /// A token type outside llama.cpp's 0..=6.
    #[error("token {id} has type {value}, not one of llama.cpp's 0..=6")]
    BadTokenType {
        /// The token id.
        id: u32,
        /// Its type.
        value: i32,
    },
    /// A byte token whose text is not `<0xXX>`.
    #[error("token {id} is of type byte but reads {text:?}, not <0xXX>")]
    BadByteToken {
        /// The token id.
        id: u32,
        /// Its text.
        text: String,
    },
    /// No token for a byte, so byte fallback could not encode it.
    #[error("the vocabulary has no token for byte 0x{0:02X} (<0x{0:02X}>)")]
    MissingByteToken(u8),
    /// Two ids have the same token text.
    #[error("token {token:?} appears twice (ids {first} and {second})")]
    DuplicateToken {
        /// The text.
        token: String,
        /// Its first id.
        first: u32,
        /// The repeated id.
        second: u32,
    },
    /// A token id in the metadata is not in the vocabulary.
    #[error("{key} is {id}, outside the vocabulary of {vocabulary}")]
    IdOutOfRange {
        /// The metadata key.
        key: &'static str,
        /// The id.
        id: u32,
        /// The vocabulary size.
        vocabulary: usize,
    },
    /// An id to decode is not in the vocabulary.
    #[error("token id {id} is not in the vocabulary of {vocabulary}")]
    UnknownId {
        /// The id.
        id: u32,
        /// The vocabulary size.
        vocabulary: usize,
    },
}

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl Kind {
    fn from_gguf(value: i32) -> Option<Kind> {
        Some(match value {
            0 => Kind::Undefined,
            1 => Kind::Normal,
            2 => Kind::Unknown,
            3 => Kind::Control,
            4 => Kind::UserDefined,
            5 => Kind::Unused,
            6 => Kind::Byte,
            _ => return None,
        })
    }

    /// Matched in the raw text before merging (with `parse_special = true`).
    fn is_special(self) -> bool {
        matches!(self, Kind::Control | Kind::UserDefined | Kind::Unknown)
    }
}

/// The settings read from the GGUF beside the three arrays.
#[derive(Debug, Clone, Copy)]
struct Settings {
    bos: u32,
    add_bos: bool,
    add_space_prefix: bool,
}

/// llama.cpp's SPM tokenizer over one vocabulary (see the module docs).
#[derive(Debug, Clone)]
pub struct Spm {
    /// Token text by id.
    texts: Vec<Box<str>>,
    /// Score by id, `-0.0` stored as `0.0`.
    scores: Vec<f32>,
    kinds: Vec<Kind>,
    /// Token text -> id, every token.
    ids: HashMap<Box<str>, u32>,
    /// The token of each byte, for byte fallback.
    byte_ids: [u32; 256],
    /// The special tokens, longest text first, equal lengths by id.
    specials: Vec<u32>,
    /// The special tokens' texts, to find which occur in a text.
    trie: Trie,
    settings: Settings,
}

/// A text fragment of the partition: raw text, or a special token found in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

impl Spm {
    /// The tokenizer a GGUF file describes (the keys in the module docs), after checking that
    /// `tokenizer.ggml.model` is `llama`.
    pub fn from_gguf(gguf: &gguf_file::GgufFile<'_>) -> Result<Spm, SpmError> {
        let model = gguf.get_str("tokenizer.ggml.model")?;
        if model != "llama" {
            return Err(SpmError::Unsupported {
                key: "tokenizer.ggml.model",
                found: model.to_string(),
                expected: "\"llama\" (SentencePiece)",
            });
        }
        if gguf.get("general.name").is_some() {
            let name = gguf.get_str("general.name")?;
            let lower = name.to_lowercase();
            if lower.contains("phi-3") || lower.contains("phi3") {
                return Err(SpmError::Unsupported {
                    key: "general.name",
                    found: name.to_string(),
                    expected: "no Phi-3 model (llama.cpp strips spaces after its special tokens)",
                });
            }
        }
        let flag = |key: &str, default: bool| -> Result<bool, SpmError> {
            match gguf.get(key) {
                Some(_) => Ok(gguf.get_bool(key)?),
                None => Ok(default),
            }
        };
        if flag("tokenizer.ggml.add_eos_token", false)? {
            return Err(SpmError::Unsupported {
                key: "tokenizer.ggml.add_eos_token",
                found: "true".into(),
                expected: "add_eos_token = false",
            });
        }
        let settings = Settings {
            bos: match gguf.get("tokenizer.ggml.bos_token_id") {
                Some(_) => gguf.get_u32("tokenizer.ggml.bos_token_id")?,
                None => 1,
            },
            add_bos: flag("tokenizer.ggml.add_bos_token", true)?,
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix", true)?,
        };
        Spm::new(
            gguf.get_string_array("tokenizer.ggml.tokens")?,
            gguf.get_f32_array("tokenizer.ggml.scores")?,
            gguf.get_i32_array("tokenizer.ggml.token_type")?,
            settings,
        )
    }

    /// A tokenizer from the three arrays (id = position) and the settings, all checked.
    fn new(
        tokens: &[&str],
        scores: &[f32],
        types: &[i32],
        settings: Settings,
    ) -> Result<Spm, SpmError> {
        let n = tokens.len();
        if n == 0 || u32::try_from(n).is_err() {
            return Err(SpmError::VocabularySize(n));
        }
        for (key, found) in [
            ("tokenizer.ggml.scores", scores.len()),
            ("tokenizer.ggml.token_type", types.len()),
        ] {
            if found != n {
                return Err(SpmError::LengthMismatch {
                    key,
                    found,
                    expected: n,
                });
            }
        }
        let mut texts = Vec::with_capacity(n);
        let mut kept_scores = Vec::with_capacity(n);
        let mut kinds = Vec::with_capacity(n);
        let mut ids: HashMap<Box<str>, u32> = HashMap::with_capacity(n);
        for (id, ((&token, &score), &ty)) in (0u32..).zip(tokens.iter().zip(scores).zip(types)) {
            if score.is_nan() {
                return Err(SpmError::BadScore { id, score });
            }
            let kind = Kind::from_gguf(ty).ok_or(SpmError::BadTokenType { id, value: ty })?;
            let text: Box<str> = if token.is_empty() {
                format!("[EMPTY_{id}]").into()
            } else {
                token.into()
            };
            if kind == Kind::Byte && byte_of(&text).is_none() {
                return Err(SpmError::BadByteToken {
                    id,
                    text: text.into(),
                });
            }
            if let Some(first) = ids.insert(text.clone(), id) {
                return Err(SpmError::DuplicateToken {
                    token: text.into(),
                    first,
                    second: id,
                });
            }
            texts.push(text);
            // `-0.0 + 0.0` is `0.0`: equal scores compare equal under `total_cmp`.
            kept_scores.push(score + 0.0);
            kinds.push(kind);
        }
        let mut byte_ids = [0u32; 256];
        for (byte, slot) in (0u8..=255).zip(byte_ids.iter_mut()) {
            let hex = format!("<0x{byte:02X}>");
            let plain = (byte < 0x80).then(|| char::from(byte).to_string());
            *slot = ids
                .get(hex.as_str())
                .or_else(|| plain.and_then(|p| ids.get(p.as_str())))
                .copied()
                .ok_or(SpmError::MissingByteToken(byte))?;
        }
        if settings.bos as usize >= n {
            return Err(SpmError::IdOutOfRange {
                key: "tokenizer.ggml.bos_token_id",
                id: settings.bos,
                vocabulary: n,
            });
        }
        let mut specials: Vec<u32> = (0u32..)
            .zip(&kinds)
            .filter(|(_, kind)| kind.is_special())
            .map(|(id, _)| id)
            .collect();
        // Stable: equal lengths stay in id order.
        specials.sort_by_key(|&id| std::cmp::Reverse(texts[id as usize].len()));
        let trie = Trie::new(specials.iter().map(|&id| texts[id as usize].as_bytes()));
        Ok(Spm {
            texts,
            scores: kept_scores,
            kinds,
            ids,
            byte_ids,
            specials,
            trie,
            settings,
        })
    }

    /// The number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.texts.len()
    }

    /// The BOS id (`tokenizer.ggml.bos_token_id`), which [`Spm::encode`] puts first when the
    /// GGUF's `add_bos_token` is true.
    pub fn bos(&self) -> u32 {
        self.settings.bos
    }

    /// The token ids of `text`: BOS (if the GGUF says so), then the special tokens and merged
    /// pieces in order (module docs).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if self.settings.add_bos {
            out.push(self.settings.bos);
        }
        let mut after_special = true;
        let mut escaped = String::new();
        for fragment in self.partition(text) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(raw) => {
                    escaped.clear();
                    if self.settings.add_space_prefix && after_special {
                        escaped.push('\u{2581}');
                    }
                    escaped.extend(raw.chars().map(|c| if c == ' ' { '\u{2581}' } else { c }));
                    self.merge(&escaped, &mut out);
                    after_special = false;
                }
            }
        }
        out
    }

    /// The text `ids` stand for (module docs): Err only for an id outside the vocabulary.
    pub fn decode(&self, ids: &[u32]) -> Result<String, SpmError> {
        let mut bytes = Vec::new();
        for &id in ids {
            let text = self.texts.get(id as usize).ok_or(SpmError::UnknownId {
                id,
                vocabulary: self.texts.len(),
            })?;
            match self.kinds[id as usize] {
                Kind::Normal => {
                    for c in text.chars() {
                        let c = if c == '\u{2581}' { ' ' } else { c };
                        bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                    }
                }
                Kind::UserDefined => bytes.extend_from_slice(text.as_bytes()),
                Kind::Byte => bytes.extend(byte_of(text)),
                Kind::Control | Kind::Unknown | Kind::Unused | Kind::Undefined => {}
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Step 1: the text cut into raw fragments and special tokens.
    fn partition<'t>(&self, text: &'t str) -> Vec<Fragment<'t>> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut fragments = vec![Fragment::Text(text)];
        for rank in self.trie.ranks_in(text) {
            let id = self.specials[rank];
            let needle = &*self.texts[id as usize];
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text(mut rest) = fragment else {
                    next.push(fragment);
                    continue;
                };
                while let Some(at) = rest.find(needle) {
                    if at > 0 {
                        next.push(Fragment::Text(&rest[..at]));
                    }
                    next.push(Fragment::Token(id));
                    rest = &rest[at + needle.len()..];
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            fragments = next;
        }
        fragments
    }

    /// Steps 3 and 4 over one escaped fragment, appending its ids to `out`.
    fn merge(&self, text: &str, out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = text
            .char_indices()
            .map(|(start, c)| Symbol {
                start,
                len: c.len_utf8(),
                prev: None,
                next: None,
            })
            .collect();
        let count = symbols.len();
        for (i, symbol) in symbols.iter_mut().enumerate() {
            symbol.prev = i.checked_sub(1);
            symbol.next = (i + 1 < count).then_some(i + 1);
        }
        let mut heap = BinaryHeap::with_capacity(count);
        for right in 1..count {
            self.push_pair(text, &symbols, right - 1, right, &mut heap);
        }
        while let Some(pair) = heap.pop() {
            let (left, right) = (pair.left, pair.right);
            let (left_len, right_len) = (symbols[left].len, symbols[right].len);
            if left_len == 0 || right_len == 0 || left_len + right_len != pair.len {
                continue;
            }
            symbols[left].len += right_len;
            symbols[right].len = 0;
            let after = symbols[right].next;
            symbols[left].next = after;
            if let Some(after) = after {
                symbols[after].prev = Some(left);
            }
            if let Some(before) = symbols[left].prev {
                self.push_pair(text, &symbols, before, left, &mut heap);
            }
            if let Some(after) = after {
                self.push_pair(text, &symbols, left, after, &mut heap);
            }
        }
        let mut at = (count > 0).then_some(0);
        while let Some(i) = at {
            let piece = &text[symbols[i].start..symbols[i].start + symbols[i].len];
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => out.extend(piece.bytes().map(|b| self.byte_ids[b as usize])),
            }
            at = symbols[i].next;
        }
    }

    /// Pushes the pair (left, its next symbol `right`) if their concatenation is a token.
    fn push_pair(
        &self,
        text: &str,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        heap: &mut BinaryHeap<Pair>,
    ) {
        let start = symbols[left].start;
        let len = symbols[left].len + symbols[right].len;
        if let Some(&id) = self.ids.get(&text[start..start + len]) {
            heap.push(Pair {
                score: self.scores[id as usize],
                left,
                right,
                len,
            });
        }
    }
}

/// The byte a `<0xXX>` token stands for.
fn byte_of(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// A run of the fragment being merged: bytes `start..start + len` (`len` 0 once merged into
/// its left neighbour), linked to its live neighbours.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge: the symbols `left` and `right`, whose concatenation (`len` bytes when
/// pushed) is a token of score `score`.
#[derive(Debug, Clone, Copy)]
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl Ord for Pair {
    /// llama.cpp's order: the higher score, then the smaller left index, is the greater.
    fn cmp(&self, other: &Pair) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Pair) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Pair) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

/// A byte trie of the special tokens' texts, to list the ones a text contains.
#[derive(Debug, Clone, Default)]
struct Trie {
    /// (node, byte) -> child node; node 0 is the root.
    edges: HashMap<(u32, u8), u32>,
    /// The rank (position in `Spm::specials`) of the token ending at each node, if any.
    ends: Vec<Option<usize>>,
}

impl Trie {
    fn new<'a>(texts: impl Iterator<Item = &'a [u8]>) -> Trie {
        let mut trie = Trie {
            edges: HashMap::new(),
            ends: vec![None],
        };
        for (rank, text) in texts.enumerate() {
            let mut node = 0u32;
            for &b in text {
                node = match trie.edges.get(&(node, b)) {
                    Some(&child) => child,
                    None => {
                        let child = u32::try_from(trie.ends.len()).expect("fewer than 2^32 nodes");
                        trie.ends.push(None);
                        trie.edges.insert((node, b), child);
                        child
                    }
                };
            }
            // Texts are distinct, so each end node is reached by one rank.
            trie.ends[node as usize] = Some(rank);
        }
        trie
    }

    /// The ranks of the texts that occur in `text`, ascending.
    fn ranks_in(&self, text: &str) -> Vec<usize> {
        let bytes = text.as_bytes();
        let mut ranks = Vec::new();
        for start in 0..bytes.len() {
            let mut node = 0u32;
            for &b in &bytes[start..] {
                match self.edges.get(&(node, b)) {
                    Some(&child) => node = child,
                    None => break,
                }
                ranks.extend(self.ends[node as usize]);
            }
        }
        ranks.sort_unstable();
        ranks.dedup();
        ranks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NORMAL: i32 = 1;
    const CONTROL: i32 = 3;
    const USER: i32 = 4;

    /// A vocabulary: `<pad>`, `<eos>`, `<bos>` (control, ids 0..=2), the 256 byte tokens (ids
    /// 3..=258, score 0), then `extra` (text, score, type) from id 259 on.
    fn vocab(extra: &[(&str, f32, i32)], add_space_prefix: bool) -> Spm {
        let (tokens, scores, types) = arrays(extra);
        let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
        let settings = Settings {
            bos: 2,
            add_bos: true,
            add_space_prefix,
        };
        Spm::new(&tokens, &scores, &types, settings).unwrap()
    }

    fn arrays(extra: &[(&str, f32, i32)]) -> (Vec<String>, Vec<f32>, Vec<i32>) {
        let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>"].map(String::from).to_vec();
        let mut scores = vec![-1000.0; 3];
        let mut types = vec![CONTROL; 3];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            scores.push(0.0);
            types.push(6);
        }
        for &(text, score, ty) in extra {
            tokens.push(text.to_string());
            scores.push(score);
            types.push(ty);
        }
        (tokens, scores, types)
    }

    /// The texts of `ids`, BOS dropped.
    fn pieces(spm: &Spm, text: &str) -> Vec<String> {
        let ids = spm.encode(text);
        assert_eq!(ids[0], 2, "BOS first");
        ids[1..]
            .iter()
            .map(|&id| spm.texts[id as usize].to_string())
            .collect()
    }

    fn letters() -> Vec<(&'static str, f32, i32)> {
        ["a", "b", "c", "d", "x", "y", "z", "\u{2581}"]
            .iter()
            .map(|&t| (t, -100.0, NORMAL))
            .collect()
    }

    #[test]
    fn the_pair_whose_token_scores_highest_merges_first() {
        let mut v = letters();
        v.extend([("ab", -2.0, NORMAL), ("bc", -1.0, NORMAL)]);
        assert_eq!(pieces(&vocab(&v, false), "abc"), ["a", "bc"]);
        let mut v = letters();
        v.extend([("ab", -1.0, NORMAL), ("bc", -2.0, NORMAL)]);
        assert_eq!(pieces(&vocab(&v, false), "abc"), ["ab", "c"]);
        // Merged symbols merge again: ab, cd, then abcd.
        let mut v = letters();
        v.extend([
            ("ab", -1.0, NORMAL),
            ("cd", -2.0, NORMAL),
            ("abcd", -3.0, NORMAL),
        ]);
        assert_eq!(pieces(&vocab(&v, false), "abcd"), ["abcd"]);
        // bc outranks both, and then neither abc nor bcd is a token: a, bc, d.
        v.push(("bc", -0.5, NORMAL));
        assert_eq!(pieces(&vocab(&v, false), "abcd"), ["a", "bc", "d"]);
    }

    #[test]
    fn equal_scores_merge_the_leftmost_pair_and_minus_zero_equals_zero() {
        let mut v = letters();
        v.push(("aa", -1.0, NORMAL));
        assert_eq!(pieces(&vocab(&v, false), "aaa"), ["aa", "a"]);
        assert_eq!(pieces(&vocab(&v, false), "aaaaa"), ["aa", "aa", "a"]);
        let mut v = letters();
        v.extend([("ab", -1.0, NORMAL), ("bc", -1.0, NORMAL)]);
        assert_eq!(pieces(&vocab(&v, false), "abc"), ["ab", "c"]);
        // -0.0 on the left, 0.0 on the right: equal in C++, so the left pair wins.
        let mut v = letters();
        v.extend([("ab", -0.0, NORMAL), ("bc", 0.0, NORMAL)]);
        assert_eq!(pieces(&vocab(&v, false), "abc"), ["ab", "c"]);
    }

    #[test]
    fn characters_without_a_token_fall_back_to_uppercase_byte_tokens() {
        let spm = vocab(&letters(), false);
        assert_eq!(
            pieces(&spm, "aé€b"),
            ["a", "<0xC3>", "<0xA9>", "<0xE2>", "<0x82>", "<0xAC>", "b"]
        );
        assert_eq!(spm.decode(&spm.encode("aé€b")).unwrap(), "aé€b");
        // A byte token can be the product of merges too (it is in llama.cpp's map).
        let mut v = letters();
        v.extend([
            ("<0", -1.0, NORMAL),
            ("<0x", -2.0, NORMAL),
            ("<0x4", -3.0, NORMAL),
        ]);
        v.extend([
            ("<0x41", -4.0, NORMAL),
            ("<", -100.0, NORMAL),
            (">", -100.0, NORMAL),
        ]);
        v.extend([
            ("0", -100.0, NORMAL),
            ("4", -100.0, NORMAL),
            ("1", -100.0, NORMAL),
        ]);
        let spm = vocab(&v, false);
        assert_eq!(pieces(&spm, "<0x41>"), ["<0x41>"]);
        assert_eq!(spm.decode(&spm.encode("<0x41>")).unwrap(), "A");
    }

    #[test]
    fn spaces_become_u2581_with_a_prefix_only_when_the_file_asks() {
        let mut v = letters();
        v.push(("\u{2581}b", -1.0, NORMAL));
        v.push(("\u{2581}a", -1.0, NORMAL));
        v.push(("<start>", -1000.0, CONTROL));
        let spm = vocab(&v, false);
        assert_eq!(pieces(&spm, "a b"), ["a", "\u{2581}b"]);
        assert_eq!(pieces(&spm, "a<start>b"), ["a", "<start>", "b"]);
        assert_eq!(spm.decode(&spm.encode("a b ")).unwrap(), "a b ");
        let spm = vocab(&v, true);
        assert_eq!(pieces(&spm, "a b"), ["\u{2581}a", "\u{2581}b"]);
        // After a special token the next fragment gets a prefix too; after text it does not.
        assert_eq!(
            pieces(&spm, "a<start>b"),
            ["\u{2581}a", "<start>", "\u{2581}b"]
        );
    }

    #[test]
    fn special_tokens_split_the_text_longest_first_then_by_id() {
        let mut v = letters();
        v.extend([
            ("\n", -1000.0, USER),
            ("\n\n", -1000.0, USER),
            ("bcd", -1000.0, USER),
            ("ab", -1000.0, CONTROL),
            ("xy", -1000.0, USER),
            ("yz", -1000.0, USER),
            ("  ", -1000.0, USER),
        ]);
        let spm = vocab(&v, false);
        assert_eq!(pieces(&spm, "a\n\n\nb"), ["a", "\n\n", "\n", "b"]);
        // Longest first, not leftmost: "bcd" is taken before "ab" is looked for.
        assert_eq!(pieces(&spm, "abcd"), ["a", "bcd"]);
        assert_eq!(pieces(&spm, "abab"), ["ab", "ab"]);
        // Equal lengths: the lower id ("xy") first.
        assert_eq!(pieces(&spm, "xyz"), ["xy", "z"]);
        // Raw spaces are matched before they become U+2581; a lone one is merged as U+2581.
        assert_eq!(pieces(&spm, "a   b"), ["a", "  ", "\u{2581}", "b"]);
        // Control tokens are matched too (parse_special), and decode to nothing.
        assert_eq!(spm.decode(&spm.encode("zab\n")).unwrap(), "z\n");
        assert_eq!(spm.encode(""), [2]);
        assert_eq!(spm.decode(&[2]).unwrap(), "");
    }

    #[test]
    fn decoding_maps_u2581_back_and_refuses_unknown_ids() {
        let mut v = letters();
        v.push(("\u{2581}\u{2581}x", -1.0, NORMAL));
        let spm = vocab(&v, false);
        let id = spm.ids["\u{2581}\u{2581}x"];
        assert_eq!(spm.decode(&[id, 3 + 0x41]).unwrap(), "  xA");
        // A byte sequence cut inside a character.
        assert_eq!(spm.decode(&[3 + 0xE2, 3 + 0x82]).unwrap(), "\u{FFFD}");
        let n = spm.vocab_size() as u32;
        assert!(matches!(
            spm.decode(&[n]),
            Err(SpmError::UnknownId { id, .. }) if id == n
        ));
    }

    /// A change to the three arrays.
    type Edit<'a> = &'a dyn Fn(&mut Vec<String>, &mut Vec<f32>, &mut Vec<i32>);

    #[test]
    fn bad_vocabularies_are_refused_by_name() {
        let settings = Settings {
            bos: 2,
            add_bos: true,
            add_space_prefix: false,
        };
        let build = |edit: Edit| {
            let (mut tokens, mut scores, mut types) = arrays(&[("a", -1.0, NORMAL)]);
            edit(&mut tokens, &mut scores, &mut types);
            let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
            Spm::new(&tokens, &scores, &types, settings)
        };
        assert!(build(&|_, _, _| {}).is_ok());
        assert!(matches!(
            build(&|_, s, _| {
                s.pop();
            }),
            Err(SpmError::LengthMismatch {
                key: "tokenizer.ggml.scores",
                ..
            })
        ));
        assert!(matches!(
            build(&|_, _, t| t.push(1)),
            Err(SpmError::LengthMismatch {
                key: "tokenizer.ggml.token_type",
                ..
            })
        ));
        assert!(matches!(
            build(&|_, s, _| s[259] = f32::NAN),
            Err(SpmError::BadScore { id: 259, .. })
        ));
        assert!(matches!(
            build(&|_, _, t| t[259] = 7),
            Err(SpmError::BadTokenType { id: 259, value: 7 })
        ));
        assert!(matches!(
            build(&|tok, _, _| tok[259] = "<bos>".into()),
            Err(SpmError::DuplicateToken {
                first: 2,
                second: 259,
                ..
            })
        ));
        assert!(matches!(
            build(&|tok, _, _| tok[3 + 0x41] = "<0x4G>".into()),
            Err(SpmError::BadByteToken { id: 68, .. })
        ));
        // Without <0x41>, "A" itself would serve; without either, refused.
        assert!(
            build(&|tok, _, t| {
                tok[3 + 0x41] = "A".into();
                t[3 + 0x41] = NORMAL;
            })
            .is_ok()
        );
        assert!(matches!(
            build(&|tok, _, t| {
                tok[3 + 0xE9] = "é".into();
                t[3 + 0xE9] = NORMAL;
            }),
            Err(SpmError::MissingByteToken(0xE9))
        ));
        assert!(matches!(
            Spm::new(&[], &[], &[], settings),
            Err(SpmError::VocabularySize(0))
        ));
        let (tokens, scores, types) = arrays(&[]);
        let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
        let far = Settings {
            bos: 259,
            ..settings
        };
        assert!(matches!(
            Spm::new(&tokens, &scores, &types, far),
            Err(SpmError::IdOutOfRange { id: 259, .. })
        ));
        // An empty text is renamed as llama.cpp does.
        let spm = build(&|tok, _, _| tok[259] = String::new()).unwrap();
        assert_eq!(&*spm.texts[259], "[EMPTY_259]");
    }

    /// GGUF v3 bytes with the given metadata and no tensors.
    fn gguf_bytes(entries: &[(&str, Meta)]) -> Vec<u8> {
        fn string(out: &mut Vec<u8>, s: &str) {
            out.extend((s.len() as u64).to_le_bytes());
            out.extend(s.as_bytes());
        }
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out.extend((entries.len() as u64).to_le_bytes());
        for (key, value) in entries {
            string(&mut out, key);
            match value {
                Meta::Str(s) => {
                    out.extend(8u32.to_le_bytes());
                    string(&mut out, s);
                }
                Meta::U32(v) => {
                    out.extend(4u32.to_le_bytes());
                    out.extend(v.to_le_bytes());
                }
                Meta::Bool(v) => {
                    out.extend(7u32.to_le_bytes());
                    out.push(u8::from(*v));
                }
                Meta::Strs(items) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(8u32.to_le_bytes());
                    out.extend((items.len() as u64).to_le_bytes());
                    for s in items {
                        string(&mut out, s);
                    }
                }
                Meta::F32s(items) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(6u32.to_le_bytes());
                    out.extend((items.len() as u64).to_le_bytes());
                    items.iter().for_each(|v| out.extend(v.to_le_bytes()));
                }
                Meta::I32s(items) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(5u32.to_le_bytes());
                    out.extend((items.len() as u64).to_le_bytes());
                    items.iter().for_each(|v| out.extend(v.to_le_bytes()));
                }
            }
        }
        out
    }

    enum Meta {
        Str(String),
        U32(u32),
        Bool(bool),
        Strs(Vec<String>),
        F32s(Vec<f32>),
        I32s(Vec<i32>),
    }

    fn from_entries(entries: &[(&str, Meta)]) -> Result<Spm, SpmError> {
        let bytes = gguf_bytes(entries);
        Spm::from_gguf(&gguf_file::GgufFile::parse(&bytes).unwrap())
    }

    fn gguf_entries(model: &str) -> Vec<(&'static str, Meta)> {
        let (tokens, scores, types) = arrays(&[
            ("a", -1.0, NORMAL),
            ("\u{2581}a", -2.0, NORMAL),
            ("\n", -1000.0, USER),
        ]);
        vec![
            ("general.name", Meta::Str("Tiny".into())),
            ("tokenizer.ggml.model", Meta::Str(model.into())),
            ("tokenizer.ggml.tokens", Meta::Strs(tokens)),
            ("tokenizer.ggml.scores", Meta::F32s(scores)),
            ("tokenizer.ggml.token_type", Meta::I32s(types)),
        ]
    }

    #[test]
    fn from_gguf_reads_the_settings_with_llama_cpp_defaults() {
        // Defaults: BOS 1, add_bos and add_space_prefix true.
        let spm = from_entries(&gguf_entries("llama")).unwrap();
        assert_eq!(spm.bos(), 1);
        assert_eq!(spm.vocab_size(), 262);
        let (a, space_a, newline) = (259, 260, 261);
        assert_eq!(spm.encode("a\na"), [1, space_a, newline, space_a]);
        let mut entries = gguf_entries("llama");
        entries.extend([
            ("tokenizer.ggml.bos_token_id", Meta::U32(2)),
            ("tokenizer.ggml.add_bos_token", Meta::Bool(false)),
            ("tokenizer.ggml.add_space_prefix", Meta::Bool(false)),
            ("tokenizer.ggml.add_eos_token", Meta::Bool(false)),
        ]);
        let spm = from_entries(&entries).unwrap();
        assert_eq!(spm.bos(), 2);
        assert_eq!(spm.encode("a\na"), [a, newline, a]);
        assert!(spm.encode("").is_empty());
    }

    #[test]
    fn from_gguf_refuses_other_tokenizers_and_missing_keys() {
        assert!(matches!(
            from_entries(&gguf_entries("gpt2")),
            Err(SpmError::Unsupported {
                key: "tokenizer.ggml.model",
                ..
            })
        ));
        let mut entries = gguf_entries("llama");
        entries.push(("tokenizer.ggml.add_eos_token", Meta::Bool(true)));
        assert!(matches!(
            from_entries(&entries),
            Err(SpmError::Unsupported {
                key: "tokenizer.ggml.add_eos_token",
                ..
            })
        ));
        let mut entries = gguf_entries("llama");
        entries[0].1 = Meta::Str("Phi-3 mini".into());
        assert!(matches!(
            from_entries(&entries),
            Err(SpmError::Unsupported {
                key: "general.name",
                ..
            })
        ));
        let mut entries = gguf_entries("llama");
        entries.retain(|(k, _)| *k != "tokenizer.ggml.scores");
        let err = from_entries(&entries).unwrap_err();
        assert!(matches!(err, SpmError::Gguf(_)), "{err}");
        assert!(err.to_string().contains("tokenizer.ggml.scores"), "{err}");
        let mut entries = gguf_entries("llama");
        entries.push(("tokenizer.ggml.bos_token_id", Meta::U32(262)));
        assert!(matches!(
            from_entries(&entries),
            Err(SpmError::IdOutOfRange { id: 262, .. })
        ));
        let mut entries = gguf_entries("llama");
        entries.push(("tokenizer.ggml.add_bos_token", Meta::U32(1)));
        assert!(matches!(from_entries(&entries), Err(SpmError::Gguf(_))));
    }
}
