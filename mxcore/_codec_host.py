"""The numpy codecs behind :mod:`mxcore.formats` and :mod:`mxcore.mx` (host arrays), at the speed of an
ml_dtypes cast.  The rules are documented in :mod:`mxcore.formats`; the device kernels
(``kernels_cuda/mx_codec.cuh``) implement the same rules and are tested bit for bit against these functions.

How the codes come out identical to the exact float64 codec (:mod:`mxcore._codec_exact`, the oracle of
``tests/test_codec_oracle.py``):

* ml_dtypes rounds a float32 value to nearest-even once, at every magnitude of the target's range, its
  subnormals included.  float16, bfloat16 and the other ml_dtypes floats are widened to float32 (exact).
  float64 is cast directly where ml_dtypes rounds it once (>= 0.7); older versions round it through float32,
  so there it is first rounded *to odd* into float32 (truncate, then set the last bit where inexact): with
  at least two more bits than the target, that float32 lies strictly between the same target midpoints as
  the float64 value, and the second rounding is the correct one.
* Scaling by 2^k (MX blocks, per-tensor scales) is exact in float32 unless the product lands below 2^-126;
  every format here rounds such a magnitude to zero (its smallest subnormal is 2^-17 or more), and float32
  keeps the sign of an underflowed product, so the codes are those of the exact product.
* mxcore's own code does what ml_dtypes does not: the few elements ml_dtypes returns a NaN or inf code for
  (non-finite input, overflow), and NaN input of a format without NaN, are recomputed by the exact codec
  (saturation or the IEEE-like rule, nan="raise" / "zero"); rtz steps the nearest code down where it lies
  above the input; stochastic rounding draws the oracle's random numbers and rounds up from the rtz code
  where the draw is below the fraction of a quantum; E8M0 (a power of two, ties up) is rounded on the
  input's exponent bits; the E8M0 block scale choice (floor / rceil) and fp4/fp6 packing.
"""

from __future__ import annotations

import re
from functools import lru_cache

import ml_dtypes
import numpy as np

from . import _codec_exact as _exact
from ._codec_exact import _as_exact_float, _rng, _table, nan_error, policy_checks  # noqa: F401  (re-exported)
from ._format_specs import FORMATS, FormatSpec, get
from .errors import FormatError, InputTypeError, ShapeError

# ml_dtypes rounds float64 once from 0.7 on (before, through float32: twice)
_ML_VERSION = tuple(int(p) for p in re.findall(r"\d+", ml_dtypes.__version__)[:2])
_F64_ONCE = _ML_VERSION >= (0, 7)
_UINT = {4: np.uint32, 8: np.uint64}


def _fast(spec: FormatSpec) -> bool:
    """Formats with a fast path: an ml_dtypes/numpy type of at most 16 bits (fp32 and tf32 stay exact)."""
    return spec.dtype is not None and spec.bits <= 16


# ---- rounding at ml_dtypes speed -----------------------------------------------------------------
def _round_to_odd_f32(x64: np.ndarray) -> np.ndarray:
    """float64 -> float32, rounded to odd: toward zero, then the last bit set where the value was inexact.
    Beyond float32's range this gives ±max float32, above every target's rounding threshold but fp32's."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = x64.astype(np.float32)
        back = f.astype(np.float64)
    bits = f.view(np.uint32)
    bits -= (np.abs(back) > np.abs(x64)).astype(np.uint32)  # rounded away from zero: one step back
    bits |= (back != x64).astype(np.uint32)
    return f


def _cast(spec: FormatSpec, xa: np.ndarray) -> np.ndarray:
    """ml_dtypes' round-to-nearest-even codes of the float32/float64 array ``xa`` (NaN/inf codes for
    overflow, or ±max where the format has neither)."""
    if xa.dtype == np.float64 and not _F64_ONCE:
        xa = _round_to_odd_f32(xa)
    with np.errstate(over="ignore", invalid="ignore"):
        return xa.astype(spec.dtype).view(spec.code_dtype)


def _pow2_codes(spec: FormatSpec, xa: np.ndarray, rounding: str) -> np.ndarray:
    """Codes of a power-of-two format (no mantissa bits, no subnormals: E8M0) from the exponent bits of
    ``xa`` (1-D): rtz keeps the exponent, rne adds half a binade (ties, 1.5 * 2^e, go up to the even
    significand 2 * 2^e).  Zero, negative, non-finite and overflowing inputs get the NaN code."""
    nbits = 8 * xa.dtype.itemsize
    mb = 52 if nbits == 64 else 23
    src_bias = 1023 if nbits == 64 else 127
    b = xa.view(_UINT[xa.dtype.itemsize])
    mag = b & b.dtype.type((1 << (nbits - 1)) - 1)
    half = 0 if rounding == "rtz" else 1 << (mb - 1)
    e = ((mag + b.dtype.type(half)) >> b.dtype.type(mb)).astype(np.int64) - (src_bias - spec.bias)
    if nbits == 32:  # float32 subnormals: the exponent field does not give their binade; use float64's
        sub = mag < (1 << mb)
        if sub.any():
            e[sub] = _pow2_codes(spec, xa[sub].astype(np.float64), rounding)
    inf_bits = ((1 << (nbits - 1 - mb)) - 1) << mb
    bad = (b >> b.dtype.type(nbits - 1)).astype(bool) | (mag == 0) | (mag >= inf_bits) | (e > spec.max_magcode)
    codes = np.clip(e, 0, spec.max_magcode).astype(spec.code_dtype)
    codes[bad] = spec.nan_code
    return codes


def _special(spec: FormatSpec, c: np.ndarray):
    """Where codes ``c`` are NaN or inf codes (ml_dtypes' answer for non-finite input and overflow), or None
    for a format with neither."""
    if not spec.has_nan:
        return None
    if spec.specials == "fnuz":
        return c == spec.nan_code
    if spec.signed:
        return (c & c.dtype.type((1 << (spec.bits - 1)) - 1)) > spec.max_magcode
    return c > spec.max_magcode


@lru_cache(maxsize=None)
def _abs_table(name: str, dtype: str) -> np.ndarray:
    """|value| of every code, in ``dtype`` (exact: every value here is a float32)."""
    t = np.abs(_table(name)).astype(dtype)
    t.setflags(write=False)
    return t


@lru_cache(maxsize=None)
def _quantum(name: str) -> np.ndarray:
    """The spacing above each magnitude code up to max_magcode (the quantum at its exponent), float64."""
    spec = FORMATS[name]
    c = np.arange(spec.max_magcode + 1)
    e = np.maximum((c >> spec.mbits) - spec.bias, spec.emin)
    q = np.ldexp(1.0, e - spec.mbits)
    q.setflags(write=False)
    return q


def _nearest(spec: FormatSpec, xa: np.ndarray, rounding: str):
    """(codes, redo) of 1-D ``xa`` rounded by ``rounding`` ("rne" or "rtz"): the codes are final except
    where ``redo`` is set (None: nowhere), the elements the exact codec decides: NaN/inf codes (ml_dtypes'
    answer for non-finite input and for overflow) and NaN inputs of a format without NaN (ml_dtypes makes
    them zeros)."""
    if spec.mbits == 0:
        c = _pow2_codes(spec, xa, rounding)
    else:
        c = _cast(spec, xa)
    redo = _special(spec, c) if spec.has_nan else np.isnan(xa)
    if rounding == "rtz" and spec.mbits:  # one code toward zero where the nearest lies above the input
        c -= (_abs_table(spec.name, xa.dtype.str)[c] > np.abs(xa)).astype(c.dtype)
        if spec.specials == "fnuz":
            c[c == spec.nan_code] = 0  # -min_subnormal stepped to -0, which fnuz spells +0 (NaN codes: redone)
    return c, (redo if redo.any() else None)


def _stochastic_magcodes(spec: FormatSpec, a: np.ndarray, u: np.ndarray):
    """(magcode, over) of finite magnitudes ``a`` (float64) rounded stochastically with draws ``u``, as the
    exact codec's exponent-unbounded extension gives them: the rtz code (clamped to max_magcode, so a value
    a quantum or more above it always rounds up, into overflow), plus one where ``u`` is below the fraction
    of a quantum ``a`` lies above it (exact: Sterbenz, and a power-of-two divisor)."""
    if spec.mbits == 0:
        b = a.view(np.uint64)
        c = np.clip((b >> np.uint64(52)).astype(np.int64) - (1023 - spec.bias), 0, spec.max_magcode)
    else:
        c = _cast(spec, a).astype(np.int64)
        c = np.minimum(c, spec.max_magcode)  # overflow codes: the largest finite magnitude
        c -= _abs_table(spec.name, "<f8")[c] > a
    with np.errstate(over="ignore"):  # far above max_normal: frac = inf, always up, into overflow
        frac = (a - _abs_table(spec.name, "<f8")[c]) / _quantum(spec.name)[c]
    magcode = c + (u < frac)
    return magcode, magcode > spec.max_magcode


# ---- encode / round_to ---------------------------------------------------------------------------
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
    xa = _as_exact_float(x)
    if not _fast(spec):
        return _exact.encode(xa, spec, rounding=rounding, overflow=overflow, nan=nan, rng=rng)
    shape, flat = xa.shape, xa.reshape(-1)
    if rounding == "stochastic":
        x64 = _exact._as_float64(flat)
        u = _rng(rng).random(x64.shape)  # the exact codec's draws, in its order
        a = np.where(np.isfinite(x64), np.abs(x64), 0.0)
        magcode, over = _stochastic_magcodes(spec, a, u)
        codes = _exact._encode_finish(spec, x64, magcode, over, rounding, overflow, nan)
    else:
        codes, redo = _nearest(spec, flat, rounding)
        if redo is not None:
            codes[redo] = _exact.encode(flat[redo], spec, rounding=rounding, overflow=overflow, nan=nan)
    return _layout_of(xa, codes.reshape(shape))


def round_to(x, fmt, *, rounding: str = "rne", overflow: str = "saturate", nan: str = "raise",
             rng=None) -> np.ndarray:
    """Quantize-dequantize ``x`` to ``fmt`` (any format here, fp16 / bf16 / tf32 / fp32 included) with one
    exact rounding from the input value; returns float64.  Same rules as :func:`encode`;
    ``nan="propagate"`` also returns NaN for NaN inputs in formats without NaN."""
    spec = get(fmt)
    policy_checks(rounding, overflow, nan, _exact._NAN_POLICIES + ("propagate",))
    xa = _as_exact_float(x)
    if not _fast(spec):
        return _exact.round_to(xa, spec, rounding=rounding, overflow=overflow, nan=nan, rng=rng)
    shape, flat = xa.shape, xa.reshape(-1)
    if rounding == "stochastic":
        x64 = _exact._as_float64(flat)
        u = _rng(rng).random(x64.shape)
        a = np.where(np.isfinite(x64), np.abs(x64), 0.0)
        magcode, over = _stochastic_magcodes(spec, a, u)
        mag = _abs_table(spec.name, "<f8")[np.minimum(magcode, spec.max_magcode)]
        out = _exact._round_to_finish(spec, x64, mag, over, rounding, overflow, nan)
    else:
        codes, redo = _nearest(spec, flat, rounding)
        out = _table(spec.name)[codes]
        if redo is not None:
            out[redo] = _exact.round_to(flat[redo], spec, rounding=rounding, overflow=overflow, nan=nan)
    return _layout_of(xa, out.reshape(shape))


def _layout_of(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out`` (C order) in ``x``'s memory order where ``x`` is column-major: a Fortran-ordered operand stays one
    (a backend reads either major without a transpose)."""
    if x.ndim >= 2 and x.flags.f_contiguous and not x.flags.c_contiguous:
        return np.asfortranarray(out)
    return out


# ---- decoding ------------------------------------------------------------------------------------
def _as_codes(codes, spec: FormatSpec) -> np.ndarray:
    """Valid integer codes of ``spec`` (uint8 codes of an 8-bit format need no check)."""
    c = np.asarray(codes)
    if spec.dtype is not None and c.dtype == np.dtype(spec.dtype) and c.dtype.kind == "V":
        return c.view(np.uint8)
    if c.dtype == np.uint8 and spec.bits == 8:
        return c
    if c.dtype == np.uint8 and spec.bits < 8 and (c.size == 0 or int(c.max()) >> spec.bits == 0):
        return c
    return _exact._as_codes(c, spec)


@lru_cache(maxsize=None)
def _table_as(name: str, dtype: str) -> np.ndarray:
    with np.errstate(over="ignore"):
        t = _table(name).astype(dtype)
    t.setflags(write=False)
    return t


def decode(codes, fmt, *, dtype=np.float32) -> np.ndarray:
    """Values of ``codes`` (integers, or an ml_dtypes array of the format) as float32 (exact for every
    format here); ``dtype=np.float64`` on request.  Invalid codes raise FormatError."""
    spec = get(fmt)
    c = _as_codes(codes, spec)
    if spec.bits > 16:
        return _exact._decode64(c.astype(np.int64), spec).astype(dtype)
    dt = np.dtype(dtype)
    if dt.kind != "f":  # what astype does to NaN (a warning, a garbage integer) only where codes ask for it
        return _table(spec.name)[c].astype(dt)
    return _table_as(spec.name, dt.str)[c]


# ---- MX blocks and per-tensor scales (mxcore.mx's host path) -------------------------------------
def as_float(x, what: str = "x") -> np.ndarray:
    """``x`` as a native float32 or float64 array holding exactly its values (InputTypeError otherwise)."""
    return _as_exact_float(x, what)


def _abs_bits(xa: np.ndarray) -> np.ndarray:
    """The bits of ``|xa|`` as unsigned integers: ordered as the magnitudes, NaN above inf."""
    ui = _UINT[xa.dtype.itemsize]
    return xa.view(ui) & ui((1 << (8 * xa.dtype.itemsize - 1)) - 1)


def _inf_bits(dtype) -> int:
    return int(np.array(np.inf, dtype).view(_UINT[np.dtype(dtype).itemsize]))


def _saturate(spec: FormatSpec, codes: np.ndarray, scaled: np.ndarray) -> None:
    """Saturate in place the codes ml_dtypes overflowed to NaN/inf (``scaled``: finite, same flat order)."""
    sp = _special(spec, codes)
    if sp is not None:
        idx = np.flatnonzero(sp)  # few: indexing by position beats two boolean masks over the array
        if idx.size:
            codes[idx] = _exact.encode(scaled[idx], spec, rounding="rne", overflow="saturate")


def _block_exponents(amax_bits: np.ndarray, dtype, spec: FormatSpec, rceil: bool) -> np.ndarray:
    """:func:`mxcore._codec_exact.mx_exponents` of the finite amax whose float32/float64 bits are ``amax_bits``,
    read off the bits for normal amax: floor(log2(amax)) is the exponent field; amax / max_normal needs one
    binade more where amax's significand exceeds max_normal's.  Zero and subnormal amax take the exact path."""
    mb = 52 if np.dtype(dtype).itemsize == 8 else 23
    bias = 1023 if mb == 52 else 127
    e = (amax_bits >> amax_bits.dtype.type(mb)).astype(np.int64) - bias
    if rceil:
        frac_max = int(np.ldexp(spec.max_normal, mb - spec.emax)) - (1 << mb)  # max_normal's significand bits
        e = e - spec.emax + ((amax_bits & amax_bits.dtype.type((1 << mb) - 1)) > frac_max)
    else:
        e = e - spec.emax
    exp = np.clip(e, -_exact.E8M0_BIAS, _exact.E8M0_BIAS)
    small = amax_bits < (1 << mb)
    if small.any():
        exp[small] = _exact.mx_exponents(amax_bits[small].view(dtype).astype(np.float64), spec, rceil)
    return exp


def quantize_mx(xa: np.ndarray, spec: FormatSpec, *, axis: int, block: int, rceil: bool):
    """(codes, scales) of float32/float64 ``xa`` in MX format with element ``spec``, blocks of ``block``
    along ``axis`` (non-negative); the rules are :mod:`mxcore.mx`'s, the result that of
    :func:`mxcore._codec_exact.quantize_mx` bit for bit."""
    k = xa.shape[axis]
    nblocks = -(-k // block)
    xt = np.moveaxis(xa, axis, -1)
    lead = xt.shape[:-1]
    pad = nblocks * block - k
    if pad:
        xt = np.concatenate([xt, np.zeros(lead + (pad,), xa.dtype)], axis=-1)
    xb = np.ascontiguousarray(xt).reshape(lead + (nblocks, block))
    # the blocks' amax from the magnitude bits: one integer max, NaN and inf above every finite value
    mag = _abs_bits(xb)
    amax_bits = mag.max(axis=-1, initial=0)
    bad = amax_bits >= _inf_bits(xa.dtype)
    exp = _block_exponents(np.where(bad, 0, amax_bits), xa.dtype, spec, rceil)
    scales = np.where(bad, _exact.E8M0_NAN, exp + _exact.E8M0_BIAS).astype(np.uint8)
    # x / 2^exp: exact (see the module doc for products below 2^-126); written over the bits buffer
    factor = np.ldexp(np.ones((), xa.dtype), np.where(bad, 0, -exp))[..., None].astype(xa.dtype)
    scaled = mag.view(xa.dtype)
    with np.errstate(under="ignore", invalid="ignore"):
        np.multiply(xb, factor, out=scaled)
    flat = scaled.reshape(-1)
    codes = _cast(spec, flat)
    if bad.any():  # a NaN or inf block: element codes 0 (so none of them is saturated below)
        codes.reshape(lead + (nblocks, block))[bad] = 0
    _saturate(spec, codes, flat)
    codes = codes.reshape(lead + (nblocks * block,))
    if pad:
        codes = codes[..., :k]
    return (np.ascontiguousarray(np.moveaxis(codes, -1, axis)),
            np.ascontiguousarray(np.moveaxis(scales, -1, axis)))


def finite_amax(xa: np.ndarray) -> float:
    """The largest finite magnitude of float32/float64 ``xa`` (0 when there is none)."""
    if xa.size == 0:
        return 0.0
    hi, lo = float(xa.max()), float(xa.min())
    if np.isfinite(hi) and np.isfinite(lo):
        return max(hi, -lo) + 0.0  # +0.0: no -0 for an all-zero tensor
    mag = _abs_bits(xa)
    return float(np.max(mag[mag < _inf_bits(xa.dtype)], initial=0).view(xa.dtype)) if mag.size else 0.0


def encode_scaled(xa: np.ndarray, spec: FormatSpec, k: int) -> np.ndarray:
    """Per-tensor codes of ``xa / 2^k`` (as :func:`mxcore._codec_exact.encode_scaled`): finite values
    rounded once and saturated; NaN to the format's NaN (FormatError where it has none), ±inf to inf or
    NaN (saturated where the format has neither)."""
    flat = xa.reshape(-1)
    with np.errstate(under="ignore", invalid="ignore"):
        scaled = flat * np.ldexp(np.ones((), xa.dtype), -k).astype(xa.dtype)
    codes = _cast(spec, scaled)
    redo = _special(spec, codes) if spec.has_nan else ~np.isfinite(flat)
    if redo.any():
        codes[redo] = _exact.encode_scaled(flat[redo], spec, k)
    return _layout_of(xa, codes.reshape(xa.shape))


@lru_cache(maxsize=None)
def _e8m0_values(dtype: str) -> np.ndarray:
    return _table_as("e8m0", dtype)


def dequantize_mx(codes, scales, spec: FormatSpec, *, axis: int, block: int, dtype=np.float32) -> np.ndarray:
    """Values of valid MX codes (uint8) and E8M0 scales, rounded once to ``dtype``.  Every product of an
    element and a scale is a float32 (4 significant bits at most, magnitudes 2^-144 and up) or overflows it,
    so float32 arithmetic rounds once to float32 / float16; wider or other dtypes go through float64."""
    dtype = np.dtype(dtype)
    work = "<f4" if dtype in (np.float32, np.float16) else "<f8"
    vals = _table_as(spec.name, work)[codes]
    sc = _e8m0_values(work)[scales]
    k = vals.shape[axis]
    with np.errstate(over="ignore", invalid="ignore"):
        if k % block == 0:
            shape = vals.shape
            blocks = vals.reshape(shape[:axis] + (k // block, block) + shape[axis + 1:])
            np.multiply(blocks, np.expand_dims(sc, axis + 1), out=blocks)
        else:
            np.multiply(vals, np.take(sc, np.arange(k) // block, axis=axis), out=vals)
        return vals if vals.dtype == dtype else vals.astype(dtype)


def dequantize_tensor(codes, spec: FormatSpec, scale_exp: int, dtype=np.float32) -> np.ndarray:
    """Values of valid per-tensor codes (uint8) times ``2^scale_exp``, rounded once to ``dtype`` (float32
    arithmetic where the scale is a float32: a correctly rounded product of exact factors)."""
    dtype = np.dtype(dtype)
    f32 = dtype in (np.float32, np.float16) and -149 <= scale_exp <= 127
    work = "<f4" if f32 else "<f8"
    vals = _table_as(spec.name, work)[codes]
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        vals *= np.ldexp(np.ones((), work), scale_exp)
        return vals if vals.dtype == dtype else vals.astype(dtype)

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
