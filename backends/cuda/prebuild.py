"""Making prebuilt kernels (the loader is ``prebuilt.py``): compile the default builds (``default_builds.py``) with
NVRTC in parallel processes into the user's disk cache (``python -m mxcore kernels --prebuild``) or into the package
data ``mxcore/prebuilt/`` (``--package``, run by developers after a kernel, option or rule change)."""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import struct
from pathlib import Path

from mxcore.errors import KernelCompileError

from .prebuilt import (_FORMAT, _USER, PACKAGE_COMMAND, RECIPE, _package_at, build_key, lookup_archs, nvrtc_options,
                       package, package_dir)

__all__ = ["cli", "compile_builds", "cubin_sm", "prebuild", "write_package"]


def _compile_one(job: tuple) -> tuple[str, bytes]:
    """(key, cubin) of one build (file, options, arch, cache): run in a worker process."""
    from ..nvrtc_tools import compile_cuda
    from .compile import source

    file, options, arch, cache = job
    text = source(file)
    binary = compile_cuda(text, name=Path(file).stem, arch=arch, options=nvrtc_options(options), cache=cache)
    return build_key(text, options, arch), binary.cubin


def compile_builds(builds, jobs: int = 0, cache: bool = True):
    """Compile ``builds`` (``default_builds.Build``) with NVRTC in ``jobs`` processes (0: one per CPU), yielding
    (build, key, cubin) in order.  ``cache``: through NVRTC's compile cache (``nvrtc_tools.compile_cuda``)."""
    from concurrent.futures import ProcessPoolExecutor

    from ..nvrtc_tools import have_nvrtc

    reason = have_nvrtc()
    if reason is not None:
        raise KernelCompileError(f"compiling kernels without a GPU needs NVRTC: {reason}")
    builds = list(builds)
    work = [(b.file, tuple(b.options), b.arch, cache) for b in builds]
    jobs = max(1, min(jobs or (os.cpu_count() or 1), len(work) or 1))
    if jobs == 1:
        for b, (key, cubin) in zip(builds, map(_compile_one, work)):
            yield b, key, cubin
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        try:
            for b, (key, cubin) in zip(builds, pool.map(_compile_one, work)):
                yield b, key, cubin
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise


def prebuild(arch: str, *, sms: int | None = None, jobs: int = 0, progress=None) -> dict:
    """Compile every build the default choice uses on a device of ``arch`` (``sm_80`` and newer; ``sms``: its SM
    count when known, else those of the common GPUs of that arch) into the user's disk cache, skipping builds the
    package data or the cache already holds.  ``progress(done, total)`` after each.  Returns counts: builds,
    compiled, present, bytes written, and the cache folder."""
    from .compile import source
    from .default_builds import default_builds, target_for

    t = target_for(arch, sms)
    pkg = package()
    todo, present = [], 0
    for b in default_builds(t):
        keys = [build_key(source(b.file), b.options, a) for a in lookup_archs(b.options, t.arch)]
        if any(k in pkg.modules or _USER.get(k) is not None for k in keys):
            present += 1
        else:
            todo.append(b)
    written = done = 0
    for _, key, cubin in compile_builds(todo, jobs=jobs, cache=False):
        _USER.put(key, cubin)
        written += len(cubin)
        done += 1
        if progress is not None:
            progress(done, len(todo))
    return {"arch": t.arch, "builds": present + len(todo), "compiled": done, "present": present, "bytes": written,
            "folder": str(_USER.folder)}


def cubin_sm(cubin: bytes) -> int:
    """The SM number an ELF cubin's header names (e_flags; "sm_90a" code says 90: ``cuobjdump -lelf`` tells the
    arch-specific suffix)."""
    if cubin[:4] != b"\x7fELF" or len(cubin) < 0x34:
        raise KernelCompileError("not an ELF cubin")
    flags, abi = struct.unpack_from("<I", cubin, 0x30)[0], cubin[8]
    return (flags >> 8) & 0xFF if abi >= 8 else flags & 0xFF  # the layout changed with ELF ABI version 8


def write_package(folder=None, *, targets=None, jobs: int = 0, progress=None) -> dict:
    """Compile every build of :func:`default_builds.default_builds` for ``targets`` (default: all) and write the
    package data into ``folder`` (default: ``mxcore/prebuilt/`` of this checkout): ``manifest.json`` and
    ``<arch>/<key>.cubin.xz``; files of builds no longer enumerated are removed.  Returns a summary."""
    from ..nvrtc_tools import nvrtc_identity
    from .compile import source
    from .default_builds import TARGETS, default_builds

    folder = Path(folder) if folder is not None else package_dir()
    targets = list(targets or TARGETS)
    builds = list({b.module: b for t in targets for b in default_builds(t)}.values())
    before = modules_before(folder)
    modules, keep = {}, set()
    for i, (b, key, cubin) in enumerate(compile_builds(builds, jobs=jobs)):
        if progress is not None:
            progress(i + 1, len(builds))
        rel = f"{b.arch}/{key}.cubin.xz"
        path = folder / rel
        keep.add(path)
        old = before.get(key)
        if old is None or old.get("sha256") != hashlib.sha256(cubin).hexdigest() or not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(lzma.compress(cubin, preset=9 | lzma.PRESET_EXTREME))
        modules[key] = {"file": b.file, "arch": b.arch, "entries": list(b.entries), "blob": rel,
                        "size": len(cubin), "sha256": hashlib.sha256(cubin).hexdigest(),
                        "source": hashlib.sha256(source(b.file).encode()).hexdigest()[:16],
                        "options": hashlib.sha256(json.dumps(list(b.options)).encode()).hexdigest()[:16]}
    for old in folder.glob("*/*.cubin.xz"):
        if old not in keep:
            old.unlink()
    manifest = {"format": _FORMAT, "recipe": RECIPE, "made_by": PACKAGE_COMMAND, "compiler": nvrtc_identity(),
                "targets": {t: {"arch": TARGETS[t].arch, "sms": list(TARGETS[t].sms), "gpus": TARGETS[t].label}
                            for t in targets},
                "modules": dict(sorted(modules.items()))}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    _package_at.cache_clear()
    blobs = sum(p.stat().st_size for p in keep)
    return {"modules": len(modules), "cubin_bytes": sum(m["size"] for m in modules.values()), "blob_bytes": blobs,
            "folder": str(folder)}


def modules_before(folder: Path) -> dict:
    """The modules of the manifest already in ``folder`` (empty when none)."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    return manifest.get("modules", {}) if isinstance(manifest, dict) else {}


# ------------------------------------------------------------------------------------------------------------
# python -m mxcore kernels --prebuild [--arch A] [--jobs N] [--package]
# ------------------------------------------------------------------------------------------------------------
def native_device() -> tuple[str, int, str]:
    """(arch, SM count, name) of the current CUDA device; BackendUnavailableError without one."""
    from mxcore.errors import BackendUnavailableError

    from .backend import CudaBackend

    be = CudaBackend()
    reason = be.is_available()
    if reason:
        raise BackendUnavailableError(f"--arch native asks the GPU, and {reason}; pass --arch sm_90a or --arch sm_80 "
                                      "to compile without a GPU")
    cp = be.cp_module
    from .device import device_info

    info = device_info(cp, int(cp.cuda.runtime.getDevice()))
    return info.arch, info.sms, info.name


def _progress_line(stream):
    """A progress callback rewriting one line on a terminal (nothing otherwise)."""
    if not getattr(stream, "isatty", lambda: False)():
        return None

    def progress(done: int, total: int) -> None:
        print(f"\r  compiled {done}/{total}", end="" if done < total else "\r", file=stream, flush=True)

    return progress


def cli(argv) -> int:
    """``kernels --prebuild``: compile the default choice's kernels into the disk cache (or, with ``--package``,
    into the package data) and print one line."""
    import argparse
    import sys
    import time

    from mxcore.errors import UnsupportedError

    p = argparse.ArgumentParser(prog="mxcore kernels --prebuild",
                                description="compile the kernels the default choice uses, without waiting for a "
                                            "first call: into the disk cache for a GPU (--arch), or into the package "
                                            "data mxcore/prebuilt/ (--package)")
    p.add_argument("--prebuild", action="store_true", required=True)
    p.add_argument("--vendor", default="nvidia", choices=["nvidia"])
    p.add_argument("--arch", default="native", help="native (this machine's GPU, default), or sm_80, sm_86, sm_89, "
                                                    "sm_90 / sm_90a, sm_120 ...")
    p.add_argument("--jobs", type=int, default=0, help="compile processes (default: one per CPU)")
    p.add_argument("--package", action="store_true",
                   help=f"write the package data (every packaged target) into {package_dir()} instead")
    args = p.parse_args(argv)
    if args.jobs < 0:
        raise UnsupportedError(f"--jobs {args.jobs}: pass a positive number of processes (0: one per CPU)")
    t0 = time.perf_counter()
    progress = _progress_line(sys.stderr)
    jobs = args.jobs or (os.cpu_count() or 1)
    if args.package:
        if args.arch != "native":
            raise UnsupportedError("--package writes every packaged target (sm_90, sm_80); leave out --arch")
        s = write_package(jobs=jobs, progress=progress)
        print(f"prebuilt package: {s['modules']} modules, {s['cubin_bytes'] / 2**20:.1f} MiB of cubins, "
              f"{s['blob_bytes'] / 2**20:.2f} MiB compressed, in {s['folder']} ({time.perf_counter() - t0:.0f} s, "
              f"{jobs} processes)")
        return 0
    sms = None
    if args.arch == "native":
        arch, sms, name = native_device()
        where = f"{name}, {sms} SMs"
    else:
        from mxcore.layouts import check_arch

        arch = check_arch(args.arch, "nvidia")
        where = "no GPU asked"
    s = prebuild(arch, sms=sms, jobs=jobs, progress=progress)
    print(f"prebuild {s['arch']} ({where}): {s['builds']} kernel builds, {s['compiled']} compiled "
          f"({s['bytes'] / 2**20:.1f} MiB) in {time.perf_counter() - t0:.0f} s with {jobs} processes, "
          f"{s['present']} already in the package data or the cache; cache: {s['folder']}")
    return 0
