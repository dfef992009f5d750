//! The study's table: per setting, the mean relative L2 error over the clean inputs and the K+V
//! payload at each length, beside the float32 bytes. This is the published table's shape.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::protocol::{Distribution, Protocol};
use crate::study::{ResultRow, float32_kv_bytes};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub about: String,
    /// Float32 K+V bytes per length (keys are token counts).
    pub float32_kv_bytes: BTreeMap<String, usize>,
    pub rows: Vec<SummaryRow>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryRow {
    pub group_size: usize,
    pub bits: u32,
    /// Number of clean inputs averaged.
    pub clean_inputs: usize,
    /// Mean relative L2 over the clean inputs (a fraction); null without clean inputs.
    pub mean_relative_l2_clean: Option<f64>,
    /// The same in percent, rounded to three decimals, as printed.
    pub mean_relative_l2_clean_percent: Option<String>,
    /// K+V payload per length (keys are token counts).
    pub payload_bytes: BTreeMap<String, usize>,
}

/// Builds the table from a run's rows.
pub fn summarize(protocol: &Protocol, rows: &[ResultRow]) -> Summary {
    let table_rows = protocol
        .settings
        .iter()
        .map(|s| {
            let mine: Vec<&ResultRow> = rows
                .iter()
                .filter(|r| r.group_size == s.group_size && r.bits == s.bits)
                .collect();
            let clean: Vec<f64> = mine
                .iter()
                .filter(|r| r.distribution == Distribution::Clean.name())
                .map(|r| r.relative_l2)
                .collect();
            let mean = (!clean.is_empty()).then(|| clean.iter().sum::<f64>() / clean.len() as f64);
            let payload_bytes = protocol
                .tokens
                .iter()
                .filter_map(|&n| {
                    mine.iter()
                        .find(|r| r.tokens == n)
                        .map(|r| (n.to_string(), r.payload_bytes))
                })
                .collect();
            SummaryRow {
                group_size: s.group_size,
                bits: s.bits,
                clean_inputs: clean.len(),
                mean_relative_l2_clean: mean,
                mean_relative_l2_clean_percent: mean.map(|m| format!("{:.3}", m * 100.0)),
                payload_bytes,
            }
        })
        .collect();
    Summary {
        about: "Per setting: mean relative L2 attention-output error over the clean inputs, and \
                the K+V payload (codes + f32 scales + two i32 shape values per tensor) per length."
            .into(),
        float32_kv_bytes: protocol
            .tokens
            .iter()
            .map(|&n| (n.to_string(), float32_kv_bytes(n, protocol.features)))
            .collect(),
        rows: table_rows,
    }
}

/// The table as printed at the end of a run.
pub fn render(protocol: &Protocol, summary: &Summary) -> String {
    let mut out = String::new();
    let mut header = format!(
        "{:>5}  {:>4}  {:>22}",
        "group", "bits", "rel. error (clean mean)"
    );
    for n in &protocol.tokens {
        header.push_str(&format!("  {:>14}", format!("payload N={n}")));
    }
    writeln!(out, "{header}").unwrap();
    for row in &summary.rows {
        let error = row
            .mean_relative_l2_clean_percent
            .as_ref()
            .map_or("n/a".to_string(), |p| format!("{p}%"));
        let mut line = format!("{:>5}  {:>4}  {:>23}", row.group_size, row.bits, error);
        for n in &protocol.tokens {
            let bytes = row.payload_bytes.get(&n.to_string()).copied().unwrap_or(0);
            line.push_str(&format!("  {:>14}", format!("{} B", thousands(bytes))));
        }
        writeln!(out, "{line}").unwrap();
    }
    let mut line = format!("{:>5}  {:>4}  {:>23}", "f32", "32", "0.000%");
    for n in &protocol.tokens {
        let bytes = float32_kv_bytes(*n, protocol.features);
        line.push_str(&format!("  {:>14}", format!("{} B", thousands(bytes))));
    }
    writeln!(out, "{line}").unwrap();
    out
}

/// 8208 -> "8,208".
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_separators() {
        assert_eq!(super::thousands(8208), "8,208");
        assert_eq!(super::thousands(131072), "131,072");
        assert_eq!(super::thousands(999), "999");
        assert_eq!(super::thousands(1000000), "1,000,000");
    }
}
