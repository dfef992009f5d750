"""The README's Python example prints what the README says it printed (as the Rust example runs
as a doc test of kvcodec)."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_example_prints_its_output():
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    code, printed = re.search(r"```python\n(.*?)```.*?```text\n(.*?)```", section, re.S).groups()
    out = io.StringIO()
    here = os.getcwd()
    os.chdir(ROOT)  # the example runs from the repository root
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md", "exec"), {})
    finally:
        os.chdir(here)
    assert out.getvalue() == printed
