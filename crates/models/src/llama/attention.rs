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

/// Causal grouped-query attention: q [heads, T, d] for positions start..start + T, k and v
/// [kv_heads, start + T, d] (standard layout) -> [T, heads * d]. Heads run in parallel; each
/// output is computed in one fixed order.
pub(super) fn attention(
    q: &Array3<f32>,
    k: &Array3<f32>,
    v: &Array3<f32>,
    start: usize,
) -> Array2<f32> {
    let (heads, t, d) = q.dim();
    let group = heads / k.dim().0;
    let scale = 1.0 / (d as f32).sqrt();
    let per_head: Vec<Array2<f32>> = (0..heads)
        .into_par_iter()
        .map(|h| {
            let q = q.index_axis(Axis(0), h);
            let k = k.index_axis(Axis(0), h / group);
            let v = v.index_axis(Axis(0), h / group);
            let k = k.to_slice().expect("standard layout");
            let v = v.to_slice().expect("standard layout");
            let mut out = Array2::<f32>::zeros((t, d));
            let k_rows: Vec<&[f32]> = k.chunks_exact(d).collect();
            let v_rows: Vec<&[f32]> = v.chunks_exact(d).collect();
            let mut scores = Vec::with_capacity(start + t);
            for (i, mut row) in out.outer_iter_mut().enumerate() {
                let qi = q.row(i);
                let qi = qi.as_slice().expect("standard layout");
                let seen = start + i + 1;
                let row = row.as_slice_mut().expect("standard layout");
                ops::attend_row(
                    qi,
                    &k_rows[..seen],
                    &v_rows[..seen],
                    scale,
                    &mut scores,
                    row,
                );
            }
            out
        })
        .collect();
    let mut out = Array2::<f32>::zeros((t, heads * d));
    for (h, part) in per_head.iter().enumerate() {
        out.slice_mut(s![.., h * d..(h + 1) * d]).assign(part);
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
    let per_head: Vec<Result<Array2<f32>, String>> = (0..heads)
        .into_par_iter()
        .map(|h| match &attended[h / group] {
            Some(rows) => {
                let first = (h % group) * t;
                Ok(rows.slice(s![first..first + t, ..]).to_owned())
            }
            None => head_from_rows(q, source, (h, h / group), scale, first_visible),
        })
        .collect();
    let mut out = Array2::<f32>::zeros((t, heads * d));
    for (h, part) in per_head.into_iter().enumerate() {
        out.slice_mut(s![.., h * d..(h + 1) * d]).assign(&part?);
    }
    Ok(out)
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

/// Query head `h` (reading KV head `kv`) over key and value rows from `source`.
fn head_from_rows(
    q: &Array3<f32>,
    source: &dyn KvSource,
    (h, kv): (usize, usize),
    scale: f32,
    first_visible: &(dyn Fn(usize) -> usize + Sync),
) -> Result<Array2<f32>, String> {
    let (_, t, d) = q.dim();
    let q = q.index_axis(Axis(0), h);
    let mut out = Array2::<f32>::zeros((t, d));
    let mut scores = Vec::with_capacity(t);
    let (mut keys, mut values) = (Vec::with_capacity(t), Vec::with_capacity(t));
    for (i, mut row) in out.outer_iter_mut().enumerate() {
        let qi = q.row(i);
        let qi = qi.as_slice().expect("standard layout");
        let first = first_visible(i).min(i);
        keys.clear();
        values.clear();
        for j in first..=i {
            let k = source.key(kv, i, j);
            if k.len() != d {
                return Err(format!(
                    "the key of head {kv} at position {j} for query {i} has {} values, not {d}",
                    k.len()
                ));
            }
            keys.push(k);
        }
        for j in first..=i {
            let v = source.value(kv, i, j);
            if v.len() != d {
                return Err(format!(
                    "the value of head {kv} at position {j} for query {i} has {} values, not \
                     {d}",
                    v.len()
                ));
            }
            values.push(v);
        }
        let row = row.as_slice_mut().expect("standard layout");
        ops::attend_row(qi, &keys, &values, scale, &mut scores, row);
    }
    Ok(out)
}
