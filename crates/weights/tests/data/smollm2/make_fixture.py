"""Writes the SmolLM2 dequantization fixture from the real GGUF, with gguf-py as the oracle.

Usage (NumPy and gguf-py 0.19 only; run from anywhere):

    python3 make_fixture.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]

The default path is `model-cache/smollm2/...` at the workspace root (or under $KVPACK_MODELS),
where `scripts/fetch-models` puts it. Writes, next to this file:

- `rows/<tensor>.bin`: the raw stored bytes (GGUF blocks, or f32 for a norm) of a few rows;
- `rows/<tensor>.f32`: gguf-py's `gguf.quants.dequantize` of those bytes, little-endian f32;
- `rows.json`: for each of those tensors its ggml type, row length and the row indices taken;
- `hashes.json`: for EVERY tensor of the file, its type, dims (ggml order, ne0 first) and the
  SHA-256 of gguf-py's dequantized values as little-endian f32 in the row-major order gguf-py
  returns them (rows of ne0 values).
"""

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType
from gguf.quants import dequantize

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[4]
FILE = "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# tensor name -> row indices (rows of ne0 elements) to copy out.
ROWS = {
    "token_embd.weight": [1, 49151],           # Q8_0
    "blk.0.attn_q.weight": [0, 1, 2, 575],     # Q4_1
    "blk.29.ffn_down.weight": [0, 287, 575],   # Q4_1
    "blk.0.attn_norm.weight": [0],             # F32, a single row
}


def f32_bytes(values):
    return np.ascontiguousarray(values, dtype="<f4").tobytes()


def main(path):
    reader = GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    (HERE / "rows").mkdir(exist_ok=True)

    rows = {}
    for name, indices in ROWS.items():
        t = tensors[name]
        raw = t.data.reshape(-1, t.data.shape[-1]) if t.data.ndim > 1 else t.data.reshape(1, -1)
        picked = np.ascontiguousarray(raw[indices])
        stored = picked.view(np.uint8).tobytes()
        values = dequantize(picked, t.tensor_type)
        assert values.shape == (len(indices), int(t.shape[0])), (name, values.shape)
        # The rows must dequantize as they do inside the whole tensor.
        whole = dequantize(t.data, t.tensor_type).reshape(-1, int(t.shape[0]))
        assert np.array_equal(whole[indices].view(np.uint32), values.view(np.uint32)), name
        (HERE / "rows" / f"{name}.bin").write_bytes(stored)
        (HERE / "rows" / f"{name}.f32").write_bytes(f32_bytes(values))
        rows[name] = {"type": t.tensor_type.name, "ne0": int(t.shape[0]), "rows": indices}

    hashes = {}
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type)
        assert values.dtype == np.float32 and values.size == int(np.prod(t.shape)), t.name
        hashes[t.name] = {
            "type": t.tensor_type.name,
            "dims": [int(d) for d in t.shape],
            "sha256": hashlib.sha256(f32_bytes(values)).hexdigest(),
        }

    (HERE / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    # One tensor per line, in file order.
    lines = [f" {json.dumps(name)}: {json.dumps(entry)}" for name, entry in hashes.items()]
    (HERE / "hashes.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")


if __name__ == "__main__":
    default = Path(os.environ.get("KVPACK_MODELS") or ROOT / "model-cache") / FILE
    main(sys.argv[1] if len(sys.argv) > 1 else default)
