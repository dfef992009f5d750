//! The study's inputs. Generated inputs are re-derived from the protocol: the audit draws q, k
//! and v itself and requires the archived arrays to hold exactly these bits. A model's inputs
//! cannot be re-derived without running the model, which the audit does not do: their q, k and
//! v are taken from arrays.npz ([`archived`]: dtype f32, exact shape, every value finite), and
//! everything computed from them is checked as for generated inputs. What vouches for these
//! arrays is the model's weight hash and the token ids the manifest records
//! ([`crate::packed_kv::manifest::check_model`]) together with the runner's own test that a
//! model run is byte-reproducible; the audit says so in its report.
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

use crate::common::npz::Archive;
use crate::common::problem::Problem;
use crate::packed_kv::protocol::{Distribution, GeneratorName, Protocol};

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
    let generator = p.generator.as_ref()?;
    let entropy = generator.entropy.entropy(seed, tokens)?;
    let shapes = [
        (p.queries, p.features),
        (tokens, p.features),
        (tokens, p.features),
    ];
    let [q, k, v] = match generator.name {
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
    // A validated protocol has a focus whenever a distribution shifts keys.
    let window = p.focus.map_or(0, |f| f.window).min(tokens);
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
    let Some(focus) = p.focus.filter(|_| !shifted.is_empty()) else {
        return;
    };
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
            *x += focus.gain * m;
        }
    }
}

/// A model input's q, k and v as archived: `<id>_q` [queries, D], `<id>_k` and `<id>_v` [N, D],
/// each f32 of exactly that shape (checked before anything is allocated: the protocol bounds
/// N x D) with every value finite. The first array that is not names the problem.
pub fn archived(p: &Protocol, id: &str, tokens: usize, archive: &Archive) -> Result<Draw, Problem> {
    let read = |part: &str, rows: usize| -> Result<Array2<f32>, Problem> {
        let array = format!("{id}_{part}");
        let m = archive
            .matrix::<f32>(&array, [rows, p.features])
            .map_err(Problem::Array)?;
        if let Some(at) = m.iter().position(|x| !x.is_finite()) {
            return Err(Problem::NotFinite {
                array,
                first: [at / p.features.max(1), at % p.features.max(1)],
            });
        }
        Ok(m)
    };
    Ok(Draw {
        q: read("q", p.queries)?,
        k: read("k", tokens)?,
        v: read("v", tokens)?,
    })
}
