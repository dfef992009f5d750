//! The attention half of a block: splitting projections into heads, RoPE, and causal
//! grouped-query attention over K/V arrays or over a [`KvSource`].

use ndarray::{Array2, Array3, Axis, s};
use rayon::prelude::*;

use super::source::KvSource;
use crate::ops;

/// [tokens, heads * head_dim] -> [heads, tokens, head_dim].
pub(super) fn split_heads(y: Array2<f32>, heads: usize) -> Array3<f32> {
    let (t, width) = y.dim();
    let d = width / heads;
    Array3::from_shape_fn((heads, t, d), |(h, i, j)| y[[i, h * d + j]])
}

/// cos and sin of pos * base^(-2i / head_dim) for pos = start..start + t, [t, head_dim / 2],
/// computed in f64 with `libm` and rounded once to f32.
pub(crate) fn rope_table(
    start: usize,
    t: usize,
    head_dim: usize,
    base: f32,
) -> (Array2<f32>, Array2<f32>) {
    let half = head_dim / 2;
    let freq: Vec<f64> = (0..half)
        .map(|i| libm::pow(f64::from(base), -((2 * i) as f64) / head_dim as f64))
        .collect();
    let angle = |row: usize, i: usize| (start + row) as f64 * freq[i];
    (
        Array2::from_shape_fn((t, half), |(p, i)| libm::cos(angle(p, i)) as f32),
        Array2::from_shape_fn((t, half), |(p, i)| libm::sin(angle(p, i)) as f32),
    )
}

/// Rotates channel pairs (2i, 2i + 1) of every head and position in place.
pub(super) fn rope(x: &mut Array3<f32>, cos: &Array2<f32>, sin: &Array2<f32>) {
    for mut head in x.axis_iter_mut(Axis(0)) {
        for (pos, mut row) in head.axis_iter_mut(Axis(0)).enumerate() {
            for i in 0..cos.ncols() {
                let (c, s) = (cos[[pos, i]], sin[[pos, i]]);
                let (a, b) = (row[2 * i], row[2 * i + 1]);
                row[2 * i] = a * c - b * s;
                row[2 * i + 1] = a * s + b * c;
            }
        }
    }
}

/// Positions of one attention task: a KV head's query heads at this many consecutive
/// positions. Small enough that two cores share the late, costly positions evenly; large
/// enough that a task's list of rows is cheap beside its work.
const POSITIONS_PER_TASK: usize = 64;

/// Causal grouped-query attention: q [heads, T, d] for positions start..start + T, k and v
/// [kv_heads, start + T, d] (standard layout) -> [T, heads * d]. The query heads that share a
/// KV head are attended together ([`ops::attend_rows`]: its rows are read once for all of
/// them), in tasks of [`POSITIONS_PER_TASK`] positions run in parallel; each output is
/// computed in one fixed order, whatever the threads.
pub(super) fn attention(
    q: &Array3<f32>,
    k: &Array3<f32>,
    v: &Array3<f32>,
    start: usize,
) -> Array2<f32> {
    let (heads, t, d) = q.dim();
    let kv_heads = k.dim().0;
    let group = heads / kv_heads;
    let scale = 1.0 / (d as f32).sqrt();
    let q = q.as_standard_layout();
    let q = q.as_slice().expect("standard layout");
    let parts: Vec<Vec<f32>> = tasks(kv_heads, t)
        .into_par_iter()
        .map(|(kv, positions)| {
            let k = k.index_axis(Axis(0), kv);
            let v = v.index_axis(Axis(0), kv);
            let k = k.to_slice().expect("standard layout");
            let v = v.to_slice().expect("standard layout");
            let keys: Vec<&[f32]> = k.chunks_exact(d).collect();
            let values: Vec<&[f32]> = v.chunks_exact(d).collect();
            let mut out = vec![0f32; positions.len() * group * d];
            let mut scores = Vec::with_capacity(group * (start + positions.end));
            for (i, row) in positions.zip(out.chunks_exact_mut(group * d)) {
                let queries = query_rows(q, (t, d), kv * group..(kv + 1) * group, i);
                let seen = start + i + 1;
                ops::attend_rows(
                    &queries,
                    &keys[..seen],
                    &values[..seen],
                    scale,
                    &mut scores,
                    row,
                );
            }
            out
        })
        .collect();
    assemble(parts, (kv_heads, group, t, d), |_| None)
}

/// The tasks of [`attention`]: (KV head, positions), every KV head's positions 0..t in runs of
/// [`POSITIONS_PER_TASK`].
fn tasks(kv_heads: usize, t: usize) -> Vec<(usize, std::ops::Range<usize>)> {
    (0..kv_heads)
        .flat_map(|kv| {
            (0..t)
                .step_by(POSITIONS_PER_TASK)
                .map(move |i| (kv, i..(i + POSITIONS_PER_TASK).min(t)))
        })
        .collect()
}

/// The rows of query heads `heads` at position `i`, from q's [heads, t, d] values.
fn query_rows(
    q: &[f32],
    (t, d): (usize, usize),
    heads: std::ops::Range<usize>,
    i: usize,
) -> Vec<&[f32]> {
    heads.map(|h| &q[(h * t + i) * d..][..d]).collect()
}

/// [T, heads * d] from the tasks' outputs, in [`tasks`] order, skipping KV heads that
/// `whole(kv)` gives whole ([group * T, d], query head by query head). A task's output holds,
/// position by position, its KV head's query heads side by side: the columns they take in the
/// result.
fn assemble<'a>(
    parts: Vec<Vec<f32>>,
    (kv_heads, group, t, d): (usize, usize, usize, usize),
    whole: impl Fn(usize) -> Option<&'a Array2<f32>>,
) -> Array2<f32> {
    let width = group * d;
    let mut out = Array2::<f32>::zeros((t, kv_heads * width));
    let mut parts = parts.into_iter();
    for kv in 0..kv_heads {
        let columns = kv * width..(kv + 1) * width;
        if let Some(rows) = whole(kv) {
            for g in 0..group {
                out.slice_mut(s![.., columns.start + g * d..columns.start + (g + 1) * d])
                    .assign(&rows.slice(s![g * t..(g + 1) * t, ..]));
            }
            continue;
        }
        let mut i = 0;
        while i < t {
            let part = parts.next().expect("one output per task");
            for row in part.chunks_exact(width) {
                out.slice_mut(s![i, columns.clone()])
                    .assign(&ndarray::ArrayView1::from(row));
                i += 1;
            }
        }
    }
    out
}

/// NeoX RoPE in place (Gemma 3's): channel i of each head and position rotates with channel
/// i + d/2.
pub(crate) fn rope_neox(x: &mut Array3<f32>, cos: &Array2<f32>, sin: &Array2<f32>) {
    let half = cos.ncols();
    for mut head in x.axis_iter_mut(Axis(0)) {
        for (pos, mut row) in head.axis_iter_mut(Axis(0)).enumerate() {
            for i in 0..half {
                let (c, s) = (cos[[pos, i]], sin[[pos, i]]);
                let (a, b) = (row[i], row[i + half]);
                row[i] = a * c - b * s;
                row[i + half] = a * s + b * c;
            }
        }
    }
}

/// [`attention`] over positions 0..T with rows from `source`: the same scores, softmax and
/// weighted sums in the same order. Query i reads positions `first_visible(i)..=i` (0 for a
/// global layer; a sliding-window layer's first position in its window). A row that is not
/// `head_dim` long is refused. Where every query reads from position 0, each KV head is first
/// offered to [`KvSource::attend`], and its query heads take what the source computes.
pub(crate) fn attention_from(
    q: &Array3<f32>,
    source: &dyn KvSource,
    kv_heads: usize,
    first_visible: &(dyn Fn(usize) -> usize + Sync),
) -> Result<Array2<f32>, String> {
    let (heads, t, d) = q.dim();
    let group = heads / kv_heads;
    let scale = 1.0 / (d as f32).sqrt();
    let from_start = (0..t).all(|i| first_visible(i) == 0);
    let attended: Vec<Option<Array2<f32>>> = if from_start {
        (0..kv_heads)
            .into_par_iter()
            .map(|kv| attended_by_source(q, source, kv, group, scale))
            .collect::<Result<_, _>>()?
    } else {
        vec![None; kv_heads]
    };
    let q_standard = q.as_standard_layout();
    let q_values = q_standard.as_slice().expect("standard layout");
    let parts: Vec<Result<Vec<f32>, String>> = tasks(kv_heads, t)
        .into_par_iter()
        .filter(|(kv, _)| attended[*kv].is_none())
        .map(|(kv, positions)| {
            let ask = RowsAsked {
                source,
                kv,
                heads: kv * group..(kv + 1) * group,
                d,
            };
            ask.attend(q_values, t, positions, scale, first_visible)
        })
        .collect();
    // The first refusal in task order, whatever the threads.
    let parts = parts.into_iter().collect::<Result<_, _>>()?;
    Ok(assemble(parts, (kv_heads, group, t, d), |kv| {
        attended[kv].as_ref()
    }))
}

/// What `source` computes for KV head `kv` ([`KvSource::attend`]): the rows of its `group`
/// query heads, head by head, or `None`.
fn attended_by_source(
    q: &Array3<f32>,
    source: &dyn KvSource,
    kv: usize,
    group: usize,
    scale: f32,
) -> Result<Option<Array2<f32>>, String> {
    let (_, t, d) = q.dim();
    let rows = group * t;
    let queries = Array2::from_shape_fn((rows, d), |(r, j)| q[[kv * group + r / t, r % t, j]]);
    let visible: Vec<usize> = (0..rows).map(|r| r % t + 1).collect();
    match source.attend(kv, queries.view(), &visible, scale) {
        None => Ok(None),
        Some(Ok(out)) if out.dim() == (rows, d) => Ok(Some(out)),
        Some(Ok(out)) => Err(format!(
            "the attention of KV head {kv} has shape {:?}, not {rows} x {d}",
            out.dim()
        )),
        Some(Err(e)) => Err(e),
    }
}

/// The query heads `heads` that read KV head `kv` of `source`, with rows of `d` values.
struct RowsAsked<'a> {
    source: &'a dyn KvSource,
    kv: usize,
    heads: std::ops::Range<usize>,
    d: usize,
}

impl RowsAsked<'_> {
    /// The query heads at `positions` over the key and value rows the source gives each
    /// position (the rows are asked once per position, for every query head), side by side per
    /// position as [`assemble`] takes them.
    fn attend(
        &self,
        q: &[f32],
        t: usize,
        positions: std::ops::Range<usize>,
        scale: f32,
        first_visible: &(dyn Fn(usize) -> usize + Sync),
    ) -> Result<Vec<f32>, String> {
        let (kv, d) = (self.kv, self.d);
        let width = self.heads.len() * d;
        let mut out = vec![0f32; positions.len() * width];
        let mut scores = Vec::new();
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for (i, row) in positions.zip(out.chunks_exact_mut(width)) {
            let first = first_visible(i).min(i);
            keys.clear();
            values.clear();
            for j in first..=i {
                keys.push(self.row(self.source.key(kv, i, j), "key", (i, j))?);
            }
            for j in first..=i {
                values.push(self.row(self.source.value(kv, i, j), "value", (i, j))?);
            }
            let queries = query_rows(q, (t, d), self.heads.clone(), i);
            ops::attend_rows(&queries, &keys, &values, scale, &mut scores, row);
        }
        Ok(out)
    }

    /// `row`, if it has `d` values.
    fn row<'r>(
        &self,
        row: &'r [f32],
        what: &str,
        (i, j): (usize, usize),
    ) -> Result<&'r [f32], String> {
        if row.len() == self.d {
            return Ok(row);
        }
        Err(format!(
            "the {what} of head {} at position {j} for query {i} has {} values, not {}",
            self.kv,
            row.len(),
            self.d
        ))
    }
}
