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
