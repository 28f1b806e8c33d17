"""Which inputs live on a GPU, decided without importing CuPy or torch.

``device_kind(x)``: ``"cupy"`` (a CuPy array), ``"torch"`` (a torch tensor on a CUDA/ROCm device),
``"dlpack"`` (another object whose ``__dlpack_device__`` is a CUDA, CUDA-managed or ROCm device), or
``None`` for host data (numpy, lists, torch CPU tensors, scalars).  The device codecs
(``mxcore.backends.codec``) return results as the same kind of array as their input (a DLPack
producer gets CuPy arrays back).
"""

from __future__ import annotations

__all__ = ["DLPACK_GPU_TYPES", "device_kind"]

# DLPack device types: 2 kDLCUDA, 13 kDLCUDAManaged, 10 kDLROCM
DLPACK_GPU_TYPES = frozenset({2, 10, 13})


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
