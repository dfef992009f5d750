"""kvpack.models.kv: a real model's K/V as `runner kv` writes them, held to the archived
real-model evidence (made by the runner from the same forward pass) bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import kvpack

ROOT = Path(__file__).resolve().parents[2]


def model_or_skip(name):
    try:
        return kvpack.models.kv(name, "Hi")
    except kvpack.RunError as err:
        if "scripts/fetch-models" in str(err):
            pytest.skip(f"{name} is not in the model cache: {err}")
        raise


def test_smollm2_kv_is_the_archived_caches_prefix(tmp_path):
    """SmolLM2 is causal: the first tokens of a text's cache are those of the archived
    128-token input of the same text (every archived layer and KV head, K and V)."""
    model_or_skip("smollm2")
    directory = ROOT / "evidence" / "real-smollm2"
    manifest = json.loads((directory / "manifest.json").read_text())
    model = manifest["protocol"]["model"]
    text = model["texts"][0]["text"][:300]
    out = tmp_path / "kv.npz"
    arrays = kvpack.models.kv("smollm2", text, out=out)
    assert out.is_file()
    with np.load(out) as kept:
        assert sorted(kept.files) == sorted(arrays)
    n = len(arrays["ids"]) - 1  # the last token may be a word cut short
    assert n > 40
    assert arrays["ids"][:n].tolist() == manifest["model"]["ids"]["t0_n128"][:n]
    archived = np.load(directory / "arrays.npz", allow_pickle=False)
    for layer in model["layers"]:
        for head in model["kv_heads"]:
            for part in "kv":
                expected = archived[f"t0_n128_l{layer}_h{head}_{part}"][:n]
                got = arrays[f"l{layer}_{part}"][head, :n]
                assert got.tobytes() == expected.tobytes(), (layer, head, part)
    assert arrays["l0_q"].shape == (9, n + 1, 64) and arrays["logits"].shape[0] == n + 1


def test_gemma3_kv_is_the_archived_caches_prefix():
    """Gemma 3 as SmolLM2 above (BOS first; one KV head of 256 read by 4 query heads), within
    its 512-token window, where a sliding layer still sees every position."""
    model_or_skip("gemma3")
    directory = ROOT / "evidence" / "real-gemma3"
    manifest = json.loads((directory / "manifest.json").read_text())
    model = manifest["protocol"]["model"]
    arrays = kvpack.models.kv("gemma3", model["texts"][0]["text"][:300])
    n = len(arrays["ids"]) - 1  # the last token may be a word cut short
    assert n > 40 and arrays["ids"][0] == 2
    assert arrays["ids"][:n].tolist() == manifest["model"]["ids"]["t0_n128"][:n]
    archived = np.load(directory / "arrays.npz", allow_pickle=False)
    for layer in model["layers"]:
        for part in "kv":
            expected = archived[f"t0_n128_l{layer}_h0_{part}"][:n]
            assert arrays[f"l{layer}_{part}"][0, :n].tobytes() == expected.tobytes(), (layer, part)
    assert arrays["l0_q"].shape == (4, n + 1, 256)
    assert arrays["logits"].shape == (n + 1, 262144)


def test_minilm_kv_shapes_and_refusals(tmp_path):
    arrays = model_or_skip("minilm")
    assert [k for k in arrays if k.endswith("_k")] == [f"l{i}_k" for i in range(6)]
    assert arrays["l0_k"].shape == (12, len(arrays["ids"]), 32)
    with pytest.raises(ValueError, match='unknown model "gpt2"'):
        kvpack.models.kv("gpt2", "Hi")
    (tmp_path / "exists.npz").write_bytes(b"")
    with pytest.raises(kvpack.RunError, match="exists"):
        kvpack.models.kv("minilm", "Hi", out=tmp_path / "exists.npz")
    with pytest.raises(TypeError, match="text must be a str"):
        kvpack.models.kv("minilm", b"Hi")
