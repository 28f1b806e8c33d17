"""mxcore: matrix-core GEMM on NVIDIA (mma.sync) and AMD (MFMA) GPUs, exact low-precision formats,
and a tested database of per-instruction register layouts.

Importing mxcore imports numpy and ml_dtypes only; GPU libraries load when a backend is used.
"""

from __future__ import annotations

__version__ = "0.1.0"

from . import dtypes, errors
from .api import matmul
from .errors import MXCoreError
from .kernels import kernel_source

__all__ = [
    "__version__",
    "MXCoreError",
    "MXTensor",
    "ScaledTensor",
    "dequantize",
    "dtypes",
    "emulate",
    "errors",
    "formats",
    "info",
    "kernel_source",
    "layouts",
    "matmul",
    "quantize_mx",
    "quantize_tensor",
    "reference_matmul",
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
    "info": ("info", "info"),
    "formats": ("formats", None),
    "layouts": ("layouts", None),
    "emulate": ("emulate", None),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module_name, attr = _LAZY[name]
        module = importlib.import_module(f"{__name__}.{module_name}")
        value = module if attr is None else getattr(module, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mxcore' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
