"""The CUDA plan: staged operands, output and a bound launch of the mma.sync GEMM (``kernels_cuda/gemm.cu``).

Everything a launch needs — variant, tile, grid, split K, kernel handle, scale factors — is decided once when the
plan is built (:meth:`CudaPlan._bind`); ``gemm()`` only launches.  Batched problems run as one launch: the batch
is the grid's y dimension (operand batch strides, 0 for a shared operand) and split K keeps z.  Split K (fp32
slices + an ordered, deterministic reduction) is used when the output tiles cannot fill the GPU and K is long
(e.g. 16x8192x8192).
"""

from __future__ import annotations

import numpy as np

from mxcore.errors import UnsupportedError

from .._contract import Plan
from .compile import GEMM_FILE
from .stage import DevOperand
from .variants import TILES, Variant, choose_tile, gemm_options

__all__ = ["OUT_KIND", "CudaPlan", "split_k"]

OUT_KIND = {"float32": 0, "float16": 1, "bfloat16": 2}
STORE = {"float32": "float32", "float16": "float16", "bfloat16": "uint16"}
MAX_BATCH = 65535  # grid.y


def split_k(sms: int, blocks: int, k: int, bk: int, force: int = 0) -> tuple[int, int]:
    """(splits, K per split): split K when the output tiles cannot fill the GPU and K is long."""
    if force:
        want = force
    elif blocks >= sms or k < 8 * bk:
        return 1, k
    else:
        want = min(-(-4 * sms // blocks), 16, k // (4 * bk))
    per = -(-k // max(1, want))
    k_split = -(-per // bk) * bk  # a multiple of the K tile
    return -(-k // k_split), k_split


class CudaPlan(Plan):
    """``a @ b`` on one device: ``gemm()`` launches the GEMM alone, ``prep()`` re-runs the device-side operand
    preparation (the benchmark times them separately), ``result()`` gives the caller's kind of array."""

    def __init__(self, backend, cp, dev, stream, da: DevOperand, db: DevOperand, out, m: int, n: int, batch,
                 out_dtype: str, prep, result_like, *, tile: str | None = None, fp8_convert: bool = True,
                 split: int = 0, fold: tuple | None = None):
        self.backend, self.cp, self.dev, self.stream = backend, cp, dev, stream
        self.da, self.db, self.out = da, db, out
        self.m, self.n, self.out_dtype = m, n, out_dtype
        self._nb = 1 if batch is None else batch  # batch elements in the grid (a folded batch is part of M)
        self.batch = fold[0] if fold is not None else batch
        self._prep, self._like, self._fold = prep, result_like, fold
        self._tile, self._convert, self._split = tile, fp8_convert, split
        with cp.cuda.Device(dev.ordinal):  # the kernel handle and its shared-memory limit are per device
            self._bind()

    # ---- launch parameters, once per plan ----------------------------------------------------------------
    def _bind(self) -> None:
        a, b, m, n = self.da, self.db, self.m, self.n
        nb = max(1, self._nb)  # an empty batch launches nothing (gemm() returns first)
        if nb > MAX_BATCH:
            raise UnsupportedError(f"batch {nb} is above {MAX_BATCH} (the grid's y dimension); split the batch")
        if a.elem in ("e4m3", "e5m2"):
            elem = f"{a.elem}.{b.elem}" + (".f16" if self._convert else "")
        elif b.elem != a.elem:
            raise UnsupportedError(f"internal: operands staged as {a.elem} and {b.elem}")
        else:
            elem = a.elem
        tile = self._tile or choose_tile(m, n, self.dev.sms, elem, nb)
        if tile not in TILES:
            raise UnsupportedError(f"tile {tile!r} is not one of the CUDA kernel's tiles: {', '.join(TILES)}")
        v = Variant(elem, a.kmajor, b.kmajor, tile)
        t = TILES[tile]
        for op, mn_rows in ((a, t.bm), (b, t.bn)):  # the kernel's per-thread copy offsets are 32-bit
            if (mn_rows if op.kmajor else v.bk) * op.ld * v.element.esize >= 2**32:
                raise UnsupportedError(f"leading dimension {op.ld} is too large for the CUDA kernels' 32-bit tile "
                                       "offsets; pass a contiguous operand with fewer than ~16M elements per row")
        self.variant_ = v
        self.variant = f"{v.name} (mma.sync)"
        blocks = -(-m // t.bm) * -(-n // t.bn)
        e = a.exp + b.exp
        self._alpha = (np.float32(2.0 ** (e // 2)), np.float32(2.0 ** (e - e // 2)))
        self._splits, self._k_split = split_k(self.dev.sms, blocks * nb, a.k, v.bk, self._split)
        self._grid = (blocks, nb, self._splits)
        self._kernel = self.backend.kernels.get(self.cp, self.dev.ordinal, ("gemm", v), GEMM_FILE, "mx_gemm",
                                                gemm_options(v), v.smem_bytes)
        self.diagnostics = ("smem", "mma", "feed") if self._splits == 1 else ()

    def _args(self, c, ldc: int, alpha, out_kind: int, split_stride: int, c_bstride: int) -> tuple:
        a, b = self.da, self.db
        return (a.buf, b.buf, c, np.int32(self.m), np.int32(self.n), np.int32(a.k), np.int64(a.ld), np.int64(b.ld),
                np.int64(ldc), alpha[0], alpha[1], np.int32(out_kind), np.int32(self._k_split),
                np.int64(split_stride), np.int64(a.bstride), np.int64(b.bstride), np.int64(c_bstride))

    # ---- the contract -------------------------------------------------------------------------------------
    def gemm(self) -> None:
        cp, m, n = self.cp, self.m, self.n
        with cp.cuda.Device(self.dev.ordinal), self.stream:
            if self.out.size == 0:
                return
            if self.da.k == 0:  # the empty sum
                self.out.fill(0)
                return
            v, out = self.variant_, self.out
            ldc = out.shape[-1]
            if self._splits == 1:
                self._kernel(self._grid, (v.threads,), self._args(out, ldc, self._alpha, OUT_KIND[self.out_dtype], 0,
                                                                   m * ldc), shared_mem=v.smem_bytes)
                return
            nb = self._nb
            ws = cp.empty((self._splits, nb, m, n), dtype=cp.float32)  # fp32 partial products, summed in z order
            one = (np.float32(1), np.float32(1))
            self._kernel(self._grid, (v.threads,), self._args(ws, n, one, 0, nb * m * n, m * n),
                         shared_mem=v.smem_bytes)
            red = self.backend.kernels.prep(cp, self.dev.ordinal, "mx_splitk_reduce")
            rows = nb * m  # the output is C-contiguous: the batch stacks along M
            grid = (max(1, min(-(-rows * n // 256), 4 * self.dev.sms)),)
            red(grid, (256,), (ws, np.int32(self._splits), np.int64(nb * m * n), out, np.int32(rows), np.int32(n),
                               np.int64(ldc), self._alpha[0], self._alpha[1], np.int32(OUT_KIND[self.out_dtype])))

    def prep(self) -> None:
        with self.cp.cuda.Device(self.dev.ordinal), self.stream:
            self._prep()

    def result(self):
        out = self.out
        if self._fold is not None:
            out = out.reshape(self._fold)
        return self._like(out)

    def clone(self) -> "CudaPlan":
        """The same problem in fresh device buffers (copies of the staged operands and the output)."""
        import copy

        other = copy.copy(self)
        with self.cp.cuda.Device(self.dev.ordinal), self.stream:
            other.da, other.db, other.out = self.da.copy(), self.db.copy(), self.out.copy()
        return other

    def gemm_diagnostic(self, name: str) -> None:
        """The benchmark's loop diagnostics (``kernels_cuda/gemm_diag.cu``): the output is NOT the product
        afterwards (run gemm() again before result())."""
        if name not in self.diagnostics:
            super().gemm_diagnostic(name)
        from .diag import launch_diagnostic

        with self.cp.cuda.Device(self.dev.ordinal), self.stream:
            launch_diagnostic(self, name)

    def close(self) -> None:
        """Drop this plan's device buffers (CuPy frees them once no other reference is left)."""
        self.da = self.db = self.out = None
        self._prep = self._like = None


class BatchLoopPlan(Plan):
    """A batch of fp8/MX problems (3-D operands of quantized dtypes): one 2-D plan per batch element, each
    quantized and scaled on its own (per-tensor fp8 scales and MX scale ranges are per batch element, as in a
    loop of 2-D calls), writing slices of one (B, M, N) output; ``gemm()`` launches them in order."""

    def __init__(self, parts, out, like):
        self.parts, self.out, self._like = parts, out, like
        self.batch = out.shape[0]
        self.variant = parts[0].variant if parts else ""

    def gemm(self) -> None:
        for p in self.parts:
            p.gemm()

    def prep(self) -> None:
        for p in self.parts:
            p.prep()

    def result(self):
        return self._like(self.out)

    def clone(self) -> "BatchLoopPlan":
        out = self.out.copy()
        parts = []
        for i, p in enumerate(self.parts):
            c = p.clone()
            c.out = out[i]
            parts.append(c)
        return BatchLoopPlan(parts, out, self._like)

    def close(self) -> None:
        for p in self.parts:
            p.close()
        self.parts, self.out = [], None
