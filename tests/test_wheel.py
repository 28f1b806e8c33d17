"""Build the wheel, install it into a fresh venv and run ``python -m mxcore demo`` there.

Proves the package data (kernels_cuda/, kernels_hip/) and ``mxcore.backends`` work from an
installed wheel, not only from a source checkout.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd, **kw):
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kw)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return res.stdout


@pytest.mark.slow
def test_wheel_installs_and_runs(tmp_path):
    import importlib.util

    from conftest import require_tool

    require_tool("build (pip install build)", importlib.util.find_spec("build") is not None)
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(ROOT)])
    wheel = next((tmp_path / "dist").glob("mxcore-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("mxcore/backends/") and n.endswith("__init__.py") for n in names), names
    assert any(n.startswith("mxcore/kernels_cuda/") and n.endswith(".cu") for n in names), names
    assert any(n.startswith("mxcore/kernels_hip/") and n.endswith(".hip") for n in names), names
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)])
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = _run([str(py), "-c", "import mxcore, pathlib; print(pathlib.Path(mxcore.__file__).parent);"
                  "print(mxcore.kernels.kernel_dir('nvidia')); print(mxcore.kernels.kernel_dir('amd'))"], cwd=work)
    site, kcuda, khip = where.split()
    assert str(venv) in site and kcuda.startswith(site) and khip.startswith(site), where
    out = _run([str(py), "-m", "mxcore", "demo", "--size", "64"], cwd=work)
    assert "mxfp4" in out and "fp16" in out, out
