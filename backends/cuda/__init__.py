"""mxcore's NVIDIA backend: our own mma.sync / ldmatrix / cp.async GEMM kernels (``kernels_cuda/``), compiled at
run time by NVRTC through CuPy.

Modules, one concern each:

* ``backend``  — :class:`CudaBackend` (the ``backends/_contract.py`` contract): availability, dtypes, plan/matmul,
  benchmark hooks; how each dtype runs.
* ``families`` — the one rule choosing the kernel family (``mma_sync`` today; the sm_90a ``wgmma`` family
  arrives as ``sm90.py``).
* ``variants`` — elements, tiles, variants, the fragment index formulas and NVRTC options, the tile rule.
* ``compile``  — kernel sources and the per-device kernel handle cache.
* ``device``   — device ordinal, cached device properties, stream, DLPack views.
* ``stage``    — operand staging (float rounding, fp8 bytes, MX decode), cached on quantized objects.
* ``plan``     — :class:`CudaPlan`: the bound launch (batch in grid.y, split K in grid.z).
* ``fastpath`` — the per-call fast paths: fp16/bf16 relaunch, fp8/MX recorded-quantization replay.
* ``emit``     — offline compile jobs and the ``kernels --emit`` manifest (:class:`KernelRecord`).
* ``bench``    — CUDA-event timer, instruction ceiling, vendor baseline; ``diag`` — loop diagnostics.
"""

from .backend import CudaBackend
from .compile import CEILING_FILE, DIAG_FILE, GEMM_FILE, PREP_FILE
from .emit import compile_all, compile_jobs, emit_kernels
from .families import FAMILIES, family_for
from .plan import CudaPlan
from .variants import (ELEMENTS, FRAGMENT_FORMULAS, TILES, Element, Tile, Variant, all_variants, ceiling_element,
                       choose_tile, element_tiles, eval_formula, gemm_options, native_fp8, sm_of)

__all__ = ["CEILING_FILE", "DIAG_FILE", "ELEMENTS", "FAMILIES", "FRAGMENT_FORMULAS", "GEMM_FILE", "PREP_FILE", "TILES",
           "CudaBackend", "CudaPlan", "Element", "Tile", "Variant", "all_variants", "ceiling_element", "choose_tile",
           "compile_all", "compile_jobs", "element_tiles", "emit_kernels", "eval_formula", "family_for",
           "gemm_options", "native_fp8", "sm_of"]
