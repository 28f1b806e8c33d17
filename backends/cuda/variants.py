"""What the mma.sync GEMM kernel (``kernels_cuda/gemm.cu``) is specialised into: elements, tiles, variants, the
fragment index formulas, the NVRTC options of a variant and the tile rule.

Fragment index arithmetic: every per-lane index the kernel uses — ldmatrix lane addresses, the split of one
ldmatrix.x4 into two n8 blocks of B, the fp8 -> f16 register split of the converted fp8 path and the
accumulator coordinates — is a formula of :data:`FRAGMENT_FORMULAS`, emitted as ``-D`` macros by
:func:`gemm_options`.  tests/test_cuda_index.py evaluates the same formulas (:func:`eval_formula`) against
``mxcore.layouts`` (the ldmatrix movement records composed with these addresses must give the mma records'
``coords``).  The mma mnemonic is the layout record's ``ptx`` string.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from mxcore.errors import UnsupportedError

from .tables import table

__all__ = ["ELEMENTS", "FRAGMENT_FORMULAS", "TILES", "Element", "Tile", "Variant", "all_variants", "ceiling_element",
           "choose", "choose_tile", "element_tiles", "eval_formula", "f8_pair", "gemm_options", "native_fp8", "sm_of"]

# ------------------------------------------------------------------------------------------------------------
# the single source of the kernel's fragment index formulas (C and Python share the syntax: & >> << + only)
# ------------------------------------------------------------------------------------------------------------
# ldmatrix.x4: lane -> (tile row, 16-byte chunk) whose address it supplies, relative to the 16x(32 bytes)
# sub-tile of one mma step.  K-major operands use ldmatrix (rows = m or n, chunks along k); M/N-major operands
# (16-bit only) use ldmatrix.trans (rows = k, chunks along m or n).
# ldsm_b_split: B's x4 covers two n8 blocks: ldmatrix register j -> (n8 block, mma B register).
# cvt_a / cvt_b (fp8 converted to f16, MX_F8_CVT): f16 mma h (K half h of the 32-wide fp8 step), register j
# <- (fp8 register, byte pair: 0 low, 1 high) of the fp8 fragment, converted by cvt.rn.f16x2.
# c: accumulator lane, register i -> (row, col) in the 16x8 tile.
FRAGMENT_FORMULAS = {
    "ldsm_a_kmajor": ("lane & 15", "lane >> 4"),
    "ldsm_a_mmajor": ("(lane & 7) + ((lane >> 4) << 3)", "(lane >> 3) & 1"),
    "ldsm_b_kmajor": ("(lane & 7) + ((lane >> 4) << 3)", "(lane >> 3) & 1"),
    "ldsm_b_nmajor": ("(lane & 7) + (((lane >> 3) & 1) << 3)", "lane >> 4"),
    "ldsm_b_split": ("j >> 1", "j & 1"),
    "cvt_a": ("(h << 1) + (j & 1)", "j >> 1"),
    "cvt_b": ("h", "j"),
    "c": ("(lane >> 2) + ((i >> 1) << 3)", "((lane & 3) << 1) + (i & 1)"),
}
# formula -> (macro name prefix, parameters): MX_<prefix>_<ROW|CHUNK|...>
_MACROS = {
    "ldsm_b_split": (("MX_LDSM_B_BLOCK", "MX_LDSM_B_REG"), "j"),
    "cvt_a": (("MX_CVT_A_REG", "MX_CVT_A_HI"), "h,j"),
    "cvt_b": (("MX_CVT_B_REG", "MX_CVT_B_HI"), "h,j"),
    "c": (("MX_C_ROW", "MX_C_COL"), "lane,i"),
}


def eval_formula(expr: str, lane=0, i=0, h=0, j=0):
    """Evaluate one formula in Python (numpy arrays or ints) exactly as the C preprocessor expands it."""
    if not re.fullmatch(r"[\sa-z0-9&>|<+()]*", expr):
        raise ValueError(f"formula {expr!r} uses operators outside & >> << + ( )")
    return eval(expr, {"__builtins__": {}}, {"lane": lane, "i": i, "h": h, "j": j})


def _macro(name: str, params: str, expr: str) -> str:
    body = re.sub(r"\b(lane|i|h|j)\b", r"(\1)", expr)
    return f"-D{name}({params})=({body})"


# ------------------------------------------------------------------------------------------------------------
# elements and tiles
# ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Element:
    """What the GEMM kernel reads: element size in bytes and the mma record (a mxcore.layouts name)."""

    name: str
    esize: int
    record: str
    min_sm: int = 80
    cvt: bool = False  # fp8 fragments converted in registers to f16 (formats: the launch's f8_pair)


ELEMENTS = {
    "f16": Element("f16", 2, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"),
    "bf16": Element("bf16", 2, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
    "tf32": Element("tf32", 4, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
}
for _pair in ("e4m3.e4m3", "e4m3.e5m2", "e5m2.e4m3", "e5m2.e5m2"):
    ELEMENTS[_pair] = Element(_pair, 1, f"mma.sync.aligned.m16n8k32.row.col.f32.{_pair}.f32", 89)
# fp8 where mma.sync fp8 is not native (sm_90): fp8 bytes in memory and shared memory, fragments loaded in the
# m16n8k32 layout, converted once per mma step to f16 and multiplied by two m16n8k16 (gemm_block.cuh MX_F8_CVT).
# One element for every pair: the A and B formats are a launch argument (:func:`f8_pair`), not a build option.
F8_CVT = "f8.f8.f16"
ELEMENTS[F8_CVT] = Element(F8_CVT, 1, ELEMENTS["f16"].record, 89, cvt=True)


@dataclass(frozen=True)
class Tile:
    """Block tile BM x BN, BK_BYTES of K per stage, WARPS_M x WARPS_N warps, STAGES-deep cp.async ring."""

    name: str
    bm: int
    bn: int
    bk_bytes: int
    warps_m: int
    warps_n: int
    stages: int
    group_m: int = 8

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n


# the tiles the kernel is built in; which one a problem takes: choose_tile (tuning/dense.json, mma_sync_tiles)
TILES = {
    "128x128": Tile("128x128", 128, 128, 64, 2, 2, 4),
    "128x128k128s3": Tile("128x128k128s3", 128, 128, 128, 2, 2, 3),
    "64x64": Tile("64x64", 64, 64, 64, 2, 2, 4),
    "32x64": Tile("32x64", 32, 64, 64, 1, 2, 4),
}
BIG_TILE_CVT = "128x128k128s3"


@dataclass(frozen=True)
class Variant:
    elem: str
    a_kmajor: bool
    b_kmajor: bool
    tile: str

    @property
    def name(self) -> str:
        e = self.elem.replace(".", "_")
        return f"gemm_{e}_{'k' if self.a_kmajor else 'm'}{'k' if self.b_kmajor else 'n'}_{self.tile}"

    @property
    def element(self) -> Element:
        return ELEMENTS[self.elem]

    @property
    def bk(self) -> int:
        return TILES[self.tile].bk_bytes // self.element.esize

    @property
    def smem_bytes(self) -> int:
        t = TILES[self.tile]
        return t.stages * (t.bm + t.bn) * t.bk_bytes  # rows x (BK bytes) for either majorness

    @property
    def threads(self) -> int:
        return TILES[self.tile].threads


@functools.lru_cache(maxsize=None)
def gemm_options(v: Variant) -> tuple[str, ...]:
    """NVRTC options (all -D) that specialise gemm.cu (and gemm_diag.cu) into variant ``v`` (built once per
    variant: a plan looks its kernel up by them on every call)."""
    from mxcore import layouts

    t = TILES[v.tile]
    mnemonic = layouts.get(v.element.record).ptx
    f = FRAGMENT_FORMULAS
    a = f["ldsm_a_kmajor" if v.a_kmajor else "ldsm_a_mmajor"]
    b = f["ldsm_b_kmajor" if v.b_kmajor else "ldsm_b_nmajor"]
    opts = [
        "-std=c++17",
        f"-DMX_ESIZE={v.element.esize}",
        f'-DMX_MMA_OP="{mnemonic}"',
        f"-DMX_A_KMAJOR={int(v.a_kmajor)}",
        f"-DMX_B_KMAJOR={int(v.b_kmajor)}",
        f"-DMX_BM={t.bm}",
        f"-DMX_BN={t.bn}",
        f"-DMX_BK={v.bk}",
        f"-DMX_WARPS_M={t.warps_m}",
        f"-DMX_WARPS_N={t.warps_n}",
        f"-DMX_STAGES={t.stages}",
        f"-DMX_GROUP_M={t.group_m}",
        *(["-DMX_F8_CVT=1"] if v.element.cvt else []),
        _macro("MX_LDSM_A_ROW", "lane", a[0]),
        _macro("MX_LDSM_A_CHUNK", "lane", a[1]),
        _macro("MX_LDSM_B_ROW", "lane", b[0]),
        _macro("MX_LDSM_B_CHUNK", "lane", b[1]),
    ]
    for key, (names, params) in _MACROS.items():
        opts += [_macro(names[0], params, f[key][0]), _macro(names[1], params, f[key][1])]
    return tuple(opts)


def f8_pair(v: Variant, a_elem: str, b_elem: str) -> int:
    """The kernel's last argument, ``f8_pair``, for staged operands ``a_elem`` / ``b_elem`` on variant ``v``: the fp8
    formats of a converted build (bit 0: A is e5m2, bit 1: B is e5m2; e4m3 otherwise), 0 for every other build
    (which ignores it)."""
    if not v.element.cvt:
        return 0
    return int(a_elem == "e5m2") | int(b_elem == "e5m2") << 1


# ------------------------------------------------------------------------------------------------------------
# archs, variants, tile rule
# ------------------------------------------------------------------------------------------------------------
def sm_of(arch: str) -> int:
    m = re.fullmatch(r"sm_(\d+)[af]?", arch or "")
    if not m:
        raise UnsupportedError(f"not an NVIDIA architecture: {arch!r} (expected e.g. 'sm_90')")
    return int(m.group(1))


def supported_dtypes(arch: str) -> list[str]:
    """The dtypes the CUDA kernels run on ``arch`` (none below sm_80; fp8 from sm_89)."""
    sm = sm_of(arch)
    if sm < 80:
        return []
    out = ["fp32", "tf32", "fp16", "bf16", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"]
    if sm >= 89:
        out[4:4] = ["e4m3fn", "e5m2"]
    return out


def native_fp8(arch: str) -> bool:
    """fp8 mma.sync runs natively on sm_89 (Ada) and sm_120 (Blackwell consumer); sm_90 emulates it."""
    return sm_of(arch) in (89, 120, 121)


def element_tiles(elem: str) -> tuple[str, ...]:
    """The tiles ``choose_tile`` may pick for element ``elem`` (all compiled in CI), largest first."""
    big = BIG_TILE_CVT if ELEMENTS[elem].cvt else "128x128"
    return tuple(dict.fromkeys((big, "128x128", "64x64", "32x64")))


def all_variants(arch: str) -> list[Variant]:
    """Every GEMM variant the backend can launch on ``arch``."""
    sm = sm_of(arch)
    out = []
    for e, el in ELEMENTS.items():
        if sm < el.min_sm:
            continue
        if el.esize == 1 and bool(el.cvt) == native_fp8(arch):
            continue  # native fp8 mma where the arch has it, fp8 fragments converted to f16 elsewhere
        majors = [(True, True), (True, False), (False, True), (False, False)] if el.esize == 2 else [(True, True)]
        for ak, bk in majors:
            for tile in element_tiles(e):
                out.append(Variant(e, ak, bk, tile))
    return out


def choose(a_elem: str, b_elem: str, a_kmajor: bool, b_kmajor: bool, m: int, n: int, sms: int, batch: int = 1,
           tile: str | None = None, fp8_convert: bool = True) -> Variant:
    """The mma.sync family's one rule: the build for staged operands A (``a_elem``: "f16" | "bf16" | "tf32" | "e4m3"
    | "e5m2", ``a_kmajor``) and B, ``batch`` products of m x n on ``sms`` SMs: fp8 pairs as one element (natively;
    where ``fp8_convert``, sm_90, every pair as the converted element, its formats passed at launch: :func:`f8_pair`),
    the tile by :func:`choose_tile` unless ``tile`` forces one."""
    if a_elem in ("e4m3", "e5m2"):
        if b_elem not in ("e4m3", "e5m2"):
            raise UnsupportedError(f"internal: operands staged as {a_elem} and {b_elem}")
        elem = F8_CVT if fp8_convert else f"{a_elem}.{b_elem}"
    elif b_elem != a_elem:
        raise UnsupportedError(f"internal: operands staged as {a_elem} and {b_elem}")
    else:
        elem = a_elem
    tile = tile or choose_tile(m, n, sms, elem, batch)
    if tile not in TILES:
        raise UnsupportedError(f"tile {tile!r} is not one of the CUDA kernel's tiles: {', '.join(TILES)}")
    return Variant(elem, a_kmajor, b_kmajor, tile)


def choose_tile(m: int, n: int, sms: int = 132, elem: str = "f16", batch: int = 1) -> str:
    """The tile for ``batch`` m x n outputs: 32x64 for skinny M, else the largest of ``element_tiles`` whose grid
    still has a block per SM, else 64x64."""
    if m <= table("dense")["mma_sync_tiles"]["skinny_m"]:
        return "32x64"
    for name in element_tiles(elem)[:-2]:
        t = TILES[name]
        if batch * -(-m // t.bm) * -(-n // t.bn) >= sms:
            return name
    return "64x64"


def ceiling_element(dtype: str, arch: str) -> str:
    """The ELEMENTS key of the mma that ``dtype`` runs on ``arch`` (fp8 on sm_90 runs f16 mma on converted
    fragments and every MX format is decoded to bf16 first, so they share those instructions' ceilings)."""
    d = dtype.lower()
    if d == "fp16":
        return "f16"
    if d in ("tf32", "fp32"):
        return "tf32"
    if d in ("fp8", "e4m3fn", "e4m3", "e5m2"):
        return "e4m3.e4m3" if native_fp8(arch) else "f16"
    return "bf16"
