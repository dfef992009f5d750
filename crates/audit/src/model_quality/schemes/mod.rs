//! The literature's KV-cache schemes, written again by the audit: what attention reads at one
//! layer under a named scheme, plugged into the model's KV hook ([`models::llama::KvSource`]) to
//! re-run a model-quality pass, and the bytes that layer's cache stores, counted from the shape
//! alone.
//!
//! The names are those of the study (`kvschemes`, docs/schemes.md); each family's spec, with the
//! source file and line it follows, is its module's top comment:
//!
//! | name | module | K | V | full precision |
//! |---|---|---|---|---|
//! | `kivi2`, `kivi4` | [`kivi`] | per channel, groups of 32 tokens, fp16 scale and min | per token, groups of 32 channels | keys: the last T mod 128; values: the last 128 |
//! | `hf-quanto2`, `hf-quanto4` | [`quanto`] | per token, groups of 64 channels, f32 scale and shift | the same | prefill: none; streaming: the residual, and each flush re-quantizes |
//! | `llamacpp-TYPE[+rot]` | [`ggml`], [`hadamard`] | ggml's blocks of 32 channels per token (rotated first with `+rot`) | the same | none |
//! | `kvpack-k<KB>v<VB>[-asym][-sink<S>][-edge8][-layer<L>]` | [`codec`] | the codec, groups of 32 tokens (width 32: float32) | groups of 32 channels (width 32: float32) | the sinks; streaming: K's filling group; every layer but L |
//! | `kvquant<B>[-first<N>]` | [`kvquant`] | before RoPE, per channel against calibrated thresholds, non-uniform levels, fp16 outliers | per token, the same levels' kind | the first N tokens, in fp16 |
//!
//! K and V are [kv_heads, tokens, head_dim], K after RoPE (KVQuant's before it: it needs its
//! calibration and the model's RoPE, so [`layer`] and [`stored_bytes`] refuse it, and
//! [`kvquant::layer`] builds its cache, whose bytes depend on the values as well as the shape). Query i reads positions j <= i.
//! Schedules ([`ReadSchedule`]): `Prefill`, every query reads the cache the whole text leaves;
//! `Streaming`, query i reads the cache as token-by-token decoding leaves it when token i
//! arrives. A full-precision value is the layer's own f32 value, billed at 4 bytes.
//!
//! Nothing here comes from the study's crates: every rule is written again from its source, one
//! f32 (or, for KIVI, f16) operation at a time in the order its module docs state, because the
//! audit requires the study's log-probs bit for bit and a last-bit difference in a scale can move
//! a code. The tests hold every read and every byte count to `kvschemes` (a dev-dependency
//! only), bit for bit, on random, tie-heavy, constant, outlier and tiny inputs.
//!
//! Shapes a scheme cannot hold are refused, naming the problem: K and V of different shapes, a
//! head size that is 0 or not a multiple of the scheme's group or block (32 for KIVI and
//! llama.cpp's types, 64 for quanto and for `+rot`), a layer index past the layer count, a value
//! that is not finite, and byte counts that overflow `usize`.

pub mod codec;
pub mod ggml;
pub mod hadamard;
pub mod kivi;
pub mod kvquant;
pub mod quanto;

use std::fmt;

use models::llama::KvSource;
use ndarray::Array3;

pub use codec::CodecScheme;
pub use ggml::BlockType;

/// A named scheme, as the audit reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditScheme {
    /// KIVI at 2 or 4 bits ([`kivi`]).
    Kivi {
        /// The code width.
        bits: u32,
    },
    /// transformers' `QuantizedCache`, quanto backend, at 2 or 4 bits ([`quanto`]).
    Quanto {
        /// The code width.
        bits: u32,
    },
    /// A llama.cpp cache type, with or without the rotation ([`ggml`], [`hadamard`]).
    LlamaCpp {
        /// The block type.
        ty: BlockType,
        /// Whether rows are rotated by the Walsh-Hadamard matrix first.
        rotate: bool,
    },
    /// This project's codec ([`codec`]).
    Codec(CodecScheme),
    /// KVQuant ([`kvquant`]).
    KvQuant {
        /// The code width, 2 to 5.
        bits: u32,
        /// Tokens kept whole in fp16 at the start (0 without `-first`).
        first: usize,
    },
}

/// When the cache is quantized (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadSchedule {
    /// Every query reads the cache the whole text leaves.
    Prefill,
    /// Query i reads the cache as decoding leaves it when token i arrives.
    Streaming,
}

impl AuditScheme {
    /// The scheme a name spells; an error naming it otherwise.
    pub fn parse(name: &str) -> Result<AuditScheme, String> {
        let scheme = match name {
            "kivi2" => Some(AuditScheme::Kivi { bits: 2 }),
            "kivi4" => Some(AuditScheme::Kivi { bits: 4 }),
            "hf-quanto2" => Some(AuditScheme::Quanto { bits: 2 }),
            "hf-quanto4" => Some(AuditScheme::Quanto { bits: 4 }),
            _ => match name.strip_prefix("llamacpp-") {
                Some(ty) => {
                    let (ty, rotate) = match ty.strip_suffix("+rot") {
                        Some(ty) => (ty, true),
                        None => (ty, false),
                    };
                    BlockType::from_name(ty).map(|ty| AuditScheme::LlamaCpp { ty, rotate })
                }
                None => CodecScheme::parse(name)
                    .map(AuditScheme::Codec)
                    .or_else(|| {
                        kvquant::parse(name)
                            .map(|(bits, first)| AuditScheme::KvQuant { bits, first })
                    }),
            },
        };
        scheme.ok_or_else(|| {
            let types: Vec<&str> = BlockType::ALL.iter().map(|t| t.name()).collect();
            format!(
                "unknown scheme {name:?}: the schemes are kivi2, kivi4, hf-quanto2, hf-quanto4, \
                 llamacpp-TYPE and llamacpp-TYPE+rot for TYPE in {}, and \
                 kvpack-k<KB>v<VB>[-asym][-sink<S>][-edge8][-layer<L>] (widths 2 to 8, or 1 to 8 \
                 with -asym; 32 keeps one side float32), \
                 and kvquant<B>[-first<N>] (B 2 to 5, N 1 to 64)",
                types.join(", ")
            )
        })
    }

    /// Its name (`kivi4`, `llamacpp-q4_0+rot`, `kvpack-k4v4-sink4`).
    pub fn name(&self) -> String {
        match self {
            AuditScheme::Kivi { bits } => format!("kivi{bits}"),
            AuditScheme::Quanto { bits } => format!("hf-quanto{bits}"),
            AuditScheme::LlamaCpp { ty, rotate } => {
                format!(
                    "llamacpp-{}{}",
                    ty.name(),
                    if *rotate { "+rot" } else { "" }
                )
            }
            AuditScheme::Codec(codec) => codec.name(),
            AuditScheme::KvQuant { bits, first } => kvquant::name(*bits, *first),
        }
    }

    /// What the head size must be a multiple of: KIVI's value groups and llama.cpp's blocks are
    /// 32 channels; quanto's groups of 64 would span tokens otherwise; llama.cpp rotates only
    /// head sizes that are multiples of 64 (kvschemes refuses the others for `+rot`); the codec
    /// pads partial groups.
    fn head_dim_multiple(&self) -> usize {
        match self {
            AuditScheme::Kivi { .. } => kivi::GROUP,
            AuditScheme::Quanto { .. } => quanto::GROUP,
            AuditScheme::LlamaCpp { rotate: false, .. } => ggml::BLOCK,
            AuditScheme::LlamaCpp { rotate: true, .. } => 64,
            AuditScheme::Codec(_) | AuditScheme::KvQuant { .. } => 1,
        }
    }

    /// Why [`layer`] and [`stored_bytes`] refuse KVQuant.
    fn needs_calibration(&self) -> String {
        format!(
            "{self} quantizes keys before RoPE against levels calibrated on another text: its \
             cache is built by kvquant::layer, from a calibration"
        )
    }

    fn check_shape(&self, (layer, layers): (usize, usize), head_dim: usize) -> Result<(), String> {
        let multiple = self.head_dim_multiple();
        if head_dim == 0 || !head_dim.is_multiple_of(multiple) {
            return Err(format!(
                "{self} needs a head size that is a positive multiple of {multiple}; this one is \
                 {head_dim}"
            ));
        }
        if layer >= layers {
            return Err(format!("{self}: layer {layer} of {layers} does not exist"));
        }
        Ok(())
    }
}

impl fmt::Display for AuditScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// One side of a layer, [heads, tokens, dim], flat in that order.
#[derive(Debug, Clone, PartialEq)]
struct Rows {
    heads: usize,
    tokens: usize,
    dim: usize,
    values: Vec<f32>,
}

impl Rows {
    /// The values of `x`, each finite; `side` names it in the error.
    fn from_array(x: &Array3<f32>, side: &str) -> Result<Rows, String> {
        let (heads, tokens, dim) = x.dim();
        if let Some(((head, token, channel), value)) =
            x.indexed_iter().find(|(_, v)| !v.is_finite())
        {
            return Err(format!(
                "{side} of head {head}, token {token}, channel {channel} is {value}; the schemes \
                 quantize finite values"
            ));
        }
        Ok(Rows {
            heads,
            tokens,
            dim,
            values: x.iter().copied().collect(),
        })
    }

    #[cfg(test)]
    fn from_fn(
        heads: usize,
        tokens: usize,
        dim: usize,
        f: impl Fn(usize, usize, usize) -> f32,
    ) -> Rows {
        let x = Array3::from_shape_fn((heads, tokens, dim), |(h, t, c)| f(h, t, c));
        Rows::from_array(&x, "x").expect("finite")
    }

    /// Where row (head, token) starts in `values`.
    fn index(&self, head: usize, token: usize) -> usize {
        (head * self.tokens + token) * self.dim
    }

    /// Row (head, token); empty when out of range (attention then reports the mismatch).
    fn row(&self, head: usize, token: usize) -> &[f32] {
        if head >= self.heads || token >= self.tokens {
            return &[];
        }
        let start = self.index(head, token);
        &self.values[start..start + self.dim]
    }

    fn row_mut(&mut self, head: usize, token: usize) -> &mut [f32] {
        let start = self.index(head, token);
        &mut self.values[start..start + self.dim]
    }
}

/// Layer `layer` of `layers` under `scheme` and `schedule`: what attention reads for each
/// query and position, from the layer's K (after RoPE) and V, [kv_heads, tokens, head_dim].
pub fn layer(
    scheme: &AuditScheme,
    schedule: ReadSchedule,
    (layer, layers): (usize, usize),
    k: &Array3<f32>,
    v: &Array3<f32>,
) -> Result<Box<dyn KvSource>, String> {
    if let AuditScheme::KvQuant { .. } = scheme {
        return Err(scheme.needs_calibration());
    }
    if k.dim() != v.dim() {
        return Err(format!(
            "{scheme}: K is {:?} and V is {:?} (kv_heads, tokens, head_dim); they must agree",
            k.dim(),
            v.dim()
        ));
    }
    scheme.check_shape((layer, layers), k.dim().2)?;
    let k = Rows::from_array(k, "K")?;
    let v = Rows::from_array(v, "V")?;
    Ok(match scheme {
        AuditScheme::Kivi { bits } => Box::new(kivi::KiviLayer::new(*bits, schedule, &k, &v)),
        AuditScheme::Quanto { bits } => Box::new(quanto::QuantoLayer::new(*bits, schedule, &k, &v)),
        AuditScheme::LlamaCpp { ty, rotate } => {
            Box::new(ggml::LlamaCppLayer::new(*ty, *rotate, &k, &v))
        }
        AuditScheme::Codec(codec) => Box::new(codec::CodecLayer::new(
            codec,
            schedule,
            (layer, layers),
            &k,
            &v,
        )?),
        AuditScheme::KvQuant { .. } => return Err(scheme.needs_calibration()),
    })
}

/// The bytes layer `layer` of `layers` stores under `scheme` and `schedule` at the end of a
/// text of `tokens` tokens, K and V together, from the shape alone (each family's rule is in its
/// module docs).
pub fn stored_bytes(
    scheme: &AuditScheme,
    schedule: ReadSchedule,
    (layer, layers): (usize, usize),
    kv_heads: usize,
    head_dim: usize,
    tokens: usize,
) -> Result<usize, String> {
    if let AuditScheme::KvQuant { .. } = scheme {
        return Err(scheme.needs_calibration());
    }
    scheme.check_shape((layer, layers), head_dim)?;
    let bytes = match scheme {
        AuditScheme::Kivi { bits } => kivi::stored_bytes(*bits, kv_heads, head_dim, tokens),
        AuditScheme::Quanto { bits } => {
            quanto::stored_bytes(*bits, schedule, kv_heads, head_dim, tokens)
        }
        AuditScheme::LlamaCpp { ty, .. } => ggml::stored_bytes(*ty, kv_heads, head_dim, tokens),
        AuditScheme::Codec(codec) => {
            codec::stored_bytes(codec, schedule, (layer, layers), kv_heads, head_dim, tokens)
        }
        AuditScheme::KvQuant { .. } => return Err(scheme.needs_calibration()),
    };
    bytes.ok_or_else(|| {
        format!(
            "{scheme}: the bytes of {kv_heads} KV heads of {head_dim} values over {tokens} tokens \
             overflow usize"
        )
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use kvschemes::{LayerCache, Schedule, Scheme};
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;
    use rand_distr::{Distribution as _, StandardNormal};

    use super::*;

    const HEADS: usize = 3;
    const HEAD_DIM: usize = 64;
    const LAYERS: [(usize, usize); 3] = [(0, 30), (15, 30), (29, 30)];
    const SCHEDULES: [(ReadSchedule, Schedule); 2] = [
        (ReadSchedule::Prefill, Schedule::Prefill),
        (ReadSchedule::Streaming, Schedule::Streaming),
    ];

    /// The inputs the differential tests read.
    #[derive(Debug, Clone, Copy)]
    enum Input {
        /// Standard normal values.
        Random,
        /// Multiples of 0.25 in [-3, 3]: ties in every rule.
        Grid,
        /// Every value the same.
        Constant(f32),
        /// Normal values, three channels 60 times larger and token 0 20 times larger.
        Outliers,
        /// Normal values, each token's row scaled by 2^e for e from -60 to 9: tiny blocks
        /// (iq4_nl's 1e-15), f16 subnormals and underflow.
        Magnitudes,
    }

    fn array(input: Input, tokens: usize, seed: u64) -> Array3<f32> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        Array3::from_shape_fn((HEADS, tokens, HEAD_DIM), |(_, t, c)| {
            let z: f64 = StandardNormal.sample(&mut rng);
            let z = z as f32;
            match input {
                Input::Random => z,
                Input::Grid => ((z * 4.0).round() / 4.0).clamp(-3.0, 3.0),
                Input::Constant(value) => value,
                Input::Outliers => {
                    let channel = if [3, 17, 40].contains(&c) { 60.0 } else { 1.0 };
                    let sink = if t == 0 { 20.0 } else { 1.0 };
                    z * channel * sink
                }
                Input::Magnitudes => z * 2f32.powi((t * 37 % 70) as i32 - 60),
            }
        })
    }

    /// The queries compared at `tokens` tokens: all of them up to 40 tokens; otherwise the first,
    /// the last, two others, and both sides of each query where a state changes: KIVI's keys
    /// between 127 and 128 (and 255, 256), quanto's flushes between 128 and 129 (256, 257), the
    /// codec's K groups filling between S + 32 g - 2 and S + 32 g - 1 for the sinks S these tests
    /// use (0, 2, 4 and 40), over the first groups; quanto's later flushes (257, 385).
    fn queries(tokens: usize) -> Vec<usize> {
        if tokens <= 40 {
            return (0..tokens).collect();
        }
        let boundaries = [
            0, 1, 2, 3, 4, 30, 31, 32, 33, 34, 35, 36, 62, 63, 64, 65, 70, 71, 72, 126, 127, 128,
            129, 130, 254, 255, 256, 257, 258, 383, 384, 385, 386,
        ];
        let mut queries = BTreeSet::from([tokens - 1, tokens / 3, tokens * 5 / 7]);
        queries.extend(boundaries.into_iter().filter(|&i| i < tokens));
        queries.into_iter().collect()
    }

    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// The audit's cache reads the bits kvschemes' reads at every compared (head, query,
    /// position).
    fn compare_reads(at: &str, ours: &dyn KvSource, theirs: &LayerCache, tokens: usize) {
        for query in queries(tokens) {
            for head in 0..HEADS {
                for position in 0..=query {
                    let reads = [
                        (
                            "key",
                            ours.key(head, query, position),
                            theirs.key(head, query, position),
                        ),
                        (
                            "value",
                            ours.value(head, query, position),
                            theirs.value(head, query, position),
                        ),
                    ];
                    for (side, a, b) in reads {
                        assert!(
                            same_bits(a, b),
                            "{at}: {side} of head {head}, query {query}, position {position}:\n\
                             audit {a:?}\nkvschemes {b:?}"
                        );
                    }
                }
            }
        }
    }

    /// The audit's cache and kvschemes' read the same bits under both schedules at every
    /// layer, and count the same bytes.
    fn compare(name: &str, input: Input, tokens: usize, seed: u64) {
        let k = array(input, tokens, seed);
        let v = array(input, tokens, seed + 1);
        let theirs: Scheme = name.parse().expect("a kvschemes name");
        let ours = AuditScheme::parse(name).expect("an audit name");
        assert_eq!(ours.name(), name);
        for (schedule, their_schedule) in SCHEDULES {
            for layers in LAYERS {
                let at = format!("{name} {schedule:?} {layers:?} {input:?} T={tokens}");
                let expected = LayerCache::new(theirs, their_schedule, layers, &k, &v)
                    .expect("kvschemes holds the layer");
                let cache = layer(&ours, schedule, layers, &k, &v).expect("the audit holds it");
                assert_eq!(
                    stored_bytes(&ours, schedule, layers, HEADS, HEAD_DIM, tokens),
                    Ok(expected.stored().total()),
                    "{at}"
                );
                compare_reads(&at, cache.as_ref(), &expected, tokens);
            }
        }
    }

    /// Every input at every length, for the schemes `names` picks from kvschemes' list and
    /// `extra`, random inputs also at `longer` lengths.
    fn compare_all(names: impl Fn(&str) -> bool, extra: &[&str], longer: &[usize]) {
        let mut list: Vec<String> = Scheme::all().iter().map(|s| s.name()).collect();
        list.extend(extra.iter().map(|s| s.to_string()));
        let list: Vec<String> = list.into_iter().filter(|n| names(n)).collect();
        assert!(!list.is_empty());
        for (i, name) in list.iter().enumerate() {
            let seed = 1000 * i as u64;
            for &tokens in [1, 31, 33, 130, 257].iter().chain(longer) {
                compare(name, Input::Random, tokens, seed + tokens as u64);
            }
            // The tie-heavy input through quanto's second re-quantization (257 tokens); the
            // others past KIVI's and quanto's first residual.
            let inputs = [
                (Input::Grid, [33, 257]),
                (Input::Constant(0.75), [33, 130]),
                (Input::Constant(0.0), [33, 130]),
                (Input::Outliers, [33, 130]),
                (Input::Magnitudes, [33, 130]),
            ];
            for (j, (input, lengths)) in inputs.into_iter().enumerate() {
                for tokens in lengths {
                    compare(name, input, tokens, seed + 500 + 10 * j as u64);
                }
            }
        }
    }

    #[test]
    fn kivi_reads_what_kvschemes_reads_bit_for_bit() {
        compare_all(|n| n.starts_with("kivi"), &[], &[]);
    }

    #[test]
    fn quanto_reads_what_kvschemes_reads_bit_for_bit() {
        // Queries from 257 on read tokens 1..=128 re-quantized once and token 0 twice, and
        // from 385 on once more (below 258 tokens only token 0 is ever read re-quantized).
        compare_all(|n| n.starts_with("hf-quanto"), &[], &[300, 400]);
    }

    #[test]
    fn llamacpp_types_read_what_kvschemes_reads_bit_for_bit() {
        compare_all(
            |n| n.starts_with("llamacpp-") && !n.ends_with("+rot"),
            &[],
            &[],
        );
    }

    #[test]
    fn llamacpp_rotated_types_read_what_kvschemes_reads_bit_for_bit() {
        compare_all(|n| n.ends_with("+rot"), &[], &[]);
    }

    #[test]
    fn codec_schemes_read_what_kvschemes_reads_bit_for_bit() {
        compare_all(
            |n| n.starts_with("kvpack-"),
            &[
                "kvpack-k3v5-asym-sink2",
                "kvpack-k1v1-asym-edge8",
                "kvpack-k2v8-sink40-edge8",
                "kvpack-k4v4-sink300",
                "kvpack-k4v32",
                "kvpack-k32v2-asym-sink3",
                "kvpack-k2v2-layer0",
                "kvpack-k3v32-layer29",
            ],
            &[],
        );
    }

    #[test]
    fn names_parse_as_kvschemes_parses_them() {
        let mut names: Vec<String> = [
            "kivi2",
            "kivi3",
            "KIVI2",
            "kivi",
            "hf-quanto4",
            "hf-quanto8",
            "hf-quanto",
            "llamacpp-q4_0",
            "llamacpp-q4_0+rot",
            "llamacpp-q4_0+ROT",
            "llamacpp-q6_k",
            "llamacpp-q8_0+rot+rot",
            "llamacpp-",
            "llamacpp-+rot",
            "",
            "kvpack-",
            "kvpack-k",
            "kvpack-kv",
            "kvpack-k4v",
            "kvpack-k4v4v",
            "kvpack-k4-v4",
            " kvpack-k4v4",
            "kvpack-k4v4 ",
            "kvpack-k+4v4",
            "kvpack-k4v4-sink",
            "kvpack-k4v4-sink-4",
            "kvpack-k4v4-sink+4",
            "kvpack-k4v4-sink4x",
            "kvpack-k4v4-sink99999999999",
            "kvpack-k4294967298v4",
            "kvpack-k4v4--asym",
            "kvquant",
            "kvquant1",
            "kvquant2",
            "kvquant5",
            "kvquant6",
            "kvquant04",
            "kvquant4-first",
            "kvquant4-first0",
            "kvquant4-first1",
            "kvquant4-first01",
            "kvquant4-first64",
            "kvquant4-first65",
            "kvquant4-first99999999999999999999",
            "kvquant4-first1-first2",
            "kvquant4-sink1",
            "kvquant4-",
            "kvquant-first1",
            "kvquant3-first5",
            " kvquant3",
            "KVQUANT3",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let widths = ["0", "1", "2", "3", "8", "9", "10", "04", "32", ""];
        let suffixes = [
            "",
            "-asym",
            "-sink4",
            "-sink0",
            "-sink8192",
            "-sink8193",
            "-edge8",
            "-edge",
            "-sym",
            "-asym-sink2-edge8",
            "-asym-edge8",
            "-sink2-edge8",
            "-edge8-asym",
            "-sink4-asym",
            "-edge8-sink4",
            "-",
            "-asym-asym",
            "-edge8-edge8",
            "-sink1-sink2",
            "-layer0",
            "-layer7",
            "-layer07",
            "-layer255",
            "-layer256",
            "-layer",
            "-sink2-layer1",
            "-layer1-sink2",
            "-edge8-layer1",
            "-layer1-layer2",
        ];
        for k in widths {
            for v in widths {
                for suffix in suffixes {
                    names.push(format!("kvpack-k{k}v{v}{suffix}"));
                }
            }
        }
        for name in &names {
            let theirs = name.parse::<Scheme>().ok().map(|s| s.name());
            let ours = AuditScheme::parse(name).ok().map(|s| s.name());
            assert_eq!(ours, theirs, "{name:?}");
        }
        assert!(
            names
                .iter()
                .filter(|n| AuditScheme::parse(n).is_ok())
                .count()
                > 80
        );
    }

    #[test]
    fn an_unknown_name_is_refused_naming_it() {
        for name in ["kivi3", "llamacpp-q6_k", "kvpack-k9v4", "turboquant"] {
            let err = AuditScheme::parse(name).unwrap_err();
            assert!(err.contains(&format!("unknown scheme {name:?}")), "{err}");
            assert!(
                err.contains("llamacpp-TYPE+rot for TYPE in q4_0, q4_1"),
                "{err}"
            );
        }
    }

    #[test]
    fn shapes_a_scheme_cannot_hold_are_refused_as_kvschemes_refuses_them() {
        for scheme in Scheme::all() {
            let ours = AuditScheme::parse(&scheme.name()).unwrap();
            for head_dim in [0, 16, 32, 48, 64, 96, 128] {
                let x = Array3::from_shape_fn((2, 3, head_dim), |(h, t, c)| (h + t + c) as f32);
                let theirs = LayerCache::new(scheme, Schedule::Prefill, (1, 30), &x, &x);
                let read = layer(&ours, ReadSchedule::Prefill, (1, 30), &x, &x);
                let bytes = stored_bytes(&ours, ReadSchedule::Prefill, (1, 30), 2, head_dim, 3);
                assert_eq!(read.is_ok(), theirs.is_ok(), "{scheme} {head_dim}");
                assert_eq!(bytes.is_ok(), theirs.is_ok(), "{scheme} {head_dim}");
                if let (Err(err), Scheme::KvQuant(_)) = (&bytes, scheme) {
                    assert!(err.contains("built by kvquant::layer"), "{err}");
                } else if let Err(err) = bytes {
                    assert!(
                        err.contains(&format!("{scheme} needs a head size"))
                            && err.contains(&format!("this one is {head_dim}")),
                        "{err}"
                    );
                }
            }
        }
        let q4 = AuditScheme::parse("llamacpp-q4_0").unwrap();
        let x = Array3::<f32>::zeros((2, 3, 64));
        let err = layer(
            &q4,
            ReadSchedule::Prefill,
            (0, 30),
            &x,
            &Array3::zeros((2, 4, 64)),
        )
        .err()
        .unwrap();
        assert!(err.contains("they must agree"), "{err}");
        let mut bad = x.clone();
        bad[[1, 2, 5]] = f32::INFINITY;
        let err = layer(&q4, ReadSchedule::Prefill, (0, 30), &x, &bad)
            .err()
            .unwrap();
        assert!(
            err.contains("V of head 1, token 2, channel 5 is inf"),
            "{err}"
        );
        let err = layer(&q4, ReadSchedule::Prefill, (30, 30), &x, &x)
            .err()
            .unwrap();
        assert!(err.contains("layer 30 of 30 does not exist"), "{err}");
        let err =
            stored_bytes(&q4, ReadSchedule::Prefill, (0, 30), usize::MAX / 2, 64, 3).unwrap_err();
        assert!(err.contains("overflow usize"), "{err}");
    }

    /// Hand-counted bytes of one small layer under each family.
    #[test]
    fn stored_bytes_of_a_small_layer_by_hand() {
        let bytes = |name: &str, schedule, tokens| {
            stored_bytes(
                &AuditScheme::parse(name).unwrap(),
                schedule,
                (3, 30),
                2,
                64,
                tokens,
            )
        };
        // llama.cpp q4_0, 2 heads x 64 values x 5 tokens: 2 blocks of 18 bytes per row, 10 rows
        // per side: 2 x 10 x 2 x 18 = 720, in either schedule and with the rotation.
        for name in ["llamacpp-q4_0", "llamacpp-q4_0+rot"] {
            for schedule in [ReadSchedule::Prefill, ReadSchedule::Streaming] {
                assert_eq!(bytes(name, schedule, 5), Ok(720));
            }
        }
        // q8_0 at 34 bytes a block, q5_0 at 22, q4_1 at 20.
        assert_eq!(bytes("llamacpp-q8_0", ReadSchedule::Prefill, 5), Ok(1_360));
        assert_eq!(bytes("llamacpp-q5_0", ReadSchedule::Prefill, 5), Ok(880));
        assert_eq!(bytes("llamacpp-q4_1", ReadSchedule::Prefill, 5), Ok(800));
        // KIVI at 5 tokens: everything in the residual, 2 sides x 2 heads x 5 x 64 x 4 = 5,120.
        assert_eq!(bytes("kivi2", ReadSchedule::Prefill, 5), Ok(5_120));
        // quanto-4 at 5 tokens, prefill: 10 groups per side: ceil(10 / 2) x 64 = 320 code bytes
        // and 80 of scale and shift: 2 x 400. Streaming: token 0 quantized (2 groups: 64 + 16)
        // and 4 in the residual (2 x 4 x 64 x 4 = 2,048): 2 x 2,128.
        assert_eq!(bytes("hf-quanto4", ReadSchedule::Prefill, 5), Ok(800));
        assert_eq!(bytes("hf-quanto4", ReadSchedule::Streaming, 5), Ok(4_256));
    }
}
