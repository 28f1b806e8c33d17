"""mxcore.layouts.hopper (wgmma, sm_90a) against the PTX ISA's closed forms, on the CPU.

The closed forms below are written the way PTX ISA 9.7.15.5.1 states them (warp w = lane / 32 of the
warpgroup, groupID = lane % 32 / 4, threadID_in_group = lane % 4), independently of the records, which are
composed from the mma.sync maps.  The swizzle atoms are checked against CuTe's ``Swizzle<B, 4, 3>`` formula on byte
offsets, and the descriptor against its bit fields and the constants ``kernels_cuda/gemm_sm90.cu`` uses.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from mxcore.errors import LayoutError
from mxcore.kernels import kernel_source
from mxcore.layouts import hopper


def _lanes_slots(op):
    return np.meshgrid(np.arange(op.lanes), np.arange(op.slots), indexing="ij")


@pytest.mark.parametrize("n", [8, 16, 64, 128, 192, 256])
def test_accumulator_matches_ptx_closed_form(n):
    op = hopper.accumulator(n)
    t, i = _lanes_slots(op)
    warp, g, tig = t // 32, (t % 32) // 4, t % 4
    row = 16 * warp + g + 8 * ((i % 4) >= 2)
    col = 8 * (i // 4) + 2 * tig + (i & 1)
    assert op.shape == (64, n) and op.lanes == 128 and op.slots == n // 2 and op.registers == n // 2
    np.testing.assert_array_equal(op.coords[..., 0], row)
    np.testing.assert_array_equal(op.coords[..., 1], col)


def test_accumulator_f16_packs_two_per_register():
    op = hopper.accumulator(64, bits=16)
    assert op.registers == 16 and op.register_of(1) == 0 and op.register_of(2) == 1


@pytest.mark.parametrize("k", [16, 8, 32])
def test_register_a_matches_ptx_closed_form(k):
    op = hopper.register_a(k)
    t, i = _lanes_slots(op)
    warp, g, tig = t // 32, (t % 32) // 4, t % 4
    if k == 16:  # a0..a7, 16-bit: row g (+8 for a2,a3,a6,a7), col 2 tig + (i & 1) (+8 for a4..a7)
        row, col = g + 8 * ((i // 2) % 2), 2 * tig + (i & 1) + 8 * (i // 4)
    elif k == 8:  # a0..a3, tf32: row g (+8 for a1, a3), col tig (+4 for a2, a3)
        row, col = g + 8 * (i % 2), tig + 4 * (i // 2)
    else:  # a0..a15, fp8: row g (+8 for a4..a7, a12..a15), col 4 tig + i % 4 (+16 for a8..a15)
        row, col = g + 8 * ((i // 4) % 2), 4 * tig + (i % 4) + 16 * (i // 8)
    np.testing.assert_array_equal(op.coords[..., 0], 16 * warp + row)
    np.testing.assert_array_equal(op.coords[..., 1], col)
    assert op.registers == 4


def test_records_and_ptx():
    r = hopper.record(256, "fp16")
    assert r.ptx == "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16" and r.k == 16 and r.transpose
    assert r.d.shape == (64, 256) and r.a_registers.shape == (64, 16)
    r8 = hopper.record(192, "e4m3fn", "e5m2")
    assert r8.ptx.endswith("m64n192k32.f32.e4m3.e5m2") and not r8.transpose
    assert hopper.record(128, "tf32").ptx.endswith("m64n128k8.f32.tf32.tf32")
    with pytest.raises(LayoutError, match="multiple of 8"):
        hopper.accumulator(100)
    with pytest.raises(LayoutError, match="no fp16 x e4m3fn"):
        hopper.wgmma_ptx(64, "fp16", "e4m3fn")
    with pytest.raises(LayoutError, match="equal"):
        hopper.wgmma_ptx(64, "fp16", "bf16")


@pytest.mark.parametrize("name,bits", [("128B", 3), ("64B", 2), ("32B", 1)])
def test_swizzle_atoms(name, bits):
    atom = hopper.SWIZZLE_ATOMS[name]
    rows, per_row = atom.chunks.shape
    assert rows == 8 and per_row == atom.span // 16 and atom.atom_bytes == 8 * atom.span
    r, c = np.meshgrid(np.arange(rows), np.arange(per_row), indexing="ij")
    # row r of span bytes starts at byte r * span: its bits 7.. are r * span >> 7
    np.testing.assert_array_equal(atom.chunks, c ^ (((r * atom.span) >> 7) & ((1 << bits) - 1)))
    off = np.random.default_rng(0).integers(0, 1 << 16, size=1000)
    np.testing.assert_array_equal(atom.physical(off), off ^ (((off >> 7) & ((1 << bits) - 1)) << 4))
    if name == "128B":  # the familiar form: chunk ^ row
        np.testing.assert_array_equal(atom.chunks, c ^ r)


def test_descriptor_fields_roundtrip_and_checks():
    d = hopper.descriptor(0x4A00, 8192, 1024, "128B")
    assert d == (0x4A00 >> 4) | ((8192 >> 4) << 16) | ((1024 >> 4) << 32) | (1 << 62)
    f = hopper.descriptor_fields(d)
    assert f == {"start": 0x4A00, "lbo": 8192, "sbo": 1024, "base_offset": 0, "swizzle": "128B"}
    assert hopper.descriptor_fields(hopper.descriptor(0, 16, 256, "32B"))["swizzle"] == "32B"
    with pytest.raises(LayoutError, match="multiple of 16"):
        hopper.descriptor(0x4A08, 16, 1024)
    with pytest.raises(LayoutError, match="below"):
        hopper.descriptor(1 << 18, 16, 1024)


def test_kernel_uses_the_canonical_descriptor_constants():
    """gemm_sm90.cu's descriptors: 128-byte swizzle (bit 62), K-major LBO 16 / SBO 1024 / K step 32 bytes,
    M/N-major LBO = one TMA box (64 elements x BK rows of 128 bytes) and SBO 1024."""
    src = kernel_source("nvidia", "gemm_sm90.cu")
    km, mn = hopper.CANONICAL["kmajor"], hopper.CANONICAL["mnmajor"]
    assert "(1ull << 62)" in src and hopper.SWIZZLE_ATOMS["128B"].mode == 1
    assert f"kk * {km['k_step_bytes']}, {km['lbo']}, {km['sbo']})" in src
    lbo = int(re.search(r"#define SM90_MN_LBO (\d+)", src).group(1))
    sbo = int(re.search(r"#define SM90_MN_SBO (\d+)", src).group(1))
    assert lbo == mn["lbo"](64) and sbo == mn["sbo"]  # 16-bit: BK = 64
    assert "kk * (32 / SM90_ESIZE) * 128" in src and mn["k_step_bytes"](16) == 16 * 128
