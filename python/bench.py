#!/usr/bin/env python3
"""kvpack.encode / decode against the same rule written in NumPy, on the same arrays, in one run.

    python python/bench.py [--quick] [--tokens N] [--features D]

For each case (K grouped along tokens, V along features; symmetric and asymmetric; 3, 4 and 8
bits; groups of 32) it first checks that the NumPy version gives kvpack's bytes exactly (codes,
scales, zero points, decoded values), then times both: the median of repeated calls after a
warm-up, in this process, on one thread (the codec is single-threaded per call). The ratio is
NumPy's time over kvpack's. Then the per-call overhead: encode and decode of a 4 x 8 array,
which is almost all call cost (argument checks, the GIL released and taken back, result objects).

The NumPy version is vectorised, idiomatic NumPy (grouped view, reductions, np.rint, bit packing
with shifts for 4 and 8 bits and np.packbits otherwise), not a loop. Needs only NumPy and kvpack.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Tuple

import numpy as np

# This script sits beside the package's sources, which lack the compiled module: import the
# installed wheel, not them.
_here = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
import kvpack  # noqa: E402


# --- The rule in NumPy ------------------------------------------------------------------------


def grouped(x: np.ndarray, group_size: int, axis: str) -> np.ndarray:
    m = x.T if axis == "token" else x
    rows, row_len = m.shape
    groups = -(-row_len // group_size)
    if groups * group_size == row_len:
        return np.ascontiguousarray(m).reshape(rows, groups, group_size)
    padded = np.zeros((rows, groups * group_size), dtype=np.float32)
    padded[:, :row_len] = m
    return padded.reshape(rows, groups, group_size)


def pack(values: np.ndarray, bits: int) -> np.ndarray:
    flat = values.reshape(-1)
    if bits == 8:
        return flat.copy()
    if bits == 4:
        if flat.size % 2:
            flat = np.append(flat, np.uint8(0))
        return flat[0::2] | (flat[1::2] << 4)
    planes = (flat[:, None] >> np.arange(bits, dtype=np.uint8)) & 1
    return np.packbits(planes.reshape(-1), bitorder="little")


def unpack(stream: np.ndarray, bits: int, count: int) -> np.ndarray:
    if bits == 8:
        return stream[:count]
    if bits == 4:
        out = np.empty(stream.size * 2, dtype=np.uint8)
        out[0::2] = stream & 0x0F
        out[1::2] = stream >> 4
        return out[:count]
    planes = np.unpackbits(stream, bitorder="little")[: count * bits].reshape(count, bits)
    return (planes << np.arange(bits, dtype=np.uint8)).sum(axis=1, dtype=np.uint8)


def numpy_encode(x, bits, group_size, axis, mode):
    """(codes, scales, zero points or None, offsets) as kvpack stores them."""
    g = grouped(x, group_size, axis)
    if mode == "symmetric":
        qmax = np.float32(2 ** (bits - 1) - 1)
        scale = np.abs(g).max(axis=2) / qmax
        scale[scale == 0] = 1
        q = np.clip(np.rint(g / scale[..., None]), -qmax, qmax) + qmax
        offsets, zero_points = None, None
    else:
        levels = np.float32(2**bits - 1)
        lo = np.minimum(g.min(axis=2), np.float32(0))
        hi = np.maximum(g.max(axis=2), np.float32(0))
        scale = (hi - lo) / levels
        flat = scale == 0
        scale[flat] = 1
        zero = np.clip(np.rint(-lo / scale), 0, levels)
        zero[flat] = 0
        q = np.clip(np.rint(g / scale[..., None]) + zero[..., None], 0, levels)
        offsets = zero.astype(np.uint8)
        zero_points = pack(offsets, bits)
    return pack(q.astype(np.uint8), bits), scale, zero_points, offsets


def numpy_decode(codes, scales, offsets, bits, group_size, axis, shape):
    rows, groups = scales.shape
    stored = unpack(codes, bits, rows * groups * group_size).reshape(rows, groups, group_size)
    offset = np.float32(2 ** (bits - 1) - 1) if offsets is None else offsets[..., None]
    values = (stored.astype(np.float32) - offset) * scales[..., None]
    n, d = shape
    values = values.reshape(rows, groups * group_size)
    return np.ascontiguousarray(values[:, :n].T if axis == "token" else values[:, :d])


# --- Timing -----------------------------------------------------------------------------------


def median_seconds(call: Callable[[], object], repeats: int, number: int = 1) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            call()
        times.append((time.perf_counter() - start) / number)
    times.sort()
    return times[(len(times) - 1) // 2]


def check_same(x, bits, group_size, axis, mode) -> Tuple[kvpack.PackedTensor, tuple]:
    packed = kvpack.encode(x, bits, group_size, axis=axis, mode=mode)
    ours = numpy_encode(x, bits, group_size, axis, mode)
    codes, scales, zero_points, offsets = ours
    assert codes.tobytes() == packed.codes.tobytes(), "codes differ"
    assert scales.astype(np.float32).tobytes() == packed.scales.tobytes(), "scales differ"
    if mode == "asymmetric":
        assert zero_points.tobytes() == packed.zero_points.tobytes(), "zero points differ"
    decoded = numpy_decode(codes, scales, offsets, bits, group_size, axis, x.shape)
    assert decoded.tobytes() == packed.decode().tobytes(), "decoded values differ"
    return packed, ours


def main(argv: Optional[list] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, smaller arrays")
    parser.add_argument("--tokens", type=int, default=None)
    parser.add_argument("--features", type=int, default=128)
    args = parser.parse_args(argv)
    tokens = args.tokens or (1024 if args.quick else 8192)
    repeats = 3 if args.quick else 7
    x = np.random.default_rng(20261202).standard_normal((tokens, args.features), dtype=np.float32)
    print(
        f"kvpack {kvpack.__version__} on {platform.machine()}, Python {platform.python_version()}, "
        f"NumPy {np.__version__}; input {tokens} x {args.features} float32 "
        f"({x.nbytes / 2**20:.1f} MiB), median of {repeats}"
    )
    print(f"{'case':<28}{'encode kvpack':>14}{'numpy':>11}{'ratio':>8}"
          f"{'decode kvpack':>15}{'numpy':>11}{'ratio':>8}")
    cases = [
        ("token", "symmetric", 4), ("feature", "symmetric", 4), ("token", "asymmetric", 4),
        ("feature", "asymmetric", 3), ("token", "symmetric", 8), ("feature", "symmetric", 8),
    ]
    for axis, mode, bits in cases:
        packed, (codes, scales, _zero_points, offsets) = check_same(x, bits, 32, axis, mode)
        enc_k = median_seconds(lambda: kvpack.encode(x, bits, 32, axis=axis, mode=mode), repeats)
        enc_n = median_seconds(lambda: numpy_encode(x, bits, 32, axis, mode), repeats)
        dec_k = median_seconds(packed.decode, repeats)
        dec_n = median_seconds(
            lambda: numpy_decode(codes, scales, offsets, bits, 32, axis, x.shape), repeats
        )
        label = f"{axis} {mode} {bits}-bit g32"
        print(f"{label:<28}{enc_k * 1e3:>11.2f} ms{enc_n * 1e3:>8.2f} ms{enc_n / enc_k:>7.1f}x"
              f"{dec_k * 1e3:>12.2f} ms{dec_n * 1e3:>8.2f} ms{dec_n / dec_k:>7.1f}x")
    small = np.random.default_rng(1).standard_normal((4, 8), dtype=np.float32)
    check_same(small, 4, 8, "token", "symmetric")
    packed = kvpack.encode(small, 4, 8)
    number = 2000 if args.quick else 20000
    enc = median_seconds(lambda: kvpack.encode(small, 4, 8), repeats, number)
    dec = median_seconds(packed.decode, repeats, number)
    enc_n = median_seconds(lambda: numpy_encode(small, 4, 8, "token", "symmetric"), repeats, number // 10)
    print(f"per call on a 4 x 8 array: kvpack.encode {enc * 1e6:.2f} us, decode {dec * 1e6:.2f} us "
          f"(the NumPy encode: {enc_n * 1e6:.1f} us)")


if __name__ == "__main__":
    main()
