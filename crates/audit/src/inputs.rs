//! The study's inputs, re-derived from the protocol: the audit draws q, k and v itself and
//! requires the archived arrays to hold exactly these bits.
//!
//! Per (seed, length): one generator seeded with the protocol's entropy draws q (queries x D),
//! then k (N x D), then v (N x D), standard normal, each value rounded to f32, row-major.
//! - `numpy`: `numpy.random.default_rng(entropy).normal(size=...)`, through `nprand`, whose tests
//!   pin it to NumPy's own vectors;
//! - `chacha20`: rand_chacha's ChaCha20 seeded with the entropy's 16 little-endian bytes followed
//!   by 16 zero bytes, each value `rand_distr::StandardNormal` as f64, then rounded to f32.
//!
//! The focus distributions add `gain * mean(q)` to the first (`early_focus`) or last
//! (`recent_focus`) `window` keys: the mean is a sequential f32 sum over the query rows divided by
//! the query count, and each element gets one f32 multiply and one f32 add.

use std::ops::Range;

use ndarray::{Array1, Array2};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution as _, StandardNormal};

use crate::protocol::{Distribution, GeneratorName, Protocol};

/// One (seed, length) draw.
#[derive(Debug, Clone, PartialEq)]
pub struct Draw {
    /// Queries x D.
    pub q: Array2<f32>,
    /// N x D, before any focus shift.
    pub k: Array2<f32>,
    /// N x D.
    pub v: Array2<f32>,
}

/// Draws q, k and v for one (seed, length), or None if the entropy overflows (a validated
/// protocol never does).
pub fn draw(p: &Protocol, seed: u64, tokens: usize) -> Option<Draw> {
    let entropy = p.generator.entropy.entropy(seed, tokens)?;
    let shapes = [
        (p.queries, p.features),
        (tokens, p.features),
        (tokens, p.features),
    ];
    let [q, k, v] = match p.generator.name {
        GeneratorName::Numpy => {
            let mut rng = nprand::NumpyRng::default_rng(entropy);
            shapes.map(|shape| rng.normal_array_f32(shape))
        }
        GeneratorName::Chacha20 => {
            let mut seed_bytes = [0u8; 32];
            seed_bytes[..16].copy_from_slice(&entropy.to_le_bytes());
            let mut rng = ChaCha20Rng::from_seed(seed_bytes);
            shapes.map(|(rows, cols)| {
                let mut out = Array2::<f32>::zeros((rows, cols));
                for x in out.iter_mut() {
                    let z: f64 = StandardNormal.sample(&mut rng);
                    *x = z as f32;
                }
                out
            })
        }
    };
    Some(Draw { q, k, v })
}

/// The keys of `distribution`: the draw's k, shifted in the focus window.
pub fn keys(p: &Protocol, draw: &Draw, distribution: Distribution) -> Array2<f32> {
    let mut k = draw.k.clone();
    shift_keys(p, &draw.q, &mut k, distribution);
    k
}

/// The rows of k that `distribution` shifts (none for `clean`).
pub fn focus_rows(p: &Protocol, tokens: usize, distribution: Distribution) -> Range<usize> {
    let window = p.focus.window.min(tokens);
    match distribution {
        Distribution::Clean => 0..0,
        Distribution::EarlyFocus => 0..window,
        Distribution::RecentFocus => tokens - window..tokens,
    }
}

/// Shifts `k` (a draw's keys, tokens x D) in place into the keys of `distribution`, `q` being
/// the draw's queries: the audit shapes the one k it holds rather than copying it, and puts the
/// [`focus_rows`] back afterwards.
pub fn shift_keys(p: &Protocol, q: &Array2<f32>, k: &mut Array2<f32>, distribution: Distribution) {
    let shifted = focus_rows(p, k.nrows(), distribution);
    if shifted.is_empty() {
        return;
    }
    let mut mean = Array1::<f32>::zeros(p.features);
    for row in q.rows() {
        for (m, &x) in mean.iter_mut().zip(row) {
            *m += x;
        }
    }
    let count = q.nrows() as f32;
    mean.mapv_inplace(|m| m / count);
    for t in shifted {
        for (x, &m) in k.row_mut(t).iter_mut().zip(&mean) {
            *x += p.focus.gain * m;
        }
    }
}
