//! Literal values (printed by NumPy 2.4.6), entropy validation, and use
//! through the `rand` traits.

use ndarray::{Array3, s};
use nprand::{EntropyError, NumpyRng, entropy_from_json, parse_entropy, parse_entropy_words};
use serde_json::json;

fn bits(xs: impl IntoIterator<Item = f64>) -> Vec<u64> {
    xs.into_iter().map(f64::to_bits).collect()
}

/// `default_rng(42)`: `normal(size=3)`, `random(2)`, `normal(10.0, 2.0, size=2)`
/// and `standard_normal(size=(2, 2))`.
#[test]
fn value_stability_seed_42() {
    let mut rng = NumpyRng::default_rng(42);
    assert_eq!(
        bits((0..3).map(|_| rng.standard_normal())),
        [0x3fd3807c1104fc6b, 0xbff0a3c65fca9a7e, 0x3fe803b239e77350]
    );
    // Literal decimals for the eye; the bits above are what is checked.
    let mut rng = NumpyRng::default_rng(42);
    assert_eq!(rng.standard_normal(), 0.30471707975443135);

    let mut rng = NumpyRng::default_rng(42);
    assert_eq!(
        bits((0..2).map(|_| rng.next_double())),
        [0x3fe8c43f79a2db24, 0x3fdc16959869e47e]
    );

    let mut rng = NumpyRng::default_rng(42);
    assert_eq!(
        bits((0..2).map(|_| rng.normal(10.0, 2.0))),
        [0x40253807c1104fc7, 0x401fae1cd01ab2c1]
    );

    let mut rng = NumpyRng::default_rng(42);
    let a = rng.normal_array((2, 2));
    assert_eq!(
        bits(a.iter().copied()),
        [
            0x3fd3807c1104fc6b,
            0xbff0a3c65fca9a7e,
            0x3fe803b239e77350,
            0x3fee191b2d157f36
        ]
    );
}

/// Entropies of 2^128 and above go through the word API:
/// `default_rng(2**130 + 3).normal(size=2)` and `default_rng(2**128).normal()`.
#[test]
fn entropy_beyond_u128() {
    let mut rng = NumpyRng::from_entropy_words(&[3, 0, 0, 0, 4]);
    assert_eq!(
        bits((0..2).map(|_| rng.standard_normal())),
        [0xbfd5cc2082dfd28d, 0xbfb7f2bb6f72c009]
    );
    let words = parse_entropy_words("340282366920938463463374607431768211456").unwrap();
    let mut rng = NumpyRng::from_entropy_words(&words);
    assert_eq!(rng.standard_normal().to_bits(), 0x3fe9c34aff467089);
}

#[test]
fn arrays_are_c_order_and_continue_the_stream() {
    let mut a_rng = NumpyRng::default_rng(7);
    let a: Array3<f64> = a_rng.normal_array([2, 3, 4]);
    let mut b_rng = NumpyRng::default_rng(7);
    let flat: Vec<f64> = (0..24).map(|_| b_rng.normal(0.0, 1.0)).collect();
    assert_eq!(a.as_slice().unwrap(), flat.as_slice());
    assert_eq!(a[[1, 2, 3]], flat[23]);
    assert_eq!(a.slice(s![0, 1, ..]).to_vec(), flat[4..8]);
    // Both generators are now at the same point.
    assert_eq!(a_rng, b_rng);
    assert_eq!(a_rng.next_u64(), b_rng.next_u64());
}

/// `default_rng(5)`: `integers(0, 2**32, size=3, dtype=np.uint32)` and
/// `bytes(10)` (which uses next_uint32 words).
#[test]
fn rand_core_traits_follow_numpy_32_bit_outputs() {
    use rand::{Rng, RngExt, SeedableRng};

    let mut rng = NumpyRng::default_rng(5);
    let u32s: Vec<u32> = (0..3).map(|_| Rng::next_u32(&mut rng)).collect();
    assert_eq!(u32s, [0xabb8e5a8, 0xce14abee, 0x05cc99f5]);

    let mut rng = NumpyRng::default_rng(5);
    let mut buf = [0u8; 10];
    rng.fill_bytes(&mut buf);
    assert_eq!(hex::encode(buf), "a8e5b8abeeab14cef599");

    // SeedableRng::seed_from_u64 is default_rng, and rand's helpers draw from
    // the same PCG64 stream.
    let mut a = NumpyRng::seed_from_u64(42);
    let mut b = NumpyRng::default_rng(42);
    assert_eq!(a, b);
    assert_eq!(a.random::<u64>(), b.next_u64());
    let mut c = NumpyRng::from_seed(70128u128.to_le_bytes());
    assert_eq!(c, NumpyRng::default_rng(70128));
    let x: f64 = c.random_range(0.0..1.0);
    assert!((0.0..1.0).contains(&x));
}

#[test]
fn parse_entropy_errors() {
    assert_eq!(parse_entropy(""), Err(EntropyError::Empty));
    assert_eq!(parse_entropy("  "), Err(EntropyError::Empty));
    assert_eq!(
        parse_entropy("-1"),
        Err(EntropyError::Negative("-1".into()))
    );
    assert_eq!(
        parse_entropy("-0"),
        Err(EntropyError::Negative("-0".into()))
    );
    assert_eq!(
        parse_entropy("3.5"),
        Err(EntropyError::NotInteger("3.5".into()))
    );
    assert_eq!(
        parse_entropy("3.0"),
        Err(EntropyError::NotInteger("3.0".into()))
    );
    assert_eq!(
        parse_entropy("1e30"),
        Err(EntropyError::NotInteger("1e30".into()))
    );
    assert_eq!(
        parse_entropy("abc"),
        Err(EntropyError::Malformed("abc".into()))
    );
    assert_eq!(
        parse_entropy("+5"),
        Err(EntropyError::Malformed("+5".into()))
    );
    assert_eq!(
        parse_entropy("0x"),
        Err(EntropyError::Malformed("0x".into()))
    );
    assert_eq!(
        parse_entropy("12 34"),
        Err(EntropyError::Malformed("12 34".into()))
    );
    let two_128 = "340282366920938463463374607431768211456";
    let err = parse_entropy(two_128).unwrap_err();
    assert!(matches!(&err, EntropyError::TooLarge { value, .. } if value == two_128));
    assert_eq!(
        err.to_string(),
        format!("entropy {two_128} is too large: at most 2^128 - 1 is accepted here")
    );
    assert_eq!(
        parse_entropy("-7").unwrap_err().to_string(),
        "entropy must be non-negative, got -7"
    );
    assert_eq!(
        parse_entropy("3.5").unwrap_err().to_string(),
        "entropy must be an integer, got 3.5"
    );
    // The word parser shares the validation but has no upper limit.
    assert_eq!(
        parse_entropy_words("-1"),
        Err(EntropyError::Negative("-1".into()))
    );
    assert!(parse_entropy_words(two_128).is_ok());
}

#[test]
fn json_entropy_validation() {
    assert_eq!(entropy_from_json(&json!(70128)), Ok(70128));
    assert_eq!(
        entropy_from_json(&json!(u64::MAX)),
        Ok(u128::from(u64::MAX))
    );
    assert_eq!(
        entropy_from_json(&json!("1180591620717411303427")),
        Ok(1_180_591_620_717_411_303_427)
    );
    assert_eq!(
        entropy_from_json(&json!(-1)),
        Err(EntropyError::Negative("-1".into()))
    );
    assert_eq!(
        entropy_from_json(&json!(-2.5)),
        Err(EntropyError::Negative("-2.5".into()))
    );
    assert_eq!(
        entropy_from_json(&json!(3.5)),
        Err(EntropyError::NotInteger("3.5".into()))
    );
    assert_eq!(
        entropy_from_json(&json!(3.0)),
        Err(EntropyError::NotInteger("3.0".into()))
    );
    // Parsed from text, as a seed would arrive in a config file.
    let big: serde_json::Value = serde_json::from_str("1e30").unwrap();
    assert!(matches!(
        entropy_from_json(&big),
        Err(EntropyError::TooLarge { .. })
    ));
    let big: serde_json::Value = serde_json::from_str("1180591620717411303427").unwrap();
    let err = entropy_from_json(&big).unwrap_err();
    assert!(
        err.to_string().contains("write larger seeds as strings"),
        "{err}"
    );
    assert!(matches!(
        entropy_from_json(&json!(null)),
        Err(EntropyError::WrongJsonType(_))
    ));
    assert_eq!(
        entropy_from_json(&json!("-3")),
        Err(EntropyError::Negative("-3".into()))
    );
}

#[test]
fn integers_are_numpys_bounded_draws() {
    // NumPy 2.4.6: default_rng(7).integers(0, 20, size=(2, 20)), flattened.
    let mut rng = NumpyRng::default_rng(7);
    let drawn: Vec<u32> = (0..40).map(|_| rng.integers(20)).collect();
    assert_eq!(
        drawn,
        [
            18, 12, 13, 17, 11, 15, 16, 4, 1, 6, 5, 17, 18, 0, 9, 16, 2, 15, 2, 9, 16, 6, 6, 5, 14,
            5, 19, 8, 9, 10, 11, 11, 10, 19, 16, 15, 14, 12, 6, 19
        ]
    );
    // default_rng(12345).integers(0, 3000000001, size=12): a range whose rejection threshold
    // (1,294,967,296) turns away about a third of the 32-bit words.
    let mut rng = NumpyRng::default_rng(12345);
    let drawn: Vec<u32> = (0..12).map(|_| rng.integers(3_000_000_001)).collect();
    assert_eq!(
        drawn,
        [
            950275018, 2392096372, 1928050708, 2028764012, 1173328651, 2518275129, 998441783,
            1702509930, 1794926260, 639429039, 560202556, 687406213
        ]
    );
    // integers(0, 1) draws nothing; one 32-bit draw keeps the other half of its 64-bit
    // output, which random() does not use: default_rng(12345).integers(0, 1, size=3),
    // .integers(0, 5, size=1), .random() give [0, 0, 0], [3], 0.31675833970975287.
    let mut rng = NumpyRng::default_rng(12345);
    assert_eq!([rng.integers(1), rng.integers(1), rng.integers(1)], [0; 3]);
    assert_eq!(rng.integers(5), 3);
    assert_eq!(rng.next_double(), 0.31675833970975287);
    assert_eq!(rng.integers(5), 1);
}
