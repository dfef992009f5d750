//! How close a figure must be: the audit's one relative tolerance for recorded figures, and the
//! comparison every check uses so that a NaN never passes.

/// Recomputed metrics must agree with results.json to this relative precision.
pub const METRIC_TOLERANCE: f64 = 1e-12;

/// `value <= bound`, false for NaN: a NaN never passes a check.
pub fn within(value: f64, bound: f64) -> bool {
    value <= bound
}

/// Whether `recorded` is `actual` to within [`METRIC_TOLERANCE`], relatively.
pub fn close(recorded: f64, actual: f64) -> bool {
    within((recorded - actual).abs(), METRIC_TOLERANCE * actual.abs())
}
