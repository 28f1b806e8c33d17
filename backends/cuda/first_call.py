"""The first-call benchmark: ``python -m mxcore bench --first-call [--cases ...] [--json FILE] [--no-compare]``.

For each case (:data:`CASES`: a dtype and a problem) a fresh Python process with empty cache folders
(``MXCORE_CACHE_DIR`` and ``CUPY_CACHE_DIR`` in a new temporary folder) makes its inputs (CuPy arrays of float16
for fp16, float32 otherwise; CuPy's context is made before the clock starts), then times ``import mxcore`` plus the
first ``mxcore.matmul`` to its synchronised result, and a second call.  Each case runs with the prebuilt kernels
(``prebuilt.py``) and, unless ``--no-compare``, again with ``MXCORE_PREBUILT=0`` (everything compiled as before).
The child reports where each mxcore kernel came from (package data, the ``--prebuild`` cache, or compiled) and
how many kernels NVRTC compiled through CuPy (files added to CuPy's empty cache: mxcore kernels the package lacks
and CuPy's own elementwise / reduction kernels), so a kernel the package misses is named in the output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mxcore.errors import BackendUnavailableError, UnknownNameError

__all__ = ["CASES", "Case", "child_code", "child_env", "cli", "parse_child", "render", "results_file", "run_case"]


@dataclass(frozen=True)
class Case:
    """One first call: ``dtype`` (as matmul takes it) on (M, N, K) float inputs."""

    label: str
    dtype: object
    shape: tuple

    @property
    def shape_text(self) -> str:
        return "x".join(map(str, self.shape))


CASES = {c.label: c for c in (
    Case("fp16", "fp16", (1024, 1024, 1024)),
    Case("bf16", "bf16", (1024, 1024, 1024)),
    Case("tf32", "tf32", (1024, 1024, 1024)),
    Case("fp8", "fp8", (1024, 1024, 1024)),
    Case("mxfp8", "mxfp8", (1024, 1024, 1024)),
    Case("mxfp4", "mxfp4", (1024, 1024, 1024)),
    Case("bf16-mxfp4", ("bf16", "mxfp4"), (1, 4096, 4096)),
)}

# the child: inputs first (CuPy's context, host data copied), then the clock; one JSON line on stdout
_CHILD = r"""
import json, os, sys, time
case = json.loads(sys.argv[1])
out = {"case": case["label"]}
try:
    import numpy as np
    import cupy as cp
    m, n, k = case["shape"]
    rng = np.random.default_rng(0)
    host = np.float16 if case["dtype"] == "fp16" else np.float32
    a = cp.asarray(rng.standard_normal((m, k)).astype(host))
    b = cp.asarray(rng.standard_normal((k, n)).astype(host))
    cp.cuda.Device().synchronize()
    cache = os.environ["CUPY_CACHE_DIR"]
    def files():
        return sum(len(f) for _, _, f in os.walk(cache))
    before = files()
    dtype = case["dtype"] if isinstance(case["dtype"], str) else tuple(case["dtype"])
    t0 = time.perf_counter()
    import mxcore
    t1 = time.perf_counter()
    c = mxcore.matmul(a, b, dtype)
    cp.cuda.Device().synchronize()
    t2 = time.perf_counter()
    c = mxcore.matmul(a, b, dtype)
    cp.cuda.Device().synchronize()
    t3 = time.perf_counter()
    from mxcore.backends.cuda import prebuilt
    from mxcore.backends.cuda.device import device_info
    dev = device_info(cp, int(cp.cuda.runtime.getDevice()))
    out.update(import_s=t1 - t0, call_s=t2 - t1, first_s=t2 - t0, second_s=t3 - t2, cupy_compiles=files() - before,
               kernels=[list(e) for e in prebuilt.EVENTS], device=f"{dev.name} ({dev.arch}, {dev.sms} SMs)",
               prebuilt_on=prebuilt.enabled())
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print("MXCORE-FIRST-CALL " + json.dumps(out))
"""
_TAG = "MXCORE-FIRST-CALL "


def child_code() -> str:
    """The child's program (``python -c``; the case as its first argument, JSON)."""
    return _CHILD


def child_env(folder, prebuilt: bool, base=None) -> dict:
    """The child's environment: empty mxcore and CuPy caches under ``folder``, mxcore importable from where this
    process imports it, ``MXCORE_PREBUILT=0`` for the compiled run."""
    import mxcore

    env = dict(os.environ if base is None else base)
    folder = Path(folder)
    env["MXCORE_CACHE_DIR"] = str(folder / "mxcore")
    env["CUPY_CACHE_DIR"] = str(folder / "cupy")
    env["MXCORE_PREBUILT"] = "1" if prebuilt else "0"
    env.pop("MXCORE_BACKEND", None)
    root = str(Path(mxcore.__file__).resolve().parents[1])  # the folder holding the mxcore package
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def parse_child(stdout: str, stderr: str = "", returncode: int = 0) -> dict:
    """The child's report (its tagged JSON line), or {"error": ...} saying why there is none."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(_TAG):
            try:
                return json.loads(line[len(_TAG):])
            except ValueError:
                break
    tail = (stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"the child exited with status {returncode} without a report: {tail}"}


def run_case(case: Case, prebuilt: bool, timeout: float = 600.0) -> dict:
    """One fresh process for ``case`` (see the module docstring); its report."""
    with tempfile.TemporaryDirectory(prefix="mxcore_first_call_") as tmp:
        arg = json.dumps({"label": case.label, "dtype": case.dtype, "shape": list(case.shape)})
        try:
            res = subprocess.run([sys.executable, "-c", child_code(), arg], env=child_env(tmp, prebuilt),
                                 capture_output=True, text=True, timeout=timeout, cwd=tmp, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return {"case": case.label, "error": f"no result within {timeout:.0f} s"}
        return parse_child(res.stdout, res.stderr, res.returncode)


def origins(report: dict) -> dict:
    """Counts of the child's mxcore kernels by origin ("package", "cache", "compiled")."""
    out = {"package": 0, "cache": 0, "compiled": 0}
    for where, *_ in report.get("kernels", []):
        out[where] = out.get(where, 0) + 1
    return out


def render(rows: list[dict]) -> str:
    """The table: per case the first call (import + matmul to the synchronised result) with and without the
    prebuilt kernels, where the kernels came from, CuPy's own compiles, and the compiled mxcore kernels named."""
    head = (f"{'dtype':<14s} {'M x N x K':<16s} {'prebuilt (s)':>12s} {'compiled (s)':>12s} {'second (ms)':>11s}  "
            f"{'kernels pkg/cache/compiled':>26s}  {'NVRTC runs':>10s}")
    lines = [head, "-" * len(head)]
    missed = []
    for r in rows:
        pre, comp = r.get("prebuilt") or {}, r.get("compiled") or {}
        if "error" in pre:
            lines.append(f"{r['label']:<14s} {r['shape']:<16s} failed: {pre['error']}")
            continue
        o = origins(pre)
        comp_s = f"{comp['first_s']:12.2f}" if "first_s" in comp else f"{'-' if not comp else 'failed':>12s}"
        lines.append(f"{r['label']:<14s} {r['shape']:<16s} {pre['first_s']:12.2f} {comp_s} "
                     f"{1e3 * pre['second_s']:11.2f}  {o['package']:>12d}/{o['cache']}/{o['compiled']:<11d}  "
                     f"{pre['cupy_compiles']:>10d}")
        missed += [f"{r['label']}: {f} {name} ({arch})" for where, f, name, arch in pre.get("kernels", [])
                   if where == "compiled"]
    device = next((r["prebuilt"]["device"] for r in rows if "device" in (r.get("prebuilt") or {})), "")
    lines.insert(0, f"first call, fresh process, empty MXCORE_CACHE_DIR and CUPY_CACHE_DIR: import mxcore + matmul "
                    f"of float CuPy inputs to the synchronised result{'; ' + device if device else ''}")
    lines.insert(1, "NVRTC runs: kernels CuPy compiled in the prebuilt run (files added to its cache: mxcore kernels "
                    "the package lacks and CuPy's own elementwise / reduction kernels)")
    if missed:
        lines.append("compiled at run time with the prebuilt kernels on (not in the package data): "
                     + "; ".join(missed))
    return "\n".join(lines)


def cli(argv) -> int:
    """``bench --first-call``: the table (and ``--json``)."""
    import argparse

    p = argparse.ArgumentParser(prog="mxcore bench --first-call",
                                description="time import + the first matmul per dtype in fresh processes with empty "
                                            "kernel caches, with and without the prebuilt kernels")
    p.add_argument("--first-call", action="store_true", required=True)
    p.add_argument("--cases", default=",".join(CASES), help=f"comma list of: {', '.join(CASES)} (default: all)")
    p.add_argument("--no-compare", action="store_true", help="skip the runs with MXCORE_PREBUILT=0")
    p.add_argument("--json", metavar="FILE", help="also write the run as a benchmarks/results file (render.py "
                                                  "renders it into docs/benchmarks.md), the reports included")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per process (default 600)")
    args = p.parse_args(argv)
    cases = []
    for name in (x.strip() for x in args.cases.split(",")):
        if name and name not in CASES:
            raise UnknownNameError(f"--cases: no first-call case {name!r}; have: {', '.join(CASES)}")
        if name:
            cases.append(CASES[name])
    require_gpu()
    rows = []
    for case in cases:
        row = {"label": case.label, "shape": case.shape_text, "prebuilt": run_case(case, True, args.timeout)}
        if not args.no_compare:
            row["compiled"] = run_case(case, False, args.timeout)
        rows.append(row)
    print(render(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(results_file(rows, " ".join(["python -m mxcore bench", *argv])),
                                              indent=1) + "\n")
    return 1 if any("error" in (r["prebuilt"] or {}) for r in rows) else 0


def results_file(rows: list[dict], command: str) -> dict:
    """The run as a ``benchmarks/results/`` file (``benchmarks/render.py`` renders it into docs/benchmarks.md):
    one row per case, the children's reports kept under ``reports``."""
    import datetime

    device = next((r["prebuilt"]["device"] for r in rows if "device" in (r.get("prebuilt") or {})), "")
    gpu = next((g for g in ("H200", "H100") if g in device), device.split(" (")[0])
    out_rows = []
    for r in rows:
        pre, comp = r.get("prebuilt") or {}, r.get("compiled") or {}
        o = origins(pre)
        out_rows.append({"dtype": r["label"], "shape": r["shape"], "prebuilt_s": _round(pre.get("first_s")),
                         "compiled_s": _round(comp.get("first_s")), "import_s": _round(pre.get("import_s")),
                         "second_ms": _round(1e3 * pre["second_s"]) if "second_s" in pre else None,
                         "kernels": f"{o['package']}/{o['cache']}/{o['compiled']}" if "kernels" in pre else None,
                         "nvrtc": pre.get("cupy_compiles")})
    return {"order": 5, "title": "First call", "gpu": gpu, "machine": device, "command": command,
            "date": datetime.date.today().isoformat(),
            "what": "Import plus the first matmul to its synchronised result in a fresh process with empty kernel "
                    "caches (MXCORE_CACHE_DIR and CUPY_CACHE_DIR), with the prebuilt kernels and with "
                    "MXCORE_PREBUILT=0 (every kernel compiled by NVRTC).",
            "method": "One process per case and mode; float CuPy inputs made (and CuPy's context created) before the "
                      "clock starts; 'kernels' counts mxcore's kernels from the package data / the --prebuild cache "
                      "/ compiled; 'NVRTC runs' the kernels CuPy compiled in the prebuilt run (its own elementwise "
                      "and reduction kernels included).",
            "columns": [["dtype", "dtype"], ["shape", "M x N x K"], ["prebuilt_s", "prebuilt (s)"],
                        ["compiled_s", "compiled (s)"], ["import_s", "of it import (s)"],
                        ["second_ms", "second call (ms)"], ["kernels", "kernels pkg/cache/compiled"],
                        ["nvrtc", "NVRTC runs"]],
            "rows": out_rows, "reports": rows}


def _round(x):
    return None if x is None else round(float(x), 3)


def require_gpu() -> None:
    """BackendUnavailableError (one line: what is missing, what to do) unless CuPy sees an NVIDIA GPU."""
    from .backend import CudaBackend

    reason = CudaBackend().is_available()
    if reason:
        raise BackendUnavailableError(f"bench --first-call times kernels on an NVIDIA GPU, and {reason}; run it on "
                                      "a machine with one (pip install 'mxcore[cuda]')")
