"""Writes a real model's dequantization fixture from its GGUF file, with gguf-py as the oracle.

Usage (NumPy and gguf-py 0.19 only; run from anywhere):

    python3 make_gguf_fixture.py MODEL [path/to/file.gguf]

MODEL is `smollm2` or `gemma3`. The default path is the file `scripts/fetch-models` puts in
`model-cache/` at the workspace root (or under $KVPACK_MODELS). Writes into the folder MODEL/
next to this file:

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
from gguf import GGUFReader
from gguf.quants import dequantize

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[4]

# model -> (file under the model cache, {tensor name: row indices (rows of ne0) to copy out}).
MODELS = {
    "smollm2": (
        "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        {
            "token_embd.weight": [1, 49151],           # Q8_0
            "blk.0.attn_q.weight": [0, 1, 2, 575],     # Q4_1
            "blk.29.ffn_down.weight": [0, 287, 575],   # Q4_1
            "blk.0.attn_norm.weight": [0],             # F32, a single row
        },
    ),
    "gemma3": (
        "gemma3/gemma-3-270m-q4_k_m.gguf",
        {
            "token_embd.weight": [2, 262143],          # Q8_0
            "blk.0.attn_q.weight": [0, 1023],          # Q5_0
            "blk.0.attn_output.weight": [0, 639],      # Q4_K
            "blk.0.ffn_down.weight": [0, 1, 639],      # Q6_K
            "blk.2.ffn_down.weight": [5, 638],         # Q4_K
            "blk.2.attn_v.weight": [0, 255],           # Q5_0
            "blk.0.attn_k_norm.weight": [0],           # F32, a single row
        },
    ),
}


def f32_bytes(values):
    return np.ascontiguousarray(values, dtype="<f4").tobytes()


def main(model, path):
    out = HERE / model
    reader = GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    (out / "rows").mkdir(parents=True, exist_ok=True)

    rows = {}
    for name, indices in MODELS[model][1].items():
        t = tensors[name]
        raw = t.data.reshape(-1, t.data.shape[-1]) if t.data.ndim > 1 else t.data.reshape(1, -1)
        picked = np.ascontiguousarray(raw[indices])
        stored = picked.view(np.uint8).tobytes()
        values = dequantize(picked, t.tensor_type)
        assert values.shape == (len(indices), int(t.shape[0])), (name, values.shape)
        # The rows must dequantize as they do inside the whole tensor.
        whole = dequantize(t.data, t.tensor_type).reshape(-1, int(t.shape[0]))
        assert np.array_equal(whole[indices].view(np.uint32), values.view(np.uint32)), name
        (out / "rows" / f"{name}.bin").write_bytes(stored)
        (out / "rows" / f"{name}.f32").write_bytes(f32_bytes(values))
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

    (out / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    # One tensor per line, in file order.
    lines = [f" {json.dumps(name)}: {json.dumps(entry)}" for name, entry in hashes.items()]
    (out / "hashes.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in MODELS:
        sys.exit(f"usage: make_gguf_fixture.py {{{','.join(MODELS)}}} [file.gguf]")
    model = sys.argv[1]
    default = Path(os.environ.get("KVPACK_MODELS") or ROOT / "model-cache") / MODELS[model][0]
    main(model, sys.argv[2] if len(sys.argv) > 2 else default)
