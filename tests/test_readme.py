"""The README tells the truth: its support matrix is the one the backends compute, and its commands exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mxcore.support import render_markdown

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_support_matrix_matches_backends():
    table = render_markdown()
    assert table in README, "README's support matrix is stale; paste mxcore.support.render_markdown() into it:\n" + table


CI = (ROOT / ".ci" / "run").read_text()


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


# ---- the documentation as a whole: README, docs/, CHANGELOG ----

DOCS = sorted((ROOT / "docs").glob("*.md"))
MARKDOWN = [p for p in (ROOT / "README.md", ROOT / "CHANGELOG.md", *DOCS) if p.is_file()]


def _render_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("render", ROOT / "benchmarks" / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_is_short():
    lines = README.count("\n") + (not README.endswith("\n"))
    assert lines <= 300, f"README.md has {lines} lines; keep it at most 300 (details go in docs/)"


def test_docs_exist():
    names = {p.name for p in DOCS}
    assert {"design.md", "benchmarks.md"} <= names, names
    assert (ROOT / "CHANGELOG.md").is_file()


def test_no_session_logs_in_the_docs():
    for path in [ROOT / "README.md", *DOCS]:
        text = path.read_text()
        hits = [i + 1 for i, line in enumerate(text.splitlines()) if re.search(r"session", line, re.I)]
        assert not hits, f"{path.relative_to(ROOT)} says 'session' on lines {hits}: state what is, not a work diary"


def test_old_notes_are_gone():
    for name in ("NOTES_CUDA.md", "NOTES_SM90.md"):
        assert not (ROOT / name).exists(), f"{name}: its lasting content lives in docs/"


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (duplicates numbered -1, -2, ...)."""
    seen: dict = {}
    out = set()
    body = re.sub(r"```.*?```", "", text, flags=re.S)
    for title in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", body, re.M):
        title = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", title)
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links(text: str) -> list[str]:
    body = re.sub(r"```.*?```", "", text, flags=re.S)
    body = re.sub(r"`[^`\n]*`", "", body)
    return re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", body)


def test_relative_links_resolve():
    bad = []
    for path in MARKDOWN:
        text = path.read_text()
        for link in _links(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", link):  # http:, https:, mailto:
                continue
            target, _, frag = link.partition("#")
            dest = (path.parent / target).resolve() if target else path
            where = f"{path.relative_to(ROOT)}: ({link})"
            if not dest.exists():
                bad.append(f"{where}: no such file")
            elif frag and dest.suffix == ".md" and frag not in _anchors(dest.read_text()):
                bad.append(f"{where}: no heading with anchor #{frag}")
            elif frag and dest.suffix != ".md":
                bad.append(f"{where}: an anchor into a file that is not Markdown")
    assert not bad, "dangling links:\n" + "\n".join(bad)


def test_link_checker_catches_dangling_links(tmp_path):
    """The checker above is real: a missing file and a missing anchor are found, a good link passes."""
    (tmp_path / "a.md").write_text("# Title here\n\n## Two: words\n")
    text = "[x](a.md#title-here) [y](a.md#two-words) [z](missing.md) [w](a.md#nope) `[q](in-code.md)`"
    assert _links(text) == ["a.md#title-here", "a.md#two-words", "missing.md", "a.md#nope"]
    assert _anchors((tmp_path / "a.md").read_text()) == {"title-here", "two-words"}


def test_benchmarks_page_is_rendered_from_the_data():
    render = _render_module()
    runs = render.load()
    assert runs and {r["gpu"] for r in runs} <= {"H100", "H200"}
    for run in runs:
        assert run["rows"] and run["command"].split()[0] in ("python", "python3", "torchrun"), run["file"]
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert page == render.render(runs), "docs/benchmarks.md is stale: run python benchmarks/render.py"


def test_readme_measured_table_is_rendered_from_the_data():
    table = _render_module().readme_table()
    assert table.count("\n") >= 4 and table in README, (
        "README's measured table is stale; paste benchmarks/render.py's readme_table() into it:\n" + table)


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)\n```", text, re.S)


@pytest.mark.parametrize("index", range(len(_python_blocks(README))))
def test_readme_snippets_run(index, monkeypatch):
    """Every Python snippet of the README runs as written (on the reference backend: no GPU here)."""
    code = _python_blocks(README)[index]
    if re.search(r"^import torch|^import .*\btorch\b", code, re.M):
        pytest.importorskip("torch")
    monkeypatch.setenv("MXCORE_BACKEND", "reference")
    exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": "__readme__"})
