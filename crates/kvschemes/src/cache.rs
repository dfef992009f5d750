//! One layer's K and V cache under a [`Scheme`]: what attention reads for each query and
//! position, and the bytes the cache stores.
//!
//! K and V are [kv_heads, tokens, head_dim] (K after RoPE). Each scheme stores, after n tokens, a
//! quantized prefix of each and keeps the rest in full precision (f32 here):
//!
//! | scheme | K quantized after n tokens | V quantized after n tokens |
//! |---|---|---|
//! | `kivi*` | floor(n / 128) * 128 | max(0, n - 128) |
//! | `llamacpp-*` | n | n |
//!
//! Schedules (query position i reads positions j <= i):
//! - [`Schedule::Prefill`]: every query reads the cache the whole text leaves (n = tokens), as
//!   a prompt's cache is built once: the scores of the quantized part, the rest f32;
//! - [`Schedule::Streaming`]: query i reads the cache as token-by-token decoding leaves it when
//!   token i arrives: its own state after the i tokens before it, plus token i as the scheme
//!   holds a new token (KIVI: in the residual, full precision; llama.cpp: quantized on arrival).
//!
//! A quantized position reads the same values whichever state it is read in (a KIVI key group
//! always lies inside a quantized prefix of whole residuals, R being a multiple of G; llama.cpp
//! blocks are per token), so each side is quantized once, over its largest prefix.
//!
//! Bytes ([`Stored`]) are those of the end state (n = tokens), counted from what is stored:
//! llama.cpp's block bytes; KIVI's packed u32 code words, fp16 scales and minimums; 4 bytes per
//! full-precision value.

use half::f16;
use ndarray::{Array3, Axis};

use crate::hadamard::{self, Hadamard};
use crate::kivi::{self, Group};
use crate::llamacpp::CacheType;
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
    /// Full-precision values (4 bytes each).
    pub full_precision: usize,
}

impl Stored {
    /// Everything.
    pub fn total(&self) -> usize {
        self.codes + self.metadata + self.full_precision
    }

    fn add(&mut self, other: Stored) {
        self.codes += other.codes;
        self.metadata += other.metadata;
        self.full_precision += other.full_precision;
    }
}

/// One side (K or V) of a layer's cache.
#[derive(Debug, Clone)]
struct Side {
    raw: Array3<f32>,
    /// The decoded values of the quantized prefix (original basis); f32 values past it.
    decoded: Array3<f32>,
    stored: Stored,
}

impl Side {
    fn row(&self, quantized: usize, head: usize, position: usize) -> &[f32] {
        let source = if position < quantized {
            &self.decoded
        } else {
            &self.raw
        };
        row_of(source, head, position)
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
    tokens: usize,
    k: Side,
    v: Side,
}

impl LayerCache {
    /// Holds one layer's K (after RoPE) and V, [kv_heads, tokens, head_dim], under `scheme`.
    pub fn new(
        scheme: Scheme,
        k: &Array3<f32>,
        v: &Array3<f32>,
    ) -> Result<LayerCache, SchemeError> {
        let (kd, vd) = (k.dim(), v.dim());
        if kd != vd {
            return Err(SchemeError::Shapes {
                k: [kd.0, kd.1, kd.2],
                v: [vd.0, vd.1, vd.2],
            });
        }
        let (_, tokens, head_dim) = kd;
        check_head_dim(scheme, head_dim)?;
        check_finite("K", k)?;
        check_finite("V", v)?;
        let k = k.as_standard_layout().into_owned();
        let v = v.as_standard_layout().into_owned();
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
        Ok(LayerCache {
            scheme,
            tokens,
            k,
            v,
        })
    }

    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// Positions of K and V quantized when query `query` reads the cache under `schedule`.
    pub fn quantized(&self, schedule: Schedule, query: usize) -> (usize, usize) {
        let state = match schedule {
            Schedule::Prefill => self.tokens,
            Schedule::Streaming => query,
        };
        match self.scheme {
            Scheme::Kivi(_) => (kivi::quantized_keys(state), kivi::quantized_values(state)),
            // Every token is quantized on arrival, the query's own included.
            Scheme::LlamaCpp { .. } => (self.tokens, self.tokens),
        }
    }

    /// The key row query `query` reads at `position`, under `schedule`.
    pub fn key(&self, schedule: Schedule, head: usize, query: usize, position: usize) -> &[f32] {
        self.k
            .row(self.quantized(schedule, query).0, head, position)
    }

    /// The value row query `query` reads at `position`, under `schedule`.
    pub fn value(&self, schedule: Schedule, head: usize, query: usize, position: usize) -> &[f32] {
        self.v
            .row(self.quantized(schedule, query).1, head, position)
    }

    /// K and V, [kv_heads, tokens, head_dim], as query `query` reads them under `schedule`
    /// (every position, including those after the query, in the state that query sees).
    pub fn read(&self, schedule: Schedule, query: usize) -> (Array3<f32>, Array3<f32>) {
        let (k_quantized, v_quantized) = self.quantized(schedule, query);
        let state = |side: &Side, quantized: usize| {
            let mut out = side.raw.clone();
            let q = quantized.min(self.tokens);
            out.slice_mut(ndarray::s![.., ..q, ..])
                .assign(&side.decoded.slice(ndarray::s![.., ..q, ..]));
            out
        };
        (state(&self.k, k_quantized), state(&self.v, v_quantized))
    }

    /// Bytes stored at the end of the text (module docs), K and V together.
    pub fn stored(&self) -> Stored {
        let mut stored = self.k.stored;
        stored.add(self.v.stored);
        stored
    }
}

fn check_head_dim(scheme: Scheme, head_dim: usize) -> Result<(), SchemeError> {
    let multiple = match scheme {
        Scheme::LlamaCpp { rotate: true, .. } => 64,
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
        stored: Stored {
            // A block is its f16 scale (and q4_1's f16 minimum) and its codes.
            codes: blocks.len() / ty.block_bytes() * (ty.block_bytes() - metadata_bytes(ty)),
            metadata: blocks.len() / ty.block_bytes() * metadata_bytes(ty),
            full_precision: 0,
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
        stored: Stored {
            codes: words.len() * 4,
            metadata: (scales.len() + mins.len()) * 2,
            full_precision: residual * 4,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(tokens: usize, head_dim: usize) -> Array3<f32> {
        Array3::from_shape_fn((2, tokens, head_dim), |(h, t, d)| {
            ((h * 131 + t * 17 + d * 7) % 23) as f32 / 5.0 - 2.0
        })
    }

    #[test]
    fn kivi_bills_codes_scales_and_its_f32_residual() {
        let (k, v) = (kv(300, 64), kv(300, 64));
        let cache = LayerCache::new(Scheme::Kivi(crate::scheme::KiviBits::Four), &k, &v).unwrap();
        // K: 256 tokens quantized, 44 in the residual; V: 172 quantized, 128 in the residual.
        let groups = 2 * 64 * 256 / 32 + 2 * 172 * 64 / 32;
        let stored = cache.stored();
        assert_eq!(stored.codes, groups * 16);
        assert_eq!(stored.metadata, groups * 4);
        assert_eq!(stored.full_precision, 2 * (44 + 128) * 64 * 4);
        // Prefill: every query reads the end state; streaming query 130 reads K 128, V 2.
        assert_eq!(cache.quantized(Schedule::Prefill, 5), (256, 172));
        assert_eq!(cache.quantized(Schedule::Streaming, 130), (128, 2));
        assert_eq!(
            cache.key(Schedule::Streaming, 1, 130, 129),
            &k.as_slice().unwrap()[(300 + 129) * 64..(300 + 130) * 64]
        );
        assert_ne!(
            cache.key(Schedule::Streaming, 1, 130, 127),
            cache.key(Schedule::Streaming, 1, 100, 127)
        );
    }

    #[test]
    fn llamacpp_stores_blocks_for_every_token_and_schedule() {
        let (k, v) = (kv(40, 64), kv(40, 64));
        for ty in CacheType::ALL {
            for rotate in [false, true] {
                let cache = LayerCache::new(Scheme::LlamaCpp { ty, rotate }, &k, &v).unwrap();
                assert_eq!(
                    cache.stored().total(),
                    2 * 2 * 40 * 2 * ty.block_bytes(),
                    "{ty}"
                );
                for (i, j) in [(0, 0), (39, 3), (20, 20)] {
                    assert_eq!(
                        cache.key(Schedule::Prefill, 1, i, j),
                        cache.key(Schedule::Streaming, 1, i, j)
                    );
                }
            }
        }
    }

    #[test]
    fn shapes_head_sizes_and_non_finite_values_are_refused() {
        let scheme = Scheme::LlamaCpp {
            ty: CacheType::Q4_0,
            rotate: true,
        };
        assert!(matches!(
            LayerCache::new(scheme, &kv(4, 32), &kv(4, 32)),
            Err(SchemeError::HeadDim { multiple: 64, .. })
        ));
        assert!(matches!(
            LayerCache::new(scheme, &kv(4, 64), &kv(5, 64)),
            Err(SchemeError::Shapes { .. })
        ));
        let mut bad = kv(4, 64);
        bad[[1, 2, 3]] = f32::NAN;
        let err = LayerCache::new(scheme, &kv(4, 64), &bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("V of head 1, token 2"), "{err}");
    }
}
