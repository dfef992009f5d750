//! Which implementation of the inner loops runs: a portable one that every target compiles, and
//! an AVX2 one on x86_64 CPUs that have it. Both write the same bytes and decode to the same
//! values (the crate's tests hold each to the one-value-at-a-time oracle in
//! [`crate::reference`]); [`Kernel::detect`] picks the fastest this CPU runs, and the `*_with`
//! functions of [`crate::quantize`] take one explicitly, so a test or a benchmark can compare
//! them.

use std::fmt;

/// An implementation of the encoder's and decoder's inner loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kernel {
    /// Plain Rust, for any target.
    Portable,
    /// 256-bit AVX2 (x86_64 only), chosen at run time when the CPU has it.
    Avx2,
}

impl Kernel {
    /// Every kernel, slowest first.
    pub const ALL: [Kernel; 2] = [Kernel::Portable, Kernel::Avx2];

    /// The fastest kernel this CPU runs.
    pub fn detect() -> Kernel {
        if Kernel::Avx2.is_available() {
            Kernel::Avx2
        } else {
            Kernel::Portable
        }
    }

    /// The kernels this CPU runs, slowest first.
    pub fn available() -> Vec<Kernel> {
        Kernel::ALL
            .into_iter()
            .filter(|kernel| kernel.is_available())
            .collect()
    }

    /// Whether this CPU runs the kernel.
    pub fn is_available(self) -> bool {
        match self {
            Kernel::Portable => true,
            Kernel::Avx2 => avx2_detected(),
        }
    }

    /// `portable` or `avx2`.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
        }
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_detected() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_detected() -> bool {
    false
}
