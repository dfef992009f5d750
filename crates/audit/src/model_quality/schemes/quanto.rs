//! The Hugging Face `QuantizedCache` with its quanto backend (`hf-quanto2`, `hf-quanto4`) as the
//! audit reads it: 2- or 4-bit affine codes per token in groups of 64 along head_dim, f32 scale
//! and shift, the prefill quantized at once and, while decoding, a residual of up to R - 1 = 127
//! tokens after which the whole cache is quantized again.
//!
//! Spec, from transformers 5.23.0 `cache_utils.py` and optimum-quanto @e33f8202
//! (docs/schemes-sources.md 3.1-3.3), at the defaults (`q_group_size` 64, `residual_length` 128,
//! `axis_key` = `axis_value` = 0):
//! - Groups, `optimum/quanto/tensor/grouped.py` l.17-36: 64 consecutive elements of the
//!   [batch, heads, tokens, head_dim] tensor: with head_dim a multiple of 64, runs of 64 within one
//!   token's row of one head (other head sizes would group across tokens and are refused).
//! - A group, `tensor/optimizers/max_optimizer.py` l.26-37 and `library/quantize.py` l.64-78, in
//!   f32 (the model's dtype): min and max of the group, scale = (max - min) / (2^b - 1), shift =
//!   -min, code = clamp(round_half_even((x + shift) / scale), 0, 2^b - 1) (round, then clamp); a
//!   constant group (scale 0) divides 0 by 0 in quanto, every code reads back as min, and the
//!   audit (as kvschemes) takes code 0. Reading, `tensor/qbits.py` l.42-45: scale * q - shift.
//! - The cache, `QuantizedLayer.update` l.781-822: the first call (token 0, the prefill of a
//!   decoding run) quantizes its tokens and attends in full precision; each later token joins a
//!   full-precision residual and its step attends to the dequantized cache, the residual and
//!   itself; a step whose residual already holds R - 1 tokens then quantizes everything (the
//!   dequantized cache, the residual and the token) as one tensor and empties the residual. So
//!   flush f >= 1 ends step 128 f and quantizes tokens 0..=128 f, flush 0 is token 0's.
//! - Schedules: `prefill` quantizes all T tokens at once and every query reads that. `streaming`
//!   (decoding from token 0): query 0 reads nothing quantized; query i >= 1 has seen flushes
//!   0..=L, L = floor((i - 1) / 128), so it reads tokens 0..=128 L quantized. Token j is first
//!   quantized by flush ceil(j / 128) and every later flush quantizes its read-back again, so query
//!   i reads version L - ceil(j / 128) of it: version 0 is the round trip of its row, version
//!   m + 1 the round trip of version m.
//! - Bytes at the end of the text: the quantized tokens Q (prefill: T; streaming: the state after
//!   the last step, 1 + 128 floor((T - 1) / 128), or 0 for T = 0) hold G = heads * Q * head_dim /
//!   64 groups, stored as one packed tensor of ceil(G / (8 / b)) * 64 code bytes
//!   (`tensor/packed.py` l.24-69: 8 / b codes to a byte, planar) and an f32 scale and shift per
//!   group; the residual, 4 bytes per value.

use models::llama::KvSource;

use super::{ReadSchedule, Rows};

/// Values per group.
pub const GROUP: usize = 64;
/// The residual length R.
pub const RESIDUAL: usize = 128;

/// quanto's round trip of one group of finite values at `bits` (module docs).
pub fn round_trip_group(x: &[f32], bits: u32) -> Vec<f32> {
    let min = x.iter().copied().fold(f32::INFINITY, f32::min);
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let top = ((1u32 << bits) - 1) as f32;
    let scale = (max - min) / top;
    let shift = -min;
    x.iter()
        .map(|&v| {
            let code = if scale == 0.0 {
                0
            } else {
                ((v + shift) / scale).round_ties_even().clamp(0.0, top) as u8
            };
            scale * f32::from(code) - shift
        })
        .collect()
}

/// A token's row (a multiple of 64 values) quantized group by group and read back.
pub fn round_trip_row(row: &[f32], bits: u32) -> Vec<f32> {
    row.chunks_exact(GROUP)
        .flat_map(|group| round_trip_group(group, bits))
        .collect()
}

/// The last flush query `query` has seen, if any (module docs).
fn last_flush_seen(query: usize) -> Option<usize> {
    query.checked_sub(1).map(|i| i / RESIDUAL)
}

/// The flush that first quantizes token `token`: ceil(token / 128).
fn first_flush(token: usize) -> usize {
    token.div_ceil(RESIDUAL)
}

/// Tokens quantized once flushes 0..=`last` are done: 0..=128 last.
fn quantized_through(last: usize) -> usize {
    RESIDUAL * last + 1
}

/// Tokens the cache holds quantized after `tokens` tokens of decoding: steps 0..tokens have
/// run, and flush f ends step 128 f.
pub fn quantized_after_decoding(tokens: usize) -> usize {
    tokens
        .checked_sub(1)
        .map_or(0, |last_step| quantized_through(last_step / RESIDUAL))
}

/// One side: each (head, token)'s versions, [head * tokens + token]; empty for a token no query
/// reads quantized. A version equal (bit for bit) to the one before is not kept: reading past the
/// last kept version reads the last.
struct Side {
    raw: Rows,
    versions: Vec<Vec<Vec<f32>>>,
}

impl Side {
    fn new(x: &Rows, bits: u32, schedule: ReadSchedule) -> Side {
        let tokens = x.tokens;
        let mut versions = Vec::with_capacity(x.heads * tokens);
        for head in 0..x.heads {
            for token in 0..tokens {
                // How many versions the last query reads at most.
                let count = match schedule {
                    ReadSchedule::Prefill => 1,
                    ReadSchedule::Streaming => {
                        match tokens.checked_sub(1).and_then(last_flush_seen) {
                            Some(last) if first_flush(token) <= last => {
                                last - first_flush(token) + 1
                            }
                            _ => 0,
                        }
                    }
                };
                let mut kept: Vec<Vec<f32>> = Vec::new();
                for _ in 0..count {
                    let next = match kept.last() {
                        None => round_trip_row(x.row(head, token), bits),
                        Some(previous) => round_trip_row(previous, bits),
                    };
                    let same = kept.last().is_some_and(|previous| {
                        previous
                            .iter()
                            .map(|v| v.to_bits())
                            .eq(next.iter().map(|v| v.to_bits()))
                    });
                    if same {
                        break;
                    }
                    kept.push(next);
                }
                versions.push(kept);
            }
        }
        Side {
            raw: x.clone(),
            versions,
        }
    }

    fn version(&self, head: usize, position: usize, version: usize) -> &[f32] {
        let kept = self
            .versions
            .get(head * self.raw.tokens + position)
            .map_or(&[][..], Vec::as_slice);
        kept.get(version)
            .or(kept.last())
            .map_or(&[][..], Vec::as_slice)
    }
}

/// One layer's quanto cache: what each query reads (module docs).
pub(super) struct QuantoLayer {
    schedule: ReadSchedule,
    k: Side,
    v: Side,
}

impl QuantoLayer {
    /// The cache of one layer's K (after RoPE) and V at `bits`; the head size must be a multiple
    /// of 64 (checked by the caller).
    pub(super) fn new(bits: u32, schedule: ReadSchedule, k: &Rows, v: &Rows) -> QuantoLayer {
        QuantoLayer {
            schedule,
            k: Side::new(k, bits, schedule),
            v: Side::new(v, bits, schedule),
        }
    }

    fn read<'a>(&self, side: &'a Side, head: usize, query: usize, position: usize) -> &'a [f32] {
        match self.schedule {
            ReadSchedule::Prefill => side.version(head, position, 0),
            ReadSchedule::Streaming => match last_flush_seen(query) {
                Some(last) if position < quantized_through(last) => {
                    side.version(head, position, last - first_flush(position))
                }
                _ => side.raw.row(head, position),
            },
        }
    }
}

impl KvSource for QuantoLayer {
    fn key(&self, head: usize, query: usize, position: usize) -> &[f32] {
        self.read(&self.k, head, query, position)
    }
    fn value(&self, head: usize, query: usize, position: usize) -> &[f32] {
        self.read(&self.v, head, query, position)
    }
}

/// Bytes the cache stores after `tokens` tokens (module docs; `None` on overflow).
pub fn stored_bytes(
    bits: u32,
    schedule: ReadSchedule,
    heads: usize,
    head_dim: usize,
    tokens: usize,
) -> Option<usize> {
    let quantized = match schedule {
        ReadSchedule::Prefill => tokens,
        ReadSchedule::Streaming => quantized_after_decoding(tokens),
    };
    let groups = heads
        .checked_mul(quantized)?
        .checked_mul(head_dim / GROUP)?;
    let per_byte = (8 / bits) as usize;
    let codes = groups.div_ceil(per_byte).checked_mul(GROUP)?;
    let metadata = groups.checked_mul(4 + 4)?;
    let residual = heads
        .checked_mul(tokens - quantized)?
        .checked_mul(head_dim)?
        .checked_mul(4)?;
    // K and V alike.
    codes
        .checked_add(metadata)?
        .checked_add(residual)?
        .checked_mul(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushes_every_128_steps_after_the_first_token() {
        // Query i reads tokens 0..quantized_through(last flush seen).
        assert_eq!(last_flush_seen(0), None);
        assert_eq!(last_flush_seen(1).map(quantized_through), Some(1));
        assert_eq!(last_flush_seen(128).map(quantized_through), Some(1));
        assert_eq!(last_flush_seen(129).map(quantized_through), Some(129));
        assert_eq!(last_flush_seen(257).map(quantized_through), Some(257));
        assert_eq!(
            (
                first_flush(0),
                first_flush(1),
                first_flush(128),
                first_flush(129)
            ),
            (0, 1, 1, 2)
        );
        assert_eq!(
            (quantized_after_decoding(0), quantized_after_decoding(1)),
            (0, 1)
        );
        assert_eq!(
            (quantized_after_decoding(129), quantized_after_decoding(300)),
            (129, 257)
        );
    }

    #[test]
    fn a_group_reads_back_by_the_affine_rule() {
        // -3, -2.5, ..., 28.5 at 4 bits: scale 31.5 / 15 = 2.1, shift 3.
        let x: Vec<f32> = (0..64).map(|i| i as f32 * 0.5 - 3.0).collect();
        let read = round_trip_group(&x, 4);
        let scale = 31.5f32 / 15.0;
        assert_eq!(read[0], -3.0);
        assert_eq!(read[63], scale * 15.0 - 3.0);
        assert_eq!(round_trip_group(&[0.75; 64], 2), vec![0.75; 64]);
    }

    #[test]
    fn stored_bytes_by_hand() {
        // 2 heads, head_dim 64, 300 tokens, 2 bits. Prefill: 600 groups per side, 4 codes a
        // byte: ceil(600 / 4) x 64 = 9,600 code bytes, and 600 x 8 = 4,800 bytes of scales and
        // shifts; K and V: 2 x 14,400.
        assert_eq!(
            stored_bytes(2, ReadSchedule::Prefill, 2, 64, 300),
            Some(28_800)
        );
        // Streaming: 257 quantized (514 groups: ceil(514 / 4) x 64 = 8,256 + 4,112) and 43 in
        // the residual (2 x 43 x 64 x 4 = 22,016), per side.
        assert_eq!(
            stored_bytes(2, ReadSchedule::Streaming, 2, 64, 300),
            Some(2 * (8_256 + 4_112 + 22_016))
        );
    }
}
