"""Prebuilt kernels: cubins made without a GPU by NVRTC (the pip wheel, as CI compiles them), loaded instead of
compiling at run time.

Where a compiled kernel comes from, in order, for a device of arch X (``KernelCache.get`` and the codec modules ask
:func:`load_kernel` / :func:`load_module` before they compile):

1. the package data ``mxcore/prebuilt/`` (:func:`package`): ``manifest.json`` and one xz-compressed cubin per
   module, for the builds the default choice uses on sm_90 and sm_80 (``default_builds.py``);
2. the user's disk cache (``$MXCORE_CACHE_DIR/cubin``), which ``python -m mxcore kernels --prebuild`` fills for any
   arch (:func:`prebuild`);
3. otherwise CuPy compiles the source with NVRTC as before (and caches it in its own disk cache).

Both stores are keyed by :func:`build_key`: the source text after header inlining, the options as the backend
passes them, the arch the cubin is for and :data:`RECIPE` (how options become an NVRTC command line), so an edited
kernel, a changed option or another arch never finds a stale binary.  A build with ``--gpu-architecture=sm_90a``
among its options is looked up for that arch; others for the device's arch, and on sm_86 / sm_87 / sm_89 also for
sm_80 (an sm_80 cubin runs there).  Every blob is checked against its SHA-256 before it is loaded; a blob that does
not decompress, does not match or that the driver refuses costs a compile, never a wrong kernel.
``MXCORE_PREBUILT=0`` turns both stores off (every kernel is compiled as before).

A loaded kernel (:class:`LoadedKernel`) is used exactly as the ``cupy.RawKernel`` it replaces: called with (grid,
block, args, shared_mem=), its ``kernel.ptr`` taken for raw launches, ``attributes`` read and
``max_dynamic_shared_size_bytes`` set.  :data:`EVENTS` records where each kernel of this process came from (the
first-call benchmark reports it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import lzma
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from mxcore.errors import KernelCompileError
from mxcore.kernels import DiskCache, cache_key

__all__ = ["ENV", "EVENTS", "PACKAGE_COMMAND", "RECIPE", "LoadedKernel", "LoadedModule", "build_key", "cubin_sm",
           "device_arch", "enabled", "load_kernel", "load_module", "lookup_archs", "nvrtc_options", "package",
           "package_dir", "prebuild", "write_package"]

#: bump when what a build's cubin is compiled from changes beyond its source, options and arch (nvrtc_options)
RECIPE = 1
ENV = "MXCORE_PREBUILT"
PACKAGE_COMMAND = "python -m mxcore kernels --prebuild --package"
_FORMAT = 1  # manifest.json's layout
_USER = DiskCache("cubin", ".cubin")
#: (where, source file, entry, arch) of every kernel this process took: "package", "cache" or "compiled"
EVENTS: list = []
_LOCK = threading.Lock()


def enabled() -> bool:
    """False when ``MXCORE_PREBUILT`` is 0 / false / off / no (read on every lookup)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def build_key(source_text: str, options, arch: str) -> str:
    """The key of a build: source text (headers inlined), options as the backend passes them, the cubin's arch."""
    return cache_key("cubin", RECIPE, source_text, list(options), arch)


def forced_arch(options) -> str | None:
    """The arch named by an ``--gpu-architecture=`` option (the last one), else None."""
    forced = [o.split("=", 1)[1] for o in options if o.startswith("--gpu-architecture=")]
    return forced[-1] if forced else None


def nvrtc_options(options) -> list[str]:
    """The NVRTC options of a build besides the arch (which ``compile_cuda`` adds): the backend's options as CuPy
    compiles them, with its flush-to-zero flag."""
    from ..nvrtc_tools import FTZ_FLAG

    return [o for o in options if not o.startswith("--gpu-architecture=")] + [FTZ_FLAG]


def lookup_archs(options, device_arch: str) -> list[str]:
    """The archs whose cubins a device of ``device_arch`` can run for a build with ``options``, best first."""
    forced = forced_arch(options)
    if forced:
        return [forced]
    out = [device_arch]
    try:
        sm = int(device_arch.split("_")[1].rstrip("af"))
    except (IndexError, ValueError):
        return out
    if 80 < sm < 90:  # same major version: an sm_80 cubin runs on sm_86 / sm_87 / sm_89
        out.append("sm_80")
    return out


# ------------------------------------------------------------------------------------------------------------
# the package data
# ------------------------------------------------------------------------------------------------------------
def package_dir() -> Path:
    """``mxcore/prebuilt/`` of this installation or checkout."""
    import mxcore

    return Path(mxcore.__file__).resolve().parent / "prebuilt"


@dataclass
class Package:
    """The package data: ``manifest`` (``modules``: key -> file, arch, entries, blob, size, sha256, source and
    options digests) read from ``folder``."""

    folder: Path
    manifest: dict

    @property
    def modules(self) -> dict:
        return self.manifest.get("modules", {})

    def blob(self, key: str) -> bytes | None:
        """The cubin of ``key``, decompressed and checked against its SHA-256; None when absent or damaged."""
        entry = self.modules.get(key)
        if entry is None:
            return None
        try:
            raw = lzma.decompress((self.folder / entry["blob"]).read_bytes())
        except (OSError, lzma.LZMAError, KeyError, TypeError):
            return None
        return raw if hashlib.sha256(raw).hexdigest() == entry.get("sha256") else None


@functools.lru_cache(maxsize=1)
def _package_at(folder: str) -> Package:
    path = Path(folder) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        manifest = {}
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT:
        manifest = {}
    return Package(Path(folder), manifest)


def package() -> Package:
    """The package data of this installation (read once; empty when the folder or its manifest is missing)."""
    return _package_at(str(package_dir()))


def device_arch(cp, ordinal: int) -> str | None:
    """``sm_XY`` of device ``ordinal``, or None when it cannot be asked (then nothing prebuilt is looked up)."""
    try:
        from .device import device_info

        return device_info(cp, ordinal).arch
    except Exception:  # noqa: BLE001 (a CuPy without device properties: the kernel is compiled, as before)
        return None


def find(source_text: str, options, device_arch: str | None) -> tuple[bytes, str] | None:
    """(cubin, "package" | "cache") of a build for a device of ``device_arch``, or None (compile it)."""
    if not enabled() or not device_arch:
        return None
    pkg = package()
    for arch in lookup_archs(options, device_arch):
        key = build_key(source_text, options, arch)
        blob = pkg.blob(key)
        if blob is not None:
            return blob, "package"
        blob = _USER.get(key)
        if blob is not None and blob[:4] == b"\x7fELF":
            return blob, "cache"
    return None


# ------------------------------------------------------------------------------------------------------------
# loading
# ------------------------------------------------------------------------------------------------------------
_ATTRS = {"max_threads_per_block": 0, "shared_size_bytes": 1, "const_size_bytes": 2, "local_size_bytes": 3,
          "num_regs": 4, "ptx_version": 5, "binary_version": 6, "cache_mode_ca": 7,
          "max_dynamic_shared_size_bytes": 8, "preferred_shared_memory_carveout": 9}  # CUfunction_attribute (cuda.h)


class LoadedModule:
    """A prebuilt cubin loaded by the driver, once per device (lazily): ``get_function(name)`` gives a
    :class:`LoadedKernel`, as ``cupy.RawModule.get_function`` gives a RawKernel."""

    def __init__(self, cp, cubin: bytes, origin: str = "package"):
        self._cp, self.cubin, self.origin = cp, bytes(cubin), origin
        self._mods: dict = {}
        self.module  # loaded on the current device now: a refused image raises here, where the caller falls back

    @property
    def module(self):
        """The ``cupy.cuda.function.Module`` on the current device."""
        dev = self._cp.cuda.runtime.getDevice()
        mod = self._mods.get(dev)
        if mod is None:
            with _LOCK:
                mod = self._mods.get(dev)
                if mod is None:
                    mod = self._cp.cuda.function.Module()
                    mod.load(self.cubin)
                    self._mods[dev] = mod
        return mod

    def get_function(self, name: str) -> "LoadedKernel":
        return LoadedKernel(self, name)


class LoadedKernel:
    """One kernel of a :class:`LoadedModule`, used as a ``cupy.RawKernel``: call it, read ``kernel.ptr`` (the
    CUfunction of the current device), ``attributes`` and the attribute properties, set
    ``max_dynamic_shared_size_bytes`` / ``preferred_shared_memory_carveout``."""

    def __init__(self, module: LoadedModule, name: str):
        self._module, self.name = module, name
        self._fns: dict = {}
        self.kernel  # the entry must exist: a missing one raises here

    @property
    def origin(self) -> str:
        return self._module.origin

    @property
    def kernel(self):
        """The ``cupy.cuda.function.Function`` on the current device."""
        dev = self._module._cp.cuda.runtime.getDevice()
        fn = self._fns.get(dev)
        if fn is None:
            fn = self._fns[dev] = self._module.module.get_function(self.name)
        return fn

    def __call__(self, grid, block, args, **kwargs):
        self.kernel(tuple(grid), tuple(block), args, **kwargs)

    def _get(self, attr: str) -> int:
        return int(self._module._cp.cuda.driver.funcGetAttribute(_ATTRS[attr], self.kernel.ptr))

    def _set(self, attr: str, value: int) -> None:
        self._module._cp.cuda.driver.funcSetAttribute(self.kernel.ptr, _ATTRS[attr], int(value))

    @property
    def attributes(self) -> dict:
        return {name: self._get(name) for name in _ATTRS}

    max_threads_per_block = property(lambda self: self._get("max_threads_per_block"))
    shared_size_bytes = property(lambda self: self._get("shared_size_bytes"))
    const_size_bytes = property(lambda self: self._get("const_size_bytes"))
    local_size_bytes = property(lambda self: self._get("local_size_bytes"))
    num_regs = property(lambda self: self._get("num_regs"))
    ptx_version = property(lambda self: self._get("ptx_version"))
    binary_version = property(lambda self: self._get("binary_version"))
    cache_mode_ca = property(lambda self: self._get("cache_mode_ca"))
    max_dynamic_shared_size_bytes = property(lambda self: self._get("max_dynamic_shared_size_bytes"),
                                             lambda self, v: self._set("max_dynamic_shared_size_bytes", v))
    preferred_shared_memory_carveout = property(lambda self: self._get("preferred_shared_memory_carveout"),
                                                lambda self, v: self._set("preferred_shared_memory_carveout", v))


_LOADED: dict = {}  # (source text, options, device arch) -> LoadedModule: a module's entries share one load


def _load(cp, source_text: str, options, device_arch: str | None) -> LoadedModule | None:
    key = (source_text, tuple(options), device_arch)
    mod = _LOADED.get(key)
    if mod is not None and enabled():
        return mod
    found = find(source_text, options, device_arch)
    if found is None:
        return None
    try:
        mod = LoadedModule(cp, *found)
    except Exception:  # noqa: BLE001 (CUDADriverError and the like: an image this driver refuses is compiled)
        return None
    _LOADED[key] = mod
    return mod


def load_kernel(cp, source_text: str, name: str, options, device_arch: str | None, file: str = ""):
    """Kernel ``name`` of a prebuilt build (a :class:`LoadedKernel` on the current device), or None: compile it."""
    mod = _load(cp, source_text, options, device_arch)
    if mod is not None:
        try:
            k = mod.get_function(name)
        except Exception:  # noqa: BLE001 (an entry the cubin lacks: compile)
            k = None
        if k is not None:
            note(mod.origin, file, name, forced_arch(options) or device_arch)
            return k
    return None


def load_module(cp, source_text: str, options, device_arch: str | None, file: str = ""):
    """A prebuilt module (a :class:`LoadedModule`, ``get_function`` as a RawModule's), or None: compile it."""
    mod = _load(cp, source_text, options, device_arch)
    if mod is not None:
        note(mod.origin, file, "*", forced_arch(options) or device_arch)
    return mod


def note(where: str, file: str, name: str, arch: str | None) -> None:
    """Record where a kernel of this process came from (:data:`EVENTS`)."""
    EVENTS.append((where, file, name, arch or "?"))


# ------------------------------------------------------------------------------------------------------------
# compiling builds offline: the package data and the user's cache
# ------------------------------------------------------------------------------------------------------------
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
        from mxcore.dtypes import check_arch

        arch = check_arch(args.arch, "nvidia")
        where = "no GPU asked"
    s = prebuild(arch, sms=sms, jobs=jobs, progress=progress)
    print(f"prebuild {s['arch']} ({where}): {s['builds']} kernel builds, {s['compiled']} compiled "
          f"({s['bytes'] / 2**20:.1f} MiB) in {time.perf_counter() - t0:.0f} s with {jobs} processes, "
          f"{s['present']} already in the package data or the cache; cache: {s['folder']}")
    return 0
