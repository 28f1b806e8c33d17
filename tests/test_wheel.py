"""The package as users get it: build the wheel, install it into a fresh venv, run the CLI there.

* The wheel holds every source file of the checkout (``mxcore/``, ``backends/`` as ``mxcore/backends/``, the
  kernel sources as package data): a package missing from pyproject's list fails here.
* Run from a temporary folder, the venv's python uses the installed wheel (``kernel_dir`` inside site-packages).
* Run from the repository root — the README's quick start, ``pip install . && python -m mxcore demo`` — Python
  imports the checkout's ``mxcore/`` (the current folder comes first on ``sys.path``), which must then find
  ``backends/`` and the kernel folders beside it: that venv has only numpy and ml_dtypes besides the wheel, so
  this is also the "checkout with nothing installed" case.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import require_tool

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = {"mxcore": "mxcore", "backends": "mxcore/backends", "kernels_cuda": "mxcore/kernels_cuda",
               "kernels_hip": "mxcore/kernels_hip"}
KERNEL_SUFFIXES = {".cu", ".cuh", ".hip", ".h"}
WHERE = ("import mxcore, mxcore.backends, mxcore.kernels as k, pathlib; "
         "print(pathlib.Path(mxcore.__file__).parent); print(pathlib.Path(mxcore.backends.__file__).parent); "
         "print(k.kernel_dir('nvidia')); print(k.kernel_dir('amd')); print(len(k.kernel_source('nvidia', 'gemm.cu')))")


def _run(cmd, **kw):
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
                         **kw)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return res.stdout


def _tracked_sources() -> set[str]:
    """Paths the wheel must hold (as they are named inside it) for every file git tracks in the source folders."""
    out = _run(["git", "ls-files", "--", *SOURCE_DIRS], cwd=ROOT)
    want = set()
    for rel in out.split():
        top, _, rest = rel.partition("/")
        if (ROOT / rel).is_file() and (rel.endswith(".py") or Path(rel).suffix in KERNEL_SUFFIXES):
            want.add(f"{SOURCE_DIRS[top]}/{rest}")
    return want


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory):
    """(wheel path, venv python) with the wheel installed."""
    require_tool("build (pip install build)", importlib.util.find_spec("build") is not None)
    tmp = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", tmp / "dist", ROOT])
    wheel = next((tmp / "dist").glob("mxcore-*.whl"))
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", venv])
    py = venv / "bin" / "python"
    _run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel])
    return wheel, py


@pytest.mark.slow
def test_wheel_holds_every_source_file(wheel_venv):
    wheel, _ = wheel_venv
    names = set(zipfile.ZipFile(wheel).namelist())
    want = _tracked_sources()
    assert {"mxcore/__init__.py", "mxcore/backends/__init__.py", "mxcore/kernels_cuda/gemm.cu"} <= want
    missing = sorted(want - names)
    assert not missing, f"the wheel lacks {missing}: add their packages to pyproject's [tool.setuptools] packages"


@pytest.mark.slow
def test_wheel_holds_the_prebuilt_kernels(wheel_venv, tmp_path):
    """The package data of backends/cuda/prebuilt.py (manifest and every cubin it names) is in the wheel, the
    installed package reads it back, and the wheel stays small."""
    import json

    wheel, py = wheel_venv
    names = set(zipfile.ZipFile(wheel).namelist())
    manifest = json.loads((ROOT / "mxcore" / "prebuilt" / "manifest.json").read_text())
    want = {"mxcore/prebuilt/manifest.json"} | {f"mxcore/prebuilt/{m['blob']}" for m in manifest["modules"].values()}
    assert len(want) > 100 and not sorted(want - names), sorted(want - names)[:5]
    size = wheel.stat().st_size
    assert size < 25 * 2**20, f"the wheel is {size / 2**20:.1f} MiB"
    check = ("from mxcore.backends.cuda import prebuilt; p = prebuilt.package(); "
             "print(len(p.modules), all(p.blob(k)[:4] == b'\\x7fELF' for k in p.modules), p.folder)")
    count, ok, folder = _run([py, "-c", check], cwd=tmp_path).split()
    assert int(count) == len(manifest["modules"]) and ok == "True" and str(py.parents[1]) in folder


@pytest.mark.slow
def test_installed_wheel_runs_from_elsewhere(wheel_venv, tmp_path):
    _, py = wheel_venv
    site, backends, kcuda, khip, n = _run([py, "-c", WHERE], cwd=tmp_path).split()
    assert str(py.parents[1]) in site and int(n) > 1000
    assert backends == f"{site}/backends" and kcuda == f"{site}/kernels_cuda" and khip == f"{site}/kernels_hip"
    out = _run([py, "-m", "mxcore", "demo", "--size", "64"], cwd=tmp_path)
    assert "mxfp4" in out and "fp16" in out, out


@pytest.mark.slow
def test_quick_start_from_the_repository_root(wheel_venv):
    """``pip install . && python -m mxcore demo`` from the root: the checkout's mxcore/ is imported and finds
    backends/ and the kernels beside it (this failed with "No module named 'mxcore.backends'")."""
    _, py = wheel_venv
    site, backends, kcuda, khip, _ = _run([py, "-c", WHERE], cwd=ROOT).split()
    assert [site, backends, kcuda, khip] == [str(ROOT / d) for d in SOURCE_DIRS]
    out = _run([py, "-m", "mxcore", "demo", "--size", "64"], cwd=ROOT)
    assert "mxfp4" in out and "fp16" in out, out
    info = _run([py, "-m", "mxcore", "info"], cwd=ROOT)
    assert "reference: usable" in info and "\n  cuda: " in info and "\n  hip: " in info, info
