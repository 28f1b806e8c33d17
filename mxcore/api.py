"""``mxcore.matmul``: one call, any backend.

The API decides everything once, in this order: the backend (registry), the dtype for the backend's arch
(:func:`mxcore.dtypes.resolve`), whether the backend supports it, where the operands live (all on the host, or all
on one GPU: anything else is a :class:`~mxcore.errors.DeviceError`), where fp8/MX quantization runs (on the
operands' GPU when they live there and the backend quantizes on the device; else inside the backend's plan, on the
host), and whether a batch runs as one launch (backends with ``batched``) or one call per batch element.
"""

from __future__ import annotations

import os

import numpy as np

from . import dtypes as _dt
from .arrays import array_kind
from .errors import DeviceError, InputTypeError, ShapeError, UnsupportedError
from .operands import check_real_input, infer_dtype, quantize_on_device

__all__ = ["cache_info", "clear_cache", "matmul", "placement", "set_cache_limit"]


def _shape(x) -> tuple:
    shape = getattr(x, "shape", None)
    if shape is None:
        raise InputTypeError(
            f"matmul takes numpy/CuPy arrays, torch tensors, MXTensor or ScaledTensor; got {type(x).__name__}. "
            "Wrap lists with numpy.asarray"
        )
    return tuple(map(int, shape))


def placement(x) -> tuple[str, int | None]:
    """Where an operand's data lives: ``("host", None)`` or ``("gpu", ordinal)`` (CuPy arrays, torch CUDA/ROCm
    tensors, and MXTensor/ScaledTensor whose codes are such arrays)."""
    kind = array_kind(x)
    if kind == "mx":
        return placement(x.codes)
    if kind == "cupy":
        return ("gpu", int(x.device.id))
    if kind == "torch" and x.device.type != "cpu":
        return ("gpu", int(x.device.index or 0))
    return ("host", None)


def _describe(where) -> str:
    return "the host" if where[0] == "host" else f"GPU {where[1]}"


def _common_placement(a, b):
    pa, pb = placement(a), placement(b)
    if pa == pb:
        return pa
    if "host" in (pa[0], pb[0]):
        dev, host_role = (pa, "b") if pa[0] == "gpu" else (pb, "a")
        raise DeviceError(
            f"operand {'a' if host_role == 'b' else 'b'} is on {_describe(dev)} but operand {host_role} is on the "
            f"host; mxcore does not copy operands between host and device behind your back. Move {host_role} to "
            f"GPU {dev[1]} (cupy.asarray(x) under cupy.cuda.Device({dev[1]}), "
            f"torch.as_tensor(x, device='cuda:{dev[1]}'), "
            "or MXTensor.to_device()), or pass both from the host"
        )
    raise DeviceError(f"operand a is on {_describe(pa)} but operand b is on {_describe(pb)}; put both operands on "
                      "the same GPU (the result is computed there)")


def _dt_name(x) -> str:
    dt = getattr(x, "dtype", None)
    return getattr(dt, "name", str(dt)).replace("torch.", "")


def matmul(a, b, dtype=None, *, out_dtype="float32", backend="auto", scale_rounding="floor", **options):
    """Compute ``a @ b`` on a matrix core (or the numpy reference).

    a: (M, K) and b: (K, N) — or batched: (B, M, K) with (B, K, N), or (B, M, K) with a shared (K, N) (the
    linear-layer case).  numpy, CuPy, torch (CPU or CUDA), :class:`~mxcore.mx.MXTensor` or
    :class:`~mxcore.mx.ScaledTensor`.  Non-contiguous and transposed views are accepted.  Both operands must live
    in the same place: both on the host, or both on the same GPU (else :class:`~mxcore.errors.DeviceError`;
    nothing is copied between host and device implicitly).
    dtype: a name from :func:`mxcore.dtypes.known_names` (``"fp16"``, ``"fp8"``, ``"mxfp4"``...), an
    (A, B) pair such as ``("mxfp8", "mxfp4")``, a dtype object (``numpy.float16``, ``ml_dtypes.bfloat16``,
    ``torch.float16``), or None for the inputs' own dtype.  High-precision inputs are quantized by mxcore
    (MX: OCP v1.0 blocks of 32 along K; fp8: a per-tensor power-of-two scale, per batch element for batches)
    — on the GPU for GPU inputs, on the host for host inputs; quantized inputs are used as they are (quantize
    weights once, multiply many times).  ``fp8`` means e4m3fnuz on CDNA3 (gfx940–gfx942), e4m3fn elsewhere.
    out_dtype: ``"float32"`` (default), ``"float16"`` or ``"bfloat16"``.
    backend: ``"auto"`` (``MXCORE_BACKEND``, else the first usable GPU backend, else ``"reference"``),
    ``"cuda"``, ``"hip"`` or ``"reference"``.
    scale_rounding: MX scale policy, ``"floor"`` (OCP v1.0 §6.3) or ``"rceil"`` (cuBLAS/cuDNN).
    options: backend-specific keywords, passed through (e.g. ``fp8_convert=True`` for ``hip``: convert fp8
    bytes of the other encoding instead of refusing them).  A keyword the backend does not take is an error.

    Returns the same kind of array as the inputs (numpy in → numpy out; CuPy → CuPy; torch → torch), on the
    inputs' device.

    Device operands run on the caller's current stream (torch's for torch tensors, CuPy's otherwise), from any
    host thread, and can be captured into CUDA graphs once their layout has run eagerly on any stream (see
    docs/design.md, Caches); the per-call setup is cached per layout (:func:`cache_info`, :func:`clear_cache`).
    """
    if not options:  # a layout that ran before: the checks it passed are in the key (see _hot)
        hot = _hot(a, b, dtype, out_dtype, backend, scale_rounding)
        if hot is not None:
            return hot
    if _needs_grad(a, b):  # torch inputs that require grad: the differentiable op (never a silent grad drop)
        differentiable = _differentiable_matmul()
        if len(_shape(b)) != 2:
            raise UnsupportedError("matmul differentiates a @ b with b of shape (K, N) (or a quantized weight); "
                                   "for batched b, detach the inputs or loop over the batch")
        return differentiable(a, b, dtype, out_dtype=out_dtype, scale_rounding=scale_rounding, backend=backend)
    for x, role in ((a, "a"), (b, "b")):
        check_real_input(x, role)
    sa, sb = _shape(a), _shape(b)
    if len(sa) not in (2, 3) or len(sb) not in (2, 3) or (len(sa) == 2 and len(sb) == 3):
        raise ShapeError(
            "matmul takes 2-D operands (M, K) @ (K, N), 3-D batches (B, M, K) @ (B, K, N), or (B, M, K) @ (K, N) "
            f"(a weight shared by the batch); got shapes {sa} and {sb}"
        )
    if sa[-1] != sb[-2]:
        raise ShapeError(f"inner dimensions differ: a is {sa} (K={sa[-1]}) but b is {sb} (K={sb[-2]}); "
                         "a's last dimension must equal b's second-to-last")
    if len(sb) == 3 and sa[0] != sb[0]:
        raise ShapeError(f"batch sizes differ: a has {sa[0]}, b has {sb[0]}")
    if scale_rounding not in ("floor", "rceil"):
        raise UnsupportedError(f"scale_rounding={scale_rounding!r}; use 'floor' (OCP v1.0) or 'rceil' (cuBLAS)")
    if backend is not None and not isinstance(backend, str):
        raise InputTypeError(f"backend={backend!r} ({type(backend).__name__}); pass a backend name: 'auto', 'cuda', "
                             "'hip' or 'reference'")
    if out_dtype is None:  # numpy reads None as float64; the default is float32
        raise InputTypeError("out_dtype=None; pass 'float32' (default), 'float16' or 'bfloat16'")
    be, mdt, out = _resolved(backend, infer_dtype(a, b) if dtype is None else dtype, out_dtype)
    if options:
        _check_options(be, options)
    where = _common_placement(a, b) if be.vendor != "cpu" else ("host", None)
    batched = len(sa) == 3
    if batched and sa[0] == 0:
        return _empty_like_kind((0, sa[1], sb[-1]), out, a, b)
    if 0 in (sa[-2], sb[-1]) or sa[-1] == 0:
        return _empty_like_kind(sa[:-1] + (sb[-1],), out, a, b)
    if where[0] == "gpu" and len(sb) == 2 and not options:  # cached per-call setup (the contract)
        if hasattr(be, "fast_matmul"):
            _remember(backend, dtype, out_dtype, scale_rounding, a, b, be, mdt, out)
        fast = _fast(be, a, b, mdt, out, scale_rounding)
        if fast is not None:
            return fast
    # a batch runs in one launch where the backend can (per-tensor fp8 keeps one scale per batch element: a loop)
    loop = batched and not (be.batched and mdt.kind != "fp8")
    if where[0] == "gpu" and be.device_quantization and mdt.kind in ("fp8", "mx", _dt.WONLY_KIND):
        if len(sb) == 2:  # one operand shared by the whole batch (or a plain 2-D product): quantized once
            b = quantize_on_device(b, mdt.b, "b", scale_rounding, b_order=be.b_code_order)
        if not loop:
            a = quantize_on_device(a, mdt.a, "a", scale_rounding, batched=batched)
            b = quantize_on_device(b, mdt.b, "b", scale_rounding, batched=len(sb) == 3, b_order=be.b_code_order)
    if loop:
        if "mx" in (array_kind(a), array_kind(b) if len(sb) == 3 else ""):
            raise ShapeError(f"backend {be.name!r} runs batches one element at a time and cannot slice a batched "
                             "MXTensor/ScaledTensor; pass float data (mxcore quantizes each element) or 2-D operands")
        pair = (mdt.a.name, mdt.b.name)
        results = [matmul(a[i], b[i] if len(sb) == 3 else b, pair, out_dtype=out, backend=be.name,
                          scale_rounding=scale_rounding, **options) for i in range(sa[0])]
        return _stack(results)
    return be.matmul(a, b, mdt, out_dtype=out, scale_rounding=scale_rounding, **options)


# ---- the per-call path ---------------------------------------------------------------------------------------
# (backend request, dtype request, out_dtype, scale_rounding, the operands' dtype signature) -> (backend object,
# resolved dtype, output dtype, MXCORE_BACKEND): filled by a call that passed every check on device operands
_HOT: dict = {}


def _needs_grad(a, b) -> bool:
    """A torch tensor input (or a quantized operand's torch codes) requires grad while grad mode is on."""
    if not (getattr(a, "requires_grad", False) or getattr(b, "requires_grad", False)):
        return False
    import torch

    return torch.is_grad_enabled()


def _differentiable_matmul():
    """``mxcore.torch.matmul``.  The torch integration is a layer above the core that imports the API; the core
    loads it by name on first need, as ``mxcore.__getattr__`` does, and never imports it."""
    import importlib

    return importlib.import_module(f"{__package__}.torch").matmul


def _signature(x):
    """What the checks and the dtype inference read of an operand besides its shape: its array type and dtype (an
    MXTensor / ScaledTensor: its type and format)."""
    t = type(x)
    attr = _SIGNATURE_ATTR.get(t)
    if attr is None:  # per type: a torch tensor's hasattr of a missing name costs more than the whole lookup
        attr = "fmt" if hasattr(x, "fmt") else "dtype"
        if len(_SIGNATURE_ATTR) < 1024:
            _SIGNATURE_ATTR[t] = attr
    return (t, getattr(x, attr, None))


_SIGNATURE_ATTR: dict = {}  # operand type -> the attribute _signature reads ("fmt" for quantized operands)


# MXCORE_BACKEND, read on every call (a change takes effect at the next call): os.environ's own mapping of encoded
# names, ~20x cheaper than os.environ.get (which encodes the name and decodes the value each time)
_ENV_DATA = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey("MXCORE_BACKEND") if hasattr(os.environ, "encodekey") else None


def _backend_env():
    """MXCORE_BACKEND's value as stored (encoded where the platform stores it so), None when unset."""
    if _ENV_DATA is None or _ENV_KEY is None:
        return os.environ.get("MXCORE_BACKEND")
    return _ENV_DATA.get(_ENV_KEY)


def _remember(backend, dtype, out_dtype, scale_rounding, a, b, be, mdt, out) -> None:
    try:
        key = (backend, dtype, out_dtype, scale_rounding, _signature(a), _signature(b))
        if len(_HOT) > 4096:
            _HOT.clear()
        _HOT[key] = (be, mdt, out, _backend_env())
    except TypeError:  # an unhashable request (a list pair): no per-call path
        pass


def _hot(a, b, dtype, out_dtype, backend, scale_rounding):
    """A call whose request and operand types passed the checks before: straight to the backend's per-call path
    (which keys its entries on shapes, strides, alignment, device and stream, and returns None for anything it has
    not seen: then the full path runs, checks first)."""
    try:
        hit = _HOT.get((backend, dtype, out_dtype, scale_rounding, _signature(a), _signature(b)))
    except TypeError:
        return None
    if hit is None:
        return None
    be, mdt, out, env = hit
    if env != _backend_env():
        return None
    return _fast(be, a, b, mdt, out, scale_rounding)


def _fast(be, a, b, mdt, out, scale_rounding):
    """The backend's per-call path for a 2-D product, or for (B, M, K) activations times a shared (K, N) operand
    whose batch folds into M (float and weight-only dtypes: one row per token either way, so the result is the
    same bit for bit; fp8 keeps one scale per batch element and MX one scale range per element: they do not fold)."""
    nd = len(a.shape)
    if nd == 2:
        return be.fast_matmul(a, b, mdt, out_dtype=out, scale_rounding=scale_rounding)
    if nd != 3 or len(b.shape) != 2 or mdt.kind not in ("float", _dt.WONLY_KIND):
        return None
    y = be.fast_matmul(a, b, mdt, out_dtype=out, scale_rounding=scale_rounding)  # the rows as they are, if kept
    if y is not None or not _rows_fold(a):
        return y
    bsz, m, k = a.shape
    y = be.fast_matmul(a.reshape(bsz * m, k), b, mdt, out_dtype=out, scale_rounding=scale_rounding)
    return None if y is None else y.reshape(bsz, m, y.shape[-1])


def _rows_fold(a) -> bool:
    """A C-contiguous 3-D torch tensor or CuPy array (its reshape to rows is a view)."""
    contiguous = getattr(a, "is_contiguous", None)
    if contiguous is not None:
        return contiguous()
    flags = getattr(a, "flags", None)
    return flags is not None and flags.c_contiguous and array_kind(a) == "cupy"


_CACHE_LIMIT = None  # set_cache_limit's bound, also for backends made later (None: their default)


def configured_cache_limit():
    """The bound :func:`set_cache_limit` set (None: not set)."""
    return _CACHE_LIMIT


def cache_info() -> dict:
    """The per-call caches of the backends in use: ``{backend name: {"entries", "bytes", "limit", "hits", "misses",
    "evictions", "captured", "graph_bytes"}}`` (bytes: device memory the kept entries hold; graph_bytes: what live
    CUDA graphs keep)."""
    from . import backends

    return {name: be.cache_info() for name, be in list(backends.loaded().items()) if hasattr(be, "cache_info")}


def clear_cache(obj=None) -> None:
    """Drop the kept per-call entries of every backend in use (their device memory goes back to the allocator), or,
    with ``obj``, what was staged from that quantized operand (an MXTensor / ScaledTensor whose CuPy arrays were
    changed in place; torch arrays are checked by their version counters)."""
    from . import backends

    _HOT.clear()
    for be in list(backends.loaded().values()):
        if hasattr(be, "clear_cache"):
            be.clear_cache(obj)


def set_cache_limit(nbytes: int) -> None:
    """Bound each backend's per-call cache to ``nbytes`` of device memory (default 4 GiB, or
    ``MXCORE_CACHE_BYTES``); least recently made entries are dropped first."""
    from . import backends

    global _CACHE_LIMIT
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
        raise UnsupportedError(f"set_cache_limit takes a non-negative number of bytes, not {nbytes!r}")
    _CACHE_LIMIT = int(nbytes)
    for be in list(backends.loaded().values()):
        if hasattr(be, "set_cache_limit"):
            be.set_cache_limit(int(nbytes))


_RESOLVED: dict = {}  # (backend, MXCORE_BACKEND, dtype, out_dtype, arch) -> (backend object, MatmulDType, out)


def _resolved(backend, dtype, out_dtype):
    """The backend, resolved dtype and output dtype of a call, checked once per (backend request, environment,
    dtype, out_dtype, arch) and then served from a cache (every error is raised before anything is cached)."""
    from . import backends  # imported here: a backend module is loaded only when a call needs it

    env = os.environ.get("MXCORE_BACKEND")
    try:
        hit = _RESOLVED.get((backend, env, dtype, out_dtype))
    except TypeError:  # an unhashable dtype (a list pair): resolve without the cache
        hit, env = None, None
    if hit is not None:
        be, by_arch = hit
        if backends.loaded().get(be.name) is be and be.is_available() is None:  # the registry's, usable
            got = by_arch.get(be.target().arch)
            if got is not None:
                return (be,) + got
    be = backends.select(backend)
    arch = be.target().arch
    mdt = _dt.resolve(dtype, arch)
    out = _dt.canonical_out_dtype(out_dtype, allow_float64=be.name == "reference")
    reason = be.supports(mdt)
    if reason is not None:
        raise UnsupportedError(
            f"backend {be.name!r} cannot run dtype {mdt.name} here: {reason}. "
            f"It can run: {', '.join(be.supported_dtypes())}; or choose the reference backend (backend='reference')"
        )
    if env is not None or "MXCORE_BACKEND" not in os.environ:
        if len(_RESOLVED) > 256:
            _RESOLVED.clear()
        key = (backend, os.environ.get("MXCORE_BACKEND"), dtype, out_dtype)
        try:
            _RESOLVED.setdefault(key, (be, {}))[1][arch] = (mdt, out)
        except TypeError:
            pass
    return be, mdt, out


def _check_options(be, options) -> None:
    accepted = tuple(be.options)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise UnsupportedError(
            f"backend {be.name!r} takes no option(s) {', '.join(unknown)}; "
            f"its options are: {', '.join(accepted) or 'none'}"
        )


def _stack(results):
    kind = array_kind(results[0])
    if kind == "cupy":
        import cupy

        return cupy.stack(results)
    if kind == "torch":
        import torch

        return torch.stack(results)
    return np.stack(results)


def _empty_like_kind(shape, out, a, b):
    """M, N or B is zero: an empty result; K is zero: a zero result (the empty sum)."""
    from .arrays import like_input
    from .reference import round_output

    return like_input(round_output(np.zeros(shape, np.float64), out), a, b)
