"""The benchmark's loop diagnostics (``python -m mxcore bench --loop-ceilings``): the GEMM's own block with parts
of its main loop removed (``kernels_cuda/gemm_diag.cu``), launched with the plan's tile, grid and operands.  Not
used by ``matmul``.

"smem": operands resident in shared memory (no global loads in the loop, barriers kept); "mma": ldmatrix + mma
alone; "feed": cp.async loads, waits and barriers alone.  A diagnostic kernel needs fewer registers than the GEMM,
so its dynamic shared memory is padded to run as many blocks per SM as the GEMM itself (same occupancy).
"""

from __future__ import annotations

from .compile import DIAG_FILE
from .operand import OUT_KIND
from .variants import TILES, gemm_options

__all__ = ["DIAG_NAMES", "launch_diagnostic"]

#: the diagnostics of gemm_diag.cu by name: the value of its MX_DIAG define
DIAG_NAMES = {"smem": 1, "mma": 2, "feed": 3}

_SMEM: dict = {}


def _diag_smem(plan) -> int:
    v, props = plan.variant_, plan.dev.props
    key = (plan.dev.ordinal, v)
    if key not in _SMEM:
        t = TILES[v.tile]
        regs = int(plan._kernel.attributes["num_regs"])
        warps = t.threads // 32
        by_regs = props.get("regsPerMultiprocessor", 65536) // (-(-regs * 32 // 256) * 256 * warps)
        smem_sm = props.get("sharedMemPerMultiprocessor", 233472)
        reserved = props.get("reservedSharedMemPerBlock", 1024)
        by_smem = smem_sm // (v.smem_bytes + reserved)
        by_threads = props.get("maxThreadsPerMultiProcessor", 2048) // t.threads
        blocks = max(1, min(by_regs, by_smem, by_threads))
        optin = props.get("sharedMemPerBlockOptin", 232448)
        _SMEM[key] = max(v.smem_bytes, min(smem_sm // blocks - reserved, optin))
    return _SMEM[key]


def launch_diagnostic(plan, name: str) -> None:
    """Launch diagnostic ``name`` of ``plan`` (one K slice) on the current device and stream."""
    v, code = plan.variant_, DIAG_NAMES[name]
    smem = _diag_smem(plan)
    kern = plan.backend.kernels.get(plan.cp, plan.dev.ordinal, ("diag", v, code, smem), DIAG_FILE, "mx_gemm_diag",
                                    (*gemm_options(v), f"-DMX_DIAG={code}"), smem)
    out = plan.out
    ldc = out.shape[-1]
    kern(plan._grid, (v.threads,), plan._args(out, ldc, plan._scale, OUT_KIND[plan.out_dtype], 0, plan.m * ldc),
         shared_mem=smem)
