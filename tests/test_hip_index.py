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
from mxcore import emulate
from mxcore.operands import prepare
from mxcore.reference import reference_from_operands

POISON = np.float32(np.nan)


def consts(spec) -> dict:
    out = {}
    for opt in spec.defines():
        key, value = opt[2:].split("=", 1)
        try:
            out[key] = int(value)
        except ValueError:
            out[key] = value
    return out


def _flat_bytes(storage: np.ndarray, strides_major: str):
    """Device-like flat byte buffer of a 2-D storage array laid out row- ('r') or column- ('c') major,
    plus element strides; followed by 64 bytes of 0xFF so an over-read shows up as NaN/garbage."""
    arr = np.ascontiguousarray(storage if strides_major == "r" else storage.T)
    rows, cols = storage.shape
    strides = (cols, 1) if strides_major == "r" else (1, rows)
    raw = arr.view(np.uint8).reshape(-1)
    return np.concatenate([raw, np.full(64, 0xFF, np.uint8)]), strides


def _load_tile(c, buf, eb, s_r, s_k, r0, k0, rows, kdim, vec_ok, R, bku):
    """mx_load_tile for all threads: (THREADS, NV, 16) staging bytes (k0, kdim, bku in storage units)."""
    threads = 64 * c["MX_WAVES_M"] * c["MX_WAVES_N"]
    vec = 16 // eb
    nv = R * bku // vec // threads
    k_major = s_k == 1
    stage = np.zeros((threads, nv, 16), np.uint8)
    for t in range(threads):
        for i in range(nv):
            v = t + i * threads
            if k_major:
                r, kk = v // (bku // vec), (v % (bku // vec)) * vec
            else:
                kk, r = v // (R // vec), (v % (R // vec)) * vec
            gr, gk = r0 + r, k0 + kk
            full = (gr < rows and gk + vec <= kdim) if k_major else (gk < kdim and gr + vec <= rows)
            src = (gr * s_r + gk * s_k) * eb
            if vec_ok and full:
                stage[t, i] = buf[src : src + 16]
            else:
                step = s_k if k_major else s_r
                in_dim = gr < rows if k_major else gk < kdim
                avail = 0 if not in_dim else (kdim - gk if k_major else rows - gr)
                for j in range(vec):
                    if j < avail:
                        e = src + j * step * eb
                        stage[t, i, j * eb : (j + 1) * eb] = buf[e : e + eb]
    return stage


def _store_tile(c, lds, stage, eb, k_major, R, bku, pitch):
    threads, nv, _ = stage.shape
    vec = 16 // eb
    for t in range(threads):
        for i in range(nv):
            v = t + i * threads
            if k_major:
                r, kk = v // (bku // vec), (v % (bku // vec)) * vec
                lds[r * pitch + kk * eb : r * pitch + kk * eb + 16] = stage[t, i]
            else:
                kk, r = v // (R // vec), (v % (R // vec)) * vec
                for j in range(vec):
                    at = (r + j) * pitch + kk * eb
                    lds[at : at + eb] = stage[t, i, j * eb : (j + 1) * eb]


def _geometry(c, p):
    """(stored bits, storage units per tile row, LDS row pitch in bytes) of operand ``p`` ("A" / "B")."""
    eb, bk = c["MX_EB"], c["MX_BK"]
    sbits = c[f"MX_{p}_SBITS"]
    bku = bk * sbits // (8 * eb)
    return sbits, bku, bku * eb + c["MX_LDS_PAD"]


def _kunits(c, k, sbits):
    """mx_kunits: K in storage units (packed codes: K rounded up to MX_KPAD zero codes)."""
    if sbits < 8 * c["MX_EB"]:
        return -(-k // c["MX_KPAD"]) * (c["MX_KPAD"] * sbits // (8 * c["MX_EB"]))
    return k


def _frag_words(c, p, lds, row0, kk0, FR):
    """mx_load_frag for the 64 lanes: (64, WORDS) uint32 register words, each chunk of CHUNK slots copied as
    CHUNK*BITS/8 contiguous LDS bytes (the staging pass stores elements in the register format)."""
    _, _, pitch = _geometry(c, p)
    slots, bits = c[f"MX_{p}_SLOTS"], c[f"MX_{p}_BITS"]
    klane, chunk, cstride = c[f"MX_{p}_KLANE"], c[f"MX_{p}_CHUNK"], c[f"MX_{p}_CSTRIDE"]
    assert c[f"MX_{p}_SBITS"] == bits and (chunk * bits) % 8 == 0
    cb = chunk * bits // 8
    words = -(-slots * bits // 32)
    out = np.zeros((64, words * 4), np.uint8)
    for ln in range(64):
        base = (row0 + ln % FR) * pitch + (kk0 + klane * (ln // FR)) * bits // 8
        for ch in range(slots // chunk):
            src = base + ch * cstride * bits // 8
            out[ln, ch * cb : (ch + 1) * cb] = lds[src : src + cb]
    return out.view(np.uint32)


def _scale_regs(c, scales, s_r, s_b, r0, kb0, rows, blocks, FR):
    lane = np.arange(64)
    r, blk = r0 + lane % FR, kb0 + lane // FR
    out = np.full((64, 1), 127, np.uint8)
    if scales is None:
        return out
    ok = (r < rows) & (blk < blocks)
    out[ok, 0] = scales.reshape(-1)[r[ok] * s_r + blk[ok] * s_b]
    return out


def mirror_gemm(c, launch, a_buf, b_buf, sa, sb, layout, z=0):
    """D (m, n) float32 of batch ``z`` (grid Z index; the batch is z + batch0) as the kernel with constants
    ``c`` computes it over the launch's grid (M tiles from m_tile0 on); unwritten elements stay NaN."""
    eb, bk, ik = c["MX_EB"], c["MX_BK"], c["MX_IK"]
    zb = z + launch.batch0  # operands advance by their batch strides (storage units; scales: bytes)
    a_buf, b_buf = a_buf[zb * launch.sab * eb:], b_buf[zb * launch.sbb * eb:]
    sa = None if sa is None else np.asarray(sa).reshape(-1)[zb * launch.ssa:]
    sb = None if sb is None else np.asarray(sb).reshape(-1)[zb * launch.ssb:]
    IM, IN, TM, TN = c["MX_IM"], c["MX_IN"], c["MX_TM"], c["MX_TN"]
    BM, BN = c["MX_WAVES_M"] * TM * IM, c["MX_WAVES_N"] * TN * IN
    (sa_bits, bku_a, pitch_a), (sb_bits, bku_b, pitch_b) = _geometry(c, "A"), _geometry(c, "B")
    L = launch
    ka, kb = _kunits(c, L.k, sa_bits), _kunits(c, L.k, sb_bits)
    d = np.full((L.m, L.n), POISON, np.float32)
    writes = np.zeros((L.m, L.n), np.int64)
    ktiles = -(-L.k // bk)
    kblocks = -(-L.k // 32)
    a_kmaj, b_kmaj = L.sak == 1, L.sbk == 1
    blocks = L.grid[0] * L.grid[1]
    assert c["MX_XCDS"] == hip.XCDS
    for linear in range(blocks):  # block (x, y) = linear (y * gx + x) computes tile mx_xcd_order(linear)
        tile = hip.xcd_order(linear, blocks, c["MX_XCDS"])
        by, bx = divmod(tile, L.grid[0])
        m0, n0 = (by + L.m_tile0) * BM, bx * BN
        lds_a = np.zeros((2, BM * pitch_a), np.uint8)
        lds_b = np.zeros((2, BN * pitch_b), np.uint8)
        acc = {}
        sta = _load_tile(c, a_buf, eb, L.sam, L.sak, m0, 0, L.m, ka, L.a_vec_ok, BM, bku_a)
        stb = _load_tile(c, b_buf, eb, L.sbn, L.sbk, n0, 0, L.n, kb, L.b_vec_ok, BN, bku_b)
        _store_tile(c, lds_a[0], sta, eb, a_kmaj, BM, bku_a, pitch_a)
        _store_tile(c, lds_b[0], stb, eb, b_kmaj, BN, bku_b, pitch_b)
        for kt in range(ktiles):
            cur, more = kt & 1, kt + 1 < ktiles
            if more:
                sta = _load_tile(c, a_buf, eb, L.sam, L.sak, m0, (kt + 1) * bku_a, L.m, ka, L.a_vec_ok, BM, bku_a)
                stb = _load_tile(c, b_buf, eb, L.sbn, L.sbk, n0, (kt + 1) * bku_b, L.n, kb, L.b_vec_ok, BN, bku_b)
            for wave in range(c["MX_WAVES_M"] * c["MX_WAVES_N"]):
                wm = (wave // c["MX_WAVES_N"]) * TM * IM
                wn = (wave % c["MX_WAVES_N"]) * TN * IN
                for ks in range(0, bk, ik):
                    kb0 = (kt * bk + ks) // 32
                    for i in range(TM):
                        if m0 + wm + i * IM >= L.m:
                            continue  # a tile wholly outside D: computed by the GPU, never stored
                        fa = _frag_words(c, "A", lds_a[cur], wm + i * IM, ks, IM)
                        ra = emulate.unpack(layout, "a", fa)
                        for j in range(TN):
                            if n0 + wn + j * IN >= L.n:
                                continue
                            fb = _frag_words(c, "B", lds_b[cur], wn + j * IN, ks, IN)
                            rb = emulate.unpack(layout, "b", fb)
                            key = (wave, i, j)
                            prev = acc.get(key, np.zeros((64, c["MX_C_SLOTS"]), np.float32))
                            kw = {}
                            if c["MX_SCALED"]:
                                kw["scale_a"] = _scale_regs(c, sa, kblocks, 1, m0 + wm + i * IM, kb0, L.m,
                                                            kblocks, c["MX_SA_FR"])
                                kw["scale_b"] = _scale_regs(c, sb, 1, L.n, n0 + wn + j * IN, kb0, L.n,
                                                            kblocks, c["MX_SB_FR"])
                            acc[key] = emulate.execute(layout, ra, rb, prev, **kw)
            if more:
                _store_tile(c, lds_a[cur ^ 1], sta, eb, a_kmaj, BM, bku_a, pitch_a)
                _store_tile(c, lds_b[cur ^ 1], stb, eb, b_kmaj, BN, bku_b, pitch_b)
        lane = np.arange(64)[:, None]
        s = np.arange(c["MX_C_SLOTS"])[None, :]
        for (wave, i, j), regs in acc.items():
            wm = (wave // c["MX_WAVES_N"]) * TM * IM
            wn = (wave % c["MX_WAVES_N"]) * TN * IN
            r = m0 + wm + i * IM + c["MX_C_RLANE"] * (lane // IN) + (s // c["MX_C_GROUP"]) * c["MX_C_GSTRIDE"] \
                + s % c["MX_C_GROUP"]
            col = np.broadcast_to(n0 + wn + j * IN + lane % IN, r.shape)
            ok = (r < L.m) & (col < L.n)
            d[r[ok], col[ok]] = regs[ok].astype(np.float32) * np.float32(L.out_scale)
            np.add.at(writes, (r[ok], col[ok]), 1)
    assert writes.max() <= 1, "an output element is written by two lanes"
    return d


# ----------------------------------------------------------------------------- inputs and the test matrix
HALVES = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -1.5, 2.0, -2.0, 3.0, -3.0])


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
