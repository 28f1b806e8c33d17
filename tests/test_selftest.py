"""``python -m mxcore selftest``.

CPU: the AMD half end to end through the stand-in HIP runtime (tests/standin_hip: the real hip-python wheels of
both call conventions, clang-22 as hiprtc, launches executed on the CPU by tests/_standin.py) on gfx950 and
gfx942 -- layout probes (scaled MFMAs with per-block scales and decoy scale bytes), the GEMM matrix, the
run-time vs offline compiler comparison, the table and the JSON report; a planted wrong layout shows up as ❌
with exit status 1; the reference backend and a machine without a GPU backend are refused with exit status 2.
GPU (nvidia_gpu): the whole selftest on the NVIDIA GPU exits 0.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import require_tool
from mxcore.backends import hip_tools
from standin_hip import standin

from mxcore.tools import selftest

HELPER = standin.TESTS / "_standin.py"
SMALL = "1x1x1,17x33x65"


@pytest.fixture(scope="module")
def runtime_lib():
    require_tool("clang-22", hip_tools.have_clang())
    lib, why = standin.build_library()
    require_tool("cc (stand-in HIP runtime)", lib is not None or why)
    return lib


def _wheels(convention):
    folder, why = standin.install_wheels(convention)
    require_tool(f"{convention} wheels from PyPI", folder is not None or why)
    return folder


def _selftest(lib, convention, arch, tmp_path, *args, **env):
    """Run the selftest on the stand-in (fresh work folder: every kernel goes through its hiprtc)."""
    full = standin.environment(_wheels(convention), lib, tmp_path / "work", MXSTANDIN_ARCH=arch, **env)
    out = tmp_path / "selftest.json"
    proc = subprocess.run([sys.executable, str(HELPER), "--out", str(out), *args], capture_output=True, text=True,
                          env=full, cwd=tmp_path, check=False, timeout=900)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 3, f"the stand-in's launch hook failed:\n{text[-4000:]}"
    return proc.returncode, text, json.loads(out.read_text())


def _table_lines(text):
    return {line.split("|")[1].strip().strip("`"): line.split("|")[2].strip() for line in text.splitlines()
            if line.startswith("| `")}


@pytest.mark.parametrize("convention, arch, dtypes, fp8_row", [
    ("hip-python-10.0", "gfx950:sramecc+:xnack-", "fp16,mxfp4,mxfp8_e4m3+mxfp4,e4m3fn,e4m3fnuz", "e4m3fn"),
    ("hip-python-7.2", "gfx942:sramecc+:xnack-", "bf16,fp8,mxfp4", "e4m3fnuz"),
])
def test_amd_selftest_on_the_standin(runtime_lib, tmp_path, convention, arch, dtypes, fp8_row):
    rc, text, report = _selftest(runtime_lib, convention, arch, tmp_path, "--dtype", dtypes, "--shapes", SMALL)
    assert rc == 0, text[-4000:]
    gfx = arch.split(":")[0]
    # the JSON: versions for a bug report, every case, the table, the compiler comparison
    assert report["backend"] == "hip" and report["passed"] is True
    v = report["versions"]
    assert v["arch"].startswith(gfx) and v["device"].startswith("Stand-in Instinct")
    assert v["hip_python"] == standin.CONVENTIONS[convention][0][0].split("==")[1]
    for key in ("mxcore", "python", "numpy", "rocm", "hiprtc", "hip_python_convention"):
        assert v[key], key
    kinds = {c["kind"] for c in report["cases"]}
    assert kinds == {"probe", "gemm"} and all(c["outcome"] == "passed" for c in report["cases"])
    gemm = [c["name"] for c in report["cases"] if c["kind"] == "gemm"]
    for major in ("row-row", "row-col", "col-row", "col-col"):
        assert any(f"17x33x65 {major} exact" in name for name in gemm), major
    assert any("random" in name for name in gemm)
    probes = [c["name"] for c in report["cases"] if c["kind"] == "probe"]
    table = report["table"]
    if gfx == "gfx950":  # the MX kernels' scaled MFMAs were probed (per-block scales, decoy bytes)
        assert any(name.startswith("v_mfma_scale_f32_") and "(e2m1 x e2m1)" in name for name in probes), probes
        assert table["mxfp8_e4m3 x mxfp4"] == "passed" and table["e4m3fnuz"] == "unsupported"
    else:
        assert table["mxfp4"] == "unsupported" and any("fp8" in name for name in probes), probes
    assert table[fp8_row] == "passed" and table["layout probes"] == "passed"
    # the printed table agrees with the JSON
    printed = _table_lines(text)
    assert printed == {k: selftest.MARK[r.split(":")[0]] for k, r in table.items()}
    # the stand-in's hiprtc is clang-22: the run-time build equals the offline build
    assert report["compiler"] and all(r["outcome"] == "same" for r in report["compiler"]), report["compiler"]
    assert all(r["runtime"]["mma_lines"] > 0 and r["runtime"]["local_bytes"] == 0 for r in report["compiler"])


def test_planted_wrong_layout_fails(runtime_lib, tmp_path):
    rc, text, report = _selftest(runtime_lib, "hip-python-10.0", "gfx950:sramecc+:xnack-", tmp_path, "--dtype", "fp16",
                                 "--shapes", "17x33x65", MXSELFTEST_PLANT="layout")
    assert rc == 1, text[-4000:]
    assert report["passed"] is False
    (bad,) = [c for c in report["cases"] if c["outcome"] == "failed"]
    assert bad["kind"] == "probe" and bad["detail"].startswith("arange: A[")
    assert "lane 0" in bad["detail"] or "lane 5" in bad["detail"]
    assert report["table"]["layout probes"].startswith("failed: " + bad["name"])
    assert report["table"]["fp16"] == "passed"  # the kernels themselves were right
    assert _table_lines(text)["layout probes"].startswith("❌ " + bad["name"])


def test_reference_backend_is_refused(tmp_path):
    out = tmp_path / "r.json"
    assert selftest.main(["--backend", "reference", "--out", str(out)]) == 2
    assert "reference itself" in json.loads(out.read_text())["not_run"]
    from mxcore.backends import get
    from mxcore.errors import UnsupportedError

    with pytest.raises(UnsupportedError, match="GPU backends"):
        selftest.run(get("reference"))


def test_no_gpu_backend_exits_2_with_each_reason(tmp_path, monkeypatch, capsys):
    from mxcore.backends import get

    for name in selftest.GPU_BACKENDS:
        monkeypatch.setattr(get(name), "is_available", lambda name=name: f"no {name} device (test)")
    out = tmp_path / "n.json"
    assert selftest.main(["--out", str(out)]) == 2
    why = json.loads(out.read_text())["not_run"]
    assert "cuda: no cuda device (test)" in why and "hip: no hip device (test)" in why
    assert why in capsys.readouterr().err


@pytest.mark.nvidia_gpu
def test_selftest_on_the_nvidia_gpu(cupy_device, tmp_path):
    out = tmp_path / "selftest.json"
    proc = subprocess.run([sys.executable, "-m", "mxcore", "selftest", "--backend", "cuda", "--out", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, check=False, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    report = json.loads(out.read_text())
    assert report["passed"] and report["versions"]["arch"].startswith("sm_")
    assert {c["kind"] for c in report["cases"]} == {"probe", "gemm"}
    assert report["compiler"], "no compiler comparison"
