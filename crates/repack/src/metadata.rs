//! The metadata that says what a checkpoint's tensors mean: the keys this tool reads and
//! writes, parsed into typed values (safetensors metadata is string to string).
//!
//! - `checkpoint_format`: `gptq`, `gptq_v2` or `awq` (GPTQModel's name for the convention).
//!   Written by this tool beside `format: pt` (transformers refuses to load a safetensors file
//!   whose `format` is anything but pt, tf, flax or mlx). When reading, `format` is also
//!   accepted when it names a layout, as the conformance fixtures record it.
//! - `quant_method` (`gptq` or `awq`), `bits`, `group_size`, `converted_from`.
//! - `<layer>.logical_shape`: `[K, N]` when the tensors were padded beyond the logical size.
//! - `<layer>.input_permutation`: `[p0, p1, ...]` when the rows were reordered: the layer's input
//!   activations must be permuted as `x_new[k] = x[p[k]]`. It must be a permutation of the
//!   layer's K rows (checked on every read).
//!
//! This module depends on no other of this crate's but [`crate::names`]; its errors are its own
//! ([`MetadataError`]), which [`crate::error::Error`] wraps.

use std::collections::BTreeMap;
use std::fmt;

use thiserror::Error;
use weights::FormatError;
use weights::WeightFormat;
use weights::logical::check_permutation;

use crate::names::qualified;

/// The per-layer key of the logical [K, N] (under the layer's prefix).
pub const LOGICAL_SHAPE: &str = "logical_shape";
/// The per-layer key of the input permutation (under the layer's prefix).
pub const INPUT_PERMUTATION: &str = "input_permutation";

/// Why a metadata value cannot be used.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum MetadataError {
    /// A value that does not parse as what its key holds.
    #[error("metadata {key:?} = {value:?} is not {expected}")]
    BadValue {
        /// The key.
        key: String,
        /// Its value.
        value: String,
        /// What the key holds ("a whole number", "a JSON list [K, N]", ...).
        expected: &'static str,
    },

    /// A recorded input permutation that is not a permutation of its layer's rows.
    #[error("metadata {key:?} cannot be used")]
    BadPermutation {
        /// The key.
        key: String,
        /// How the permutation fails to be one.
        #[source]
        source: Box<FormatError>,
    },
}

/// Results of this module.
pub type Result<T> = std::result::Result<T, MetadataError>;

/// The layout a checkpoint's metadata declares, with the key that declared it
/// (`checkpoint_format` or `format`); `None` when it declares none (as AutoAWQ's files and
/// plain `format: pt` files do).
pub fn declared_format(
    metadata: &BTreeMap<String, String>,
) -> Result<Option<(&'static str, WeightFormat)>> {
    if let Some(value) = metadata.get("checkpoint_format") {
        return match integer_format(value) {
            Some(format) => Ok(Some(("checkpoint_format", format))),
            None => Err(MetadataError::BadValue {
                key: "checkpoint_format".into(),
                value: value.clone(),
                expected: "gptq, gptq_v2 or awq",
            }),
        };
    }
    Ok(metadata
        .get("format")
        .and_then(|value| integer_format(value))
        .map(|format| ("format", format)))
}

/// The integer layout `name` names, if it names one.
fn integer_format(name: &str) -> Option<WeightFormat> {
    name.parse::<WeightFormat>()
        .ok()
        .filter(|format| format.is_integer())
}

/// A usize metadata value, if present.
pub fn metadata_number(metadata: &BTreeMap<String, String>, key: &str) -> Result<Option<usize>> {
    metadata
        .get(key)
        .map(|value| {
            value.trim().parse().map_err(|_| MetadataError::BadValue {
                key: key.into(),
                value: value.clone(),
                expected: "a whole number",
            })
        })
        .transpose()
}

/// A bit width the reader was told: the `--bits` flag, or the metadata's `bits`. Either must
/// agree with the tensor shapes (`layer_io::read_integer_layer` refuses it otherwise, naming
/// both). Exhaustive: messages say where the width came from, and must say it for every source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeclaredBits {
    /// Given as `--bits`.
    Flag(u32),
    /// Recorded as the metadata's `bits`.
    Metadata(u32),
}

impl DeclaredBits {
    /// The width, wherever it came from.
    pub fn bits(self) -> u32 {
        match self {
            DeclaredBits::Flag(bits) | DeclaredBits::Metadata(bits) => bits,
        }
    }
}

impl fmt::Display for DeclaredBits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeclaredBits::Flag(bits) => write!(f, "--bits {bits} was given"),
            DeclaredBits::Metadata(bits) => write!(f, "the metadata says bits = {bits}"),
        }
    }
}

/// The width to read at: `--bits` when given, else the metadata's `bits` when recorded; `None`
/// leaves it to the tensor shapes.
pub fn declared_bits(
    flag: Option<u32>,
    metadata: &BTreeMap<String, String>,
) -> Result<Option<DeclaredBits>> {
    if let Some(bits) = flag {
        return Ok(Some(DeclaredBits::Flag(bits)));
    }
    metadata_number(metadata, "bits")?
        .map(|bits| {
            u32::try_from(bits)
                .map(DeclaredBits::Metadata)
                .map_err(|_| MetadataError::BadValue {
                    key: "bits".into(),
                    value: metadata["bits"].clone(),
                    expected: "a bit width",
                })
        })
        .transpose()
}

/// The recorded group size, if any. AutoGPTQ records -1 for one group spanning all of K; that
/// counts as unrecorded, and the tensor shapes then check `--group-size` (G = ceil(K / g) = 1).
pub fn recorded_group_size(metadata: &BTreeMap<String, String>) -> Result<Option<usize>> {
    if metadata.get("group_size").map(|g| g.trim()) == Some("-1") {
        return Ok(None);
    }
    metadata_number(metadata, "group_size")
}

/// A layer's recorded `[K, N]`, if any.
pub fn logical_shape(
    metadata: &BTreeMap<String, String>,
    prefix: &str,
) -> Result<Option<[usize; 2]>> {
    let key = qualified(prefix, LOGICAL_SHAPE);
    let expected = "a JSON list [K, N]";
    json_list(metadata, &key, expected)?
        .map(|dims: Vec<usize>| {
            <[usize; 2]>::try_from(dims).map_err(|_| MetadataError::BadValue {
                value: metadata[&key].clone(),
                key: key.clone(),
                expected,
            })
        })
        .transpose()
}

/// A layer's recorded input permutation, if any, checked to be a permutation of its `rows`
/// (logical K) rows: anything else would index past the rows or drop some of them.
pub fn input_permutation(
    metadata: &BTreeMap<String, String>,
    prefix: &str,
    rows: usize,
) -> Result<Option<Vec<u32>>> {
    let key = qualified(prefix, INPUT_PERMUTATION);
    let Some(permutation) = json_list(metadata, &key, "a JSON list of row indices")? else {
        return Ok(None);
    };
    check_permutation(&permutation, rows).map_err(|source| MetadataError::BadPermutation {
        key,
        source: Box::new(source),
    })?;
    Ok(Some(permutation))
}

fn json_list<T: serde::de::DeserializeOwned>(
    metadata: &BTreeMap<String, String>,
    key: &str,
    expected: &'static str,
) -> Result<Option<Vec<T>>> {
    metadata
        .get(key)
        .map(|value| {
            serde_json::from_str(value).map_err(|_| MetadataError::BadValue {
                key: key.into(),
                value: value.clone(),
                expected,
            })
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn bad_value(key: &str, value: &str, expected: &'static str) -> MetadataError {
        MetadataError::BadValue {
            key: key.into(),
            value: value.into(),
            expected,
        }
    }

    #[test]
    fn the_declared_format_comes_from_checkpoint_format_or_a_layout_named_format() {
        let declared = |pairs| declared_format(&metadata(pairs)).unwrap();
        assert_eq!(
            declared(&[("format", "gptq_v2")]),
            Some(("format", WeightFormat::GptqV2))
        );
        assert_eq!(declared(&[("format", "pt")]), None);
        // A block format is not a checkpoint layout.
        assert_eq!(declared(&[("format", "q4_0")]), None);
        assert_eq!(
            declared(&[("format", "pt"), ("checkpoint_format", "gptq")]),
            Some(("checkpoint_format", WeightFormat::Gptq))
        );
        for refused in ["marlin", "nf4"] {
            assert_eq!(
                declared_format(&metadata(&[("checkpoint_format", refused)])),
                Err(bad_value(
                    "checkpoint_format",
                    refused,
                    "gptq, gptq_v2 or awq"
                ))
            );
        }
    }

    #[test]
    fn the_width_is_the_flag_else_the_metadata_else_the_shapes() {
        let recorded = metadata(&[("bits", "8")]);
        assert_eq!(
            declared_bits(Some(4), &recorded),
            Ok(Some(DeclaredBits::Flag(4)))
        );
        assert_eq!(
            declared_bits(None, &recorded),
            Ok(Some(DeclaredBits::Metadata(8)))
        );
        assert_eq!(declared_bits(None, &metadata(&[])), Ok(None));
        assert_eq!(
            declared_bits(None, &metadata(&[("bits", "99999999999")])),
            Err(bad_value("bits", "99999999999", "a bit width"))
        );
    }

    #[test]
    fn group_size_minus_one_means_unrecorded() {
        let recorded = |value| recorded_group_size(&metadata(&[("group_size", value)]));
        assert_eq!(recorded("-1"), Ok(None));
        assert_eq!(recorded("128"), Ok(Some(128)));
        assert_eq!(
            recorded("x"),
            Err(bad_value("group_size", "x", "a whole number"))
        );
    }

    #[test]
    fn per_layer_metadata_is_json() {
        let m = metadata(&[
            ("proj.logical_shape", "[100, 60]"),
            ("proj.input_permutation", "[1, 0]"),
            ("logical_shape", "[1]"),
        ]);
        assert_eq!(logical_shape(&m, "proj"), Ok(Some([100, 60])));
        assert_eq!(input_permutation(&m, "proj", 2), Ok(Some(vec![1, 0])));
        assert_eq!(logical_shape(&m, "other"), Ok(None));
        assert_eq!(
            logical_shape(&m, ""),
            Err(bad_value("logical_shape", "[1]", "a JSON list [K, N]"))
        );
    }

    #[test]
    fn a_malformed_input_permutation_is_refused_with_its_key() {
        let m = metadata(&[
            ("short.input_permutation", "[0]"),
            ("twice.input_permutation", "[0, 0]"),
            ("text.input_permutation", "rows"),
        ]);
        let refused = |prefix: &str, source| MetadataError::BadPermutation {
            key: format!("{prefix}.input_permutation"),
            source: Box::new(source),
        };
        assert_eq!(
            input_permutation(&m, "short", 2),
            Err(refused(
                "short",
                FormatError::PermutationLength { found: 1, rows: 2 }
            ))
        );
        assert_eq!(
            input_permutation(&m, "twice", 2),
            Err(refused(
                "twice",
                FormatError::PermutationRepeatsRow {
                    rows: 2,
                    index: 1,
                    value: 0,
                    first: 0
                }
            ))
        );
        assert_eq!(
            input_permutation(&m, "text", 2),
            Err(bad_value(
                "text.input_permutation",
                "rows",
                "a JSON list of row indices"
            ))
        );
    }
}
