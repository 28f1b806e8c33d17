"""The CUDA backend's tuning tables (``tuning/*.json``, package data): every number a kernel choice reads, each
entry with the benchmark figures that decided it.  ``table("wonly")`` (wonly.choose), ``table("dense")``
(families.py, sm90.py, variants.py).  Change a value in its JSON file together with the figures that justify it."""

from __future__ import annotations

import functools
import json
from pathlib import Path

__all__ = ["table"]


@functools.lru_cache(maxsize=None)
def table(name: str) -> dict:
    """The tuning table ``tuning/<name>.json`` (read once per process; treat it as read-only)."""
    with open(Path(__file__).with_name("tuning") / f"{name}.json") as f:
        return json.load(f)
