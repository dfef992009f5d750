//! What a protocol asks a run to do: its inputs (seed x length x distribution, in run order),
//! its configurations ([`Plan`]: packed-KV settings, then budget policies), the token segments each
//! configuration stores K and V in, and the ids and labels that name them.

use serde::{Deserialize, Serialize};

use crate::protocol::{Axes, Budget, Distribution, KvSetting, Mode, Policy, Protocol};

/// How one comparison stores the cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Plan {
    /// The whole cache at one setting.
    Packed(KvSetting),
    /// A budget policy with the codec fixed: `setting` is its low tier.
    Budget {
        policy: Policy,
        setting: KvSetting,
        window: usize,
    },
}

impl Plan {
    /// The label a configuration goes by in tables, timings and the chart: `g8_b4`,
    /// `g32_b2_asym`, or the policy's name.
    pub fn label(&self) -> String {
        match self {
            Plan::Packed(s) => s.label(),
            Plan::Budget { policy, .. } => policy.to_string(),
        }
    }

    /// The setting K and V are stored at: the packed setting, or a budget's low tier (whose
    /// quantized segments differ from it only in width).
    pub fn setting(&self) -> KvSetting {
        match *self {
            Plan::Packed(s) | Plan::Budget { setting: s, .. } => s,
        }
    }

    /// The token segments of an N-token cache.
    pub fn segments(&self, tokens: usize) -> Vec<SegmentPlan> {
        match *self {
            Plan::Packed(s) => vec![SegmentPlan {
                start: 0,
                end: tokens,
                storage: Storage::Quantized {
                    bits: s.bits(),
                    mode: s.mode(),
                },
            }],
            Plan::Budget {
                policy,
                setting,
                window,
            } => policy.segments(tokens, window, setting.bits()),
        }
    }

    pub fn id(&self, input: &InputSpec) -> String {
        match *self {
            Plan::Packed(s) => comparison_id(input, &s),
            Plan::Budget { policy, .. } => budget_id(input, policy),
        }
    }
}

/// Every plan of the protocol, packed-KV settings first.
pub fn plans(protocol: &Protocol) -> Vec<Plan> {
    let mut plans: Vec<Plan> = protocol.settings.iter().map(|&s| Plan::Packed(s)).collect();
    if let Some(budget) = &protocol.budget {
        let Budget {
            window, policies, ..
        } = budget;
        plans.extend(policies.iter().map(|&policy| Plan::Budget {
            policy,
            setting: budget.setting(),
            window: *window,
        }));
    }
    plans
}

impl Policy {
    /// The token segments of an N-token cache: (start, end, storage), in token order, empty
    /// segments left out.
    pub fn segments(self, tokens: usize, window: usize, low_bits: u32) -> Vec<SegmentPlan> {
        let window = window.min(tokens);
        let quantized = |bits| Storage::Quantized {
            bits,
            mode: Mode::Symmetric,
        };
        let low = quantized(low_bits);
        let (early, late) = match self {
            Policy::Uniform => (None, None),
            Policy::Recent8 => (None, Some(quantized(8))),
            Policy::RecentF32 => (None, Some(Storage::Float32)),
            Policy::Early8 => (Some(quantized(8)), None),
            Policy::EarlyF32 => (Some(Storage::Float32), None),
        };
        let parts = match (early, late) {
            (Some(high), _) => vec![(0, window, high), (window, tokens, low)],
            (None, Some(high)) => vec![(0, tokens - window, low), (tokens - window, tokens, high)],
            (None, None) => vec![(0, tokens, low)],
        };
        parts
            .into_iter()
            .filter(|(start, end, _)| end > start)
            .map(|(start, end, storage)| SegmentPlan {
                start,
                end,
                storage,
            })
            .collect()
    }
}

/// One run of consecutive tokens stored one way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentPlan {
    pub start: usize,
    pub end: usize,
    #[serde(flatten)]
    pub storage: Storage,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "storage", rename_all = "snake_case")]
pub enum Storage {
    /// Codes at this width and mode, grouped as the tensor's axis says.
    Quantized {
        bits: u32,
        #[serde(default, skip_serializing_if = "crate::protocol::is_symmetric")]
        mode: Mode,
    },
    /// Raw float32 values.
    Float32,
}

impl Protocol {
    /// Inputs in run order: seeds, then lengths, then distributions; or for a model's inputs,
    /// texts, then lengths, then layers, then KV heads.
    pub fn inputs(&self) -> Vec<InputSpec> {
        let mut inputs = Vec::new();
        if let Some(model) = &self.model {
            for text in 0..model.texts.len() {
                for &tokens in &self.tokens {
                    for &layer in &model.layers {
                        for &kv_head in &model.kv_heads {
                            inputs.push(InputSpec {
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
            return inputs;
        }
        for &seed in &self.seeds {
            for &tokens in &self.tokens {
                for &distribution in &self.distributions {
                    inputs.push(InputSpec {
                        tokens,
                        source: InputSource::Drawn { seed, distribution },
                    });
                }
            }
        }
        inputs
    }

    /// How many inputs a run of this protocol has, without listing them.
    pub fn input_count(&self) -> usize {
        match &self.model {
            Some(m) => m.texts.len() * self.tokens.len() * m.layers.len() * m.kv_heads.len(),
            None => self.seeds.len() * self.tokens.len() * self.distributions.len(),
        }
    }

    /// Number of comparisons a run of this protocol writes: packed-KV settings and budget
    /// policies, on every input.
    pub fn comparison_count(&self) -> usize {
        let policies = self.budget.as_ref().map_or(0, |b| b.policies.len());
        self.input_count() * (self.settings.len() + policies)
    }

    /// The conditions tables break results down by, in protocol order: the distributions of
    /// generated inputs, or the layers (`l0`, `l5`, ...) of a model's.
    pub fn conditions(&self) -> Vec<String> {
        match &self.model {
            Some(m) => m.layers.iter().map(|l| layer_condition(*l)).collect(),
            None => self.distributions.iter().map(|d| d.to_string()).collect(),
        }
    }
}

/// The condition label of a model layer: `l5`.
pub fn layer_condition(layer: usize) -> String {
    format!("l{layer}")
}

/// One input: N tokens of K, V and their queries, from a generator or a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputSpec {
    /// N.
    pub tokens: usize,
    /// Where the input comes from.
    pub source: InputSource,
}

/// Where one input comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputSource {
    /// A (seed, length) draw shaped by a distribution.
    Drawn {
        seed: u64,
        distribution: Distribution,
    },
    /// One KV head of one layer of the model's cache for the first N tokens of a text.
    Model {
        /// Index into the protocol's `model.texts`.
        text: usize,
        layer: usize,
        kv_head: usize,
    },
}

impl InputSpec {
    /// Identifier used in arrays.npz and results.json, e.g. `s7_n128_clean`, or
    /// `t0_n128_l5_h2` for text 0, layer 5, KV head 2.
    pub fn id(&self) -> String {
        let tokens = self.tokens;
        match self.source {
            InputSource::Drawn { seed, distribution } => {
                format!("s{seed}_n{tokens}_{distribution}")
            }
            InputSource::Model {
                text,
                layer,
                kv_head,
            } => format!("t{text}_n{tokens}_l{layer}_h{kv_head}"),
        }
    }

    /// The column tables put this input's results in: its distribution, or its layer.
    pub fn condition(&self) -> String {
        match self.source {
            InputSource::Drawn { distribution, .. } => distribution.to_string(),
            InputSource::Model { layer, .. } => layer_condition(layer),
        }
    }

    /// Whether the input counts towards the packed-KV headline: a clean draw, or any model
    /// input (a model's K is never shaped).
    pub fn is_clean(&self) -> bool {
        match self.source {
            InputSource::Drawn { distribution, .. } => distribution == Distribution::Clean,
            InputSource::Model { .. } => true,
        }
    }
}

/// Identifier of one packed-KV comparison, e.g. `s7_n128_clean_g8_b4`, or
/// `s7_n128_clean_g32_b2_asym` for an asymmetric setting.
pub fn comparison_id(input: &InputSpec, setting: &KvSetting) -> String {
    format!("{}_{}", input.id(), setting.label())
}

/// The label of a setting recorded field by field (a result or summary row). A record that is no
/// valid setting, which a run never writes, is labelled by its group size and width alone.
pub fn recorded_label(group_size: usize, bits: u32, mode: Mode, axes: Axes) -> String {
    KvSetting::new(group_size, bits, mode, axes)
        .map_or_else(|_| format!("g{group_size}_b{bits}"), |s| s.label())
}

/// Identifier of one budget comparison, e.g. `s7_n128_clean_budget_recent8`.
pub fn budget_id(input: &InputSpec, policy: Policy) -> String {
    format!("{}_budget_{policy}", input.id())
}

/// Bytes of K and V stored as float32.
pub fn float32_kv_bytes(tokens: usize, features: usize) -> usize {
    2 * tokens * features * std::mem::size_of::<f32>()
}

/// One of N disjoint, deterministic slices of a protocol's work: the unit is an input, with all
/// its comparisons ([`evidence::shard`] for how the slices fall).
pub use evidence::shard::{Shard, ShardError};

/// `shard`'s inputs of `protocol`, in run order; refuses more shards than inputs.
pub fn shard_inputs(shard: Shard, protocol: &Protocol) -> Result<Vec<InputSpec>, ShardError> {
    let all = protocol.inputs();
    Ok(all[shard.slice(all.len(), "inputs")?].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_cut_the_cache_into_token_segments() {
        let q = |bits| Storage::Quantized {
            bits,
            mode: Mode::Symmetric,
        };
        let plan = |p: Policy| {
            p.segments(128, 32, 4)
                .iter()
                .map(|s| (s.start, s.end, s.storage))
                .collect::<Vec<_>>()
        };
        assert_eq!(plan(Policy::Uniform), vec![(0, 128, q(4))]);
        assert_eq!(plan(Policy::Recent8), vec![(0, 96, q(4)), (96, 128, q(8))]);
        assert_eq!(plan(Policy::Early8), vec![(0, 32, q(8)), (32, 128, q(4))]);
        assert_eq!(
            plan(Policy::RecentF32),
            vec![(0, 96, q(4)), (96, 128, Storage::Float32)]
        );
        assert_eq!(
            plan(Policy::EarlyF32),
            vec![(0, 32, Storage::Float32), (32, 128, q(4))]
        );
        // A window as long as the cache leaves no low-precision segment.
        assert_eq!(Policy::Recent8.segments(32, 32, 4).len(), 1);
    }
}
