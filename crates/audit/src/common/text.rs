//! How figures are written, and how to find them in free text.

/// The figures in free text: each maximal run of digits, '.', ',' and '%' that starts with a
/// digit not preceded by an ASCII letter, a digit or an underscore. So `L2`, `float32` and
/// `x86_64` are words, while `12`, `8-bit`, `13.4%` and `1,024` are figures. A digit is any
/// character Unicode counts as a number (general categories Nd, Nl and No: fullwidth `１２`,
/// mathematical `𝟏𝟐`, Arabic-Indic, superscripts, fractions, Roman numerals), since fonts draw
/// many of them like 0-9; and only an ASCII letter makes a word of what follows it, since some
/// letters draw nothing (U+3164 HANGUL FILLER) and would hide the figure after them.
pub fn figures(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = chars[i].is_numeric()
            && (i == 0
                || !(chars[i - 1].is_ascii_alphabetic()
                    || chars[i - 1].is_numeric()
                    || chars[i - 1] == '_'));
        if starts {
            let start = i;
            while i < chars.len() && (chars[i].is_numeric() || matches!(chars[i], '.' | ',' | '%'))
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

#[cfg(test)]
mod tests {
    use super::figures;

    #[test]
    fn figures_in_any_script_are_figures() {
        for (text, figure) in [
            (
                "error down to \u{FF11}\u{FF12}.\u{FF15}%",
                "\u{FF11}\u{FF12}.\u{FF15}%",
            ),
            (
                "error \u{1D7CF}\u{1D7D0}.\u{1D7D3}%",
                "\u{1D7CF}\u{1D7D0}.\u{1D7D3}%",
            ),
            ("\u{0661}\u{0662} runs", "\u{0661}\u{0662}"),
            ("x\u{00B2} and \u{00BD} of it", "\u{00BD}"),
            ("chapter \u{216B}", "\u{216B}"),
            ("\u{3164}12.5% better", "12.5%"),
            ("\u{00E9}3 bits", "3"),
        ] {
            assert_eq!(
                figures(text).first().map(String::as_str),
                Some(figure),
                "{text}"
            );
        }
        // Words with digits stay words, in any script of digit.
        assert!(figures("L2 error in float32 on x86_64, float\u{FF13}\u{FF12}").is_empty());
    }
}
