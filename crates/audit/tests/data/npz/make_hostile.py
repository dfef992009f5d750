#!/usr/bin/env python3
"""Hostile and honest `.npz` fixtures for the audit's strict npz reader, with NumPy's reading.

Re-run from anywhere (Python 3 and NumPy; nothing else outside the standard library):

    python3 crates/audit/tests/data/npz/make_hostile.py

It (re)writes, next to itself, one `<attack>.npz` per fixture and `expected.json`. The Rust test
`crates/audit/tests/audit/archives.rs` reads `expected.json`: every fixture must get the audit
verdict recorded under "audit" (`"accept"`, or a list of the rule ids, `ZipError::rule()` /
`NpyError::rule()`, that the reader may report first), and every archive the audit accepts must be
read by the audit exactly as NumPy read it here. The script is deterministic: every byte of every
fixture is fixed here (DOS time 0, date 0x21 = 1980-01-01 00:00; no clock, no randomness), so a
re-run with the same NumPy and Python gives byte-identical files. The messages NumPy and zipfile
raise, recorded in expected.json, may change with their versions ("numpy" and "python" at the
top of expected.json say which made it).

What is recorded for each fixture under "numpy" is what `numpy.load(path, allow_pickle=False)`
gives, key by key over `NpzFile.files` (duplicates included, in archive order):
- {"arrays": [{"name", "dtype" (a.dtype.str), "shape", "fortran", "sha256"}, ...]} when the load
  succeeds and every key reads as an ndarray; sha256 is over np.ascontiguousarray(a).tobytes();
- otherwise {"error": "TypeName: message"}: the load's exception, or the first key that raised
  or did not give an ndarray (NpzFile returns a member without the .npy magic as raw `bytes`);
  then "members" lists each key's own result (an array as above, {"name", "error"}, or
  {"name", "bytes": length, "sha256"}).
"about" says, when NumPy reads an archive the audit refuses, what NumPy sees; the script stops if
NumPy's success or failure on a fixture is not the one that sentence describes, so that "about"
never goes stale silently.

numpy.savez: the fixture `numpy_savez.npz` is what `numpy.savez` (uncompressed) writes, with only
the DOS time and date fields (2 x 2 bytes per member, local header and central entry) set to
1980-01-01 00:00 so that it is reproducible. The audit REFUSES it, rule `zip64`: NumPy's `_savez`
opens every member with `zipfile.open(name, "w", force_zip64=True)` (gh-10776), so Python's
zipfile writes each LOCAL header with version needed 45, compressed and uncompressed sizes
0xFFFFFFFF (the ZIP64 marker) and a 20-byte ZIP64 extra field holding the real sizes; the central
entries carry version 45 and the real 32-bit sizes without any extra field. No data descriptor,
flags 0 (no UTF-8 flag). The reader checks a local header's sizes for the ZIP64 marker before its
flags, method, version and extra field, so it names `zip64` (the version 45 and the extra field
would each be refused too). The runner never writes this layout. The accepted "NumPy" layout is
the other honest fixture, `honest_python_zipfile.npz`: members written by NumPy's own
`format.write_array` (header `{..., 'shape': (2, 3), }`) into Python's zipfile with `writestr`
(version needed 20, no extra field, no ZIP64).

Evidence: "evidence" records NumPy's reading of the two archived evidence archives as one digest
each (SHA-256 over, per array in sorted name order, name, NUL, dtype.str, NUL, comma-joined shape,
NUL, C-order data bytes), with the file's SHA-256 and array count. Re-run the script when the
evidence is re-generated.
"""

import hashlib
import io
import json
import os
import platform
import struct
import sys
import zipfile
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", "..", ".."))
EVIDENCE = ["evidence/packed-kv/arrays.npz", "evidence/widths-and-modes/arrays.npz"]

LOCAL_SIG = 0x04034B50
CENTRAL_SIG = 0x02014B50
END_SIG = 0x06054B50
ZIP64_END_SIG = 0x06064B50
ZIP64_LOCATOR_SIG = 0x07064B50
DESCRIPTOR_SIG = 0x08074B50
DOS_TIME = 0  # 00:00:00
DOS_DATE = 0x21  # 1980-01-01
UNIX_644 = 0o100644 << 16

# ---------------------------------------------------------------------------------------------
# .npy members


def npy(dict_text, data, version=(1, 0)):
    """A .npy file: magic, version, header length, header padded with spaces to a 64-byte
    multiple (preamble included) and ended by a newline, then `data` as given."""
    preamble = 10 if version == (1, 0) else 12
    header = dict_text
    while (preamble + len(header) + 1) % 64:
        header += " "
    header = (header + "\n").encode("latin1")
    if version == (1, 0):
        length = struct.pack("<H", len(header))
    else:
        length = struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes(version) + length + header + data


def runner_dict(a, descr=None, fortran="False", shape=None):
    """The header as ndarray-npy (the runner's writer) spells it."""
    descr = a.dtype.str if descr is None else descr
    shape = repr(tuple(a.shape)) if shape is None else shape
    return "{'descr': '%s', 'fortran_order': %s, 'shape': %s}" % (descr, fortran, shape)


def runner_npy(a):
    return npy(runner_dict(a), np.ascontiguousarray(a).tobytes())


def numpy_npy(a):
    """The header as NumPy's own writer spells it: {'descr': ..., 'shape': (2, 3), }."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, version=(1, 0), allow_pickle=False)
    return buf.getvalue()


# Small arrays with fixed values.
Q = (np.arange(6, dtype="<f4") / 4 - 0.5).reshape(2, 3)
REF = np.array([0.5, -1.25, 3.0], dtype="<f8")
OUT = np.array([[1.0, 2.5], [-0.125, 1e-3]], dtype="<f8")
SHAPE = np.array([2, 3], dtype="<i4")
CODES = np.array([1, 2, 3, 250, 255], dtype="|u1")
# The forged arrays of the "two readers" attacks: same names and shapes, other values.
FORGED_Q = np.full((2, 3), 7.0, dtype="<f4")
FORGED_REF = np.array([9.0, 9.0, 9.0], dtype="<f8")

# ---------------------------------------------------------------------------------------------
# ZIP writer with every field under control


class Member:
    """One member. `local`/`central` override fields of one header only; keyword arguments
    override both. `after` is written right after the member's bytes (a data descriptor, a gap);
    `listed=False` leaves it out of the central directory."""

    def __init__(self, name, payload, *, stored=None, after=b"", listed=True, local=None,
                 central=None, **both):
        name = name.encode("utf-8") if isinstance(name, str) else name
        self.stored = payload if stored is None else stored
        fields = dict(version=10, flags=0, method=0, time=DOS_TIME, date=DOS_DATE,
                      crc=zlib.crc32(payload), csize=len(self.stored), size=len(payload),
                      name=name, extra=b"")
        fields.update(both)
        self.local = dict(fields, **(local or {}))
        self.central = dict(fields, made_by=0x030A, comment=b"", disk=0, internal=0,
                            external=UNIX_644)
        self.central.update(central or {})
        self.after = after
        self.listed = listed

    def local_header(self):
        f = self.local
        return struct.pack("<IHHHHHIIIHH", LOCAL_SIG, f["version"], f["flags"], f["method"],
                           f["time"], f["date"], f["crc"], f["csize"], f["size"],
                           len(f["name"]), len(f["extra"])) + f["name"] + f["extra"]

    def central_header(self, offset):
        f = self.central
        offset = f.get("offset", offset)
        return struct.pack("<IHHHHHHIIIHHHHHII", CENTRAL_SIG, f["made_by"], f["version"],
                           f["flags"], f["method"], f["time"], f["date"], f["crc"], f["csize"],
                           f["size"], len(f["name"]), len(f["extra"]), len(f["comment"]),
                           f["disk"], f["internal"], f["external"], offset) \
            + f["name"] + f["extra"] + f["comment"]


def build(members, *, lead=b"", absolute=False, end=None, zip64_record=False, tail=b""):
    """An archive: `lead`, the members, the central directory, [a ZIP64 end record and
    locator,] the end record (fields overridable through `end`), `tail`. Offsets are recorded
    relative to the end of `lead` unless `absolute`."""
    out = bytearray(lead)
    shift = 0 if absolute else len(lead)
    listed = []
    for m in members:
        offset = len(out) - shift
        out += m.local_header() + m.stored + m.after
        if m.listed:
            listed.append((m, offset))
    cd_start = len(out)
    cd = b"".join(m.central_header(offset) for m, offset in listed)
    out += cd
    e = dict(disk=0, cd_disk=0, on_disk=len(listed), total=len(listed), size=len(cd),
             offset=cd_start - shift, comment=b"")
    if zip64_record:
        record_at = len(out) - shift
        out += struct.pack("<IQHHIIQQQQ", ZIP64_END_SIG, 44, 45, 45, 0, 0, len(listed),
                           len(listed), len(cd), cd_start - shift)
        out += struct.pack("<IIQI", ZIP64_LOCATOR_SIG, 0, record_at, 1)
    e.update(end or {})
    out += struct.pack("<IHHHHIIH", END_SIG, e["disk"], e["cd_disk"], e["on_disk"], e["total"],
                       e["size"], e["offset"], len(e["comment"])) + e["comment"]
    out += tail
    return bytes(out)


def runner_members(arrays):
    return [Member(name + ".npy", runner_npy(a)) for name, a in arrays]


HONEST = [("x_q", Q), ("x_ref", REF), ("x_out", OUT), ("x_shape", SHAPE), ("x_codes", CODES)]
PAIR = [("a", Q), ("b", SHAPE)]  # the two-member base of most zip-level attacks
FORGED = [("x_q", FORGED_Q), ("x_ref", FORGED_REF)]


def honest():
    return build(runner_members(HONEST))


def pair(**kw_per_member):
    """PAIR as the runner writes it, with member b's fields overridden."""
    a, b = runner_members(PAIR)
    b = Member(b.local["name"], runner_npy(SHAPE), **kw_per_member)
    return [a, b]


def deflate_stored_block(payload):
    """A raw deflate stream of one final stored block (fixed bytes, any zlib inflates it)."""
    assert len(payload) < 0x10000
    return b"\x01" + struct.pack("<HH", len(payload), len(payload) ^ 0xFFFF) + payload


def python_zipfile():
    """NumPy's own .npy writer into Python's zipfile with writestr (version 20, no extra)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        for name, a in HONEST:
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = UNIX_644
            z.writestr(info, numpy_npy(a))
    return buf.getvalue()


def numpy_savez():
    """numpy.savez's bytes with only the DOS time/date fields of every header fixed."""
    buf = io.BytesIO()
    np.savez(buf, **dict(HONEST))
    b = bytearray(buf.getvalue())
    (_, _, _, _, total, _, cd_offset, _) = struct.unpack("<IHHHHIIH", b[-22:])
    at = cd_offset
    for _ in range(total):
        assert struct.unpack("<I", b[at:at + 4])[0] == CENTRAL_SIG
        b[at + 12:at + 16] = struct.pack("<HH", DOS_TIME, DOS_DATE)
        name_len, extra_len, comment_len = struct.unpack("<HHH", b[at + 28:at + 34])
        local = struct.unpack("<I", b[at + 42:at + 46])[0]
        assert struct.unpack("<I", b[local:local + 4])[0] == LOCAL_SIG
        b[local + 10:local + 14] = struct.pack("<HH", DOS_TIME, DOS_DATE)
        at += 46 + name_len + extra_len + comment_len
    return bytes(b)


def npy_pair(hostile_member):
    """An archive as the runner writes it: an honest member `ok`, then `hostile`."""
    return build([Member("ok.npy", runner_npy(Q)), Member("hostile.npy", hostile_member)])


QDATA = Q.tobytes()
# 58 characters of dictionary, padded to a 10,038-byte header (10 + 10,038 = 157 x 64).
LONG_HEADER = runner_dict(Q) + " " * 9970

# ---------------------------------------------------------------------------------------------
# The fixtures: (file stem, one line on the attack, audit verdict, NumPy reads every key?, bytes)

FIXTURES = [
    # Honest archives.
    ("honest_runner",
     "honest: laid out as the runner writes arrays.npz (zip crate: stored, version 10, no extra, "
     "1980-01-01 00:00; ndarray-npy headers); <f4, <f8 (1-D and 2-D), <i4, |u1",
     "accept", True, honest()),
    ("honest_python_zipfile",
     "honest: NumPy's own .npy writer (header '..., 'shape': (2, 3), }') stored by Python's "
     "zipfile.writestr (version needed 20, no extra field), fixed date",
     "accept", True, python_zipfile()),
    ("numpy_savez",
     "numpy.savez (uncompressed) output, dates fixed: zipfile writes it with force_zip64, so "
     "every local header has sizes 0xFFFFFFFF, version 45 and a ZIP64 extra field; NumPy reads "
     "it, the audit refuses it (the runner never writes this layout)",
     ["zip64"], True, numpy_savez()),
    # Two readers.
    ("two_readers_appended",
     "two readers: an honest archive with a complete forged archive appended; zipfile takes the "
     "last end record and adjusts for the 'prepended' honest bytes, so NumPy reads the FORGED "
     "arrays; a reader that walks from offset 0 would read the honest ones",
     ["directory_bounds"], True,
     honest() + build(runner_members(FORGED))),
    ("two_readers_absolute",
     "two readers: an honest archive followed by a forged one whose offsets count from the file "
     "start, so its end record is self-consistent; NumPy reads the FORGED arrays, the honest "
     "members are the 'leading bytes' no directory lists",
     ["layout"], True,
     build(runner_members(FORGED), lead=honest(), absolute=True)),
    # Bytes where the canonical layout has none.
    ("leading_bytes",
     "22 leading bytes (an empty end record, which makes numpy.load take the file for a zip) "
     "before an archive whose offsets ignore them; zipfile adjusts, NumPy reads the arrays",
     ["directory_bounds"], True,
     build(runner_members(PAIR), lead=struct.pack("<IHHHHIIH", END_SIG, 0, 0, 0, 0, 0, 0, 0))),
    ("leading_bytes_absolute",
     "the same leading bytes, with every offset counted from the file start (as a "
     "self-extracting archive does); NumPy reads the arrays",
     ["layout"], True,
     build(runner_members(PAIR), lead=struct.pack("<IHHHHIIH", END_SIG, 0, 0, 0, 0, 0, 0, 0),
           absolute=True)),
    ("leading_junk",
     "leading bytes that are not a zip signature; numpy.load then does not take the file for a "
     "zip at all and refuses it as pickled data",
     ["directory_bounds"], False,
     build(runner_members(PAIR), lead=b"#!/bin/sh\nexit 0\n")),
    ("gap_between_members",
     "bytes between two members, the second member's offset pointing past them; NumPy reads "
     "the arrays",
     ["layout"], True,
     build([Member("a.npy", runner_npy(Q), after=b"a gap no header describes\n"),
            Member("b.npy", runner_npy(SHAPE))])),
    ("unreferenced_member",
     "a complete member between two others that the central directory does not list; NumPy "
     "reads only the listed arrays and never sees it",
     ["directory_entries"], True,
     build([Member("a.npy", runner_npy(Q)),
            Member("hidden.npy", runner_npy(FORGED_Q), listed=False),
            Member("b.npy", runner_npy(SHAPE))])),
    ("trailing_bytes",
     "bytes after the end record; zipfile searches back for the end record, NumPy reads the "
     "arrays",
     ["end_record"], True,
     build(runner_members(PAIR), tail=b"trailing bytes\n")),
    ("archive_comment",
     "an archive comment in the end record; NumPy reads the arrays",
     ["end_record"], True,
     build(runner_members(PAIR), end=dict(comment=b"an archive comment"))),
    ("two_end_records",
     "a second copy of the end record after the first; zipfile takes the last one, shifts every "
     "offset by 22 bytes and finds no central directory (NumPy refuses it)",
     ["directory_bounds"], False,
     (lambda b: b + b[-22:])(build(runner_members(PAIR)))),
    # Member encodings the canonical layout excludes.
    ("deflated_member",
     "member b deflate-compressed (method 8, one stored deflate block); NumPy inflates and "
     "reads it",
     ["compressed"], True,
     build(pair(method=8, version=20, stored=deflate_stored_block(runner_npy(SHAPE))))),
    ("data_descriptor_flag",
     "member b streamed: flag bit 3, zero CRC and sizes in its local header, a data descriptor "
     "after its bytes; zipfile reads the central directory's sizes, NumPy reads the arrays",
     ["flags"], True,
     build(pair(flags=0x08, version=20, local=dict(crc=0, csize=0, size=0),
                after=struct.pack("<IIII", DESCRIPTOR_SIG, zlib.crc32(runner_npy(SHAPE)),
                                  len(runner_npy(SHAPE)), len(runner_npy(SHAPE)))))),
    ("encrypted_flag",
     "member b flagged encrypted (bit 0) though its bytes are plain; zipfile asks for a "
     "password, NumPy cannot read b",
     ["flags"], False,
     build(pair(flags=0x01))),
    ("utf8_flag",
     "member b with the UTF-8 name flag (bit 11) on an ASCII name; NumPy reads the arrays",
     ["flags"], True,
     build(pair(flags=0x800))),
    ("version_needed_45",
     "member b needs version 4.5 (ZIP64) to extract, without any ZIP64 field; NumPy reads the "
     "arrays",
     ["version"], True,
     build(pair(version=45))),
    ("extra_field",
     "member b with an extended-timestamp extra field (0x5455) in both headers; NumPy reads "
     "the arrays",
     ["extra_field"], True,
     build(pair(extra=struct.pack("<HHBI", 0x5455, 5, 1, 0)))),
    ("file_comment",
     "member b with a file comment in its central directory entry; NumPy reads the arrays",
     ["extra_field"], True,
     build(pair(central=dict(comment=b"a file comment")))),
    # Central directory against local header.
    ("name_mismatch",
     "the central directory names member b 'c.npy' while its local header says 'b.npy'; NumPy "
     "lists key 'c' and zipfile refuses to read it",
     ["header_mismatch"], False,
     build(pair(central=dict(name=b"c.npy")))),
    ("size_mismatch",
     "the central directory gives member b 4 bytes more than its local header (into the "
     "central directory); zipfile reads them and the CRC fails, NumPy cannot read b",
     ["header_mismatch"], False,
     build(pair(central=dict(csize=len(runner_npy(SHAPE)) + 4,
                             size=len(runner_npy(SHAPE)) + 4)))),
    ("crc_mismatch_central",
     "member b's central CRC-32 is wrong, its local one right; zipfile checks the central one, "
     "NumPy cannot read b",
     ["header_mismatch"], False,
     build(pair(central=dict(crc=zlib.crc32(runner_npy(SHAPE)) ^ 1)))),
    ("crc_mismatch_local",
     "member b's local CRC-32 is wrong, its central one right; zipfile never reads the local "
     "CRC, NumPy reads the arrays",
     ["header_mismatch"], True,
     build(pair(local=dict(crc=zlib.crc32(runner_npy(SHAPE)) ^ 1)))),
    ("crc_wrong_both",
     "member b's CRC-32 wrong in both headers (they agree with each other, not with the "
     "bytes); zipfile raises BadZipFile when NumPy reads b",
     ["crc"], False,
     build(pair(crc=zlib.crc32(runner_npy(SHAPE)) ^ 1))),
    ("crc_wrong_unchecked",
     "member 'hostile' with a wrong CRC-32 in both headers and 4,096 bytes after its array "
     "data: zipfile checks a CRC only when a read reaches the member's end, NumPy stops after "
     "the data (and zipfile's 4 KiB read-ahead), so NumPy reads the array without noticing",
     ["crc"], True,
     (lambda m: build([Member("ok.npy", runner_npy(Q)),
                       Member("hostile.npy", m, crc=zlib.crc32(m) ^ 1)]))(
         npy(runner_dict(Q), QDATA + bytes(4096)))),
    # Names.
    ("duplicate_name",
     "two members named a.npy with different arrays; NumPy lists key 'a' twice and reads the "
     "LAST member for both",
     ["duplicate_name"], True,
     build([Member("a.npy", runner_npy(Q)), Member("a.npy", runner_npy(FORGED_Q))])),
    ("stem_collision",
     "members 'a.npy' and 'a' (no suffix); NumPy lists key 'a' twice and reads the member "
     "named 'a' for both, never 'a.npy'",
     ["name"], True,
     build([Member("a.npy", runner_npy(Q)), Member("a", runner_npy(FORGED_Q))])),
    ("path_parent",
     "a member named '../x.npy'; NumPy reads it under key '../x'",
     ["name"], True,
     build([Member("a.npy", runner_npy(Q)), Member("../x.npy", runner_npy(SHAPE))])),
    ("path_subdir",
     "a member named 'a/b.npy'; NumPy reads it under key 'a/b'",
     ["name"], True,
     build([Member("a.npy", runner_npy(Q)), Member("a/b.npy", runner_npy(SHAPE))])),
    ("name_without_npy",
     "a member named 'b.bin'; NumPy reads it (it has the .npy magic) under key 'b.bin'",
     ["name"], True,
     build([Member("a.npy", runner_npy(Q)), Member("b.bin", runner_npy(SHAPE))])),
    ("empty_stem",
     "a member named '.npy'; NumPy reads it under the empty key ''",
     ["name"], True,
     build([Member("a.npy", runner_npy(Q)), Member(".npy", runner_npy(SHAPE))])),
    # ZIP64 and disks.
    ("zip64_entry_count",
     "end record entry counts 0xFFFF (ZIP64 marker) without any ZIP64 record; zipfile walks the "
     "directory by its size and NumPy reads the arrays",
     ["zip64"], True,
     build(runner_members(PAIR), end=dict(on_disk=0xFFFF, total=0xFFFF))),
    ("zip64_offset",
     "end record directory offset 0xFFFFFFFF with a real ZIP64 end record and locator before "
     "it; zipfile takes the offset from the ZIP64 record and NumPy reads the arrays",
     ["zip64"], True,
     build(runner_members(PAIR), zip64_record=True, end=dict(offset=0xFFFFFFFF))),
    ("multi_disk",
     "end record on disk 1 with its directory on disk 1; zipfile ignores disk numbers, NumPy "
     "reads the arrays",
     ["disk"], True,
     build(runner_members(PAIR), end=dict(disk=1, cd_disk=1))),
    # .npy members (member 'ok' honest, member 'hostile' not).
    ("npy_bad_magic",
     "member 'hostile' without the .npy magic; NumPy returns its raw bytes instead of an array",
     ["npy_magic"], False,
     npy_pair(b"\x93NUMPX" + runner_npy(SHAPE)[6:])),
    ("npy_version_2",
     "member 'hostile' in .npy format 2.0 (4-byte header length); NumPy reads it",
     ["npy_version"], True,
     npy_pair(npy(runner_dict(SHAPE), SHAPE.tobytes(), version=(2, 0)))),
    ("npy_key_order",
     "member 'hostile' with its header keys in another order; NumPy reads it (ast.literal_eval)",
     ["npy_header"], True,
     npy_pair(npy("{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}", QDATA))),
    ("npy_descr_f4",
     "member 'hostile' with descr 'f4' (native order); NumPy reads it as <f4 on this machine",
     ["npy_dtype"], True,
     npy_pair(npy(runner_dict(Q, descr="f4"), QDATA))),
    ("npy_descr_big_endian",
     "member 'hostile' with descr '>f4'; NumPy reads big-endian floats",
     ["npy_dtype"], True,
     npy_pair(npy(runner_dict(Q, descr=">f4"), Q.astype(">f4").tobytes()))),
    ("npy_descr_u2",
     "member 'hostile' with descr '<u2', a dtype the evidence never uses; NumPy reads it",
     ["npy_dtype"], True,
     npy_pair(npy(runner_dict(SHAPE, descr="<u2", shape="(4,)"), SHAPE.tobytes()))),
    ("npy_fortran_order",
     "member 'hostile' with 'fortran_order': True; NumPy reads the same bytes as the transposed "
     "layout",
     ["npy_fortran_order"], True,
     npy_pair(npy(runner_dict(Q, fortran="True"), QDATA))),
    ("npy_shape_not_tuple",
     "member 'hostile' with shape (6) (an int, not a tuple); NumPy refuses the header",
     ["npy_shape"], False,
     npy_pair(npy(runner_dict(Q, shape="(6)"), QDATA))),
    ("npy_shape_leading_zero",
     "member 'hostile' with shape (02, 3); Python's literal_eval refuses the leading zero, so "
     "NumPy refuses the header",
     ["npy_shape"], False,
     npy_pair(npy(runner_dict(Q, shape="(02, 3)"), QDATA))),
    ("npy_data_short",
     "member 'hostile' holds 4 bytes fewer than shape x itemsize; NumPy fails at EOF",
     ["npy_data_size"], False,
     npy_pair(npy(runner_dict(Q), QDATA[:-4]))),
    ("npy_data_long",
     "member 'hostile' holds 8 bytes more than shape x itemsize; NumPy ignores them and reads "
     "the array: the extra bytes are data the audit would certify but NumPy never shows",
     ["npy_data_size"], True,
     npy_pair(npy(runner_dict(Q), QDATA + b"\x00\x00\x80\x7f" * 2))),
    ("npy_huge_shape",
     "member 'hostile' with shape (2**40, 2**40) of <f8 over 16 data bytes (the element count "
     "overflows 64 bits to 0 in NumPy); NumPy refuses it",
     ["npy_shape"], False,
     npy_pair(npy(runner_dict(REF, shape="(%d, %d)" % (2**40, 2**40)), bytes(16)))),
    ("npy_header_too_long",
     "member 'hostile' whose header is %d bytes (spaces after the dictionary), over NumPy's "
     "10,000-byte limit for allow_pickle=False loads; NumPy refuses it"
     % (len(npy(LONG_HEADER, b"")) - 10),
     ["npy_header_length"], False,
     npy_pair(npy(LONG_HEADER, QDATA))),
]

# ---------------------------------------------------------------------------------------------
# NumPy's reading


def describe(e, path):
    text = "%s: %s" % (type(e).__name__, e)
    return text.replace(os.path.abspath(path), os.path.basename(path))


def array_record(name, a):
    return {
        "name": name,
        "dtype": a.dtype.str,
        "shape": list(a.shape),
        "fortran": bool(a.flags.f_contiguous and not a.flags.c_contiguous),
        "sha256": hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest(),
    }


def numpy_reading(path):
    try:
        npz = np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - every failure is a reading
        return {"error": describe(e, path)}
    if not isinstance(npz, np.lib.npyio.NpzFile):
        return {"error": "not an npz: numpy.load returned %s" % type(npz).__name__}
    members, error = [], None
    with npz:
        for key in npz.files:
            try:
                a = npz[key]
            except Exception as e:  # noqa: BLE001
                members.append({"name": key, "error": describe(e, path)})
                error = error or "%s (key %r)" % (describe(e, path), key)
                continue
            if isinstance(a, np.ndarray):
                members.append(array_record(key, a))
            else:
                raw = bytes(a)
                members.append({"name": key, "bytes": len(raw),
                                "sha256": hashlib.sha256(raw).hexdigest()})
                error = error or "%s: NpzFile[%r] gave %d raw bytes, not an array" % (
                    type(a).__name__, key, len(raw))
    if error is None:
        return {"arrays": members}
    return {"error": error, "members": members}


def evidence_record(rel):
    path = os.path.join(ROOT, rel)
    with open(path, "rb") as f:
        raw = f.read()
    digest = hashlib.sha256()
    with np.load(path, allow_pickle=False) as npz:
        names = sorted(npz.files)
        for name in names:
            a = npz[name]
            for part in (name.encode(), a.dtype.str.encode(),
                         ",".join(str(d) for d in a.shape).encode()):
                digest.update(part)
                digest.update(b"\0")
            digest.update(np.ascontiguousarray(a).tobytes())
    return {"path": rel, "file_sha256": hashlib.sha256(raw).hexdigest(), "arrays": len(names),
            "digest": digest.hexdigest()}


def main():
    archives = []
    stems = set()
    for stem, about, audit, numpy_reads, data in FIXTURES:
        assert stem not in stems, stem
        stems.add(stem)
        file = stem + ".npz"
        path = os.path.join(HERE, file)
        with open(path, "wb") as f:
            f.write(data)
        reading = numpy_reading(path)
        if ("arrays" in reading) != numpy_reads:
            sys.exit("%s: NumPy %s it, but 'about' says otherwise: %s" % (
                file, "reads" if "arrays" in reading else "does not read", reading))
        archives.append({"file": file, "about": about, "audit": audit, "numpy": reading})
    expected = {
        "numpy": np.__version__,
        "python": platform.python_version(),
        "about": "Hostile and honest npz archives for the audit's strict reader "
                 "(crates/audit/src/common/npz), written by make_hostile.py: for each, the verdict "
                 "the audit must give ('accept' or the rule ids it may report first) and what "
                 "numpy.load(path, allow_pickle=False) reads ('arrays' when every key gives "
                 "an ndarray, else 'error' with each key's result under 'members'); and "
                 "NumPy's reading of the archived evidence as one digest per archive.",
        "archives": archives,
        "evidence": [evidence_record(rel) for rel in EVIDENCE],
    }
    with open(os.path.join(HERE, "expected.json"), "w", encoding="ascii", newline="\n") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
