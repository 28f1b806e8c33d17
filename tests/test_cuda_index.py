"""The CUDA GEMM kernel's fragment index arithmetic, checked against mxcore.layouts (no GPU needed).

The kernel gets its ldmatrix lane addresses, the split of B's ldmatrix.x4 into two n8 blocks, the fp8 -> f16
register split and the accumulator coordinates from ``backends/cuda/variants.py::FRAGMENT_FORMULAS`` (emitted as
-D macros; the kernel source uses only those macros).  Here the same formulas are composed with the layout
database's ldmatrix movement records (which lane supplies which row address, where each element lands) and must
reproduce the mma records' A/B/C ``coords`` exactly, for every element size and majorness the kernel uses.  A
layout bug in the kernel's addressing cannot pass this test.
"""

from __future__ import annotations

import numpy as np
import pytest

from mxcore import layouts
from mxcore.backends import cuda

ELEMS = ["f16", "bf16", "tf32", "e4m3.e4m3", "e5m2.e4m3"]
# (element, K-major?): M/N-major operands exist only for 16-bit elements (the backend transposes the others)
CASES = [(e, True) for e in ELEMS] + [(e, False) for e in ELEMS if cuda.ELEMENTS[e].esize == 2]


def _formula(key):
    row, chunk = cuda.FRAGMENT_FORMULAS[key]
    return (lambda lane: cuda.eval_formula(row, lane)), (lambda lane: cuda.eval_formula(chunk, lane))


def _ldmatrix_result(operand: str, kmajor: bool, esize: int):
    """Simulate the kernel's ldmatrix.x4 of one mma step: {(lane, register, element-in-register): (tile row,
    element index along the tile row)}, with tile rows as the kernel stores them in shared memory."""
    key = f"ldsm_{operand}_{'kmajor' if kmajor else ('mmajor' if operand == 'a' else 'nmajor')}"
    row_f, chunk_f = _formula(key)
    ldm = layouts.get("ldmatrix.x4" + ("" if kmajor else ".trans"))
    out = {}
    for lane in range(32):
        for slot16 in range(8):
            j, r, c = (int(x) for x in ldm.coords[lane, slot16])
            src = int(ldm.address_lane[j, r])
            tile_row, chunk = row_f(src), chunk_f(src)
            reg = slot16 // 2
            for byte in range(2):  # the two bytes of this 16-bit half
                offset = 2 * c + byte  # byte offset inside the 16-byte row the address points at
                elem_in_row = chunk * (16 // esize) + offset // esize
                pos = ((slot16 % 2) * 2 + byte) // esize  # element index within the 32-bit register
                key2 = (lane, reg, pos)
                val = (tile_row, elem_in_row)
                assert out.setdefault(key2, val) == val, "one register element mixes two source elements"
    return out


@pytest.mark.parametrize(("elem", "kmajor"), CASES, ids=[f"{e}-{'kmajor' if k else 'mmajor'}" for e, k in CASES])
def test_a_fragment_matches_layout(elem, kmajor):
    el = cuda.ELEMENTS[elem]
    rec = layouts.get(el.record)
    got = _ldmatrix_result("a", kmajor, el.esize)
    per_reg = 4 // el.esize
    for lane in range(32):
        for slot in range(rec.a.map.slots):
            reg, pos = divmod(slot, per_reg)
            tile_row, along = got[(lane, reg, pos)]
            m, k = (tile_row, along) if kmajor else (along, tile_row)
            assert (m, k) == tuple(rec.a.coords[lane, slot]), (lane, slot)


@pytest.mark.parametrize(("elem", "kmajor"), CASES, ids=[f"{e}-{'kmajor' if k else 'nmajor'}" for e, k in CASES])
def test_b_fragment_matches_layout(elem, kmajor):
    el = cuda.ELEMENTS[elem]
    rec = layouts.get(el.record)
    got = _ldmatrix_result("b", kmajor, el.esize)
    per_reg = 4 // el.esize
    # the x4 loads two n8 blocks: ldmatrix register j -> (block, mma register), the kernel's MX_LDSM_B_* formulas
    split = {tuple(int(cuda.eval_formula(e, j=j)) for e in cuda.FRAGMENT_FORMULAS["ldsm_b_split"]): j for j in range(4)}
    assert sorted(split) == [(0, 0), (0, 1), (1, 0), (1, 1)], "the x4 split must be a bijection"
    for block in range(2):
        for lane in range(32):
            for slot in range(rec.b.map.slots):
                mreg, pos = divmod(slot, per_reg)
                tile_row, along = got[(lane, split[(block, mreg)], pos)]
                n16, k = (tile_row, along) if kmajor else (along, tile_row)
                assert n16 // 8 == block, (lane, slot, block)
                assert (k, n16 % 8) == tuple(rec.b.coords[lane, slot]), (lane, slot, block)


@pytest.mark.parametrize("elem", ELEMS)
def test_accumulator_matches_layout(elem):
    rec = layouts.get(cuda.ELEMENTS[elem].record)
    row, col = cuda.FRAGMENT_FORMULAS["c"]
    lane = np.arange(32)[:, None]
    i = np.arange(4)[None, :]
    got = np.stack([np.broadcast_to(cuda.eval_formula(row, lane, i), (32, 4)),
                    np.broadcast_to(cuda.eval_formula(col, lane, i), (32, 4))], axis=-1)
    np.testing.assert_array_equal(got, rec.c.coords)


def test_mnemonics_come_from_layouts():
    for el in cuda.ELEMENTS.values():
        rec = layouts.get(el.record)
        assert rec.ptx == el.record
        # one mma step covers 32 bytes of K (an fp8 step converted to f16 runs two k16 mma)
        steps = 2 if el.cvt else 1
        assert rec.vendor == "nvidia" and rec.m == 16 and rec.n == 8 and steps * rec.k * el.esize == 32


def test_options_carry_formulas_and_mnemonic():
    v = cuda.Variant("bf16", False, True, "128x128")
    opts = cuda.gemm_options(v)
    text = " ".join(opts)
    assert '-DMX_MMA_OP="mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"' in opts
    assert "-DMX_LDSM_A_ROW(lane)=(((lane) & 7) + (((lane) >> 4) << 3))" in opts
    assert "MX_C_COL(lane,i)" in text and "-DMX_A_KMAJOR=0" in opts


def test_kernel_takes_every_index_from_the_formula_macros():
    """gemm_options defines every formula's macros, and the kernel block uses each of them (no index arithmetic
    re-typed in the kernel: the B split and the cvt split are read through the macros)."""
    from mxcore.kernels import kernel_source

    v = cuda.Variant("f8.f8.f16", True, True, "128x128k128s3")
    defined = {o[2:].split("(")[0].split("=")[0] for o in cuda.gemm_options(v) if o.startswith("-D")}
    text = kernel_source("nvidia", cuda.GEMM_FILE)
    for name in ("MX_LDSM_A_ROW", "MX_LDSM_B_CHUNK", "MX_LDSM_B_BLOCK", "MX_LDSM_B_REG", "MX_CVT_A_REG", "MX_CVT_A_HI",
                 "MX_CVT_B_REG", "MX_CVT_B_HI", "MX_C_ROW", "MX_C_COL"):
        assert name in defined and f"{name}(" in text, name


def test_wrong_cvt_split_is_caught(monkeypatch):
    bad = dict(cuda.FRAGMENT_FORMULAS)
    bad["cvt_b"] = ("(h + 1) & 1", "j")  # B takes the other K half than A
    monkeypatch.setattr(cuda, "FRAGMENT_FORMULAS", bad)
    global CVT_B
    saved, CVT_B = CVT_B, _cvt("cvt_b", 2)
    try:
        with pytest.raises(AssertionError):
            test_fp8_to_f16_fragment_conversion_permutes_k_consistently("e4m3.e4m3")
    finally:
        CVT_B = saved


def test_a_wrong_formula_is_caught(monkeypatch):
    bad = dict(cuda.FRAGMENT_FORMULAS)
    bad["ldsm_a_kmajor"] = ("lane & 15", "(lane >> 3) & 1")  # the x4 matrices in the wrong order
    monkeypatch.setattr(cuda, "FRAGMENT_FORMULAS", bad)
    with pytest.raises(AssertionError):
        test_a_fragment_matches_layout("f16", True)


def test_formula_grammar_rejects_other_code():
    with pytest.raises(ValueError):
        cuda.eval_formula("__import__('os')", 0)


def test_tile_choice():
    assert cuda.choose_tile(16, 8192) == "32x64"
    assert cuda.choose_tile(4096, 4096) == "128x128"
    assert cuda.choose_tile(8192, 1024) == "128x128"
    assert cuda.choose_tile(100, 100) == "64x64"
    assert cuda.choose_tile(4096, 4096, elem="tf32") == "128x128"
    assert cuda.choose_tile(512, 1024, elem="f8.f8.f16") == "64x64"  # 32 blocks of 128x128 < 132 SMs
    assert cuda.choose_tile(4096, 4096, elem="f8.f8.f16") == "128x128k128s3"
    assert cuda.choose_tile(4096, 4096, elem="e4m3.e4m3") == "128x128"
    for e in cuda.ELEMENTS:
        assert set(cuda.element_tiles(e)) <= set(cuda.TILES) and cuda.element_tiles(e)[-2:] == ("64x64", "32x64")


# gemm_block.cuh MX_F8_CVT: an fp8 mma step (m16n8k32 fragments, as ldmatrix loads them) runs as two f16 m16n8k16
# mma.  Register j of f16 mma h comes from (fp8 register, byte pair) given by the kernel's MX_CVT_* formulas.
def _cvt(key, regs):
    reg, hi = cuda.FRAGMENT_FORMULAS[key]
    return [[(int(cuda.eval_formula(reg, h=h, j=j)), int(cuda.eval_formula(hi, h=h, j=j))) for j in range(regs)]
            for h in range(2)]


CVT_A, CVT_B = _cvt("cvt_a", 4), _cvt("cvt_b", 2)  # [h][j] -> (fp8 register, hi)


@pytest.mark.parametrize("pair", ["e4m3.e4m3", "e5m2.e4m3"])
def test_fp8_to_f16_fragment_conversion_permutes_k_consistently(pair):
    """Both operands must see the same permutation of K inside the 32-wide step, and the two f16 mma together
    must cover every K exactly once: then the sum of products is the fp8 mma's (checked on the layout tables)."""
    r8, r16 = layouts.get(cuda.ELEMENTS[pair].record), layouts.get(cuda.ELEMENTS["f8.f8.f16"].record)
    assert cuda.ELEMENTS["f8.f8.f16"].cvt
    def pairs(operand, cvt, h):
        """(fp8 coords, f16 coords) of every lane and f16 slot of operand ``operand`` in f16 mma ``h``."""
        f8, f16 = getattr(r8, operand), getattr(r16, operand)
        for lane in range(32):
            for slot in range(f16.map.slots):
                reg8, hi = cvt[h][slot // 2]
                yield tuple(int(x) for x in f8.coords[lane, reg8 * 4 + 2 * hi + slot % 2]), \
                    tuple(int(x) for x in f16.coords[lane, slot])

    covered = set()
    for h in range(2):
        perm = {}  # virtual k of f16 mma h -> real k of the fp8 step
        for (m, k), (m16, k16) in pairs("a", CVT_A, h):
            assert m == m16, (h, m, k)
            assert perm.setdefault(k16, k) == k, "A maps one virtual k to two real k"
        for (k, n), (k16, n16) in pairs("b", CVT_B, h):
            assert n == n16, (h, k, n)
            assert perm[k16] == k, "B sees another permutation of K than A"
        assert sorted(perm) == list(range(16)) and len(set(perm.values())) == 16
        covered |= set(perm.values())
    assert covered == set(range(32))


def test_kernel_source_inlines_local_includes(tmp_path, monkeypatch):
    """kernel_source resolves #include "X" from the kernel folder once (the real gemm.cu / gemm_prep.cu share
    mx_common.cuh that way), leaves other includes alone and turns a repeated include into a comment."""
    from mxcore import kernels

    (tmp_path / "h.cuh").write_text("typedef int T;\n")
    (tmp_path / "g.cuh").write_text('#include "h.cuh"\nT g;\n')
    (tmp_path / "k.cu").write_text('#include "g.cuh"\n#include "h.cuh"\n  #include <cuda_fp16.h>\nT k;\n')
    monkeypatch.setattr(kernels, "kernel_dir", lambda vendor: tmp_path)
    text = kernels.kernel_source("nvidia", "k.cu")
    assert text.count("typedef int T;") == 1 and "T g;" in text and "#include <cuda_fp16.h>" in text
    assert '// (#include "h.cuh": inlined above)' in text and not any(
        line.strip().startswith('#include "') for line in text.splitlines())
    monkeypatch.undo()
    for name in ("gemm.cu", "gemm_diag.cu", "gemm_prep.cu"):
        real = kernels.kernel_source("nvidia", name)
        assert real.count("typedef unsigned int u32;") == 1 and "f32_to_bf16(float v)" in real


def test_fp8_pairs_share_the_converted_build():
    """sm_90 (fp8 converted to f16): every fp8 pair chooses one build per tile, the formats are the launch's f8_pair
    (bit 0: A is e5m2, bit 1: B is e5m2) and the kernel switches on it once into per-pair main loops; natively
    (sm_89) each pair is its own build and f8_pair is 0."""
    from mxcore.backends.cuda.variants import choose, f8_pair

    pairs = [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e5m2")]
    conv = [choose(a, b, True, True, 4096, 4096, 132, fp8_convert=True) for a, b in pairs]
    assert len(set(conv)) == 1 and conv[0].elem == "f8.f8.f16" and conv[0].tile == "128x128k128s3"
    opts = cuda.gemm_options(conv[0])
    assert "-DMX_F8_CVT=1" in opts and not any(o.startswith(("-DMX_A_CVT", "-DMX_B_CVT")) for o in opts)
    assert [f8_pair(conv[0], a, b) for a, b in pairs] == [0, 1, 2, 3]
    native = [choose(a, b, True, True, 4096, 4096, 132, fp8_convert=False) for a, b in pairs]
    assert len(set(native)) == 4 and [f8_pair(v, a, b) for v, (a, b) in zip(native, pairs)] == [0] * 4
    assert f8_pair(choose("f16", "f16", True, True, 64, 64, 132), "f16", "f16") == 0
    from mxcore.kernels import kernel_source

    text = kernel_source("nvidia", cuda.GEMM_FILE)
    assert "cvt.rn.f16x2.e4m3x2" in text and "cvt.rn.f16x2.e5m2x2" in text and "MX_A_CVT" not in text
    assert all(f"main_loop(F8Pair<{p}>{{}})" in text for p in range(4))
