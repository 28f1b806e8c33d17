"""The numpy reference backend: always usable; exact products, float64 sums, one rounding (mxcore.reference)."""

from __future__ import annotations

import platform

import numpy as np

from .. import dtypes as _dt
from ..arrays import like_input, to_numpy
from ..errors import ShapeError, UnsupportedError
from ..operands import prepare
from ..reference import reference_from_operands
from ._contract import Backend, Plan, Target

__all__ = ["ReferenceBackend", "ReferencePlan"]


def _host(x):
    """numpy view of an array of any kind; quantized operands (MXTensor / ScaledTensor) as they are."""
    return x if type(x).__module__.startswith("mxcore") else to_numpy(x)


class ReferencePlan(Plan):
    """One ``a @ b`` on the host: ``gemm()`` computes it, ``result()`` returns it as the inputs' kind of array."""

    variant = "numpy: exact products, float64 sum, one rounding"

    def __init__(self, a, b, mdt, out_dtype: str, scale_rounding: str, out=None):
        self._args = (a, b, mdt, out_dtype, scale_rounding, out)
        self._result = None

    def gemm(self) -> None:
        a, b, mdt, out_dtype, scale_rounding, out = self._args
        opa, opb = prepare(_host(a), _host(b), mdt, scale_rounding=scale_rounding)
        res = reference_from_operands(opa, opb, out_dtype)
        if out is not None:
            if not isinstance(out, np.ndarray) or out.shape != res.shape or out.dtype != res.dtype:
                raise ShapeError(f"out must be a numpy array of shape {res.shape} and dtype {res.dtype}, got "
                                 f"{type(out).__name__} {getattr(out, 'shape', '')} {getattr(out, 'dtype', '')}")
            np.copyto(out, res)
            self._result = out
        else:
            self._result = like_input(res, a, b)

    def result(self):
        if self._result is None:
            self.gemm()
        return self._result

    def clone(self) -> "ReferencePlan":
        return ReferencePlan(*self._args)


class ReferenceBackend(Backend):
    name = "reference"
    vendor = "cpu"

    def is_available(self):
        return None

    def devices(self):
        return [f"CPU ({platform.machine()}, numpy {np.__version__})"]

    def target(self) -> Target:
        return Target("cpu", None, 1)

    def supported_dtypes(self, arch=None):
        return list(_dt.DTYPES)

    def supports(self, mdt):
        return None

    def plan(self, a, b, mdt, *, out_dtype="float32", scale_rounding="floor", out=None, tile=None, **options):
        if tile is not None or options:
            extra = ["tile"] * (tile is not None) + sorted(options)
            raise UnsupportedError(f"the reference backend takes no option(s) {', '.join(extra)}")
        for x, role in ((a, "a"), (b, "b")):
            # The oracle takes what the GPU kernels take (OCP MX blocks of 32 along K), so that a product it
            # accepts is one every backend computes; other block lengths are a codec feature only.
            block = getattr(x, "block", _dt.MX_BLOCK) if type(x).__name__ == "MXTensor" else _dt.MX_BLOCK
            if block != _dt.MX_BLOCK:
                raise UnsupportedError(f"operand {role} is an MXTensor with blocks of {block}; matmul reads OCP MX "
                                       f"blocks of {_dt.MX_BLOCK} along K: quantize with block={_dt.MX_BLOCK}")
        return ReferencePlan(a, b, mdt, out_dtype, scale_rounding, out)
