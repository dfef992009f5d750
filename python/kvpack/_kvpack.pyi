"""Type stubs for kvpack._kvpack, the extension module (python/src/)."""

import os
from typing import Dict, List, Literal, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

BUILD_TREE: str
__version__: str

class CodecError(ValueError):
    """The codec refused the input or the stored parts (the message is kvcodec's)."""

class ProtocolError(ValueError):
    """A study protocol that does not parse or breaks a bound (the message names the field)."""

class RunError(RuntimeError):
    """A study run that did not finish; nothing is left behind."""

class WeightsError(ValueError):
    """A weight file, layout or conversion that repack refused (the message is repack's)."""

class SchemeCache:
    """One layer's K and V under a named scheme (see kvpack.schemes)."""

    @property
    def scheme(self) -> str:
        """The scheme's name."""
    @property
    def k(self) -> npt.NDArray[np.float32]:
        """K as attention reads it, in the input's shape."""
    @property
    def v(self) -> npt.NDArray[np.float32]:
        """V as attention reads it, in the input's shape."""
    @property
    def quantized(self) -> Tuple[int, int]:
        """Positions quantized, (keys, values)."""
    @property
    def stored(self) -> Dict[str, int]:
        """Bytes stored: codes, metadata, full_precision, total."""
    @property
    def bits_per_element(self) -> float:
        """Every stored byte over the K and V values, in bits."""

class WeightLayer:
    """One quantized layer of a weight file (see kvpack.weights for orientations and rules).

    Arrays are NumPy copies made when an attribute is read.
    """

    @property
    def name(self) -> str:
        """The layer's prefix (safetensors) or the tensor's name (GGUF)."""
    @property
    def format(self) -> Literal["gptq", "gptq_v2", "awq", "q4_0", "q8_0", "q4_1", "nf4"]:
        """The layout."""
    @property
    def bits(self) -> int:
        """Bits per code."""
    @property
    def group_size(self) -> int:
        """Elements per scale (GGUF: 32; NF4: the absmax block)."""
    @property
    def shape(self) -> Tuple[int, int]:
        """Shape of codes and dequantize(): [K, N] for GPTQ/AWQ, [rows, cols] for GGUF/NF4."""
    @property
    def codes(self) -> npt.NDArray[np.uint8]:
        """One unpacked code per weight, in ``shape``."""
    @property
    def scales(self) -> Union[npt.NDArray[np.float16], npt.NDArray[np.float32]]:
        """float16 [groups, N] (GPTQ/AWQ) or [rows, cols/32] (GGUF d); NF4: float32 absmax, 1-D."""
    @property
    def zero_points(self) -> Optional[npt.NDArray[np.uint8]]:
        """True zero points in the shape of scales (GGUF: the fixed offset); None for q4_1, nf4."""
    @property
    def minimums(self) -> Optional[npt.NDArray[np.float16]]:
        """q4_1's minimum m per block, [rows, cols/32]; None otherwise."""
    @property
    def g_idx(self) -> Optional[npt.NDArray[np.uint32]]:
        """GPTQ/AWQ: each of the K rows' group; None for GGUF and NF4."""
    @property
    def input_permutation(self) -> Optional[npt.NDArray[np.uint32]]:
        """The row permutation a conversion to AWQ recorded, or None."""
    @property
    def levels(self) -> Optional[npt.NDArray[np.float32]]:
        """NF4's 16 levels; None for the other layouts."""
    @property
    def cost(self) -> Dict[str, Union[int, float]]:
        """Stored bytes by part, counted from the tensors (as kvpack.bpw returns)."""
    @property
    def bits_per_weight(self) -> float:
        """Every stored byte, in bits, over the weights."""
    def dequantize(self) -> npt.NDArray[np.float32]:
        """The weights, float32 in ``shape``, as the layout's library dequantizes them."""

Axis = Literal["token", "feature"]
Mode = Literal["symmetric", "asymmetric"]

class PackedTensor:
    """A packed N x D (tokens x features) matrix under one layout.

    Its parts are read-only NumPy views of its own memory: ``codes`` (the b-bit code stream,
    uint8), ``scales`` (float32, rows x groups per row of the grouped view) and ``zero_points``
    (the b-bit zero point stream, uint8; None when symmetric). ``payload_bytes`` is what is
    stored: code bytes + 4 per scale + zero point bytes + 8 for the two i32 shape values.
    Equal (``==``) when layout, shape and every stored byte are equal; pickles through
    ``from_parts``.
    """

    @staticmethod
    def from_parts(
        codes: npt.NDArray[np.uint8],
        scales: npt.NDArray[np.float32],
        shape: Tuple[int, int],
        bits: int,
        group_size: int,
        axis: Axis = "token",
        mode: Mode = "symmetric",
        zero_points: Optional[npt.NDArray[np.uint8]] = None,
    ) -> "PackedTensor":
        """Assembles a tensor from stored parts, checked as kvcodec checks them (CodecError)."""
    @property
    def codes(self) -> npt.NDArray[np.uint8]:
        """The packed code stream (read-only view)."""
    @property
    def scales(self) -> npt.NDArray[np.float32]:
        """Float32 scales, [rows, groups per row] of the grouped view (read-only view)."""
    @property
    def zero_points(self) -> Optional[npt.NDArray[np.uint8]]:
        """The packed zero point stream (read-only view); None when symmetric."""
    @property
    def shape(self) -> Tuple[int, int]:
        """(tokens, features)."""
    @property
    def bits(self) -> int:
        """Code width in bits."""
    @property
    def group_size(self) -> int:
        """Consecutive elements per group."""
    @property
    def axis(self) -> Axis:
        """The axis groups run along."""
    @property
    def mode(self) -> Mode:
        """Symmetric or asymmetric."""
    @property
    def payload_bytes(self) -> int:
        """Bytes stored: codes, scales, zero points and the shape values."""
    def stored_codes(self) -> npt.NDArray[np.uint8]:
        """Stored codes unpacked, [rows, padded row length], padding included (a new array)."""
    def offsets(self) -> npt.NDArray[np.uint8]:
        """What decoding subtracts per group, [rows, groups per row] (a new array)."""
    def decode(self) -> npt.NDArray[np.float32]:
        """The float32 matrix the codes stand for, [tokens, features] (a new array)."""
    def __eq__(self, other: object) -> bool: ...

class AuditReport:
    """What an audit of one evidence directory found."""

    @property
    def passed(self) -> bool:
        """True for PASS only."""
    @property
    def verdict(self) -> Literal["PASS", "UNVERIFIED", "FAIL"]:
        """The audit's verdict."""
    @property
    def problems(self) -> List[str]:
        """One line per failure."""
    @property
    def counts(self) -> Dict[str, int]:
        """What was checked, and how many."""
    @property
    def notes(self) -> List[str]:
        """How it checked (tree or commit, timings)."""
    @property
    def unverified(self) -> List[str]:
        """What it could not re-derive."""
    @property
    def subject(self) -> str:
        """The directory audited, as given."""

def encode(
    x: npt.NDArray[np.float32],
    bits: int,
    group_size: int,
    axis: Axis = "token",
    mode: Mode = "symmetric",
) -> PackedTensor:
    """Quantizes a 2-D float32 array (tokens x features) into b-bit codes in groups."""

def decode(packed: PackedTensor) -> npt.NDArray[np.float32]:
    """The float32 matrix a packed tensor stands for (a new C-order array)."""

def audit(
    path: Union[str, "os.PathLike[str]"],
    tree: Union[str, "os.PathLike[str]"],
    models: Union[bool, str, "os.PathLike[str]", None] = None,
    sample: Optional[int] = None,
) -> AuditReport: ...
def run(
    out: Union[str, "os.PathLike[str]"],
    protocol_json: Optional[str] = None,
    protocol_path: Optional[Union[str, "os.PathLike[str]"]] = None,
    source: Optional[str] = None,
    threads: Optional[int] = None,
) -> str: ...
def models_kv(model: str, text: str, out: Union[str, "os.PathLike[str]"]) -> Tuple[int, int]: ...
def read_weight_file(
    path: Union[str, "os.PathLike[str]"], format: Optional[str] = None
) -> List[WeightLayer]: ...
def convert_weight_file(
    src: Union[str, "os.PathLike[str]"],
    dst: Union[str, "os.PathLike[str]"],
    to: str,
    source_format: Optional[str] = None,
    group_size: Optional[int] = None,
    bits: Optional[int] = None,
) -> Dict[str, object]: ...
def layout_cost(
    rows: int,
    cols: int,
    bits: int,
    group_size: int,
    axis: str,
    scale: str,
    zero_points: str,
    g_idx: bool,
    padding: str,
    container: str,
    extra_bytes_per_group: int,
) -> Dict[str, Union[int, float]]: ...
def scheme_cache(
    k: npt.NDArray[np.float32],
    v: npt.NDArray[np.float32],
    scheme: str,
    layer: int = 0,
    layers: int = 1,
) -> SchemeCache: ...
def scheme_names() -> List[str]: ...
