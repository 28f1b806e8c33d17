"""Offline compilation (no GPU): every kernel the backend can launch on an arch, compiled by NVRTC from the pip
wheels (``backends/nvrtc_tools.py``), written as cubin + PTX, described by one :class:`KernelRecord` each."""

from __future__ import annotations

from pathlib import Path

from .._contract import KernelRecord
from .compile import CEILING_FILE, GEMM_FILE, PREP_FILE, PREP_KERNELS, source
from .variants import ELEMENTS, Variant, all_variants, gemm_options, sm_of

__all__ = ["compile_all", "compile_jobs", "emit_kernels", "plain_options", "register_jobs"]

#: family name -> its offline compile jobs on an arch (a family registers them when it is imported: this module
#: imports no family)
_FAMILY_JOBS: dict = {}


def register_jobs(family: str, jobs) -> None:
    """Family ``family``'s builds for ``kernels --emit`` and the offline checks: ``jobs(arch) -> list[dict]`` (the
    keys :func:`compile_jobs` documents; an empty list where the family does not run)."""
    _FAMILY_JOBS[family] = jobs

_DTYPE_OF_ELEM = {"f16": "fp16", "bf16": "bf16 (and MX decoded)", "tf32": "tf32, fp32 (3xTF32)"}


def _dtype_label(v: Variant) -> str:
    if v.element.cvt:
        return "fp8, every e4m3 / e5m2 pair (fragments converted to f16; the pair a kernel argument)"
    return _DTYPE_OF_ELEM.get(v.elem, f"fp8 {v.elem.replace('.', ' x ')}")


def compile_jobs(arch: str) -> list[dict]:
    """Every kernel a call can launch on ``arch``, one job per build (a build's entry points in ``entries``): the
    variants the families' rules return and those a documented option selects (``tile=``, ``family=``, ``config=``,
    ``fp8_accumulate=``), and the benchmark's ceiling loops; the offline checks compile them all.
    ``default_builds.emit_jobs`` keeps those the default choice uses (``kernels --emit``, the prebuilt package).
    (The loop diagnostics of ``bench --loop-ceilings``, gemm_diag.cu, are compiled when used.)"""
    from mxcore import layouts

    from ..nvrtc_tools import FTZ_FLAG

    jobs = []
    for v in all_variants(arch):
        jobs.append({"file": GEMM_FILE, "kernel": "mx_gemm", "stem": v.name, "dtype": _dtype_label(v), "tile": v.tile,
                     "options": list(gemm_options(v)), "smem": v.smem_bytes, "threads": v.threads, "variant": v,
                     "ldmatrix": True, "cp_async": True,
                     "mma": "QMMA" if v.element.esize == 1 and not v.element.cvt else "HMMA"})
    for kname in PREP_KERNELS:
        jobs.append({"file": PREP_FILE, "kernel": kname, "stem": kname, "dtype": "prep", "options": ["-std=c++17"],
                     "smem": 0, "threads": 256})
    sm = sm_of(arch)
    for e, el in ELEMENTS.items():
        if sm < el.min_sm or (el.esize == 1 and e != "e4m3.e4m3"):
            continue
        rec = layouts.get(el.record)
        jobs.append({"file": CEILING_FILE, "kernel": "mx_mma_ceiling", "stem": f"ceiling_{e.replace('.', '_')}",
                     "dtype": e, "options": ["-std=c++17", f'-DMX_MMA_OP="{rec.ptx}"', "-DMX_CHAINS=8"],
                     "smem": 0, "threads": 256})
    for family_jobs in _FAMILY_JOBS.values():  # the families' own builds (registered by sm90.py, wonly/)
        jobs += family_jobs(arch)
    jobs = _one_per_build(jobs)
    for job in jobs:  # every kernel compiled as CuPy compiles it (with -ftz=true): the SASS checks see the same
        job["options"] = [*job["options"], FTZ_FLAG]
    return jobs


def plain_options(options) -> tuple:
    """A build's options without the arch flag (a job names its arch apart) and the flush-to-zero flag every offline
    job carries: what identifies a build of a source."""
    return tuple(o for o in options if not o.startswith(("--gpu-architecture", "-ftz")))


def _one_per_build(jobs: list[dict]) -> list[dict]:
    """Jobs of the same source and options (several entry points of one module, element formats that share a
    build) merged into the first one, which lists every entry point in ``entries``."""
    out: dict = {}
    for j in jobs:
        key = (j["file"], plain_options(j["options"]), j.get("arch"))
        if key in out:
            first = out[key]
            if j["kernel"] not in first["entries"]:
                first["entries"].append(j["kernel"])
        else:
            out[key] = {**j, "entries": [j["kernel"]]}
    return list(out.values())


def compile_all(jobs: list[dict], *, arch: str, workers: int | None = None):
    """Compile ``jobs`` (from :func:`compile_jobs`) for ``arch`` in a thread pool; yields (job, CudaBinary) in
    order."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from ..nvrtc_tools import compile_cuda

    def one(job):
        return compile_cuda(source(job["file"]), name=job["stem"], arch=job.get("arch", arch), options=job["options"])

    workers = workers or max(1, min(4, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        yield from zip(jobs, pool.map(one, jobs))


def emit_kernels(arch: str, out_dir, jobs: list[dict], *, workers: int | None = None) -> list[KernelRecord]:
    """Compile ``jobs`` (:func:`compile_jobs`' or a subset) for ``arch``; write ``<stem>.cubin`` and ``<stem>.ptx``
    under ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for job, binary in compile_all(jobs, arch=arch, workers=workers):
        cubin_path, _ = binary.write(out_dir, job["stem"])
        res = binary.resources.get(job["kernel"], next(iter(binary.resources.values()), {}))
        rows.append(KernelRecord(
            kernel=job["kernel"], variant=job["stem"], dtype=job["dtype"], arch=job.get("arch", arch),
            file=cubin_path.name,
            tile=job.get("tile", ""), registers=res.get("registers", 0),
            shared_bytes=job.get("smem", 0) + res.get("shared_bytes", 0), local_bytes=res.get("local_bytes", 0),
            spill_stores=res.get("spill_stores", 0), spill_loads=res.get("spill_loads", 0),
            threads=job.get("threads", 0), options=tuple(job["options"]),
            extra={"ptx": cubin_path.with_suffix(".ptx").name}))
    return rows
