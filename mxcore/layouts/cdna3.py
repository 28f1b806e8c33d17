"""AMD CDNA3 (gfx942, MI300) MFMA fragment layouts, and the MFMA maps CDNA4 reuses.

Source: "AMD Instinct MI300 CDNA3 ISA", chapter 7 "Matrix Arithmetic Instructions" (7.1 dependent
arithmetic / MFMA operand layouts), cross-checked with the AMD matrix instruction calculator's
rules and the seed ../shared/seeds/002 (ROCm blog "Matrix Core Programming on AMD CDNA3 and CDNA4",
section 5 examples 5.1-5.3 give the lane arithmetic for 32x32x2 f32, 16x16x16 f16, 32x32x16 fp8).

All single-block MFMAs on a wave of 64 share one scheme.  With G = 64 / M lane groups and ``kpl``
= M*K/64 elements per lane, lane l holds row (A) / column (B) ``l % M`` and the K elements
``k = (s // chunk) * chunk * G + (l // M) * chunk + s % chunk`` for slot s (chunk = kpl unless a
format splits the lane's K range; see cdna4).  C/D: the 32x32 fragment has row
``8*(s//4) + 4*(l//32) + s%4``, col ``l % 32``; the 16x16 fragment row ``4*(l//16) + s``, col ``l % 16``.
"""

from __future__ import annotations

from dataclasses import replace

from ..dtypes import storage_bits
from ._core import InstructionLayout, OperandLayout, closed_form

WAVE = 64
GFX942 = ("gfx942",)
BOTH = ("gfx942", "gfx950")  # f32/f16/bf16 MFMAs kept unchanged in CDNA4 (one record, both archs)
_SRC = ("AMD CDNA3 ISA ch. 7 Matrix Arithmetic (MFMA operand layouts)",
        "seeds/002 ROCm blog sec. 5.1-5.3")


def mfma_input(role: str, rows: int, cols: int, bits: int, chunk: int | None = None) -> OperandLayout:
    """A (rows=M, cols=K) or B (rows=K, cols=N) of a single-block MFMA; ``chunk`` K-contiguous per run."""
    if role == "a":
        mn, k = rows, cols
    else:
        k, mn = rows, cols
    groups = WAVE // mn
    kpl = mn * k // WAVE
    ch = chunk or kpl

    @closed_form(rows, cols, WAVE, kpl, doc=f"lane%{mn} -> {'row' if role == 'a' else 'col'}; "
                 f"k = (s//{ch})*{ch * groups} + (lane//{mn})*{ch} + s%{ch}")
    def mp(lane, slot):
        kk = (slot // ch) * ch * groups + (lane // mn) * ch + slot % ch
        return (lane % mn, kk) if role == "a" else (kk, lane % mn)

    return OperandLayout(role, mp, bits, -(-kpl * bits // 32))


@closed_form(32, 32, WAVE, 16, doc="32x32 C fragment: row 8*(s//4) + 4*(lane//32) + s%4, col lane%32")
def C32X32(lane, slot):
    return 8 * (slot // 4) + 4 * (lane // 32) + slot % 4, lane % 32


@closed_form(16, 16, WAVE, 4, doc="16x16 C fragment: row 4*(lane//16) + s, col lane%16")
def C16X16(lane, slot):
    return 4 * (lane // 16) + slot, lane % 16


C32 = OperandLayout("c", C32X32, 32, 16)
C16 = OperandLayout("c", C16X16, 32, 4)


def mfma(mnemonic: str, intrinsic: str, m: int, k: int, a_fmt: str, b_fmt: str | None = None, *,
         archs=GFX942, sources=_SRC, notes: str = "") -> InstructionLayout:
    b_fmt = b_fmt or a_fmt
    return InstructionLayout(
        name=mnemonic, vendor="amd", archs=archs, m=m, n=m, k=k, lanes=WAVE,
        a_format=a_fmt, b_format=b_fmt, c_format="fp32",
        a=mfma_input("a", m, k, storage_bits(a_fmt)), b=mfma_input("b", k, m, storage_bits(b_fmt)),
        c=C32 if m == 32 else C16, mnemonic=mnemonic, intrinsic=intrinsic, sources=sources, notes=notes)


# xf32: AMD's 19-bit float (1-8-10, the same bit budget as tf32), passed as fp32 bit patterns,
# two per lane in a 64-bit VGPR pair.  CDNA3 only (removed in CDNA4).
_XF32 = "xf32 inputs are fp32 registers; the hardware uses the tf32-sized (1-8-10) top bits."

_F32_32 = mfma("v_mfma_f32_32x32x2_f32", "__builtin_amdgcn_mfma_f32_32x32x2f32", 32, 2, "fp32", archs=BOTH)
_F32_16 = mfma("v_mfma_f32_16x16x4_f32", "__builtin_amdgcn_mfma_f32_16x16x4f32", 16, 4, "fp32", archs=BOTH)
_F16_32 = mfma("v_mfma_f32_32x32x8_f16", "__builtin_amdgcn_mfma_f32_32x32x8f16", 32, 8, "fp16", archs=BOTH)
_F16_16 = mfma("v_mfma_f32_16x16x16_f16", "__builtin_amdgcn_mfma_f32_16x16x16f16", 16, 16, "fp16", archs=BOTH)
_XF_32 = mfma("v_mfma_f32_32x32x4_xf32", "__builtin_amdgcn_mfma_f32_32x32x4_xf32", 32, 4, "tf32", notes=_XF32)
_XF_16 = mfma("v_mfma_f32_16x16x8_xf32", "__builtin_amdgcn_mfma_f32_16x16x8_xf32", 16, 8, "tf32", notes=_XF32)
_F8_32 = mfma("v_mfma_f32_32x32x16_fp8_fp8", "__builtin_amdgcn_mfma_f32_32x32x16_fp8_fp8", 32, 16, "e4m3fnuz")
_F8_16 = mfma("v_mfma_f32_16x16x32_fp8_fp8", "__builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8", 16, 32, "e4m3fnuz")

# bf16: CDNA3 spells it v_mfma_f32_32x32x8_bf16 (the CDNA2 "_1k" form); the builtin keeps "_1k".
_BF16 = (replace(_F16_32, name="v_mfma_f32_32x32x8_bf16", mnemonic="v_mfma_f32_32x32x8_bf16",
                 intrinsic="__builtin_amdgcn_mfma_f32_32x32x8bf16_1k", a_format="bf16", b_format="bf16"),
         replace(_F16_16, name="v_mfma_f32_16x16x16_bf16", mnemonic="v_mfma_f32_16x16x16_bf16",
                 intrinsic="__builtin_amdgcn_mfma_f32_16x16x16bf16_1k", a_format="bf16", b_format="bf16"))



def fp8_pairs(base: InstructionLayout, fmts=("e4m3fnuz", "e5m2fnuz")) -> tuple:
    """The four A/B pairs (_fp8_fp8, _fp8_bf8, _bf8_fp8, _bf8_bf8) of an fp8 MFMA: dtype-only variants."""
    names = {f: n for f, n in zip(fmts, ("fp8", "bf8"))}
    stem = base.name.rsplit("_", 2)[0]
    out = []
    for fa in fmts:
        for fb in fmts:
            suffix = f"{names[fa]}_{names[fb]}"
            out.append(replace(base, name=f"{stem}_{suffix}", mnemonic=f"{stem}_{suffix}",
                               intrinsic=base.intrinsic.rsplit("_", 2)[0] + "_" + suffix,
                               a_format=fa, b_format=fb))
    return tuple(out)


RECORDS = (_F32_32, _F32_16, _F16_32, _BF16[0], _F16_16, _BF16[1], _XF_32, _XF_16,
           *fp8_pairs(_F8_32), *fp8_pairs(_F8_16))
