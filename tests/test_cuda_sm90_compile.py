"""Offline (no GPU) checks of the sm_90a wgmma family: the variants the chooser can return
(``backends/cuda/sm90.all_sm90_variants``; a covering subset, every code path once) compiled by NVRTC to an sm_90a cubin (ptxas runs), and its SASS must
show the design: HGMMA (fp16/bf16/tf32) or QGMMA (fp8) of the variant's shape, four per ring stage (128 bytes of
K in 32-byte wgmma steps), TMA loads (UTMALDG), setmaxnreg (USETMAXREG, no C7508 "ignored" warning), and no local
memory; TMA stores (UTMASTG) exactly in the TMA-store epilogue variants.  The exact MX fp8 variants (``mx``) also
load their block factors by TMA (four UTMALDG per stage), keep one QGMMA per 32-K block and no local memory; their
factor prep (``gemm_sm90_mx.cu``) compiles.  Also the pure-Python parts: variant validation, the family rule and
the MX path rule, the tensor-map argument checks.  Without NVRTC/cuobjdump the compile tests skip, except under CI=true where they fail.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from mxcore.backends import nvrtc_tools
from mxcore.backends.cuda import families, sm90
from mxcore.backends.cuda.compile import source
from mxcore.errors import UnsupportedError

from conftest import require_tool

SMEM_LIMIT = 227 * 1024  # sm_90 opt-in dynamic shared memory per block
ALL = sm90.all_sm90_variants()


def _covering(variants):
    """Every code path of the kernel once: each 16-bit majorness with direct stores, both TMA-store widths on
    K-major and M/N-major 16-bit operands, every tf32 variant, and every fp8 pair x accumulation mode with the
    store width rotating, so that each (-D define, value) of ``ALL`` is compiled (CI time: a third of the compiles)."""
    out, fp8_seen, mx_seen = [], 0, 0
    for v in ALL:
        if v.mx:  # every fp8 pair once, the store width rotating (each width and element on each side covered)
            keep = v.tma_store == (0, 2, 4, 0)[mx_seen // 3 % 4]
            mx_seen += 1
        elif v.elem in ("f16", "bf16"):
            keep = v.tma_store == 0 or (v.a_kmajor == v.b_kmajor and v.elem == ("f16" if v.a_kmajor else "bf16"))
        elif v.elem == "tf32":
            keep = True
        else:
            keep = v.tma_store == (0, 2, 4)[fp8_seen // 3 % 3]
            fp8_seen += 1
        if keep:
            out.append(v)
    return out


VARIANTS = _covering(ALL)


def _compile(v):  # with -ftz=true, as CuPy compiles
    opts = [*(o for o in v.options() if not o.startswith("--gpu-architecture")), nvrtc_tools.FTZ_FLAG]
    return nvrtc_tools.compile_cuda(source(sm90.SM90_FILE), name=v.name, arch="sm_90a", options=opts)


@pytest.fixture(scope="module")
def binaries():
    """Every variant compiled once, NVRTC calls in parallel threads."""
    require_tool("NVRTC (cuda-bindings + nvidia-cuda-nvrtc)", nvrtc_tools.have_nvrtc())
    require_tool("cuobjdump + nvdisasm", nvrtc_tools.have_cuobjdump())
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        return dict(zip(VARIANTS, pool.map(_compile, VARIANTS)))


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_variant_compiles_to_wgmma_and_tma(binaries, v):
    b = binaries[v]
    res = b.resources[sm90.SM90_KERNEL]
    print(f"{v.name}: {res['registers']} registers at entry, {v.smem_bytes} B dynamic shared memory")
    assert res["local_bytes"] == 0 and res["spill_stores"] == 0 and res["spill_loads"] == 0, res
    assert "C7508" not in b.log, "ptxas ignored setmaxnreg"
    assert v.smem_bytes <= SMEM_LIMIT
    counts = nvrtc_tools.sass_counts(b.sass)
    fp8 = v.elem in ("e4m3", "e5m2")
    mma, other = ("QGMMA", "HGMMA") if fp8 else ("HGMMA", "QGMMA")
    kstep = 32 // v.esize
    lines = nvrtc_tools.sass_lines(b.sass, mma)
    folds = v.mx  # the folded-window loop (4 wgmma) beside the per-32 one
    assert len(lines) == (8 if folds else 4) and counts[other] == 0, counts
    assert all(f".64x{v.bn}x{kstep}." in line for line in lines), lines
    assert counts["UTMALDG"] >= (4 if v.mx else 2) and counts["USETMAXREG"] == 2
    assert (counts["UTMASTG"] > 0) == bool(v.tma_store)  # the TMA-store epilogue, or direct stores
    assert counts["LDL"] == 0 and counts["STL"] == 0 and counts["HMMA"] == 0
    # IEEE fp32 under CuPy's -ftz=true: promotions, split-K sums, block factors and the output scale keep subnormals
    assert not nvrtc_tools.ftz_ops(b.sass), f"fp32 arithmetic flushing subnormals: {nvrtc_tools.ftz_ops(b.sass)[:3]}"


def test_variant_validation():
    with pytest.raises(UnsupportedError, match="K-major only"):
        sm90.Sm90Variant("tf32", "tf32", False, True, "128x256")
    with pytest.raises(UnsupportedError, match="two fp8"):
        sm90.Sm90Variant("e4m3", "f16", True, True, "128x256")
    with pytest.raises(UnsupportedError, match="not a wgmma tile"):
        sm90.Sm90Variant("f16", "f16", True, True, "128x128k128s3")
    v = sm90.choose_sm90("e4m3", "e5m2", True, True)
    assert v.promote and "-DSM90_B_E5M2=1" in v.options() and "-DSM90_A_E5M2=0" in v.options()
    assert len({x.name for x in ALL}) == len(ALL)
    with pytest.raises(UnsupportedError, match="K-major fp8"):
        sm90.Sm90Variant("bf16", "bf16", True, True, "128x192", mx=True)
    with pytest.raises(UnsupportedError, match="not swapped"):
        sm90.Sm90Variant("e4m3", "e4m3", True, True, "128x64", swap=True, mx=True)
    m = sm90.choose_sm90("e5m2", "e4m3", True, True, tma_store=4, mx=True)
    assert m.tile == sm90.MX_TILE and "-DSM90_MX=1" in m.options() and "_mx32" in m.name and not m.swap
    assert m.smem_bytes - sm90.choose_sm90("e5m2", "e4m3", True, True, tma_store=4).smem_bytes != 0
    assert {(x.elem, x.b_elem) for x in ALL if x.mx} == {(a, b) for a in ("e4m3", "e5m2") for b in ("e4m3", "e5m2")}
    for key in ("elem", "b_elem", "a_kmajor", "b_kmajor", "promote", "tma_store", "swap", "tile", "mx"):  # covers
        assert {getattr(x, key) for x in VARIANTS} == {getattr(x, key) for x in ALL}, key
    assert all(x.smem_bytes <= SMEM_LIMIT for x in ALL)


def test_family_rule():
    assert families.family_for("sm_90", None, (1, 4096, 4096, 4096)) == "wgmma"
    assert families.family_for("sm_90", None, (1, 16, 8192, 8192)) == "mma_sync"  # decode: split K on mma.sync
    assert families.family_for("sm_90", None, (4, 4096, 4096, 4096)) == "mma_sync"  # batches
    assert families.family_for("sm_89", None, (1, 4096, 4096, 4096)) == "mma_sync"
    assert families.family_for("sm_90", None, (1, 16, 8192, 8192), "wgmma") == "wgmma"
    with pytest.raises(UnsupportedError, match="sm_90"):
        families.family_for("sm_80", None, None, "wgmma")


@pytest.mark.parametrize("tiles, resident, kblocks, want", [
    (704, 132, 32, (660, 3, 11)),  # 4096^2 in 128x192 tiles: 5 waves, the 44 tiles left split in 3 (11, 11, 10 stages)
    (2752, 132, 64, (2752, 1, 64)),  # 8192^2: 112 tiles left, no room to split them
    (1024, 132, 32, (1024, 1, 32)),  # 7.76 waves: 100 left, too many
    (2400, 132, 32, (2376, 4, 8)),  # 24 left: 5 splits would be 7 stages (< MIN_SPLIT_STAGES): 4
    (64, 132, 128, (0, 2, 64)),  # fewer tiles than blocks (decode, swapped): every tile split
    (2, 132, 33, (0, 4, 9)),  # 33 stages in 4 splits of 9, 9, 9, 6
    (1, 132, 15, (1, 1, 15)),  # too short to split
    (132, 132, 64, (132, 1, 64)),  # whole waves
    (4, 132, 1000, (0, 16, 63)),  # at most MAX_SPLITS
])
def test_split_tail_rule(tiles, resident, kblocks, want):
    assert sm90.split_tail(tiles, resident, kblocks) == want


def test_split_tail_rule_invariants():
    """Over a grid of problems: the split units fit in the one wave left after the whole ones, the splits are
    MIN_SPLIT_STAGES stages or more (the last one the rest) and cover K exactly, none empty (unit_work's ranges)."""
    for resident in (66, 114, 132):
        for tiles in range(1, 3 * resident, 7):
            for kblocks in (1, 8, 15, 16, 17, 33, 64, 257):
                tail0, splits, per = sm90.split_tail(tiles, resident, kblocks)
                if splits == 1:
                    assert (tail0, per) == (tiles, kblocks)
                    continue
                assert tail0 % resident == 0 and tail0 == tiles // resident * resident
                assert (tiles - tail0) * splits <= resident and 2 <= splits <= sm90.MAX_SPLITS
                ranges = [(z * per, min(kblocks, (z + 1) * per)) for z in range(splits)]
                assert ranges[0][0] == 0 and ranges[-1][1] == kblocks
                assert all(lo < hi for lo, hi in ranges)
                assert per >= sm90.MIN_SPLIT_STAGES


def test_mx_path_rule():
    """MX pairs on wgmma take the exact block-scaled variant by the rule where it measured faster than decoding:
    pairs of fp4 / fp6 operands by MX_FOLD_DEFAULT at any shape; pairs with mxfp8 by MX_EXACT_FROM, from its K and
    M N bounds per (operands staged per call, pair) and never without a shape; mma.sync, non-MX dtypes and
    mx_path="decode" decode; mx_path="exact" runs any MX pair on wgmma and raises elsewhere."""
    from mxcore import dtypes as _dt

    def mdt(d):
        return _dt.resolve(d, "sm_90")

    eights = {"mxfp8": ("mxfp8_e4m3", "mxfp8_e5m2", ("mxfp8_e4m3", "mxfp8_e5m2")),
              "mixed": (("mxfp8_e4m3", "mxfp4"), ("mxfp6_e2m3", "mxfp8_e5m2"))}
    assert set(families.MX_EXACT_FROM) == {(c, p) for c in (0, 1, 2) for p in eights}
    for (per_call, pair), bound in families.MX_EXACT_FROM.items():
        for d in eights[pair]:
            assert families.mx_path("wgmma", mdt(d), per_call=per_call) is None  # no shape: decode
            if bound is None:
                big = (1, 1 << 15, 1 << 15, 1 << 16)
                assert families.mx_path("wgmma", mdt(d), shape=big, per_call=per_call) is None
                continue
            k, mn = bound
            at = (1, mn // 4096, 4096, k)
            assert at[1] * at[2] == mn
            assert families.mx_path("wgmma", mdt(d), shape=at, per_call=per_call) == "mx_exact"
            assert families.mx_path("wgmma", mdt(d), shape=(3,) + at[1:], per_call=per_call) == "mx_exact"
            assert families.mx_path("wgmma", mdt(d), shape=at[:3] + (k - 32,), per_call=per_call) is None
            assert families.mx_path("wgmma", mdt(d), shape=(1, at[1] - 1, 4096, k), per_call=per_call) is None
            assert families.mx_path("wgmma", mdt(d), "decode", at, per_call) is None
            assert families.mx_path("mma_sync", mdt(d), None, at, per_call) is None
    # the measured shapes (H100): exact where it won, decode where it lost or tied
    assert families.mx_path("wgmma", mdt("mxfp8"), shape=(1, 8192, 8192, 8192), per_call=2) == "mx_exact"
    assert families.mx_path("wgmma", mdt("mxfp8"), shape=(1, 4096, 8192, 16384), per_call=2) is None
    assert families.mx_path("wgmma", mdt("mxfp8"), shape=(1, 7168, 7168, 7168), per_call=2) is None
    assert families.mx_path("wgmma", mdt(("mxfp8", "mxfp4")), shape=(1, 7168, 7168, 7168), per_call=2) == "mx_exact"
    assert families.mx_path("wgmma", mdt(("mxfp8", "mxfp4")), shape=(1, 16384, 4096, 4096), per_call=2) is None
    assert families.mx_path("wgmma", mdt("mxfp8"), shape=(1, 8192, 8192, 8192), per_call=1) == "mx_exact"
    assert families.mx_path("wgmma", mdt("mxfp8"), shape=(1, 7168, 7168, 7168), per_call=1) is None
    assert families.mx_path("wgmma", mdt("mxfp8"), shape=(1, 6144, 6144, 6144), per_call=0) == "mx_exact"
    assert families.mx_path("wgmma", mdt("mxfp8"), shape=(1, 5120, 5120, 5120), per_call=0) is None
    for d in ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", ("mxfp6_e2m3", "mxfp4")):
        for shape in (None, (1, 64, 64, 64), (1, 8192, 8192, 8192)):
            assert families.mx_path("wgmma", mdt(d), shape=shape) == ("mx_exact" if families.MX_FOLD_DEFAULT else None)
        assert families.mx_path("wgmma", mdt(d), "exact") == "mx_exact"
        assert families.mx_path("wgmma", mdt(d), "decode") is None
        assert families.mx_path("mma_sync", mdt(d)) is None
    for d in ("mxfp8", ("mxfp8", "mxfp4")):
        assert families.mx_path("wgmma", mdt(d), "exact") == "mx_exact"
    for d in ("bf16", "e4m3fn"):
        assert families.mx_path("wgmma", mdt(d), shape=(1, 8192, 8192, 8192)) is None
    with pytest.raises(UnsupportedError, match="mx_path='exact'"):
        families.mx_path("mma_sync", mdt("mxfp4"), "exact")
    with pytest.raises(UnsupportedError, match="choose one of"):
        families.mx_path("wgmma", mdt("mxfp8"), "fast")


def test_mx_factor_prep_compiles():
    require_tool("NVRTC (cuda-bindings + nvidia-cuda-nvrtc)", nvrtc_tools.have_nvrtc())
    b = nvrtc_tools.compile_cuda(source(sm90.SM90_MX_FILE), name="sm90_mx_factors", arch="sm_90",
                                 options=["-std=c++17", nvrtc_tools.FTZ_FLAG])  # as CuPy compiles
    for kernel in sm90.SM90_MX_KERNELS:
        assert b.resources[kernel]["local_bytes"] == 0, kernel
    # the fold's lost bits and mx_lo_fix's sums in IEEE fp32 (a GEMM result that is an fp32 subnormal stays one)
    assert not nvrtc_tools.ftz_ops(b.sass), nvrtc_tools.ftz_ops(b.sass)[:3]
    fix_sass = nvrtc_tools.sass_function(b.sass, "mx_lo_fix")  # launched with PDL after the GEMM:
    assert nvrtc_tools.sass_counts(fix_sass)["ACQBULK"] == 1  # one griddepcontrol.wait before it reads C
    fix = b.resources["mx_lo_fix"]  # five blocks per SM (its __launch_bounds__): 228 KB of shared memory per SM,
    assert 5 * (fix["shared_bytes"] + 1024) <= 228 * 1024, fix  # 1 KB of it reserved per block


def test_tensor_map_needs_aligned_operands():
    with pytest.raises(UnsupportedError, match="16-byte aligned"):
        sm90.tensor_map(0x1008, 2, 64, 64, 64, 64, 64)
    with pytest.raises(UnsupportedError, match="16-byte aligned"):
        sm90.tensor_map(0x1000, 2, 65, 64, 65, 64, 64)


def test_probe_kernels_compile_to_wgmma():
    require_tool("NVRTC (cuda-bindings + nvidia-cuda-nvrtc)", nvrtc_tools.have_nvrtc())
    require_tool("cuobjdump + nvdisasm", nvrtc_tools.have_cuobjdump())
    from mxcore.backends.probes import wgmma as probe

    b = nvrtc_tools.compile_cuda(source(probe.PROBE_FILE), name="probe_wgmma", arch="sm_90a", options=["-std=c++17"])
    assert set(probe.PROBE_KERNELS) <= set(b.resources)
    lines = nvrtc_tools.sass_lines(b.sass, "HGMMA")
    assert len(lines) == 3 and sum(".64x64x16." in x for x in lines) == 1 and sum(".64x16x" in x for x in lines) == 2
    assert all(r["local_bytes"] == 0 for r in b.resources.values())

