//! How costs are printed: effective bits per weight = stored bytes * 8 / logical weights, with
//! code and metadata apart, and the byte counts they come from.

use codec::formats::StorageCost;

/// `5.125 bits/weight = 4.000 codes + 1.125 metadata (4,096 + 1,152 bytes for 8,192 weights)`
pub fn cost_line(cost: &StorageCost) -> String {
    format!(
        "{:.3} bits/weight = {:.3} codes + {:.3} metadata ({} + {} bytes for {} weights)",
        cost.bits_per_weight(),
        cost.code_bits_per_weight(),
        cost.metadata_bits_per_weight(),
        thousands(cost.code_bytes),
        thousands(cost.metadata_bytes),
        thousands(cost.logical_weights),
    )
}

/// 1234567 -> "1,234,567".
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
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
        let cost = StorageCost {
            code_bytes: 4096,
            metadata_bytes: 1152,
            logical_weights: 8192,
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
}
