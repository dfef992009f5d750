"""kvpack.audit and kvpack.run: the audit library and the study runner, as the binaries call
them. The archived evidence passes; a tampered copy fails with its problems named; a small
protocol run from a dict is audited PASS."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import kvpack

ROOT = Path(__file__).resolve().parents[2]
PACKED_KV = ROOT / "evidence" / "packed-kv"

SMALL = {
    "study": "python-smoke",
    "seeds": [7],
    "tokens": [40],
    "features": 16,
    "queries": 2,
    "distributions": ["clean"],
    "settings": [
        {"group_size": 8, "bits": 4},
        {"group_size": 16, "bits": 3, "mode": "asymmetric"},
    ],
    "generator": {
        "name": "numpy",
        "entropy": {"seed_multiplier": 10000, "tokens_multiplier": 1, "offset": 0},
    },
}


@pytest.fixture(scope="module")
def archived_report():
    return kvpack.audit(PACKED_KV)


def test_the_archived_evidence_passes(archived_report):
    report = archived_report
    assert report.passed, str(report)
    assert report.verdict == "PASS"
    assert report.problems == []
    assert report.counts["codes (the quantization rule, range and padding)"] == 2_912_256
    assert report.counts["result rows"] == 144
    assert str(report).startswith("PASS ")


def test_a_tampered_copy_fails_with_its_problems(tmp_path):
    copy = tmp_path / "packed-kv"
    shutil.copytree(PACKED_KV, copy)
    summary = copy / "summary.md"
    text = summary.read_text()
    assert "13.450%" in text
    summary.write_text(text.replace("13.450%", "12.450%", 1))
    report = kvpack.audit(copy)
    assert not report.passed
    assert report.verdict == "FAIL"
    assert report.problems, str(report)
    assert any("summary.md" in p for p in report.problems), report.problems
    assert "FAIL: " in str(report)


def test_a_missing_directory_is_a_fail_not_an_exception(tmp_path):
    report = kvpack.audit(tmp_path / "nothing")
    assert report.verdict == "FAIL" and report.problems


def test_a_dict_protocol_runs_and_audits_pass(tmp_path):
    out = kvpack.run(SMALL, tmp_path / "run", threads=2)
    assert out == tmp_path / "run" and (out / "manifest.json").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["protocol_source"] == "kvpack.run"
    report = kvpack.audit(out, tree=ROOT, models=False)
    assert report.passed, str(report)
    # The same protocol from a file, with a different thread count: the same arrays.
    path = tmp_path / "small.json"
    path.write_text(json.dumps(SMALL))
    again = kvpack.run(path, tmp_path / "again", threads=1)
    assert (again / "arrays.npz").read_bytes() == (out / "arrays.npz").read_bytes()


def test_run_refusals(tmp_path):
    with pytest.raises(kvpack.ProtocolError, match="settings"):
        kvpack.run({**SMALL, "settings": [{"group_size": 8, "bits": 9}]}, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    (tmp_path / "exists").mkdir()
    with pytest.raises(kvpack.RunError, match="exists"):
        kvpack.run(SMALL, tmp_path / "exists")
    with pytest.raises(ValueError, match="threads"):
        kvpack.run(SMALL, tmp_path / "t", threads=0)
    with pytest.raises(TypeError, match="out="):
        kvpack.run(SMALL)
