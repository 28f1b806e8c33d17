"""CI compile checks of the device codecs (``kernels_cuda/mx_codec.cuh``), no GPU needed.

The one source is compiled exactly as it is launched (``backends.codec.compile_inputs``): by NVRTC to cubins
for sm_80 / sm_89 / sm_90 and by clang-22 to code objects for gfx942 / gfx950 (the fp8 module on each arch,
fp4 and the packing-only module on one arch per vendor: every kernel on every arch).  Checked:
every ``extern "C"`` entry point exists, no local memory / scratch / spills, and the instructions the design
relies on: 128-bit vector loads and stores in the MX quantizer (LDG.E.128 / STG.E.128, global_load_dwordx4),
count-leading-zeros for the exponent (FLO / v_ffbh), shared-memory atomics for the per-CTA maxima (ATOMS /
ds_max), and no floating-point conversion instruction in the encoders (rounding is integer arithmetic).
Under CI=true a missing toolchain fails instead of skipping.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import require_tool

from mxcore import formats as F
from mxcore.backends import codec, nvrtc_tools

try:
    from mxcore.backends import hip_tools
except ImportError:  # the HIP backend's tools may move inside its package
    from mxcore.backends.hip import hip_tools  # type: ignore[no-redef]

NV_ARCHS = ("sm_80", "sm_89", "sm_90")
AMD_ARCHS = ("gfx942", "gfx950")
# Every kernel is in every format's module (the format only changes constants), so each arch compiles the
# module of its fp8 format, plus fp4 (the 4-bit, no-NaN case) and the packing-only module on one arch each.
# The other formats' modules are compiled and run, bit-compared, by tests/test_device_codec.py on a GPU.
_JOBS = ([("nvidia", arch, "e4m3fn") for arch in NV_ARCHS] + [("nvidia", "sm_90", "e2m1"), ("nvidia", "sm_90", None)]
         + [("amd", "gfx942", "e4m3fnuz"), ("amd", "gfx950", "e4m3fn"), ("amd", "gfx950", "e2m1"),
            ("amd", "gfx950", None)])


def _jobs():
    return list(_JOBS)


def _compile(job):
    vendor, arch, name = job
    spec = F.get(name) if name else None
    src, opts = codec.compile_inputs(spec, vendor)
    label = f"codec_{name or 'pack'}"
    if vendor == "nvidia":
        return nvrtc_tools.compile_cuda(src, name=label, arch=arch, options=opts)
    return hip_tools.compile_hip(src, name=label, arch=arch, options=opts)


@pytest.fixture(scope="module")
def binaries():
    nv = nvrtc_tools.have_nvrtc() is None and nvrtc_tools.have_cuobjdump() is None
    amd = hip_tools.have_clang() is None
    jobs = [j for j in _jobs() if (nv if j[0] == "nvidia" else amd)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(jobs, pool.map(_compile, jobs)))


def _need(vendor):
    if vendor == "nvidia":
        require_tool("NVRTC (cuda-bindings + nvidia-cuda-nvrtc)", nvrtc_tools.have_nvrtc())
        require_tool("cuobjdump + nvdisasm", nvrtc_tools.have_cuobjdump())
    else:
        require_tool("clang-22", hip_tools.have_clang())


def _sass_of(sass: str, kernel: str) -> str:
    """The SASS text of one function from cuobjdump output."""
    parts = re.split(r"\n\s*Function : ", sass)
    for p in parts[1:]:
        if p.split()[0] == kernel:
            return p
    raise AssertionError(f"{kernel} not in the SASS")


def _amd_of(disasm: str, kernel: str) -> str:
    m = re.search(rf"^[0-9a-f]+ <{kernel}>:\n(.*?)(?=^[0-9a-f]+ <|\Z)", disasm, re.S | re.M)
    assert m, f"{kernel} not in the disassembly"
    return m.group(1)


@pytest.mark.parametrize("job", [j for j in _jobs() if j[0] == "nvidia"], ids=lambda j: f"{j[1]}-{j[2] or 'pack'}")
def test_nvrtc_codec_module(binaries, job):
    _need("nvidia")
    b = binaries[job]
    want = codec.entry_points(job[2] is not None)
    assert sorted(b.resources) == sorted(want)
    for kernel, res in b.resources.items():
        assert res["local_bytes"] == 0 and res["spill_stores"] == 0 and res["spill_loads"] == 0, (kernel, res)
    counts = nvrtc_tools.sass_counts(b.sass)
    assert counts["LDL"] == 0 and counts["STL"] == 0
    if job[2] is None:
        return
    for suf in ("f32", "f16", "bf16", "f64"):
        q = _sass_of(b.sass, f"mx_quantize_mx_{suf}")
        assert "LDG.E.128" in q and "STG.E.128" in q, f"mx_quantize_mx_{suf}: no 128-bit vector load/store"
        assert "ATOMS" in q, "per-CTA scale maximum is a shared-memory atomic"
        enc = _sass_of(b.sass, f"mx_encode_{suf}")
        assert "FLO" in enc, "the exponent comes from a count-leading-zeros"
        assert not re.search(r"\b(F2F|F2I|I2F)\b", enc), "encoding is integer arithmetic: no float conversion"
    assert "ATOMS" in _sass_of(b.sass, "mx_amax_bf16")


@pytest.mark.parametrize("job", [j for j in _jobs() if j[0] == "amd"], ids=lambda j: f"{j[1]}-{j[2] or 'pack'}")
def test_clang_codec_module(binaries, job):
    _need("amd")
    b = binaries[job]
    res = b.resources
    want = codec.entry_points(job[2] is not None)
    assert sorted(res) == sorted(want)
    for kernel, r in res.items():
        assert r["scratch_bytes"] == 0 and r["vgpr_spill"] == 0 and r["sgpr_spill"] == 0, (kernel, r)
    if job[2] is None:
        return
    for suf in ("f32", "f16", "bf16", "f64"):
        q = _amd_of(b.disasm, f"mx_quantize_mx_{suf}")
        assert "global_load_dwordx4" in q and "global_store_dwordx4" in q, f"mx_quantize_mx_{suf}: no 16-byte access"
        assert re.search(r"\bds_max_(rtn_)?u32\b", q), "per-CTA scale maximum is an LDS atomic"
        enc = _amd_of(b.disasm, f"mx_encode_{suf}")
        assert re.search(r"\bv_ffbh_u32|\bs_flbit_i32", enc), "the exponent comes from a count-leading-zeros"
        assert not re.search(r"\bv_cvt_f(16|32|64)_f(16|32|64)", enc), "encoding is integer arithmetic"


def test_one_source_for_both_vendors():
    """The HIP compile unit inlines the very header NVRTC compiles; vendor intrinsics only inside the shim."""
    nv, _ = codec.compile_inputs(F.get("e4m3fn"), "nvidia")
    amd, _ = codec.compile_inputs(F.get("e4m3fn"), "amd")
    from mxcore import kernel_source

    header = kernel_source("nvidia", "mx_codec.cuh")
    assert header in nv and header in amd
    shim_end = header.index("// ---- input formats")
    body = header[shim_end:]
    for vendor_only in ("__clz", "atomicMax", "atomicAdd", "__hip_atomic", "__builtin_amdgcn", "asm(", "__shfl"):
        assert vendor_only not in body, vendor_only


@pytest.mark.parametrize("name", F.names())
def test_format_defines_come_from_the_spec(name):
    """Each -D define is the FormatSpec's own value (the kernel restates no format)."""
    spec = F.get(name)
    d = dict(opt[2:].split("=", 1) for opt in codec.format_defines(spec))
    num = lambda k: int(d[k].rstrip("ul"))  # noqa: E731
    assert (num("MXF_BITS"), num("MXF_EBITS"), num("MXF_MBITS"), num("MXF_BIAS")) == (spec.bits, spec.ebits, spec.mbits,
                                                                                      spec.bias)
    assert (num("MXF_EMIN"), num("MXF_EMAX"), num("MXF_MAX_MAGCODE")) == (spec.emin, spec.emax, spec.max_magcode)
    assert num("MXF_NAN_CODE") == (spec.nan_code or 0) and bool(num("MXF_HAS_INF")) == spec.has_inf
    # the max normal the kernel reconstructs is the spec's
    assert num("MXF_MAXSIG") * 2.0 ** (spec.emax - spec.mbits) == spec.max_normal
    assert d["MXF_CODE_T"] == {1: "mxc_u8", 2: "mxc_u16", 4: "mxc_u32"}[spec.code_dtype.itemsize]
