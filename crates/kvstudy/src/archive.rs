//! What `arrays.npz` will hold, planned from the protocol alone, before anything is computed.
//!
//! The audit reads the archive as a plain ZIP (no ZIP64), so a protocol is refused when its
//! archive could need ZIP64: more than [`MAX_NPZ_MEMBERS`] members, or an upper-bound size
//! estimate above [`MAX_NPZ_BYTES`]. Everything here is checked arithmetic; an overflow is
//! `None`, never a wrapped number.
//!
//! Members, in the order [`crate::write`] writes them: per input `<input>_q`, `_k`, `_v`,
//! `_ref`; per comparison, for K then V and each stored segment, `codes`, `scales`, `shape`
//! (and `zeros` when asymmetric) of a quantized segment or `values`, `shape` of a float32 one,
//! then `<id>_out`. ndarray-npy appends `.npy` to every name.
//!
//! Size of one member, as an upper bound: a ZIP local header ([`ZIP_LOCAL_HEADER_BYTES`] plus
//! the name) and central directory entry ([`ZIP_CENTRAL_HEADER_BYTES`] plus the name), with no
//! extra fields (stored entries, fixed timestamp, no alignment, no ZIP64), a `.npy` header of
//! at most [`NPY_HEADER_BYTES`], and the array's data. Plus [`ZIP_END_RECORD_BYTES`] for the end
//! of central directory record.

use crate::plan::{Plan, SegmentPlan, Storage, plans};
use crate::protocol::{Mode, Protocol};

/// Most members a plain ZIP holds: its end record counts entries in 16 bits. More would need
/// ZIP64, which the audit does not read.
pub const MAX_NPZ_MEMBERS: u64 = 65_535;

/// Largest size estimate of `arrays.npz` a protocol may have, in bytes: 2^32 - 1. A plain ZIP
/// stores offsets and sizes in 32 bits (the `zip` crate switches to ZIP64 at 0xFFFFFFFF), and
/// with the whole archive below 2^32 bytes no offset or member can reach that.
pub const MAX_NPZ_BYTES: u64 = u32::MAX as u64;

/// Fixed part of a ZIP local file header (the name follows it).
pub const ZIP_LOCAL_HEADER_BYTES: u64 = 30;

/// Fixed part of a ZIP central directory entry (the name follows it).
pub const ZIP_CENTRAL_HEADER_BYTES: u64 = 46;

/// The ZIP end of central directory record, without a comment.
pub const ZIP_END_RECORD_BYTES: u64 = 22;

/// Upper bound of one `.npy` header. ndarray-npy writes format 1.0 and pads the header (magic,
/// version, length, the dict and a newline) to a multiple of 64 bytes; the dict of a 1-D or 2-D
/// array is at most 97 bytes even with two 20-digit dimensions, so the header is 64 or 128
/// bytes. 128 is therefore a safe bound for every member the runner writes.
pub const NPY_HEADER_BYTES: u64 = 128;

/// How many members `arrays.npz` would hold, or `None` if the count overflows u64.
///
/// Computed per length without listing inputs or comparisons, so a protocol with huge lists is
/// refused without a huge loop.
pub fn member_count(protocol: &Protocol) -> Option<u64> {
    let tensor_members =
        |segments: &[SegmentPlan]| -> u64 { segments.iter().map(segment_members).sum::<u64>() };
    // A comparison stores K and V, each segment by segment, and its output.
    let comparison_members = |segments: &[SegmentPlan]| 1 + 2 * tensor_members(segments);
    // Settings store the same members at every length (one segment, whatever its length).
    let settings = protocol.settings.iter().try_fold(0u64, |sum, &s| {
        let segments = Plan::Packed(s).segments(1);
        sum.checked_add(comparison_members(&segments))
    })?;
    let inputs_per_length = match &protocol.model {
        Some(m) => u64::try_from(m.texts.len())
            .ok()?
            .checked_mul(u64::try_from(m.layers.len()).ok()?)?
            .checked_mul(u64::try_from(m.kv_heads.len()).ok()?)?,
        None => u64::try_from(protocol.seeds.len())
            .ok()?
            .checked_mul(u64::try_from(protocol.distributions.len()).ok()?)?,
    };
    let mut total = 0u64;
    for &tokens in &protocol.tokens {
        let mut per_input = 4u64.checked_add(settings)?;
        if let Some(budget) = &protocol.budget {
            for &policy in &budget.policies {
                let segments = policy.segments(tokens, budget.window, budget.low_bits);
                per_input = per_input.checked_add(comparison_members(&segments))?;
            }
        }
        total = total.checked_add(inputs_per_length.checked_mul(per_input)?)?;
    }
    Some(total)
}

/// Members one stored segment of one tensor takes: codes, scales, shape (and zero points when
/// asymmetric), or values and shape.
fn segment_members(segment: &SegmentPlan) -> u64 {
    match segment.storage {
        Storage::Quantized {
            mode: Mode::Symmetric,
            ..
        } => 3,
        Storage::Quantized {
            mode: Mode::Asymmetric,
            ..
        } => 4,
        Storage::Float32 => 2,
    }
}

/// One member of the archive: its name without `.npy` and the bytes of its array data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    /// `None` if the data size overflows u64.
    pub data_bytes: Option<u64>,
}

/// Every member of `arrays.npz` in the order the runner writes them.
///
/// Lists names, so call it only once [`member_count`] is known to be small (the protocol
/// validator does so after refusing more than [`MAX_NPZ_MEMBERS`]).
pub fn members(protocol: &Protocol) -> Vec<Member> {
    let features = protocol.features as u64;
    let queries = protocol.queries as u64;
    let matrix = |rows: u64, cols: u64, width: u64| rows.checked_mul(cols)?.checked_mul(width);
    let plans = plans(protocol);
    let mut out = Vec::new();
    let mut push = |name: String, data_bytes: Option<u64>| out.push(Member { name, data_bytes });
    let inputs = protocol.inputs();
    for input in &inputs {
        let id = input.id();
        let tokens = input.tokens as u64;
        push(format!("{id}_q"), matrix(queries, features, 4));
        push(format!("{id}_k"), matrix(tokens, features, 4));
        push(format!("{id}_v"), matrix(tokens, features, 4));
        push(format!("{id}_ref"), matrix(queries, features, 8));
    }
    for input in &inputs {
        for plan in &plans {
            let id = plan.id(input);
            let suffixed = matches!(plan, Plan::Budget { .. });
            let axes = plan.axes();
            for (tensor, axis) in [("k", axes.k()), ("v", axes.v())] {
                for (index, segment) in plan.segments(input.tokens).iter().enumerate() {
                    let suffix = if suffixed {
                        format!("_s{index}")
                    } else {
                        String::new()
                    };
                    let name = |part: &str| format!("{id}_{tensor}_{part}{suffix}");
                    let len = (segment.end - segment.start) as u64;
                    match segment.storage {
                        Storage::Quantized { bits, mode } => {
                            let view = grouped_view(axis, len, features, plan.group_size() as u64);
                            let bits = u64::from(bits);
                            let codes = view.and_then(|v| v.codes()?.checked_mul(bits));
                            push(name("codes"), codes.map(|b| b.div_ceil(8)));
                            let groups = view.and_then(|v| v.groups());
                            push(name("scales"), groups.and_then(|g| g.checked_mul(4)));
                            push(name("shape"), Some(8));
                            if mode == Mode::Asymmetric {
                                let zeros = groups.and_then(|g| g.checked_mul(bits));
                                push(name("zeros"), zeros.map(|b| b.div_ceil(8)));
                            }
                        }
                        Storage::Float32 => {
                            push(name("values"), matrix(len, features, 4));
                            push(name("shape"), Some(8));
                        }
                    }
                }
            }
            push(format!("{id}_out"), matrix(queries, features, 8));
        }
    }
    out
}

/// Upper bound of the archive's size in bytes, or `None` if it overflows u64. See the module
/// comment for what is counted.
pub fn estimated_bytes(members: &[Member]) -> Option<u64> {
    members
        .iter()
        .try_fold(ZIP_END_RECORD_BYTES, |total, member| {
            // ndarray-npy names the entry `<name>.npy`.
            let name = u64::try_from(member.name.len()).ok()?.checked_add(4)?;
            let headers = (ZIP_LOCAL_HEADER_BYTES + ZIP_CENTRAL_HEADER_BYTES + NPY_HEADER_BYTES)
                .checked_add(name.checked_mul(2)?)?;
            total.checked_add(headers)?.checked_add(member.data_bytes?)
        })
}

/// Rows and padded row length of the grouped view of a `len` x `features` segment: K (token
/// axis) has `features` rows of `len` tokens, V (feature axis) `len` rows of `features`; each
/// row is padded to whole groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupedView {
    pub rows: u64,
    pub groups_per_row: u64,
    pub group_size: u64,
}

impl GroupedView {
    /// Padded length of one row, or `None` on overflow.
    pub fn padded_row_len(&self) -> Option<u64> {
        self.groups_per_row.checked_mul(self.group_size)
    }

    /// Codes in the stream, padding included, or `None` on overflow.
    pub fn codes(&self) -> Option<u64> {
        self.rows.checked_mul(self.padded_row_len()?)
    }

    /// Scales (and zero points) in the tensor, or `None` on overflow.
    pub fn groups(&self) -> Option<u64> {
        self.rows.checked_mul(self.groups_per_row)
    }
}

/// The grouped view of a `len`-token segment under `axis`; `None` for a zero group size.
pub fn grouped_view(
    axis: kvcodec::GroupAxis,
    len: u64,
    features: u64,
    group_size: u64,
) -> Option<GroupedView> {
    let (rows, row_len) = match axis {
        kvcodec::GroupAxis::Token => (features, len),
        kvcodec::GroupAxis::Feature => (len, features),
    };
    if group_size == 0 {
        return None;
    }
    Some(GroupedView {
        rows,
        groups_per_row: row_len.div_ceil(group_size),
        group_size,
    })
}
