//! Typed access to arrays.npz, every failure turned into a one-line message naming the array.

use std::fs::File;
use std::path::Path;

use ndarray::{Array1, Array2, Ix1, Ix2};
use ndarray_npy::{NpzReader, ReadableElement};

pub struct Arrays {
    reader: NpzReader<File>,
    names: Vec<String>,
}

impl Arrays {
    pub fn open(path: &Path) -> Result<Arrays, String> {
        let file = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let mut reader = NpzReader::new(file)
            .map_err(|e| format!("{} is not a readable npz archive: {e}", path.display()))?;
        let names = reader
            .names()
            .map_err(|e| format!("cannot list arrays in {}: {e}", path.display()))?;
        Ok(Arrays { reader, names })
    }

    /// Array names, without the `.npy` suffix.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn matrix<A: ReadableElement>(&mut self, name: &str) -> Result<Array2<A>, String> {
        self.reader
            .by_name::<ndarray::OwnedRepr<A>, Ix2>(name)
            .map_err(|e| format!("array {name}: {e}"))
    }

    pub fn vector<A: ReadableElement>(&mut self, name: &str) -> Result<Array1<A>, String> {
        self.reader
            .by_name::<ndarray::OwnedRepr<A>, Ix1>(name)
            .map_err(|e| format!("array {name}: {e}"))
    }
}

/// Fails unless `array` has exactly `expected` as its shape.
pub fn expect_shape(name: &str, shape: &[usize], expected: &[usize]) -> Result<(), String> {
    if shape == expected {
        Ok(())
    } else {
        Err(format!(
            "array {name} has shape {shape:?}, expected {expected:?}"
        ))
    }
}
