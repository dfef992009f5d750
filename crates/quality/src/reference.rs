//! The float32 pass's next-token distributions, which every run of a text is scored against
//! (its KL at each position).
//!
//! Kept as log-softmax rows (f64, one per scored position) while they fit in
//! [`ROWS_BUDGET_BYTES`]; past that (8,192 positions of SmolLM2 would take 3.2 GB, 768 of
//! Gemma 3 1.6 GB) the pass's hidden stream is kept instead, and each block of rows is
//! recomputed when a run is scored: the LM head computes every logit by one fixed sum whatever
//! the block, and the log-softmax is a function of its row, so both give the same bits (tested)
//! at the cost of a second LM head per run.

use std::borrow::Cow;
use std::ops::Range;

use models::CausalLm;
use models::llama::argmax;
use ndarray::{Array2, s};

use crate::QualityError;
use crate::metrics::log_softmax;

/// Most bytes of log-softmax rows kept per text.
pub const ROWS_BUDGET_BYTES: usize = 2 << 30;

/// A text's float32 distributions.
#[derive(Debug, Clone)]
pub enum Reference {
    /// Every scored position's log-softmax row.
    Rows(Vec<Vec<f64>>),
    /// The hidden stream the LM head reads, [tokens, hidden].
    Hidden(Array2<f32>),
}

/// What the float32 pass gives every run: the reference and, per scored position, the log-prob
/// of the next id and the argmax.
#[derive(Debug, Clone)]
pub struct Scored {
    /// The distributions.
    pub reference: Reference,
    /// ln p_f32(ids\[j + 1\] | ids\[..=j\]).
    pub logp: Vec<f64>,
    /// The f32 logits' argmax.
    pub argmax: Vec<u32>,
}

impl Reference {
    /// Scores the float32 pass whose hidden stream is `hidden` ([`crate::LOGIT_BLOCK`] positions
    /// of logits at a time), keeping rows when they fit in `budget` bytes.
    pub fn score(
        model: &dyn CausalLm,
        ids: &[u32],
        hidden: Array2<f32>,
        budget: usize,
    ) -> Result<Scored, QualityError> {
        let positions = ids.len().saturating_sub(1);
        let keep_rows = positions
            .checked_mul(model.vocab())
            .and_then(|n| n.checked_mul(8))
            .is_some_and(|bytes| bytes <= budget);
        let mut rows = Vec::new();
        let mut logp = Vec::with_capacity(positions);
        let mut maxes = Vec::with_capacity(positions);
        for block in blocks(positions) {
            for (j, ls, max) in block_rows(model, &hidden, block)? {
                logp.push(ls.get(ids[j + 1] as usize).copied().unwrap_or(f64::NAN));
                maxes.push(max);
                if keep_rows {
                    rows.push(ls);
                }
            }
        }
        let reference = if keep_rows {
            Reference::Rows(rows)
        } else {
            Reference::Hidden(hidden)
        };
        Ok(Scored {
            reference,
            logp,
            argmax: maxes,
        })
    }

    /// The log-softmax rows of positions `block`.
    pub fn rows(
        &self,
        model: &dyn CausalLm,
        block: Range<usize>,
    ) -> Result<Cow<'_, [Vec<f64>]>, QualityError> {
        match self {
            Reference::Rows(rows) => Ok(Cow::Borrowed(&rows[block])),
            Reference::Hidden(hidden) => Ok(Cow::Owned(
                block_rows(model, hidden, block)?
                    .into_iter()
                    .map(|(_, ls, _)| ls)
                    .collect(),
            )),
        }
    }
}

/// The scored positions in blocks of [`crate::LOGIT_BLOCK`].
pub fn blocks(positions: usize) -> impl Iterator<Item = Range<usize>> {
    (0..positions)
        .step_by(crate::LOGIT_BLOCK)
        .map(move |start| start..(start + crate::LOGIT_BLOCK).min(positions))
}

/// (position, log-softmax row, argmax) of each position of `block`, from `hidden`.
pub fn block_rows(
    model: &dyn CausalLm,
    hidden: &Array2<f32>,
    block: Range<usize>,
) -> Result<Vec<(usize, Vec<f64>, u32)>, QualityError> {
    let logits = model.logits(hidden.slice(s![block.clone(), ..]));
    block
        .enumerate()
        .map(|(r, j)| {
            let row = logits.row(r);
            let row = row
                .as_slice()
                .ok_or(QualityError::TooFewTokens(hidden.nrows()))?;
            Ok((j, log_softmax(row), argmax(row)))
        })
        .collect()
}
