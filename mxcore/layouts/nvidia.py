"""NVIDIA ``mma.sync`` (sm_80+, fp8 sm_89+) and ``ldmatrix`` fragment layouts.

Source: PTX ISA, "Matrix Fragments for mma.m16n8k4 / m16n8k8 / m16n8k16 / m16n8k32" (9.7.14.5.x)
and "ldmatrix" (9.7.14.5.15).  The maps are written as CuTe-style thread/value (shape, stride)
pairs over a column-major tile (the facts of CuTe's ``mma_traits_sm80.hpp`` / ``sm89``); the tests
check them against the PTX ISA's closed forms (groupID = lane >> 2, threadID_in_group = lane % 4).
Lane shape (4, 8) with stride (x, 1) means: threadID_in_group steps columns, groupID steps rows.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from .. import dtypes as _dt
from ..dtypes import bits as _bits
from ..errors import LayoutError
from ._core import InstructionLayout, LdMatrixLayout, Map, OperandLayout, tv_layout

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

# PTX spelling of each element format (mma.sync, wgmma and cvt operand types)
PTX_TYPE = {"fp16": "f16", "bf16": "bf16", "tf32": "tf32", "fp32": "f32", "e4m3fn": "e4m3", "e5m2": "e5m2",
            "e3m2": "e3m2", "e2m3": "e2m3", "e2m1": "e2m1"}


def _mma(shape: str, a_fmt: str, b_fmt: str, c_fmt: str, a, b, archs=SM80) -> InstructionLayout:
    m, n, k = (int(x) for x in shape[1:].replace("n", " ").replace("k", " ").split())
    ta, tb, tc = PTX_TYPE[a_fmt], PTX_TYPE[b_fmt], PTX_TYPE[c_fmt]
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


# ---- sm_120a block-scaled mma.sync (RTX 50 / Blackwell consumer; also sm_121a)
# PTX ISA 9.7.14.3 "Block Scaling for mma.sync" and the mma syntax:
#   mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.atype.btype.f32.ue8m0
#       d, a, b, c, scale-a-data, {byte-id-a, thread-id-a}, scale-b-data, {byte-id-b, thread-id-b};
#   D = (A * scale_A) (B * scale_B) + C; scale_A is M x SFA_N (1X: M x 1, 2X: M x 2), scale_B SFB_M x N,
#   each element scaling one 32-K chunk of a row of A / column of B (Table 35/36: mxf8f6f4 -> 1X ue8m0;
#   mxf4 -> 2X ue8m0; mxf4nvf4 -> 2X ue8m0 or 4X).
# A/B fragments: .kind::mxf8f6f4 m16n8k32 uses the fp8 m16n8k32 maps above (A16X32_F8, B32X8_F8) for every
# format, one element per byte (PTX ISA 9.7.14.5.x m16n8k32); fp6 codes sit in the byte's low 6 bits and
# fp4 codes in bits [5:2] (CUTLASS mma_traits_sm120.hpp fp4_shift_A/B: "MMA F8F6F4 expects the four-bit
# data to be in the middle of the eight-bit container ... NOT needed for FP6 and FP8"; an e2m1 code at
# [5:2] is the e2m3 code of the same value).  .kind::mxf4(nvf4) m16n8k64 uses the packed e2m1 maps of
# PTX ISA "Matrix Fragments for mma.m16n8k64": A row g (+8 for a8-a15, a24-a31), col 8t + (i & 7)
# (+32 for i >= 16); B row 8t + (i & 7) (+32 for i >= 8), col g; eight 4-bit codes per register.
# Scales: only some lanes supply them (a partial map).  With (byte-id, thread-id) = (b, t):
#   scale_A row m <- lane 4*(m % 8) + 2*t + m // 8, K block j in byte b + j   (t in {0, 1})
#   scale_B col n <- lane 4*n + t, K block j in byte b + j
# Sources: CUTLASS mma_traits_sm120.hpp SFALayout ((2,2,8):(8,0,1)) / SFBLayout ((4,8):(0,1)) for
# thread-id 0 (the same thread modes for 16x8x32 1X and 16x8x64 2X); two independent hardware probes in
# public repositories (an sm_121a oracle test: "row g -> thread (g, t=0) byte0, row g+8 -> thread (g, t=1),
# col g -> thread (g, t=0)"; an sm_120 header: "A: row m <- lane 4*(m % 8) + 2*tid + (m / 8), B: col n <-
# lane 4*n + tid, byte bid").  2X: the two K blocks in consecutive bytes from byte-id (public sm_120 code
# packs the pair in the low 16 bits for byte-id 0).  Not run on sm_120 hardware here (no such GPU).
SM120A = ("sm_120a", "sm_121a")
_SRC_SM120 = ("PTX ISA 9.7.14.3 Block Scaling for mma.sync; mma syntax (.kind, .block_scale, .scale_vec)",
              "PTX ISA 9.7.14.5 Matrix fragments for mma.m16n8k32 / mma.m16n8k64",
              "CUTLASS cute/atom/mma_traits_sm120.hpp (SFALayout, SFBLayout, fp4_shift_A/B)",
              "public sm_120/sm_121a scale-lane probes (see mxcore/layouts/nvidia.py)")
MX_FORMATS = tuple(dict.fromkeys(_dt.MX_ELEMENT.values()))  # OCP MX element formats (.kind::mxf8f6f4 takes each)
_BYTE_SHIFT = {8: 0, 6: 0, 4: 2}  # LSB of the code inside its byte container (.kind::mxf8f6f4)
# kind -> (shape, scale_vec, allowed A/B formats)
BLOCK_SCALED_KINDS = {
    "mxf8f6f4": ("m16n8k32", "1X", MX_FORMATS),
    "mxf4": ("m16n8k64", "2X", ("e2m1",)),
    "mxf4nvf4": ("m16n8k64", "2X", ("e2m1",)),
}

# m16n8k64 e2m1 (packed, 8 per register): A a0..a31, B b0..b15 as in the PTX ISA text above
A16X64_F4 = tv_layout(16, 64, ((4, 8), (128, 1)), ((8, 2, 2), (16, 8, 512)))
B64X8_F4 = tv_layout(64, 8, ((4, 8), (64, 1)), ((8, 2), (8, 256)), nk=True)


def _mx_input(role: str, mp, fmt: str, container: bool) -> OperandLayout:
    bits = _bits(fmt)
    if not container:  # packed e2m1 (kind::mxf4*)
        return OperandLayout(role, mp, bits, mp.slots * bits // 32)
    offs = tuple(8 * s + _BYTE_SHIFT[bits] for s in range(mp.slots))
    return OperandLayout(role, mp, bits, mp.slots // 4, bit_offsets=offs)


def _scale_map(role: str, rows_or_cols: int, nb: int, thread: int) -> OperandLayout:
    if role == "scale_a":
        def fn(lane, slot):
            g, t = lane // 4, lane % 4 - 2 * thread
            held = (t == 0) | (t == 1)
            return np.where(held, g + 8 * t, -1), np.where(held, slot, -1)
        mp = Map(rows_or_cols, nb, 32, nb, fn,
                 f"scale_A row (lane>>2) + 8*((lane&3) - {2 * thread}) from lanes with lane&3 in "
                 f"{{{2 * thread},{2 * thread + 1}}}, K block = slot", partial=True)
    else:
        def fn(lane, slot):
            held = lane % 4 == thread
            return np.where(held, slot, -1), np.where(held, lane // 4, -1)
        mp = Map(nb, rows_or_cols, 32, nb, fn,
                 f"scale_B col lane>>2 from lanes with lane&3 == {thread}, K block = slot", partial=True)
    return mp


@lru_cache(maxsize=None)
def block_scaled(kind: str, a_fmt: str, b_fmt: str, byte_a: int = 0, thread_a: int = 0,
                 byte_b: int = 0, thread_b: int = 0) -> InstructionLayout:
    """The sm_120a block-scaled mma.sync record for ``kind`` (mxf8f6f4, mxf4, mxf4nvf4), formats and
    scale selectors ({byte-id, thread-id} of scale_A and scale_B)."""
    if kind not in BLOCK_SCALED_KINDS:
        raise LayoutError(f"block-scaled mma kind {kind!r}: use one of {', '.join(BLOCK_SCALED_KINDS)}")
    shape, vec, fmts = BLOCK_SCALED_KINDS[kind]
    for f in (a_fmt, b_fmt):
        if f not in fmts:
            raise LayoutError(f"kind::{kind}: format {f!r} is not an operand format; use one of {', '.join(fmts)}")
    nb = int(vec[0])
    if not (0 <= byte_a <= 4 - nb and 0 <= byte_b <= 4 - nb and byte_a % nb == 0 and byte_b % nb == 0):
        raise LayoutError(f"{kind} scale_vec::{vec}: byte-id must be one of {list(range(0, 4, nb))}, "
                          f"got ({byte_a}, {byte_b})")
    if thread_a not in (0, 1) or thread_b not in (0, 1, 2, 3):
        raise LayoutError(f"{kind}: thread-id-a must be 0 or 1 and thread-id-b 0..3, got ({thread_a}, {thread_b})")
    ta, tb = PTX_TYPE[a_fmt], PTX_TYPE[b_fmt]
    ptx = (f"mma.sync.aligned.{shape}.row.col.kind::{kind}.block_scale.scale_vec::{vec}"
           f".f32.{ta}.{tb}.f32.ue8m0")
    if shape == "m16n8k32":
        a, b = _mx_input("a", A16X32_F8, a_fmt, True), _mx_input("b", B32X8_F8, b_fmt, True)
    else:
        a, b = _mx_input("a", A16X64_F4, a_fmt, False), _mx_input("b", B64X8_F4, b_fmt, False)
    k = int(shape.split("k")[1])
    sa = OperandLayout("scale_a", _scale_map("scale_a", 16, nb, thread_a), 8, 1,
                       bit_offsets=tuple(8 * (byte_a + j) for j in range(nb)))
    sb = OperandLayout("scale_b", _scale_map("scale_b", 8, nb, thread_b), 8, 1,
                       bit_offsets=tuple(8 * (byte_b + j) for j in range(nb)))
    alias = f"{shape}.{kind}" + (f".{ta}.{tb}" if kind == "mxf8f6f4" else "")
    return InstructionLayout(
        name=ptx.lower(), vendor="nvidia", archs=SM120A, m=16, n=8, k=k, lanes=32,
        a_format=a_fmt, b_format=b_fmt, c_format="fp32", a=a, b=b, c=C_F32,
        mnemonic=ptx, ptx=ptx, alias=alias, scale_a=sa, scale_b=sb, scale_format="e8m0", scale_block=32,
        scale_opsel=(byte_a, byte_b), scale_thread=(thread_a, thread_b), sources=_SRC_SM120,
        notes="operands after c: scale-a-data, {byte-id-a, thread-id-a}, scale-b-data, {byte-id-b, thread-id-b}")


BLOCK_SCALED = tuple(block_scaled(kind, fa, fb) for kind, (_, _, fmts) in BLOCK_SCALED_KINDS.items()
                     for fa in fmts for fb in fmts)
RECORDS = RECORDS + BLOCK_SCALED
