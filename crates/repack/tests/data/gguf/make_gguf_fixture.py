#!/usr/bin/env python3
"""What gguf-py (the `gguf` package, 0.19.0) reads in the GGUF files `repack quantize` writes.

    python3 make_gguf_fixture.py [REPACK]

With REPACK (the path of a built `repack` binary), first rewrites pattern_{q4_0,q8_0,q4_1}.gguf
from ../formats/inputs/gguf_pattern.npy (8 x 256 float32). Then, for each file, opens it with
`gguf.GGUFReader`, dequantizes its tensor with `gguf.quants.dequantize`, and records into
gguf_py.json: the file's SHA-256, its metadata (GGUF.* header fields left out), and per tensor its
name, ggml type, gguf-py's shape (ne order, row length first), the shape of the dequantized
array, and the SHA-256 of the dequantized values as little-endian float32 in row-major order;
and whether gguf-py's own `GGUFWriter`, given the same metadata and the tensor's blocks, writes
the same file byte for byte (`gguf_py_writer_identical`).

The Rust test `quantfile::gguf_files_match_what_gguf_py_read` re-writes each file from the same
input and requires it byte-identical to the committed one, and `repack dequantize`'s output to
hash as gguf-py's did. (The `kvpack.tool` value holds repack's version: after a version change,
rerun this script with the new binary and commit the result.)
"""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import tempfile

import numpy as np
from gguf import GGUFReader, GGUFWriter
from gguf.quants import dequantize

HERE = Path(__file__).resolve().parent
INPUT = HERE.parent / "formats" / "inputs" / "gguf_pattern.npy"
FORMATS = ["q4_0", "q8_0", "q4_1"]


def main() -> None:
    if len(sys.argv) > 1:
        for fmt in FORMATS:
            out = HERE / f"pattern_{fmt}.gguf"
            out.unlink(missing_ok=True)
            subprocess.run([sys.argv[1], "quantize", "--to", fmt, str(INPUT), str(out)], check=True)
    record = {}
    for fmt in FORMATS:
        path = HERE / f"pattern_{fmt}.gguf"
        reader = GGUFReader(path)
        metadata = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
        tensors = []
        for t in reader.tensors:
            values = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype="<f4")
            tensors.append({
                "name": t.name,
                "type": t.tensor_type.name,
                "shape": [int(d) for d in t.shape],
                "dequantized_shape": list(values.shape),
                "dequantized_sha256": hashlib.sha256(values.tobytes()).hexdigest(),
            })
        with tempfile.TemporaryDirectory() as tmp:
            again = Path(tmp) / path.name
            writer = GGUFWriter(again, metadata["general.architecture"])
            writer.add_name(metadata["general.name"])
            writer.add_string("kvpack.tool", metadata["kvpack.tool"])
            for t in reader.tensors:
                writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
            identical = again.read_bytes() == path.read_bytes()
        record[path.name] = {
            "gguf_py_writer_identical": identical,
            "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "metadata": metadata,
            "tensors": tensors,
        }
    (HERE / "gguf_py.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
