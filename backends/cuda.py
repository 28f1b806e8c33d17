"""NVIDIA backend: our own mma.sync / ldmatrix / cp.async GEMM kernels, compiled at run time by CuPy (NVRTC).

Kernels (``kernels_cuda/``):

* ``gemm.cu`` — one GEMM family, specialised by ``-D`` defines: element size (16-bit ``m16n8k16``, tf32
  ``m16n8k8``, fp8 ``m16n8k32``), A/B majorness, block/warp tile, pipeline depth.  cp.async (16 bytes, zero fill
  past M/N/K) into an XOR-swizzled multi-stage shared-memory ring, ldmatrix(.trans) into mma fragments,
  fp32 accumulation, one epilogue that scales by a power of two and writes fp32/fp16/bf16 (paired stores).
  Full K tiles are copied through a precomputed per-thread plan (~4.5 instructions per cp.async; blocks whose
  tile lies inside M and N copy with no predicate or zero fill at all); a partial last K tile is multiplied
  first, through the fully predicated path.  Split K (fp32 slices + an ordered reduction,
  deterministic) when the output tiles cannot fill the GPU and K is long (e.g. 16x8192x8192).
* ``gemm_prep.cu`` — operand preparation on the GPU: rounding (RNE) to f16/bf16/tf32, the 3xTF32 split,
  fp8/fp6/fp4 decoding with the E8M0 block scale folded in (table decode, elementwise in the operand's own
  layout when its contiguous dimension is a multiple of 8, else a transposing/padding copy), the fp8 byte
  transpose (B to K-major for the fp8 kernels), the split-K reduction.
* ``gemm_ceiling.cu`` — a register-only mma loop (the benchmark's instruction ceiling).

Tiles (``choose_tile``, per element): the element's large tile when the output has at least one block per SM —
128x128 (4 warps of 64x64, 4 stages of 64-byte K rows, two blocks per SM); for fp8 converted to f16, 128x128
with 128-byte K rows — then 128x128; 32x64 for M <= 32, else 64x64.

How each dtype runs (all accumulate in fp32 on tensor cores):

=============  ===============================================================================================
fp16, bf16     inputs rounded once (RNE) to the dtype; ``m16n8k16``.  Fast paths: all four majorness
               combinations (ldmatrix for K-contiguous, ldmatrix.trans for M/N-contiguous operands) when the
               operand is already in the dtype, has one unit stride, a 16-byte aligned base and leading
               dimension; anything else is first copied by ``mx_prep_float`` (K-major, padded).
tf32           inputs rounded to tf32 with RNE (``mx_prep_float``: fp32 bits in integer arithmetic; float64
               inputs first to fp32, as mxcore.operands does), then ``m16n8k8``; the hardware reads the
               pre-rounded bits exactly.
fp32           3xTF32: x = big + small with big = rne_tf32(x), small = rne_tf32(x - big);
               A'·B' over K' = 3K with A' = [big_A | big_A | small_A], B' = [big_B ; small_B ; big_B], i.e.
               big·big + big·small + small·big in one fp32 accumulator.  Dropped: small·small (≤ 2^-22
               relative per product) and the tf32 rounding of the residual (≤ 2^-22): per product ≤ 2^-20
               relative, so |err| ≤ (K+2)·2^-23·Σ|ab| + 2^-20·Σ|ab| (tested), typically ~1e-6 relative.
fp8            e4m3fn/e5m2 and mixed pairs, per-tensor power-of-two scales (host quantization through
               ``mxcore.operands.prepare``) applied in the epilogue (exact: a power of two).  sm_89 / sm_120:
               native ``m16n8k32`` (K-major fp8 bytes).  sm_90 (and any arch without native fp8 mma): the
               same K-major fp8 bytes travel through cp.async and ldmatrix; each mma step's fragments are
               converted ONCE to f16 in registers (``cvt.rn.f16x2.e4m3x2/e5m2x2``, exact) and multiplied by
               two f16 ``m16n8k16`` accumulating directly.  (``m16n8k32`` fp8 itself compiles on sm_90 to the same
               conversions plus two HMMA into fresh accumulators and 4 FADD per mma, and spills at 64x64 warp
               tiles: 702 loop instructions per 128 HMMA against 474.)  A in C order is read in place, B in C
               order is transposed once per call (``mx_transpose_bytes``).  ``fp8_path = "decode"`` instead
               decodes whole operands to f16 (``mx_decode_codes``) and runs the f16 kernel (2 bytes per
               element in memory; equal speed with preparation at 8192^3, see NOTES_CUDA.md).
MX             mxfp8 (e4m3/e5m2), mxfp6 (e2m3/e3m2), mxfp4 and mixed pairs.  Codes and E8M0 scales from
               ``mxcore.operands.prepare`` (OCP v1.0, host); the device decodes each element with its block
               scale folded in, value·2^(scale - smax), to bf16, and the epilogue multiplies by
               2^(smax_A - 127) · 2^(smax_B - 127) (smax: the tensor's largest finite scale code).
               Exactness: every fp8/fp6/fp4 value has ≤ 4 significant bits, so value·2^e is exact in bf16
               (8 bits) whenever it stays ≥ 2^-133 (bf16's smallest subnormal step): i.e. when a tensor's
               block scales span at most 133 + log2(min_subnormal) binades (e4m3 124, e5m2 117, e2m3 130,
               e3m2 129, e2m1 132).  Blocks further below the largest are rounded once (RNE) to bf16 —
               they are ≥ 2^117 times smaller than the largest block.  bf16·bf16 products are exact in
               fp32; so the kernel equals the reference (exact products, block scales per 32 K, one sum)
               up to fp32 accumulation.
=============  ===============================================================================================

Accuracy bound (tested on random normal inputs): |out - ref| ≤ (K + 2)·2^-23·(|A|@|B|) (+ the output rounding
for fp16/bf16 outputs), ref and |A|, |B| from the decoded operands.  On exactly representable inputs (every
partial sum exact in fp32) the result equals ``mxcore.reference`` bit for bit.

Inputs: CuPy arrays are used in place (or copied once by the prep kernels); numpy inputs are quantized on the
host by ``mxcore.operands.prepare``, copied to the device, and the result comes back as numpy; torch CUDA
tensors are shared through DLPack and a torch tensor comes back.  CuPy has no bfloat16: a bf16 result for
CuPy inputs is a ``uint16`` array of bf16 bits.

Fragment index arithmetic: the ldmatrix lane addresses and the accumulator coordinates the kernel uses come
from :data:`FRAGMENT_FORMULAS` (emitted as ``-D`` macros); tests/test_cuda_index.py checks them against
``mxcore.layouts`` (the ldmatrix movement records composed with these addresses must give the mma records'
``coords``).  The mma mnemonic is the layout record's ``ptx`` string.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BackendUnavailableError, UnsupportedError

__all__ = [
    "ELEMENTS",
    "FRAGMENT_FORMULAS",
    "TILES",
    "CudaBackend",
    "Variant",
    "all_variants",
    "choose_tile",
    "gemm_options",
]

# ------------------------------------------------------------------------------------------------------------
# the single source of the kernel's fragment index formulas (C and Python share the syntax: & >> << + only)
# ------------------------------------------------------------------------------------------------------------
# ldmatrix.x4: lane -> (tile row, 16-byte chunk) whose address it supplies, relative to the 16x(32 bytes)
# sub-tile of one mma step.  K-major operands use ldmatrix (rows = m or n, chunks along k); M/N-major operands
# (16-bit only) use ldmatrix.trans (rows = k, chunks along m or n).  For B the x4 covers two n8 blocks:
# registers 0,1 are b0,b1 of the first, 2,3 of the second.
# Accumulator: lane, register i -> (row, col) in the 16x8 tile.
FRAGMENT_FORMULAS = {
    "ldsm_a_kmajor": ("lane & 15", "lane >> 4"),
    "ldsm_a_mmajor": ("(lane & 7) + ((lane >> 4) << 3)", "(lane >> 3) & 1"),
    "ldsm_b_kmajor": ("(lane & 7) + ((lane >> 4) << 3)", "(lane >> 3) & 1"),
    "ldsm_b_nmajor": ("(lane & 7) + (((lane >> 3) & 1) << 3)", "lane >> 4"),
    "c": ("(lane >> 2) + ((i >> 1) << 3)", "((lane & 3) << 1) + (i & 1)"),
}


def eval_formula(expr: str, lane, i=0):
    """Evaluate one formula in Python (numpy arrays or ints) exactly as the C preprocessor expands it."""
    if not re.fullmatch(r"[\sa-z0-9&>|<+()]*", expr):
        raise ValueError(f"formula {expr!r} uses operators outside & >> << + ( )")
    return eval(expr, {"__builtins__": {}}, {"lane": lane, "i": i})


def _macro(name: str, params: str, expr: str) -> str:
    body = re.sub(r"\b(lane|i)\b", r"(\1)", expr)
    return f"-D{name}({params})=({body})"


# ------------------------------------------------------------------------------------------------------------
# kernel variants
# ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Element:
    """What the GEMM kernel reads: element size in bytes and the mma record (a mxcore.layouts name)."""

    name: str
    esize: int
    record: str
    min_sm: int = 80
    cvt: tuple[str, str] | None = None  # fp8 fragments converted in registers to f16 (A, B cvt source types)


ELEMENTS = {
    "f16": Element("f16", 2, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"),
    "bf16": Element("bf16", 2, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
    "tf32": Element("tf32", 4, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
    "e4m3.e4m3": Element("e4m3.e4m3", 1, "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", 89),
    "e4m3.e5m2": Element("e4m3.e5m2", 1, "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32", 89),
    "e5m2.e4m3": Element("e5m2.e4m3", 1, "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e4m3.f32", 89),
    "e5m2.e5m2": Element("e5m2.e5m2", 1, "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32", 89),
}
# fp8 where mma.sync fp8 is not native (sm_90): fp8 bytes in memory and shared memory, fragments loaded in the
# m16n8k32 layout, converted once per mma step to f16 and multiplied by two m16n8k16 (gemm.cu MX_F8_CVT)
for _pair in ("e4m3.e4m3", "e4m3.e5m2", "e5m2.e4m3", "e5m2.e5m2"):
    ELEMENTS[f"{_pair}.f16"] = Element(f"{_pair}.f16", 1, ELEMENTS["f16"].record, 89,
                                       cvt=tuple(f"{x}x2" for x in _pair.split(".")))


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
    frag_db: bool = False  # double-buffer the mma fragments in registers
    mbar: bool = False  # hand stages over with mbarriers (no __syncthreads per K tile)
    lag: int = 1  # with mbar: tile kt refills the stage of tile kt - lag

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n


# The tiles the backend launches (chosen per element and shape by choose_tile; each element's are compiled in
# CI, see element_tiles).  128x128 with 4 warps of 64x64 runs two blocks per SM; on an H100 it was the best or
# near-best 16-bit tile of the sweeps below at 4096^3 and 8192^3 for all majorness (see NOTES_CUDA.md).
TILES = {
    "128x128": Tile("128x128", 128, 128, 64, 2, 2, 4),
    "64x64": Tile("64x64", 64, 64, 64, 2, 2, 4),
    "32x64": Tile("32x64", 32, 64, 64, 1, 2, 4),
    "128x128k128s3": Tile("128x128k128s3", 128, 128, 128, 2, 2, 3),  # fp8 converted to f16 (128 fp8 per K row)
}
# tuning candidates: launchable with ``force_tile`` / ``bench --tile``, not compiled in CI
EXTRA_TILES = {
    "128x256": Tile("128x256", 128, 256, 64, 2, 4, 4),
    "128x256k128s3": Tile("128x256k128s3", 128, 256, 128, 2, 4, 3),
    "128x256k64s5": Tile("128x256k64s5", 128, 256, 64, 2, 4, 5),
    "256x128k64s4": Tile("256x128k64s4", 256, 128, 64, 4, 2, 4),
    "256x128k128s3": Tile("256x128k128s3", 256, 128, 128, 4, 2, 3),
    "128x128k64s3": Tile("128x128k64s3", 128, 128, 64, 2, 2, 3),
    "128x256db": Tile("128x256db", 128, 256, 64, 2, 4, 4, frag_db=True),
    "128x256k128s3db": Tile("128x256k128s3db", 128, 256, 128, 2, 4, 3, frag_db=True),
    "128x128db": Tile("128x128db", 128, 128, 64, 2, 2, 4, frag_db=True),
    "128x128k128s3db": Tile("128x128k128s3db", 128, 128, 128, 2, 2, 3, frag_db=True),
    "128x128w8": Tile("128x128w8", 128, 128, 64, 2, 4, 4),
    "128x128w8db": Tile("128x128w8db", 128, 128, 64, 2, 4, 4, frag_db=True),
    "128x128s3db": Tile("128x128s3db", 128, 128, 64, 2, 2, 3, frag_db=True),
    "128x128g16db": Tile("128x128g16db", 128, 128, 64, 2, 2, 4, group_m=16, frag_db=True),
    "256x128db": Tile("256x128db", 256, 128, 64, 4, 2, 4, frag_db=True),
    "128x128k128s4": Tile("128x128k128s4", 128, 128, 128, 2, 2, 4),
    # deeper pipelines for 128x128 (two blocks per SM still fit: 2 x 80 / 96 KB); not yet timed, see NOTES_CUDA.md
    "128x128s5": Tile("128x128s5", 128, 128, 64, 2, 2, 5),
    "128x128s6": Tile("128x128s6", 128, 128, 64, 2, 2, 6),
    # mbarrier hand-over (no per-tile __syncthreads): the large tiles that halve L2 traffic per FLOP
    "128x128mb": Tile("128x128mb", 128, 128, 64, 2, 2, 4, mbar=True),
    "128x128s5mbl2": Tile("128x128s5mbl2", 128, 128, 64, 2, 2, 5, mbar=True, lag=2),
    "256x128s6mb": Tile("256x128s6mb", 256, 128, 64, 4, 2, 6, mbar=True),
    "256x128s6mbl2": Tile("256x128s6mbl2", 256, 128, 64, 4, 2, 6, mbar=True, lag=2),
    "128x256s6mb": Tile("128x256s6mb", 128, 256, 64, 2, 4, 6, mbar=True),
    "128x256s6mbl2": Tile("128x256s6mbl2", 128, 256, 64, 2, 4, 6, mbar=True, lag=2),
    "256x128k128s4mb": Tile("256x128k128s4mb", 256, 128, 128, 4, 2, 4, mbar=True),
    "128x256k128s4mbl2": Tile("128x256k128s4mbl2", 128, 256, 128, 2, 4, 4, mbar=True, lag=2),
}
TILES.update(EXTRA_TILES)


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
        barriers = 16 * t.stages if t.mbar else 0  # a full and an empty mbarrier per stage
        return t.stages * (t.bm + t.bn) * t.bk_bytes + barriers  # rows x (BK bytes) for either majorness

    @property
    def threads(self) -> int:
        return TILES[self.tile].threads


def gemm_options(v: Variant) -> list[str]:
    """NVRTC options (all -D) that specialise gemm.cu into variant ``v``."""
    from mxcore import layouts

    t = TILES[v.tile]
    mnemonic = layouts.get(v.element.record).ptx
    f = FRAGMENT_FORMULAS
    a = f["ldsm_a_kmajor" if v.a_kmajor else "ldsm_a_mmajor"]
    b = f["ldsm_b_kmajor" if v.b_kmajor else "ldsm_b_nmajor"]
    return [
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
        f"-DMX_FRAG_DB={int(t.frag_db)}",
        f"-DMX_MBAR={int(t.mbar)}",
        f"-DMX_LAG={t.lag}",
        *([f"-DMX_F8_CVT=1", f'-DMX_A_CVT="{v.element.cvt[0]}"', f'-DMX_B_CVT="{v.element.cvt[1]}"']
          if v.element.cvt else []),
        _macro("MX_LDSM_A_ROW", "lane", a[0]),
        _macro("MX_LDSM_A_CHUNK", "lane", a[1]),
        _macro("MX_LDSM_B_ROW", "lane", b[0]),
        _macro("MX_LDSM_B_CHUNK", "lane", b[1]),
        _macro("MX_C_ROW", "lane,i", f["c"][0]),
        _macro("MX_C_COL", "lane,i", f["c"][1]),
    ]


def _sm(arch: str) -> int:
    m = re.fullmatch(r"sm_(\d+)[af]?", arch or "")
    if not m:
        raise UnsupportedError(f"not an NVIDIA architecture: {arch!r} (expected e.g. 'sm_90')")
    return int(m.group(1))


def native_fp8(arch: str) -> bool:
    """fp8 mma.sync runs natively on sm_89 (Ada) and sm_120 (Blackwell consumer); sm_90 emulates it."""
    return _sm(arch) in (89, 120, 121)


def all_variants(arch: str) -> list[Variant]:
    """Every GEMM variant the backend can launch on ``arch``."""
    sm = _sm(arch)
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


# The large tile per element, measured on an H100 (NOTES_CUDA.md, round 3): 128x128 (4 warps, two blocks per SM)
# for every element; fp8 converted to f16 reads 128-byte K rows (128 fp8, 3 stages): +7 % at 8192^3 over 64-byte
# rows.  (tf32 with 128x256 / mbarriers measured 0.98x of 128x128 in the benchmark: not taken.)
BIG_TILE_CVT = "128x128k128s3"


def element_tiles(elem: str) -> tuple[str, ...]:
    """The tiles ``choose_tile`` may pick for element ``elem`` (all compiled in CI), largest first."""
    el = ELEMENTS[elem]
    big = BIG_TILE_CVT if el.cvt else "128x128"
    return tuple(dict.fromkeys((big, "128x128", "64x64", "32x64")))


def choose_tile(m: int, n: int, sms: int = 132, elem: str = "f16") -> str:
    """The tile for an m x n output: 32x64 for skinny M, else the largest of ``element_tiles`` whose grid still
    has a block per SM, else 64x64."""
    if m <= 32:
        return "32x64"
    for name in element_tiles(elem)[:-2]:
        t = TILES[name]
        if -(-m // t.bm) * -(-n // t.bn) >= sms:
            return name
    return "64x64"


PREP_FILE, GEMM_FILE, CEILING_FILE = "gemm_prep.cu", "gemm.cu", "gemm_ceiling.cu"
_SRC_KIND = {"f64": 0, "f32": 1, "f16": 2, "bf16": 3}
_DST_KIND = {"f16": 0, "bf16": 1, "tf32": 2, "tf32_small": 3, "byte": 4}
_OUT_KIND = {"float32": 0, "float16": 1, "bfloat16": 2}
_SPECIAL = {"none": 0, "fn": 1, "ieee": 2}


def _source(filename: str) -> str:
    from mxcore.kernels import kernel_source

    return kernel_source("nvidia", filename)


# ------------------------------------------------------------------------------------------------------------
# device operands
# ------------------------------------------------------------------------------------------------------------
@dataclass
class _DevOperand:
    """An operand as the GEMM kernel reads it."""

    buf: object          # cupy array (kept alive) whose data pointer the kernel reads
    ld: int              # leading dimension in elements
    kmajor: bool
    elem: str            # "f16" | "bf16" | "tf32" | "e4m3" | "e5m2"
    exp: int = 0         # the operand's values are multiplied by 2^exp in the epilogue
    k: int = 0           # K as the kernel sees it (3xTF32 triples it)


def _max_finite_scale(scales) -> int:
    s = np.asarray(scales)
    finite = s[s != 0xFF]
    return int(finite.max()) if finite.size else 127


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _pow2_exponent(scale: float) -> int:
    mant, e = math.frexp(float(scale))
    if mant != 0.5:
        raise UnsupportedError(f"per-tensor scale {scale!r} is not a power of two")
    return e - 1


@dataclass
class _Uploaded:
    arr: object
    kind: str


class _Plan:
    """Staged operands + output; ``gemm()`` launches the GEMM kernel, ``prep()`` the device-side preparation."""

    def __init__(self, be, cp, stream, da, db, out, m, n, k, arch, out_dtype, prep, kinds, inputs):
        self.be, self.cp, self.stream = be, cp, stream
        self.da, self.db, self.out = da, db, out
        self.m, self.n, self.k, self.arch, self.out_dtype = m, n, k, arch, out_dtype
        self._prep, self.kinds, self.inputs = prep, kinds, inputs
        self.variant = None

    def gemm(self):
        if self.da.k == 0:
            self.out.fill(0)
            return None
        self.variant = self.be._launch(self.cp, self.da, self.db, self.out, self.m, self.n, self.arch,
                                       self.out_dtype)
        return self.variant

    def prep(self):
        return self._prep()

    # benchmark diagnostics: the GEMM's own kernel with parts of its main loop removed (gemm.cu MX_DIAG); the
    # output is NOT the product afterwards (run gemm() again before result())
    DIAGNOSTICS = {"smem": 1, "mma": 2, "feed": 3}

    def gemm_diagnostic(self, name: str):
        """Launch the diagnostic kernel ``name``: "smem" (operands resident in shared memory: no global loads in
        the loop, barriers kept), "mma" (ldmatrix + mma alone), "feed" (cp.async loads, waits and barriers
        alone).  Same tile, grid and operands as ``gemm()``."""
        return self.be._launch(self.cp, self.da, self.db, self.out, self.m, self.n, self.arch, self.out_dtype,
                               diag=self.DIAGNOSTICS[name])

    def clone(self) -> _Plan:
        """The same problem in fresh device buffers (copies of the staged operands): another input set for
        benchmarks without quantizing again on the host."""
        import copy

        other = copy.copy(self)
        other.da = _DevOperand(self.da.buf.copy(), self.da.ld, self.da.kmajor, self.da.elem, self.da.exp, self.da.k)
        other.db = _DevOperand(self.db.buf.copy(), self.db.ld, self.db.kmajor, self.db.elem, self.db.exp, self.db.k)
        other.out = self.out.copy()
        return other

    def result(self):
        return self.be._result(self.cp, self.out, self.out_dtype, self.kinds, self.inputs)

    def close(self) -> None:
        """Drop this plan's device buffers (CuPy frees them once no other reference is left)."""
        self.da = self.db = self.out = None
        self._prep = self.inputs = None


class CudaBackend:
    """mxcore's NVIDIA backend (see the module docstring)."""

    name = "cuda"
    vendor = "nvidia"

    def __init__(self):
        self.unavailable_cause = None
        self._kernels: dict = {}
        self._reason_cache = None
        # fp8 path: None = the arch's own ("native" m16n8k32 on sm_89/sm_120, "convert" elsewhere); tests and the
        # benchmark may force "native" (compiler-emulated on sm_90), "convert" or "decode" (whole operands to f16
        # first, then the f16 kernel)
        self.fp8_path: str | None = None
        self.force_tile: str | None = None
        self._diag_smem_of: dict = {}
        self.force_split: int = 0  # tests: split K into this many slices

    # ---- availability ---------------------------------------------------------------------------------------
    def is_available(self) -> str | None:
        if self._reason_cache is not None:
            return self._reason_cache or None
        try:
            import cupy

            n = cupy.cuda.runtime.getDeviceCount()
            if n < 1:
                raise RuntimeError("no CUDA device")
            reason = ""
        except Exception as exc:  # noqa: BLE001 (ImportError, CUDARuntimeError, ...: never raise here)
            self.unavailable_cause = exc
            reason = f"CuPy with an NVIDIA GPU is needed ({type(exc).__name__}: {exc})"
        self._reason_cache = reason
        return reason or None

    def _cupy(self):
        reason = self.is_available()
        if reason:
            raise BackendUnavailableError(f"cuda backend: {reason}") from self.unavailable_cause
        import cupy

        return cupy

    def _props(self):
        cp = self._cupy()
        dev = cp.cuda.Device()
        props = cp.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return name, f"sm_{dev.compute_capability}", props

    def devices(self) -> list[str]:
        if self.is_available():
            return []
        cp = self._cupy()
        out = []
        for i in range(cp.cuda.runtime.getDeviceCount()):
            p = cp.cuda.runtime.getDeviceProperties(i)
            name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
            out.append(f"{name} (sm_{p['major']}{p['minor']})")
        return out

    def target(self):
        from . import Target

        if self.is_available():
            return Target("nvidia", None, 32)
        return Target("nvidia", self._props()[1], 32)

    # ---- dtypes ---------------------------------------------------------------------------------------------
    def supported_dtypes(self, arch: str | None = None) -> list[str]:
        if arch is None:
            arch = self.target().arch
            if arch is None:
                return []
        sm = _sm(arch)
        if sm < 80:
            return []
        out = ["fp32", "tf32", "fp16", "bf16", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"]
        if sm >= 89:
            out[4:4] = ["e4m3fn", "e5m2"]
        return out

    def supports(self, mdt) -> str | None:
        reason = self.is_available()
        if reason:
            return reason
        name, arch, _ = self._props()
        return self._supports_on(mdt, name, arch)

    def _supports_on(self, mdt, device: str, arch: str) -> str | None:
        ok = self.supported_dtypes(arch)
        if not ok:
            return (f"{device} ({arch}) is below sm_80; mxcore's NVIDIA kernels need mma.sync/ldmatrix/cp.async "
                    "(Ampere or newer). Use backend='reference'")
        for od in (mdt.a, mdt.b):
            if od.name not in ok:
                if od.kind == "fp8" and not od.name.endswith("fnuz"):
                    return f"{device} ({arch}) has no fp8 tensor cores (they start at sm_89); it can run {', '.join(ok)}"
                return f"{od.name} is not supported on {device} ({arch}); it can run {', '.join(ok)}"
        return None

    # ---- kernels --------------------------------------------------------------------------------------------
    def _kernel(self, key, filename: str, name: str, options: tuple, smem: int = 0):
        k = self._kernels.get(key)
        if k is None:
            cp = self._cupy()
            k = cp.RawKernel(_source(filename), name, options=tuple(options))
            if smem > 48 * 1024:
                k.max_dynamic_shared_size_bytes = smem
            self._kernels[key] = k
        return k

    def _gemm_kernel(self, v: Variant, diag: int = 0, smem: int = 0):
        opts = tuple(gemm_options(v)) + ((f"-DMX_DIAG={diag}",) if diag else ())
        smem = max(smem, v.smem_bytes)
        return self._kernel(("gemm", v, diag, smem), GEMM_FILE, "mx_gemm", opts, smem)

    def _diag_smem(self, v: Variant) -> int:
        """Dynamic shared memory for a diagnostic kernel of ``v``: padded so that it runs as many blocks per SM as
        the GEMM itself (a diagnostic that needs fewer registers would otherwise run more blocks and measure
        another occupancy)."""
        props, t = self._props()[2], TILES[v.tile]
        regs = int(self._gemm_kernel(v).attributes["num_regs"])
        warps = t.threads // 32
        by_regs = int(props.get("regsPerMultiprocessor", 65536)) // (-(-regs * 32 // 256) * 256 * warps)
        smem_sm = int(props.get("sharedMemPerMultiprocessor", 233472))
        reserved = int(props.get("reservedSharedMemPerBlock", 1024))
        by_smem = smem_sm // (v.smem_bytes + reserved)
        by_threads = int(props.get("maxThreadsPerMultiProcessor", 2048)) // t.threads
        blocks = max(1, min(by_regs, by_smem, by_threads))
        optin = int(props.get("sharedMemPerBlockOptin", 232448))
        return max(v.smem_bytes, min(smem_sm // blocks - reserved, optin))

    def _prep_kernel(self, name: str):
        return self._kernel(("prep", name), PREP_FILE, name, ("-std=c++17",))

    # ---- operand staging ------------------------------------------------------------------------------------
    @staticmethod
    def _device_source(cp, x):
        """(cupy array, kind) for a device float array: kind f64/f32/f16/bf16 (bf16 as uint16 bits)."""
        from mxcore.arrays import array_kind

        kind = array_kind(x)
        if kind == "torch":
            import torch

            if x.dtype == torch.bfloat16:
                return cp.from_dlpack(x.detach().view(torch.int16)).view(cp.uint16), "bf16"
            arr = cp.from_dlpack(x.detach())
        else:
            arr = x
        name = arr.dtype.name
        table = {"float64": "f64", "float32": "f32", "float16": "f16"}
        if name not in table:
            raise UnsupportedError(f"device input of dtype {name}: pass float16/float32/float64 (or torch bfloat16)")
        return arr, table[name]

    def _upload_float(self, cp, values: np.ndarray):
        name = values.dtype.name
        if name == "bfloat16":
            return cp.asarray(values.view(np.uint16)), "bf16"
        table = {"float64": "f64", "float32": "f32", "float16": "f16"}
        return cp.asarray(values), table[name]

    @staticmethod
    def _logical(arr, role: str):
        """(rows, cols, s_r, s_c) with rows = m (A) or n (B), cols = k, strides in elements."""
        es = arr.itemsize
        s0, s1 = (s // es for s in arr.strides)
        if role == "a":
            return arr.shape[0], arr.shape[1], s0, s1
        return arr.shape[1], arr.shape[0], s1, s0

    def _direct16(self, arr, role: str) -> _DevOperand | None:
        """Use a 16-bit device array in place when the kernel can read it: a unit stride along K (K-major) or
        along M/N (M/N-major), the other stride a positive multiple of 8 elements, a 16-byte aligned base."""
        rows, cols, s_r, s_c = self._logical(arr, role)
        if arr.data.ptr % 16:
            return None
        # K-major: row i (m or n) starts at i * s_r
        if (s_c == 1 or cols == 1) and (rows == 1 or (s_r > 0 and s_r % 8 == 0)):
            return _DevOperand(arr, s_r if rows > 1 else _round_up(cols, 8), True, "", 0, cols)
        # M/N-major: k row j starts at j * s_c
        if (s_r == 1 or rows == 1) and (cols == 1 or (s_c > 0 and s_c % 8 == 0)):
            return _DevOperand(arr, s_c if cols > 1 else _round_up(rows, 8), False, "", 0, cols)
        return None

    def _prep_float(self, cp, arr, kind: str, role: str, dst: str, out=None, col_off: int = 0, ld: int | None = None):
        rows, cols, s_r, s_c = self._logical(arr, role)
        esize = 2 if dst in ("f16", "bf16") else 4
        epc = 16 // esize
        if out is None:
            ld = _round_up(cols, epc)
            out = cp.empty((rows, ld), dtype=cp.uint16 if esize == 2 else cp.uint32)
        k = self._prep_kernel("mx_prep_float")
        grid = (-(-cols // 32), -(-rows // 32))
        row_fast = int(s_r == 1 and s_c != 1)
        k(grid, (32, 8), (arr, np.int32(_SRC_KIND[kind]), np.int32(rows), np.int32(cols), np.int64(s_r),
                          np.int64(s_c), np.int32(row_fast), out, np.int32(_DST_KIND[dst]), np.int64(ld),
                          np.int64(col_off)))
        return out, ld

    def _prep_codes(self, cp, codes, role: str, element: str, dst: str, scales=None, exp_bias: int = 127):
        from mxcore import formats

        spec = formats.get(element)
        codes_d = cp.ascontiguousarray(cp.asarray(codes))
        rows, cols, s_r, s_c = self._logical(codes_d, role)
        esize = {"f16": 2, "bf16": 2, "byte": 1}[dst]
        ld = _round_up(cols, 16 // esize)
        out = cp.empty((rows, ld), dtype=cp.uint16 if esize == 2 else cp.uint8)
        if scales is not None:
            sc = cp.ascontiguousarray(cp.asarray(scales))
            ss0, ss1 = sc.strides  # itemsize 1
            ss_r, ss_c = (ss0, ss1) if role == "a" else (ss1, ss0)
        else:
            sc, ss_r, ss_c = 0, 0, 0
        k = self._prep_kernel("mx_prep_codes")
        grid = (-(-cols // 32), -(-rows // 32))
        k(grid, (32, 8), (codes_d, np.int32(rows), np.int32(cols), np.int64(s_r), np.int64(s_c),
                          np.int32(int(s_r == 1 and s_c != 1)), sc, np.int64(ss_r), np.int64(ss_c),
                          np.int32(exp_bias), np.int32(spec.ebits), np.int32(spec.mbits), np.int32(spec.bias),
                          np.int32(_SPECIAL.get(spec.specials, 0)), out, np.int32(_DST_KIND[dst]), np.int64(ld),
                          np.int64(0)))
        return out, ld

    def _stage_float(self, cp, x, role: str, od) -> _DevOperand:
        if isinstance(x, _Uploaded):
            arr, kind = x.arr, x.kind
        else:
            arr, kind = self._device_source(cp, x)
        name = od.name
        if name in ("fp16", "bf16"):
            want = "f16" if name == "fp16" else "bf16"
            if kind == want:
                d = self._direct16(arr, role)
                if d is not None:
                    d.elem = want
                    return d
            buf, ld = self._prep_float(cp, arr, kind, role, want)
            return _DevOperand(buf, ld, True, want, 0, arr.shape[1] if role == "a" else arr.shape[0])
        rows, cols, _, _ = self._logical(arr, role)
        if name == "tf32":
            buf, ld = self._prep_float(cp, arr, kind, role, "tf32")
            return _DevOperand(buf, ld, True, "tf32", 0, cols)
        # fp32: 3xTF32 as one tf32 GEMM over K' = 3 Kp
        kp = _round_up(cols, 4)
        out = cp.zeros((rows, 3 * kp), dtype=cp.uint32)
        parts = ("tf32", "tf32", "tf32_small") if role == "a" else ("tf32", "tf32_small", "tf32")
        for i, dst in enumerate(parts):
            self._prep_float(cp, arr, kind, role, dst, out=out, col_off=i * kp, ld=3 * kp)
        return _DevOperand(out, 3 * kp, True, "tf32", 0, 3 * kp)

    def _stage_bytes(self, cp, codes, role: str, element: str):
        """fp8 codes as the fp8 kernels read them: K-major rows, 16-byte aligned, ld a multiple of 16 bytes.
        (buffer, ld).  Codes already K-major (A in C order, B in Fortran order) are used in place; the other
        order is transposed by ``mx_transpose_bytes`` when both dimensions are multiples of 64; anything else
        (padding, other strides) goes through ``mx_prep_codes``."""
        codes_d = cp.asarray(codes)
        if codes_d.ndim == 2 and codes_d.data.ptr % 16 == 0:
            kmajor = codes_d if role == "a" else codes_d.T  # logical rows = M or N, columns = K
            if kmajor.flags.c_contiguous and kmajor.shape[1] % 16 == 0:
                return kmajor, kmajor.shape[1]
            src = kmajor.T  # C order: K x (M or N)
            if src.flags.c_contiguous and src.shape[0] % 64 == 0 and src.shape[1] % 64 == 0:
                rows, cols = src.shape
                out = cp.empty((cols, rows), dtype=cp.uint8)
                self._prep_kernel("mx_transpose_bytes")((cols // 64, rows // 64), (256,),
                                                        (src, np.int32(rows), np.int32(cols), np.int64(cols), out,
                                                         np.int64(rows)))
                return out, rows
        return self._prep_codes(cp, codes, role, element, "byte")

    def _fp8_path(self, arch: str) -> str:
        path = self.fp8_path or ("native" if native_fp8(arch) else "convert")
        if path not in ("native", "convert", "decode"):
            raise UnsupportedError(f"fp8_path must be 'native', 'convert' or 'decode', not {path!r}")
        return path

    def _stage_quantized(self, cp, op, role: str, arch: str, device=None, smax=None) -> _DevOperand:
        """Decode/copy a host-quantized operand on the GPU.  ``device``: (codes, scales) already uploaded;
        ``smax``: the largest finite scale code, if already known (it is a host-side scan of the scales)."""
        from mxcore import dtypes as _dt

        od = op.dtype
        cols = op.shape[1] if role == "a" else op.shape[0]
        codes, scales_d = device if device is not None else (op.codes, None)
        if od.kind == "fp8":
            exp = _pow2_exponent(op.tensor_scale)
            short = {"e4m3fn": "e4m3", "e5m2": "e5m2"}[od.name]
            if self._fp8_path(arch) != "decode":
                buf, ld = self._stage_bytes(cp, codes, role, od.element)
                return _DevOperand(buf, ld, True, short, exp, cols)
            fast = self._decode_in_place(cp, codes, role, od.element, "f16", None, 127, exp, cols)
            if fast is not None:
                return fast
            buf, ld = self._prep_codes(cp, codes, role, od.element, "f16")
            return _DevOperand(buf, ld, True, "f16", exp, cols)
        # MX: fold the block scales in, relative to the tensor's largest finite scale
        smax = _max_finite_scale(op.mx.scales) if smax is None else smax
        element = _dt.MX_ELEMENT[od.name]
        scales = scales_d if scales_d is not None else op.mx.scales
        fast = self._decode_in_place(cp, codes, role, element, "bf16", scales, smax, smax - 127, cols)
        if fast is not None:
            return fast
        buf, ld = self._prep_codes(cp, codes, role, element, "bf16", scales=scales, exp_bias=smax)
        return _DevOperand(buf, ld, True, "bf16", smax - 127, cols)

    def _code_table(self, cp, element: str, dst: str, scaled: bool):
        """256 x uint32 decode table: destination bits of each code, or (scaled) its exact fp32 value."""
        key = ("table", element, dst, scaled)
        if key not in self._kernels:
            from mxcore import formats

            spec = formats.get(element)
            vals = formats.decode(np.arange(1 << spec.bits, dtype=np.uint8), element).astype(np.float32)
            if scaled:
                bits = vals.view(np.uint32)
            elif dst == "f16":
                bits = vals.astype(np.float16).view(np.uint16).astype(np.uint32)
            else:
                import ml_dtypes

                bits = vals.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)
            table = np.zeros(256, dtype=np.uint32)
            table[: bits.size] = bits
            self._kernels[key] = cp.asarray(table)
        return self._kernels[key]

    def _decode_in_place(self, cp, codes, role: str, element: str, dst: str, scales, exp_bias: int, exp: int,
                         cols: int) -> _DevOperand | None:
        """Decode codes elementwise in their own layout (A stays K-major, B stays N-major: the 16-bit kernel
        reads both); None when the contiguous dimension is not a multiple of 8 (the transposing path pads)."""
        codes_d = cp.ascontiguousarray(cp.asarray(codes))
        rows_, cols_ = codes_d.shape
        if cols_ % 8 or codes_d.data.ptr % 8:
            return None
        out = cp.empty((rows_, cols_), dtype=cp.uint16)
        table = self._code_table(cp, element, dst, scales is not None)
        if scales is not None:
            sc = cp.ascontiguousarray(cp.asarray(scales))
            bi, bj, s_i, s_j = (1, 32, sc.shape[1], 1) if role == "a" else (32, 1, sc.shape[1], 1)
        else:
            sc, bi, bj, s_i, s_j = 0, 1, 1, 0, 0
        k = self._prep_kernel("mx_decode_codes")
        grid = (max(1, min(-(-(rows_ * cols_ // 8) // 256), 16 * self._sms())),)
        k(grid, (256,), (codes_d, np.int32(rows_), np.int32(cols_), table, sc, np.int32(bi), np.int32(bj),
                         np.int64(s_i), np.int64(s_j), np.int32(exp_bias), np.int32(_DST_KIND[dst]), out))
        return _DevOperand(out, cols_, role == "a", dst, exp, cols)

    # ---- launch ---------------------------------------------------------------------------------------------
    def _launch(self, cp, a: _DevOperand, b: _DevOperand, out, m: int, n: int, arch: str, out_dtype: str,
                diag: int = 0):
        if a.elem in ("e4m3", "e5m2"):
            elem = f"{a.elem}.{b.elem}" + (".f16" if self._fp8_path(arch) == "convert" else "")
        else:
            elem = a.elem
            if b.elem != a.elem:
                raise UnsupportedError(f"internal: operands staged as {a.elem} and {b.elem}")
        tile = self.force_tile or choose_tile(m, n, self._sms(), elem)
        v = Variant(elem, a.kmajor, b.kmajor, tile)
        t = TILES[tile]
        for op, mn_rows in ((a, t.bm), (b, t.bn)):  # the kernel's per-thread copy offsets are 32-bit
            if (mn_rows if op.kmajor else v.bk) * op.ld * v.element.esize >= 2**32:
                raise UnsupportedError(f"leading dimension {op.ld} is too large for the CUDA kernels' 32-bit tile "
                                       "offsets; pass a contiguous operand with fewer than ~16M elements per row")
        blocks = -(-m // t.bm) * -(-n // t.bn)
        e = a.exp + b.exp
        a0, a1 = np.float32(2.0 ** (e // 2)), np.float32(2.0 ** (e - e // 2))
        splits, k_split = self._split(blocks, a.k, v.bk)
        if diag and (splits != 1 or t.mbar or t.frag_db):
            raise UnsupportedError(f"loop diagnostics need one K slice and a plain pipeline tile ({v.name}, "
                                   f"{splits} K slices)")
        if diag and v not in self._diag_smem_of:  # once per variant: the launch itself must stay cheap
            self._diag_smem_of[v] = self._diag_smem(v)
        smem = self._diag_smem_of[v] if diag else v.smem_bytes
        kern = self._gemm_kernel(v, diag, smem)
        if splits == 1:
            kern((blocks, 1, 1), (t.threads,), (a.buf, b.buf, out, np.int32(m), np.int32(n), np.int32(a.k),
                 np.int64(a.ld), np.int64(b.ld), np.int64(out.shape[1]), a0, a1, np.int32(_OUT_KIND[out_dtype]),
                 np.int32(a.k), np.int64(0)), shared_mem=smem)
            return v
        ws = cp.empty((splits, m, n), dtype=cp.float32)  # fp32 partial products, summed in z order below
        kern((blocks, 1, splits), (t.threads,), (a.buf, b.buf, ws, np.int32(m), np.int32(n), np.int32(a.k),
             np.int64(a.ld), np.int64(b.ld), np.int64(n), np.float32(1), np.float32(1), np.int32(0),
             np.int32(k_split), np.int64(m * n)), shared_mem=v.smem_bytes)
        red = self._prep_kernel("mx_splitk_reduce")
        grid = (max(1, min(-(-m * n // 256), 4 * self._sms())),)
        red(grid, (256,), (ws, np.int32(splits), np.int64(m * n), out, np.int32(m), np.int32(n),
                           np.int64(out.shape[1]), a0, a1, np.int32(_OUT_KIND[out_dtype])))
        return v

    def _split(self, blocks: int, k: int, bk: int) -> tuple[int, int]:
        """(splits, K per split): split K when the output tiles cannot fill the GPU and K is long."""
        sms = self._sms()
        if self.force_split:
            want = self.force_split
        elif blocks >= sms or k < 8 * bk:
            return 1, k
        else:
            want = min(-(-4 * sms // blocks), 16, k // (4 * bk))
        k_split = _round_up(-(-k // max(1, want)), bk)
        return -(-k // k_split), k_split

    def _sms(self) -> int:
        if not hasattr(self, "_sm_count"):
            self._sm_count = int(self._props()[2]["multiProcessorCount"])
        return self._sm_count

    # ---- public entry ---------------------------------------------------------------------------------------
    def matmul(self, a, b, mdt, *, out_dtype="float32", scale_rounding="floor", out=None):
        """``a @ b`` on the GPU.  ``out``: optional CuPy (M, N) C-contiguous array of the output's storage dtype
        (float32, float16, or uint16 for bfloat16) to write into (the tests poison it with NaN first)."""
        p = self.plan(a, b, mdt, out_dtype=out_dtype, scale_rounding=scale_rounding, out=out)
        with p.stream:
            p.gemm()
        return p.result()

    def plan(self, a, b, mdt, *, out_dtype="float32", scale_rounding="floor", out=None) -> _Plan:
        """Stage both operands on the GPU (host quantization for fp8/MX, prep kernels) and return a
        :class:`_Plan` whose ``gemm()`` launches the GEMM alone and ``prep()`` re-runs the device-side
        preparation (used by the benchmark to time them separately)."""
        from mxcore import dtypes as _dt
        from mxcore.arrays import array_kind

        cp = self._cupy()
        out_dtype = _dt.canonical_out_dtype(out_dtype)
        device, arch, _ = self._props()
        reason = self._supports_on(mdt, device, arch)
        if reason:
            raise UnsupportedError(f"dtype {mdt}: {reason}")
        kinds = (array_kind(a), array_kind(b))
        m, k, n = int(a.shape[0]), int(a.shape[1]), int(b.shape[1])
        torch_like = next((x for x, kd in zip((a, b), kinds) if kd == "torch"), None)
        if torch_like is not None and torch_like.device.type == "cpu":
            torch_like = None
        stream = _torch_stream(cp, torch_like)
        with stream:
            if mdt.kind == "float":
                on_dev = [self._on_device(kd, x) for kd, x in zip(kinds, (a, b))]
                srcs = [x if dev else self._host_float(cp, x, role, od)
                        for x, dev, role, od in zip((a, b), on_dev, "ab", (mdt.a, mdt.b))]

                def prep():
                    return (self._stage_float(cp, srcs[0], "a", mdt.a), self._stage_float(cp, srcs[1], "b", mdt.b))
            else:
                from mxcore.arrays import to_numpy
                from mxcore.operands import prepare

                host = [x if kd in ("mx", "numpy") else to_numpy(x) for x, kd in zip((a, b), kinds)]
                opa, opb = prepare(host[0], host[1], mdt, scale_rounding=scale_rounding)
                dev = [(cp.asarray(op.codes), cp.asarray(op.mx.scales) if op.mx is not None else None)
                       for op in (opa, opb)]
                smax = [_max_finite_scale(op.mx.scales) if op.mx is not None else None for op in (opa, opb)]

                def prep():
                    return (self._stage_quantized(cp, opa, "a", arch, dev[0], smax[0]),
                            self._stage_quantized(cp, opb, "b", arch, dev[1], smax[1]))
            da, db = prep()
            if da.k != db.k:
                raise UnsupportedError(f"internal: staged K differs ({da.k} vs {db.k})")
            store = {"float32": cp.float32, "float16": cp.float16, "bfloat16": cp.uint16}[out_dtype]
            if out is None:
                out = cp.empty((m, n), dtype=store)
            elif out.shape != (m, n) or out.dtype != store or not out.flags.c_contiguous:
                raise UnsupportedError(f"out must be a C-contiguous ({m}, {n}) array of {np.dtype(store).name}")
        return _Plan(self, cp, stream, da, db, out, m, n, k, arch, out_dtype, prep, kinds, (a, b))

    def _host_float(self, cp, x, role: str, od):
        """Round a host float operand with mxcore.operands (the oracle's own rounding), upload the values."""
        from mxcore import dtypes as _dt
        from mxcore.arrays import to_numpy
        from mxcore.operands import prepare_one

        op = prepare_one(to_numpy(x), _dt.OperandDType(od.name, od.element, od.kind), role, "floor")
        arr, kind = self._upload_float(cp, op.values)
        return _Uploaded(arr, kind)

    @staticmethod
    def _on_device(kind: str, x) -> bool:
        if kind == "cupy":
            return True
        if kind == "torch":
            return x.device.type == "cuda"
        return False

    @staticmethod
    def _result(cp, out, out_dtype: str, kinds, inputs):
        for kd, x in zip(kinds, inputs):
            if kd == "cupy":
                return out
            if kd == "torch":
                import torch

                t = torch.from_dlpack(out.view(cp.int16) if out_dtype == "bfloat16" else out)
                if out_dtype == "bfloat16":
                    t = t.view(torch.bfloat16)
                return t.to(x.device)
        host = cp.asnumpy(out)
        if out_dtype == "bfloat16":
            import ml_dtypes

            return host.view(ml_dtypes.bfloat16)
        return host

    # ---- offline: every variant for an arch -----------------------------------------------------------------
    def emit_kernels(self, arch: str, out_dir, *, workers: int | None = None) -> list[dict]:
        """Compile every variant (GEMM, prep, ceiling) for ``arch`` with NVRTC; write cubin + PTX to ``out_dir``;
        return one manifest row per kernel.  Needs no GPU."""
        rows = []
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        jobs = compile_jobs(arch)
        for job, binary in compile_all(jobs, workers=workers, arch=arch):
            cubin_path, _ = binary.write(out_dir, job["stem"])
            res = binary.resources.get(job["kernel"], next(iter(binary.resources.values()), {}))
            rows.append({
                "kernel": job["kernel"],
                "variant": job["stem"],
                "dtype": job["dtype"],
                "tile": job.get("tile", ""),
                "arch": arch,
                "file": cubin_path.name,
                "ptx": cubin_path.with_suffix(".ptx").name,
                "registers": res.get("registers", 0),
                "shared_bytes": job.get("smem", 0) + res.get("shared_bytes", 0),
                "local_bytes": res.get("local_bytes", 0),
                "spill_stores": res.get("spill_stores", 0),
                "spill_loads": res.get("spill_loads", 0),
                "threads": job.get("threads", 0),
                "options": job["options"],
            })
        return rows

    # ---- benchmark hooks ------------------------------------------------------------------------------------
    def timer(self):
        """``measure(fn) -> seconds``: runs ``fn()`` between two CUDA events on the current stream and waits."""
        cp = self._cupy()
        start, stop = cp.cuda.Event(), cp.cuda.Event()

        def measure(fn) -> float:
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            return cp.cuda.get_elapsed_time(start, stop) * 1e-3

        return measure

    def ceiling_key(self, dtype: str) -> str:
        """Dtypes with the same key run the same mma instruction here (one ceiling measurement serves them)."""
        return ceiling_element(dtype, self._props()[1])

    def bench_operands(self, a: np.ndarray, b: np.ndarray, dtype: str):
        """Host float32 operands -> device arrays as the kernel reads them in place: fp16 CuPy arrays for fp16,
        torch bf16 tensors for bf16 (CuPy has no bf16; without torch, float32 CuPy arrays are prepped), float32
        CuPy arrays otherwise.  Memory order (C or Fortran) is kept."""
        cp = self._cupy()
        a, b = (cp.asfortranarray(cp.asarray(x)) if x.flags.f_contiguous and not x.flags.c_contiguous
                else cp.asarray(x) for x in (a, b))
        if dtype == "fp16":
            return a.astype(cp.float16), b.astype(cp.float16)
        if dtype == "bf16":
            try:
                import torch
            except ImportError:
                return a, b
            return torch.from_dlpack(a).to(torch.bfloat16), torch.from_dlpack(b).to(torch.bfloat16)
        return a, b

    def instruction_ceiling(self, dtype: str, *, iters: int = 4096, chains: int = 8) -> tuple[str, float]:
        """(mnemonic, TFLOP/s) of a register-only loop of the mma that ``dtype`` uses on this device."""
        from mxcore import layouts

        cp = self._cupy()
        _, arch, props = self._props()
        elem = ceiling_element(dtype, arch)
        rec = layouts.get(ELEMENTS[elem].record)
        kern = self._kernel(("ceiling", elem, chains), CEILING_FILE, "mx_mma_ceiling",
                            ("-std=c++17", f'-DMX_MMA_OP="{rec.ptx}"', f"-DMX_CHAINS={chains}"))
        sms = int(props["multiProcessorCount"])
        blocks = sms * 8
        buf = cp.empty(blocks * 256, dtype=cp.float32)
        args = (buf, np.int32(iters), np.uint32(1))
        kern((blocks,), (256,), args)
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for _ in range(5):
            start.record()
            kern((blocks,), (256,), args)
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3)
        flops = 2.0 * rec.m * rec.n * rec.k * chains * iters * blocks * 8
        return rec.ptx, flops / sorted(times)[len(times) // 2] / 1e12

    def vendor_baseline(self, dtype: str, m: int, n: int, k: int):
        """(label, callable) timing the vendor library on the same problem, or None."""
        return vendor_baseline(dtype, m, n, k)


def ceiling_element(dtype: str, arch: str) -> str:
    """The ELEMENTS key of the mma that ``dtype`` runs on ``arch`` (fp8 on sm_90 runs f16 mma on converted
    fragments and every MX format is decoded to bf16 first, so they share those instructions' ceilings)."""
    d = dtype.lower()
    if d in ("fp16",):
        return "f16"
    if d in ("tf32", "fp32"):
        return "tf32"
    if d in ("fp8", "e4m3fn", "e4m3", "e5m2") and native_fp8(arch):
        return "e4m3.e4m3"
    if d in ("fp8", "e4m3fn", "e4m3", "e5m2"):
        return "f16"
    return "bf16"


class _NullCtx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _StreamHandle:
    """The CUDA stream protocol (``__cuda_stream__``) around a raw stream handle."""

    def __init__(self, handle: int):
        self.handle = int(handle)

    def __cuda_stream__(self):
        return (0, self.handle)


def _torch_stream(cp, tensor):
    """Run on torch's current stream when a torch CUDA tensor is involved (ordering with torch's work)."""
    if tensor is None:
        return _NullCtx()
    import torch

    handle = torch.cuda.current_stream(tensor.device).cuda_stream
    if hasattr(cp.cuda.Stream, "from_external"):
        return cp.cuda.Stream.from_external(_StreamHandle(handle))
    return cp.cuda.ExternalStream(handle)


def vendor_baseline(dtype: str, m: int, n: int, k: int, sets: int = 3):
    """cuBLAS through torch (fp16/bf16/tf32/fp32) or torch._scaled_mm (fp8), or None when torch is missing.
    The callable rotates over ``sets`` input pairs, like the mxcore side of the benchmark."""
    try:
        import torch
    except ImportError:
        return None
    from ._torch_baseline import torch_matmul

    d = dtype.lower()
    dev = "cuda"
    turn = [0]
    run = torch_matmul(torch, d, m, n, k, sets)
    if run is not None:
        return f"cuBLAS {d} (torch.matmul)", run
    if d in ("fp8", "e4m3fn", "e4m3") and hasattr(torch, "_scaled_mm"):
        one = torch.ones((), device=dev)
        pairs = [(torch.randn(m, k, device=dev).to(torch.float8_e4m3fn),
                  torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()) for _ in range(sets)]  # col-major B

        def run8():
            a, b = pairs[turn[0] % sets]
            turn[0] += 1
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        return "cuBLASLt fp8 e4m3 (torch._scaled_mm)", run8
    return None


# ------------------------------------------------------------------------------------------------------------
# offline compile jobs (CI, emit_kernels)
# ------------------------------------------------------------------------------------------------------------
_DTYPE_OF_ELEM = {"f16": "fp16", "bf16": "bf16 (and MX decoded)", "tf32": "tf32, fp32 (3xTF32)"}


def compile_jobs(arch: str) -> list[dict]:
    """Every kernel the backend can launch on ``arch``: GEMM variants, prep kernels, ceiling loops."""
    from mxcore import layouts

    jobs = []
    for v in all_variants(arch):
        if v.element.cvt:
            dtype = f"fp8 {' x '.join(v.elem.split('.')[:2])} (fragments converted to f16)"
        else:
            dtype = _DTYPE_OF_ELEM.get(v.elem, f"fp8 {v.elem.replace('.', ' x ')}")
        jobs.append({"file": GEMM_FILE, "kernel": "mx_gemm", "stem": v.name, "dtype": dtype, "tile": v.tile,
                     "options": gemm_options(v), "smem": v.smem_bytes, "threads": v.threads, "variant": v,
                     "ldmatrix": True, "cp_async": True,
                     "mma": "QMMA" if v.element.esize == 1 and not v.element.cvt else "HMMA"})
    for kname in ("mx_prep_float", "mx_prep_codes", "mx_splitk_reduce", "mx_decode_codes", "mx_transpose_bytes"):
        jobs.append({"file": PREP_FILE, "kernel": kname, "stem": kname, "dtype": "prep", "options": ["-std=c++17"],
                     "smem": 0, "threads": 256})
    sm = _sm(arch)
    for e, el in ELEMENTS.items():
        if sm < el.min_sm or (el.esize == 1 and e != "e4m3.e4m3"):
            continue
        rec = layouts.get(el.record)
        jobs.append({"file": CEILING_FILE, "kernel": "mx_mma_ceiling", "stem": f"ceiling_{e.replace('.', '_')}",
                     "dtype": e, "options": ["-std=c++17", f'-DMX_MMA_OP="{rec.ptx}"', "-DMX_CHAINS=8"],
                     "smem": 0, "threads": 256})
    return jobs


def compile_all(jobs: list[dict], *, workers: int | None = None, arch: str | None = None):
    """Compile ``jobs`` (from :func:`compile_jobs`) in a thread pool; yields (job, CudaBinary) in order."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from .nvrtc_tools import compile_cuda

    sources = {}

    def one(job):
        src = sources.setdefault(job["file"], _source(job["file"]))
        return compile_cuda(src, name=job["stem"], arch=job.get("arch") or arch or job["_arch"],
                            options=job["options"])

    if arch is not None:
        for j in jobs:
            j["_arch"] = arch
    workers = workers or max(1, min(4, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        yield from zip(jobs, pool.map(one, jobs))
