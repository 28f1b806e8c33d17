"""Device sources shipped with mxcore (``kernels_cuda/``, ``kernels_hip/``) and the disk cache of what the
compilers make of them.

* :func:`kernel_dir` / :func:`kernel_source`: the sources are the packages ``mxcore.kernels_cuda`` and
  ``mxcore.kernels_hip`` — package data inside an installed mxcore, folders at the repository root in a
  checkout (``mxcore/__init__.py`` puts the root on the package's path); both are found through the import
  system, so a wheel, an editable install and a bare checkout read the same files the same way.
* :class:`DiskCache`: a content-addressed store of compiler outputs under :func:`cache_root`
  (``$MXCORE_CACHE_DIR``, else ``$XDG_CACHE_HOME/mxcore``, else ``~/.cache/mxcore``), one folder per kind.
  Keys are hashes of everything that decides the output (:func:`cache_key`: source text, options, arch,
  compiler identity); entries are written atomically (temp file + ``os.replace``) with a SHA-256 header that
  is checked on every read, so a corrupt or truncated entry is deleted and rebuilt, never trusted.  A
  read-only or full cache folder costs a recompile, nothing else.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import tempfile
from pathlib import Path

from .errors import UnknownNameError

__all__ = ["DiskCache", "cache_key", "cache_root", "kernel_dir", "kernel_files", "kernel_source"]

_DIRS = {"nvidia": "kernels_cuda", "cuda": "kernels_cuda", "amd": "kernels_hip", "hip": "kernels_hip"}


def kernel_dir(vendor: str) -> Path:
    """The folder holding ``vendor``'s kernel sources ("nvidia"/"cuda" or "amd"/"hip")."""
    try:
        sub = _DIRS[vendor.lower()]
    except KeyError:
        raise UnknownNameError(f"unknown kernel vendor {vendor!r}; use 'nvidia' or 'amd'") from None
    spec = importlib.util.find_spec(f"{__package__}.{sub}")
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        if Path(loc).is_dir():
            return Path(loc)
    raise FileNotFoundError(f"mxcore's {sub}/ folder was not found (mxcore at {Path(__file__).parent}); "
                            "reinstall mxcore (pip install .) or run from the root of a complete checkout")


def kernel_files(vendor: str) -> list[str]:
    d = kernel_dir(vendor)
    return sorted(p.name for p in d.iterdir() if p.suffix in {".cu", ".cuh", ".hip", ".h"})


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*$', re.M)


def kernel_source(vendor: str, filename: str, _seen: set | None = None) -> str:
    """The text of ``filename`` from ``vendor``'s kernel folder, with each ``#include "X"`` of a file of the same
    folder replaced by X's text (once per file; a repeated include becomes a comment).  The compilers then need
    no include path, and a kernel cache keyed on the source text sees header changes."""
    path = kernel_dir(vendor) / filename
    if not path.is_file():
        raise UnknownNameError(f"no kernel source {filename!r} for {vendor}; have: {', '.join(kernel_files(vendor))}")
    seen = {filename} if _seen is None else _seen

    def inline(m):
        name = m.group(1)
        if name in seen:
            return f"// (#include \"{name}\": inlined above)"
        seen.add(name)
        return f"// ---- {name} ----\n{kernel_source(vendor, name, seen)}// ---- end {name} ----"

    return _INCLUDE.sub(inline, path.read_text())


# ----------------------------------------------------------------------------------------------------------------
# compiled-kernel disk cache
# ----------------------------------------------------------------------------------------------------------------
def cache_root() -> Path:
    """``$MXCORE_CACHE_DIR``, else ``$XDG_CACHE_HOME/mxcore``, else ``~/.cache/mxcore``."""
    root = os.environ.get("MXCORE_CACHE_DIR")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mxcore")
    return Path(root)


def cache_key(*parts) -> str:
    """A hex key naming ``parts`` (str, bytes, numbers, lists/tuples/dicts of them): equal parts, equal key.
    Bytes and long strings enter by their SHA-256, so a key is cheap however large the source text."""

    def norm(x):
        if isinstance(x, bytes):
            return ["bytes", hashlib.sha256(x).hexdigest()]
        if isinstance(x, str):
            return x if len(x) <= 256 else ["text", hashlib.sha256(x.encode()).hexdigest()]
        if isinstance(x, (list, tuple)):
            return [norm(v) for v in x]
        if isinstance(x, dict):
            return {str(k): norm(v) for k, v in sorted(x.items())}
        if x is None or isinstance(x, (bool, int, float)):
            return x
        raise TypeError(f"cache_key takes str, bytes, numbers and lists/dicts of them, not {type(x).__name__}")

    return hashlib.sha256(json.dumps(norm(list(parts))).encode()).hexdigest()[:40]


class DiskCache:
    """Verified blobs under ``cache_root()/<kind>/<key><suffix>``.  ``get`` returns None for a missing, corrupt
    or truncated entry (deleting the bad one); ``put`` never raises on a read-only or full disk."""

    MAGIC = b"MXCOv1 "

    def __init__(self, kind: str, suffix: str = ".bin"):
        if not re.fullmatch(r"[a-z0-9_]+", kind):
            raise ValueError(f"cache kind must be a plain lower-case name, got {kind!r}")
        self.kind, self.suffix = kind, suffix

    @property
    def folder(self) -> Path:
        return cache_root() / self.kind  # read each time: tests and users may point MXCORE_CACHE_DIR elsewhere

    def path(self, key: str) -> Path:
        return self.folder / f"{key}{self.suffix}"

    def get(self, key: str) -> bytes | None:
        path = self.path(key)
        try:
            raw = path.read_bytes()
        except OSError:
            return None
        head, sep, body = raw.partition(b"\n")
        if head.startswith(self.MAGIC) and sep and hashlib.sha256(body).hexdigest().encode() == head[len(self.MAGIC):]:
            return body
        try:
            path.unlink()
        except OSError:
            pass
        return None

    def put(self, key: str, blob: bytes) -> None:
        folder = self.folder
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_", suffix=self.suffix)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(self.MAGIC + hashlib.sha256(blob).hexdigest().encode() + b"\n" + blob)
                os.replace(tmp, self.path(key))
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError:
            pass  # a read-only or full cache folder costs a recompile, nothing else

    def get_json(self, key: str):
        blob = self.get(key)
        if blob is None:
            return None
        try:
            return json.loads(blob)
        except ValueError:
            return None

    def put_json(self, key: str, value) -> None:
        self.put(key, json.dumps(value).encode())
