"""The README tells the truth: its support matrix is the one the backends compute, and its commands exist."""

from __future__ import annotations

import re
from pathlib import Path

from mxcore.support import render_markdown

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_support_matrix_matches_backends():
    table = render_markdown()
    assert table in README, "README's support matrix is stale; paste mxcore.support.render_markdown() into it:\n" + table


def test_ci_runs_the_readme_test_command():
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    blocks = re.findall(r"## Tests.*?```bash\n(.*?)\n```", README, re.S)
    assert blocks, "README has no '## Tests' section with a bash block"
    command = blocks[0].strip()
    assert command in ci.splitlines(), f"CI must run exactly the README's test command: {command!r}"


def test_no_placeholders_left():
    for marker in ("SUPPORT_TABLE", "BENCH_TABLE", "MEASURED\n", "TODO", "TBD"):
        assert marker not in README, marker
