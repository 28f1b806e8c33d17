"""The numpy codecs behind :mod:`mxcore.formats` (host arrays): exact rounding from float64, decoding
through per-format tables, fp4/fp6 packing.  The rules are documented in :mod:`mxcore.formats`; the
device kernels (``kernels_cuda/mx_codec.cuh``) implement the same rules and are tested bit for bit
against these functions.
"""

from __future__ import annotations

from functools import lru_cache

import ml_dtypes
import numpy as np

from ._format_specs import _NAN_POLICIES, _OVERFLOWS, FORMATS, ROUNDINGS, FormatSpec, get
from .errors import FormatError, InputTypeError, ShapeError

# ---- input handling ------------------------------------------------------------------------------
def _as_float64(x, what: str = "x") -> np.ndarray:
    """``x`` as a float64 array holding exactly the same values; integer/complex/bool inputs raise."""
    a = np.asarray(x)
    dt = a.dtype
    if dt.kind in "iub":
        raise InputTypeError(f"{what} has integer/bool dtype {dt}; these are values to quantize, so pass floats "
                             f"(x.astype(np.float32)); to decode integer codes use mxcore.formats.decode")
    if dt.kind == "c":
        raise InputTypeError(f"{what} is complex ({dt}); quantize the real and imaginary parts separately")
    if dt.kind == "f":
        if dt.itemsize > 8:
            raise InputTypeError(f"{what} is {dt}; float64 is the widest input taken exactly (cast explicitly)")
        return a.astype(np.float64, copy=False)
    if dt.kind == "V":
        try:
            ml_dtypes.finfo(dt)
        except (ValueError, TypeError):
            pass
        else:
            return a.astype(np.float64)  # every ml_dtypes float embeds exactly in float64
    raise InputTypeError(f"{what} has dtype {dt}; pass a float array (float16/32/64, bfloat16, ml_dtypes floats)")


def _check_choice(what: str, value, choices) -> None:
    if value not in choices:
        raise FormatError(f"{what}={value!r}; choose one of {', '.join(repr(c) for c in choices)}")


def _rng(rng):
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or isinstance(rng, (int, np.integer, np.random.SeedSequence)):
        return np.random.default_rng(rng)
    raise InputTypeError(f"rng={rng!r}; pass a numpy.random.Generator or an integer seed")


# ---- the generic rounding core -------------------------------------------------------------------
def _round_magnitude(spec: FormatSpec, a: np.ndarray, rounding: str, rng):
    """Round finite magnitudes ``a`` (float64, >= 0) once.  Returns (r, shift, magcode, overflow):
    the rounded value is ``r * 2**shift`` exactly (r an integer), ``magcode`` its magnitude code
    in an exponent-unbounded extension of the format, ``overflow`` where it exceeds max_normal."""
    m = spec.mbits
    _, ex = np.frexp(a)  # a = f * 2**ex, f in [0.5, 1); exact
    e = np.where(a == 0, spec.emin, np.maximum(ex.astype(np.int64) - 1, spec.emin))  # exponent whose quantum applies
    shift = e - m
    scaled = np.ldexp(a, -shift)  # exact: a power-of-two scaling into [0, 2**(m+1))
    if rounding == "rne":
        r = np.rint(scaled)  # ties to even
    elif rounding == "rtz":
        r = np.trunc(scaled)
    else:
        low = np.floor(scaled)
        r = low + (rng.random(scaled.shape) < (scaled - low))
    r = r.astype(np.int64)
    if not spec.subnormals:  # no zero and nothing below the smallest normal: clamp up to it
        r = np.maximum(r, 1 << m)
    magcode = ((e - spec.emin) << m) + r - (0 if spec.subnormals else (1 << m))
    return r, shift, magcode, magcode > spec.max_magcode


def _policy_checks(rounding, overflow, nan, nan_choices=_NAN_POLICIES):
    _check_choice("rounding", rounding, ROUNDINGS)
    _check_choice("overflow", overflow, _OVERFLOWS)
    _check_choice("nan", nan, nan_choices)


def _nan_error(spec: FormatSpec, count: int) -> FormatError:
    return FormatError(f"{count} NaN value(s) cannot be encoded in {spec.name}, which has no NaN; "
                       f"remove them, or pass nan='zero' to encode NaN as +0")


def encode(x, fmt, *, rounding: str = "rne", overflow: str = "saturate", nan: str = "raise",
           rng=None) -> np.ndarray:
    """Round ``x`` once to format ``fmt`` and return the canonical codes (uint8 for formats of at most 8
    bits; uint16 / uint32 for fp16, bf16 / tf32, fp32), same shape as ``x``.

    ``rounding``: ``"rne"`` | ``"rtz"`` | ``"stochastic"`` (with ``rng``: a Generator or a seed).
    ``overflow``: ``"saturate"`` (±max, also for ±inf) | ``"nan"`` (inf, or NaN where the format has no inf).
    ``nan``: for formats without NaN, ``"raise"`` (FormatError) | ``"zero"`` (+0).  See the module doc.
    """
    spec = get(fmt)
    _policy_checks(rounding, overflow, nan)
    x64 = _as_float64(x)
    gen = _rng(rng) if rounding == "stochastic" else None
    neg = np.signbit(x64)
    finite = np.isfinite(x64)
    isnan = np.isnan(x64)
    a = np.where(finite, np.abs(x64), 0.0)
    _, _, magcode, over = _round_magnitude(spec, a, rounding, gen)
    # finite overflow: saturate, unless the format's IEEE-like rule gives inf/NaN
    nonsat = overflow == "nan" and rounding != "rtz" and spec.has_nan
    over_code = (spec.inf_codes[0] if spec.has_inf else spec.nan_code) if nonsat else spec.max_magcode
    magcode = np.where(over, over_code, magcode)
    # infinite inputs
    if overflow == "nan" and spec.has_nan:
        inf_code = spec.inf_codes[0] if spec.has_inf else spec.nan_code
    else:
        inf_code = spec.max_magcode
    magcode = np.where(np.isinf(x64), inf_code, magcode)
    # sign
    if spec.signed:
        sign_bit = 1 << (spec.bits - 1)
        keep_sign = neg
        if spec.specials == "fnuz":  # no -0; the sign-bit-only code is the NaN
            keep_sign = neg & (magcode != 0)
        code = np.where(keep_sign, magcode | sign_bit, magcode)
        if spec.specials == "fnuz":
            code = np.where(magcode == spec.nan_code, spec.nan_code, code)  # NaN (from overflow) has no sign
    else:  # unsigned (e8m0): zero, negatives and -inf have no code but NaN
        code = np.where(neg | (x64 == 0), spec.nan_code, magcode)
    # NaN inputs
    if isnan.any():
        if spec.has_nan:
            nan_code = spec.nan_code
            if spec.signed and spec.specials != "fnuz":
                code = np.where(isnan, np.where(neg, nan_code | (1 << (spec.bits - 1)), nan_code), code)
            else:
                code = np.where(isnan, nan_code, code)
        elif nan == "raise":
            raise _nan_error(spec, int(isnan.sum()))
        else:
            code = np.where(isnan, 0, code)
    return np.asarray(code).astype(spec.code_dtype)


def round_to(x, fmt, *, rounding: str = "rne", overflow: str = "saturate", nan: str = "raise",
             rng=None) -> np.ndarray:
    """Quantize-dequantize ``x`` to ``fmt`` (any format here, fp16 / bf16 / tf32 / fp32 included) with one
    exact rounding from the input value; returns float64.  Same rules as :func:`encode`;
    ``nan="propagate"`` also returns NaN for NaN inputs in formats without NaN."""
    spec = get(fmt)
    _policy_checks(rounding, overflow, nan, _NAN_POLICIES + ("propagate",))
    x64 = _as_float64(x)
    gen = _rng(rng) if rounding == "stochastic" else None
    finite = np.isfinite(x64)
    isnan = np.isnan(x64)
    a = np.where(finite, np.abs(x64), 0.0)
    r, shift, _, over = _round_magnitude(spec, a, rounding, gen)
    mag = np.ldexp(r.astype(np.float64), shift)
    nonsat = overflow == "nan" and rounding != "rtz" and spec.has_nan
    big = np.inf if spec.has_inf else np.nan
    mag = np.where(over, big if nonsat else spec.max_normal, mag)
    inf_val = big if (overflow == "nan" and spec.has_nan) else spec.max_normal
    mag = np.where(np.isinf(x64), inf_val, mag)
    neg = np.signbit(x64)
    if spec.signed:
        keep = neg & (mag != 0) if spec.specials == "fnuz" else neg
        out = np.where(keep, -mag, mag)
    else:
        out = np.where(neg | (x64 == 0), np.nan, mag)
    if isnan.any():
        if not spec.has_nan and nan == "raise":
            raise _nan_error(spec, int(isnan.sum()))
        if not spec.has_nan and nan == "zero":
            fill = 0.0
        else:  # keep the NaN's sign where the format's NaN codes have one (as decode(encode(x)) does)
            fill = np.copysign(np.nan, x64) if spec.signed and spec.specials in ("ieee", "fn") else np.nan
        out = np.where(isnan, fill, out)
    return np.asarray(out, dtype=np.float64)


# ---- decoding ------------------------------------------------------------------------------------
def _as_codes(codes, spec: FormatSpec) -> np.ndarray:
    c = np.asarray(codes)
    if spec.dtype is not None and c.dtype == np.dtype(spec.dtype) and c.dtype.kind == "V":
        return c.view(np.uint8).astype(np.int64)
    if c.dtype.kind not in "iu":
        raise InputTypeError(f"decode takes integer codes of {spec.name}, got dtype {c.dtype}; "
                             "to round float values use mxcore.formats.round_to or encode")
    c = c.astype(np.int64)
    bad = (c < 0) | (c >= (1 << spec.bits))
    if bad.any():
        first = int(c[bad].flat[0])
        raise FormatError(f"{int(bad.sum())} code(s) are not valid {spec.name} codes (e.g. {first:#x}); "
                          f"{spec.name} has {spec.bits} bits, codes 0..{(1 << spec.bits) - 1:#x}"
                          + ("; packed bytes? use unpack_fp4 / unpack_fp6 first" if spec.bits < 8 else ""))
    return c


def _decode64(c: np.ndarray, spec: FormatSpec) -> np.ndarray:
    """Values of valid int64 codes ``c`` as float64 (NaN keeps the code's sign bit)."""
    m = spec.mbits
    mag_mask = (1 << (spec.ebits + m)) - 1
    mag = c & mag_mask
    fld = mag >> m
    mant = (mag & ((1 << m) - 1)).astype(np.float64)
    if spec.subnormals:
        val = np.where(fld == 0, np.ldexp(mant, spec.emin - m), np.ldexp(mant + (1 << m), fld - spec.bias - m))
    else:
        val = np.ldexp(mant + (1 << m), fld - spec.bias - m)
    if spec.specials == "ieee":
        exp_ones = (1 << spec.ebits) - 1
        val = np.where(fld == exp_ones, np.where(mant == 0, np.inf, np.nan), val)
    elif spec.specials == "fn":
        val = np.where(mag == mag_mask, np.nan, val)
    if spec.signed:
        sign = (c >> (spec.bits - 1)) & 1
        if spec.specials == "fnuz":
            val = np.where(c == spec.nan_code, np.nan, np.where(sign == 1, -val, val))
        else:
            val = np.where(sign == 1, np.copysign(val, -1.0), val)
    return val


@lru_cache(maxsize=None)
def _table(name: str) -> np.ndarray:
    spec = FORMATS[name]
    t = _decode64(np.arange(1 << spec.bits, dtype=np.int64), spec)
    t.setflags(write=False)
    return t


def decode(codes, fmt, *, dtype=np.float32) -> np.ndarray:
    """Values of ``codes`` (integers, or an ml_dtypes array of the format) as float32 (exact for every
    format here); ``dtype=np.float64`` on request.  Invalid codes raise FormatError."""
    spec = get(fmt)
    c = _as_codes(codes, spec)
    vals = _table(spec.name)[c] if spec.bits <= 16 else _decode64(c, spec)
    return vals.astype(dtype)


# ---- packing -------------------------------------------------------------------------------------
def _check_nbit(codes, nbits: int, what: str) -> np.ndarray:
    c = np.asarray(codes)
    if c.dtype.kind not in "iu":
        raise InputTypeError(f"{what} takes integer codes (from encode), got dtype {c.dtype}")
    if c.ndim == 0:
        raise ShapeError(f"{what} takes an array of at least one dimension (packs along the last axis)")
    if ((c < 0) | (c >= (1 << nbits))).any():
        raise FormatError(f"{what}: codes must be {nbits}-bit (0..{(1 << nbits) - 1}); got values up to {int(c.max())}")
    return c.astype(np.uint8)


def _pad_last(c: np.ndarray, multiple: int) -> np.ndarray:
    extra = (-c.shape[-1]) % multiple
    if extra:
        c = np.concatenate([c, np.zeros(c.shape[:-1] + (extra,), np.uint8)], axis=-1)
    return c


def pack_fp4(codes) -> np.ndarray:
    """Pack 4-bit codes two per byte along the last axis: element 2j in the low nibble, 2j+1 in the high
    nibble.  An odd length is padded with a zero code; pass ``count`` to :func:`unpack_fp4` to trim."""
    c = _pad_last(_check_nbit(codes, 4, "pack_fp4"), 2)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)


def unpack_fp4(packed, count: int | None = None) -> np.ndarray:
    """Inverse of :func:`pack_fp4`: 2 codes per byte along the last axis, trimmed to ``count`` if given."""
    p = _check_nbit(packed, 8, "unpack_fp4")
    out = np.stack([p & 0x0F, p >> 4], axis=-1).reshape(p.shape[:-1] + (2 * p.shape[-1],))
    return _trim(out, count, "unpack_fp4")


def pack_fp6(codes) -> np.ndarray:
    """Pack 6-bit codes four per three bytes along the last axis, LSB first: value i of a group of four
    occupies bits [6i, 6i+6) of the group's little-endian 24-bit word.  The length is padded with zero
    codes to a multiple of 4; pass ``count`` to :func:`unpack_fp6` to trim."""
    c = _pad_last(_check_nbit(codes, 6, "pack_fp6"), 4).astype(np.uint32)
    word = c[..., 0::4] | (c[..., 1::4] << 6) | (c[..., 2::4] << 12) | (c[..., 3::4] << 18)
    out = np.stack([word & 0xFF, (word >> 8) & 0xFF, word >> 16], axis=-1)
    return out.reshape(c.shape[:-1] + (3 * (c.shape[-1] // 4),)).astype(np.uint8)


def unpack_fp6(packed, count: int | None = None) -> np.ndarray:
    """Inverse of :func:`pack_fp6` (the last axis must be a multiple of 3 bytes)."""
    p = _check_nbit(packed, 8, "unpack_fp6")
    if p.shape[-1] % 3:
        raise ShapeError(f"unpack_fp6: the last axis holds {p.shape[-1]} bytes, not a multiple of 3 "
                         "(4 values in 3 bytes)")
    g = p.reshape(p.shape[:-1] + (p.shape[-1] // 3, 3)).astype(np.uint32)
    word = g[..., 0] | (g[..., 1] << 8) | (g[..., 2] << 16)
    out = np.stack([(word >> (6 * i)) & 0x3F for i in range(4)], axis=-1)
    out = out.reshape(p.shape[:-1] + (4 * (p.shape[-1] // 3),)).astype(np.uint8)
    return _trim(out, count, "unpack_fp6")


def _trim(out: np.ndarray, count, what: str) -> np.ndarray:
    if count is None:
        return out
    if not 0 <= count <= out.shape[-1]:
        raise ShapeError(f"{what}: count={count} but the packed data holds {out.shape[-1]} values")
    return out[..., :count]
