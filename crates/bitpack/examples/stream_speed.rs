//! Throughput of the b-bit stream packers on 128 MiB of codes, against a 256 MiB
//! `copy_from_slice` of f32 timed in the same process.
//!
//! `cargo run --release -p bitpack --example stream_speed [runs] [filter] [MiB]`
//!
//! GB/s counts the unpacked side: one byte per code. Each figure is the median of `runs`
//! (default 7) timed runs after one warm-up run. Rows are `kernel op`: every kernel this CPU
//! has on the `_into` functions (caller's buffers, reused), and `alloc` for the allocating
//! public functions (best kernel, a fresh output each call). `filter` keeps the rows whose
//! label contains it; `MiB` (default 128) sets the codes' size, e.g. 1 to see the kernels in
//! cache. A quick look, not the project's benchmark.

use std::hint::black_box;
use std::time::Instant;

use bitpack::Bits;
use bitpack::stream::{self, imp};

/// Median seconds of `runs` calls of `f`, after one untimed call.
fn seconds(runs: usize, f: &mut dyn FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[runs / 2]
}

/// GB/s of `copy_from_slice` over 256 MiB of f32 (the reference every ratio is taken to).
fn memcpy_gbs(runs: usize) -> f64 {
    let source = vec![1.5f32; 64 << 20];
    let mut target = vec![0f32; 64 << 20];
    let time = seconds(runs, &mut || target.copy_from_slice(black_box(&source)));
    black_box(&target);
    (256 << 20) as f64 / time / 1e9
}

fn codes(bits: Bits, len: usize) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> (64 - bits.get())) as u8
        })
        .collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let runs: usize = args
        .next()
        .map_or(7, |arg| arg.parse().expect("runs: a number"));
    let filter = args.next().unwrap_or_default();
    let mib: usize = args
        .next()
        .map_or(128, |arg| arg.parse().expect("MiB: a number"));
    let codes_len = mib << 20;
    let memcpy = memcpy_gbs(runs);
    println!("memcpy (copy_from_slice, 256 MiB f32): {memcpy:.2} GB/s");
    println!(
        "{:<5} {:<28} {:>7} {:>7}",
        "bits", "kernel op", "GB/s", "x copy"
    );
    for bits in Bits::ALL {
        let input = codes(bits, codes_len);
        let mut bytes = stream::pack_bytes(bits, &input).unwrap();
        let mut words = stream::pack_words(bits, &input).unwrap();
        let mut signed = stream::pack_i32_words(bits, &input).unwrap();
        let mut output = vec![0u8; codes_len];
        let report = |label: String, f: &mut dyn FnMut()| {
            if label.contains(&filter) {
                let gbs = codes_len as f64 / seconds(runs, f) / 1e9;
                println!(
                    "{:<5} {label:<28} {gbs:>7.2} {:>7.2}",
                    bits.get(),
                    gbs / memcpy
                );
            }
        };
        for kernel in imp::Kernel::available() {
            let name = format!("{kernel:?}").to_lowercase();
            report(format!("{name} pack_bytes"), &mut || {
                imp::pack_bytes_into(kernel, bits, black_box(&input), &mut bytes).unwrap()
            });
            report(format!("{name} unpack_bytes"), &mut || {
                imp::unpack_bytes_into(kernel, bits, black_box(&bytes), &mut output).unwrap()
            });
            report(format!("{name} pack_words"), &mut || {
                imp::pack_words_into(kernel, bits, black_box(&input), &mut words).unwrap()
            });
            report(format!("{name} unpack_words"), &mut || {
                imp::unpack_words_into(kernel, bits, black_box(&words), &mut output).unwrap()
            });
            report(format!("{name} pack_i32_words"), &mut || {
                imp::pack_words_into(kernel, bits, black_box(&input), &mut signed).unwrap()
            });
            report(format!("{name} unpack_i32_words"), &mut || {
                imp::unpack_words_into(kernel, bits, black_box(&signed), &mut output).unwrap()
            });
        }
        report("alloc pack_bytes".into(), &mut || {
            black_box(stream::pack_bytes(bits, black_box(&input)).unwrap());
        });
        report("alloc unpack_bytes".into(), &mut || {
            black_box(stream::unpack_bytes(bits, black_box(&bytes), codes_len).unwrap());
        });
        report("alloc pack_words".into(), &mut || {
            black_box(stream::pack_words(bits, black_box(&input)).unwrap());
        });
        report("alloc unpack_words".into(), &mut || {
            black_box(stream::unpack_words(bits, black_box(&words), codes_len).unwrap());
        });
        report("alloc pack_i32_words".into(), &mut || {
            black_box(stream::pack_i32_words(bits, black_box(&input)).unwrap());
        });
        report("alloc unpack_i32_words".into(), &mut || {
            black_box(stream::unpack_i32_words(bits, black_box(&signed), codes_len).unwrap());
        });
        black_box(&output);
    }
}
