"""Weight-only MX products on NVIDIA: fp16/bf16 activations A (M x K) times an MX weight B (K x N, E8M0 scales per
32 K), the ``"wonly"`` kind of :mod:`mxcore.dtypes`.  One function, :func:`choose`, picks the path and the kernel of a
problem from the tuning table ``tuning/wonly.json`` (values and the figures that decided them).  Two paths:

``registers``
    The weight is packed once into fragment records (``kernels_cuda/wonly_pack.cu``, ``wonly/records.py``: 4-bit
    codes two per byte placed so that a register of two 16-bit values comes out of its word in a few integer
    operations, fp6/fp8 codes one per byte, the block scales beside them; records of 8 n16 tiles per K chunk
    contiguous, K permuted inside each 32-K block so that a lane's activations of a block are 16 consecutive bytes)
    and cached on the MXTensor like any staged operand (``stage.py``, path ``"wonly"``): 0.53 bytes per element for
    mxfp4, read once per launch.  Three kernels read the records (``wonly_common.cuh`` holds what they share):

    * ``gemm_wonly_gemv.cu`` (``"gemv"``, small M on GPUs other than sm_90): each warp loads its tiles' records
      straight into registers a few chunks ahead, no shared memory, no barrier;
    * ``gemm_wonly.cu`` (``"ring"``, larger M): records and activation rows through a cp.async ring;
    * ``gemm_wonly_wg.cu`` (``"wg"``, sm_90a: every M up to 32; up to 64 with f16 activations or wide
      weights): wgmma with the decoded weight as the register-A operand, the activations gathered into swizzled
      shared memory (or loaded by tensor copy from a permuted copy of A, ``tma_x``), the block scales folded into
      the decode where :func:`fold_range` says that is exact (else an fp32 block-scale path per chunk;
      ``fold_only`` builds have no such path and run only weights whose every scale code folds), clusters sharing
      the gather (``pair``).

    On sm_90 the wgmma kernel (and a forced ``"gemv-pdl"``) launches with programmatic dependent launch
    (``RawLaunch(pdl=True)``): a launch may start while the previous kernel of the stream finishes and request its
    first records before it waits for it (``wonly_common.cuh`` says why that is safe).  The mma.sync kernels decode
    codes to the activation's 16-bit type (exact: bit placement and one multiply by a power of two), multiply with
    m16n8k16 with the weight as A and apply each 32-K block's scale in fp32.  Split K fills the GPU when the tiles
    cannot; the last block of a tile sums the fp32 partials in split order (deterministic, one launch).
``staged`` (bf16 only; bf16 with M above ``registers_max_m`` where the wgmma kernel does not run)
    B decoded once to bf16 with its block scale folded in (``stage.py``, cached on the MXTensor), then the bf16
    GEMM.  fp16 activations are refused there: a weight decoded to f16 with its scales folded in is not exact.

Numerics (both paths): A is rounded once to its 16-bit format; products are exact; fp32 accumulation.  Bound on
random inputs: |C - ref| <= (K + 2) * 2^-23 * (|A| @ |B|) (+ the output rounding; + ceil(K/32) * 2^-149 where a
block partial times a scale below 2^-126 lands among fp32 subnormals on the registers path).  On exactly
representable inputs the result is the reference's bit for bit.  A block with scale 0xFF makes every output that
reads it NaN.

Experts and tests force a kernel with the backend option ``config=``: a :class:`WonlyVariant`, its ``name``, or a
kernel form ("gemv", "gemv-pdl", "ring", "wg", "wg-tma"; the M tile and the rest as :func:`choose` fits them).
``plan.py`` (this package) holds the plan, ``records.py`` the packed records, ``formats.py`` the format table and
the fold range.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np

from mxcore.errors import UnsupportedError

from ..emit import register_jobs
from ..tables import table
from ..variants import sm_of
from .formats import byte_formats, decode_fixes, fold_range, format_entry, mx_weight_folds, wg_fold_only
from .records import PACK_FILE, GROUP, chunk_k, formula_options, record_bytes, record_groups

__all__ = ["GEMV_FILE", "KERNEL_FORMS", "TUNING", "WG_FILE", "WONLY_FILE", "WONLY_PATHS", "WonlyChoice",
           "WonlyProblem", "WonlyVariant", "all_wonly_variants", "byte_formats", "choose", "fold_range",
           "mx_weight_folds", "ring_split_cap", "wg_fold_only", "wonly_path"]

WONLY_FILE, GEMV_FILE, WG_FILE = "gemm_wonly.cu", "gemm_wonly_gemv.cu", "gemm_wonly_wg.cu"
KERNELS = {"ring": (WONLY_FILE, "mx_wonly_gemm"), "gemv": (GEMV_FILE, "mx_wonly_gemv"), "wg": (WG_FILE, "mx_wonly_wg")}
WONLY_PATHS = ("registers", "staged")
#: the kernel forms ``config=`` takes by name: (kernel, PDL, activations by tensor copy); sm_90 only where noted
KERNEL_FORMS = {"gemv": ("gemv", False, False), "gemv-pdl": ("gemv", True, False), "ring": ("ring", False, False),
                "wg": ("wg", True, False), "wg-tma": ("wg", True, True)}


#: the weight-only tuning table (tables.py; change the JSON file, with the figures that justify it)
TUNING = table("wonly")
_T = TUNING
INF = float("inf")


def _gather_warps(mt: int) -> int:
    return int(_T["wg_gather"]["warps"].get(str(mt), 1))


def wg_cps(mt: int) -> int:
    """K chunks per ring stage of the wgmma kernel with ``mt`` m8 tiles."""
    return 4 if mt <= 2 else 2


_RECORD = {"f16": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
           "bf16": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"}


@dataclass(frozen=True)
class WonlyVariant:
    """One compiled form of a weight-only kernel (what :func:`choose` returns for the registers path): the weight's
    element format, the activation type ("f16" | "bf16"), the m8 tiles per block, the kernel ("ring" | "gemv" |
    "wg") and its build parameters."""

    element: str
    act: str
    mt: int
    kernel: str = "ring"
    r: int = 0
    warps: int = 0
    pf: int = 0  # gemv: chunks in flight per warp; wg: ring stages
    cps: int = 0  # wg: K chunks per ring stage
    pdl: bool = False  # launched with programmatic dependent launch (WO_PDL; sm_90)
    fold_only: bool = False  # wg: every chunk folds (WW_FOLD_ONLY: no fp32 block-scale path)
    pair: int = 0  # wg: clusters of this many blocks share the activation gather (WW_PAIR)
    tma_x: bool = False  # wg: the activations by tensor copy from the permuted copy of X (WW_TMA)

    @classmethod
    def ring(cls, element: str, act: str, mt: int) -> "WonlyVariant":
        return cls(element, act, mt, "ring")

    @classmethod
    def gemv(cls, element: str, act: str, mt: int, pdl: bool = False) -> "WonlyVariant":
        g = _T["gemv"]
        return cls(element, act, mt, "gemv", g["r"], g["warps"], g["pf"], pdl=pdl)

    @classmethod
    def wg(cls, element: str, act: str, mt: int, pdl: bool = True, fold_only: bool = False) -> "WonlyVariant":
        return cls(element, act, mt, "wg", 1, 8, _T["wg"]["stages"], wg_cps(mt), pdl, fold_only)

    @property
    def file(self) -> str:
        return KERNELS[self.kernel][0]

    @property
    def entry(self) -> str:
        return KERNELS[self.kernel][1]

    @property
    def threads(self) -> int:
        return 32 * {"gemv": self.warps, "wg": 8 + self.gather_warps}.get(self.kernel, _T["ring"]["warps"])

    @property
    def kind_loop(self) -> bool:
        """wg, byte codes: the consumer loop is compiled once per element format and the kernel branches on the
        format once (WW_KIND_LOOP), not in every chunk (tuning: wg_kind_loop)."""
        t = _T["wg_kind_loop"]
        return (self.kernel == "wg" and not self.pack4 and not self.fold_only and self.act in t["acts"]
                and self.mt <= t["max_mt"])

    @property
    def gather_warps(self) -> int:
        """wg: the producer warps that gather the activations (per token row, or per row group)."""
        if self.kernel != "wg":
            return 0
        if self.tma_x:
            return 1  # the one producer warp: records, fold bits and the activations' tensor copies
        return _T["wg_gather"]["rows_warps"] if self.gather_rows else _gather_warps(self.mt)

    @property
    def gather_rows(self) -> bool:
        """wg: the activations gathered per token row (4-bit codes from rows_mt, 6-bit from rows6_mt), else per row
        group."""
        if self.kernel != "wg":
            return False
        g = _T["wg_gather"]
        if self.pack4:
            return self.mt >= g["rows_mt"]
        return self.spec.bits == 6 and g["rows6_mt"] is not None and self.mt >= g["rows6_mt"]

    @property
    def whole_rows(self) -> bool:
        """wg: the token-row gather of a block inside M with offsets computed once."""
        return self.gather_rows and self.mt >= _T["wg_gather"]["whole_mt"]

    @property
    def tiles(self) -> int:
        """n16 tiles per block."""
        return self.r * self.warps if self.kernel == "gemv" else GROUP

    @property
    def ctas_per_sm(self) -> int:
        """The most blocks per SM that split K aims for (fewer where fewer are resident)."""
        return {"gemv": _T["gemv"]["ctas_per_sm"], "wg": _T["wg"]["ctas_per_sm"]}.get(self.kernel,
                                                                                    _T["ring"]["ctas_per_sm"])

    @property
    def sm90(self) -> bool:
        """Whether the variant needs sm_90 (griddepcontrol; wgmma: sm_90a)."""
        return self.kernel == "wg" or self.pdl

    @property
    def arch(self) -> str | None:
        """The architecture the variant must be compiled for when not the device's own (wgmma: sm_90a)."""
        return "sm_90a" if self.kernel == "wg" else None

    @property
    def spec(self):
        from mxcore import formats

        return formats.get(self.element)

    @property
    def pack4(self) -> bool:
        return self.spec.bits == 4

    @property
    def kc(self) -> int:
        return chunk_k(self.element)

    @property
    def record_bytes(self) -> int:
        return record_bytes(self.element)

    @property
    def stages(self) -> int:
        """Depth of the cp.async ring (chunks in flight per block)."""
        return _T["ring"]["stages"]

    @property
    def smem_bytes(self) -> int:
        if self.kernel == "gemv":
            return 0
        if self.kernel == "wg":  # per stage: the activation rows (64 K x 2 bytes per token), the records; 1 KB aligned
            rows = self.cps * (self.kc // 32) // 2 * self.mt * 8 * 128
            return self.pf * (-(-(rows + self.cps * GROUP * self.record_bytes) // 1024) * 1024) + 1024
        return self.stages * (GROUP * self.record_bytes + self.mt * 8 * (192 if self.kc == 64 else 64))

    @property
    def name(self) -> str:
        tail = "_pdl" if self.pdl else ""
        if self.kernel == "wg":
            tail = (f"_s{self.pf}c{self.cps}" + ("_fold" if self.fold_only else "")
                    + ("_x" if self.tma_x else "") + (f"_p{self.pair}" if self.pair else "") + tail)
        if self.kernel in ("gemv", "wg"):
            return f"wonly_{self.kernel}_{self.act}_{self.element}_m{self.mt * 8}{tail}"
        return f"wonly_{self.act}_{self.element}_m{self.mt * 8}{tail}"

    @property
    def formats(self) -> tuple[str, ...]:
        """The element formats the build decodes (one build serves every byte-code format; e2m1 has its own)."""
        return ("e2m1",) if self.pack4 else byte_formats()

    def format_args(self, plain: bool = False) -> tuple:
        """The kernel arguments after the operands: the weight's index in the build's format table (WO_FORMATS), plus
        256 where ``plain`` (the weight holds no special code: a wgmma build with the per-format loop then decodes it
        without their fix, gemm_wonly_wg.cu) and, for the wgmma kernel, its fold range (slo, shi, eoff4 = eoff *
        0x01010101 mod 2^32: :func:`fold_range`)."""
        args = (np.uint32(self.formats.index(self.element) | (256 if plain and self.plain_twin else 0)),)
        if self.kernel == "wg":
            lo, hi, off = fold_range(self.element, self.act)
            args += (np.uint32(lo), np.uint32(hi), np.uint32((off * 0x01010101) & 0xFFFFFFFF))
        return args

    def finish_options(self) -> tuple:
        """The split-K finish's -D (wonly_common.cuh: items per thread, partials loaded at once), by the build's m8
        tiles (tuning: splitk_finish)."""
        t = _T["splitk_finish"]["one_tile" if self.mt == 1 else "wider"]
        return f"-DWO_FIN={t['items']}", f"-DWO_FIN_Z={t['partials']}"

    @property
    def plain_twin(self) -> bool:
        """Whether the build decodes a weight without special codes through its format's plain twin: the wgmma
        kernel's per-format loop, for a format whose decode fixes them (:func:`decode_fixes`)."""
        return self.kernel == "wg" and self.kind_loop and decode_fixes(self.element, self.act)

    def options(self) -> tuple:
        from mxcore import layouts

        ring = _T["ring"]
        table = ", ".join(format_entry(e, self.act) for e in self.formats)
        return ("-std=c++17", f"-DWO_PACK4={int(self.pack4)}", f"-DWO_FORMATS={{{table}}}",
                f"-DWO_BF16={int(self.act == 'bf16')}", f"-DWO_MT={self.mt}",
                *{"gemv": (f"-DWG_R={self.r}", f"-DWG_WARPS={self.warps}", f"-DWG_PF={self.pf}"),
                  "wg": ("--gpu-architecture=sm_90a", f"-DWW_STAGES={self.pf}", f"-DWW_CPS={self.cps}",
                         f'-DWW_MMA_ASM="{_wgmma_asm(self.mt, self.act)}"', f"-DWW_FOLD_ONLY={int(self.fold_only)}",
                         f"-DWW_GATHER_WARPS={self.gather_warps}",
                         f"-DWW_GATHER_ROWS={int(self.gather_rows)}",
                         f"-DWW_WHOLE={int(self.whole_rows)}",
                         f"-DWW_PAIR={self.pair}", f"-DWW_TMA={int(self.tma_x)}",
                         f"-DWW_KIND_LOOP={int(self.kind_loop)}"),
                  "ring": (f"-DWO_R={GROUP // ring['warps']}", f"-DWO_WARPS={ring['warps']}",
                           f"-DWO_STAGES={self.stages}")}[self.kernel],
                *self.finish_options(), f"-DWO_PDL={int(self.pdl)}",
                f'-DWO_MMA="{layouts.get(_RECORD[self.act]).ptx}"', *formula_options())


# ------------------------------------------------------------------------------------------------------------------
# the choice
# ------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WonlyProblem:
    """What decides a weight-only kernel: M (rows of A; a batch folded in), N, K, the activation type ("f16" |
    "bf16"), the weight's element format (``"e2m1"``...), the device's arch and SM count, and whether every scale
    code of the weight lies in the fold range (``folds``: True | False | None, not known: asked through
    ``ask_folds`` only where the choice depends on it)."""

    m: int
    n: int
    k: int
    act: str
    element: str
    arch: str
    sms: int
    folds: bool | None = None


@dataclass(frozen=True)
class WonlyChoice:
    """:func:`choose`'s answer: the path ("registers" | "staged") and, on the registers path, the kernel build."""

    path: str
    variant: WonlyVariant | None = None


def _sm90(arch: str) -> bool:
    return bool(arch) and sm_of(arch) == 90


def _mt(choices, m: int) -> int:
    return next((x for x in choices if 8 * x >= m), choices[-1])


def _bits(element: str) -> int:
    from mxcore import formats

    return formats.get(element).bits


def _wg(p: WonlyProblem, folds) -> bool:
    """Whether the wgmma kernel runs ``p`` (tuning: wg): on sm_90, every M up to any_width_m; above it, M up to max_m
    for f16 activations, and for bf16 on weights of more than narrow_share (by the codes' bits) record groups per SM
    (narrower ones take the staged path), bf16 x byte codes above byte_max_m only where every scale code folds (the
    fold-only build)."""
    t = _T["wg"]
    if not _sm90(p.arch):
        return False
    if p.m <= t["any_width_m"]:
        return True
    if p.m > t["max_m"]:
        return False
    if p.act != "bf16":
        return True
    if record_groups(p.n) <= t["narrow_share"][str(_bits(p.element))] * p.sms:
        return False
    return p.m <= t["byte_max_m"] or _bits(p.element) != 8 or folds()


def wg_tma(v: WonlyVariant, blocks: int, sms: int) -> bool:
    """Whether wgmma variant ``v`` (without clusters) loads its activations by tensor copy in a launch of ``blocks``
    blocks before any K split on ``sms`` multiprocessors (tuning: wg_tma)."""
    t = _T["wg_tma"]
    if v.kernel != "wg" or t["mt"] is None or v.mt < t["mt"]:
        return False
    return blocks >= sms or v.mt >= t["any_mt"].get(str(v.spec.bits), 99)


def wg_pair(v: WonlyVariant, groups: int) -> int:
    """The blocks per cluster of wgmma variant ``v`` on ``groups`` record groups (tuning: wg_pair; 0: none)."""
    t = _T["wg_pair"]
    ok = v.gather_rows and not v.tma_x and v.mt >= t["mt"] and groups % t["size"] == 0
    return t["size"] if ok and 8 * v.mt % (t["size"] * v.gather_warps) == 0 else 0


def _fit(p: WonlyProblem, kernel: str, pdl: bool, folds, tma_x: bool | None = None) -> WonlyVariant:
    """The build of ``kernel`` for ``p``: the M tile, the fold-only build above wgmma's row block where every scale
    code folds, the activations by tensor copy and clusters where the table says (``tma_x``: forced either way)."""
    if kernel == "wg":
        mt = _mt(_T["wg"]["mt"], p.m)
        if p.m > 8 * mt and folds():
            v = WonlyVariant.wg(p.element, p.act, _mt(_T["wg_fold"]["mt"], p.m), pdl, fold_only=True)
        else:
            v = WonlyVariant.wg(p.element, p.act, mt, pdl)
    elif kernel == "gemv":
        v = WonlyVariant.gemv(p.element, p.act, _mt(_T["gemv"]["mt"], p.m), pdl)
    else:
        v = WonlyVariant.ring(p.element, p.act, _mt(_T["ring"]["mt"], p.m))
    groups = record_groups(p.n)
    if tma_x is None:
        tma_x = wg_tma(v, -(-groups * GROUP // v.tiles) * -(-p.m // (8 * v.mt)), p.sms)
    if tma_x:
        v = replace(v, tma_x=True)
    pair = wg_pair(v, groups)
    return replace(v, pair=pair) if pair else v


def _folds_of(p: WonlyProblem, ask_folds):
    """The fold question of ``p`` as a memoized zero-argument callable (asked once, only where needed)."""
    memo: list = []

    def folds() -> bool:
        if p.folds is not None:
            return p.folds
        if not memo:
            memo.append(bool(ask_folds()) if ask_folds is not None else False)
        return memo[0]

    return folds


def _path(p: WonlyProblem, path: str | None, config, folds) -> str:
    if path is not None and path not in WONLY_PATHS:
        raise UnsupportedError(f"wonly_path={path!r}; choose one of {', '.join(WONLY_PATHS)} (or None: the rule)")
    if path == "staged" and p.act != "bf16":
        raise UnsupportedError(f"wonly_path='staged' decodes the weight to bf16 and multiplies bf16; {p.act} "
                               f"activations run on wonly_path='registers'")
    if config is not None:
        if path == "staged":
            raise UnsupportedError("config= picks a kernel of the registers path; wonly_path='staged' runs the bf16 "
                                   "GEMM (choose its kernel with tile= or family=)")
        return "registers"
    if path is not None:
        return path
    if p.act != "bf16" or p.m <= _T["registers_max_m"]["value"] or _wg(p, folds):
        return "registers"
    return "staged"


def wonly_path(p: WonlyProblem, path: str | None = None, config=None, ask_folds=None) -> str:
    """The path :func:`choose` takes for ``p`` ("registers" | "staged"), without fitting a kernel (the fold question
    is asked only where the path depends on it)."""
    return _path(p, path, config, _folds_of(p, ask_folds))


def choose(p: WonlyProblem, path: str | None = None, config=None, ask_folds=None) -> WonlyChoice:
    """The path and kernel build for problem ``p`` from the tuning table (``path``: "registers" | "staged" forces
    the path; ``config``: a :class:`WonlyVariant`, its name, or a kernel form of :data:`KERNEL_FORMS` forces the
    kernel; ``ask_folds()``: whether every scale code of the weight folds, asked only where the choice depends on it
    when ``p.folds`` is None).  Pure: the same problem always gets the same answer."""
    folds = _folds_of(p, ask_folds)
    if _path(p, path, config, folds) == "staged":
        return WonlyChoice("staged")
    if config is not None:
        return WonlyChoice("registers", _forced(p, config, folds))
    sm90 = _sm90(p.arch)
    if sm90:
        kernel = "wg" if _wg(p, folds) else "ring"
    else:
        kernel = "gemv" if p.m <= _T["gemv_max_m"]["value"] else "ring"
    pdl = sm90 and kernel != "ring" and _T["sm90_pdl"]["value"]
    return WonlyChoice("registers", _fit(p, kernel, pdl, folds))


def _forced(p: WonlyProblem, config, folds) -> WonlyVariant:
    """The build that ``config=`` names for ``p`` (see :func:`choose`)."""
    sm90 = _sm90(p.arch)
    if isinstance(config, WonlyVariant):
        v = config
        if (v.element, v.act) != (p.element, p.act):
            raise UnsupportedError(f"config={v.name} multiplies {v.act} x {v.element}; this product is "
                                   f"{p.act} x {p.element}")
    elif isinstance(config, str) and config in KERNEL_FORMS:
        v = _fit_form(p, config, folds)
    elif isinstance(config, str):
        names = {v.name: v for v in _candidates(p)}
        if config not in names:
            raise UnsupportedError(f"config={config!r} names no weight-only build for {p.act} x {p.element}; give a "
                                   f"kernel form ({', '.join(KERNEL_FORMS)}), a WonlyVariant, or one of: "
                                   f"{', '.join(sorted(names))}")
        v = names[config]
    else:
        raise UnsupportedError(f"config= takes a WonlyVariant, its name or a kernel form ({', '.join(KERNEL_FORMS)}), "
                               f"not {type(config).__name__}")
    if v.sm90 and not sm90:
        raise UnsupportedError(f"config={v.name} runs on sm_90 only (this GPU is {p.arch})")
    if v.fold_only and not folds():
        raise UnsupportedError(f"config={v.name} is a fold-only build; this weight has scale codes outside "
                               f"fold_range({p.element!r}, {p.act!r})")
    return v


def _fit_form(p: WonlyProblem, form: str, folds) -> WonlyVariant:
    """The build kernel form ``form`` (:data:`KERNEL_FORMS`) fits to ``p``: the wgmma forms fix the activations'
    tensor copy either way, the others leave it to the table."""
    kernel, pdl, tma_x = KERNEL_FORMS[form]
    return _fit(p, kernel, pdl, folds, tma_x if kernel == "wg" else None)


def _candidates(p: WonlyProblem) -> list:
    """Every build a kernel form fits to ``p``, for a weight whose scale codes fold or not (the names config= takes
    besides the forms)."""
    return [_fit_form(p, form, lambda fo=fo: fo) for form in KERNEL_FORMS for fo in (False, True)]


#: the grid over which the default choice is enumerated (all_wonly_variants: the builds compiled, checked and shipped)
GRID_M = (1, 2, 4, 8, 9, 16, 17, 24, 32, 33, 40, 48, 56, 64, 65, 128)
GRID_N = (256, 1024, 2048, 4096, 8192, 14336, 28672, 57344)
GRID_SMS = {80: (108,), 86: (84,), 89: (128,), 90: (132, 114)}


@functools.lru_cache(maxsize=None)
def all_wonly_variants(arch: str = "sm_80") -> list:
    """Every build :func:`choose` returns on ``arch`` over a grid of M, N, activation types, element formats and
    fold answers (GRID_M, GRID_N, GRID_SMS): what is compiled and checked offline (``kernels --emit``).  Builds
    that only ``config=`` names compile on first use."""
    from mxcore import dtypes as _dt

    elements = list(dict.fromkeys(_dt.MX_ELEMENT.values()))
    out: dict = {}
    for sms in GRID_SMS.get(sm_of(arch), (108,)):
        for act in ("f16", "bf16"):
            for e in elements:
                for m in GRID_M:
                    for n in GRID_N:
                        for folds in (False, True):
                            c = choose(WonlyProblem(m, n, 4096, act, e, arch, sms, folds))
                            if c.variant is not None:
                                out[c.variant] = None
    return list(out)


def _wgmma_asm(mt: int, act: str) -> str:
    """The wg kernel's ``wgmma.mma_async m64n(8 mt)k16`` with A from registers, as one line of inline PTX whose
    operands are numbered as ww_mma passes them: the 4 mt accumulators, the 4 A registers, B's descriptor, and
    whether to accumulate (the scale-d predicate)."""
    from mxcore.layouts import hopper

    fmt = {"f16": "fp16", "bf16": "bf16"}[act]
    nd = 4 * mt
    d = ", ".join(f"%{i}" for i in range(nd))
    a = ", ".join(f"%{nd + i}" for i in range(4))
    return (f"{{ .reg .pred p; setp.ne.b32 p, %{nd + 5}, 0; {hopper.wgmma_ptx(8 * mt, fmt, fmt)} {{{d}}}, {{{a}}}, "
            f"%{nd + 4}, p, 1, 1, 0; }}")



# ------------------------------------------------------------------------------------------------------------------
# how a launch is sized (the plan, wonly/plan.py, applies them)
# ------------------------------------------------------------------------------------------------------------------
def _splits(sms: int, base: int, nchunks: int, force: int = 0, per_sm: int = 4,
            one_wave: bool = False, cap: int = 64) -> tuple[int, int]:
    """(splits, chunks per split): enough blocks for ``per_sm`` per SM when the tiles alone cannot give them
    (``one_wave``: at most ``per_sm`` per SM), at most ``cap`` splits unless ``force``d."""
    fill = (per_sm * sms // max(base, 1)) if one_wave else -(-per_sm * sms // max(base, 1))
    want = force or (1 if base >= 2 * sms else max(1, min(fill, cap, 64, max(1, nchunks // 4))))
    per = -(-nchunks // max(1, want))
    return -(-nchunks // per), per


def ring_split_cap(m: int, n_padded: int, weight_bytes: int) -> int:
    """The most K splits of the cp.async ring: each split writes an fp32 partial of M x N that the finishing block
    reads back (8 M N bytes of traffic), kept to 1 / ring.ws_share of the packed weight's bytes (tuning table)."""
    return max(1, weight_bytes // (_T["ring"]["ws_share"] * 8 * max(m, 1) * max(n_padded, 1)))


def _even_smem(props: dict, blocks: int, sms: int, resident: int, smem: int, static: int) -> int:
    """Dynamic shared memory for a one-wave grid of ``blocks`` launched with PDL: enough that an SM holds at most
    ceil(blocks / sms) of them.  A PDL launch's blocks start on the SMs its predecessor frees first, which would
    otherwise take up to ``resident`` blocks each and leave the last ones idle (H200, 16 x 28672 x 8192 on the
    direct-load kernel: 145 us with PDL against 119 without, before this)."""
    cap = -(-blocks // max(sms, 1))
    if cap >= resident:
        return smem
    per_sm = props.get("sharedMemPerMultiprocessor", 233472) // cap - props.get("reservedSharedMemPerBlock", 1024)
    want = min(per_sm - static, props.get("sharedMemPerBlockOptin", 232448) - static) // 128 * 128
    return max(smem, want)


def compile_jobs(arch: str) -> list[dict]:
    """This family's builds for ``kernels --emit`` and the offline checks (registered with ``emit.py``): every build
    :func:`choose` returns on ``arch`` (:func:`all_wonly_variants`) and the packing kernel."""
    jobs = [{"file": w.file, "kernel": w.entry, "stem": w.name, "family": "wonly", **({"arch": w.arch} if w.arch else {}),
             "dtype": f"{w.act} x mx {w.element} (weight-only, registers, {w.kernel}{', PDL' if w.pdl else ''})",
             "options": [o for o in w.options() if not o.startswith("--gpu-architecture")],
             "smem": w.smem_bytes, "threads": w.threads, "mma": "HGMMA" if w.kernel == "wg" else "HMMA",
             "cp_async": w.kernel in ("ring", "wg")}
            for w in all_wonly_variants(arch)]
    jobs.append({"file": PACK_FILE, "kernel": "mx_wonly_pack", "stem": "wonly_pack", "family": "wonly",
                 "dtype": "weight-only packing", "options": ["-std=c++17", *formula_options()], "smem": 0,
                 "threads": 256})
    return jobs


register_jobs("wonly", compile_jobs)
