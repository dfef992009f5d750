//! summary.md: the run's tables in markdown, with the chart beside it.
//!
//! Every figure is in a table; the text between them has none (not even a count), so that a
//! reader, or the audit, can check everything summary.md claims by checking its table cells. The
//! tables, in order: the run (protocol and counts), the packed-KV table, the same per
//! distribution, the budget table (when the protocol has a budget study), the platform and the
//! median timings (when it takes timings).

use std::fmt::Write as _;

use crate::manifest::Manifest;
use crate::protocol::Protocol;
use crate::summary::{
    Summary, Table, budget_table, packed_by_distribution_table, packed_table, timing_table,
};

/// The run table: what was run (the protocol, and for a shard which slice of it), and how many of
/// everything this directory holds.
pub fn run_table(protocol: &Protocol, manifest: &Manifest) -> Table {
    let join = |items: Vec<String>| items.join(", ");
    let policies = protocol.budget.as_ref().map_or(0, |b| b.policies.len());
    let mut rows = Vec::new();
    match (&protocol.model, &protocol.generator) {
        (Some(model), _) => {
            rows.push(("model", model.name.to_string()));
            rows.push((
                "texts",
                join(model.texts.iter().map(|t| t.name.clone()).collect()),
            ));
            rows.push((
                "layers",
                join(model.layers.iter().map(usize::to_string).collect()),
            ));
            rows.push((
                "KV heads",
                join(model.kv_heads.iter().map(usize::to_string).collect()),
            ));
        }
        (None, Some(generator)) => {
            rows.push(("generator", generator.name.name().to_string()));
            rows.push((
                "seeds",
                join(protocol.seeds.iter().map(u64::to_string).collect()),
            ));
        }
        (None, None) => {}
    }
    rows.extend([
        (
            "lengths (N)",
            join(protocol.tokens.iter().map(usize::to_string).collect()),
        ),
        ("features (D)", protocol.features.to_string()),
        ("queries", protocol.queries.to_string()),
    ]);
    if protocol.model.is_none() {
        rows.push((
            "distributions",
            join(
                protocol
                    .distributions
                    .iter()
                    .map(|d| d.to_string())
                    .collect(),
            ),
        ));
    }
    if let Some(focus) = protocol.focus {
        rows.push(("focus window (tokens)", focus.window.to_string()));
        rows.push(("focus gain", focus.gain.to_string()));
    }
    if let Some(shard) = &manifest.shard {
        rows.push(("shard", format!("{} of {}", shard.index, shard.count)));
    }
    if let Some(shards) = &manifest.merged_from {
        rows.push(("shards merged", shards.len().to_string()));
    }
    rows.extend([
        ("inputs", manifest.counts.inputs.to_string()),
        ("packed-KV settings", protocol.settings.len().to_string()),
    ]);
    if let Some(budget) = &protocol.budget {
        rows.push(("budget policies", policies.to_string()));
        rows.push(("budget group size", budget.group_size.to_string()));
        rows.push(("budget low bits", budget.low_bits.to_string()));
        rows.push(("budget window W (tokens)", budget.window.to_string()));
    }
    if let Some(timing) = &protocol.timing {
        rows.push(("timing warm-up calls", timing.warmup.to_string()));
        rows.push(("timing repeats", timing.repeats.to_string()));
    }
    rows.push(("comparisons", manifest.counts.comparisons.to_string()));
    Table {
        headers: vec!["quantity".into(), "value".into()],
        rows: rows
            .into_iter()
            .map(|(k, v)| vec![k.to_string(), v])
            .collect(),
    }
}

/// The platform the timings describe.
pub fn platform_table(manifest: &Manifest) -> Table {
    Table {
        headers: vec!["target".into(), "rustc".into(), "profile".into()],
        rows: vec![vec![
            manifest.platform.target.clone(),
            manifest.tool.rustc.clone(),
            manifest.tool.profile.clone(),
        ]],
    }
}

/// summary.md's text.
pub fn summary_markdown(protocol: &Protocol, summary: &Summary, manifest: &Manifest) -> String {
    let mut md = String::new();
    let mut line = |text: &str| {
        md.push_str(text);
        md.push_str("\n\n");
    };
    line(&format!("# Run summary: {}", protocol.study));
    match &protocol.model {
        None => line(
            "Every figure of this run is in a table below; the text only says what the tables \
             hold. The inputs are synthetic standard-normal draws, not K and V from a trained \
             model, and nothing here measures model quality. `early_focus` and `recent_focus` \
             (keys shifted towards the mean query over the first or last tokens of the focus \
             window) are this project's conditions.",
        ),
        Some(model) => line(&format!(
            "Every figure of this run is in a table below; the text only says what the tables \
             hold. The inputs are K and V that the real model `{}` computed for the protocol's \
             texts (one input per text, length, layer and KV head; K after RoPE for a rotary \
             model), with the model's own queries at the last positions. Attention error is a \
             proxy: nothing here measures the model's predictions. Columns `lL` are layer L.",
            model.name
        )),
    }
    line("## Run");
    line(&run_table(protocol, manifest).to_markdown());
    line("## Packed KV");
    line(&format!(
        "Mean relative L2 error of the attention output over the {} inputs, and the K+V payload \
         (codes, float32 scales, zero points when asymmetric, and two int32 shape values per \
         tensor):",
        if protocol.model.is_some() {
            "model's"
        } else {
            "clean"
        }
    ));
    line(&packed_table(protocol, summary).to_markdown());
    line(if protocol.model.is_some() {
        "The same settings on every layer (mean over texts, KV heads and lengths):"
    } else {
        "The same settings on every distribution (mean over seeds and lengths):"
    });
    line(&packed_by_distribution_table(protocol, summary).to_markdown());
    if protocol.budget.is_some() {
        line("## Recent-token precision budget");
        line(&format!(
            "With the codec fixed at the budget group size and low width (see the run table), \
             a window of W tokens at the start (`early*`) or the end (`recent*`) of the cache is \
             kept at eight bits or in float32; each part is stored as its own segment. Mean \
             relative L2 error over {} and lengths:",
            if protocol.model.is_some() {
                "texts, KV heads"
            } else {
                "seeds"
            }
        ));
        line(&budget_table(protocol, summary).to_markdown());
    }
    if !summary.timings.is_empty() {
        line("## Median timings");
        line(
            "Medians of the raw measurements in each cell (every seed, distribution and repeat; \
             all of them are in timings.json), in nanoseconds, on the platform below. \
             Descriptive only: they vary by machine and run.",
        );
        line(&platform_table(manifest).to_markdown());
        line(&timing_table(summary).to_markdown());
    }
    let _ = writeln!(
        md,
        "![Relative error against payload bytes](error-vs-bytes.svg)"
    );
    md
}
