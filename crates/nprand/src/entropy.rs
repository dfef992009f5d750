//! Reading a seed (NumPy's `entropy`) from text or JSON, with typed errors.
//!
//! NumPy accepts any non-negative integer, and strings of decimal digits or
//! `0x`-prefixed hex (`_coerce_to_uint32_array` in
//! `numpy/random/bit_generator.pyx`); it rejects negative numbers and floats,
//! even integral ones like `3.0`. The same rules apply here, with one addition:
//! a JSON number is only trusted when it is an exact integer, since
//! `serde_json` turns integers above 2^64 - 1 into lossy floats.

use serde_json::Value;
use thiserror::Error;

/// 2^64, the first integer a `serde_json` number can only hold as a float.
const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;

/// Why a seed was refused.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum EntropyError {
    /// Nothing to parse.
    #[error("entropy is empty")]
    Empty,
    /// A minus sign: NumPy's `SeedSequence` needs a non-negative integer.
    #[error("entropy must be non-negative, got {0}")]
    Negative(String),
    /// A fraction, an exponent or a float value.
    #[error("entropy must be an integer, got {0}")]
    NotInteger(String),
    /// Above the largest value the target type holds.
    #[error("entropy {value} is too large: at most {max} is accepted here")]
    TooLarge {
        /// The offending input.
        value: String,
        /// The largest accepted value, in words.
        max: &'static str,
    },
    /// Not a number at all (letters, stray signs, spaces inside, ...).
    #[error("entropy {0:?} is not a decimal or 0x-hex integer")]
    Malformed(String),
    /// A JSON value that is neither a number nor a string.
    #[error("entropy must be a JSON integer or a string of digits, got {0}")]
    WrongJsonType(String),
}

/// Accepts the integer syntax NumPy accepts for a seed string; returns the
/// digits and their radix, or says what is wrong.
fn split_radix(text: &str) -> Result<(&str, u32), EntropyError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(EntropyError::Empty);
    }
    let looks_numeric = |t: &str| {
        !t.is_empty()
            && t.chars()
                .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))
            && t.chars().any(|c| c.is_ascii_digit())
    };
    if let Some(rest) = s.strip_prefix('-') {
        if looks_numeric(rest) || rest.starts_with("0x") {
            return Err(EntropyError::Negative(s.to_owned()));
        }
        return Err(EntropyError::Malformed(s.to_owned()));
    }
    if let Some(hex) = s.strip_prefix("0x") {
        if !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Ok((hex, 16));
        }
        return Err(EntropyError::Malformed(s.to_owned()));
    }
    if s.chars().all(|c| c.is_ascii_digit()) {
        return Ok((s, 10));
    }
    // A float literal ("3.5", "1e30"), as opposed to plain garbage.
    if s.contains(['.', 'e', 'E']) && looks_numeric(s) && s.parse::<f64>().is_ok() {
        return Err(EntropyError::NotInteger(s.to_owned()));
    }
    Err(EntropyError::Malformed(s.to_owned()))
}

/// Parses a seed as a `u128`: decimal digits, or hex after `0x` (surrounding
/// whitespace is ignored). Negative, fractional or exponent forms and values of
/// 2^128 or more are refused with the matching [`EntropyError`].
pub fn parse_entropy(text: &str) -> Result<u128, EntropyError> {
    let (digits, radix) = split_radix(text)?;
    u128::from_str_radix(digits, radix).map_err(|_| EntropyError::TooLarge {
        value: text.trim().to_owned(),
        max: "2^128 - 1",
    })
}

/// Parses a seed of any size into NumPy's entropy words (32-bit, least
/// significant first; zero is `[0]`), for [`crate::SeedSequence::from_words`]
/// and [`crate::NumpyRng::from_entropy_words`].
pub fn parse_entropy_words(text: &str) -> Result<Vec<u32>, EntropyError> {
    let (digits, radix) = split_radix(text)?;
    // Schoolbook base conversion: words = words * radix + digit.
    let mut words: Vec<u32> = vec![0];
    for c in digits.chars() {
        let mut carry = u64::from(c.to_digit(radix).expect("digits were checked"));
        for w in words.iter_mut() {
            let v = u64::from(*w) * u64::from(radix) + carry;
            *w = v as u32; // low 32 bits
            carry = v >> 32;
        }
        if carry > 0 {
            words.push(carry as u32);
        }
    }
    while words.len() > 1 && words.last() == Some(&0) {
        words.pop();
    }
    Ok(words)
}

/// Reads a seed from a JSON value: a non-negative integer number, or a string
/// as for [`parse_entropy`]. `-1` is [`EntropyError::Negative`]; `3.5` and
/// `3.0` are [`EntropyError::NotInteger`] (NumPy refuses float seeds); numbers
/// above 2^64 - 1 such as `1e30` are [`EntropyError::TooLarge`], because
/// `serde_json` keeps them only as approximate floats: pass those as strings.
pub fn entropy_from_json(value: &Value) -> Result<u128, EntropyError> {
    match value {
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                return Ok(u128::from(u));
            }
            if n.as_i64().is_some() {
                return Err(EntropyError::Negative(n.to_string()));
            }
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f < 0.0 {
                Err(EntropyError::Negative(n.to_string()))
            } else if !f.is_finite() || f.fract() != 0.0 || f < TWO_POW_64 {
                Err(EntropyError::NotInteger(n.to_string()))
            } else {
                Err(EntropyError::TooLarge {
                    value: n.to_string(),
                    max: "2^64 - 1 as a JSON number (write larger seeds as strings)",
                })
            }
        }
        Value::String(s) => parse_entropy(s),
        other => Err(EntropyError::WrongJsonType(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seed_sequence::entropy_words;

    #[test]
    fn parses_decimal_and_hex() {
        assert_eq!(parse_entropy("0"), Ok(0));
        assert_eq!(parse_entropy(" 70128\n"), Ok(70128));
        assert_eq!(parse_entropy("0x1f"), Ok(31));
        assert_eq!(
            parse_entropy("1180591620717411303427"),
            Ok(1_180_591_620_717_411_303_427)
        );
        assert_eq!(parse_entropy(&u128::MAX.to_string()), Ok(u128::MAX));
    }

    #[test]
    fn words_agree_with_u128_and_go_beyond() {
        for e in [0u128, 7, 1 << 32, 12_345_678_901_234_567_890, u128::MAX] {
            assert_eq!(parse_entropy_words(&e.to_string()), Ok(entropy_words(e)));
        }
        assert_eq!(parse_entropy_words("000"), Ok(vec![0]));
        // 2^128 is too large for u128 but fine as words.
        let two_128 = "340282366920938463463374607431768211456";
        assert_eq!(parse_entropy_words(two_128), Ok(vec![0, 0, 0, 0, 1]));
        assert_eq!(parse_entropy_words("0x100000000"), Ok(vec![0, 1]));
    }
}
