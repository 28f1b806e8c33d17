"""mxcore: matrix-core GEMM on NVIDIA (mma.sync) and AMD (MFMA) GPUs, exact low-precision formats,
and a tested database of per-instruction register layouts.

Importing mxcore imports numpy and ml_dtypes only; GPU libraries load when a backend is used.

Layout: an installed mxcore (wheel) holds ``mxcore/backends``, ``mxcore/kernels_cuda`` and
``mxcore/kernels_hip``; a source checkout keeps them beside ``mxcore/`` at the repository root
(pyproject's ``package-dir`` maps them).  Imported from a checkout — Python started at the root, an
editable install, or ``PYTHONPATH`` pointing there — this package adds the root to its ``__path__``, so
``mxcore.backends`` is ``<root>/backends`` and a checkout behaves as an install does.
"""

# No ``from __future__ import annotations`` here: it would bind ``annotations`` in the package namespace.

#: the version of this source tree; ``mxcore --version`` prefers the installed distribution's metadata
__version__ = "0.1.0"

# The sub-packages that live beside mxcore/ in a checkout (pyproject.toml [tool.setuptools.package-dir]).
_CHECKOUT_SIBLINGS = ("backends", "kernels_cuda", "kernels_hip")


def _checkout_root():
    """The repository root when this package runs from a source checkout, else None."""
    from pathlib import Path

    here = Path(__file__).resolve().parent
    root = here.parent
    if (here / "backends").exists() or not (root / "pyproject.toml").is_file():
        return None  # an installed package carries its sub-packages inside
    if all((root / name).is_dir() for name in _CHECKOUT_SIBLINGS) and (root / "backends" / "__init__.py").is_file():
        return root
    return None


_ROOT = _checkout_root()
if _ROOT is not None and str(_ROOT) not in __path__:
    __path__.append(str(_ROOT))

from . import dtypes, errors
from .api import cache_info, clear_cache, matmul, set_cache_limit
from .errors import MXCoreError
from .kernels import kernel_source

__all__ = [
    "__version__",
    "MXCoreError",
    "cache_info",
    "clear_cache",
    "MXTensor",
    "ScaledTensor",
    "dequantize",
    "distributed",
    "dtypes",
    "emulate",
    "errors",
    "formats",
    "kernel_source",
    "layouts",
    "matmul",
    "quantize_mx",
    "quantize_tensor",
    "reference_matmul",
    "set_cache_limit",
    "to_device",
    "to_host",
]

_LAZY = {
    "MXTensor": ("mx", "MXTensor"),
    "ScaledTensor": ("mx", "ScaledTensor"),
    "quantize_mx": ("mx", "quantize_mx"),
    "quantize_tensor": ("mx", "quantize_tensor"),
    "dequantize": ("mx", "dequantize"),
    "to_device": ("mx", "to_device"),
    "to_host": ("mx", "to_host"),
    "reference_matmul": ("reference", "reference_matmul"),
    "formats": ("formats", None),
    "distributed": ("distributed", None),
    "layouts": ("layouts", None),
    "emulate": ("emulate", None),
    # need torch (an optional extra): not in __all__, so that ``from mxcore import *`` works without it
    "nn": ("nn", None),
    "torch": ("torch", None),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module_name, attr = _LAZY[name]
        if module_name in ("nn", "torch"):  # mxcore.nn and mxcore.torch need torch, an optional extra
            try:
                importlib.import_module("torch")
            except ImportError as exc:
                raise ModuleNotFoundError(f"mxcore.{name} needs PyTorch: pip install 'mxcore[torch]' (torch>=2.4)",
                                          name="torch") from exc
        module = importlib.import_module(f"{__name__}.{module_name}")
        value = module if attr is None else getattr(module, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mxcore' has no attribute {name!r}")


def __dir__():
    # The public API only: importing a submodule binds it here (mxcore.api, mxcore.arrays, ...), and those
    # bindings stay reachable as attributes without being listed as the API.
    return sorted(__all__)
