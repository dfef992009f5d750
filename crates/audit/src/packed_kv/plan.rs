//! What a run of a protocol must contain, derived from the protocol alone: its inputs (generated
//! draws, or a model's passes cut into one input per layer and KV head), its comparisons (ids,
//! segments, the axes K and V are grouped along, array names), the labels tables use, and the
//! conditions (distributions, or layers `l5`) they break results down by.

use crate::packed_kv::decoder::GroupAxis;
use crate::packed_kv::protocol::{Axes, Distribution, Mode, Policy, Protocol, Setting};

/// One input the protocol calls for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputPlan {
    /// `s7_n128_clean`, or `t0_n128_l5_h2` for a model's input.
    pub id: String,
    /// N.
    pub tokens: usize,
    /// Where its q, k and v come from.
    pub source: InputSource,
}

/// Where one input comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputSource {
    /// A (seed, length) draw of the protocol's generator, its keys shaped by a distribution.
    Drawn {
        /// Seed of the draw.
        seed: u64,
        /// How K is shaped.
        distribution: Distribution,
    },
    /// One KV head of one layer of the model's cache for a text's first N tokens.
    Model {
        /// Index into the protocol's `model.texts`.
        text: usize,
        /// The layer.
        layer: usize,
        /// The KV head.
        kv_head: usize,
    },
}

impl InputPlan {
    /// The column tables and the chart put this input's results in: its distribution, or its
    /// layer (`l5`).
    pub fn condition(&self) -> String {
        match self.source {
            InputSource::Drawn { distribution, .. } => distribution.name().to_string(),
            InputSource::Model { layer, .. } => layer_condition(layer),
        }
    }

    /// Whether the input counts towards the packed-KV headline ("clean mean"): a clean draw, or
    /// any model input (a model's keys are never shaped).
    pub fn is_clean(&self) -> bool {
        match self.source {
            InputSource::Drawn { distribution, .. } => distribution == Distribution::Clean,
            InputSource::Model { .. } => true,
        }
    }

    /// The model pass this input comes from, `t{text}_n{N}` (the manifest's key for its token
    /// ids); None for a generated input.
    pub fn pass(&self) -> Option<String> {
        match self.source {
            InputSource::Drawn { .. } => None,
            InputSource::Model { text, .. } => Some(pass_id(text, self.tokens)),
        }
    }
}

/// The condition of a model layer: `l5`.
pub fn layer_condition(layer: usize) -> String {
    format!("l{layer}")
}

/// The name of one model pass (a text's first N tokens): `t0_n128`.
pub fn pass_id(text: usize, tokens: usize) -> String {
    format!("t{text}_n{tokens}")
}

/// The conditions tables break results down by, in protocol order: the distributions, or the
/// layers (`l0`, `l29`) of a model protocol.
pub fn conditions(p: &Protocol) -> Vec<String> {
    match &p.model {
        Some(m) => m.layers.iter().map(|&l| layer_condition(l)).collect(),
        None => p
            .distributions
            .iter()
            .map(|d| d.name().to_string())
            .collect(),
    }
}

/// Which study a comparison belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Study {
    /// A packed-KV setting over the whole cache.
    PackedKv,
    /// A budget policy.
    Budget,
}

impl Study {
    /// As results.json spells it.
    pub fn name(self) -> &'static str {
        match self {
            Study::PackedKv => "packed_kv",
            Study::Budget => "budget",
        }
    }
}

/// A configuration: what tables, timings and the chart label a comparison by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Config {
    /// A packed-KV setting.
    Setting(Setting),
    /// A budget policy.
    Policy(Policy),
}

impl Config {
    /// `g8_b4`, `g32_b2_asym`, or the policy's name.
    pub fn label(&self) -> String {
        match self {
            Config::Setting(s) => setting_label(s),
            Config::Policy(p) => p.name().to_string(),
        }
    }
}

/// `g8_b4`, `g32_b2_asym` when asymmetric, `g32_b4_swap` (or `g32_b4_asym_swap`) when K and V
/// swap axes.
pub fn setting_label(s: &Setting) -> String {
    let mode = match s.mode {
        Mode::Symmetric => "",
        Mode::Asymmetric => "_asym",
    };
    let axes = match s.axes {
        Axes::KTokenVFeature => "",
        Axes::KFeatureVToken => "_swap",
    };
    format!("g{}_b{}{mode}{axes}", s.group_size, s.bits)
}

/// One run of consecutive tokens stored one way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// First token.
    pub start: usize,
    /// One past the last token.
    pub end: usize,
    /// Code width, or None for a float32 segment.
    pub bits: Option<u32>,
    /// The quantization mode (symmetric for float32 segments).
    pub mode: Mode,
}

impl Segment {
    fn quantized(start: usize, end: usize, bits: u32, mode: Mode) -> Segment {
        Segment {
            start,
            end,
            bits: Some(bits),
            mode,
        }
    }

    /// Tokens in the segment.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether the segment holds no token (never the case in a plan).
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// The audit's reading of a budget policy: a window of W tokens at the start (`early*`) or the
/// end (`recent*`), 8-bit or float32, the rest at the low width; empty segments dropped.
pub fn policy_segments(
    policy: Policy,
    tokens: usize,
    window: usize,
    low_bits: u32,
) -> Vec<Segment> {
    let w = window.min(tokens);
    let low = |start, end| Segment::quantized(start, end, low_bits, Mode::Symmetric);
    let float32 = |start, end| Segment {
        start,
        end,
        bits: None,
        mode: Mode::Symmetric,
    };
    let eight = |start, end| Segment::quantized(start, end, 8, Mode::Symmetric);
    let segments = match policy {
        Policy::Uniform => vec![low(0, tokens)],
        Policy::Recent8 => vec![low(0, tokens - w), eight(tokens - w, tokens)],
        Policy::RecentF32 => vec![low(0, tokens - w), float32(tokens - w, tokens)],
        Policy::Early8 => vec![eight(0, w), low(w, tokens)],
        Policy::EarlyF32 => vec![float32(0, w), low(w, tokens)],
    };
    segments.into_iter().filter(|s| !s.is_empty()).collect()
}

/// One comparison the protocol calls for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComparisonPlan {
    /// `s7_n128_clean_g8_b4` or `s7_n128_clean_budget_recent8`.
    pub id: String,
    /// Index of its input in [`inputs`].
    pub input: usize,
    /// Its study.
    pub study: Study,
    /// Its configuration.
    pub config: Config,
    /// Group size of every quantized segment.
    pub group_size: usize,
    /// The whole cache's width (packed-KV) or the low width (budget).
    pub bits: u32,
    /// The setting's mode (symmetric for budget comparisons).
    pub mode: Mode,
    /// The axes K and V are grouped along: the setting's (the default for budget comparisons).
    pub axes: Axes,
    /// The segments K and V are each stored in.
    pub segments: Vec<Segment>,
}

impl ComparisonPlan {
    /// Budget comparisons name their arrays with a `_s<index>` suffix per segment.
    pub fn suffix(&self, index: usize) -> String {
        match self.study {
            Study::PackedKv => String::new(),
            Study::Budget => format!("_s{index}"),
        }
    }

    /// Every array this comparison stores, segment by segment.
    pub fn array_names(&self) -> Vec<String> {
        let mut names = vec![format!("{}_out", self.id)];
        for tensor in ["k", "v"] {
            for (index, segment) in self.segments.iter().enumerate() {
                let parts: &[&str] = match (segment.bits, segment.mode) {
                    (Some(_), Mode::Asymmetric) => &["codes", "scales", "zeros", "shape"],
                    (Some(_), Mode::Symmetric) => &["codes", "scales", "shape"],
                    (None, _) => &["values", "shape"],
                };
                let suffix = self.suffix(index);
                names.extend(
                    parts
                        .iter()
                        .map(|part| format!("{}_{tensor}_{part}{suffix}", self.id)),
                );
            }
        }
        names
    }
}

/// The inputs a run holds: all of the protocol's, or for a shard `(index, count)` its slice,
/// positions `floor((index - 1) * U / count)` up to `floor(index * U / count)` of the U inputs in
/// run order.
pub fn inputs_of(p: &Protocol, shard: Option<(usize, usize)>) -> Vec<InputPlan> {
    let all = inputs(p);
    match shard {
        None => all,
        Some((index, count)) => {
            let u = all.len();
            all[(index - 1) * u / count..index * u / count].to_vec()
        }
    }
}

/// Inputs in run order: seeds, then lengths, then distributions; for a model's inputs, texts,
/// then lengths, then layers, then KV heads (one model pass per text and length, shared by its
/// layers and heads).
pub fn inputs(p: &Protocol) -> Vec<InputPlan> {
    let mut out = Vec::new();
    if let Some(m) = &p.model {
        for text in 0..m.texts.len() {
            for &tokens in &p.tokens {
                for &layer in &m.layers {
                    for &kv_head in &m.kv_heads {
                        out.push(InputPlan {
                            id: format!("t{text}_n{tokens}_l{layer}_h{kv_head}"),
                            tokens,
                            source: InputSource::Model {
                                text,
                                layer,
                                kv_head,
                            },
                        });
                    }
                }
            }
        }
        return out;
    }
    for &seed in &p.seeds {
        for &tokens in &p.tokens {
            for &distribution in &p.distributions {
                out.push(InputPlan {
                    id: format!("s{seed}_n{tokens}_{distribution}"),
                    tokens,
                    source: InputSource::Drawn { seed, distribution },
                });
            }
        }
    }
    out
}

/// Every configuration, packed-KV settings first, in protocol order.
pub fn configs(p: &Protocol) -> Vec<Config> {
    let mut out: Vec<Config> = p.settings.iter().map(|&s| Config::Setting(s)).collect();
    if let Some(b) = &p.budget {
        out.extend(b.policies.iter().map(|&policy| Config::Policy(policy)));
    }
    out
}

/// Comparisons in run order: per input, every configuration.
pub fn comparisons(p: &Protocol, inputs: &[InputPlan]) -> Vec<ComparisonPlan> {
    let mut out = Vec::new();
    for (index, input) in inputs.iter().enumerate() {
        for config in configs(p) {
            out.push(match config {
                Config::Setting(s) => ComparisonPlan {
                    id: format!("{}_{}", input.id, setting_label(&s)),
                    input: index,
                    study: Study::PackedKv,
                    config,
                    group_size: s.group_size,
                    bits: s.bits,
                    mode: s.mode,
                    axes: s.axes,
                    segments: vec![Segment::quantized(0, input.tokens, s.bits, s.mode)],
                },
                Config::Policy(policy) => {
                    let b = p.budget.as_ref().expect("policies come from the budget");
                    ComparisonPlan {
                        id: format!("{}_budget_{policy}", input.id),
                        input: index,
                        study: Study::Budget,
                        config,
                        group_size: b.group_size,
                        bits: b.low_bits,
                        mode: Mode::Symmetric,
                        axes: Axes::default(),
                        segments: policy_segments(policy, input.tokens, b.window, b.low_bits),
                    }
                }
            });
        }
    }
    out
}

/// The runner's upper bound on arrays.npz's size, in bytes: per array 30 + 46 bytes of ZIP
/// headers, 128 of `.npy` header and twice its file name, plus its data; 22 for the end record.
/// None if it overflows.
pub fn archive_estimate(p: &Protocol) -> Option<u64> {
    let inputs = inputs(p);
    let comparisons = comparisons(p, &inputs);
    let member = |name: &str, data: Option<u64>| -> Option<u64> {
        (30u64 + 46 + 128)
            .checked_add(2 * (name.len() as u64 + 4))?
            .checked_add(data?)
    };
    let matrix = |rows: usize, width: u64| {
        (rows as u64)
            .checked_mul(p.features as u64)?
            .checked_mul(width)
    };
    let mut total = 22u64;
    for input in &inputs {
        for (part, rows, width) in [
            ("q", p.queries, 4),
            ("k", input.tokens, 4),
            ("v", input.tokens, 4),
            ("ref", p.queries, 8),
        ] {
            total = total.checked_add(member(
                &format!("{}_{part}", input.id),
                matrix(rows, width),
            )?)?;
        }
    }
    for e in &comparisons {
        let id = &e.id;
        total = total.checked_add(member(&format!("{id}_out"), matrix(p.queries, 8))?)?;
        for tensor in ["k", "v"] {
            for (index, segment) in e.segments.iter().enumerate() {
                let name = |part: &str| format!("{id}_{tensor}_{part}{}", e.suffix(index));
                let mut add = |part: &str, data: Option<u64>| -> Option<()> {
                    total = total.checked_add(member(&name(part), data)?)?;
                    Some(())
                };
                match segment.bits {
                    Some(bits) => {
                        let axis = match tensor {
                            "k" => e.axes.k(),
                            _ => e.axes.v(),
                        };
                        let (rows, len) = match axis {
                            GroupAxis::Token => (p.features, segment.len()),
                            GroupAxis::Feature => (segment.len(), p.features),
                        };
                        let groups_per_row = len.div_ceil(e.group_size) as u64;
                        let padded = groups_per_row.checked_mul(e.group_size as u64)?;
                        let codes = (rows as u64)
                            .checked_mul(padded)?
                            .checked_mul(u64::from(bits))?;
                        let groups = (rows as u64).checked_mul(groups_per_row)?;
                        add("codes", Some(codes.div_ceil(8)))?;
                        add("scales", groups.checked_mul(4))?;
                        add("shape", Some(8))?;
                        if segment.mode == Mode::Asymmetric {
                            add(
                                "zeros",
                                Some(groups.checked_mul(u64::from(bits))?.div_ceil(8)),
                            )?;
                        }
                    }
                    None => {
                        add("values", matrix(segment.len(), 4))?;
                        add("shape", Some(8))?;
                    }
                }
            }
        }
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-written MiniLM protocol: two texts, two lengths, two layers, two KV heads; a
    /// default, a swapped asymmetric setting and one budget policy.
    fn model_protocol() -> Protocol {
        serde_json::from_value(serde_json::json!({
            "study": "plan",
            "tokens": [8, 16],
            "features": 32,
            "queries": 2,
            "settings": [
                { "group_size": 8, "bits": 4 },
                { "group_size": 8, "bits": 4, "mode": "asymmetric", "axes": "k_feature_v_token" }
            ],
            "budget": { "group_size": 8, "low_bits": 2, "window": 4, "policies": ["recent8"] },
            "model": { "name": "minilm",
                       "texts": [{ "name": "a", "text": "one" }, { "name": "b", "text": "two" }],
                       "layers": [5, 0], "kv_heads": [3, 1] }
        }))
        .expect("the schema")
    }

    #[test]
    fn model_inputs_run_texts_then_lengths_then_layers_then_heads() {
        let p = model_protocol();
        let ids: Vec<String> = inputs(&p).into_iter().map(|i| i.id).collect();
        assert_eq!(ids.len(), p.input_count());
        assert_eq!(
            ids[..5],
            [
                "t0_n8_l5_h3",
                "t0_n8_l5_h1",
                "t0_n8_l0_h3",
                "t0_n8_l0_h1",
                "t0_n16_l5_h3"
            ]
        );
        assert_eq!(ids[8], "t1_n8_l5_h3");
        let first = &inputs(&p)[0];
        assert_eq!(
            first.source,
            InputSource::Model {
                text: 0,
                layer: 5,
                kv_head: 3
            }
        );
        // Layer 5 is its condition and every model input counts as clean; t0_n8 is its pass.
        assert_eq!(first.condition(), "l5");
        assert!(first.is_clean());
        assert_eq!(first.pass().as_deref(), Some("t0_n8"));
        // Conditions keep the protocol's order of layers.
        assert_eq!(conditions(&p), ["l5", "l0"]);
    }

    #[test]
    fn a_shard_slices_model_inputs_in_run_order() {
        let p = model_protocol();
        let all = inputs(&p);
        let second = inputs_of(&p, Some((2, 3)));
        assert_eq!(second, all[5..10]);
    }

    #[test]
    fn swapped_settings_are_labelled_and_compared_on_their_axes() {
        let p = model_protocol();
        let labels: Vec<String> = configs(&p).iter().map(Config::label).collect();
        assert_eq!(labels, ["g8_b4", "g8_b4_asym_swap", "recent8"]);
        let inputs = inputs(&p);
        let plan = comparisons(&p, &inputs);
        assert_eq!(plan[1].id, "t0_n8_l5_h3_g8_b4_asym_swap");
        assert_eq!(plan[1].axes, Axes::KFeatureVToken);
        assert_eq!(
            (plan[1].axes.k(), plan[1].axes.v()),
            (GroupAxis::Feature, GroupAxis::Token)
        );
        // Budget policies keep the default axes: K along tokens, V along features.
        assert_eq!(plan[2].id, "t0_n8_l5_h3_budget_recent8");
        assert_eq!(plan[2].axes, Axes::KTokenVFeature);
    }

    #[test]
    fn generated_inputs_keep_their_ids_and_distributions() {
        let p: Protocol = serde_json::from_value(serde_json::json!({
            "study": "drawn", "seeds": [7], "tokens": [16], "features": 8, "queries": 2,
            "distributions": ["recent_focus", "clean"],
            "focus": { "window": 4, "gain": 2.0 },
            "settings": [{ "group_size": 8, "bits": 4 }],
            "generator": { "name": "numpy", "entropy":
                { "seed_multiplier": 1, "tokens_multiplier": 1, "offset": 0 } }
        }))
        .expect("the schema");
        let inputs = inputs(&p);
        assert_eq!(inputs[0].id, "s7_n16_recent_focus");
        assert_eq!(inputs[0].condition(), "recent_focus");
        assert!(!inputs[0].is_clean() && inputs[1].is_clean());
        assert_eq!(inputs[0].pass(), None);
        assert_eq!(conditions(&p), ["recent_focus", "clean"]);
    }

    #[test]
    fn policies_cut_the_cache_where_their_names_say() {
        let cut = |p| {
            policy_segments(p, 128, 32, 4)
                .iter()
                .map(|s| (s.start, s.end, s.bits))
                .collect::<Vec<_>>()
        };
        assert_eq!(cut(Policy::Uniform), vec![(0, 128, Some(4))]);
        assert_eq!(
            cut(Policy::Recent8),
            vec![(0, 96, Some(4)), (96, 128, Some(8))]
        );
        assert_eq!(
            cut(Policy::EarlyF32),
            vec![(0, 32, None), (32, 128, Some(4))]
        );
        // A window as long as the cache leaves one segment.
        assert_eq!(policy_segments(Policy::Early8, 32, 32, 4).len(), 1);
    }
}
