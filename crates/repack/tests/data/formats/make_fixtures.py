"""Copies the conformance fixtures the repack tests need out of the shared reference set, leanly.

Usage: python3 make_fixtures.py /work/shared/reference/formats

- Library outputs are copied byte for byte (`library/`): these are what the tests compare with.
- Logical inputs (`inputs/`): the GPTQ/AWQ input .npz files hold int64 codes; they are re-encoded
  losslessly as small safetensors files (codes U8 [K, N], zeros U8 [G, N] true zero points,
  scales F16 [G, N], g_idx I32 [K] when the input has one). The GGUF and NF4 float inputs are
  copied as they are.
- `expected.json`: the SHA-256 of every library's dequantized weights (float32, C order), after
  checking that all the libraries that read a case agree exactly; the tests hash their own
  dequantization and compare.
- `proj_nf4.safetensors`: the NF4 pattern fixture's bytes laid out under the tensor names
  bitsandbytes' Linear4bit writes (`proj.weight`, `.absmax`, `.quant_map`,
  `.quant_state.bitsandbytes__nf4`). Assembled here, NOT written by bitsandbytes itself; it exists
  so the CLI can be shown refusing NF4 -> GPTQ.

Needs only NumPy. Safetensors files are written by hand (8-byte little-endian header length,
JSON header, raw little-endian data), keys sorted.
"""

import hashlib
import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

GPTQ_CASES = [f"gptq_{p}_b{b}" for p in ("pattern", "all15") for b in (2, 3, 4, 8)]
AWQ_CASES = ["awq_pattern", "awq_all15"]
DTYPES = {np.dtype(np.uint8): "U8", np.dtype(np.int32): "I32", np.dtype(np.float16): "F16",
          np.dtype(np.float32): "F32"}


def write_safetensors(path, tensors, metadata=None):
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        data = array.astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": DTYPES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def sha256(array):
    return hashlib.sha256(np.ascontiguousarray(array, dtype="<f4").tobytes()).hexdigest()


def agreed_weight_hash(outputs, stem):
    """The hash all `<stem>_unpacked_<lib>.npz` readers agree on (asserts they do)."""
    hashes = {p.name: sha256(np.load(p)["weight"]) for p in sorted(outputs.glob(f"{stem}_unpacked_*.npz"))}
    assert hashes, stem
    assert len(set(hashes.values())) == 1, (stem, hashes)
    return next(iter(hashes.values())), sorted(hashes)


def compact_input(source, target):
    z = np.load(source)
    tensors = {
        "codes": z["codes"].astype(np.uint8),
        "zeros": z["zeros"].astype(np.uint8),
        "scales": z["scales"].astype(np.float16),
    }
    if "g_idx" in z.files:
        tensors["g_idx"] = z["g_idx"].astype(np.int32)
    for name in ("codes", "zeros"):
        assert np.array_equal(tensors[name].astype(np.int64), z[name]), (source, name)
    write_safetensors(target, tensors)


def main(reference):
    inputs, outputs = reference / "inputs", reference / "outputs"
    (HERE / "inputs").mkdir(exist_ok=True)
    (HERE / "library").mkdir(exist_ok=True)
    expected = {}

    for case in GPTQ_CASES + ["gptq_actorder_b4"] + AWQ_CASES:
        compact_input(inputs / f"{case}.npz", HERE / "inputs" / f"{case}.safetensors")
    for case in GPTQ_CASES:
        for variant in (case, f"{case}_v2"):
            shutil.copyfile(outputs / f"{variant}.safetensors", HERE / "library" / f"{variant}.safetensors")
            expected[variant] = agreed_weight_hash(outputs, variant)
    shutil.copyfile(outputs / "gptq_actorder_b4.safetensors", HERE / "library" / "gptq_actorder_b4.safetensors")
    expected["gptq_actorder_b4"] = agreed_weight_hash(outputs, "gptq_actorder_b4")
    for case in AWQ_CASES:
        for variant in (case, f"{case}_as_gptq"):
            shutil.copyfile(outputs / f"{variant}.safetensors", HERE / "library" / f"{variant}.safetensors")
        expected[case] = agreed_weight_hash(outputs, case)

    for probe in ("pattern", "all15"):
        shutil.copyfile(inputs / f"gguf_{probe}.npy", HERE / "inputs" / f"gguf_{probe}.npy")
        for kind in ("Q4_0", "Q4_1", "Q8_0"):
            stem = f"gguf_{probe}_{kind}"
            shutil.copyfile(outputs / f"{stem}.bin", HERE / "library" / f"{stem}.bin")
            expected[stem] = [sha256(np.load(outputs / f"{stem}_deq.npy")), [f"{stem}_deq.npy"]]
        shutil.copyfile(inputs / f"nf4_{probe}.npy", HERE / "inputs" / f"nf4_{probe}.npy")
        nf4 = np.load(outputs / f"nf4_{probe}.npz")
        packed = nf4["packed"].reshape(-1).astype(np.uint8)
        assert packed.tobytes() == (outputs / f"nf4_{probe}.bin").read_bytes()
        shutil.copyfile(outputs / f"nf4_{probe}.bin", HERE / "library" / f"nf4_{probe}.bin")
        # The absmax as raw little-endian f32, exactly the bytes bitsandbytes returned.
        (HERE / "library" / f"nf4_{probe}_absmax.bin").write_bytes(nf4["absmax"].astype("<f4").tobytes())
        expected[f"nf4_{probe}"] = [sha256(np.load(outputs / f"nf4_{probe}_deq.npy")), [f"nf4_{probe}_deq.npy"]]
        if probe == "pattern":
            quant_state = json.dumps({"quant_type": "nf4", "blocksize": int(nf4["blocksize"]),
                                      "dtype": "float32", "shape": [int(s) for s in nf4["shape"]]})
            write_safetensors(HERE / "proj_nf4.safetensors", {
                "proj.weight": packed.reshape(-1, 1),
                "proj.weight.absmax": nf4["absmax"].astype(np.float32),
                "proj.weight.quant_map": nf4["code"].astype(np.float32),
                "proj.weight.quant_state.bitsandbytes__nf4": np.frombuffer(quant_state.encode(), np.uint8),
            }, {"format": "pt"})

    (HERE / "expected.json").write_text(json.dumps(
        {name: {"weight_sha256": h, "agreed_by": libs} for name, (h, libs) in sorted(expected.items())},
        indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/work/shared/reference/formats"))
