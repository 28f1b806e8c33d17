"""The fragment-layout database: which lane and register slot holds each matrix element.

>>> from mxcore import layouts
>>> lay = layouts.get("m16n8k16.f16")                 # or the PTX form
>>> lay.a.coords[5, 0]                                # (row, col) of A in lane 5, slot 0 (a0)
>>> layouts.get("v_mfma_scale_f32_32x32x64_f8f6f4", a_format="fp4", b_format="fp8", scale_opsel=(0, 1))
>>> layouts.get("m64n128k16.f16").smem("b", swizzle="128B").descriptor(0x400)   # wgmma: B in shared memory

``names(vendor, arch)`` lists the matrix instructions — mma.sync, Hopper wgmma (sm_90a), MFMA —
(``kind="ldmatrix"`` lists the ldmatrix movement layouts, ``kind="all"`` both); ``get`` returns an
:class:`InstructionLayout`, a :class:`WgmmaLayout` (register operands plus shared-memory operands through a
descriptor, :mod:`.hopper`) or an :class:`LdMatrixLayout`; ``render`` draws an operand (svg, png, text).
Conventions: see ``_core``.
"""

from __future__ import annotations

import re

from .. import dtypes as _dt
from ..errors import InputTypeError, LayoutError, UnknownNameError, UnsupportedError
from . import cdna3, cdna4, hopper, nvidia
from ._core import InstructionLayout, LdMatrixLayout, OperandLayout
from ._smem import SmemLayout, SwizzleAtom
from .hopper import WgmmaLayout

__all__ = ["names", "get", "render", "records", "element_formats", "instruction_element", "check_arch",
           "InstructionLayout", "OperandLayout", "LdMatrixLayout", "WgmmaLayout", "SmemLayout", "SwizzleAtom",
           "MATRIX_TYPES"]

#: the record types of matrix instructions (mma.sync / MFMA, and Hopper wgmma with its shared-memory operands)
MATRIX_TYPES = (InstructionLayout, WgmmaLayout)


def _fixed_records():
    return nvidia.RECORDS + hopper.RECORDS + cdna3.RECORDS + cdna4.RECORDS


_BY_NAME: dict[str, list] = {}
for _r in _fixed_records():
    _BY_NAME.setdefault(_r.name, []).append(_r)
_LDM = {r.name: r for r in nvidia.LDMATRIX}

_ALIAS: dict[str, str] = {}
for _r in nvidia.RECORDS:
    _ALIAS[_r.alias.lower()] = _r.name
    if _r.scaled:  # sm_120a block_scale: the alias (m16n8k32.mxf8f6f4.e4m3.e2m1) is the short form
        continue
    shape, ta, tb, tc = _r.name.split(".")[3], *_r.name.split(".")[-3:-1], _r.name.split(".")[6]
    _ALIAS.setdefault(f"{shape}.{ta}.{tb}" + (".f16acc" if tc == "f16" else ""), _r.name)
for _l in nvidia.LDMATRIX:  # "ldmatrix.x4.trans"
    _ALIAS[f"ldmatrix.x{_l.num}" + (".trans" if _l.trans else "")] = _l.name
for _n in cdna4.F8F6F4_SHAPES:
    _ALIAS[_n.replace("v_mfma_", "")] = _n
for _r in hopper.RECORDS:  # "m64n128k16.f16", "wgmma.m64n128k16.f16", "m64n64k32.e4m3.e5m2"
    for _a in hopper.aliases(_r):
        _ALIAS[_a.lower()] = _r.name


class _NameTypeError(UnknownNameError, InputTypeError):
    """A layout name that is not a string (caught by ``except KeyError`` and ``except TypeError``)."""


def _canonical_name(name: str) -> str:
    if not isinstance(name, str):
        raise _NameTypeError(f"instruction name must be a string, got {type(name).__name__} {name!r}; "
                             "e.g. 'm16n8k16.f16', 'v_mfma_f32_32x32x8_f16' or 'ldmatrix.x4' "
                             "(all names: mxcore.layouts.names(kind='all'))")
    key = name.strip().lower()
    if key in _BY_NAME or key in cdna4.F8F6F4_SHAPES or key in _LDM:
        return key
    if key in _ALIAS:
        return _ALIAS[key]
    if "v_mfma_" + key in _BY_NAME:
        return "v_mfma_" + key
    close = [n for n in names(kind="all") if key.replace("_", "") in n.replace("_", "")][:8]
    hint = f" Did you mean: {', '.join(close)}?" if close else " See mxcore.layouts.names() or `python -m mxcore layout --list`."
    raise UnknownNameError(f"unknown instruction {name!r}.{hint}")


def _arch_matches(rec, arch: str) -> bool:
    arch = _dt.layout_arch(arch)  # gfx940/gfx941: gfx942's CDNA3 records
    if arch in rec.archs:
        return True
    if rec.vendor == "nvidia":  # mma.sync is forward compatible: sm_XY >= the record's first arch
        if any(a.endswith("a") for a in rec.archs):  # arch-specific (sm_120a) features: listed archs only
            return False
        m = re.fullmatch(r"sm_(\d+)[af]?", arch)
        return bool(m) and int(m.group(1)) >= int(rec.archs[0][3:])
    return False


VENDORS = ("nvidia", "amd")


def _known_archs(vendor: str | None = None) -> list[str]:
    recs = list(_fixed_records()) + list(nvidia.LDMATRIX) + [cdna4.f8f6f4(n, "e4m3fn", "e4m3fn")
                                                              for n in cdna4.F8F6F4_SHAPES]
    archs = {a for r in recs if vendor in (None, r.vendor) for a in r.archs}
    if any(_dt.layout_arch(a) in archs for a in _dt.FNUZ_ARCHS):  # CDNA3 parts that share gfx942's records
        archs |= _dt.FNUZ_ARCHS
    return sorted(archs)


def _check_arch(arch) -> str:
    """``arch`` normalised (lower case) when some layout runs on it, else UnknownNameError."""
    key = arch.strip().lower() if isinstance(arch, str) else None
    if key is not None and any(_arch_matches(r, key) for r in list(_fixed_records()) + list(nvidia.LDMATRIX)):
        return key
    if key in _known_archs():
        return key
    raise UnknownNameError(f"no layouts for arch {arch!r}; known archs: {', '.join(_known_archs())} "
                           "(NVIDIA sm_XY newer than sm_90 also work: mma.sync is forward compatible)")


def names(vendor: str | None = None, arch: str | None = None, *, kind: str = "mma") -> list[str]:
    """Instruction names for ``vendor`` ("nvidia" | "amd") and ``arch`` (e.g. "sm_90", "gfx950").

    ``kind``: "mma" (the matrix instructions: mma.sync, wgmma, MFMA; default), "ldmatrix" (movement layouts) or
    "all".  Arch-specific records (sm_90a wgmma, sm_120a block-scaled mma.sync) are listed for their own arch
    only: ``names(arch="sm_90a")`` has the wgmma family, ``names(arch="sm_90")`` the forward-compatible mma.sync.
    """
    if kind not in ("mma", "ldmatrix", "all"):
        raise LayoutError(f"kind {kind!r}: use 'mma', 'ldmatrix' or 'all'")
    if vendor is not None:
        if not isinstance(vendor, str) or vendor.strip().lower() not in VENDORS:
            raise UnknownNameError(f"unknown vendor {vendor!r}; known vendors: {', '.join(VENDORS)}")
        vendor = vendor.strip().lower()
    if arch is not None:
        arch = _check_arch(arch)
        arch_vendor = "nvidia" if arch.startswith("sm_") else "amd"
        if vendor is not None and vendor != arch_vendor:
            raise LayoutError(f"arch {arch!r} is an {arch_vendor} arch, not {vendor}; "
                              f"drop the vendor or pick one of {', '.join(_known_archs(vendor))}")
    recs = []
    if kind in ("mma", "all"):
        recs += list(_fixed_records()) + [cdna4.f8f6f4(n, "e4m3fn", "e4m3fn") for n in cdna4.F8F6F4_SHAPES]
    if kind in ("ldmatrix", "all"):
        recs += list(nvidia.LDMATRIX)
    out = []
    for r in recs:
        if vendor is not None and r.vendor != vendor:
            continue
        if arch is not None and not _arch_matches(r, arch):
            continue
        if r.name not in out:
            out.append(r.name)
    return out


def _canon_format(fmt, arch: str | None) -> str:
    """An operand format name as ``arch`` means it (mxcore.dtypes decides: fp8 is e4m3fnuz on CDNA3)."""
    try:
        return _dt.element_format(fmt, arch)
    except UnknownNameError as exc:
        raise LayoutError(f"operand format {fmt!r}: {exc}") from None


def records(vendor: str | None = None, arch: str | None = None) -> list:
    """Every matrix-instruction record (each CDNA4 f8f6f4 shape once per A/B format pair; the sm_90a wgmma records,
    :class:`WgmmaLayout`, whose B is in shared memory), for ``vendor`` and ``arch`` when given: what the emulator,
    probes and tests iterate over."""
    out, seen = [], set()
    for name in names(vendor, arch):
        if name in cdna4.F8F6F4_SHAPES:
            out += [cdna4.f8f6f4(name, fa, fb) for fa in _dt.F8F6F4_CODES for fb in _dt.F8F6F4_CODES]
            continue
        for rec in _BY_NAME[name]:
            if (arch is None or _arch_matches(rec, arch)) and id(rec) not in seen:
                seen.add(id(rec))
                out.append(rec)
    return out


def element_formats(arch: str, *, scaled: bool = False) -> frozenset:
    """The A/B element formats some matrix instruction of ``arch`` reads: block-scaled instructions when
    ``scaled``, unscaled ones otherwise (e.g. gfx950 unscaled: fp32, fp16, bf16, e4m3fn, e5m2, e2m3, e3m2, e2m1)."""
    fmts = set()
    for rec in records(arch=arch):
        if bool(rec.scaled) == scaled:
            fmts |= {rec.a_format, rec.b_format}
    return frozenset(fmts)


def instruction_element(name, arch: str) -> str | None:
    """The element format that a matrix instruction of ``arch`` reads for operand dtype ``name``: the dtype's own
    element when some instruction reads it, else, for the float dtypes, the narrowest format an instruction
    reads that holds every value exactly (tf32 on gfx950, which has no xf32 MFMA: ``"fp32"``); None when none does
    (a backend may still emulate it, as the CUDA backend's 3xTF32 split does for fp32).  Derived from the
    layout records (block-scaled instructions for the MX dtypes, unscaled ones otherwise)."""
    from .. import formats

    d = _dt.DTYPES[_dt.canonical_operand(name, arch)]
    read = element_formats(_dt.layout_arch(arch), scaled=d.kind == "mx")
    if d.element in read:
        return d.element
    if d.kind != "float":  # codes travel as bytes: no wider instruction format stands in for them
        return None
    mine = formats.FORMATS[d.element]
    wider = [f for f in read if f in formats.FORMATS and _is_subset(mine, formats.FORMATS[f])]
    return min(wider, key=lambda f: formats.FORMATS[f].bits) if wider else None


def _is_subset(small, big) -> bool:
    """Every value of format ``small`` is a value of ``big`` (same exponent range, at least as many mantissa bits)."""
    return (small.ebits == big.ebits and small.bias == big.bias and small.mbits <= big.mbits
            and small.signed == big.signed and small.has_inf == big.has_inf)


def check_arch(arch, vendor: str | None = None) -> str:
    """``arch`` normalised (lower case) when some matrix instruction of the layout records runs on it (and it
    belongs to ``vendor`` when given), else UnsupportedError naming what mxcore needs: NVIDIA sm_80 or newer
    (the oldest mma.sync record), AMD CDNA3 (gfx940-gfx942) or CDNA4 (gfx950)."""
    key = "" if arch is None else str(arch).strip().lower()
    nv_archs = sorted({a for r in records("nvidia") for a in r.archs}, key=lambda a: (len(a), a))
    nv = sorted(int(a[3:].rstrip("af")) for a in nv_archs)
    amd = sorted({a for r in records("amd") for a in r.archs} | _dt.FNUZ_ARCHS)
    kind = "nvidia" if key.startswith("sm_") else "amd" if key.startswith("gfx") else None
    if vendor is not None and kind is not None and kind != vendor:
        raise UnsupportedError(f"arch {arch!r} is an {kind} arch, not {vendor}; "
                               + (f"use sm_{nv[0]} or newer" if vendor == "nvidia" else f"use one of {', '.join(amd)}"))
    m = re.fullmatch(r"sm_(\d+)[af]?", key)
    if m and int(m.group(1)) < nv[0]:
        raise UnsupportedError(f"arch {arch!r}: mxcore needs sm_{nv[0]} or newer on NVIDIA (its mma.sync records "
                               "and kernels start there)")
    try:
        names(arch=key)
    except (UnknownNameError, LayoutError):
        raise UnsupportedError(f"unknown arch {arch!r}; mxcore runs on NVIDIA sm_{nv[0]} or newer (records for "
                               f"{', '.join(nv_archs)}) and AMD {', '.join(amd)}") from None
    return key


def get(name: str, *, a_format: str | None = None, b_format: str | None = None,
        scale_opsel: tuple | None = None, arch: str | None = None):
    """The layout record for ``name`` (PTX form, short alias, or AMD mnemonic).

    ``a_format``/``b_format`` pick the operand formats of the CDNA4 f8f6f4 instructions (default fp8
    e4m3fn; names as in mxcore.formats or the ISA's fp8/bf8/fp6/bf6/fp4) and select among records
    sharing a mnemonic (gfx942 FNUZ vs gfx950 OCP fp8).  ``scale_opsel=(byte_a, byte_b)`` chooses
    which byte of each lane's scale register the scaled MFMAs read (default (0, 0)).  ``arch``
    selects the record for that arch when a mnemonic exists on several.
    """
    key = _canonical_name(name)
    if key in _LDM:
        return _LDM[key]
    if key in cdna4.F8F6F4_SHAPES:
        if arch is not None and arch.lower() != "gfx950":
            raise LayoutError(f"{key} exists on gfx950 only, not {arch}")
        fa = _canon_format(a_format or "e4m3fn", "gfx950")
        fb = _canon_format(b_format or "e4m3fn", "gfx950")
        scaled = cdna4.F8F6F4_SHAPES[key][2]
        if scale_opsel is not None and not scaled:
            raise LayoutError(f"{key} takes no scales; use v_mfma_scale_... for scale_opsel")
        opsel = tuple(int(x) for x in (scale_opsel or (0, 0))) if scaled else (0, 0)
        return cdna4.f8f6f4(key, fa, fb, opsel)
    if scale_opsel is not None:
        raise LayoutError(f"{key} takes no scales; scale_opsel applies to v_mfma_scale_*_f8f6f4 only")
    cands = _BY_NAME[key]
    if arch is not None:
        cands = [r for r in cands if _arch_matches(r, arch)]
    for want, field in ((a_format, "a_format"), (b_format, "b_format")):
        if want is not None:
            cands = [r for r in cands if getattr(r, field) == _canon_format(want, arch or r.archs[0])]
    if not cands:
        have = "; ".join(f"{', '.join(r.archs)}: A {r.a_format}, B {r.b_format}" for r in _BY_NAME[key])
        raise LayoutError(f"{key}: no record for arch={arch}, a_format={a_format}, b_format={b_format}; "
                          f"it exists as {have}")
    return cands[0]


def render(name: str, operand: str = "a", fmt: str = "svg", *, major: str | None = None, swizzle: str | None = None,
           lbo: int | None = None, sbo: int | None = None, **get_kwargs) -> str | bytes:
    """Draw one operand of ``name`` as a grid labelled with lane and slot, coloured by lane.

    ``fmt``: "svg" (str, no dependency), "text" (str), "png" (bytes; needs Pillow).  A wgmma operand in shared
    memory (``operand`` "B" or "A_smem") is drawn as its swizzle atom and its tile in 16-byte chunks, for
    ``major`` ("K" default, or "MN"), ``swizzle`` ("128B" default, "64B", "32B", "none") and ``lbo`` / ``sbo``
    (bytes; default: the tile packed densely).
    """
    from . import _draw as _render

    return _render.render(get(name, **get_kwargs), operand, fmt, _smem_args(major, swizzle, lbo, sbo))


def _smem_args(major, swizzle, lbo, sbo) -> dict:
    given = {"major": major, "swizzle": swizzle, "lbo": lbo, "sbo": sbo}
    return {k: v for k, v in given.items() if v is not None}


_OUT_FORMATS = {".svg": "svg", ".png": "png", ".txt": "text"}


def _opsel_arg(text: str) -> tuple:
    """argparse type for --scale-opsel: "A,B", two byte indices 0..3."""
    import argparse

    parts = text.split(",")
    try:
        vals = tuple(int(x) for x in parts)
    except ValueError:
        vals = ()
    if len(vals) != 2 or not all(0 <= v <= 3 for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: expected A,B: the bytes (0..3) of the scale_a and "
                                         "scale_b registers, e.g. 0,1")
    return vals


def _cli(argv) -> int:
    import argparse
    import os
    import sys

    p = argparse.ArgumentParser(prog="mxcore layout", description="show an instruction's fragment layout")
    p.add_argument("name", nargs="?", help="instruction (PTX form, alias like m16n8k16.f16, or AMD mnemonic)")
    p.add_argument("--list", action="store_true", help="list instruction names and exit")
    p.add_argument("--vendor", choices=list(VENDORS))
    p.add_argument("--arch", help="filter --list (sm_90, gfx942, gfx950) or pick the record")
    p.add_argument("--operand", default="A", help="A, B, C (= D), and scale_a, scale_b on scaled MFMAs (default A); "
                                                  "wgmma: A (registers), A_smem and B (shared memory), C")
    p.add_argument("--out", help="write a picture instead of printing: file.svg, file.png (needs Pillow: "
                                 'pip install "mxcore[png]") or file.txt')
    p.add_argument("--a-format", help="f8f6f4 A format: fp8 bf8 fp6 bf6 fp4 (or e4m3fn e5m2 e2m3 e3m2 e2m1)")
    p.add_argument("--b-format", help="f8f6f4 B format")
    p.add_argument("--scale-opsel", type=_opsel_arg, metavar="A,B",
                   help="scaled MFMAs: bytes (0..3) read from the scale_a and scale_b registers, e.g. 0,1")
    p.add_argument("--major", choices=["K", "MN"], type=str.upper,
                   help="wgmma operand in shared memory: K-major (default) or MN-major (16-bit formats)")
    p.add_argument("--swizzle", choices=list(hopper.SWIZZLES), help="wgmma operand in shared memory: swizzle mode "
                                                                     "(default 128B)")
    p.add_argument("--lbo", type=int, help="wgmma operand in shared memory: leading dimension byte offset")
    p.add_argument("--sbo", type=int, help="wgmma operand in shared memory: stride dimension byte offset")
    args = p.parse_args(argv)
    smem = _smem_args(args.major, args.swizzle, args.lbo, args.sbo)
    out_fmt = None
    if args.out:
        out_fmt = _OUT_FORMATS.get(os.path.splitext(args.out)[1].lower())
        if out_fmt is None:
            p.error(f"--out {args.out}: use a file name ending in .svg, .png or .txt")
    from ..errors import MXCoreError
    from . import _draw as _render

    try:
        if args.list or not args.name:
            for n in names(args.vendor, args.arch, kind="all"):
                print(n)
            return 0
        kw = dict(a_format=args.a_format, b_format=args.b_format, arch=args.arch)
        if args.scale_opsel is not None:
            kw["scale_opsel"] = args.scale_opsel
        lay = get(args.name, **kw)
        if isinstance(lay, MATRIX_TYPES):
            _render.panels(lay, args.operand, smem)  # validate before printing anything
        elif smem:
            raise LayoutError(f"{lay.name}: --major / --swizzle / --lbo / --sbo apply to wgmma operands in shared memory")
        if out_fmt is not None:
            data = _render.render(lay, args.operand, out_fmt, smem)
            mode = "wb" if isinstance(data, bytes) else "w"
            try:
                with open(args.out, mode) as fh:
                    fh.write(data)
            except OSError as exc:
                folder = os.path.dirname(os.path.abspath(args.out))
                why = f"folder {folder} does not exist" if not os.path.isdir(folder) else exc.strerror
                raise LayoutError(f"--out {args.out}: cannot write the file ({why})") from None
            print(f"wrote {args.out}")
        else:
            print(lay)
            print()
            print(_render.render(lay, args.operand, "text", smem))
    except (MXCoreError, ValueError) as exc:
        print(f"mxcore layout: error: {exc}", file=sys.stderr)
        return 2
    return 0
