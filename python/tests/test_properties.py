"""Property tests (Hypothesis): for any finite float32 matrix, width, group size, axis and mode,
kvpack's bytes are the NumPy reference's, and decoding stays within half a step of the input."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import kvpack
import reference

finite32 = st.floats(
    min_value=-(2.0**100), max_value=2.0**100, allow_nan=False, allow_infinity=False, width=32
)
# Values where ties and repeats are common: small halves, zeros, signed zeros.
tie_values = st.sampled_from([0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 3.0, 7.0, -7.0, float(np.finfo(np.float32).smallest_subnormal)])


@st.composite
def cases(draw):
    mode = draw(st.sampled_from(["symmetric", "asymmetric"]))
    bits = draw(st.integers(2 if mode == "symmetric" else 1, 8))
    shape = draw(st.tuples(st.integers(1, 40), st.integers(1, 40)))
    elements = draw(st.sampled_from([finite32, tie_values]))
    x = draw(hnp.arrays(np.float32, shape, elements=elements))
    order = draw(st.sampled_from(["C", "F", "strided"]))
    if order == "F":
        x = np.asfortranarray(x)
    elif order == "strided":
        wide = np.zeros((shape[0], 2 * shape[1]), dtype=np.float32)
        wide[:, ::2] = x
        x = wide[:, ::2]
    group_size = draw(st.integers(1, 48))
    axis = draw(st.sampled_from(["token", "feature"]))
    return x, bits, group_size, axis, mode


@settings(max_examples=300, deadline=None)
@given(cases())
def test_any_matrix_matches_the_reference(case):
    x, bits, group_size, axis, mode = case
    packed = kvpack.encode(x, bits, group_size, axis=axis, mode=mode)
    ref = reference.encode(np.ascontiguousarray(x), bits, group_size, axis, mode)
    assert packed.codes.tobytes() == ref.codes.tobytes()
    assert packed.scales.tobytes() == ref.scales.tobytes()
    if mode == "asymmetric":
        assert packed.zero_points.tobytes() == ref.zero_points.tobytes()
    assert packed.payload_bytes == ref.payload_bytes
    decoded = packed.decode()
    assert decoded.tobytes() == ref.decoded.tobytes()
    # Within half a step of each group's scale: the codec's bound, "up to the f32 division"
    # (symmetric.rs). Where the scale is subnormal that division is coarse (a scale of
    # 9.04e-43 / 63 rounds to 10 * 2^-149, and 9.04e-43 then sits 64.5 steps out, clipped to 63),
    # so the bound is checked where the scale is a normal float32.
    row_len = x.shape[0] if axis == "token" else x.shape[1]
    scale = np.repeat(ref.scales, group_size, axis=1)[:, :row_len]
    scale = (scale.T if axis == "token" else scale).astype(np.float64)
    error = np.abs(decoded.astype(np.float64) - x.astype(np.float64))
    normal = scale >= np.finfo(np.float32).tiny
    assert np.all(error[normal] <= scale[normal] * (0.5 + 1e-4))


@settings(max_examples=100, deadline=None)
@given(cases())
def test_from_parts_round_trips(case):
    x, bits, group_size, axis, mode = case
    packed = kvpack.encode(x, bits, group_size, axis=axis, mode=mode)
    again = kvpack.PackedTensor.from_parts(
        packed.codes, packed.scales, packed.shape, bits, group_size, axis, mode, packed.zero_points
    )
    assert again == packed
