"""Prebuilt kernels: cubins made without a GPU by NVRTC (the pip wheel, as CI compiles them), loaded instead of
compiling at run time.

Where a compiled kernel comes from, in order, for a device of arch X (``KernelCache.get`` and the codec modules ask
:func:`load_kernel` / :func:`load_module` before they compile):

1. the package data ``mxcore/prebuilt/`` (:func:`package`): ``manifest.json`` and one xz-compressed cubin per
   module, for the builds the default choice uses on sm_90 and sm_80 (``default_builds.py``);
2. the user's disk cache (``$MXCORE_CACHE_DIR/cubin``), which ``python -m mxcore kernels --prebuild`` fills for any
   arch (``prebuild.py``: making the cubins, the package data and the command line; this module only loads them);
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
import threading
from dataclasses import dataclass
from pathlib import Path

from mxcore.kernels import DiskCache, cache_key

__all__ = ["ENV", "EVENTS", "PACKAGE_COMMAND", "RECIPE", "LoadedKernel", "LoadedModule", "build_key",
           "device_arch", "enabled", "load_kernel", "load_module", "lookup_archs", "nvrtc_options", "package",
           "package_dir"]

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
