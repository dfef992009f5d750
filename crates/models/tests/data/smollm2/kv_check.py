"""Independent float64 check of SmolLM2 on a second text, for `tests/models/smollm2.rs`.

Run from the workspace root after `scripts/fetch-models` (numpy 2.4.6, gguf 0.19.0,
tokenizers 0.23.3; about a minute on 2 cores):

    python3 crates/models/tests/data/smollm2/kv_check.py \
        model-cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        crates/models/tests/data/smollm2/kv_check.npz

It writes `kv_check.npz`: `ids` [T] (int64), `l{0,15,29}_k` and `l{0,15,29}_v`
[3, T, 64] (K after RoPE, float32) and `logits_last` [49152] (float32).

Written from the model's description (shared/reference/real-models/smollm2/README.md), not from
the Rust code: weights dequantized by `gguf.quants.dequantize` (float32, as ggml) then float64;
every activation float64; RoPE on adjacent channel pairs (2i, 2i+1) with angle
pos * base^(-2i/64); query head h reads KV head h // 3; causal softmax(q k^T / 8); no BOS.
Token ids come from Hugging Face `tokenizers` with a BPE model built from the GGUF's tokens and
merges and the pre-tokenizer Sequence[Digits(individual_digits=True),
ByteLevel(add_prefix_space=False, use_regex=True)].
"""

import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

TEXT = (
    "A KV cache keeps the keys and values of every earlier token, so each new token only "
    "computes its own; storing them in 4 bits instead of 16 cuts the memory by about 3.5x, "
    "at the cost of a small error in attention."
)
LAYERS = (0, 15, 29)


def main(gguf_path, out_path):
    reader = GGUFReader(gguf_path)
    fields = reader.fields

    def scalar(key):
        return fields[key].contents()

    def strings(key):
        f = fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    from tokenizers import Tokenizer, models, pre_tokenizers

    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ")) for m in strings("tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    ids = np.array(tok.encode(TEXT).ids, dtype=np.int64)

    weights = {}
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float64)
        weights[t.name] = w
    n_layer = scalar("llama.block_count")
    n_head = scalar("llama.attention.head_count")
    n_kv = scalar("llama.attention.head_count_kv")
    base = float(scalar("llama.rope.freq_base"))
    eps = float(np.float32(scalar("llama.attention.layer_norm_rms_epsilon")))
    hd = weights["token_embd.weight"].shape[1] // n_head
    T = len(ids)

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    pos = np.arange(T, dtype=np.float64)[:, None]
    inv = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    cos, sin = np.cos(pos * inv), np.sin(pos * inv)  # [T, hd/2]

    def rope(x):  # [heads, T, hd]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    def heads(y, n):  # [T, n*hd] -> [n, T, hd]
        return y.reshape(T, n, hd).transpose(1, 0, 2)

    x = weights["token_embd.weight"][ids]
    saved = {"ids": ids}
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for layer in range(n_layer):
        w = lambda part: weights[f"blk.{layer}.{part}.weight"]
        h = rms(x, w("attn_norm"))
        q = rope(heads(h @ w("attn_q").T, n_head))
        k = rope(heads(h @ w("attn_k").T, n_kv))
        v = heads(h @ w("attn_v").T, n_kv)
        if layer in LAYERS:
            saved[f"l{layer}_k"] = k.astype(np.float32)
            saved[f"l{layer}_v"] = v.astype(np.float32)
        kv = np.arange(n_head) // (n_head // n_kv)
        scores = q @ k[kv].transpose(0, 2, 1) / np.sqrt(hd) + mask
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        att = (p @ v[kv]).transpose(1, 0, 2).reshape(T, n_head * hd)
        x = x + att @ w("attn_output").T
        h = rms(x, w("ffn_norm"))
        g = h @ w("ffn_gate").T
        x = x + ((g / (1 + np.exp(-g))) * (h @ w("ffn_up").T)) @ w("ffn_down").T
    logits = rms(x[-1], weights["output_norm.weight"]) @ weights["token_embd.weight"].T
    saved["logits_last"] = logits.astype(np.float32)
    # Uncompressed: the npz reader in the Rust tests has no deflate (and floats barely compress).
    np.savez(out_path, **saved)
    print(f"{T} tokens; argmax {int(np.argmax(logits))}; wrote {out_path}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
