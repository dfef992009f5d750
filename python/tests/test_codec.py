"""kvpack.encode and decode: byte for byte against the NumPy reference rule (reference.py) and
against codes the Rust codec wrote into the archived evidence; every layout of the input; bad
input refused with a clear exception."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import kvpack
import reference

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = {"symmetric": range(2, 9), "asymmetric": range(1, 9)}
CASES = [(mode, bits) for mode, widths in WIDTHS.items() for bits in widths]
AXES = ["token", "feature"]


def assert_matches(x, bits, group_size, axis, mode):
    """kvpack's tensor of x is the reference's, part by part and byte for byte."""
    packed = kvpack.encode(x, bits, group_size, axis=axis, mode=mode)
    ref = reference.encode(np.array(x, dtype=np.float32), bits, group_size, axis, mode)
    label = f"b{bits} g{group_size} {axis} {mode} shape {x.shape}"
    assert packed.shape == x.shape, label
    np.testing.assert_array_equal(packed.stored_codes(), ref.stored, err_msg=label)
    assert packed.scales.dtype == np.float32, label
    assert packed.scales.tobytes() == ref.scales.tobytes(), label
    np.testing.assert_array_equal(packed.offsets(), ref.offsets, err_msg=label)
    assert packed.codes.tobytes() == ref.codes.tobytes(), label
    if mode == "symmetric":
        assert packed.zero_points is None, label
    else:
        assert packed.zero_points.tobytes() == ref.zero_points.tobytes(), label
    assert packed.payload_bytes == ref.payload_bytes, label
    decoded = packed.decode()
    assert decoded.dtype == np.float32 and decoded.flags.c_contiguous, label
    assert decoded.tobytes() == ref.decoded.tobytes(), label
    assert kvpack.decode(packed).tobytes() == ref.decoded.tobytes(), label
    return packed


def random_input(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def tie_heavy(shape, bits, group_size, seed=0):
    """Halves in [-qmax, qmax], each group holding qmax, so symmetric scales are 1 and x / scale
    lands on .5 ties everywhere: round-half-even decides half the codes."""
    qmax = 2 ** (bits - 1) - 1 if bits > 1 else 1
    rng = np.random.default_rng(seed)
    x = rng.integers(-2 * qmax, 2 * qmax + 1, size=shape).astype(np.float32) / 2
    x[::group_size, :] = qmax
    x[:, ::group_size] = qmax
    return x


def patterned(shape):
    """The README's ramp: ((t * 7 + f * 3) % 17) / 8 - 1."""
    t, f = np.indices(shape)
    return (((t * 7 + f * 3) % 17) / 8 - 1).astype(np.float32)


@pytest.mark.parametrize("mode,bits", CASES)
@pytest.mark.parametrize("axis", AXES)
def test_random_patterned_and_tie_heavy_inputs_match_the_reference(mode, bits, axis):
    for group_size in (1, 8, 32):
        assert_matches(random_input((96, 40), seed=bits), bits, group_size, axis, mode)
        assert_matches(patterned((96, 40)), bits, group_size, axis, mode)
        assert_matches(tie_heavy((96, 40), bits, group_size, seed=bits), bits, group_size, axis, mode)


@pytest.mark.parametrize("mode,bits", CASES)
@pytest.mark.parametrize("axis", AXES)
def test_odd_shapes_and_groups_longer_than_rows_match(mode, bits, axis):
    for shape in [(1, 1), (3, 5), (37, 13), (129, 7)]:
        for group_size in (1, 3, 8, 64):
            assert_matches(random_input(shape, seed=shape[0]), bits, group_size, axis, mode)


@pytest.mark.parametrize("mode,bits", [("symmetric", 4), ("asymmetric", 3), ("symmetric", 8)])
@pytest.mark.parametrize("axis", AXES)
def test_special_values_match(mode, bits, axis):
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    big = np.float32(1e38)
    x = np.zeros((40, 24), dtype=np.float32)  # all-zero groups: scale 1.0
    x[0:8, 0:8] = tiny  # subnormal groups: the division underflows, scale 1.0
    x[8:16, 8:16] = -big  # large magnitudes
    x[16:24, :] = 5.0  # constant groups
    x[24:, :] = -0.0
    assert_matches(x, bits, 8, axis, mode)


def same_tensor(a, b):
    return (
        a == b
        and a.codes.tobytes() == b.codes.tobytes()
        and a.scales.tobytes() == b.scales.tobytes()
    )


@pytest.mark.parametrize("mode,bits", [("symmetric", 4), ("asymmetric", 5), ("symmetric", 8)])
@pytest.mark.parametrize("axis", AXES)
def test_every_memory_layout_gives_the_same_bytes(mode, bits, axis):
    base = random_input((64, 48), seed=3)
    expected = assert_matches(base, bits, 16, axis, mode)
    big = random_input((130, 100), seed=4)
    layouts = {
        "fortran": np.asfortranarray(base),
        "transposed view": np.ascontiguousarray(base.T).T,
        "reversed rows": base[::-1][::-1],
        "negative strides": np.ascontiguousarray(base[::-1, ::-1])[::-1, ::-1],
        "read-only": _read_only(base.copy()),
    }
    for name, x in layouts.items():
        assert np.array_equal(x, base), name
        assert same_tensor(kvpack.encode(x, bits, 16, axis=axis, mode=mode), expected), name
    # Strided views of a larger array, checked against the reference on their own values.
    for name, x in {
        "every other row and third column": big[::2, ::3],
        "slice with offset": big[5:69, 7:55],
        "reversed": big[::-1, ::-2],
        "broadcast (stride 0)": np.broadcast_to(big[0], (64, 100)),
        "unaligned": _unaligned(big[:64, :48]),
    }.items():
        assert_matches(x, bits, 16, axis, mode)


def _read_only(x):
    x.flags.writeable = False
    return x


def _unaligned(x):
    """A copy of x whose data starts one byte past an aligned address."""
    raw = np.zeros(x.nbytes + 1, dtype=np.uint8)
    raw[1:] = np.frombuffer(np.ascontiguousarray(x).tobytes(), dtype=np.uint8)
    view = np.frombuffer(raw.data, dtype=np.float32, count=x.size, offset=1).reshape(x.shape)
    assert not view.flags.aligned
    return view


def test_the_readme_and_crate_examples_pinned():
    # The README's Rust example: 256 x 64 ramp, token axis, 4-bit, groups of 32.
    k = patterned((256, 64))
    packed = kvpack.encode(k, bits=4, group_size=32, axis="token")
    assert packed.payload_bytes == 10_248
    assert np.abs(packed.decode() - k).max() <= 1.0 / 7.0 / 2.0 + 1e-6
    # kvcodec's crate example: 3 tokens x 2 features, groups of 2 tokens.
    k = np.array([[1.0, -2.0], [0.5, 4.0], [-1.0, 0.0]], dtype=np.float32)
    assert kvpack.encode(k, 4, 2).payload_bytes == 4 + 4 * 4 + 8
    assert kvpack.encode(k, 3, 2, mode="asymmetric").payload_bytes == 3 + 4 * 4 + 2 + 8
    # asymmetric.rs's worked example: a 4-bit group from -1 to 2.75, scale 0.25, zero point 4.
    group = np.array([[-1.0, 0.0, 2.75, 0.375, 0.625]], dtype=np.float32)
    packed = kvpack.encode(group, 4, 5, axis="feature", mode="asymmetric")
    assert packed.scales.tolist() == [[0.25]]
    assert packed.offsets().tolist() == [[4]]
    assert packed.stored_codes().tolist() == [[0, 4, 15, 6, 6]]


def _archived_settings(directory):
    manifest = json.loads((directory / "manifest.json").read_text())
    for setting in manifest["protocol"]["settings"]:
        mode = setting.get("mode", "symmetric")
        swap = setting.get("axes") not in (None, {"k": "token", "v": "feature"})
        label = f"g{setting['group_size']}_b{setting['bits']}"
        label += "_asym" if mode == "asymmetric" else ""
        label += "_swap" if swap else ""
        axes = ("feature", "token") if swap else ("token", "feature")
        yield label, setting["bits"], setting["group_size"], mode, axes


@pytest.mark.parametrize("study", ["packed-kv", "widths-and-modes"])
def test_codes_the_rust_codec_archived_are_reproduced(study):
    """Every K and V the runner packed (with the Rust codec) into the archived evidence,
    re-encoded from the archived inputs: the same code, scale and zero point bytes."""
    directory = ROOT / "evidence" / study
    arrays = np.load(directory / "arrays.npz", allow_pickle=False)
    inputs = sorted({m.rsplit("_", 1)[0] for m in arrays.files if m.endswith("_ref")})
    checked = 0
    for label, bits, group_size, mode, axes in _archived_settings(directory):
        for name in inputs:
            for which, axis in zip("kv", axes):
                prefix = f"{name}_{label}_{which}"
                if f"{prefix}_codes" not in arrays.files:
                    continue
                packed = kvpack.encode(arrays[f"{name}_{which}"], bits, group_size, axis, mode)
                assert packed.codes.tobytes() == arrays[f"{prefix}_codes"].tobytes(), prefix
                assert packed.scales.tobytes() == arrays[f"{prefix}_scales"].tobytes(), prefix
                if mode == "asymmetric":
                    assert packed.zero_points.tobytes() == arrays[f"{prefix}_zeros"].tobytes()
                assert list(packed.shape) == arrays[f"{prefix}_shape"].tolist(), prefix
                checked += 1
    assert checked >= 24


def test_from_parts_round_trips_and_is_checked():
    x = random_input((33, 17), seed=9)
    for mode, bits in [("symmetric", 4), ("asymmetric", 3)]:
        packed = kvpack.encode(x, bits, 8, axis="feature", mode=mode)
        again = kvpack.PackedTensor.from_parts(
            packed.codes, packed.scales, packed.shape, bits, 8, "feature", mode, packed.zero_points
        )
        assert again == packed
        assert again.decode().tobytes() == packed.decode().tobytes()
    with pytest.raises(kvpack.CodecError, match="code bytes, but the shape and layout need"):
        kvpack.PackedTensor.from_parts(packed.codes[:-1], packed.scales, (33, 17), 3, 8, "feature", "asymmetric", packed.zero_points)
    with pytest.raises(kvpack.CodecError, match="zero point bytes"):
        kvpack.PackedTensor.from_parts(packed.codes, packed.scales, (33, 17), 3, 8, "feature", "asymmetric")
    bad_scales = packed.scales.copy()
    bad_scales[0, 0] = -1.0
    with pytest.raises(kvpack.CodecError, match=r"scale \[0, 0\] is -1"):
        kvpack.PackedTensor.from_parts(packed.codes, bad_scales, (33, 17), 3, 8, "feature", "asymmetric", packed.zero_points)


def test_parts_are_read_only_views_that_outlive_nothing():
    packed = kvpack.encode(random_input((64, 32)), 4, 32)
    codes, scales = packed.codes, packed.scales
    assert not codes.flags.writeable and not scales.flags.writeable
    with pytest.raises(ValueError):
        codes[0] = 1
    del packed  # the views keep the tensor alive
    assert codes.sum() > 0 and scales.shape == (32, 2)


def test_repr_and_attributes():
    packed = kvpack.encode(random_input((10, 6)), 5, 4, axis="feature", mode="asymmetric")
    assert (packed.bits, packed.group_size, packed.axis, packed.mode) == (5, 4, "feature", "asymmetric")
    assert repr(packed).startswith("PackedTensor(shape=(10, 6), bits=5, group_size=4")


@pytest.mark.parametrize(
    "x,error,message",
    [
        (np.ones((4, 4), dtype=np.float64), TypeError, "dtype float64; kvpack takes native float32"),
        (np.ones((4, 4), dtype=np.float16), TypeError, "dtype float16"),
        (np.ones((4, 4), dtype=np.int32), TypeError, "dtype int32"),
        (np.ones((4, 4), dtype=">f4"), TypeError, "dtype >f4"),
        ([[1.0, 2.0]], TypeError, "must be a numpy.ndarray of float32, got list"),
        (np.ones(4, dtype=np.float32), ValueError, r"2-D \(tokens x features\), got shape \[4\]"),
        (np.ones((2, 2, 2), dtype=np.float32), ValueError, "got shape"),
        (np.zeros((0, 4), dtype=np.float32), kvpack.CodecError, "empty matrix: shape 0 x 4"),
        (np.array([[1.0, np.nan]], dtype=np.float32), kvpack.CodecError, r"non-finite input: element \[0, 1\] is NaN"),
        (np.array([[1.0], [-np.inf]], dtype=np.float32), kvpack.CodecError, r"element \[1, 0\] is -inf"),
    ],
)
def test_bad_input_raises_a_clear_exception(x, error, message):
    with pytest.raises(error, match=message):
        kvpack.encode(x, 4, 8)


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (dict(bits=1), kvpack.CodecError, "unsupported bit width 1: symmetric codes take 2 to 8 bits"),
        (dict(bits=9, mode="asymmetric"), kvpack.CodecError, "asymmetric codes take 1 to 8 bits"),
        (dict(bits=-3), kvpack.CodecError, "unsupported bit width -3"),
        (dict(bits=2**70), ValueError, "bits .* is out of range"),
        (dict(bits=4.0), TypeError, "bits must be an int, got float"),
        (dict(group_size=0), kvpack.CodecError, "group size must be at least 1, got 0"),
        (dict(group_size=-1), kvpack.CodecError, "group size must be at least 1, got -1"),
        (dict(group_size=2**40), ValueError, "group size 1099511627776 is longer than the 16 tokens"),
        (dict(group_size=2**63 - 1), ValueError, "is longer than the 16 tokens"),
        (dict(group_size=2**64), ValueError, "group_size .* is out of range"),
        (dict(group_size=2**40, axis="feature"), ValueError, "longer than the 8 features"),
        (dict(axis="channel"), ValueError, "axis must be 'token' or 'feature'"),
        (dict(mode="asym"), ValueError, "mode must be 'symmetric' or 'asymmetric'"),
    ],
)
def test_bad_arguments_raise_a_clear_exception(kwargs, error, message):
    args = dict(bits=4, group_size=8, axis="token", mode="symmetric")
    args.update(kwargs)
    with pytest.raises(error, match=message):
        kvpack.encode(np.ones((16, 8), dtype=np.float32), **args)


def test_an_asymmetric_range_too_wide_names_its_group():
    x = np.array([[3e38, -3e38]], dtype=np.float32)
    with pytest.raises(kvpack.CodecError, match="range too wide for a float32 scale at 4 bits"):
        kvpack.encode(x, 4, 2, axis="feature", mode="asymmetric")


def test_numpy_integers_are_accepted_as_sizes():
    x = random_input((16, 8))
    assert kvpack.encode(x, np.int64(4), np.uint8(8)) == kvpack.encode(x, 4, 8)


def test_codec_error_is_a_value_error():
    assert issubclass(kvpack.CodecError, ValueError)
    assert issubclass(kvpack.ProtocolError, ValueError)
    assert issubclass(kvpack.RunError, RuntimeError)


def test_the_gil_is_released_while_encoding():
    """Two threads encoding a large matrix take less than twice one's time on two cores; here
    only that they finish with the same bytes (timing is machine-dependent)."""
    import threading

    x = random_input((4096, 128), seed=5)
    expected = kvpack.encode(x, 4, 32)
    results = [None, None]

    def work(i):
        results[i] = kvpack.encode(x, 4, 32)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r == expected for r in results)


def test_a_setting_label_in_the_archive_is_parsed_as_the_runner_names_it():
    labels = [label for label, *_ in _archived_settings(ROOT / "evidence" / "widths-and-modes")]
    assert all(re.fullmatch(r"g\d+_b\d(_asym)?(_swap)?", label) for label in labels)


def test_a_packed_tensor_pickles_to_an_equal_tensor():
    import pickle

    for mode, bits in [("symmetric", 4), ("asymmetric", 3)]:
        packed = kvpack.encode(random_input((21, 10), seed=2), bits, 8, axis="feature", mode=mode)
        again = pickle.loads(pickle.dumps(packed))
        assert again == packed
        assert again.decode().tobytes() == packed.decode().tobytes()
