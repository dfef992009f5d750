"""kvpack.weights against the libraries that define each layout, on the project's conformance
fixtures (crates/repack/tests/data/formats: written by AutoGPTQ, GPTQModel, AutoAWQ, gguf-py and
bitsandbytes, with the logical inputs they were made from and the SHA-256 of what every
library reader dequantized). GGUF files are written here by gguf-py's own GGUFWriter and read
back by gguf-py's dequantizer; safetensors files are read by the safetensors package."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import kvpack

FORMATS = Path(__file__).resolve().parents[2] / "crates" / "repack" / "tests" / "data" / "formats"
EXPECTED = json.loads((FORMATS / "expected.json").read_text())
GPTQ_CASES = [f"gptq_{probe}_b{bits}" for probe in ("pattern", "all15") for bits in (2, 3, 4, 8)]
GGUF_TYPES = {
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
}


def weight_hash(values: np.ndarray) -> str:
    """SHA-256 of float32 values, little-endian, row-major (as expected.json)."""
    assert values.dtype == np.float32
    return hashlib.sha256(np.ascontiguousarray(values).astype("<f4").tobytes()).hexdigest()


def only_layer(path, **kwargs) -> kvpack.weights.WeightLayer:
    layers = kvpack.weights.read(path, **kwargs)
    assert len(layers) == 1, layers
    return layers[0]


def assert_logical(layer, inputs: dict, label: str):
    """A GPTQ/AWQ layer's parts are the logical input the library packed."""
    np.testing.assert_array_equal(layer.codes, inputs["codes"], err_msg=label)
    assert layer.scales.dtype == np.float16, label
    assert layer.scales.tobytes() == inputs["scales"].tobytes(), label
    np.testing.assert_array_equal(layer.zero_points, inputs["zeros"], err_msg=label)
    k = inputs["codes"].shape[0]
    g_idx = inputs.get("g_idx", np.arange(k) // layer.group_size)
    np.testing.assert_array_equal(layer.g_idx, g_idx, err_msg=label)


@pytest.mark.parametrize(
    "case, variant",
    [(case, v) for case in GPTQ_CASES for v in ("", "_v2")] + [("gptq_actorder_b4", "")],
)
def test_gptq_layers_read_as_the_input_the_library_packed(case, variant):
    inputs = load_file(FORMATS / "inputs" / f"{case}.safetensors")
    layer = only_layer(FORMATS / "library" / f"{case}{variant}.safetensors")
    label = case + variant
    assert layer.format == ("gptq_v2" if variant else "gptq"), label
    assert layer.bits == int(case.rsplit("_b", 1)[1]), label
    assert layer.shape == inputs["codes"].shape, label
    assert_logical(layer, inputs, label)
    # The metadata states the convention; asking for the same one is allowed.
    assert only_layer(FORMATS / "library" / f"{case}{variant}.safetensors", format=layer.format)
    values = layer.dequantize()
    assert values.shape == layer.shape
    assert weight_hash(values) == EXPECTED[label]["weight_sha256"], label
    # Dequantization is the rule the parts state: scale * (code - zero) of the row's group.
    groups = layer.g_idx.astype(np.intp)
    rule = layer.scales.astype(np.float32)[groups] * (
        layer.codes.astype(np.float32) - layer.zero_points[groups].astype(np.float32)
    )
    assert rule.tobytes() == values.tobytes(), label


@pytest.mark.parametrize("probe", ["pattern", "all15"])
def test_awq_layers_read_as_their_input_and_as_autoawqs_own_gptq_repack(probe):
    inputs = load_file(FORMATS / "inputs" / f"awq_{probe}.safetensors")
    awq = only_layer(FORMATS / "library" / f"awq_{probe}.safetensors")
    assert (awq.format, awq.bits, awq.group_size) == ("awq", 4, 32)
    assert_logical(awq, inputs, probe)
    assert weight_hash(awq.dequantize()) == EXPECTED[f"awq_{probe}"]["weight_sha256"]
    repacked = only_layer(FORMATS / "library" / f"awq_{probe}_as_gptq.safetensors")
    assert repacked.format == "gptq"
    assert repacked.dequantize().tobytes() == awq.dequantize().tobytes()
    assert awq.cost["total_bytes"] < repacked.cost["total_bytes"]  # AWQ stores no g_idx


def write_gguf(path: Path, tensors: dict) -> None:
    """A GGUF file written by gguf-py: name -> (raw block bytes as uint8 [rows, row bytes], type)
    or a float32 array."""
    writer = gguf.GGUFWriter(str(path), "kvpack-test")
    for name, tensor in tensors.items():
        if isinstance(tensor, tuple):
            data, qtype = tensor
            writer.add_tensor(name, data, raw_dtype=qtype)
        else:
            writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("probe", ["pattern", "all15"])
@pytest.mark.parametrize("name", sorted(GGUF_TYPES))
def test_gguf_tensors_read_as_gguf_py_dequantizes_them(tmp_path, probe, name):
    qtype = GGUF_TYPES[name]
    x = np.load(FORMATS / "inputs" / f"gguf_{probe}.npy")
    blocks = (FORMATS / "library" / f"gguf_{probe}_{name.upper()}.bin").read_bytes()
    # gguf-py quantizes the input to the library's bytes (the fixture's own claim, re-checked).
    assert gguf.quants.quantize(x, qtype).tobytes() == blocks
    raw = np.frombuffer(blocks, dtype=np.uint8).reshape(x.shape[0], -1)
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, {"blk.0.attn_k.weight": (raw, qtype), "output_norm.weight": x[0].copy()})

    layer = only_layer(path)  # the float tensor is skipped
    assert (layer.name, layer.format, layer.bits, layer.group_size) == (
        "blk.0.attn_k.weight",
        name,
        8 if name == "q8_0" else 4,
        32,
    )
    assert layer.shape == x.shape
    values = layer.dequantize()
    library = gguf.quants.dequantize(raw, qtype)
    assert values.shape == library.shape
    assert values.tobytes() == library.astype(np.float32).tobytes()
    assert weight_hash(values) == EXPECTED[f"gguf_{probe}_{name.upper()}"]["weight_sha256"]

    # Every block's d is its first two bytes, in the shape [rows, cols / 32].
    block_bytes = {"q4_0": 18, "q8_0": 34, "q4_1": 20}[name]
    per_block = np.frombuffer(blocks, dtype=np.uint8).reshape(-1, block_bytes)
    d = per_block[:, :2].copy().view(np.float16).reshape(x.shape[0], -1)
    assert layer.scales.dtype == np.float16 and layer.scales.tobytes() == d.tobytes()
    scale = np.repeat(layer.scales.astype(np.float32), 32, axis=1)
    if name == "q4_1":
        m = per_block[:, 2:4].copy().view(np.float16).reshape(x.shape[0], -1)
        assert layer.zero_points is None and layer.minimums.tobytes() == m.tobytes()
        rule = scale * layer.codes.astype(np.float32) + np.repeat(
            layer.minimums.astype(np.float32), 32, axis=1
        )
    else:
        offset = 8 if name == "q4_0" else 128
        assert layer.minimums is None and np.all(layer.zero_points == offset)
        rule = scale * (layer.codes.astype(np.float32) - offset)
    assert rule.tobytes() == values.tobytes()
    assert layer.cost["total_bytes"] == len(blocks)


def test_a_gguf_block_type_without_a_reader_is_refused_by_name(tmp_path):
    path = tmp_path / "q5_0.gguf"
    x = np.load(FORMATS / "inputs" / "gguf_pattern.npy")
    raw = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q5_0)
    write_gguf(path, {"blk.0.attn_v.weight": (raw, gguf.GGMLQuantizationType.Q5_0)})
    with pytest.raises(kvpack.WeightsError, match=r'"blk.0.attn_v.weight" is Q5_0'):
        kvpack.weights.read(path)
    with pytest.raises(kvpack.WeightsError, match="names each tensor's type"):
        kvpack.weights.read(path, format="gptq")


@pytest.mark.parametrize("probe", ["pattern", "all15"])
def test_nf4_layers_read_as_bitsandbytes_wrote_them(tmp_path, probe):
    # proj_nf4.safetensors carries the pattern fixture's bytes under Linear4bit's tensor names;
    # the all15 case is assembled the same way here.
    tensors = load_file(FORMATS / "proj_nf4.safetensors")
    packed = np.frombuffer((FORMATS / "library" / f"nf4_{probe}.bin").read_bytes(), np.uint8)
    absmax = np.frombuffer(
        (FORMATS / "library" / f"nf4_{probe}_absmax.bin").read_bytes(), "<f4"
    )
    tensors["proj.weight"] = packed.reshape(tensors["proj.weight"].shape)
    tensors["proj.weight.absmax"] = absmax.copy()
    path = tmp_path / "nf4.safetensors"
    save_file(tensors, str(path))

    layer = only_layer(path)
    assert (layer.name, layer.format, layer.group_size, layer.shape) == ("proj", "nf4", 64, (8, 128))
    assert layer.scales.dtype == np.float32 and layer.scales.tobytes() == absmax.tobytes()
    assert layer.zero_points is None and layer.g_idx is None
    codes = layer.codes.reshape(-1)
    # bitsandbytes puts the first element in the high nibble.
    assert ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8).tobytes() == packed.tobytes()
    values = layer.dequantize()
    assert weight_hash(values) == EXPECTED[f"nf4_{probe}"]["weight_sha256"]
    rule = layer.levels[codes] * np.repeat(absmax, 64)
    assert rule.astype(np.float32).tobytes() == values.reshape(-1).tobytes()


def test_awq_to_gptq_conversion_writes_autoawqs_own_bytes(tmp_path):
    out = tmp_path / "as_gptq.safetensors"
    done = kvpack.weights.convert(FORMATS / "library" / "awq_pattern.safetensors", out, to="gptq")
    assert (done["from"], done["to"], done["group_size"]) == ("awq", "gptq", 32)
    (layer,) = done["layers"]
    assert layer["before"]["bits_per_element"] == 4.625
    assert layer["after"]["bits_per_element"] == 5.125
    ours = load_file(out)
    autoawq = load_file(FORMATS / "library" / "awq_pattern_as_gptq.safetensors")
    assert sorted(ours) == sorted(autoawq)
    for name in ours:
        assert ours[name].dtype == autoawq[name].dtype, name
        assert ours[name].tobytes() == autoawq[name].tobytes(), name


def test_act_order_gptq_to_awq_and_back_gives_the_original_bytes(tmp_path):
    source = FORMATS / "library" / "gptq_actorder_b4.safetensors"
    awq, back = tmp_path / "awq.safetensors", tmp_path / "back.safetensors"
    to_awq = kvpack.weights.convert(source, awq, to="awq")
    assert to_awq["layers"][0]["permuted"]
    read_awq = only_layer(awq)
    assert read_awq.format == "awq" and read_awq.input_permutation is not None
    # The AWQ rows are the original rows, permuted as recorded.
    original = only_layer(source).dequantize()
    assert read_awq.dequantize().tobytes() == original[read_awq.input_permutation].tobytes()
    restored = kvpack.weights.convert(awq, back, to="gptq")
    assert restored["layers"][0]["restored"]
    ours, library = load_file(back), load_file(source)
    for name in library:
        assert ours[name].tobytes() == library[name].tobytes(), name


def test_conversion_refuses_an_existing_output_and_nf4(tmp_path):
    existing = tmp_path / "exists.safetensors"
    existing.write_bytes(b"keep me")
    with pytest.raises(FileExistsError):
        kvpack.weights.convert(FORMATS / "library" / "awq_pattern.safetensors", existing, to="gptq")
    assert existing.read_bytes() == b"keep me"
    out = tmp_path / "nf4_as_gptq.safetensors"
    with pytest.raises(kvpack.WeightsError, match="requantiz"):
        kvpack.weights.convert(FORMATS / "proj_nf4.safetensors", out, to="gptq")
    assert not out.exists()
    with pytest.raises(ValueError, match="unknown weight format"):
        kvpack.weights.convert(FORMATS / "library" / "awq_pattern.safetensors", out, to="gptq_v3")


def test_a_gptq_convention_recorded_nowhere_is_asked_for_not_guessed(tmp_path):
    tensors = load_file(FORMATS / "library" / "gptq_pattern_b4_v2.safetensors")
    bare = tmp_path / "bare.safetensors"
    save_file(tensors, str(bare))  # no metadata
    with pytest.raises(kvpack.WeightsError, match="gptq_v2"):
        kvpack.weights.read(bare)
    v2 = only_layer(bare, format="gptq_v2")
    expected = EXPECTED["gptq_pattern_b4_v2"]["weight_sha256"]
    assert weight_hash(v2.dequantize()) == expected
    # The metadata's convention wins over a contradicting request, which is refused.
    with pytest.raises(kvpack.WeightsError, match='says format = "gptq_v2"'):
        kvpack.weights.read(FORMATS / "library" / "gptq_pattern_b4_v2.safetensors", format="gptq")


@pytest.mark.parametrize(
    "content", [b"", b"not a checkpoint", b"GGUF\x03\x00\x00\x00", b"\xff" * 64]
)
def test_damaged_files_raise_weights_error_not_a_crash(tmp_path, content):
    path = tmp_path / "damaged.bin"
    path.write_bytes(content)
    with pytest.raises(kvpack.WeightsError, match="damaged.bin"):
        kvpack.weights.read(path)


def test_a_missing_file_is_named():
    with pytest.raises(kvpack.WeightsError, match="no such file"):
        kvpack.weights.read("/nonexistent/model.safetensors")


def test_bpw_counts_every_stored_byte():
    cost = kvpack.bpw()  # the worked example: 4096 x 4096, 4-bit, groups of 128, f16 scales
    elements = 4096 * 4096
    assert cost["elements"] == elements
    assert cost["code_bytes"] == elements // 2
    assert cost["scale_bytes"] == elements // 128 * 2
    assert cost["bits_per_element"] == 4.125
    asym = kvpack.weights.bpw((4096, 4096), bits=4, group_size=128, zero_points="packed", g_idx=True)
    assert asym["zero_point_bytes"] == elements // 128 // 2
    assert asym["g_idx_bytes"] == 4096 * 4
    assert asym["total_bytes"] == sum(
        asym[k] for k in ("code_bytes", "scale_bytes", "zero_point_bytes", "g_idx_bytes")
    )
    # A read layer's cost is the same count from its stored tensors.
    layer = only_layer(FORMATS / "library" / "gptq_pattern_b4.safetensors")
    assert layer.cost == kvpack.bpw(
        (128, 64), bits=4, group_size=32, zero_points="packed", g_idx=True, container="line-words"
    )


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"bits": 9}, ValueError, "9"),
        ({"group_size": 0}, kvpack.WeightsError, "group"),
        ({"axis": "diagonal"}, ValueError, "diagonal"),
        ({"scale": "f8"}, ValueError, "f8"),
        ({"zero_points": "int4"}, ValueError, "int4"),
        ({"padding": "rows"}, ValueError, "rows"),
        ({"container": "words"}, ValueError, "words"),
        ({"shape": (4096,)}, ValueError, "rows, cols"),
        ({"shape": (4096.0, 16)}, TypeError, "float"),
        ({"shape": (-1, 16)}, OverflowError, "negative"),
    ],
)
def test_bpw_refuses_values_outside_the_layouts(kwargs, error, match):
    with pytest.raises(error, match=match):
        kvpack.bpw(**kwargs)
