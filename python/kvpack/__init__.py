"""kvpack: packed, quantized KV caches from Python, NumPy arrays in and out.

The codec, the packed-KV study runner and the audit of this repository (a Rust workspace),
through one extension module built with PyO3. Nothing here re-implements a rule: every call is
the Rust library the command-line tools use.

    >>> import numpy as np, kvpack
    >>> k = np.random.default_rng(0).standard_normal((256, 64), dtype=np.float32)
    >>> packed = kvpack.encode(k, bits=4, group_size=32, axis="token")
    >>> packed.payload_bytes
    10248
    >>> back = packed.decode()          # or kvpack.decode(packed)

- ``encode(x, bits, group_size, axis="token", mode="symmetric") -> PackedTensor``
- ``decode(packed) -> numpy.ndarray`` (float32)
- ``run(protocol=None, out=..., threads=None) -> pathlib.Path``: a study into a new evidence
  directory, as ``runner --out`` runs it
- ``audit(path, tree=None, models=None, sample=None) -> AuditReport``: as ``audit DIR`` checks it
- ``models.kv(model, text) -> dict[str, numpy.ndarray]``: a real model's q, k and v, as
  ``runner kv`` writes them
- ``schemes.cache(k, v, scheme)``: one layer's K and V under a scheme of the literature (KIVI,
  llama.cpp's cache types), what attention reads and the bytes stored
- ``weights.read(path)``, ``weights.convert(src, dst, to=...)``, ``bpw(...)``: quantized weight
  files (GPTQ, AWQ, GGUF, NF4) read into their parts, converted, and a layout's cost, as the
  ``repack`` binary does

Errors: ``TypeError`` for a wrong type (float64 input is refused, not converted),
``ValueError`` for a wrong value, and the ``ValueError`` subclasses ``CodecError`` (the
codec's message) and ``ProtocolError``; ``RunError`` (a ``RuntimeError``) for a run that did not
finish; ``WeightsError`` (a ``ValueError``) for a weight file ``repack`` refused. The
documentation is docs/python.md in the repository.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from . import _kvpack, models, schemes, weights
from ._kvpack import (
    AuditReport,
    CodecError,
    PackedTensor,
    ProtocolError,
    RunError,
    WeightsError,
    __version__,
    decode,
    encode,
)

__all__ = [
    "AuditReport",
    "CodecError",
    "PackedTensor",
    "ProtocolError",
    "RunError",
    "WeightsError",
    "audit",
    "bpw",
    "build_tree",
    "decode",
    "encode",
    "models",
    "run",
    "schemes",
    "weights",
    "__version__",
]

PathLike = Union[str, "os.PathLike[str]"]

bpw = weights.bpw


def build_tree() -> Path:
    """The workspace this module was built from (where ``audit`` finds sources by default)."""
    return Path(_kvpack.BUILD_TREE).resolve()


def _checkout_containing(path: Path) -> Optional[Path]:
    """The nearest directory at or above ``path`` that is a git checkout of this workspace."""
    for directory in (path, *path.parents):
        if (directory / ".git").exists() and (directory / "crates" / "audit").is_dir():
            return directory
    return None


def audit(
    path: PathLike,
    tree: Optional[PathLike] = None,
    models: Union[bool, PathLike, None] = None,
    sample: Optional[int] = None,
) -> AuditReport:
    """Audits one evidence directory, as ``audit DIR`` does, and returns its report.

    The audit checks a run's sources against the git commit the run records, read from a source
    tree (a git checkout of this repository):

    - ``tree``: that checkout. By default, the checkout that contains ``path`` (so
      ``evidence/packed-kv`` of any clone is checked against that clone), else the workspace
      this module was built from (``build_tree()``), as the ``audit`` binary does.
    - ``models``: ``None`` (default) or ``True``: re-run model passes from the model cache as the
      binary does (``$KVPACK_MODELS``, else ``model-cache/`` in the build tree); ``False``: do not
      (``--no-models``; model evidence is then UNVERIFIED); a path: that model cache.
    - ``sample``: re-run only this many model passes per directory (``--sample K``).

    The report's ``passed`` is True for PASS only; ``verdict`` is "PASS", "UNVERIFIED" or
    "FAIL"; ``problems`` lists one line per failure; ``str(report)`` is the binary's text. A
    directory that is missing or malformed is a FAIL with its problem, not an exception. The
    GIL is released while auditing.
    """
    directory = Path(path)
    if tree is None:
        source_tree = _checkout_containing(directory.resolve()) or build_tree()
        if not source_tree.is_dir():
            raise FileNotFoundError(
                f"no source tree: {directory} is not inside a checkout of the repository and the "
                f"workspace this module was built from ({source_tree}) is gone; pass tree="
            )
    else:
        source_tree = Path(tree)
    return _kvpack.audit(os.fspath(directory), os.fspath(source_tree), models, sample)


def run(
    protocol: Union[Mapping[str, Any], PathLike, None] = None,
    out: Optional[PathLike] = None,
    threads: Optional[int] = None,
) -> Path:
    """Runs a packed-KV study protocol into the new evidence directory ``out``, as ``runner``.

    - ``protocol``: a dict (the protocol's JSON, validated as a file's would be; the manifest
      records its source as ``kvpack.run``), a path to a protocol file (recorded as given), or
      ``None`` for the frozen protocol (``experiments/packed-kv/protocol.json``, embedded).
    - ``out``: must not exist; the run is staged beside it and moved into place when complete,
      so a failed run leaves nothing behind.
    - ``threads``: worker threads for the comparisons (default: one per core); the output does
      not depend on it.

    Returns ``out`` as a ``pathlib.Path``. Raises ``ProtocolError`` for a protocol that does not
    parse or breaks a bound, ``RunError`` otherwise (``out`` exists, a model is missing, a write
    failed). The GIL is released while the study runs. Audit the result with ``audit(out)``.
    """
    if out is None:
        raise TypeError("run() needs out=, the new evidence directory")
    if protocol is None:
        result = _kvpack.run(os.fspath(out), threads=threads)
    elif isinstance(protocol, Mapping):
        text = json.dumps(protocol)
        result = _kvpack.run(os.fspath(out), protocol_json=text, source="kvpack.run", threads=threads)
    elif isinstance(protocol, (str, os.PathLike)):
        result = _kvpack.run(os.fspath(out), protocol_path=os.fspath(protocol), threads=threads)
    else:
        raise TypeError(
            f"protocol must be a dict, a path or None, got {type(protocol).__name__}"
        )
    return Path(result)
