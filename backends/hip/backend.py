"""``HipBackend``: mxcore's contract (:class:`backends._contract.Backend`) on AMD Instinct GPUs through hip-python.

Availability (never raises): hip-python missing, no ROCm runtime, no AMD GPU, or an arch other than
gfx942/gfx950 are *absences* (the backend is skipped); hip-python importing and a device being counted but the
runtime failing to come up (a hip-python release that does not match the ROCm version, a broken install) is a
*failure*: the reason starts with :data:`backends._contract.FAILURE`, ``python -m mxcore info`` shows it and
the ``amd_gpu`` tests fail with it instead of skipping.
"""

from __future__ import annotations

from .._contract import FAILURE, Backend, Target
from ... import dtypes as _dt
from ...errors import BackendUnavailableError, UnsupportedError
from .fragments import WAVE
from .plan import HipPlan, device_operands
from .runtime import MATCH_HINT, Runtime, hip_python_version, rocm_version_text, version_mismatch
from .variants import ARCHS, ceiling_defines, kernel_specs, select_spec, supported_dtype_names, tile_names

__all__ = ["HipBackend"]


def supports_on(mdt, arch: str) -> str | None:
    """None if ``arch`` has a kernel for the resolved dtype ``mdt``, else why not (and what to do)."""
    if arch not in ARCHS:
        return f"{arch} is not a CDNA3/CDNA4 arch ({', '.join(ARCHS)})"
    if any(mdt.name in s.dtypes for s in kernel_specs(arch)):
        return None
    if mdt.kind == "wonly":
        return ("weight-only pairs (fp16/bf16 activations x an MX weight) have no MFMA kernel yet; run them on the "
                "cuda or reference backend, or quantize the activations too (dtype=('mxfp8', 'mxfp4') on gfx950)")
    fnuz = any(x.name.endswith("fnuz") for x in (mdt.a, mdt.b))
    if mdt.kind == "fp8" and fnuz:
        return f"{arch} reads OCP fp8 (e4m3fn/e5m2), not FNUZ; use dtype='fp8' or fp8_convert=True"
    if mdt.kind == "fp8":
        return f"{arch} reads FNUZ fp8 (e4m3fnuz/e5m2fnuz), not OCP; use dtype='fp8' or fp8_convert=True"
    if mdt.kind == "mx":
        return f"block-scaled MX formats need the f8f6f4 MFMAs, which {arch} lacks (gfx950 has them)"
    return f"no {arch} kernel for {mdt}"


class HipBackend(Backend):
    """mxcore.matmul on AMD Instinct GPUs (gfx942, gfx950) through hip-python; see the package docstring."""

    name = "hip"
    vendor = "amd"
    options = ("fp8_convert", "poison")
    batched = True

    def __init__(self):
        self.unavailable_cause = None
        self._rt = None
        self._reason = None
        self._probed = False

    # -- availability (never raises)
    def is_available(self) -> str | None:
        if not self._probed:
            self._probed = True
            self._reason = self._probe()
        return self._reason

    def _probe(self) -> str | None:
        try:
            from hip import hip, hiprtc
        except ImportError as exc:
            self.unavailable_cause = exc
            return f"hip-python is not installed (pip install \"mxcore[hip]\"; {MATCH_HINT})"
        except Exception as exc:  # noqa: BLE001  (installed but broken: say so, never raise)
            self.unavailable_cause = exc
            return f"{FAILURE}hip-python failed to import: {type(exc).__name__}: {exc}; {MATCH_HINT}"
        try:
            count = hip.hipGetDeviceCount()
        except RuntimeError as exc:  # hip-python without a ROCm runtime raises a plain RuntimeError
            self.unavailable_cause = exc
            return f"no ROCm runtime: {exc}"
        except Exception as exc:  # noqa: BLE001
            self.unavailable_cause = exc
            return f"{FAILURE}hip-python cannot count devices: {type(exc).__name__}: {exc}; {MATCH_HINT}"
        err, n = count if isinstance(count, tuple) else (count, 0)
        if err != hip.hipError_t.hipSuccess or int(n) < 1:
            return f"no AMD GPU visible to the ROCm runtime ({getattr(err, 'name', err)})"
        try:
            rt = Runtime(hip, hiprtc)
            dev = rt.device(rt.current_device())
        except Exception as exc:  # noqa: BLE001  (a device is there: anything else is a failure)
            self.unavailable_cause = exc
            return (f"{FAILURE}{int(n)} AMD GPU(s) found but the HIP runtime failed to initialise through "
                    f"hip-python {hip_python_version()} (ROCm runtime {_runtime_version(hip)}): "
                    f"{type(exc).__name__}: {exc}; {MATCH_HINT}")
        self._rt = rt
        if dev.arch not in ARCHS:
            return f"device {dev.name} is {dev.arch}; mxcore's MFMA kernels target {', '.join(ARCHS)} (CDNA3/CDNA4)"
        return None

    def runtime(self) -> Runtime:
        """The device runtime (backends/hip/runtime.py), for probes and tools.  Raises BackendUnavailableError
        (with the reason) without hip-python, ROCm or a supported AMD GPU."""
        reason = self.is_available()
        if reason is not None:
            raise BackendUnavailableError(f"hip backend not usable: {reason}") from self.unavailable_cause
        return self._rt

    def devices(self) -> list[str]:
        if self.is_available() is not None:
            return []
        rt = self._rt
        out = []
        for i in range(rt.device_count()):
            d = rt.device(i)
            out.append(f"{d.name} ({d.arch_full})")
        out[0] += f"; ROCm {rocm_version_text(rt.runtime_version)}, {rt.convention.label}"
        note = version_mismatch(hip_python_version(), rt.runtime_version)
        if note:
            out[0] += f"; WARNING: {note}"
        return out

    def target(self) -> Target:
        rt = self.runtime()
        return Target("amd", rt.device().arch, WAVE)

    # -- capabilities
    def supported_dtypes(self, arch: str | None = None) -> list[str]:
        arch = arch or self.target().arch
        return supported_dtype_names(arch) if arch in ARCHS else []

    def supports(self, mdt) -> str | None:
        return supports_on(mdt, self.target().arch)

    def tiles(self, dtype: str) -> tuple:
        arch = self.target().arch
        return tile_names(arch, _dt.resolve(dtype, arch).name)

    # -- running
    def plan(self, a, b, mdt, *, out_dtype: str = "float32", scale_rounding: str = "floor", out=None,
             tile: str | None = None, fp8_convert: bool = False, **options) -> HipPlan:
        """A reusable launch for ``a @ b`` (2-D, or batched: (B,M,K) @ (B,K,N) / (K,N)): the operands are
        staged at once; ``gemm()`` launches (asynchronously, on the inputs' stream), ``result()`` returns the
        output.  ``tile``: one of :meth:`tiles` (default: by problem shape)."""
        if out is not None:
            raise UnsupportedError("the hip backend allocates its output; out= is not supported")
        if options:
            raise UnsupportedError(f"hip backend takes no option(s) {', '.join(sorted(options))}; its options are: "
                                   f"{', '.join(self.options)}")
        rt = self.runtime()
        views = device_operands(a, b, mdt) or []  # device arrays: their GPU's arch picks the variant
        arch = rt.device(views[0].device if views else None).arch
        spec = select_spec(arch, mdt, int(a.shape[-2]), int(b.shape[-1]), tile=tile)
        return HipPlan(rt, spec, a, b, mdt, out_dtype=_dt.canonical_out_dtype(out_dtype),
                       scale_rounding=scale_rounding, fp8_convert=fp8_convert, views=views)

    def matmul(self, a, b, mdt, *, out_dtype: str = "float32", scale_rounding: str = "floor", out=None,
               fp8_convert: bool = False, poison: bool = False):
        """``a @ b`` on the AMD GPU.  ``fp8_convert``: accept fp8 bytes of the other encoding (OCP vs FNUZ)
        and re-encode them (see :func:`convert_fp8`).  ``poison``: fill the output with NaN before the launch
        (tests check that every element is written)."""
        with self.plan(a, b, mdt, out_dtype=out_dtype, scale_rounding=scale_rounding, out=out,
                       fp8_convert=fp8_convert) as p:
            if poison:
                p.poison()
            p.gemm()
            return p.result()

    # -- benchmarking
    def timer(self):
        """``measure(fn) -> seconds``: ``fn()`` between two hipEvents on the null stream."""
        rt = self.runtime()
        return lambda fn: rt.elapsed(fn)

    def ceiling_key(self, dtype: str) -> str:
        arch = self.target().arch
        return select_spec(arch, _dt.resolve(dtype, arch), 1 << 20, 1 << 20).instruction

    def instruction_ceiling(self, dtype: str, *, iters: int = 4096, chains: int = 4):
        """(mnemonic, TFLOP/s) of a register-only loop of the MFMA that ``dtype`` uses on this device."""
        import ctypes

        from ...kernels import kernel_source
        from .runtime import device_address

        rt = self.runtime()
        dev = rt.device()
        spec = select_spec(dev.arch, _dt.resolve(dtype, dev.arch), 1 << 20, 1 << 20)
        func = rt.function(kernel_source("amd", "gemm_ceiling.hip"), "mx_mfma_ceiling", ceiling_defines(spec, chains))
        blocks = max(1, dev.cus) * 8
        out = rt.alloc(blocks * 256 * 4)
        try:
            args = (ctypes.c_void_p(device_address(out)), ctypes.c_int(iters), ctypes.c_uint(1))
            rt.launch(func, (blocks, 1, 1), (256, 1, 1), args)
            rt.synchronize()
            times = sorted(rt.elapsed(lambda: rt.launch(func, (blocks, 1, 1), (256, 1, 1), args)) for _ in range(5))
        finally:
            rt.free(out)
        m, n, k = spec.shape
        flops = 2.0 * m * n * k * chains * iters * blocks * 4  # 4 waves per 256-thread block
        return spec.instruction, flops / times[len(times) // 2] / 1e12

    def vendor_baseline(self, dtype: str, m: int, n: int, k: int):
        """hipBLASLt through a ROCm build of torch (fp32/tf32/fp16/bf16), as (label, callable); else None."""
        try:
            import torch
        except ImportError:
            return None
        if not getattr(torch.version, "hip", None) or not torch.cuda.is_available():
            return None
        from .._torch_baseline import torch_matmul

        d = dtype.lower()
        run = torch_matmul(torch, d, m, n, k)
        if run is None:
            return None
        return f"hipBLASLt {d} (torch.matmul, ROCm {torch.version.hip})", run

    # -- offline
    def emit_kernels(self, arch: str, out_dir, *, workers: int | None = None):
        """Compile every variant for ``arch`` (hiprtc with a ROCm runtime here, else clang-22); KernelRecords."""
        from .emit import emit_kernels

        return emit_kernels(arch, out_dir, runtime=self._rt if self.is_available() is None else None,
                            workers=workers)


def _runtime_version(hip) -> str:
    """ROCm version of the runtime hip-python loaded, for failure reasons (never raises)."""
    try:
        result = hip.hipRuntimeGetVersion()
        return rocm_version_text(int(result[1] if isinstance(result, tuple) else result))
    except Exception:  # noqa: BLE001
        return "unknown"
