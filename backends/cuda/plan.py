"""The CUDA plan: staged operands, output and a bound launch of the mma.sync GEMM (``kernels_cuda/gemm.cu``).

Everything a launch needs — variant, tile, grid, split K, kernel handle, the packed argument tuples — is decided
once when the plan is built (:meth:`CudaPlan._bind`); ``gemm()`` only launches.  The output scale 2^e travels as
``(exp0, exp_a, exp_b, exp_u8)`` (:func:`scale_args`): host exponents in exp0, device scalars (a device
ScaledTensor's scale_exp, a device MXTensor's scale_max) as pointers the epilogue reads, never the host.  Batched problems run as one launch: the batch
is the grid's y dimension (operand batch strides, 0 for a shared operand) and split K keeps z.  Split K (fp32
slices + an ordered, deterministic reduction) is used when the output tiles cannot fill the GPU and K is long
(e.g. 16x8192x8192).
"""

from __future__ import annotations


import numpy as np

from mxcore.errors import UnsupportedError

from .._contract import Plan
from .compile import GEMM_FILE
from .device import address_of
from .driver import RawLaunch
from .operand import OUT_KIND, DevOperand
from .tables import table
from .variants import TILES, f8_pair, gemm_options
from .variants import choose as choose_variant

__all__ = ["OUT_KIND", "CudaPlan", "scale_args", "split_k"]

MAX_BATCH = 65535  # grid.y


def split_k(sms: int, blocks: int, k: int, bk: int, force: int = 0) -> tuple[int, int]:
    """(splits, K per split): split K when the output tiles cannot fill the GPU and K is long (at least 8 K tiles
    and the tuning table's ``mma_sync_split.min_k``)."""
    if force:
        want = force
    elif blocks >= sms or k < max(8 * bk, table("dense")["mma_sync_split"]["min_k"]):
        return 1, k
    else:
        want = min(-(-4 * sms // blocks), 16, k // (4 * bk))
    per = -(-k // max(1, want))
    k_split = -(-per // bk) * bk  # a multiple of the K tile
    return -(-k // k_split), k_split


_NULL = np.uint64(0)
UNIT_SCALE = (np.int32(0), _NULL, _NULL, np.int32(0))  # scale 1 (split-K partial products)


def scale_args(a: DevOperand, b: DevOperand) -> tuple:
    """The kernels' output-scale arguments (exp0, exp_a, exp_b, exp_u8) for 2^(a.exp + *a.exp_at + b.exp +
    *b.exp_at) (mx_common.cuh ``out_scale``): device scalars are passed as pointers, never read here."""
    ats = [x.exp_at for x in (a, b) if x.exp_at is not None]
    kinds = {x.dtype.itemsize for x in ats}
    if len(kinds) > 1 or kinds - {1, 4}:
        raise UnsupportedError(f"internal: device scale exponents of dtypes {[x.dtype.name for x in ats]}")
    return (np.int32(a.exp + b.exp), _NULL if a.exp_at is None else a.exp_at,
            _NULL if b.exp_at is None else b.exp_at, np.int32(kinds == {1}))


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
        self._ws = None  # split K's fp32 partials (mma.sync: made by the first gemm(); Sm90Plan: _alloc_split)
        with cp.cuda.Device(dev.ordinal):  # the kernel handle and its shared-memory limit are per device
            self._bind()

    # ---- launch parameters, once per plan ----------------------------------------------------------------
    def _bind(self) -> None:
        a, b, m, n = self.da, self.db, self.m, self.n
        nb = max(1, self._nb)  # an empty batch launches nothing (gemm() returns first)
        if nb > MAX_BATCH:
            raise UnsupportedError(f"batch {nb} is above {MAX_BATCH} (the grid's y dimension); split the batch")
        v = choose_variant(a.elem, b.elem, a.kmajor, b.kmajor, m, n, self.dev.sms, nb, self._tile, self._convert)
        t = TILES[v.tile]
        for op, mn_rows in ((a, t.bm), (b, t.bn)):  # the kernel's per-thread copy offsets are 32-bit
            if (mn_rows if op.kmajor else v.bk) * op.ld * v.element.esize >= 2**32:
                raise UnsupportedError(f"leading dimension {op.ld} is too large for the CUDA kernels' 32-bit tile "
                                       "offsets; pass a contiguous operand with fewer than ~16M elements per row")
        self.variant_ = v
        self.variant = f"{v.name} (mma.sync)"
        blocks = -(-m // t.bm) * -(-n // t.bn)
        self._scale = scale_args(a, b)
        self._splits, self._k_split = split_k(self.dev.sms, blocks * nb, a.k, v.bk, self._split)
        self._grid = (blocks, nb, self._splits)
        self._kernel = self.backend.kernels.get(self.cp, self.dev.ordinal, ("gemm", v), GEMM_FILE, "mx_gemm",
                                                gemm_options(v), v.smem_bytes)
        self.diagnostics = ("smem", "mma", "feed") if self._splits == 1 else ()
        self._pack()

    def _pack(self) -> None:
        """The launch argument tuples (they hold the buffers: re-packed by clone()); the packed launch is made
        again from them by the next gemm()."""
        self._launch = self._relaunch = None
        out = self.out
        if out is None or out.size == 0 or self.da.k == 0:
            return
        ldc = out.shape[-1]
        if self._splits == 1:
            self._launch = (self._args(out, ldc, self._scale, OUT_KIND[self.out_dtype], 0, self.m * ldc), None)
            return
        nb, m, n = self._nb, self.m, self.n
        rows = nb * m  # the output is C-contiguous: the batch stacks along M
        self._red_grid = (max(1, min(-(-rows * n // 256), 4 * self.dev.sms)),)
        self._red = self.backend.kernels.prep(self.cp, self.dev.ordinal, "mx_splitk_reduce")
        self._launch = (None, (np.int32(self._splits), np.int64(nb * m * n), out, np.int32(rows), np.int32(n),
                               np.int64(ldc), *self._scale, np.int32(OUT_KIND[self.out_dtype])))

    def _args(self, c, ldc: int, scale, out_kind: int, split_stride: int, c_bstride: int) -> tuple:
        """mx_gemm's (and mx_gemm_diag's) arguments in kernel order (gemm.cu); the last, f8_pair, is the fp8
        formats of a converted build (0 for the others, which ignore it)."""
        a, b = self.da, self.db
        return (a.buf, b.buf, c, np.int32(self.m), np.int32(self.n), np.int32(a.k), np.int64(a.ld), np.int64(b.ld),
                np.int64(ldc), *scale, np.int32(out_kind), np.int32(self._k_split),
                np.int64(split_stride), np.int64(a.bstride), np.int64(b.bstride), np.int64(c_bstride),
                np.int32(f8_pair(self.variant_, a.elem, b.elem)))

    # ---- the contract -------------------------------------------------------------------------------------
    def gemm(self) -> None:
        cp = self.cp
        with cp.cuda.Device(self.dev.ordinal), self.stream:
            self._gemm()

    def _gemm(self) -> None:
        """gemm() under the plan's device and stream (the backend's matmul is already there)."""
        launch = self._launch
        if launch is None:
            if self.out.size and self.da.k == 0:  # the empty sum
                self.out.fill(0)
            return
        self._launch_ptrs(self.da.buf.data.ptr, self.db.buf.data.ptr, self.out.data.ptr)

    def _launch_ptrs(self, a_ptr: int, b_ptr: int, c_ptr: int) -> None:
        raw = self._relaunch
        if raw is None:  # packed once per operands / output (_pack): a launch is cuLaunchKernel alone
            raw = self._relaunch = self.launcher()
        cp = self.cp
        ws = self._ws
        if raw.ws_bytes and (ws is None or ws.nbytes < raw.ws_bytes):  # fp32 partials, summed in z order: kept
            ws = self._ws = cp.empty(raw.ws_bytes, dtype=cp.uint8)  # (a call allocates nothing: CUDA-graph safe)
        raw(cp.cuda.driver, self.stream.ptr, a_ptr, b_ptr, c_ptr, 0 if ws is None else ws.data.ptr)

    def launch_at(self, a_ptr: int, b_ptr: int, out) -> None:
        """gemm() with operands of this plan's layout (shape, strides, alignment, scales) at ``a_ptr`` / ``b_ptr``
        into ``out`` (a torch CUDA tensor or CuPy array like the plan's output): the per-call paths' launch.  The
        plan keeps no reference to ``out``."""
        with self.cp.cuda.Device(self.dev.ordinal):
            self._launch_ptrs(a_ptr, b_ptr, address_of(out))

    def rebind(self, da: DevOperand | None = None, db: DevOperand | None = None, out=None) -> None:
        """Point the next gemm() at other staged operands (same layout: what ``prep()`` returns again) and/or another
        output (a CuPy array like the plan's output: shape, dtype, C order)."""
        operands = da is not None or db is not None
        self.da, self.db = da or self.da, db or self.db
        scale = self._scale
        if operands:  # another weight: its scale exponent (or device scale) too
            self._scale = scale_args(self.da, self.db)
        if out is not None:
            self.out = out
        packed = self._relaunch
        self._pack()
        if all(x is y or (isinstance(x, np.generic) and x == y) for x, y in zip(scale, self._scale)):
            self._relaunch = packed  # same layout and scales: the packed launch takes the addresses per call

    def launcher(self) -> "Relaunch":
        """This plan's launch(es) as a :class:`Relaunch`, packed once: a call sets the operand, output and workspace
        addresses (``_gemm``, and ``fastpath.fast_call`` with direct operands whose addresses change per call)."""
        args, red = self._launch
        v = self.variant_
        if red is None:
            return Relaunch(RawLaunch(self._kernel, self._grid, (v.threads,), v.smem_bytes, args), None, 0)
        nb, m, n = self._nb, self.m, self.n
        main = RawLaunch(self._kernel, self._grid, (v.threads,), v.smem_bytes,
                         self._args(None, n, UNIT_SCALE, 0, nb * m * n, m * n))
        return Relaunch(main, RawLaunch(self._red, self._red_grid, (256,), 0, (None,) + red),
                        self._splits * nb * m * n * 4)

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
        other._ws = None  # its own split-K partials (plans may run on different streams)
        if hasattr(other, "_launch"):  # this family's packed arguments hold the buffers
            other._pack()
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


class Relaunch:
    """A direct-operand plan's launches with the operand and output addresses as the only per-call inputs:
    ``main`` (slots 0, 1, 2: A, B, C — or the fp32 workspace under split K) and, under split K, ``red`` (the
    ordered reduction: slot 0 the workspace, slot 3 the output); ``ws_bytes``: workspace size."""

    def __init__(self, main: RawLaunch, red: RawLaunch | None, ws_bytes: int):
        self.main, self.red, self.ws_bytes = main, red, ws_bytes

    def __call__(self, driver, stream: int, a_ptr: int, b_ptr: int, c_ptr: int, ws_ptr: int = 0) -> None:
        if self.red is None:
            self.main(driver, stream, ((0, a_ptr), (1, b_ptr), (2, c_ptr)))
            return
        self.main(driver, stream, ((0, a_ptr), (1, b_ptr), (2, ws_ptr)))
        self.red(driver, stream, ((0, ws_ptr), (3, c_ptr)))


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
