"""What each ``matmul(dtype=...)`` name means: one table, asked by the API, every backend and the CLI.

A *matmul dtype* names how the operands are represented on the matrix core:

========================  ==========================================================  =======
name (aliases)            A/B element format                                          scaling
========================  ==========================================================  =======
fp32                      float32 (exact fp32 inputs)                                  none
tf32                      float32 rounded to tf32 (RNE)                                none
fp16, bf16                IEEE half, bfloat16                                          none
fp8 / e4m3, e5m2          e4m3fn, e5m2 (OCP); ``fp8`` means e4m3fnuz on gfx942        per-tensor power of two
e4m3fnuz, e5m2fnuz        AMD CDNA3 FNUZ bytes                                         per-tensor power of two
mxfp8 (mxfp8_e4m3)        e4m3fn                                                       E8M0 per 32 K
mxfp8_e5m2                e5m2                                                         E8M0 per 32 K
mxfp6 (mxfp6_e2m3)        e2m3                                                         E8M0 per 32 K
mxfp6_e3m2                e3m2                                                         E8M0 per 32 K
mxfp4                     e2m1                                                         E8M0 per 32 K
========================  ==========================================================  =======

A pair ``("mxfp8", "mxfp4")`` gives A and B different formats of the same scaling kind.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UnknownNameError, UnsupportedError

__all__ = [
    "KINDS",
    "MX_BLOCK",
    "MX_ELEMENT",
    "MatmulDType",
    "OperandDType",
    "canonical_operand",
    "known_names",
    "resolve",
]

MX_BLOCK = 32

# kind of each canonical operand dtype: "float" (no scaling), "fp8" (per-tensor scale), "mx" (E8M0 per block)
KINDS = {
    "fp32": "float",
    "tf32": "float",
    "fp16": "float",
    "bf16": "float",
    "e4m3fn": "fp8",
    "e5m2": "fp8",
    "e4m3fnuz": "fp8",
    "e5m2fnuz": "fp8",
    "mxfp8_e4m3": "mx",
    "mxfp8_e5m2": "mx",
    "mxfp6_e2m3": "mx",
    "mxfp6_e3m2": "mx",
    "mxfp4": "mx",
}

# element format (a name mxcore.formats knows) of each canonical operand dtype
ELEMENT = {
    "fp32": "fp32",
    "tf32": "tf32",
    "fp16": "fp16",
    "bf16": "bf16",
    "e4m3fn": "e4m3fn",
    "e5m2": "e5m2",
    "e4m3fnuz": "e4m3fnuz",
    "e5m2fnuz": "e5m2fnuz",
    "mxfp8_e4m3": "e4m3fn",
    "mxfp8_e5m2": "e5m2",
    "mxfp6_e2m3": "e2m3",
    "mxfp6_e3m2": "e3m2",
    "mxfp4": "e2m1",
}
MX_ELEMENT = {name: ELEMENT[name] for name, kind in KINDS.items() if kind == "mx"}

_ALIASES = {
    "float32": "fp32",
    "f32": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "f16": "fp16",
    "bfloat16": "bf16",
    "e4m3": "e4m3fn",
    "float8_e4m3fn": "e4m3fn",
    "float8_e5m2": "e5m2",
    "float8_e4m3fnuz": "e4m3fnuz",
    "float8_e5m2fnuz": "e5m2fnuz",
    "bf8": "e5m2",
    "mxfp8": "mxfp8_e4m3",
    "mxfp6": "mxfp6_e2m3",
    "mxfp4_e2m1": "mxfp4",
}

# Names whose meaning depends on the architecture: CDNA3 (gfx942) reads fp8 bytes as FNUZ.
_ARCH_DEPENDENT = {
    "fp8": {"gfx942": "e4m3fnuz", None: "e4m3fn"},
    "bf8": {"gfx942": "e5m2fnuz", None: "e5m2"},
}
FNUZ_ARCHS = frozenset({"gfx940", "gfx941", "gfx942"})


def known_names() -> list[str]:
    """Every name ``matmul(dtype=...)`` accepts (canonical names, aliases, arch-dependent names)."""
    return sorted(set(KINDS) | set(_ALIASES) | set(_ARCH_DEPENDENT))


def canonical_operand(name, arch: str | None = None) -> str:
    """Map one operand name (any case, alias, or an arch-dependent name like ``fp8``) to its canonical name."""
    if not isinstance(name, str):
        raise UnknownNameError(f"dtype must be a string or a pair of strings, got {name!r}; known: {', '.join(known_names())}")
    key = name.strip().lower()
    if key in _ARCH_DEPENDENT:
        table = _ARCH_DEPENDENT[key]
        return table["gfx942"] if arch in FNUZ_ARCHS else table[None]
    key = _ALIASES.get(key, key)
    if key not in KINDS:
        raise UnknownNameError(f"unknown dtype {name!r}; known dtypes: {', '.join(known_names())}")
    return key


@dataclass(frozen=True)
class OperandDType:
    """One operand's representation: canonical name, element format, scaling kind."""

    name: str
    element: str
    kind: str  # "float" | "fp8" | "mx"

    @property
    def is_mx(self) -> bool:
        return self.kind == "mx"


@dataclass(frozen=True)
class MatmulDType:
    """The resolved ``dtype=`` of a matmul: A's and B's representation."""

    a: OperandDType
    b: OperandDType

    @property
    def kind(self) -> str:
        return self.a.kind

    @property
    def name(self) -> str:
        return self.a.name if self.a == self.b else f"{self.a.name},{self.b.name}"

    def __str__(self) -> str:
        return self.name


def _operand(name: str) -> OperandDType:
    return OperandDType(name, ELEMENT[name], KINDS[name])


def resolve(dtype, arch: str | None = None) -> MatmulDType:
    """Resolve ``dtype`` (a name or an (A, B) pair) for ``arch`` (``"sm_90"``, ``"gfx942"``, or None)."""
    if isinstance(dtype, (tuple, list)):
        if len(dtype) != 2:
            raise UnknownNameError(f"a dtype pair must have two names (A, B), got {dtype!r}")
        a, b = (canonical_operand(d, arch) for d in dtype)
    else:
        a = b = canonical_operand(dtype, arch)
    oa, ob = _operand(a), _operand(b)
    if oa.kind != ob.kind:
        raise UnsupportedError(
            f"dtype pair ({a}, {b}) mixes scaling kinds {oa.kind!r} and {ob.kind!r}; "
            "pair MX formats with MX formats, or fp8 formats with fp8 formats"
        )
    if oa.kind == "float" and a != b:
        raise UnsupportedError(f"mixed float dtypes ({a}, {b}) are not supported; use one of fp32, tf32, fp16, bf16 for both")
    fnuz = {x.name for x in (oa, ob) if x.name.endswith("fnuz")}
    if fnuz and len(fnuz) != len({oa.name, ob.name}) and oa.kind == "fp8":
        raise UnsupportedError(
            f"dtype pair ({a}, {b}) mixes FNUZ and OCP fp8 encodings; no instruction reads both. "
            "Use e4m3fnuz/e5m2fnuz together (gfx942) or e4m3fn/e5m2 together (OCP)"
        )
    return MatmulDType(oa, ob)


# output dtypes: canonical name -> element format of mxcore.formats used for the final rounding
OUT_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": None}
_OUT_ALIASES = {"fp32": "float32", "f32": "float32", "fp16": "float16", "half": "float16", "f16": "float16",
                "bf16": "bfloat16", "fp64": "float64", "f64": "float64"}


def canonical_out_dtype(name, *, allow_float64: bool = False) -> str:
    """'float32' | 'float16' | 'bfloat16' (| 'float64' for the reference oracle when allowed)."""
    key = getattr(name, "name", None) or getattr(name, "__name__", None) or str(name)
    key = key.strip().lower().replace("torch.", "")
    key = _OUT_ALIASES.get(key, key)
    allowed = [k for k in OUT_DTYPES if allow_float64 or k != "float64"]
    if key not in allowed:
        raise UnknownNameError(f"unknown out_dtype {name!r}; choose one of {', '.join(allowed)}")
    return key
