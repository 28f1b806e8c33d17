"""The pytest half of the stand-in-runtime tests: build the stand-in HIP runtime, fetch real hip-python wheels,
run a scenario of ``scenario.py`` in a subprocess wired to both.

* :func:`build_library`: ``cc`` compiles ``standin_hip.c`` once per source text into
  ``<cache>/runtime-<hash>/lib/libamdhip64.so`` (+ ``libhiprtc.so``, the same file under hiprtc's name).
* :func:`install_wheels`: ``pip install --no-deps --target <cache>/<convention>`` of the pinned wheels in
  :data:`CONVENTIONS` (from PyPI), once; each release lives in its own folder and is imported only by the
  subprocesses that put it on PYTHONPATH, so both call conventions are tested in one environment.
* :func:`run_scenario`: the subprocess, with LD_LIBRARY_PATH (hip-python 6.x/7.x dlopen the bare library
  names) and ROCM_PATH (hip-python 10.x looks in ``$ROCM_PATH/lib``) naming the stand-in.

The cache folder is ``$MXCORE_STANDIN_CACHE``, else ``$XDG_CACHE_HOME`` (``~/.cache``)``/mxcore-tests/standin``
(the temp folder where that cannot be created);
every entry is written to a temporary name and renamed into place, so an interrupted run leaves no half entry.

By hand (e.g. the ``amd_gpu`` tests or ``mxcore`` commands on the stand-in; the plugin executes the launches)::

    eval "$(python tests/standin_hip/standin.py env hip-python-10.0 gfx950 /tmp/standin-work)"
    python -m pytest -p standin_hip.plugin -m amd_gpu tests/test_hip_gpu.py -k fp8_encoding
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "standin_hip.c"
TESTS = HERE.parent

#: hip-python releases under test, one per call convention: (pip requirements, hipGetDeviceProperties returns
#: the properties).  The newest release of each line with a CPython 3.x manylinux wheel; 10.x is a metapackage
#: over rocm-bindings-{hip,core}, pinned here so that a new upload cannot change what is tested.
CONVENTIONS = {
    "hip-python-7.2": (("hip-python==7.2.2.562.43",), False),
    "hip-python-10.0": (("hip-python==10.0.0.0.1.2", "rocm-bindings-hip==10.0.0.0.1.2",
                         "rocm-bindings-core==10.0.0.0.1.2"), True),
}


def cache_root() -> Path:
    """The cache folder (created); the system temp folder's ``mxcore-tests-standin`` when home is read-only."""
    root = os.environ.get("MXCORE_STANDIN_CACHE")
    if root:
        path = Path(root)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        path = Path(base) / "mxcore-tests" / "standin"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        path = Path(tempfile.gettempdir()) / "mxcore-tests-standin"
        path.mkdir(parents=True, exist_ok=True)
    return path


def _publish(tmp: Path, final: Path) -> None:
    try:
        os.replace(tmp, final)
    except OSError:  # another run published it first
        shutil.rmtree(tmp, ignore_errors=True)


def build_library() -> tuple[Path | None, str]:
    """(the stand-in's lib folder, '') or (None, why it could not be built)."""
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        return None, f"no C compiler ({cc}) on PATH"
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    final = cache_root() / f"runtime-{digest}"
    lib = final / "lib"
    if (lib / "libamdhip64.so").is_file() and (lib / "libhiprtc.so").exists():
        return lib, ""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
    (tmp / "lib").mkdir()
    cmd = [cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-Wl,-soname,libamdhip64.so",
           "-o", str(tmp / "lib" / "libamdhip64.so"), str(SOURCE), "-lpthread"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        return None, f"{' '.join(cmd)} failed:\n{proc.stderr}"
    os.symlink("libamdhip64.so", tmp / "lib" / "libhiprtc.so")
    _publish(tmp, final)
    return lib, ""


def install_wheels(convention: str) -> tuple[Path | None, str]:
    """(a folder holding that hip-python release, '') or (None, why pip could not install it)."""
    requirements, _ = CONVENTIONS[convention]
    final = cache_root() / convention
    marker = final / ".requirements"
    if marker.is_file() and marker.read_text() == "\n".join(requirements):
        return final, ""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".pip-", dir=final.parent))
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--disable-pip-version-check",
           "--quiet", "--target", str(tmp), *requirements]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        return None, f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}"
    (tmp / ".requirements").write_text("\n".join(requirements))
    if final.exists():  # a stale pin set
        shutil.rmtree(final, ignore_errors=True)
    _publish(tmp, final)
    return final, ""


def environment(wheels: Path, lib: Path | None, work: Path, **env) -> dict:
    """The environment of a subprocess that imports the hip-python in ``wheels`` and whose HIP runtime is the
    stand-in in ``lib`` (None: no HIP runtime at all); ``env``: extra MXSTANDIN_* settings."""
    from mxcore.kernels import kernel_source

    work.mkdir(parents=True, exist_ok=True)
    prelude = work / "hip_shim.h"  # what real hiprtc predefines, from mxcore's own shim
    prelude.write_text(kernel_source("amd", "hip_shim.h"))
    log = work / "standin.log"
    if log.exists():
        log.unlink()  # the hook reads this run's compile options from it
    full = {k: v for k, v in os.environ.items() if not k.startswith("MXSTANDIN_")}
    full.update(
        PYTHONPATH=os.pathsep.join([str(wheels), str(TESTS)]),
        MXCORE_CACHE_DIR=str(work / "cache"),  # fresh: every kernel goes through the stand-in's hiprtc
        MXSTANDIN_LOG=str(log),
        MXSTANDIN_HIPRTC_PRELUDE=str(prelude),
        PYTHONDONTWRITEBYTECODE="1",
    )
    full.pop("MXCORE_BACKEND", None)
    if lib is not None:
        full["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(lib), os.environ.get("LD_LIBRARY_PATH", "")) if p)
        full["ROCM_PATH"] = str(lib.parent)
        full["MXSTANDIN_LIB_DIR"] = str(lib)
    else:
        full["ROCM_PATH"] = str(work / "no-rocm")  # an empty tree: hip-python 10 must not find /opt/rocm either
    full.update({k: str(v) for k, v in env.items()})
    return full


def run_scenario(name: str, wheels: Path, lib: Path | None, work: Path, **env) -> dict:
    """Run ``scenario.py name`` in :func:`environment`.  Returns the scenario's result dict plus the stand-in's
    log lines."""
    full = environment(wheels, lib, work, **env)
    log = Path(full["MXSTANDIN_LOG"])
    proc = subprocess.run([sys.executable, str(HERE / "scenario.py"), name], capture_output=True, text=True,
                          env=full, check=False, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("STANDIN_RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"scenario {name} exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\n"
                             f"stderr:\n{proc.stderr[-4000:]}")
    out = json.loads(lines[-1][len("STANDIN_RESULT "):])
    out["log"] = log.read_text().splitlines() if log.exists() else []
    out["stderr"] = proc.stderr
    return out


def _print_environment(convention: str, arch: str, work: str) -> int:
    """``env CONVENTION ARCH WORK``: shell ``export`` lines for a stand-in session (see the module docstring)."""
    import shlex

    lib, why = build_library()
    wheels, why_not = install_wheels(convention)
    if lib is None or wheels is None:
        print(why or why_not, file=sys.stderr)
        return 1
    full = environment(wheels, lib, Path(work), MXSTANDIN_ARCH=arch)
    for key, value in sorted(full.items()):
        if key.startswith("MXSTANDIN_") or key in ("PYTHONPATH", "LD_LIBRARY_PATH", "ROCM_PATH", "MXCORE_CACHE_DIR"):
            print(f"export {key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "env" or sys.argv[2] not in CONVENTIONS:
        sys.exit(f"usage: {sys.argv[0]} env {{{','.join(CONVENTIONS)}}} ARCH WORK_DIR")
    sys.exit(_print_environment(*sys.argv[2:]))
