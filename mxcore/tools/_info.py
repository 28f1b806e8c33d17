"""``mxcore.tools.info()``: backends, devices, archs and versions in one report (returned; ``python -m mxcore info``
prints it)."""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass

__all__ = ["Info", "info"]

PACKAGES = ("numpy", "ml_dtypes", "cupy-cuda13x", "hip-python", "torch", "cuda-bindings", "nvidia-cuda-nvrtc")


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "not installed"


@dataclass(frozen=True)
class Info:
    """What mxcore can use on this machine: ``str(report)`` (or the REPL's echo) is the text report."""

    version: str
    python: str
    platform: str
    packages: dict  # distribution name -> version or "not installed"
    backends: tuple  # mxcore.backends.BackendStatus, in selection order

    def __str__(self) -> str:
        lines = [f"mxcore {self.version} on Python {self.python} ({self.platform})"]
        lines += [f"  {pkg:18s} {ver}" for pkg, ver in self.packages.items()]
        lines.append("backends:")
        lines += [f"  {status}" for status in self.backends]
        return "\n".join(lines)

    __repr__ = __str__


def info() -> Info:
    """The report on versions and backends (print it, or read its fields)."""
    from .. import __version__
    from ..backends import available

    return Info(__version__, sys.version.split()[0], platform.platform(), {p: _version(p) for p in PACKAGES},
                tuple(available()))
