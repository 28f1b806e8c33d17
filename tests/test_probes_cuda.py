"""NVIDIA probe kernels: one mma.sync / ldmatrix per kernel, fed and read through the layout table.

CPU: the register packing against the PTX ISA's fragment formulas (written out here, independent of the
table), the arange experiment against the emulator, and every probe compiled with NVRTC to a cubin for each
arch it exists on (sm_80 / sm_89 / sm_90), its SASS checked for exactly the instruction.
GPU (marker nvidia_gpu): every probe run with arange inputs (where did each element go?), with random inputs
whose products and sums are exact (bit-exact against the reference and the emulator), and with arbitrary
random inputs (within a bound); ldmatrix probes compared lane by lane with the table.
"""

from __future__ import annotations

import numpy as np
import pytest
from mxcore.backends import probes

from mxcore import layouts
from mxcore.errors import KernelCompileError

MMA = [layouts.get(n) for n in layouts.names("nvidia") if n.startswith("mma.sync") and "block_scale" not in n]
BLOCK_SCALED = [layouts.get(n) for n in layouts.names("nvidia") if "block_scale" in n]  # sm_120a
LDMATRIX = [layouts.get(n) for n in layouts.names("nvidia", kind="ldmatrix")]
COMPILE_CASES = [(rec, arch) for rec in MMA + LDMATRIX for arch in
                 (probes.ldmatrix_probe_kernel(rec) if rec in LDMATRIX else probes.probe_kernel(rec)).archs]


def _id(rec) -> str:
    return rec.name


def _is_fp8(rec) -> bool:
    return rec.a_format in ("e4m3fn", "e5m2")


# ---------------------------------------------------------------------------------------------- independent oracle
# PTX ISA 9.7.14.5.x, "Matrix fragments for mma.m16n8k*": groupID g = lane >> 2, threadID_in_group t = lane % 4.
def _ptx_a_m16n8k16_f16(lane, slot):
    g, t = lane >> 2, lane % 4
    row = g + 8 * ((slot >> 1) & 1)
    col = 2 * t + (slot & 1) + 8 * (slot >> 2)
    return row, col


def _ptx_a_m16n8k32_f8(lane, slot):
    g, t = lane >> 2, lane % 4
    row = g + 8 * ((slot >> 2) & 1)
    col = 4 * t + (slot & 3) + 16 * (slot >> 3)
    return row, col


def _ptx_c_m16n8(lane, slot):
    g, t = lane >> 2, lane % 4
    return g + 8 * (slot >> 1), 2 * t + (slot & 1)


def _ldmatrix_oracle(lane, slot, trans):
    """PTX ldmatrix: lane l receives, in register j, row l>>2 of matrix j, columns 2*(l%4) and +1 (low half
    first); with .trans the stored matrix is read column-wise (row and column swap)."""
    j, r, c = slot // 2, lane >> 2, 2 * (lane % 4) + slot % 2
    return (j, c, r) if trans else (j, r, c)


@pytest.mark.parametrize(
    "name, role, oracle, bits",
    [
        ("m16n8k16.f16", "a", _ptx_a_m16n8k16_f16, 16),
        ("m16n8k16.bf16", "a", _ptx_a_m16n8k16_f16, 16),
        ("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32", "a", _ptx_a_m16n8k32_f8, 8),
        ("m16n8k16.f16.f16acc", "c", _ptx_c_m16n8, 16),
        ("m16n8k8.tf32", "c", _ptx_c_m16n8, 32),
    ],
)
def test_probe_registers_hold_what_the_ptx_isa_says(name, role, oracle, bits):
    """The words a probe kernel loads: tiles scattered and packed through the table; lane l's register r,
    bits [b*bits, (b+1)*bits), holds the element the PTX ISA names for slot r*(32/bits)+b.  Two tiles (each
    element's row index, then its column index, as bit patterns) so that 8-bit codes suffice."""
    from mxcore import emulate

    rec = layouts.get(name)
    op = getattr(rec, role)
    rows, cols = op.shape
    storage = {8: np.uint8, 16: np.uint16, 32: np.uint32}[bits]
    fmt = rec.format_of(role)
    per_reg = 32 // bits
    assert op.registers * per_reg == op.slots
    for axis, index in enumerate(np.indices((rows, cols))):
        tile = index.astype(storage)
        if fmt in ("fp16", "bf16", "fp32", "tf32"):  # value registers: the same bit patterns as floats
            import ml_dtypes

            tile = tile.view({"fp16": np.float16, "bf16": ml_dtypes.bfloat16}.get(fmt, np.float32))
        words = emulate.pack(rec, role, emulate.scatter(rec, role, tile))
        assert words.shape == (32, op.registers)
        for lane in range(32):
            for slot in range(op.slots):
                reg, part = divmod(slot, per_reg)
                got = (int(words[lane, reg]) >> (part * bits)) & ((1 << bits) - 1)
                assert got == oracle(lane, slot)[axis], f"lane {lane} slot {slot} ({'row' if axis == 0 else 'col'})"


@pytest.mark.parametrize("rec", LDMATRIX, ids=_id)
def test_ldmatrix_table_matches_ptx_isa(rec):
    trans = ".trans" in rec.name
    n = probes.ldmatrix_count(rec)
    want = np.zeros((32, 2 * n), dtype=np.int64)
    for lane in range(32):
        for slot in range(2 * n):
            j, r, c = _ldmatrix_oracle(lane, slot, trans)
            want[lane, slot] = (j * 8 + r) * 8 + c
    np.testing.assert_array_equal(probes.ldmatrix_expected(rec), want)
    offs = probes.ldmatrix_row_offsets(rec)
    np.testing.assert_array_equal(offs[: 8 * n], np.arange(8 * n) * 8)  # lane q*8+r supplies row r of matrix q


def test_probe_entries_are_unique_and_named_after_the_instruction():
    entries = [probes.probe_kernel(r).entry for r in MMA] + [probes.ldmatrix_probe_kernel(r).entry for r in LDMATRIX]
    assert len(set(entries)) == len(entries)
    assert probes.probe_kernel(layouts.get("m16n8k16.f16")).entry == "mx_probe_m16n8k16_row_col_f32_f16_f16_f32"
    assert probes.ldmatrix_probe_kernel(layouts.get("ldmatrix.x4.trans")).entry == \
        "mx_probe_ldmatrix_m8n8_x4_trans_shared_b16"


@pytest.mark.parametrize("rec", MMA, ids=_id)
def test_arange_experiment_finds_every_element_on_the_emulator(rec):
    """The where-did-it-go experiment, run on the emulator, recovers the identity: the driver itself works."""
    for role in ("a", "b"):
        where = probes.arange_probe(rec, role, lambda a, b, c: probes.run_matrices(rec, a, b, c))
        assert probes.where_elements(rec, role, where) == []
        assert (where >= 0).all()


def test_arange_experiment_reports_a_wrong_table():
    """A 'hardware' that reads two lanes swapped is caught, and the message names both lanes."""
    rec = layouts.get("m16n8k16.f16")
    from mxcore import emulate

    def swapped(a, b, c):
        regs = probes.registers.slots(rec, "a", a)
        regs = regs.copy()
        regs[[0, 5]] = regs[[5, 0]]
        d = emulate.execute(rec, regs, probes.registers.slots(rec, "b", b), probes.registers.slots(rec, "c", c))
        return emulate.gather(rec, "c", np.asarray(d, dtype=np.float64))

    diffs = probes.where_elements(rec, "a", probes.arange_probe(rec, "a", swapped))
    assert len(diffs) == 2 * rec.a.slots
    assert any("lane 5" in d and "lane 0" in d for d in diffs)


# ---------------------------------------------------------------------------------------------- compile checks
_SHAPE = {"m16n8k4": "1684", "m16n8k8": "1688", "m16n8k16": "16816", "m16n8k32": "16832"}
_MMA_OPS = ("HMMA", "QMMA", "IMMA", "DMMA")


def _tools():
    from conftest import require_tool
    from mxcore.backends import nvrtc_tools

    require_tool("NVRTC", nvrtc_tools.have_nvrtc())
    require_tool("cuobjdump", nvrtc_tools.have_cuobjdump())
    return nvrtc_tools


@pytest.mark.parametrize("rec, arch", COMPILE_CASES, ids=lambda x: x if isinstance(x, str) else x.name)
def test_probe_compiles_to_exactly_its_instruction(rec, arch):
    nt = _tools()
    is_ldm = rec in LDMATRIX
    pk = probes.ldmatrix_probe_kernel(rec) if is_ldm else probes.probe_kernel(rec)
    binary = nt.compile_cuda(pk.source(), name=pk.entry, arch=arch, options=pk.options)
    res = binary.resources[pk.entry]
    print(f"{pk.entry} {arch}: {res}")
    assert res["local_bytes"] == 0 and res["spill_stores"] == 0
    counts = nt.sass_counts(binary.sass)
    assert counts["LDL"] == 0 and counts["STL"] == 0
    lines = {op: nt.sass_lines(binary.sass, op) for op in (*_MMA_OPS, "LDSM", "F2FP")}
    if is_ldm:
        n = probes.ldmatrix_count(rec)
        kind = "MT88" if ".trans" in rec.name else "M88"
        suffix = "" if n == 1 else f".{n}"  # cuobjdump writes LDSM.16.M88 for .x1
        assert [line.split()[0] for line in lines["LDSM"]] == [f"LDSM.16.{kind}{suffix}"]
        assert not any(lines[op] for op in _MMA_OPS)
        return
    shape = _SHAPE[rec.name.split(".")[3]]
    assert not lines["LDSM"]
    if _is_fp8(rec) and arch == "sm_89":  # native fp8 tensor cores
        fa, fb = ({"e4m3fn": "E4M3", "e5m2": "E5M2"}[f] for f in (rec.a_format, rec.b_format))
        assert [line.split()[0] for line in lines["QMMA"]] == [f"QMMA.{shape}.F32.{fa}.{fb}"]
        assert not lines["HMMA"]
    elif _is_fp8(rec):  # sm_90: mma.sync fp8 is emulated -- fp8->f16 conversions and two m16n8k16 HMMAs
        assert not lines["QMMA"]
        assert lines["F2FP"] and all("UNPACK_B" in line for line in lines["F2FP"])
        assert [line.split()[0] for line in lines["HMMA"]] == ["HMMA.16816.F32"] * 2
    else:
        acc = ".F32" if rec.c_format == "fp32" else ".F16"
        assert len(lines["HMMA"]) == 1 and lines["HMMA"][0].split()[0].startswith(f"HMMA.{shape}{acc}")
        assert not lines["QMMA"]
    # the generic expectation in probes (used by tools) agrees with the one written out here
    for op, (count, fragment) in probes.expected_sass(rec, arch).items():
        assert lines[op] and all(fragment in line for line in lines[op])
        assert count is None or len(lines[op]) == count


def test_fp8_probe_does_not_compile_for_sm_80():
    nt = _tools()
    rec = layouts.get("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32")
    assert "sm_80" not in probes.probe_kernel(rec).archs
    pk = probes.probe_kernel(rec)
    with pytest.raises(KernelCompileError):
        nt.compile_cuda(pk.source(), name=pk.entry, arch="sm_80", options=pk.options)


# ---------------------------------------------------------------------------------------------- on the GPU
def _require_arch(rec, cupy_device):
    cc = int(cupy_device.compute_capability)
    if cc < 80:
        pytest.skip(f"mma.sync probes need sm_80+, this GPU is sm_{cc}")
    if _is_fp8(rec) and cc < 89:
        pytest.skip(f"fp8 mma.sync needs sm_89+, this GPU is sm_{cc}")


def _on_gpu(rec):
    return lambda a, b, c: probes.run_matrices(rec, a, b, c, device="cuda")


def check_arange(rec):
    """Arange A with identity-like B (and the reverse): every element is read from the (lane, slot) the
    table says.  A failure lists, per element, where the hardware read it from."""
    for role in ("a", "b"):
        where = probes.arange_probe(rec, role, _on_gpu(rec))
        diffs = probes.where_elements(rec, role, where)
        assert not diffs, f"{rec.name} operand {role}: {len(diffs)} disagreements\n" + "\n".join(diffs[:40])


def check_random_exact(rec, rng):
    """Random inputs whose products and sums are exact: hardware == reference == emulator, bit for bit."""
    grid = probes.exact_grid(rec)
    for _ in range(3):
        a = probes.exact_values(rec.a_format, (rec.m, rec.k), rng, **grid)
        b = probes.exact_values(rec.b_format, (rec.k, rec.n), rng, **grid)
        c = probes.exact_values(rec.c_format, (rec.m, rec.n), rng, grid=grid["grid"] ** 2, vmax=grid["vmax"] ** 2)
        ref = probes.reference_d(rec, a, b, c)
        hw = probes.run_matrices(rec, a, b, c, device="cuda")
        np.testing.assert_array_equal(hw, ref, err_msg=f"{rec.name}: hardware vs reference")
        np.testing.assert_array_equal(probes.run_matrices(rec, a, b, c), ref, err_msg=f"{rec.name}: emulator")


def check_random(rec, rng):
    """Arbitrary finite inputs (every fp8 code, normals for 16/32-bit formats): hardware within a few units
    in the last place of the reference and of the emulator."""
    a = probes.random_values(rec.a_format, (rec.m, rec.k), rng)
    b = probes.random_values(rec.b_format, (rec.k, rec.n), rng)
    c = probes.random_values(rec.c_format, (rec.m, rec.n), rng)
    hw = probes.run_matrices(rec, a, b, c, device="cuda")
    ref = probes.reference_d(rec, a, b, c)
    emu = probes.run_matrices(rec, a, b, c)
    bound = probes.error_bound(rec, a, b, c)
    assert np.all(np.isfinite(hw))
    worst = np.max(np.abs(hw - ref) / bound)
    print(f"{rec.name}: max |hw - ref| / bound = {worst:.3g}; hw == ref in {np.mean(hw == ref):.0%} of cells")
    assert np.all(np.abs(hw - ref) <= bound), f"{rec.name}: hardware vs reference beyond the bound"
    assert np.all(np.abs(hw - emu) <= 2 * bound), f"{rec.name}: hardware vs emulator beyond the bound"


def check_ldmatrix(rec):
    """Each lane supplies its row address per the table; each lane receives exactly the table's elements."""
    got = probes.run_cuda_ldmatrix(rec)
    want = probes.ldmatrix_expected(rec)
    bad = np.argwhere(got != want)
    msg = "\n".join(f"lane {lane} slot {slot}: got element {got[lane, slot]}, table says {want[lane, slot]}"
                    for lane, slot in bad[:40])
    assert not len(bad), f"{rec.name}: {len(bad)} disagreements\n{msg}"


@pytest.mark.nvidia_gpu
@pytest.mark.parametrize("rec", MMA, ids=_id)
def test_gpu_probe_arange(rec, cupy_device):
    _require_arch(rec, cupy_device)
    check_arange(rec)


@pytest.mark.nvidia_gpu
@pytest.mark.parametrize("rec", MMA, ids=_id)
def test_gpu_probe_random_exact(rec, cupy_device, rng):
    _require_arch(rec, cupy_device)
    check_random_exact(rec, rng)


@pytest.mark.nvidia_gpu
@pytest.mark.parametrize("rec", MMA, ids=_id)
def test_gpu_probe_random(rec, cupy_device, rng):
    _require_arch(rec, cupy_device)
    check_random(rec, rng)


@pytest.mark.nvidia_gpu
@pytest.mark.parametrize("rec", LDMATRIX, ids=_id)
def test_gpu_ldmatrix_probe(rec, cupy_device):
    check_ldmatrix(rec)


# ---------------------------------------------------------------------------------------------- host plumbing
class _FakeCupy:
    """Just enough of CuPy for the probe host code, backed by numpy (device arrays are numpy arrays)."""

    uint16, uint32 = np.uint16, np.uint32

    class cuda:
        class runtime:
            @staticmethod
            def deviceSynchronize():
                return None

    @staticmethod
    def asarray(x):
        return np.array(x)

    @staticmethod
    def full(n, value, dtype):
        return np.full(n, value, dtype=dtype)

    @staticmethod
    def asnumpy(x):
        return np.array(x)

    @staticmethod
    def arange(n, dtype):
        return np.arange(n, dtype=dtype)


def _fake_mma_kernel(rec):
    """What probe_mma.cu does, in numpy: lane-major words in, one instruction (the emulator), words out."""
    from mxcore import emulate

    def kernel(grid, block, args):
        a, b, c, d = args
        assert grid == (1,) and block == (32,)
        regs = [emulate.unpack(rec, role, buf.reshape(32, getattr(rec, role).registers))
                for role, buf in (("a", a), ("b", b), ("c", c))]
        d[:] = emulate.pack(rec, "c", emulate.execute(rec, *regs)).ravel()

    return kernel


def _fake_ldmatrix_kernel(rec):
    """What the ldmatrix hardware does per the PTX ISA (written out here, not from the table)."""
    trans, n = ".trans" in rec.name, probes.ldmatrix_count(rec)

    def kernel(grid, block, args):
        tile, offs, out = args
        words = np.zeros((32, n), dtype=np.uint32)
        for lane in range(32):
            for j in range(n):
                halves = []
                for h in range(2):
                    if trans:  # element (row 2*(l%4)+h, col l>>2) of matrix j
                        addr = offs[j * 8 + 2 * (lane % 4) + h] + (lane >> 2)
                    else:  # element (row l>>2, col 2*(l%4)+h)
                        addr = offs[j * 8 + (lane >> 2)] + 2 * (lane % 4) + h
                    halves.append(int(tile[addr]))
                words[lane, j] = halves[0] | (halves[1] << 16)
        out[:] = words.ravel()

    return kernel


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(probes.nvidia, "_cupy", lambda: _FakeCupy)
    kernels = {}
    for rec in MMA:
        kernels[probes.probe_kernel(rec)] = _fake_mma_kernel(rec)
    for rec in LDMATRIX:
        kernels[probes.ldmatrix_probe_kernel(rec)] = _fake_ldmatrix_kernel(rec)
    monkeypatch.setattr(probes.nvidia, "_cupy_function", lambda pk: kernels[pk])


@pytest.mark.parametrize("rec", MMA, ids=_id)
def test_host_side_of_the_gpu_probe_on_a_fake_device(rec, fake_cuda):
    """The GPU tests' host path (scatter, pack, launch arguments, unpack, gather) and checks, on a numpy
    stand-in for the kernel: so a GPU run fails only for what the hardware does."""
    rng = np.random.default_rng(11)
    check_random_exact(rec, rng)
    check_random(rec, rng)
    check_arange(rec)


@pytest.mark.parametrize("rec", LDMATRIX, ids=_id)
def test_host_side_of_the_ldmatrix_probe_on_a_fake_device(rec, fake_cuda):
    check_ldmatrix(rec)



# ---------------------------------------------------------------------------------------------- sm_120a block_scale
# mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.<a>.<b>.f32.ue8m0 (and the
# m16n8k64 kind::mxf4 / mxf4nvf4 scale_vec::2X forms): compiled for sm_120a only (a handful, to keep CI short);
# run only on an sm_120 / sm_121 GPU.
def _bs(kind, fa, fb, *sel):
    from mxcore.layouts import nvidia

    return nvidia.block_scaled(kind, fa, fb, *sel)


BS_COMPILE = [_bs("mxf8f6f4", "e4m3fn", "e4m3fn"), _bs("mxf8f6f4", "e5m2", "e2m1"), _bs("mxf8f6f4", "e2m3", "e3m2"),
              _bs("mxf8f6f4", "e2m1", "e2m1"), _bs("mxf8f6f4", "e4m3fn", "e2m3", 3, 1, 2, 3),
              _bs("mxf4", "e2m1", "e2m1"), _bs("mxf4nvf4", "e2m1", "e2m1", 2, 1, 0, 2)]
_SASS_FMT = {"e4m3fn": "E4M3", "e5m2": "E5M2", "e3m2": "E3M2", "e2m3": "E2M3", "e2m1": "E2M1"}


def _bs_id(rec) -> str:
    return f"{rec.alias}@{rec.scale_opsel}{rec.scale_thread}"


def test_block_scaled_probe_kernels():
    assert len(BLOCK_SCALED) == 27
    for rec in BLOCK_SCALED + BS_COMPILE:
        pk = probes.probe_kernel(rec)
        assert pk.scaled and pk.archs == ("sm_120a",)
        defs = dict(pk.defines)
        assert defs["MX_BLOCK_SCALED"] == 1 and defs["MX_PTX"] == f'"{rec.ptx}"'
        assert (defs["MX_SCALE_BYTE_A"], defs["MX_SCALE_THREAD_A"]) == (rec.scale_opsel[0], rec.scale_thread[0])
        assert (defs["MX_SCALE_BYTE_B"], defs["MX_SCALE_THREAD_B"]) == (rec.scale_opsel[1], rec.scale_thread[1])
    entries = [probes.probe_kernel(r).entry for r in BLOCK_SCALED + BS_COMPILE]
    assert len(set(entries)) == len(BLOCK_SCALED) + 2  # BS_COMPILE adds two non-default selector variants
    assert probes.probe_kernel(BS_COMPILE[4]).entry.endswith("_sel3123")


@pytest.mark.parametrize("rec", BS_COMPILE, ids=_bs_id)
def test_block_scaled_probe_compiles_for_sm120a(rec):
    """NVRTC -> sm_120a cubin; cuobjdump shows one QMMA.SF.16832 (kind::mxf8f6f4) or OMMA.SF.16864
    (kind::mxf4 / mxf4nvf4) with both operand formats and E8 (ue8m0) scales, e.g.
    ``QMMA.SF.16832.F32.E4M3.E4M3.E8 R16, R16, R14, R20, R0, R11, URZ``."""
    nt = _tools()
    pk = probes.probe_kernel(rec)
    binary = nt.compile_cuda(pk.source(), name=pk.entry, arch="sm_120a", options=pk.options)
    res = binary.resources[pk.entry]
    assert res["local_bytes"] == 0 and res["spill_stores"] == 0
    op = "QMMA" if rec.k == 32 else "OMMA"
    lines = nt.sass_lines(binary.sass, op)
    print(f"{pk.entry}: {lines}")
    shape = "16832" if rec.k == 32 else "16864"
    want = f"{op}.SF.{shape}.F32.{_SASS_FMT[rec.a_format]}.{_SASS_FMT[rec.b_format]}.E8"
    assert [line.split()[0] for line in lines] == [want]
    assert not nt.sass_lines(binary.sass, "HMMA")
    for opcode, (count, fragment) in probes.expected_sass(rec, "sm_120a").items():
        assert len(nt.sass_lines(binary.sass, opcode)) == count and fragment in lines[0]


def test_block_scaled_selectors_outside_ptxas_range_do_not_compile():
    """ptxas checks the immediates: thread-id-a is 0..1; scale_vec::2X byte-ids are 0 or 2."""
    nt = _tools()
    for rec, key, bad in ((BS_COMPILE[0], "MX_SCALE_THREAD_A", 2), (BS_COMPILE[5], "MX_SCALE_BYTE_A", 1)):
        pk = probes.probe_kernel(rec)
        opts = tuple(o for o in pk.options if not o.startswith(f"-D{key}=")) + (f"-D{key}={bad}",)
        with pytest.raises(KernelCompileError, match="out of range|expected to be 0 or 2"):
            nt.compile_cuda(pk.source(), name=pk.entry, arch="sm_120a", options=opts)


def _scales(rec, rng):
    nb = rec.k // 32  # a different scale per row/col and block: a wrong scale lane or byte changes D
    return (rng.integers(123, 132, size=(rec.m, nb)).astype(np.uint8),
            rng.integers(123, 132, size=(nb, rec.n)).astype(np.uint8))


def check_block_scaled(rec, rng, device):
    grid = probes.exact_grid(rec)
    for _ in range(2):
        a = probes.exact_values(rec.a_format, (rec.m, rec.k), rng, **grid)
        b = probes.exact_values(rec.b_format, (rec.k, rec.n), rng, **grid)
        c = probes.exact_values(rec.c_format, (rec.m, rec.n), rng, grid=grid["grid"] ** 2, vmax=grid["vmax"] ** 2)
        sa, sb = _scales(rec, rng)
        ref = probes.reference_d(rec, a, b, c, scale_a=sa, scale_b=sb)
        hw = probes.run_matrices(rec, a, b, c, scale_a=sa, scale_b=sb, device=device)
        np.testing.assert_array_equal(hw, ref, err_msg=f"{rec.name}: {device} vs reference")
        emu = probes.run_matrices(rec, a, b, c, scale_a=sa, scale_b=sb)
        np.testing.assert_array_equal(emu, ref, err_msg=f"{rec.name}: emulator vs reference")


def _fake_scaled_kernel(rec):
    """probe_mma.cu with MX_BLOCK_SCALED, in numpy: the scale bytes come from the lanes the PTX text names
    (written out here: row m <- lane 4*(m % 8) + 2*thread-id-a + m // 8, col n <- lane 4n + thread-id-b)."""
    from mxcore import emulate

    (byte_a, byte_b), (tid_a, tid_b) = rec.scale_opsel, rec.scale_thread
    nb = rec.k // 32

    def kernel(grid, block, args):
        a, b, c, sa_w, sb_w, d = args
        assert grid == (1,) and block == (32,)
        A, B, C = (emulate.gather(rec, role, emulate.unpack(rec, role, buf.reshape(32, getattr(rec, role).registers)))
                   for role, buf in (("a", a), ("b", b), ("c", c)))
        sa = np.array([[(int(sa_w[4 * (m % 8) + 2 * tid_a + m // 8]) >> (8 * (byte_a + j))) & 0xFF for j in range(nb)]
                       for m in range(16)])
        sb = np.array([[(int(sb_w[4 * n + tid_b]) >> (8 * (byte_b + j))) & 0xFF for n in range(8)] for j in range(nb)])
        As = emulate.decode_regs(rec.a_format, A) * np.repeat(np.exp2(sa - 127.0), 32, axis=1)
        Bs = emulate.decode_regs(rec.b_format, B) * np.repeat(np.exp2(sb - 127.0), 32, axis=0)
        D = (As @ Bs + C.astype(np.float64)).astype(np.float32)  # exact inputs: any order, one rounding
        d[:] = emulate.pack(rec, "c", emulate.scatter(rec, "c", D)).ravel()

    return kernel


@pytest.mark.parametrize("rec", BS_COMPILE, ids=_bs_id)
def test_host_side_of_the_block_scaled_probe_on_a_fake_device(rec, monkeypatch):
    monkeypatch.setattr(probes.nvidia, "_cupy", lambda: _FakeCupy)
    monkeypatch.setattr(probes.nvidia, "_cupy_function", lambda pk: _fake_scaled_kernel(rec))
    check_block_scaled(rec, np.random.default_rng(5), "cuda")


def _require_sm120(cupy_device):
    cc = int(cupy_device.compute_capability)
    if cc not in (120, 121):
        pytest.skip(f"block-scaled mma.sync (sm_120a / sm_121a) needs an sm_120 or sm_121 GPU, this one is sm_{cc}")


@pytest.mark.nvidia_gpu
@pytest.mark.parametrize("rec", BLOCK_SCALED + BS_COMPILE[4:5] + BS_COMPILE[6:], ids=_bs_id)
def test_gpu_block_scaled_probe(rec, cupy_device, rng):
    _require_sm120(cupy_device)
    check_block_scaled(rec, rng, "cuda")


def test_family_dispatch():
    """Each record goes to its family module; a device the family does not run on is refused by name."""
    from mxcore.errors import UnsupportedError

    mma, mfma = layouts.get("m16n8k16.f16"), layouts.get("v_mfma_f32_32x32x8_f16")
    assert probes.family(mma) is probes.nvidia and probes.family(mfma) is probes.amd
    assert probes.probe_kernel(layouts.get("ldmatrix.x2")) == probes.ldmatrix_probe_kernel(layouts.get("ldmatrix.x2"))
    z = np.zeros((16, 16))
    with pytest.raises(UnsupportedError, match="runs on 'cuda'"):
        probes.run_matrices(mma, z, z[:, :8], z[:, :8], device="hip")
    with pytest.raises(UnsupportedError, match="no probe kernel"):
        probes.family(object())
