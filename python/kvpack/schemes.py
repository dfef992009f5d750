"""KV-cache schemes from Python: one layer's K and V under KIVI, the Hugging Face quanto cache, a
llama.cpp cache type (with or without its Hadamard rotation) or this project's codec, as
crates/kvschemes holds them.

    >>> c = kvpack.schemes.cache(k, v, "llamacpp-q4_0+rot")   # k, v: [kv_heads, tokens, head_dim]
    >>> c.k, c.v                 # float32, what attention reads from the cache
    >>> c.quantized              # (keys, values) positions quantized; the rest full precision
    >>> c.stored["total"], c.bits_per_element

- ``names() -> list[str]``: the schemes (kivi2, kivi4, hf-quanto2, hf-quanto4, llamacpp-TYPE[+rot]
  for TYPE q4_0, q4_1, q5_0, q8_0, iq4_nl, and this project's codec as kvpack-k4v4, kvpack-k8v4,
  ...; any ``kvpack-k<KB>v<VB>[-asym][-sink<S>][-edge8][-layer<L>]`` parses).
- ``cache(k, v, scheme) -> SchemeCache``: K (after RoPE) and V, float32, [kv_heads, tokens,
  head_dim] or one head's [tokens, head_dim], as the cache the whole text leaves holds them (the
  ``prefill`` schedule of ``runner quality --scheme``). A scheme treats K and V differently (KIVI
  groups keys per channel along tokens and values per token, and keeps the last 128 tokens in
  full precision), which is why it takes both rather than one matrix as ``kvpack.encode`` does.

Bytes (``stored``) are counted from what the cache stores: llama.cpp's blocks; KIVI's packed
code words, fp16 scales and minimums; quanto's packed codes and f32 scales and shifts; the
codec's tensors (codes, f32 scales, zero points, shape); and 4 bytes per full-precision value. Specs, sources and
departures: docs/schemes.md. A wrong dtype raises ``TypeError``; an unknown scheme, a head size
the scheme cannot split, K and V of different shapes or a non-finite value ``ValueError``.
"""

from __future__ import annotations

from typing import List

from . import _kvpack
from ._kvpack import SchemeCache

__all__ = ["SchemeCache", "cache", "names"]


def names() -> List[str]:
    """Every scheme's name."""
    return _kvpack.scheme_names()


def cache(k, v, scheme: str, layer: int = 0, layers: int = 1) -> SchemeCache:
    """K and V under ``scheme``, as the cache the whole text leaves holds them.

    ``layer`` of ``layers`` matters only to ``kvpack-...-edge8``, which holds the first and last
    layers at 8 bits.
    """
    return _kvpack.scheme_cache(k, v, scheme, layer, layers)
