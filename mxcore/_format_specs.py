"""The number-format table: one frozen :class:`FormatSpec` per format, as data, and name lookup.

Public through :mod:`mxcore.formats` (``FORMATS``, ``FormatSpec``, ``get``, ``names``); the rules the
codecs follow are described there.  The device codec kernels receive their constants from these specs
(``backends/codec_runtime.py`` turns a spec into ``-D`` defines), so nothing here is re-typed in C++.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from .errors import FormatError, UnknownNameError

ROUNDINGS = ("rne", "rtz", "stochastic")
_OVERFLOWS = ("saturate", "nan")
_NAN_POLICIES = ("raise", "zero")

# Special-value schemes, as data:
#   "ieee": exponent field all ones is inf (mantissa 0) or NaN (mantissa != 0)
#   "fn":   only the all-ones magnitude is NaN (both signs); no inf          (e4m3fn, e8m0)
#   "fnuz": the negative-zero code (sign bit alone) is the only NaN; no inf, no -0
#   "none": every code is a finite number                                   (e2m1, e2m3, e3m2)
SPECIALS = ("ieee", "fn", "fnuz", "none")


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
        if self.specials not in SPECIALS:
            raise FormatError(f"format {self.name}: specials={self.specials!r}; use one of {SPECIALS}")
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



@functools.lru_cache(maxsize=None)
def exact_shifts(src, dst) -> tuple[int, int] | None:
    """The shifts ``(lo, hi)``: every finite value ``x`` of ``src`` times ``2^d`` is exactly a finite value of
    ``dst`` for each integer ``d`` in ``[lo, hi]`` (and for no ``d`` outside it); None when there is no such ``d``.
    ``x 2^d`` keeps at most ``src.mbits + 1`` significant bits on the grid ``src.min_subnormal 2^d``, so it is a
    value of ``dst`` when the grid is no finer than ``dst``'s (``d >= lo``), ``src.mbits <= dst.mbits`` and
    ``src.max_normal 2^d <= dst.max_normal`` (``d <= hi``).  E.g. into e4m3fn: e2m1 [-8, 6], e2m3 [-6, 5],
    e3m2 [-5, 4], e4m3fn [0, 0]: the widest spread of MX block exponents that one shared power of two can carry
    (hi - lo binades: 14, 11, 9).  Cached (the specs are immutable)."""
    s, d = get(src), get(dst)
    if s.mbits > d.mbits or (s.signed and not d.signed):
        return None
    lo = int(np.log2(d.min_subnormal)) - int(np.log2(s.min_subnormal))
    hi = int(np.floor(np.log2(d.max_normal / s.max_normal)))
    return (lo, hi) if lo <= hi else None
