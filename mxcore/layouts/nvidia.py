"""NVIDIA ``mma.sync`` (sm_80+, fp8 sm_89+) and ``ldmatrix`` fragment layouts.

Source: PTX ISA, "Matrix Fragments for mma.m16n8k4 / m16n8k8 / m16n8k16 / m16n8k32" (9.7.14.5.x)
and "ldmatrix" (9.7.14.5.15).  The maps are written as CuTe-style thread/value (shape, stride)
pairs over a column-major tile (the facts of CuTe's ``mma_traits_sm80.hpp`` / ``sm89``); the tests
check them against the PTX ISA's closed forms (groupID = lane >> 2, threadID_in_group = lane % 4).
Lane shape (4, 8) with stride (x, 1) means: threadID_in_group steps columns, groupID steps rows.
"""

from __future__ import annotations

from dataclasses import replace

from ._core import InstructionLayout, LdMatrixLayout, OperandLayout, tv_layout

SM80 = ("sm_80", "sm_86", "sm_89", "sm_90")
SM89 = ("sm_89", "sm_90")
_SRC = ("PTX ISA 9.7.14.5 Matrix fragments for mma.sync",)

_LANES16 = ((4, 8), (32, 1))   # 16-row tile: col 2*tig (stride 2*16), row groupID
_LANES16_K1 = ((4, 8), (16, 1))  # 16-row tile: col tig (stride 16), row groupID

# The 16x8 C/D fragment (c0..c3), shared by every m16n8 shape: row g (+8 for c2, c3), col 2*tig (+1).
C16X8 = tv_layout(16, 8, _LANES16, ((2, 2), (16, 8)), doc="16x8 C fragment: row g+8*(s>>1), col 2t+(s&1)")

# m16n8k16 .f16/.bf16: A a0..a7 (row g / g+8, col 2t(+1) / +8), B b0..b3 (row 2t(+1) / +8, col g)
A16X16_F16 = tv_layout(16, 16, _LANES16, ((2, 2, 2), (16, 8, 128)))
B16X8_F16 = tv_layout(16, 8, ((4, 8), (16, 1)), ((2, 2), (8, 64)), nk=True)
# m16n8k8 .f16/.bf16: A a0..a3 like C, B b0, b1 (row 2t+s, col g)
A16X8_F16 = tv_layout(16, 8, _LANES16, ((2, 2), (16, 8)))
B8X8_F16 = tv_layout(8, 8, ((4, 8), (16, 1)), ((2,), (8,)), nk=True)
# m16n8k4 .tf32: A a0 (g, t), a1 (g+8, t); B b0 (t, g)
A16X4_TF32 = tv_layout(16, 4, _LANES16_K1, ((2,), (8,)))
B4X8_TF32 = tv_layout(4, 8, ((4, 8), (8, 1)), ((1,), (0,)), nk=True)
# m16n8k8 .tf32: A a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B b0 (t, g), b1 (t+4, g)
A16X8_TF32 = tv_layout(16, 8, _LANES16_K1, ((2, 2), (8, 64)))
B8X8_TF32 = tv_layout(8, 8, ((4, 8), (8, 1)), ((2,), (32,)), nk=True)
# m16n8k32 .e4m3/.e5m2: A a0..a15 (row g / g+8 per 4, col 4t+(s&3) / +16), B b0..b7 (row 4t+(s&3) / +16, col g)
A16X32_F8 = tv_layout(16, 32, ((4, 8), (64, 1)), ((4, 2, 2), (16, 8, 256)))
B32X8_F8 = tv_layout(32, 8, ((4, 8), (32, 1)), ((4, 2), (8, 128)), nk=True)


def _op(role, mp, bits):
    return OperandLayout(role, mp, bits, mp.slots * bits // 32)


C_F32 = _op("c", C16X8, 32)
C_F16 = _op("c", C16X8, 16)  # .f16 accumulator: c0,c1 in register 0 (low, high), c2,c3 in register 1

_PTX_TYPE = {"fp16": "f16", "bf16": "bf16", "tf32": "tf32", "fp32": "f32", "e4m3fn": "e4m3", "e5m2": "e5m2"}


def _mma(shape: str, a_fmt: str, b_fmt: str, c_fmt: str, a, b, archs=SM80) -> InstructionLayout:
    m, n, k = (int(x) for x in shape[1:].replace("n", " ").replace("k", " ").split())
    ta, tb, tc = _PTX_TYPE[a_fmt], _PTX_TYPE[b_fmt], _PTX_TYPE[c_fmt]
    name = f"mma.sync.aligned.{shape}.row.col.{tc}.{ta}.{tb}.{tc}"
    alias = f"{shape}.{ta}" if ta == tb else f"{shape}.{ta}.{tb}"
    if c_fmt == "fp16":
        alias += ".f16acc"
    return InstructionLayout(
        name=name, vendor="nvidia", archs=archs, m=m, n=n, k=k, lanes=32,
        a_format=a_fmt, b_format=b_fmt, c_format=c_fmt, a=a, b=b,
        c=C_F16 if c_fmt == "fp16" else C_F32,
        mnemonic=name, ptx=name, alias=alias, sources=_SRC)


_K16_F16 = _mma("m16n8k16", "fp16", "fp16", "fp32", _op("a", A16X16_F16, 16), _op("b", B16X8_F16, 16))
_K8_F16 = _mma("m16n8k8", "fp16", "fp16", "fp32", _op("a", A16X8_F16, 16), _op("b", B8X8_F16, 16))
_K4_TF32 = _mma("m16n8k4", "tf32", "tf32", "fp32", _op("a", A16X4_TF32, 32), _op("b", B4X8_TF32, 32))
_K8_TF32 = _mma("m16n8k8", "tf32", "tf32", "fp32", _op("a", A16X8_TF32, 32), _op("b", B8X8_TF32, 32))
_K32_F8 = _mma("m16n8k32", "e4m3fn", "e4m3fn", "fp32", _op("a", A16X32_F8, 8), _op("b", B32X8_F8, 8), SM89)


def _variant(base: InstructionLayout, a_fmt: str, b_fmt: str, c_fmt: str) -> InstructionLayout:
    """A dtype-only variant: same maps, other element formats (and the f16 accumulator's C)."""
    shape = base.name.split(".")[3]
    fresh = _mma(shape, a_fmt, b_fmt, c_fmt, base.a, base.b, base.archs)
    return replace(base, name=fresh.name, mnemonic=fresh.mnemonic, ptx=fresh.ptx, alias=fresh.alias,
                   a_format=a_fmt, b_format=b_fmt, c_format=c_fmt, c=fresh.c)


RECORDS = (
    _K8_F16,
    _variant(_K8_F16, "fp16", "fp16", "fp16"),
    _variant(_K8_F16, "bf16", "bf16", "fp32"),
    _K16_F16,
    _variant(_K16_F16, "fp16", "fp16", "fp16"),
    _variant(_K16_F16, "bf16", "bf16", "fp32"),
    _K4_TF32,
    _K8_TF32,
    _K32_F8,
    _variant(_K32_F8, "e4m3fn", "e5m2", "fp32"),
    _variant(_K32_F8, "e5m2", "e4m3fn", "fp32"),
    _variant(_K32_F8, "e5m2", "e5m2", "fp32"),
)


# ---- ldmatrix (PTX ISA 9.7.14.5.15): lane l receives, per matrix j in register j, row l>>2 and
# columns 2*(l&3), 2*(l&3)+1 (low half first); with .trans the stored matrix is read column-wise,
# so lane l gets column l>>2, rows 2*(l&3) and 2*(l&3)+1.
def _ldm_rows(lane, slot):
    return slot // 2, lane // 4, 2 * (lane % 4) + slot % 2


def _ldm_trans(lane, slot):
    return slot // 2, 2 * (lane % 4) + slot % 2, lane // 4


def _ldmatrix(num: int, trans: bool) -> LdMatrixLayout:
    name = f"ldmatrix.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16"
    return LdMatrixLayout(name=name, num=num, trans=trans, map_fn=_ldm_trans if trans else _ldm_rows,
                          ptx=name, sources=("PTX ISA 9.7.14.5.15 ldmatrix",))


LDMATRIX = tuple(_ldmatrix(num, trans) for num in (1, 2, 4) for trans in (False, True))
