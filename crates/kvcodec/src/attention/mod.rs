//! Attention read straight from a packed cache: the scores q·K over a K cache packed per
//! channel (grouped along tokens) and the weighted sum over a V cache packed per token (grouped
//! along features), dequantized in registers, with an online softmax, so that nothing of size
//! N x D is ever decoded. One call serves one KV head and every query row that reads it (the
//! query heads of a GQA or MQA group, and the positions of a prefill chunk), so the cache is
//! read from memory once per call.
//!
//! # What every kernel computes
//!
//! Inputs: queries Q x D (f32, finite); `visible[i]` in 1..=N, the tokens query i attends to
//! (N for a decode step, its position + 1 in a causal prefill chunk); K and V packed N x D of
//! any width and mode, K along tokens in groups that are a multiple of 32 tokens, V along
//! features in groups that are a multiple of 8, D a multiple of 8; the softmax scale (finite,
//! positive; 1/sqrt(D) for a standard head). Let `c - o` be a stored code minus its group's
//! offset (qmax, or the zero point), an exact small integer, and `sK`, `sV` the group scales.
//! Every product and sum below is one f32 operation, in the order written, and `fma(a, b, c)`
//! is `a * b + c` rounded once; that is what makes the portable and AVX2 kernels, and every
//! thread count, give the same bits:
//!
//! 1. `qs[i][d] = q[i][d] * scale`.
//! 2. Query rows are taken [`QUERY_TILE`] at a time; a tile's tokens (up to the last its rows
//!    see) are cut into splits of [`SPLIT_TOKENS`], each into blocks of [`BLOCK_TOKENS`]; a
//!    split keeps per query a state (m, l, acc\[D\]), starting at (-inf, 0, 0).
//! 3. Scores of a block: from `s = 0`, for d = 0, 1, ..: `s = fma((c - o)K[d][t], qs[i][d] *
//!    sK[d][g], s)`, with g the token's group; tokens at or past `visible[i]` are masked. (A
//!    packed K's scores are computed a pass of [`PASS_TOKENS`] at a time, channel by channel;
//!    each score is still this sum in this order.)
//! 4. `m' = max(m, unmasked scores)` (a block with none is skipped); `corr = exp(m - m')`, 0 when
//!    m is -inf; `p[t] = exp(s[t] - m')`, 0 when masked; [`exp()`] is this crate's own.
//! 5. `l = l * corr + sum8(p)`: `p[t]` is added into lane t mod 8 in token order, and the lanes
//!    are added as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
//! 6. `acc[d] = acc[d] * corr`, then for each token in order `acc[d] = fma((c - o)V[t][d],
//!    p[t] * sV[t][h], acc[d])`, with h the feature's group (masked tokens add a zero).
//! 7. Splits merge in token order: `m = max(mA, mB)`, `l = lA * exp(mA - m) + lB * exp(mB - m)`,
//!    acc likewise element by element (a split with m = -inf leaves the other unchanged).
//! 8. `out[i][d] = acc[d] / l`.
//!
//! [`attend_dense`] is the same computation over an unpacked f32 cache (N x D, row-major), the
//! baseline a packed cache is measured against: step 3 is `lane = fma(qs[i][d], K[t][d],
//! lane)` into lane d mod 8, lanes added as in step 5, and step 6 is `acc[d] = fma(V[t][d],
//! p[t], acc[d])`. The [`Kernel`]s: portable (everywhere), AVX2 with FMA, and AVX-512F for 2-,
//! 4- and 8-bit codes ([`available`] says which this CPU runs); all give the same bits.
//! [`attend_reference`] decodes the cache exactly (f64) and attends in f64 with the row maximum
//! subtracted and the platform's `exp`: the oracle the kernels are held to (1e-5 relative).
//!
//! Tiles and splits run in parallel on the current rayon pool; their sizes, and the merge order,
//! do not depend on the number of threads.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod exp;
pub mod fma;
mod portable;
pub mod reference;

use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;
use thiserror::Error;

use crate::layout::{GroupAxis, Mode};
use crate::packed::PackedTensor;

pub use exp::exp;
pub use reference::attend_reference;

/// Tokens per split: the unit of parallel work, and of the merge.
pub const SPLIT_TOKENS: usize = 4096;
/// Tokens per block: the online softmax's step.
pub const BLOCK_TOKENS: usize = 256;
/// Tokens per pass of the packed K: step 3 runs over a pass channel by channel, so that each
/// channel's codes are read in runs of `PASS_TOKENS * bits / 8` bytes (K packed per channel is
/// D separate streams, and this machine reads 32-byte visits to 128 streams at a fifth of the
/// speed of 1 KiB visits). Each score is the same sum in the same order whatever the pass.
pub const PASS_TOKENS: usize = 2048;
/// Query rows attended together: a tile's scores stay in registers (the AVX-512 kernel's query
/// groups), and a tile of a causal prefill chunk reads only the tokens its rows see. Every
/// step is per query row, so the tiles give each row the bits one call for it alone would.
pub const QUERY_TILE: usize = 8;
/// A packed K's group size must be a multiple of this (the kernels read 32 tokens of one group
/// at a time).
pub const K_GROUP_MULTIPLE: usize = 32;
/// A packed V's group size, and the head dimension, must be multiples of this.
pub const LANES: usize = 8;

/// Why attention over a cache cannot run.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum AttentionError {
    /// K not grouped along tokens, or V not along features.
    #[error(
        "the fused kernels read K grouped along tokens (per channel) and V along features (per \
         token); got K along {k} and V along {v}"
    )]
    Axes {
        /// K's axis.
        k: &'static str,
        /// V's axis.
        v: &'static str,
    },
    /// A group size the kernels cannot step through.
    #[error("{tensor}'s group size {group_size} is not a multiple of {multiple}")]
    GroupSize {
        /// `K` or `V`.
        tensor: &'static str,
        /// Its group size.
        group_size: usize,
        /// What it must be a multiple of.
        multiple: usize,
    },
    /// K and V (or the queries) disagree on their shape, or D is not a multiple of 8.
    #[error("{0}")]
    Shape(String),
    /// `visible` has another length than the queries have rows.
    #[error("{got} visible counts for {queries} query rows")]
    VisibleCount {
        /// Counts given.
        got: usize,
        /// Query rows.
        queries: usize,
    },
    /// A query that sees no token, or more than the cache holds.
    #[error("query {row} sees {visible} tokens; it must see 1 to {tokens}")]
    Visible {
        /// The query row.
        row: usize,
        /// Its count.
        visible: usize,
        /// Tokens in the cache.
        tokens: usize,
    },
    /// NaN or an infinity in a query.
    #[error("query element [{row}, {col}] is {value}")]
    NonFiniteQuery {
        /// Row.
        row: usize,
        /// Column.
        col: usize,
        /// Value.
        value: f32,
    },
    /// A softmax scale that is not finite and positive.
    #[error("softmax scale {0} is not finite and positive")]
    Scale(f32),
    /// A kernel this CPU cannot run.
    #[error("the {0} kernel needs CPU features this machine does not have")]
    KernelUnavailable(Kernel),
}

/// Results of this module.
pub type Result<T> = std::result::Result<T, AttentionError>;

/// Attention of `queries` (Q x D) over one KV head's packed cache, with the fastest kernel this
/// CPU runs ([`fastest`]); see the module comment for what is computed and the inputs it takes.
pub fn attend(
    queries: ArrayView2<f32>,
    visible: &[usize],
    k: &PackedTensor,
    v: &PackedTensor,
    scale: f32,
) -> Result<Array2<f32>> {
    attend_with(fastest(), queries, visible, k, v, scale)
}

/// [`attend`] with a chosen kernel (every kernel gives the same bits).
pub fn attend_with(
    kernel: Kernel,
    queries: ArrayView2<f32>,
    visible: &[usize],
    k: &PackedTensor,
    v: &PackedTensor,
    scale: f32,
) -> Result<Array2<f32>> {
    let head = PackedHead::new(k, v)?;
    let queries = Queries::new(queries, visible, head.tokens, head.features, scale)?;
    run(kernel, &Cache::Packed(head), &queries)
}

/// The same attention over an unpacked f32 cache, K and V each N x D: the baseline a packed
/// cache is measured against. Non-finite K or V values are not looked for (that would read the
/// cache twice); they make the output non-finite.
pub fn attend_dense(
    queries: ArrayView2<f32>,
    visible: &[usize],
    k: ArrayView2<f32>,
    v: ArrayView2<f32>,
    scale: f32,
) -> Result<Array2<f32>> {
    attend_dense_with(fastest(), queries, visible, k, v, scale)
}

/// [`attend_dense`] with a chosen kernel (every kernel gives the same bits).
pub fn attend_dense_with(
    kernel: Kernel,
    queries: ArrayView2<f32>,
    visible: &[usize],
    k: ArrayView2<f32>,
    v: ArrayView2<f32>,
    scale: f32,
) -> Result<Array2<f32>> {
    let head = DenseHead::new(k, v)?;
    let queries = Queries::new(queries, visible, head.tokens, head.features, scale)?;
    run(kernel, &Cache::Dense(head), &queries)
}

/// Checked queries: qs = q * scale, row-major, and each row's visible count.
pub(crate) struct Queries<'a> {
    pub rows: usize,
    pub scaled: Vec<f32>,
    pub visible: &'a [usize],
}

impl<'a> Queries<'a> {
    fn new(
        queries: ArrayView2<f32>,
        visible: &'a [usize],
        tokens: usize,
        features: usize,
        scale: f32,
    ) -> Result<Self> {
        let (rows, cols) = queries.dim();
        if rows == 0 || cols != features {
            return Err(AttentionError::Shape(format!(
                "queries have shape {rows} x {cols}; they need at least one row of the cache's \
                 {features} features"
            )));
        }
        if visible.len() != rows {
            return Err(AttentionError::VisibleCount {
                got: visible.len(),
                queries: rows,
            });
        }
        if let Some((row, &count)) = visible
            .iter()
            .enumerate()
            .find(|(_, c)| **c == 0 || **c > tokens)
        {
            return Err(AttentionError::Visible {
                row,
                visible: count,
                tokens,
            });
        }
        if let Some(((row, col), &value)) = queries.indexed_iter().find(|(_, x)| !x.is_finite()) {
            return Err(AttentionError::NonFiniteQuery { row, col, value });
        }
        if !(scale.is_finite() && scale > 0.0) {
            return Err(AttentionError::Scale(scale));
        }
        let scaled = queries.iter().map(|&x| x * scale).collect();
        Ok(Queries {
            rows,
            scaled,
            visible,
        })
    }

    /// Rows `rows` of these queries.
    fn tile(&self, rows: std::ops::Range<usize>) -> Queries<'a> {
        let features = self.scaled.len() / self.rows;
        Queries {
            rows: rows.len(),
            scaled: self.scaled[rows.start * features..rows.end * features].to_vec(),
            visible: &self.visible[rows],
        }
    }

    fn last_visible(&self) -> usize {
        self.visible.iter().copied().max().unwrap_or(0)
    }
}

/// Offsets subtracted from a tensor's stored codes, one per group.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Offsets<'a> {
    /// Symmetric: qmax for every group.
    Constant(i32),
    /// Asymmetric: the packed zero-point stream (LSB first, as `bitpack` writes it).
    Stream { bytes: &'a [u8], bits: u32 },
}

impl Offsets<'_> {
    fn at(&self, group: usize) -> i32 {
        match *self {
            Offsets::Constant(o) => o,
            Offsets::Stream { bytes, bits } => read_code(bytes, group, bits),
        }
    }
}

/// The `index`-th `bits`-bit code of an LSB-first stream (`bitpack`'s order), one at a time.
pub(crate) fn read_code(bytes: &[u8], index: usize, bits: u32) -> i32 {
    let bit = index * bits as usize;
    let (byte, shift) = (bit / 8, bit % 8);
    let low = u16::from(bytes[byte]);
    let high = u16::from(bytes.get(byte + 1).copied().unwrap_or(0));
    i32::from(((low | (high << 8)) >> shift) & ((1 << bits) - 1))
}

/// Step 5's sum of eight lanes, as a fixed tree: ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 +
/// l7)); the dense baseline's dot products end the same way.
pub(crate) fn tree_sum(lanes: [f32; LANES]) -> f32 {
    ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
        + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
}

/// One packed tensor as the kernels read it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stream<'a> {
    pub codes: &'a [u8],
    pub bits: u32,
    /// Codes per grouped row, padding included.
    pub row_len: usize,
    pub group_size: usize,
    pub groups_per_row: usize,
    /// [rows, groups_per_row], row-major.
    pub scales: &'a [f32],
    pub offsets: Offsets<'a>,
}

impl<'a> Stream<'a> {
    fn new(packed: &'a PackedTensor) -> Self {
        let layout = packed.layout();
        let geometry = packed.geometry();
        Stream {
            codes: packed.code_bytes(),
            bits: layout.bits.get(),
            row_len: geometry.padded_row_len,
            group_size: layout.group_size,
            groups_per_row: geometry.groups_per_row,
            scales: packed
                .scales()
                .as_slice()
                .expect("a packed tensor's scales are standard layout"),
            offsets: match layout.mode {
                Mode::Symmetric => Offsets::Constant(i32::from(layout.bits.qmax())),
                Mode::Asymmetric => Offsets::Stream {
                    bytes: packed.zero_point_bytes(),
                    bits: layout.bits.get(),
                },
            },
        }
    }
}

/// One KV head's packed K (grouped rows are features) and V (grouped rows are tokens).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PackedHead<'a> {
    pub tokens: usize,
    pub features: usize,
    pub k: Stream<'a>,
    pub v: Stream<'a>,
}

impl<'a> PackedHead<'a> {
    fn new(k: &'a PackedTensor, v: &'a PackedTensor) -> Result<Self> {
        let (kl, vl) = (k.layout(), v.layout());
        if kl.axis != GroupAxis::Token || vl.axis != GroupAxis::Feature {
            return Err(AttentionError::Axes {
                k: kl.axis.name(),
                v: vl.axis.name(),
            });
        }
        if k.shape() != v.shape() {
            return Err(AttentionError::Shape(format!(
                "K is {:?} and V is {:?} (tokens x features); one head's K and V have one shape",
                k.shape(),
                v.shape()
            )));
        }
        let [tokens, features] = k.shape();
        check_features(features)?;
        for (tensor, group_size, multiple) in [
            ("K", kl.group_size, K_GROUP_MULTIPLE),
            ("V", vl.group_size, LANES),
        ] {
            if !group_size.is_multiple_of(multiple) {
                return Err(AttentionError::GroupSize {
                    tensor,
                    group_size,
                    multiple,
                });
            }
        }
        Ok(PackedHead {
            tokens,
            features,
            k: Stream::new(k),
            v: Stream::new(v),
        })
    }
}

/// One KV head's unpacked K and V, N x D each, row-major.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DenseHead<'a> {
    pub tokens: usize,
    pub features: usize,
    pub k: &'a [f32],
    pub v: &'a [f32],
}

impl<'a> DenseHead<'a> {
    fn new(k: ArrayView2<'a, f32>, v: ArrayView2<'a, f32>) -> Result<Self> {
        if k.dim() != v.dim() || k.is_empty() {
            return Err(AttentionError::Shape(format!(
                "K is {:?} and V is {:?}; one head's K and V have one non-empty shape",
                k.dim(),
                v.dim()
            )));
        }
        let (tokens, features) = k.dim();
        check_features(features)?;
        let standard = |m: ArrayView2<'a, f32>, name: &str| {
            m.to_slice().ok_or_else(|| {
                AttentionError::Shape(format!("{name} is not a standard-layout (row-major) array"))
            })
        };
        Ok(DenseHead {
            tokens,
            features,
            k: standard(k, "K")?,
            v: standard(v, "V")?,
        })
    }
}

fn check_features(features: usize) -> Result<()> {
    if features.is_multiple_of(LANES) {
        Ok(())
    } else {
        Err(AttentionError::Shape(format!(
            "head dimension {features} is not a multiple of {LANES}"
        )))
    }
}

/// The cache one call reads.
pub(crate) enum Cache<'a> {
    Packed(PackedHead<'a>),
    Dense(DenseHead<'a>),
}

impl Cache<'_> {
    fn features(&self) -> usize {
        match self {
            Cache::Packed(h) => h.features,
            Cache::Dense(h) => h.features,
        }
    }
}

/// A split's running softmax, per query: (max, sum, acc[D]).
#[derive(Debug, Clone)]
struct State {
    max: Vec<f32>,
    sum: Vec<f32>,
    acc: Vec<f32>,
}

impl State {
    fn new(queries: usize, features: usize) -> Self {
        State {
            max: vec![f32::NEG_INFINITY; queries],
            sum: vec![0.0; queries],
            acc: vec![0.0; queries * features],
        }
    }

    /// Step 7: `self` then `later`, query by query.
    fn merge(mut self, later: State, features: usize) -> State {
        for i in 0..self.max.len() {
            let (ma, mb) = (self.max[i], later.max[i]);
            let acc = &mut self.acc[i * features..][..features];
            let acc_b = &later.acc[i * features..][..features];
            if mb == f32::NEG_INFINITY {
                continue;
            }
            if ma == f32::NEG_INFINITY {
                self.max[i] = mb;
                self.sum[i] = later.sum[i];
                acc.copy_from_slice(acc_b);
                continue;
            }
            let m = ma.max(mb);
            let (a, b) = (exp(ma - m), exp(mb - m));
            self.max[i] = m;
            self.sum[i] = self.sum[i] * a + later.sum[i] * b;
            for (x, &y) in acc.iter_mut().zip(acc_b) {
                *x = *x * a + y * b;
            }
        }
        self
    }
}

/// Per-block scratch, allocated once per split.
pub(crate) struct Scratch {
    /// Scores, then weights p, [Q][BLOCK_TOKENS].
    pub scores: Vec<f32>,
    /// Packed K: a pass's scores, [Q][PASS_TOKENS].
    pub pass_scores: Vec<f32>,
    /// Packed K: a pass's offsets at [d * groups in the pass + g - first group].
    pub k_offsets: Vec<i32>,
    /// Packed K, one query: `qs[d] * sK[d][g]` of a pass's groups for a few channels (AVX-512).
    #[cfg(target_arch = "x86_64")]
    pub k_weights: Vec<f32>,
    /// Packed V: `p[i][t] * sV[t][h]` at [(i * BLOCK + t - t0) * groups + h].
    pub v_weights: Vec<f32>,
    /// Packed V: offsets at [(t - t0) * groups + h].
    pub v_offsets: Vec<i32>,
}

/// An implementation of the attention kernels. Every one gives the same bits; [`fastest`]
/// picks the fastest this CPU runs, and [`attend_with`] takes one, so that tests and benchmarks
/// can compare them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kernel {
    /// Plain Rust, for any target.
    Portable,
    /// AVX2 and FMA (x86_64).
    Avx2,
    /// AVX-512F for 2- and 4-bit codes (a table lookup in place of each conversion) and 8-bit
    /// ones, AVX2 and FMA for the rest (x86_64).
    Avx512,
}

impl Kernel {
    /// Every kernel, slowest first.
    pub const ALL: [Kernel; 3] = [Kernel::Portable, Kernel::Avx2, Kernel::Avx512];

    /// `portable`, `avx2` or `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
            Kernel::Avx512 => "avx512",
        }
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether this CPU runs `kernel`: the AVX2 kernel needs FMA too, the AVX-512 one both and
/// AVX-512F.
pub fn available(kernel: Kernel) -> bool {
    match kernel {
        Kernel::Portable => true,
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => avx2::Fma::detect().is_some(),
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => avx512::Avx512::detect().is_some(),
        #[cfg(not(target_arch = "x86_64"))]
        Kernel::Avx2 | Kernel::Avx512 => false,
    }
}

/// The kernels this CPU runs attention with, slowest first.
pub fn kernels() -> Vec<Kernel> {
    Kernel::ALL.into_iter().filter(|&k| available(k)).collect()
}

/// The fastest kernel this CPU runs attention with.
pub fn fastest() -> Kernel {
    kernels().pop().unwrap_or(Kernel::Portable)
}

fn run(kernel: Kernel, cache: &Cache, queries: &Queries) -> Result<Array2<f32>> {
    if !available(kernel) {
        return Err(AttentionError::KernelUnavailable(kernel));
    }
    let features = cache.features();
    let tiles: Vec<std::ops::Range<usize>> = (0..queries.rows)
        .step_by(QUERY_TILE)
        .map(|start| start..(start + QUERY_TILE).min(queries.rows))
        .collect();
    let states: Vec<State> = tiles
        .into_par_iter()
        .map(|rows| tile_state(kernel, cache, &queries.tile(rows)))
        .collect();
    let mut out = Array2::<f32>::zeros((queries.rows, features));
    let finished = states
        .iter()
        .flat_map(|state| state.sum.iter().zip(state.acc.chunks_exact(features)));
    for (mut row, (&sum, acc)) in out.rows_mut().into_iter().zip(finished) {
        for (o, &a) in row.iter_mut().zip(acc) {
            *o = a / sum;
        }
    }
    Ok(out)
}

/// Steps 2 to 7 for one tile of query rows: its splits, up to the last token a row of it sees.
fn tile_state(kernel: Kernel, cache: &Cache, queries: &Queries) -> State {
    let features = cache.features();
    let last = queries.last_visible();
    let splits: Vec<std::ops::Range<usize>> = (0..last)
        .step_by(SPLIT_TOKENS)
        .map(|start| start..(start + SPLIT_TOKENS).min(last))
        .collect();
    splits
        .into_par_iter()
        .map(|split| split_state(kernel, cache, queries, split))
        .collect::<Vec<State>>()
        .into_iter()
        .reduce(|a, b| a.merge(b, features))
        .expect("at least one split: every query sees a token")
}

fn split_state(
    kernel: Kernel,
    cache: &Cache,
    queries: &Queries,
    split: std::ops::Range<usize>,
) -> State {
    let features = cache.features();
    let q = queries.rows;
    let mut state = State::new(q, features);
    let mut scratch = Scratch {
        scores: vec![0.0; q * BLOCK_TOKENS],
        pass_scores: Vec::new(),
        #[cfg(target_arch = "x86_64")]
        k_weights: Vec::new(),
        k_offsets: Vec::new(),
        v_weights: Vec::new(),
        v_offsets: Vec::new(),
    };
    let seen_by_none = |t0: usize| queries.visible.iter().all(|&v| v <= t0);
    for p0 in split.clone().step_by(PASS_TOKENS) {
        let pass_end = (p0 + PASS_TOKENS).min(split.end);
        if seen_by_none(p0) {
            continue;
        }
        if let Cache::Packed(head) = cache {
            // Step 3 for the whole pass.
            prepare_keys(head, p0, pass_end - p0, &mut scratch);
            let scaled = &queries.scaled;
            dispatch::scores(kernel, head, scaled, q, p0, pass_end - p0, &mut scratch);
        }
        for t0 in (p0..pass_end).step_by(BLOCK_TOKENS) {
            let len = (t0 + BLOCK_TOKENS).min(pass_end) - t0;
            if seen_by_none(t0) {
                continue;
            }
            block(
                kernel,
                cache,
                queries,
                p0,
                t0,
                len,
                &mut state,
                &mut scratch,
            );
        }
    }
    state
}

/// Steps 3 (for a packed K, the block's share of its pass from p0) to 6 for tokens t0..t0 +
/// len.
#[allow(clippy::too_many_arguments)]
fn block(
    kernel: Kernel,
    cache: &Cache,
    queries: &Queries,
    p0: usize,
    t0: usize,
    len: usize,
    state: &mut State,
    scratch: &mut Scratch,
) {
    let features = cache.features();
    let q = queries.rows;
    // Step 3.
    match cache {
        Cache::Packed(_) => {
            for i in 0..q {
                scratch.scores[i * BLOCK_TOKENS..][..len]
                    .copy_from_slice(&scratch.pass_scores[i * PASS_TOKENS + t0 - p0..][..len]);
            }
        }
        Cache::Dense(head) => dispatch::dense_scores(kernel, head, queries, t0, len, scratch),
    }
    // Steps 4 and 5.
    for i in 0..q {
        let scores = &mut scratch.scores[i * BLOCK_TOKENS..][..len];
        let seen = queries.visible[i].saturating_sub(t0).min(len);
        let block_max = max(&scores[..seen]);
        let m = state.max[i].max(block_max);
        let corr = if seen == 0 {
            1.0
        } else {
            exp(state.max[i] - m)
        };
        let lanes = dispatch::weights(kernel, scores, seen, m);
        let sum8 = tree_sum(lanes);
        if seen > 0 {
            state.max[i] = m;
            state.sum[i] = state.sum[i] * corr + sum8;
            for a in &mut state.acc[i * features..][..features] {
                *a *= corr;
            }
        }
    }
    // Step 6.
    match cache {
        Cache::Packed(head) => {
            prepare_values(head, t0, len, scratch);
            dispatch::accumulate(kernel, head, q, t0, len, scratch, &mut state.acc);
        }
        Cache::Dense(head) => {
            dispatch::dense_accumulate(kernel, head, q, t0, len, &scratch.scores, &mut state.acc)
        }
    }
}

/// The runs of 32 tokens (counted from t0, `runs` in all) that lie in the g-th K group of a
/// pass from t0 (counted from the group holding t0, which may have begun before t0). Only the
/// x86_64 kernels read a pass run by run.
#[cfg(target_arch = "x86_64")]
pub(crate) fn group_runs(
    group_size: usize,
    t0: usize,
    runs: usize,
    g: usize,
) -> std::ops::Range<usize> {
    let first = t0 / group_size;
    let start = ((first + g) * group_size).saturating_sub(t0) / K_GROUP_MULTIPLE;
    let end = ((first + g + 1) * group_size - t0) / K_GROUP_MULTIPLE;
    start.min(runs)..end.min(runs)
}

/// The first and one-past-last K groups a block touches.
fn key_groups(head: &PackedHead, t0: usize, len: usize) -> (usize, usize) {
    let g = head.k.group_size;
    (t0 / g, (t0 + len).div_ceil(g))
}

/// The offsets of the K groups a pass touches, channel by channel: [d * (end - first) + g -
/// first].
fn prepare_keys(head: &PackedHead, t0: usize, len: usize, s: &mut Scratch) {
    let (first, end) = key_groups(head, t0, len);
    let groups = head.k.groups_per_row;
    match head.k.offsets {
        // The same value every pass: written once per split.
        Offsets::Constant(o) => {
            if s.k_offsets.len() < (end - first) * head.features {
                s.k_offsets.resize((end - first) * head.features, o);
            }
        }
        offsets => {
            s.k_offsets.clear();
            for d in 0..head.features {
                s.k_offsets
                    .extend((first..end).map(|g| offsets.at(d * groups + g)));
            }
        }
    }
}

/// The V offsets of tokens t0..t0 + len, at [(t - t0) * groups + h].
fn prepare_values(head: &PackedHead, t0: usize, len: usize, s: &mut Scratch) {
    let groups = head.v.groups_per_row;
    match head.v.offsets {
        // The same value every block: written once per split.
        Offsets::Constant(o) => {
            if s.v_offsets.len() < BLOCK_TOKENS * groups {
                s.v_offsets.resize(BLOCK_TOKENS * groups, o);
            }
        }
        offsets => {
            s.v_offsets.clear();
            s.v_offsets
                .extend((t0 * groups..(t0 + len) * groups).map(|index| offsets.at(index)));
        }
    }
}

/// `p[i][t] * sV[t][h]` of tokens t0..t0 + len into `s.v_weights` (step 6's weights, for the
/// kernels that do not compute them as they go).
pub(crate) fn value_weights(head: &PackedHead, q: usize, t0: usize, len: usize, s: &mut Scratch) {
    let groups = head.v.groups_per_row;
    s.v_weights.resize(q * BLOCK_TOKENS * groups, 0.0);
    // The next block's scales, meanwhile: the hardware prefetcher misses the first lines of
    // each block's run of them.
    let next = (t0 + len) * groups..(t0 + 2 * len) * groups;
    for at in next.step_by(16) {
        prefetch(head.v.scales.as_ptr().wrapping_add(at));
    }
    let scales = &head.v.scales[t0 * groups..][..len * groups];
    for i in 0..q {
        let p = &s.scores[i * BLOCK_TOKENS..][..len];
        let weights = &mut s.v_weights[i * BLOCK_TOKENS * groups..][..len * groups];
        for ((w, scales), &p) in weights
            .chunks_exact_mut(groups)
            .zip(scales.chunks_exact(groups))
            .zip(p)
        {
            for (w, &scale) in w.iter_mut().zip(scales) {
                *w = p * scale;
            }
        }
    }
}

/// Asks for the line at `at` ahead of its use: a hint that never faults, whatever the address,
/// and a no-op off x86_64.
#[inline]
fn prefetch<T>(at: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults, and SSE is part of x86_64. (Newer compilers call it
    // safe; Rust 1.89, the workspace's rust-version, needs the block.)
    #[allow(unused_unsafe)]
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(at.cast::<i8>())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// The largest of some finite scores (-inf for none), eight lanes at a time: the maximum of
/// finite values does not depend on the order they are compared in (a zero's sign aside, which
/// no later step can see: `x - 0` and `x + 0` are `x`, `exp(±0)` is 1).
fn max(scores: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let (whole, rest) = scores.as_chunks::<LANES>();
    for chunk in whole {
        for (m, &x) in lanes.iter_mut().zip(chunk) {
            *m = if x > *m { x } else { *m };
        }
    }
    for &x in rest {
        lanes[0] = if x > lanes[0] { x } else { lanes[0] };
    }
    lanes
        .into_iter()
        .fold(f32::NEG_INFINITY, |m, x| if x > m { x } else { m })
}

/// Picks each block kernel for a kernel and a width.
mod dispatch {
    use super::{DenseHead, Kernel, PackedHead, Queries, Scratch, portable};
    #[cfg(target_arch = "x86_64")]
    use super::{avx2, avx512};

    macro_rules! by_bits {
        ($bits:expr, $f:ident :: <B> ($($arg:expr),*)) => {
            match $bits {
                1 => $f::<1>($($arg),*),
                2 => $f::<2>($($arg),*),
                3 => $f::<3>($($arg),*),
                4 => $f::<4>($($arg),*),
                5 => $f::<5>($($arg),*),
                6 => $f::<6>($($arg),*),
                7 => $f::<7>($($arg),*),
                8 => $f::<8>($($arg),*),
                other => unreachable!("a packed tensor's width is 1 to 8 bits, not {other}"),
            }
        };
    }

    #[cfg(target_arch = "x86_64")]
    fn proof() -> avx2::Fma {
        avx2::Fma::detect().expect("the kernel's availability was checked")
    }

    #[cfg(target_arch = "x86_64")]
    fn proof512() -> avx512::Avx512 {
        avx512::Avx512::detect().expect("the kernel's availability was checked")
    }

    pub(super) fn scores(
        kernel: Kernel,
        head: &PackedHead,
        scaled: &[f32],
        q: usize,
        t0: usize,
        len: usize,
        s: &mut Scratch,
    ) {
        match kernel {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 if matches!(head.k.bits, 2 | 4 | 8) => {
                use avx512::packed_scores;
                let k = proof512();
                // SAFETY: `k` proves the CPU has AVX-512F, AVX2 and FMA.
                unsafe {
                    match head.k.bits {
                        2 => packed_scores::<2>(k, head, scaled, q, t0, len, s),
                        4 => packed_scores::<4>(k, head, scaled, q, t0, len, s),
                        _ => packed_scores::<8>(k, head, scaled, q, t0, len, s),
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 | Kernel::Avx512 => {
                use avx2::packed_scores;
                let k = proof();
                // SAFETY: `k` proves the CPU has AVX2 and FMA.
                unsafe {
                    by_bits!(
                        head.k.bits,
                        packed_scores::<B>(k, head, scaled, q, t0, len, s)
                    )
                }
            }
            _ => {
                use portable::packed_scores;
                by_bits!(head.k.bits, packed_scores::<B>(head, scaled, q, t0, len, s))
            }
        }
    }

    pub(super) fn accumulate(
        kernel: Kernel,
        head: &PackedHead,
        q: usize,
        t0: usize,
        len: usize,
        s: &mut Scratch,
        acc: &mut [f32],
    ) {
        match kernel {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `proof512()` proves the CPU has AVX-512F, AVX2 and FMA.
            Kernel::Avx512 if avx512::reads_values(head) => unsafe {
                avx512::value_weights(proof512(), head, q, t0, len, s)
            },
            _ => super::value_weights(head, q, t0, len, s),
        }
        let s = &*s;
        match kernel {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 if avx512::reads_values(head) => {
                use avx512::packed_accumulate;
                let k = proof512();
                // SAFETY: `k` proves the CPU has AVX-512F, AVX2 and FMA.
                unsafe {
                    match head.v.bits {
                        2 => packed_accumulate::<2>(k, head, q, t0, len, s, acc),
                        4 => packed_accumulate::<4>(k, head, q, t0, len, s, acc),
                        _ => packed_accumulate::<8>(k, head, q, t0, len, s, acc),
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 | Kernel::Avx512 => {
                use avx2::packed_accumulate;
                let k = proof();
                // SAFETY: `k` proves the CPU has AVX2 and FMA.
                unsafe {
                    by_bits!(
                        head.v.bits,
                        packed_accumulate::<B>(k, head, q, t0, len, s, acc)
                    )
                }
            }
            _ => {
                use portable::packed_accumulate;
                by_bits!(
                    head.v.bits,
                    packed_accumulate::<B>(head, q, t0, len, s, acc)
                )
            }
        }
    }

    /// Step 4's weights and step 5's lanes: `scores[t]` becomes `exp(scores[t] - m)` for t
    /// below `seen` and 0 after it; returns the eight lane sums.
    pub(super) fn weights(kernel: Kernel, scores: &mut [f32], seen: usize, m: f32) -> [f32; 8] {
        match kernel {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `proof()` proves the CPU has AVX2 and FMA.
            Kernel::Avx2 | Kernel::Avx512 => unsafe { avx2::weights(proof(), scores, seen, m) },
            _ => portable::weights(scores, seen, m),
        }
    }

    pub(super) fn dense_scores(
        kernel: Kernel,
        head: &DenseHead,
        queries: &Queries,
        t0: usize,
        len: usize,
        s: &mut Scratch,
    ) {
        match kernel {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `proof()` proves the CPU has AVX2 and FMA.
            Kernel::Avx2 | Kernel::Avx512 => unsafe {
                avx2::dense_scores(
                    proof(),
                    head,
                    &queries.scaled,
                    queries.rows,
                    t0,
                    len,
                    &mut s.scores,
                )
            },
            _ => {
                portable::dense_scores(head, &queries.scaled, queries.rows, t0, len, &mut s.scores)
            }
        }
    }

    pub(super) fn dense_accumulate(
        kernel: Kernel,
        head: &DenseHead,
        q: usize,
        t0: usize,
        len: usize,
        p: &[f32],
        acc: &mut [f32],
    ) {
        match kernel {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `proof()` proves the CPU has AVX2 and FMA.
            Kernel::Avx2 | Kernel::Avx512 => unsafe {
                avx2::dense_accumulate(proof(), head, q, t0, len, p, acc)
            },
            _ => portable::dense_accumulate(head, q, t0, len, p, acc),
        }
    }
}

#[cfg(test)]
mod tests;
