"""The three real models' K/V cache for a text, as ``runner kv`` writes it (docs/real-models.md).

    >>> arrays = kvpack.models.kv("smollm2", "The quick brown fox")
    >>> arrays["l0_k"].shape          # (KV heads, tokens, head size), float32

The models are read from the model cache (``$KVPACK_MODELS``, else ``model-cache/`` in the
workspace the wheel was built from; ``scripts/fetch-models`` fills it), their weights
hash-checked first.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Dict, Optional, Union

import numpy as np

from . import _kvpack

__all__ = ["kv"]

MODELS = ("minilm", "smollm2", "gemma3")


def kv(
    model: str = "smollm2",
    text: str = "",
    out: Optional[Union[str, "os.PathLike[str]"]] = None,
) -> Dict[str, np.ndarray]:
    """Runs ``model`` ("minilm", "smollm2" or "gemma3") on ``text``; returns what ``runner kv`` writes.

    The keys are the .npz members ``runner kv --model M --text T --out FILE`` writes: ``ids``
    (int64 token ids), ``l<layer>_q`` (float32, query heads x tokens x head size), ``l<layer>_k``
    and ``l<layer>_v`` (float32, KV heads x tokens x head size), the final hidden state and, for
    the decoders, ``logits``. With ``out`` the file is also kept there (it must not exist); without it, it is written to a temporary
    directory and removed. Raises ``ValueError`` for an unknown model, ``kvpack.RunError`` when
    the model is not in the cache (the message says how to fetch it) or the text cannot be
    run. The GIL is released while the model runs.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if out is not None:
        _kvpack.models_kv(model, text, os.fspath(out))
        return _load(Path(out))
    with tempfile.TemporaryDirectory(prefix="kvpack-kv-") as directory:
        path = Path(directory) / "kv.npz"
        _kvpack.models_kv(model, text, os.fspath(path))
        return _load(path)


def _load(path: Path) -> Dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as arrays:
        return {name: arrays[name] for name in arrays.files}
