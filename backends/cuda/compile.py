"""Kernel sources and compiled kernels, one in-memory handle cache per (device, kernel): a prebuilt cubin where the
package data or the ``--prebuild`` cache holds one (``prebuilt.py``), else NVRTC through CuPy's ``RawKernel`` (CuPy
caches the binaries on disk, keyed on the source text and options).

Sources (``kernels_cuda/``, read through :func:`mxcore.kernels.kernel_source`, which inlines local headers):

* ``gemm.cu`` — the mma.sync GEMM (``mx_gemm``); its block lives in ``gemm_block.cuh``.
* ``gemm_diag.cu`` — the benchmark's loop diagnostics (``mx_gemm_diag``, same block, parts of the loop removed).
* ``gemm_prep.cu`` — operand preparation, decoding, the byte transpose and the split-K reduction.
* ``gemm_ceiling.cu`` — a register-only mma loop (the benchmark's instruction ceiling).
"""

from __future__ import annotations

import functools

__all__ = ["CEILING_FILE", "DIAG_FILE", "GEMM_FILE", "PREP_FILE", "PREP_KERNELS", "KernelCache", "kernel", "source"]

GEMM_FILE, DIAG_FILE, PREP_FILE, CEILING_FILE = "gemm.cu", "gemm_diag.cu", "gemm_prep.cu", "gemm_ceiling.cu"
SM90_FILE, SM90_KERNEL, SM90_MX_FILE = "gemm_sm90.cu", "mx_gemm_sm90", "gemm_sm90_mx.cu"  # the wgmma family (sm90.py)
PREP_KERNELS = ("mx_prep_float", "mx_prep_codes", "mx_splitk_reduce", "mx_decode_codes", "mx_transpose_bytes")


@functools.lru_cache(maxsize=None)
def source(filename: str) -> str:
    """The text of a kernel source with its local headers inlined (read once per process)."""
    from mxcore.kernels import kernel_source

    return kernel_source("nvidia", filename)


def kernel(cp, ordinal: int, filename: str, name: str, options: tuple):
    """Kernel ``name`` of ``filename`` built with ``options`` for device ``ordinal`` (the current device): a prebuilt
    cubin (``prebuilt.load_kernel``), else a ``cupy.RawKernel`` that NVRTC compiles on first use."""
    from ..nvrtc_tools import DEVICE_FLAGS
    from .prebuilt import device_arch, load_kernel, note

    text = source(filename)
    arch = device_arch(cp, ordinal)
    k = load_kernel(cp, text, name, options, arch, filename)
    if k is None:
        k = cp.RawKernel(text, name, options=(*DEVICE_FLAGS, *options))
        note("compiled", filename, name, arch)
    return k


class KernelCache:
    """Compiled kernel handles per (device ordinal, key, what compiles it: file, entry, options).  ``get`` loads a
    prebuilt cubin or compiles on first use (on the current device, which the caller has selected) and raises the
    kernel's dynamic shared memory limit when it needs more than the 48 KB default.  The options are part of the
    key, so a rule that changes a variant's build (a module constant read by its options) never gets a stale
    kernel."""

    def __init__(self):
        self._kernels: dict = {}

    def get(self, cp, ordinal: int, key, filename: str, name: str, options, smem: int = 0):
        full = (ordinal, key, filename, name, tuple(options))
        k = self._kernels.get(full)
        if k is None:
            k = kernel(cp, ordinal, filename, name, full[-1])
            if smem > 48 * 1024:
                k.max_dynamic_shared_size_bytes = smem
            self._kernels[full] = k
        return k

    def prep(self, cp, ordinal: int, name: str):
        return self.get(cp, ordinal, ("prep", name), PREP_FILE, name, ("-std=c++17",))

    def constant(self, ordinal: int, key, make):
        """A cached device constant (e.g. a decode table): ``make()`` runs once per (device, key)."""
        full = (ordinal, ("const", key))
        if full not in self._kernels:
            self._kernels[full] = make()
        return self._kernels[full]
