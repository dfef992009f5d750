//! How figures are written, and how to find them in free text.

/// The figures in free text: each maximal run of digits, '.', ',' and '%' that starts with a
/// digit not preceded by a letter, digit or underscore. So `L2`, `float32` and `x86_64` are
/// words, while `12`, `8-bit`, `13.4%` and `1,024` are figures.
pub fn figures(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = chars[i].is_ascii_digit()
            && (i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_'));
        if starts {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_digit() || matches!(chars[i], '.' | ',' | '%'))
            {
                i += 1;
            }
            out.push(
                chars[start..i]
                    .iter()
                    .collect::<String>()
                    .trim_end_matches(['.', ','])
                    .to_string(),
            );
        } else {
            i += 1;
        }
    }
    out
}

/// 8208 -> "8,208" (any unsigned integer up to u128).
pub fn thousands(n: impl Into<u128>) -> String {
    let n: u128 = n.into();
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A fraction as a percentage with three decimals: 0.09797 -> "9.797".
pub fn percent(fraction: f64) -> String {
    format!("{:.3}", fraction * 100.0)
}
