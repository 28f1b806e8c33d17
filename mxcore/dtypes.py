"""Which element format a dtype name means on which arch: the one resolver that the API, the backends,
the layouts, the benchmark and the CLI ask.

A *matmul dtype* names how the operands are represented on the matrix core:

========================  ==========================================================  =======
name (aliases)            A/B element format                                          scaling
========================  ==========================================================  =======
fp32                      float32 (exact fp32 inputs)                                  none
tf32                      float32 rounded to tf32 (RNE)                                none
fp16, bf16                IEEE half, bfloat16                                          none
fp8 / e4m3, e5m2 / bf8    e4m3fn, e5m2 (OCP); ``fp8``/``bf8`` mean the FNUZ formats    per-tensor power of two
                          on CDNA3 (gfx940, gfx941, gfx942)
e4m3fnuz, e5m2fnuz        AMD CDNA3 FNUZ bytes                                         per-tensor power of two
mxfp8 (mxfp8_e4m3)        e4m3fn                                                       E8M0 per 32 K
mxfp8_e5m2                e5m2                                                         E8M0 per 32 K
mxfp6 (mxfp6_e2m3)        e2m3                                                         E8M0 per 32 K
mxfp6_e3m2                e3m2                                                         E8M0 per 32 K
mxfp4                     e2m1                                                         E8M0 per 32 K
========================  ==========================================================  =======

A pair ``("mxfp8", "mxfp4")`` gives A and B different formats of the same scaling kind.  The one pair across
kinds is the weight-only case: fp16 or bf16 activations A times an MX weight B, ``("bf16", "mxfp4")`` (kind
``"wonly"``: A is rounded once to its 16-bit format, B is block-quantized along K as for any MX operand).

Where each fact comes from:

* :data:`DTYPES` is the one table of matmul dtypes (name, element format, scaling kind, own aliases).  The
  float and fp8 dtypes also take every alias :mod:`mxcore.formats` lists for their element format
  (``half``, ``bfloat16``, ``float8_e4m3fn``, ``e4m3``...), so those names are written once, there.
* :data:`ARCH_DEPENDENT` holds the names whose format depends on the arch (``fp8``, ``bf8``), and
  :data:`FNUZ_ARCHS` the archs that read fp8 bytes as FNUZ.
* Bit widths come from the :class:`~mxcore.formats.FormatSpec` (:func:`bits`, :func:`storage_bits`).
* :data:`F8F6F4_CODES`: the CDNA4 f8f6f4 MFMA format codes (``cbsz`` for A, ``blgp`` for B).

Which archs mxcore runs on (:func:`mxcore.layouts.check_arch`) and what an arch's matrix instruction reads for a
dtype (:func:`mxcore.layouts.instruction_element`) are derived from the layout records, which sit above this table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import InputTypeError, UnknownNameError, UnsupportedError

__all__ = [
    "ARCH_DEPENDENT",
    "DTYPES",
    "DTypeSpec",
    "F8F6F4_CODES",
    "FNUZ_ARCHS",
    "KINDS",
    "MX_BLOCK",
    "MX_ELEMENT",
    "MatmulDType",
    "OperandDType",
    "WONLY_ACTIVATIONS",
    "WONLY_KIND",
    "bits",
    "canonical_operand",
    "canonical_out_dtype",
    "dtype_name",
    "element_format",
    "holds_codes",
    "known_names",
    "layout_arch",
    "resolve",
    "resolve_name",
    "storage_bits",
]

MX_BLOCK = 32
#: the kind of a weight-only pair: 16-bit float activations A (WONLY_ACTIVATIONS) times an MX weight B
WONLY_KIND = "wonly"
WONLY_ACTIVATIONS = ("fp16", "bf16")


@dataclass(frozen=True)
class DTypeSpec:
    """One matmul dtype: canonical ``name``, the :mod:`mxcore.formats` ``element`` format of its A/B values,
    the scaling ``kind`` ("float": none, "fp8": per-tensor power of two, "mx": E8M0 per 32 K) and the
    ``aliases`` that are dtype names rather than format names."""

    name: str
    element: str
    kind: str
    aliases: tuple[str, ...] = ()


DTYPES: dict[str, DTypeSpec] = {d.name: d for d in (
    DTypeSpec("fp32", "fp32", "float"),
    DTypeSpec("tf32", "tf32", "float"),
    DTypeSpec("fp16", "fp16", "float"),
    DTypeSpec("bf16", "bf16", "float"),
    DTypeSpec("e4m3fn", "e4m3fn", "fp8"),
    DTypeSpec("e5m2", "e5m2", "fp8"),
    DTypeSpec("e4m3fnuz", "e4m3fnuz", "fp8"),
    DTypeSpec("e5m2fnuz", "e5m2fnuz", "fp8"),
    DTypeSpec("mxfp8_e4m3", "e4m3fn", "mx", ("mxfp8",)),
    DTypeSpec("mxfp8_e5m2", "e5m2", "mx"),
    DTypeSpec("mxfp6_e2m3", "e2m3", "mx", ("mxfp6",)),
    DTypeSpec("mxfp6_e3m2", "e3m2", "mx"),
    DTypeSpec("mxfp4", "e2m1", "mx", ("mxfp4_e2m1",)),
)}

# names whose element format depends on the arch: name -> (format on FNUZ_ARCHS, format elsewhere)
ARCH_DEPENDENT = {"fp8": ("e4m3fnuz", "e4m3fn"), "bf8": ("e5m2fnuz", "e5m2")}
# CDNA3 reads fp8 bytes as FNUZ; its layout records are written for gfx942 (the same MFMA ISA)
FNUZ_ARCHS = frozenset({"gfx940", "gfx941", "gfx942"})
_CDNA3_LAYOUT_ARCH = "gfx942"

# CDNA4 ISA 7.1.5: the f8f6f4 MFMAs' format codes (cbsz field for A, blgp for B)
F8F6F4_CODES = {"e4m3fn": 0, "e5m2": 1, "e2m3": 2, "e3m2": 3, "e2m1": 4}

# operand format names the ISAs use that mxcore.formats does not list (AMD: bf6 = E3M2, xf32 = a tf32-sized float)
_ISA_FORMAT_NAMES = {"bf6": "e3m2", "xf32": "tf32"}

# views of the table for callers that want one column
KINDS = {d.name: d.kind for d in DTYPES.values()}
MX_ELEMENT = {d.name: d.element for d in DTYPES.values() if d.kind == "mx"}


def _format_aliases() -> dict[str, str]:
    """alias -> canonical dtype: the dtypes' own aliases, plus the formats' aliases of float/fp8 elements."""
    from . import formats

    out = {}
    for d in DTYPES.values():
        for a in d.aliases:
            out[a] = d.name
        if d.kind != "mx":
            for a in formats.FORMATS[d.element].aliases:
                out.setdefault(a.lower(), d.name)
    for name in ARCH_DEPENDENT:
        out.pop(name, None)
    return out


_ALIASES = _format_aliases()


def known_names() -> list[str]:
    """Every name ``matmul(dtype=...)`` accepts (canonical names, aliases, arch-dependent names)."""
    return sorted(set(DTYPES) | set(_ALIASES) | set(ARCH_DEPENDENT))


def layout_arch(arch: str | None) -> str | None:
    """The arch whose layout records describe ``arch`` (gfx940/gfx941 share gfx942's CDNA3 MFMAs)."""
    if arch is None:
        return None
    key = str(arch).strip().lower()
    return _CDNA3_LAYOUT_ARCH if key in FNUZ_ARCHS else key


def _norm_arch(arch) -> str | None:
    return None if arch is None else str(arch).strip().lower()


def dtype_name(obj) -> str:
    """The lower-case name of a dtype given as a string, a numpy / ml_dtypes dtype or type (``np.float16``,
    ``ml_dtypes.bfloat16``), or a torch dtype (``torch.float16``); the one normaliser of ``dtype=`` and
    ``out_dtype=``."""
    if isinstance(obj, str):
        return obj.strip().lower()
    if (type(obj).__module__ or "").startswith("torch"):
        return str(obj).strip().lower().removeprefix("torch.")
    import numpy as np

    try:
        return np.dtype(obj).name.lower()
    except TypeError:
        pass
    raise InputTypeError(f"dtype must be a name such as 'fp16', a numpy/ml_dtypes dtype or a torch dtype, got "
                         f"{type(obj).__name__} {obj!r}; known names: {', '.join(known_names())}")


def canonical_operand(name, arch: str | None = None) -> str:
    """Map one operand dtype (any case, alias, dtype object, or an arch-dependent name like ``fp8``) to its
    canonical name in :data:`DTYPES`."""
    key = dtype_name(name)
    if key in ARCH_DEPENDENT:
        fnuz, ocp = ARCH_DEPENDENT[key]
        return fnuz if _norm_arch(arch) in FNUZ_ARCHS else ocp
    key = _ALIASES.get(key, key)
    if key not in DTYPES:
        hint = " (float64 is not a matrix-core dtype: use fp32)" if key in ("float64", "fp64", "double") else ""
        raise UnknownNameError(f"unknown dtype {name!r}{hint}; known dtypes: {', '.join(known_names())}")
    return key


def element_format(name, arch: str | None = None) -> str:
    """The :mod:`mxcore.formats` element format that an operand name means on ``arch``: a dtype name
    (``mxfp8`` -> e4m3fn, ``fp8`` on gfx942 -> e4m3fnuz), a format name or alias (``fp4`` -> e2m1), or an ISA
    spelling (``bf6`` -> e3m2, ``xf32`` -> tf32).  This is what ``layouts.get(a_format=...)`` asks."""
    from . import formats

    key = dtype_name(name)
    key = _ISA_FORMAT_NAMES.get(key, key)
    if key in ARCH_DEPENDENT or key in _ALIASES or key in DTYPES:
        return DTYPES[canonical_operand(key, arch)].element
    return formats.get(key).name


def bits(fmt) -> int:
    """Bits of one element code of format ``fmt`` (any name :func:`element_format` takes): tf32 19, e2m1 4."""
    from . import formats

    return formats.FORMATS[element_format(fmt)].bits


def storage_bits(fmt) -> int:
    """Bits one element occupies in a register or a buffer: the code's width, except that formats wider than
    16 bits (tf32, fp32) travel as 32-bit words."""
    b = bits(fmt)
    return 32 if b > 16 else b


def holds_codes(fmt) -> bool:
    """Whether registers of ``fmt`` hold element codes (formats of at most 8 bits, scales included) rather
    than values (fp32, tf32, fp16, bf16)."""
    return bits(fmt) <= 8


@dataclass(frozen=True)
class OperandDType:
    """One operand's representation: canonical name, element format, scaling kind."""

    name: str
    element: str
    kind: str  # "float" | "fp8" | "mx"

    @property
    def is_mx(self) -> bool:
        return self.kind == "mx"

    @property
    def bits(self) -> int:
        return bits(self.element)


@dataclass(frozen=True)
class MatmulDType:
    """The resolved ``dtype=`` of a matmul: A's and B's representation."""

    a: OperandDType
    b: OperandDType
    # derived once, at construction (every per-call path reads both; plain attributes, which torch.compile traces)
    kind: str = field(init=False, repr=False, compare=False)
    """The operands' scaling kind ("float", "fp8", "mx"), or "wonly" for fp16/bf16 A times an MX B."""
    name: str = field(init=False, repr=False, compare=False)
    """The canonical name: ``"mxfp8_e4m3"``, or a pair such as ``"bf16,mxfp4"``."""

    def __post_init__(self):
        object.__setattr__(self, "kind", WONLY_KIND if self.a.kind != self.b.kind else self.a.kind)
        object.__setattr__(self, "name", self.a.name if self.a == self.b else f"{self.a.name},{self.b.name}")

    def __str__(self) -> str:
        return self.name


def _operand(name: str) -> OperandDType:
    d = DTYPES[name]
    return OperandDType(d.name, d.element, d.kind)


def resolve(dtype, arch: str | None = None) -> MatmulDType:
    """Resolve ``dtype`` (a name, a dtype object, or an (A, B) pair of those) for ``arch`` (``"sm_90"``,
    ``"gfx942"``, or None)."""
    if isinstance(dtype, MatmulDType):
        return dtype
    if isinstance(dtype, (tuple, list)):
        if len(dtype) != 2:
            raise UnknownNameError(f"a dtype pair must have two names (A, B), got {dtype!r}")
        a, b = (canonical_operand(d, arch) for d in dtype)
    else:
        a = b = canonical_operand(dtype, arch)
    oa, ob = _operand(a), _operand(b)
    if oa.kind != ob.kind:
        if oa.kind == "float" and ob.kind == "mx" and a in WONLY_ACTIVATIONS:
            return MatmulDType(oa, ob)  # weight-only: 16-bit activations x an MX weight
        if oa.kind == "mx" and ob.kind == "float" and b in WONLY_ACTIVATIONS:
            hint = (f"the MX operand must be B (the weight): compute (b.T @ a.T).T with dtype=({b!r}, {a!r})")
        elif "mx" in (oa.kind, ob.kind) and "float" in (oa.kind, ob.kind):
            hint = (f"weight-only pairs take fp16 or bf16 activations as A ({', '.join(WONLY_ACTIVATIONS)}), "
                    "not " + (a if oa.kind == "float" else b))
        else:
            hint = ("pair MX formats with MX formats, fp8 formats with fp8 formats, or fp16/bf16 activations "
                    "with an MX weight (A float, B MX)")
        raise UnsupportedError(f"dtype pair ({a}, {b}) mixes scaling kinds {oa.kind!r} and {ob.kind!r}; {hint}")
    if oa.kind == "float" and a != b:
        raise UnsupportedError(f"mixed float dtypes ({a}, {b}) are not supported; use one of fp32, tf32, fp16, bf16 for both")
    if oa.kind == "fp8" and a.endswith("fnuz") != b.endswith("fnuz"):
        raise UnsupportedError(
            f"dtype pair ({a}, {b}) mixes FNUZ and OCP fp8 encodings; no instruction reads both. "
            "Use e4m3fnuz/e5m2fnuz together (gfx942) or e4m3fn/e5m2 together (OCP)"
        )
    return MatmulDType(oa, ob)


def resolve_name(name, arch: str | None = None) -> str:
    """The canonical name of ``name`` (or an "A,B" pair) on ``arch``: ``resolve_name("fp8", "gfx942")`` is
    ``"e4m3fnuz"``, ``resolve_name("mxfp8,mxfp4")`` is ``"mxfp8_e4m3,mxfp4"``.  For command lines (bench)."""
    if isinstance(name, str) and "," in name:
        return resolve(tuple(p for p in name.split(",")), arch).name
    return resolve(name, arch).name


# output dtypes: canonical name -> element format of mxcore.formats used for the final rounding
OUT_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": None}
_OUT_ALIASES = {"fp64": "float64", "f64": "float64", "double": "float64"}


def canonical_out_dtype(name, *, allow_float64: bool = False) -> str:
    """'float32' | 'float16' | 'bfloat16' (| 'float64' for the reference oracle when allowed): names, aliases
    (``fp16``, ``half``, ``bf16``...) and dtype objects, through the same normaliser as ``dtype=``."""
    key = dtype_name(name)
    key = _OUT_ALIASES.get(key, key)
    if key not in OUT_DTYPES:
        try:
            key = {v: k for k, v in OUT_DTYPES.items() if v}.get(DTYPES[canonical_operand(key)].element, key)
        except UnknownNameError:
            pass
    allowed = [k for k in OUT_DTYPES if allow_float64 or k != "float64"]
    if key not in allowed:
        raise UnknownNameError(f"unknown out_dtype {name!r}; choose one of {', '.join(allowed)}")
    return key
