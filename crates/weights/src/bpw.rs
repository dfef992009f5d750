//! Effective bits per element: what a quantized storage layout really costs, codes and
//! metadata counted byte for byte as stored.
//!
//! Spec, for a `rows` x `cols` matrix and a [`Format`]:
//! - Grouped view (as in `kvcodec`'s layout): `GroupAxis::Token` groups run down each column (along
//!   the first dimension: K's tokens, or a weight's input rows K in GPTQ's [K, N] qweight), so
//!   there are `cols` lines of `rows` elements; `GroupAxis::Feature` groups run along each row, so
//!   `rows` lines of `cols` elements. Each line has `groups_per_line = ceil(line_len / g)`
//!   groups; `groups = lines * groups_per_line`.
//! - Padding: [`Padding::None`] stores codes for the logical elements only; [`Padding::Groups`]
//!   pads every line with zero codes to whole groups (this codec's KV layout).
//! - Codes ([`Container`]): [`Container::ByteStream`] packs all lines into one b-bit stream,
//!   padded at its end to a whole byte (this codec; GGUF and NF4 blocks, which hold whole
//!   bytes); [`Container::LineWords`] makes each line its own stream of u32 words, padded to a
//!   whole word (GPTQ's qweight, compressed-tensors' weight_packed).
//! - Scales: one per group, 2 bytes (f16, bf16) or 4 (f32).
//! - Zero points: none; one float per group; or [`ZeroPoints::Packed`] b-bit codes, in the same
//!   container as the codes (one byte stream over all groups; or, with `LineWords`, one word
//!   stream per group index across the lines, as GPTQ's qzeros [groups_per_line, lines*b/32]).
//! - g_idx: one int32 per element of the grouped dimension (GPTQ's act-order group index per
//!   input row), `4 * line_len` bytes.
//! - Extra bytes per group: block metadata a format stores besides one scale and one zero
//!   (GGUF's K-quants: 12 bytes of packed 6-bit sub-block scales and mins per 256-weight Q4_K
//!   super-block; 16 int8 sub-block scales per Q6_K super-block).
//! - Bits per element: `8 * total bytes / (rows * cols)`, logical elements only, so padding
//!   counts as cost. Shapes, names and file headers are not counted (a `kvcodec` packed tensor
//!   adds its 8 shape bytes on top).
//! - Every count is computed with checked arithmetic: a shape or layout whose element count, any
//!   part's bytes or the total does not fit in a `usize` is an error naming that quantity, never
//!   a wrapped number.

use std::fmt;
use std::str::FromStr;

use bitpack::{Bits, GroupAxis};
use thiserror::Error;

/// Why a layout's cost cannot be counted, or a layout name is not one.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BpwError {
    /// A matrix with no element.
    #[error("empty matrix shape {rows} x {cols}: effective bits need at least one element")]
    EmptyShape {
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
    },
    /// A group size of 0.
    #[error("group size must be at least 1, got 0")]
    ZeroGroupSize,
    /// A count that does not fit a usize.
    #[error(
        "{quantity} of a {rows} x {cols} matrix does not fit in {} bits; refusing to print a \
         wrapped number",
        usize::BITS
    )]
    SizeOverflow {
        /// Which count.
        quantity: &'static str,
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
    },
    /// A name that is not one of a setting's choices.
    #[error("unknown {what} {got:?}: expected one of {expected}")]
    UnknownChoice {
        /// Which setting.
        what: &'static str,
        /// The name given.
        got: String,
        /// The names it takes.
        expected: &'static str,
    },
}

/// Results of this module.
pub type Result<T> = std::result::Result<T, BpwError>;

/// Storage type of a per-group float (scale or zero).
///
/// `#[non_exhaustive]`, as are [`ZeroPoints`], [`Padding`] and [`Container`]: they describe
/// storage layouts, which users build rather than take apart, and new kinds (an 8-bit float
/// scale, another container) should not break code that builds the existing ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FloatDtype {
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE single precision.
    F32,
}

impl FloatDtype {
    /// Bytes per value.
    pub fn bytes(self) -> usize {
        match self {
            FloatDtype::F16 | FloatDtype::Bf16 => 2,
            FloatDtype::F32 => 4,
        }
    }

    /// The name the CLI takes and prints (`f16`, `bf16`, `f32`).
    pub fn name(self) -> &'static str {
        match self {
            FloatDtype::F16 => "f16",
            FloatDtype::Bf16 => "bf16",
            FloatDtype::F32 => "f32",
        }
    }
}

/// How zero points are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ZeroPoints {
    /// Symmetric: no zero points.
    None,
    /// b-bit integer codes, packed in the codes' container.
    Packed,
    /// One float per group (GGUF's Q4_1 m, Q4_K dmin, KIVI's minimum).
    Float(FloatDtype),
}

/// Which elements get codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Padding {
    /// Only the logical elements.
    None,
    /// Every line padded with zero codes to whole groups.
    Groups,
}

/// How codes (and packed zero points) are laid into storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Container {
    /// One b-bit byte stream, padded at its end to a whole byte.
    ByteStream,
    /// Each line its own b-bit stream of u32 words, padded to a whole word.
    LineWords,
}

/// A storage layout, apart from the matrix shape. Build one with [`Format::new`] and struct
/// update syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Format {
    /// Code width.
    pub bits: Bits,
    /// Elements per group (per scale).
    pub group_size: usize,
    /// The axis groups run along.
    pub axis: GroupAxis,
    /// Scale dtype.
    pub scale: FloatDtype,
    /// How zero points are stored, if at all.
    pub zero_points: ZeroPoints,
    /// Whether one int32 group index per element of the grouped dimension is stored.
    pub g_idx: bool,
    /// Which elements get codes.
    pub padding: Padding,
    /// How codes (and packed zero points) are laid into storage.
    pub container: Container,
    /// Block metadata bytes per group besides one scale and one zero point.
    pub extra_bytes_per_group: usize,
}

impl Format {
    /// A plain layout: groups down the columns, no zero points, no g_idx, no padding, one byte
    /// stream, no extra metadata. Adjust the fields from there.
    pub fn new(bits: Bits, group_size: usize, scale: FloatDtype) -> Self {
        Format {
            bits,
            group_size,
            axis: GroupAxis::Token,
            scale,
            zero_points: ZeroPoints::None,
            g_idx: false,
            padding: Padding::None,
            container: Container::ByteStream,
            extra_bytes_per_group: 0,
        }
    }
}

/// Bytes a layout stores for one matrix, by part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    /// Logical elements: rows * cols.
    pub elements: usize,
    /// Bytes of codes, padding included.
    pub code_bytes: usize,
    /// Bytes of scales.
    pub scale_bytes: usize,
    /// Bytes of zero points.
    pub zero_point_bytes: usize,
    /// Bytes of g_idx.
    pub g_idx_bytes: usize,
    /// Other metadata bytes (block sub-scales; tensors a reader does not attribute).
    pub extra_bytes: usize,
}

impl Cost {
    /// Everything but the codes.
    pub fn metadata_bytes(&self) -> usize {
        self.scale_bytes + self.zero_point_bytes + self.g_idx_bytes + self.extra_bytes
    }

    /// Every part together. A [`cost`] result has checked that this sum fits.
    pub fn total_bytes(&self) -> usize {
        self.code_bytes + self.metadata_bytes()
    }

    /// 8 * total bytes / elements: NaN or infinite for 0 elements, so whoever prints it checks
    /// `elements` first ([`cost`] refuses empty shapes).
    pub fn bits_per_element(&self) -> f64 {
        8.0 * self.total_bytes() as f64 / self.elements as f64
    }

    /// Bytes for `elements` elements at this cost per element (a model of that many weights
    /// stored like this matrix).
    pub fn bytes_at(&self, elements: u64) -> f64 {
        elements as f64 * self.total_bytes() as f64 / self.elements as f64
    }
}

/// What `format` stores for a `rows` x `cols` matrix; an error if the shape is empty, the group
/// size 0, or any count overflows.
pub fn cost(format: &Format, rows: usize, cols: usize) -> Result<Cost> {
    if rows == 0 || cols == 0 {
        return Err(BpwError::EmptyShape { rows, cols });
    }
    if format.group_size == 0 {
        return Err(BpwError::ZeroGroupSize);
    }
    let fits = |value: Option<usize>, quantity: &'static str| {
        value.ok_or(BpwError::SizeOverflow {
            quantity,
            rows,
            cols,
        })
    };
    let (lines, line_len) = match format.axis {
        GroupAxis::Token => (cols, rows),
        GroupAxis::Feature => (rows, cols),
    };
    let elements = fits(rows.checked_mul(cols), "the element count (rows x cols)")?;
    let groups_per_line = line_len.div_ceil(format.group_size);
    let groups = fits(lines.checked_mul(groups_per_line), "the group count")?;
    let coded_line_len = match format.padding {
        Padding::None => line_len,
        Padding::Groups => fits(
            groups_per_line.checked_mul(format.group_size),
            "the padded line length",
        )?,
    };
    let bits = format.bits.get() as usize;
    // Bytes of `count` b-bit codes in one stream padded to whole `unit`-bit units.
    let stream = |count: usize, unit: usize| {
        count
            .checked_mul(bits)
            .map(|total_bits| total_bits.div_ceil(unit) * (unit / 8))
    };
    let line_words = |count: usize, per: usize| stream(per, 32)?.checked_mul(count);
    let code_bytes = fits(
        match format.container {
            Container::ByteStream => lines
                .checked_mul(coded_line_len)
                .and_then(|codes| stream(codes, 8)),
            Container::LineWords => line_words(lines, coded_line_len),
        },
        "the code bytes",
    )?;
    let zero_point_bytes = fits(
        match (format.zero_points, format.container) {
            (ZeroPoints::None, _) => Some(0),
            (ZeroPoints::Float(dtype), _) => groups.checked_mul(dtype.bytes()),
            (ZeroPoints::Packed, Container::ByteStream) => stream(groups, 8),
            (ZeroPoints::Packed, Container::LineWords) => line_words(groups_per_line, lines),
        },
        "the zero-point bytes",
    )?;
    let scale_bytes = fits(groups.checked_mul(format.scale.bytes()), "the scale bytes")?;
    let g_idx_bytes = if format.g_idx {
        fits(line_len.checked_mul(4), "the g_idx bytes")?
    } else {
        0
    };
    let extra_bytes = fits(
        groups.checked_mul(format.extra_bytes_per_group),
        "the extra metadata bytes (groups x extra bytes per group)",
    )?;
    fits(
        [scale_bytes, zero_point_bytes, g_idx_bytes, extra_bytes]
            .into_iter()
            .try_fold(code_bytes, usize::checked_add),
        "the total bytes",
    )?;
    Ok(Cost {
        elements,
        code_bytes,
        scale_bytes,
        zero_point_bytes,
        g_idx_bytes,
        extra_bytes,
    })
}

/// Common layouts for the worked example, each with a short name.
pub fn common_layouts() -> Vec<(&'static str, Format)> {
    let four = Bits::FOUR;
    let gptq = |zero_points, g_idx| Format {
        zero_points,
        g_idx,
        container: Container::LineWords,
        ..Format::new(four, 128, FloatDtype::F16)
    };
    vec![
        ("4-bit g128, f16 scales", gptq(ZeroPoints::None, false)),
        (
            "4-bit g128, f16 scales, packed 4-bit zeros",
            gptq(ZeroPoints::Packed, false),
        ),
        (
            "4-bit g128, f16 scales, packed zeros, g_idx",
            gptq(ZeroPoints::Packed, true),
        ),
        (
            "4-bit g32, f16 scale + f16 zero",
            Format {
                zero_points: ZeroPoints::Float(FloatDtype::F16),
                ..Format::new(four, 32, FloatDtype::F16)
            },
        ),
        (
            "GGUF Q4_0 (block 32, f16 d)",
            Format::new(four, 32, FloatDtype::F16),
        ),
        (
            "GGUF Q4_K (256: f16 d, dmin, 12 B scales)",
            Format {
                zero_points: ZeroPoints::Float(FloatDtype::F16),
                extra_bytes_per_group: 12,
                ..Format::new(four, 256, FloatDtype::F16)
            },
        ),
        (
            "GGUF Q6_K (256: f16 d, 16 B scales)",
            Format {
                extra_bytes_per_group: 16,
                ..Format::new(Bits::new(6).expect("6 bits"), 256, FloatDtype::F16)
            },
        ),
        (
            "GGUF Q8_0 (block 32, f16 d)",
            Format::new(Bits::EIGHT, 32, FloatDtype::F16),
        ),
        (
            "NF4 (block 64, f32 absmax)",
            Format::new(four, 64, FloatDtype::F32),
        ),
    ]
}

impl fmt::Display for Format {
    /// e.g. `4-bit g128 token-axis, f16 scales, packed zeros, g_idx, groups-padded, line-words`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} g{} {}-axis, {} scales",
            self.bits,
            self.group_size,
            self.axis,
            self.scale.name()
        )?;
        match self.zero_points {
            ZeroPoints::None => {}
            ZeroPoints::Packed => write!(f, ", packed {}-bit zeros", self.bits.get())?,
            ZeroPoints::Float(dtype) => write!(f, ", {} zeros", dtype.name())?,
        }
        if self.g_idx {
            f.write_str(", g_idx")?;
        }
        if self.extra_bytes_per_group > 0 {
            write!(f, ", {} extra B per group", self.extra_bytes_per_group)?;
        }
        if self.padding == Padding::Groups {
            f.write_str(", padded to groups")?;
        }
        f.write_str(match self.container {
            Container::ByteStream => ", byte stream",
            Container::LineWords => ", u32 words per line",
        })
    }
}

fn unknown(what: &'static str, got: &str, expected: &'static str) -> BpwError {
    BpwError::UnknownChoice {
        what,
        got: got.to_string(),
        expected,
    }
}

impl FromStr for FloatDtype {
    type Err = BpwError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f16" => Ok(FloatDtype::F16),
            "bf16" => Ok(FloatDtype::Bf16),
            "f32" => Ok(FloatDtype::F32),
            other => Err(unknown("float dtype", other, "f16, bf16, f32")),
        }
    }
}

impl FromStr for ZeroPoints {
    type Err = BpwError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(ZeroPoints::None),
            "packed" => Ok(ZeroPoints::Packed),
            other => other
                .parse()
                .map(ZeroPoints::Float)
                .map_err(|_| unknown("zero-point storage", other, "none, packed, f16, bf16, f32")),
        }
    }
}

impl FromStr for Padding {
    type Err = BpwError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(Padding::None),
            "groups" => Ok(Padding::Groups),
            other => Err(unknown("padding", other, "none, groups")),
        }
    }
}

impl FromStr for Container {
    type Err = BpwError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "bytes" => Ok(Container::ByteStream),
            "line-words" => Ok(Container::LineWords),
            other => Err(unknown("container", other, "bytes, line-words")),
        }
    }
}
