//! A model-quality study cut into shards (`runner quality --protocol P --shard I/N`) and merged
//! back (`runner merge`), byte-identical to a single run.
//!
//! The unit is a text. Shard I of N runs the texts of slice I ([`evidence::shard`]: contiguous,
//! as even as whole texts allow), each with everything a whole run computes for it: its float32
//! pass (and mechanisms), every run, every perturbed pass, every run's attention error on it.
//! Shard 1 also keeps what belongs to the protocol rather than to a text: the calibration (every
//! shard fits it, since its KVQuant runs need it; only shard 1 keeps it) and the Gaussian draws'
//! attention errors. A single run computes each text's figures from that text alone, in text
//! order, so the shards' parts concatenated in index order are the study a single run computes.
//!
//! A shard's directory (format [`QUALITY_SHARD_FORMAT`]) holds [`PART`], its part of the study
//! as compact JSON (every float read back to the same bits: the writer parses it back and
//! refuses to write a part that does not come back equal, such as one holding a NaN), an empty
//! arrays.npz (every evidence directory has one), and manifest.json: the protocol, the shard,
//! the sources and the commit the runner was built from, and the SHA-256 of each file. A shard
//! is not evidence: nothing is summarized in it, and the audit checks the merged run.
//!
//! The merge checks that the directories are exactly the N shards of one protocol (the same
//! protocol and N in every manifest, indices 1 to N once each), made by a runner built from this
//! runner's sources, each file hashing as its manifest records, and each part holding its
//! slice's texts, rows and perturbed rows in run order (and shard 1 alone the protocol's
//! parts). It then writes the concatenated study with [`crate::write`]: arrays.npz,
//! results.json, summary.json, summary.md and the chart are byte-identical to a single run's;
//! the manifest records each shard's index and the SHA-256 of its manifest.json
//! (`merged_from`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use evidence::hashing::{sha256_file, sha256_hex};
use evidence::provenance::{Git, Platform, Tool, git_info, source_hashes, source_roots};
use evidence::shard::{MergedShard, SetError, Shard, ShardError, in_index_order};
use evidence::{EvidenceError, MANIFEST, Writer};

use crate::attention_error::{AttentionResult, LayerStats};
use crate::study::{QualityProtocol, QualityStudyError, Study};
use crate::write::QualityManifest;

/// manifest.json's `format` in a shard's directory.
pub const QUALITY_SHARD_FORMAT: &str = "model-quality-shard/1";
/// A shard's part of the study.
pub const PART: &str = "part.json";
/// Largest manifest or part a merge reads (a part of twenty 8,192-token texts with a dozen runs
/// is a few hundred MB).
const MAX_READ_BYTES: u64 = 4 << 30;

/// manifest.json of a shard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardManifest {
    /// [`QUALITY_SHARD_FORMAT`].
    pub format: String,
    /// The runner and its crates.
    pub tool: Tool,
    /// Where it ran.
    pub platform: Platform,
    /// The protocol file's path.
    pub protocol_source: String,
    /// The whole protocol, as read.
    pub protocol: QualityProtocol,
    /// Which slice of its texts this shard ran.
    pub shard: Shard,
    /// Worker threads (the part does not depend on it).
    pub threads: usize,
    /// The commit, when built in a repository.
    pub git: Option<Git>,
    /// Files and directories whose contents produce a run.
    pub source_roots: Vec<String>,
    /// SHA-256 of each source file, LF-normalised.
    pub sources: BTreeMap<String, String>,
    /// SHA-256 of each output file's raw bytes.
    pub outputs: BTreeMap<String, String>,
}

/// Why a shard cannot be written or shards merged; each names the shard directory.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum QualityShardError {
    /// A file that cannot be read.
    #[error("reading {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// A file larger than a merge reads.
    #[error("{} holds more than {MAX_READ_BYTES} bytes", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// A file that does not parse.
    #[error("{}: {file} is not a model-quality shard's", dir.display())]
    Json {
        /// The shard directory.
        dir: PathBuf,
        /// Which file.
        file: &'static str,
        /// The parser's message.
        #[source]
        source: serde_json::Error,
    },
    /// A manifest of another format.
    #[error("{} is not a model-quality shard: its manifest's format is {found:?}", dir.display())]
    NotAShard {
        /// The directory.
        dir: PathBuf,
        /// The format it records.
        found: String,
    },
    /// A file whose hash is not what its manifest records, or that it does not record.
    #[error("{}: {file} does not hash as its manifest records (tampered or incomplete)", dir.display())]
    Hash {
        /// The shard directory.
        dir: PathBuf,
        /// The file.
        file: String,
    },
    /// Shards of different protocols or shard counts.
    #[error("{} is a shard of another protocol (or another count) than {}", dir.display(), first.display())]
    DifferentProtocols {
        /// The shard that differs.
        dir: PathBuf,
        /// The first shard given.
        first: PathBuf,
    },
    /// A shard made by a runner built from other sources than this one.
    #[error(
        "{} was made by a runner built from other sources than this one; merge with the runner \
         that made the shards",
        dir.display()
    )]
    DifferentSources {
        /// The shard directory.
        dir: PathBuf,
    },
    /// Not slices 1 to N, each once.
    #[error(transparent)]
    Set(#[from] SetError),
    /// A part that is not its slice's.
    #[error("{}: part.json is not shard {shard}'s: {problem}", dir.display())]
    Part {
        /// The shard directory.
        dir: PathBuf,
        /// Its slice.
        shard: Shard,
        /// What is wrong.
        problem: String,
    },
    /// A part whose numbers would not read back to the same bits (a NaN or an infinity).
    #[error(
        "shard {shard}'s part holds a number JSON cannot carry exactly (NaN or infinite); run \
         the study unsharded"
    )]
    NotExact {
        /// The shard.
        shard: Shard,
    },
    /// The shard is not one of the protocol's.
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// Writing failed.
    #[error(transparent)]
    Evidence(#[from] EvidenceError),
    /// Writing the merged study failed.
    #[error(transparent)]
    Study(#[from] QualityStudyError),
}

/// Writes shard `shard`'s part of the study (from [`crate::study::run_study_shard`]) into the
/// new directory `out`.
pub fn write_shard(
    out: &Path,
    protocol: &QualityProtocol,
    protocol_source: String,
    (shard, part): (Shard, &Study),
    threads: usize,
) -> Result<ShardManifest, QualityShardError> {
    let bytes =
        serde_json::to_vec(part).map_err(|source| EvidenceError::Json { file: PART, source })?;
    let exact = serde_json::from_slice::<Study>(&bytes).is_ok_and(|back| &back == part);
    if !exact {
        return Err(QualityShardError::NotExact { shard });
    }
    let writer = Writer::create(out)?;
    let mut manifest = ShardManifest {
        format: QUALITY_SHARD_FORMAT.into(),
        tool: Tool::current(),
        platform: Platform::current(),
        protocol_source,
        protocol: protocol.clone(),
        shard,
        threads,
        git: git_info(),
        source_roots: source_roots(),
        sources: source_hashes(),
        outputs: BTreeMap::new(),
    };
    writer.finish_files(&[(PART, bytes)], |outputs| {
        manifest.outputs = outputs;
        evidence::json_bytes(MANIFEST, &manifest)
    })?;
    Ok(manifest)
}

/// Whether `dir`'s manifest.json says it is a model-quality shard (what `runner merge` asks
/// before choosing a merge); `false` when it cannot be read.
pub fn is_quality_shard(dir: &Path) -> bool {
    #[derive(Deserialize)]
    struct Format {
        format: String,
    }
    read_capped(&dir.join(MANIFEST))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Format>(&bytes).ok())
        .is_some_and(|f| f.format == QUALITY_SHARD_FORMAT)
}

/// One shard as read and checked against its manifest.
struct ShardDir {
    dir: PathBuf,
    manifest: ShardManifest,
    manifest_sha256: String,
}

fn read_capped(path: &Path) -> Result<Vec<u8>, QualityShardError> {
    let read = |source| QualityShardError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut bytes = Vec::new();
    File::open(path)
        .map_err(read)?
        .take(MAX_READ_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read)?;
    if bytes.len() as u64 > MAX_READ_BYTES {
        return Err(QualityShardError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    Ok(bytes)
}

fn read_shard(dir: &Path) -> Result<ShardDir, QualityShardError> {
    let bytes = read_capped(&dir.join(MANIFEST))?;
    if !is_quality_shard(dir) {
        let found = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v.get("format").and_then(|f| f.as_str()).map(String::from))
            .unwrap_or_default();
        return Err(QualityShardError::NotAShard {
            dir: dir.into(),
            found,
        });
    }
    let manifest: ShardManifest =
        serde_json::from_slice(&bytes).map_err(|source| QualityShardError::Json {
            dir: dir.into(),
            file: MANIFEST,
            source,
        })?;
    let recorded: BTreeSet<&str> = manifest.outputs.keys().map(String::as_str).collect();
    for file in [evidence::ARRAYS, PART] {
        if !recorded.contains(file) {
            return Err(QualityShardError::Hash {
                dir: dir.into(),
                file: file.into(),
            });
        }
    }
    for (file, hash) in &manifest.outputs {
        let path = dir.join(file);
        let actual = sha256_file(&path).map_err(|source| QualityShardError::Read {
            path: path.clone(),
            source,
        })?;
        if &actual != hash {
            return Err(QualityShardError::Hash {
                dir: dir.into(),
                file: file.clone(),
            });
        }
    }
    Ok(ShardDir {
        dir: dir.into(),
        manifest,
        manifest_sha256: sha256_hex(&bytes),
    })
}

/// Checks that `dirs` are exactly the N shards of one protocol, made from this runner's
/// sources; returns them in index order.
fn check_set(dirs: &[PathBuf]) -> Result<Vec<ShardDir>, QualityShardError> {
    let shards = dirs
        .iter()
        .map(|d| read_shard(d))
        .collect::<Result<Vec<_>, _>>()?;
    let first = shards.first().ok_or(SetError::Empty)?;
    let own_sources = source_hashes();
    for s in &shards {
        if s.manifest.protocol != first.manifest.protocol
            || s.manifest.shard.count != first.manifest.shard.count
        {
            return Err(QualityShardError::DifferentProtocols {
                dir: s.dir.clone(),
                first: first.dir.clone(),
            });
        }
        if s.manifest.sources != own_sources {
            return Err(QualityShardError::DifferentSources { dir: s.dir.clone() });
        }
    }
    Ok(in_index_order(shards, |s| {
        (s.manifest.shard, s.dir.as_path())
    })?)
}

/// What is wrong with `part` as shard `shard`'s part of `protocol`, if anything.
fn part_problem(protocol: &QualityProtocol, shard: Shard, part: &Study) -> Option<String> {
    let texts = shard.range(protocol.texts.len());
    let row_ids: Vec<String> = texts
        .clone()
        .flat_map(|t| protocol.runs.iter().map(move |run| run.row_id(t)))
        .collect();
    let perturbed_ids: Vec<String> = match &protocol.sensitivity {
        Some(spec) => texts
            .clone()
            .flat_map(|t| {
                (0..spec.perturbations.len()).flat_map(move |k| {
                    spec.runs
                        .iter()
                        .map(move |&r| format!("s{k}_{}", protocol.runs[r].row_id(t)))
                })
            })
            .collect(),
        None => Vec::new(),
    };
    let keeps_shared = shard.index == 1;
    if part.texts.len() != texts.len() {
        return Some(format!(
            "{} texts, not the slice's {}",
            part.texts.len(),
            texts.len()
        ));
    }
    let rows_match = part.rows.len() == row_ids.len()
        && part
            .rows
            .iter()
            .zip(&row_ids)
            .all(|(row, id)| &row.result.id == id && texts.contains(&row.result.text));
    if !rows_match {
        return Some("its rows are not the slice's, in run order".into());
    }
    let perturbed: Vec<&String> = part.sensitivity.iter().map(|r| &r.id).collect();
    if perturbed != perturbed_ids.iter().collect::<Vec<_>>() {
        return Some("its perturbed rows are not the slice's, in run order".into());
    }
    let calibrated = protocol.calibration.is_some() && keeps_shared;
    if part.calibration.is_some() != calibrated {
        return Some(format!(
            "it {} a calibration",
            if calibrated { "lacks" } else { "holds" }
        ));
    }
    match (&protocol.attention, &part.attention) {
        (None, None) => None,
        (
            Some(spec),
            Some(AttentionResult {
                texts: t,
                gaussian,
                stats,
                matched,
            }),
        ) => {
            let draws = if keeps_shared {
                spec.gaussian_seeds.len()
            } else {
                0
            };
            let matched_draws = if spec.matched { draws } else { 0 };
            let stats_ok = match stats {
                None => !(spec.matched && keeps_shared),
                Some(stats) => {
                    spec.matched && keeps_shared && stats_fit(stats, &protocol.model.shape())
                }
            };
            (t.len() != texts.len()
                || gaussian.len() != draws
                || matched.len() != matched_draws
                || !stats_ok)
                .then(|| "its attention errors are not the slice's".into())
        }
        _ => Some("its attention errors do not follow the protocol".into()),
    }
}

/// Whether `stats` hold a `[mean, std]` per channel of every head of every layer of `shape`.
fn stats_fit(stats: &[LayerStats], shape: &models::ModelShape) -> bool {
    let fits = |side: &[Vec<[f64; 2]>], heads: usize| {
        side.len() == heads && side.iter().all(|h| h.len() == shape.head_dim)
    };
    stats.len() == shape.layers
        && stats.iter().all(|l| {
            fits(&l.q, shape.query_heads)
                && fits(&l.k, shape.kv_heads)
                && fits(&l.v, shape.kv_heads)
        })
}

/// Merges the shards in `dirs` (any order) into the new evidence directory `out`; returns its
/// manifest and the merged study.
pub fn merge(
    out: &Path,
    dirs: &[PathBuf],
) -> Result<(QualityManifest, QualityProtocol, Study), QualityShardError> {
    evidence::check_new(out)?;
    let shards = check_set(dirs)?;
    let protocol = shards[0].manifest.protocol.clone();
    let mut study = Study {
        texts: Vec::new(),
        rows: Vec::new(),
        calibration: None,
        attention: protocol.attention.as_ref().map(|_| AttentionResult {
            texts: Vec::new(),
            gaussian: Vec::new(),
            stats: None,
            matched: Vec::new(),
        }),
        sensitivity: Vec::new(),
    };
    for s in &shards {
        let shard = s.manifest.shard;
        let bytes = read_capped(&s.dir.join(PART))?;
        let part: Study =
            serde_json::from_slice(&bytes).map_err(|source| QualityShardError::Json {
                dir: s.dir.clone(),
                file: PART,
                source,
            })?;
        if let Some(problem) = part_problem(&protocol, shard, &part) {
            return Err(QualityShardError::Part {
                dir: s.dir.clone(),
                shard,
                problem,
            });
        }
        study.texts.extend(part.texts);
        study.rows.extend(part.rows);
        study.sensitivity.extend(part.sensitivity);
        if part.calibration.is_some() {
            study.calibration = part.calibration;
        }
        if let (Some(merged), Some(attention)) = (&mut study.attention, part.attention) {
            merged.texts.extend(attention.texts);
            merged.gaussian.extend(attention.gaussian);
            merged.matched.extend(attention.matched);
            if attention.stats.is_some() {
                merged.stats = attention.stats;
            }
        }
    }
    let merged_from = shards
        .iter()
        .map(|s| MergedShard {
            index: s.manifest.shard.index,
            manifest_sha256: s.manifest_sha256.clone(),
        })
        .collect();
    let first = &shards[0].manifest;
    let manifest = crate::write::write_with(
        out,
        &protocol,
        first.protocol_source.clone(),
        &study,
        (first.threads, Some(merged_from)),
    )?;
    Ok((manifest, protocol, study))
}
