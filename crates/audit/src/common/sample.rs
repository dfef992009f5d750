//! Which model passes a sampled audit (`audit --sample K`) re-runs.
//!
//! Re-running every pass of model-quality evidence takes minutes; a sample re-runs K of them.
//! The choice is deterministic and comes from the evidence itself: each pass is ranked by
//! SHA-256(`<arrays.npz SHA-256 as recorded>/<pass id>`), and the K lowest are re-run. So two
//! audits of the same evidence re-run the same passes, and a change to arrays.npz changes the
//! choice. What a sampled PASS covers is exactly the passes it names (the report lists them):
//! a forger who knows K and forges only other passes is not caught by it; the full audit (the
//! default) re-runs every pass.

use sha2::{Digest, Sha256};

/// The passes to re-run, in their given order: all of them without a sample size, else the
/// `k` ranked first by the hash of `seed` and the pass id.
pub fn choose(passes: &[String], seed: &str, k: Option<usize>) -> Vec<String> {
    let Some(k) = k.filter(|&k| k < passes.len()) else {
        return passes.to_vec();
    };
    let rank = |pass: &String| {
        let mut h = Sha256::new();
        h.update(seed.as_bytes());
        h.update(b"/");
        h.update(pass.as_bytes());
        h.finalize()
    };
    let mut ranked: Vec<(_, usize)> = passes.iter().map(rank).zip(0..).collect();
    ranked.sort();
    let mut chosen: Vec<usize> = ranked.into_iter().take(k).map(|(_, i)| i).collect();
    chosen.sort_unstable();
    chosen.into_iter().map(|i| passes[i].clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_is_fixed_by_the_evidence_and_keeps_the_pass_order() {
        let passes: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
        let a = choose(&passes, "abc", Some(3));
        assert_eq!(a.len(), 3);
        assert_eq!(a, choose(&passes, "abc", Some(3)));
        assert!(a.windows(2).all(
            |w| passes.iter().position(|p| *p == w[0]) < passes.iter().position(|p| *p == w[1])
        ));
        assert_ne!(
            (0..8)
                .map(|i| choose(&passes, &format!("seed{i}"), Some(3)))
                .collect::<Vec<_>>(),
            vec![a; 8],
            "another archive hash chooses other passes"
        );
        assert_eq!(choose(&passes, "abc", None), passes);
        assert_eq!(choose(&passes, "abc", Some(99)), passes);
        assert!(choose(&passes, "abc", Some(0)).is_empty());
    }
}
