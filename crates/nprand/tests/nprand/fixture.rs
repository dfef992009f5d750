//! Checks against `tests/data/numpy-default-rng.json`, made by NumPy 2.4.6
//! (`tests/data/make_fixture.py` regenerates its vectors).

use nprand::{Lcg128Xsl64, NumpyRng, SeedSequence, parse_entropy, parse_entropy_words, tables};
use serde::Deserialize;
use sha2::{Digest, Sha256};

#[derive(Deserialize)]
struct Fixture {
    tables: Tables,
    vectors: Vec<Vector>,
    study_draws: StudyDraws,
}

#[derive(Deserialize)]
struct Tables {
    ki_double_u64_hex: Vec<String>,
    wi_double_f64_bits_hex: Vec<String>,
    fi_double_f64_bits_hex: Vec<String>,
    ziggurat_nor_r_f64_bits_hex: String,
    ziggurat_nor_inv_r_f64_bits_hex: String,
}

#[derive(Deserialize)]
struct Vector {
    entropy: String,
    seed_words_u64_hex: Vec<String>,
    first_raw_u64_hex: Vec<String>,
    first_normals_f64_bits_hex: Vec<String>,
    first_normals_as_f32_bits_hex: Vec<String>,
    sha256_of_first_1000000_normals_f64_le: String,
}

#[derive(Deserialize)]
struct StudyDraws {
    draws: Vec<StudyDraw>,
}

#[derive(Deserialize)]
struct StudyDraw {
    seed: u128,
    tokens: usize,
    entropy: u128,
    sha256_q_f32_le_c_order: String,
    sha256_k_f32_le_c_order: String,
    sha256_v_f32_le_c_order: String,
}

fn fixture() -> Fixture {
    let text = include_str!("../data/numpy-default-rng.json");
    serde_json::from_str(text).expect("fixture parses")
}

fn hex_u64(s: &str) -> u64 {
    u64::from_str_radix(s, 16).expect("hex u64")
}

fn hex_u32(s: &str) -> u32 {
    u32::from_str_radix(s, 16).expect("hex u32")
}

fn rng_for(v: &Vector) -> NumpyRng {
    NumpyRng::default_rng(parse_entropy(&v.entropy).expect("fixture entropy"))
}

#[test]
fn tables_match_fixture() {
    let t = fixture().tables;
    assert_eq!(t.ki_double_u64_hex.len(), 256);
    assert_eq!(t.wi_double_f64_bits_hex.len(), 256);
    assert_eq!(t.fi_double_f64_bits_hex.len(), 256);
    for i in 0..256 {
        assert_eq!(
            tables::KI_DOUBLE[i],
            hex_u64(&t.ki_double_u64_hex[i]),
            "ki[{i}]"
        );
        assert_eq!(
            tables::WI_DOUBLE_BITS[i],
            hex_u64(&t.wi_double_f64_bits_hex[i]),
            "wi[{i}]"
        );
        assert_eq!(
            tables::FI_DOUBLE_BITS[i],
            hex_u64(&t.fi_double_f64_bits_hex[i]),
            "fi[{i}]"
        );
        // The float views used by the sampler carry the same bits.
        assert_eq!(nprand::ziggurat::KI_DOUBLE[i], tables::KI_DOUBLE[i]);
        assert_eq!(
            nprand::ziggurat::WI_DOUBLE[i].to_bits(),
            tables::WI_DOUBLE_BITS[i]
        );
        assert_eq!(
            nprand::ziggurat::FI_DOUBLE[i].to_bits(),
            tables::FI_DOUBLE_BITS[i]
        );
    }
    assert_eq!(
        nprand::ziggurat::ZIGGURAT_NOR_R.to_bits(),
        hex_u64(&t.ziggurat_nor_r_f64_bits_hex)
    );
    assert_eq!(
        nprand::ziggurat::ZIGGURAT_NOR_INV_R.to_bits(),
        hex_u64(&t.ziggurat_nor_inv_r_f64_bits_hex)
    );
}

#[test]
fn seed_words_match() {
    let f = fixture();
    assert_eq!(f.vectors.len(), 10);
    for v in &f.vectors {
        let expect: Vec<u64> = v.seed_words_u64_hex.iter().map(|s| hex_u64(s)).collect();
        let entropy = parse_entropy(&v.entropy).unwrap();
        assert_eq!(
            nprand::seed_words(entropy).to_vec(),
            expect,
            "entropy {}",
            v.entropy
        );
        // The arbitrary-size path agrees.
        let words = parse_entropy_words(&v.entropy).unwrap();
        assert_eq!(
            SeedSequence::from_words(&words).pcg64_seed_words().to_vec(),
            expect,
            "entropy {} via words",
            v.entropy
        );
    }
}

/// `rand_pcg::Lcg128Xsl64::new(initstate, initseq)` seeds and steps exactly as
/// NumPy's `pcg64_set_seed` / `pcg64_next64`.
#[test]
fn rand_pcg_matches_numpy_raw_outputs() {
    use rand_core::Rng;
    for v in &fixture().vectors {
        let w: Vec<u64> = v.seed_words_u64_hex.iter().map(|s| hex_u64(s)).collect();
        let initstate = (u128::from(w[0]) << 64) | u128::from(w[1]);
        let initseq = (u128::from(w[2]) << 64) | u128::from(w[3]);
        let mut lcg = Lcg128Xsl64::new(initstate, initseq);
        let mut rng = rng_for(v);
        for (i, s) in v.first_raw_u64_hex.iter().enumerate() {
            let expect = hex_u64(s);
            assert_eq!(
                lcg.next_u64(),
                expect,
                "rand_pcg, entropy {} output {i}",
                v.entropy
            );
            assert_eq!(
                rng.next_u64(),
                expect,
                "NumpyRng, entropy {} output {i}",
                v.entropy
            );
        }
    }
}

#[test]
fn first_normals_match_f64_and_f32() {
    for v in &fixture().vectors {
        let mut rng = rng_for(v);
        let got = rng.normal_array(8);
        let mut rng = rng_for(v);
        let got32 = rng.normal_array_f32(8);
        for i in 0..8 {
            assert_eq!(
                got[i].to_bits(),
                hex_u64(&v.first_normals_f64_bits_hex[i]),
                "entropy {} normal {i}",
                v.entropy
            );
            assert_eq!(
                got32[i].to_bits(),
                hex_u32(&v.first_normals_as_f32_bits_hex[i]),
                "entropy {} f32 normal {i}",
                v.entropy
            );
        }
    }
}

/// One million draws per entropy reach the tail (layer 0, `log1p`) and wedge
/// (`exp`) paths hundreds to thousands of times each, so this also checks that
/// the platform libm agrees with the one NumPy used.
#[test]
fn million_normals_sha256_match() {
    let mut buf = vec![0.0f64; 1_000_000];
    let mut bytes = Vec::with_capacity(buf.len() * 8);
    for v in &fixture().vectors {
        let mut rng = rng_for(v);
        rng.fill_normal(&mut buf);
        bytes.clear();
        for x in &buf {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
        assert_eq!(
            hex::encode(Sha256::digest(&bytes)),
            v.sha256_of_first_1000000_normals_f64_le,
            "entropy {}",
            v.entropy
        );
    }
}

fn sha256_f32_c_order(a: &ndarray::Array2<f32>) -> String {
    assert!(a.is_standard_layout());
    let mut h = Sha256::new();
    for x in a.iter() {
        h.update(x.to_le_bytes());
    }
    hex::encode(h.finalize())
}

#[test]
fn study_draws_match() {
    let draws = fixture().study_draws.draws;
    assert_eq!(draws.len(), 6);
    for d in &draws {
        assert_eq!(d.entropy, d.seed * 10_000 + d.tokens as u128);
        let mut rng = NumpyRng::default_rng(d.entropy);
        let q = rng.normal_array_f32((4, 32));
        let k = rng.normal_array_f32((d.tokens, 32));
        let v = rng.normal_array_f32((d.tokens, 32));
        assert_eq!(
            sha256_f32_c_order(&q),
            d.sha256_q_f32_le_c_order,
            "q of {}",
            d.entropy
        );
        assert_eq!(
            sha256_f32_c_order(&k),
            d.sha256_k_f32_le_c_order,
            "k of {}",
            d.entropy
        );
        assert_eq!(
            sha256_f32_c_order(&v),
            d.sha256_v_f32_le_c_order,
            "v of {}",
            d.entropy
        );
    }
}
