"""The one contract every backend implements (``cuda``, ``hip``, ``reference``), and the parts they share.

``mxcore.api``, ``mxcore.tools.bench``, ``mxcore.tools.selftest`` and the tests use a backend only through this
contract: no ``hasattr`` probing.  A backend subclasses :class:`Backend` (which supplies the optional hooks'
defaults) and its plans subclass :class:`Plan`.

Division of labour:

* the API resolves the backend, the dtype (``mxcore.dtypes.resolve`` for the backend's arch) and checks
  ``supports`` ONCE, then calls ``plan(...)`` / ``matmul(...)`` with a resolved :class:`~mxcore.dtypes.MatmulDType`;
  backends do not re-check support on the hot path.
* a plan holds staged operands and the output; ``gemm()`` launches the GEMM kernel(s) alone, ``prep()`` re-runs
  the device-side preparation alone (both asynchronous on the plan's stream), ``result()`` returns the output as
  the caller's kind of array.
* ``timer()`` measures a callable between two device events on the current stream.
* ``emit_kernels(arch, out_dir)`` compiles the default kernels offline and returns :class:`KernelRecord` rows (one
  manifest schema for every vendor).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

__all__ = ["FAILURE", "Backend", "KernelRecord", "Plan", "Target", "is_failure"]

#: prefix of an ``is_available()`` reason that is a FAILURE, not an absence: the GPU library imports and a device
#: is counted, but setting it up failed (a library/driver version mismatch, a broken install).  GPU tests fail
#: with such a reason instead of skipping, and ``python -m mxcore info`` shows it.
FAILURE = "FAILURE: "


def is_failure(reason) -> bool:
    """True when an ``is_available()`` reason marks a failure (see :data:`FAILURE`), not a missing GPU/library."""
    return isinstance(reason, str) and reason.startswith(FAILURE)


@dataclass(frozen=True)
class Target:
    """What a kernel is built for: vendor ("nvidia" | "amd" | "cpu"), arch ("sm_90", "gfx950"), wave size."""

    vendor: str
    arch: str | None
    wave_size: int = 32


@dataclass(frozen=True)
class KernelRecord:
    """One row of the ``kernels --emit`` manifest (same schema for every vendor)."""

    kernel: str            # entry point name
    variant: str           # file stem: unique per compiled variant
    dtype: str             # element / dtype the variant serves
    arch: str
    file: str              # machine code file (cubin / hsaco) written under out_dir
    tile: str = ""
    registers: int = 0     # per thread (VGPRs on AMD)
    shared_bytes: int = 0  # static + dynamic shared memory (LDS on AMD)
    local_bytes: int = 0   # stack / scratch per thread
    spill_stores: int = 0
    spill_loads: int = 0
    threads: int = 0
    options: tuple = field(default_factory=tuple)
    extra: dict = field(default_factory=dict)  # vendor-specific figures (e.g. SGPRs, ptx file name)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["options"] = list(self.options)
        return d


class Plan:
    """Staged operands + output of one ``a @ b`` (see the module docstring)."""

    #: what ran: a short human-readable kernel/variant description (set by ``gemm()``), e.g. "f16 128x128 tn"
    variant: str = ""
    #: names of loop diagnostics ``gemm_diagnostic`` accepts (empty: none)
    diagnostics: tuple = ()
    #: batch size of a 3-D problem ((B, M, K) @ (B, K, N) or @ (K, N): the result is (B, M, N)); None for 2-D
    batch: int | None = None

    def gemm(self) -> None:
        raise NotImplementedError

    def prep(self) -> None:
        """Re-run the device-side operand preparation alone (no-op when there is none)."""

    def result(self):
        raise NotImplementedError

    def clone(self) -> "Plan":
        """The same problem in fresh device buffers (another input set for benchmarks)."""
        raise NotImplementedError

    def gemm_diagnostic(self, name: str) -> None:
        from mxcore.errors import UnsupportedError

        raise UnsupportedError(f"this plan has no loop diagnostic {name!r}; it has: {', '.join(self.diagnostics) or 'none'}")

    def close(self) -> None:
        """Release device memory now."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Backend:
    """Base class of every backend: the contract with the defaults of its optional hooks."""

    name: str = ""
    vendor: str = ""
    #: backend-specific ``matmul`` keywords (beyond a, b, mdt, out_dtype, scale_rounding, out)
    options: tuple = ()
    #: True when ``plan``/``matmul`` take batched operands in ONE launch: a (B, M, K) with b (B, K, N) or a shared
    #: b (K, N); the API loops over the batch for backends that leave this False
    batched: bool = False
    #: True when fp8/MX operands that live on this backend's device are quantized there (the API then passes
    #: device ScaledTensor/MXTensor objects to ``plan``); False: the API leaves quantization to ``plan``
    device_quantization: bool = False
    #: the memory order ("C" or "F") in which device quantization should write B's (K, N) per-tensor fp8 codes: the
    #: order this backend's kernels read without a staging copy
    b_code_order: str = "C"
    #: set when ``is_available()`` failed on an exception (chained into the error the registry raises)
    unavailable_cause: BaseException | None = None

    # ---- identity and capability ---------------------------------------------------------------------------
    def is_available(self) -> str | None:
        """None when usable, else the reason (never raises; imports GPU libraries lazily).  A reason starting
        with :data:`FAILURE` means the library and a device are there but initialisation failed."""
        raise NotImplementedError

    def devices(self) -> list[str]:
        return []

    def target(self) -> Target:
        raise NotImplementedError

    def supported_dtypes(self, arch: str | None = None) -> list[str]:
        raise NotImplementedError

    def supports(self, mdt) -> str | None:
        """None if this backend runs the resolved dtype ``mdt`` on its current device, else why not."""
        raise NotImplementedError

    # ---- running ------------------------------------------------------------------------------------------
    def plan(self, a, b, mdt, *, out_dtype: str = "float32", scale_rounding: str = "floor", out=None,
             tile: str | None = None, **options) -> Plan:
        raise NotImplementedError

    def matmul(self, a, b, mdt, *, out_dtype: str = "float32", scale_rounding: str = "floor", out=None, **options):
        p = self.plan(a, b, mdt, out_dtype=out_dtype, scale_rounding=scale_rounding, out=out, **options)
        p.gemm()
        return p.result()

    def fast_matmul(self, a, b, mdt, *, out_dtype: str = "float32", scale_rounding: str = "floor"):
        """An optional per-call fast path for two 2-D device operands with no options (``mxcore.matmul`` tries it
        before anything else on GPU data), also offered C-contiguous (B, T, K) activations times a 2-D operand for
        float and weight-only dtypes (then ``matmul`` tries again with the B T rows as a 2-D operand): the result,
        or None when not taken (then ``matmul`` runs as usual).  Whatever it returns must equal ``matmul``'s result
        bit for bit."""
        return None

    def cache_info(self) -> dict:
        """The per-call cache's state (entries, device bytes, limit, counters); empty where there is none."""
        return {}

    def clear_cache(self, obj=None) -> None:
        """Drop the per-call cache's entries (or, with ``obj``, what was staged from that quantized operand)."""

    def set_cache_limit(self, nbytes: int) -> None:
        """Bound the per-call cache's device bytes."""

    # ---- benchmarking ---------------------------------------------------------------------------------------
    def timer(self) -> Callable[[Callable[[], object]], float]:
        """``measure(fn) -> seconds`` with device events; the reference backend uses the host clock."""
        import time

        def measure(fn) -> float:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0

        return measure

    def tiles(self, dtype: str) -> tuple:
        """Tile names ``plan(..., tile=...)`` accepts for ``dtype`` (empty: no choice)."""
        return ()

    def bench_operands(self, a, b, dtype: str):
        """Host float32 operands -> what this backend reads in place (identity by default)."""
        return a, b

    def ceiling_key(self, dtype: str) -> str:
        """Dtypes with the same key run the same matrix instruction (one ceiling measurement serves them)."""
        return dtype

    def instruction_ceiling(self, dtype: str):
        """(mnemonic, TFLOP/s) of a register-only loop of the instruction ``dtype`` runs on, or None."""
        return None

    def vendor_baseline(self, dtype: str, m: int, n: int, k: int):
        """(label, callable) of the vendor library on the same problem, or None."""
        return None

    # ---- offline ---------------------------------------------------------------------------------------------
    def emit_kernels(self, arch: str, out_dir, *, workers: int | None = None) -> list[KernelRecord]:
        """Compile every variant for ``arch`` without a GPU; write the binaries under ``out_dir``."""
        return []
