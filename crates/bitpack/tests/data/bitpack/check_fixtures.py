"""Independent NumPy check of the bitpack fixtures in this directory (not needed by the tests).

Re-packs every input with the bit-packing seed's reference pack_bits (element i at bits
[i*b, (i+1)*b) of a little-endian u32 stream, zero-padded to a whole word) and requires the
words written by compressed-tensors to match, row by row for the 2-D (6 x 45) inputs, and the
unpacked arrays to equal the inputs.

    python3 check_fixtures.py
"""

from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def pack_bits(q, bits):
    words = [0] * ((len(q) * bits + 31) // 32)
    for i, v in enumerate(q):
        w, off = divmod(i * bits, 32)
        words[w] |= (int(v) << off) & 0xFFFFFFFF
        if off + bits > 32:
            words[w + 1] |= int(v) >> (32 - off)
    return np.array(words, dtype=np.uint32)


checked = 0
for bits in range(1, 9):
    for probe in ("pattern", "allmax"):
        for dims in ("1d", "2d"):
            stem = f"bitpack_{probe}_b{bits}_{dims}"
            codes = np.atleast_2d(np.load(HERE / f"{stem}.npy"))
            unpacked = np.atleast_2d(np.load(HERE / f"{stem}_unpacked.npy"))
            words = np.fromfile(HERE / f"{stem}.bin", dtype="<u4")
            expected = np.concatenate([pack_bits(row, bits) for row in codes])
            assert np.array_equal(words, expected), stem
            assert np.array_equal(unpacked, codes), stem
            checked += 1
print(f"{checked} fixtures match the reference packer")
