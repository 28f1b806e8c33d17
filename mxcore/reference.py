"""The numpy reference: what an ideal matrix core computes.

Decoded inputs (exact), exact products, block scales applied per 32-element K block, the sum in
float64, and one rounding to ``out_dtype``.  It is the default backend on a machine without a GPU
and the oracle every GPU test compares against.

Exactness: every product of two supported inputs is exact in float64 (at most 24+24 significant
bits).  The float64 sum is exact whenever the partial sums fit 53 bits, which holds for the
"exactly representable" test inputs (small integers times powers of two); otherwise it differs
from the exact sum by at most K·2^-53 relative, far below any fp32 output rounding.

Non-finite values follow IEEE arithmetic for every float dtype (tf32 included): inputs are rounded once to the
dtype with overflow to ±inf, ±inf and NaN pass through, and ``inf * 0`` is NaN.  fp8 and MX inputs follow
:mod:`mxcore.operands` (inf becomes NaN in formats without inf; a non-finite MX block gets the NaN scale).
"""

from __future__ import annotations

import numpy as np

from . import dtypes as _dt
from .operands import Operand, infer_dtype, prepare

__all__ = ["reference_matmul", "reference_from_operands", "round_output"]


def round_output(x64: np.ndarray, out_dtype: str) -> np.ndarray:
    """Round float64 results once to ``out_dtype`` (RNE)."""
    out = _dt.canonical_out_dtype(out_dtype, allow_float64=True)
    if out == "float64":
        return x64
    if out == "float32":
        return x64.astype(np.float32)
    if out == "float16":
        return x64.astype(np.float16)  # numpy converts double -> half with a single RNE rounding
    import ml_dtypes

    from . import formats

    return formats.round_to(x64, "bf16", overflow="nan", nan="propagate").astype(ml_dtypes.bfloat16)


def reference_from_operands(opa: Operand, opb: Operand, out_dtype: str = "float32") -> np.ndarray:
    a64, b64 = opa.to_float64(), opb.to_float64()
    with np.errstate(invalid="ignore", over="ignore"):
        return round_output(a64 @ b64, out_dtype)


def reference_matmul(a, b, dtype=None, *, out_dtype: str = "float32", scale_rounding: str = "floor",
                     arch: str | None = None) -> np.ndarray:
    """``a @ b`` as an ideal matrix core computes it for ``dtype`` (see module docstring)."""
    mdt = _dt.resolve(infer_dtype(a, b) if dtype is None else dtype, arch)
    opa, opb = prepare(a, b, mdt, scale_rounding=scale_rounding)
    return reference_from_operands(opa, opb, out_dtype)
