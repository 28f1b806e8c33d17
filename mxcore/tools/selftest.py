"""``python -m mxcore selftest``: trust a new GPU in one command (NVIDIA through ``cuda``, AMD through ``hip``).

On the GPU the backend runs on (``--backend``, default ``auto``: the first usable GPU backend):

1. **Layout probes** of every instruction the backend's kernels use (:mod:`backends.probes`): the arange
   experiment per operand (every element read from the (lane, slot) :mod:`mxcore.layouts` says), then exact
   random inputs bit-exact against the reference; scaled MFMAs get a different E8M0 scale per 32-K block and
   decoy bytes in the scale-register bytes op_sel must not read.  NVIDIA also runs the ldmatrix probes and, on
   sm_90, the wgmma probes.
2. **GEMM matrix**: every dtype of ``supported_dtypes()`` plus mixed pairs (fp8 x fp4 MX, e4m3 x e5m2), the four
   A/B majorness combinations, odd shapes; exact inputs bit-exact against :func:`mxcore.reference.reference_matmul`,
   random normal inputs within (K + 2) * 2^-23 * (|A| @ |B|) (+ 2^-20 * (|A| @ |B|) for fp32, which NVIDIA runs
   as 3xTF32); every output poisoned with NaN before the launch.
3. **Compiler comparison** (reported, not gating): each GEMM variant the run used, as the run-time compiler built
   it (NVRTC through CuPy / hiprtc) versus the offline compile of the same source and options that CI and
   ``python -m mxcore kernels`` use (``backends/nvrtc_tools.py`` / clang-22 through ``backends/hip/cache.py``):
   registers, shared memory / LDS, local memory / scratch, spills, and the MFMA count where a disassembler is
   present.  Different compilers legitimately differ; the table says by how much.
4. One support table (dtype x ✅ / ❌ first mismatch / ➖ not supported) and a JSON file (``--out``) with the
   versions, every probe and GEMM case and the comparison, to attach to a bug report.

Exit status: 0 when every probe and GEMM case passed, 1 when any failed, 2 when no GPU backend is usable (the
reason is printed; the ``reference`` backend is refused: it is the oracle the selftest compares against).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .. import dtypes as _dt

__all__ = ["MAJORS", "SHAPES", "Case", "Report", "main", "run"]

SHAPES = ((1, 1, 1), (17, 33, 65), (127, 255, 257))
MAJORS = (("row", "row"), ("row", "col"), ("col", "row"), ("col", "col"))
RANDOM_SHAPE = (64, 80, 300)
MARK = {"passed": "✅", "failed": "❌", "unsupported": "➖"}
GPU_BACKENDS = ("cuda", "hip")  # the backends with a driver below (auto tries them in this order)


@dataclass
class Case:
    """One check: ``kind`` "probe" | "gemm"; ``outcome`` "passed" | "failed"; ``detail``: the first mismatch."""

    kind: str
    name: str
    outcome: str
    detail: str = ""
    dtype: str = ""
    seconds: float = 0.0


@dataclass
class Report:
    backend: str
    versions: dict
    cases: list = field(default_factory=list)
    table: dict = field(default_factory=dict)  # dtype -> "passed" | "failed: ..." | "unsupported"
    compiler: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(c.outcome == "passed" for c in self.cases) and bool(self.cases)

    def as_dict(self) -> dict:
        return {"backend": self.backend, "passed": self.passed, "versions": self.versions,
                "table": self.table, "cases": [asdict(c) for c in self.cases], "compiler": self.compiler,
                "seconds": round(self.seconds, 2)}


def _label(dtype) -> str:
    return dtype if isinstance(dtype, str) else " x ".join(dtype)


def _canonical(dtype, arch: str):
    """A dtype request as the table's row: one canonical name, or an (A, B) pair of them."""
    mdt = _dt.resolve(dtype, arch)
    return mdt.a.name if mdt.a.name == mdt.b.name else (mdt.a.name, mdt.b.name)


def _first_mismatch(got: np.ndarray, want: np.ndarray, bound=None) -> str:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return f"shape {got.shape}, reference {want.shape}"
    bad = np.isnan(got) & ~np.isnan(want)  # an unwritten (poisoned) element
    if bound is None:
        bad |= ~((got == want) | (np.isnan(got) & np.isnan(want)))
    else:
        bad |= ~(np.abs(got - want) <= bound)
    if not bad.any():
        return ""
    i, j = (int(x) for x in np.argwhere(bad)[0])
    what = "unwritten (still NaN)" if np.isnan(got[i, j]) else f"{got[i, j]!r}"
    lim = "" if bound is None else f" (bound {float(np.broadcast_to(bound, got.shape)[i, j]):.3g})"
    return f"D[{i},{j}] = {what}, reference {want[i, j]!r}{lim}; {int(bad.sum())} of {bad.size} elements differ"


def _exact(rng, shape) -> np.ndarray:
    """Small integers times powers of two: products and sums over K <= 8192 are exact in fp32."""
    return rng.integers(-4, 5, size=shape).astype(np.float64) * np.exp2(rng.integers(-1, 2, size=shape))


# ---- vendor drivers: how to run a staged GEMM with a poisoned output, which records the kernels use --------------
class _Driver:
    def __init__(self, backend):
        self.be = backend
        self.arch = backend.target().arch

    def versions(self) -> dict:
        return {}

    def probe_records(self, dtypes) -> list:
        raise NotImplementedError

    def gemm(self, a, b, mdt, major):
        """(host float64 result, variant key) with the output poisoned first."""
        raise NotImplementedError

    def extra_probes(self) -> list:
        return []

    def compare(self, keys) -> list:
        return []


class _CudaDriver(_Driver):
    device = "cuda"

    def __init__(self, backend):
        super().__init__(backend)
        import cupy

        self.cp = cupy

    def versions(self) -> dict:
        cp = self.cp
        dev = cp.cuda.Device()
        return {"cupy": cp.__version__, "cuda_driver": cp.cuda.runtime.driverGetVersion(),
                "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(), "nvrtc": ".".join(map(str, cp.cuda.nvrtc.getVersion())),
                "device": cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode(), "arch": self.arch}

    def probe_records(self, dtypes) -> list:
        from .. import layouts
        from ..backends.cuda.variants import ELEMENTS, sm_of

        sm, names = sm_of(self.arch), []
        for el in ELEMENTS.values():
            if sm >= el.min_sm and el.record not in names:
                names.append(el.record)
        return [layouts.get(n) for n in names] + [layouts.get(n) for n in layouts.names("nvidia", kind="ldmatrix")]

    def extra_probes(self) -> list:
        from ..backends.cuda.sm90 import wgmma_reason

        if wgmma_reason(self.arch) is not None:
            return []
        t0 = time.perf_counter()
        from ..backends.probes import wgmma
        from ..layouts import hopper

        try:
            got = wgmma.run_probes(self.cp)
            want = {"d": hopper.accumulator(64).coords, "a_k16": hopper.register_a(16).coords,
                    "a_k8": hopper.register_a(8).coords}
            out = []
            for key, coords in want.items():
                bad = np.argwhere(np.any(got[key] != coords, axis=-1))
                detail = "" if not len(bad) else (f"lane {bad[0][0]} slot {bad[0][1]} holds {got[key][tuple(bad[0])]}"
                                                  f", the table says {coords[tuple(bad[0])]}; {len(bad)} cells differ")
                out.append(Case("probe", f"wgmma {key}", "failed" if detail else "passed", detail,
                                seconds=time.perf_counter() - t0))
            return out
        except Exception as exc:  # noqa: BLE001 (a probe that cannot run is a failed probe)
            return [Case("probe", "wgmma", "failed", f"{type(exc).__name__}: {exc}")]

    def gemm(self, a, b, mdt, major):
        cp = self.cp
        storage = np.float16 if mdt.kind == "float" and mdt.a.name == "fp16" else np.float32
        da, db = (cp.asfortranarray(cp.asarray(x.astype(storage))) if mj == "col" else cp.asarray(x.astype(storage))
                  for x, mj in ((a, major[0]), (b, major[1])))
        out = cp.full((a.shape[0], b.shape[1]), np.nan, dtype=cp.float32)
        with self.be.plan(da, db, mdt, out=out) as p:
            p.gemm()
            got = cp.asnumpy(out).astype(np.float64)
            return got, p.variant_

    def compare(self, keys) -> list:
        from concurrent.futures import ThreadPoolExecutor

        from ..backends import nvrtc_tools
        from ..backends.cuda.compile import GEMM_FILE, source
        from ..backends.cuda.sm90 import SM90_FILE, SM90_KERNEL, Sm90Variant
        from ..backends.cuda.variants import gemm_options

        jobs = []
        for v in keys:
            sm90 = isinstance(v, Sm90Variant)
            file, kernel, opts = (SM90_FILE, SM90_KERNEL, v.options()) if sm90 else (GEMM_FILE, "mx_gemm", gemm_options(v))
            jobs.append((v, file, kernel, tuple(opts), ("sm90" if sm90 else "gemm", v), v.smem_bytes))
        why = nvrtc_tools.have_nvrtc()
        offline_arch = "sm_90a" if self.arch == "sm_90" else self.arch

        def offline(job):
            v, file, kernel, opts, _, _ = job
            try:
                opts = [o for o in opts if not o.startswith("--gpu-architecture")]
                binary = nvrtc_tools.compile_cuda(source(file), name=v.name, arch=offline_arch if file == SM90_FILE
                                                  else self.arch, options=opts)
                res = dict(binary.resources.get(kernel, next(iter(binary.resources.values()), {})))
                if nvrtc_tools.have_cuobjdump() is None:
                    counts = nvrtc_tools.sass_counts(binary.sass)
                    res["mma_lines"] = sum(n for op, n in counts.items() if op.split(".")[0] in ("HMMA", "HGMMA", "QMMA"))
                return res
            except Exception as exc:  # noqa: BLE001
                return {"error": f"{type(exc).__name__}: {exc}"}

        with ThreadPoolExecutor(max_workers=4) as pool:
            offl = list(pool.map(offline, jobs)) if why is None else [{"error": f"NVRTC wheel: {why}"}] * len(jobs)
        rows = []
        ordinal = int(self.cp.cuda.runtime.getDevice())
        for (v, file, kernel, opts, key, smem), off in zip(jobs, offl):
            k = self.be.kernels.get(self.cp, ordinal, key, file, kernel, opts, smem)
            run = {"registers": int(k.num_regs), "shared_bytes": int(k.shared_size_bytes) + smem,
                   "local_bytes": int(k.local_size_bytes)}
            if "shared_bytes" in off:
                off["shared_bytes"] = off["shared_bytes"] + smem
            rows.append(_compare_row(v.name, "nvrtc (CuPy)", run, "nvrtc (pip wheel, offline)", off))
        return rows


class _HipDriver(_Driver):
    device = "hip"

    def versions(self) -> dict:
        from ..backends.hip.runtime import hip_python_version, rocm_version_text

        rt = self.be.runtime()
        return {"hip_python": hip_python_version(), "rocm": rocm_version_text(rt.runtime_version),
                "hip_python_convention": rt.convention.label, "hiprtc": rt.compiler_id(),
                "device": rt.device().name, "arch": rt.device().arch_full}

    def probe_records(self, dtypes) -> list:
        from ..backends.hip import kernel_specs

        out, seen = [], set()
        for spec in kernel_specs(self.arch):
            if dtypes is not None and not set(spec.dtypes) & set(dtypes):
                continue
            rec = spec.layout()
            key = (rec.name, rec.a_format, rec.b_format, getattr(rec, "scale_opsel", None))
            if key not in seen:
                seen.add(key)
                out.append(rec)
        return out

    def gemm(self, a, b, mdt, major):
        ha, hb = (np.asfortranarray(x.astype(np.float32)) if mj == "col" else np.ascontiguousarray(x.astype(np.float32))
                  for x, mj in ((a, major[0]), (b, major[1])))
        with self.be.plan(ha, hb, mdt) as p:
            p.poison()
            p.gemm()
            return np.asarray(p.result(), np.float64), p.spec

    def compare(self, keys) -> list:
        from ..backends import hip_tools
        from ..backends.hip.cache import offline_compile
        from ..backends.hip.variants import compile_inputs

        rt, rows = self.be.runtime(), []
        clang = hip_tools.have_clang()
        for spec in keys:
            source, options = compile_inputs(spec)
            blob = rt.code_object(source, spec.entry, self.arch, options)  # what the run loaded (cached)
            run = _hip_figures(hip_tools, hip_tools.HipBinary(blob, name=spec.entry, arch=self.arch, options=options),
                               spec.entry, clang is None)
            try:
                off = _hip_figures(hip_tools, offline_compile(spec), spec.entry, True) if clang is None else \
                    {"error": f"clang-22 not available: {clang}"}
            except Exception as exc:  # noqa: BLE001
                off = {"error": f"{type(exc).__name__}: {exc}"}
            rows.append(_compare_row(spec.entry, rt.compiler_id(), run, "clang-22 (offline)", off))
        return rows


def _hip_figures(hip_tools, binary, entry: str, disasm: bool) -> dict:
    res = binary.resources.get(entry, {})
    out = {"registers": res.get("vgpr", 0), "agpr": res.get("agpr", 0), "shared_bytes": res.get("lds_bytes", 0),
           "local_bytes": res.get("scratch_bytes", 0), "spill_stores": res.get("vgpr_spill", 0)}
    if disasm:
        out["mma_lines"] = len(hip_tools.mfma_instructions(binary.disasm))
    return out


def _compare_row(variant: str, run_compiler: str, run: dict, offline_compiler: str, offline: dict) -> dict:
    if "error" in offline:
        return {"variant": variant, "runtime_compiler": run_compiler, "runtime": run, "offline_compiler":
                offline_compiler, "offline": offline, "outcome": "unavailable", "differs": offline["error"]}
    diffs = [f"{k}: run-time {run[k]}, offline {offline[k]}" for k in sorted(run) if k in offline and run[k] != offline[k]]
    return {"variant": variant, "runtime_compiler": run_compiler, "runtime": run, "offline_compiler": offline_compiler,
            "offline": {k: offline[k] for k in offline if k in run or k == "mma_lines"},
            "outcome": "differs" if diffs else "same", "differs": "; ".join(diffs)}


# ---- the checks ---------------------------------------------------------------------------------------------------
def _probe_case(rec, device: str, rng) -> Case:
    from ..backends import probes

    t0 = time.perf_counter()
    name = getattr(rec, "name", str(rec))
    fmts = "" if "f8f6f4" not in name else f" ({rec.a_format} x {rec.b_format})"
    try:
        if "ldmatrix" in name:
            got, want = probes.run_cuda_ldmatrix(rec), probes.ldmatrix_expected(rec)
            bad = np.argwhere(got != want)
            detail = "" if not len(bad) else (f"lane {bad[0][0]} slot {bad[0][1]}: got element {got[tuple(bad[0])]}, "
                                              f"the table says {want[tuple(bad[0])]}; {len(bad)} cells differ")
            return Case("probe", name, "failed" if detail else "passed", detail, seconds=time.perf_counter() - t0)
        scaled = getattr(rec, "scale_a", None) is not None
        unit = {}
        if scaled:
            nb = rec.k // rec.scale_block
            unit = {"scale_a": np.full((rec.m, nb), 127), "scale_b": np.full((nb, rec.n), 127)}
        for role in ("a", "b"):  # 1. arange: where did each element go?
            where = probes.arange_probe(rec, role, lambda a, b, c: probes.run_matrices(rec, a, b, c, device=device,
                                                                                        **unit))
            diffs = probes.where_elements(rec, role, where)
            if diffs:
                return Case("probe", name + fmts, "failed", f"arange: {diffs[0]} ({len(diffs)} elements disagree)",
                            seconds=time.perf_counter() - t0)
        grid = probes.exact_grid(rec)  # 2. exact inputs (scaled: a different scale per 32-K block, decoy bytes)
        a = probes.exact_values(rec.a_format, (rec.m, rec.k), rng, **grid)
        b = probes.exact_values(rec.b_format, (rec.k, rec.n), rng, **grid)
        c = probes.exact_values(rec.c_format, (rec.m, rec.n), rng, grid=grid["grid"] ** 2, vmax=grid["vmax"] ** 2)
        kw = {}
        if scaled:
            nb = rec.k // rec.scale_block
            kw = {"scale_a": rng.integers(126, 129, size=(rec.m, nb)), "scale_b": rng.integers(126, 129, size=(nb, rec.n))}
        hw = probes.run_matrices(rec, a, b, c, device=device, **kw)
        detail = _first_mismatch(hw, probes.reference_d(rec, a, b, c, **kw))
        what = "exact inputs" + (" with per-block scales" if scaled else "")
        return Case("probe", name + fmts, "failed" if detail else "passed", f"{what}: {detail}" if detail else "",
                    seconds=time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001 (a probe that cannot run is a failed probe, with the reason)
        return Case("probe", name + fmts, "failed", f"{type(exc).__name__}: {exc}", seconds=time.perf_counter() - t0)


def _gemm_cases(driver, dtype, shapes, rng, used: dict) -> list:
    from ..operands import prepare
    from ..reference import reference_matmul

    label, arch = _label(dtype), driver.arch
    mdt = _dt.resolve(dtype, arch)
    out = []
    for shape in shapes:
        m, n, k = shape
        for major in MAJORS:
            name = f"{label} {m}x{n}x{k} {major[0]}-{major[1]} exact"
            t0 = time.perf_counter()
            a, b = _exact(rng, (m, k)), _exact(rng, (k, n))
            try:
                got, key = driver.gemm(a, b, mdt, major)
                used[key] = None  # an ordered set of the variants that ran (frozen dataclasses)
                detail = _first_mismatch(got, reference_matmul(a.astype(np.float32), b.astype(np.float32), dtype,
                                                               arch=arch))
            except Exception as exc:  # noqa: BLE001
                detail = f"{type(exc).__name__}: {exc}"
            out.append(Case("gemm", name, "failed" if detail else "passed", detail, label, time.perf_counter() - t0))
    m, n, k = RANDOM_SHAPE
    t0 = time.perf_counter()
    a32 = (rng.standard_normal((m, k)) * 3.0).astype(np.float32)
    b32 = (rng.standard_normal((k, n)) * 0.5).astype(np.float32)
    try:
        got, _ = driver.gemm(a32.astype(np.float64), b32.astype(np.float64), mdt, ("row", "row"))
        opa, opb = prepare(a32, b32, mdt)
        a64, b64 = opa.to_float64(), opb.to_float64()
        scale = np.abs(a64) @ np.abs(b64)
        bound = (k + 2) * 2.0**-23 * scale + (2.0**-20 * scale if mdt.a.name == "fp32" else 0.0)
        detail = _first_mismatch(got, a64 @ b64, bound)
    except Exception as exc:  # noqa: BLE001
        detail = f"{type(exc).__name__}: {exc}"
    out.append(Case("gemm", f"{label} {m}x{n}x{k} random (bound (K+2)*2^-23*|A||B|)",
                    "failed" if detail else "passed", detail, label, time.perf_counter() - t0))
    return out


def _dtype_rows(supported: list) -> list:
    """Every canonical dtype (the support matrix's rows) plus mixed pairs of supported formats of one kind."""
    rows: list = list(_dt.KINDS)
    pairs = [("mxfp8_e4m3", "mxfp4"), ("mxfp6_e2m3", "mxfp8_e5m2"), ("e4m3fn", "e5m2"), ("e4m3fnuz", "e5m2fnuz")]
    return rows + [p for p in pairs if p[0] in supported and p[1] in supported]


def _versions(driver) -> dict:
    from .. import __version__

    out = {"mxcore": __version__, "python": platform.python_version(), "numpy": np.__version__,
           "platform": platform.platform()}
    try:
        out.update(driver.versions())
    except Exception as exc:  # noqa: BLE001 (versions are best effort; the checks report real failures)
        out["versions_error"] = f"{type(exc).__name__}: {exc}"
    return out


def select_backend(name: str):
    """(backend, None) or (None, why not): ``auto`` takes the first usable GPU backend; ``reference`` is refused."""
    from ..backends import get, names

    if name in ("auto", None):
        reasons = []
        for key in GPU_BACKENDS:
            be = get(key)
            why = be.is_available()
            if why is None:
                return be, None
            reasons.append(f"{key}: {why}")
        return None, "no usable GPU backend (" + "; ".join(reasons) + ")"
    be = get(name)
    if be.name not in GPU_BACKENDS:
        return None, (f"selftest checks a GPU backend against the numpy reference; {be.name!r} is the reference "
                      f"itself. Use --backend {' or --backend '.join(GPU_BACKENDS)} (or auto); known: {', '.join(names())}")
    why = be.is_available()
    return (be, None) if why is None else (None, f"{be.name}: {why}")


def run(backend, *, dtypes=None, shapes=SHAPES, seed: int = 20261123, log=print) -> Report:
    """Run the three stages on ``backend`` (a usable GPU backend object) and return the :class:`Report`."""
    from ..errors import UnsupportedError

    drivers = {"cuda": _CudaDriver, "hip": _HipDriver}
    if backend.name not in drivers:
        raise UnsupportedError(f"selftest runs on the GPU backends ({', '.join(drivers)}), not {backend.name!r}")
    t_start = time.perf_counter()
    driver = drivers[backend.name](backend)
    report = Report(backend.name, _versions(driver))
    supported = backend.supported_dtypes()
    rows = _dtype_rows(supported) if dtypes is None else list(dict.fromkeys(_canonical(d, driver.arch) for d in dtypes))
    want = None if dtypes is None else [_dt.resolve(d, driver.arch).name for d in dtypes]
    rng = np.random.default_rng(seed)
    records = driver.probe_records(want)
    log(f"selftest: {backend.name} on {report.versions.get('device', '?')} ({driver.arch}): {len(records)} layout "
        "probes, then the GEMM matrix")
    for rec in records:
        report.cases.append(_probe_case(rec, driver.device, rng))
    report.cases += driver.extra_probes()
    probe_fail = [c for c in report.cases if c.outcome != "passed"]
    used: dict = {}
    for dtype in rows:
        label = _label(dtype)
        names = dtype if isinstance(dtype, tuple) else (dtype,)
        if any(n not in supported for n in names):
            report.table[label] = "unsupported"
            continue
        cases = _gemm_cases(driver, dtype, shapes, rng, used)
        report.cases += cases
        bad = [c for c in cases if c.outcome != "passed"]
        report.table[label] = "passed" if not bad else f"failed: {bad[0].name}: {bad[0].detail}"
        log(f"  {MARK['passed' if not bad else 'failed']} {label}")
    if probe_fail:
        report.table["layout probes"] = f"failed: {probe_fail[0].name}: {probe_fail[0].detail}"
    else:
        report.table["layout probes"] = "passed"
    report.compiler = driver.compare(list(used))
    report.seconds = time.perf_counter() - t_start
    return report


def render_table(report: Report) -> str:
    lines = [f"| dtype | {report.backend} on {report.versions.get('device', '?')} |", "|---|---|"]
    for label, res in report.table.items():
        state = res.split(":", 1)[0]
        text = MARK[state] + ("" if state != "failed" else " " + res.split(":", 1)[1].strip())
        lines.append(f"| `{label}` | {text} |")
    return "\n".join(lines)


def render_compiler(report: Report) -> str:
    if not report.compiler:
        return "compiler comparison: no variant ran"
    same = sum(r["outcome"] == "same" for r in report.compiler)
    lines = [f"compiler comparison ({len(report.compiler)} variants: {same} same as the offline build; "
             "reported, not gating):"]
    for r in report.compiler:
        if r["outcome"] != "same":
            lines.append(f"  {r['variant']}: {r['outcome']}: {r['differs']}")
    return "\n".join(lines)


def _parse_shapes(text: str) -> tuple:
    try:
        return tuple(tuple(int(x) for x in s.lower().split("x")) for s in text.split(",") if s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shapes {text!r}: use MxNxK[,MxNxK...], e.g. 1x1x1,17x33x65") from None


def _parse_dtypes(text: str) -> list:
    return [tuple(d.split("+")) if "+" in d else d for d in text.split(",") if d]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="mxcore selftest", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="auto", help="cuda, hip or auto (default: the first usable GPU backend)")
    p.add_argument("--out", default="selftest.json", help="JSON report to attach to a bug report (default: %(default)s)")
    p.add_argument("--dtype", type=_parse_dtypes, default=None,
                   help="only these dtypes (comma-separated; a pair as a+b); default: every supported one")
    p.add_argument("--shapes", type=_parse_shapes, default=SHAPES, help="exact-input shapes MxNxK,... (default: "
                   + ",".join("x".join(map(str, s)) for s in SHAPES) + ")")
    p.add_argument("--seed", type=int, default=20261123)
    args = p.parse_args(argv)
    backend, why = select_backend(args.backend)
    if backend is None:
        print(f"mxcore selftest: not run: {why}", file=sys.stderr)
        with open(args.out, "w") as f:
            json.dump({"backend": args.backend, "passed": False, "not_run": why}, f, indent=1)
        return 2
    report = run(backend, dtypes=args.dtype, shapes=args.shapes, seed=args.seed)
    print(render_table(report))
    print(render_compiler(report))
    failed = [c for c in report.cases if c.outcome != "passed"]
    with open(args.out, "w") as f:
        json.dump(report.as_dict(), f, indent=1, default=str)
    print(f"{len(report.cases) - len(failed)} of {len(report.cases)} checks passed in {report.seconds:.1f} s; "
          f"report written to {args.out}")
    return 0 if report.passed else 1


_cli = main
