//! Which implementation of the inner loops runs: a portable one that every target compiles, an
//! AVX2 one on x86_64 CPUs that have it, and on those that also have AVX-512F the AVX2 one with
//! a 512-bit token-axis encoder. All write the same bytes and decode to the same
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
    /// AVX2, with the token-axis encoder in 512-bit AVX-512F for groups of 64 tokens and more
    /// (x86_64 only), chosen at run time when the CPU has both.
    Avx512,
}

impl Kernel {
    /// Every kernel, slowest first.
    pub const ALL: [Kernel; 3] = [Kernel::Portable, Kernel::Avx2, Kernel::Avx512];

    /// The fastest kernel this CPU runs.
    pub fn detect() -> Kernel {
        if Kernel::Avx512.is_available() {
            Kernel::Avx512
        } else if Kernel::Avx2.is_available() {
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
            Kernel::Avx512 => avx2_detected() && avx512_detected(),
        }
    }

    /// `portable`, `avx2` or `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
            Kernel::Avx512 => "avx512",
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

#[cfg(target_arch = "x86_64")]
fn avx512_detected() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx512_detected() -> bool {
    false
}
