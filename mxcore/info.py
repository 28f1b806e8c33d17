"""``mxcore.info()``: backends, devices, archs and versions in one report."""

from __future__ import annotations

import platform
import sys


def _version(module: str) -> str:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return "not installed"


def info(file=None) -> str:
    """Return (and print unless ``file=False``) what mxcore can use on this machine."""
    from . import __version__
    from .backends import available

    lines = [f"mxcore {__version__} on Python {sys.version.split()[0]} ({platform.platform()})"]
    for pkg in ("numpy", "ml_dtypes", "cupy-cuda13x", "hip-python", "torch", "cuda-bindings", "nvidia-cuda-nvrtc"):
        lines.append(f"  {pkg:18s} {_version(pkg)}")
    lines.append("backends:")
    for status in available():
        lines.append(f"  {status}")
    text = "\n".join(lines)
    if file is not False:
        print(text, file=file)
    return text
