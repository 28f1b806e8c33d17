"""The numpy reference backend: always usable; exact products, float64 sums, one rounding."""

from __future__ import annotations

import platform

import numpy as np

from .. import dtypes as _dt
from ..arrays import like_input, to_numpy
from ..reference import reference_from_operands
from ..operands import prepare
from . import Target

__all__ = ["ReferenceBackend"]


class ReferenceBackend:
    name = "reference"
    vendor = "cpu"
    unavailable_cause = None

    def is_available(self):
        return None

    def devices(self):
        return [f"CPU ({platform.machine()}, numpy {np.__version__})"]

    def target(self) -> Target:
        return Target("cpu", None, 1)

    def supported_dtypes(self, arch=None):
        return list(_dt.KINDS)

    def supports(self, mdt):
        return None

    def matmul(self, a, b, mdt, *, out_dtype="float32", scale_rounding="floor"):
        ha = a if type(a).__module__.startswith("mxcore") else to_numpy(a)
        hb = b if type(b).__module__.startswith("mxcore") else to_numpy(b)
        opa, opb = prepare(ha, hb, mdt, scale_rounding=scale_rounding)
        return like_input(reference_from_operands(opa, opb, out_dtype), a, b)

    def emit_kernels(self, arch, out_dir):
        return []
