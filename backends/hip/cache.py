"""The verified disk cache of HIP code objects, and the offline (clang-22) compile through it.

Key: hash of (source, arch, the full option list the compiler receives in order, the compiler's identity
including the ROCm / clang version, mxcore's version).  Entries are written atomically (temp file in the same
folder + ``os.replace``) with a SHA-256 header that is verified on read; a corrupt or truncated entry is
deleted and rebuilt, never trusted.  A read-only or full cache folder costs a recompile, nothing else.
"""

from __future__ import annotations

import hashlib
import json

from ...kernels import DiskCache

__all__ = ["COMMON_OPTIONS", "cache_dir", "cache_key", "cache_read", "cache_write", "clang_options",
           "hiprtc_options", "offline_compile"]

COMMON_OPTIONS = ("-O3", "-std=c++17")  # what hiprtc gets besides the arch; clang-22 gets the same


_STORE = DiskCache("hip", ".co")  # the one verified store (mxcore.kernels), folder <cache root>/hip


def cache_dir() -> str:
    """Where compiled code objects are kept: $MXCORE_CACHE_DIR/hip, else $XDG_CACHE_HOME (~/.cache)/mxcore/hip."""
    return str(_STORE.folder)


def hiprtc_options(arch: str, options) -> list[str]:
    """The exact option list the runtime hands to hiprtc, in order."""
    return [f"--offload-arch={arch}", *COMMON_OPTIONS, *options]


def clang_options(arch: str, options, name: str) -> list[str]:
    """What :func:`offline_compile`'s clang-22 call gets (hip_tools.compile_hip), for the cache key: its flags
    in order, the force-included shim named by a hash of its text, and no per-call temp paths."""
    from ...kernels import kernel_source
    from .. import hip_tools

    shim = hashlib.sha256(kernel_source("amd", "hip_shim.h").encode()).hexdigest()
    return [*hip_tools.BASE_FLAGS, f"--offload-arch={arch}", f"-cuid={name}", "-include", f"hip_shim.h@{shim}",
            *hip_tools.DEFAULT_OPTIONS, *options]


def cache_key(source: str, arch: str, options, compiler: str) -> str:
    """Hash of (source, arch, options, compiler identity incl. ROCm version, mxcore version).

    ``options``: the full option list the compiler receives, in order (:func:`hiprtc_options`,
    :func:`clang_options`), so a change to COMMON_OPTIONS or the offline flags never reuses a stale entry.
    """
    from ... import __version__

    blob = json.dumps([hashlib.sha256(source.encode()).hexdigest(), arch, list(options), compiler, __version__])
    return hashlib.sha256(blob.encode()).hexdigest()[:40]


def cache_read(key: str) -> bytes | None:
    """The cached code object for ``key``, or None.  A corrupt or truncated entry is deleted, never trusted."""
    return _STORE.get(key)


def cache_write(key: str, blob: bytes) -> None:
    """Store atomically (temp file in the same folder + os.replace) with a SHA-256 header."""
    _STORE.put(key, blob)


def offline_compile(spec, *, use_cache: bool = True):
    """clang-22 code object of the variant ``spec`` (hip_tools.HipBinary), through the disk cache."""
    from .. import hip_tools
    from .variants import compile_inputs

    source, options = compile_inputs(spec)
    key = cache_key(source, spec.arch, clang_options(spec.arch, options, spec.entry),
                    "clang:" + hip_tools.clang_version())
    blob = cache_read(key) if use_cache else None
    if blob is None:
        binary = hip_tools.compile_hip(source, name=spec.entry, arch=spec.arch, options=options)
        if use_cache:
            cache_write(key, binary.code_object)
        return binary
    return hip_tools.HipBinary(blob, name=spec.entry, arch=spec.arch, options=tuple(options))
