//! How costs are printed: effective bits per weight = stored bytes * 8 / logical weights, with
//! code and metadata apart, and the byte counts they come from.

use weights::bpw::Cost;

/// `5.125 bits/weight = 4.000 codes + 1.125 metadata (4,096 + 1,152 bytes for 8,192 weights)`;
/// with no weights there is no ratio to print, and the line says so instead of printing NaN.
pub fn cost_line(cost: &Cost) -> String {
    if cost.elements == 0 {
        return format!(
            "no weights, so no bits/weight ({} + {} bytes for 0 weights)",
            thousands(cost.code_bytes),
            thousands(cost.metadata_bytes()),
        );
    }
    let bits = |bytes: usize| (8 * bytes) as f64 / cost.elements as f64;
    format!(
        "{:.3} bits/weight = {:.3} codes + {:.3} metadata ({} + {} bytes for {} weights)",
        cost.bits_per_element(),
        bits(cost.code_bytes),
        bits(cost.metadata_bytes()),
        thousands(cost.code_bytes),
        thousands(cost.metadata_bytes()),
        thousands(cost.elements),
    )
}

/// 1234567 -> "1,234,567".
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_codes_and_metadata_apart() {
        let cost = Cost {
            elements: 8192,
            code_bytes: 4096,
            scale_bytes: 512,
            zero_point_bytes: 128,
            g_idx_bytes: 512,
            extra_bytes: 0,
        };
        assert_eq!(
            cost_line(&cost),
            "5.125 bits/weight = 4.000 codes + 1.125 metadata (4,096 + 1,152 bytes for 8,192 weights)"
        );
        assert_eq!(
            (thousands(0), thousands(999), thousands(1000)),
            ("0".into(), "999".into(), "1,000".into())
        );
    }

    #[test]
    fn zero_weights_print_no_bits_per_weight_instead_of_nan() {
        let cost = Cost {
            elements: 0,
            code_bytes: 0,
            scale_bytes: 64,
            zero_point_bytes: 0,
            g_idx_bytes: 0,
            extra_bytes: 0,
        };
        assert_eq!(
            cost_line(&cost),
            "no weights, so no bits/weight (0 + 64 bytes for 0 weights)"
        );
    }
}
