"""The README tells the truth: its support matrix is the one the backends compute, and its commands exist."""

from __future__ import annotations

import re
from pathlib import Path

from mxcore.support import render_markdown

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_support_matrix_matches_backends():
    table = render_markdown()
    assert table in README, "README's support matrix is stale; paste mxcore.support.render_markdown() into it:\n" + table


CI = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()


def _command(section: str) -> str:
    blocks = re.findall(rf"## {section}.*?```bash\n(.*?)\n```", README, re.S)
    assert blocks, f"README has no '## {section}' section with a bash block"
    return blocks[0].strip()


def test_ci_runs_the_readme_test_command_last():
    command = _command("Tests")
    lines = [line.strip() for line in CI.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert lines[-1] == command, f"CI's last command must be exactly the README's test command: {command!r}"


def test_ci_runs_the_quick_start_in_a_fresh_venv():
    """The quick start, verbatim, inside a venv made by CI (no site packages), then `info` there."""
    command = _command("Quick start")
    lines = [line.strip() for line in CI.splitlines()]
    assert command in lines, f"CI must run exactly the README's quick start: {command!r}"
    venv = next(i for i, line in enumerate(lines) if line.startswith("python -m venv "))
    activate = [i for i, line in enumerate(lines) if line.startswith(". ") and line.endswith("/bin/activate\"")]
    assert "--system-site-packages" not in lines[venv] and activate and venv < activate[0] < lines.index(command)
    assert lines[lines.index(command) + 1] == ")", "the quick start must be its subshell's last command (set -e)"
    assert "python -m mxcore info" in lines[lines.index(command):]


def test_no_placeholders_left():
    for marker in ("SUPPORT_TABLE", "BENCH_TABLE", "MEASURED\n", "TODO", "TBD"):
        assert marker not in README, marker
