"""The instruction emulator against an independent float64 A@B+C, for every instruction and format.

Inputs are exactly representable and small (codes whose values lie in 2^-3..2^4, values that are
small integers times small powers of two), so the float64 reference sum is exact and rounding
once to fp32 gives the bit-exact expected D whatever order the hardware sums in.  Element codes
are decoded here with ml_dtypes directly (independent of mxcore.formats).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from mxcore import emulate, layouts
from mxcore.errors import InputTypeError, LayoutError, ShapeError

ALL = layouts.records()
REGISTER_FED = [r for r in ALL if not isinstance(r, layouts.WgmmaLayout)]  # wgmma (B in shared memory): test_wgmma_*.py


def lid(lay):
    return lay.key

ML = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
      "e5m2fnuz": ml_dtypes.float8_e5m2fnuz, "e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn,
      "e2m1": ml_dtypes.float4_e2m1fn, "e8m0": ml_dtypes.float8_e8m0fnu}
NBITS = {"e2m3": 6, "e3m2": 6, "e2m1": 4}


def code_values(fmt):
    n = 1 << NBITS.get(fmt, 8)
    codes = np.arange(n, dtype=np.uint8)
    vals = codes.view(ML[fmt]).astype(np.float64)
    ok = np.isfinite(vals) & ((vals == 0) | ((np.abs(vals) >= 0.125) & (np.abs(vals) <= 16)))
    return codes[ok], vals[ok]


def random_tile(rng, fmt, shape):
    """(register-ready tile, exact float64 values) for an operand tile in ``fmt``."""
    if fmt in ML:
        codes, vals = code_values(fmt)
        idx = rng.integers(0, len(codes), size=shape)
        return codes[idx], vals[idx]
    v = rng.integers(-8, 9, size=shape) * np.exp2(rng.integers(-3, 4, size=shape))
    return v.astype(np.float32 if fmt != "fp16" else np.float16), v


@pytest.mark.parametrize("lay", REGISTER_FED, ids=lid)
def test_execute_matches_float64_reference(lay, rng):
    A, A64 = random_tile(rng, lay.a_format, (lay.m, lay.k))
    B, B64 = random_tile(rng, lay.b_format, (lay.k, lay.n))
    C, C64 = random_tile(rng, lay.c_format, (lay.m, lay.n))
    kw = {}
    if lay.scaled:
        nb = lay.k // 32  # a different scale per (row, block) and (block, col): reveals the K grouping
        sa = rng.integers(124, 131, size=(lay.m, nb)).astype(np.uint8)
        sb = rng.integers(124, 131, size=(nb, lay.n)).astype(np.uint8)
        kw = dict(scale_a=emulate.scatter(lay, "scale_a", sa), scale_b=emulate.scatter(lay, "scale_b", sb))
        A64 = A64 * np.repeat(np.exp2(sa.astype(float) - 127), 32, axis=1)
        B64 = B64 * np.repeat(np.exp2(sb.astype(float) - 127), 32, axis=0)
    regs = [emulate.scatter(lay, r, t) for r, t in (("a", A), ("b", B), ("c", C))]
    for r, t, reg in zip("abc", (A, B, C), regs):
        assert np.array_equal(emulate.gather(lay, r, reg), t)
    d = emulate.execute(lay, *regs, **kw)
    assert d.shape == (lay.lanes, lay.c.slots)
    want = (A64 @ B64 + C64).astype(np.float16 if lay.c_format == "fp16" else np.float32)
    got = emulate.gather(lay, "d", d)
    assert got.dtype == want.dtype
    assert np.array_equal(got, want)


def test_one_rounding_of_the_exact_sum():
    lay = layouts.get("v_mfma_f32_32x32x2_f32")
    A = np.zeros((32, 2), np.float32)
    B = np.zeros((2, 32), np.float32)
    C = np.zeros((32, 32), np.float32)
    A[0] = [1.0, 2.0**-24]
    B[:, 0] = [1.0, 1.0]
    C[0, 0] = 2.0**-80  # float64 sum gives the tie 1 + 2^-24, the exact sum lies above it
    d = emulate.execute(lay, *(emulate.scatter(lay, r, t) for r, t in zip("abc", (A, B, C))))
    assert emulate.gather(lay, "d", d)[0, 0] == np.nextafter(np.float32(1), np.float32(2))
    C[0, 0] = -(2.0**-80)
    d = emulate.execute(lay, *(emulate.scatter(lay, r, t) for r, t in zip("abc", (A, B, C))))
    assert emulate.gather(lay, "d", d)[0, 0] == np.float32(1)


def test_scales_follow_op_sel_independent_layout():
    # the same codes give the same D whichever byte op_sel picks: the byte is a register detail
    base = layouts.get("v_mfma_scale_f32_16x16x128_f8f6f4", a_format="fp4", b_format="fp4")
    moved = layouts.get("v_mfma_scale_f32_16x16x128_f8f6f4", a_format="fp4", b_format="fp4", scale_opsel=(3, 1))
    rng = np.random.default_rng(7)
    regs = [rng.integers(0, 16, size=(64, 32)).astype(np.uint8) for _ in range(2)]
    c = np.zeros((64, 4), np.float32)
    sa = rng.integers(120, 135, size=(64, 1)).astype(np.uint8)
    sb = rng.integers(120, 135, size=(64, 1)).astype(np.uint8)
    d0 = emulate.execute(base, *regs, c, scale_a=sa, scale_b=sb)
    d1 = emulate.execute(moved, *regs, c, scale_a=sa, scale_b=sb)
    assert np.array_equal(d0, d1)
    w = emulate.pack(moved, "scale_a", sa)
    assert np.array_equal(w[:, 0], sa[:, 0].astype(np.uint32) << 24)
    assert np.array_equal(emulate.unpack(moved, "scale_a", w), sa)


@pytest.mark.parametrize("lay", [l for l in ALL if l.cbsz is None or l.a_format == l.b_format], ids=lid)
def test_pack_unpack_round_trip(lay, rng):
    for role, op in lay.operands().items():
        fmt = lay.format_of(role)
        tile, _ = random_tile(rng, fmt, op.shape)
        regs = emulate.scatter(lay, role, tile)
        words = emulate.pack(lay, role, regs)
        assert words.shape == (lay.lanes, op.registers) and words.dtype == np.uint32
        back = emulate.unpack(lay, role, words)
        assert np.array_equal(back.astype(np.float64), regs.astype(np.float64))


def test_fp6_dense_packing():
    lay = layouts.get("v_mfma_f32_32x32x64_f8f6f4", a_format="fp6", b_format="fp6")
    regs = np.tile(np.arange(32, dtype=np.uint8) % 64, (64, 1))
    words = emulate.pack(lay, "a", regs)
    big = sum(int(w) << (32 * r) for r, w in enumerate(words[0]))
    assert big == sum(s << (6 * s) for s in range(32))  # slot s at bits [6s, 6s+6) of v0..v5
    assert words.shape == (64, 6)


def test_ldmatrix_emulation():
    for name in layouts.names(kind="ldmatrix"):
        ldm = layouts.get(name)
        mats = np.arange(ldm.num * 64).reshape(ldm.num, 8, 8)
        got = emulate.ldmatrix(ldm, mats)
        assert got.shape == (32, 2 * ldm.num)
        lane = 9  # groupID 2, thread-in-group 1
        want = mats[:, 2, 2:4] if not ldm.trans else mats[:, 2:4, 2]
        assert np.array_equal(got[lane], want.reshape(-1))


def test_input_checks():
    lay = layouts.get("m16n8k32.e4m3")
    a = np.zeros((32, 16), np.float32)
    with pytest.raises(InputTypeError, match="codes"):
        emulate.execute(lay, a, np.zeros((32, 8), np.uint8), np.zeros((32, 4), np.float32))
    with pytest.raises(ShapeError):
        emulate.gather(lay, "a", np.zeros((32, 15), np.uint8))
    scaled = layouts.get("v_mfma_scale_f32_32x32x64_f8f6f4")
    with pytest.raises(ShapeError, match="scale"):
        emulate.execute(scaled, np.zeros((64, 32), np.uint8), np.zeros((64, 32), np.uint8),
                        np.zeros((64, 16), np.float32))


def test_register_shapes_named():
    lay = layouts.get("m16n8k16.f16")
    c = np.zeros((32, 4), np.float32)
    with pytest.raises(LayoutError, match=r"operand a registers must have shape \(lanes, slots\) = \(32, 8\), "
                                          r"got an array of shape \(32, 3\)") as info:
        emulate.execute(lay, np.zeros((32, 3)), np.zeros((32, 4)), c)
    assert isinstance(info.value, ShapeError)
    with pytest.raises(LayoutError, match=r"operand c .*\(32, 4\), got an array of shape \(4, 32\)"):
        emulate.execute(lay, np.zeros((32, 8)), np.zeros((32, 4)), c.T)
    with pytest.raises(LayoutError, match=r"operand b .*\(32, 4\)"):
        emulate.pack(lay, "b", np.zeros((32, 5)))
    scaled = layouts.get("v_mfma_scale_f32_32x32x64_f8f6f4")
    codes = np.zeros((64, 32), np.uint8)
    with pytest.raises(LayoutError, match=r"operand scale_a .*\(64, 1\), got an array of shape \(64,\)"):
        emulate.execute(scaled, codes, codes, np.zeros((64, 16), np.float32),
                        scale_a=np.zeros(64, np.uint8), scale_b=np.zeros((64, 1), np.uint8))


def test_ldmatrix_is_not_an_mma():
    ldm = layouts.get("ldmatrix.x1")
    with pytest.raises(LayoutError, match=r"movement layout.*emulate\.ldmatrix"):
        emulate.execute(ldm, np.zeros((32, 2)), np.zeros((32, 2)), np.zeros((32, 2)))
    with pytest.raises(LayoutError, match="movement layout"):
        emulate.gather(ldm, "a", np.zeros((32, 2)))
    with pytest.raises(LayoutError, match="needs an ldmatrix layout"):
        emulate.ldmatrix(layouts.get("m16n8k16.f16"), np.zeros((1, 8, 8)))


@pytest.mark.parametrize("fa", ["e4m3fn", "e3m2", "e2m1"])
@pytest.mark.parametrize("fb", ["e5m2", "e2m3", "e2m1"])
def test_sm120_block_scale_registers_built_from_the_ptx_text(fa, fb, rng):
    """Registers filled by the PTX ISA m16n8k32 formulas and the scale-lane formula (not by the table):
    A a_i of lane 4g+t is A[g + 8*((i >> 2) & 1)][4t + (i & 3) + 16*(i >> 3)], B b_i = B[4t + (i & 3) +
    16*(i >> 2)][g]; scale_A row m from lane 4*(m % 8) + m // 8, scale_B col n from lane 4n (selectors 0)."""
    t = {"e4m3fn": "e4m3", "e5m2": "e5m2", "e3m2": "e3m2", "e2m3": "e2m3", "e2m1": "e2m1"}
    lay = layouts.get(f"m16n8k32.mxf8f6f4.{t[fa]}.{t[fb]}")
    A, A64 = random_tile(rng, fa, (16, 32))
    B, B64 = random_tile(rng, fb, (32, 8))
    sa = rng.integers(120, 135, size=(16, 1)).astype(np.uint8)
    sb = rng.integers(120, 135, size=(1, 8)).astype(np.uint8)
    ra, rb = np.zeros((32, 16), np.uint8), np.zeros((32, 8), np.uint8)
    rsa, rsb = np.full((32, 1), 255, np.uint8), np.full((32, 1), 255, np.uint8)  # NaN scales in unused lanes
    for lane in range(32):
        g, tt = lane >> 2, lane & 3
        for i in range(16):
            ra[lane, i] = A[g + 8 * ((i >> 2) & 1), 4 * tt + (i & 3) + 16 * (i >> 3)]
        for i in range(8):
            rb[lane, i] = B[4 * tt + (i & 3) + 16 * (i >> 2), g]
    for m in range(16):
        rsa[4 * (m % 8) + m // 8, 0] = sa[m, 0]
    for n in range(8):
        rsb[4 * n, 0] = sb[0, n]
    c = np.zeros((32, 4), np.float32)
    d = emulate.execute(lay, ra, rb, c, scale_a=rsa, scale_b=rsb)
    want = ((A64 * np.exp2(sa - 127.0)) @ (B64 * np.exp2(sb - 127.0))).astype(np.float32)
    assert np.array_equal(emulate.gather(lay, "d", d), want)
    # register words: one element per byte, fp4 codes shifted into bits [5:2]
    words = emulate.pack(lay, "a", ra)
    shift = 2 if fa == "e2m1" else 0
    for lane in (0, 13, 31):
        want_w = [sum(int(ra[lane, 4 * r + j]) << (8 * j + shift) for j in range(4)) for r in range(4)]
        assert words[lane].tolist() == want_w
    assert np.array_equal(emulate.unpack(lay, "a", words), ra)


def test_sm120_mxf4_two_scale_blocks():
    """kind::mxf4 scale_vec::2X: K 0..31 scaled by byte byte-id, K 32..63 by byte byte-id + 1."""
    from mxcore.layouts import nvidia

    lay = nvidia.block_scaled("mxf4", "e2m1", "e2m1", 2, 1, 2, 3)
    A = np.full((16, 64), 0x2, np.uint8)  # e2m1 1.0
    B = np.full((64, 8), 0x2, np.uint8)
    sa = np.stack([np.full(16, 127), np.full(16, 129)], axis=1).astype(np.uint8)  # 1 and 4
    sb = np.stack([np.full(8, 128), np.full(8, 127)], axis=0).astype(np.uint8)    # 2 and 1
    d = emulate.execute(lay, emulate.scatter(lay, "a", A), emulate.scatter(lay, "b", B), np.zeros((32, 4), np.float32),
                        scale_a=emulate.scatter(lay, "scale_a", sa), scale_b=emulate.scatter(lay, "scale_b", sb))
    assert (emulate.gather(lay, "d", d) == 32 * 1 * 2 + 32 * 4 * 1).all()
    words = emulate.pack(lay, "scale_a", emulate.scatter(lay, "scale_a", sa))
    assert words[2, 0] == (127 << 16 | 129 << 24) and words[0, 0] == 0  # lane 2 = row 0 (thread-id-a 1)


@pytest.mark.parametrize("fmt,x,want", [
    ("bf16", 1 + 2.0 ** -8 + 2.0 ** -30, 1 + 2.0 ** -7),    # just above a bf16 midpoint: rounds up, once
    ("tf32", 1 + 2.0 ** -11 + 2.0 ** -30, 1 + 2.0 ** -10),
    ("fp16", 1 + 2.0 ** -11 + 2.0 ** -30, 1 + 2.0 ** -10),
    ("fp32", 1 + 2.0 ** -24 + 2.0 ** -40, 1 + 2.0 ** -23),
])
def test_value_registers_round_float64_once(fmt, x, want):
    """Through float32 first, the value would land on the midpoint and round to even (down)."""
    got = emulate.decode_regs(fmt, np.array([x, -x]))
    assert got.tolist() == [want, -want]


@pytest.mark.parametrize("fmt", ["fp32", "tf32", "fp16", "bf16"])
def test_value_registers_keep_ieee_specials(fmt):
    got = emulate.decode_regs(fmt, np.array([np.inf, -np.inf, np.nan, 2.0 ** 130]))
    assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2]) and got[3] == np.inf


def test_pack_rounds_bf16_once():
    lay = layouts.get("m16n8k16.bf16")
    regs = np.full((lay.lanes, lay.a.slots), 1 + 2.0 ** -8 + 2.0 ** -30)
    words = emulate.pack(lay, "a", regs)
    assert (words == 0x3F813F81).all()  # bf16 1.0078125 = 0x3F81 in both halves
