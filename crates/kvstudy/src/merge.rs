//! `runner merge`: one evidence directory from the N shards of one protocol.
//!
//! The shards must be exactly the N slices of one protocol ([`crate::plan::Shard`]): every
//! shard's manifest records the same protocol, the same protocol hash (recomputed here), the same
//! count N and the same sources, which must be this runner's own; the indices are 1 to N, each
//! once; each shard's files hash as its manifest says; its rows are exactly its slice's, in run
//! order; its archive holds exactly its slice's arrays.
//!
//! What is copied and what is recomputed: arrays.npz's members are copied byte for byte in the
//! order a single run writes them, and results.json's rows concatenated in shard order, so both
//! files are byte-identical to a single-process run of the protocol. timings.json concatenates
//! the shards' measurements in shard order, renumbers their order and records each one's shard.
//! summary.json, summary.md and the chart are recomputed from the merged rows and timings, never
//! copied. The merged manifest is this runner's, with the shards' indices and the SHA-256 of
//! each shard's manifest.json (`merged_from`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::archive;
use evidence::EvidenceError;

use crate::manifest::{Counts, Manifest, MergedShard, protocol_sha256};
use crate::plan::{Plan, Shard, plans, shard_inputs};
use crate::protocol::Protocol;
use crate::study::ResultRow;
use crate::summary::{self, Summary};
use crate::timing::Timings;
use crate::write::{self, MemberSink};
use evidence::hashing::{sha256_file, sha256_hex};
use evidence::provenance::source_hashes;
use evidence::shard::{SetError, in_index_order};

/// Largest manifest, results or timings file a merge reads (an honest one is far smaller).
const MAX_JSON_BYTES: u64 = 1 << 30;

/// Why shards cannot be merged. Each names the shard directory (or what is missing).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum MergeError {
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
    #[error("{} holds more than {MAX_JSON_BYTES} bytes", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// A JSON file that does not parse.
    #[error("{} is not a run's {file}", dir.display())]
    Json {
        /// The shard directory.
        dir: PathBuf,
        /// Which file.
        file: &'static str,
        /// The parser's message.
        #[source]
        source: serde_json::Error,
    },
    /// A directory that is not a shard's run.
    #[error("{} is not a shard: its manifest records no shard", dir.display())]
    NotAShard {
        /// The directory.
        dir: PathBuf,
    },
    /// A file whose hash is not what its manifest records.
    #[error("{}: {file} does not hash as its manifest records (tampered or incomplete)", dir.display())]
    Hash {
        /// The shard directory.
        dir: PathBuf,
        /// The file.
        file: String,
    },
    /// A shard whose recorded protocol hash is not its protocol's.
    #[error("{}: its recorded protocol hash is not its protocol's", dir.display())]
    ProtocolHash {
        /// The shard directory.
        dir: PathBuf,
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
    /// A shard whose rows are not its slice's.
    #[error("{}: its results are not the rows of shard {shard}", dir.display())]
    Rows {
        /// The shard directory.
        dir: PathBuf,
        /// Its slice.
        shard: Shard,
    },
    /// A shard whose archive is not its slice's arrays.
    #[error("{}: arrays.npz {problem}", dir.display())]
    Arrays {
        /// The shard directory.
        dir: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The output lies inside one of the shards (or is one): writing it there would add a
    /// directory to that shard, which would then fail its own audit.
    #[error(
        "--out {} is inside the shard {}; write the merged run outside every shard",
        out.display(),
        shard.display()
    )]
    OutputInsideShard {
        /// The output given.
        out: PathBuf,
        /// The shard directory it lies in.
        shard: PathBuf,
    },
    /// The merged directory could not be written.
    #[error("writing the merged run")]
    Write(#[from] crate::write::WriteError),
}

/// A merged run, as written.
#[derive(Debug)]
pub struct Merged {
    /// The protocol the shards ran.
    pub protocol: Protocol,
    /// The recomputed tables.
    pub summary: Summary,
    /// The merged run's manifest.
    pub manifest: Manifest,
}

/// One shard as read: its directory, its manifest, and its manifest's hash.
struct ShardRun {
    dir: PathBuf,
    shard: Shard,
    manifest: Manifest,
    manifest_sha256: String,
}

fn read_capped(path: &Path) -> Result<Vec<u8>, MergeError> {
    let read = |source| MergeError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(read)?;
    let mut bytes = Vec::new();
    file.take(MAX_JSON_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read)?;
    if bytes.len() as u64 > MAX_JSON_BYTES {
        return Err(MergeError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    Ok(bytes)
}

fn parse<T: serde::de::DeserializeOwned>(
    dir: &Path,
    file: &'static str,
    bytes: &[u8],
) -> Result<T, MergeError> {
    serde_json::from_slice(bytes).map_err(|source| MergeError::Json {
        dir: dir.to_path_buf(),
        file,
        source,
    })
}

/// Reads one shard's manifest and checks its files against it.
fn read_shard(dir: &Path) -> Result<ShardRun, MergeError> {
    let bytes = read_capped(&dir.join(write::MANIFEST))?;
    let manifest: Manifest = parse(dir, write::MANIFEST, &bytes)?;
    let Some(record) = manifest.shard.clone() else {
        return Err(MergeError::NotAShard { dir: dir.into() });
    };
    if record.protocol_sha256 != protocol_sha256(&manifest.protocol) {
        return Err(MergeError::ProtocolHash { dir: dir.into() });
    }
    let mut run_files = vec![
        write::ARRAYS,
        write::RESULTS,
        write::SUMMARY,
        write::SUMMARY_MD,
        write::PLOT,
    ];
    if manifest.protocol.timing.is_some() {
        run_files.push(write::TIMINGS);
    }
    if let Some(file) = run_files
        .iter()
        .find(|f| !manifest.outputs.contains_key(**f))
    {
        return Err(MergeError::Hash {
            dir: dir.into(),
            file: file.to_string(),
        });
    }
    for (file, recorded) in &manifest.outputs {
        let path = dir.join(file);
        let actual = sha256_file(&path).map_err(|source| MergeError::Read {
            path: path.clone(),
            source,
        })?;
        if &actual != recorded {
            return Err(MergeError::Hash {
                dir: dir.into(),
                file: file.clone(),
            });
        }
    }
    Ok(ShardRun {
        dir: dir.to_path_buf(),
        shard: Shard {
            index: record.index,
            count: record.count,
        },
        manifest,
        manifest_sha256: sha256_hex(&bytes),
    })
}

/// Checks that `dirs` are exactly the N shards of one protocol, made by this runner's sources;
/// returns them in index order.
fn check_set(dirs: &[PathBuf]) -> Result<Vec<ShardRun>, MergeError> {
    let shards = dirs
        .iter()
        .map(|d| read_shard(d))
        .collect::<Result<Vec<_>, _>>()?;
    let first = shards.first().ok_or(SetError::Empty)?;
    let own_sources = source_hashes();
    for s in &shards {
        let same =
            s.manifest.protocol == first.manifest.protocol && s.shard.count == first.shard.count;
        if !same {
            return Err(MergeError::DifferentProtocols {
                dir: s.dir.clone(),
                first: first.dir.clone(),
            });
        }
        if s.manifest.sources != own_sources {
            return Err(MergeError::DifferentSources { dir: s.dir.clone() });
        }
    }
    Ok(in_index_order(shards, |s| (s.shard, s.dir.as_path()))?)
}

/// Refuses an output inside (or equal to) a shard directory, comparing real paths (links and
/// `..` resolved, so `--out shard-1/../shard-1/merged` and a link to a shard are caught too). A
/// shard that cannot be resolved is left to [`check_set`], which names it.
fn check_out_outside_shards(out: &Path, dirs: &[PathBuf]) -> Result<(), MergeError> {
    let Some(real_out) = real_path_of_new(out) else {
        return Ok(());
    };
    for dir in dirs {
        if let Ok(real_dir) = dir.canonicalize()
            && real_out.starts_with(&real_dir)
        {
            return Err(MergeError::OutputInsideShard {
                out: out.to_path_buf(),
                shard: dir.clone(),
            });
        }
    }
    Ok(())
}

/// The real path a new `path` will have: its nearest existing ancestor resolved, then the
/// components that do not exist yet (to be created as plain directories, so `..` among them
/// steps back lexically).
fn real_path_of_new(path: &Path) -> Option<PathBuf> {
    use std::path::Component;
    let absolute = std::path::absolute(path).ok()?;
    let components: Vec<Component> = absolute.components().collect();
    for split in (1..=components.len()).rev() {
        let prefix: PathBuf = components[..split].iter().collect();
        if let Ok(mut real) = prefix.canonicalize() {
            for component in &components[split..] {
                match component {
                    Component::ParentDir => {
                        real.pop();
                    }
                    Component::Normal(name) => real.push(name),
                    _ => {}
                }
            }
            return Some(real);
        }
    }
    None
}

/// Merges the shards in `dirs` into a new evidence directory `out`.
pub fn merge(out: &Path, dirs: &[PathBuf]) -> Result<Merged, MergeError> {
    evidence::check_new(out).map_err(crate::write::WriteError::from)?;
    check_out_outside_shards(out, dirs)?;
    let shards = check_set(dirs)?;
    let protocol = shards[0].manifest.protocol.clone();
    let plans = plans(&protocol);

    let mut rows: Vec<ResultRow> = Vec::new();
    let mut timings: Option<Timings> = None;
    let mut owner: BTreeMap<String, usize> = BTreeMap::new();
    for (position, s) in shards.iter().enumerate() {
        let bytes = read_capped(&s.dir.join(write::RESULTS))?;
        let shard_rows: Vec<ResultRow> = parse(&s.dir, write::RESULTS, &bytes)?;
        let inputs = shard_inputs(s.shard, &protocol).map_err(|_| MergeError::Rows {
            dir: s.dir.clone(),
            shard: s.shard,
        })?;
        let expected: Vec<String> = inputs
            .iter()
            .flat_map(|input| plans.iter().map(move |p: &Plan| p.id(input)))
            .collect();
        let found: Vec<&str> = shard_rows.iter().map(|r| r.id.as_str()).collect();
        if found != expected {
            return Err(MergeError::Rows {
                dir: s.dir.clone(),
                shard: s.shard,
            });
        }
        rows.extend(shard_rows);
        if protocol.timing.is_some() {
            let bytes = read_capped(&s.dir.join(write::TIMINGS))?;
            let shard_timings: Timings = parse(&s.dir, write::TIMINGS, &bytes)?;
            let merged = timings.get_or_insert_with(|| Timings {
                measurements: Vec::new(),
                ..shard_timings.clone()
            });
            for mut m in shard_timings.measurements {
                m.order = merged.measurements.len();
                m.shard = Some(s.shard.index);
                merged.measurements.push(m);
            }
        }
        // The archive must hold exactly this slice's arrays.
        let wanted: BTreeSet<String> =
            shard_members(&protocol, s.shard).map_err(|problem| MergeError::Arrays {
                dir: s.dir.clone(),
                problem,
            })?;
        let present = member_names(&s.dir)?;
        if present != wanted {
            let problem = match wanted.difference(&present).next() {
                Some(name) => format!("lacks {name}"),
                None => format!(
                    "holds {}, which is not this slice's",
                    present.difference(&wanted).next().map_or("", |s| s)
                ),
            };
            return Err(MergeError::Arrays {
                dir: s.dir.clone(),
                problem,
            });
        }
        for name in present {
            owner.insert(name, position);
        }
    }

    let summary = summary::summarize(&protocol, &rows, timings.as_ref());
    let mut manifest = Manifest::new(
        shards[0].manifest.protocol_source.clone(),
        protocol.clone(),
        Counts {
            inputs: protocol.inputs().len(),
            comparisons: rows.len(),
            timings: timings.as_ref().map_or(0, |t| t.measurements.len()),
        },
    );
    // A model's passes: every shard's ids, each pass recorded once (a pass shared by two shards
    // gives the same ids in both: encoding is a pure function of the text).
    manifest.model = shards[0].manifest.model.as_ref().map(|first| {
        let mut record = first.clone();
        for s in &shards[1..] {
            if let Some(m) = &s.manifest.model {
                record
                    .ids
                    .extend(m.ids.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        record
    });
    manifest.merged_from = Some(
        shards
            .iter()
            .map(|s| MergedShard {
                index: s.shard.index,
                manifest_sha256: s.manifest_sha256.clone(),
            })
            .collect(),
    );

    // Members in a single run's order, each copied from the shard that holds it.
    let order: Vec<String> = archive::members(&protocol)
        .into_iter()
        .map(|m| m.name)
        .collect();
    let mut archives: Vec<Option<zip::ZipArchive<File>>> = shards.iter().map(|_| None).collect();
    let mut copy = |sink: &mut MemberSink<'_>| -> Result<(), EvidenceError> {
        for name in &order {
            let position = owner[name];
            let dir = &shards[position].dir;
            let problem = |what: String| EvidenceError::Npz(format!("{}: {what}", dir.display()));
            if archives[position].is_none() {
                let path = dir.join(write::ARRAYS);
                let file = File::open(&path).map_err(|e| problem(e.to_string()))?;
                let zip = zip::ZipArchive::new(file).map_err(|e| problem(e.to_string()))?;
                archives[position] = Some(zip);
            }
            let zip = archives[position].as_mut().expect("just opened");
            let mut member = zip
                .by_name(&format!("{name}.npy"))
                .map_err(|e| problem(format!("{name}: {e}")))?;
            let mut bytes = Vec::new();
            (&mut member)
                .take(archive::MAX_NPZ_BYTES)
                .read_to_end(&mut bytes)
                .map_err(|e| problem(format!("{name}: {e}")))?;
            sink(name, &bytes)?;
        }
        Ok(())
    };
    let outputs = write::Outputs {
        protocol: &protocol,
        rows: &rows,
        summary: &summary,
        timings: timings.as_ref(),
    };
    let manifest = write::write_merged(out, &mut copy, outputs, manifest)?;
    Ok(Merged {
        protocol,
        summary,
        manifest,
    })
}

/// The archive members one shard writes (without `.npy`).
fn shard_members(protocol: &Protocol, shard: Shard) -> Result<BTreeSet<String>, String> {
    let ids: BTreeSet<String> = shard_inputs(shard, protocol)
        .map_err(|e| e.to_string())?
        .iter()
        .map(|i| i.id())
        .collect();
    let all = archive::members(protocol);
    Ok(all
        .into_iter()
        .map(|m| m.name)
        .filter(|name| ids.iter().any(|id| belongs(name, id)))
        .collect())
}

/// Whether archive member `name` belongs to input `id` (`<id>_q`, `<id>_g8_b4_out`, ...).
fn belongs(name: &str, id: &str) -> bool {
    name.strip_prefix(id).is_some_and(|rest| {
        // `s7_n128_clean` must not claim `s7_n128_clean_x` of another input: input ids end
        // in the distribution, and what follows is always `_` and a part or a configuration.
        rest.starts_with('_')
    })
}

/// The names (without `.npy`) of the members of a shard's archive.
fn member_names(dir: &Path) -> Result<BTreeSet<String>, MergeError> {
    let path = dir.join(write::ARRAYS);
    let problem = |what: String| MergeError::Arrays {
        dir: dir.to_path_buf(),
        problem: what,
    };
    let file = File::open(&path).map_err(|source| MergeError::Read {
        path: path.clone(),
        source,
    })?;
    let zip = zip::ZipArchive::new(file).map_err(|e| problem(format!("is not an archive: {e}")))?;
    zip.file_names()
        .map(|n| {
            n.strip_suffix(".npy")
                .map(String::from)
                .ok_or_else(|| problem(format!("holds {n}, which is not a .npy member")))
        })
        .collect()
}
