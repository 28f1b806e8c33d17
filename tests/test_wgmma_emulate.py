"""wgmma records in the layout database and the emulator, on the CPU.

* The shared-memory canonical layouts against the PTX ISA's worked examples (9.7.15.5.1.2.1.3: "Exact layout"
  strides in elements, LBO / SBO in bytes), written out here, and the swizzle as CuTe's ``Swizzle<B,4,3>`` on byte
  addresses (bits [4, 4+B) ^= bits [7, 7+B)), written out here too.
* ``emulate.execute`` on every wgmma record, A from registers and from shared memory, every swizzle mode and both
  major-nesses, against a float64 ``A @ B + C`` of exactly representable inputs (one right answer); register words
  filled by the PTX ISA's register-fragment formulas (independent of the table).
* The database surface: names, aliases, arch filtering, the layout command's text / SVG pictures.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import ml_dtypes
import numpy as np
import pytest

from mxcore import emulate, layouts
from mxcore.errors import InputTypeError, LayoutError, ShapeError
from mxcore.layouts import hopper

WGMMA = [r for r in layouts.records("nvidia") if isinstance(r, layouts.WgmmaLayout)]
SWIZZLES = ("128B", "64B", "32B", "none")
ML = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def _swizzle(addr, mode):
    bits = {"128B": 3, "64B": 2, "32B": 1, "none": 0}[mode]
    return addr ^ (((addr >> 7) & ((1 << bits) - 1)) << 4)


def _cute(shape, stride, index):
    """CuTe's colexicographic layout function of a flat ``index`` over a flat (shape, stride)."""
    off, rest = 0, index
    for s, d in zip(shape, stride):
        off, rest = off + (rest % s) * d, rest // s
    return off


# ---------------------------------------------------------------------------------------------- PTX ISA examples
# (role, rows, cols, bits, major, swizzle, LBO bytes, SBO bytes, MN (shape, stride), K (shape, stride)) -- the
# "Exact layout" of each example, its first mode along M/N, its second along K, strides in elements; only the first
# 32 bytes of K (one wgmma) are compared.
PTX_EXAMPLES = [
    ("a", 16, 8, 32, "K", "none", 64 * 4, 32 * 4, ((8, 2), (4, 32)), ((4, 4), (1, 64))),          # Figure 166
    ("a", 16, 8, 32, "K", "32B", 16, 64 * 4, ((8, 2), (8, 64)), ((4, 4), (1, 4))),                # Figure 167
    ("b", 16, 16, 16, "MN", "none", 128 * 2, 64 * 2, ((8, 1, 2), (1, 8, 64)), ((8, 2), (8, 128))),  # Figure 168
    ("b", 16, 32, 16, "MN", "32B", 128 * 2, 256 * 2, ((8, 2, 2), (1, 8, 128)), ((8, 2), (16, 256))),  # Figure 169
    ("b", 16, 64, 16, "MN", "64B", 256 * 2, 512 * 2, ((8, 4, 2), (1, 8, 256)), ((8, 2), (32, 512))),  # Figure 170
]


@pytest.mark.parametrize("ex", PTX_EXAMPLES, ids=lambda e: f"{e[4]}-major-{e[5]}-{e[3]}bit")
def test_canonical_layouts_match_the_ptx_isa_examples(ex):
    role, rows, cols, bits, major, swz, lbo, sbo, (mshape, mstride), (kshape, kstride) = ex
    lay = layouts.SmemLayout(role, rows, cols, bits, major, swz, lbo, sbo)
    eb = bits // 8
    for r in range(rows):
        for c in range(cols):
            mn, k = (r, c) if role == "a" else (c, r)
            want = (_cute(mshape, mstride, mn) + _cute(kshape, kstride, k)) * eb
            assert lay.offsets[r, c] == want, (r, c)
            assert lay.addresses(2048)[r, c] == _swizzle(2048 + want, swz)


@pytest.mark.parametrize("swz", SWIZZLES)
def test_kernel_descriptors_read_tma_boxes(swz):
    """gemm_sm90.cu's K-major operand: rows of 128 bytes (a TMA box row each), SBO 1024, LBO 16, start stepped by 32
    bytes per wgmma along K; element (n, k) of wgmma step s sits at row n, byte 32 s + 2 k of the row, swizzled."""
    rec = layouts.get("m64n64k16.f16")
    for step in range(4):
        lay = rec.smem("b", "K", "128B", desc=hopper.descriptor(step * 32, 16, 1024, "128B"))
        k, n = np.meshgrid(np.arange(16), np.arange(64), indexing="ij")
        want = _swizzle(n * 128 + step * 32 + 2 * k, "128B")
        np.testing.assert_array_equal(lay.addresses(step * 32), want)


def test_swizzle_atom_pictures_say_which_chunk_lands_where():
    atom = hopper.SWIZZLE_ATOMS["128B"]
    logical = atom.logical_at()
    for r in range(8):
        for p in range(8):
            assert logical[r, p] == p ^ r  # 128B: chunk c of row r lands at c ^ r, an involution
    a64 = hopper.SWIZZLE_ATOMS["64B"].logical_at()
    assert a64[2].tolist() == [1, 0, 3, 2] and a64[7].tolist() == [3, 2, 1, 0]


# ---------------------------------------------------------------------------------------------- the emulator
def random_tile(rng, fmt, shape):
    """(register / shared-memory ready tile, exact float64 values)."""
    v = rng.integers(-6, 7, size=shape) * np.exp2(rng.integers(-2, 3, size=shape))
    if fmt in ML:
        return v.astype(ML[fmt]).view(np.uint8), v.astype(ML[fmt]).astype(np.float64)
    dt = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16, "tf32": np.float32, "fp32": np.float32}[fmt]
    return v.astype(dt), v


def _cases():
    out = []
    for rec in WGMMA:
        for a_smem in (True, False):
            for major in ("K", "MN") if rec.transpose else ("K",):
                out.append((rec, a_smem, major))
    return out


def _id(case):
    rec, a_smem, major = case
    return f"{rec.alias}-{'ss' if a_smem else 'rs'}-{major}"


@pytest.mark.parametrize("case", _cases(), ids=_id)
def test_execute_matches_float64_reference(case, rng):
    rec, a_smem, major = case
    A, A64 = random_tile(rng, rec.a_format, (64, rec.k))
    B, B64 = random_tile(rng, rec.b_format, (rec.k, rec.n))
    C = (rng.integers(-8, 9, size=(64, rec.n)) * 0.25).astype(np.float32)
    want = (A64 @ B64 + C).astype(np.float32)
    c = emulate.scatter(rec, "c", C)
    for swz in SWIZZLES if rec.n in (8, 24, 64, 256) else ("128B",):
        smem, db = emulate.smem_write(rec, "b", B, major=major, swizzle=swz)
        np.testing.assert_array_equal(emulate.smem_read(rec, "b", smem, db, transpose=major == "MN"), B)
        if a_smem:
            smem, da = emulate.smem_write(rec, "a", A, smem, start=-(-smem.size // 1024) * 1024, major=major,
                                          swizzle=swz)
            d = emulate.execute(rec, da, db, c, smem=smem, trans_a=major == "MN", trans_b=major == "MN")
        else:
            d = emulate.execute(rec, emulate.scatter(rec, "a", A), db, c, smem=smem, trans_b=major == "MN")
        assert d.shape == (128, rec.n // 2) and d.dtype == np.float32
        np.testing.assert_array_equal(emulate.gather(rec, "d", d), want, err_msg=swz)


@pytest.mark.parametrize("fmt", ["fp16", "tf32", "e4m3fn"])
def test_register_words_built_from_the_ptx_text(fmt, rng):
    """A's and C's registers filled by PTX ISA 9.7.15.5.1.1's fragment formulas (warp w = lane / 32 holds rows
    16w..16w+15; within a warp the m16n8k{16,8,32} A fragment and the 16x8 C fragment per 8 columns), then run."""
    rec = hopper.record(16, fmt)
    A, A64 = random_tile(rng, fmt, (64, rec.k))
    B, B64 = random_tile(rng, fmt, (rec.k, 16))
    ra = np.zeros((128, rec.a.slots), A.dtype)
    for lane in range(128):
        w, g, t = lane // 32, lane % 32 // 4, lane % 4
        for i in range(rec.a.slots):
            if fmt == "fp16":
                row, col = g + 8 * ((i // 2) % 2), 2 * t + i % 2 + 8 * (i // 4)
            elif fmt == "tf32":
                row, col = g + 8 * (i % 2), t + 4 * (i // 2)
            else:
                row, col = g + 8 * ((i // 4) % 2), 4 * t + i % 4 + 16 * (i // 8)
            ra[lane, i] = A[16 * w + row, col]
    smem, db = emulate.smem_write(rec, "b", B)
    d = emulate.execute(rec, ra, db, np.zeros((128, 8), np.float32), smem=smem)
    want = (A64 @ B64).astype(np.float32)
    for lane in range(128):
        w, g, t = lane // 32, lane % 32 // 4, lane % 4
        for s in range(8):
            assert d[lane, s] == want[16 * w + g + 8 * ((s // 2) % 2), 8 * (s // 4) + 2 * t + s % 2]


def test_immediates_and_one_rounding():
    rec = layouts.get("m64n8k16.f16")
    A = np.zeros((64, 16), np.float16)
    B = np.zeros((16, 8), np.float16)
    A[0, :2] = [1.0, 2.0 ** -12]
    B[:2, 0] = [1.0, 2.0 ** -12]
    C = np.zeros((64, 8), np.float32)
    C[0, 0] = 2.0 ** -80  # 1 + 2^-24 + 2^-80: the float64 sum is the fp32 tie, the exact sum above it
    smem, db = emulate.smem_write(rec, "b", B)
    a = emulate.scatter(rec, "a", A)
    c = emulate.scatter(rec, "c", C)
    d = emulate.gather(rec, "d", emulate.execute(rec, a, db, c, smem=smem))
    assert d[0, 0] == np.nextafter(np.float32(1), np.float32(2))
    d = emulate.gather(rec, "d", emulate.execute(rec, a, db, c, smem=smem, scale_d=False))
    assert d[0, 0] == np.float32(1)  # scale-d 0: D = A B, C dropped
    d = emulate.gather(rec, "d", emulate.execute(rec, a, db, c, smem=smem, imm_scale_a=-1, scale_d=False))
    assert d[0, 0] == np.float32(-1)


def test_wgmma_errors_name_the_fix():
    rec = layouts.get("m64n64k8.tf32")
    smem, db = emulate.smem_write(rec, "b", np.zeros((8, 64), np.float32))
    c = np.zeros((128, 32), np.float32)
    with pytest.raises(LayoutError, match="K-major only"):
        emulate.smem_write(rec, "b", np.zeros((8, 64), np.float32), major="MN")
    with pytest.raises(LayoutError, match="imm-trans"):
        emulate.execute(rec, np.zeros((128, 4), np.float32), db, c, smem=smem, trans_b=True)
    with pytest.raises(ShapeError, match="pass smem"):
        emulate.execute(rec, np.zeros((128, 4), np.float32), db, c)
    with pytest.raises(InputTypeError, match="descriptor"):
        emulate.execute(rec, np.zeros((128, 4), np.float32), np.zeros((128, 4)), c, smem=smem)
    with pytest.raises(ShapeError, match="reaches byte"):
        emulate.smem_read(rec, "b", smem[:100], db)
    with pytest.raises(InputTypeError, match="uint8"):
        emulate.smem_read(rec, "b", smem.astype(np.int32), db)
    with pytest.raises(LayoutError, match="shared memory through a descriptor"):
        emulate.scatter(rec, "b", np.zeros((8, 64)))
    with pytest.raises(LayoutError, match="base offset"):
        emulate.smem_read(rec, "b", smem, db | (1 << 49))
    with pytest.raises(LayoutError, match="wgmma operands"):
        mma = layouts.get("m16n8k8.tf32")
        emulate.execute(mma, np.zeros((32, 4)), np.zeros((32, 2)), np.zeros((32, 4)), smem=smem)
    with pytest.raises(LayoutError, match="reads no shared memory"):
        emulate.smem_write(layouts.get("m16n8k8.tf32"), "b", np.zeros((8, 8)))
    with pytest.raises(LayoutError, match="overlap"):
        rec.smem("b", lbo=16, sbo=16)


def test_pack_round_trip_of_register_operands(rng):
    for rec in (layouts.get("m64n256k16.bf16"), layouts.get("m64n8k32.e5m2.e4m3"), layouts.get("m64n40k8.tf32")):
        for role, op in rec.operands().items():
            tile, _ = random_tile(rng, rec.format_of(role), op.shape)
            regs = emulate.scatter(rec, role, tile)
            words = emulate.pack(rec, role, regs)
            assert words.shape == (128, op.registers)
            np.testing.assert_array_equal(emulate.unpack(rec, role, words).astype(np.float64), regs.astype(np.float64))


# ---------------------------------------------------------------------------------------------- the database surface
def test_names_aliases_and_archs():
    nv = layouts.names("nvidia")
    wg = [n for n in nv if n.startswith("wgmma.")]
    assert len(wg) == len(hopper.KERNEL_N) * 7 == len(WGMMA)
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in wg
    assert set(wg) <= set(layouts.names("nvidia", "sm_90a")) and not set(wg) & set(layouts.names(arch="sm_90"))
    rec = layouts.get("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16")
    assert rec is layouts.get("m64n128k16.f16") is layouts.get("wgmma.m64n128k16.f16") is hopper.record(128, "fp16")
    assert layouts.get("m64n64k32.e4m3.e4m3") is layouts.get("m64n64k32.e4m3")
    assert layouts.get("m64n192k32.e5m2.e4m3").ptx.endswith("m64n192k32.f32.e5m2.e4m3")
    assert layouts.get("m64n256k8.tf32", a_format="tf32", arch="sm_90a").k == 8
    with pytest.raises(LayoutError, match="sm_90a"):
        layouts.get("m64n256k8.tf32", arch="sm_90")
    assert rec.key == "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16@sm_90a" and rec.lanes == 128
    text = str(rec)
    for part in ("128 lanes", "m64n128k16.f16", "imm-trans-b", "SBO 1024", "Swizzle<3,4,3>"):
        assert part in text


def test_layout_command_lists_and_draws_wgmma(capsys, tmp_path):
    assert layouts._cli(["--list", "--arch", "sm_90a"]) == 0
    listed = capsys.readouterr().out.split()
    assert "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16" in listed
    assert layouts._cli(["wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16", "--operand", "C"]) == 0
    out = capsys.readouterr().out
    assert "T127:v63" in out  # D[63][127]: warp 3, groupID 7, thread 3, slot 63
    assert layouts._cli(["m64n64k16.bf16", "--operand", "B", "--major", "MN", "--swizzle", "32B"]) == 0
    out = capsys.readouterr().out
    assert "32B swizzle atom" in out and "MN-major, swizzle 32B" in out
    assert layouts._cli(["m64n64k8.tf32", "--operand", "B", "--major", "MN"]) == 2
    assert "K-major only" in capsys.readouterr().err
    assert layouts._cli(["m16n8k16.f16", "--swizzle", "64B"]) == 2
    target = tmp_path / "b.svg"
    assert layouts._cli(["m64n128k16.f16", "--operand", "A_smem", "--out", str(target)]) == 0
    root = ET.fromstring(target.read_text())
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert sum(1 for t in texts if t and t.startswith("128B swizzle atom")) == 1
    rects = root.findall("{http://www.w3.org/2000/svg}rect")
    assert len(rects) == 1 + 8 * 8 + 64 * 2  # background, the atom's 8 x 8 chunks, A's 64 rows x 2 chunks


def test_render_panels_follow_the_swizzle():
    text = layouts.render("m64n16k16.f16", "B", fmt="text", swizzle="128B")
    rows = [ln.split() for ln in text.splitlines() if re.match(r"\s*\d+\s+\S+:\S+", ln)]
    atom_rows, tile_rows = rows[:8], rows[8:]
    assert atom_rows[3][1:] == [f"c{p ^ 3}:@{384 + 16 * p}" for p in range(8)]
    assert tile_rows[5][1:] == ["@720:p5", "@704:p4"]  # row n = 5: K chunks 0, 1 at physical chunks 5, 4
    with pytest.raises(LayoutError, match="apply to wgmma"):
        layouts.render("m16n8k16.f16", "A", fmt="text", swizzle="64B")


def test_png_of_a_shared_memory_operand():
    import importlib.util

    from mxcore.errors import BackendUnavailableError

    if importlib.util.find_spec("PIL") is None:
        with pytest.raises(BackendUnavailableError, match="Pillow"):
            layouts.render("m64n64k16.f16", "B", fmt="png", swizzle="32B")
    else:
        assert layouts.render("m64n64k16.f16", "B", fmt="png", swizzle="32B")[:8] == b"\x89PNG\r\n\x1a\n"
