//! The speed goals of issue 11, as ratios to the memcpy of the same run, and how a run's rows
//! measure up to them: for each goal, its cases, the slowest of them, and whether it was met.
//!
//! The goals against ggml are stated as ratios to memcpy from the issue's own measurements of
//! ggml on a 2-vCPU Zen 3 (memcpy 11 GB/s): its reference Q4_0 quantizer ran at about 0.25x
//! memcpy (so 2x of it is 0.5x), its AVX2 Q8_0 quantizer at about 0.9x, and its Q4_0 and Q8_0
//! dequantizers at about 0.44x and 0.62x. ggml itself is not built here.

use tabled::builder::Builder;
use tabled::settings::object::Columns;
use tabled::settings::{Alignment, Style};

use crate::cases::Measured;
use crate::report::Row;

/// One goal: the cases it covers and the ratio to memcpy each of them must reach.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub name: &'static str,
    pub covers: fn(&Measured) -> bool,
    pub ratio: f64,
}

/// Every goal of the issue, in the order docs/speed.md lists them.
pub const TARGETS: &[Target] = &[
    Target {
        name: "KV encode, feature axis",
        covers: |m| kv(m, "encode", "feature"),
        ratio: 0.7,
    },
    Target {
        name: "KV encode, token axis",
        covers: |m| kv(m, "encode", "token"),
        ratio: 0.5,
    },
    Target {
        name: "KV decode to f32, feature axis",
        covers: |m| kv(m, "decode", "feature"),
        ratio: 1.0,
    },
    Target {
        name: "KV decode to f32, token axis",
        covers: |m| kv(m, "decode", "token"),
        ratio: 0.6,
    },
    Target {
        name: "Q4_0 quantize (2x ggml's reference)",
        covers: |m| m.format == "Q4_0" && m.op == "quantize",
        ratio: 0.5,
    },
    Target {
        name: "Q8_0 quantize (ggml's AVX2)",
        covers: |m| m.format == "Q8_0" && m.op == "quantize",
        ratio: 0.9,
    },
    Target {
        name: "Q4_0 dequantize (ggml's)",
        covers: |m| m.format == "Q4_0" && m.op == "dequantize",
        ratio: 0.44,
    },
    Target {
        name: "Q8_0 dequantize (ggml's)",
        covers: |m| m.format == "Q8_0" && m.op == "dequantize",
        ratio: 0.62,
    },
    Target {
        name: "GPTQ and AWQ pack and unpack",
        covers: |m| m.format == "gptq" || m.format == "awq",
        ratio: 0.5,
    },
    Target {
        name: "b-bit streams, bytes and words",
        covers: |m| m.format.starts_with("stream_"),
        ratio: 0.5,
    },
];

fn kv(m: &Measured, op: &str, axis: &str) -> bool {
    m.format == "kv" && m.op == op && m.axis == Some(axis)
}

/// How a run's rows measure up to one goal.
#[derive(Debug, Clone)]
pub struct Outcome<'a> {
    pub target: &'a Target,
    /// Rows the goal covers.
    pub cases: usize,
    /// The slowest of them (by ratio), if any ran.
    pub slowest: Option<&'a Row>,
}

impl Outcome<'_> {
    /// Every covered case reached the goal (false when none ran).
    pub fn met(&self) -> bool {
        self.slowest
            .is_some_and(|row| row.ratio >= self.target.ratio)
    }
}

/// Each goal with the rows that ran (goals whose family did not run have no cases).
pub fn outcomes(rows: &[Row]) -> Vec<Outcome<'_>> {
    TARGETS
        .iter()
        .map(|target| {
            let covered = rows.iter().filter(|row| (target.covers)(&row.case));
            Outcome {
                target,
                cases: covered.clone().count(),
                slowest: covered.min_by(|a, b| a.ratio.total_cmp(&b.ratio)),
            }
        })
        .collect()
}

/// The goals that had cases, as a markdown table: goal, cases, slowest case, its ratio, met.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut builder = Builder::default();
    builder.push_record([
        "goal",
        "x memcpy",
        "cases",
        "slowest case",
        "its x memcpy",
        "met",
    ]);
    for outcome in outcomes {
        let Some(slowest) = outcome.slowest else {
            continue;
        };
        builder.push_record([
            outcome.target.name.to_string(),
            format!("{:.2}", outcome.target.ratio),
            outcome.cases.to_string(),
            describe(&slowest.case),
            format!("{:.2}", slowest.ratio),
            if outcome.met() { "yes" } else { "no" }.to_string(),
        ]);
    }
    let mut table = builder.build();
    table
        .with(Style::markdown())
        .modify(Columns::new(1..3), Alignment::right())
        .modify(Columns::new(4..5), Alignment::right());
    table.to_string()
}

/// A case in a few words: "asymmetric 3-bit g8", "4-bit pack".
fn describe(case: &Measured) -> String {
    let mut words = Vec::new();
    if let Some(mode) = case.mode {
        words.push(mode.to_string());
    }
    if let Some(bits) = case.bits {
        words.push(format!("{bits}-bit"));
    }
    if let Some(group) = case.group_size {
        words.push(format!("g{group}"));
    }
    words.push(format!("{} {}", case.format, case.op));
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(op: &'static str, format: &'static str, axis: Option<&'static str>, ratio: f64) -> Row {
        let case = Measured {
            op,
            format,
            mode: Some("symmetric"),
            axis,
            bits: Some(4),
            group_size: Some(32),
            bytes: 1 << 20,
            median_s: 1e-3,
            memcpy_gbps: 1.0,
        };
        let mut row = Row::new(case, 1);
        row.ratio = ratio;
        row
    }

    #[test]
    fn a_goal_is_met_only_when_its_slowest_case_reaches_it() {
        let rows = [
            row("encode", "kv", Some("feature"), 0.9),
            row("encode", "kv", Some("feature"), 0.65),
            row("encode", "kv", Some("token"), 0.55),
        ];
        let outcomes = outcomes(&rows);
        let feature = &outcomes[0];
        assert_eq!(feature.cases, 2);
        assert_eq!(feature.slowest.map(|r| r.ratio), Some(0.65));
        assert!(!feature.met(), "0.65 < 0.7");
        assert!(outcomes[1].met(), "0.55 >= 0.5 on the token axis");
        // No decode ran: no cases, not met, and left out of the table.
        assert_eq!(outcomes[2].cases, 0);
        assert!(!outcomes[2].met());
        let table = table(&outcomes);
        assert!(table.contains("KV encode, token axis"));
        assert!(!table.contains("KV decode"));
    }

    #[test]
    fn every_case_family_has_a_goal() {
        for (op, format, axis) in [
            ("encode", "kv", Some("feature")),
            ("decode", "kv", Some("token")),
            ("quantize", "Q4_0", None),
            ("dequantize", "Q8_0", None),
            ("unpack", "awq", None),
            ("pack", "stream_words", None),
        ] {
            let r = row(op, format, axis, 1.0);
            let goals = TARGETS.iter().filter(|t| (t.covers)(&r.case)).count();
            assert_eq!(goals, 1, "{format} {op}");
        }
    }
}
