"""Turn user operands into what a matrix core reads: typed values, or codes plus scales.

This is the one place that decides how an input of any kind (float array, ml_dtypes array of
codes, :class:`~mxcore.mx.MXTensor`, :class:`~mxcore.mx.ScaledTensor`) becomes an operand of a
resolved :class:`~mxcore.dtypes.MatmulDType`.  The reference backend and the GPU backends both
call :func:`prepare`, so the quantization a GPU kernel consumes is exactly the one the oracle
checks.

Input policy (documented in the README):

* float dtypes (fp32/tf32/fp16/bf16): inputs are rounded once (RNE) to the dtype; NaN and inf
  propagate as IEEE arithmetic says.
* plain fp8: a power-of-two per-tensor scale is chosen from the finite amax (``quantize_tensor``);
  NaN stays NaN, inf stays inf in e5m2 and becomes NaN in e4m3 (it has no inf).
* MX: OCP v1.0 block quantization along K (A along axis 1, B along axis 0); a block containing
  NaN or inf gets the NaN scale 0xFF and so every output that reads it is NaN.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from . import dtypes as _dt
from .arrays import check_unmasked
from .errors import InputTypeError, MXCoreError, UnsupportedError

__all__ = ["Operand", "infer_dtype", "prepare", "prepare_one", "check_real_input", "check_unmasked", "round_values",
           "made_per_call", "mark_per_call"]


def _native(name: str) -> str | None:
    """The operand dtype an input of numpy / ml_dtypes / torch dtype ``name`` implies (dtype=None), or None."""
    if name == "float64":
        return "fp32"  # float64 data is multiplied as fp32 (one rounding)
    try:
        canon = _dt.canonical_operand(name)
    except MXCoreError:
        return None
    return canon if _dt.KINDS[canon] != "mx" and canon != "tf32" else None


def _numpy_name(element: str) -> str:
    """The numpy / ml_dtypes dtype name of an element format's values (e4m3fn -> float8_e4m3fn)."""
    from . import formats

    return np.dtype(formats.get(element).dtype).name


def _is_mx(x) -> bool:
    return type(x).__name__ == "MXTensor" and type(x).__module__.startswith("mxcore")


def _is_scaled(x) -> bool:
    return type(x).__name__ == "ScaledTensor" and type(x).__module__.startswith("mxcore")


def _on_device(x) -> bool:
    mod = type(x).__module__ or ""
    return mod.startswith("cupy") or (mod.startswith("torch") and getattr(x.device, "type", "cpu") != "cpu")


def _byte_dtype(x):
    """uint8 in ``x``'s array library (a view of fp8 codes as bytes)."""
    if (type(x).__module__ or "").startswith("torch"):
        import torch

        return torch.uint8
    return np.uint8


_NAMES: dict = {}  # dtype object -> name (numpy's dtype.name costs ~5 us; this runs on every matmul)


def _dtype_name(x) -> str:
    dt = getattr(x, "dtype", None)
    try:
        return _NAMES[dt]
    except (KeyError, TypeError):
        name = getattr(dt, "name", str(dt)).replace("torch.", "")
        try:
            _NAMES[dt] = name
        except TypeError:
            pass
        return name


def check_real_input(x, role: str) -> None:
    """Reject anything but real floating-point data (integer, boolean, complex, string, object arrays, masked
    arrays), the same way on every dtype path, with a message that says what to pass instead."""
    if _is_mx(x) or _is_scaled(x):
        return
    check_unmasked(x, f"operand {role}")
    if getattr(x, "dtype", None) is None:
        return  # not an array: the API's shape check says what to pass
    name = _dtype_name(x)
    if not name.startswith(("float", "bfloat")):  # every path takes the same real floating-point dtypes only
        raise InputTypeError(
            f"operand {role} has dtype {name}; mxcore multiplies real floating-point data. Pass float arrays "
            "(float32/float16/bfloat16, or ml_dtypes float8 arrays for fp8 codes), an MXTensor from "
            "mxcore.quantize_mx, or a ScaledTensor from mxcore.quantize_tensor"
        )


def infer_dtype(a, b):
    """The dtype implied by the inputs themselves (``dtype=None``): an operand name or an (A, B) pair."""

    def one(x):
        if _is_mx(x) or _is_scaled(x):
            return x.fmt
        name = _dtype_name(x)
        native = _native(name)
        if native is None:
            raise InputTypeError(
                f"cannot infer a matmul dtype from input dtype {name!r}; pass dtype= explicitly "
                f"(known: {', '.join(_dt.known_names())})"
            )
        return native

    da, db = one(a), one(b)
    return da if da == db else (da, db)


@dataclass(frozen=True)
class Operand:
    """One prepared operand.

    ``values``: float array in the dtype's storage type (float kinds; tf32 values, already rounded to tf32,
    in float32), else None.
    ``codes``: uint8 element codes, logical shape (fp8 and MX kinds).
    ``mx``: the :class:`MXTensor` (MX kind).  ``scale_exp``: the per-tensor scale's exponent (fp8 kind; the
    scale is 2^scale_exp): an int, or, for a device ScaledTensor, its 0-d int32 device array, carried as it is so
    that a GPU backend reads it on the device (nothing here reads it back).  ``tensor_scale``: the scale as a
    float (reading it from a device ScaledTensor synchronises; the reference and host paths use it).
    """

    dtype: _dt.OperandDType
    role: str
    shape: tuple
    values: np.ndarray | None = None
    codes: np.ndarray | None = None
    mx: object = None
    scale_exp: object = 0

    @property
    def tensor_scale(self) -> float:
        e = self.scale_exp
        if not isinstance(e, (int, np.integer)):
            from .arrays import to_numpy

            e = int(to_numpy(e))  # a device scalar: one device->host read
        return float(np.ldexp(1.0, int(e)))

    @property
    def scales(self):
        return None if self.mx is None else self.mx.scales

    def to_float64(self) -> np.ndarray:
        """The exact real values the matrix core multiplies (scales applied)."""
        from . import formats, mx

        kind = self.dtype.kind
        if kind == "float":
            return self.values.astype(np.float64)
        if kind == "fp8":
            return formats.decode(self.codes, self.dtype.element).astype(np.float64) * self.tensor_scale
        return mx.dequantize(self.mx, dtype=np.float64)


def prepare_one(x, od: _dt.OperandDType, role: str, scale_rounding: str = "floor") -> Operand:
    """Prepare one operand (role "a": M×K, blocks along axis 1; "b": K×N, blocks along axis 0): host data of any
    kind; quantized objects (MXTensor / ScaledTensor, host or device) and raw device fp8 codes are passed through
    without reading device memory."""
    from . import mx

    axis = 1 if role == "a" else 0  # K is A's columns and B's rows
    if od.kind == "mx":
        if _is_mx(x):
            if _dt.canonical_operand(x.fmt) != od.name:
                raise UnsupportedError(f"operand {role} is an MXTensor of {x.fmt} but dtype asks for {od.name}; "
                                       f"requantize it, or pass dtype={x.fmt!r}")
            if x.axis != axis:
                raise UnsupportedError(f"operand {role} is block-quantized along axis {x.axis}; matmul needs blocks "
                                       f"along K (axis {axis} for {role.upper()})")
            return Operand(od, role, tuple(x.shape), codes=x.codes, mx=x)
        if _is_scaled(x):
            raise UnsupportedError(f"operand {role} is a per-tensor ScaledTensor but dtype {od.name} is block-scaled; "
                                   "pass float data and let mxcore quantize it")
        host = np.asarray(x)
        if host.dtype.name.startswith("float8"):
            raise UnsupportedError(f"operand {role} holds {host.dtype.name} codes without block scales; "
                                   f"use mxcore.quantize_mx(float_data, {od.name!r}) or dtype='fp8'")
        t = mx.quantize_mx(host.astype(np.float32) if host.dtype.itemsize < 4 else host, od.name, axis=axis,
                           scale_rounding=scale_rounding)
        return Operand(od, role, tuple(host.shape), codes=t.codes, mx=t)
    if od.kind == "fp8":
        if _is_scaled(x):
            if _dt.canonical_operand(x.fmt) != od.name:
                raise UnsupportedError(_fp8_mismatch(role, x.fmt, od.name))
            return Operand(od, role, tuple(x.codes.shape), codes=x.codes, scale_exp=x.scale_exp)
        if _is_mx(x):
            raise UnsupportedError(f"operand {role} is an MXTensor but dtype {od.name} is per-tensor fp8; "
                                   f"pass dtype={x.fmt!r} to use its block scales")
        if _on_device(x) and _dtype_name(x).startswith("float8"):  # raw device fp8 codes: read as bytes, scale 1
            name = _dtype_name(x)
            if name != _numpy_name(od.element):
                raise UnsupportedError(_fp8_mismatch(role, name.replace("float8_", ""), od.name))
            return Operand(od, role, tuple(x.shape), codes=x.view(_byte_dtype(x)))
        host = np.asarray(x)
        name = host.dtype.name
        if name.startswith("float8"):
            if name != _numpy_name(od.element):
                raise UnsupportedError(_fp8_mismatch(role, name.replace("float8_", ""), od.name))
            return Operand(od, role, tuple(host.shape), codes=host.view(np.uint8))
        t = mx.quantize_tensor(host, od.element)
        return Operand(od, role, tuple(host.shape), codes=t.codes, scale_exp=t.scale_exp)
    # float kinds
    if _is_mx(x) or _is_scaled(x):
        raise UnsupportedError(f"operand {role} is quantized ({x.fmt}) but dtype is {od.name}; pass dtype={x.fmt!r}")
    host = np.asarray(x)
    if host.dtype.name.startswith("float8"):
        raise UnsupportedError(f"operand {role} holds {host.dtype.name} codes but dtype is {od.name}; "
                               f"pass dtype={_native(host.dtype.name)!r} or decode them first")
    return Operand(od, role, tuple(host.shape), values=round_values(host, od.element))


def round_values(host: np.ndarray, element: str) -> np.ndarray:
    """Float data rounded ONCE (RNE, from the input's own precision) to a float element format, in its storage
    type (tf32 in float32).  IEEE semantics: finite overflow gives ±inf, ±inf and NaN propagate."""
    from . import formats

    with np.errstate(over="ignore"):  # overflow to +-inf is the documented IEEE behaviour, not a warning
        if element == "fp32":
            return host.astype(np.float32)  # float64 -> float32 is one RNE rounding
        if element == "fp16":
            return host.astype(np.float16)  # numpy converts double -> half with one RNE rounding
    storage = np.float32 if element == "tf32" else formats.get(element).dtype
    if host.dtype == np.dtype(storage) and element != "tf32":
        return host
    return formats.round_to(host, element, overflow="nan", nan="propagate").astype(storage)


def _fp8_mismatch(role: str, have: str, want: str) -> str:
    have = _dt.canonical_operand(have)
    if have.endswith("fnuz") != want.endswith("fnuz"):
        why = ("These are different fp8 encodings (OCP e4m3fn/e5m2 vs FNUZ e4m3fnuz/e5m2fnuz: CDNA3 (gfx942) reads "
               "FNUZ, CDNA4 (gfx950) and NVIDIA read OCP)")
    else:
        why = "These are different fp8 element formats (e4m3 has 3 mantissa bits, e5m2 has 2)"
    return (f"operand {role} holds {have} bytes but the matmul reads {want}. {why}; "
            f"convert the data (decode as {have}, re-encode as {want}) or pass dtype={have!r}")


def prepare(a, b, mdt: _dt.MatmulDType, *, scale_rounding: str = "floor") -> tuple[Operand, Operand]:
    """Prepare host operands ``a`` (M×K) and ``b`` (K×N) for ``mdt``."""
    if scale_rounding not in ("floor", "rceil"):
        raise UnsupportedError(f"scale_rounding={scale_rounding!r}; use 'floor' (OCP v1.0) or 'rceil' (cuBLAS)")
    return prepare_one(a, mdt.a, "a", scale_rounding), prepare_one(b, mdt.b, "b", scale_rounding)


def quantize_on_device(x, od, role: str, scale_rounding: str = "floor", *, batched: bool = False,
                       b_order: str = "C"):
    """fp8/MX quantization of a float operand on its own GPU (MX: blocks along K; fp8: per-tensor).  Quantized
    objects and raw fp8 code arrays pass as they are.  ``batched``: x is (B, M, K) / (B, K, N).  ``b_order``: the
    memory order of a 2-D B's per-tensor fp8 codes (the backend's ``b_code_order``; "F" is column-major, K
    contiguous)."""
    from . import mx
    from .arrays import array_kind

    if array_kind(x) == "mx" or od.kind == "float":  # quantized, or the float activations of a weight-only pair
        return x
    dt = getattr(x, "dtype", None)
    if getattr(dt, "name", str(dt)).replace("torch.", "").startswith("float8"):  # raw codes, read with unit scale
        return x
    if od.kind == "mx":
        axis = -1 if role == "a" else (-2 if batched else 0)
        return mark_per_call(mx.quantize_mx(x, od.name, axis=axis, scale_rounding=scale_rounding))
    order = b_order if role == "b" and len(getattr(x, "shape", ())) == 2 else "C"
    return mark_per_call(mx.quantize_tensor(x, od.element, order=order))


#: quantized operands that :func:`quantize_on_device` made from a call's float data: staged for that call (or
#: replayed per call), unlike a caller's own quantized objects, staged once and reused.  The cuda backend's MX
#: path rule weighs per-call staging by this (``backends/cuda/families.py``).
_PER_CALL: "weakref.WeakSet" = weakref.WeakSet()


def mark_per_call(q, like=None):
    """Mark quantized operand ``q`` as made for one call (``like``: only where ``like`` is so marked); returns
    ``q``."""
    if like is None or made_per_call(like):
        _PER_CALL.add(q)
    return q


def made_per_call(x) -> bool:
    """Whether ``x`` is a quantized operand :func:`quantize_on_device` made from a call's float data."""
    try:
        return x in _PER_CALL
    except TypeError:  # not weak-referenceable: not one of ours
        return False
