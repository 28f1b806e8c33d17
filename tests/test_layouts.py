"""The layout database against independent oracles transcribed from the PTX ISA / CDNA ISA texts.

The oracle formulas below are written here from the documents (never imported from mxcore):
PTX ISA 9.7.14.5 "Matrix fragments for mma.m16n8k{4,8,16,32}" and "ldmatrix"; the CDNA3 ISA
ch. 7 / AMD matrix instruction calculator rule (A[i][k] in lane i + M*(k // kpl), slot k % kpl;
D[i][j] of 32x32 in lane j + 32*((i//4) % 2), slot 4*(i//8) + i%4); the CDNA4 ISA 7.1.4 (4- and
6-bit packing), 7.1.5.1 "Dense Matrix Layouts: 8-bit and Smaller" (per-lane K tables for FP4, FP6,
FP8, BF16) and 7.2.1 (scale data layout, OPSEL byte codes); the seed's HIP code for 32x32x64
fp8/fp4 (ROCm blog sec. 5.4-5.5); composable_kernel's mx_mfma_op register tables for 16x16x128
and its gfx950 scale-mapping probe output (test/mx_mfma_op/scale_mapping_*.txt).
"""

from __future__ import annotations

import numpy as np
import pytest

from mxcore import layouts
from mxcore.errors import LayoutError, UnknownNameError

F8F6F4 = ("e4m3fn", "e5m2", "e2m3", "e3m2", "e2m1")


# every register-fed record (f8f6f4 once per A/B format pair); wgmma: tests/test_layouts_hopper.py
ALL = [r for r in layouts.records() if not isinstance(r, layouts.WgmmaLayout)]


def lid(lay):
    return lay.key


# ------------------------------------------------------------------ oracles: element -> (lane, slot)
def ptx_oracle(lay, role):
    """{(row, col): (lane, slot)} from the PTX ISA fragment descriptions."""
    shape = lay.name.split(".")[3]
    ta = lay.name.split(".")[7]
    if lay.scaled:  # sm_120a block_scale: A/B as the m16n8k32 / m16n8k64 fragments, scales below
        return ptx_block_scale_oracle(lay, role) if role.startswith("scale") or shape == "m16n8k64" else \
            ptx_oracle_unscaled(lay, role, shape, ta)
    return ptx_oracle_unscaled(lay, role, shape, ta)


def ptx_block_scale_oracle(lay, role):
    """PTX ISA "Matrix Fragments for mma.m16n8k64" (e2m1 A a0..a31, B b0..b15) and the scale lanes:
    scale_A row m from lane 4*(m % 8) + 2*thread-id-a + m // 8, scale_B col n from lane 4*n + thread-id-b,
    K block j in slot j (byte byte-id + j).  (CUTLASS mma_traits_sm120.hpp SFALayout/SFBLayout for
    thread-id 0; public sm_120 / sm_121a hardware probes for the lane formula.)"""
    out = {}
    tid_a, tid_b = lay.scale_thread
    nb = lay.k // 32
    if role == "scale_a":
        for m in range(16):
            for j in range(nb):
                out[(m, j)] = (4 * (m % 8) + 2 * tid_a + m // 8, j)
        return out
    if role == "scale_b":
        for n in range(8):
            for j in range(nb):
                out[(j, n)] = (4 * n + tid_b, j)
        return out
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        if role == "c":
            for i in range(4):
                out[(g if i < 2 else g + 8, t * 2 + (i & 1))] = (lane, i)
        elif role == "a":
            for i in range(32):
                row = g if (i < 8 or 16 <= i < 24) else g + 8
                col = t * 8 + (i & 7) + (32 if i >= 16 else 0)
                out[(row, col)] = (lane, i)
        else:
            for i in range(16):
                out[(t * 8 + (i & 7) + (32 if i >= 8 else 0), g)] = (lane, i)
    return out


def ptx_oracle_unscaled(lay, role, shape, ta):
    out = {}
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        if role == "c":
            for i in range(lay.c.slots):
                out[(g if i < 2 else g + 8, t * 2 + (i & 1))] = (lane, i)
        elif shape == "m16n8k16" and role == "a":
            for i in range(8):
                row = g if i in (0, 1, 4, 5) else g + 8
                col = t * 2 + (i & 1) + (8 if i >= 4 else 0)
                out[(row, col)] = (lane, i)
        elif shape == "m16n8k16" and role == "b":
            for i in range(4):
                out[(t * 2 + (i & 1) + (8 if i >= 2 else 0), g)] = (lane, i)
        elif shape == "m16n8k8" and ta in ("f16", "bf16"):
            if role == "a":
                for i in range(4):
                    out[(g if i < 2 else g + 8, t * 2 + (i & 1))] = (lane, i)
            else:
                for i in range(2):
                    out[(t * 2 + i, g)] = (lane, i)
        elif shape == "m16n8k4":  # tf32
            if role == "a":
                out[(g, t)] = (lane, 0)
                out[(g + 8, t)] = (lane, 1)
            else:
                out[(t, g)] = (lane, 0)
        elif shape == "m16n8k8":  # tf32
            if role == "a":
                for i in range(4):
                    out[(g if i in (0, 2) else g + 8, t if i < 2 else t + 4)] = (lane, i)
            else:
                out[(t, g)] = (lane, 0)
                out[(t + 4, g)] = (lane, 1)
        elif shape == "m16n8k32":
            if role == "a":
                for i in range(16):
                    row = g if (i < 4 or 8 <= i < 12) else g + 8
                    col = t * 4 + (i & 3) + (16 if i >= 8 else 0)
                    out[(row, col)] = (lane, i)
            else:
                for i in range(8):
                    out[(t * 4 + (i & 3) + (16 if i >= 4 else 0), g)] = (lane, i)
        else:
            raise AssertionError(f"no oracle for {lay.name} {role}")
    return out


def cdna_oracle(lay, role):
    """{(row, col): (lane, slot)} from the CDNA ISA / calculator rule, the seed code and CK's tables."""
    m, k = lay.m, lay.k
    out = {}
    if role == "c":
        for i in range(m):
            for j in range(m):
                if m == 32:
                    out[(i, j)] = (j + 32 * ((i // 4) % 2), 4 * (i // 8) + i % 4)
                else:
                    out[(i, j)] = (j + 16 * (i // 4), i % 4)
        return out
    if role in ("scale_a", "scale_b"):  # ISA 7.2.1 scale data layout: lane l <-> (row l % M, K block l // M)
        for i in range(m):
            for kb in range(k // 32):
                out[(i, kb) if role == "scale_a" else (kb, i)] = (i + m * kb, 0)
        return out
    fmt = lay.a_format if role == "a" else lay.b_format
    for lane in range(64):
        for s in range(lay.operand(role).slots):
            if lay.cbsz is None:  # classic MFMA: lane i + M*(k // kpl), slot k % kpl (CDNA4 ISA 7.1.4.1, 7.1.5.1 BF16)
                kpl = m * k // 64
                kk = (lane // m) * kpl + s
            elif fmt in ("e4m3fn", "e5m2") and m == 32:  # seed 5.4: a_reg[i*16+j] = A[l%32][(l/32)*16 + i*32 + j]
                # (= ISA 7.1.5.1 FP8 32x32x64: thr 0-31 k=0-15 in v0-3, k=32-47 in v4-7; thr 32-63 +16)
                i, j = divmod(s, 16)
                kk = (lane // 32) * 16 + i * 32 + j
            elif fmt in ("e4m3fn", "e5m2"):  # CK mx_mfma_op 16x128: reg r byte b
                # (= ISA 7.1.5.1 FP8 16x16x128: thr 16g.. k=16g..16g+15 in v0-3, 64+16g..64+16g+15 in v4-7)
                r, b = divmod(s, 4)
                kk = 16 * (lane // 16) + 4 * r + b if r < 4 else 64 + 16 * (lane // 16) + 4 * (r - 4) + b
            elif fmt == "e2m1" and m == 32 and role == "a":  # seed 5.5: byte i of row l%32 at (l/32)*16 + i
                byte, nib = divmod(s, 2)
                kk = 2 * ((lane // 32) * 16 + byte) + nib
            elif fmt == "e2m1" and m == 32:  # seed 5.5 B: slot 2i <- row 32*(l/32)+2i, slot 2i+1 <- +1
                kk = 32 * (lane // 32) + 2 * (s // 2) + s % 2
            elif fmt == "e2m1":  # CK 16x128 fp4: reg r byte b holds K 32g + 8r + 2b (+1); = ISA 7.1.5.1 FP4
                r, rest = divmod(s, 8)
                kk = 32 * (lane // 16) + 8 * r + rest
            else:  # fp6/bf6, ISA 7.1.5.1 FP6: lane group g holds k=32g..32g+15 in v0-2, 32g+16.. in v3-5
                kk = 32 * (lane // m) + s
            out[(lane % m, kk) if role == "a" else (kk, lane % m)] = (lane, s)
    return out


@pytest.mark.parametrize("lay", ALL, ids=lid)
def test_matches_independent_oracle(lay):
    oracle = ptx_oracle if lay.vendor == "nvidia" else cdna_oracle
    for role, op in lay.operands().items():
        want = oracle(lay, role)
        assert len(want) == op.shape[0] * op.shape[1], (role, "oracle must cover the tile")
        for (r, c), (lane, slot) in want.items():
            assert tuple(op.inverse[r, c]) == (lane, slot), (role, r, c)
            assert tuple(op.coords[lane, slot]) == (r, c), (role, lane, slot)


@pytest.mark.parametrize("lay", ALL, ids=lid)
def test_bijection_and_arange_round_trip(lay):
    for role, op in lay.operands().items():
        rows, cols = op.shape
        assert op.coords.shape == (lay.lanes, op.slots, 2)
        assert op.inverse.shape == (rows, cols, 2)
        held = op.held  # all True except the partial NVIDIA scale maps
        assert held.all() or (lay.vendor == "nvidia" and role.startswith("scale"))
        assert (op.coords[~held] == -1).all()
        seen = np.zeros((rows, cols), dtype=int)
        np.add.at(seen, (op.coords[held, 0], op.coords[held, 1]), 1)
        assert (seen == 1).all(), role
        tile = np.arange(rows * cols).reshape(rows, cols)
        regs = np.where(held, tile[op.coords[..., 0], op.coords[..., 1]], -1)
        back = np.empty_like(tile)
        back[op.coords[held, 0], op.coords[held, 1]] = regs[held]
        assert np.array_equal(back, tile)
        lane, slot = op.inverse[..., 0], op.inverse[..., 1]
        assert np.array_equal(regs[lane, slot], tile)
        assert op.registers * 32 >= max(op.bit_offsets) + op.bits


def test_register_footprints():
    a = layouts.get("v_mfma_f32_32x32x64_f8f6f4", a_format="fp8", b_format="fp4")
    assert (a.a.registers, a.b.registers, a.cbsz, a.blgp) == (8, 4, 0, 4)
    six = layouts.get("v_mfma_f32_16x16x128_f8f6f4", a_format="fp6", b_format="bf6")
    assert (six.a.registers, six.a.bit_offsets[5], six.cbsz, six.blgp) == (6, 30, 2, 3)
    h = layouts.get("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16")
    assert (h.c.registers, h.c.slots, h.c.bits, h.c_format) == (2, 4, 16, "fp16")
    assert layouts.get("m16n8k32.e4m3.e5m2").ptx == "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32"


def test_names_and_aliases():
    nv = layouts.names("nvidia")
    # 27: sm_120a block_scale; 77: sm_90a wgmma (11 N x 7 format pairs)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in nv and len(nv) == 12 + 27 + 77
    assert not [n for n in layouts.names("nvidia", "sm_80") if "m16n8k32" in n]
    assert len([n for n in layouts.names("nvidia", "sm_90") if "m16n8k32" in n]) == 4
    g942, g950 = set(layouts.names("amd", "gfx942")), set(layouts.names("amd", "gfx950"))
    assert "v_mfma_f32_32x32x4_xf32" in g942 and "v_mfma_f32_32x32x4_xf32" not in g950
    assert {"v_mfma_scale_f32_32x32x64_f8f6f4", "v_mfma_f32_16x16x32_bf16"} <= g950
    assert len(layouts.names("amd", "gfx942")) == 16 and len(g950) == 22
    assert layouts.get("m16n8k16.f16") is layouts.get("MMA.SYNC.ALIGNED.M16N8K16.ROW.COL.F32.F16.F16.F32")
    assert layouts.get("m16n8k32.e4m3.e4m3").name.endswith("e4m3.e4m3.f32")
    assert layouts.get("v_mfma_f32_32x32x16_fp8_fp8").a_format == "e4m3fnuz"
    assert layouts.get("v_mfma_f32_32x32x16_fp8_fp8", arch="gfx950").a_format == "e4m3fn"
    assert layouts.get("v_mfma_f32_32x32x16_bf8_fp8", a_format="e5m2").archs == ("gfx950",)
    assert layouts.get("v_mfma_f32_32x32x8_bf16").intrinsic == "__builtin_amdgcn_mfma_f32_32x32x8bf16_1k"
    assert layouts.names(kind="ldmatrix")[0].startswith("ldmatrix.sync.aligned.m8n8.x1")


def test_errors_say_what_exists():
    with pytest.raises(UnknownNameError, match="m16n8k16"):
        layouts.get("m16n8k16.f64")
    with pytest.raises(LayoutError, match="f8f6f4 operand format"):
        layouts.get("v_mfma_f32_32x32x64_f8f6f4", a_format="fp16")
    with pytest.raises(LayoutError, match="gfx942"):
        layouts.get("v_mfma_f32_32x32x4_xf32", arch="gfx950")
    with pytest.raises(LayoutError, match="no scales"):
        layouts.get("v_mfma_f32_32x32x64_f8f6f4", scale_opsel=(1, 0))
    with pytest.raises(LayoutError, match="0..3"):
        layouts.get("v_mfma_scale_f32_32x32x64_f8f6f4", scale_opsel=(4, 0))


def test_names_reject_unknown_vendor_and_arch():
    with pytest.raises(UnknownNameError, match="known vendors: nvidia, amd"):
        layouts.names("intel")
    with pytest.raises(UnknownNameError, match=r"known archs: gfx940, gfx941, gfx942, gfx950, sm_120a, sm_121a, sm_80"):
        layouts.names(arch="gfx900")
    with pytest.raises(UnknownNameError, match="gfx942"):
        layouts.names(arch="sm_70")  # older than every mma.sync record here
    with pytest.raises(LayoutError, match="nvidia arch, not amd"):
        layouts.names("amd", arch="sm_90")
    assert layouts.names("AMD", arch="GFX950") == layouts.names("amd", "gfx950") != []
    assert layouts.names(arch="sm_120") == layouts.names(arch="sm_90")  # forward compatible
    assert layouts.names("amd", "gfx942", kind="ldmatrix") == []        # known arch, no ldmatrix there
    assert layouts.names(arch="gfx940") == layouts.names(arch="gfx941") == layouts.names(arch="gfx942")  # CDNA3


@pytest.mark.parametrize("arch", ["gfx940", "gfx941", "gfx942"])
def test_cdna3_fp8_means_fnuz(arch):
    """fp8/bf8 operand names follow the arch on every CDNA3 part (the ISA reads FNUZ bytes)."""
    lay = layouts.get("v_mfma_f32_32x32x16_fp8_fp8", a_format="fp8", b_format="fp8", arch=arch)
    assert (lay.a_format, lay.b_format) == ("e4m3fnuz", "e4m3fnuz")
    lay = layouts.get("v_mfma_f32_32x32x16_bf8_fp8", a_format="bf8", b_format="fp8", arch=arch)
    assert (lay.a_format, lay.b_format) == ("e5m2fnuz", "e4m3fnuz")
    ocp = layouts.get("v_mfma_f32_32x32x16_fp8_fp8", a_format="fp8", b_format="fp8", arch="gfx950")
    assert (ocp.a_format, ocp.archs) == ("e4m3fn", ("gfx950",))


def test_element_formats_per_arch():
    """What each arch's instructions read (independent list from the ISA texts)."""
    f8f6f4 = {"e4m3fn", "e5m2", "e2m3", "e3m2", "e2m1"}
    assert layouts.element_formats("gfx942") == {"fp32", "tf32", "fp16", "bf16", "e4m3fnuz", "e5m2fnuz"}
    assert layouts.element_formats("gfx950") == {"fp32", "fp16", "bf16"} | f8f6f4
    assert layouts.element_formats("gfx950", scaled=True) == f8f6f4
    assert layouts.element_formats("sm_80") == {"tf32", "fp16", "bf16"}
    assert layouts.element_formats("sm_90") == {"tf32", "fp16", "bf16", "e4m3fn", "e5m2"}
    assert layouts.element_formats("sm_90", scaled=True) == set()
    assert layouts.element_formats("sm_120a", scaled=True) == f8f6f4


def test_get_non_string_name():
    for bad in (5, None, ("m16n8k16.f16",)):
        with pytest.raises(UnknownNameError, match="must be a string") as info:
            layouts.get(bad)
        assert isinstance(info.value, TypeError) and "names(kind='all')" in str(info.value)
        assert "mma.sync" not in str(info.value)  # no unrelated suggestions


def ck_probe_scale_lane(m, lane, slot):
    """Lane whose scale multiplied the fp8 A/B element in (lane, slot), as measured on gfx950.

    composable_kernel test/mx_mfma_op/scale_mapping_16x16x128.txt and scale_mapping_32x32x64.txt:
    element t of row r sits in lane M*(t//32) + r, slot t % 32, every lane's scale is 2^lane, and the
    printed log2 of the product names the lane.  16x16x128: lanes r, r+16 slots 0-15 -> lane r,
    slots 16-31 -> r+32; lanes r+32, r+48 slots 0-15 -> r+16, slots 16-31 -> r+48 (A and B alike).
    32x32x64 (A): lanes r, r+32 slots 0-15 -> lane r, slots 16-31 -> lane r+32.
    """
    row, group = lane % m, lane // m
    if m == 16:
        return row + 16 * (group // 2) + 32 * (slot // 16)
    return row + 32 * (slot // 16)


def scale_lane_of(lay, role, lane, slot):
    """Through the database: the lane whose scale VGPR covers the element held in (lane, slot)."""
    r, c = lay.operand(role).coords[lane, slot]
    if role == "a":
        return lay.scale_a.inverse[r, c // 32][0]
    return lay.scale_b.inverse[r // 32, c][0]


@pytest.mark.parametrize("name", ["v_mfma_scale_f32_16x16x128_f8f6f4", "v_mfma_scale_f32_32x32x64_f8f6f4"])
@pytest.mark.parametrize("fmt", F8F6F4)
def test_scale_grouping_matches_hardware_and_isa(name, fmt):
    # Which elements share a scale is the observable that a K permutation hits (an equal permutation
    # of A and B is invisible without scales).  fp8: CK's gfx950 probe (runs of 16, not aiter's 8);
    # fp6/fp4: ISA 7.1.5.1 + 7.2.1 put a lane's 32 K exactly in the block its own scale covers.
    lay = layouts.get(name, a_format=fmt, b_format=fmt)
    roles = ("a", "b") if lay.m == 16 else ("a",)  # the 32x32x64 probe measured A only
    for role in roles:
        for lane in range(64):
            for slot in range(32):
                got = scale_lane_of(lay, role, lane, slot)
                want = ck_probe_scale_lane(lay.m, lane, slot) if fmt in ("e4m3fn", "e5m2") else lane
                assert got == want, (role, lane, slot)


def test_scale_opsel_moves_the_byte():
    lay = layouts.get("v_mfma_scale_f32_16x16x128_f8f6f4", a_format="fp4", b_format="fp4", scale_opsel=(2, 3))
    assert lay.scale_a.bit_offsets == (16,) and lay.scale_b.bit_offsets == (24,)
    assert lay.scale_opsel == (2, 3)
    assert "op_sel:[0,1,0] op_sel_hi:[1,1,0]" in lay.modifiers and "cbsz:4 blgp:4" in lay.modifiers
    assert "op_sel" not in layouts.get("v_mfma_scale_f32_16x16x128_f8f6f4").modifiers
    # ISA 7.2.1: {OP_SEL_HI[i], OP_SEL[i]} = 2-bit byte code; llc-22 prints builtin OPSEL (3, 1) so
    lay = layouts.get("v_mfma_scale_f32_32x32x64_f8f6f4", scale_opsel=(3, 1))
    assert lay.modifiers == "op_sel:[1,1,0] op_sel_hi:[1,0,0]"
    assert lay.scale_a.bit_offsets == (24,) and lay.scale_b.bit_offsets == (8,)


def test_non_bijective_map_raises():
    from mxcore.layouts._core import OperandLayout, closed_form

    @closed_form(4, 4, 4, 4)
    def bad(lane, slot):
        return lane, slot % 2  # columns 2, 3 never held

    with pytest.raises(LayoutError, match="bijection"):
        OperandLayout("a", bad, 8, 1)


@pytest.mark.parametrize("ldm", [layouts.get(n) for n in layouts.names(kind="ldmatrix")], ids=str)
def test_ldmatrix_against_ptx(ldm):
    # PTX ISA ldmatrix: threads 8j..8j+7 give the row addresses of matrix j; lane l gets, in register
    # j, row l/4 and elements 2*(l%4), 2*(l%4)+1 (with .trans: column l/4, rows 2*(l%4), +1).
    for j in range(ldm.num):
        for r in range(8):
            assert ldm.address_lane[j, r] == 8 * j + r
    for lane in range(32):
        for j in range(ldm.num):
            for h in range(2):
                a, b = lane // 4, 2 * (lane % 4) + h
                want = (j, b, a) if ldm.trans else (j, a, b)
                assert tuple(ldm.coords[lane, 2 * j + h]) == want
                assert tuple(ldm.inverse[want]) == (lane, 2 * j + h)


def test_str_mentions_everything():
    text = str(layouts.get("v_mfma_scale_f32_32x32x64_f8f6f4", a_format="fp6", b_format="fp8"))
    for part in ("scale_a", "cbsz:2", "__builtin_amdgcn_mfma_scale_f32_32x32x64_f8f6f4", "6 register"):
        assert part in text


# ------------------------------------------------------------------ sm_120a block-scaled mma.sync
MX_PTX = {"e4m3fn": "e4m3", "e5m2": "e5m2", "e3m2": "e3m2", "e2m3": "e2m3", "e2m1": "e2m1"}


def test_block_scaled_records_cover_every_format_pair():
    names = layouts.names("nvidia", "sm_120a")
    scaled = [n for n in names if "block_scale" in n]
    assert len(scaled) == 25 + 2
    assert layouts.names(arch="sm_121a") == names
    assert not [n for n in layouts.names(arch="sm_90") + layouts.names(arch="sm_120") if "block_scale" in n]
    for fa in F8F6F4:
        for fb in F8F6F4:
            lay = layouts.get(f"m16n8k32.mxf8f6f4.{MX_PTX[fa]}.{MX_PTX[fb]}")
            assert (lay.a_format, lay.b_format, lay.archs) == (fa, fb, ("sm_120a", "sm_121a"))
            assert lay.ptx == ("mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X"
                               f".f32.{MX_PTX[fa]}.{MX_PTX[fb]}.f32.ue8m0")
            assert layouts.get(lay.ptx) is lay and layouts.get(lay.name) is lay
            assert (lay.scale_format, lay.scale_block, lay.scale_a.shape, lay.scale_b.shape) == ("e8m0", 32, (16, 1), (1, 8))
    for kind in ("mxf4", "mxf4nvf4"):
        lay = layouts.get(f"m16n8k64.{kind}")
        assert lay.ptx == f"mma.sync.aligned.m16n8k64.row.col.kind::{kind}.block_scale.scale_vec::2X.f32.e2m1.e2m1.f32.ue8m0"
        assert (lay.a.registers, lay.b.registers, lay.scale_a.shape, lay.scale_a.bit_offsets) == (4, 2, (16, 2), (0, 8))


def test_block_scaled_byte_containers():
    """.kind::mxf8f6f4 keeps one element per byte: fp8 in [7:0], fp6 in [5:0], fp4 in [5:2] (CUTLASS
    mma_traits_sm120.hpp fp4_shift: "0b0000ABCD --> 0b00ABCD00", not needed for FP6/FP8)."""
    for fmt, bits, shift in (("e4m3fn", 8, 0), ("e5m2", 8, 0), ("e2m3", 6, 0), ("e3m2", 6, 0), ("e2m1", 4, 2)):
        lay = layouts.get(f"m16n8k32.mxf8f6f4.{MX_PTX[fmt]}.e4m3")
        assert (lay.a.bits, lay.a.registers) == (bits, 4)
        assert lay.a.bit_offsets == tuple(8 * s + shift for s in range(16))
        assert lay.b.bit_offsets == tuple(range(0, 64, 8))
    # kind::mxf4: eight packed e2m1 per register
    assert layouts.get("m16n8k64.mxf4").a.bit_offsets == tuple(range(0, 128, 4))


@pytest.mark.parametrize("sel", [(0, 0, 0, 0), (3, 1, 2, 3), (1, 1, 0, 2)])
def test_block_scaled_selectors_move_lanes_and_bytes(sel):
    from mxcore.layouts import nvidia

    byte_a, tid_a, byte_b, tid_b = sel
    lay = nvidia.block_scaled("mxf8f6f4", "e2m1", "e4m3fn", byte_a, tid_a, byte_b, tid_b)
    for role, op in (("scale_a", lay.scale_a), ("scale_b", lay.scale_b)):
        want = ptx_block_scale_oracle(lay, role)
        for (r, c), (lane, slot) in want.items():
            assert tuple(op.inverse[r, c]) == (lane, slot)
        assert op.held.sum() == len(want)  # every other lane supplies nothing
    assert lay.scale_a.bit_offsets == (8 * byte_a,) and lay.scale_b.bit_offsets == (8 * byte_b,)
    assert "(byte-id, thread-id) A (%d, %d), B (%d, %d)" % (byte_a, tid_a, byte_b, tid_b) in str(lay)


def test_block_scaled_selector_ranges():
    """ptxas (NVRTC 13, sm_120a) rejects thread-id-a > 1 and, for scale_vec::2X, byte-ids other than 0, 2."""
    from mxcore.layouts import nvidia

    with pytest.raises(LayoutError, match="thread-id-a must be 0 or 1"):
        nvidia.block_scaled("mxf8f6f4", "e4m3fn", "e4m3fn", 0, 2, 0, 0)
    with pytest.raises(LayoutError, match=r"byte-id must be one of \[0, 2\]"):
        nvidia.block_scaled("mxf4", "e2m1", "e2m1", 1, 0, 0, 0)
    with pytest.raises(LayoutError, match="not an operand format"):
        nvidia.block_scaled("mxf4", "e4m3fn", "e2m1")
    with pytest.raises(LayoutError, match="use one of mxf8f6f4"):
        nvidia.block_scaled("nvf4", "e2m1", "e2m1")
