//! Every weight format against the three probes, at every width it stores, in one labelled table:
//! a failure names its format, probe, width and shape.
//!
//! Each case packs a probe matrix, reads every element back with an oracle written here from the
//! format's spec (bit position by bit position, not with the codec), round-trips it through the
//! codec's unpacker, and checks the dequantized weights. The patterned probe
//! ((i*7 + j*3) mod 2^b) scrambles visibly under a wrong axis or slot order; the all-maximum
//! probe sets the top slot's sign bit, which catches sign extension.

use half::f16;
use ndarray::Array2;
use weights::gguf::{self, BlockQ4_0, BlockQ8_0, GgufBlock};
use weights::gptq::{self, ZeroConvention};
use weights::nf4::{self, Nf4Tensor};
use weights::{LogicalWeights, WeightFormat, awq};

#[derive(Debug, Clone, Copy)]
enum Probe {
    Patterned,
    Random,
    AllMaximum,
}

const PROBES: [Probe; 3] = [Probe::Patterned, Probe::Random, Probe::AllMaximum];

/// [K, N]: one aligned to every pack factor, one that needs padding (GGUF rows must stay whole
/// blocks of 32, so its ragged K is 96).
fn shapes(format: WeightFormat) -> [[usize; 2]; 2] {
    match format {
        WeightFormat::Q4_0 | WeightFormat::Q8_0 => [[128, 64], [96, 60]],
        WeightFormat::Gptq | WeightFormat::GptqV2 | WeightFormat::Awq | WeightFormat::Nf4 => {
            [[128, 64], [100, 60]]
        }
    }
}

fn widths(format: WeightFormat) -> &'static [u32] {
    match format {
        WeightFormat::Gptq | WeightFormat::GptqV2 => &gptq::GPTQ_BITS,
        WeightFormat::Awq | WeightFormat::Q4_0 | WeightFormat::Nf4 => &[4],
        WeightFormat::Q8_0 => &[8],
    }
}

/// xorshift64: a dependency-free random stream.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn probe_values(probe: Probe, bits: u32, shape: (usize, usize), seed: u64) -> Array2<u8> {
    let levels = 1u64 << bits;
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ seed);
    Array2::from_shape_fn(shape, |(i, j)| match probe {
        Probe::Patterned => ((i as u64 * 7 + j as u64 * 3) % levels) as u8,
        Probe::Random => (rng.next() >> 40) as u8 & (levels - 1) as u8,
        Probe::AllMaximum => (levels - 1) as u8,
    })
}

/// The probe as a logical matrix in the format's terms: fixed-offset formats get their offset
/// as every zero point, GPTQ v1 zero points stay in 1..=maxq (zero 0 is refused under v1).
fn probe_weights(
    format: WeightFormat,
    probe: Probe,
    bits: u32,
    [k, n]: [usize; 2],
) -> LogicalWeights {
    let group_size = 32;
    let groups = k.div_ceil(group_size);
    let codes = probe_values(probe, bits, (k, n), 1);
    let zeros = match format {
        WeightFormat::Q4_0 => Array2::from_elem((groups, n), 8),
        WeightFormat::Q8_0 => Array2::from_elem((groups, n), 128),
        WeightFormat::Gptq => probe_values(probe, bits, (groups, n), 2).mapv(|z| z.max(1)),
        WeightFormat::GptqV2 | WeightFormat::Awq | WeightFormat::Nf4 => {
            probe_values(probe, bits, (groups, n), 2)
        }
    };
    let mut rng = XorShift(3);
    let scales = Array2::from_shape_fn((groups, n), |(g, c)| match probe {
        Probe::Random => f16::from_f32((rng.next() >> 40) as f32 / 16_777_216.0 - 0.5),
        _ => f16::from_f32(0.01 * (1 + (g * 3 + c) % 7) as f32),
    });
    LogicalWeights::with_sequential_groups(bits, group_size, codes, scales, zeros).unwrap()
}

// Oracles: where the spec says element (k, n) lives, read bit by bit.

/// GPTQ qweight: column n is a little-endian b-bit stream along K.
fn gptq_code(qweight: &Array2<i32>, bits: u32, k: usize, n: usize) -> u8 {
    stream_value(|w| qweight[[w, n]] as u32, bits, k)
}

/// GPTQ qzeros: row g is a little-endian b-bit stream along N.
fn gptq_zero_field(qzeros: &Array2<i32>, bits: u32, g: usize, n: usize) -> u8 {
    stream_value(|w| qzeros[[g, w]] as u32, bits, n)
}

fn stream_value(word: impl Fn(usize) -> u32, bits: u32, i: usize) -> u8 {
    let bit = i * bits as usize;
    let mut value = u64::from(word(bit / 32)) >> (bit % 32);
    if bit % 32 + bits as usize > 32 {
        value |= u64::from(word(bit / 32 + 1)) << (32 - bit % 32);
    }
    (value & ((1 << bits) - 1)) as u8
}

/// AWQ: column n sits in word n / 8 at the reverse-order shift of n % 8.
fn awq_value(packed: &Array2<i32>, row: usize, n: usize) -> u8 {
    const REVERSE_SHIFTS: [u32; 8] = [0, 16, 4, 20, 8, 24, 12, 28];
    ((packed[[row, n / 8]] as u32 >> REVERSE_SHIFTS[n % 8]) & 0xF) as u8
}

/// Q4_0: element i of a block is byte i % 16, low nibble for i < 16, high nibble after.
fn q4_0_code(bytes: &[u8], block: usize, i: usize) -> u8 {
    let byte = bytes[block * 18 + 2 + i % 16];
    if i < 16 { byte & 0xF } else { byte >> 4 }
}

/// Q8_0: element i of a block is int8 byte i, code = q + 128.
fn q8_0_code(bytes: &[u8], block: usize, i: usize) -> u8 {
    (i16::from(bytes[block * 34 + 2 + i] as i8) + 128) as u8
}

/// NF4: element i is in byte i / 2, high nibble for even i.
fn nf4_code(packed: &[u8], i: usize) -> u8 {
    if i.is_multiple_of(2) {
        packed[i / 2] >> 4
    } else {
        packed[i / 2] & 0xF
    }
}

fn check_case(
    format: WeightFormat,
    probe: Probe,
    bits: u32,
    shape: [usize; 2],
) -> Result<(), String> {
    match format {
        WeightFormat::Gptq => check_gptq(ZeroConvention::V1, probe, bits, shape),
        WeightFormat::GptqV2 => check_gptq(ZeroConvention::V2, probe, bits, shape),
        WeightFormat::Awq => check_awq(probe, shape),
        WeightFormat::Q4_0 => check_gguf::<BlockQ4_0>(format, probe, shape, q4_0_code),
        WeightFormat::Q8_0 => check_gguf::<BlockQ8_0>(format, probe, shape, q8_0_code),
        WeightFormat::Nf4 => check_nf4(probe, shape),
    }
}

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(what()) }
}

fn check_gptq(
    convention: ZeroConvention,
    probe: Probe,
    bits: u32,
    [k, n]: [usize; 2],
) -> Result<(), String> {
    let w = probe_weights(convention.format(), probe, bits, [k, n]);
    let layer = gptq::pack(&w, convention).map_err(|e| e.to_string())?;
    let minus = u8::from(convention == ZeroConvention::V1);
    for ((r, c), &code) in w.codes().indexed_iter() {
        let found = gptq_code(&layer.qweight, bits, r, c);
        ensure(found == code, || {
            format!("qweight [{r}, {c}]: oracle reads {found}, wrote {code}")
        })?;
    }
    for ((g, c), &zero) in w.zeros().indexed_iter() {
        let found = gptq_zero_field(&layer.qzeros, bits, g, c);
        ensure(found == zero - minus, || {
            format!("qzeros [{g}, {c}]: field {found}, zero {zero}")
        })?;
    }
    if matches!(probe, Probe::AllMaximum) && k % 32 == 0 && n % 32 == 0 {
        ensure(layer.qweight.iter().all(|&word| word == -1), || {
            "all-maximum qweight words are not all -1 (0xFFFFFFFF)".into()
        })?;
    }
    round_trip(&w, &gptq::unpack(&layer).map_err(|e| e.to_string())?)
}

fn check_awq(probe: Probe, [k, n]: [usize; 2]) -> Result<(), String> {
    let w = probe_weights(WeightFormat::Awq, probe, 4, [k, n]);
    let layer = awq::pack(&w).map_err(|e| e.to_string())?;
    for ((r, c), &code) in w.codes().indexed_iter() {
        let found = awq_value(&layer.qweight, r, c);
        ensure(found == code, || {
            format!("qweight [{r}, {c}]: oracle reads {found}, wrote {code}")
        })?;
    }
    for ((g, c), &zero) in w.zeros().indexed_iter() {
        let found = awq_value(&layer.qzeros, g, c);
        ensure(found == zero, || {
            format!("qzeros [{g}, {c}]: oracle reads {found}, wrote {zero}")
        })?;
    }
    if matches!(probe, Probe::AllMaximum) && n % 8 == 0 {
        ensure(layer.qweight.iter().all(|&word| word == -1), || {
            "all-maximum qweight words are not all -1".into()
        })?;
    }
    round_trip(&w, &awq::unpack(&layer).map_err(|e| e.to_string())?)
}

fn check_gguf<B: GgufBlock>(
    format: WeightFormat,
    probe: Probe,
    [k, n]: [usize; 2],
    oracle: fn(&[u8], usize, usize) -> u8,
) -> Result<(), String> {
    let w = probe_weights(format, probe, B::BITS, [k, n]);
    let blocks = gguf::from_logical::<B>(&w).map_err(|e| e.to_string())?;
    let bytes = gguf::to_bytes(&blocks);
    ensure(bytes.len() == k * n / 32 * B::BYTES, || {
        format!("{} bytes", bytes.len())
    })?;
    // Row n of the GGUF tensor is column n of the logical matrix.
    for ((r, c), &code) in w.codes().indexed_iter() {
        let found = oracle(&bytes, c * (k / 32) + r / 32, r % 32);
        ensure(found == code, || {
            format!("element [{c}, {r}]: oracle reads {found}, wrote {code}")
        })?;
    }
    let blocks = gguf::from_bytes::<B>(&bytes).map_err(|e| e.to_string())?;
    let back = gguf::to_logical(&blocks, n, k).map_err(|e| e.to_string())?;
    let ggml = gguf::dequantize(&blocks);
    let logical = w.dequantize();
    ensure(
        logical
            .indexed_iter()
            .all(|((r, c), v)| v.to_bits() == ggml[c * k + r].to_bits()),
        || "ggml's dequantization differs from the logical matrix's".into(),
    )?;
    round_trip(&w, &back)
}

fn check_nf4(probe: Probe, [k, n]: [usize; 2]) -> Result<(), String> {
    let codes = probe_values(probe, 4, (k, n), 1);
    let blocks = (k * n).div_ceil(nf4::DEFAULT_BLOCK_SIZE);
    let absmax: Vec<f32> = (0..blocks).map(|b| 0.5 + b as f32 * 0.25).collect();
    let tensor = Nf4Tensor::from_codes(&codes, absmax.clone(), nf4::DEFAULT_BLOCK_SIZE)
        .map_err(|e| e.to_string())?;
    for ((r, c), &code) in codes.indexed_iter() {
        let found = nf4_code(&tensor.packed, r * n + c);
        ensure(found == code, || {
            format!("element [{r}, {c}]: oracle reads {found}, wrote {code}")
        })?;
    }
    let back = tensor.codes().map_err(|e| e.to_string())?;
    ensure(back == codes, || "codes do not round-trip".into())?;
    let deq = tensor.dequantize().map_err(|e| e.to_string())?;
    ensure(
        deq.indexed_iter().all(|((r, c), v)| {
            *v == nf4::NF4_LEVELS[codes[[r, c]] as usize] * absmax[(r * n + c) / 64]
        }),
        || "dequantized weights are not level * absmax".into(),
    )
}

fn round_trip(written: &LogicalWeights, read: &LogicalWeights) -> Result<(), String> {
    ensure(read == written, || "unpack(pack(w)) != w".into())?;
    let (a, b) = (written.dequantize(), read.dequantize());
    ensure(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        || "dequantized weights differ".into(),
    )
}

#[test]
fn every_format_round_trips_every_probe_at_every_width() {
    let mut failures = Vec::new();
    let mut cases = 0;
    for format in WeightFormat::ALL {
        for probe in PROBES {
            for &bits in widths(format) {
                for shape in shapes(format) {
                    cases += 1;
                    if let Err(problem) = check_case(format, probe, bits, shape) {
                        failures.push(format!(
                            "{format} {probe:?} {bits}-bit {shape:?}: {problem}"
                        ));
                    }
                }
            }
        }
    }
    assert_eq!(cases, 72, "12 (format, width) pairs x 3 probes x 2 shapes");
    assert!(
        failures.is_empty(),
        "{} of {cases} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn three_bit_gptq_packs_32_rows_into_3_words() {
    let w = probe_weights(WeightFormat::GptqV2, Probe::AllMaximum, 3, [32, 32]);
    let layer = gptq::pack(&w, ZeroConvention::V2).unwrap();
    assert_eq!(layer.qweight.dim(), (3, 32));
    assert_eq!(layer.qzeros.dim(), (1, 3));
}
