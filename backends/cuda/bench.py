"""Benchmark hooks of the CUDA backend: the CUDA-event timer, the instruction ceiling (a register-only mma loop,
``kernels_cuda/gemm_ceiling.cu``) and the vendor baseline (cuBLAS / cuBLASLt through torch)."""

from __future__ import annotations

import numpy as np

from .compile import CEILING_FILE
from .variants import ELEMENTS, ceiling_element

__all__ = ["instruction_ceiling", "timer", "vendor_baseline"]


def timer(cp):
    """``measure(fn) -> seconds``: runs ``fn()`` between two CUDA events on the current stream and waits."""
    start, stop = cp.cuda.Event(), cp.cuda.Event()

    def measure(fn) -> float:
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return cp.cuda.get_elapsed_time(start, stop) * 1e-3

    return measure


def instruction_ceiling(backend, cp, dev, dtype: str, *, iters: int = 4096, chains: int = 8) -> tuple[str, float]:
    """(mnemonic, TFLOP/s) of a register-only loop of the mma that ``dtype`` uses on device ``dev``."""
    from mxcore import layouts

    elem = ceiling_element(dtype, dev.arch)
    rec = layouts.get(ELEMENTS[elem].record)
    kern = backend.kernels.get(cp, dev.ordinal, ("ceiling", elem, chains), CEILING_FILE, "mx_mma_ceiling",
                               ("-std=c++17", f'-DMX_MMA_OP="{rec.ptx}"', f"-DMX_CHAINS={chains}"))
    blocks = dev.sms * 8
    buf = cp.empty(blocks * 256, dtype=cp.float32)
    args = (buf, np.int32(iters), np.uint32(1))
    kern((blocks,), (256,), args)
    measure = timer(cp)
    times = sorted(measure(lambda: kern((blocks,), (256,), args)) for _ in range(5))
    flops = 2.0 * rec.m * rec.n * rec.k * chains * iters * blocks * 8
    return rec.ptx, flops / times[len(times) // 2] / 1e12


def vendor_baseline(dtype: str, m: int, n: int, k: int, sets: int = 3):
    """cuBLAS through torch (fp16/bf16/tf32/fp32) or torch._scaled_mm (fp8), or None when torch is missing.
    The callable rotates over ``sets`` input pairs, like the mxcore side of the benchmark."""
    try:
        import torch
    except ImportError:
        return None
    from .._torch_baseline import torch_matmul, torch_scaled_mm

    d = dtype.lower()
    run = torch_matmul(torch, d, m, n, k, sets)
    if run is not None:
        return f"cuBLAS {d} (torch.matmul)", run
    if d in ("fp8", "e4m3fn", "e4m3"):
        run = torch_scaled_mm(torch, m, n, k, sets)
        if run is not None:
            return "cuBLASLt fp8 e4m3 (torch._scaled_mm)", run
    return None
