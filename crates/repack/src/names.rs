//! How a layer and the names under it are spelled: a layer is known by its prefix (empty when a
//! file holds a single unprefixed layer), and its tensors and per-layer metadata keys are
//! `<prefix>.<name>`.

/// `<prefix>.<name>`, or `<name>` without a prefix.
pub fn qualified(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// A layer as reports name it: its prefix, or `(unprefixed)` for a file's only layer.
pub fn layer_name(prefix: &str) -> &str {
    if prefix.is_empty() {
        "(unprefixed)"
    } else {
        prefix
    }
}

/// A layer as error messages name it: its quoted prefix, or `(unprefixed)`.
pub fn layer_label(prefix: &str) -> String {
    if prefix.is_empty() {
        "(unprefixed)".to_string()
    } else {
        format!("{prefix:?}")
    }
}
