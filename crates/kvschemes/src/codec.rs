//! This project's own KV codec (`kvcodec`) as a named scheme, so that it stands on the same
//! frontier as the literature's: separate K and V widths, symmetric or asymmetric codes, attention
//! sinks kept in full precision, and 8-bit first and last layers.
//!
//! Name: `kvpack-k<KB>v<VB>[-asym][-sink<S>][-edge8]`, for example `kvpack-k4v4`,
//! `kvpack-k8v4-asym`, `kvpack-k4v2-sink4`, `kvpack-k4v4-edge8`.
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
}

/// Values per group.
pub const GROUP: usize = 32;

/// The largest sink count a name may ask for (SmolLM2's context).
pub const MAX_SINKS: usize = 8192;

impl CodecScheme {
    /// The widths of layer `layer` of `layers`: 8 and 8 at the edges under `-edge8`.
    pub fn widths(&self, layer: usize, layers: usize) -> (u32, u32) {
        if self.edge8 && (layer == 0 || layer + 1 == layers) {
            (8, 8)
        } else {
            (self.k_bits, self.v_bits)
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
                _ => match part.strip_prefix("sink").and_then(number) {
                    Some(s) if (s as usize) <= MAX_SINKS => (2, {
                        scheme.sinks = s as usize;
                        true
                    }),
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
        let valid = |b: u32| (lowest..=8).contains(&b);
        (valid(scheme.k_bits) && valid(scheme.v_bits)).then_some(scheme)
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
        ] {
            assert_eq!(CodecScheme::parse(name), None, "{name}");
        }
    }

    #[test]
    fn edge_layers_hold_eight_bits() {
        let s = CodecScheme::parse("kvpack-k4v2-edge8").unwrap();
        assert_eq!(
            (s.widths(0, 30), s.widths(1, 30), s.widths(29, 30)),
            ((8, 8), (4, 2), (8, 8))
        );
    }
}
