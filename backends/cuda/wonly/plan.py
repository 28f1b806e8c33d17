"""The registers path's plan of a weight-only product (``"wonly"`` pairs: fp16/bf16 activations x an MX weight) and
both paths' staging callables; the kernel is ``wonly.choose``'s (or the ``config=`` it is given), the launch is
sized by the functions of ``wonly/__init__.py``."""

from __future__ import annotations


import numpy as np

from mxcore.errors import UnsupportedError

from ..._contract import Plan
from .. import wonly as rules
from ..device import resident_blocks
from ..driver import RawLaunch, tensor_map
from ..operand import OUT_KIND, DevOperand
from ..variants import sm_of
from .records import GROUP, packed_bytes, record_groups, records_written

__all__ = ["WonlyPlan", "quantized_b", "registers_prep", "staged_prep"]


def _activations(stager, a, od) -> DevOperand:
    """A as the kernel reads it: 16-bit, K contiguous, 16-byte aligned base and row pitch; read in place when it
    already is, else rounded once into a padded K-major buffer (stage.py's float staging)."""
    want = "f16" if od.name == "fp16" else "bf16"
    arr, kind = stager.float_source(a, "a", od)
    if kind == {"f16": "float16", "bf16": "bf16"}[want]:
        d = stager._direct16(arr, "a")
        if d is not None and d.kmajor:
            d.elem = want
            return d
    buf, ld = stager._prep_float(arr, kind, "a", want)
    return DevOperand(buf, ld, True, want, 0, int(arr.shape[-1]))


class WonlyPlan(Plan):
    """``a @ b`` on the registers path: ``gemm()`` launches mx_wonly_gemm alone, ``prep()`` re-stages the operands
    (a cached packed weight costs nothing), ``result()`` gives the caller's kind of array."""

    def __init__(self, backend, cp, dev, stream, da: DevOperand, db: DevOperand, out, m: int, n: int,
                 out_dtype: str, prep, result_like, fold=None, split: int = 0, config=None):
        self.backend, self.cp, self.dev, self.stream = backend, cp, dev, stream
        self.da, self.db, self.out, self.m, self.n, self.out_dtype = da, db, out, m, n, out_dtype
        self._prep, self._like, self._fold, self._split = prep, result_like, fold, split
        if sm_of(dev.arch) < 80:
            raise UnsupportedError(f"the weight-only kernel needs sm_80 or newer (mma.sync bf16, cp.async), "
                                   f"not {dev.arch}")
        self.batch = fold[0] if fold is not None else None

        problem = rules.WonlyProblem(m, n, da.k, da.elem, db.elem, dev.arch, dev.sms)
        self.variant_ = rules.choose(problem, "registers", config, lambda: rules.wg_fold_only(db, da.elem)).variant
        groups = record_groups(n)
        self._grid_xy = (-(-groups * GROUP // self.variant_.tiles), -(-m // (8 * self.variant_.mt)))
        v = self.variant_
        self._nchunks = -(-da.k // v.kc)
        with cp.cuda.Device(dev.ordinal):
            # keyed by the build (its options): the element formats that share it share the module
            self._kernel = backend.kernels.get(cp, dev.ordinal, "wonly", v.file, v.entry, v.options(), v.smem_bytes)
            # the permuted copy of the activations that a WW_TMA build loads (the same module's second entry)
            self._xperm_kernel = (backend.kernels.get(cp, dev.ordinal, "wonly", v.file, "mx_wonly_xperm",
                                                      v.options()) if v.tma_x else None)
            small = v.kernel in ("gemv", "wg")
            per_sm = v.ctas_per_sm
            if small:  # one wave: no more blocks per SM than can be resident (registers, shared memory, threads)
                attrs = self._kernel.attributes
                per_sm = min(per_sm, resident_blocks(dev.props, int(attrs["num_regs"]), v.threads,
                                                     v.smem_bytes + int(attrs.get("shared_size_bytes", 0))))
            base = self._grid_xy[0] * self._grid_xy[1]
            cap = (64 if v.kernel == "gemv"
                   else rules.ring_split_cap(m, self._grid_xy[0] * v.tiles * 16, packed_bytes(db.elem, da.k, n)))
            self._splits, self._per = rules._splits(dev.sms, base, self._nchunks, split, per_sm, small, cap)
            self._smem = v.smem_bytes
            if small and v.pdl:  # see wonly._even_smem
                self._smem = rules._even_smem(dev.props, base * self._splits, dev.sms, per_sm, v.smem_bytes,
                                              int(self._kernel.attributes.get("shared_size_bytes", 0)))
                if self._smem > max(v.smem_bytes, 48 * 1024):
                    self._kernel.max_dynamic_shared_size_bytes = max(
                        self._smem, int(self._kernel.attributes.get("max_dynamic_shared_size_bytes", 0)))
            how = {"gemv": "direct loads",
                   "wg": ("bulk copies and tensor copies of the permuted activations (mx_wonly_xperm first)"
                          if v.tma_x else "bulk copies and a gathered activation ring") + ", warp-specialized"}.get(
                v.kernel, "cp.async ring") + (", PDL" if v.pdl else "")
            mma = "wgmma with the weight as register A" if v.kernel == "wg" else "mma.sync"
            self.variant = (f"{v.name} split {self._splits} (registers: packed weight decoded in registers, {how}, "
                            f"{mma})")
            with self.stream:  # as prep() and clone(): every buffer made and zeroed on the stream that uses it
                self._alloc()

    def _alloc(self) -> None:
        """Split-K workspace and tile counters, and the launch packed once (``RawLaunch``: cuLaunchKernel with a
        prepared parameter block, a few microseconds of host time per call); for a WW_TMA build also the permuted
        copy of A (M x K rounded up to 64, written by mx_wonly_xperm before each product), its tensor map (boxes of
        64 K x the tokens a block loads) and that launch.  Called on the plan's stream: a memset on another stream
        (a worker thread's CuPy default) would not be ordered before the first launch."""
        cp = self.cp
        gx, gy = self._grid_xy
        v = self.variant_
        if self._splits > 1:
            self._ws = cp.empty(self._splits * self.m * gx * v.tiles * 16, dtype=cp.float32)
            self._counters = cp.zeros(gx * gy, dtype=cp.uint32)
        else:
            self._ws = self._counters = None
        self._launch = self._xperm = None
        out, a, b = self.out, self.da, self.db
        self._plain = v.plain_twin and not b.specials  # (takes() keeps it for a swapped weight)
        if out is None or out.size == 0 or a.k == 0:
            return
        # the wgmma kernel's last parameter, the permuted copy's tensor map (a build without WW_TMA does not read it);
        # the other kernels have none
        xmap = (np.zeros(1, dtype="V128"),) if v.kernel == "wg" else ()
        if v.tma_x:
            kp = -(-a.k // 64) * 64
            self._xp = cp.empty((self.m, kp), dtype=cp.uint16)
            xmap = (tensor_map(self._xp.data.ptr, 2, kp, self.m, kp, 64, 8 * v.mt),)
            words = self.m * (kp // 32)
            self._xperm = RawLaunch(self._xperm_kernel, (-(-words // 256),), (256,), 0, (
                a.buf, self._xp, np.int32(self.m), np.int32(a.k), np.int64(a.ld), np.int32(kp)), pdl=v.pdl)
        self._launch = RawLaunch(self._kernel, self._grid_xy + (self._splits,), (v.threads,), self._smem, (
            b.buf, a.buf, out, self._ws, self._counters, np.int32(self.m), np.int32(self.n), np.int32(a.k),
            np.int64(a.ld), np.int64(out.shape[-1]), np.int32(OUT_KIND[self.out_dtype]), np.int32(self._nchunks),
            np.int32(self._per), *v.format_args(self._plain), *xmap), pdl=v.pdl)

    def takes(self, db: DevOperand) -> bool:
        """Whether the plan's kernel multiplies the packed weight ``db`` (of the same form as its own): the
        fold-only wgmma build only a weight whose every scale code folds, and a launch decoding without the special
        codes' fix only a weight that holds none (a kept layout swapping weights asks)."""
        return (not self.variant_.fold_only or rules.wg_fold_only(db, self.da.elem)) and \
            not (self._plain and db.specials)

    def gemm(self) -> None:
        with self.cp.cuda.Device(self.dev.ordinal):
            self._gemm()

    def _gemm(self) -> None:
        if self._launch is None:
            if self.out.size and self.da.k == 0:  # the empty sum
                with self.stream:
                    self.out.fill(0)
            return
        self.launch(self.stream.ptr)

    def launch(self, stream: int, b: int | None = None, a: int | None = None, out: int | None = None) -> None:
        """The product's launches on raw stream handle ``stream``, with the weight's records, A and the output at
        other addresses where given (a kept layout's replay): the permuted copy of A first (a WW_TMA build), then
        the kernel."""
        if b is not None and a is not None and out is not None:  # a kept layout's call
            if self._xperm is None:
                self._launch.at3(self.cp.cuda.driver, stream, b, a, out)
                return
            slots = ((0, b), (1, a), (2, out))
        else:
            slots = tuple((i, ptr) for i, ptr in enumerate((b, a, out)) if ptr is not None)
        if self._xperm is not None:
            self._xperm(self.cp.cuda.driver, stream, ((0, a),) if a is not None else ())
        self._launch(self.cp.cuda.driver, stream, slots)

    def prep(self) -> None:
        with self.cp.cuda.Device(self.dev.ordinal), self.stream:
            da, db = self._prep()
            if (da.buf.data.ptr, db.buf.data.ptr) != (self.da.buf.data.ptr, self.db.buf.data.ptr):  # new buffers
                self.da, self.db = da, db
                self._alloc()

    def result(self):
        out = self.out if self._fold is None else self.out.reshape(self._fold)
        return self._like(out)

    def clone(self) -> "WonlyPlan":
        import copy

        other = copy.copy(self)
        with self.cp.cuda.Device(self.dev.ordinal), self.stream:
            other.da, other.db, other.out = self.da.copy(), self.db.copy(), self.out.copy()
            records_written(self.backend.kernels, self.cp, self.dev.ordinal)  # the copied records
            other._alloc()
        return other

    def close(self) -> None:
        self.da = self.db = self.out = self._ws = self._counters = self._launch = self._xperm = self._xp = None
        self._prep = self._like = None


def registers_prep(backend, stager, a, b, mdt, scale_rounding: str, cache: bool = True):
    """The registers path's staging callable: (A as the kernel reads it, B's packed records, cached on the MXTensor)."""
    prep_b = quantized_b(backend, stager, b, mdt, scale_rounding, "wonly", cache)
    return lambda: (_activations(stager, a, mdt.a), prep_b())


def quantized_b(backend, stager, b, mdt, scale_rounding: str, path: str, cache: bool = True):
    """The staging callable of the MX weight B: an MXTensor as it is (the staged form cached on it), device float
    data quantized on its GPU along K, host data by mxcore.operands.  ``path``: stage.py's path ("wonly": the
    packed records; "decode": bf16 with the scales folded in)."""
    from mxcore.arrays import array_kind, to_numpy
    from mxcore.operands import prepare_one, quantize_on_device

    kind = array_kind(b)
    on_gpu = kind == "cupy" or (kind == "torch" and b.device.type == "cuda")
    host = b if kind in ("mx", "numpy") else (
        quantize_on_device(b, mdt.b, "b", scale_rounding, b_order=backend.b_code_order) if on_gpu else to_numpy(b))
    opb = prepare_one(host, mdt.b, "b", scale_rounding)
    src = host if (cache and array_kind(host) == "mx") else None
    up: dict = {}

    def uploaded():
        if "b" not in up:
            up["b"] = stager.upload(opb)
        return up["b"]

    return lambda: stager.stage_quantized(opb, "b", path, src, uploaded)


def staged_prep(backend, stager, a, b, mdt, scale_rounding: str, cache: bool = True):
    """The staged path's staging callable: A as the bf16 GEMM reads it, B decoded to bf16 (cached on the MXTensor)."""
    prep_b = quantized_b(backend, stager, b, mdt, scale_rounding, "decode", cache)
    return lambda: (stager.stage_float(a, "a", mdt.a), prep_b())
