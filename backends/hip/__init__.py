"""AMD backend: CDNA3 (gfx942) and CDNA4 (gfx950) MFMA GEMM kernels through hip-python + hiprtc.

What runs where (one source, ``kernels_hip/gemm_mfma.hip``, specialised by -D defines; the variant list is
enumerated from the MFMA records of :mod:`mxcore.layouts`, see :mod:`.variants`):

===========  =================================================  =====================================
arch         dtype                                              instruction (both shapes are variants)
===========  =================================================  =====================================
both         fp32                                               v_mfma_f32_32x32x2_f32 / 16x16x4_f32
gfx942       tf32                                               v_mfma_f32_32x32x4_xf32 / 16x16x8_xf32
gfx950       tf32 (inputs rounded to tf32 by mxcore; exact      v_mfma_f32_32x32x2_f32 / 16x16x4_f32
             products, so the fp32 instruction computes the     (CDNA4 dropped the xf32 MFMAs)
             same products)
gfx942       fp16, bf16                                         v_mfma_f32_32x32x8_{f16,bf16} / 16x16x16
gfx942       e4m3fnuz / e5m2fnuz, all four A/B pairs (FNUZ)     v_mfma_f32_32x32x16_{fp8,bf8}_{fp8,bf8} / 16x16x32
gfx950       fp16, bf16                                         v_mfma_f32_32x32x16_{f16,bf16} / 16x16x32
gfx950       e4m3fn / e5m2 (OCP), all pairs, unit scales 127    v_mfma_scale_f32_32x32x64_f8f6f4 / 16x16x128
gfx950       mxfp8(_e5m2), mxfp6(_e3m2), mxfp4, any A/B pair    v_mfma_scale_f32_32x32x64_f8f6f4 / 16x16x128
===========  =================================================  =====================================

Nothing here has run on AMD hardware: the kernels are compile-checked (clang-22, disassembly), their index
arithmetic is run on the CPU through the emulator (tests/test_hip_index.py), and the host glue runs against a
stand-in for hip-python (tests/test_hip_gpu.py).

Kernel structure (``gemm_mfma.hip``): 4 waves per block, each 2x2 instruction tiles (block tile 128x128
for the 32x32 shapes, 64x64 for the 16x16 ones; the 16x16 shape is picked when M or N < 128), BK =
max(instruction K, 64 bytes); global -> registers with 16-byte loads where the operand is contiguous,
aligned and inside the matrix (element loads with zero fill at the edges: any M, N, K >= 1) -> LDS (two
buffers, one barrier per K tile) -> per-lane fragments.  A and B may each be row- or column-major; batches
run in grid Z.  Output fp32 (float16/bfloat16 outputs are rounded once from it).  Per-tensor fp8 scales
(powers of two) are applied in the epilogue; MX block scales go through the scale operands of the f8f6f4
MFMA, one E8M0 per lane per 32-K block as the layout record says (other ``MXTensor.block`` sizes are
refused).  MX element codes are staged one code per byte (fp4/fp6 are packed into the instruction's
registers in the kernel).

Modules: :mod:`.variants` (KernelSpec, the variant list), :mod:`.fragments` (lane maps fitted to the records,
fragment typedefs of ``kernels_hip/mx_types.h``), :mod:`.runtime` (the only caller of hip-python; detects its
call convention once), :mod:`.cache` (verified code-object cache, clang-22 compile), :mod:`.dlpack` (device
views), :mod:`.staging` (operand storage, fp8 re-encoding), :mod:`.launch` (grid and arguments),
:mod:`.plan` (HipPlan), :mod:`.emit` (offline compile + KernelRecords), :mod:`.backend` (HipBackend).
"""

from __future__ import annotations

from .backend import HipBackend, supports_on
from .cache import (
    COMMON_OPTIONS,
    cache_dir,
    cache_key,
    cache_read,
    cache_write,
    clang_options,
    hiprtc_options,
    offline_compile,
)
from .dlpack import DeviceView, device_view
from .fragments import WAVE, frag_type, fragment_constants
from .launch import XCDS, Launch, kernel_args, plan_launch, xcd_order
from .plan import HipPlan
from .runtime import Convention, Runtime, detect_convention, device_address
from .staging import K_PAD, convert_fp8, operand_storage, pack_k
from .variants import (
    ARCHS,
    SOURCE_FILE,
    KernelSpec,
    ceiling_defines,
    compile_inputs,
    kernel_specs,
    scaled_spec,
    select_spec,
    supported_dtype_names,
    tile_name,
    validate_spec,
)

__all__ = [
    "ARCHS", "COMMON_OPTIONS", "K_PAD", "SOURCE_FILE", "WAVE", "XCDS", "Convention", "DeviceView", "HipBackend", "HipPlan",
    "KernelSpec", "Launch", "Runtime", "cache_dir", "cache_key", "cache_read", "cache_write", "ceiling_defines",
    "clang_options", "compile_inputs", "convert_fp8", "detect_convention", "device_address", "device_view",
    "frag_type", "fragment_constants", "hiprtc_options", "kernel_args", "kernel_specs", "offline_compile",
    "operand_storage", "pack_k", "plan_launch", "scaled_spec", "select_spec", "supported_dtype_names", "supports_on",
    "tile_name", "validate_spec", "xcd_order",
]
