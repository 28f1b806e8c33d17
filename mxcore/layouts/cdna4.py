"""AMD CDNA4 (gfx950, MI350/MI355) MFMA fragment layouts.

Sources: "AMD Instinct MI355X CDNA4 ISA", chapter 7 "Matrix Arithmetic Instructions" (MFMA operand
layouts; V_MFMA_F32_{16X16X128,32X32X64}_F8F6F4, V_MFMA_SCALE_F32_*_F8F6F4 and the
V_MFMA_LD_SCALE_B32 scale operands); seed ../shared/seeds/002 (ROCm blog, sections 5.4 and 5.5:
lane code for 32x32x64 with fp8 and with fp4 operands, "scales applied after the normal dot
product and prior to accumulation", Atype/Btype codes 0 E4M3, 1 E5M2, 2 E2M3, 3 E3M2, 4 E2M1);
cross-checked against composable_kernel test/mx_mfma_op (register tables with per-lane scales)
and LLVM's llvm.amdgcn.mfma.scale.f32.*.f8f6f4 tests (operand widths v8i32 / v6i32 / v4i32).

CDNA4 keeps the CDNA3 set except xf32 (the f32/f16/bf16 records carry both archs, see cdna3); its
fp8/bf8 MFMAs read OCP bytes (e4m3fn, e5m2) instead of FNUZ.

f8f6f4 operands (one lane group of M lanes per G = 64/M K-runs; 32 elements per lane):

* fp8/bf8: 8 VGPRs, one byte per element (slot s in bits [8s, 8s+8)); the lane's K range is split
  into two runs of 16: k = (s // 16) * 16 * G + (lane // M) * 16 + s % 16.  For 32x32x64 this is
  the seed's ``a_reg[i*16+j] = A[row][(lane/32)*16 + i*32 + j]``.
* fp6/bf6: 6 VGPRs, 32 elements of 6 bits packed densely, slot s in bits [6s, 6s+6) of the
  192-bit concatenation v0..v5 (elements straddle registers); k = (lane // M) * 32 + s.
* fp4: 4 VGPRs (only the low four of the 256-bit builtin operand are read), slot s in bits
  [4s, 4s+4) (low nibble = even k); k = (lane // M) * 32 + s.  Seed sec. 5.5:
  ``a_reg[i] = byte (lane/32)*16 + i of row lane%32`` with the low nibble first.

Disagreement noted: for 16x16x128 fp8, aiter's op_tests/opus/test_mfma_scale.cu loads runs of 8
(k = (s//8)*32 + (lane//16)*8 + s%8) while composable_kernel's mx_mfma_op tables use runs of 16
(k = (s//16)*64 + (lane//16)*16 + s%16).  Without per-block scales both give the same product
(the permutation hits A and B alike); the aiter test uses one uniform scale, so it cannot tell.
We follow composable_kernel (hardware-tested with per-block scales, and the same run-of-16 rule
as the seed's 32x32x64 fp8 code).  The probe kernels must confirm it on gfx950.

Scales (E8M0, one per 32 K elements; scale_a is M x K/32, scale_b is K/32 x N): lane l's 32-bit
scale VGPR supplies scale_a[l % M][l // M] and scale_b[l // N][l % N] (composable_kernel mx_mfma_op;
Mojo's CDNA4 block_scaled_mma docs: "lane_row = lane % 16, lane_k_group = lane / 16").  The byte
read is chosen by op_sel: ``scale_opsel = (byte_a, byte_b)``, each 0..3, the builtin's OPSEL_A /
OPSEL_B arguments; in assembly byte = op_sel[i] + 2 * op_sel_hi[i] (i = 0 for A, 1 for B).  The
scale operand is modelled as one 8-bit slot at bit offset 8 * byte of the lane's register.

Unscaled f8f6f4: there is no separate builtin.  Clang/LLVM emit v_mfma_f32_*_f8f6f4 (no scales,
factor 1) from __builtin_amdgcn_mfma_scale_f32_*_f8f6f4 when both scale operands are the
constant 0 with op_sel 0; a runtime scale byte 0 means 2^-127.  Check the disassembly.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ..errors import LayoutError
from ._core import InstructionLayout, OperandLayout, closed_form
from .cdna3 import C16, C32, WAVE, _F8_16, _F8_32, fp8_pairs, mfma, mfma_input

GFX950 = ("gfx950",)
_SRC = ("AMD CDNA4 ISA ch. 7 Matrix Arithmetic (MFMA, F8F6F4, MFMA_LD_SCALE)",
        "seeds/002 ROCm blog sec. 5.4-5.5", "composable_kernel test/mx_mfma_op")

# cbsz (A) / blgp (B) format codes of the f8f6f4 family
FORMAT_CODE = {"e4m3fn": 0, "e5m2": 1, "e2m3": 2, "e3m2": 3, "e2m1": 4}
FORMAT_BITS = {"e4m3fn": 8, "e5m2": 8, "e2m3": 6, "e3m2": 6, "e2m1": 4}

_F16 = (
    mfma("v_mfma_f32_16x16x32_f16", "__builtin_amdgcn_mfma_f32_16x16x32_f16", 16, 32, "fp16", archs=GFX950),
    mfma("v_mfma_f32_32x32x16_f16", "__builtin_amdgcn_mfma_f32_32x32x16_f16", 32, 16, "fp16", archs=GFX950),
    mfma("v_mfma_f32_16x16x32_bf16", "__builtin_amdgcn_mfma_f32_16x16x32_bf16", 16, 32, "bf16", archs=GFX950),
    mfma("v_mfma_f32_32x32x16_bf16", "__builtin_amdgcn_mfma_f32_32x32x16_bf16", 32, 16, "bf16", archs=GFX950),
)


def _ocp(base: InstructionLayout) -> tuple:
    return fp8_pairs(replace(base, archs=GFX950, sources=_SRC), fmts=("e4m3fn", "e5m2"))


RECORDS = (*_F16, *_ocp(_F8_32), *_ocp(_F8_16))

# ---- f8f6f4: built on demand per (shape, A format, B format, scaled, op_sel)
F8F6F4_SHAPES = {  # name -> (m, k, scaled)
    "v_mfma_f32_16x16x128_f8f6f4": (16, 128, False),
    "v_mfma_f32_32x32x64_f8f6f4": (32, 64, False),
    "v_mfma_scale_f32_16x16x128_f8f6f4": (16, 128, True),
    "v_mfma_scale_f32_32x32x64_f8f6f4": (32, 64, True),
}


def _f8f6f4_input(role: str, m: int, k: int, fmt: str) -> OperandLayout:
    bits = FORMAT_BITS[fmt]
    rows, cols = (m, k) if role == "a" else (k, m)
    return mfma_input(role, rows, cols, bits, chunk=16 if bits == 8 else None)


def _scale(role: str, m: int, k: int, byte: int) -> OperandLayout:
    nb = k // 32
    if role == "scale_a":
        @closed_form(m, nb, WAVE, 1, doc=f"scale_a[lane%{m}][lane//{m}], byte {byte} of the scale VGPR")
        def mp(lane, slot):
            return lane % m, lane // m + slot
    else:
        @closed_form(nb, m, WAVE, 1, doc=f"scale_b[lane//{m}][lane%{m}], byte {byte} of the scale VGPR")
        def mp(lane, slot):
            return lane // m + slot, lane % m
    return OperandLayout(role, mp, 8, 1, bit_offsets=(8 * byte,))


@lru_cache(maxsize=None)
def f8f6f4(name: str, a_fmt: str, b_fmt: str, opsel: tuple = (0, 0)) -> InstructionLayout:
    m, k, scaled = F8F6F4_SHAPES[name]
    for f in (a_fmt, b_fmt):
        if f not in FORMAT_CODE:
            raise LayoutError(f"{name}: format {f!r} is not an f8f6f4 operand format; "
                              f"use one of {', '.join(FORMAT_CODE)} (or fp8, bf8, fp6, bf6, fp4)")
    if any(b not in (0, 1, 2, 3) for b in opsel):
        raise LayoutError(f"{name}: scale_opsel {opsel} must be two byte indices 0..3")
    extra = {}
    if scaled:
        extra = dict(scale_a=_scale("scale_a", m, k, opsel[0]), scale_b=_scale("scale_b", m, k, opsel[1]),
                     scale_format="e8m0", scale_block=32, scale_opsel=tuple(opsel))
    return InstructionLayout(
        name=name, vendor="amd", archs=GFX950, m=m, n=m, k=k, lanes=WAVE,
        a_format=a_fmt, b_format=b_fmt, c_format="fp32",
        a=_f8f6f4_input("a", m, k, a_fmt), b=_f8f6f4_input("b", m, k, b_fmt), c=C32 if m == 32 else C16,
        mnemonic=name, intrinsic=f"__builtin_amdgcn_mfma_scale_f32_{m}x{m}x{k}_f8f6f4",
        cbsz=FORMAT_CODE[a_fmt], blgp=FORMAT_CODE[b_fmt], sources=_SRC,
        notes="" if scaled else "emit via the scale builtin with constant-0 scales and op_sel 0", **extra)
