"""Writes the block-type fixture: synthetic blocks of every type `weights::gguf::stored` reads,
dequantized by gguf-py as the oracle, so the tests need no model file.

Usage (NumPy and gguf-py 0.19 only; run from anywhere):

    python3 make_block_fixture.py

For each of Q5_0, Q5_1, Q4_K, Q5_K and Q6_K writes, into `blocks/` next to this file,
`<TYPE>.bin` (the stored blocks) and `<TYPE>.f32` (gguf-py's `gguf.quants.dequantize` of them,
little-endian f32). The blocks, in order:

- 3 patterned blocks: byte i of block b is (37 i + 11 b) mod 256;
- 1 all-maximum block: every byte 0xFF (every code, sub-scale and minimum at its maximum);
- 1 tie-heavy block: every code byte 0x88, sub-scales equal;
- 6 random blocks (NumPy's PCG64, seed 20261203), odd in number;

and in every block each stored f16 field (d, dmin, m) is then overwritten with a finite value:
f16 max, -f16 max, the smallest subnormal, 0, -0 and random finite values by turn, because a
NaN or infinite scale is refused by the reader rather than dequantized.
"""

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

HERE = Path(__file__).resolve().parent

# type -> byte offsets of its f16 fields within a block
F16_FIELDS = {
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
SPECIAL = [0x7BFF, 0xFBFF, 0x0001, 0x0000, 0x8000]  # f16 max, -max, min subnormal, 0, -0


def blocks_for(ty, rng):
    values, size = GGML_QUANT_SIZES[ty]
    rows = []
    for b in range(3):
        rows.append([(37 * i + 11 * b) % 256 for i in range(size)])
    rows.append([0xFF] * size)
    rows.append([0x88] * size)
    for _ in range(6):
        rows.append(list(rng.integers(0, 256, size)))
    blocks = np.array(rows, dtype=np.uint8)
    turn = 0
    for block in blocks:
        for offset in F16_FIELDS[ty]:
            if turn < len(SPECIAL):
                bits = SPECIAL[turn]
            else:
                # A random finite f16: any sign and mantissa, exponent field below 31.
                bits = int(rng.integers(0, 0x7C00)) | (int(rng.integers(0, 2)) << 15)
            block[offset:offset + 2] = [bits & 0xFF, bits >> 8]
            turn += 1
    return blocks, values


def main():
    rng = np.random.Generator(np.random.PCG64(20261203))
    out = HERE / "blocks"
    out.mkdir(exist_ok=True)
    for ty in F16_FIELDS:
        blocks, values = blocks_for(ty, rng)
        result = dequantize(blocks, ty)
        assert result.shape == (len(blocks), values) and result.dtype == np.float32, ty.name
        (out / f"{ty.name}.bin").write_bytes(blocks.tobytes())
        (out / f"{ty.name}.f32").write_bytes(np.ascontiguousarray(result, dtype="<f4").tobytes())


if __name__ == "__main__":
    main()
