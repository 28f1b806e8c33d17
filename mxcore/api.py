"""``mxcore.matmul``: one call, any backend."""

from __future__ import annotations

import numpy as np

from . import dtypes as _dt
from .arrays import array_kind
from .errors import InputTypeError, ShapeError, UnsupportedError
from .operands import check_real_input, infer_dtype

__all__ = ["matmul"]


def _shape(x) -> tuple:
    shape = getattr(x, "shape", None)
    if shape is None:
        raise InputTypeError(
            f"matmul takes numpy/CuPy arrays, torch tensors, MXTensor or ScaledTensor; got {type(x).__name__}. "
            "Wrap lists with numpy.asarray"
        )
    return tuple(int(s) for s in shape)


def _stack(results, like):
    kind = array_kind(results[0]) if results else "numpy"
    if kind == "cupy":
        import cupy

        return cupy.stack(results)
    if kind == "torch":
        import torch

        return torch.stack(results)
    return np.stack(results)


def matmul(a, b, dtype=None, *, out_dtype="float32", backend="auto", scale_rounding="floor", **options):
    """Compute ``a @ b`` on a matrix core (or the numpy reference).

    a: (M, K) and b: (K, N) — or batched (B, M, K) and (B, K, N).  numpy, CuPy, torch (CPU or CUDA),
    :class:`~mxcore.mx.MXTensor` or :class:`~mxcore.mx.ScaledTensor`.  Non-contiguous and transposed
    views are accepted.
    dtype: a name from :func:`mxcore.dtypes.known_names` (``"fp16"``, ``"fp8"``, ``"mxfp4"``...), an
    (A, B) pair such as ``("mxfp8", "mxfp4")``, or None for the inputs' own dtype.  High-precision
    inputs are quantized by mxcore (MX: OCP v1.0 blocks of 32 along K; fp8: a per-tensor power-of-two
    scale); quantized inputs are used as they are.  ``fp8`` means e4m3fnuz on gfx942, e4m3fn elsewhere.
    out_dtype: ``"float32"`` (default), ``"float16"`` or ``"bfloat16"``.
    backend: ``"auto"`` (``MXCORE_BACKEND``, else the first usable GPU backend, else ``"reference"``),
    ``"cuda"``, ``"hip"`` or ``"reference"``.
    scale_rounding: MX scale policy, ``"floor"`` (OCP v1.0 §6.3) or ``"rceil"`` (cuBLAS/cuDNN).
    options: backend-specific keywords, passed through (e.g. ``fp8_convert=True`` for ``hip``: convert fp8
    bytes of the other encoding instead of refusing them).  A keyword the backend does not take is an error.

    Returns the same kind of array as the inputs (numpy in → numpy out; CuPy → CuPy; torch → torch).
    """
    from .backends import select

    for x, role in ((a, "a"), (b, "b")):
        check_real_input(x, role)
    sa, sb = _shape(a), _shape(b)
    if len(sa) != len(sb) or len(sa) not in (2, 3):
        raise ShapeError(
            f"matmul takes 2-D operands (M, K) @ (K, N), or 3-D batches (B, M, K) @ (B, K, N); got shapes {sa} and {sb}"
        )
    if sa[-1] != sb[-2]:
        raise ShapeError(f"inner dimensions differ: a is {sa} (K={sa[-1]}) but b is {sb} (K={sb[-2]}); "
                         "a's last dimension must equal b's second-to-last")
    if len(sa) == 3 and sa[0] != sb[0]:
        raise ShapeError(f"batch sizes differ: a has {sa[0]}, b has {sb[0]}")
    be = select(backend)
    _check_options(be, options)
    arch = be.target().arch
    mdt = _dt.resolve(infer_dtype(a, b) if dtype is None else dtype, arch)
    out = _dt.canonical_out_dtype(out_dtype, allow_float64=be.name == "reference")
    reason = be.supports(mdt)
    if reason is not None:
        raise UnsupportedError(
            f"backend {be.name!r} cannot run dtype {mdt} here: {reason}. "
            f"It can run: {', '.join(be.supported_dtypes())}; or pass backend='reference'"
        )
    if len(sa) == 3:
        if array_kind(a) == "mx" or array_kind(b) == "mx":
            raise ShapeError("batched matmul takes plain arrays; quantize each batch element separately")
        return _stack([matmul(a[i], b[i], mdt_pair(mdt), out_dtype=out, backend=be.name,
                              scale_rounding=scale_rounding, **options) for i in range(sa[0])], a)
    if 0 in (sa[0], sa[1], sb[1]):
        return _empty_like_kind((sa[0], sb[1]), out, a, b, sa[1])
    return be.matmul(a, b, mdt, out_dtype=out, scale_rounding=scale_rounding, **options)


def _check_options(be, options) -> None:
    if not options:
        return
    import inspect

    params = inspect.signature(be.matmul).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    fixed = {"a", "b", "mdt", "out_dtype", "scale_rounding"}
    accepted = sorted(name for name, p in params.items() if p.kind is p.KEYWORD_ONLY and name not in fixed)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise UnsupportedError(
            f"backend {be.name!r} takes no option(s) {', '.join(unknown)}; "
            f"its options are: {', '.join(accepted) or 'none'}"
        )


def mdt_pair(mdt: _dt.MatmulDType):
    return (mdt.a.name, mdt.b.name)


def _empty_like_kind(shape, out, a, b, k):
    """M or N is zero: an empty result; K is zero: a zero result (the empty sum)."""
    from .arrays import like_input
    from .reference import round_output

    return like_input(round_output(np.zeros(shape, np.float64), out), a, b)
