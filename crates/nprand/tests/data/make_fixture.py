"""Regenerate the `vectors` and `study_draws` parts of numpy-default-rng.json.

Run with NumPy 2.4.6 (the version the checked-in file was made with):

    python3 make_fixture.py > /tmp/vectors.json

and compare against the corresponding keys of numpy-default-rng.json. The
`tables` part holds the ziggurat constants of
numpy/random/src/distributions/ziggurat_constants.h as bit patterns; they are
not reachable from Python and are kept as they are.
"""

import hashlib
import json
import sys

import numpy as np

ENTROPIES = [0, 7, 70128, 70512, 190128, 190512, 410128, 410512,
             12345678901234567890, 1180591620717411303427]
STUDY = [(7, 128), (7, 512), (19, 128), (19, 512), (41, 128), (41, 512)]


def f64_hex(x):
    return "%016x" % np.float64(x).view(np.uint64)


def f32_hex(x):
    return "%08x" % np.float32(x).view(np.uint32)


def vector(entropy):
    words = np.random.SeedSequence(entropy).generate_state(4, np.uint64)
    raw = np.random.PCG64(entropy).random_raw(8)
    first = np.random.default_rng(entropy).normal(size=8)
    big = np.random.default_rng(entropy).normal(size=1_000_000)
    return {
        "entropy": str(entropy),
        "seed_words_u64_hex": ["%016x" % int(w) for w in words],
        "first_raw_u64_hex": ["%016x" % int(r) for r in raw],
        "first_normals_f64_bits_hex": [f64_hex(x) for x in first],
        "first_normals_as_f32_bits_hex": [f32_hex(x) for x in first.astype(np.float32)],
        "sha256_of_first_1000000_normals_f64_le": hashlib.sha256(
            big.astype("<f8").tobytes()).hexdigest(),
    }


def study(seed, tokens):
    entropy = seed * 10000 + tokens
    rng = np.random.default_rng(entropy)
    out = {"seed": seed, "tokens": tokens, "entropy": entropy}
    for name, rows in (("q", 4), ("k", tokens), ("v", tokens)):
        a = rng.normal(size=(rows, 32)).astype(np.float32)
        out["sha256_%s_f32_le_c_order" % name] = hashlib.sha256(
            np.ascontiguousarray(a).astype("<f4").tobytes()).hexdigest()
    return out


if __name__ == "__main__":
    if np.__version__ != "2.4.6":
        print("warning: numpy %s, fixture was made with 2.4.6" % np.__version__,
              file=sys.stderr)
    json.dump({
        "numpy_version": np.__version__,
        "vectors": [vector(e) for e in ENTROPIES],
        "study_draws": [study(s, t) for s, t in STUDY],
    }, sys.stdout, indent=1)
    print()
