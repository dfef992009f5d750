//! Tables as a header and rows of cells, rendered as aligned text (for the terminal) or as
//! markdown (for summary.md), by tabled.

use tabled::builder::Builder;
use tabled::settings::object::Columns;
use tabled::settings::{Alignment, Style};

/// A table as header + rows of cells, rendered as aligned text or as markdown.
pub struct Table {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    fn build(&self) -> tabled::Table {
        let mut builder = Builder::default();
        builder.push_record(self.headers.clone());
        for row in &self.rows {
            builder.push_record(row.clone());
        }
        builder.build()
    }

    pub fn to_text(&self) -> String {
        let mut table = self.build();
        table
            .with(Style::blank())
            .modify(Columns::new(0..), Alignment::right());
        let text = table.to_string();
        let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
        lines.join("\n")
    }

    pub fn to_markdown(&self) -> String {
        let mut table = self.build();
        table
            .with(Style::markdown())
            .modify(Columns::new(1..), Alignment::right());
        table.to_string()
    }
}
