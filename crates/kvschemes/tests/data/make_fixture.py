"""The llama.cpp cache types' bytes on real SmolLM2 keys and values, written by gguf-py.

Reads the archived K and V of evidence/real-smollm2 (text 0, 512 tokens, layers 0, 15 and 29,
KV heads 0 to 2: [tokens, head_dim = 64] float32 each), quantizes every token's row with
gguf-py 0.19.0's own `gguf.quants.quantize` (q4_0, q4_1, q5_0, q8_0; gguf-py has no IQ4_NL
quantizer, so iq4_nl's bytes come from the C rule of `quantize_row_iq4_nl_ref` written out in
NumPy below, from ggml-org/ggml d99724f2 `ggml-quants.c` l.28-37 and l.4966-5113), and records
the SHA-256 of each type's blocks, arrays in the listed order, rows in token order. The `+rot`
entries first multiply each row by llama.cpp's 64 x 64 Walsh-Hadamard matrix (entries +-1/8),
summing in index order in float32, as crates/kvschemes does.

    python3 make_fixture.py ../../../../evidence/real-smollm2/arrays.npz > gguf_py.json

Needs numpy and gguf==0.19.0. crates/kvschemes/tests/gguf_py.rs checks the crate against it.
"""

import hashlib
import json
import sys

import gguf
import numpy as np

ARRAYS = [f"t0_n512_l{layer}_h{head}_{side}" for layer in (0, 15, 29) for head in range(3) for side in "kv"]
TYPES = {
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
    "q5_0": gguf.GGMLQuantizationType.Q5_0,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
}
IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def hadamard(n: int) -> np.ndarray:
    h = np.zeros((n, n), np.float32)
    h[0, 0] = np.float32(1.0 / float(np.sqrt(np.float32(n))))
    s = 1
    while s < n:
        h[s : 2 * s, :s] = h[:s, :s]
        h[:s, s : 2 * s] = h[:s, :s]
        h[s : 2 * s, s : 2 * s] = -h[:s, :s]
        s *= 2
    return h


def rotate(x: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Each row times h (symmetric), summed over the index in order, in float32."""
    out = np.zeros_like(x)
    for j in range(h.shape[0]):
        out = (out + x[:, j : j + 1] * h[j][None, :]).astype(np.float32)
    return out


def best_index(x: np.float32) -> int:
    if x <= IQ4NL[0]:
        return 0
    if x >= IQ4NL[15]:
        return 15
    ml, mu = 0, 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < IQ4NL[mav]:
            mu = mav
        else:
            ml = mav
    return mu - 1 if x - IQ4NL[mu - 1] < IQ4NL[mu] - x else mu


def iq4_nl_block(x: np.ndarray) -> bytes:
    f = np.float32
    amax, mx = f(0), f(0)
    for v in x:
        if amax < abs(v):
            amax, mx = abs(v), v
    if amax < f(1e-15):
        # ggml leaves the indices unwritten here; crates/kvschemes writes index 8.
        return np.float16(0).tobytes() + bytes([0x88] * 16)
    d = f(mx / f(-127))
    inv = f(f(1) / d)
    codes, sumqx, sumq2 = [], f(0), f(0)
    for v in x:
        l = best_index(f(inv * v))
        codes.append(l)
        q, w = IQ4NL[l], f(v * v)
        sumqx = f(sumqx + f(f(w * q) * v))
        sumq2 = f(sumq2 + f(f(w * q) * q))
    d = f(sumqx / sumq2) if sumq2 > 0 else f(0)
    qs = bytes((codes[j] & 0xF) | (codes[j + 16] << 4) for j in range(16))
    return np.float16(d).tobytes() + qs


def main(path: str) -> None:
    arrays = np.load(path)
    rows = {name: arrays[name].astype(np.float32) for name in ARRAYS}
    h64 = hadamard(64)
    digests = {}
    for rot in (False, True):
        for name, qtype in TYPES.items():
            digest = hashlib.sha256()
            for array in ARRAYS:
                x = rotate(rows[array], h64) if rot else rows[array]
                digest.update(gguf.quants.quantize(x, qtype).tobytes())
            digests[name + ("+rot" if rot else "")] = digest.hexdigest()
        digest = hashlib.sha256()
        for array in ARRAYS:
            x = rotate(rows[array], h64) if rot else rows[array]
            for block in x.reshape(-1, 32):
                digest.update(iq4_nl_block(block))
        digests["iq4_nl" + ("+rot" if rot else "")] = digest.hexdigest()
    json.dump(
        {
            "source": "evidence/real-smollm2/arrays.npz",
            "arrays": ARRAYS,
            "made_by": {"gguf": gguf.__version__ if hasattr(gguf, "__version__") else "0.19.0", "numpy": np.__version__},
            "iq4_nl": "the C rule of quantize_row_iq4_nl_ref in NumPy (gguf-py has no IQ4_NL quantizer)",
            "sha256": digests,
        },
        sys.stdout,
        indent=1,
    )
    print()


if __name__ == "__main__":
    main(sys.argv[1])
