"""AMD CDNA4 (gfx950, MI350/MI355) MFMA fragment layouts.

Primary source: "AMD Instinct CDNA4 Instruction Set Architecture", chapter 7 "Matrix Arithmetic
Instructions":

* 7.1.4 "General input and output layout": items are packed little-endian; 4-bit item 0 in bits
  3-0, item 1 in bits 7-4, ...; 6-bit items are packed densely in six contiguous registers treated
  as one 192-bit register (item i in bits [6i, 6i+6), crossing register boundaries), 32 per lane.
  7.1.4.1 "Input layout": A[i][k] in item k % K_L of lane i + M*(k // K_L), K_L = K / (64/M).
* 7.1.5 "8-bit and Smaller Matrix Operations and Layouts": F8 8 VGPRs, F6 6 VGPRs, F4 4 VGPRs for
  A and B; CBSZ/BLGP codes 0 E4M3, 1 E5M2, 2 E2M3, 3 E3M2, 4 E2M1; 16 (32x32: 32) cycles, doubled if
  either operand is F8.  ABID[0] = 0 forces all scales to 1.0 (0x7f); the SCALE ops set ABID[0] = 1.
* 7.1.5.1 "Dense Matrix Layouts: 8-bit and Smaller": per-lane K tables for FP4, FP6, FP8 (both
  shapes) and for BF16 16x16x32 / 32x32x16 (all transcribed below).
* 7.2.1 "MFMA with Block Exponent Scaling": scale operand OPSEL codes and the scale data layout.
* 7.3 Table 30: FP8 is E4M3 bias 7 (max 448) and BF8 E5M2 bias 15, i.e. the OCP formats.

Cross-checks: seed ../shared/seeds/002 (ROCm blog "Matrix Core Programming on AMD CDNA3 and CDNA4",
sec. 5.4/5.5: HIP code for 32x32x64 with fp8 and with fp4 operands; "scales applied after the
normal dot product and prior to accumulation"); composable_kernel test/mx_mfma_op/mx_mfma_op.hpp
(register tables, fp8 and fp4) and test/mx_mfma_op/scale_mapping_{16x16x128,32x32x64}.{cpp,txt}
(a gfx950 probe: one A element at a time set to 1.0 with per-lane scales 2^lane, the printed log2
of the result names the lane whose scale applied); Triton lib/Dialect/TritonGPU/IR/
LinearLayoutConversions.cpp (mfmaDotToLinearLayout with kWidth 16 for scaled fp8, i.e. runs of 16;
chooseScaledMfmaScaleLayout lane bases); LLVM AMDGPU llvm.amdgcn.mfma.scale.f32.*.f8f6f4 tests
(operand widths v8i32 / v6i32 / v4i32) and llc-22 output for the builtin's op_sel arguments.

CDNA4 keeps the CDNA3 set except xf32 (the f32/f16/bf16 records carry both archs, see cdna3); its
fp8/bf8 MFMAs read OCP bytes (e4m3fn, e5m2) instead of FNUZ (ISA 7.3 Table 30).

f16/bf16 16x16x32 and 32x32x16 (ISA 7.1.5.1 "A[m][k]/B[k][n] Layout BF16"): 8 K-contiguous
elements per lane in 4 VGPRs, k = (lane // M) * 8 + s (16x16x32: thr 0-15 k=0-7, thr 16-31 k=8-15,
...; 32x32x16: thr 0-31 k=0-7, thr 32-63 k=8-15), i.e. the 7.1.4.1 rule.  F16 uses the same table.

f8f6f4 operands (lane group g = lane // M, G = 64 / M groups; 32 elements per lane):

* fp8/bf8: 8 VGPRs, one byte per element (slot s in bits [8s, 8s+8)); the lane's K range is split
  into two runs of 16: k = (s // 16) * 16 * G + g * 16 + s % 16.  ISA 7.1.5.1 FP8 tables:
  16x16x128 thr 0-15 hold k=0-15 in v0-v3 and k=64-79 in v4-v7, thr 16-31 k=16-31 / 80-95, ...;
  32x32x64 thr 0-31 k=0-15 / 32-47, thr 32-63 k=16-31 / 48-63 (= the seed's
  ``a_reg[i*16+j] = A[row][(lane/32)*16 + i*32 + j]``).  FP8 is the one exception to 7.1.4.1.
* fp6/bf6: 6 VGPRs, 32 elements of 6 bits packed densely, slot s in bits [6s, 6s+6) of the
  192-bit concatenation v0..v5 (elements straddle registers; ISA 7.1.4); k = g * 32 + s.
  ISA 7.1.5.1 FP6 tables: 16x16x128 thr 0-15 hold k=0-15 in v0-v2 and k=16-31 in v3-v5, thr 16-31
  k=32-63, ...; 32x32x64 thr 0-31 k=0-31, thr 32-63 k=32-63.  ISA 6.7 "Packed Math" says the same
  for the FP32->FP6 conversion example (16x16x128: lanes 0..15 hold K=0..31 in VGPRs 0..5).
  (A comment in Triton's chooseScaledMfmaScaleLayout groups mxfp6 with mxfp8 as "2
  16-consecutive elements blocks", but Triton rejects mxfp6 ("NYI: mxfp6"); we follow the ISA.)
* fp4: 4 VGPRs (only the low four of the 256-bit builtin operand are read), slot s in bits
  [4s, 4s+4) (low nibble = even k; ISA 7.1.4); k = g * 32 + s.  ISA 7.1.5.1 FP4 tables
  (16x16x128 thr 0-15 k=0-31, thr 16-31 k=32-63, ...; 32x32x64 "A[I, k] goes in item k % 32 of
  lane I + 32 * (k / 32)"); seed sec. 5.5 ``a_reg[i] = byte (lane/32)*16 + i of row lane%32``.

Resolved disagreement (16x16x128 fp8): aiter's op_tests/opus/device/test_mfma_scale.cu loads runs
of 8 (k = (s//8)*32 + g*8 + s%8) but passes one uniform scale, so it cannot see a K permutation
applied to A and B alike.  The ISA 7.1.5.1 FP8 table, composable_kernel's mx_mfma_op register
tables, Triton's kWidth-16 layout and CK's scale_mapping_16x16x128 hardware probe (lane 0 slots
0-15 scaled by lane 0's scale, slots 16-31 by lane 32's, i.e. K blocks 0 and 2) all give runs of 16.
Runs of 8 would put slots 8-15 of lane 0 in K block 1 (lane 16's scale), which the probe rules out.

Scales (E8M0, one per 32 K elements; scale_a is M x K/32, scale_b is K/32 x N): lane l's 32-bit
scale VGPR supplies scale_a[l % M][l // M] and scale_b[l // N][l % N].  ISA 7.2.1 "Scale data layout
for 16x16 Output Matrices (K=128)": lane 0 M=0 K=0..31, lane 15 M=15 K=0..31, lane 16 M=0 K=32..63,
lane 32 M=0 K=64..95, lane 63 M=15 K=96..127; "for 32x32 (K=64)": lane 16 M=16 K=0..31, lane 32 M=0
K=32..63, lane 63 M=31 K=32..63 (B alike with N).  CK's scale_mapping_* probes measured the same
lanes for A and B.  The byte read is chosen per operand by ISA 7.2.1: "{OP_SEL_HI[i], OP_SEL[i]}"
is a 2-bit code, 00 Src[7:0], 01 Src[15:8], 10 Src[23:16], 11 Src[31:24] (i = 0 A, 1 B), so
byte = op_sel[i] + 2 * op_sel_hi[i].  ``scale_opsel = (byte_a, byte_b)`` are the builtin's
OPSEL_A / OPSEL_B arguments; llc-22 encodes argument v as op_sel[i] = v & 1, op_sel_hi[i] = v >> 1
(checked: (2, 3) -> op_sel:[0,1,0] op_sel_hi:[1,1,0]; (3, 1) -> op_sel:[1,1,0] op_sel_hi:[1,0,0]).
The scale operand is modelled as one 8-bit slot at bit offset 8 * byte of the lane's register.

Inline-constant caveat (ISA 7.2.1): "Scale values (SRC0 and SRC1) can be either VGPRs or Inline
constants (floats, using only the exponent portion)".  An inline float constant such as 1.0 means
scale 2^0 there, while the same bits 0x3F800000 in a VGPR give byte 0 = 0x00 = 2^-127.  CK's probes
pass 0x3F800000 as the neutral B scale and measured factor 1, i.e. their compiler emitted the inline
constant; llc-22 materialises such constants in a VGPR.  Kernels should pass scale bytes in VGPRs.

Unscaled f8f6f4: there is no separate builtin.  Clang/LLVM emit v_mfma_f32_*_f8f6f4 (ABID[0] = 0:
scales forced to 1.0) from __builtin_amdgcn_mfma_scale_f32_*_f8f6f4 when both scale operands are the
constant 0 with op_sel 0 (checked with llc-22); a runtime scale byte 0 means 2^-127.  Check the
disassembly.  Each operand's layout depends only on its own format (ISA 7.1.5: "any combination of
the formats"); mixed-format pairs are not covered by the lane-level sources above.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ..dtypes import F8F6F4_CODES, bits as _bits
from ..errors import LayoutError
from ._core import InstructionLayout, OperandLayout, closed_form
from .cdna3 import C16, C32, WAVE, _F8_16, _F8_32, fp8_pairs, mfma, mfma_input

GFX950 = ("gfx950",)
_SRC = ("AMD CDNA4 ISA 7.1.4 General input and output layout",
        "AMD CDNA4 ISA 7.1.5.1 Dense Matrix Layouts: 8-bit and Smaller",
        "AMD CDNA4 ISA 7.2.1 MFMA with Block Exponent Scaling",
        "seeds/002 ROCm blog sec. 5.4-5.5",
        "composable_kernel test/mx_mfma_op (mx_mfma_op.hpp tables; scale_mapping_* gfx950 probes)",
        "triton LinearLayoutConversions.cpp (mfmaDotToLinearLayout, chooseScaledMfmaScaleLayout)")


# ISA 7.1.5.1 "Layout BF16" tables (8 K-contiguous per lane); builtins and mnemonics checked with clang-22.
_F16_SRC = (_SRC[1] + " (BF16 tables)", "clang-22 --offload-arch=gfx950 (builtin -> mnemonic)")
_F16 = (
    mfma("v_mfma_f32_16x16x32_f16", "__builtin_amdgcn_mfma_f32_16x16x32_f16", 16, 32, "fp16", archs=GFX950,
         sources=_F16_SRC),
    mfma("v_mfma_f32_32x32x16_f16", "__builtin_amdgcn_mfma_f32_32x32x16_f16", 32, 16, "fp16", archs=GFX950,
         sources=_F16_SRC),
    mfma("v_mfma_f32_16x16x32_bf16", "__builtin_amdgcn_mfma_f32_16x16x32_bf16", 16, 32, "bf16", archs=GFX950,
         sources=_F16_SRC),
    mfma("v_mfma_f32_32x32x16_bf16", "__builtin_amdgcn_mfma_f32_32x32x16_bf16", 32, 16, "bf16", archs=GFX950,
         sources=_F16_SRC),
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
    bits = _bits(fmt)
    rows, cols = (m, k) if role == "a" else (k, m)
    # ISA 7.1.5.1: FP8 splits the lane's 32 K into two runs of 16; FP6 and FP4 hold 32 K-contiguous.
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
        if f not in F8F6F4_CODES:
            raise LayoutError(f"{name}: format {f!r} is not an f8f6f4 operand format; "
                              f"use one of {', '.join(F8F6F4_CODES)} (or fp8, bf8, fp6, bf6, fp4)")
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
        cbsz=F8F6F4_CODES[a_fmt], blgp=F8F6F4_CODES[b_fmt], sources=_SRC,
        notes="" if scaled else "emit via the scale builtin with constant-0 scales and op_sel 0", **extra)
