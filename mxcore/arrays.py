"""Which array library an input comes from, and moving results back to it.

mxcore never imports CuPy or torch here: it looks at the object's type module.
"""

from __future__ import annotations

import numpy as np

__all__ = ["array_kind", "to_numpy", "like_input"]


def array_kind(x) -> str:
    """'numpy', 'cupy', 'torch', 'mx' (MXTensor/ScaledTensor) or 'other' (lists, scalars...)."""
    mod = type(x).__module__ or ""
    if isinstance(x, np.ndarray):
        return "numpy"
    if mod.startswith("cupy"):
        return "cupy"
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("mxcore"):
        return "mx"
    return "other"


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
