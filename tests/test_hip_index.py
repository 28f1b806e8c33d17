"""CPU run of every HIP GEMM variant's index arithmetic: a Python interpreter of the kernel's -D constants.

``mirror_gemm`` executes kernels_hip/gemm_mfma.hip's program structure step by step -- grid (M tiles from the
launch's m_tile0, batches through the batch strides), waves,
16-byte staging loads with their edge fallback, LDS rows (two buffers), per-lane fragment reads (stored
bytes copied into the registers; fp4 / fp6 packed along K by ``hip.operand_storage``), per-lane E8M0 scale
reads, the guarded epilogue -- reading only the constants that ``KernelSpec.defines()`` passes to the
compiler.  Each instruction is executed by ``mxcore.emulate.execute`` from the layout record (the register
words are unpacked with the record's bit offsets, so the staging pass's packing is checked against the
database), and the result is compared
with ``mxcore.reference``.  Inputs are exactly representable (small multiples of 1/2), so every
partial sum is exact and the comparison is bit-exact.
"""

from __future__ import annotations

import numpy as np
import pytest
from mxcore.backends import hip

from mxcore import dtypes as _dt
from mxcore.operands import prepare
from mxcore.reference import reference_from_operands

from _hip_mirror import HALVES, _flat_bytes, consts, mirror_gemm


def _inputs(rng, m, n, k):
    """Small multiples of 1/2 times a power of two per (row, 32-K block) of A and (block, column) of B,
    so MX block scales differ from block to block and a wrong scale lane shows."""
    kb = -(-k // 32)
    ea = np.repeat(rng.integers(-3, 4, size=(m, kb)), 32, axis=1)[:, :k]
    eb = np.repeat(rng.integers(-3, 4, size=(kb, n)), 32, axis=0)[:k, :]
    a = rng.choice(HALVES, size=(m, k)) * np.exp2(ea)
    b = rng.choice(HALVES, size=(k, n)) * np.exp2(eb)
    return a, b


def _mdt(spec, which=0):
    name = spec.dtypes[which] if isinstance(which, int) else which
    pair = name.split(",")
    return _dt.resolve(tuple(pair) if len(pair) == 2 else name, spec.arch)


def run_variant(spec, rng, m, n, k, majors=("r", "r"), misalign=False, which=0, tweak=None):
    mdt = _mdt(spec, which)
    a, b = _inputs(rng, m, n, k)
    opa, opb = prepare(a, b, mdt)
    for op in (opa, opb):  # enough blocks that equal scales everywhere would be a generator bug
        if op.scales is not None and op.scales.size >= 16:
            assert len(np.unique(op.scales)) > 1
    want = reference_from_operands(opa, opb, "float32")
    sa_store, sb_store = hip.operand_storage(opa, spec, "a"), hip.operand_storage(opb, spec, "b")
    # packed fp4 / fp6 operands are K-contiguous whatever the caller's major (the staging pass transposes)
    majors = ("r" if spec.packed("a") else majors[0], "c" if spec.packed("b") else majors[1])
    a_buf, a_str = _flat_bytes(sa_store, majors[0])
    b_buf, b_str = _flat_bytes(sb_store, majors[1])
    launch = hip.plan_launch(spec, m, n, k, a_str, b_str, a_addr=8 if misalign else 0, b_addr=0,
                             out_scale=opa.tensor_scale * opb.tensor_scale)
    c = consts(spec)
    if tweak:
        c.update(tweak)
    got = mirror_gemm(c, launch, a_buf, b_buf, opa.scales, opb.scales, spec.layout())
    np.testing.assert_array_equal(got, want)
    return launch


def _small(spec):
    """A shape with a K tail and two+ K tiles (double buffering), ragged M/N edges."""
    k = 2 * spec.bk + 7
    return 37, 21, k


ALL = [s for arch in hip.ARCHS for s in hip.kernel_specs(arch)]


@pytest.mark.parametrize("spec", ALL, ids=lambda s: f"{s.arch}-{s.entry}")
def test_variant_index_arithmetic(spec, rng):
    """Row-major A (K-contiguous, vector path) and row-major B (N-contiguous, transposing path)."""
    launch = run_variant(spec, rng, *_small(spec))
    assert launch.a_vec_ok == 0 or launch.sak == 1


# one representative per operand class for the other majors, misalignment and several blocks
_REPS = {("gfx942", "fp32"), ("gfx942", "tf32"), ("gfx942", "bf16"), ("gfx942", "e4m3fnuz,e5m2fnuz"),
         ("gfx950", "fp16"), ("gfx950", "mxfp4"), ("gfx950", "mxfp6_e3m2,mxfp8_e4m3"), ("gfx950", "mxfp6_e2m3")}
REPS = [s for s in ALL if (s.arch, s.dtype) in _REPS and s.shape[0] == 16]


@pytest.mark.parametrize("spec", REPS, ids=lambda s: f"{s.arch}-{s.entry}")
def test_column_major_and_unaligned(spec, rng):
    """Column-major A (transposing path) and column-major B (K-contiguous), unaligned base: element loads."""
    launch = run_variant(spec, rng, 19, 33, spec.bk + 5, majors=("c", "c"), misalign=True)
    assert launch.a_vec_ok == 0 and (launch.sam == 1 or spec.packed("a")) and launch.sbk == 1


@pytest.mark.parametrize("spec", REPS[:3], ids=lambda s: f"{s.arch}-{s.entry}")
def test_several_blocks(spec, rng):
    bm, bn, _ = spec.tile
    run_variant(spec, rng, bm + 3, 2 * bn + 1, spec.bk + 1, majors=("r", "c"))


def test_ocp_fp8_shares_the_mx_kernel(rng):
    """Plain OCP fp8 on gfx950 runs the MX fp8 kernel with no scale arrays (the kernel reads 127)."""
    spec = hip.select_spec("gfx950", _dt.resolve("e4m3fn", "gfx950"), 20, 20)
    assert spec.scaled and "e4m3fn" in spec.dtypes
    run_variant(spec, rng, 20, 20, 70, which=spec.dtypes.index("e4m3fn"))


@pytest.mark.parametrize("arch,dtype,key,bad", [
    ("gfx950", "fp16", "MX_A_KLANE", 4),
    ("gfx950", "fp16", "MX_C_RLANE", 8),
    ("gfx950", "mxfp4", "MX_SA_FR", 32),
    ("gfx950", "mxfp6_e2m3", "MX_B_KLANE", 16),
    ("gfx950", "mxfp8_e4m3", "MX_B_CSTRIDE", 32),
    ("gfx942", "e4m3fnuz,e5m2fnuz", "MX_B_KLANE", 4),
])
def test_mirror_catches_a_wrong_constant(rng, arch, dtype, key, bad):
    """The mirror reads the generated constants: one wrong value must break the result."""
    spec = next(s for s in ALL if s.arch == arch and s.dtype == dtype and s.shape[0] == 16)
    assert consts(spec)[key] != bad
    m, n, k = 16, 16, 2 * spec.bk
    run_variant(spec, rng, m, n, k)
    with pytest.raises(AssertionError):
        run_variant(spec, rng, m, n, k, tweak={key: bad})


def test_tf32_on_gfx950_uses_the_fp32_kernel(rng):
    """CDNA4 has no xf32 MFMA: tf32 inputs are rounded on the host and run through v_mfma_f32_16x16x4_f32."""
    mdt = _dt.resolve("tf32", "gfx950")
    spec = hip.select_spec("gfx950", mdt, 30, 30)
    assert spec.instruction == "v_mfma_f32_16x16x4_f32" and "tf32" in hip.supported_dtype_names("gfx950")
    a = rng.standard_normal((30, 40)).astype(np.float32)  # not tf32-representable: the host must round
    b = rng.standard_normal((40, 30)).astype(np.float32)
    opa, _opb = prepare(a, b, mdt)
    store = hip.operand_storage(opa, spec, "a").view(np.float32)
    assert np.array_equal(store.astype(np.float64), opa.to_float64())
    assert not np.array_equal(store, a)


@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 70, 3), (65, 1, 33), (2, 3, 129)])
@pytest.mark.parametrize("dtype", ["fp16", "mxfp4"])
def test_degenerate_shapes(rng, shape, dtype):
    spec = hip.select_spec("gfx950", _dt.resolve(dtype, "gfx950"), shape[0], shape[1])
    run_variant(spec, rng, *shape)
    run_variant(spec, rng, *shape, majors=("c", "c"))


@pytest.mark.parametrize("xcds", [8, 6, 4, 1])
def test_xcd_order_is_a_bijection(xcds):
    """The chiplet-aware block order renumbers every grid size onto every tile exactly once, and chiplet c
    (blocks c, c+xcds, ...) gets one contiguous run of tiles."""
    for blocks in [*range(1, 70), 255, 256, 257, 1000]:
        tiles = [hip.xcd_order(b, blocks, xcds) for b in range(blocks)]
        assert sorted(tiles) == list(range(blocks))
        for c in range(min(xcds, blocks)):
            run = tiles[c::xcds]
            assert run == list(range(run[0], run[0] + len(run)))


def test_xcd_order_is_the_kernels(tmp_path):
    """gemm_mfma.hip's mx_xcd_order, compiled for the host (clang-22, no libc) and called through ctypes,
    equals the mirror's hip.xcd_order for every block of many grid sizes."""
    import ctypes
    import re
    import subprocess

    from conftest import require_tool
    from mxcore.backends import hip_tools

    from mxcore.kernels import kernel_source

    require_tool("clang-22", hip_tools.have_clang())
    src = kernel_source("amd", hip.SOURCE_FILE)
    body = re.search(r"__device__ __forceinline__ int mx_xcd_order\(int L, int G\) \{.*?\n\}\n", src, re.S)
    assert body, "mx_xcd_order not found in gemm_mfma.hip"
    fn = body.group(0).replace("__device__ __forceinline__ int mx_xcd_order", 'extern "C" int mx_xcd_order')
    (tmp_path / "x.cpp").write_text(f"#define MX_XCDS {hip.XCDS}\n{fn}")
    lib = tmp_path / "x.so"
    subprocess.run([hip_tools.CLANG, "-x", "c++", "-O2", "-shared", "-fPIC", "-nostdlib", str(tmp_path / "x.cpp"),
                    "-o", str(lib)], check=True, capture_output=True)
    f = ctypes.CDLL(str(lib)).mx_xcd_order
    for blocks in [*range(1, 40), 256, 1001]:
        assert [f(b, blocks) for b in range(blocks)] == [hip.xcd_order(b, blocks) for b in range(blocks)]


def test_grid_split_covers_tall_m(rng):
    """M tiles beyond the device's grid-Y limit: the launch splits into pieces (m_tile0 offsets) that together
    write every output element exactly once."""
    spec = hip.select_spec("gfx950", _dt.resolve("fp16", "gfx950"), 16, 16)
    bm = spec.tile[0]
    m, n, k = 3 * bm + 5, 20, spec.bk + 3
    a, b = _inputs(rng, m, n, k)
    opa, opb = prepare(a, b, _dt.resolve("fp16", "gfx950"))
    a_buf, a_str = _flat_bytes(hip.operand_storage(opa, spec, "a"), "r")
    b_buf, b_str = _flat_bytes(hip.operand_storage(opb, spec, "b"), "c")
    launch = hip.plan_launch(spec, m, n, k, a_str, b_str)
    pieces = launch.pieces((2**31 - 1, 3, 65535))
    assert [p.grid[1] for p in pieces] == [3, 1] and [p.m_tile0 for p in pieces] == [0, 3]
    got = np.full((m, n), np.nan, np.float32)
    writes = np.zeros((m, n), int)
    for p in pieces:
        part = mirror_gemm(consts(spec), p, a_buf, b_buf, None, None, spec.layout())
        done = ~np.isnan(part)
        got[done] = part[done]
        writes += done
    assert writes.max() == 1 and writes.min() == 1
    np.testing.assert_array_equal(got, reference_from_operands(opa, opb, "float32"))


@pytest.mark.parametrize("dtype,shared_b", [("fp16", True), ("bf16", False), ("mxfp4", False), ("mxfp8", True)])
def test_batched_launch(rng, dtype, shared_b):
    """(B, M, K) @ (B, K, N) and (B, M, K) @ (K, N) in one launch: batch in grid Z, batch strides for A, B, D
    and the scale arrays (0 for a shared B); split along Z as well."""
    mdt = _dt.resolve(dtype, "gfx950")
    batch, m, n, k = 3, 21, 18, 70
    spec = hip.select_spec("gfx950", mdt, m, n)
    ops = []
    for _ in range(batch):
        a, b = _inputs(rng, m, n, k)
        ops.append(prepare(a, b, mdt))
    if shared_b:
        ops = [(oa, ops[0][1]) for oa, _ in ops]
    a_st = np.stack([hip.operand_storage(oa, spec, "a") for oa, _ in ops])
    b_list = [hip.operand_storage(ob, spec, "b") for _, ob in (ops[:1] if shared_b else ops)]
    kua, kub = a_st.shape[2], b_list[0].shape[0]  # K in storage units (packed fp4: bytes)
    if spec.packed("b"):  # K-contiguous B: each matrix stored as its (N, K units) transpose
        b_st, b_strides = np.stack([x.T for x in b_list]), (1, kub)
    else:
        b_st, b_strides = np.stack(b_list), (n, 1)
    a_buf = np.concatenate([a_st.view(np.uint8).reshape(-1), np.full(64, 0xFF, np.uint8)])
    b_buf = np.concatenate([b_st.view(np.uint8).reshape(-1), np.full(64, 0xFF, np.uint8)])
    sa = sb = None
    ssa = ssb = 0
    if mdt.kind == "mx":
        sa = np.stack([oa.scales for oa, _ in ops])
        sb = ops[0][1].scales[None] if shared_b else np.stack([ob.scales for _, ob in ops])
        ssa, ssb = sa[0].size, 0 if shared_b else sb[0].size
    launch = hip.plan_launch(spec, m, n, k, (kua, 1), b_strides, batch=batch,
                             batch_strides=(m * kua, 0 if shared_b else kub * n, m * n),
                             scale_batch_strides=(ssa, ssb))
    assert launch.grid[2] == batch
    pieces = launch.pieces((2**31 - 1, 65535, 2))
    assert [(p.grid[2], p.batch0) for p in pieces] == [(2, 0), (1, 2)]
    for p in pieces:
        for z in range(p.grid[2]):
            got = mirror_gemm(consts(spec), p, a_buf, b_buf, sa, sb, spec.layout(), z=z)
            want = reference_from_operands(*ops[p.batch0 + z], "float32")
            np.testing.assert_array_equal(got, want, err_msg=f"batch {p.batch0 + z}")


def test_fragment_types_are_the_header_types():
    """fragments.frag_type names a typedef of kernels_hip/mx_types.h for every operand of every AMD record, and the
    typedef's size is the record's register count (the f8f6f4 builtins always take 8 registers)."""
    import re

    from mxcore import layouts
    from mxcore.kernels import kernel_source

    base = {"float": 4, "_Float16": 2, "short": 2, "__bf16": 2, "long": 8, "int": 4}
    sizes = {}
    for t, name, n in re.findall(r"typedef\s+(\w+)\s+(mx_\w+)(?:\s+__attribute__\(\(ext_vector_type\((\d+)\)\)\))?;",
                                 kernel_source("amd", "mx_types.h")):
        sizes[name] = base[t] * int(n or 1)
    recs = layouts.records("amd")
    assert len(recs) > 50
    for rec in recs:
        for role in ("a", "b", "c"):
            name = hip.frag_type(rec, role)
            want = 32 if rec.cbsz is not None and role != "c" else 4 * getattr(rec, role).registers
            assert sizes.get(name) == want, f"{rec.name} {rec.a_format}x{rec.b_format} {role}: {name}"
