//! [`super::linear`]'s block kernels for x86_64: the portable kernel's arithmetic, compiled for
//! AVX2 (or AVX-512VL) with a larger tile. Each output element keeps eight lane sums
//! (`[f32; 8]`, one 256-bit register), and `lanes[j] += x[j] * w[j]` is [`super::dot`]'s own
//! operation for all eight `j` at once, rounded the same way: a multiply, then an add (Rust never
//! contracts them into an FMA, which would round once). The tree and the tail are
//! [`super::dot`]'s. So every output has the bits of [`super::linear_reference`]; the tests hold
//! each kernel to it. Safe Rust: the target features let the compiler use the registers.
//!
//! A tile is 4 tokens by R weight rows: 4R accumulators, R weight vectors and one token vector
//! stay in registers, and each 8-float chunk of input costs 4 + R loads for 8R arithmetic
//! operations. With AVX2's 16 registers R is 2; AVX-512VL gives the same 256-bit operations 32
//! registers, and R = 4 needs fewer loads per operation. `bench --only linear` measures it
//! (docs/speed.md).

/// Tokens per tile.
const TOKENS: usize = 4;

/// Proof that the CPU has AVX2, checked once at run time.
#[derive(Debug, Clone, Copy)]
pub(super) struct Avx2(());

/// Proof that the CPU has AVX2, AVX-512F and AVX-512VL (32 vector registers).
#[derive(Debug, Clone, Copy)]
pub(super) struct Avx512(());

/// What every tile of one block shares: `x` is [tokens, inputs] and `w` is [outputs, inputs],
/// both row-major; the block is weight rows `start..end`, written to `part`
/// ([tokens, end - start], row-major).
pub(super) struct Block<'a> {
    pub x: &'a [f32],
    pub w: &'a [f32],
    pub inputs: usize,
    pub tokens: usize,
    pub bias: Option<&'a [f32]>,
    pub start: usize,
    pub end: usize,
}

impl Block<'_> {
    fn check(&self, part: &[f32]) {
        assert!(self.x.len() >= self.tokens * self.inputs);
        assert!(self.w.len() >= self.end * self.inputs);
        assert!(self.start <= self.end && part.len() >= self.tokens * (self.end - self.start));
        assert!(self.bias.is_none_or(|b| b.len() >= self.end));
    }
}

impl Avx2 {
    /// The proof, if this CPU has AVX2.
    pub(super) fn detect() -> Option<Avx2> {
        std::arch::is_x86_feature_detected!("avx2").then_some(Avx2(()))
    }

    /// Fills `part` with the block's outputs.
    pub(super) fn block(self, block: &Block, part: &mut [f32]) {
        block.check(part);
        // SAFETY: this CPU has AVX2 (the proof `self`).
        unsafe { block_avx2(block, part) }
    }
}

impl Avx512 {
    /// The proof, if this CPU has AVX2, AVX-512F and AVX-512VL.
    pub(super) fn detect() -> Option<Avx512> {
        (std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl"))
        .then_some(Avx512(()))
    }

    /// Fills `part` with the block's outputs.
    pub(super) fn block(self, block: &Block, part: &mut [f32]) {
        block.check(part);
        // SAFETY: this CPU has AVX2, AVX-512F and AVX-512VL (the proof `self`).
        unsafe { block_avx512(block, part) }
    }
}

/// The tile loops and the tile, compiled for one set of target features with `R` weight rows
/// per tile. A macro, so that each kernel's tiles are compiled for its own features: a shared
/// `#[inline]` function with fewer features need not be inlined (in the test profile it was
/// not), and then the 16 accumulators of a 4 x 4 tile spill from AVX2's 16 registers.
macro_rules! kernel {
    ($name:ident, $features:literal, $rows:literal) => {
        #[target_feature(enable = $features)]
        fn $name(b: &Block, part: &mut [f32]) {
            const R: usize = $rows;
            /// Tokens `t0..t0 + T` against the block's weight rows.
            #[inline]
            #[target_feature(enable = $features)]
            fn row_of_tiles<const T: usize>(b: &Block, t0: usize, part: &mut [f32]) {
                let mut o = b.start;
                while o < b.end {
                    let step = (b.end - o).min(R);
                    match step {
                        4 => tile::<T, 4>(b, t0, o, part),
                        3 => tile::<T, 3>(b, t0, o, part),
                        2 => tile::<T, 2>(b, t0, o, part),
                        _ => tile::<T, 1>(b, t0, o, part),
                    }
                    o += step;
                }
            }

            /// One tile: tokens `t0..t0 + T` by weight rows `o0..o0 + R`.
            #[inline]
            #[target_feature(enable = $features)]
            fn tile<'a, const T: usize, const R: usize>(
                b: &Block<'a>,
                t0: usize,
                o0: usize,
                part: &mut [f32],
            ) {
                let inputs = b.inputs;
                let body = inputs / 8 * 8;
                let row = |m: &'a [f32], i: usize| -> (&'a [[f32; 8]], &'a [f32]) {
                    let r = &m[i * inputs..(i + 1) * inputs];
                    (r[..body].as_chunks::<8>().0, &r[body..])
                };
                let mut xr = [(&[][..], &[][..]); T];
                for (t, slot) in xr.iter_mut().enumerate() {
                    *slot = row(b.x, t0 + t);
                }
                let mut wr = [(&[][..], &[][..]); R];
                for (r, slot) in wr.iter_mut().enumerate() {
                    *slot = row(b.w, o0 + r);
                }
                let chunks = body / 8;
                let mut acc = [[[0f32; 8]; R]; T];
                for c in 0..chunks {
                    let mut wc = [[0f32; 8]; R];
                    for r in 0..R {
                        wc[r] = wr[r].0[c];
                    }
                    for t in 0..T {
                        let xc = xr[t].0[c];
                        for r in 0..R {
                            for j in 0..8 {
                                acc[t][r][j] += xc[j] * wc[r][j];
                            }
                        }
                    }
                }
                let width = b.end - b.start;
                for t in 0..T {
                    for r in 0..R {
                        let l = &acc[t][r];
                        let mut sum =
                            ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
                        for (a, c) in xr[t].1.iter().zip(wr[r].1) {
                            sum += a * c;
                        }
                        let o = o0 + r;
                        if let Some(bias) = b.bias {
                            sum += bias[o];
                        }
                        part[(t0 + t) * width + (o - b.start)] = sum;
                    }
                }
            }

            let mut t = 0;
            while t < b.tokens {
                let step = (b.tokens - t).min(TOKENS);
                match step {
                    4 => row_of_tiles::<4>(b, t, part),
                    3 => row_of_tiles::<3>(b, t, part),
                    2 => row_of_tiles::<2>(b, t, part),
                    _ => row_of_tiles::<1>(b, t, part),
                }
                t += step;
            }
        }
    };
}

kernel!(block_avx2, "avx2", 2);
// The same code with twice the weight rows per tile: AVX-512VL gives the 256-bit operations
// ymm0-ymm31, room for the 16 accumulators of a 4 x 4 tile.
kernel!(block_avx512, "avx2,avx512f,avx512vl", 4);
