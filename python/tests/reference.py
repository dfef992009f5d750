"""The KV codec's rule in plain NumPy, written from kvcodec's documentation (crates/kvcodec/src:
layout.rs, symmetric.rs, asymmetric.rs, quantize.rs, packed.rs; docs/formats.md), not from
its code. The tests hold kvpack to it byte for byte.

Grouped view: axis "token" groups run down each feature column (the D x N transpose), axis
"feature" along each token row (the N x D matrix); each row is zero-padded to whole groups.
All arithmetic is float32, as the codec's.

- Symmetric, b = 2..8, qmax = 2^(b-1) - 1: scale = max|x| / qmax, or 1.0 when that is 0;
  stored = clip(round_half_even(x / scale), -qmax, qmax) + qmax.
- Asymmetric, b = 1..8, L = 2^b - 1: lo = min(min, 0), hi = max(max, 0); scale = (hi - lo) / L,
  or 1.0 (zero point 0) when that is 0; zero = clip(round_half_even(-lo / scale), 0, L);
  stored = clip(round_half_even(x / scale) + zero, 0, L).
- Streams: code i takes bits [i*b, (i+1)*b) of the stream, least significant first, in row-major
  order of the padded grouped view; zero points likewise, one per group; bytes padded with 0.
- Payload: code bytes + 4 * scales + zero point bytes + 8 (two i32 shape values).
- Decode: (stored - offset) * scale in float32 (offset qmax, or the zero point), cropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass
class Reference:
    stored: np.ndarray  # uint8 [rows, padded row length]
    scales: np.ndarray  # float32 [rows, groups]
    offsets: np.ndarray  # uint8 [rows, groups]
    codes: np.ndarray  # packed uint8 stream
    zero_points: Optional[np.ndarray]  # packed uint8 stream, None when symmetric
    payload_bytes: int
    decoded: np.ndarray  # float32 [tokens, features]


def grouped(x: np.ndarray, group_size: int, axis: str) -> np.ndarray:
    """The padded grouped view, [rows, groups, group_size]."""
    m = x.T if axis == "token" else x
    rows, row_len = m.shape
    groups = -(-row_len // group_size)
    padded = np.zeros((rows, groups * group_size), dtype=np.float32)
    padded[:, :row_len] = m
    return padded.reshape(rows, groups, group_size)


def pack(values: np.ndarray, bits: int) -> np.ndarray:
    """The b-bit stream: least significant bit first, element after element."""
    flat = values.reshape(-1).astype(np.uint16)
    planes = ((flat[:, None] >> np.arange(bits, dtype=np.uint16)) & 1).astype(np.uint8)
    return np.packbits(planes.reshape(-1), bitorder="little")


def encode(x: np.ndarray, bits: int, group_size: int, axis: str, mode: str) -> Reference:
    x = np.asarray(x, dtype=np.float32)
    g = grouped(x, group_size, axis)
    rows, groups, _ = g.shape
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if mode == "symmetric":
            qmax = np.float32(2 ** (bits - 1) - 1)
            scale = (np.abs(g).max(axis=2) / qmax).astype(np.float32)
            scale[scale == 0] = np.float32(1.0)
            q = np.clip(np.rint(g / scale[..., None]), -qmax, qmax) + qmax
            offsets = np.full((rows, groups), qmax, dtype=np.uint8)
            zero_points = None
        else:
            levels = np.float32(2**bits - 1)
            lo = np.minimum(g.min(axis=2), np.float32(0))
            hi = np.maximum(g.max(axis=2), np.float32(0))
            scale = ((hi - lo) / levels).astype(np.float32)
            flat = scale == 0
            scale[flat] = np.float32(1.0)
            zero = np.clip(np.rint(-lo / scale), np.float32(0), levels).astype(np.float32)
            zero[flat] = 0
            q = np.clip(np.rint(g / scale[..., None]) + zero[..., None], np.float32(0), levels)
            offsets = zero.astype(np.uint8)
            zero_points = pack(offsets, bits)
    stored = q.astype(np.uint8).reshape(rows, -1)
    codes = pack(stored, bits)
    payload = codes.size + 4 * scale.size + (0 if zero_points is None else zero_points.size) + 8
    values = (stored.reshape(rows, groups, -1).astype(np.float32) - offsets[..., None].astype(np.float32))
    decoded = (values * scale[..., None]).reshape(rows, -1)
    n, d = x.shape
    decoded = decoded[:, :n].T if axis == "token" else decoded[:, :d]
    return Reference(
        stored=stored,
        scales=scale,
        offsets=offsets,
        codes=codes,
        zero_points=zero_points,
        payload_bytes=payload,
        decoded=np.ascontiguousarray(decoded, dtype=np.float32),
    )
