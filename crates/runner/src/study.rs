//! The packed-KV comparisons: every input under every (group size, bits) setting, with K grouped
//! on the token axis and V on the feature axis, and attention recomputed from the decoded cache.

use codec::{Axis, Layout, PackedTensor};
use ndarray::Array2;
use serde::{Deserialize, Serialize};

use crate::attention::{attention, max_abs, relative_l2};
use crate::inputs::{Draw, draw, shape_keys};
use crate::protocol::{InputSpec, Protocol, Setting, comparison_id};

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

/// One comparison: the packed K and V and the attention output computed from them.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub row: ResultRow,
    pub k: PackedTensor,
    pub v: PackedTensor,
    pub out: Array2<f64>,
}

/// One row of results.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultRow {
    pub id: String,
    pub input: String,
    pub seed: u64,
    pub tokens: usize,
    pub features: usize,
    pub queries: usize,
    pub distribution: String,
    pub group_size: usize,
    pub bits: u32,
    pub k_axis: String,
    pub v_axis: String,
    pub relative_l2: f64,
    pub max_abs: f64,
    pub k_payload_bytes: usize,
    pub v_payload_bytes: usize,
    pub payload_bytes: usize,
    /// Float32 K + V bytes for the same shape.
    pub baseline_bytes: usize,
}

/// Everything a run computes, in protocol order.
#[derive(Debug, Clone)]
pub struct StudyRun {
    pub protocol: Protocol,
    pub inputs: Vec<Input>,
    pub comparisons: Vec<Comparison>,
}

/// Axis K is grouped on in every comparison.
pub const K_AXIS: Axis = Axis::Token;
/// Axis V is grouped on in every comparison.
pub const V_AXIS: Axis = Axis::Feature;

/// Runs every comparison of the protocol. `progress` is called after each comparison.
pub fn run(protocol: &Protocol, mut progress: impl FnMut(usize)) -> codec::Result<StudyRun> {
    let mut inputs = Vec::new();
    let mut comparisons = Vec::new();
    let mut current_draw: Option<((u64, usize), Draw)> = None;
    for spec in protocol.inputs() {
        let key = (spec.seed, spec.tokens);
        if current_draw.as_ref().map(|(k, _)| *k) != Some(key) {
            current_draw = Some((key, draw(protocol, spec.seed, spec.tokens)));
        }
        let (_, base) = current_draw.as_ref().expect("just drawn");
        let input = build_input(protocol, spec, base);
        for setting in &protocol.settings {
            comparisons.push(compare(protocol, &input, setting)?);
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

fn compare(protocol: &Protocol, input: &Input, setting: &Setting) -> codec::Result<Comparison> {
    let k = codec::encode(
        input.k.view(),
        Layout::new(K_AXIS, setting.bits, setting.group_size)?,
    )?;
    let v = codec::encode(
        input.v.view(),
        Layout::new(V_AXIS, setting.bits, setting.group_size)?,
    )?;
    let out = attention(
        input.q.mapv(f64::from).view(),
        codec::decode(&k).view(),
        codec::decode(&v).view(),
    );
    let spec = input.spec;
    let row = ResultRow {
        id: comparison_id(&spec, setting),
        input: input.id.clone(),
        seed: spec.seed,
        tokens: spec.tokens,
        features: protocol.features,
        queries: protocol.queries,
        distribution: spec.distribution.to_string(),
        group_size: setting.group_size,
        bits: setting.bits,
        k_axis: K_AXIS.to_string(),
        v_axis: V_AXIS.to_string(),
        relative_l2: relative_l2(&out, &input.reference),
        max_abs: max_abs(&out, &input.reference),
        k_payload_bytes: k.payload_bytes(),
        v_payload_bytes: v.payload_bytes(),
        payload_bytes: k.payload_bytes() + v.payload_bytes(),
        baseline_bytes: float32_kv_bytes(spec.tokens, protocol.features),
    };
    Ok(Comparison { row, k, v, out })
}

/// Bytes of K and V stored as float32.
pub fn float32_kv_bytes(tokens: usize, features: usize) -> usize {
    2 * tokens * features * std::mem::size_of::<f32>()
}
