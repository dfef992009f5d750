//! KIVI (`kivi2`, `kivi4`) as the audit reads it: asymmetric 2- or 4-bit codes, keys per channel
//! and values per token, in groups of 32, with a full-precision residual of the newest tokens.
//!
//! Spec, from github jy-yuan/KIVI @876b4d2d (docs/schemes-sources.md 1.1-1.5):
//! - A group of G = 32 values, `quant/new_pack.py` `triton_quantize_and_pack_along_last_dim`
//!   l.217-252, run in fp16 as KIVI's fp16 model runs it: each value rounded to f16, then mn and
//!   mx its minimum and maximum, scale = f16(f16(mx - mn) / (2^b - 1)) (l.238), and each code
//!   q = round_half_even(clamp(f16(f16(x - mn) / scale), 0, 2^b - 1)) (l.239-241): one f16
//!   operation is the f32 operation rounded to f16. A constant group (scale 0) divides 0 by 0 in
//!   KIVI; every code reads back as mn there, and the audit (as kvschemes) takes code 0.
//! - Reading, the CUDA kernel `quant/csrc/gemv_cuda.cu` l.323-329: q * scale + mn, one f32
//!   product and one f32 sum, from the f16 scale and mn.
//! - Keys are grouped along tokens (32 consecutive tokens of one channel, groups from token 0),
//!   values along channels (32 consecutive channels of one token).
//! - The residual, `models/llama_kivi.py` l.264-466 with R = 128 (`docs/long_bench.md` l.7, l.30):
//!   after n tokens the first floor(n / R) * R keys are quantized (keys leave the residual R at a
//!   time, l.343-352: four whole groups per channel) and the first max(0, n - R) values (values
//!   leave it one token at a time, l.386-391); the rest are full precision (f32 here: the model
//!   runs in f32).
//! - Schedules: `prefill` reads the state after all T tokens at every query; `streaming` reads, at
//!   query i, the state after the i tokens before it, with token i in the residual (a decoding step
//!   appends its token before attention, l.333-337 and l.377). A quantized position reads the same
//!   values in every state, so each side is quantized once, over its end state's prefix.
//! - Bytes at the end of the text (the same for both schedules): per quantized group, b 32-bit
//!   words of packed codes (32 codes of b bits, l.133-154) = 4b bytes, and an f16 scale and an f16
//!   mn = 4 bytes; per residual value, 4 bytes.

use half::f16;
use models::llama::KvSource;

use super::{ReadSchedule, Rows};

/// Values per group.
pub const GROUP: usize = 32;
/// The residual length R.
pub const RESIDUAL: usize = 128;

/// Keys quantized after `n` tokens: whole residuals.
pub fn keys_quantized(n: usize) -> usize {
    n / RESIDUAL * RESIDUAL
}

/// Values quantized after `n` tokens: all but the newest R.
pub fn values_quantized(n: usize) -> usize {
    n.saturating_sub(RESIDUAL)
}

/// One fp16 operation: its f32 result rounded to f16 (round to nearest, ties to even).
fn fp16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// KIVI's quantizer on one group of 32 values at `bits`, read back (module docs).
pub fn round_trip(x: &[f32; GROUP], bits: u32) -> [f32; GROUP] {
    let x = x.map(fp16);
    let mn = x.iter().copied().fold(f32::INFINITY, f32::min);
    let mx = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let top = ((1u32 << bits) - 1) as f32;
    let scale = fp16(fp16(mx - mn) / top);
    x.map(|v| {
        let code = if scale == 0.0 {
            0
        } else {
            fp16(fp16(v - mn) / scale).clamp(0.0, top).round_ties_even() as u8
        };
        f32::from(code) * scale + mn
    })
}

/// `x` with positions `0..keys` quantized per channel in groups of 32 tokens.
fn keys(x: &Rows, quantized: usize, bits: u32) -> Rows {
    let mut read = x.clone();
    for head in 0..x.heads {
        for channel in 0..x.dim {
            for start in (0..quantized).step_by(GROUP) {
                let group: [f32; GROUP] = std::array::from_fn(|t| x.row(head, start + t)[channel]);
                for (t, value) in round_trip(&group, bits).into_iter().enumerate() {
                    read.row_mut(head, start + t)[channel] = value;
                }
            }
        }
    }
    read
}

/// `x` with positions `0..quantized` quantized per token in groups of 32 channels.
fn values(x: &Rows, quantized: usize, bits: u32) -> Rows {
    let mut read = x.clone();
    for head in 0..x.heads {
        for token in 0..quantized {
            let row = read.row_mut(head, token);
            for group in row.chunks_exact_mut(GROUP) {
                let values: &[f32; GROUP] = (&*group).try_into().expect("chunks of 32");
                let decoded = round_trip(values, bits);
                group.copy_from_slice(&decoded);
            }
        }
    }
    read
}

/// One layer's KIVI cache: what each query reads (module docs).
pub(super) struct KiviLayer {
    schedule: ReadSchedule,
    tokens: usize,
    raw_k: Rows,
    raw_v: Rows,
    k: Rows,
    v: Rows,
}

impl KiviLayer {
    /// The cache of one layer's K (after RoPE) and V at `bits`; the head size must be a
    /// multiple of 32 (checked by the caller).
    pub(super) fn new(bits: u32, schedule: ReadSchedule, k: &Rows, v: &Rows) -> KiviLayer {
        let tokens = k.tokens;
        KiviLayer {
            schedule,
            tokens,
            raw_k: k.clone(),
            raw_v: v.clone(),
            k: keys(k, keys_quantized(tokens), bits),
            v: values(v, values_quantized(tokens), bits),
        }
    }

    /// The number of tokens whose state query `query` reads.
    fn state(&self, query: usize) -> usize {
        match self.schedule {
            ReadSchedule::Prefill => self.tokens,
            ReadSchedule::Streaming => query,
        }
    }
}

impl KvSource for KiviLayer {
    fn key(&self, head: usize, query: usize, position: usize) -> &[f32] {
        if position < keys_quantized(self.state(query)) {
            self.k.row(head, position)
        } else {
            self.raw_k.row(head, position)
        }
    }
    fn value(&self, head: usize, query: usize, position: usize) -> &[f32] {
        if position < values_quantized(self.state(query)) {
            self.v.row(head, position)
        } else {
            self.raw_v.row(head, position)
        }
    }
}

/// Bytes the cache stores after `tokens` tokens (module docs; `None` on overflow).
pub fn stored_bytes(bits: u32, heads: usize, head_dim: usize, tokens: usize) -> Option<usize> {
    let (k_quantized, v_quantized) = (keys_quantized(tokens), values_quantized(tokens));
    // Key groups: per head and channel, k_quantized / 32; value groups: per head and token,
    // head_dim / 32.
    let k_groups = heads
        .checked_mul(head_dim)?
        .checked_mul(k_quantized / GROUP)?;
    let v_groups = heads
        .checked_mul(v_quantized)?
        .checked_mul(head_dim / GROUP)?;
    let per_group = 4 * bits as usize + 2 + 2;
    let residual_values = heads
        .checked_mul(head_dim)?
        .checked_mul((tokens - k_quantized).checked_add(tokens - v_quantized)?)?;
    k_groups
        .checked_add(v_groups)?
        .checked_mul(per_group)?
        .checked_add(residual_values.checked_mul(4)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(tokens: usize) -> Rows {
        Rows::from_fn(1, tokens, 32, |_, t, c| ((t * 7 + c * 3) % 11) as f32 - 5.0)
    }

    #[test]
    fn keys_leave_the_residual_128_at_a_time_and_values_one_at_a_time() {
        assert_eq!((keys_quantized(127), values_quantized(127)), (0, 0));
        assert_eq!((keys_quantized(128), values_quantized(128)), (128, 0));
        assert_eq!((keys_quantized(255), values_quantized(255)), (128, 127));
        assert_eq!((keys_quantized(256), values_quantized(256)), (256, 128));
        let x = ramp(200);
        let cache = KiviLayer::new(2, ReadSchedule::Streaming, &x, &x);
        // Query 127 reads the state after 127 tokens: no key quantized; query 128 the state
        // after 128: keys 0..128 quantized (token 128 itself in the residual), no value.
        assert_eq!(cache.key(0, 127, 0), x.row(0, 0));
        assert_eq!(cache.key(0, 127, 127), x.row(0, 127));
        assert_ne!(cache.key(0, 128, 0), x.row(0, 0));
        assert_ne!(cache.key(0, 128, 127), x.row(0, 127));
        assert_eq!(cache.key(0, 128, 128), x.row(0, 128));
        assert_eq!(cache.value(0, 128, 0), x.row(0, 0));
        // Query 130: values 0 and 1 have left the residual, value 2 has not.
        assert_ne!(cache.value(0, 130, 1), x.row(0, 1));
        assert_eq!(cache.value(0, 130, 2), x.row(0, 2));
        // Under prefill every query reads the end state (200 tokens): keys 0..128, values
        // 0..72 quantized, whatever the query.
        let prefill = KiviLayer::new(2, ReadSchedule::Prefill, &x, &x);
        assert_eq!(prefill.key(0, 0, 0), cache.key(0, 128, 0));
        assert_eq!(prefill.key(0, 0, 128), x.row(0, 128));
        // (Streaming query 199 reads the state after 199 tokens: values 0..71 quantized.)
        assert_eq!(prefill.value(0, 0, 70), cache.value(0, 199, 70));
        assert_ne!(prefill.value(0, 0, 71), cache.value(0, 199, 71));
        assert_eq!(prefill.value(0, 0, 72), x.row(0, 72));
    }

    #[test]
    fn a_group_reads_back_by_the_fp16_min_max_rule() {
        // 0, 1, ..., 31 at 4 bits: mn = 0, scale = f16(31 / 15) = 2.066..; 2 / scale = 0.968
        // rounds to 1, read as 1 * scale; 31 reads back as 15 * scale, not 31.
        let x: [f32; GROUP] = std::array::from_fn(|i| i as f32);
        let scale = fp16(31.0 / 15.0);
        let read = round_trip(&x, 4);
        assert_eq!(read[0], 0.0);
        assert_eq!(read[2], scale);
        assert_eq!(read[31], 15.0 * scale);
        // A constant group reads back as its (f16) value.
        assert_eq!(round_trip(&[1.5; GROUP], 2), [1.5; GROUP]);
        assert_eq!(round_trip(&[0.1; GROUP], 2), [fp16(0.1); GROUP]);
    }

    #[test]
    fn stored_bytes_by_hand() {
        // 2 heads, head_dim 64, 300 tokens, 4 bits. Keys: 256 quantized, 2 x 64 x 8 = 1,024
        // groups, 44 tokens in the residual; values: 172 quantized, 2 x 172 x 2 = 688 groups,
        // 128 in the residual. A group is 4 words (16 bytes) + 4 bytes of scale and mn:
        // (1,024 + 688) x 20 = 34,240; the residual 2 x 64 x (44 + 128) x 4 = 88,064.
        assert_eq!(stored_bytes(4, 2, 64, 300), Some(34_240 + 88_064));
        // At 2 bits a group is 2 words: 12 bytes.
        assert_eq!(stored_bytes(2, 2, 64, 300), Some(1_712 * 12 + 88_064));
        assert_eq!(stored_bytes(2, usize::MAX, 64, 300), None);
    }
}
