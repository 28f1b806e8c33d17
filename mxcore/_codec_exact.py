"""The exact float64 codec: the reference every fast host path is tested against, bit for bit.

Each value is taken to float64 exactly and rounded once by a generic algorithm over the
:class:`~mxcore.formats.FormatSpec`: scale by the power-of-two quantum at the value's exponent
(``ldexp``, exact), round to an integer, rescale.  It is slow (many float64 passes) but needs no
library's rounding, so it is the oracle of ``tests/test_codec_oracle.py``.  :mod:`mxcore._codec_host`
calls it only for the few elements ml_dtypes does not round the way mxcore's rules say (NaN, inf,
overflow under a policy, stochastic rounding's finish), and for formats ml_dtypes lacks (tf32, fp32).
The MX and per-tensor quantizers at the end are the float64 form of :mod:`mxcore.mx`'s host rules.
"""

from __future__ import annotations

from functools import lru_cache

import ml_dtypes
import numpy as np

from ._format_specs import _NAN_POLICIES, _OVERFLOWS, FORMATS, ROUNDINGS, FormatSpec, get
from .errors import FormatError, InputTypeError


# ---- input handling ------------------------------------------------------------------------------
def _as_exact_float(x, what: str = "x") -> np.ndarray:
    """``x`` as a native float32 or float64 array holding exactly the same values: float32 and float64 as
    they are, float16, bfloat16 and the other ml_dtypes floats widened to float32 (they all embed exactly);
    integer/complex/bool inputs raise."""
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
        with np.errstate(invalid="ignore"):  # signaling NaNs (float16) quieten
            return a.astype(np.float64 if dt.itemsize == 8 else np.float32, copy=False)
    if dt.kind == "V":
        try:
            ml_dtypes.finfo(dt)
        except (ValueError, TypeError):
            pass
        else:
            with np.errstate(invalid="ignore"):
                return a.astype(np.float32)  # every ml_dtypes float embeds exactly in float32
    raise InputTypeError(f"{what} has dtype {dt}; pass a float array (float16/32/64, bfloat16, ml_dtypes floats)")


def _as_float64(x, what: str = "x") -> np.ndarray:
    """``x`` as a float64 array holding exactly the same values; integer/complex/bool inputs raise."""
    a = _as_exact_float(x, what)
    with np.errstate(invalid="ignore"):  # a signaling NaN becomes a quiet one; NaN is NaN to every rule here
        return a.astype(np.float64, copy=False)


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


def policy_checks(rounding, overflow, nan, nan_choices=_NAN_POLICIES):
    _check_choice("rounding", rounding, ROUNDINGS)
    _check_choice("overflow", overflow, _OVERFLOWS)
    _check_choice("nan", nan, nan_choices)


def nan_error(spec: FormatSpec, count: int) -> FormatError:
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
    policy_checks(rounding, overflow, nan)
    x64 = _as_float64(x)
    gen = _rng(rng) if rounding == "stochastic" else None
    a = np.where(np.isfinite(x64), np.abs(x64), 0.0)
    _, _, magcode, over = _round_magnitude(spec, a, rounding, gen)
    return _encode_finish(spec, x64, magcode, over, rounding, overflow, nan)


def _encode_finish(spec: FormatSpec, x64, magcode, over, rounding, overflow, nan) -> np.ndarray:
    """Codes from the rounded magnitude codes of ``|x64|`` (non-finite inputs rounded as 0): the overflow,
    inf, sign and NaN rules of :func:`encode`."""
    neg = np.signbit(x64)
    isnan = np.isnan(x64)
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
            raise nan_error(spec, int(isnan.sum()))
        else:
            code = np.where(isnan, 0, code)
    return np.asarray(code).astype(spec.code_dtype)


def round_to(x, fmt, *, rounding: str = "rne", overflow: str = "saturate", nan: str = "raise",
             rng=None) -> np.ndarray:
    """Quantize-dequantize ``x`` to ``fmt`` (any format here, fp16 / bf16 / tf32 / fp32 included) with one
    exact rounding from the input value; returns float64.  Same rules as :func:`encode`;
    ``nan="propagate"`` also returns NaN for NaN inputs in formats without NaN."""
    spec = get(fmt)
    policy_checks(rounding, overflow, nan, _NAN_POLICIES + ("propagate",))
    x64 = _as_float64(x)
    gen = _rng(rng) if rounding == "stochastic" else None
    a = np.where(np.isfinite(x64), np.abs(x64), 0.0)
    r, shift, _, over = _round_magnitude(spec, a, rounding, gen)
    with np.errstate(over="ignore"):  # a value rounded up past float64's range overflows the format too
        mag = np.ldexp(r.astype(np.float64), shift)
    return _round_to_finish(spec, x64, mag, over, rounding, overflow, nan)


def _round_to_finish(spec: FormatSpec, x64, mag, over, rounding, overflow, nan) -> np.ndarray:
    """Values from the rounded magnitudes ``mag`` of ``|x64|``: the overflow, inf, sign and NaN rules of
    :func:`round_to`."""
    isnan = np.isnan(x64)
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
            raise nan_error(spec, int(isnan.sum()))
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


# ---- MX and per-tensor quantization (the float64 form of mxcore.mx's host rules) ----------------
E8M0_BIAS = 127
E8M0_NAN = 0xFF


def floor_log2(a: np.ndarray) -> np.ndarray:
    """floor(log2(a)) exactly for positive finite float64 ``a`` (via frexp); int64."""
    return np.frexp(a)[1].astype(np.int64) - 1


def ceil_log2_ratio(a: np.ndarray, max_normal: float) -> np.ndarray:
    """Smallest integer k with ``a <= max_normal * 2^k``, exactly, for positive finite ``a``; int64."""
    k = floor_log2(a) - floor_log2(np.array(max_normal))  # within 1 of the answer
    k = np.clip(k, -1100, 1100)
    with np.errstate(over="ignore", under="ignore"):
        k = np.where(a > np.ldexp(max_normal, k), k + 1, k)
        k = np.where(a <= np.ldexp(max_normal, k - 1), k - 1, k)
    return k


def mx_exponents(amax: np.ndarray, spec: FormatSpec, rceil: bool) -> np.ndarray:
    """The blocks' scale exponents from their finite amax (float64, >= 0), clamped to E8M0's [-127, 127]:
    ``floor(log2(amax)) - emax`` (OCP) or ``ceil(log2(amax / max_normal))`` (rceil); an all-zero block gets
    -127, the clamp of ``log2(0)``."""
    pos = amax > 0
    safe = np.where(pos, amax, 1.0)
    exp = ceil_log2_ratio(safe, spec.max_normal) if rceil else floor_log2(safe) - spec.emax
    exp = np.where(pos, exp, -E8M0_BIAS)
    return np.clip(exp, -E8M0_BIAS, E8M0_BIAS)


def quantize_mx(x, spec: FormatSpec, *, axis: int, block: int, rceil: bool):
    """(codes, scales) of ``x`` in MX format with element ``spec``, blocks of ``block`` along ``axis``
    (non-negative), every element rounded once from float64."""
    x64 = _as_float64(x)
    k = x64.shape[axis]
    nblocks = -(-k // block)
    xt = np.moveaxis(x64, axis, -1)
    lead = xt.shape[:-1]
    pad = nblocks * block - k
    if pad:
        xt = np.concatenate([xt, np.zeros(lead + (pad,))], axis=-1)
    xb = xt.reshape(lead + (nblocks, block))
    finite = np.isfinite(xb)
    bad_block = ~finite.all(axis=-1)
    amax = np.max(np.where(finite, np.abs(xb), 0.0), axis=-1, initial=0.0)
    exp = mx_exponents(amax, spec, rceil)
    scales = np.where(bad_block, E8M0_NAN, exp + E8M0_BIAS).astype(np.uint8)
    with np.errstate(under="ignore"):
        scaled = np.ldexp(np.where(bad_block[..., None], 0.0, xb), -exp[..., None])
    codes = encode(scaled, spec, rounding="rne", overflow="saturate")
    codes = codes.reshape(lead + (nblocks * block,))[..., :k]
    return (np.ascontiguousarray(np.moveaxis(codes, -1, axis)),
            np.ascontiguousarray(np.moveaxis(scales, -1, axis)))


def tensor_exponent(amax: float, spec: FormatSpec) -> int:
    """The per-tensor scale exponent: ``ceil(log2(amax / max_normal))`` (0 for amax 0), clamped to
    [-126, 127] so that the scale is a normal float32."""
    k = int(ceil_log2_ratio(np.array(amax), spec.max_normal)) if amax > 0 else 0
    return min(max(k, -126), 127)


def finite_amax(x) -> float:
    """The largest finite magnitude of ``x`` (0 when there is none)."""
    x64 = _as_float64(x)
    return float(np.max(np.abs(x64[np.isfinite(x64)]), initial=0.0))


def encode_scaled(x, spec: FormatSpec, k: int) -> np.ndarray:
    """Per-tensor codes of ``x / 2^k``: finite values rounded once and saturated; NaN to the format's NaN
    (FormatError where it has none), ±inf to inf or NaN (saturated where the format has neither)."""
    x64 = _as_float64(x)
    finite = np.isfinite(x64)
    with np.errstate(under="ignore"):
        scaled = np.ldexp(np.where(finite, x64, 0.0), -k)
    codes = encode(scaled, spec, rounding="rne", overflow="saturate", nan="zero")
    nonfinite = ~finite
    if nonfinite.any():
        codes[nonfinite] = encode(x64[nonfinite], spec, overflow="nan")
    return codes


def dequantize_mx(codes, scales, spec: FormatSpec, *, axis: int, block: int, dtype=np.float32) -> np.ndarray:
    """Values of MX codes and E8M0 scales, exact in float64, rounded once to ``dtype``."""
    elem = decode(codes, spec, dtype=np.float64)
    sc = np.repeat(decode(scales, "e8m0", dtype=np.float64), block, axis=axis)
    sc = np.take(sc, np.arange(np.shape(codes)[axis]), axis=axis)
    return _to_dtype(elem * sc, dtype)  # exact: a power of two times a short significand, well inside float64


def dequantize_tensor(codes, spec: FormatSpec, scale_exp: int, dtype=np.float32) -> np.ndarray:
    """Values of per-tensor codes times ``2^scale_exp``, exact in float64, rounded once to ``dtype``."""
    return _to_dtype(decode(codes, spec, dtype=np.float64) * np.ldexp(1.0, scale_exp), dtype)


def _to_dtype(vals: np.ndarray, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return vals
    with np.errstate(over="ignore"):
        return vals.astype(dtype)
