"""The Hopper (sm_90a) kernel family: ``kernels_cuda/gemm_sm90.cu`` (wgmma + TMA + warp specialization).

One persistent kernel, specialised by ``-D`` defines (:meth:`Sm90Variant.options`): a producer warpgroup issues
TMA loads (128-byte swizzle, zero fill past M/N/K) into a multi-stage ring of full/empty mbarriers; two consumer
warpgroups run ``wgmma.mma_async`` m64nNk{16,8,32} from shared memory and write fp32/fp16/bf16, scaled by the
per-tensor power-of-two factors.  Optional clusters of two blocks along M share
the B tile through TMA multicast.

* Elements: f16, bf16 (all four majorness combinations through wgmma's transpose bits), tf32 (K-major; fp32 runs
  its 3xTF32 split through it, K' = 3K), fp8 e4m3/e5m2 and mixed pairs (K-major bytes) with fp32 promotion of the
  accumulator every 128 K (one ring stage) by default, or fast accumulation (``fp8_accumulate="fast"``).
* Exact OCP-MX fp8 (``mx``: mxfp8 e4m3/e5m2 and the mixed pair, blocks of 32 K, E8M0 scales): one k32 wgmma per
  block into a scratch accumulator, then ``main += 2^(ea + eb) * scratch`` in fp32 (the factor's bits built by one
  integer add, then one FMA; exact, IEEE fp32 under CuPy's -ftz=true; see the kernel's SM90_MX).  The operands'
  scales go through ``gemm_sm90_mx.cu`` once per operand (:class:`~.stage.MXFactors`, cached on a quantized object
  like the staged codes) and are TMA-loaded with each stage.  Folded operands (MXFP4 / MXFP6 into e4m3; mxfp8 in its own
  format, its lost bits as lists that ``mx_lo_fix`` adds to the GEMM's fp32 result after it) promote once per
  128 K, or once per tile where every row and column has one factor.
* Operands come from :class:`~.stage.Stager` unchanged (:class:`~.stage.DevOperand`: 16-byte aligned base, row
  pitch a multiple of 16 bytes, which is what TMA needs); this module encodes the two tensor maps per plan
  (``cuTensorMapEncodeTiled`` through the driver library, ctypes) and passes them by value.
* The grid is persistent (one block or cluster per SM); when the tiles leave the last wave part full, or are fewer
  than the SMs, :func:`split_tail` splits those tiles along K over the idle SMs: fp32 partials summed in split order
  inside the kernel (deterministic).  A launch is one ``cuLaunchKernel`` with its parameters packed once
  (:class:`~.driver.RawLaunch`).
* :func:`wgmma_reason` is this family's part of the family rule (``families.family_for``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from mxcore.errors import UnsupportedError

from . import driver
from .device import address_of, unowned_view
from .driver import SWIZZLE_NONE, RawLaunch, tensor_map
from .emit import register_jobs
from .plan import CudaPlan, scale_args
from .compile import SM90_FILE, SM90_KERNEL, SM90_MX_FILE
from .operand import _SPECIAL, FP8_SHORT, LO_CAP, OUT_KIND
from .tables import table
from .variants import ELEMENTS, sm_of

__all__ = ["BM", "SM90_FILE", "SM90_KERNEL", "SM90_TILES", "Sm90Plan", "Sm90Variant", "all_sm90_variants",
           "choose_sm90", "split_tail", "tensor_map", "wgmma_reason"]

SM90_MX_KERNELS = ("mx_sm90_block_factors", "mx_sm90_fold_rows", "mx_sm90_fold",  # fp8 factors; folds
                   "mx_sm90_lo_sort",  # a lossy MXFP8 fold's lists in k order
                   "mx_lo_fix")  # and its lost bits added to the GEMM's result
MX_FACTOR_BYTES = 16  # per row of A / column of B per stage: 4 blocks of 32 K, one int32 factor each
BM = 128  # two consumer warpgroups of 64 rows
THREADS = 384  # producer + two consumers
STAGE_K_BYTES = 128  # K bytes per row per stage: one 128-byte swizzle row
SMEM_LIMIT = 227 * 1024  # dynamic shared memory per block on sm_90 (opt-in)
_ELEM_CODE = {"f16": 0, "bf16": 1, "tf32": 2, "e4m3": 3, "e5m2": 3}
_FP8 = ("e4m3", "e5m2")
FIX_ROWS, FIX_COLS = 32, 256  # mx_lo_fix's tile of C (its FIX_ROWS / FIX_COLS)
_STORES = (0, 2, 4)  # direct stores, TMA store of 16-bit or fp32 outputs


@functools.lru_cache(maxsize=None)
def _fp8_fmt(elem: str) -> int:
    """A staged fp8 element's format as mx_lo_fix takes it: ebits | mbits << 4 | bias << 8 | specials << 16."""
    from mxcore import formats

    spec = formats.get(next(name for name, short in FP8_SHORT.items() if short == elem))
    return spec.ebits | spec.mbits << 4 | spec.bias << 8 | _SPECIAL.get(spec.specials, 0) << 16


def _transposed_elements(cp, d):
    """An MX folded operand's elements transposed as mx_lo_fix reads them (``MXFactors.lo_elt``: [k][row], rows
    rounded up to 32, zeros beyond): written by the fold (a lossy one, or an MXFP4 / MXFP6 operand staged beside an
    MXFP8 partner: ``Stager.stage_quantized``'s ``partner``), else here once and kept on the operand's factors (an
    operand staged without its partner known)."""
    f = d.mx
    if f.lo_elt is None:
        rows, k = d.buf.shape[0], d.ld
        f.lo_elt = cp.zeros((f.blocks_pad * 32, 32 * -(-max(rows, 1) // 32)), dtype=cp.uint8)
        f.lo_elt[:k, :rows] = d.buf[:rows, :k].T
    return f.lo_elt


_T = table("dense")
#: block tiles: name -> (BN, stages, cluster size along M) (tuning/dense.json, sm90_tiles)
SM90_TILES = {name: tuple(v) for name, v in _T["sm90_tiles"]["value"].items()}
#: exact MX fp8: the tile
MX_TILE = _T["mx_exact"]["tile"]
SWAP_MAX_M = _T["sm90_swap_max_m"]["value"]  # M at or below which A and B are swapped (C^T = B^T A^T)
#: the last wave's K splits: at least this many ring stages per split, at most this many splits (split_tail)
MIN_SPLIT_STAGES, MAX_SPLITS = _T["sm90_split"]["min_stages"], _T["sm90_split"]["max_splits"]


@dataclass(frozen=True)
class Sm90Variant:
    """One compiled form of gemm_sm90.cu.  ``elem``/``b_elem``: the operands' element names (mma.sync's
    ``variants.ELEMENTS`` spelling: f16, bf16, tf32, e4m3, e5m2); ``promote``: fp8 promotion every 128 K."""

    elem: str
    b_elem: str
    a_kmajor: bool
    b_kmajor: bool
    tile: str
    promote: bool = True
    tma_store: int = 0  # output bytes (2: fp16/bf16, 4: fp32) stored through shared memory + TMA; 0: direct
    swap: bool = False  # the host swapped A and B; the kernel stores D transposed (direct stores)
    group_m: int = 16
    mx: bool = False  # exact OCP-MX fp8: per-32-K E8M0 block scales applied after each k32 wgmma

    def __post_init__(self):
        if self.elem not in _ELEM_CODE or self.b_elem not in _ELEM_CODE:
            raise UnsupportedError(f"the wgmma family reads f16, bf16, tf32, e4m3, e5m2; got {self.elem}/{self.b_elem}")
        if (self.elem in _FP8) != (self.b_elem in _FP8) or (self.elem not in _FP8 and self.elem != self.b_elem):
            raise UnsupportedError(f"wgmma multiplies equal 16-bit/tf32 elements or two fp8 elements, not "
                                   f"{self.elem} x {self.b_elem}")
        if self.esize != 2 and not (self.a_kmajor and self.b_kmajor):
            raise UnsupportedError(f"wgmma reads {self.elem} operands K-major only (transpose bits are 16-bit only)")
        if self.tile not in SM90_TILES:
            raise UnsupportedError(f"tile {self.tile!r} is not a wgmma tile; choose one of {', '.join(SM90_TILES)}")
        if self.swap and self.tma_store:
            raise UnsupportedError("the swapped (transposed-output) wgmma variant stores directly (tma_store=0)")
        if self.mx and (self.elem not in _FP8 or not (self.a_kmajor and self.b_kmajor) or self.swap):
            raise UnsupportedError("the exact MX variant multiplies K-major fp8 operands (mxfp8), not swapped")

    @property
    def esize(self) -> int:
        return ELEMENTS[self.elem].esize if self.elem in ELEMENTS else 1

    @property
    def bn(self) -> int:
        return SM90_TILES[self.tile][0]

    @property
    def stages(self) -> int:
        """The tile's ring depth, less where the output buffers of the TMA-store epilogue need the room."""
        per = (BM + self.bn) * self.row_bytes
        fit = (SMEM_LIMIT - 1024 - 16 - 2 * 64 * self.epi_cols * self.tma_store) // (per + 16)
        return min(SM90_TILES[self.tile][1], fit)

    @property
    def row_bytes(self) -> int:
        """Shared-memory bytes per tile row (A) / column (B) per stage: 128 bytes of K (+ the MX factors)."""
        return STAGE_K_BYTES + (MX_FACTOR_BYTES if self.mx else 0)

    @property
    def cluster(self) -> int:
        return SM90_TILES[self.tile][2]

    @property
    def epi_cols(self) -> int:
        """Output columns per epilogue round: with the TMA store, the most whole 128-byte boxes dividing BN whose
        buffers for both consumers fit in 32 KB (BN 256: 128 columns of 16-bit, 64 of fp32); direct stores: BN (one
        round, no buffer)."""
        if not self.tma_store:
            return self.bn
        box = STAGE_K_BYTES // self.tma_store
        return max(c for c in range(box, self.bn + 1, box) if self.bn % c == 0 and 2 * 64 * c * self.tma_store <= 32768)

    @property
    def bk(self) -> int:
        """K elements per ring stage."""
        return STAGE_K_BYTES // self.esize

    @property
    def threads(self) -> int:
        return THREADS

    @property
    def smem_bytes(self) -> int:
        """Ring + output buffers (TMA store: 2 warpgroups x 64 rows x epi_cols) + 2 mbarriers per stage + 16 bytes
        (the consumers' split-K flags) + 1 KB for aligning the ring to the 128-byte swizzle's 1024-byte period."""
        epi = 2 * 64 * self.epi_cols * self.tma_store
        return self.stages * (BM + self.bn) * self.row_bytes + epi + 16 * self.stages + 16 + 1024

    @property
    def name(self) -> str:
        e = self.elem if self.elem == self.b_elem else f"{self.elem}_{self.b_elem}"
        acc = "" if self.elem not in _FP8 else ("_mx32" if self.mx else "_promote" if self.promote else "_fast")
        epi = f"_tmastore{8 * self.tma_store}" if self.tma_store else ("_swap" if self.swap else "")
        return f"sm90_{e}_{'k' if self.a_kmajor else 'm'}{'k' if self.b_kmajor else 'n'}_{self.tile}{acc}{epi}"

    def options(self) -> list[str]:
        """Every define gemm_sm90.cu reads (the kernel has no defaults)."""
        fp8 = self.elem in _FP8
        return ["--gpu-architecture=sm_90a", "-std=c++17", f"-DSM90_ELEM={_ELEM_CODE[self.elem]}",
                f"-DSM90_A_E5M2={int(self.elem == 'e5m2')}", f"-DSM90_B_E5M2={int(self.b_elem == 'e5m2')}",
                f"-DSM90_TA={int(not self.a_kmajor)}", f"-DSM90_TB={int(not self.b_kmajor)}", f"-DSM90_BN={self.bn}",
                f"-DSM90_STAGES={self.stages}", f"-DSM90_CLUSTER={self.cluster}", f"-DSM90_GROUP_M={self.group_m}",
                f"-DSM90_TMA_STORE={int(self.tma_store)}", f"-DSM90_EPI_COLS={self.epi_cols}",
                f"-DSM90_SWAP={int(self.swap)}", f"-DSM90_PROMOTE={int(fp8 and self.promote)}",
                f"-DSM90_MX={int(self.mx)}"]


def choose_sm90(elem: str, b_elem: str, a_kmajor: bool, b_kmajor: bool, promote: bool = True,
                tile: str | None = None, tma_store: int = 0, swap: bool = False, mx: bool = False) -> Sm90Variant:
    """The default variant of an element pair (tuning/dense.json, sm90_tiles).  ``tma_store``: the output's
    element bytes when its row pitch is a multiple of 16 bytes and its base 16-byte aligned (TMA), else 0.
    ``swap``: the operands are swapped (small M; the element names and majorness are the swapped ones).
    ``mx``: exact MX fp8 (block scales in the kernel; never swapped)."""
    if mx:
        return Sm90Variant(elem, b_elem, a_kmajor, b_kmajor, tile or MX_TILE, True, tma_store, mx=True)
    if swap:
        return Sm90Variant(elem, b_elem, a_kmajor, b_kmajor, tile or _T["sm90_tiles"]["swapped"], promote, 0, True)
    if tile is None:
        tile = _T["sm90_tiles"]["default_fp8_promoted" if (elem in _FP8 and promote) else "default_16bit"]
    return Sm90Variant(elem, b_elem, a_kmajor, b_kmajor, tile, promote, tma_store)


def choose(a_elem: str, b_elem: str, a_kmajor: bool, b_kmajor: bool, m: int, *, out_bytes: int = 0,
           promote: bool = True, tile: str | None = None, mx: bool = False) -> Sm90Variant:
    """The wgmma family's one rule: the build for staged operands A (``a_elem``, ``a_kmajor``) and B with M = ``m``
    rows.  M up to ``sm90_swap_max_m`` swaps the operands (C^T = B^T A^T: the returned variant has ``swap`` set and
    names B's element and majorness first) but never the exact MX variant (``mx``), which reads A's and B's factors;
    ``out_bytes``: the output's element bytes where TMA may store it (16-byte aligned base and pitch), else 0;
    ``tile``: a forced tile; ``promote``: fp8 promotion every 128 K.  Pure: tuning/dense.json holds its numbers."""
    if mx:
        return choose_sm90(a_elem, b_elem, a_kmajor, b_kmajor, tile=tile, tma_store=out_bytes, mx=True)
    if m <= SWAP_MAX_M:
        return choose_sm90(b_elem, a_elem, b_kmajor, a_kmajor, promote, tile, swap=True)
    return choose_sm90(a_elem, b_elem, a_kmajor, b_kmajor, promote, tile, out_bytes)


def all_sm90_variants() -> list[Sm90Variant]:
    """Every variant the chooser can return (the CI compile checks and the kernel manifest)."""
    out = []
    for e in ("f16", "bf16"):
        for ak in (True, False):
            for bk in (True, False):
                for store in _STORES:
                    out.append(choose_sm90(e, e, ak, bk, tma_store=store))
    for store in _STORES:
        out.append(choose_sm90("tf32", "tf32", True, True, tma_store=store))
    for a in _FP8:
        for b in _FP8:
            for promote in (True, False):
                for store in _STORES:
                    out.append(choose_sm90(a, b, True, True, promote, tma_store=store))
                out.append(choose_sm90(a, b, True, True, promote, swap=True))
            for store in _STORES:
                out.append(choose_sm90(a, b, True, True, tma_store=store, mx=True))
    for e in ("f16", "bf16"):
        for ak in (True, False):
            for bk in (True, False):
                out.append(choose_sm90(e, e, ak, bk, swap=True))
    out.append(choose_sm90("tf32", "tf32", True, True, swap=True))
    return out


# ------------------------------------------------------------------------------------------------------------
# the family rule (this family's part; families.family_for asks it)
# ------------------------------------------------------------------------------------------------------------
def wgmma_reason(arch: str, mdt=None, shape=None, sms: int = 132) -> str | None:
    """None when the wgmma family should run ``mdt`` for ``shape`` = (batch, m, n, k) on ``arch``, else why not.
    sm_90 only (wgmma is sm_90a); one matrix (batches stay on mma.sync's grid.y); enough 128x256 tiles to give
    every SM one (fewer — decode shapes — go to mma.sync, which splits K)."""
    if arch != "sm_90":
        return f"wgmma needs sm_90 (H100/H200/GH200), not {arch}"
    if shape is not None:
        batch, m, n, _k = shape
        if batch and batch > 1:
            return "batched problems run on mma.sync (the wgmma kernel has no batch dimension yet)"
        least = int(sms * _T["wgmma_min_tiles_per_sm"]["value"])
        if -(-m // BM) * -(-n // 256) < least:
            return f"{m}x{n} has fewer than {least} 128x256 tiles: mma.sync with split K fills the GPU better"
    return None


def split_tail(tiles: int, resident: int, kblocks: int) -> tuple[int, int, int]:
    """(tail0, splits, per): how the persistent grid of ``resident`` blocks (clusters) shares ``tiles`` output tiles
    of ``kblocks`` ring stages each.  The tiles fill ``tiles // resident`` whole waves; the ``r`` left over (all of
    them when there are fewer tiles than blocks) would keep r blocks busy for a whole tile while the others wait, so
    they are split along K into ``splits`` units of ``per`` stages, up to ``resident // r`` per tile, each split at
    least MIN_SPLIT_STAGES long (kernel: unit_work, split_fixup).  Tiles [0, tail0) run whole.  No split:
    (tiles, 1, kblocks).  E.g. 704 tiles of 128x192 (4096^2) on 132 SMs: 5 waves and 44 tiles split in 3."""
    r = tiles % resident
    splits = min(resident // r, kblocks // MIN_SPLIT_STAGES, MAX_SPLITS) if r else 1
    if splits < 2:
        return tiles, 1, kblocks
    per = -(-kblocks // splits)
    return tiles - r, -(-kblocks // per), per


_NO_MAP = np.zeros(1, dtype="V128")  # an unused tensor-map parameter
_NULL = np.uint64(0)


def operand_map(v: Sm90Variant, op, rows: int, tile_rows: int, ptr: int | None = None) -> np.ndarray:
    """The map of a staged operand (rows = M for A, N for B): K-major boxes are (128 bytes of K) x tile_rows;
    M/N-major boxes are 64 elements (128 bytes) x BK, loaded tile_rows / 64 times.  ``ptr``: the same layout at
    another address (default: the operand's own buffer)."""
    esize, ptr = v.esize, op.buf.data.ptr if ptr is None else ptr
    if op.kmajor:
        return tensor_map(ptr, esize, op.k, rows, op.ld, v.bk, tile_rows)
    return tensor_map(ptr, esize, rows, op.k, op.ld, STAGE_K_BYTES // esize, v.bk)


def max_active_clusters(kernel, v: Sm90Variant) -> int:
    """cuOccupancyMaxActiveClusters of variant ``v``'s kernel (compile-time cluster dims; 0 when the query fails)."""
    return driver.max_active_clusters(kernel, v.cluster, THREADS, v.smem_bytes)


_CLUSTERS: dict = {}
_OUT_ARGS = (2, 3, 13)  # Sm90Plan._launch_args: positions of map_c, C and pair_ok (Sm90Plan._out_args)
_MAP_ARGS = (0, 1)  # and of the operand maps (Sm90Plan.readdress)
_FIX_OUT_ARGS = (0, 2)  # mx_lo_fix's (Sm90Plan._fix_launch): the GEMM's fp32 result and the output


# ------------------------------------------------------------------------------------------------------------
# the plan
# ------------------------------------------------------------------------------------------------------------
class Sm90Plan(CudaPlan):
    """:class:`~.plan.CudaPlan` with the wgmma kernel bound instead of mma.sync (same staging, output, result).
    ``tile``: one of :data:`SM90_TILES`; ``fp8_accumulate``: "promote" (default) or "fast"."""

    def __init__(self, *args, fp8_accumulate: str = "promote", **kwargs):
        if fp8_accumulate not in ("promote", "fast"):
            raise UnsupportedError(f"fp8_accumulate must be 'promote' or 'fast', not {fp8_accumulate!r}")
        self._promote = fp8_accumulate == "promote"
        super().__init__(*args, **kwargs)

    def _bind(self) -> None:
        a, b, m, n = self.da, self.db, self.m, self.n
        if getattr(self, "_nb", 1) > 1 or a.bstride or b.bstride:  # batch elements in the grid (folded: none)
            raise UnsupportedError("the wgmma kernel multiplies one matrix; batches run on family='mma_sync'")
        mx = a.mx is not None
        self._fix = mx and (a.mx.lo_cnt is not None or b.mx.lo_cnt is not None)  # lost bits: mx_lo_fix after
        out = self._gemm_out()
        ob = out.dtype.itemsize  # 2 (fp16, bf16 bits) or 4 (fp32)
        store = ob if out.size > 0 and (out.shape[-1] * ob) % 16 == 0 and out.data.ptr % 16 == 0 else 0
        if mx != (b.mx is not None) or (mx and (a.elem not in _FP8 or b.elem not in _FP8)):
            raise UnsupportedError(f"internal: exact MX needs two MX fp8 operands (staged {a.elem}, {b.elem})")
        v = choose(a.elem, b.elem, a.kmajor, b.kmajor, m, out_bytes=store, promote=self._promote, tile=self._tile,
                   mx=mx)
        self._swap = v.swap  # C^T = B^T A^T: B (n rows) is the kernel's A, A (m rows) its B; D stored transposed
        self.variant_ = v
        path = "" if not mx else (", MX per-32 blocks" if a.mx.folded is None or b.mx.folded is None
                                  else ", MX folded into e4m3" if a.mx.lo_cnt is None and b.mx.lo_cnt is None
                                  else ", MX folded, lost bits added back")
        self.variant = f"{v.name} (wgmma{path})"
        self._kmn = (n, m) if self._swap else (m, n)  # the kernel's M and N
        self.diagnostics = ()
        self._scale = scale_args(a, b)  # host exponents by value, device ones (exp_at) as pointers
        self._smem = v.smem_bytes
        self._kernel = self.backend.kernels.get(self.cp, self.dev.ordinal, ("sm90", v), SM90_FILE, SM90_KERNEL,
                                                v.options(), self._smem)
        self._maps()
        key = (self.dev.ordinal, v)
        if key not in _CLUSTERS:
            _CLUSTERS[key] = max_active_clusters(self._kernel, v) if v.cluster > 1 else self.dev.sms
        self._schedule(_CLUSTERS[key] or self.dev.sms // v.cluster)

    def _gemm_out(self):
        """Where the GEMM writes: the output, or, where mx_lo_fix adds lost bits after it into a 16-bit output, an
        fp32 buffer of the output's shape that mx_lo_fix reads (one per plan)."""
        out = self.out
        if not self._fix or out.dtype.itemsize == 4:
            return out
        tmp = getattr(self, "_tmp", None)
        if tmp is None or tmp.shape != out.shape:
            with self.cp.cuda.Device(self.dev.ordinal):
                tmp = self._tmp = self.cp.empty(out.shape, dtype=self.cp.float32)
        return tmp

    def _fix_launch(self):
        """mx_lo_fix's grid and arguments: the lossy operands' lists and both operands' transposed elements."""
        cp, out, gout = self.cp, self.out, self._gemm_out()
        da, db = self.da, self.db
        ops = []
        for d, other in ((da, db), (db, da)):
            f = d.mx
            lossy = f.lo_cnt is not None
            elt = _transposed_elements(cp, d) if other.mx.lo_cnt is not None else None
            ops.append((f.lo_cnt if lossy else _NULL, f.lo_ent if lossy else _NULL, _NULL if elt is None else elt,
                        np.int64(0 if elt is None else elt.shape[1]), np.int32(_fp8_fmt(d.elem))))
        fa, fb = da.mx, db.mx
        args = (gout, np.int64(gout.shape[-1]), out, np.int64(out.shape[-1]), np.int32(OUT_KIND[self.out_dtype]),
                np.int32(self.m), np.int32(self.n), fa.info, fb.info, fa.factors, np.int64(fa.ld), fb.factors,
                np.int64(fb.ld), np.int32(LO_CAP), *ops[0], *ops[1],
                np.int32(fa.folded is not None and fb.folded is not None))
        grid = (-(-self.n // FIX_COLS), -(-self.m // FIX_ROWS))
        kernel = self.backend.kernels.get(cp, self.dev.ordinal, ("sm90", "mx_lo_fix"), SM90_MX_FILE, "mx_lo_fix",
                                          ("-std=c++17",))
        return kernel, grid, args

    def _schedule(self, resident: int) -> None:
        """The persistent grid on ``resident`` blocks (clusters) and the split of the last wave's tiles
        (:func:`split_tail`), with the fp32 partials and counters the split needs."""
        v, (km, kn) = self.variant_, self._kmn
        self._resident = resident = max(1, resident)
        self._tiles = tiles = max(1, -(-km // (BM * v.cluster)) * -(-kn // v.bn))  # clusters' tiles with clusters
        self._tail0, self._splits, self._per = split_tail(tiles, resident, max(1, -(-self.da.k // v.bk)))
        self._units = self._tail0 + (tiles - self._tail0) * self._splits  # whole tiles, then the split ones
        self._grid = (min(self._units, resident) * v.cluster,)
        self._alloc_split()

    def _alloc_split(self) -> None:
        """The split tiles' fp32 partials (per block of a split tile: splits x 128 x BN) and their counters (one per
        tile and consumer warpgroup, zero between launches); none without a split."""
        self._raw = None
        if self._splits == 1:
            self._ws = self._counters = None
            return
        v, cp = self.variant_, self.cp
        slots = (self._tiles - self._tail0) * v.cluster  # one per block of a split tile
        with cp.cuda.Device(self.dev.ordinal), self.stream:
            self._ws = cp.empty(slots * self._splits * BM * v.bn, dtype=cp.float32)
            self._counters = cp.zeros(slots * (THREADS // 128 - 1), dtype=cp.uint32)  # one per consumer

    def _maps(self) -> None:
        v = self.variant_
        self._raw = None  # the packed launch holds the maps: packed again by the next gemm()
        if self.da.k == 0 or self.out.size == 0:
            self._map_a = self._map_b = self._map_c = None
            return
        (da, db), (km, kn) = (self.db, self.da) if self._swap else (self.da, self.db), self._kmn
        self._map_a = operand_map(v, da, km, BM)
        self._map_b = operand_map(v, db, kn, v.bn // v.cluster)
        self._mx_args = (_NO_MAP, _NO_MAP, _NULL, _NULL, _NULL, _NULL, _NULL, _NULL, _NULL, np.int64(0), _NULL,
                         np.int64(0))
        if v.mx:  # int32 factors: A [M][blocks_pad] in boxes {4 blocks, 128 rows}, B [blocks_pad][N16] in {BN, 4}
            fa, fb = da.mx, db.mx
            map_sa = tensor_map(fa.factors.data.ptr, 4, fa.ld, km, fa.ld, 4, BM, swizzle=SWIZZLE_NONE)
            map_sb = tensor_map(fb.factors.data.ptr, 4, fb.ld, fb.blocks_pad, fb.ld, v.bn, 4, swizzle=SWIZZLE_NONE)
            folded = (fa.folded, fb.folded) if fa.folded is not None and fb.folded is not None else (_NULL, _NULL)
            self._mx_args = (map_sa, map_sb, fa.info, fb.info, fa.nan, fb.nan, *folded, fa.factors, np.int64(fa.ld),
                             fb.factors, np.int64(fb.ld))
        self._fix_raw = None  # packed again by the next gemm()
        # the output as TMA stores it: dims {N, M}, boxes of 128 bytes x 64 rows; zeros (unused) for direct stores
        out = self._gemm_out()
        ob = v.tma_store
        self._map_c = (tensor_map(out.data.ptr, ob, self.n, self.m, out.shape[-1], STAGE_K_BYTES // ob, 64) if ob
                       else np.zeros(1, dtype="V128"))

    def rebind(self, da=None, db=None, out=None) -> None:
        """:meth:`CudaPlan.rebind`: the tensor maps of what changed are encoded again; a new output alone is set
        into the packed launch (its map, address and pair_ok), new operands pack it again at the next gemm()."""
        operands = da is not None or db is not None
        self.da, self.db = da or self.da, db or self.db
        if out is not None:
            self.out = out
            if operands or self._fix_raw is None:
                self._fix_raw = None
            else:  # mx_lo_fix's packed launch: the GEMM's result it reads and the output it writes (_fix_launch)
                self._fix_raw.set(_FIX_OUT_ARGS[0], self._gemm_out())
                self._fix_raw.set(_FIX_OUT_ARGS[1], out)
        if operands:
            self._scale = scale_args(self.da, self.db)  # another weight: its scale exponent (or device scale) too
            self._maps()
        elif out is not None and out.size and self.da.k:
            v = self.variant_
            out = self._gemm_out()
            if v.tma_store:
                self._map_c = tensor_map(out.data.ptr, v.tma_store, self.n, self.m, out.shape[-1],
                                         STAGE_K_BYTES // v.tma_store, 64)
            if self._raw is not None:
                for i, a in zip(_OUT_ARGS, self._out_args()):
                    self._raw.set(i, a)

    def readdress(self, a_ptr: int, b_ptr: int) -> None:
        """Point the packed launch at operands of the same layout (shape, strides, alignment) at other addresses:
        the per-call path of fp16/bf16 device operands read in place (``fastpath.fast_call``).  Only the two
        operand maps are encoded again and set into the launch; ``da``/``db`` keep describing the layout."""
        v = self.variant_
        (da, db), (km, kn) = (self.db, self.da) if self._swap else (self.da, self.db), self._kmn
        pa, pb = (b_ptr, a_ptr) if self._swap else (a_ptr, b_ptr)
        self._map_a = operand_map(v, da, km, BM, pa)
        self._map_b = operand_map(v, db, kn, v.bn // v.cluster, pb)
        if self._raw is not None:
            for i, m in zip(_MAP_ARGS, (self._map_a, self._map_b)):
                self._raw.set(i, m)

    def launch_at(self, a_ptr: int, b_ptr: int, out) -> None:
        """:meth:`CudaPlan.launch_at`: the operand maps at the new addresses (:meth:`readdress`), the output's
        set into the launch when it moved (the plan holds an unowned view of it), then gemm()."""
        if address_of(out) != int(self.out.data.ptr):
            self.rebind(out=unowned_view(self.cp, out))
        self.readdress(a_ptr, b_ptr)
        self.gemm()

    def leave_sms(self, n: int) -> None:
        """Launch the persistent grid on ``n`` fewer SMs (whole clusters; tiles stride over the blocks there are):
        for a GEMM that runs beside a collective whose kernel holds about that many SMs (backends/cuda/tp.py), so
        that no block waits for an SM the collective holds while the others finish their tiles."""
        self._schedule(max(1, self._resident - max(0, int(n)) // self.variant_.cluster))  # split_tail again

    def _out_args(self) -> tuple:
        """The launch arguments that follow the output (at positions _OUT_ARGS): its tensor map, address, pair_ok."""
        out = self._gemm_out()
        return self._map_c, out, np.int32(out.shape[-1] % 2 == 0 and out.data.ptr % 8 == 0)

    def _launch_args(self) -> tuple:
        (km, kn), (map_c, out, pair_ok) = self._kmn, self._out_args()
        return (self._map_a, self._map_b, map_c, out, np.int32(km), np.int32(kn), np.int32(self.da.k),
                np.int64(out.shape[-1]), *self._scale,
                np.int32(OUT_KIND[self.out_dtype] if out is self.out else OUT_KIND["float32"]), pair_ok,
                np.int32(self._units), np.int32(self._tail0), np.int32(self._splits), np.int32(self._per), self._ws,
                self._counters,
                *self._mx_args)

    def gemm(self) -> None:
        cp, out = self.cp, self.out
        with cp.cuda.Device(self.dev.ordinal):
            if out.size == 0:
                return
            if self.da.k == 0:  # the empty sum
                with self.stream:
                    out.fill(0)
                return
            if self._raw is None:  # packed once per operands / output (rebind): a launch is cuLaunchKernel alone
                self._raw = RawLaunch(self._kernel, self._grid, (THREADS,), self._smem, self._launch_args())
            self._raw(cp.cuda.driver, self.stream.ptr, ())
            if self._fix:  # a lossy MXFP8 fold's lost bits, added to the GEMM's fp32 result
                if self._fix_raw is None:  # packed once; programmatic dependent launch: mx_lo_fix's prologue
                    with self.stream:  # runs while the GEMM finishes (it waits for the GEMM before reading C)
                        kernel, grid, args = self._fix_launch()  # (a partner's transposed elements, made by the
                    self._fix_raw = RawLaunch(kernel, grid, (256,), 0, args, pdl=True)  # first call, on this stream)
                self._fix_raw(cp.cuda.driver, self.stream.ptr, ())

    def clone(self) -> "Sm90Plan":
        other = super().clone()
        other._tmp = None  # its own fp32 buffer for mx_lo_fix (plans may run on different streams)
        other._maps()  # the maps hold the operands' addresses
        other._alloc_split()  # its own partials and counters (plans may run on different streams)
        return other


def compile_jobs(arch: str) -> list[dict]:
    """This family's builds for ``kernels --emit`` and the offline checks (registered with ``emit.py``): on sm_90,
    every variant the chooser can return (sm_90a machine code: wgmma and setmaxnreg are arch-specific) and the exact
    MX kernels; nothing elsewhere."""
    if sm_of(arch) != 90:
        return []
    jobs = [{"file": SM90_FILE, "kernel": SM90_KERNEL, "stem": v.name, "family": "wgmma", "arch": "sm_90a",
             "dtype": (f"mxfp8 {v.elem} x {v.b_elem} (wgmma, exact block scales)" if v.mx
                       else f"{v.elem} x {v.b_elem} (wgmma)"),
             "tile": v.tile, "smem": v.smem_bytes, "threads": THREADS,
             "options": [o for o in v.options() if not o.startswith("--gpu-architecture")]}
            for v in all_sm90_variants()]
    for kernel, what in zip(SM90_MX_KERNELS, ("MX block factors (wgmma, exact MX fp8)",
                                              "MXFP4/MXFP6 row exponents (wgmma, exact MX)",
                                              "MX operands folded (MXFP4/MXFP6 into e4m3, MXFP8 lossy + lists)",
                                              "MXFP8 fold: lost-bit lists sorted by k (wgmma, exact MX)",
                                              "MXFP8 fold: lost bits added to the GEMM's result")):
        jobs.append({"file": SM90_MX_FILE, "kernel": kernel, "stem": kernel[3:], "family": "wgmma", "dtype": what,
                     "options": ["-std=c++17"], "smem": 0, "threads": 256})
    return jobs


register_jobs("wgmma", compile_jobs)
