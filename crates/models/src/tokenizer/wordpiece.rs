//! BERT's WordPiece tokenizer, as all-MiniLM-L6-v2's `tokenizer.json` configures it, with its
//! padding and truncation turned off (the file pads every text to 128 ids; the model sees the
//! unpadded ids).
//!
//! The steps, each as the `tokenizers` library does it:
//! 1. the special tokens (`[CLS]`, `[SEP]`, `[PAD]`, `[UNK]`, `[MASK]`) written literally in the
//!    text are matched first, on the raw text, and become their own ids;
//! 2. `BertNormalizer` on the text between them: drop NUL, U+FFFD and control characters
//!    (Unicode `C*`, except tab, CR and LF), turn whitespace into a space, put spaces around CJK
//!    ideographs, strip accents (NFD, then drop non-spacing marks `Mn`), lowercase;
//! 3. `BertPreTokenizer`: split on whitespace (dropped) and around every punctuation character
//!    (ASCII punctuation, which includes symbols such as `$+<=>^|~`, and Unicode `P*`);
//! 4. WordPiece: longest vocabulary match first, continuations prefixed `##`; a word longer than
//!    100 characters, or one that cannot be covered, becomes a single `[UNK]`;
//! 5. `[CLS] ... [SEP]` around the whole.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use thiserror::Error;
use unicode_general_category::{GeneralCategory, get_general_category};
use unicode_normalization::UnicodeNormalization;

/// Words longer than this many characters become `[UNK]` (`max_input_chars_per_word`).
pub const MAX_WORD_CHARS: usize = 100;

/// The special tokens of the vocabulary, matched literally in the text before normalizing.
const SPECIAL_TOKENS: [&str; 5] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];

/// Why a vocabulary cannot be used.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// Reading the vocabulary file failed (missing, unreadable or not UTF-8).
    #[error("cannot read the vocabulary {}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A token the encoder needs is not in the vocabulary.
    #[error("the vocabulary has no {0} token")]
    MissingToken(&'static str),
    /// The same token on two lines: ids would not map back to one token.
    #[error("the vocabulary lists {token:?} twice, as id {first} and id {second}")]
    DuplicateToken {
        /// The token.
        token: String,
        /// Its first id (line number from 0).
        first: u32,
        /// The line that repeats it.
        second: u32,
    },
    /// More tokens than a `u32` id can number.
    #[error("the vocabulary has more than 2^32 tokens")]
    TooLarge,
}

/// A WordPiece vocabulary and the BERT text pipeline around it.
#[derive(Debug, Clone)]
pub struct WordPiece {
    ids: HashMap<String, u32>,
    tokens: Vec<String>,
    unk: u32,
    cls: u32,
    sep: u32,
}

impl WordPiece {
    /// Reads `vocab.txt`: one token per line, the id of a token is its line number from 0.
    pub fn from_vocab_file(path: &Path) -> Result<WordPiece, TokenizerError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        WordPiece::from_vocab(&text)
    }

    /// Builds the tokenizer from the text of a `vocab.txt`. Lines lose trailing whitespace
    /// (a CRLF file reads as an LF one), as `tokenizers` reads them.
    pub fn from_vocab(text: &str) -> Result<WordPiece, TokenizerError> {
        let mut ids = HashMap::new();
        let mut tokens = Vec::new();
        for (line, token) in text.lines().enumerate() {
            let id = u32::try_from(line).map_err(|_| TokenizerError::TooLarge)?;
            let token = token.trim_end();
            if let Some(&first) = ids.get(token) {
                return Err(TokenizerError::DuplicateToken {
                    token: token.to_string(),
                    first,
                    second: id,
                });
            }
            ids.insert(token.to_string(), id);
            tokens.push(token.to_string());
        }
        let find = |name: &'static str| {
            ids.get(name)
                .copied()
                .ok_or(TokenizerError::MissingToken(name))
        };
        Ok(WordPiece {
            unk: find("[UNK]")?,
            cls: find("[CLS]")?,
            sep: find("[SEP]")?,
            ids,
            tokens,
        })
    }

    /// The number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The token with this id, if the vocabulary has one.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of this token, if it is in the vocabulary.
    pub fn id(&self, token: &str) -> Option<u32> {
        self.ids.get(token).copied()
    }

    /// The ids of `text` as the model reads it: `[CLS]`, the text's word pieces, `[SEP]`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = vec![self.cls];
        let mut rest = text;
        while !rest.is_empty() {
            match self.next_special(rest) {
                Some((at, token, id)) => {
                    self.encode_plain(&rest[..at], &mut out);
                    out.push(id);
                    rest = &rest[at + token.len()..];
                }
                None => {
                    self.encode_plain(rest, &mut out);
                    rest = "";
                }
            }
        }
        out.push(self.sep);
        out
    }

    /// The first special token written in `text` (earliest start, then longest), if any.
    fn next_special(&self, text: &str) -> Option<(usize, &'static str, u32)> {
        SPECIAL_TOKENS
            .iter()
            .filter_map(|&token| Some((text.find(token)?, token, self.id(token)?)))
            .min_by_key(|&(at, token, _)| (at, std::cmp::Reverse(token.len())))
    }

    /// Normalizes, splits and WordPiece-encodes text that holds no special token.
    fn encode_plain(&self, text: &str, out: &mut Vec<u32>) {
        let normalized = normalize(text);
        for word in pre_tokenize(&normalized) {
            self.encode_word(word, out);
        }
    }

    /// Greedy longest-match-first WordPiece of one word; the whole word is `[UNK]` when it is
    /// too long or some part of it matches nothing.
    fn encode_word(&self, word: &str, out: &mut Vec<u32>) {
        if word.chars().count() > MAX_WORD_CHARS {
            out.push(self.unk);
            return;
        }
        let mark = out.len();
        let mut start = 0;
        let mut piece = String::new();
        while start < word.len() {
            let mut end = word.len();
            let found = loop {
                piece.clear();
                if start > 0 {
                    piece.push_str("##");
                }
                piece.push_str(&word[start..end]);
                if let Some(id) = self.id(&piece) {
                    break Some(id);
                }
                // Shorten by one character, staying on a character boundary.
                match word[start..end].char_indices().next_back() {
                    Some((last, _)) if last > 0 => end = start + last,
                    _ => break None,
                }
            };
            match found {
                Some(id) => {
                    out.push(id);
                    start = end;
                }
                None => {
                    out.truncate(mark);
                    out.push(self.unk);
                    return;
                }
            }
        }
    }
}

/// `BertNormalizer` with clean_text, handle_chinese_chars, strip_accents and lowercase on.
fn normalize(text: &str) -> String {
    let mut cleaned = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\0' || c == '\u{FFFD}' || is_control(c) {
            continue;
        }
        if is_whitespace(c) {
            cleaned.push(' ');
        } else if is_chinese_char(c) {
            cleaned.push(' ');
            cleaned.push(c);
            cleaned.push(' ');
        } else {
            cleaned.push(c);
        }
    }
    // Accents go before lowercasing, in the order `tokenizers` applies them.
    cleaned
        .nfd()
        .filter(|&c| get_general_category(c) != GeneralCategory::NonspacingMark)
        .flat_map(char::to_lowercase)
        .collect()
}

/// Tab, LF and CR count as whitespace although Unicode calls them control characters.
fn is_whitespace(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || c.is_whitespace()
}

/// Unicode "Other" (`Cc`, `Cf`, `Cn`, `Co`), except tab, LF and CR.
fn is_control(c: char) -> bool {
    if matches!(c, '\t' | '\n' | '\r') {
        return false;
    }
    matches!(
        get_general_category(c),
        GeneralCategory::Control
            | GeneralCategory::Format
            | GeneralCategory::Unassigned
            | GeneralCategory::PrivateUse
            | GeneralCategory::Surrogate
    )
}

/// The CJK ideograph blocks BERT isolates (its list, not Unicode's Han script).
fn is_chinese_char(c: char) -> bool {
    matches!(
        c as u32,
        0x4E00..=0x9FFF
            | 0x3400..=0x4DBF
            | 0x20000..=0x2A6DF
            | 0x2A700..=0x2B73F
            | 0x2B740..=0x2B81F
            | 0x2B920..=0x2CEAF
            | 0xF900..=0xFAFF
            | 0x2F800..=0x2FA1F
    )
}

/// ASCII punctuation (which includes ASCII symbols) or Unicode punctuation `P*`.
fn is_punctuation(c: char) -> bool {
    c.is_ascii_punctuation()
        || matches!(
            get_general_category(c),
            GeneralCategory::ConnectorPunctuation
                | GeneralCategory::DashPunctuation
                | GeneralCategory::OpenPunctuation
                | GeneralCategory::ClosePunctuation
                | GeneralCategory::InitialPunctuation
                | GeneralCategory::FinalPunctuation
                | GeneralCategory::OtherPunctuation
        )
}

/// `BertPreTokenizer`: words between whitespace, each punctuation character a word of its own.
fn pre_tokenize(text: &str) -> Vec<&str> {
    let mut words = Vec::new();
    for chunk in text.split(char::is_whitespace) {
        let mut start = 0;
        for (at, c) in chunk.char_indices() {
            if is_punctuation(c) {
                if start < at {
                    words.push(&chunk[start..at]);
                }
                words.push(&chunk[at..at + c.len_utf8()]);
                start = at + c.len_utf8();
            }
        }
        if start < chunk.len() {
            words.push(&chunk[start..]);
        }
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vocabulary small enough to read: ids are the line numbers.
    fn tiny() -> WordPiece {
        let vocab =
            "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nun\n##aff\n##able\n.\n,\ncafe\n##s\na\n##b\n";
        WordPiece::from_vocab(vocab).unwrap()
    }

    fn tokens(wp: &WordPiece, text: &str) -> Vec<String> {
        wp.encode(text)
            .into_iter()
            .map(|id| wp.token(id).unwrap().to_string())
            .collect()
    }

    #[test]
    fn words_split_into_the_longest_pieces_and_get_cls_and_sep() {
        let wp = tiny();
        assert_eq!(
            tokens(&wp, "the unaffable."),
            ["[CLS]", "the", "un", "##aff", "##able", ".", "[SEP]"]
        );
        assert_eq!(wp.encode(""), [2, 3]);
    }

    #[test]
    fn a_word_with_an_uncoverable_part_is_one_unk() {
        let wp = tiny();
        // "un" matches, then "##x" does not: the pieces already pushed are taken back.
        assert_eq!(tokens(&wp, "unx the"), ["[CLS]", "[UNK]", "the", "[SEP]"]);
    }

    #[test]
    fn a_word_over_100_characters_is_unk_even_if_it_could_be_covered() {
        let wp = tiny();
        let hundred = format!("a{}", "b".repeat(99));
        let long = format!("a{}", "b".repeat(100));
        assert_eq!(wp.encode(&hundred).len(), 2 + 100);
        assert_eq!(tokens(&wp, &long), ["[CLS]", "[UNK]", "[SEP]"]);
    }

    #[test]
    fn the_normalizer_lowercases_strips_accents_and_cleans() {
        assert_eq!(normalize("CAFÉ Ünïcode"), "cafe unicode");
        assert_eq!(normalize("a\tb\r\nc\u{00A0}d"), "a b  c d");
        assert_eq!(normalize("x\0y\u{FFFD}z\u{200B}w\u{7}"), "xyzw");
        assert_eq!(normalize("中文"), " 中  文 ");
        let wp = tiny();
        assert_eq!(tokens(&wp, "CAFÉS"), ["[CLS]", "cafe", "##s", "[SEP]"]);
    }

    #[test]
    fn punctuation_and_ascii_symbols_are_words_of_their_own() {
        assert_eq!(
            pre_tokenize("k/v's  4-bit $x+y «q» ok"),
            [
                "k", "/", "v", "'", "s", "4", "-", "bit", "$", "x", "+", "y", "«", "q", "»", "ok"
            ]
        );
    }

    #[test]
    fn special_tokens_in_the_text_are_kept_whole() {
        let wp = tiny();
        assert_eq!(
            tokens(&wp, "the[SEP]the [MASK]"),
            ["[CLS]", "the", "[SEP]", "the", "[MASK]", "[SEP]"]
        );
        // Lowercase is not special: it is split as punctuation and words.
        assert_eq!(
            tokens(&wp, "[sep]"),
            ["[CLS]", "[UNK]", "[UNK]", "[UNK]", "[SEP]"]
        );
    }

    #[test]
    fn a_vocabulary_must_have_the_special_tokens_and_no_repeats() {
        assert!(matches!(
            WordPiece::from_vocab("[CLS]\n[SEP]\nthe\n"),
            Err(TokenizerError::MissingToken("[UNK]"))
        ));
        let err = WordPiece::from_vocab("[UNK]\n[CLS]\n[SEP]\nthe\nthe\n").unwrap_err();
        assert!(
            matches!(&err, TokenizerError::DuplicateToken { token, first: 3, second: 4 } if token == "the"),
            "{err}"
        );
        let err = WordPiece::from_vocab_file(Path::new("/nonexistent/vocab.txt")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/vocab.txt"), "{err}");
    }
}
