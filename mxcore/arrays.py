"""Which array library an input comes from, whether it lives on a GPU, and moving results back to it.

mxcore never imports CuPy or torch here: it looks at the object's type module.

``device_kind(x)``: ``"cupy"`` (a CuPy array), ``"torch"`` (a torch tensor on a CUDA/ROCm device),
``"dlpack"`` (another object whose ``__dlpack_device__`` is a CUDA, CUDA-managed or ROCm device), or
``None`` for host data (numpy, lists, torch CPU tensors, scalars).  The device codecs
(``mxcore.backends.codec``) return results as the same kind of array as their input (a DLPack
producer gets CuPy arrays back).
"""

from __future__ import annotations

import numpy as np

from .errors import InputTypeError

__all__ = ["DLPACK_GPU_TYPES", "array_kind", "check_unmasked", "device_kind", "to_numpy", "like_input"]

# DLPack device types: 2 kDLCUDA, 13 kDLCUDAManaged, 10 kDLROCM
DLPACK_GPU_TYPES = frozenset({2, 10, 13})


_KIND_OF: dict = {}  # type -> array_kind (the answer depends on the type alone)


def array_kind(x) -> str:
    """'numpy', 'cupy', 'torch', 'mx' (MXTensor/ScaledTensor) or 'other' (lists, scalars...)."""
    t = type(x)
    kind = _KIND_OF.get(t)
    if kind is None:
        mod = t.__module__ or ""
        kind = ("numpy" if issubclass(t, np.ndarray) else "cupy" if mod.startswith("cupy") else
                "torch" if mod.startswith("torch") else "mx" if mod.startswith("mxcore") else "other")
        if len(_KIND_OF) < 1024:
            _KIND_OF[t] = kind
    return kind


def device_kind(x) -> str | None:
    mod = type(x).__module__ or ""
    if mod.startswith("cupy"):
        return "cupy" if hasattr(x, "data") and hasattr(x, "device") else None
    if mod.startswith("torch"):
        dev = getattr(x, "device", None)
        return "torch" if getattr(dev, "type", "cpu") == "cuda" else None
    probe = getattr(x, "__dlpack_device__", None)
    if probe is None or mod.startswith("numpy"):
        return None
    try:
        dev_type = int(probe()[0])
    except (TypeError, ValueError, IndexError):
        return None
    return "dlpack" if dev_type in DLPACK_GPU_TYPES else None


def check_unmasked(x, what: str) -> None:
    """Refuse a numpy masked array: every conversion mxcore makes (``numpy.asarray``) drops the mask, so its
    masked entries would be used as values."""
    if isinstance(x, np.ma.MaskedArray):
        raise InputTypeError(f"{what} is a numpy masked array, whose mask mxcore would ignore; pass plain data: "
                             "x.filled(0.0) (or the fill value you mean) or x.data")


def to_numpy(x) -> np.ndarray:
    """A host numpy view/copy of ``x`` (numpy, CuPy, torch CPU/CUDA, array-like)."""
    kind = array_kind(x)
    if kind == "cupy":
        return x.get()
    if kind == "torch":
        import ml_dtypes
        import torch

        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        name = str(t.dtype).replace("torch.", "")
        if name == "bfloat16":  # numpy has no bfloat16: go through the raw bits
            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        if name.startswith("float8"):
            return t.view(torch.uint8).numpy().view(getattr(ml_dtypes, name))
        return t.numpy()
    return np.asarray(x)


def like_input(result: np.ndarray, *inputs):
    """Return host ``result`` as the same kind of array as the first CuPy/torch input (else numpy)."""
    for x in inputs:
        kind = array_kind(x)
        if kind == "cupy":
            import cupy

            return cupy.asarray(result)
        if kind == "torch":
            import torch

            if result.dtype.name == "bfloat16":
                out = torch.from_numpy(result.view(np.int16).copy()).view(torch.bfloat16)
            else:
                out = torch.from_numpy(np.ascontiguousarray(result))
            return out.to(x.device)
    return result
