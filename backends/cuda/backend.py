"""``CudaBackend``: mxcore's NVIDIA backend behind the contract of ``backends/_contract.py``.

How each dtype runs (all accumulate in fp32 on tensor cores; staging details in stage.py):

=============  ===============================================================================================
fp16, bf16     inputs rounded once (RNE) to the dtype; ``m16n8k16``.  Operands already in the dtype with one
               unit stride and 16-byte alignment are read in place (ldmatrix for K-contiguous, ldmatrix.trans
               for M/N-contiguous); anything else is copied once by ``mx_prep_float``.
tf32           inputs rounded to tf32 with RNE, then ``m16n8k8``; the hardware reads the pre-rounded bits.
fp32           3xTF32: x = big + small, big = rne_tf32(x), small = rne_tf32(x - big); big·big + big'·small +
               small·big' in one fp32 accumulator over K' = 3K, where small and big' (big in the cross terms) are
               0 where big is inf or NaN, so that inf and NaN propagate as in IEEE x·y.  Dropped: small·small and
               the residual's rounding: ≤ 2^-20 relative per product; |err| ≤ (K+2)·2^-23·Σ|ab| + 2^-20·Σ|ab|.
fp8            e4m3fn/e5m2 and mixed pairs, per-tensor power-of-two scales applied in the epilogue.  sm_89 /
               sm_120: native ``m16n8k32`` on K-major fp8 bytes.  sm_90: the same bytes through cp.async and
               ldmatrix, each mma step's fragments converted once to f16 in registers and multiplied by two f16
               ``m16n8k16``.  ``fp8_path="decode"`` decodes whole operands to f16 and runs the f16 kernel.
MX             mxfp8/mxfp6/mxfp4 and mixed pairs: each element decoded with its block scale folded in,
               value·2^(scale - smax), to bf16 (exact while a tensor's block scales span ≤ ~117-133 binades;
               blocks further below the largest are rounded once), bf16 mma, epilogue times 2^(smax - 127).
weight-only   fp16/bf16 activations x an MX weight (``("bf16", "mxfp4")``): wonly/ — the packed weight decoded
               in registers by ``gemm_wonly_gemv.cu`` (small M), ``gemm_wonly.cu`` (larger M; fp16 at any M),
               on sm_90a ``gemm_wonly_wg.cu`` (wgmma, M up to 64), with PDL launches on sm_90, or decoded once to
               bf16 and run through the bf16 GEMM (``wonly_path="staged"``); ``wonly.choose`` picks, from the
               tuning table ``tuning/wonly.json``.
=============  ===============================================================================================

Accuracy (tested): |out - ref| ≤ (K + 2)·2^-23·(|A|@|B|) (+ the output rounding); on exactly representable
inputs the result equals ``mxcore.reference`` bit for bit.

Inputs and results: CuPy arrays and torch CUDA tensors are used on their own device (``cupy.cuda.Device(i)``) and
stream (torch's current stream for torch tensors, CuPy's otherwise); the result is the same kind of array (CuPy
has no bfloat16: a bf16 result for CuPy inputs is a ``uint16`` array of bf16 bits; torch results are allocated by
torch).  numpy inputs are rounded or quantized on the host, uploaded, and the result comes back as numpy.  Device
fp8/MX operands are quantized on their GPU (``device_quantization``: the API does it; ``plan`` does it for device
float data it is handed) and their scales never come to the host: a device ScaledTensor's ``scale_exp`` and a
device MXTensor's ``scale_max`` are read by the kernels (stage.py, plan.py ``scale_args``), so a call on device
inputs does not synchronise.  3-D operands ``(B, M, K) @ (B, K, N)`` or ``(B, M, K) @ (K, N)`` run as one launch
for the float dtypes (``batched``; a shared weight with a contiguous A folds the batch into M); fp8/MX batches run
one 2-D plan per element (each with its own per-tensor scales; a batched MXTensor is sliced per element).

Per-call cost: fp16/bf16 device operands that the kernel reads in place take a fast path (:meth:`matmul`): the
plan of a layout (device, dtypes, shapes, strides, alignment, output dtype) is built once and later calls allocate
the output and relaunch it through ``cuLaunchKernel`` with the new addresses (plan.py ``Relaunch``).

Options (``plan`` / ``matmul`` keywords): ``tile`` (one of :meth:`tiles`), ``family`` ("mma_sync"; the rule is
``families.family_for``), ``fp8_path`` ("native" | "convert" | "decode"), ``split_k`` (force that many K
slices), ``mx_path`` ("exact" | "decode": mxfp8 on wgmma with block scales in the kernel, or decoded to bf16;
``families.mx_path``), ``wonly_path`` ("registers" | "staged": how an fp16/bf16 x MX-weight pair runs; wonly/),
``config`` (the weight-only kernel build: a ``wonly.WonlyVariant``, its name, or a kernel form such as "wg";
``wonly.choose``).
"""

from __future__ import annotations

import functools

from mxcore.arrays import array_kind
from mxcore.dtypes import MX_ELEMENT, WONLY_KIND
from mxcore.errors import BackendUnavailableError, ShapeError, UnsupportedError
from mxcore.operands import made_per_call, mark_per_call

from .._contract import Backend, Target
from .callcache import CallCache
from .compile import KernelCache
from .device import as_cupy, device_info, element_strides, refuse_capture, resolve_ordinal, stream_for
from .families import family_for
from .families import mx_path as _mx_path
from .fastpath import _TORCH_OUT, fast_call, fast_pair, fast_quantized, fast_weight
from .operand import STORE
from .plan import BatchLoopPlan, CudaPlan
from .stage import Stager
from .variants import TILES, ceiling_element, native_fp8
from .wonly import WonlyProblem, mx_weight_folds
from .wonly import wonly_path as _wonly_path
from .wonly.plan import WonlyPlan, registers_prep, staged_prep

__all__ = ["CudaBackend"]

_FP8_PATHS = ("native", "convert", "decode")


class CudaBackend(Backend):
    """mxcore's NVIDIA backend (see the module docstring)."""

    name = "cuda"
    vendor = "nvidia"
    options = ("tile", "family", "fp8_path", "split_k", "fp8_accumulate", "mx_path", "wonly_path", "config")
    batched = True  # (B, M, K) @ (B, K, N) / @ (K, N): one launch for the float dtypes (see the module docstring)
    device_quantization = True  # fp8/MX device operands are quantized on their GPU; scales never read on the host
    # fp8 B codes K-major: the fp8 kernels read them in place (no staging transpose; fp8 8192^3 end to end 0.84 ->
    # 0.90 of the kernel in one H200 run).  quantize_tensor's fallback copy (B shapes without 64 x 64 tiles) is a
    # recorded codec step, so the per-call replay (fast_matmul) refreshes it too
    b_code_order = "F"

    def __init__(self):
        self.unavailable_cause = None
        self.kernels = KernelCache()
        self._reason = None
        self._fast = CallCache()  # per-call paths: layout key -> kept entry (callcache.py; its lock serialises calls)
        self._targets: dict = {}  # device ordinal -> Target

    # ---- availability ---------------------------------------------------------------------------------------
    def is_available(self) -> str | None:
        if self._reason is None:
            try:
                import cupy

                if cupy.cuda.runtime.getDeviceCount() < 1:
                    raise RuntimeError("no CUDA device")
                self._reason = ""
            except Exception as exc:  # noqa: BLE001 (ImportError, CUDARuntimeError, ...: never raise here)
                self.unavailable_cause = exc
                self._reason = f"CuPy with an NVIDIA GPU is needed ({type(exc).__name__}: {exc})"
        return self._reason or None

    @property
    def cp_module(self):
        cp = self.__dict__.get("_cp")
        if cp is None:
            cp = self.__dict__["_cp"] = self._cupy()
        return cp

    def _cupy(self):
        reason = self.is_available()
        if reason:
            raise BackendUnavailableError(f"cuda backend: {reason}") from self.unavailable_cause
        import cupy

        return cupy

    def _device(self, ordinal: int | None = None):
        cp = self._cupy()
        return device_info(cp, int(cp.cuda.runtime.getDevice()) if ordinal is None else ordinal)

    def devices(self) -> list[str]:
        if self.is_available():
            return []
        cp = self._cupy()
        return [f"{d.name} ({d.arch})" for d in (device_info(cp, i) for i in range(cp.cuda.runtime.getDeviceCount()))]

    def target(self) -> Target:
        if self.is_available():
            return Target("nvidia", None, 32)
        cp = self.cp_module
        ordinal = int(cp.cuda.runtime.getDevice())
        t = self._targets.get(ordinal)
        if t is None:
            t = self._targets[ordinal] = Target("nvidia", device_info(cp, ordinal).arch, 32)
        return t

    # ---- dtypes ---------------------------------------------------------------------------------------------
    def supported_dtypes(self, arch: str | None = None) -> list[str]:
        if arch is None:
            arch = self.target().arch
            if arch is None:
                return []
        from .variants import supported_dtypes

        return supported_dtypes(arch)

    def supports(self, mdt) -> str | None:
        reason = self.is_available()
        if reason:
            return reason
        dev = self._device()
        ok = self.supported_dtypes(dev.arch)
        if not ok:
            return (f"{dev.name} ({dev.arch}) is below sm_80; mxcore's NVIDIA kernels need mma.sync/ldmatrix/cp.async "
                    "(Ampere or newer). Use backend='reference'")
        for od in (mdt.a, mdt.b):
            if od.name not in ok:
                if od.kind == "fp8" and not od.name.endswith("fnuz"):
                    return f"{dev.name} ({dev.arch}) has no fp8 tensor cores (they start at sm_89); it can run {', '.join(ok)}"
                return f"{od.name} is not supported on {dev.name} ({dev.arch}); it can run {', '.join(ok)}"
        return None

    def tiles(self, dtype: str) -> tuple:
        return tuple(TILES)

    # ---- running --------------------------------------------------------------------------------------------
    def plan(self, a, b, mdt, *, out_dtype: str = "float32", scale_rounding: str = "floor", out=None,
             tile: str | None = None, family: str | None = None, fp8_path: str | None = None,
             split_k: int = 0, fp8_accumulate: str = "promote", mx_path: str | None = None,
             wonly_path: str | None = None, config=None, _restage: bool | str = False) -> CudaPlan:
        """Stage both operands on the operands' device and return a :class:`CudaPlan`.  ``out``: optional CuPy
        C-contiguous array of the output's shape and storage dtype (float32, float16, or uint16 for bfloat16).
        ``_restage`` (the fast paths'): True — ``prep()`` stages both quantized operands again (nothing cached on
        them); "a" — A again, B's staging cached on B (a weight quantized once)."""
        from mxcore import dtypes as _dt

        cp = self._cupy()
        out_dtype = _dt.canonical_out_dtype(out_dtype)
        ordinal = resolve_ordinal(cp, a, b)
        dev = device_info(cp, ordinal)
        sa, sb = tuple(int(s) for s in a.shape), tuple(int(s) for s in b.shape)
        if len(sa) not in (2, 3) or len(sb) not in (2, 3) or sa[-1] != sb[-2] or (
                len(sa) == 3 and len(sb) == 3 and sa[0] != sb[0]):
            raise ShapeError(f"cuda backend multiplies (M, K) @ (K, N), (B, M, K) @ (B, K, N) or (B, M, K) @ (K, N); "
                             f"got {sa} and {sb}")
        batch = sa[0] if len(sa) == 3 else (sb[0] if len(sb) == 3 else None)
        m, k, n = sa[-2], sa[-1], sb[-1]
        mma_sync_only = tile in TILES or split_k or fp8_path is not None  # options of the mma.sync kernel
        folds = batch is not None and len(sb) == 2 and mdt.kind in ("float", WONLY_KIND) and _foldable(a)
        shape = (1, batch * m, n, k) if folds else (batch or 1, m, n, k)  # the rule sees the folded problem
        wpath = None
        if config is not None and mdt.kind != WONLY_KIND:
            raise UnsupportedError(f"config= picks a weight-only kernel build (fp16/bf16 x an MX weight); this is a "
                                   f"{mdt.kind} product {mdt.name}: choose its kernel with tile= or family=")
        if mdt.kind == WONLY_KIND:  # fp16/bf16 x MX weight: wonly/ (registers kernel, or the staged bf16 GEMM)
            act, element = ("f16" if mdt.a.name == "fp16" else "bf16"), MX_ELEMENT[mdt.b.name]
            wpath = _wonly_path(WonlyProblem(shape[1], n, k, act, element, dev.arch, dev.sms),
                                wonly_path or ("staged" if (tile in TILES or fp8_path or family) else None), config,
                                functools.partial(mx_weight_folds, b, act, element))
            if wpath == "registers" and (tile or family or fp8_path):
                raise UnsupportedError("tile=, family= and fp8_path= choose kernels of the staged path; the registers "
                                       "path (wonly_path='registers') takes split_k only")
        fam = family_for(dev.arch, mdt, shape, family or ("mma_sync" if mma_sync_only else None))
        path = fp8_path or ("native" if native_fp8(dev.arch) else "convert")
        if path not in _FP8_PATHS:
            raise UnsupportedError(f"fp8_path must be one of {', '.join(_FP8_PATHS)}, not {path!r}")
        per_call = made_per_call(a) + made_per_call(b)  # operands quantized (and staged) for this call alone
        path = _mx_path(fam, mdt, mx_path, shape, per_call) or path  # MX on wgmma: block scales in the kernel
        with cp.cuda.Device(ordinal):
            stream = stream_for(cp, a, b)
            refuse_capture(cp, stream.ptr, "building a plan (staging, kernel choice, allocations)")
            with stream:
                stager = Stager(cp, ordinal, self.kernels, dev.sms)
                fold = None
                if folds:
                    fold, a, m = (batch, m, n), _fold(a), batch * m  # shared weight: the batch stacks along M
                    batch = None
                if batch is not None and mdt.kind != "float":
                    return self._batch_loop(a, b, mdt, batch, (m, n), out_dtype, scale_rounding, out, tile=tile,
                                            family=family, fp8_path=fp8_path, split_k=split_k,
                                            fp8_accumulate=fp8_accumulate, mx_path=mx_path, wonly_path=wonly_path,
                                            config=config)
                if wpath is not None:
                    prep = (registers_prep if wpath == "registers" else staged_prep)(
                        self, stager, a, b, mdt, scale_rounding, cache=_restage is not True)
                elif mdt.kind == "float":
                    def prep():
                        return stager.stage_float(a, "a", mdt.a), stager.stage_float(b, "b", mdt.b)
                else:
                    prep = self._quantized_prep(stager, a, b, mdt, scale_rounding, path,
                                                cache=(not _restage, _restage is not True))
                da, db = prep()
                shape = fold or ((m, n) if batch is None else (batch, m, n))
                store = getattr(cp, STORE[out_dtype])
                like = _result_like(cp, out_dtype, a, b)
                if out is None:
                    out, like = _new_output(cp, shape, store, out_dtype, a, b, like)
                elif tuple(out.shape) != shape or out.dtype != store or not out.flags.c_contiguous:
                    raise UnsupportedError(f"out must be a C-contiguous {shape} array of {STORE[out_dtype]}")
                if fold:
                    out = out.reshape(m, n)
        if wpath == "registers":
            return WonlyPlan(self, cp, dev, stream, da, db, out, m, n, out_dtype, prep, like, fold, split_k, config)
        if fam == "wgmma":  # the sm_90a family (sm90.py): same staging and output, its own launch
            from .sm90 import Sm90Plan

            return Sm90Plan(self, cp, dev, stream, da, db, out, m, n, batch, out_dtype, prep, like, tile=tile,
                            fold=fold, fp8_accumulate=fp8_accumulate)
        return CudaPlan(self, cp, dev, stream, da, db, out, m, n, batch, out_dtype, prep, like, tile=tile,
                        fp8_convert=path == "convert", split=split_k, fold=fold)

    def _batch_loop(self, a, b, mdt, batch, mn, out_dtype, scale_rounding, out, **options) -> BatchLoopPlan:
        """fp8/MX batches: one plan per batch element (own per-tensor scales) into slices of one output."""
        cp = self._cupy()
        shape = (batch, *mn)
        store = getattr(cp, STORE[out_dtype])
        if out is None:
            out = cp.empty(shape, dtype=store)
        elif tuple(out.shape) != shape or out.dtype != store or not out.flags.c_contiguous:
            raise UnsupportedError(f"out must be a C-contiguous {shape} array of {STORE[out_dtype]}")
        parts = [self.plan(_item(a, i) if a.ndim == 3 else a, _item(b, i) if b.ndim == 3 else b, mdt, out_dtype=out_dtype,
                           scale_rounding=scale_rounding, out=out[i], **options) for i in range(batch)]
        return BatchLoopPlan(parts, out, _result_like(cp, out_dtype, a, b))

    def _quantized_prep(self, stager, a, b, mdt, scale_rounding, path, cache: tuple = (True, True)):
        """fp8/MX operands: quantized objects as they are (codes/scales on any device), device float data quantized
        on its GPU (mxcore.quantize_mx / quantize_tensor), host data by mxcore.operands.prepare; device scales stay
        on the device.  Returns the staging callable (``cache``: per operand, whether its staged buffers are cached
        on its quantized object; off, every call stages it again from the object's current contents)."""
        from mxcore.arrays import to_numpy
        from mxcore.operands import prepare, quantize_on_device

        kinds = [array_kind(x) for x in (a, b)]
        host = [x if kd in ("mx", "numpy")
                else quantize_on_device(x, od, role, scale_rounding, batched=len(x.shape) == 3,
                                        b_order=self.b_code_order) if _on_gpu(x)
                else to_numpy(x) for x, kd, od, role in zip((a, b), kinds, (mdt.a, mdt.b), ("a", "b"))]
        opa, opb = prepare(host[0], host[1], mdt, scale_rounding=scale_rounding)
        src = [x if kd == "mx" and keep else None for x, kd, keep in zip((a, b), kinds, cache)]
        up: dict = {}  # uploads once per plan: prep() re-runs the device work only

        def uploaded(op, role):
            if role not in up:
                up[role] = stager.upload(op)
            return up[role]

        def prep():
            return (stager.stage_quantized(opa, "a", path, src[0], lambda: uploaded(opa, "a"), partner=mdt.b),
                    stager.stage_quantized(opb, "b", path, src[1], lambda: uploaded(opb, "b"), partner=mdt.a))

        return prep

    def matmul(self, a, b, mdt, *, out_dtype: str = "float32", scale_rounding: str = "floor", out=None, **options):
        """``a @ b`` on the operands' GPU (see :meth:`plan` for ``out`` and the options)."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise UnsupportedError(f"the cuda backend takes no option(s) {', '.join(unknown)}; its options are: "
                                   f"{', '.join(self.options)}")
        with self._fast.lock:  # kept buffers, staged forms and compiled kernels are shared by threads
            if out is None and not options and mdt.kind == "float":
                fast = fast_call(self, a, b, mdt, out_dtype)
                if fast is not None:
                    return fast
            p = self.plan(a, b, mdt, out_dtype=out_dtype, scale_rounding=scale_rounding, out=out, **options)
            p.gemm()
            return p.result()

    def fast_matmul(self, a, b, mdt, *, out_dtype: str = "float32", scale_rounding: str = "floor"):
        """The contract's per-call fast path for 2-D device operands (None: not taken, call matmul):
        fp16/bf16 read in place (``fastpath.fast_call``); fp8/MX products of contiguous float16/bfloat16/float32
        device arrays, whose quantization, staging and GEMM are set up once per layout and replayed
        (``fast_quantized``); such activations times a device weight quantized once (``fast_weight``); and two
        operands quantized once (``fast_pair``)."""
        with self._fast.lock:  # one call at a time writes a kept entry's buffers (host work only: launches are async)
            if mdt.kind == "float":
                return fast_call(self, a, b, mdt, out_dtype)
            if array_kind(b) == "mx":  # a weight quantized once (times activations, or times an operand quantized once)
                if array_kind(a) == "mx":
                    return fast_pair(self, a, b, mdt, out_dtype, scale_rounding)
                return fast_weight(self, a, b, mdt, out_dtype, scale_rounding)
            return fast_quantized(self, a, b, mdt, out_dtype, scale_rounding)

    # ---- the per-call cache ---------------------------------------------------------------------------------
    def cache_info(self) -> dict:
        """The per-call cache's entries, device bytes, limit and counters, and the device bytes live CUDA graphs
        keep (see callcache.py)."""
        from .device import graph_kept_bytes

        with self._fast.lock:
            info = self._fast.info()
        info["graph_bytes"] = graph_kept_bytes() if self.is_available() is None else 0
        return info

    def clear_cache(self, obj=None) -> None:
        """Drop every kept entry (obj=None), or what was staged from quantized object ``obj`` (an MXTensor or
        ScaledTensor changed in place: CuPy arrays carry no version counter)."""
        from .stage import _STAGED

        with self._fast.lock:
            if obj is None:
                self._fast.clear()
            else:
                _STAGED.pop(obj, None)
                self._fast.clear()  # bound plans may hold what was staged from it

    def set_cache_limit(self, nbytes: int) -> None:
        with self._fast.lock:
            self._fast.set_limit(nbytes)

    # ---- benchmark hooks ------------------------------------------------------------------------------------
    def timer(self):
        from .bench import timer

        return timer(self._cupy())

    def ceiling_key(self, dtype: str) -> str:
        return ceiling_element(dtype, self._device().arch)

    def bench_operands(self, a, b, dtype: str):
        """Host float32 operands -> device arrays the kernel reads in place: fp16 CuPy arrays for fp16, torch bf16
        tensors for bf16 (CuPy has no bf16; without torch, float32 CuPy arrays are prepped), float32 CuPy arrays
        otherwise.  Memory order (C or Fortran) is kept."""
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

    def instruction_ceiling(self, dtype: str):
        from .bench import instruction_ceiling

        cp = self._cupy()
        return instruction_ceiling(self, cp, self._device(), dtype)

    def vendor_baseline(self, dtype: str, m: int, n: int, k: int):
        from .bench import vendor_baseline

        return vendor_baseline(dtype, m, n, k)

    # ---- offline --------------------------------------------------------------------------------------------
    def emit_kernels(self, arch: str, out_dir, *, workers: int | None = None):
        """The kernels the default choice uses on ``arch`` (``default_builds.emit_jobs``), compiled into ``out_dir``."""
        from .default_builds import emit_jobs
        from .emit import emit_kernels

        return emit_kernels(arch, out_dir, emit_jobs(arch), workers=workers)


def _new_output(cp, shape, store, out_dtype: str, a, b, like):
    """(CuPy output array, result converter): for torch CUDA operands the output is a torch tensor allocated by
    torch (its caching allocator, current stream) and the kernel writes it through a CuPy view, so result() hands
    the tensor back without a DLPack round trip; otherwise a CuPy array and ``like``."""
    t = None
    for x in (a, b):
        x = x.codes if array_kind(x) == "mx" else x
        if array_kind(x) == "torch" and x.device.type == "cuda":
            t = x
            break
    if t is None:
        return cp.empty(shape, dtype=store), like
    import torch

    tout = torch.empty(shape, dtype=_TORCH_OUT[out_dtype], device=t.device)
    view = as_cupy(cp, tout) if tout.numel() else cp.empty(shape, dtype=store)
    ptr = view.data.ptr

    def result(out):
        return tout if out.data.ptr == ptr and out.size == view.size else like(out)

    return view, result


def _on_gpu(x) -> bool:
    kind = array_kind(x)
    return kind == "cupy" or (kind == "torch" and x.device.type == "cuda")


def _item(x, i: int):
    """Batch element ``i`` of a 3-D operand (an MXTensor/ScaledTensor is sliced along its codes and scales; the
    batch's scale maximum / scale stays shared, which keeps the product exact)."""
    if array_kind(x) != "mx":
        return x[i]
    from mxcore.mx import MXTensor, ScaledTensor

    if isinstance(x, MXTensor):
        if x.axis == 0:
            raise ShapeError("a batched MXTensor must have its blocks along M/K/N (axis 1 or 2), not the batch axis")
        return mark_per_call(MXTensor(x.codes[i], x.scales[i], x.fmt, x.axis - 1, x.block, tuple(x.shape[1:]),
                                      x.scale_max), x)
    if isinstance(x, ScaledTensor):
        return mark_per_call(ScaledTensor(x.codes[i], x.scale, x.fmt, x.scale_exp), x)
    return x[i]


def _foldable(a) -> bool:
    """A (B, M, K) operand whose rows stack into one (B*M, K) view."""
    kind = array_kind(a)
    if kind not in ("cupy", "torch", "numpy"):
        return False
    s = element_strides(a) if kind != "numpy" else tuple(x // a.itemsize for x in a.strides)
    return s[0] == a.shape[1] * s[1]


def _fold(a):
    return a.reshape(a.shape[0] * a.shape[1], a.shape[2])


def _result_like(cp, out_dtype: str, a, b):
    """A function turning the CuPy output into the caller's kind of array: CuPy for CuPy inputs, torch for torch
    inputs (CUDA: same device, through DLPack; CPU: a host copy), numpy otherwise."""
    bf16 = out_dtype == "bfloat16"
    for x in (a, b):
        kind = array_kind(x)
        if kind == "mx":
            x, kind = x.codes, array_kind(x.codes)
        if kind == "cupy":
            return lambda out: out
        if kind == "torch":
            import torch

            device = x.device

            def to_torch(out):
                bits = out.view(cp.int16) if bf16 else out
                if device.type == "cuda":
                    with torch.cuda.device(device):
                        t = torch.from_dlpack(bits)
                else:
                    t = torch.from_numpy(cp.asnumpy(bits))
                return t.view(torch.bfloat16) if bf16 else t

            return to_torch

    def to_host(out):
        host = cp.asnumpy(out)
        if bf16:
            import ml_dtypes

            return host.view(ml_dtypes.bfloat16)
        return host

    return to_host
