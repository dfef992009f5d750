//! The comparisons of one run, on every input:
//! - packed-KV: each (group size, bits) setting quantizes all of K (token axis) and V (feature
//!   axis);
//! - budget: each policy cuts the cache into token segments (a high-precision window at the start
//!   or the end, the rest at the low width), each stored as its own tensor.
//!
//! Attention is recomputed from the stored cache (decoded exactly, a chunk of tokens at a time)
//! and compared with the float64 reference. How a run walks its inputs and writes what it
//! computes is [`crate::pipeline`]'s business; this module computes one comparison.

use kvcodec::{GroupAxis, Layout, PackedTensor};
use ndarray::{Array2, ArrayView2, ArrayViewMut2, s};
use serde::{Deserialize, Serialize};

use crate::attention::{TokenRows, attention, max_abs, relative_l2};
use crate::plan::{InputSource, InputSpec, Plan, SegmentPlan, Storage, float32_kv_bytes};
use crate::protocol::{Axes, Distribution, Mode, Policy, Protocol, Setting};

/// Which study a comparison belongs to (`"packed_kv"` or `"budget"` in results.json).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Study {
    /// A packed-KV setting over the whole cache.
    PackedKv,
    /// A budget policy with the codec fixed.
    Budget,
}

/// One input as archived: the f32 arrays (borrowed from its draw, the keys shaped by its
/// distribution) and the f64 reference output.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub spec: InputSpec,
    pub q: ArrayView2<'a, f32>,
    pub k: ArrayView2<'a, f32>,
    pub v: ArrayView2<'a, f32>,
    pub reference: &'a Array2<f64>,
}

impl Input<'_> {
    /// Identifier in arrays.npz and results.json.
    pub fn id(&self) -> String {
        self.spec.id()
    }
}

/// Attention of `q` over `k` and `v` in f64 (the reference output of an input).
pub fn reference_output(q: ArrayView2<f32>, k: ArrayView2<f32>, v: ArrayView2<f32>) -> Array2<f64> {
    attention(q.mapv(f64::from).view(), &k, &v)
}

/// A run of consecutive tokens of K or V, stored one way.
#[derive(Debug, Clone)]
pub struct Segment {
    pub plan: SegmentPlan,
    pub data: SegmentData,
}

#[derive(Debug, Clone)]
pub enum SegmentData {
    Packed(PackedTensor),
    Float32(Array2<f32>),
}

impl Segment {
    /// Bytes as stored: a packed tensor's payload, or 4 bytes per value plus the two i32 shape
    /// values.
    pub fn payload_bytes(&self) -> usize {
        match &self.data {
            SegmentData::Packed(p) => p.payload_bytes(),
            SegmentData::Float32(values) => 4 * values.len() + kvcodec::SHAPE_BYTES,
        }
    }
}

/// Stores `x` (N x D) segment by segment, quantized ones grouped along `axis`.
pub fn encode_segments(
    x: ArrayView2<f32>,
    axis: GroupAxis,
    group_size: usize,
    plan: &[SegmentPlan],
) -> kvcodec::Result<Vec<Segment>> {
    plan.iter()
        .map(|&segment| {
            let rows = x.slice(s![segment.start..segment.end, ..]);
            let data = match segment.storage {
                Storage::Quantized { bits, mode } => {
                    let layout = Layout::with_mode(axis, mode, bits, group_size)?;
                    SegmentData::Packed(kvcodec::encode(rows, layout)?)
                }
                Storage::Float32 => SegmentData::Float32(rows.to_owned()),
            };
            Ok(Segment {
                plan: segment,
                data,
            })
        })
        .collect()
}

/// A cache stored as segments, read back exactly in f64 a chunk of tokens at a time.
#[derive(Debug, Clone, Copy)]
pub struct StoredCache<'a>(pub &'a [Segment]);

impl TokenRows for StoredCache<'_> {
    fn tokens(&self) -> usize {
        self.0.last().map_or(0, |segment| segment.plan.end)
    }

    fn features(&self) -> usize {
        self.0.first().map_or(0, |segment| match &segment.data {
            SegmentData::Packed(p) => p.shape()[1],
            SegmentData::Float32(values) => values.ncols(),
        })
    }

    fn read(&self, start: usize, mut out: ArrayViewMut2<f64>) {
        let end = start + out.nrows();
        for segment in self.0 {
            let (first, last) = (segment.plan.start.max(start), segment.plan.end.min(end));
            if first >= last {
                continue;
            }
            let rows = out.slice_mut(s![first - start..last - start, ..]);
            let local = first - segment.plan.start..last - segment.plan.start;
            match &segment.data {
                SegmentData::Packed(p) => kvcodec::decode_exact_tokens_into(p, local, rows)
                    .expect("the rows lie inside the segment and out has its width"),
                SegmentData::Float32(values) => values.slice(s![local, ..]).view().read(0, rows),
            }
        }
    }
}

/// Decodes a cache stored as segments into `out` (N x D) in f32, as the codec decodes: what a
/// consumer of the stored cache would do (timed as decode_k and decode_v).
pub fn decode_segments_into(segments: &[Segment], mut out: ArrayViewMut2<f32>) {
    for segment in segments {
        let rows = out.slice_mut(s![segment.plan.start..segment.plan.end, ..]);
        match &segment.data {
            SegmentData::Packed(p) => kvcodec::decode_into(p, rows)
                .expect("the segment's rows have the packed tensor's shape"),
            SegmentData::Float32(values) => {
                let mut rows = rows;
                rows.assign(values);
            }
        }
    }
}

/// One comparison: the stored K and V and the attention output computed from them.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub row: ResultRow,
    pub plan: Plan,
    pub k: Vec<Segment>,
    pub v: Vec<Segment>,
    pub out: Array2<f64>,
}

/// One row of results.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultRow {
    pub id: String,
    /// `packed_kv` or `budget`.
    pub study: Study,
    pub input: String,
    /// The draw's seed; absent for a model's input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    pub tokens: usize,
    pub features: usize,
    pub queries: usize,
    /// How the draw's keys were shaped; absent for a model's input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distribution: Option<Distribution>,
    /// A model's input: index of the text in the protocol's `model.texts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<usize>,
    /// A model's input: the layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<usize>,
    /// A model's input: the KV head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_head: Option<usize>,
    pub group_size: usize,
    /// The width of the whole cache (packed-KV) or of the low-precision part (budget).
    pub bits: u32,
    /// Symmetric unless stated (and then not written).
    #[serde(default, skip_serializing_if = "crate::protocol::is_symmetric")]
    pub mode: Mode,
    /// Budget policy; null for packed-KV rows.
    pub policy: Option<Policy>,
    /// Budget window W in tokens; null for packed-KV rows.
    pub window: Option<usize>,
    /// Token segments, each stored as its own tensor for K and for V.
    pub segments: Vec<SegmentPlan>,
    /// The axis K is grouped along (`token` unless the setting swaps axes).
    pub k_axis: GroupAxis,
    /// The axis V is grouped along (`feature` unless the setting swaps axes).
    pub v_axis: GroupAxis,
    pub relative_l2: f64,
    pub max_abs: f64,
    pub k_payload_bytes: usize,
    pub v_payload_bytes: usize,
    pub payload_bytes: usize,
    /// Float32 K + V bytes for the same shape.
    pub baseline_bytes: usize,
}

impl ResultRow {
    /// The label of the row's configuration (the same as its plan's [`Plan::label`]).
    pub fn label(&self) -> String {
        match self.policy {
            Some(policy) => policy.to_string(),
            None => Setting {
                group_size: self.group_size,
                bits: self.bits,
                mode: self.mode,
                axes: if self.k_axis == GroupAxis::Token {
                    Axes::KTokenVFeature
                } else {
                    Axes::KFeatureVToken
                },
            }
            .label(),
        }
    }

    /// The column tables put this row in: its input's distribution, or its layer (`l5`).
    pub fn condition(&self) -> String {
        match (self.distribution, self.layer) {
            (Some(d), _) => d.to_string(),
            (None, Some(layer)) => crate::plan::layer_condition(layer),
            (None, None) => String::new(),
        }
    }
}

/// Stores the input's K and V as `plan` says, recomputes attention from what was stored, and
/// measures it against the reference.
pub fn compare(protocol: &Protocol, input: &Input, plan: &Plan) -> kvcodec::Result<Comparison> {
    let spec = input.spec;
    let segments = plan.segments(spec.tokens);
    let axes = plan.axes();
    let k = encode_segments(input.k, axes.k(), plan.group_size(), &segments)?;
    let v = encode_segments(input.v, axes.v(), plan.group_size(), &segments)?;
    let out = attention(
        input.q.mapv(f64::from).view(),
        &StoredCache(&k),
        &StoredCache(&v),
    );
    let k_payload_bytes: usize = k.iter().map(Segment::payload_bytes).sum();
    let v_payload_bytes: usize = v.iter().map(Segment::payload_bytes).sum();
    let (study, bits, mode, policy, window) = match *plan {
        Plan::Packed(s) => (Study::PackedKv, s.bits, s.mode, None, None),
        Plan::Budget {
            policy,
            low_bits,
            window,
            ..
        } => (
            Study::Budget,
            low_bits,
            Mode::Symmetric,
            Some(policy),
            Some(window),
        ),
    };
    let mut row = ResultRow {
        id: plan.id(&spec),
        study,
        input: input.id(),
        seed: None,
        tokens: spec.tokens,
        features: protocol.features,
        queries: protocol.queries,
        distribution: None,
        text: None,
        layer: None,
        kv_head: None,
        group_size: plan.group_size(),
        bits,
        mode,
        policy,
        window,
        segments,
        k_axis: axes.k(),
        v_axis: axes.v(),
        relative_l2: relative_l2(&out, input.reference),
        max_abs: max_abs(&out, input.reference),
        k_payload_bytes,
        v_payload_bytes,
        payload_bytes: k_payload_bytes + v_payload_bytes,
        baseline_bytes: float32_kv_bytes(spec.tokens, protocol.features),
    };
    match spec.source {
        InputSource::Drawn { seed, distribution } => {
            row.seed = Some(seed);
            row.distribution = Some(distribution);
        }
        InputSource::Model {
            text,
            layer,
            kv_head,
        } => {
            row.text = Some(text);
            row.layer = Some(layer);
            row.kv_head = Some(kv_head);
        }
    }
    Ok(Comparison {
        row,
        plan: *plan,
        k,
        v,
        out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_round_trip_and_count_their_own_bytes() {
        let x = Array2::from_shape_fn((40, 8), |(t, f)| ((t * 8 + f) as f32 * 0.37).sin());
        let plan = Policy::RecentF32.segments(40, 8, 4);
        let segments = encode_segments(x.view(), GroupAxis::Token, 32, &plan).unwrap();
        assert_eq!(segments.len(), 2);
        // 32 tokens x 8 features at 4 bits in one group per column, then 8 raw tokens.
        assert_eq!(segments[0].payload_bytes(), 32 * 8 / 2 + 8 * 4 + 8);
        assert_eq!(segments[1].payload_bytes(), 8 * 8 * 4 + 8);
        let cache = StoredCache(&segments);
        assert_eq!((cache.tokens(), cache.features()), (40, 8));
        // Read across the segment boundary: the float32 window comes back exactly.
        let mut back = Array2::<f64>::zeros((10, 8));
        cache.read(30, back.view_mut());
        assert_eq!(
            back.slice(s![2.., ..]),
            x.slice(s![32.., ..]).mapv(f64::from)
        );
        let mut f32_back = Array2::<f32>::zeros((40, 8));
        decode_segments_into(&segments, f32_back.view_mut());
        assert_eq!(f32_back.slice(s![32.., ..]), x.slice(s![32.., ..]));
    }
}
