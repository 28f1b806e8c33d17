"""mxcore's NVIDIA backend: its own CUDA C++ kernels (``kernels_cuda/``), shipped prebuilt for the default choices
on sm_90 and sm_80-class GPUs and otherwise compiled at run time by NVRTC through CuPy.

Modules, one concern each:

* ``backend``  — :class:`CudaBackend` (the ``backends/_contract.py`` contract): availability, dtypes, plan/matmul,
  benchmark hooks; how each dtype runs.
* ``families`` — the rule choosing the dense family (``mma_sync`` everywhere, ``wgmma`` on sm_90) and the MX path.
* ``variants`` (mma.sync), ``sm90`` (wgmma), ``wonly/`` (weight-only) — each family's builds, rule and plan; the
  families register their offline builds with ``emit`` and their staged forms with ``stage``, which import none of
  them.  The numbers the rules read are in ``tuning/*.json`` (``tables``).
* ``compile``, ``prebuilt``, ``prebuild`` — kernel sources, the per-device kernel handle cache, prebuilt cubins.
* ``device``, ``driver``, ``operand`` — device properties and streams; the libcuda calls CuPy does not wrap
  (``RawLaunch``, tensor maps, graph user objects); ``DevOperand`` and the kernel codes.
* ``stage``    — operand staging (float rounding, fp8 bytes, MX decode / fold), cached on quantized objects.
* ``plan``     — :class:`CudaPlan`: the bound launch (batch in grid.y, split K in grid.z).
* ``callcache``, ``fastpath``, ``quantized`` — the per-call cache and paths (relaunch, recorded-quantization
  replay, kept weights) and the staged forms and bound plans of quantized objects they reuse.
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
