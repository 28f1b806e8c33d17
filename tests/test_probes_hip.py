"""AMD probe kernels: one MFMA per kernel, fed and read through the layout table.

CPU: every probe (each CDNA3/CDNA4 record; every f8f6f4 A/B format pair, unscaled and scaled; op_sel
variants of the scaled forms) compiled with clang-22 for each arch it exists on, the disassembly checked for
exactly that instruction with its cbsz/blgp/op_sel modifiers and no scratch; the scale-register packing; the
arange experiment through the emulator for a sample of AMD records.
GPU (marker amd_gpu, through hip-python): arange, exact random (bit-exact) and arbitrary random inputs; for
the scaled forms a different scale per 32-K block (this is what tells the K order of each lane's elements)
and decoy bytes in the scale register bytes that op_sel must not read.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from mxcore.backends import probes

from mxcore import layouts
from mxcore.layouts import cdna4

ARCHS = ("gfx942", "gfx950")
F8F6F4_FORMATS = ("e4m3fn", "e5m2", "e2m3", "e3m2", "e2m1")
OPSEL_PAIR = ("e2m1", "e4m3fn")  # the format pair whose scaled forms are also built for every op_sel (16 combos)


def _records():
    """Every AMD record once: classic MFMAs per arch record, f8f6f4 for all 25 format pairs (scaled and not),
    and the scaled forms for every (op_sel A, op_sel B)."""
    out, seen = [], set()
    for name in layouts.names("amd"):
        if name in cdna4.F8F6F4_SHAPES:
            for fa, fb in itertools.product(F8F6F4_FORMATS, repeat=2):
                out.append(layouts.get(name, a_format=fa, b_format=fb))
            if cdna4.F8F6F4_SHAPES[name][2]:
                for sel in itertools.product(range(4), repeat=2):
                    if sel != (0, 0):
                        out.append(layouts.get(name, a_format=OPSEL_PAIR[0], b_format=OPSEL_PAIR[1], scale_opsel=sel))
            continue
        for arch in ARCHS:
            if name not in layouts.names("amd", arch):
                continue
            rec = layouts.get(name, arch=arch)
            if id(rec) not in seen:
                seen.add(id(rec))
                out.append(rec)
    return out


RECORDS = _records()
PROBES = [probes.probe_kernel(r) for r in RECORDS]
CASES = [(rec, pk, arch) for rec, pk in zip(RECORDS, PROBES) for arch in pk.archs]


def _case_id(x):
    if isinstance(x, str):
        return x
    if isinstance(x, probes.ProbeKernel):
        return x.entry.replace("mx_probe_", "")
    return "-"


def _norm(mods: dict) -> dict:
    """Drop modifiers at their default value (llvm-objdump omits most of them)."""
    return {k: v for k, v in mods.items() if v not in ("0", "[0,0,0]")}


def test_every_amd_record_has_a_probe():
    names = {pk.instruction for pk in PROBES}
    assert names == set(layouts.names("amd"))
    entries = [(pk.entry, arch) for _, pk, arch in CASES]
    assert len(entries) == len(set(entries)), "two probes share an entry point on one arch"
    # CDNA3 xf32 exists on gfx942 only; the f8f6f4 family on gfx950 only
    for rec, pk in zip(RECORDS, PROBES):
        if "xf32" in rec.name:
            assert pk.archs == ("gfx942",)
        if "f8f6f4" in rec.name:
            assert pk.archs == ("gfx950",)


def test_f8f6f4_probe_defines_follow_the_record():
    rec = layouts.get("v_mfma_scale_f32_32x32x64_f8f6f4", a_format="fp6", b_format="fp4", scale_opsel=(2, 1))
    pk = probes.probe_kernel(rec)
    d = dict(pk.defines)
    assert d["MX_CBSZ"] == 2 and d["MX_BLGP"] == 4 and d["MX_SCALED"] == 1
    assert (d["MX_OPSEL_A"], d["MX_OPSEL_B"]) == (2, 1)
    assert (d["MX_A_REGS"], d["MX_B_REGS"], d["MX_C_REGS"]) == (6, 4, 16)  # fp6: 6 VGPRs, fp4: 4, 32x32 D: 16
    assert pk.entry == "mx_probe_mfma_scale_f32_32x32x64_f8f6f4_e2m3_e2m1_opsel21"
    unscaled = probes.probe_kernel(layouts.get("v_mfma_f32_16x16x128_f8f6f4", a_format="bf8", b_format="fp8"))
    assert dict(unscaled.defines)["MX_SCALED"] == 0 and not unscaled.scaled


@pytest.mark.parametrize("sel", [(0, 0), (1, 3), (3, 2)])
def test_scale_register_holds_the_code_at_the_op_sel_byte_and_decoys_elsewhere(sel):
    from mxcore import emulate

    rec = layouts.get("v_mfma_scale_f32_16x16x128_f8f6f4", scale_opsel=sel)
    rng = np.random.default_rng(3)
    for role, byte in (("scale_a", sel[0]), ("scale_b", sel[1])):
        codes = rng.integers(0, 255, size=(rec.lanes, 1), dtype=np.uint8)
        words = probes.scale_words(rec, role, codes)
        for b in range(4):
            got = (words >> np.uint32(8 * b)) & np.uint32(0xFF)
            want = codes[:, 0] if b == byte else codes[:, 0] ^ 0x55
            np.testing.assert_array_equal(got, want)
        # the byte the table says is read is exactly the code (emulate.unpack reads the record's bit offset)
        np.testing.assert_array_equal(emulate.unpack(rec, role, words.reshape(-1, 1)), codes)


@pytest.mark.parametrize("name, fmts", [
    ("v_mfma_f32_32x32x8_f16", {}),
    ("v_mfma_f32_16x16x32_fp8_bf8", {"arch": "gfx942"}),
    ("v_mfma_f32_16x16x128_f8f6f4", {"a_format": "fp6", "b_format": "fp4"}),
])
def test_arange_experiment_on_the_emulator(name, fmts):
    rec = layouts.get(name, **fmts)
    for role in ("a", "b"):
        where = probes.arange_probe(rec, role, lambda a, b, c: probes.run_matrices(rec, a, b, c))
        assert probes.where_elements(rec, role, where) == []


# ---------------------------------------------------------------------------------------------- compile checks
def _hip_tools():
    from conftest import require_tool
    from mxcore.backends import hip_tools

    require_tool("clang-22/lld-22/llvm-objdump-22", hip_tools.have_clang())
    return hip_tools


def _expected(rec, pk):
    """Written out from the ISA/LLVM conventions, independent of probes.expected_mfma."""
    mods = {}
    mnemonic = rec.name
    if "f8f6f4" in rec.name:
        code = {"e4m3fn": 0, "e5m2": 1, "e2m3": 2, "e3m2": 3, "e2m1": 4}
        mods.update(cbsz=str(code[rec.a_format]), blgp=str(code[rec.b_format]))
        if rec.scaled:
            sa, sb = rec.scale_opsel
            mods.update(op_sel=f"[{sa & 1},{sb & 1},0]", op_sel_hi=f"[{sa >> 1},{sb >> 1},0]")
    return mnemonic, _norm(mods)


@pytest.mark.parametrize("rec, pk, arch", CASES, ids=_case_id)
def test_probe_compiles_to_exactly_its_instruction(rec, pk, arch):
    ht = _hip_tools()
    binary = ht.compile_hip(pk.source(), name=pk.entry, arch=arch, options=pk.options)
    found = ht.mfma_instructions(binary.disasm)
    assert len(found) == 1, f"{pk.entry} on {arch}: expected one MFMA, found {found}"
    mnemonic, mods = probes.parse_mfma(found[0])
    want = _expected(rec, pk)
    assert (mnemonic, _norm(mods)) == want
    assert (want[0], _norm(probes.expected_mfma(pk, rec)[1])) == want
    res = binary.resources[pk.entry]
    assert res["scratch_bytes"] == 0 and res["vgpr_spill"] == 0
    if rec.modifiers:  # the layout record's own assembler text agrees
        assert _norm(probes.parse_mfma(f"{rec.name} {rec.modifiers}")[1]) == want[1]


# ---------------------------------------------------------------------------------------------- on the GPU
def _device_arch(hip_device) -> str:
    return hip_device.target().arch


def _require_arch(pk, hip_device):
    arch = _device_arch(hip_device)
    if arch not in pk.archs:
        pytest.skip(f"{pk.instruction} ({pk.a_format}, {pk.b_format}) is not on {arch}")


def _scales(rec, rng, *, exact: bool):
    """Different E8M0 codes per 32-K block and row/column (2^-1..2^1 for exact runs)."""
    nb = rec.k // rec.scale_block
    lo, hi = (126, 129) if exact else (120, 135)
    return rng.integers(lo, hi, size=(rec.m, nb)), rng.integers(lo, hi, size=(nb, rec.n))


GPU_CASES = [(rec, pk) for rec, pk in zip(RECORDS, PROBES)]


def check_arange(rec):
    kw = {}
    if rec.scaled:
        kw = {"scale_a": np.full((rec.m, rec.k // 32), 127), "scale_b": np.full((rec.k // 32, rec.n), 127)}
    for role in ("a", "b"):
        where = probes.arange_probe(rec, role, lambda a, b, c: probes.run_matrices(rec, a, b, c, device="hip", **kw))
        diffs = probes.where_elements(rec, role, where)
        assert not diffs, f"{rec.name} operand {role}: {len(diffs)} disagreements\n" + "\n".join(diffs[:40])


def check_random_exact(rec, rng):
    """Exact inputs (and, for scaled forms, a different scale per block): hardware == reference == emulator."""
    grid = probes.exact_grid(rec)
    a = probes.exact_values(rec.a_format, (rec.m, rec.k), rng, **grid)
    b = probes.exact_values(rec.b_format, (rec.k, rec.n), rng, **grid)
    c = probes.exact_values(rec.c_format, (rec.m, rec.n), rng, grid=grid["grid"] ** 2, vmax=grid["vmax"] ** 2)
    kw = {}
    if rec.scaled:
        kw = dict(zip(("scale_a", "scale_b"), _scales(rec, rng, exact=True)))
    ref = probes.reference_d(rec, a, b, c, **kw)
    np.testing.assert_array_equal(probes.run_matrices(rec, a, b, c, device="hip", **kw), ref)
    np.testing.assert_array_equal(probes.run_matrices(rec, a, b, c, **kw), ref)


def check_random(rec, rng):
    a = probes.random_values(rec.a_format, (rec.m, rec.k), rng)
    b = probes.random_values(rec.b_format, (rec.k, rec.n), rng)
    c = probes.random_values(rec.c_format, (rec.m, rec.n), rng)
    kw = {}
    if rec.scaled:
        kw = dict(zip(("scale_a", "scale_b"), _scales(rec, rng, exact=False)))
    hw = probes.run_matrices(rec, a, b, c, device="hip", **kw)
    ref = probes.reference_d(rec, a, b, c, **kw)
    bound = probes.error_bound(rec, a, b, c, **kw)
    assert np.all(np.abs(hw - ref) <= bound), f"{rec.name}: hardware vs reference beyond the bound"


@pytest.mark.amd_gpu
@pytest.mark.parametrize("rec, pk", GPU_CASES, ids=_case_id)
def test_gpu_probe_arange(rec, pk, hip_device):
    _require_arch(pk, hip_device)
    check_arange(rec)


@pytest.mark.amd_gpu
@pytest.mark.parametrize("rec, pk", GPU_CASES, ids=_case_id)
def test_gpu_probe_random_exact(rec, pk, hip_device, rng):
    _require_arch(pk, hip_device)
    check_random_exact(rec, rng)


@pytest.mark.amd_gpu
@pytest.mark.parametrize("rec, pk", GPU_CASES, ids=_case_id)
def test_gpu_probe_random(rec, pk, hip_device, rng):
    _require_arch(pk, hip_device)
    check_random(rec, rng)


# ---------------------------------------------------------------------------------------------- host plumbing
def _fake_mfma(probe, inputs, out_words, threads):
    """What probe_mfma.hip does, in numpy: lane-major words in; the scale byte taken from the op_sel the
    kernel was built with (not from the table); one MFMA (the emulator); D words out."""
    from mxcore import emulate

    rec = FAKE_RECORDS[probe]
    assert threads == 64 and out_words == 64 * rec.c.registers
    a, b, c, sa, sb = inputs
    regs = [emulate.unpack(rec, role, w.reshape(64, -1)) for role, w in (("a", a), ("b", b), ("c", c))]
    kw = {}
    if probe.scaled:
        d = dict(probe.defines)
        kw = {"scale_a": ((sa >> np.uint32(8 * d["MX_OPSEL_A"])) & 0xFF).astype(np.uint8).reshape(64, 1),
              "scale_b": ((sb >> np.uint32(8 * d["MX_OPSEL_B"])) & 0xFF).astype(np.uint8).reshape(64, 1)}
    return emulate.pack(rec, "c", emulate.execute(rec, *regs, **kw)).ravel()


FAKE_SAMPLE = [
    layouts.get("v_mfma_f32_32x32x2_f32"),
    layouts.get("v_mfma_f32_16x16x16_bf16"),
    layouts.get("v_mfma_f32_32x32x4_xf32"),
    layouts.get("v_mfma_f32_16x16x32_bf8_fp8", arch="gfx942"),
    layouts.get("v_mfma_f32_32x32x16_f16"),
    layouts.get("v_mfma_f32_32x32x64_f8f6f4", a_format="fp6", b_format="bf8"),
    layouts.get("v_mfma_scale_f32_16x16x128_f8f6f4", a_format="fp4", b_format="bf6", scale_opsel=(3, 1)),
    layouts.get("v_mfma_scale_f32_32x32x64_f8f6f4", a_format="fp8", b_format="fp4", scale_opsel=(0, 2)),
]
FAKE_RECORDS = {probes.probe_kernel(r): r for r in FAKE_SAMPLE}


@pytest.mark.parametrize("rec", FAKE_SAMPLE, ids=lambda r: probes.probe_kernel(r).entry.replace("mx_probe_", ""))
def test_host_side_of_the_gpu_probe_on_a_fake_device(rec, monkeypatch):
    """The AMD GPU tests' host path (scatter, pack, scale bytes with decoys, unpack, gather) and checks on a
    numpy stand-in for the kernel, so that a run on hardware fails only for what the hardware does."""
    monkeypatch.setattr(probes.amd, "_hip_launcher", lambda: _fake_mfma)
    rng = np.random.default_rng(5)
    check_random_exact(rec, rng)
    check_random(rec, rng)
    check_arange(rec)


def test_hip_launcher_uses_the_public_runtime(monkeypatch):
    """probes' launcher goes through HipBackend.runtime() and hip.device_address only (no private names)."""
    import ctypes

    from mxcore.backends import hip

    class StubRuntime:
        def __init__(self):
            self.mem, self.calls = {}, []

        def function(self, source, name, options):
            self.calls.append(("function", name, tuple(options)))
            return "func"

        def upload(self, host):
            addr = 4096 * (len(self.mem) + 1)
            self.mem[addr] = host.copy()
            return ctypes.c_void_p(addr)  # like a pointer object, not a plain int

        def launch(self, func, grid, block, args):
            self.calls.append(("launch", func, grid, block, tuple(a.value for a in args)))
            self.mem[args[3].value][:] = 42  # the "kernel" writes D

        def synchronize(self):
            self.calls.append(("synchronize",))

        def download(self, ptr, host):
            host[:] = self.mem[ptr.value]
            return host

        def free(self, ptr):
            del self.mem[ptr.value]

    stub = StubRuntime()
    monkeypatch.setattr(hip.HipBackend, "runtime", lambda self: stub)
    pk = PROBES[0]
    launch = probes.amd._hip_launcher()
    inputs = [np.full(4, i, np.uint32) for i in range(5)]  # a, b, c, scale_a, scale_b
    out = launch(pk, inputs, 8, 64)
    assert out.tolist() == [42] * 8 and stub.mem == {}  # everything freed
    assert stub.calls[0] == ("function", pk.entry, tuple(pk.options))
    # kernel arguments: a, b, c, d, scale_a, scale_b (d is the sixth upload)
    assert stub.calls[1] == ("launch", "func", (1, 1, 1), (64, 1, 1), tuple(4096 * i for i in (1, 2, 3, 6, 4, 5)))
