"""Independent float64 check of the packed-cache quality numbers on a second text, for
`crates/quality/tests/quality/smollm2.rs`.

Run from the workspace root after `scripts/fetch-models` (numpy 2.4.6, gguf 0.19.0 (gguf-py),
tokenizers 0.23.3 for the ids only; about a minute on 2 cores):

    python3 crates/quality/tests/data/quality_check.py \
        "$KVPACK_MODELS/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
        crates/quality/tests/data/quality_check.npz

It writes `quality_check.npz` (uncompressed): `ids` [T] (int64); `nll_f32`, `nll_q4_prefill`,
`kl_q4_prefill` (float64 scalars) and their per-position arrays `*_pos` [T - 1].

Written from the model's and the quantizer's descriptions
(shared/reference/real-models/smollm2/README.md, "Perplexity reference"), not from the Rust
code. The forward pass is that of `crates/models/tests/data/smollm2/kv_check.py` (weights
dequantized by `gguf.quants.dequantize`, every activation float64, RoPE on adjacent pairs,
query head h reads KV head h // 3, no BOS). The 4-bit cache, prefill schedule: every layer's K
(after RoPE) and V, cast to float32, are quantized and decoded once before attention:
symmetric 4-bit, scale = max|x| / 7 over the group (float32 division), code =
round-half-to-even(x / scale) (float32 division, clipped to +-7; a group of zeros decodes to 0),
decoded = code * scale (float32). K: per KV head and per channel, groups of 32 consecutive
tokens (the last group partial, zero-padded, which does not change its max). V: per KV head
and per token, groups of 32 consecutive features. NLL = mean over positions i = 0..T-2 of
-log p(t_(i+1)); KL = mean over the same positions of sum_v p_f32(v) (log p_f32(v) - log
p_q4(v)); log-softmax with the max subtracted.
"""

import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

TEXT = (
    "The old lighthouse keeper climbed the spiral stairs every evening at dusk. He lit the "
    "lamp, wound the clockwork that turned the lens, and wrote the weather in a worn leather "
    "book. Ships passing the rocky point at night saw the beam sweep across the water twice a "
    "minute."
)
GROUP = 32


def quantize_groups(x):
    """Symmetric 4-bit round trip of float32 groups along the last axis (length GROUP)."""
    x = x.astype(np.float32)
    amax = np.max(np.abs(x), axis=-1, keepdims=True)
    scale = (amax / np.float32(7)).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1), scale)
    code = np.clip(np.rint((x / safe).astype(np.float32)), -7, 7)  # rint: half to even
    code = np.where(scale == 0, 0, code).astype(np.float32)
    return (code * scale).astype(np.float32)


def pack_k(k):
    """K [heads, T, d]: per head and channel, groups of GROUP consecutive tokens."""
    h, t, d = k.shape
    padded = -(-t // GROUP) * GROUP
    x = np.zeros((h, padded, d), dtype=np.float32)
    x[:, :t] = k.astype(np.float32)
    g = x.transpose(0, 2, 1).reshape(h, d, padded // GROUP, GROUP)
    back = quantize_groups(g).reshape(h, d, padded).transpose(0, 2, 1)
    return back[:, :t].astype(np.float64)


def pack_v(v):
    """V [heads, T, d]: per head and token, groups of GROUP consecutive features."""
    h, t, d = v.shape
    g = v.astype(np.float32).reshape(h, t, d // GROUP, GROUP)
    return quantize_groups(g).reshape(h, t, d).astype(np.float64)


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

    weights = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64) for t in reader.tensors}
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
    cos, sin = np.cos(pos * inv), np.sin(pos * inv)

    def rope(x):
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    def heads(y, n):
        return y.reshape(T, n, hd).transpose(1, 0, 2)

    mask = np.triu(np.full((T, T), -np.inf), 1)

    def forward(quantized):
        x = weights["token_embd.weight"][ids]
        for layer in range(n_layer):
            w = lambda part: weights[f"blk.{layer}.{part}.weight"]
            h = rms(x, w("attn_norm"))
            q = rope(heads(h @ w("attn_q").T, n_head))
            k = rope(heads(h @ w("attn_k").T, n_kv))
            v = heads(h @ w("attn_v").T, n_kv)
            if quantized:
                k, v = pack_k(k), pack_v(v)
            kv = np.arange(n_head) // (n_head // n_kv)
            scores = q @ k[kv].transpose(0, 2, 1) / np.sqrt(hd) + mask
            p = np.exp(scores - scores.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            att = (p @ v[kv]).transpose(1, 0, 2).reshape(T, n_head * hd)
            x = x + att @ w("attn_output").T
            h = rms(x, w("ffn_norm"))
            g = h @ w("ffn_gate").T
            x = x + ((g / (1 + np.exp(-g))) * (h @ w("ffn_up").T)) @ w("ffn_down").T
        logits = rms(x, weights["output_norm.weight"]) @ weights["token_embd.weight"].T
        m = logits.max(-1, keepdims=True)
        return (logits - m) - np.log(np.exp(logits - m).sum(-1, keepdims=True))

    lp_f32, lp_q4 = forward(False)[:-1], forward(True)[:-1]
    nxt = ids[1:]
    nll_f32 = -lp_f32[np.arange(T - 1), nxt]
    nll_q4 = -lp_q4[np.arange(T - 1), nxt]
    kl = (np.exp(lp_f32) * (lp_f32 - lp_q4)).sum(-1)
    np.savez(
        out_path,
        ids=ids,
        nll_f32=np.float64(nll_f32.mean()),
        nll_q4_prefill=np.float64(nll_q4.mean()),
        kl_q4_prefill=np.float64(kl.mean()),
        nll_f32_pos=nll_f32,
        nll_q4_prefill_pos=nll_q4,
        kl_q4_prefill_pos=kl,
    )
    print(
        f"{T} tokens; nll_f32 {nll_f32.mean():.6f}; nll_q4_prefill {nll_q4.mean():.6f}; "
        f"kl_q4_prefill {kl.mean():.6f}; wrote {out_path}"
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
