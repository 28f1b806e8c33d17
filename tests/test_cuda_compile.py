"""Offline (no GPU) checks of every CUDA kernel the backend can launch: NVRTC from the pip wheels compiles each
variant to a cubin for sm_80, sm_89 and sm_90 (ptxas runs, so PTX errors surface here), and cuobjdump's SASS
must show the instructions the design relies on: HMMA (QMMA for native fp8 on sm_89), LDSM where ldmatrix is
used, LDGSTS for cp.async, and no local memory (LDL/STL).  Registers and shared memory are printed per variant
(run with ``-s`` to see the table).  Without NVRTC/cuobjdump the tests skip, except under CI=true where they fail.
"""

from __future__ import annotations

import json
import time

import pytest

from mxcore.backends import cuda, nvrtc_tools
from mxcore.errors import KernelCompileError

from conftest import require_tool

ARCHS = ["sm_80", "sm_89", "sm_90"]

TINY = r"""
extern "C" __global__ void tiny(float* x) {
    __shared__ float s[64];
    s[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    x[threadIdx.x] = s[63 - threadIdx.x] * 2.0f;
}
template <int N> __global__ void scaled(float* x) { x[threadIdx.x] *= N; }
"""


def _need_tools():
    require_tool("NVRTC (cuda-bindings + nvidia-cuda-nvrtc)", nvrtc_tools.have_nvrtc())
    require_tool("cuobjdump + nvdisasm (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)", nvrtc_tools.have_cuobjdump())


def test_nvrtc_tools_compile_resources_and_sass():
    _need_tools()
    b = nvrtc_tools.compile_cuda(TINY, name="tiny", arch="sm_80", name_expressions=["scaled<3>"])
    assert b.cubin[:4] == b"\x7fELF" and ".target sm_80" in b.ptx
    assert b.lowered_names["scaled<3>"].startswith("_Z")
    res = b.resources["tiny"]
    assert res["registers"] > 0 and res["shared_bytes"] == 256 and res["barriers"] == 1 and res["spill_stores"] == 0
    counts = nvrtc_tools.sass_counts(b.sass)
    assert counts["BAR"] == 1 and counts["STS"] == 1 and counts["LDS"] == 1 and counts["LDL"] == 0
    assert nvrtc_tools.disassemble(b.cubin) == b.sass


def test_nvrtc_tools_reports_compile_errors():
    require_tool("NVRTC", nvrtc_tools.have_nvrtc())
    with pytest.raises(KernelCompileError) as info:
        nvrtc_tools.compile_cuda("this is not C++", name="broken", arch="sm_90")
    assert "broken" in str(info.value) and info.value.log and info.value.arch == "sm_90"
    with pytest.raises(KernelCompileError):
        nvrtc_tools.compile_cuda(TINY, name="tiny", arch="compute_90")


def test_ptxas_log_parser():
    log = """ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem"""
    assert nvrtc_tools.parse_ptxas_log(log) == {"k": {"registers": 255, "shared_bytes": 1024, "local_bytes": 16,
                                                     "spill_stores": 8, "spill_loads": 4, "barriers": 1}}


@pytest.mark.parametrize("arch", ARCHS)
def test_every_variant_compiles_with_expected_sass(arch, tmp_path):
    _need_tools()
    t0 = time.time()
    rows = [r.as_dict() for r in cuda.CudaBackend().emit_kernels(arch, tmp_path)]
    jobs = {j["stem"]: j for j in cuda.compile_jobs(arch)}
    assert {r["variant"] for r in rows} == set(jobs), "emit_kernels must cover every launchable kernel"
    table = [f"{arch}: {len(rows)} kernels compiled in {time.time() - t0:.1f}s",
             f"{'variant':34} {'regs':>5} {'smem':>7} {'HMMA':>5} {'QMMA':>5} {'LDSM':>5} {'LDGSTS':>6}"]
    failures = []
    for r in rows:
        job = jobs[r["variant"]]
        sass = nvrtc_tools.disassemble((tmp_path / r["file"]).read_bytes())
        c = nvrtc_tools.sass_counts(sass)
        table.append(f"{r['variant']:34} {r['registers']:5d} {r['shared_bytes']:7d} {c['HMMA']:5d} {c['QMMA']:5d} "
                     f"{c['LDSM']:5d} {c['LDGSTS']:6d}")
        problems = []
        if c["LDL"] or c["STL"] or r["spill_stores"] or r["local_bytes"]:
            problems.append(f"local memory (LDL {c['LDL']}, STL {c['STL']}, stack {r['local_bytes']} B)")
        if job["file"] == cuda.GEMM_FILE:
            mma = "QMMA" if job["mma"] == "QMMA" and arch == "sm_89" else "HMMA"
            if c[mma] == 0:
                problems.append(f"no {mma}")
            if c["LDSM"] == 0 or c["LDGSTS"] == 0:
                problems.append("no LDSM or no LDGSTS")
            if r["shared_bytes"] > 227 * 1024:
                problems.append("more shared memory than an SM has")
        elif job["file"] == cuda.CEILING_FILE and c["HMMA"] + c["QMMA"] == 0:
            problems.append("the ceiling loop has no mma")
        if problems:
            failures.append(f"{r['variant']}: {', '.join(problems)}")
    print("\n".join(table))
    assert not failures, "\n".join(failures)
    manifest = json.loads(json.dumps(rows))  # JSON-serialisable, as the CLI writes it
    assert all({"kernel", "dtype", "tile", "file", "registers", "shared_bytes"} <= set(m) for m in manifest)


def test_variant_counts_per_arch():
    counts = {arch: len(cuda.all_variants(arch)) for arch in ARCHS}
    # fp16/bf16: 4 majorness x tiles; tf32: 1 x tiles; fp8 pairs: 4 x tiles from sm_89 (native m16n8k32 on sm_89,
    # fragments converted to f16 on sm_90)
    t = {e: len(cuda.element_tiles(e)) for e in cuda.ELEMENTS}
    assert t["f16"] == t["bf16"] == 3 and t["tf32"] == 3 and t["e4m3.e4m3"] == 3 and t["e4m3.e4m3.f16"] == 4
    assert counts == {"sm_80": 3 * 3 * 3, "sm_89": 3 * 3 * 3 + 4 * 3, "sm_90": 3 * 3 * 3 + 4 * 4}
    assert all(bool(v.element.cvt) == (arch == "sm_90") for arch in ARCHS for v in cuda.all_variants(arch)
               if v.element.esize == 1)
    assert cuda.native_fp8("sm_89") and not cuda.native_fp8("sm_90") and cuda.native_fp8("sm_120")
