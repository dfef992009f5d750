//! Throughput of the b-bit stream packers on 2^24 codes per width: the fast byte and word
//! packers and unpackers, and the one-value-at-a-time oracle for contrast.
//!
//! `cargo bench -p bench --bench bits` (add `-- --measurement-time 2` for a shorter run).
//! Throughput is reported in codes (elements) per second.

use std::hint::black_box;

use bitpack::Bits;
use bitpack::stream as bits;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

// The tests' probes: `random` is xorshift64 codes in 0..2^b.
#[path = "../../bitpack/tests/common/mod.rs"]
mod common;

const CODES: usize = 1 << 24;

fn packers(c: &mut Criterion) {
    for bits in Bits::ALL {
        let input = common::random(bits, CODES, 0x2545_F491_4F6C_DD1D);
        let bytes = bits::pack_bytes(bits, &input).unwrap();
        let words = bits::pack_words(bits, &input).unwrap();
        let mut group = c.benchmark_group(format!("bits/{}", bits.get()));
        group.throughput(Throughput::Elements(CODES as u64));
        group.sample_size(10);
        group.bench_function("pack_bytes", |b| {
            b.iter(|| bits::pack_bytes(bits, black_box(&input)).unwrap())
        });
        group.bench_function("unpack_bytes", |b| {
            b.iter(|| bits::unpack_bytes(bits, black_box(&bytes), CODES).unwrap())
        });
        group.bench_function("pack_words", |b| {
            b.iter(|| bits::pack_words(bits, black_box(&input)).unwrap())
        });
        group.bench_function("unpack_words", |b| {
            b.iter(|| bits::unpack_words(bits, black_box(&words), CODES).unwrap())
        });
        group.bench_function("pack_words_reference", |b| {
            b.iter(|| bits::pack_words_reference(bits, black_box(&input)).unwrap())
        });
        group.bench_function("unpack_words_reference", |b| {
            b.iter(|| bits::unpack_words_reference(bits, black_box(&words), CODES).unwrap())
        });
        group.finish();
    }
}

criterion_group!(benches, packers);
criterion_main!(benches);
