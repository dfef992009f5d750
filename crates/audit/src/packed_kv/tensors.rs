//! One stored tensor segment, checked against the input it stores: its shape array, its codes
//! (range, padding, unused bits, and each code against the quantization rule), its scales and
//! zero points (against the rule applied to the input's groups), the `scale / 2` bound, and, for
//! a float32 segment, its values bit for bit.
//!
//! A checked segment is kept as stored ([`Stored`]: codes, scales and offsets, or float32
//! values), not decoded: it is decoded element by element when attention reads it, so no f64
//! copy of a segment is ever held.

use ndarray::{Array2, ArrayView2};

use crate::common::npz::Archive;
use crate::common::report::{Checked, Problem, Report};
use crate::common::tolerance::within;
use crate::packed_kv::decoder::{Grid, code_at, offsets, tail_is_clear, value_at};
use crate::packed_kv::protocol::Mode;
use crate::packed_kv::rules;

/// Slack on the |decoded - original| <= scale / 2 bound, in units of scale * L: x / scale is
/// rounded to f32 before it is rounded to a code, which can move it by up to L * 2^-24.
pub const BOUND_SLACK: f64 = 1.0 / (1u64 << 22) as f64;

/// What a checked segment holds, as the archive stores it.
#[derive(Debug, Clone)]
pub enum Values {
    /// A quantized segment: its code stream, scales and per-group offsets.
    Quantized {
        /// Where its elements live.
        grid: Grid,
        /// The code stream.
        codes: Vec<u8>,
        /// One scale per group.
        scales: Array2<f32>,
        /// One offset per group (qmax, or the stored zero point).
        offsets: Array2<u8>,
    },
    /// A float32 segment's values, tokens x features.
    Float32(Array2<f32>),
}

impl Values {
    /// Logical row `t` of the segment, decoded into `out` (one f64 per feature), exactly as
    /// [`crate::packed_kv::decoder::decode`] decodes it.
    pub fn row(&self, t: usize, out: &mut [f64]) {
        match self {
            Values::Quantized {
                grid,
                codes,
                scales,
                offsets,
            } => {
                for (f, o) in out.iter_mut().enumerate() {
                    *o = value_at(grid, codes, scales.view(), offsets, t, f);
                }
            }
            Values::Float32(values) => {
                for (o, &x) in out.iter_mut().zip(values.row(t)) {
                    *o = f64::from(x);
                }
            }
        }
    }
}

/// A segment as the audit checked it, and what it costs as stored.
#[derive(Debug, Clone)]
pub struct Stored {
    /// What it holds, to be decoded as it is read.
    pub values: Values,
    /// Code bytes + 4 per scale + zero-point bytes + 8 shape bytes, or 4 per value + 8.
    pub payload_bytes: usize,
}

fn check_shape(
    archive: &Archive,
    array: &str,
    expected: [usize; 2],
    report: &mut Report,
) -> Option<()> {
    let shape = match archive.vector::<i32>(array, 2) {
        Ok(shape) => shape,
        Err(e) => {
            report.fail(Problem::Array(e));
            return None;
        }
    };
    let matches = shape
        .iter()
        .zip(expected)
        .all(|(&s, e)| usize::try_from(s).ok() == Some(e));
    if !matches {
        report.fail(Problem::ShapeValues {
            array: array.to_string(),
            found: shape.to_vec(),
            expected,
        });
        return None;
    }
    Some(())
}

/// A float32 segment: values identical to the input's, with its shape stored beside it.
pub fn check_float32(
    archive: &Archive,
    name: &str,
    suffix: &str,
    original: ArrayView2<f32>,
    report: &mut Report,
) -> Option<Stored> {
    let dim = [original.nrows(), original.ncols()];
    check_shape(archive, &format!("{name}_shape{suffix}"), dim, report)?;
    let array = format!("{name}_values{suffix}");
    let values = match archive.matrix::<f32>(&array, dim) {
        Ok(v) => v,
        Err(e) => {
            report.fail(Problem::Array(e));
            return None;
        }
    };
    let same = values
        .iter()
        .zip(original.iter())
        .all(|(a, b)| a.to_bits() == b.to_bits());
    if !same {
        report.fail(Problem::Float32 { array });
    }
    Some(Stored {
        payload_bytes: 4 * values.len() + 8,
        values: Values::Float32(values),
    })
}

/// A quantized segment of `original` (tokens x features) stored under `grid`.
pub fn check_quantized(
    archive: &Archive,
    name: &str,
    suffix: &str,
    grid: Grid,
    original: ArrayView2<f32>,
    report: &mut Report,
) -> Option<Stored> {
    let array = |part: &str| format!("{name}_{part}{suffix}");
    check_shape(
        archive,
        &array("shape"),
        [grid.tokens, grid.features],
        report,
    )?;
    let (rows, _, groups) = grid.view();
    let loaded = (|| {
        let codes =
            archive.values::<u8>(&array("codes"), &[grid.stream_bytes(grid.positions())])?;
        let scales = archive.matrix::<f32>(&array("scales"), [rows, groups])?;
        let zeros = match grid.mode {
            Mode::Symmetric => Vec::new(),
            Mode::Asymmetric => {
                archive.values::<u8>(&array("zeros"), &[grid.stream_bytes(grid.groups())])?
            }
        };
        Ok((codes, scales, zeros))
    })();
    let (codes, scales, zeros) = match loaded {
        Ok(arrays) => arrays,
        Err(e) => {
            report.fail(Problem::Array(e));
            return None;
        }
    };
    let stream = codes.as_slice();
    let zero_stream = zeros.as_slice();
    if grid.mode == Mode::Asymmetric && !tail_is_clear(zero_stream, grid.bits, grid.groups()) {
        report.fail(Problem::Padding {
            array: array("zeros"),
            count: 1,
        });
    }
    let offsets = offsets(&grid, zero_stream);
    check_codes(&array("codes"), grid, stream, &offsets, report);
    check_scales(&array("scales"), grid, original, &scales, &offsets, report);
    check_code_rule(
        &array("codes"),
        grid,
        original,
        stream,
        &scales,
        &offsets,
        report,
    );

    let levels = f64::from(grid.max_code());
    let mut over = 0usize;
    let mut first = None;
    for ((t, f), &x) in original.indexed_iter() {
        let (_, at) = grid.locate(t, f);
        let scale = f64::from(scales[at]);
        let decoded = value_at(&grid, stream, scales.view(), &offsets, t, f);
        let err = (decoded - f64::from(x)).abs();
        if !within(err, scale * (0.5 + levels * BOUND_SLACK)) {
            over += 1;
            first.get_or_insert(([t, f], err, scale / 2.0));
        }
    }
    if let Some((first, error, half)) = first {
        report.fail(Problem::Bound {
            array: format!("{name}{suffix}"),
            count: over,
            first,
            error,
            half,
        });
    }
    Some(Stored {
        payload_bytes: codes.len() + 4 * scales.len() + zeros.len() + 8,
        values: Values::Quantized {
            grid,
            codes,
            scales,
            offsets,
        },
    })
}

/// Range of every code, padding codes equal to their group's offset, unused tail bits zero.
fn check_codes(array: &str, grid: Grid, stream: &[u8], offsets: &Array2<u8>, report: &mut Report) {
    let max = grid.max_code();
    let mut out_of_range = 0usize;
    let mut first = None;
    let mut bad_padding = 0usize;
    for position in 0..grid.positions() {
        let code = code_at(stream, grid.bits, position);
        if code > max {
            out_of_range += 1;
            first.get_or_insert((position, code));
        } else if grid.is_padding(position) && code != offsets[grid.group_of(position)] {
            bad_padding += 1;
        }
    }
    if !tail_is_clear(stream, grid.bits, grid.positions()) {
        bad_padding += 1;
    }
    if let Some((position, code)) = first {
        report.fail(Problem::CodeRange {
            array: array.to_string(),
            count: out_of_range,
            bits: grid.bits,
            max,
            code,
            position,
        });
    }
    if bad_padding > 0 {
        report.fail(Problem::Padding {
            array: array.to_string(),
            count: bad_padding,
        });
    }
    report.count(Checked::Codes, grid.positions());
}

/// Every scale and offset must be the rule's for its group of the input.
fn check_scales(
    array: &str,
    grid: Grid,
    original: ArrayView2<f32>,
    scales: &Array2<f32>,
    offsets: &Array2<u8>,
    report: &mut Report,
) {
    let mut lo = Array2::<f32>::zeros(scales.raw_dim());
    let mut hi = Array2::<f32>::zeros(scales.raw_dim());
    for ((t, f), &x) in original.indexed_iter() {
        let (_, g) = grid.locate(t, f);
        lo[g] = lo[g].min(x);
        hi[g] = hi[g].max(x);
    }
    let mut wrong = 0usize;
    let mut first = None;
    for ((r, g), &scale) in scales.indexed_iter() {
        let rule = rules::group_rule(grid.mode, grid.bits, lo[[r, g]], hi[[r, g]]);
        if scale.to_bits() != rule.scale.to_bits() || offsets[[r, g]] != rule.offset {
            wrong += 1;
            first.get_or_insert(([r, g], scale, offsets[[r, g]], rule));
        }
    }
    if let Some((first, found, offset, rule)) = first {
        let words = match grid.mode {
            Mode::Symmetric => format!("max|x| / {}", rules::qmax(grid.bits)),
            Mode::Asymmetric => format!("(max - min) / {} with its zero point", grid.max_code()),
        };
        report.fail(Problem::Scale {
            array: array.to_string(),
            count: wrong,
            rule: words,
            first,
            found,
            offset,
            expected: rule.scale,
            expected_offset: rule.offset,
        });
    }
    report.count(Checked::Scales, scales.len());
}

/// Every code of a real element must be the rule's code for that element under its group's
/// stored scale and offset.
fn check_code_rule(
    array: &str,
    grid: Grid,
    original: ArrayView2<f32>,
    stream: &[u8],
    scales: &Array2<f32>,
    offsets: &Array2<u8>,
    report: &mut Report,
) {
    let mut wrong = 0usize;
    let mut first = None;
    for ((t, f), &x) in original.indexed_iter() {
        let (position, g) = grid.locate(t, f);
        let stored = code_at(stream, grid.bits, position);
        let expected = rules::code(grid.mode, grid.bits, x, scales[g], offsets[g]);
        if stored != expected {
            wrong += 1;
            first.get_or_insert(([t, f], stored, expected));
        }
    }
    if let Some((first, stored, expected)) = first {
        report.fail(Problem::Code {
            array: array.to_string(),
            count: wrong,
            first,
            stored,
            expected,
        });
    }
}
