//! summary.md: the run's tables in markdown, with the chart beside it.

use std::fmt::Write as _;

use crate::manifest::Manifest;
use crate::protocol::Protocol;
use crate::summary::{
    Summary, budget_table, packed_by_distribution_table, packed_table, timing_table,
};

pub fn summary_markdown(protocol: &Protocol, summary: &Summary, manifest: &Manifest) -> String {
    let mut md = String::new();
    let settings = protocol.settings.len();
    let policies = protocol.budget.as_ref().map_or(0, |b| b.policies.len());
    let inputs = protocol.inputs().len();
    writeln!(md, "# Run summary: {}\n", protocol.study).unwrap();
    writeln!(
        md,
        "{} seeds x {} lengths x {} distributions = {inputs} inputs; {settings} packed-KV settings \
         and {policies} budget policies on each: {} comparisons. Generator `{}`; D = {}, {} queries.\n",
        protocol.seeds.len(),
        protocol.tokens.len(),
        protocol.distributions.len(),
        inputs * (settings + policies),
        protocol.generator.name.name(),
        protocol.features,
        protocol.queries,
    )
    .unwrap();
    writeln!(
        md,
        "Inputs are synthetic standard-normal draws, not KV from a trained model, and nothing here \
         measures model quality. `early_focus` and `recent_focus` (keys shifted towards the mean \
         query over the first or last {} tokens) are this project's conditions.\n",
        protocol.focus.window
    )
    .unwrap();

    writeln!(md, "## Packed KV\n").unwrap();
    writeln!(
        md,
        "Mean relative L2 error of the attention output over the clean inputs, and the K+V \
         payload (codes + f32 scales + two i32 shape values per tensor):\n"
    )
    .unwrap();
    writeln!(md, "{}\n", packed_table(protocol, summary).to_markdown()).unwrap();
    writeln!(
        md,
        "The same settings on every distribution (mean over seeds and lengths):\n"
    )
    .unwrap();
    writeln!(
        md,
        "{}\n",
        packed_by_distribution_table(protocol, summary).to_markdown()
    )
    .unwrap();

    if let Some(budget) = &protocol.budget {
        writeln!(md, "## Recent-token precision budget\n").unwrap();
        writeln!(
            md,
            "Group {}, {}-bit everywhere except a window of W = {} tokens at the start (`early*`) \
             or the end (`recent*`) of the cache, kept 8-bit or float32; each part is stored as \
             its own segment. Mean relative L2 error over seeds and lengths:\n",
            budget.group_size, budget.low_bits, budget.window
        )
        .unwrap();
        writeln!(md, "{}\n", budget_table(protocol, summary).to_markdown()).unwrap();
    }

    if !summary.timings.is_empty() {
        let per_cell = summary.timings.first().map_or(0, |t| t.measurements);
        writeln!(md, "## Median timings\n").unwrap();
        writeln!(
            md,
            "Median of {per_cell} raw measurements per cell (every seed and distribution, every \
             repeat; all of them are in timings.json), in ns, on {} ({}, {} build). Descriptive \
             only: they vary by machine and run.\n",
            manifest.platform.target, manifest.tool.rustc, manifest.tool.profile
        )
        .unwrap();
        writeln!(md, "{}\n", timing_table(summary).to_markdown()).unwrap();
    }
    writeln!(
        md,
        "![Relative error against payload bytes](error-vs-bytes.svg)"
    )
    .unwrap();
    md
}
