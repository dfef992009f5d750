#!/usr/bin/env python3
"""Times the `bench` binary's operations as one would write them in NumPy, on the same sizes,
with memcpy (np.copyto of 256 MiB) measured in the same process, so the two can be set side by
side as ratios (docs/speed.md).

    python3 scripts/bench-numpy.py [--quick] [--json] [--compare BENCH_JSON]
    python3 scripts/bench-numpy.py --serve        # what `bench --numpy` runs

With --compare, the cases are also set beside the same cases of a `bench --json` run (a file
of its JSON lines), as a markdown table of both ratios to memcpy and their quotient. Two runs
minutes apart can sit in different phases of a shared VM (memcpy moved between 4.1 and 10.7 GB/s
within hours on this project's), so prefer `bench --numpy`, which times each NumPy case right
after its own, in one run: it starts this script with --serve and sends it one JSON line per case
(the case's key, its shape, warm-up and repeat counts); the script makes that case's input,
times it and answers one JSON line ({"median_s": ...}, or {"unsupported": ...}).

The NumPy versions are idiomatic, vectorised code (the way the seed studies were written), not
this project's codec: symmetric and asymmetric 4- and 8-bit KV groups along features and tokens
(the token axis pays for the transpose, as a NumPy user would), GPTQ 4-bit qweight packing, and,
when gguf-py is installed (`pip install gguf`), its NumPy Q4_0 / Q8_0 quantizers. Only NumPy is
required. Medians of 5 timed calls after one warm-up (3 with --quick), like `bench`.
"""

import argparse
import json
import sys
import time

import numpy as np

MEMCPY_BYTES = 256 << 20
FEATURES = 128


def median_seconds(call, repeats):
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[(len(times) - 1) // 2]


def row(op, fmt, nbytes, seconds, memcpy_gbps, mode=None, axis=None, bits=None, group_size=None):
    gbps = nbytes / seconds / 1e9
    return {
        "op": op, "format": fmt, "mode": mode, "axis": axis, "bits": bits,
        "group_size": group_size, "bytes": nbytes, "median_s": seconds, "gbps": gbps,
        "memcpy_gbps": memcpy_gbps, "ratio": gbps / memcpy_gbps, "threads": 1,
        "implementation": "numpy " + np.__version__,
    }


def pack(codes, bits):
    """b-bit codes (uint8, last axis even) into bytes, even element in the low nibble."""
    if bits == 8:
        return codes
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack(packed, bits):
    if bits == 8:
        return packed
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out


def grouped(x, axis, group):
    """The grouped view: rows of groups of `group` consecutive values."""
    rows = np.ascontiguousarray(x.T) if axis == "token" else x
    return rows.reshape(rows.shape[0], -1, group)


def encode(x, axis, mode, bits, group):
    g = grouped(x, axis, group)
    if mode == "symmetric":
        qmax = np.float32(2 ** (bits - 1) - 1)
        scale = np.abs(g).max(axis=-1) / qmax
        scale[scale == 0] = 1
        codes = np.clip(np.rint(g / scale[..., None]), -qmax, qmax) + qmax
        return pack(codes.astype(np.uint8), bits), scale, None
    levels = np.float32(2 ** bits - 1)
    lo = np.minimum(g.min(axis=-1), 0)
    hi = np.maximum(g.max(axis=-1), 0)
    scale = (hi - lo) / levels
    scale[scale == 0] = 1
    zero = np.clip(np.rint(-lo / scale), 0, levels)
    codes = np.clip(np.rint(g / scale[..., None]) + zero[..., None], 0, levels)
    return pack(codes.astype(np.uint8), bits), scale, zero.astype(np.uint8)


def decode(packed, scale, zero, axis, mode, bits, shape):
    codes = unpack(packed, bits).astype(np.float32)
    offset = np.float32(2 ** (bits - 1) - 1) if mode == "symmetric" else zero[..., None]
    values = (codes - offset) * scale[..., None]
    values = values.reshape(values.shape[0], -1)
    return np.ascontiguousarray(values.T) if axis == "token" else values


def gptq_pack(codes):
    k, n = codes.shape
    qweight = np.zeros((k // 8, n), dtype=np.uint32)
    for i in range(8):
        qweight |= codes[i::8, :].astype(np.uint32) << (4 * i)
    return qweight.view(np.int32)


def gptq_unpack(qweight):
    words = qweight.view(np.uint32)
    out = np.empty((words.shape[0] * 8, words.shape[1]), dtype=np.uint8)
    for i in range(8):
        out[i::8, :] = (words >> (4 * i)) & 0xF
    return out


def gguf_quants():
    try:
        from gguf import GGMLQuantizationType, quants
    except ImportError:
        return None
    return GGMLQuantizationType, quants


class Inputs:
    """Each case's input, made once per (kind, shape) and kept until another is asked for, so
    that a case's encode and decode share one array and memory holds one case at a time."""

    def __init__(self):
        self.key = None
        self.value = None

    def get(self, kind, shape, make):
        if self.key != (kind, shape):
            self.value = None
            self.value = make()
            self.key = (kind, shape)
        return self.value


def case_call(req, inputs):
    """The call timing one case (a dict with the keys of KEY and a shape), and the bytes it
    counts; None when NumPy has no version of it."""
    op, fmt, bits = req["op"], req["format"], req.get("bits")
    shape = tuple(req["shape"])
    if fmt == "kv" and bits in (4, 8) and op in ("encode", "decode"):
        tokens, features = shape
        group, axis, mode = req["group_size"], req["axis"], req["mode"]
        if (features if axis == "feature" else tokens) % group:
            return None
        x = inputs.get("kv", shape, lambda: np.random.default_rng(11).standard_normal(
            shape, dtype=np.float32))
        if op == "encode":
            return (lambda: encode(x, axis, mode, bits, group)), x.nbytes
        packed, scale, zero = encode(x, axis, mode, bits, group)
        return (lambda: decode(packed, scale, zero, axis, mode, bits, shape)), x.nbytes
    if fmt == "gptq" and bits == 4 and op in ("pack", "unpack"):
        codes = inputs.get("codes", shape, lambda: np.random.default_rng(13).integers(
            0, 16, size=shape, dtype=np.uint8))
        if op == "pack":
            return (lambda: gptq_pack(codes)), codes.nbytes
        qweight = gptq_pack(codes)
        return (lambda: gptq_unpack(qweight)), codes.nbytes
    if fmt in ("Q4_0", "Q8_0") and op in ("quantize", "dequantize"):
        found = gguf_quants()
        if found is None:
            return None
        types, quants = found
        qtype = getattr(types, fmt)
        w = inputs.get("gguf", shape, lambda: np.random.default_rng(17).standard_normal(
            shape, dtype=np.float32))
        if op == "quantize":
            return (lambda: quants.quantize(w, qtype)), w.nbytes
        blocks = quants.quantize(w, qtype)
        return (lambda: quants.dequantize(blocks, qtype)), w.nbytes
    return None


def memcpy_seconds(repeats):
    src = np.arange(MEMCPY_BYTES // 4, dtype=np.float32)
    dst = np.empty_like(src)
    return median_seconds(lambda: np.copyto(dst, src), repeats)


def serve():
    """Answers `bench --numpy`: one JSON request per line on stdin, one JSON answer per line."""
    inputs = Inputs()
    implementation = "numpy " + np.__version__
    if gguf_quants() is not None:
        from importlib.metadata import version
        implementation += ", gguf-py " + version("gguf")
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "memcpy":
                answer = {"median_s": memcpy_seconds(req["repeats"]), "bytes": MEMCPY_BYTES}
            else:
                found = case_call(req, inputs)
                if found is None:
                    answer = {"unsupported": "no NumPy version of this case"}
                else:
                    call, nbytes = found
                    for _ in range(max(req["warmup"] - 1, 0)):
                        call()
                    answer = {"median_s": median_seconds(call, req["repeats"]), "bytes": nbytes}
            answer["implementation"] = implementation
        except Exception as err:  # the bench reports it and stops
            answer = {"error": f"{type(err).__name__}: {err}"}
        print(json.dumps(answer), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", action="store_true",
                        help="answer `bench --numpy`'s requests on stdin (module docs)")
    parser.add_argument("--compare", metavar="BENCH_JSON",
                        help="a file of `bench --json` lines to set beside these cases")
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    repeats = 3 if args.quick else 5
    tokens = 1 << 13 if args.quick else 1 << 18
    memcpy_gbps = MEMCPY_BYTES / memcpy_seconds(repeats) / 1e9
    print(f"bench-numpy: memcpy (np.copyto of 256 MiB): {memcpy_gbps:.2f} GB/s", file=sys.stderr)

    k, n = (1 << 10, 1 << 11) if args.quick else (1 << 13, 1 << 14)
    values = (1 << 20) if args.quick else (1 << 25)
    requests = []
    for mode in ["symmetric", "asymmetric"]:
        for axis in ["feature", "token"]:
            for bits in [4, 8]:
                for op in ["encode", "decode"]:
                    requests.append({"op": op, "format": "kv", "mode": mode, "axis": axis,
                                     "bits": bits, "group_size": 32,
                                     "shape": [tokens, FEATURES]})
    for op in ["pack", "unpack"]:
        requests.append({"op": op, "format": "gptq", "bits": 4, "group_size": 128,
                         "shape": [k, n]})
    if gguf_quants() is None:
        print("bench-numpy: gguf-py not installed; GGUF cases skipped", file=sys.stderr)
    else:
        for fmt in ["Q4_0", "Q8_0"]:
            for op in ["quantize", "dequantize"]:
                requests.append({"op": op, "format": fmt, "shape": [values // 4096, 4096]})
    inputs = Inputs()
    rows = []
    for req in requests:
        call, nbytes = case_call(req, inputs)
        rows.append(row(req["op"], req["format"], nbytes, median_seconds(call, repeats),
                        memcpy_gbps, req.get("mode"), req.get("axis"), req.get("bits"),
                        req.get("group_size")))

    if args.compare:
        compare(rows, args.compare)
        return
    for r in rows:
        if args.json:
            print(json.dumps(r))
        else:
            print(f"{r['format']:6} {r['op']:10} {r['mode'] or '-':10} {r['axis'] or '-':8} "
                  f"{r['bits'] or '-':>4} {r['gbps']:7.2f} GB/s {r['ratio']:6.3f}x memcpy")


KEY = ("op", "format", "mode", "axis", "bits", "group_size")


def compare(rows, path):
    """Prints NumPy's rows beside the same cases of a bench run, as a markdown table."""
    with open(path) as f:
        bench = {tuple(r[k] for k in KEY): r for r in map(json.loads, f)
                 if r.get("op") and "implementation" not in r}
    print("| case | bench (x memcpy) | NumPy (x memcpy) | bench / NumPy |")
    print("|---|---:|---:|---:|")
    for r in rows:
        ours = bench.get(tuple(r[k] for k in KEY))
        if ours is None:
            continue
        words = [r["mode"], f"{r['bits']}-bit" if r["bits"] else None,
                 f"g{r['group_size']}" if r["group_size"] else None,
                 f"{r['axis']} axis" if r["axis"] else None, r["format"], r["op"]]
        case = " ".join(w for w in words if w)
        print(f"| {case} | {ours['ratio']:.2f} | {r['ratio']:.3f} | "
              f"{ours['ratio'] / r['ratio']:.0f}x |")


if __name__ == "__main__":
    main()
