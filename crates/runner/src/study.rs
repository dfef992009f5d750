//! The comparisons of one run, on every input:
//! - packed-KV: each (group size, bits) setting quantizes all of K (token axis) and V (feature
//!   axis);
//! - budget: each policy cuts the cache into token segments (a high-precision window at the start
//!   or the end, the rest at the low width), each stored as its own tensor.
//!
//! Attention is recomputed from the decoded cache and compared with the float64 reference.

use kvcodec::{GroupAxis, Layout, PackedTensor};
use ndarray::{Array2, ArrayView2, Axis, s};
use serde::{Deserialize, Serialize};

use crate::attention::{attention, max_abs, relative_l2};
use crate::inputs::{Draw, draw, shape_keys};
use crate::plan::{InputSpec, K_AXIS, Plan, SegmentPlan, Storage, V_AXIS, float32_kv_bytes, plans};
use crate::protocol::{Distribution, Mode, Policy, Protocol, Setting};

/// Which study a comparison belongs to (`"packed_kv"` or `"budget"` in results.json).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Study {
    /// A packed-KV setting over the whole cache.
    PackedKv,
    /// A budget policy with the codec fixed.
    Budget,
}

/// One input as archived: the f32 arrays and the f64 reference output.
#[derive(Debug, Clone)]
pub struct Input {
    pub spec: InputSpec,
    pub id: String,
    pub entropy: u128,
    pub q: Array2<f32>,
    pub k: Array2<f32>,
    pub v: Array2<f32>,
    pub reference: Array2<f64>,
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

/// Decodes and concatenates segments back into the N x D cache.
pub fn decode_segments(segments: &[Segment]) -> Array2<f64> {
    let parts: Vec<Array2<f64>> = segments
        .iter()
        .map(|segment| match &segment.data {
            SegmentData::Packed(p) => kvcodec::decode(p),
            SegmentData::Float32(values) => values.mapv(f64::from),
        })
        .collect();
    let views: Vec<_> = parts.iter().map(|p| p.view()).collect();
    ndarray::concatenate(Axis(0), &views).expect("segments share the feature count")
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
    pub seed: u64,
    pub tokens: usize,
    pub features: usize,
    pub queries: usize,
    pub distribution: Distribution,
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
    /// The axis K is grouped along (`token`).
    pub k_axis: GroupAxis,
    /// The axis V is grouped along (`feature`).
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
            }
            .label(),
        }
    }
}

/// Everything a run computes, in protocol order.
#[derive(Debug, Clone)]
pub struct StudyRun {
    pub protocol: Protocol,
    pub inputs: Vec<Input>,
    pub comparisons: Vec<Comparison>,
}

/// Runs every comparison of the protocol. `progress` is called after each comparison.
pub fn run(protocol: &Protocol, progress: impl FnMut(usize)) -> kvcodec::Result<StudyRun> {
    run_inputs(protocol, &protocol.inputs(), progress)
}

/// Runs every comparison of the given inputs of `protocol` (a shard's, say), in the order given.
pub fn run_inputs(
    protocol: &Protocol,
    specs: &[InputSpec],
    mut progress: impl FnMut(usize),
) -> kvcodec::Result<StudyRun> {
    let plans = plans(protocol);
    let mut inputs = Vec::new();
    let mut comparisons = Vec::new();
    let mut current_draw: Option<((u64, usize), Draw)> = None;
    for &spec in specs {
        let key = (spec.seed, spec.tokens);
        if current_draw.as_ref().map(|(k, _)| *k) != Some(key) {
            current_draw = Some((key, draw(protocol, spec.seed, spec.tokens)));
        }
        let (_, base) = current_draw.as_ref().expect("just drawn");
        let input = build_input(protocol, spec, base);
        for plan in &plans {
            comparisons.push(compare(protocol, &input, plan)?);
            progress(comparisons.len());
        }
        inputs.push(input);
    }
    Ok(StudyRun {
        protocol: protocol.clone(),
        inputs,
        comparisons,
    })
}

fn build_input(protocol: &Protocol, spec: InputSpec, base: &Draw) -> Input {
    let k = shape_keys(base, spec.distribution, protocol.focus);
    let reference = attention(
        base.q.mapv(f64::from).view(),
        k.mapv(f64::from).view(),
        base.v.mapv(f64::from).view(),
    );
    Input {
        id: spec.id(),
        entropy: protocol
            .generator
            .entropy
            .entropy(spec.seed, spec.tokens)
            .expect("entropy range is checked when the protocol is loaded"),
        spec,
        q: base.q.clone(),
        k,
        v: base.v.clone(),
        reference,
    }
}

fn compare(protocol: &Protocol, input: &Input, plan: &Plan) -> kvcodec::Result<Comparison> {
    let spec = input.spec;
    let segments = plan.segments(spec.tokens);
    let k = encode_segments(input.k.view(), K_AXIS, plan.group_size(), &segments)?;
    let v = encode_segments(input.v.view(), V_AXIS, plan.group_size(), &segments)?;
    let out = attention(
        input.q.mapv(f64::from).view(),
        decode_segments(&k).view(),
        decode_segments(&v).view(),
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
    let row = ResultRow {
        id: plan.id(&spec),
        study,
        input: input.id.clone(),
        seed: spec.seed,
        tokens: spec.tokens,
        features: protocol.features,
        queries: protocol.queries,
        distribution: spec.distribution,
        group_size: plan.group_size(),
        bits,
        mode,
        policy,
        window,
        segments,
        k_axis: K_AXIS,
        v_axis: V_AXIS,
        relative_l2: relative_l2(&out, &input.reference),
        max_abs: max_abs(&out, &input.reference),
        k_payload_bytes,
        v_payload_bytes,
        payload_bytes: k_payload_bytes + v_payload_bytes,
        baseline_bytes: float32_kv_bytes(spec.tokens, protocol.features),
    };
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
        let back = decode_segments(&segments);
        assert_eq!(back.dim(), (40, 8));
        // The float32 window comes back exactly.
        assert_eq!(
            back.slice(s![32.., ..]),
            x.slice(s![32.., ..]).mapv(f64::from)
        );
    }
}
