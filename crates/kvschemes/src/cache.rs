//! One layer's K and V cache under a [`Scheme`]: what attention reads for each query and
//! position, and the bytes the cache stores.
//!
//! K and V are [kv_heads, tokens, head_dim] (K after RoPE; KVQuant's, built by
//! [`LayerCache::kvquant`], before it). Each scheme stores, after n tokens, a
//! quantized prefix of each and keeps the rest in full precision (f32 here):
//!
//! | scheme | K quantized after n tokens | V quantized after n tokens |
//! |---|---|---|
//! | `kivi*` | floor(n / 128) * 128 | max(0, n - 128) |
//! | `hf-quanto*` | prefill: n; decoding: 1 + floor((n - 1) / 128) * 128 | the same |
//! | `llamacpp-*` | n | n |
//! | `kvpack-*` | prefill: n; decoding: S + 32 floor((n - S) / 32) (whole groups) | n |
//! | `kvquant*` | n (before RoPE; the first N in fp16) | n (the first N in fp16) |
//!
//! (`kvpack-*-sink<S>` keeps its first S tokens f32 in both.)
//!
//! Schedules (query position i reads positions j <= i):
//! - [`Schedule::Prefill`]: every query reads the cache the whole text leaves (n = tokens), as
//!   a prompt's cache is built once: the scores of the quantized part, the rest f32;
//! - [`Schedule::Streaming`]: query i reads the cache as token-by-token decoding leaves it when
//!   token i arrives: its own state after the i tokens before it, plus token i as the scheme
//!   holds a new token (KIVI: in the residual, full precision; llama.cpp: quantized on arrival;
//!   `kvpack-*`: a K group is quantized when its last token arrives, so query i reads the state
//!   after i + 1 tokens).
//!
//! For KIVI and llama.cpp a quantized position reads the same values whichever state it is read
//! in (a KIVI key group always lies inside a quantized prefix of whole residuals, R being a
//! multiple of G; llama.cpp blocks are per token), so each side is quantized once, over its
//! largest prefix. quanto re-quantizes its whole cache at every flush, so while decoding a
//! position reads the version its flushes have made of it (quantize after dequantize, once per
//! flush since its first); each token's distinct versions are kept.
//!
//! Refused: a layer index past the model's; finite values whose scale or minimum overflows the
//! scheme's metadata (fp16 for KIVI and llama.cpp, f32 for quanto), which would read back as
//! infinities or NaN. A block scale that underflows fp16 to 0 is kept, as ggml keeps it: that
//! block reads back as zeros.
//!
//! Bytes ([`Stored`]) are those of the state the schedule ends in (after the last token),
//! counted from what is stored: llama.cpp's block bytes; KIVI's packed u32 code words, fp16
//! scales and minimums; quanto's packed codes and f32 scales and shifts; KVQuant's packed codes,
//! outliers and ranges (its module's spec) and its layer's calibration; 4 bytes per
//! full-precision value.

use half::f16;
use ndarray::{Array3, Axis};

use crate::hadamard::{self, Hadamard};
use kvcodec::{GroupAxis, Layout, PackedTensor};

use crate::codec::{self, CodecScheme};
use crate::kivi::{self, Group};
use crate::kvquant::{self, Calibration, KvQuantScheme};
use crate::llamacpp::CacheType;
use crate::quanto;
use crate::scheme::{Scheme, SchemeError};

/// When the cache is quantized (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Every query reads the cache the whole text leaves.
    Prefill,
    /// Query i reads the cache as decoding leaves it when token i arrives.
    Streaming,
}

/// Bytes a cache stores, by part.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stored {
    /// Codes (block nibbles and bytes, packed code words).
    pub codes: usize,
    /// Scales, minimums and zero points.
    pub metadata: usize,
    /// Full-precision values (4 bytes each; KVQuant's first tokens, 2 bytes each in fp16).
    pub full_precision: usize,
    /// Sparse outliers: their values, indices and per-row counts (KVQuant).
    pub outliers: usize,
}

impl Stored {
    /// Everything.
    pub fn total(&self) -> usize {
        self.codes + self.metadata + self.full_precision + self.outliers
    }

    fn add(&mut self, other: Stored) {
        self.codes += other.codes;
        self.metadata += other.metadata;
        self.full_precision += other.full_precision;
        self.outliers += other.outliers;
    }
}

/// One side (K or V) of a layer's cache.
#[derive(Debug, Clone)]
struct Side {
    raw: Array3<f32>,
    /// The decoded values of the quantized prefix (original basis; quanto: each token's first
    /// version); f32 values past it.
    decoded: Array3<f32>,
    /// quanto while decoding: each (head, token)'s later distinct versions, [head * tokens +
    /// token], version m >= 1 at m - 1 (the last one is a fixed point of re-quantization: the
    /// next version would equal it value for value, compared as f32).
    later: Vec<Vec<Vec<f32>>>,
    /// Leading positions held f32 whatever the state (the codec scheme's sinks).
    sinks: usize,
    stored: Stored,
}

impl Side {
    /// Refuses a side whose decoded values (any version) are not all finite: finite inputs
    /// whose scale or minimum overflowed the scheme's metadata.
    fn check_read_back(&self, scheme: Scheme, side: &'static str) -> Result<(), SchemeError> {
        let (_, tokens, head_dim) = self.decoded.dim();
        let bad = |head: usize, token: usize, value: f32| SchemeError::Unrepresentable {
            scheme,
            side,
            head,
            token,
            value,
        };
        if let Some((i, &value)) = self
            .decoded
            .iter()
            .enumerate()
            .find(|(_, x)| !x.is_finite())
        {
            let row = i / head_dim.max(1);
            return Err(bad(row / tokens.max(1), row % tokens.max(1), value));
        }
        for (at, versions) in self.later.iter().enumerate() {
            if let Some(&value) = versions.iter().flatten().find(|x| !x.is_finite()) {
                return Err(bad(at / tokens.max(1), at % tokens.max(1), value));
            }
        }
        Ok(())
    }

    fn row(&self, quantized: usize, version: usize, head: usize, position: usize) -> &[f32] {
        if position >= quantized || position < self.sinks {
            return row_of(&self.raw, head, position);
        }
        let tokens = self.raw.dim().1;
        match self.later.get(head * tokens + position) {
            Some(later) if version > 0 && !later.is_empty() => {
                &later[(version - 1).min(later.len() - 1)]
            }
            _ => row_of(&self.decoded, head, position),
        }
    }
}

/// Row `position` of head `head` of a standard-layout [heads, positions, d] array; empty when
/// out of range.
fn row_of(x: &Array3<f32>, head: usize, position: usize) -> &[f32] {
    let (heads, positions, d) = x.dim();
    if head >= heads || position >= positions {
        return &[];
    }
    let start = (head * positions + position) * d;
    &x.as_slice().expect("standard layout")[start..start + d]
}

/// One layer's cache under a scheme.
#[derive(Debug, Clone)]
pub struct LayerCache {
    scheme: Scheme,
    schedule: Schedule,
    tokens: usize,
    k: Side,
    v: Side,
    /// Sparse outlier values stored (KVQuant), K and V together.
    outliers: usize,
    /// Per KV head, K and V each held whole as one codec tensor (the codec scheme under
    /// `prefill` without sinks); empty otherwise.
    packed: Vec<(PackedTensor, PackedTensor)>,
}

impl LayerCache {
    /// Holds one layer's K (after RoPE) and V, [kv_heads, tokens, head_dim], under `scheme`,
    /// read under `schedule`; `layer` is its index among the model's `layers` (only the codec
    /// scheme's `-edge8` reads it).
    pub fn new(
        scheme: Scheme,
        schedule: Schedule,
        (layer, layers): (usize, usize),
        k: &Array3<f32>,
        v: &Array3<f32>,
    ) -> Result<LayerCache, SchemeError> {
        let (_, tokens, head_dim) = check_shapes(k, v, (layer, layers))?;
        check_head_dim(scheme, head_dim)?;
        check_finite("K", k)?;
        check_finite("V", v)?;
        let k = k.as_standard_layout().into_owned();
        let v = v.as_standard_layout().into_owned();
        let mut packed = Vec::new();
        let (k, v) = match scheme {
            Scheme::Kivi(bits) => (
                kivi_side(
                    k,
                    kivi::quantized_keys(tokens),
                    bits.bits(),
                    KiviAxis::Tokens,
                ),
                kivi_side(
                    v,
                    kivi::quantized_values(tokens),
                    bits.bits(),
                    KiviAxis::Channels,
                ),
            ),
            Scheme::Quanto(bits) => (
                quanto_side(k, schedule, bits.bits()),
                quanto_side(v, schedule, bits.bits()),
            ),
            Scheme::Codec(codec) => {
                if let Some(only) = codec.layer.filter(|&l| l >= layers) {
                    return Err(SchemeError::Layer {
                        layer: only,
                        layers,
                    });
                }
                let (k_bits, v_bits) = codec.widths(layer, layers);
                let (k, k_whole) = codec_side(k, schedule, codec, k_bits, GroupAxis::Token)?;
                let (v, v_whole) = codec_side(v, schedule, codec, v_bits, GroupAxis::Feature)?;
                packed = k_whole.into_iter().zip(v_whole).collect();
                (k, v)
            }
            Scheme::KvQuant(_) => return Err(SchemeError::NeedsCalibration { scheme }),
            Scheme::LlamaCpp { ty, rotate } => {
                let rotation = |size: Option<usize>| {
                    size.filter(|_| rotate)
                        .map(|n| Hadamard::new(n).expect("a power of two"))
                };
                (
                    llamacpp_side(k, ty, rotation(hadamard::key_size(head_dim)).as_ref()),
                    llamacpp_side(v, ty, rotation(hadamard::value_size(head_dim)).as_ref()),
                )
            }
        };
        k.check_read_back(scheme, "K")?;
        v.check_read_back(scheme, "V")?;
        Ok(LayerCache {
            scheme,
            schedule,
            tokens,
            k,
            v,
            outliers: 0,
            packed,
        })
    }

    /// Holds one layer's keys *before* RoPE and values under a KVQuant scheme, against
    /// `calibration` (fitted for this scheme and model, [`kvquant::Calibration::fit`]);
    /// `rope` rotates the keys read back ([kv_heads, tokens, head_dim], position p as the
    /// model rotates position p). Every token is quantized on arrival, so both schedules read
    /// the same cache.
    pub fn kvquant<E: std::fmt::Display>(
        scheme: KvQuantScheme,
        calibration: &Calibration,
        schedule: Schedule,
        (layer, layers): (usize, usize),
        (k_pre_rope, v): (&Array3<f32>, &Array3<f32>),
        rope: impl FnOnce(&mut Array3<f32>) -> Result<(), E>,
    ) -> Result<LayerCache, SchemeError> {
        let named = Scheme::KvQuant(scheme);
        let kd = check_shapes(k_pre_rope, v, (layer, layers))?;
        let mismatch = |problem: String| SchemeError::Calibration {
            scheme: named,
            problem,
        };
        if calibration.bits != scheme.bits || calibration.first != scheme.first {
            return Err(mismatch(format!(
                "the calibration was fitted at {} bits with {} first tokens",
                calibration.bits, calibration.first
            )));
        }
        if calibration.layers.len() != layers {
            return Err(mismatch(format!(
                "the calibration has {} layers, the model {layers}",
                calibration.layers.len()
            )));
        }
        let fitted = &calibration.layers[layer];
        let (heads, tokens, head_dim) = kd;
        if fitted.key_upper.len() != heads * head_dim {
            return Err(mismatch(format!(
                "the calibration's key rows are {} wide, this layer's {}",
                fitted.key_upper.len(),
                heads * head_dim
            )));
        }
        check_finite("K", k_pre_rope)?;
        check_finite("V", v)?;
        let mut stored = Stored {
            metadata: calibration.layer_bytes(heads * head_dim),
            ..Stored::default()
        };
        let mut count = 0usize;
        let mut side = |x: &Array3<f32>, keys: bool| {
            let mut decoded = x.as_standard_layout().into_owned();
            for (t, row) in kvquant::rows(x.view()).iter().enumerate() {
                let values: Vec<f32> = if t < scheme.first {
                    stored.full_precision += row.len() * 2;
                    row.iter().map(|&x| f16::from_f32(x).to_f32()).collect()
                } else {
                    let q = if keys {
                        kvquant::quantize_key_row(fitted, row)
                    } else {
                        kvquant::quantize_value_row(fitted, row)
                    };
                    let (codes, metadata, outliers) = q.bytes(scheme.bits);
                    count += q.outliers.len();
                    stored.codes += codes;
                    stored.metadata += metadata;
                    stored.outliers += outliers;
                    q.decoded
                };
                for (i, value) in values.into_iter().enumerate() {
                    decoded[[i / head_dim, t, i % head_dim]] = value;
                }
            }
            decoded
        };
        let mut k = side(k_pre_rope, true);
        let v = side(v, false);
        rope(&mut k).map_err(|e| SchemeError::Rope(e.to_string()))?;
        let whole = |decoded: Array3<f32>| Side {
            raw: decoded.clone(),
            decoded,
            later: Vec::new(),
            sinks: 0,
            stored: Stored::default(),
        };
        let (mut k, v) = (whole(k), whole(v));
        k.stored = stored;
        k.check_read_back(named, "K")?;
        v.check_read_back(named, "V")?;
        Ok(LayerCache {
            scheme: named,
            schedule,
            tokens,
            k,
            v,
            outliers: count,
            packed: Vec::new(),
        })
    }

    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The schedule.
    pub fn schedule(&self) -> Schedule {
        self.schedule
    }

    /// Positions of K and V quantized when query `query` reads the cache.
    pub fn quantized(&self, query: usize) -> (usize, usize) {
        let state = match self.schedule {
            Schedule::Prefill => self.tokens,
            Schedule::Streaming => query,
        };
        match (self.scheme, self.schedule) {
            (Scheme::Kivi(_), _) => (kivi::quantized_keys(state), kivi::quantized_values(state)),
            (Scheme::Quanto(_), Schedule::Prefill) => (self.tokens, self.tokens),
            (Scheme::Quanto(_), Schedule::Streaming) => {
                let n = quanto::quantized_prefix(query);
                (n, n)
            }
            // Every token is quantized on arrival, the query's own included.
            (Scheme::LlamaCpp { .. } | Scheme::KvQuant(_), _) => (self.tokens, self.tokens),
            (Scheme::Codec(_), Schedule::Prefill) => (self.tokens, self.tokens),
            (Scheme::Codec(codec), Schedule::Streaming) => {
                let n = query + 1;
                let whole = n.saturating_sub(codec.sinks) / codec::GROUP * codec::GROUP;
                (codec.sinks + whole, n)
            }
        }
    }

    /// Which version of `position` query `query` reads (quanto while decoding: one per flush
    /// since the position's first; 0 otherwise).
    fn version(&self, query: usize, position: usize) -> usize {
        match (self.scheme, self.schedule) {
            (Scheme::Quanto(_), Schedule::Streaming) => {
                quanto::flushes_before(query).saturating_sub(quanto::first_flush(position))
            }
            _ => 0,
        }
    }

    /// The key row query `query` reads at `position`.
    pub fn key(&self, head: usize, query: usize, position: usize) -> &[f32] {
        let version = self.version(query, position);
        self.k.row(self.quantized(query).0, version, head, position)
    }

    /// The value row query `query` reads at `position`.
    pub fn value(&self, head: usize, query: usize, position: usize) -> &[f32] {
        let version = self.version(query, position);
        self.v.row(self.quantized(query).1, version, head, position)
    }

    /// K and V, [kv_heads, tokens, head_dim], as query `query` reads them (every position,
    /// including those after the query, in the state that query sees).
    pub fn read(&self, query: usize) -> (Array3<f32>, Array3<f32>) {
        let (heads, tokens, _) = self.k.raw.dim();
        let mut k = self.k.raw.clone();
        let mut v = self.v.raw.clone();
        for head in 0..heads {
            for position in 0..tokens {
                k.slice_mut(ndarray::s![head, position, ..])
                    .assign(&ndarray::ArrayView1::from(self.key(head, query, position)));
                v.slice_mut(ndarray::s![head, position, ..])
                    .assign(&ndarray::ArrayView1::from(
                        self.value(head, query, position),
                    ));
            }
        }
        (k, v)
    }

    /// Sparse outlier values the cache stores (KVQuant's; 0 for the other schemes), K and V
    /// together: with the shape, they decide its bytes.
    pub fn outliers(&self) -> usize {
        self.outliers
    }

    /// KV head `head`'s K (grouped along tokens) and V (along features), each held whole as one
    /// codec tensor, where the cache is that (the codec scheme under `prefill` without sinks), for
    /// attention to read in place; `None` otherwise.
    pub fn packed_head(&self, head: usize) -> Option<(&PackedTensor, &PackedTensor)> {
        self.packed.get(head).map(|(k, v)| (k, v))
    }

    /// Bytes stored at the end of the text (module docs), K and V together.
    pub fn stored(&self) -> Stored {
        let mut stored = self.k.stored;
        stored.add(self.v.stored);
        stored
    }
}

/// K's shape, when V's is the same and the layer is one of the model's.
fn check_shapes(
    k: &Array3<f32>,
    v: &Array3<f32>,
    (layer, layers): (usize, usize),
) -> Result<(usize, usize, usize), SchemeError> {
    let (kd, vd) = (k.dim(), v.dim());
    if kd != vd {
        return Err(SchemeError::Shapes {
            k: [kd.0, kd.1, kd.2],
            v: [vd.0, vd.1, vd.2],
        });
    }
    if layer >= layers {
        return Err(SchemeError::Layer { layer, layers });
    }
    Ok(kd)
}

fn check_head_dim(scheme: Scheme, head_dim: usize) -> Result<(), SchemeError> {
    let multiple = match scheme {
        Scheme::Codec(_) | Scheme::KvQuant(_) => 1,
        Scheme::LlamaCpp { rotate: true, .. } | Scheme::Quanto(_) => 64,
        Scheme::LlamaCpp { rotate: false, .. } => 32,
        Scheme::Kivi(_) => kivi::GROUP,
    };
    if head_dim == 0 || !head_dim.is_multiple_of(multiple) {
        return Err(SchemeError::HeadDim {
            scheme,
            head_dim,
            multiple,
        });
    }
    Ok(())
}

fn check_finite(side: &'static str, x: &Array3<f32>) -> Result<(), SchemeError> {
    match x.indexed_iter().find(|(_, v)| !v.is_finite()) {
        Some(((head, token, _), &value)) => Err(SchemeError::NotFinite {
            side,
            head,
            token,
            value,
        }),
        None => Ok(()),
    }
}

fn llamacpp_side(raw: Array3<f32>, ty: CacheType, rotation: Option<&Hadamard>) -> Side {
    let mut decoded = raw.clone();
    let mut blocks = Vec::new();
    for (head, mut out) in raw.axis_iter(Axis(0)).zip(decoded.axis_iter_mut(Axis(0))) {
        for (row, mut out_row) in head.outer_iter().zip(out.outer_iter_mut()) {
            let row = row.to_vec();
            let stored_row = rotation.map_or_else(|| row.clone(), |h| h.apply(&row));
            let mut values = vec![0f32; row.len()];
            ty.quantize_row(&stored_row, &mut blocks, &mut values);
            let values = rotation.map_or(values.clone(), |h| h.apply(&values));
            out_row.assign(&ndarray::ArrayView1::from(&values));
        }
    }
    Side {
        raw,
        decoded,
        later: Vec::new(),
        sinks: 0,
        stored: Stored {
            // A block is its f16 scale (and q4_1's f16 minimum) and its codes.
            codes: blocks.len() / ty.block_bytes() * (ty.block_bytes() - metadata_bytes(ty)),
            metadata: blocks.len() / ty.block_bytes() * metadata_bytes(ty),
            full_precision: 0,
            outliers: 0,
        },
    }
}

/// Bytes of a llama.cpp block that are scale and minimum.
fn metadata_bytes(ty: CacheType) -> usize {
    match ty {
        CacheType::Q4_1 => 4,
        _ => 2,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KiviAxis {
    /// Keys: per channel, groups of 32 consecutive tokens.
    Tokens,
    /// Values: per token, groups of 32 consecutive channels.
    Channels,
}

fn kivi_side(raw: Array3<f32>, quantized: usize, bits: u32, axis: KiviAxis) -> Side {
    let (heads, tokens, head_dim) = raw.dim();
    let mut decoded = raw.clone();
    let (mut words, mut scales, mut mins): (Vec<u32>, Vec<f16>, Vec<f16>) = Default::default();
    let mut store = |group: &Group| {
        words.extend(group.packed(bits));
        scales.push(group.scale);
        mins.push(group.min);
    };
    for head in 0..heads {
        match axis {
            KiviAxis::Tokens => {
                for channel in 0..head_dim {
                    for start in (0..quantized).step_by(kivi::GROUP) {
                        let x = std::array::from_fn(|i| raw[[head, start + i, channel]]);
                        let group = Group::quantize(&x, bits);
                        for (i, value) in group.dequantize().into_iter().enumerate() {
                            decoded[[head, start + i, channel]] = value;
                        }
                        store(&group);
                    }
                }
            }
            KiviAxis::Channels => {
                for token in 0..quantized {
                    for start in (0..head_dim).step_by(kivi::GROUP) {
                        let x = std::array::from_fn(|i| raw[[head, token, start + i]]);
                        let group = Group::quantize(&x, bits);
                        for (i, value) in group.dequantize().into_iter().enumerate() {
                            decoded[[head, token, start + i]] = value;
                        }
                        store(&group);
                    }
                }
            }
        }
    }
    let residual = heads * (tokens - quantized) * head_dim;
    Side {
        raw,
        decoded,
        later: Vec::new(),
        sinks: 0,
        stored: Stored {
            codes: words.len() * 4,
            metadata: (scales.len() + mins.len()) * 2,
            full_precision: residual * 4,
            outliers: 0,
        },
    }
}

/// The codec scheme's side: each head's tokens after the sinks as one codec tensor (K along
/// tokens, V along features), decoded; stored, what the schedule's end state holds quantized
/// (prefill: every token; decoding: K's whole groups) as codec tensors, the rest f32. With the
/// side, under `prefill` without sinks, each head's tensor (every query reads all of it), and
/// nothing otherwise. A side of no width (`None`) is held float32: read as it is, 4 bytes a value.
fn codec_side(
    raw: Array3<f32>,
    schedule: Schedule,
    scheme: CodecScheme,
    bits: Option<u32>,
    axis: GroupAxis,
) -> Result<(Side, Vec<PackedTensor>), SchemeError> {
    let (heads, tokens, head_dim) = raw.dim();
    let Some(bits) = bits else {
        let stored = Stored {
            full_precision: raw.len() * 4,
            ..Stored::default()
        };
        let side = Side {
            decoded: raw.clone(),
            raw,
            later: Vec::new(),
            sinks: tokens,
            stored,
        };
        return Ok((side, Vec::new()));
    };
    let sinks = scheme.sinks.min(tokens);
    let layout = Layout::with_mode(axis, scheme.mode, bits, codec::GROUP)
        .map_err(|e| SchemeError::Codec(e.to_string()))?;
    let mut decoded = raw.clone();
    let stored_tokens = match (schedule, axis) {
        (Schedule::Streaming, GroupAxis::Token) => {
            sinks + (tokens - sinks) / codec::GROUP * codec::GROUP
        }
        _ => tokens,
    };
    let mut stored = Stored::default();
    let mut whole = Vec::new();
    for head in 0..heads {
        if sinks < tokens {
            let part = raw.slice(ndarray::s![head, sinks.., ..]);
            let packed =
                kvcodec::encode(part, layout).map_err(|e| SchemeError::Codec(e.to_string()))?;
            decoded
                .slice_mut(ndarray::s![head, sinks.., ..])
                .assign(&kvcodec::decode(&packed));
        }
        if sinks < stored_tokens {
            let part = raw.slice(ndarray::s![head, sinks..stored_tokens, ..]);
            let packed =
                kvcodec::encode(part, layout).map_err(|e| SchemeError::Codec(e.to_string()))?;
            let parts = packed.payload_bytes();
            let metadata = parts - packed.code_bytes().len();
            stored.codes += packed.code_bytes().len();
            stored.metadata += metadata;
            if schedule == Schedule::Prefill && sinks == 0 {
                whole.push(packed);
            }
        }
        stored.full_precision += (tokens - stored_tokens + sinks) * head_dim * 4;
    }
    let side = Side {
        raw,
        decoded,
        later: Vec::new(),
        sinks,
        stored,
    };
    Ok((side, whole))
}

/// quanto's side: every token-head vector of `head_dim` in groups of 64, quantized once
/// (prefill) or, while decoding, with each token's later versions (one per flush since its
/// first, until re-quantization no longer changes it).
fn quanto_side(raw: Array3<f32>, schedule: Schedule, bits: u32) -> Side {
    let (heads, tokens, head_dim) = raw.dim();
    let mut decoded = raw.clone();
    let mut later = Vec::new();
    let round_trip = |row: &[f32]| -> Vec<f32> {
        row.chunks_exact(quanto::GROUP)
            .flat_map(|g| quanto::Group::quantize(g, bits).dequantize())
            .collect()
    };
    let (end, last_flush) = match schedule {
        Schedule::Prefill => (tokens, 0),
        Schedule::Streaming => (
            quanto::quantized_prefix(tokens),
            quanto::flushes_before(tokens),
        ),
    };
    for head in 0..heads {
        for token in 0..tokens {
            let mut versions = Vec::new();
            if token < end {
                let first = round_trip(&raw.slice(ndarray::s![head, token, ..]).to_vec());
                let needed = last_flush.saturating_sub(quanto::first_flush(token));
                let mut current = first.clone();
                for _ in 0..needed {
                    let next = round_trip(&current);
                    if next == current {
                        break;
                    }
                    versions.push(next.clone());
                    current = next;
                }
                decoded
                    .slice_mut(ndarray::s![head, token, ..])
                    .assign(&ndarray::ArrayView1::from(&first));
            }
            later.push(versions);
        }
    }
    let groups = heads * end * head_dim / quanto::GROUP;
    Side {
        raw,
        decoded,
        later: if schedule == Schedule::Streaming {
            later
        } else {
            Vec::new()
        },
        sinks: 0,
        stored: Stored {
            codes: quanto::packed_code_bytes(groups, bits),
            // An f32 scale and an f32 shift per group (the model's dtype).
            metadata: groups * 8,
            full_precision: heads * (tokens - end) * head_dim * 4,
            outliers: 0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheme::Width;

    fn kv(tokens: usize, head_dim: usize) -> Array3<f32> {
        Array3::from_shape_fn((2, tokens, head_dim), |(h, t, d)| {
            ((h * 131 + t * 17 + d * 7) % 23) as f32 / 5.0 - 2.0
        })
    }

    fn row(x: &Array3<f32>, head: usize, token: usize) -> Vec<f32> {
        x.slice(ndarray::s![head, token, ..]).to_vec()
    }

    #[test]
    fn kivi_bills_codes_scales_and_its_f32_residual() {
        let (k, v) = (kv(300, 64), kv(300, 64));
        let scheme = Scheme::Kivi(Width::Four);
        let prefill = LayerCache::new(scheme, Schedule::Prefill, (0, 1), &k, &v).unwrap();
        let streaming = LayerCache::new(scheme, Schedule::Streaming, (0, 1), &k, &v).unwrap();
        // K: 256 tokens quantized, 44 in the residual; V: 172 quantized, 128 in the residual.
        let groups = 2 * 64 * 256 / 32 + 2 * 172 * 64 / 32;
        for cache in [&prefill, &streaming] {
            let stored = cache.stored();
            assert_eq!(stored.codes, groups * 16);
            assert_eq!(stored.metadata, groups * 4);
            assert_eq!(stored.full_precision, 2 * (44 + 128) * 64 * 4);
        }
        // Prefill: every query reads the end state; streaming query 130 reads K 128, V 2.
        assert_eq!(prefill.quantized(5), (256, 172));
        assert_eq!(streaming.quantized(130), (128, 2));
        assert_eq!(streaming.key(1, 130, 129), row(&k, 1, 129));
        assert_ne!(streaming.key(1, 130, 127), streaming.key(1, 100, 127));
        assert_eq!(streaming.key(1, 130, 127), prefill.key(1, 0, 127));
    }

    #[test]
    fn quanto_quantizes_the_prefill_at_once_and_re_quantizes_at_every_flush() {
        let (k, v) = (kv(300, 64), kv(300, 64));
        let scheme = Scheme::Quanto(Width::Two);
        let prefill = LayerCache::new(scheme, Schedule::Prefill, (0, 1), &k, &v).unwrap();
        // Every token quantized: for K and for V, 2 heads x 300 groups of 64 in one packed
        // tensor, 4 codes a byte, an f32 scale and shift per group.
        let groups = 2 * 300usize;
        assert_eq!(
            prefill.stored(),
            Stored {
                codes: 2 * groups.div_ceil(4) * 64,
                metadata: 2 * groups * 8,
                full_precision: 0,
                outliers: 0,
            }
        );
        let streaming = LayerCache::new(scheme, Schedule::Streaming, (0, 1), &k, &v).unwrap();
        // After 300 tokens: flushes after steps 128 and 256, so 257 quantized and 43 in the
        // residual.
        assert_eq!(streaming.quantized(299), (257, 257));
        assert_eq!(streaming.stored().full_precision, 2 * 2 * 43 * 64 * 4);
        assert_eq!(streaming.quantized(0), (0, 0));
        assert_eq!(streaming.key(0, 0, 0), row(&k, 0, 0));
        // Token 5 is first quantized at the flush after step 128, read by query 129 as its
        // first version, which the prefill's quantization also gives.
        assert_eq!(streaming.key(0, 129, 5), prefill.key(0, 0, 5));
        assert_eq!(streaming.key(0, 128, 5), row(&k, 0, 5));
        // Query 257 reads it re-quantized once more: quantize(dequantize(first version)).
        let first = prefill.key(0, 0, 5).to_vec();
        let again: Vec<f32> = quanto::Group::quantize(&first, 2).dequantize();
        assert_eq!(streaming.key(0, 257, 5), again.as_slice());
    }

    #[test]
    fn llamacpp_stores_blocks_for_every_token_and_schedule() {
        let (k, v) = (kv(40, 64), kv(40, 64));
        for ty in CacheType::ALL {
            for rotate in [false, true] {
                let scheme = Scheme::LlamaCpp { ty, rotate };
                let prefill = LayerCache::new(scheme, Schedule::Prefill, (0, 1), &k, &v).unwrap();
                let streaming =
                    LayerCache::new(scheme, Schedule::Streaming, (0, 1), &k, &v).unwrap();
                let bytes = 2 * 2 * 40 * 2 * ty.block_bytes();
                assert_eq!(prefill.stored().total(), bytes, "{ty}");
                assert_eq!(streaming.stored().total(), bytes, "{ty}");
                for (i, j) in [(0, 0), (39, 3), (20, 20)] {
                    assert_eq!(prefill.key(1, i, j), streaming.key(1, i, j));
                }
            }
        }
    }

    #[test]
    fn kvquant_quantizes_keys_before_rope_and_bills_codes_outliers_ranges_and_calibration() {
        let (k, v) = (kv(40, 64), kv(40, 64).mapv(|x| x * 0.5 - 0.25));
        let scheme = KvQuantScheme::parse("kvquant3-first1").unwrap();
        let calibration = Calibration::fit(3, 1, &[(k.clone(), v.clone())]).unwrap();
        // A stand-in RoPE: negate every key read back.
        let negate = |x: &mut Array3<f32>| -> Result<(), String> {
            x.mapv_inplace(|y| -y);
            Ok(())
        };
        let build = |schedule| {
            LayerCache::kvquant(scheme, &calibration, schedule, (0, 1), (&k, &v), negate).unwrap()
        };
        let (prefill, streaming) = (build(Schedule::Prefill), build(Schedule::Streaming));
        assert_eq!(prefill.stored(), streaming.stored());
        assert_eq!(prefill.quantized(3), (40, 40));
        // Token 0 is kept in fp16, then rotated.
        let fp16 = |x: &f32| f16::from_f32(*x).to_f32();
        let negated: Vec<f32> = row(&k, 1, 0).iter().map(|x| -fp16(x)).collect();
        assert_eq!(prefill.key(1, 5, 0), negated.as_slice());
        let rounded: Vec<f32> = row(&v, 0, 0).iter().map(fp16).collect();
        assert_eq!(prefill.value(0, 5, 0), rounded.as_slice());
        let rows = kvquant::rows(k.view());
        let fitted = &calibration.layers[0];
        let q = kvquant::quantize_key_row(fitted, &rows[7]);
        let negated: Vec<f32> = q.decoded[64..].iter().map(|x| -x).collect();
        assert_eq!(prefill.key(1, 9, 7), negated.as_slice());
        // Bytes: 39 quantized rows of 128 values per side at 3 bits, their outliers (4 bytes
        // each, 2 per row for the count), 8 bytes of range per value row, the first token's 128
        // values per side in fp16, and the layer's calibration.
        let stored = prefill.stored();
        assert_eq!(stored.codes, 2 * 39 * 128 * 3 / 8);
        assert_eq!(stored.full_precision, 2 * 128 * 2);
        let outliers: usize = (1..40)
            .map(|t| {
                let vt = kvquant::rows(v.view());
                kvquant::quantize_key_row(fitted, &rows[t]).outliers.len()
                    + kvquant::quantize_value_row(fitted, &vt[t]).outliers.len()
            })
            .sum();
        assert_eq!(stored.outliers, outliers * 4 + 2 * 39 * 2);
        assert_eq!(prefill.outliers(), outliers);
        assert_eq!(stored.metadata, 39 * 8 + calibration.layer_bytes(128));
        // Without a calibration, or with another scheme's, it is refused.
        assert!(matches!(
            LayerCache::new(Scheme::KvQuant(scheme), Schedule::Prefill, (0, 1), &k, &v),
            Err(SchemeError::NeedsCalibration { .. })
        ));
        let other = KvQuantScheme::parse("kvquant4-first1").unwrap();
        let err = LayerCache::kvquant(
            other,
            &calibration,
            Schedule::Prefill,
            (0, 1),
            (&k, &v),
            negate,
        )
        .unwrap_err();
        assert!(err.to_string().contains("fitted at 3 bits"), "{err}");
        let err = LayerCache::kvquant(
            scheme,
            &calibration,
            Schedule::Prefill,
            (0, 1),
            (&k, &v),
            |_| Err("wrong shape"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("wrong shape"), "{err}");
    }

    #[test]
    fn shapes_head_sizes_and_non_finite_values_are_refused() {
        let scheme = Scheme::LlamaCpp {
            ty: CacheType::Q4_0,
            rotate: true,
        };
        let new = |k: &Array3<f32>, v: &Array3<f32>| {
            LayerCache::new(scheme, Schedule::Prefill, (0, 1), k, v)
        };
        assert!(matches!(
            new(&kv(4, 32), &kv(4, 32)),
            Err(SchemeError::HeadDim { multiple: 64, .. })
        ));
        assert!(matches!(
            new(&kv(4, 64), &kv(5, 64)),
            Err(SchemeError::Shapes { .. })
        ));
        let mut bad = kv(4, 64);
        bad[[1, 2, 3]] = f32::NAN;
        let err = new(&kv(4, 64), &bad).unwrap_err().to_string();
        assert!(err.contains("V of head 1, token 2"), "{err}");
        assert!(matches!(
            LayerCache::new(scheme, Schedule::Prefill, (3, 3), &kv(4, 64), &kv(4, 64)),
            Err(SchemeError::Layer {
                layer: 3,
                layers: 3
            })
        ));
    }

    /// Finite values whose metadata overflows the scheme's (fp16 scales for KIVI and
    /// llama.cpp, f32 for quanto) are refused, never read back as infinities or NaN.
    #[test]
    fn values_beyond_the_metadatas_range_are_refused() {
        let cases: [(Scheme, f32); 4] = [
            (
                Scheme::LlamaCpp {
                    ty: CacheType::Q4_0,
                    rotate: false,
                },
                1e6,
            ),
            (
                Scheme::LlamaCpp {
                    ty: CacheType::Q8_0,
                    rotate: false,
                },
                1e7,
            ),
            (Scheme::Kivi(Width::Four), 5e4),
            (Scheme::Quanto(Width::Two), 2e38),
        ];
        for (scheme, size) in cases {
            let mut v = kv(200, 64);
            v[[1, 2, 3]] = size;
            v[[1, 2, 4]] = -size;
            let err =
                LayerCache::new(scheme, Schedule::Prefill, (0, 1), &kv(200, 64), &v).unwrap_err();
            assert!(
                matches!(
                    err,
                    SchemeError::Unrepresentable {
                        side: "V",
                        head: 1,
                        ..
                    }
                ),
                "{scheme}: {err}"
            );
            // A tenth of the size fits.
            v[[1, 2, 3]] = size / 10.0;
            v[[1, 2, 4]] = -size / 10.0;
            assert!(LayerCache::new(scheme, Schedule::Prefill, (0, 1), &kv(200, 64), &v).is_ok());
        }
    }
}
