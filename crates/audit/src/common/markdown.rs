//! summary.md read as a renderer reads it, for both evidence formats: CommonMark with GitHub's
//! tables, footnotes, task lists and strikethrough, through `pulldown-cmark`, into the only
//! blocks a summary may hold: headings, paragraphs, tables and the chart image. Anything else a
//! renderer could show or hide (HTML, comments included, links, lists, quotes, code blocks,
//! footnotes, an image with a title or inside other text) is refused by name. Figures in free
//! text are found by [`figures`].

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

pub use crate::common::problem::MarkdownProblem;
pub use crate::common::text::figures;

/// A block of the document, as far as the checks care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Block {
    Heading(u8, String),
    Paragraph(String),
    Table(Vec<Vec<String>>),
    Chart { alt: String, dest: String },
}

impl Block {
    pub(crate) fn describe(&self) -> String {
        match self {
            Block::Heading(level, text) => format!("heading {level} {text:?}"),
            Block::Paragraph(_) => "a paragraph".into(),
            Block::Table(rows) => format!(
                "a table headed {:?}",
                rows.first().map(|r| r.join(" | ")).unwrap_or_default()
            ),
            Block::Chart { dest, .. } => format!("an image of {dest:?}"),
        }
    }
}

/// Reads summary.md into blocks, or names the first element it does not allow.
pub(crate) fn blocks(text: &str) -> Result<Vec<Block>, MarkdownProblem> {
    let options = Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_GFM;
    let markup = |what: String| MarkdownProblem::Markup { what };
    let mut out = Vec::new();
    let mut text_buf = String::new();
    let mut table: Option<Vec<Vec<String>>> = None;
    let mut image: Option<(String, String)> = None;
    let mut in_image = false;
    for event in Parser::new_ext(text, options) {
        match event {
            Event::Start(Tag::Heading { .. } | Tag::Paragraph | Tag::TableCell) => text_buf.clear(),
            Event::Start(Tag::Table(_)) => table = Some(Vec::new()),
            Event::Start(Tag::TableHead | Tag::TableRow) => {
                table.get_or_insert_with(Vec::new).push(Vec::new());
            }
            Event::Start(Tag::Emphasis | Tag::Strong) => {}
            Event::Start(Tag::Image {
                dest_url, title, ..
            }) => {
                if !title.is_empty() || image.is_some() {
                    return Err(markup(format!(
                        "an image with a title or a second image ({dest_url})"
                    )));
                }
                image = Some((String::new(), dest_url.to_string()));
                in_image = true;
            }
            Event::End(TagEnd::Image) => in_image = false,
            Event::Start(other) => return Err(markup(format!("{other:?}"))),
            Event::End(TagEnd::Heading(level)) => {
                out.push(Block::Heading(level as u8, std::mem::take(&mut text_buf)))
            }
            Event::End(TagEnd::Paragraph) => match image.take() {
                Some((alt, dest)) if text_buf.trim() == alt.trim() => {
                    out.push(Block::Chart { alt, dest })
                }
                Some(_) => return Err(markup("an image inside other text".into())),
                None => out.push(Block::Paragraph(std::mem::take(&mut text_buf))),
            },
            Event::End(TagEnd::TableCell) => {
                if let Some(row) = table.as_mut().and_then(|t| t.last_mut()) {
                    row.push(std::mem::take(&mut text_buf).trim().to_string());
                }
            }
            Event::End(TagEnd::Table) => out.push(Block::Table(table.take().unwrap_or_default())),
            Event::End(_) => {}
            Event::Text(t) | Event::Code(t) => {
                text_buf.push_str(&t);
                if in_image && let Some((alt, _)) = image.as_mut() {
                    alt.push_str(&t);
                }
            }
            Event::SoftBreak | Event::HardBreak => text_buf.push(' '),
            other => return Err(markup(format!("{other:?}"))),
        }
    }
    Ok(out)
}

/// Compares a table read from summary.md with the audit's own rendering of it: the same shape
/// (rows and columns, header included), then every cell. Returns how many cells were compared
/// (none when the shapes differ) and the problem, if any: the shape, or the first differing cell.
pub(crate) fn compare_table(
    table: &'static str,
    got: &[Vec<String>],
    want: &[Vec<String>],
) -> (usize, Option<MarkdownProblem>) {
    let dims = |rows: &[Vec<String>]| (rows.len(), rows.first().map_or(0, Vec::len));
    let width = dims(want).1;
    if dims(got) != dims(want) || got.iter().any(|r| r.len() != width) {
        let problem = MarkdownProblem::TableShape {
            table,
            found: dims(got),
            expected: dims(want),
        };
        return (0, Some(problem));
    }
    let mut cells = 0;
    let mut first = None;
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        for (c, (gc, wc)) in g.iter().zip(w).enumerate() {
            cells += 1;
            if gc != wc && first.is_none() {
                first = Some(MarkdownProblem::Cell {
                    table,
                    row: r,
                    column: c,
                    found: gc.clone(),
                    expected: wc.clone(),
                });
            }
        }
    }
    (cells, first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_numbers_not_words_with_digits() {
        assert_eq!(
            figures("L2 error in float32 on x86_64"),
            Vec::<String>::new()
        );
        assert_eq!(
            figures("12 inputs, 8-bit, 13.4% and 1,024 B."),
            vec!["12", "8", "13.4%", "1,024"]
        );
    }

    #[test]
    fn html_and_links_are_refused() {
        for text in [
            "<!-- | 1 | -->\n",
            "[x](http://a)\n",
            "- item\n",
            "```\n1\n```\n",
            "a[^1]\n\n[^1]: 2\n",
        ] {
            assert!(
                matches!(blocks(text), Err(MarkdownProblem::Markup { .. })),
                "{text}"
            );
        }
    }

    #[test]
    fn a_table_reads_as_its_cells() {
        let parsed = blocks("# T\n\n| a | b |\n|---|--:|\n| 1 | 2,048 B |\n").unwrap();
        assert_eq!(
            parsed,
            vec![
                Block::Heading(1, "T".into()),
                Block::Table(vec![
                    vec!["a".into(), "b".into()],
                    vec!["1".into(), "2,048 B".into()]
                ]),
            ]
        );
    }
}
