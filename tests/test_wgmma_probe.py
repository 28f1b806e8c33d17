"""wgmma probes driven by the layout records (``backends/probes/wgmma.py``, ``kernels_cuda/probe_wgmma.cu``).

CPU: the probe kernels compile (NVRTC, sm_90a) to exactly their instruction — one HGMMA / QGMMA of the record's
shape and formats, A from a descriptor (``gdesc``) or registers, ``.tnspA`` / ``.tnspB`` for M/N-major operands —
with no local memory; the host path (image, descriptors, register words, launch arguments, read-back) runs against a
numpy stand-in for the kernel.
GPU (marker nvidia_gpu, an sm_90 device): every wgmma record, A from shared memory and from registers, K-major and
(16-bit) M/N-major, every swizzle mode: the hardware's D equals ``mxcore.emulate.execute``'s and the float64
reference bit for bit on inputs whose every partial sum is exact; and the arange probes of
``backends/probes/wgmma.run_probes`` equal the records' register maps.

GPU run: ``python -m pytest -q -p no:cacheprovider tests/test_wgmma_probe.py -m nvidia_gpu``.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require_tool

from mxcore import layouts
from mxcore.backends import nvrtc_tools, probes
from mxcore.backends.probes import wgmma as wp

WGMMA = [r for r in layouts.records("nvidia") if isinstance(r, layouts.WgmmaLayout)]
SWIZZLES = ("128B", "64B", "32B", "none")
_SASS_TYPE = {"fp16": "", "bf16": ".BF16", "tf32": ".TF32", "e4m3fn": ".E4M3", "e5m2": ".E5M2"}


def _kernels(rec):
    """(A from shared memory, M/N-major) of every probe kernel of ``rec``."""
    return [(s, mn) for s in (True, False) for mn in ((False, True) if rec.transpose else (False,))]


def _kid(x):
    return x if isinstance(x, str) else getattr(x, "alias", str(x))


# one kernel per format pair and every N once, each A source and major-ness among them
COMPILE = [(layouts.get("m64n256k16.f16"), True, False), (layouts.get("m64n8k16.bf16"), False, True),
           (layouts.get("m64n64k16.f16"), True, True), (layouts.get("m64n192k8.tf32"), False, False),
           (layouts.get("m64n24k32.e4m3"), True, False), (layouts.get("m64n40k32.e4m3.e5m2"), False, False),
           (layouts.get("m64n128k32.e5m2.e4m3"), True, False), (layouts.get("m64n16k32.e5m2"), False, False),
           (layouts.get("m64n32k16.bf16"), True, False), (layouts.get("m64n48k8.tf32"), True, False),
           (layouts.get("m64n56k16.f16"), False, False)]


def exact_inputs(rec, rng):
    """A, B tiles (codes for fp8) with their float64 values, and C: small integers times 1 or 2, so every product
    and partial sum is an integer below 2^11 -- exact in any order and at any accumulator width of 12 bits or more
    (Hopper's fp8 wgmma keeps fewer bits than fp32 in its running sum)."""
    import ml_dtypes

    tiles = []
    for fmt, shape in ((rec.a_format, (64, rec.k)), (rec.b_format, (rec.k, rec.n))):
        v = rng.integers(-3, 4, size=shape) * rng.integers(1, 3, size=shape).astype(np.float64)
        if fmt in ("e4m3fn", "e5m2"):
            codes = v.astype({"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[fmt]).view(np.uint8)
            tiles.append((codes, v))
        else:
            tiles.append((v.astype({"fp16": np.float16, "bf16": ml_dtypes.bfloat16}.get(fmt, np.float32)), v))
    c = rng.integers(-16, 17, size=(64, rec.n)).astype(np.float32)
    (a, a64), (b, b64) = tiles
    return a, b, c, (a64 @ b64 + c).astype(np.float32).astype(np.float64)


@pytest.mark.parametrize("rec, a_smem, mn", COMPILE, ids=_kid)
def test_probe_compiles_to_exactly_its_wgmma(rec, a_smem, mn):
    require_tool("NVRTC (cuda-bindings + nvidia-cuda-nvrtc)", nvrtc_tools.have_nvrtc())
    require_tool("cuobjdump + nvdisasm", nvrtc_tools.have_cuobjdump())
    pk = wp.wgmma_probe_kernel(rec, a_smem=a_smem, mn_major=mn)
    b = nvrtc_tools.compile_cuda(pk.source(), name=pk.entry, arch="sm_90a", options=[*pk.options, "-std=c++17"])
    res = b.resources[pk.entry]
    assert res["local_bytes"] == 0 and res["spill_stores"] == 0, res
    sass = nvrtc_tools.sass_function(b.sass, pk.entry)
    op = "QGMMA" if rec.k == 32 else "HGMMA"
    lines = nvrtc_tools.sass_lines(sass, op)
    assert len(lines) == 1 and not nvrtc_tools.sass_lines(sass, "HGMMA" if op == "QGMMA" else "QGMMA"), lines
    mnemonic, operands = lines[0].split(None, 1)
    fmts = _SASS_TYPE[rec.a_format] + (_SASS_TYPE[rec.b_format] if op == "QGMMA" else "")
    assert mnemonic == f"{op}.64x{rec.n}x{rec.k}.F32{fmts}", lines
    regs = [x.strip() for x in operands.split(",")]
    # A and B from shared memory: one gdesc operand; A from registers: a register, then B's gdesc
    assert regs[1].startswith("gdesc") == a_smem and (a_smem or regs[2].startswith("gdesc")), lines
    assert (".tnspA" in operands) == (mn and a_smem) and (".tnspB" in operands) == mn


def test_probe_kernel_refuses_what_the_instruction_lacks():
    from mxcore.errors import LayoutError

    with pytest.raises(LayoutError, match="K-major only"):
        wp.wgmma_probe_kernel(layouts.get("m64n64k8.tf32"), mn_major=True)
    entries = {wp.wgmma_probe_kernel(r, a_smem=s, mn_major=m).entry for r in WGMMA for s, m in _kernels(r)}
    assert len(entries) == sum(len(_kernels(r)) for r in WGMMA)  # one entry per kernel


# ---------------------------------------------------------------------------------------------- host path, no GPU
class _FakeCupy:
    """Just enough of CuPy for run_wgmma, backed by numpy."""

    uint32 = np.uint32

    class cuda:
        class runtime:
            @staticmethod
            def deviceSynchronize():
                return None

    asarray = staticmethod(np.array)
    asnumpy = staticmethod(np.array)

    @staticmethod
    def full(n, value, dtype):
        return np.full(n, value, dtype=dtype)


def _fake_kernel(rec, probe):
    """What probe_wgmma.cu does, in numpy: the image copied to a 1024-aligned base (here 0), descriptors used as
    given, A's and C's words unpacked lane-major, one wgmma (the emulator), D's words lane-major."""
    from mxcore import emulate

    defs = dict(probe.defines)

    def kernel(grid, block, args):
        image, a_words, c_words, d_out, desc_a, desc_b = args
        assert grid == (1,) and block == (128,) and image.size == wp.IMAGE_BYTES
        c = emulate.unpack(rec, "c", c_words.reshape(128, defs["MX_WG_ACC"]))
        trans = "mn" in probe.entry.rsplit("_", 1)[-1]
        if defs["MX_WG_AREGS"]:
            a = emulate.unpack(rec, "a", a_words.reshape(128, defs["MX_WG_AREGS"]))
        else:
            a = int(desc_a)
        d = emulate.execute(rec, a, int(desc_b), c, smem=image, trans_a=trans and not defs["MX_WG_AREGS"],
                            trans_b=trans)
        d_out[:] = emulate.pack(rec, "c", d).ravel()

    return kernel


@pytest.mark.parametrize("rec, a_smem, mn", COMPILE, ids=_kid)
def test_host_side_of_the_probe_on_a_fake_device(rec, a_smem, mn, monkeypatch, rng):
    monkeypatch.setattr(probes.nvidia, "_cupy", lambda: _FakeCupy)
    monkeypatch.setattr(wp, "_wgmma_function", lambda pk: _fake_kernel(rec, pk))
    a, b, c, want = exact_inputs(rec, rng)
    for swz in SWIZZLES:
        inp = wp.wgmma_inputs(rec, a, b, c, a_smem=a_smem, mn_major=mn, swizzle=swz)
        np.testing.assert_array_equal(wp.run_wgmma(rec, inp), want)
        np.testing.assert_array_equal(wp.emulate_wgmma(rec, inp), want)


# ---------------------------------------------------------------------------------------------- on the GPU
def _require_sm90(cupy_device):
    cc = int(cupy_device.compute_capability)
    if cc != 90:
        pytest.skip(f"wgmma (sm_90a) needs an sm_90 GPU, this one is sm_{cc}")


@pytest.mark.nvidia_gpu
@pytest.mark.parametrize("rec", WGMMA, ids=lambda r: r.alias)
def test_gpu_wgmma_matches_the_emulator_bit_for_bit(rec, cupy_device, rng):
    _require_sm90(cupy_device)
    import cupy

    for a_smem, mn in _kernels(rec):
        for swz in SWIZZLES:
            a, b, c, want = exact_inputs(rec, rng)
            inp = wp.wgmma_inputs(rec, a, b, c, a_smem=a_smem, mn_major=mn, swizzle=swz)
            hw = wp.run_wgmma(rec, inp, cupy)
            emu = wp.emulate_wgmma(rec, inp)
            where = f"{rec.name} A {'smem' if a_smem else 'registers'} {'MN' if mn else 'K'}-major swizzle {swz}"
            bad = np.argwhere(hw != emu)
            assert not len(bad), (f"{where}: {len(bad)} cells differ, first D{tuple(bad[0])} hardware "
                                  f"{hw[tuple(bad[0])]} emulator {emu[tuple(bad[0])]}")
            np.testing.assert_array_equal(emu, want, err_msg=f"{where}: emulator vs float64 reference")


@pytest.mark.nvidia_gpu
def test_gpu_arange_probes_equal_the_records(cupy_device):
    """The layout-free arange probes (D of m64n64k16, register A of k16 and k8) against the database records."""
    _require_sm90(cupy_device)
    import cupy

    got = wp.run_probes(cupy)
    np.testing.assert_array_equal(got["d"], layouts.get("m64n64k16.f16").c.coords)
    np.testing.assert_array_equal(got["a_k16"], layouts.get("m64n16k16.f16").a.coords)
    np.testing.assert_array_equal(got["a_k8"], layouts.get("m64n16k8.tf32").a.coords)
