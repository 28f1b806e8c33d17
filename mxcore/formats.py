"""Bit-exact reference codecs for the low-precision number formats matrix cores read.

One frozen :class:`FormatSpec` per format describes it as data (exponent and mantissa widths, bias,
sign, subnormals, and which codes are special); :func:`encode`, :func:`decode` and :func:`round_to`
are generic over the spec: no code path asks a format's name.

==========  ====  ======  ====  ===========  ===========  ============  =============  =====================
format      bits  layout  bias  max normal   min normal   min subnorm.  inf / NaN      ml_dtypes
==========  ====  ======  ====  ===========  ===========  ============  =============  =====================
e4m3fn      8     S4.3    7     448          2^-6         2^-9          - / S.1111.111 float8_e4m3fn
e4m3fnuz    8     S4.3    8     240          2^-7         2^-10         - / 0x80       float8_e4m3fnuz
e5m2        8     S5.2    15    57344        2^-14        2^-16         IEEE           float8_e5m2
e5m2fnuz    8     S5.2    16    57344        2^-15        2^-17         - / 0x80       float8_e5m2fnuz
e2m3        6     S2.3    1     7.5          1            0.125         - / -          float6_e2m3fn
e3m2        6     S3.2    3     28           0.25         0.0625        - / -          float6_e3m2fn
e2m1        4     S2.1    1     6            1            0.5           - / -          float4_e2m1fn
e8m0        8     8.0     127   2^127        2^-127       (none)        - / 0xFF       float8_e8m0fnu
fp16        16    S5.10   15    65504        2^-14        2^-24         IEEE           float16
bf16        16    S8.7    127   ~3.39e38     2^-126       2^-133        IEEE           bfloat16
tf32        19    S8.10   127   ~3.40e38     2^-126       2^-136        IEEE           (none)
fp32        32    S8.23   127   ~3.40e38     2^-126       2^-149        IEEE           float32
==========  ====  ======  ====  ===========  ===========  ============  =============  =====================

Conversion rules (every one is tested in ``tests/test_formats.py``):

* **One rounding from the input value.**  Inputs are taken to float64 exactly (float16/32, bfloat16 and
  the other ml_dtypes types all embed exactly) and rounded once, by a generic exact algorithm: scale
  by the power-of-two quantum at the value's exponent (``ldexp``, exact), round to an integer, rescale.
  Nothing passes through float32 on the way, so a float64 input just above an fp8 midpoint rounds up
  even where float32 would have rounded it *onto* the midpoint (ml_dtypes' float64 ``astype`` does
  round twice).
* **Rounding modes.**  ``"rne"``: to nearest, ties to the even significand (at every midpoint,
  subnormals included; for every format with mantissa bits that is the even code.  E8M0 has no
  mantissa bits: its ties, ``1.5 * 2^e``, go to ``2^(e+1)``, the even significand, as in ml_dtypes).
  ``"rtz"``: toward zero.  ``"stochastic"``: up with probability equal to the fraction of a quantum
  the value lies above the lower neighbour, so the expected result is the input (pass ``rng``, a
  ``numpy.random.Generator`` or a seed).
* **Overflow** (a rounded magnitude above ``max_normal``):
  ``overflow="saturate"`` (default) gives ``±max_normal``, and applies to ±inf inputs as well
  (OCP FP8 saturation mode, PTX ``cvt.satfinite``); ``overflow="nan"`` follows the format's IEEE-like
  rule, as ml_dtypes' ``astype`` does: inf where the format has inf (e5m2), NaN where it has only NaN
  (e4m3fn, the FNUZ formats, e8m0).  Under ``rounding="rtz"`` IEEE 754 gives ``±max_normal`` for
  finite overflow in either mode (only an infinite input stays infinite).  e2m1, e2m3 and e3m2 have
  neither inf nor NaN: finite and infinite overflow always saturate (OCP MX v1.0 §5.3, ml_dtypes).
* **NaN.**  Signed formats with NaN keep the NaN's sign: e4m3fn NaN → 0x7F / 0xFF, e5m2 → 0x7E /
  0xFE (quiet NaN).  FNUZ formats have one NaN, 0x80.  e2m1, e2m3, e3m2 have no NaN: ``nan="raise"``
  (default) raises :class:`~mxcore.errors.FormatError`; ``nan="zero"`` encodes NaN as +0 (code 0).
  (ml_dtypes silently turns NaN into ±0 there.)  :func:`round_to` also takes ``nan="propagate"``.
* **Zero.**  FNUZ formats have no −0: −0 and negative values that round to zero encode to 0x00.
  The other signed formats keep −0 (0x80, or 0x8 / 0x20 for fp4 / fp6).
* **E8M0** (the MX scale): unsigned, no zero, no subnormals; code c is ``2^(c-127)`` (0x00 is
  2^-127), 0xFF is NaN.  A non-power of two rounds per the rounding mode on its value (``"rne"``:
  nearest power of two, ``1.5 * 2^e`` → ``2^(e+1)``).  Positive values below 2^-127 encode to 0x00
  (there is no zero to round to, in every rounding mode).  Zero, negative values and −inf encode to
  NaN (0xFF), as ml_dtypes does.
* **Canonical codes.**  :func:`encode` returns one canonical code per value; ``encode(decode(c)) == c``
  for every code except the extra NaN payloads of e5m2 (0x7D, 0x7F, 0xFD, 0xFF re-encode to the
  quiet NaN 0x7E / 0xFE) and of the wide IEEE formats.  e4m3fn, e4m3fnuz, e5m2fnuz, e2m1, e2m3,
  e3m2 and e8m0 have no non-canonical codes.
* **Decoding** takes integer codes (or an ml_dtypes array of the same format) and returns float32
  (every value of every format here is exactly a float32).  A code outside ``[0, 2^bits)``, such as a
  byte above 0x0F for fp4, raises :class:`~mxcore.errors.FormatError`.
* **Packing**: :func:`pack_fp4` puts two e2m1 codes in a byte, the even element in the low nibble;
  :func:`pack_fp6` puts four 6-bit codes in three bytes, LSB first: value ``i`` of a group occupies bits
  ``[6i, 6i+6)`` of the little-endian 24-bit group (byte 0 = v0 | v1<<6, byte 1 = v1>>2 | v2<<4,
  byte 2 = v2>>4 | v3<<2); the order AMD's rocRoller reads fp6 buffers in (``getFp6``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from functools import lru_cache

import ml_dtypes
import numpy as np

from .errors import FormatError, InputTypeError, ShapeError, UnknownNameError

__all__ = [
    "FORMATS",
    "FormatSpec",
    "ROUNDINGS",
    "decode",
    "encode",
    "get",
    "names",
    "pack_fp4",
    "pack_fp6",
    "round_to",
    "unpack_fp4",
    "unpack_fp6",
]

ROUNDINGS = ("rne", "rtz", "stochastic")
_OVERFLOWS = ("saturate", "nan")
_NAN_POLICIES = ("raise", "zero")

# Special-value schemes, as data:
#   "ieee": exponent field all ones is inf (mantissa 0) or NaN (mantissa != 0)
#   "fn":   only the all-ones magnitude is NaN (both signs); no inf          (e4m3fn, e8m0)
#   "fnuz": the negative-zero code (sign bit alone) is the only NaN; no inf, no -0
#   "none": every code is a finite number                                   (e2m1, e2m3, e3m2)
_SPECIALS = ("ieee", "fn", "fnuz", "none")


@dataclass(frozen=True)
class FormatSpec:
    """One number format, as data.  Construct via the module table; look up with :func:`get`.

    Given: ``name``, ``ebits``, ``mbits``, ``bias``, ``specials`` (``"ieee"``, ``"fn"``, ``"fnuz"`` or
    ``"none"``, see the module source), ``signed``, ``subnormals`` (exponent field 0 holds subnormals
    and zero; when False, as in e8m0, field 0 is an ordinary exponent and there is no zero),
    ``dtype`` (the ml_dtypes / numpy scalar type, or None), ``aliases``, ``title``.

    Derived: ``bits``, ``emin`` / ``emax`` (unbiased exponents of min / max normal), ``max_normal``,
    ``min_normal``, ``min_subnormal`` (equals ``min_normal`` without subnormals), ``has_inf``,
    ``has_nan``, ``has_zero``, ``has_negative_zero``, ``nan_codes`` (every NaN code for formats of at
    most 8 bits; wider formats list only their canonical quiet NaNs), ``inf_codes``, ``nan_code``
    (canonical positive NaN or None), ``max_code`` (code of +max_normal), ``max_magcode`` (the
    largest finite magnitude code).
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    specials: str
    signed: bool = True
    subnormals: bool = True
    dtype: type | None = None
    aliases: tuple[str, ...] = ()
    title: str = ""
    bits: int = field(init=False)
    emin: int = field(init=False)
    emax: int = field(init=False)
    max_normal: float = field(init=False)
    min_normal: float = field(init=False)
    min_subnormal: float = field(init=False)
    has_inf: bool = field(init=False)
    has_nan: bool = field(init=False)
    has_zero: bool = field(init=False)
    has_negative_zero: bool = field(init=False)
    nan_code: int | None = field(init=False)
    nan_codes: tuple[int, ...] = field(init=False)
    inf_codes: tuple[int, ...] = field(init=False)
    max_code: int = field(init=False)
    max_magcode: int = field(init=False)

    def __post_init__(self):
        if self.specials not in _SPECIALS:
            raise FormatError(f"format {self.name}: specials={self.specials!r}; use one of {_SPECIALS}")
        put = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        bits = int(self.signed) + self.ebits + self.mbits
        put("bits", bits)
        emin = 1 - self.bias if self.subnormals else -self.bias
        put("emin", emin)
        mag_bits = self.ebits + self.mbits
        all_ones = (1 << mag_bits) - 1
        exp_ones = ((1 << self.ebits) - 1) << self.mbits
        max_mag = {"ieee": exp_ones - 1, "fn": all_ones - 1, "fnuz": all_ones, "none": all_ones}[self.specials]
        put("max_magcode", max_mag)
        put("max_code", max_mag)
        field_max, mant_max = max_mag >> self.mbits, max_mag & ((1 << self.mbits) - 1)
        put("emax", field_max - self.bias)
        put("max_normal", float(np.ldexp(float((1 << self.mbits) + mant_max), field_max - self.bias - self.mbits)))
        put("min_normal", float(np.ldexp(1.0, emin)))
        put("min_subnormal", float(np.ldexp(1.0, emin - self.mbits)) if self.subnormals else float(np.ldexp(1.0, emin)))
        put("has_inf", self.specials == "ieee")
        put("has_nan", self.specials != "none")
        put("has_zero", self.subnormals)
        put("has_negative_zero", self.signed and self.subnormals and self.specials != "fnuz")
        sign = 1 << (bits - 1) if self.signed else 0
        if self.specials == "ieee":
            quiet = exp_ones | (1 << (self.mbits - 1))
            nan_code = quiet
            if bits <= 8:
                mags = [exp_ones | m for m in range(1, 1 << self.mbits)]
                nans = tuple(mags + [sign | m for m in mags])
            else:
                nans = (quiet, sign | quiet)
            infs = (exp_ones, sign | exp_ones)
        elif self.specials == "fn":
            nan_code = all_ones
            nans = (all_ones, sign | all_ones) if self.signed else (all_ones,)
            infs = ()
        elif self.specials == "fnuz":
            nan_code = sign
            nans, infs = (sign,), ()
        else:
            nan_code, nans, infs = None, (), ()
        put("nan_code", nan_code)
        put("nan_codes", nans)
        put("inf_codes", infs)

    # ---- presentation -------------------------------------------------------------------------
    @property
    def layout(self) -> str:
        """Bit layout from the most significant bit, e.g. ``SEEEEMMM`` (e4m3) or ``EEEEEEEE`` (e8m0)."""
        return ("S" if self.signed else "") + "E" * self.ebits + "M" * self.mbits

    @property
    def code_dtype(self) -> np.dtype:
        """The unsigned integer dtype :func:`encode` returns for this format."""
        return np.dtype(np.uint8 if self.bits <= 8 else np.uint16 if self.bits <= 16 else np.uint32)

    @property
    def negative_zero_code(self) -> int | None:
        return (1 << (self.bits - 1)) if self.has_negative_zero else None

    def __str__(self) -> str:
        return self.name


def _specs() -> dict[str, FormatSpec]:
    md = ml_dtypes
    table = [
        FormatSpec("e4m3fn", 4, 3, 7, "fn", dtype=md.float8_e4m3fn,
                   aliases=("fp8", "e4m3", "float8_e4m3fn", "f8e4m3fn"),
                   title="OCP FP8 E4M3 (no inf; NaN = S.1111.111)"),
        FormatSpec("e4m3fnuz", 4, 3, 8, "fnuz", dtype=md.float8_e4m3fnuz,
                   aliases=("float8_e4m3fnuz", "f8e4m3fnuz", "fp8_fnuz"),
                   title="FNUZ FP8 E4M3 (AMD CDNA3; no inf, no -0; NaN = 0x80)"),
        FormatSpec("e5m2", 5, 2, 15, "ieee", dtype=md.float8_e5m2,
                   aliases=("bf8", "float8_e5m2", "f8e5m2"),
                   title="OCP FP8 E5M2 (IEEE-like: inf and NaN)"),
        FormatSpec("e5m2fnuz", 5, 2, 16, "fnuz", dtype=md.float8_e5m2fnuz,
                   aliases=("float8_e5m2fnuz", "f8e5m2fnuz", "bf8_fnuz"),
                   title="FNUZ FP8 E5M2 (AMD CDNA3; no inf, no -0; NaN = 0x80)"),
        FormatSpec("e2m3", 2, 3, 1, "none", dtype=md.float6_e2m3fn,
                   aliases=("fp6", "float6_e2m3fn", "e2m3fn", "fp6_e2m3"),
                   title="OCP MX FP6 E2M3 (no inf, no NaN)"),
        FormatSpec("e3m2", 3, 2, 3, "none", dtype=md.float6_e3m2fn,
                   aliases=("float6_e3m2fn", "e3m2fn", "fp6_e3m2"),
                   title="OCP MX FP6 E3M2 (no inf, no NaN)"),
        FormatSpec("e2m1", 2, 1, 1, "none", dtype=md.float4_e2m1fn,
                   aliases=("fp4", "float4_e2m1fn", "e2m1fn", "fp4_e2m1"),
                   title="OCP MX FP4 E2M1 (no inf, no NaN)"),
        FormatSpec("e8m0", 8, 0, 127, "fn", signed=False, subnormals=False, dtype=md.float8_e8m0fnu,
                   aliases=("ue8m0", "e8m0fnu", "float8_e8m0fnu"),
                   title="OCP MX scale E8M0 (unsigned powers of two; no zero; NaN = 0xFF)"),
        FormatSpec("fp16", 5, 10, 15, "ieee", dtype=np.float16,
                   aliases=("half", "float16", "f16", "binary16"), title="IEEE 754 binary16"),
        FormatSpec("bf16", 8, 7, 127, "ieee", dtype=md.bfloat16,
                   aliases=("bfloat16",), title="bfloat16 (float32 with 7 mantissa bits)"),
        FormatSpec("tf32", 8, 10, 127, "ieee", dtype=None,
                   aliases=("tensorfloat32", "tensorfloat-32"),
                   title="NVIDIA TensorFloat-32 (float32 range, 10 mantissa bits; a 19-bit value in a 32-bit word)"),
        FormatSpec("fp32", 8, 23, 127, "ieee", dtype=np.float32,
                   aliases=("float32", "f32", "single", "binary32", "float"), title="IEEE 754 binary32"),
    ]
    return {s.name: s for s in table}


FORMATS: dict[str, FormatSpec] = _specs()
_LOOKUP = {**{n: n for n in FORMATS}, **{a: s.name for s in FORMATS.values() for a in s.aliases}}
# names whose meaning depends on the target: CDNA3 (gfx940-942) reads fp8 bytes as FNUZ
_FNUZ_ARCHS = frozenset({"gfx940", "gfx941", "gfx942"})
_ARCH_ALIASES = {"fp8": "e4m3fnuz", "bf8": "e5m2fnuz"}


def names() -> list[str]:
    """Canonical format names, in table order."""
    return list(FORMATS)


def get(name, *, arch: str | None = None) -> FormatSpec:
    """The :class:`FormatSpec` for ``name`` (case-insensitive; aliases such as ``fp8``, ``e4m3``, ``fp4``,
    ``fp6``, ``bf8``, ``half``, ``bfloat16`` and the ml_dtypes names).  ``fp8`` / ``bf8`` mean the FNUZ
    formats when ``arch`` is gfx940-gfx942.  Also accepts a FormatSpec or an ml_dtypes/numpy dtype."""
    if isinstance(name, FormatSpec):
        return name
    if not isinstance(name, str):
        try:
            dt = np.dtype(name)
        except TypeError:
            dt = None
        for spec in FORMATS.values():
            if dt is not None and spec.dtype is not None and dt == np.dtype(spec.dtype):
                return spec
        raise UnknownNameError(f"format must be a name such as 'e4m3fn', got {name!r}; known: {', '.join(FORMATS)}")
    key = name.strip().lower()
    if arch in _FNUZ_ARCHS and key in _ARCH_ALIASES:
        key = _ARCH_ALIASES[key]
    if key not in _LOOKUP:
        aliases = sorted(a for a in _LOOKUP if a not in FORMATS)
        raise UnknownNameError(f"unknown number format {name!r}; formats: {', '.join(FORMATS)}; "
                               f"aliases: {', '.join(aliases)}")
    return FORMATS[_LOOKUP[key]]


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


# ---- the reference table (python -m mxcore formats) ----------------------------------------------
def _exact(v: float) -> str:
    """Exact text for a dyadic value: '448 = 1.75 x 2^8', '2^-9 (0.001953125)', '2^127 (~1.70141e+38)'."""
    if v == 0:
        return "0"
    f, e = np.frexp(abs(v))
    mant, exp = float(f) * 2, int(e) - 1
    sgn = "-" if v < 0 else ""
    pow_txt = f"{sgn}2^{exp}" if mant == 1.0 else f"{sgn}{mant!r} x 2^{exp}"
    dec = repr(float(v))
    dec = dec[:-2] if dec.endswith(".0") else dec
    if "e" not in dec and len(dec.lstrip("-").replace(".", "").lstrip("0")) <= 15:  # repr is then exact
        return dec if dec == pow_txt or (mant == 1.0 and 0 <= exp < 4) else f"{dec} = {pow_txt}"
    return f"{pow_txt} (~{v:.6g})"


def _bits(code: int, spec: FormatSpec) -> str:
    b = format(code, f"0{spec.bits}b")
    parts = []
    i = 0
    if spec.signed:
        parts.append(b[0])
        i = 1
    parts.append(b[i:i + spec.ebits])
    if spec.mbits:
        parts.append(b[i + spec.ebits:])
    return " ".join(parts)


def _hex(code: int, spec: FormatSpec) -> str:
    return f"0x{code:0{(spec.bits + 3) // 4}X}"


def _codes_text(codes, spec: FormatSpec) -> str:
    if not codes:
        return "none"
    return ", ".join(_hex(c, spec) for c in codes)


def _nan_text(spec: FormatSpec) -> str:
    if not spec.has_nan:
        return "none (encode raises on NaN by default; nan='zero' gives +0)"
    if spec.specials == "ieee":
        return (f"exponent all ones, mantissa != 0 ({len(spec.nan_codes) if spec.bits <= 8 else 'many'} codes); "
                f"encode gives {_hex(spec.nan_code, spec)}"
                + (f" / {_hex(spec.nan_code | (1 << (spec.bits - 1)), spec)}" if spec.signed else ""))
    return _codes_text(spec.nan_codes, spec)


def _describe(spec: FormatSpec) -> list[str]:
    max_txt = _exact(spec.max_normal)
    rows = [
        ("bits", f"{spec.bits}   layout {spec.layout}  ({int(spec.signed)} sign, {spec.ebits} exponent, "
                 f"{spec.mbits} mantissa)"),
        ("exponent bias", str(spec.bias)),
        ("max normal", f"{max_txt}   code {_hex(spec.max_code, spec)}"),
        ("min normal", f"{_exact(spec.min_normal)}   code {_hex((1 << spec.mbits) if spec.subnormals else 0, spec)}"),
        ("min subnormal", f"{_exact(spec.min_subnormal)}   code {_hex(1, spec)}" if spec.subnormals
         else "none (no subnormals)"),
        ("zero", ("+0 " + _hex(0, spec) + (f", -0 {_hex(spec.negative_zero_code, spec)}" if spec.has_negative_zero
                                         else ", no -0 (-0 encodes to +0)" if spec.signed else ""))
         if spec.has_zero else "none (values below min normal encode to the smallest code)"),
        ("inf", _codes_text(spec.inf_codes, spec) if spec.has_inf else "none"),
        ("NaN", _nan_text(spec)),
        ("overflow", f"overflow='saturate' -> {'+-' if spec.signed else ''}{max_txt.split(' ')[0]} (inf too); "
                     "overflow='nan' -> "
                       + ("inf" if spec.has_inf else "NaN" if spec.has_nan else "saturates too (no inf/NaN)")),
        ("ml_dtypes", np.dtype(spec.dtype).name if spec.dtype is not None else "none"),
        ("aliases", ", ".join(spec.aliases) or "-"),
    ]
    out = [f"{spec.name}: {spec.title}"]
    out += [f"  {k:<14s} {v}" for k, v in rows]
    return out


def _class(spec: FormatSpec, code: int, v: float) -> str:
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "inf"
    if v == 0:
        return "zero"
    mag = code & ((1 << (spec.ebits + spec.mbits)) - 1)
    if spec.subnormals and (mag >> spec.mbits) == 0:
        return "subnormal"
    return "normal"


def _table_lines(spec: FormatSpec) -> list[str]:
    vals = _table(spec.name)
    bw = len(_bits(0, spec))
    lines = [f"{'code':>6s}  {'bits':<{bw}s}  {'class':<9s}  {'value':>22s}  exact"]
    lines.append("-" * len(lines[0]) + "-" * 12)
    for code in range(1 << spec.bits):
        v = float(vals[code])
        cls = _class(spec, code, v)
        if cls in ("NaN", "inf"):
            vtxt = ("-" if np.signbit(v) and spec.specials != "fnuz" else "+") + ("NaN" if cls == "NaN" else "inf")
            exact = ""
        else:
            vtxt = repr(v) if v != 0 else ("-0.0" if np.signbit(v) else "0.0")
            f, e = np.frexp(abs(v))
            if v == 0:
                exact = ""
            elif cls == "subnormal":
                q = spec.emin - spec.mbits
                exact = f"{'-' if v < 0 else ''}{int(abs(v) / np.ldexp(1.0, q))} x 2^{q}"
            else:
                mant = repr(float(f) * 2).removesuffix(".0")
                exact = f"{'-' if v < 0 else ''}{mant} x 2^{int(e) - 1}"
        lines.append(f"{_hex(code, spec):>6s}  {_bits(code, spec):<{bw}s}  {cls:<9s}  {vtxt:>22s}  {exact}")
    return lines


def _summary() -> list[str]:
    head = (f"{'format':<9s} {'bits':>4s} {'S.E.M':<7s} {'bias':>4s} {'max normal':>13s} {'min normal':>11s} "
            f"{'min subnorm':>11s} {'inf':>4s} {'NaN':<14s} {'-0':>3s}  ml_dtypes")
    lines = [head, "-" * len(head)]
    for s in FORMATS.values():
        nan = ("IEEE" if s.specials == "ieee" else _codes_text(s.nan_codes, s)) if s.has_nan else "-"
        sub = f"2^{int(np.frexp(s.min_subnormal)[1]) - 1}" if s.subnormals else "-"
        mx = f"{s.max_normal:.6g}" if s.max_normal < 1e6 else f"{s.max_normal:.4g}"
        lines.append(
            f"{s.name:<9s} {s.bits:>4d} {f'{int(s.signed)}.{s.ebits}.{s.mbits}':<7s} {s.bias:>4d} {mx:>13s} "
            f"{'2^' + str(s.emin):>11s} {sub:>11s} {'yes' if s.has_inf else '-':>4s} {nan:<14s} "
            f"{'yes' if s.has_negative_zero else '-':>3s}  {np.dtype(s.dtype).name if s.dtype is not None else '-'}")
    return lines


def _cli(argv: list[str]) -> int:
    """``python -m mxcore formats [NAME] [--table]``."""
    argv = list(argv)
    if argv[:1] == ["formats"]:
        argv = argv[1:]
    p = argparse.ArgumentParser(prog="python -m mxcore formats",
                                description="number-format properties and, with --table, every code and its value")
    p.add_argument("name", nargs="?", help="a format or alias (e4m3fn, fp8, e5m2, e2m1, e8m0, ...); default: all")
    p.add_argument("--table", action="store_true",
                   help="list every code with its bits and value (formats of <= 8 bits)")
    args = p.parse_args(argv)
    specs = [get(args.name)] if args.name else list(FORMATS.values())
    out: list[str] = []
    if not args.name:
        out += _summary() + [""]
    for spec in specs:
        out += _describe(spec)
        if args.table:
            if spec.bits <= 8:
                out += ["", f"  all {1 << spec.bits} codes of {spec.name} (bits: "
                            f"{'sign exponent mantissa' if spec.signed else 'exponent'}):"]
                out += ["  " + line for line in _table_lines(spec)]
            else:
                out.append(f"  (no code table for a {spec.bits}-bit format: {1 << spec.bits} codes)")
        out.append("")
    print("\n".join(out).rstrip("\n"))
    return 0
