//! Byte-level BPE as SmolLM2's GGUF describes it (`tokenizer.ggml.model = gpt2`,
//! `tokenizer.ggml.pre = smollm`), the same ids as Hugging Face `tokenizers` and llama.cpp give.
//!
//! Encoding a text:
//! 1. Pre-tokenization, in two passes (HF's `Digits(individual_digits)` then `ByteLevel`'s
//!    regex; llama.cpp's `smollm` pre-tokenizer is the same two expressions):
//!    - every number character (`\p{N}`: general categories Nd, Nl, No) is a piece of its own;
//!    - each run between them is split by GPT-2's expression
//!      `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`,
//!      alternatives tried in order at each position. The lookahead makes a run of whitespace
//!      that is followed by something else leave its last whitespace character to the next
//!      piece (so `"  word"` is `" "`, `" word"`); a single whitespace character before a
//!      non-space (`"\nword"`) is a piece by itself through the last alternative.
//!      The contractions are case-sensitive, `?` is an ASCII space only, `\s` is Unicode
//!      White_Space.
//! 2. Each piece's UTF-8 bytes become characters of GPT-2's byte alphabet (printable Latin-1
//!    bytes stand for themselves, the other 68 bytes for U+0100 onwards, in byte order; so a
//!    space is `Ġ`), one starting symbol per byte.
//! 3. Within a piece, the adjacent pair of symbols whose merge comes first in the merge list is
//!    merged, the leftmost such pair on a tie, until no pair has a merge; each final symbol is a
//!    token.
//!
//! Special tokens (`<|im_start|>`, ...) are not recognised in the text: it is encoded as plain
//! text, as the studies feed it (no chat template, no BOS: `add_bos_token` is false).
//!
//! The hand-written scanner replaces a regex engine because the expression needs a lookahead;
//! `\p{L}` comes from `regex-syntax`'s Unicode tables (`char::is_alphabetic` is the Alphabetic
//! property, which also holds marks such as Devanagari vowel signs and the Nl numbers, so it
//! would split differently), `\p{N}` is `char::is_numeric` and `\s` is `char::is_whitespace`,
//! which are exactly those properties.

use std::collections::HashMap;

use thiserror::Error;

/// Why a vocabulary cannot be used, or ids cannot be decoded.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BpeError {
    /// The vocabulary has no tokens, or more than `u32` ids can number.
    #[error("a BPE vocabulary needs between 1 and 2^32 - 1 tokens, got {0}")]
    VocabularySize(usize),
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
    /// A token has a character outside GPT-2's byte alphabet, so it stands for no bytes.
    #[error(
        "token {id} ({token:?}) has the character {ch:?}, which is not in the byte-level alphabet"
    )]
    NotByteLevel {
        /// The token id.
        id: u32,
        /// Its text.
        token: String,
        /// The offending character.
        ch: char,
    },
    /// The text has a character one of whose bytes has no token of its own (SmolLM2 has none
    /// for the control characters U+0004, U+0006, U+0013, U+0014, U+0016 and U+001D).
    /// Hugging Face `tokenizers` and llama.cpp drop such bytes silently; this refuses.
    #[error(
        "cannot encode {ch:?} at byte {offset} of the text: the vocabulary has no token for its byte 0x{byte:02x}"
    )]
    Unencodable {
        /// The character.
        ch: char,
        /// Its byte offset in the text.
        offset: usize,
        /// The byte without a token.
        byte: u8,
    },
    /// A merge is not two token texts separated by one space.
    #[error("merge {rank} ({merge:?}) is not two tokens separated by one space")]
    MalformedMerge {
        /// Its position in the merge list.
        rank: usize,
        /// Its text.
        merge: String,
    },
    /// A merge names a token (one of its parts, or their concatenation) that is not in the
    /// vocabulary.
    #[error("merge {rank} ({merge:?}) needs the token {token:?}, which is not in the vocabulary")]
    MergeTokenMissing {
        /// Its position in the merge list.
        rank: usize,
        /// Its text.
        merge: String,
        /// The missing token.
        token: String,
    },
    /// The GGUF's tokenizer is not the one this module implements.
    #[error("GGUF {key} is {found:?}; this tokenizer implements {expected:?}")]
    Unsupported {
        /// The metadata key.
        key: &'static str,
        /// Its value in the file.
        found: String,
        /// The value this module implements.
        expected: &'static str,
    },
    /// The GGUF's tokenizer metadata is missing or of the wrong type.
    #[error("GGUF tokenizer metadata: {0}")]
    Gguf(#[from] gguf_file::Error),
    /// An id to decode is not in the vocabulary.
    #[error("token id {id} is not in the vocabulary of {vocabulary}")]
    UnknownId {
        /// The id.
        id: u32,
        /// The vocabulary size.
        vocabulary: usize,
    },
}

/// A byte-level BPE tokenizer: token texts (id = position) and the ranked merges.
#[derive(Debug, Clone)]
pub struct Bpe {
    /// The bytes each token stands for, by id.
    token_bytes: Vec<Vec<u8>>,
    /// The token of each single byte, where the vocabulary has one.
    byte_token: [Option<u32>; 256],
    /// (left id, right id) -> (rank, merged id).
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// `\p{L}` as sorted, disjoint inclusive ranges.
    letters: Vec<(char, char)>,
}

impl Bpe {
    /// A tokenizer from token texts (in GPT-2's byte alphabet; the id of a token is its
    /// position) and merges (`"left right"`, first = applied first). Checks that the texts are
    /// distinct and byte-level and that every merge's parts and result are tokens.
    /// Bytes without a token of their own are allowed; [`Bpe::encode`] refuses texts that have
    /// them. When a pair is listed twice, its first rank counts.
    pub fn new(tokens: Vec<String>, merges: Vec<String>) -> Result<Bpe, BpeError> {
        if tokens.is_empty() || u32::try_from(tokens.len()).is_err() {
            return Err(BpeError::VocabularySize(tokens.len()));
        }
        let alphabet = ByteAlphabet::new();
        let mut ids: HashMap<&str, u32> = HashMap::with_capacity(tokens.len());
        let mut token_bytes = Vec::with_capacity(tokens.len());
        for (id, token) in (0u32..).zip(&tokens) {
            if let Some(first) = ids.insert(token, id) {
                return Err(BpeError::DuplicateToken {
                    token: token.clone(),
                    first,
                    second: id,
                });
            }
            let bytes = token
                .chars()
                .map(|ch| {
                    alphabet.byte_of(ch).ok_or_else(|| BpeError::NotByteLevel {
                        id,
                        token: token.clone(),
                        ch,
                    })
                })
                .collect::<Result<Vec<u8>, _>>()?;
            token_bytes.push(bytes);
        }
        let mut byte_token = [None; 256];
        for (byte, slot) in (0u8..=255).zip(byte_token.iter_mut()) {
            *slot = ids
                .get(alphabet.char_of(byte).to_string().as_str())
                .copied();
        }
        let mut merge_map = HashMap::with_capacity(merges.len());
        for (rank, merge) in merges.iter().enumerate() {
            let malformed = || BpeError::MalformedMerge {
                rank,
                merge: merge.clone(),
            };
            let (left, right) = merge.split_once(' ').ok_or_else(malformed)?;
            if left.is_empty() || right.is_empty() || right.contains(' ') {
                return Err(malformed());
            }
            let rank32 = u32::try_from(rank).map_err(|_| malformed())?;
            let id_of = |token: &str| {
                ids.get(token)
                    .copied()
                    .ok_or_else(|| BpeError::MergeTokenMissing {
                        rank,
                        merge: merge.clone(),
                        token: token.to_string(),
                    })
            };
            let pair = (id_of(left)?, id_of(right)?);
            let merged = id_of(&format!("{left}{right}"))?;
            merge_map.entry(pair).or_insert((rank32, merged));
        }
        Ok(Bpe {
            token_bytes,
            byte_token,
            merges: merge_map,
            letters: letter_ranges(),
        })
    }

    /// The tokenizer a GGUF file describes: `tokenizer.ggml.tokens` and `tokenizer.ggml.merges`,
    /// after checking that `tokenizer.ggml.model` is `gpt2` and `tokenizer.ggml.pre` is `smollm`
    /// (the pre-tokenizer this module implements).
    pub fn from_gguf(gguf: &gguf_file::GgufFile<'_>) -> Result<Bpe, BpeError> {
        for (key, expected) in [
            ("tokenizer.ggml.model", "gpt2"),
            ("tokenizer.ggml.pre", "smollm"),
        ] {
            let found = gguf.get_str(key)?;
            if found != expected {
                return Err(BpeError::Unsupported {
                    key,
                    found: found.to_string(),
                    expected,
                });
            }
        }
        let owned = |list: &[&str]| list.iter().map(|s| s.to_string()).collect();
        Bpe::new(
            owned(gguf.get_string_array("tokenizer.ggml.tokens")?),
            owned(gguf.get_string_array("tokenizer.ggml.merges")?),
        )
    }

    /// The number of tokens.
    pub fn vocabulary_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// The token ids of `text` (no BOS, special tokens not recognised; see the module docs).
    /// Refuses a text with a byte that has no token ([`BpeError::Unencodable`]).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, BpeError> {
        if let Some((offset, ch)) = text
            .char_indices()
            .find(|&(_, ch)| self.missing_byte(ch).is_some())
        {
            let byte = self.missing_byte(ch).unwrap_or_default();
            return Err(BpeError::Unencodable { ch, offset, byte });
        }
        let mut ids = Vec::new();
        for piece in self.pre_tokenize(text) {
            self.encode_piece(piece.as_bytes(), &mut ids);
        }
        Ok(ids)
    }

    /// The first byte of `ch` that has no token.
    fn missing_byte(&self, ch: char) -> Option<u8> {
        let mut buf = [0u8; 4];
        ch.encode_utf8(&mut buf)
            .bytes()
            .find(|&b| self.byte_token[b as usize].is_none())
    }

    /// The bytes `ids` stand for. Bytes, not a string: a token may end inside a UTF-8
    /// character (the next token completes it).
    pub fn decode(&self, ids: &[u32]) -> Result<Vec<u8>, BpeError> {
        let mut out = Vec::new();
        for &id in ids {
            let bytes = self
                .token_bytes
                .get(id as usize)
                .ok_or(BpeError::UnknownId {
                    id,
                    vocabulary: self.token_bytes.len(),
                })?;
            out.extend_from_slice(bytes);
        }
        Ok(out)
    }

    /// The pieces BPE runs on, in order; they concatenate to `text`.
    pub fn pre_tokenize<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut pieces = Vec::new();
        let mut start = 0;
        for (at, ch) in text.char_indices() {
            if ch.is_numeric() {
                self.split_gpt2(&text[start..at], &mut pieces);
                let end = at + ch.len_utf8();
                pieces.push(&text[at..end]);
                start = end;
            }
        }
        self.split_gpt2(&text[start..], &mut pieces);
        pieces
    }

    /// GPT-2's expression (module docs) over `text`, appending the matches to `pieces`.
    fn split_gpt2<'t>(&self, text: &'t str, pieces: &mut Vec<&'t str>) {
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        let n = chars.len();
        let byte_at = |i: usize| chars.get(i).map_or(text.len(), |&(b, _)| b);
        let class = |i: usize| chars.get(i).map(|&(_, ch)| self.class_of(ch));
        let mut i = 0;
        while i < n {
            let ch = chars[i].1;
            let end = if let Some(len) = contraction(&chars[i..]) {
                i + len
            } else {
                // ` ?X+` for X = letters, numbers, others: an optional ASCII space, then a run.
                let body = if ch == ' ' && matches!(class(i + 1), Some(c) if c != Class::Space) {
                    i + 1
                } else {
                    i
                };
                match class(body) {
                    Some(c) if c != Class::Space => {
                        let mut j = body + 1;
                        while class(j) == Some(c) {
                            j += 1;
                        }
                        j
                    }
                    _ => {
                        // Whitespace: `\s+(?!\S)`, else `\s+`.
                        let mut j = i + 1;
                        while class(j) == Some(Class::Space) {
                            j += 1;
                        }
                        if j < n && j - i >= 2 { j - 1 } else { j }
                    }
                }
            };
            pieces.push(&text[byte_at(i)..byte_at(end)]);
            i = end;
        }
    }

    fn class_of(&self, ch: char) -> Class {
        if ch.is_whitespace() {
            Class::Space
        } else if ch.is_numeric() {
            Class::Number
        } else if self.is_letter(ch) {
            Class::Letter
        } else {
            Class::Other
        }
    }

    fn is_letter(&self, ch: char) -> bool {
        // The ranges are sorted and disjoint: the last range starting at or before `ch`.
        let after = self.letters.partition_point(|&(start, _)| start <= ch);
        after > 0 && ch <= self.letters[after - 1].1
    }

    /// BPE over one piece's bytes, each of which has a token (checked by [`Bpe::encode`]).
    fn encode_piece(&self, bytes: &[u8], out: &mut Vec<u32>) {
        let mut symbols: Vec<u32> = bytes
            .iter()
            .filter_map(|&b| self.byte_token[b as usize])
            .collect();
        // Quadratic in the piece length, which is a word or a run of spaces: fine here.
        loop {
            let best = symbols
                .windows(2)
                .enumerate()
                .filter_map(|(at, pair)| {
                    self.merges
                        .get(&(pair[0], pair[1]))
                        .map(|&(rank, merged)| (rank, at, merged))
                })
                .min_by_key(|&(rank, at, _)| (rank, at));
            match best {
                Some((_, at, merged)) => {
                    symbols[at] = merged;
                    symbols.remove(at + 1);
                }
                None => break,
            }
        }
        out.extend_from_slice(&symbols);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Number,
    Space,
    Other,
}

/// The length in characters of a contraction (`'s|'t|'re|'ve|'m|'ll|'d`) at the start of
/// `chars`, if there is one.
fn contraction(chars: &[(usize, char)]) -> Option<usize> {
    let c = |i: usize| chars.get(i).map(|&(_, ch)| ch);
    if c(0) != Some('\'') {
        return None;
    }
    match (c(1), c(2)) {
        (Some('s' | 't' | 'm' | 'd'), _) => Some(2),
        (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l')) => Some(3),
        _ => None,
    }
}

/// `\p{L}` (general categories Lu, Ll, Lt, Lm, Lo) as sorted inclusive ranges.
fn letter_ranges() -> Vec<(char, char)> {
    use regex_syntax::hir::{Class as HirClass, HirKind};
    let hir = regex_syntax::parse(r"\p{L}").expect("\\p{L} is a valid class");
    match hir.kind() {
        HirKind::Class(HirClass::Unicode(class)) => class
            .ranges()
            .iter()
            .map(|r| (r.start(), r.end()))
            .collect(),
        other => unreachable!("\\p{{L}} parses to a Unicode class, not {other:?}"),
    }
}

/// GPT-2's reversible map between bytes and printable characters.
struct ByteAlphabet {
    chars: [char; 256],
}

impl ByteAlphabet {
    fn new() -> ByteAlphabet {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut chars = ['\0'; 256];
        let mut next = 256u32;
        for (b, slot) in (0u8..=255).zip(chars.iter_mut()) {
            *slot = if printable(b) {
                char::from(b)
            } else {
                let ch = char::from_u32(next).expect("U+0100..U+0143 are characters");
                next += 1;
                ch
            };
        }
        ByteAlphabet { chars }
    }

    fn char_of(&self, byte: u8) -> char {
        self.chars[byte as usize]
    }

    fn byte_of(&self, ch: char) -> Option<u8> {
        let code = u32::from(ch);
        match code {
            0..=255 if self.chars[code as usize] == ch => Some(code as u8),
            256..=0x143 => (0u8..=255).find(|&b| self.chars[b as usize] == ch),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vocabulary of the 256 byte tokens plus the given merges' results.
    fn tiny(merges: &[&str]) -> Bpe {
        let alphabet = ByteAlphabet::new();
        let mut tokens: Vec<String> = (0u8..=255)
            .map(|b| alphabet.char_of(b).to_string())
            .collect();
        for m in merges {
            tokens.push(m.replace(' ', ""));
        }
        Bpe::new(tokens, merges.iter().map(|m| m.to_string()).collect()).unwrap()
    }

    fn pieces(text: &str) -> Vec<&str> {
        tiny(&[]).pre_tokenize(text)
    }

    #[test]
    fn the_byte_alphabet_is_gpt2s() {
        let a = ByteAlphabet::new();
        assert_eq!(a.char_of(b' '), 'Ġ');
        assert_eq!(a.char_of(b'\n'), 'Ċ');
        assert_eq!(a.char_of(b'A'), 'A');
        assert_eq!(a.char_of(0xE9), 'é');
        for b in 0u8..=255 {
            assert_eq!(a.byte_of(a.char_of(b)), Some(b));
        }
        assert_eq!(a.byte_of('Ω'), None);
    }

    #[test]
    fn digits_are_pieces_of_their_own_and_take_no_space() {
        assert_eq!(
            pieces("2^20 x, 128"),
            ["2", "^", "2", "0", " x", ",", " ", "1", "2", "8"]
        );
        // Nl and No numbers too (the Roman numeral twelve, one half, superscript two).
        assert_eq!(pieces("Ⅻ½²"), ["Ⅻ", "½", "²"]);
    }

    #[test]
    fn whitespace_runs_leave_their_last_character_to_the_next_word() {
        assert_eq!(pieces("a  b"), ["a", " ", " b"]);
        assert_eq!(pieces("a\n\n   b"), ["a", "\n\n  ", " b"]);
        assert_eq!(pieces("a\nb"), ["a", "\n", "b"]);
        assert_eq!(pieces("a \tb"), ["a", " ", "\t", "b"]);
        assert_eq!(pieces("end  "), ["end", "  "]);
    }

    #[test]
    fn contractions_are_lowercase_only_and_punctuation_takes_one_space() {
        assert_eq!(pieces("don't"), ["don", "'t"]);
        assert_eq!(pieces("They'RE"), ["They", "'", "RE"]);
        assert_eq!(pieces("we'll ok"), ["we", "'ll", " ok"]);
        assert_eq!(pieces("a --out"), ["a", " --", "out"]);
    }

    #[test]
    fn letters_are_general_category_l_not_the_alphabetic_property() {
        // U+093F DEVANAGARI VOWEL SIGN I is Alphabetic but a mark (Mc), not a letter.
        assert!('\u{93F}'.is_alphabetic());
        assert_eq!(pieces("हि"), ["ह", "\u{93F}"]);
        assert_eq!(pieces("naïve"), ["naïve"]);
    }

    #[test]
    fn merges_apply_by_rank_leftmost_first() {
        // "a b" outranks "b c": abc -> [ab, c], whichever pair comes first in the text.
        let bpe = tiny(&["a b", "b c", "ab c"]);
        let abc = bpe.encode("abc").unwrap();
        assert_eq!(abc.len(), 1, "ab + c merges third");
        assert_eq!(bpe.decode(&abc).unwrap(), b"abc");
        assert_eq!(bpe.encode("bc").unwrap().len(), 1);
        // Three a's with only "a a": the leftmost pair merges.
        let bpe = tiny(&["a a"]);
        let aa = bpe.encode("aa").unwrap()[0];
        // In this vocabulary a byte's token id is the byte.
        assert_eq!(bpe.encode("aaa").unwrap(), [aa, u32::from(b'a')]);
    }

    proptest::proptest! {
        #[test]
        fn pieces_cover_the_text_and_decoding_gives_back_its_bytes(text in "\\PC{0,40}") {
            let bpe = tiny(&["a b", "Ġ a", "Ġa b", "Ġ Ġ"]);
            proptest::prop_assert_eq!(bpe.pre_tokenize(&text).concat(), text.clone());
            let ids = bpe.encode(&text).unwrap();
            proptest::prop_assert_eq!(bpe.decode(&ids).unwrap(), text.as_bytes());
        }
    }

    #[test]
    fn bad_vocabularies_and_ids_are_refused_by_name() {
        let alphabet = ByteAlphabet::new();
        let bytes: Vec<String> = (0u8..=255)
            .map(|b| alphabet.char_of(b).to_string())
            .collect();
        let without_0x04: Vec<String> = bytes
            .iter()
            .filter(|t| t.as_str() != "Ą")
            .cloned()
            .collect();
        let bpe = Bpe::new(without_0x04, vec![]).unwrap();
        assert!(matches!(
            bpe.encode("a\u{4}"),
            Err(BpeError::Unencodable {
                ch: '\u{4}',
                offset: 1,
                byte: 4
            })
        ));
        let mut dup = bytes.clone();
        dup.push("A".into());
        assert!(matches!(
            Bpe::new(dup, vec![]),
            Err(BpeError::DuplicateToken { .. })
        ));
        let mut odd = bytes.clone();
        odd.push("Ωx".into());
        assert!(matches!(
            Bpe::new(odd, vec![]),
            Err(BpeError::NotByteLevel { ch: 'Ω', .. })
        ));
        let err = Bpe::new(bytes.clone(), vec!["a b".into()]).unwrap_err();
        assert!(err.to_string().contains("\"ab\""), "{err}");
        let err = Bpe::new(bytes.clone(), vec!["ab".into()]).unwrap_err();
        assert!(matches!(err, BpeError::MalformedMerge { rank: 0, .. }));
        assert!(matches!(
            Bpe::new(vec![], vec![]),
            Err(BpeError::VocabularySize(0))
        ));
        let bpe = Bpe::new(bytes, vec![]).unwrap();
        assert!(matches!(
            bpe.decode(&[256]),
            Err(BpeError::UnknownId {
                id: 256,
                vocabulary: 256
            })
        ));
    }
}
