"""Independent float64 check of Gemma 3 270M on a second, 675-token text, for the Rust port.

Run from the workspace root after `scripts/fetch-models` (Python 3.11.7, numpy 2.4.6 with
OpenBLAS, gguf 0.19.0, sentencepiece 0.2.3, protobuf 7.36.2; 35 to 70 s on 2 cores, mostly
loading the weights; 3.6 GB of memory at peak; the model is in $KVPACK_MODELS/gemma3/ if that is set;
`python3 -m pip install sentencepiece==0.2.3 protobuf==7.36.2` brings the tokenizer):

    python3 crates/models/tests/data/gemma3/kv_check.py \
        model-cache/gemma3/gemma-3-270m-q4_k_m.gguf \
        crates/models/tests/data/gemma3/kv_check.npz \
        --public-npz ../shared/reference/real-models/gemma3/public.npz \
        --public-json crates/models/tests/data/gemma3/gemma3_public.json

The two `--public-*` options are optional: with them the script first runs itself on the public
prompt "The capital of France is" and prints the largest |diff| against every member of the
shared reference, and its greedy 16 tokens against the reference's.

It writes `kv_check.npz` (uncompressed `numpy.savez`):
  `ids` [T] int64 (BOS first), `text_utf8` [bytes] uint8, `positions` [P] int64
  (0..3, 508..515 and T-4..T-1: both sides of the sliding window's 512 edge, where the
  sliding layers stop seeing BOS), and at those positions only:
  `l{0,4,5,17}_q` [4, P, 256] float32 (after q-norm and RoPE, before the 1/16 scale),
  `l{0,4,5,17}_k` and `l{0,4,5,17}_v` [1, P, 256] float32 (k after k-norm and RoPE; v as
  projected), `hidden_final` [P, 640] float32 (after output_norm), `logits_top_ids` [P, 20]
  int64 and `logits_top` [P, 20] float32 (the 20 largest logits, largest first), and
  `logits_last` [262144] float32 (every logit of position T-1).
  Layers 0 and 4 are sliding-window layers; 5 and 17 are global.

Written from the model's description (shared/reference/real-models/gemma3/README.md), not from
the Rust code: weights dequantized by `gguf.quants.dequantize` (float32, as ggml) then float64;
every activation float64. x = E[id] * sqrt(640); RMSNorm x / sqrt(mean(x^2) + eps) * w with w
as stored (already 1 + w); q and k RMS-normed per head before NeoX RoPE on pairs (i, i + 128)
with angle pos * base^(-2i/256), base 1e6 on the global layers 5, 11, 17 and 1e4 elsewhere;
on the sliding layers (the others) query p1 sees key p0 iff p0 <= p1 and p1 - p0 < 512; softmax(q k^T / 16);
4 query heads share the one KV head; x += post_attention_norm(attn(attn_norm(x))), then
x += post_ffw_norm(down(gelu_tanh(gate h) * up h)) with h = ffn_norm(x); output_norm; logits
= hidden @ token_embd^T (tied), no softcapping.
Token ids come from Google's `sentencepiece` (BPE model) loaded from a ModelProto built from the
GGUF's tokens, scores and token types (identity normalizer, no dummy prefix, whitespace as U+2581,
byte fallback, `<unk>` as the unknown piece), with BOS (2) prepended as llama.cpp does
(tokenizer.ggml.add_bos_token = true, add_space_prefix = false). The script checks that it gives
[2, 818, 5279, 529, 7001, 563] for "The capital of France is"; transformers 5.23.0's GGUF
tokenizer conversion (tokenizers 0.23.3) gave the same 675 ids for TEXT.
"""

import argparse
import json
import math
import re
import time

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

TEXT = (
    "When a language model writes a sentence, it produces one token at a time, and every new token "
    "has to look back at all of the tokens that came before it. Inside each attention layer, the "
    "model turns every earlier token into two vectors: a key, which says what the token is about, "
    "and a value, which holds what the token will contribute if someone pays attention to it. The "
    "new token makes a query, compares that query with every key, turns the comparison scores into "
    "weights that add up to one, and takes the weighted average of the values.\n\n"
    "Computing those keys and values again for the whole history at every step would be wasteful, "
    "because they never change once a token has been read. So the program keeps them in memory, in "
    "what is called the key-value cache, or simply the KV cache. At each step it computes the key "
    "and value of the newest token only, appends them to the cache, and reads the rest back. This "
    "turns a cost that grows with the square of the length into one that grows in a straight line, "
    "and it is the main reason that chat programs can answer quickly.\n\n"
    "The price is memory. A small model with a few layers and one shared key head per layer may "
    "need only a few kilobytes for each token, but a large model serving many users at once can "
    "spend more memory on its caches than on its own weights. On many machines the speed of generation is "
    "then limited not by arithmetic but by how fast the cache can be moved from memory to the "
    "processor.\n\n"
    "There are several ways to shrink it. Some models let several query heads share the same key "
    "and value head, which divides the cache by the size of the group. Others use a sliding window: "
    "a layer only looks at the most recent few hundred tokens, so anything older can be thrown "
    "away, while a few global layers still see the whole text. The model in this test mixes both "
    "ideas. Five layers out of every six look at a window of the latest tokens, and the sixth looks "
    "at everything, so the first token of the prompt eventually falls out of view for most layers "
    "but never for all of them.\n\n"
    "A third way is to store the numbers with fewer bits. Instead of keeping each key and value as a "
    "sixteen-bit float, the cache can keep a short integer code together with a scale and an offset "
    "for each small group of numbers. Reading a key then means multiplying the code by the scale and "
    "adding the offset, which is cheap compared with fetching twice as many bytes. The danger is "
    "that small errors in the keys change which earlier tokens receive attention, and small errors "
    "in the values change what is read from them. Whether those errors matter depends on the model, "
    "the layer and the text, which is why careful tests compare every intermediate step of the "
    "computation against an independent reference before trusting a new design.\n\n"
    "Such a reference does not need to be fast. It needs to be simple enough to read in one "
    "sitting, precise enough that rounding does not hide a real mistake, and written by someone "
    "who followed the description of the model rather than the code being checked. When the two "
    "agree at the first position, near the edge of the window, and at the very end of a long "
    "passage, one can be fairly confident that the positions, the masks and the rotations have all "
    "been handled the same way."
)

LAYERS = (0, 4, 5, 17)
PUBLIC_TEXT = "The capital of France is"
PUBLIC_IDS = [2, 818, 5279, 529, 7001, 563]
TOP = 20


def build_tokenizer(reader):
    from sentencepiece import SentencePieceProcessor
    from sentencepiece import sentencepiece_model_pb2 as pb

    f = reader.fields
    tok_field = f["tokenizer.ggml.tokens"]
    tokens = [bytes(tok_field.parts[i]).decode("utf-8") for i in tok_field.data]
    scores = f["tokenizer.ggml.scores"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    special = {k: int(f[f"tokenizer.ggml.{k}"].contents()) for k in
               ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")}
    assert f["tokenizer.ggml.model"].contents() == "llama"
    assert f["tokenizer.ggml.add_bos_token"].contents() is True
    assert f["tokenizer.ggml.add_space_prefix"].contents() is False

    m = pb.ModelProto()
    ts = m.trainer_spec
    ts.model_type = pb.TrainerSpec.BPE
    ts.vocab_size = len(tokens)
    ts.byte_fallback = True
    ts.unk_id, ts.bos_id = special["unknown_token_id"], special["bos_token_id"]
    ts.eos_id, ts.pad_id = special["eos_token_id"], special["padding_token_id"]
    ts.unk_piece, ts.bos_piece = tokens[ts.unk_id], tokens[ts.bos_id]
    ts.eos_piece, ts.pad_piece = tokens[ts.eos_id], tokens[ts.pad_id]
    ns = m.normalizer_spec
    ns.name = "identity"
    ns.add_dummy_prefix = False
    ns.remove_extra_whitespaces = False
    ns.escape_whitespaces = True
    for i, (t, s, ty) in enumerate(zip(tokens, scores, types)):
        p = m.pieces.add()
        p.piece, p.score = t, float(s)
        # GGUF token types use SentencePiece's numbering; the GGUF marks <unk> CONTROL.
        p.type = pb.ModelProto.SentencePiece.UNKNOWN if i == ts.unk_id else int(ty)
    sp = SentencePieceProcessor()
    sp.LoadFromSerializedProto(m.SerializeToString())
    return lambda text: sp.encode(text, add_bos=True), tokens


def load_model(reader):
    f = reader.fields
    arch = f["general.architecture"].contents()
    cfg = {k: f[f"{arch}.{k}"].contents() for k in (
        "block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
        "attention.key_length", "attention.value_length", "rope.freq_base",
        "attention.sliding_window", "attention.layer_norm_rms_epsilon")}
    for absent in ("rope.freq_base_swa", "final_logit_softcapping", "rope.dimension_count",
                   "attention.sliding_window_pattern"):
        assert f"{arch}.{absent}" not in f, absent
    assert not any(t.name == "output.weight" for t in reader.tensors)
    weights = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64) for t in reader.tensors}
    return cfg, weights


def forward(cfg, W, ids, keep_layers=(), out_pos=None, extras=False):
    """Float64 forward over ids at positions 0..T-1. Returns hidden_final and logits at out_pos
    (default: every position) and, for keep_layers, q/k/v at every position."""
    T = len(ids)
    d = cfg["embedding_length"]
    n_head, n_kv = cfg["attention.head_count"], cfg["attention.head_count_kv"]
    hd = cfg["attention.key_length"]
    assert cfg["attention.value_length"] == hd
    eps = float(cfg["attention.layer_norm_rms_epsilon"])
    window = cfg["attention.sliding_window"]
    n_layer = cfg["block_count"]

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    pos = np.arange(T, dtype=np.float64)[:, None]
    half = hd // 2

    def rope_tables(base):
        ang = pos * base ** (-2.0 * np.arange(half, dtype=np.float64) / hd)  # [T, 128]
        return np.cos(ang), np.sin(ang)

    tables = {"global": rope_tables(float(cfg["rope.freq_base"])), "sliding": rope_tables(1e4)}

    def rope(x, cs):  # NeoX: pairs (i, i + 128)
        cos, sin = cs
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)

    p1 = np.arange(T)[:, None]
    p0 = np.arange(T)[None, :]
    masks = {
        "global": np.where(p0 <= p1, 0.0, -np.inf),
        "sliding": np.where((p0 <= p1) & (p1 - p0 < window), 0.0, -np.inf),
    }

    def heads(y, n):  # [T, n*hd] -> [n, T, hd]
        return y.reshape(T, n, hd).transpose(1, 0, 2)

    def gelu_tanh(x):
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    out = {}
    x = W["token_embd.weight"][ids] * math.sqrt(d)
    if extras:
        out["embd"] = x.copy()
    kv_of = np.arange(n_head) // (n_head // n_kv)
    for L in range(n_layer):
        w = lambda part: W[f"blk.{L}.{part}.weight"]
        kind = "sliding" if L % 6 < 5 else "global"
        h = rms(x, w("attn_norm"))
        q = rope(rms(heads(h @ w("attn_q").T, n_head), w("attn_q_norm")), tables[kind])
        k = rope(rms(heads(h @ w("attn_k").T, n_kv), w("attn_k_norm")), tables[kind])
        v = heads(h @ w("attn_v").T, n_kv)
        if L in keep_layers:
            out[f"l{L}_q"], out[f"l{L}_k"], out[f"l{L}_v"] = q, k, v
        s = q @ k[kv_of].transpose(0, 2, 1) / math.sqrt(hd) + masks[kind]
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        att = (s @ v[kv_of]).transpose(1, 0, 2).reshape(T, n_head * hd)
        x = x + rms(att @ w("attn_output").T, w("post_attention_norm"))
        h = rms(x, w("ffn_norm"))
        ff = (gelu_tanh(h @ w("ffn_gate").T) * (h @ w("ffn_up").T)) @ w("ffn_down").T
        x = x + rms(ff, w("post_ffw_norm"))
        if extras:
            out[f"l{L}_out"] = x.copy()
    if extras:
        out["hidden_prenorm"] = x.copy()
    rows = np.arange(T) if out_pos is None else np.asarray(out_pos)
    hidden = rms(x[rows], W["output_norm.weight"])
    out["hidden_final"] = hidden
    out["logits"] = hidden @ W["token_embd.weight"].T
    return out


def self_check(cfg, W, encode, npz_path, json_path):
    ids = encode(PUBLIC_TEXT)
    assert ids == PUBLIC_IDS, ids
    ref = np.load(npz_path)
    assert list(ref["ids"]) == PUBLIC_IDS
    o = forward(cfg, W, ids, keep_layers=range(cfg["block_count"]), extras=True)
    o["logits_f64"] = o["logits"][-1]
    o["logits"] = o["logits"][-1]
    worst = {}
    for name in ref.files:
        if name in ("ids", "mode"):
            continue
        diff = np.abs(o[name] - ref[name].astype(np.float64)).max()
        layered = re.fullmatch(r"l\d+_(\w+)", name)
        group = f"l*_{layered.group(1)}" if layered else name
        worst[group] = max(worst.get(group, 0.0), diff)
        scale = np.abs(ref[name]).max()
        worst[group + " (rel)"] = max(worst.get(group + " (rel)", 0.0), diff / scale)
    for name, v in worst.items():
        print(f"  public max|diff| {name:24s} {v:.3e}")
    greedy = list(ids)
    for _ in range(16):
        logits = forward(cfg, W, greedy, out_pos=[len(greedy) - 1])["logits"][0]
        greedy.append(int(np.argmax(logits)))
    with open(json_path) as fh:
        ref_greedy = json.load(fh)["greedy_16_ids"]
    same = sum(a == b for a, b in zip(greedy[len(ids):], ref_greedy))
    print(f"  public greedy 16: {greedy[len(ids):]} ({same}/16 equal to the reference)")
    return worst, same


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--public-npz")
    ap.add_argument("--public-json")
    args = ap.parse_args()

    t0 = time.time()
    reader = GGUFReader(args.model)
    encode, tokens = build_tokenizer(reader)
    cfg, W = load_model(reader)
    print(f"loaded in {time.time() - t0:.0f} s")
    if args.public_npz:
        t1 = time.time()
        self_check(cfg, W, encode, args.public_npz, args.public_json)
        print(f"self-check in {time.time() - t1:.0f} s")

    t1 = time.time()
    ids = np.array(encode(TEXT), dtype=np.int64)
    T = len(ids)
    assert T > 515 + 4, T
    positions = np.array(list(range(0, 4)) + list(range(508, 516)) + list(range(T - 4, T)),
                         dtype=np.int64)
    o = forward(cfg, W, ids, keep_layers=LAYERS, out_pos=positions)
    saved = {"ids": ids, "text_utf8": np.frombuffer(TEXT.encode("utf-8"), dtype=np.uint8),
             "positions": positions}
    for L in LAYERS:
        for part in "qkv":
            saved[f"l{L}_{part}"] = o[f"l{L}_{part}"][:, positions].astype(np.float32)
    saved["hidden_final"] = o["hidden_final"].astype(np.float32)
    logits = o["logits"]
    top = np.argsort(-logits, axis=-1, kind="stable")[:, :TOP]
    saved["logits_top_ids"] = top.astype(np.int64)
    saved["logits_top"] = np.take_along_axis(logits, top, axis=-1).astype(np.float32)
    assert positions[-1] == T - 1
    saved["logits_last"] = logits[-1].astype(np.float32)
    # Uncompressed: the npz reader in the Rust tests has no deflate (and floats barely compress).
    np.savez(args.out, **saved)
    nxt = int(top[-1, 0])
    print(f"{T} tokens; positions {positions.tolist()}; last argmax {nxt} {tokens[nxt]!r}; "
          f"forward in {time.time() - t1:.0f} s; total {time.time() - t0:.0f} s; wrote {args.out}")


if __name__ == "__main__":
    main()
