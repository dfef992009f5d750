//! Finding quantized layers in a checkpoint by the tensor names the libraries write.
//!
//! - Integer layers (AutoGPTQ, GPTQModel, AutoAWQ): `<layer>.qweight`, `<layer>.qzeros`,
//!   `<layer>.scales` and, for GPTQ, `<layer>.g_idx`; plain `qweight` etc. when the file holds a
//!   single layer without a prefix. `<layer>.bias` is an ordinary tensor and passes through.
//!   Any other tensor under a layer's prefix (exllama's `q_perm`, Marlin's `B`/`s`, a stray
//!   `weight`) makes the layer's layout unknown: refused, never silently dropped.
//! - bitsandbytes 4-bit layers: `<layer>.weight` with `<layer>.weight.absmax`,
//!   `<layer>.weight.quant_map` and `<layer>.weight.quant_state.bitsandbytes__<type>` (and, when
//!   the absmax is itself quantized, `nested_absmax` / `nested_quant_map`). The type in the
//!   state's name is `nf4` or `fp4`; this tool reads NF4 only, but finds both, so that `inspect`
//!   can name an fp4 layer and `convert` can refuse it instead of copying it as plain tensors.
//! - Everything else is not quantized and passes through unchanged.

use std::collections::{BTreeMap, BTreeSet};

use crate::checkpoint::{Checkpoint, Tensor};
use crate::error::{Error, Result};
use crate::names::qualified;

/// The tensors an integer layer may hold.
pub const INTEGER_TENSORS: [&str; 4] = ["qweight", "qzeros", "scales", "g_idx"];

/// Suffixes (after `<layer>.weight`) of a bitsandbytes 4-bit layer's tensors, besides its quant
/// state.
pub const BNB_SUFFIXES: [&str; 5] = [
    "",
    ".absmax",
    ".quant_map",
    ".nested_absmax",
    ".nested_quant_map",
];

/// A bitsandbytes 4-bit layer's quant state, inside the layer, before its quant type.
pub const BNB_STATE: &str = "weight.quant_state.bitsandbytes__";

/// Which family of layouts a layer's tensor names belong to. Exhaustive: `convert` and `inspect`
/// dispatch on it, and a new family must be handled in both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// qweight / qzeros / scales [/ g_idx]: GPTQ or AWQ.
    Integer,
    /// bitsandbytes 4-bit (NF4, or fp4, which this tool does not read).
    Bitsandbytes,
}

/// One quantized layer: its prefix (empty for an unprefixed file) and its tensors by the name
/// after the prefix (`qweight`, `weight.absmax`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct Layer<'a> {
    /// The prefix of its tensors' names (empty for an unprefixed file's only layer).
    pub prefix: String,
    /// Its family of layouts.
    pub kind: LayerKind,
    /// Its tensors, by the name after the prefix.
    pub tensors: BTreeMap<String, &'a Tensor>,
}

/// The quantized layers, and the names of the tensors that belong to none.
#[derive(Debug, Clone, PartialEq)]
pub struct Layers<'a> {
    /// The quantized layers: integer ones by prefix, then bitsandbytes ones by prefix.
    pub layers: Vec<Layer<'a>>,
    /// Full names of the tensors no layer claims, sorted.
    pub passthrough: Vec<String>,
}

impl Layer<'_> {
    /// The full tensor name for a name inside this layer.
    pub fn tensor_name(&self, name: &str) -> String {
        qualified(&self.prefix, name)
    }

    /// The tensor `name` (inside the layer), or an error naming the layer and the tensor.
    pub fn get(&self, name: &str) -> Result<&Tensor> {
        self.tensors
            .get(name)
            .copied()
            .ok_or_else(|| Error::MissingTensor {
                layer: self.prefix.clone(),
                tensor: self.tensor_name(name),
            })
    }

    /// Whether the layer has the tensor `name` (inside the layer).
    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// A bitsandbytes layer's quant state: its name inside the layer, and the quant type that
    /// name gives (`nf4`, `fp4`).
    pub fn quant_state(&self) -> Option<(&str, &str)> {
        self.tensors.keys().find_map(|inside| {
            inside
                .strip_prefix(BNB_STATE)
                .map(|quant_type| (inside.as_str(), quant_type))
        })
    }

    /// Bytes of all this layer's tensors as stored.
    pub fn stored_bytes(&self) -> usize {
        self.tensors.values().map(|t| t.data.len()).sum()
    }
}

/// Splits a checkpoint into quantized layers and pass-through tensors.
pub fn find_layers(ckpt: &Checkpoint) -> Result<Layers<'_>> {
    let integer: BTreeSet<String> = ckpt
        .tensors
        .keys()
        .filter_map(|name| prefix_of(name, "qweight"))
        .collect();
    let mut bnb: BTreeMap<String, &str> = BTreeMap::new();
    for name in ckpt.tensors.keys() {
        let Some((prefix, quant_type)) = bnb_state(name) else {
            continue;
        };
        if let Some(first) = bnb.insert(prefix.clone(), quant_type) {
            return Err(Error::TwoQuantStates {
                layer: prefix,
                first: first.to_string(),
                second: quant_type.to_string(),
            });
        }
    }
    let mut layers = Vec::new();
    let mut claimed = BTreeSet::new();
    for prefix in &integer {
        let layer = integer_layer(ckpt, prefix)?;
        claimed.extend(layer.tensors.keys().map(|n| qualified(prefix, n)));
        layers.push(layer);
    }
    for (prefix, quant_type) in &bnb {
        let layer = bnb_layer(ckpt, prefix, quant_type);
        claimed.extend(layer.tensors.keys().map(|n| qualified(prefix, n)));
        layers.push(layer);
    }
    let passthrough = ckpt
        .tensors
        .keys()
        .filter(|name| !claimed.contains(*name))
        .cloned()
        .collect();
    Ok(Layers {
        layers,
        passthrough,
    })
}

fn prefix_of(name: &str, tensor: &str) -> Option<String> {
    if name == tensor {
        Some(String::new())
    } else {
        name.strip_suffix(&format!(".{tensor}")).map(str::to_string)
    }
}

fn integer_layer<'a>(ckpt: &'a Checkpoint, prefix: &str) -> Result<Layer<'a>> {
    let mut tensors = BTreeMap::new();
    for (name, tensor) in &ckpt.tensors {
        let inside = if prefix.is_empty() {
            Some(name.as_str())
        } else {
            name.strip_prefix(prefix)
                .and_then(|rest| rest.strip_prefix('.'))
        };
        let Some(inside) = inside else { continue };
        if INTEGER_TENSORS.contains(&inside) {
            tensors.insert(inside.to_string(), tensor);
        } else if inside == "bias" || (prefix.is_empty() && !looks_quantized(inside)) {
            // An unprefixed file's other tensors are other modules, not this layer's.
            continue;
        } else if !inside.contains('.') {
            return Err(Error::UnknownTensor {
                layer: prefix.to_string(),
                tensor: name.clone(),
            });
        }
    }
    Ok(Layer {
        prefix: prefix.to_string(),
        kind: LayerKind::Integer,
        tensors,
    })
}

/// Names that quantized-layer packers (exllama, Marlin) write beside qweight.
fn looks_quantized(name: &str) -> bool {
    name.starts_with('q') || name == "B" || name == "s" || name == "workspace"
}

/// `(prefix, quant type)` when `name` is a bitsandbytes quant state
/// (`<prefix>.weight.quant_state.bitsandbytes__<type>`, or unprefixed).
fn bnb_state(name: &str) -> Option<(String, &str)> {
    let (prefix, quant_type) = match name.split_once(&format!(".{BNB_STATE}")) {
        Some((prefix, quant_type)) => (prefix.to_string(), quant_type),
        None => (String::new(), name.strip_prefix(BNB_STATE)?),
    };
    (!quant_type.is_empty() && !quant_type.contains('.')).then_some((prefix, quant_type))
}

fn bnb_layer<'a>(ckpt: &'a Checkpoint, prefix: &str, quant_type: &str) -> Layer<'a> {
    let state = format!("{BNB_STATE}{quant_type}");
    let tensors = BNB_SUFFIXES
        .iter()
        .map(|suffix| format!("weight{suffix}"))
        .chain([state])
        .filter_map(|inside| {
            ckpt.tensors
                .get(&qualified(prefix, &inside))
                .map(|t| (inside, t))
        })
        .collect();
    Layer {
        prefix: prefix.to_string(),
        kind: LayerKind::Bitsandbytes,
        tensors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::Dtype;

    fn ckpt(names: &[&str]) -> Checkpoint {
        let mut ckpt = Checkpoint::default();
        for name in names {
            ckpt.tensors.insert(
                name.to_string(),
                Tensor {
                    dtype: Dtype::I32,
                    shape: vec![1],
                    data: vec![0; 4],
                },
            );
        }
        ckpt
    }

    #[test]
    fn groups_tensors_by_layer_and_passes_the_rest_through() {
        let ckpt = ckpt(&[
            "model.embed_tokens.weight",
            "model.layers.0.mlp.down_proj.bias",
            "model.layers.0.mlp.down_proj.g_idx",
            "model.layers.0.mlp.down_proj.qweight",
            "model.layers.0.mlp.down_proj.qzeros",
            "model.layers.0.mlp.down_proj.scales",
            "lm_head.weight",
            "lm_head.weight.absmax",
            "lm_head.weight.quant_map",
            "lm_head.weight.quant_state.bitsandbytes__nf4",
        ]);
        let found = find_layers(&ckpt).unwrap();
        let summary: Vec<(&str, LayerKind, Vec<&String>)> = found
            .layers
            .iter()
            .map(|l| (l.prefix.as_str(), l.kind, l.tensors.keys().collect()))
            .collect();
        assert_eq!(summary.len(), 2);
        assert_eq!(summary[0].0, "model.layers.0.mlp.down_proj");
        assert_eq!(summary[0].2, ["g_idx", "qweight", "qzeros", "scales"]);
        assert_eq!(
            (summary[1].0, summary[1].1),
            ("lm_head", LayerKind::Bitsandbytes)
        );
        assert_eq!(
            found.layers[1].quant_state(),
            Some(("weight.quant_state.bitsandbytes__nf4", "nf4"))
        );
        assert_eq!(
            found.passthrough,
            [
                "model.embed_tokens.weight",
                "model.layers.0.mlp.down_proj.bias"
            ]
        );
    }

    #[test]
    fn a_bitsandbytes_fp4_layer_is_found_not_passed_through() {
        let fp4 = ckpt(&[
            "proj.weight",
            "proj.weight.absmax",
            "proj.weight.quant_map",
            "proj.weight.quant_state.bitsandbytes__fp4",
        ]);
        let found = find_layers(&fp4).unwrap();
        assert_eq!(found.layers.len(), 1);
        assert!(found.passthrough.is_empty());
        assert_eq!(found.layers[0].prefix, "proj");
        assert_eq!(found.layers[0].quant_state().unwrap().1, "fp4");
    }

    #[test]
    fn an_unprefixed_file_is_one_layer() {
        let unprefixed = ckpt(&["g_idx", "qweight", "qzeros", "scales"]);
        let found = find_layers(&unprefixed).unwrap();
        assert_eq!(found.layers.len(), 1);
        assert_eq!(found.layers[0].prefix, "");
        assert_eq!(found.layers[0].tensor_name("qweight"), "qweight");
    }

    #[test]
    fn an_unknown_tensor_in_a_layer_is_refused_by_name() {
        let err = find_layers(&ckpt(&["proj.qweight", "proj.q_perm", "proj.scales"])).unwrap_err();
        assert!(
            matches!(&err, Error::UnknownTensor { layer, tensor }
                if layer == "proj" && tensor == "proj.q_perm"),
            "{err:?}"
        );
        // The message lists the names this module accepts.
        assert!(
            err.to_string().contains(&format!(
                "is not one of {} (or bias)",
                INTEGER_TENSORS.join(", ")
            )),
            "{err}"
        );
    }

    #[test]
    fn two_quant_states_in_one_layer_are_refused() {
        let err = find_layers(&ckpt(&[
            "proj.weight",
            "proj.weight.quant_state.bitsandbytes__fp4",
            "proj.weight.quant_state.bitsandbytes__nf4",
        ]))
        .unwrap_err();
        assert!(
            matches!(&err, Error::TwoQuantStates { layer, first, second }
                if layer == "proj" && first == "fp4" && second == "nf4"),
            "{err:?}"
        );
    }
}
