//! A measured case set against memcpy: the JSON line `bench --json` prints and the table row.

use serde::Serialize;
use tabled::builder::Builder;
use tabled::settings::object::Columns;
use tabled::settings::{Alignment, Style};

use crate::cases::Measured;

/// One case, as `--json` prints it (one object per line).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub case: Measured,
    /// `bytes / median_s`, in 10^9 bytes per second.
    pub gbps: f64,
    /// The memcpy reference timed in alternation with the case (its rounds' ratios' median is
    /// `ratio`), in 10^9 bytes per second; or, for a case timed alone, the run's.
    pub memcpy_gbps: f64,
    /// `gbps / memcpy_gbps`.
    pub ratio: f64,
    /// Slices run at once.
    pub threads: usize,
}

impl Row {
    pub fn new(case: Measured, threads: usize) -> Row {
        let gbps = case.bytes as f64 / case.median_s / 1e9;
        let memcpy_gbps = case.memcpy_gbps;
        Row {
            case,
            gbps,
            memcpy_gbps,
            ratio: gbps / memcpy_gbps,
            threads,
        }
    }
}

/// The rows as an aligned text table.
pub fn table(rows: &[Row]) -> String {
    let mut builder = Builder::default();
    builder.push_record([
        "format", "op", "mode", "axis", "bits", "group", "MiB", "GB/s", "x memcpy",
    ]);
    let dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    for row in rows {
        let case = &row.case;
        builder.push_record([
            case.format.to_string(),
            case.op.to_string(),
            dash(case.mode.map(str::to_string)),
            dash(case.axis.map(str::to_string)),
            dash(case.bits.map(|b| b.to_string())),
            dash(case.group_size.map(|g| g.to_string())),
            format!("{}", case.bytes >> 20),
            format!("{:.2}", row.gbps),
            format!("{:.2}", row.ratio),
        ]);
    }
    let mut table = builder.build();
    table
        .with(Style::markdown())
        .modify(Columns::new(4..), Alignment::right());
    table.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_its_bytes_over_its_time_against_memcpy() {
        let case = Measured {
            op: "encode",
            format: "kv",
            mode: Some("symmetric"),
            axis: Some("token"),
            bits: Some(4),
            group_size: Some(32),
            bytes: 2_000_000_000,
            median_s: 0.5,
            memcpy_gbps: 10.0,
        };
        let row = Row::new(case, 1);
        assert_eq!((row.gbps, row.ratio), (4.0, 0.4));
        let json = serde_json::to_value(&row).unwrap();
        for key in [
            "op",
            "format",
            "mode",
            "axis",
            "bits",
            "group_size",
            "bytes",
            "median_s",
            "gbps",
            "memcpy_gbps",
            "ratio",
        ] {
            assert!(json.get(key).is_some(), "{key}");
        }
        assert!(table(&[row]).contains("| kv "));
    }
}
