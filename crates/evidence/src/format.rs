//! How numbers are printed in tables, messages and the chart.

/// 8208 -> "8,208".
pub fn thousands(n: usize) -> String {
    thousands_u64(n as u64)
}

/// [`thousands`] for u64 counts (byte estimates that may exceed a 32-bit usize).
pub fn thousands_u64(n: u64) -> String {
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
