"""Timing a callable between a backend's device events (``Backend.timer()``): the benchmarks' one clock; and how a
benchmark writes its rows (:func:`write_rows`)."""

from __future__ import annotations

import json

import numpy as np

__all__ = ["time_back_to_back", "time_callable", "write_rows"]


def write_rows(rows: list, path: str | None) -> None:
    """Write a benchmark's rows as JSON to ``path`` (nothing when None) and say so."""
    if not path:
        return
    with open(path, "w") as fh:
        json.dump(rows, fh, indent=1)
    print(f"{len(rows)} rows written to {path}")


def time_callable(measure, fn, repeats: int, warmup: int = 3) -> float:
    """Median seconds of ``fn()`` over ``repeats`` timed calls after ``warmup`` untimed ones.  ``measure(fn)``
    (a backend's ``timer()``) runs ``fn`` between two device events and returns the elapsed seconds."""
    for _ in range(warmup):
        measure(fn)
    return float(np.median([measure(fn) for _ in range(max(1, repeats))]))


def time_back_to_back(measure, fn, repeats: int, calls: int = 20, warmup: int = 2) -> float:
    """Median seconds per call of ``calls`` back-to-back ``fn()`` between two device events (``repeats`` times):
    the device time of kernels shorter than their host launch cost (a single call between events would time the
    host), as long as one launch's host work is shorter than its kernel."""
    for _ in range(warmup):
        measure(fn)
    return float(np.median([measure(lambda: [fn() for _ in range(calls)]) / calls for _ in range(max(1, repeats))]))
