"""The CPU mirror of kernels_hip/gemm_mfma.hip (shared by the HIP tests and the stand-in runtime; not a test module).

``mirror_gemm`` executes the kernel's program structure step by step -- grid (M tiles from the launch's m_tile0,
batches through the batch strides), waves, 16-byte staging loads with their edge fallback, LDS rows (two buffers),
per-lane fragment reads, per-lane E8M0 scale reads, the guarded epilogue -- reading only the constants that
``KernelSpec.defines()`` passes to the compiler; each instruction is executed by ``mxcore.emulate.execute`` from the
layout record.  tests/test_hip_index.py checks it against ``mxcore.reference`` for every variant.
"""

from __future__ import annotations

import numpy as np
from mxcore.backends import hip

from mxcore import emulate

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


HALVES = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -1.5, 2.0, -2.0, 3.0, -3.0])  # exactly representable inputs: every partial sum is exact
