//! Scheme names, parsed once into a [`Scheme`]; the table of what each stores is in the crate
//! docs.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use crate::codec::CodecScheme;
use crate::kvquant::KvQuantScheme;
use crate::llamacpp::CacheType;

/// The code widths KIVI and quanto's cache take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Width {
    /// 2 bits.
    Two,
    /// 4 bits.
    Four,
}

impl Width {
    /// The width.
    pub fn bits(self) -> u32 {
        match self {
            Width::Two => 2,
            Width::Four => 4,
        }
    }
}

/// A named scheme of the literature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scheme {
    /// KIVI at 2 or 4 bits ([`crate::kivi`]).
    Kivi(Width),
    /// The Hugging Face `QuantizedCache`, quanto backend, at 2 or 4 bits ([`crate::quanto`]).
    Quanto(Width),
    /// This project's codec: K and V widths, mode, sinks, edge layers ([`crate::codec`]).
    Codec(CodecScheme),
    /// KVQuant: pre-RoPE keys, calibrated non-uniform levels, dense-and-sparse outliers
    /// ([`crate::kvquant`]).
    KvQuant(KvQuantScheme),
    /// A llama.cpp cache type for K and V, with or without its rotation
    /// ([`crate::llamacpp`], [`crate::hadamard`]).
    LlamaCpp {
        /// The type.
        ty: CacheType,
        /// Whether K and V are rotated by the Walsh-Hadamard matrix first.
        rotate: bool,
    },
}

impl Scheme {
    /// Every scheme, in the order reports list them.
    pub fn all() -> Vec<Scheme> {
        let mut all = vec![
            Scheme::Kivi(Width::Two),
            Scheme::Kivi(Width::Four),
            Scheme::Quanto(Width::Two),
            Scheme::Quanto(Width::Four),
        ];
        for rotate in [false, true] {
            for ty in CacheType::ALL {
                all.push(Scheme::LlamaCpp { ty, rotate });
            }
        }
        for name in KVQUANT_SCHEMES {
            all.push(Scheme::KvQuant(
                KvQuantScheme::parse(name).expect("a valid name"),
            ));
        }
        for name in CODEC_SCHEMES {
            all.push(Scheme::Codec(
                CodecScheme::parse(name).expect("a valid name"),
            ));
        }
        all
    }

    /// Its name (`kivi4`, `llamacpp-q4_0+rot`).
    pub fn name(self) -> String {
        match self {
            Scheme::Kivi(bits) => format!("kivi{}", bits.bits()),
            Scheme::Quanto(bits) => format!("hf-quanto{}", bits.bits()),
            Scheme::LlamaCpp { ty, rotate } => {
                format!("llamacpp-{ty}{}", if rotate { "+rot" } else { "" })
            }
            Scheme::Codec(codec) => codec.to_string(),
            Scheme::KvQuant(kvquant) => kvquant.to_string(),
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The KVQuant schemes [`Scheme::all`] lists; `kvquant<B>[-first<N>]` parses for B in 2..=5.
pub const KVQUANT_SCHEMES: [&str; 4] = ["kvquant2", "kvquant3", "kvquant4", "kvquant4-first1"];

/// The project's codec schemes [`Scheme::all`] lists; any other valid `kvpack-...` name parses
/// too.
pub const CODEC_SCHEMES: [&str; 7] = [
    "kvpack-k4v4",
    "kvpack-k4v4-asym",
    "kvpack-k8v4",
    "kvpack-k4v8",
    "kvpack-k4v2",
    "kvpack-k4v4-sink4",
    "kvpack-k4v4-edge8",
];

/// A name that is no scheme.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "unknown scheme {name:?}; the schemes are {}, kvquant<B>[-first<N>] (B 2 to 5, N 1 to 64), \
     and kvpack-k<KB>v<VB>[-asym][-sink<S>][-edge8][-layer<L>] (widths 2 to 8, or 1 to 8 \
     with -asym; 32 keeps one side float32)",
    Scheme::all().iter().filter(|s| !matches!(s, Scheme::Codec(_) | Scheme::KvQuant(_))).map(|s| s.name()).collect::<Vec<_>>().join(", ")
)]
pub struct UnknownScheme {
    /// The name given.
    pub name: String,
}

impl FromStr for Scheme {
    type Err = UnknownScheme;
    fn from_str(name: &str) -> Result<Scheme, UnknownScheme> {
        Scheme::all()
            .into_iter()
            .find(|s| s.name() == name)
            .or_else(|| CodecScheme::parse(name).map(Scheme::Codec))
            .or_else(|| KvQuantScheme::parse(name).map(Scheme::KvQuant))
            .ok_or_else(|| UnknownScheme {
                name: name.to_string(),
            })
    }
}

/// Why a cache cannot be held under a scheme.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum SchemeError {
    /// K and V of different shapes.
    #[error("K is {k:?} and V is {v:?} (kv_heads, tokens, head_dim); they must agree")]
    Shapes {
        /// K's shape.
        k: [usize; 3],
        /// V's shape.
        v: [usize; 3],
    },
    /// A head size the scheme's blocks or groups do not divide.
    #[error(
        "{scheme} needs a head size that is a multiple of {multiple}; this model's is {head_dim}"
    )]
    HeadDim {
        /// The scheme.
        scheme: Scheme,
        /// The head size.
        head_dim: usize,
        /// What it must be a multiple of.
        multiple: usize,
    },
    /// The codec refused a layout or a tensor.
    #[error("KV codec: {0}")]
    Codec(String),
    /// A layer index past the model's layers.
    #[error("layer {layer} of a model with {layers} layers")]
    Layer {
        /// The index given.
        layer: usize,
        /// The model's layers.
        layers: usize,
    },
    /// Values whose block scale, group scale or minimum the scheme's metadata cannot hold
    /// (beyond fp16's range for KIVI and llama.cpp's types, f32's for quanto): the cache would
    /// read back infinities or NaN.
    #[error(
        "{scheme}: {side} of head {head}, token {token} reads back {value} (its scale or minimum \
         overflows the scheme's metadata); such values cannot be held"
    )]
    Unrepresentable {
        /// The scheme.
        scheme: Scheme,
        /// "K" or "V".
        side: &'static str,
        /// The head.
        head: usize,
        /// The token.
        token: usize,
        /// The value read back.
        value: f32,
    },
    /// A KVQuant scheme asked for without its calibration and keys before RoPE.
    #[error(
        "{scheme} quantizes keys before RoPE against levels calibrated on another text: build \
         its cache with LayerCache::kvquant, from a Calibration"
    )]
    NeedsCalibration {
        /// The scheme.
        scheme: Scheme,
    },
    /// A calibration that is not the scheme's or the model's.
    #[error("{scheme}: {problem}")]
    Calibration {
        /// The scheme.
        scheme: Scheme,
        /// What does not fit.
        problem: String,
    },
    /// The caller's RoPE refused the keys read back.
    #[error("rotating the keys read back: {0}")]
    Rope(String),
    /// A value that is not finite.
    #[error("{side} of head {head}, token {token} holds {value}; schemes quantize finite values")]
    NotFinite {
        /// "K" or "V".
        side: &'static str,
        /// The head.
        head: usize,
        /// The token.
        token: usize,
        /// The value.
        value: f32,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_an_unknown_name_lists_the_schemes() {
        for scheme in Scheme::all() {
            assert_eq!(scheme.name().parse::<Scheme>(), Ok(scheme));
        }
        assert_eq!(Scheme::all().len(), 25);
        assert!("kvquant3-first5".parse::<Scheme>().is_ok());
        assert!("kvpack-k3v5-asym-sink2".parse::<Scheme>().is_ok());
        let err = "kivi3".parse::<Scheme>().unwrap_err().to_string();
        assert!(
            err.contains("kivi2, kivi4, hf-quanto2, hf-quanto4, llamacpp-q4_0"),
            "{err}"
        );
        assert!(err.contains("llamacpp-iq4_nl+rot"), "{err}");
    }
}
