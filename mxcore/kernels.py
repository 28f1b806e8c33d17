"""Find the device sources shipped with mxcore (kernels_cuda/, kernels_hip/).

In a wheel they are package data under ``mxcore/kernels_cuda`` and ``mxcore/kernels_hip``; in a
source checkout (editable install, or ``PYTHONPATH`` at the repository root) they sit at the
repository's top level.  Everything that reads kernel source goes through :func:`kernel_source`.
"""

from __future__ import annotations

import re
from pathlib import Path

from .errors import UnknownNameError

__all__ = ["kernel_dir", "kernel_source", "kernel_files"]

_DIRS = {"nvidia": "kernels_cuda", "cuda": "kernels_cuda", "amd": "kernels_hip", "hip": "kernels_hip"}


def kernel_dir(vendor: str) -> Path:
    """The folder holding ``vendor``'s kernel sources ("nvidia"/"cuda" or "amd"/"hip")."""
    try:
        sub = _DIRS[vendor.lower()]
    except KeyError:
        raise UnknownNameError(f"unknown kernel vendor {vendor!r}; use 'nvidia' or 'amd'") from None
    here = Path(__file__).resolve().parent
    for cand in (here / sub, here.parent / sub):
        if cand.is_dir():
            return cand
    try:  # an editable install maps mxcore.kernels_cuda elsewhere
        import importlib.util

        spec = importlib.util.find_spec(f"mxcore.{sub}")
        if spec is not None and spec.submodule_search_locations:
            for loc in spec.submodule_search_locations:
                if Path(loc).is_dir():
                    return Path(loc)
    except (ImportError, ValueError):
        pass
    raise FileNotFoundError(f"mxcore's {sub}/ folder was not found next to {here}; reinstall mxcore")


def kernel_files(vendor: str) -> list[str]:
    d = kernel_dir(vendor)
    return sorted(p.name for p in d.iterdir() if p.suffix in {".cu", ".cuh", ".hip", ".h"})


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*$', re.M)


def kernel_source(vendor: str, filename: str, _seen: set | None = None) -> str:
    """The text of ``filename`` from ``vendor``'s kernel folder, with each ``#include "X"`` of a file of the same
    folder replaced by X's text (once per file; a repeated include becomes a comment).  The compilers then need
    no include path, and a runtime kernel cache keyed on the source text sees header changes."""
    path = kernel_dir(vendor) / filename
    if not path.is_file():
        raise UnknownNameError(f"no kernel source {filename!r} for {vendor}; have: {', '.join(kernel_files(vendor))}")
    seen = {filename} if _seen is None else _seen

    def inline(m):
        name = m.group(1)
        if name in seen:
            return f"// (#include \"{name}\": inlined above)"
        seen.add(name)
        return f"// ---- {name} ----\n{kernel_source(vendor, name, seen)}// ---- end {name} ----"

    return _INCLUDE.sub(inline, path.read_text())
