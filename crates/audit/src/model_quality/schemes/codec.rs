//! This project's codec as named schemes
//! (`kvpack-k<KB>v<VB>[-asym][-sink<S>][-edge8][-layer<L>]`) as the audit reads them, with the
//! audit's own quantization rule ([`crate::packed_kv::rules`], written from the evidence format's
//! spec).
//!
//! Spec, from kvschemes' `codec.rs` and the codec's docs/formats.md:
//! - The name: `kvpack-k` KB `v` VB, then optionally, in this order and each at most once,
//!   `-asym`, `-sink` S, `-edge8` and `-layer` L; KB, VB and S are decimal without a leading
//!   zero, L too except `0`; S is 1 to 8,192 and L 0 to 255; widths 2 to 8, or 1 to 8 with
//!   `-asym`, or 32 for one side (not both): that side is held float32. `-edge8` is refused
//!   with a float32 side or `-layer`.
//! - `-layer` L: layer L is held as the rest of the name says, every other layer float32 (K and
//!   V as they are, 4 bytes a value); an L past the model's layers is refused.
//! - Each KV head's tokens S.. (the first S, or all if fewer, stay f32 in K and V: attention
//!   sinks) form one codec tensor per side: K in groups of 32 consecutive tokens of one channel
//!   (counted from token S), V in groups of 32 consecutive channels of one token (a partial last
//!   group has fewer values: the codec's zero padding changes neither its range nor its codes).
//!   Codes at KB bits for K and VB for V, symmetric, or asymmetric with `-asym`; `-edge8` holds
//!   the first and the last layer at 8 and 8 bits (same mode).
//! - A group: the rule of [`crate::packed_kv::rules`] (symmetric: scale = max|x| / qmax;
//!   asymmetric: scale = (hi - lo) / L over the range widened to contain 0, an integer zero
//!   point), read as `(code - offset) as f32 * scale`. An asymmetric range whose scale overflows
//!   f32 is refused, as the codec refuses it.
//! - Attention: under `prefill` without sinks (each head's K and V one codec tensor), with a
//!   head dimension that is a multiple of 8, attention reads the codes in place
//!   ([`crate::model_quality::packed_attention`]), as the quality crate's scheme layer does.
//! - Schedules (the quality crate's): `prefill` reads every position after the sinks quantized;
//!   `streaming` reads, at query i, a K position quantized once its group has filled (the groups
//!   S + 32 g .. S + 32 (g + 1) that lie within tokens 0..=i), f32 while it is filling, and every V
//!   position after the sinks quantized (V is quantized on arrival).
//! - Bytes at the end of the text, per head: each codec tensor's payload (its packed codes, each
//!   row zero-padded to whole groups: ceil(values * b / 8) bytes; a 4-byte scale per group;
//!   with `-asym` the packed b-bit zero points, ceil(groups * b / 8) bytes; 8 bytes of shape) for
//!   what the end state holds quantized (prefill: tokens S..T for K and V; streaming: K's whole
//!   groups only), and 4 bytes per f32 value (the sinks, and streaming K's filling group).

use models::llama::KvSource;
use ndarray::{Array2, ArrayView2};

use super::{ReadSchedule, Rows};
use crate::model_quality::packed_attention::{Coded, attend_coded, coded_heads};
use crate::packed_kv::protocol::Mode;
use crate::packed_kv::rules;

/// Values per group.
pub const GROUP: usize = 32;
/// The largest sink count a name may ask for.
pub const MAX_SINKS: usize = 8192;

/// A `kvpack-*` scheme (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// The width that holds a side float32.
const FLOAT32: u32 = 32;
/// The largest layer a name may give.
const MAX_LAYER: usize = 255;

/// A decimal number without a leading zero.
fn number(s: &str) -> Option<usize> {
    let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits || s.starts_with('0') {
        return None;
    }
    s.parse::<u32>().ok().map(|n| n as usize)
}

impl CodecScheme {
    /// The scheme a name spells, if any (module docs).
    pub fn parse(name: &str) -> Option<CodecScheme> {
        let mut parts = name.strip_prefix("kvpack-")?.split('-');
        let (k, v) = parts.next()?.strip_prefix('k')?.split_once('v')?;
        let mut scheme = CodecScheme {
            k_bits: u32::try_from(number(k)?).ok()?,
            v_bits: u32::try_from(number(v)?).ok()?,
            mode: Mode::Symmetric,
            sinks: 0,
            edge8: false,
            layer: None,
        };
        let mut rest = parts.peekable();
        if rest.next_if_eq(&"asym").is_some() {
            scheme.mode = Mode::Asymmetric;
        }
        if let Some(sinks) = rest.next_if(|p| p.starts_with("sink")) {
            let s = number(&sinks["sink".len()..])?;
            if s > MAX_SINKS {
                return None;
            }
            scheme.sinks = s;
        }
        if rest.next_if_eq(&"edge8").is_some() {
            scheme.edge8 = true;
        }
        if let Some(layer) = rest.next_if(|p| p.starts_with("layer")) {
            let l = match &layer["layer".len()..] {
                "0" => 0,
                digits => number(digits)?,
            };
            if l > MAX_LAYER {
                return None;
            }
            scheme.layer = Some(l);
        }
        let width = |bits: u32| scheme.mode.supports(bits) || bits == FLOAT32;
        let floats = [scheme.k_bits, scheme.v_bits]
            .iter()
            .filter(|&&b| b == FLOAT32)
            .count();
        let valid = rest.next().is_none()
            && width(scheme.k_bits)
            && width(scheme.v_bits)
            && floats < 2
            && !(scheme.edge8 && (floats > 0 || scheme.layer.is_some()));
        valid.then_some(scheme)
    }

    /// Its name.
    pub fn name(&self) -> String {
        let mut name = format!("kvpack-k{}v{}", self.k_bits, self.v_bits);
        if self.mode == Mode::Asymmetric {
            name.push_str("-asym");
        }
        if self.sinks > 0 {
            name.push_str(&format!("-sink{}", self.sinks));
        }
        if self.edge8 {
            name.push_str("-edge8");
        }
        if let Some(layer) = self.layer {
            name.push_str(&format!("-layer{layer}"));
        }
        name
    }

    /// K's and V's widths at layer `layer` of `layers`; `None` for a side held float32.
    pub fn widths(&self, layer: usize, layers: usize) -> (Option<u32>, Option<u32>) {
        let edge = layer == 0 || layer + 1 == layers;
        let coded = |bits: u32| (bits != FLOAT32).then_some(bits);
        match self.layer {
            Some(only) if only != layer => (None, None),
            _ if self.edge8 && edge => (Some(8), Some(8)),
            _ => (coded(self.k_bits), coded(self.v_bits)),
        }
    }
}

/// The flat indices of one group's values, quantized in place in `read`; Err when the
/// asymmetric scale overflows.
fn round_trip_group(
    read: &mut [f32],
    indices: &[usize],
    mode: Mode,
    bits: u32,
) -> Result<(), String> {
    let (mut lo, mut hi) = (0f32, 0f32);
    for &i in indices {
        lo = lo.min(read[i]);
        hi = hi.max(read[i]);
    }
    let rule = rules::group_rule(mode, bits, lo, hi);
    if !rule.scale.is_finite() {
        return Err(format!(
            "a group ranging over [{lo}, {hi}] has a scale f32 cannot hold at {bits} bits"
        ));
    }
    for &i in indices {
        let code = rules::code(mode, bits, read[i], rule.scale, rule.offset);
        read[i] = (i32::from(code) - i32::from(rule.offset)) as f32 * rule.scale;
    }
    Ok(())
}

/// K: each head's tokens `sinks..` quantized per channel in groups of 32 tokens from `sinks`
/// (float32 as it is without a width).
fn keys(x: &Rows, sinks: usize, mode: Mode, bits: Option<u32>) -> Result<Rows, String> {
    let mut read = x.clone();
    let Some(bits) = bits else {
        return Ok(read);
    };
    let mut indices = Vec::with_capacity(GROUP);
    for head in 0..x.heads {
        for channel in 0..x.dim {
            for start in (sinks..x.tokens).step_by(GROUP) {
                let end = (start + GROUP).min(x.tokens);
                indices.clear();
                indices.extend((start..end).map(|t| x.index(head, t) + channel));
                round_trip_group(&mut read.values, &indices, mode, bits)?;
            }
        }
    }
    Ok(read)
}

/// V: each head's tokens `sinks..` quantized per token in groups of 32 channels (float32 as it
/// is without a width).
fn values(x: &Rows, sinks: usize, mode: Mode, bits: Option<u32>) -> Result<Rows, String> {
    let mut read = x.clone();
    let Some(bits) = bits else {
        return Ok(read);
    };
    let mut indices = Vec::with_capacity(GROUP);
    for head in 0..x.heads {
        for token in sinks..x.tokens {
            for start in (0..x.dim).step_by(GROUP) {
                let end = (start + GROUP).min(x.dim);
                indices.clear();
                indices.extend((start..end).map(|c| x.index(head, token) + c));
                round_trip_group(&mut read.values, &indices, mode, bits)?;
            }
        }
    }
    Ok(read)
}

/// One layer's cache under a `kvpack-*` scheme: what each query reads (module docs).
pub(super) struct CodecLayer {
    schedule: ReadSchedule,
    sinks: usize,
    raw_k: Rows,
    raw_v: Rows,
    k: Rows,
    v: Rows,
    /// Per KV head, K and V as attention reads them in place (module docs); empty otherwise.
    coded: Vec<(Coded, Coded)>,
}

impl CodecLayer {
    /// The cache of layer `layer` of `layers`, K (after RoPE) and V.
    pub(super) fn new(
        scheme: &CodecScheme,
        schedule: ReadSchedule,
        (layer, layers): (usize, usize),
        k: &Rows,
        v: &Rows,
    ) -> Result<CodecLayer, String> {
        if let Some(only) = scheme.layer.filter(|&l| l >= layers) {
            return Err(format!(
                "{}: layer {only} of a model with {layers} layers",
                scheme.name()
            ));
        }
        let (k_bits, v_bits) = scheme.widths(layer, layers);
        let sinks = scheme.sinks.min(k.tokens);
        let in_k = |e: String| format!("{} K: {e}", scheme.name());
        let in_v = |e: String| format!("{} V: {e}", scheme.name());
        let read_k = keys(k, sinks, scheme.mode, k_bits).map_err(in_k)?;
        let read_v = values(v, sinks, scheme.mode, v_bits).map_err(in_v)?;
        let in_place = schedule == ReadSchedule::Prefill && sinks == 0 && k.dim.is_multiple_of(8);
        let coded = match (in_place, k_bits, v_bits) {
            (true, Some(k_bits), Some(v_bits)) => {
                let dims = (k.heads, k.tokens, k.dim);
                coded_heads(
                    (&k.values, &v.values),
                    dims,
                    scheme.mode,
                    (k_bits, v_bits),
                    GROUP,
                )?
            }
            _ => Vec::new(),
        };
        Ok(CodecLayer {
            schedule,
            sinks,
            raw_k: k.clone(),
            raw_v: v.clone(),
            k: read_k,
            v: read_v,
            coded,
        })
    }
}

/// Tokens of K quantized while decoding once `n` tokens have arrived: the sinks, then whole
/// groups.
fn keys_quantized_decoding(sinks: usize, n: usize) -> usize {
    sinks + n.saturating_sub(sinks) / GROUP * GROUP
}

impl KvSource for CodecLayer {
    fn key(&self, head: usize, query: usize, position: usize) -> &[f32] {
        let quantized = match self.schedule {
            ReadSchedule::Prefill => true,
            ReadSchedule::Streaming => {
                position < keys_quantized_decoding(self.sinks, query.saturating_add(1))
            }
        };
        if position >= self.sinks && quantized {
            self.k.row(head, position)
        } else {
            self.raw_k.row(head, position)
        }
    }
    fn value(&self, head: usize, _query: usize, position: usize) -> &[f32] {
        if position >= self.sinks {
            self.v.row(head, position)
        } else {
            self.raw_v.row(head, position)
        }
    }
    fn attend(
        &self,
        head: usize,
        queries: ArrayView2<'_, f32>,
        visible: &[usize],
        scale: f32,
    ) -> Option<Result<Array2<f32>, String>> {
        attend_coded(&self.coded, head, queries, visible, scale)
    }
}

/// The codec's payload of one tensor of `rows` rows of `len` values, grouped along the rows
/// (module docs; `None` on overflow).
fn payload(mode: Mode, bits: u32, rows: usize, len: usize) -> Option<usize> {
    let groups = rows.checked_mul(len.div_ceil(GROUP))?;
    let stream = |count: usize| Some(count.checked_mul(bits as usize)?.div_ceil(8));
    let codes = stream(groups.checked_mul(GROUP)?)?;
    let zero_points = match mode {
        Mode::Symmetric => 0,
        Mode::Asymmetric => stream(groups)?,
    };
    codes
        .checked_add(groups.checked_mul(4)?)?
        .checked_add(zero_points)?
        .checked_add(8)
}

/// Bytes the cache of layer `layer` of `layers` stores after `tokens` tokens (module docs;
/// `None` on overflow).
pub fn stored_bytes(
    scheme: &CodecScheme,
    schedule: ReadSchedule,
    (layer, layers): (usize, usize),
    heads: usize,
    head_dim: usize,
    tokens: usize,
) -> Option<usize> {
    let (k_bits, v_bits) = scheme.widths(layer, layers);
    let sinks = scheme.sinks.min(tokens);
    let k_quantized_end = match schedule {
        ReadSchedule::Prefill => tokens,
        ReadSchedule::Streaming => keys_quantized_decoding(sinks, tokens),
    };
    // One head: K along tokens (head_dim rows of the quantized tokens), V along channels (a row
    // per quantized token), and the f32 values.
    // A float32 side: every token's values, 4 bytes each.
    let (k_quantized_end, k_sinks) = match k_bits {
        Some(_) => (k_quantized_end, sinks),
        None => (0, 0),
    };
    let (v_end, v_sinks) = match v_bits {
        Some(_) => (tokens, sinks),
        None => (0, 0),
    };
    let k_tokens = k_quantized_end - k_sinks;
    let v_tokens = v_end - v_sinks;
    let k_payload = match (k_tokens, k_bits) {
        (0, _) | (_, None) => 0,
        (n, Some(bits)) => payload(scheme.mode, bits, head_dim, n)?,
    };
    let v_payload = match (v_tokens, v_bits) {
        (0, _) | (_, None) => 0,
        (n, Some(bits)) => payload(scheme.mode, bits, n, head_dim)?,
    };
    let f32_tokens = (tokens - k_quantized_end + k_sinks).checked_add(tokens - v_end + v_sinks)?;
    let f32_bytes = f32_tokens.checked_mul(head_dim)?.checked_mul(4)?;
    let head = k_payload.checked_add(v_payload)?.checked_add(f32_bytes)?;
    head.checked_mul(heads)
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
            assert_eq!(
                CodecScheme::parse(name).map(|s| s.name()).as_deref(),
                Some(name)
            );
        }
        for name in [
            "kvpack-k1v4",
            "kvpack-k9v4",
            "kvpack-k4v4-edge8-asym",
            "kvpack-k4v4-sink0",
            "kvpack-k04v4",
            "kvpack-k4v4-sink8193",
            "kvpack-k4v4-asym-asym",
            "kvpack-k4",
            "kvpack-k4v4-",
            "kvpack-k32v32",
            "kvpack-k16v4",
            "kvpack-k4v32-edge8",
            "kvpack-k4v4-edge8-layer3",
            "kvpack-k4v4-layer03",
            "kvpack-k4v4-layer256",
            "kvpack-k4v4-layer",
            "kvpack-k4v4-layer2-sink4",
        ] {
            assert_eq!(CodecScheme::parse(name), None, "{name}");
        }
    }

    #[test]
    fn streaming_keys_wait_for_their_group_after_the_sinks() {
        assert_eq!(keys_quantized_decoding(0, 31), 0);
        assert_eq!(keys_quantized_decoding(0, 32), 32);
        assert_eq!(keys_quantized_decoding(4, 35), 4);
        assert_eq!(keys_quantized_decoding(4, 36), 36);
        assert_eq!(keys_quantized_decoding(4, 3), 4);
    }

    #[test]
    fn stored_bytes_by_hand() {
        // kvpack-k4v4, 1 head, head_dim 64, 5 tokens, prefill. K: 64 rows of 1 group (5 tokens
        // padded to 32) = 2,048 codes = 1,024 bytes + 64 scales x 4 + 8 = 1,288. V: 5 rows of 2
        // groups = 320 codes = 160 bytes + 10 x 4 + 8 = 208.
        let k4v4 = CodecScheme::parse("kvpack-k4v4").unwrap();
        let bytes = |s: &CodecScheme, schedule, layer, tokens| {
            stored_bytes(s, schedule, (layer, 30), 1, 64, tokens)
        };
        assert_eq!(bytes(&k4v4, ReadSchedule::Prefill, 5, 5), Some(1_288 + 208));
        // Streaming: K's group is still filling, 5 x 64 x 4 = 1,280 bytes of f32.
        assert_eq!(
            bytes(&k4v4, ReadSchedule::Streaming, 5, 5),
            Some(1_280 + 208)
        );
        // -sink4 at 5 tokens: one token quantized. K: 64 rows x 1 group = 1,024 + 256 + 8;
        // V: 1 row x 2 groups: 32 + 8 + 8; 4 sinks x 2 sides x 64 x 4 = 2,048.
        let sink4 = CodecScheme::parse("kvpack-k4v4-sink4").unwrap();
        assert_eq!(
            bytes(&sink4, ReadSchedule::Prefill, 5, 5),
            Some(1_288 + 48 + 2_048)
        );
        // -edge8 at layer 0: 8 bits; 64 tokens, prefill. K: 64 rows x 2 groups: 4,096 codes =
        // 4,096 bytes + 128 x 4 + 8 = 4,616; V (64 rows x 2 groups) the same.
        let edge = CodecScheme::parse("kvpack-k4v2-edge8").unwrap();
        assert_eq!(bytes(&edge, ReadSchedule::Prefill, 0, 64), Some(2 * 4_616));
        // Asymmetric 2 bits, 64 tokens: 4,096 codes = 1,024 bytes, 128 scales = 512, 128 zero
        // points = 32 bytes, + 8 = 1,576 per side.
        // K only at 4 bits, 5 tokens, prefill: K's 1,288 as above, V float32: 5 x 64 x 4.
        let k_only = CodecScheme::parse("kvpack-k4v32").unwrap();
        assert_eq!(
            bytes(&k_only, ReadSchedule::Prefill, 5, 5),
            Some(1_288 + 1_280)
        );
        // V only, streaming: K float32 (1,280), V's 208.
        let v_only = CodecScheme::parse("kvpack-k32v4").unwrap();
        assert_eq!(
            bytes(&v_only, ReadSchedule::Streaming, 5, 5),
            Some(1_280 + 208)
        );
        // One layer: the others hold float32 K and V.
        let layer7 = CodecScheme::parse("kvpack-k4v4-layer7").unwrap();
        assert_eq!(
            bytes(&layer7, ReadSchedule::Prefill, 7, 5),
            Some(1_288 + 208)
        );
        assert_eq!(bytes(&layer7, ReadSchedule::Prefill, 6, 5), Some(2 * 1_280));
        let asym = CodecScheme::parse("kvpack-k2v2-asym").unwrap();
        assert_eq!(bytes(&asym, ReadSchedule::Prefill, 5, 64), Some(2 * 1_576));
        assert_eq!(
            stored_bytes(&asym, ReadSchedule::Prefill, (5, 30), usize::MAX, 64, 64),
            None
        );
    }
}
