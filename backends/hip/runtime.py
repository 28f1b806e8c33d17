"""The one place that calls hip-python (``hip.hip`` and ``hip.hiprtc``).

hip-python's call conventions differ by release; :func:`detect_convention` reads them ONCE from the
wrappers' own signatures when the :class:`Runtime` is built:

==========================  ======================================  ========================================
call                        hip-python 6.x / 7.x                    hip-python 10.x (rocm-bindings)
==========================  ======================================  ========================================
device properties           ``hipGetDeviceProperties(prop, dev)``   ``hipGetDeviceProperties(dev)``
                            -> ``(err,)`` (fills ``prop``)           -> ``(err, prop)``
==========================  ======================================  ========================================

Everything else mxcore calls (device count/selection, runtime version, hipMalloc/Free/Memcpy(Async)/
Memset(Async), module load / function / launch with the ``extra`` argument tuple, events, synchronisation,
and the eight hiprtc calls) has the same Python signature in 6.4, 7.2 and 10.0 (checked against the wheels'
wrappers).  Every call returns ``(err, *values)`` and goes through :meth:`Runtime.check`, which raises
:class:`~mxcore.errors.DeviceError` (or :class:`~mxcore.errors.KernelCompileError` for hiprtc).

Surface (what the backend, probes and the stand-in-runtime tests use): ``Runtime(hip=None, hiprtc=None)``
(the modules may be injected), ``device_count()``, ``device(i)`` -> :class:`DeviceInfo`, ``on_device(i)``
(context manager), ``function(source, name, options, device=None)``, ``alloc``/``free``/``upload``/
``download``/``memset``, ``launch(func, grid, block, args, stream=None)``, ``synchronize(stream=None)``,
``elapsed(fn, stream=None)``, ``compiler_id()``, ``code_object(...)``.  Streams are integer handles (or None
for the null stream); pointers passed to kernels are ``ctypes.c_void_p(device_address(ptr))``.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import inspect
import re
import threading
from dataclasses import dataclass

import numpy as np

from ...errors import DeviceError, KernelCompileError
from .cache import cache_key, cache_read, cache_write, hiprtc_options

__all__ = ["Convention", "DeviceInfo", "Runtime", "detect_convention", "device_address", "hip_python_version",
           "rocm_version_text", "version_mismatch"]

MATCH_HINT = ("use the hip-python release that matches your ROCm version: pip install \"hip-python==X.Y.*\" for "
              "ROCm X.Y (mxcore drives the 6.x/7.x and the 10.x call conventions)")


@dataclass(frozen=True)
class Convention:
    """How this hip-python build is called (see the module docstring)."""

    props_returned: bool  # hipGetDeviceProperties(dev) -> (err, prop) (10.x) vs (prop, dev) -> (err,) (6.x/7.x)

    @property
    def label(self) -> str:
        return "hip-python >= 10 (properties returned)" if self.props_returned else "hip-python 6/7 (properties filled)"


def _positional_params(fn) -> int | None:
    """Number of parameters of a (Cython or Python) function, from its signature or embedded docstring."""
    try:
        return len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        pass
    first = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    m = re.match(r"\w+\((.*?)\)", first[0]) if first else None
    if m is None:
        return None
    return len([p for p in m.group(1).split(",") if p.strip()])


def detect_convention(hip) -> Convention:
    """Read hip-python's calling convention from its wrappers (raises DeviceError when it cannot tell)."""
    n = _positional_params(hip.hipGetDeviceProperties)
    if n == 1:
        return Convention(props_returned=True)
    if n == 2:
        return Convention(props_returned=False)
    raise DeviceError(f"hip-python's hipGetDeviceProperties takes {n} arguments; mxcore knows the 1-argument "
                      f"(hip-python 10) and 2-argument (6.x/7.x) forms; {MATCH_HINT}")


def rocm_version_text(version: int) -> str:
    """hipRuntimeGetVersion's integer (major * 10^7 + minor * 10^5 + patch) as "6.4.43483"."""
    if version <= 0:
        return "unknown"
    return f"{version // 10_000_000}.{version // 100_000 % 100}.{version % 100_000}"


def hip_python_version() -> str:
    """The installed hip-python distribution's version ("7.2.2.562.43"), or "unknown"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hip-python")
    except PackageNotFoundError:
        return "unknown"


def version_mismatch(hip_python: str, runtime_version: int) -> str | None:
    """A note when hip-python 6.x/7.x (whose X.Y is the ROCm release it was built for) and the ROCm runtime
    differ in X.Y; None when they match or cannot be compared (hip-python >= 10 versions its bindings apart)."""
    parts = hip_python.split(".")
    if runtime_version <= 0 or len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    built, running = (int(parts[0]), int(parts[1])), (runtime_version // 10_000_000, runtime_version // 100_000 % 100)
    if built[0] >= 10 or built == running:
        return None
    return (f"hip-python {hip_python} is built for ROCm {built[0]}.{built[1]} but the runtime is ROCm "
            f"{running[0]}.{running[1]}; {MATCH_HINT}")


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    arch: str  # "gfx942"
    arch_full: str  # "gfx942:sramecc+:xnack-"
    cus: int
    max_grid: tuple  # (x, y, z) block counts


def _text(value) -> str:
    return value.decode(errors="replace").rstrip("\0") if isinstance(value, (bytes, bytearray)) else str(value)


def device_address(ptr) -> int:
    """Integer device address of a hip-python pointer, a __cuda_array_interface__ producer, a ctypes.c_void_p,
    or an int.  Raises DeviceError otherwise."""
    if isinstance(ptr, int):
        return ptr
    if isinstance(ptr, ctypes.c_void_p):  # int() would parse its buffer as text
        return int(ptr.value or 0)
    try:
        return int(ptr)  # hip-python's Pointer / DeviceArray convert to their address
    except (TypeError, ValueError):
        pass
    cai = getattr(ptr, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    raise DeviceError(f"cannot read a device address from {type(ptr).__name__}")


class Runtime:
    """hip-python, imported once; every hip / hiprtc call goes through :meth:`check`."""

    def __init__(self, hip=None, hiprtc=None):
        if hip is None or hiprtc is None:
            from hip import hip as _hip
            from hip import hiprtc as _hiprtc

            hip, hiprtc = hip or _hip, hiprtc or _hiprtc
        self.hip, self.hiprtc = hip, hiprtc
        self.convention = detect_convention(hip)
        self.lock = threading.Lock()
        self.modules: dict = {}
        self._devices: dict = {}
        try:
            self.runtime_version = int(self.check(hip.hipRuntimeGetVersion(), "hipRuntimeGetVersion"))
        except DeviceError:
            self.runtime_version = 0

    # -- the one checker
    def check(self, result, what: str):
        """hip-python returns (err, *values): raise DeviceError / KernelCompileError, else the value(s)."""
        hip, hiprtc = self.hip, self.hiprtc
        if not isinstance(result, tuple):
            result = (result,)
        err, values = result[0], result[1:]
        if isinstance(err, hip.hipError_t) and err != hip.hipError_t.hipSuccess:
            msg = hip.hipGetErrorString(err)
            msg = msg[-1] if isinstance(msg, tuple) else msg
            raise DeviceError(f"{what} failed: {err.name}: {_text(msg)}")
        if isinstance(err, hiprtc.hiprtcResult) and err != hiprtc.hiprtcResult.HIPRTC_SUCCESS:
            raise KernelCompileError(f"{what} failed: {err.name}")
        if not values:
            return None
        return values[0] if len(values) == 1 else values

    # -- devices
    def device_count(self) -> int:
        return int(self.check(self.hip.hipGetDeviceCount(), "hipGetDeviceCount"))

    def current_device(self) -> int:
        return int(self.check(self.hip.hipGetDevice(), "hipGetDevice"))

    @contextlib.contextmanager
    def on_device(self, index: int | None):
        """Make ``index`` the calling thread's device inside the block (None: leave it as it is)."""
        if index is None:
            yield
            return
        prev = self.current_device()
        if prev != index:
            self.check(self.hip.hipSetDevice(int(index)), f"hipSetDevice({index})")
        try:
            yield
        finally:
            if prev != index:
                self.check(self.hip.hipSetDevice(prev), f"hipSetDevice({prev})")

    def properties(self, index: int):
        hip = self.hip
        if self.convention.props_returned:
            return self.check(hip.hipGetDeviceProperties(index), "hipGetDeviceProperties")
        props = hip.hipDeviceProp_t()
        self.check(hip.hipGetDeviceProperties(props, index), "hipGetDeviceProperties")
        return props

    def device(self, index: int | None = None) -> DeviceInfo:
        index = self.current_device() if index is None else int(index)
        if index not in self._devices:
            p = self.properties(index)
            full = _text(p.gcnArchName)
            grid = tuple(int(x) for x in getattr(p, "maxGridSize", (2**31 - 1, 65535, 65535)))
            self._devices[index] = DeviceInfo(index, _text(p.name), full.split(":")[0], full,
                                              int(getattr(p, "multiProcessorCount", 0)), grid)
        return self._devices[index]

    # -- compile and load
    def hiprtc_compile(self, source: str, name: str, arch: str, options) -> bytes:
        hiprtc = self.hiprtc
        opts = hiprtc_options(arch, options)
        prog = self.check(hiprtc.hiprtcCreateProgram(source.encode(), name.encode(), 0, [], []), "hiprtcCreateProgram")
        try:
            enc = [o.encode() for o in opts]
            result = hiprtc.hiprtcCompileProgram(prog, len(enc), enc)
            err = result[0] if isinstance(result, tuple) else result
            if err != hiprtc.hiprtcResult.HIPRTC_SUCCESS:
                size = self.check(hiprtc.hiprtcGetProgramLogSize(prog), "hiprtcGetProgramLogSize")
                log = bytearray(int(size))
                self.check(hiprtc.hiprtcGetProgramLog(prog, log), "hiprtcGetProgramLog")
                raise KernelCompileError(f"hiprtc failed to compile {name} ({err.name})",
                                         log=log.decode(errors="replace"), source=name, options=opts, arch=arch)
            size = self.check(hiprtc.hiprtcGetCodeSize(prog), "hiprtcGetCodeSize")
            code = bytearray(int(size))
            self.check(hiprtc.hiprtcGetCode(prog, code), "hiprtcGetCode")
            return bytes(code)
        finally:
            self.check(hiprtc.hiprtcDestroyProgram(prog.createRef()), "hiprtcDestroyProgram")

    def compiler_id(self) -> str:
        try:
            ver = self.check(self.hiprtc.hiprtcVersion(), "hiprtcVersion")
        except (DeviceError, KernelCompileError, AttributeError):
            ver = "?"
        return f"hiprtc:{ver}:rocm{self.runtime_version}"

    def code_object(self, source: str, name: str, arch: str, options) -> bytes:
        """hiprtc code object through the verified disk cache."""
        key = cache_key(source, arch, hiprtc_options(arch, options), self.compiler_id())
        blob = cache_read(key)
        if blob is None:
            blob = self.hiprtc_compile(source, name, arch, options)
            cache_write(key, blob)
        return blob

    def function(self, source: str, name: str, options, device: int | None = None):
        """The loaded kernel ``name`` on ``device`` (default: the current one), compiled for its arch."""
        dev = self.device(device)
        key = (dev.index, hashlib.sha256(source.encode()).hexdigest(), name, tuple(options))
        with self.lock:
            if key not in self.modules:
                blob = self.code_object(source, name, dev.arch, options)
                with self.on_device(dev.index):
                    module = self.check(self.hip.hipModuleLoadData(blob), "hipModuleLoadData")
                    func = self.check(self.hip.hipModuleGetFunction(module, name.encode()),
                                      f"hipModuleGetFunction({name})")
                self.modules[key] = (module, func)
            return self.modules[key][1]

    # -- memory (on the calling thread's current device)
    def alloc(self, nbytes: int):
        return self.check(self.hip.hipMalloc(max(int(nbytes), 1)), "hipMalloc")

    def free(self, ptr) -> None:
        self.check(self.hip.hipFree(ptr), "hipFree")

    def upload(self, host: np.ndarray):
        """A new device buffer holding ``host`` (hipMemcpy returns once the copy is done)."""
        host = np.ascontiguousarray(host)
        ptr = self.alloc(host.nbytes)
        if host.nbytes:
            kind = self.hip.hipMemcpyKind.hipMemcpyHostToDevice
            self.check(self.hip.hipMemcpy(ptr, host, host.nbytes, kind), "hipMemcpy H2D")
        return ptr

    def download(self, ptr, host: np.ndarray, stream=None) -> np.ndarray:
        """Copy ``host.nbytes`` from the device into ``host`` after the work queued on ``stream``."""
        self.synchronize(stream)
        kind = self.hip.hipMemcpyKind.hipMemcpyDeviceToHost
        self.check(self.hip.hipMemcpy(host, ptr, host.nbytes, kind), "hipMemcpy D2H")
        return host

    def memset(self, ptr, byte: int, nbytes: int) -> None:
        self.check(self.hip.hipMemset(ptr, byte, nbytes), "hipMemset")

    # -- launch and time
    def launch(self, func, grid, block, args, stream=None) -> None:
        self.check(self.hip.hipModuleLaunchKernel(func, *grid, *block, sharedMemBytes=0, stream=stream,
                                                  kernelParams=None, extra=tuple(args)), "hipModuleLaunchKernel")

    def synchronize(self, stream=None) -> None:
        if stream is None:
            self.check(self.hip.hipDeviceSynchronize(), "hipDeviceSynchronize")
        else:
            self.check(self.hip.hipStreamSynchronize(stream), "hipStreamSynchronize")

    def elapsed(self, fn, stream=None) -> float:
        """Seconds between two hipEvents recorded on ``stream`` around ``fn()`` (waits for the second)."""
        hip = self.hip
        start = self.check(hip.hipEventCreate(), "hipEventCreate")
        stop = self.check(hip.hipEventCreate(), "hipEventCreate")
        try:
            self.check(hip.hipEventRecord(start, stream), "hipEventRecord")
            fn()
            self.check(hip.hipEventRecord(stop, stream), "hipEventRecord")
            self.check(hip.hipEventSynchronize(stop), "hipEventSynchronize")
            return self.check(hip.hipEventElapsedTime(start, stop), "hipEventElapsedTime") * 1e-3
        finally:
            self.check(hip.hipEventDestroy(start), "hipEventDestroy")
            self.check(hip.hipEventDestroy(stop), "hipEventDestroy")
