"""kvpack.schemes against the schemes' sources: llama.cpp's cache types against gguf-py 0.19.0's
own quantize and dequantize (row by row, as llama.cpp stores each token), with and without the
Walsh-Hadamard rotation; the Hugging Face quanto cache against optimum-quanto's affine rule in
NumPy float32; KIVI against its quantizer's arithmetic in NumPy fp16, written from
jy-yuan/KIVI `quant/new_pack.py` l.217-252 (min and max per group, scale = (mx - mn) / (2^b - 1),
q = round_half_even(clamp((x - mn) / scale, 0, 2^b - 1)), all in fp16; decoded q * scale + mn in
f32 as its CUDA kernel does) and its cache policy (`models/llama_kivi.py`: keys quantized R = 128
at a time, values all but the last 128)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import kvpack

ROOT = Path(__file__).resolve().parents[2]
TYPES = {
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
    "q5_0": gguf.GGMLQuantizationType.Q5_0,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
}
BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q5_0": 22, "q8_0": 34, "iq4_nl": 18}


def real_kv(layer: int = 15):
    """The archived SmolLM2 K and V of one layer: [3 KV heads, 512 tokens, 64]."""
    with np.load(ROOT / "evidence" / "real-smollm2" / "arrays.npz") as arrays:
        k = np.stack([arrays[f"t0_n512_l{layer}_h{h}_k"] for h in range(3)])
        v = np.stack([arrays[f"t0_n512_l{layer}_h{h}_v"] for h in range(3)])
    return k.astype(np.float32), v.astype(np.float32)


def random_kv(heads=2, tokens=300, head_dim=64, seed=0):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((heads, tokens, head_dim), dtype=np.float32) * 3
    v = rng.standard_normal((heads, tokens, head_dim), dtype=np.float32)
    k[:, :, 5] *= 20  # an outlier channel, as real keys have
    v[0, 7] = 0.25  # a constant group
    return k, v


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
    """Each row (last axis, chunks of n) times h, summed from 0 in index order in float32."""
    n = h.shape[0]
    rows = x.reshape(-1, n)
    out = np.zeros_like(rows)
    for j in range(n):
        out = (out + rows[:, j : j + 1] * h[j][None, :]).astype(np.float32)
    return out.reshape(x.shape)


def llamacpp_reference(x: np.ndarray, name: str, rot: bool) -> np.ndarray:
    h = hadamard(64)
    rows = rotate(x, h) if rot else x
    flat = rows.reshape(-1, x.shape[-1])
    decoded = gguf.quants.dequantize(gguf.quants.quantize(flat, TYPES[name]), TYPES[name])
    decoded = decoded.astype(np.float32).reshape(x.shape)
    return rotate(decoded, h) if rot else decoded


@pytest.mark.parametrize("rot", [False, True])
@pytest.mark.parametrize("name", sorted(TYPES))
@pytest.mark.parametrize("data", ["real", "random"])
def test_llama_cpp_types_read_as_gguf_py_quantizes_each_token(name, rot, data):
    k, v = real_kv() if data == "real" else random_kv(tokens=40)
    scheme = f"llamacpp-{name}" + ("+rot" if rot else "")
    c = kvpack.schemes.cache(k, v, scheme)
    assert c.scheme == scheme
    assert c.quantized == (k.shape[1], k.shape[1])
    assert c.k.tobytes() == llamacpp_reference(k, name, rot).tobytes()
    assert c.v.tobytes() == llamacpp_reference(v, name, rot).tobytes()
    blocks = 2 * k.size // 32
    assert c.stored["total"] == blocks * BLOCK_BYTES[name]
    assert c.stored["full_precision"] == 0
    assert c.bits_per_element == BLOCK_BYTES[name] / 4


def kivi_groups(groups: np.ndarray, bits: int) -> np.ndarray:
    """KIVI's quantizer on float16 groups along the last axis, decoded to float32."""
    mn = groups.min(axis=-1, keepdims=True)
    mx = groups.max(axis=-1, keepdims=True)
    scale = (mx - mn) / np.float16(2**bits - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        data = (groups - mn) / scale
    q = np.round(np.clip(data, 0, 2**bits - 1))  # numpy rounds half to even, as torch.round
    q = np.where(scale == 0, 0, q)  # 0/0 in KIVI; every code decodes to mn there
    return q.astype(np.float32) * scale.astype(np.float32) + mn.astype(np.float32)


def kivi_reference(k: np.ndarray, v: np.ndarray, bits: int):
    heads, tokens, d = k.shape
    nk, nv = tokens // 128 * 128, max(0, tokens - 128)
    k_out, v_out = k.copy(), v.copy()
    k16, v16 = k.astype(np.float16), v.astype(np.float16)
    # Keys per channel: [heads, d, tokens] in groups of 32 tokens.
    kt = k16[:, :nk, :].transpose(0, 2, 1).reshape(heads, d, nk // 32, 32)
    k_out[:, :nk, :] = kivi_groups(kt, bits).reshape(heads, d, nk).transpose(0, 2, 1)
    # Values per token: groups of 32 channels.
    vg = v16[:, :nv, :].reshape(heads, nv, d // 32, 32)
    v_out[:, :nv, :] = kivi_groups(vg, bits).reshape(heads, nv, d)
    return k_out, v_out, nk, nv


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("data", ["real", "random"])
def test_kivi_reads_as_its_fp16_quantizer_and_residual_give(bits, data):
    k, v = real_kv(29) if data == "real" else random_kv()
    c = kvpack.schemes.cache(k, v, f"kivi{bits}")
    k_ref, v_ref, nk, nv = kivi_reference(k, v, bits)
    assert c.quantized == (nk, nv)
    np.testing.assert_array_equal(c.k, k_ref)
    np.testing.assert_array_equal(c.v, v_ref)
    assert c.k.tobytes() == k_ref.tobytes() and c.v.tobytes() == v_ref.tobytes()
    # Residual: the last tokens as given.
    assert c.k[:, nk:].tobytes() == k[:, nk:].tobytes()
    heads, tokens, d = k.shape
    groups = heads * (nk + nv) * d // 32
    assert c.stored == {
        "codes": groups * 32 * bits // 8,
        "metadata": groups * 4,
        "full_precision": heads * (2 * tokens - nk - nv) * d * 4,
        "outliers": 0,
        "total": groups * (32 * bits // 8 + 4) + heads * (2 * tokens - nk - nv) * d * 4,
    }


def quanto_reference(x: np.ndarray, bits: int) -> np.ndarray:
    """optimum-quanto's affine rule (max_optimizer.py l.26-37, quantize.py l.64-78, qbits.py
    l.42-45) on groups of 64 consecutive values, in float32 (the model's dtype)."""
    groups = x.reshape(-1, 64)
    rmin = groups.min(axis=1, keepdims=True)
    rmax = groups.max(axis=1, keepdims=True)
    scale = (rmax - rmin) / np.float32(2**bits - 1)
    shift = -rmin
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.clip(np.round((groups + shift) / scale), 0, 2**bits - 1)
    q = np.where(scale == 0, 0, q).astype(np.uint8)
    dqt = scale * q.astype(np.float32)
    dqt -= shift
    return dqt.reshape(x.shape)


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("data", ["real", "random"])
def test_hf_quanto_quantizes_the_prefill_at_once_as_quanto_does(bits, data):
    k, v = real_kv(0) if data == "real" else random_kv()
    c = kvpack.schemes.cache(k, v, f"hf-quanto{bits}")
    assert c.quantized == (k.shape[1], k.shape[1])
    assert c.k.tobytes() == quanto_reference(k, bits).tobytes()
    assert c.v.tobytes() == quanto_reference(v, bits).tobytes()
    groups = k.size // 64
    per_byte = 8 // bits
    assert c.stored == {
        "codes": 2 * (-(-groups // per_byte)) * 64,
        "metadata": 2 * groups * 8,
        "full_precision": 0,
        "outliers": 0,
        "total": 2 * (-(-groups // per_byte)) * 64 + 2 * groups * 8,
    }


@pytest.mark.parametrize("scheme, kb, vb, mode", [
    ("kvpack-k4v4", 4, 4, "symmetric"),
    ("kvpack-k8v4", 8, 4, "symmetric"),
    ("kvpack-k3v2-asym", 3, 2, "asymmetric"),
])
def test_the_codec_as_a_scheme_is_kvpack_encode_per_head(scheme, kb, vb, mode):
    k, v = real_kv(15)
    c = kvpack.schemes.cache(k, v, scheme)
    total = 0
    for h in range(k.shape[0]):
        pk = kvpack.encode(k[h], kb, 32, axis="token", mode=mode)
        pv = kvpack.encode(v[h], vb, 32, axis="feature", mode=mode)
        assert c.k[h].tobytes() == pk.decode().tobytes()
        assert c.v[h].tobytes() == pv.decode().tobytes()
        total += pk.payload_bytes + pv.payload_bytes
    assert c.stored["total"] == total and c.stored["full_precision"] == 0
    # Sinks stay as given; -edge8 holds the first and last layers at 8 bits.
    sunk = kvpack.schemes.cache(k, v, scheme + "-sink4")
    assert sunk.k[:, :4].tobytes() == k[:, :4].tobytes()
    assert sunk.k[:, 4:].tobytes() != c.k[:, 4:].tobytes()
    edge = kvpack.schemes.cache(k, v, scheme + "-edge8", layer=29, layers=30)
    eight = kvpack.schemes.cache(k, v, "kvpack-k8v8" + ("-asym" if mode == "asymmetric" else ""))
    assert edge.k.tobytes() == eight.k.tobytes()
    middle = kvpack.schemes.cache(k, v, scheme + "-edge8", layer=15, layers=30)
    assert middle.k.tobytes() == c.k.tobytes()
    with pytest.raises(ValueError, match="not one of the 30 layers"):
        kvpack.schemes.cache(k, v, scheme, layer=30, layers=30)


def test_one_head_in_gives_one_head_out_and_names_list_every_scheme():
    k, v = random_kv(heads=1, tokens=64)
    c = kvpack.schemes.cache(k[0], v[0], "llamacpp-q8_0")
    assert c.k.shape == (64, 64) and c.k.dtype == np.float32
    names = kvpack.schemes.names()
    assert len(names) == 25 and "kivi4" in names and "hf-quanto2" in names
    assert "kvquant4-first1" in names
    assert "kvpack-k8v4" in names and "llamacpp-iq4_nl+rot" in names


def test_bad_input_is_refused_by_name():
    k, v = random_kv(tokens=8)
    with pytest.raises(TypeError, match="float32"):
        kvpack.schemes.cache(k.astype(np.float64), v, "kivi4")
    with pytest.raises(ValueError, match="unknown scheme \"kivi3\"; the schemes are kivi2"):
        kvpack.schemes.cache(k, v, "kivi3")
    with pytest.raises(ValueError, match="must agree"):
        kvpack.schemes.cache(k, v[:, :4], "kivi4")
    with pytest.raises(ValueError, match="multiple of 64"):
        kvpack.schemes.cache(k[:, :, :32], v[:, :, :32], "llamacpp-q4_0+rot")
    bad = v.copy()
    bad[1, 3, 2] = np.nan
    with pytest.raises(ValueError, match="V of head 1, token 3 holds NaN"):
        kvpack.schemes.cache(k, bad, "llamacpp-q4_0")
    with pytest.raises(ValueError, match="dimensions"):
        kvpack.schemes.cache(k[0, 0], v[0, 0], "kivi4")
    # KVQuant needs keys before RoPE and a calibration, which this call has not got.
    with pytest.raises(ValueError, match="calibrated on another text"):
        kvpack.schemes.cache(k, v, "kvquant4")
