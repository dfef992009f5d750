"""Quantized weight files from Python: read a layer's parts, convert between layouts, cost a layout.

The ``repack`` tool's library (crates/repack, crates/weights), called as the ``repack`` binary
calls it; nothing is re-implemented here.

    >>> layers = kvpack.weights.read("model.gptq.safetensors", format="gptq")
    >>> layer = layers[0]
    >>> layer.codes.shape, layer.scales.dtype, layer.bits_per_weight
    >>> w = layer.dequantize()                       # float32, as AutoGPTQ dequantizes it
    >>> kvpack.weights.convert("model.gptq.safetensors", "model.awq.safetensors", to="awq")

- ``read(path, format=None) -> list[WeightLayer]``: every quantized layer of a safetensors
  checkpoint (GPTQ ``gptq``/``gptq_v2``, AWQ GEMM, bitsandbytes NF4) or GGUF file (Q4_0, Q8_0,
  Q4_1; float tensors are skipped), in file order. A GPTQ checkpoint's zero-point convention is
  its metadata's (``checkpoint_format`` or ``format``); ``format`` names it when the metadata
  does not ("gptq": stored zero = zero - 1, AutoGPTQ; "gptq_v2": stored as is, GPTQModel), and
  is refused when the metadata says otherwise. The convention is never guessed.
- ``convert(src, dst, to, source_format=None, group_size=None, bits=None) -> dict``: every
  integer layer of ``src`` into layout ``to`` (gptq, gptq_v2, awq) in the new file ``dst``,
  proven bit-identical through the logical matrix before anything is written, as
  ``repack convert --from F --to T --group-size G`` does; the source's layout and group size
  default to what ``read`` finds. Refusals are ``repack``'s, and name its flags (``--from`` is
  ``source_format``).
- ``bpw(...)``: a layout's cost in bytes by part and bits per weight (also ``kvpack.bpw``).

A ``WeightLayer``'s arrays are in its library's orientation: GPTQ and AWQ [K, N] (in-features x
out-features, codes and ``dequantize()``; scales and zero points [groups, N]; ``g_idx`` [K]);
GGUF and NF4 [rows, cols], as gguf-py and bitsandbytes return them (GGUF scales [rows, cols/32];
NF4's float32 absmax is one per block of 64 of the row-major tensor, so 1-D). Weight = scale *
(code - zero point) for the integer layouts (GGUF q4_0 and q8_0 store no zero point: theirs is
the fixed offset 8 or 128, returned as ``zero_points``); d * code + m for q4_1
(``minimums``); ``levels[code] * absmax`` for NF4. Errors are ``kvpack.WeightsError`` (a
``ValueError``) with ``repack``'s message; the GIL is released while files are read, converted
and dequantized.
"""

from __future__ import annotations

import operator
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _kvpack
from ._kvpack import WeightLayer, WeightsError

__all__ = ["WeightLayer", "WeightsError", "bpw", "convert", "read"]

PathLike = Union[str, "os.PathLike[str]"]


def read(path: PathLike, format: Optional[str] = None) -> List[WeightLayer]:
    """The quantized layers of a safetensors checkpoint or GGUF file, in file order.

    ``format`` ("gptq" or "gptq_v2", or "awq") states a GPTQ checkpoint's zero-point convention
    when its metadata does not; for a GGUF file it must be None (each tensor names its type).
    Raises ``kvpack.WeightsError`` for a file ``repack`` cannot read or vouch for (the message
    names the file, the layer and why; a missing file is one of them).
    """
    return _kvpack.read_weight_file(os.fspath(path), format)


def convert(
    src: PathLike,
    dst: PathLike,
    to: str,
    source_format: Optional[str] = None,
    group_size: Optional[int] = None,
    bits: Optional[int] = None,
) -> Dict[str, Any]:
    """Converts every integer layer of ``src`` to layout ``to`` into the new file ``dst``.

    As ``repack convert --from SOURCE_FORMAT --to TO --group-size G [--bits B] src dst``: each
    layer is proven bit-identical through the logical matrix before anything is written, and
    ``dst`` must not exist (``FileExistsError``). ``source_format`` and ``group_size`` default to
    what ``read`` finds in ``src``. Returns what was done: ``from``, ``to``, ``group_size``,
    ``layers`` (per layer: ``name``, ``bits``, ``logical_shape``, ``stored_shape``, ``before``
    and ``after`` costs, ``permuted``, ``restored``), ``passed_through`` (tensors copied
    unchanged) and ``kept_metadata``. Raises ``kvpack.WeightsError`` with ``repack``'s message
    (NF4 needs requantization; a convention the target cannot hold; metadata that contradicts
    the arguments).
    """
    return _kvpack.convert_weight_file(
        os.fspath(src), os.fspath(dst), to, source_format, group_size, bits
    )


def bpw(
    shape: Sequence[int] = (4096, 4096),
    bits: int = 4,
    group_size: int = 128,
    axis: str = "token",
    scale: str = "f16",
    zero_points: str = "none",
    g_idx: bool = False,
    padding: str = "none",
    container: str = "bytes",
    extra_bytes_per_group: int = 0,
) -> Dict[str, Any]:
    """What a ``rows`` x ``cols`` matrix costs under one layout, as ``repack bpw --bits`` prints it.

    ``axis``: "token" (groups run down each column) or "feature" (along each row); ``scale``:
    f16, bf16 or f32; ``zero_points``: none, packed (b-bit), f16, bf16 or f32; ``g_idx``: one
    int32 per element of the grouped dimension; ``padding``: none or groups; ``container``:
    bytes or line-words (u32 words per line); ``extra_bytes_per_group``: GGUF k-quants'
    sub-block scales. Returns bytes by part (``code_bytes``, ``scale_bytes``,
    ``zero_point_bytes``, ``g_idx_bytes``, ``extra_bytes``, ``metadata_bytes``,
    ``total_bytes``), ``elements`` and ``bits_per_element``. Raises ``ValueError`` for a value
    outside these.
    """
    rows, cols = _shape(shape)
    return _kvpack.layout_cost(
        rows,
        cols,
        bits,
        group_size,
        axis,
        scale,
        zero_points,
        bool(g_idx),
        padding,
        container,
        extra_bytes_per_group,
    )


def _shape(shape: Sequence[int]) -> Tuple[int, int]:
    if isinstance(shape, (str, bytes)) or len(shape) != 2:
        raise ValueError(f"shape must be (rows, cols), got {shape!r}")
    rows, cols = shape
    # operator.index: 4096.0 or 4.5 is refused, not truncated.
    return operator.index(rows), operator.index(cols)

