//! Slicing a study's work into N shards, and recording what a merged run was merged from.
//!
//! A study is a sequence of independent units (the packed-KV study's inputs, the model-quality
//! study's texts), each computed alone. Shard `index` of `count` takes the units at positions
//! `floor((index - 1) * U / count)` up to, not including, `floor(index * U / count)` of the U
//! units in run order: the slices are contiguous, as even as whole units allow, and concatenated
//! in index order they are the whole run, which is what lets a merge be byte-identical to a
//! single run. Each study says what its units are and what else shard 1 carries.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One of N disjoint, deterministic slices of a study's units (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shard {
    /// Which slice, 1 to `count`.
    pub index: usize,
    /// How many slices.
    pub count: usize,
}

/// Why a shard cannot be one of a study's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShardError {
    /// Not `I/N` with whole numbers.
    #[error("--shard {given:?} is not I/N (for example 2/3)")]
    Form {
        /// What was given.
        given: String,
    },
    /// I outside 1..=N.
    #[error("shard {index}/{count}: the index runs from 1 to {count}")]
    Index {
        /// I.
        index: usize,
        /// N.
        count: usize,
    },
    /// More shards than units: some would be empty.
    #[error("{count} shards of {units} {what}: each shard needs at least one")]
    TooMany {
        /// N.
        count: usize,
        /// Units in the study.
        units: usize,
        /// What a unit is (`inputs`, `texts`).
        what: &'static str,
    },
}

impl std::str::FromStr for Shard {
    type Err = ShardError;
    fn from_str(s: &str) -> Result<Shard, ShardError> {
        let form = || ShardError::Form { given: s.into() };
        let (index, count) = s.split_once('/').ok_or_else(form)?;
        let (index, count) = (
            index.parse::<usize>().map_err(|_| form())?,
            count.parse::<usize>().map_err(|_| form())?,
        );
        if count == 0 || !(1..=count).contains(&index) {
            return Err(ShardError::Index { index, count });
        }
        Ok(Shard { index, count })
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl Shard {
    /// The positions, in run order, of the units this shard runs out of `units`.
    pub fn range(&self, units: usize) -> std::ops::Range<usize> {
        (self.index - 1) * units / self.count..self.index * units / self.count
    }

    /// [`Shard::range`], refusing more shards than units (`what` names a unit in the error).
    pub fn slice(
        &self,
        units: usize,
        what: &'static str,
    ) -> Result<std::ops::Range<usize>, ShardError> {
        if self.count > units {
            return Err(ShardError::TooMany {
                count: self.count,
                units,
                what,
            });
        }
        Ok(self.range(units))
    }
}

/// Why a set of shards is not slices 1 to N of one cut, each once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SetError {
    /// No shard given.
    #[error("no shard directories given")]
    Empty,
    /// The same slice given twice.
    #[error("shard {index} of {count} is given twice ({} and {})", first.display(), second.display())]
    Duplicate {
        /// The slice.
        index: usize,
        /// N.
        count: usize,
        /// One directory.
        first: PathBuf,
        /// The other.
        second: PathBuf,
    },
    /// Slices missing from the set.
    #[error("shards {missing:?} of {count} are missing")]
    Missing {
        /// The missing indices.
        missing: Vec<usize>,
        /// N.
        count: usize,
    },
}

/// `shards` sorted by index, when they are exactly slices 1 to N of one cut; `slice` gives each
/// one's shard and directory (the caller has checked that every one records the same N).
pub fn in_index_order<T>(
    shards: Vec<T>,
    slice: impl Fn(&T) -> (Shard, &Path),
) -> Result<Vec<T>, SetError> {
    let count = shards
        .first()
        .map(|s| slice(s).0.count)
        .ok_or(SetError::Empty)?;
    let mut by_index: BTreeMap<usize, T> = BTreeMap::new();
    for s in shards {
        let (shard, dir) = slice(&s);
        if let Some(other) = by_index.get(&shard.index) {
            return Err(SetError::Duplicate {
                index: shard.index,
                count,
                first: slice(other).1.to_path_buf(),
                second: dir.to_path_buf(),
            });
        }
        by_index.insert(shard.index, s);
    }
    let missing: Vec<usize> = (1..=count).filter(|i| !by_index.contains_key(i)).collect();
    if !missing.is_empty() {
        return Err(SetError::Missing { missing, count });
    }
    Ok(by_index.into_values().collect())
}

/// One shard a merged run was made from, as its manifest records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergedShard {
    /// 1 to N.
    pub index: usize,
    /// SHA-256 of that shard's manifest.json, as it was merged.
    pub manifest_sha256: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_contiguous_even_and_cover_every_unit_once() {
        for (units, count) in [(18, 3), (18, 4), (8, 8), (7, 2), (1, 1), (20, 6)] {
            let mut covered = Vec::new();
            for index in 1..=count {
                let range = Shard { index, count }.slice(units, "texts").unwrap();
                assert!(range.len() >= units / count && range.len() <= units.div_ceil(count));
                covered.extend(range);
            }
            assert_eq!(covered, (0..units).collect::<Vec<_>>());
        }
        assert_eq!(
            Shard { index: 1, count: 4 }.slice(3, "texts"),
            Err(ShardError::TooMany {
                count: 4,
                units: 3,
                what: "texts"
            })
        );
    }

    #[test]
    fn a_set_is_sorted_by_index_and_must_hold_each_slice_once() {
        let set = |indices: &[usize]| -> Vec<(Shard, PathBuf)> {
            indices
                .iter()
                .map(|&index| {
                    (
                        Shard { index, count: 3 },
                        PathBuf::from(format!("s{index}")),
                    )
                })
                .collect()
        };
        let sorted = in_index_order(set(&[3, 1, 2]), |s| (s.0, s.1.as_path())).unwrap();
        assert_eq!(sorted, set(&[1, 2, 3]));
        assert_eq!(
            in_index_order(set(&[1, 3]), |s| (s.0, s.1.as_path())),
            Err(SetError::Missing {
                missing: vec![2],
                count: 3
            })
        );
        assert_eq!(
            in_index_order(set(&[1, 2, 2, 3]), |s| (s.0, s.1.as_path())),
            Err(SetError::Duplicate {
                index: 2,
                count: 3,
                first: "s2".into(),
                second: "s2".into()
            })
        );
        assert_eq!(
            in_index_order(set(&[]), |s| (s.0, s.1.as_path())),
            Err(SetError::Empty)
        );
    }

    #[test]
    fn a_shard_is_written_i_slash_n() {
        assert_eq!("2/3".parse(), Ok(Shard { index: 2, count: 3 }));
        assert_eq!(Shard { index: 2, count: 3 }.to_string(), "2/3");
        assert_eq!(
            "0/3".parse::<Shard>(),
            Err(ShardError::Index { index: 0, count: 3 })
        );
        assert_eq!(
            "4/3".parse::<Shard>(),
            Err(ShardError::Index { index: 4, count: 3 })
        );
        assert!(matches!(
            "2-3".parse::<Shard>(),
            Err(ShardError::Form { .. })
        ));
        assert!(matches!(
            "1/x".parse::<Shard>(),
            Err(ShardError::Form { .. })
        ));
    }
}
