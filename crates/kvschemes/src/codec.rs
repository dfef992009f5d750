//! This project's own KV codec (`kvcodec`) as a named scheme, so that it stands on the same
//! frontier as the literature's: separate K and V widths, symmetric or asymmetric codes, attention
//! sinks kept in full precision, and 8-bit first and last layers.
//!
//! Name: `kvpack-k<KB>v<VB>[-asym][-sink<S>][-edge8][-layer<L>]`, for example `kvpack-k4v4`,
//! `kvpack-k8v4-asym`, `kvpack-k4v2-sink4`, `kvpack-k4v4-edge8`, and, to find where a cache's
//! error comes from, `kvpack-k4v32` (K only: a width of 32 keeps that side float32, not both),
//! `kvpack-k2v2-layer7` (layer 7 only; every other layer holds float32 K and V). `-edge8`
//! combines with neither.
//!
//! Spec:
//! - Codes: `kvcodec` with groups of 32 (`docs/formats.md`): K grouped along tokens (one group =
//!   32 consecutive tokens of one channel), V along features (32 consecutive channels of one
//!   token), each KV head's [tokens, head_dim] matrix one codec tensor; symmetric codes (2 to 8
//!   bits) with f32 scales, or `-asym` (1 to 8 bits) with a b-bit zero point per group too.
//! - `-sink<S>`: the first S tokens stay f32 in K and V (StreamingLLM's attention sinks, which
//!   real SmolLM2 layers lean on); the codec tensors cover tokens S and on, groups counted from S.
//! - `-edge8`: the first and the last layer hold K and V at 8 bits (symmetric, or asymmetric with
//!   `-asym`), the others at KB and VB.
//! - A side of width 32, and every layer but L under `-layer<L>`, stores float32 values as the
//!   float32 cache does (4 bytes each; attention reads them as they are).
//! - Schedules, this project's (`quality::cache`): `prefill` encodes each layer's text at once (a
//!   partial last K group zero-padded); while decoding, a K group is quantized when it fills and
//!   the tokens of the group still filling stay f32, and V tokens are quantized on arrival.
//! - Attention: under `prefill` without sinks each head's K and V are one codec tensor each,
//!   which `LayerCache::packed_head` hands to attention to read in place (the quality crate's
//!   scheme layer does, through `kvcodec::attention`).
//! - Bytes, from the encoded tensors: `PackedTensor::payload_bytes` (codes, f32 scales, zero
//!   points, the 8-byte shape) of what is quantized, and 4 bytes per f32 value.

use std::fmt;

use kvcodec::Mode;

/// The project's codec as a scheme (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CodecScheme {
    /// K's code width.
    pub k_bits: u32,
    /// V's code width.
    pub v_bits: u32,
    /// Symmetric or asymmetric codes.
    pub mode: Mode,
    /// Tokens kept f32 at the start.
    pub sinks: usize,
    /// First and last layers at 8 bits.
    pub edge8: bool,
    /// The one layer quantized, when only one is.
    pub layer: Option<usize>,
}

/// Values per group.
pub const GROUP: usize = 32;

/// The width that keeps a side float32.
pub const FLOAT32: u32 = 32;

/// The largest layer index a name may give (a model's own count is checked when its cache is
/// built).
pub const MAX_LAYER: usize = 255;

/// The largest sink count a name may ask for (SmolLM2's context).
pub const MAX_SINKS: usize = 8192;

impl CodecScheme {
    /// The code widths of layer `layer` of `layers`, `None` for a side held float32: 8 and 8 at
    /// the edges under `-edge8`; float32 at every layer but L under `-layer<L>`.
    pub fn widths(&self, layer: usize, layers: usize) -> (Option<u32>, Option<u32>) {
        let quantized = |bits: u32| (bits != FLOAT32).then_some(bits);
        if self.layer.is_some_and(|l| l != layer) {
            (None, None)
        } else if self.edge8 && (layer == 0 || layer + 1 == layers) {
            (Some(8), Some(8))
        } else {
            (quantized(self.k_bits), quantized(self.v_bits))
        }
    }

    /// The scheme a name spells, if it is one and the codec can store its widths.
    pub fn parse(name: &str) -> Option<CodecScheme> {
        let rest = name.strip_prefix("kvpack-k")?;
        let (k, rest) = rest.split_once('v')?;
        let mut parts = rest.split('-');
        let v = parts.next()?;
        let number = |s: &str| {
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && !s.starts_with('0'))
                .then(|| s.parse::<u32>().ok())
                .flatten()
        };
        let mut scheme = CodecScheme {
            k_bits: number(k)?,
            v_bits: number(v)?,
            mode: Mode::Symmetric,
            sinks: 0,
            edge8: false,
            layer: None,
        };
        // Suffixes in the order the name writes them, each at most once.
        let mut stage = 0;
        for part in parts {
            let (at, ok) = match part {
                "asym" => (1, {
                    scheme.mode = Mode::Asymmetric;
                    true
                }),
                "edge8" => (3, {
                    scheme.edge8 = true;
                    true
                }),
                _ => match (
                    part.strip_prefix("sink").and_then(number),
                    part.strip_prefix("layer"),
                ) {
                    (Some(s), _) if (s as usize) <= MAX_SINKS => (2, {
                        scheme.sinks = s as usize;
                        true
                    }),
                    (_, Some(l)) => match (l == "0").then_some(0).or_else(|| number(l)) {
                        Some(l) if (l as usize) <= MAX_LAYER => (4, {
                            scheme.layer = Some(l as usize);
                            true
                        }),
                        _ => (0, false),
                    },
                    _ => (0, false),
                },
            };
            if !ok || at <= stage {
                return None;
            }
            stage = at;
        }
        let lowest = match scheme.mode {
            Mode::Symmetric => 2,
            Mode::Asymmetric => 1,
        };
        let valid = |b: u32| (lowest..=8).contains(&b) || b == FLOAT32;
        let float = scheme.k_bits == FLOAT32 || scheme.v_bits == FLOAT32;
        let both_float = scheme.k_bits == FLOAT32 && scheme.v_bits == FLOAT32;
        let edge8_alone = !scheme.edge8 || (!float && scheme.layer.is_none());
        (valid(scheme.k_bits) && valid(scheme.v_bits) && !both_float && edge8_alone)
            .then_some(scheme)
    }
}

impl fmt::Display for CodecScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kvpack-k{}v{}", self.k_bits, self.v_bits)?;
        if self.mode == Mode::Asymmetric {
            f.write_str("-asym")?;
        }
        if self.sinks > 0 {
            write!(f, "-sink{}", self.sinks)?;
        }
        if self.edge8 {
            f.write_str("-edge8")?;
        }
        if let Some(layer) = self.layer {
            write!(f, "-layer{layer}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_in_their_one_spelling() {
        for name in [
            "kvpack-k4v4",
            "kvpack-k8v4-asym",
            "kvpack-k4v2-sink4",
            "kvpack-k1v1-asym-sink16-edge8",
            "kvpack-k4v32",
            "kvpack-k32v2-asym",
            "kvpack-k2v2-layer0",
            "kvpack-k4v32-sink4-layer29",
        ] {
            let scheme = CodecScheme::parse(name).unwrap();
            assert_eq!(scheme.to_string(), name);
        }
        for name in [
            "kvpack-k1v4", // 1 bit is asymmetric only
            "kvpack-k9v4",
            "kvpack-k4v4-edge8-asym", // out of order
            "kvpack-k4v4-sink0",
            "kvpack-k04v4",
            "kvpack-k4v4-sink8193",
            "kvpack-k4v4-asym-asym",
            "kvpack-k4",
            "kvpack-k32v32",      // quantizes nothing: the float32 cache
            "kvpack-k16v4",       // 9 to 31 bits are no width
            "kvpack-k4v32-edge8", // -edge8 would quantize the float side
            "kvpack-k4v4-edge8-layer3",
            "kvpack-k4v4-layer03",
            "kvpack-k4v4-layer256",
            "kvpack-k4v4-layer",
            "kvpack-k4v4-layer2-sink4", // out of order
        ] {
            assert_eq!(CodecScheme::parse(name), None, "{name}");
        }
    }

    #[test]
    fn edge_layers_hold_eight_bits() {
        let s = CodecScheme::parse("kvpack-k4v2-edge8").unwrap();
        let q = |k, v| (Some(k), Some(v));
        assert_eq!(
            (s.widths(0, 30), s.widths(1, 30), s.widths(29, 30)),
            (q(8, 8), q(4, 2), q(8, 8))
        );
    }

    #[test]
    fn a_float_side_and_the_other_layers_are_not_quantized() {
        let k_only = CodecScheme::parse("kvpack-k4v32").unwrap();
        assert_eq!(k_only.widths(3, 30), (Some(4), None));
        let one_layer = CodecScheme::parse("kvpack-k2v2-layer3").unwrap();
        assert_eq!(one_layer.widths(3, 30), (Some(2), Some(2)));
        assert_eq!(one_layer.widths(2, 30), (None, None));
        assert_eq!(one_layer.widths(4, 30), (None, None));
    }
}
