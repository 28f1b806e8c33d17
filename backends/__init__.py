"""Backend registry (imported as ``mxcore.backends``): the one module of this package that the core imports.

Each backend module defines one class with ``name``, a side-effect-free ``is_available()``
that returns ``None`` when usable or a reason string (it imports CuPy / hip-python inside a
try and never raises), ``supports(dtype)`` and ``matmul``.  Importing this package imports no
GPU library.

Selection order for ``backend="auto"``: the ``MXCORE_BACKEND`` environment variable, else the
first usable GPU backend (cuda, then hip), else the numpy reference.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from types import MappingProxyType

from ..errors import BackendUnavailableError, UnknownNameError
from ._contract import Backend, KernelRecord, Plan, Target

__all__ = ["Backend", "BackendStatus", "KernelRecord", "Plan", "Target", "available", "device_codec", "get", "loaded",
           "names", "select", "tensor_parallel"]

# name -> module (relative to this package) and class; order is the auto-selection order
_REGISTRY = {
    "cuda": ("cuda", "CudaBackend"),
    "hip": ("hip", "HipBackend"),
    "reference": ("reference", "ReferenceBackend"),
}
_ALIASES = {"nvidia": "cuda", "amd": "hip", "rocm": "hip", "numpy": "reference", "cpu": "reference"}
# name -> the module (relative to this package) of the backend's column-parallel program for mxcore.distributed
_TENSOR_PARALLEL = {"cuda": "cuda.tp"}
_INSTANCES: dict = {}
_LOADED = MappingProxyType(_INSTANCES)


@dataclass(frozen=True)
class BackendStatus:
    name: str
    usable: bool
    reason: str | None
    devices: tuple = field(default_factory=tuple)

    def __str__(self) -> str:
        state = "usable" if self.usable else f"not usable: {self.reason}"
        devs = f" [{'; '.join(self.devices)}]" if self.devices else ""
        return f"{self.name}: {state}{devs}"


def names() -> list[str]:
    return list(_REGISTRY)


def _canonical(name: str) -> str:
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in _REGISTRY and key != "auto":
        raise UnknownNameError(f"unknown backend {name!r}; choose one of: auto, {', '.join(_REGISTRY)}")
    return key


def get(name: str):
    """The backend object called ``name`` (usable or not; see ``is_available()``)."""
    key = _canonical(name)
    if key == "auto":
        return select("auto")
    if key not in _INSTANCES:
        module_name, cls_name = _REGISTRY[key]
        module = importlib.import_module(f"{__name__}.{module_name}")
        _INSTANCES[key] = getattr(module, cls_name)()
    return _INSTANCES[key]


def loaded() -> MappingProxyType:
    """The backend objects made so far (by :func:`get` or :func:`select`), by canonical name, as a read-only live
    view: the ones whose caches ``mxcore.cache_info`` / ``clear_cache`` / ``set_cache_limit`` reach.  Loads
    nothing."""
    return _LOADED


def device_codec():
    """The device codecs (``mxcore.backends.codec``: encode, decode and MX / per-tensor quantization of GPU
    arrays), imported on first use: ``mxcore.formats`` and ``mxcore.mx`` hand device arrays to it."""
    return importlib.import_module(f"{__name__}.codec")


def tensor_parallel(name: str):
    """The module that runs ``mxcore.distributed.matmul(layout="column")`` as one replayed per-call program on
    backend ``name`` (``lookup`` / ``keep``, see ``backends/cuda/tp.py``), or None where the backend has none and
    the generic path runs."""
    module = _TENSOR_PARALLEL.get(_canonical(name))
    return None if module is None else importlib.import_module(f"{__name__}.{module}")


def available() -> list[BackendStatus]:
    """Every known backend, whether it is usable here and, when not, why."""
    out = []
    for key in _REGISTRY:
        try:
            backend = get(key)
        except Exception as exc:  # a broken install: report it instead of failing the whole listing
            out.append(BackendStatus(key, False, f"backend module failed to import: {exc}"))
            continue
        reason = backend.is_available()
        devices = tuple(backend.devices()) if reason is None and hasattr(backend, "devices") else ()
        out.append(BackendStatus(key, reason is None, reason, devices))
    return out


def select(name: str | None = "auto"):
    """Resolve a backend request to a usable backend object, or raise saying why not."""
    key = _canonical(name or "auto")
    if key == "auto":
        env = os.environ.get("MXCORE_BACKEND", "").strip()
        if env and env.lower() != "auto":
            try:
                return select(env)
            except (UnknownNameError, BackendUnavailableError) as exc:
                raise type(exc)(f"MXCORE_BACKEND={env!r} (environment variable) chose this backend: {exc}. "
                                "Unset MXCORE_BACKEND or set it to a usable backend") from exc
        for key in _REGISTRY:  # the first usable one, in registry order (as available() lists them)
            try:
                backend = get(key)
            except Exception:  # noqa: BLE001 (a broken install: available() reports it; try the next)
                continue
            if backend.is_available() is None:
                return backend
        raise BackendUnavailableError("no usable backend (even the reference failed to load)")
    backend = get(key)
    reason = backend.is_available()
    if reason is not None:
        others = [s.name for s in available() if s.usable]
        raise BackendUnavailableError(
            f"backend {key!r} is not usable here: {reason}. Usable backends: {', '.join(others) or 'none'}; "
            "pass backend='auto' to pick one"
        ) from getattr(backend, "unavailable_cause", None)
    return backend
