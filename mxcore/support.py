"""Which dtype runs where, and what has been measured on hardware: the README's support matrix.

The cells come from the backends themselves (``supported_dtypes(arch)``, computed without a GPU); the
"measured" marks come from :data:`MEASURED`, the record of hardware on which the GPU test suite has
passed.  ``tests/test_readme.py`` checks that the README's table is exactly :func:`render_markdown`.
"""

from __future__ import annotations

from . import dtypes as _dt

__all__ = ["MEASURED", "TARGETS", "matrix", "render_markdown"]

# (column title, backend, arch)
TARGETS = (
    ("NVIDIA sm_80 (A100)", "cuda", "sm_80"),
    ("NVIDIA sm_89 (L40, RTX 40)", "cuda", "sm_89"),
    ("NVIDIA sm_90 (H100/H200)", "cuda", "sm_90"),
    ("AMD gfx942 (MI300)", "hip", "gfx942"),
    ("AMD gfx950 (MI350)", "hip", "gfx950"),
)

# arch -> where and how the GPU tests (pytest -m nvidia_gpu / amd_gpu) passed.  Add a line only for a real run.
MEASURED = {
    "sm_90": "NVIDIA H200 (and H100 80GB HBM3 before), `python3 -m pytest -q -m nvidia_gpu`, 2026-11-23",
}

MARK = {"measured": "✅", "compiled": "🔧", "none": "➖"}


def matrix() -> dict:
    """{dtype: {"reference": "measured", arch: "measured"|"compiled"|"none", ...}} for every canonical dtype."""
    from .backends import get

    table = {name: {"reference": "measured"} for name in _dt.KINDS}
    for _, backend, arch in TARGETS:
        have = set(get(backend).supported_dtypes(arch))
        for name in table:
            table[name][arch] = ("measured" if arch in MEASURED else "compiled") if name in have else "none"
    return table


def render_markdown() -> str:
    """The support matrix as a Markdown table (header, separator, one row per dtype)."""
    head = "| dtype | reference (CPU) | " + " | ".join(t[0] for t in TARGETS) + " |"
    rows = [head, "|" + "---|" * (2 + len(TARGETS))]
    for name, cells in matrix().items():
        rows.append(f"| `{name}` | {MARK[cells['reference']]} | "
                    + " | ".join(MARK[cells[arch]] for _, _, arch in TARGETS) + " |")
    return "\n".join(rows)
