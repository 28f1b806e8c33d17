"""The CUDA driver API that CuPy does not wrap, in one place (libcuda through ctypes): kernel launches with a
parameter block packed once (:class:`RawLaunch`, ``cuLaunchKernel``; ``cuLaunchKernelEx`` with programmatic
dependent launch), tiled tensor maps for TMA (:func:`tensor_map`, ``cuTensorMapEncodeTiled``) and cluster occupancy
(:func:`max_active_clusters`), and the graph calls that keep a captured launch's buffers alive (:func:`graph_api`).  The plans, the staging and the codec runtime launch through it; it imports none of
them."""

from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np

from mxcore.errors import UnsupportedError

__all__ = ["SWIZZLE_128B", "SWIZZLE_NONE", "LaunchConfig", "RawLaunch", "graph_api", "libcuda", "max_active_clusters",
           "tensor_map"]


_TMA_DTYPE = {1: 0, 2: 1, 4: 2}  # CU_TENSOR_MAP_DATA_TYPE_UINT8 / UINT16 / UINT32: bytes are copied, not converted
SWIZZLE_NONE, SWIZZLE_128B, _L2_PROMOTION_256B = 0, 3, 3  # CU_TENSOR_MAP_SWIZZLE_*, CU_TENSOR_MAP_L2_PROMOTION_L2_256B


@functools.lru_cache(maxsize=None)
def libcuda():
    """The CUDA driver library (libcuda.so.1) through ctypes, for what CuPy does not wrap."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise UnsupportedError(f"mxcore needs the CUDA driver library (libcuda.so.1): {exc}") from None


@functools.lru_cache(maxsize=None)
def _encode_tiled():
    """``cuTensorMapEncodeTiled`` with its argument types set (once: a plan's rebind encodes maps per call)."""
    fn = libcuda().cuTensorMapEncodeTiled
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return fn


def tensor_map(ptr: int, esize: int, inner: int, outer: int, ld: int, box_inner: int, box_outer: int,
               swizzle: int = SWIZZLE_128B) -> np.ndarray:
    """A 2-D tiled ``CUtensorMap`` (128-byte swizzle, or none: ``swizzle=0``; zeros out of bounds) as a size-1
    'V128' numpy array, which CuPy passes by value to a ``const __grid_constant__`` kernel parameter.
    ``inner``/``outer``: the global extents (elements; inner contiguous), ``ld``: elements between outer rows."""
    if ptr % 16 or (ld * esize) % 16:
        raise UnsupportedError(f"TMA needs a 16-byte aligned base and row pitch (base {ptr:#x}, pitch {ld}x{esize} B)")
    fn = _encode_tiled()
    raw = (ctypes.c_uint8 * 192)()
    addr = (ctypes.addressof(raw) + 63) & ~63  # the map must be 64-byte aligned
    err = fn(addr, _TMA_DTYPE[esize], 2, ptr, (ctypes.c_uint64 * 2)(inner, outer), (ctypes.c_uint64 * 1)(ld * esize),
             (ctypes.c_uint32 * 2)(box_inner, box_outer), (ctypes.c_uint32 * 2)(1, 1), 0, swizzle,
             _L2_PROMOTION_256B, 0)
    if err != 0:
        raise UnsupportedError(f"cuTensorMapEncodeTiled failed (CUresult {err}) for a {inner}x{outer} operand "
                               f"(pitch {ld}, box {box_inner}x{box_outer})")
    out = np.zeros(1, dtype="V128")
    out.view(np.uint8)[:] = np.frombuffer(ctypes.string_at(addr, 128), dtype=np.uint8)
    return out



class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuda.h)."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]


def max_active_clusters(kernel, cluster: int, threads: int, smem: int) -> int:
    """cuOccupancyMaxActiveClusters of a kernel with compile-time cluster dims (``cluster`` blocks of ``threads``
    threads and ``smem`` bytes of dynamic shared memory; 0 when the query fails)."""
    fn = libcuda().cuOccupancyMaxActiveClusters
    fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.POINTER(LaunchConfig)]
    cfg = LaunchConfig((ctypes.c_uint * 3)(cluster, 1, 1), (ctypes.c_uint * 3)(threads, 1, 1), smem,
                        None, None, 0)
    n = ctypes.c_int(0)
    func = getattr(kernel, "kernel", kernel).ptr  # cupy RawKernel -> Function -> CUfunction
    return n.value if fn(ctypes.byref(n), ctypes.c_void_p(func), ctypes.byref(cfg)) == 0 else 0



class RawLaunch:
    """One kernel launch through ``cuLaunchKernel`` with its parameter block packed once (ctypes values); a call
    sets the slots that change (device addresses) and launches on a raw stream handle.  What CuPy's kernel call
    does per argument (type dispatch, packing) is done once here.

    ``pdl``: launch through ``cuLaunchKernelEx`` with the programmatic-stream-serialization attribute (sm_90,
    programmatic dependent launch): the kernel may start before its predecessor in the stream has finished, so it
    must execute ``griddepcontrol.wait`` before reading anything a predecessor may write (only kernels built for
    it: the weight-only kernels compiled with WO_PDL, and ``mx_lo_fix`` after the exact MX GEMM)."""

    def __init__(self, kernel, grid, block, smem: int, args, pdl: bool = False):
        self.f = getattr(kernel, "kernel", kernel).ptr  # the CUfunction (a RawKernel's: of the current device)
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.block = tuple(block) + (1,) * (3 - len(block))
        self.smem = int(smem)
        self.vals = [_ctype(ctypes, a) for a in args]
        self.params = (ctypes.c_void_p * len(self.vals))(*[ctypes.addressof(v) for v in self.vals])
        self.pp = ctypes.addressof(self.params)
        self.lock = threading.Lock()
        self.ex = _PdlLaunch(self.f, self.grid, self.block, self.smem, self.pp) if pdl else None

    def set(self, i: int, a) -> None:
        """Argument ``i`` becomes ``a`` (of the same C type: an address, a number, a 'V<n>' array)."""
        val = _ctype(ctypes, a)
        with self.lock:
            ctypes.memmove(ctypes.addressof(self.vals[i]), ctypes.addressof(val), ctypes.sizeof(self.vals[i]))

    def __call__(self, driver, stream: int, slots) -> None:
        """Launch with ``slots`` = ((index, address), ...) set first, on stream handle ``stream``."""
        g, b, vals = self.grid, self.block, self.vals
        with self.lock:  # the parameter block is shared: set and launch atomically (cuLaunchKernel copies it)
            for i, ptr in slots:
                vals[i].value = ptr
            if self.ex is not None:
                self.ex(stream)
                return
            driver.launchKernel(self.f, g[0], g[1], g[2], b[0], b[1], b[2], self.smem, stream, self.pp, 0)

    def at3(self, driver, stream: int, p0: int, p1: int, p2: int) -> None:
        """``self(driver, stream, ((0, p0), (1, p1), (2, p2)))`` with less host work (the per-call paths' launch)."""
        vals = self.vals
        with self.lock:
            vals[0].value, vals[1].value, vals[2].value = p0, p1, p2
            if self.ex is not None:
                self.ex(stream)
                return
            g, b = self.grid, self.block
            driver.launchKernel(self.f, g[0], g[1], g[2], b[0], b[1], b[2], self.smem, stream, self.pp, 0)


_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h)


class _PdlLaunch:
    """``cuLaunchKernelEx`` (libcuda through ctypes; CuPy does not wrap it) of one function and shape with the
    programmatic-stream-serialization attribute set, with the parameter block at address ``params`` (RawLaunch's);
    the launch configuration is built once, the stream set per call (under RawLaunch's lock)."""

    def __init__(self, f: int, grid, block, smem: int, params: int):
        class Attr(ctypes.Structure):  # CUlaunchAttribute: id (4 bytes, padded to 8), a 64-byte value union
            _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_uint), ("value", ctypes.c_int * 16)]

        self.attr = Attr(_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, 0, (ctypes.c_int * 16)(1))  # allowed = 1
        self.cfg = LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), smem, None,
                                 ctypes.cast(ctypes.pointer(self.attr), ctypes.c_void_p), 1)
        self.launch = _launch_ex()
        # the call's arguments as ctypes objects, made once (nothing converted per call)
        self.args = (ctypes.byref(self.cfg), ctypes.c_void_p(f), ctypes.c_void_p(params), None)

    def __call__(self, stream: int) -> None:
        self.cfg.stream = stream or None
        err = self.launch(*self.args)
        if err != 0:
            from mxcore.errors import DeviceError

            raise DeviceError(f"cuLaunchKernelEx (programmatic dependent launch) failed: CUresult {err}")


@functools.lru_cache(maxsize=None)
def _launch_ex():
    """``cuLaunchKernelEx`` (its own function object: the callers pass ctypes objects made once, no argument types
    to convert through)."""
    fn = libcuda()["cuLaunchKernelEx"]
    fn.restype = ctypes.c_int
    return fn


def _ctype(ctypes, a):
    """A kernel argument as a ctypes value of its C type (device arrays and None: a 64-bit address; a size-1 numpy
    array of a raw 'V<n>' dtype, e.g. a TMA tensor map: its n bytes by value)."""
    if a is None:
        return ctypes.c_uint64(0)
    if isinstance(a, np.ndarray) and a.dtype.kind == "V":  # 64-byte aligned, as the kernel's parameter is
        buf = (ctypes.c_uint8 * (a.nbytes + 64))()
        val = (ctypes.c_uint8 * a.nbytes).from_buffer(buf, -ctypes.addressof(buf) % 64)  # keeps buf alive
        ctypes.memmove(val, a.tobytes(), a.nbytes)
        return val
    if isinstance(a, np.generic):
        return {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64,
                np.dtype(np.uint64): ctypes.c_uint64, np.dtype(np.uint32): ctypes.c_uint32,
                np.dtype(np.float32): ctypes.c_float}[a.dtype](a.item())
    return ctypes.c_uint64(int(a.data.ptr))


@functools.lru_cache(maxsize=None)
def graph_api():
    """(cuStreamGetCaptureInfo_v2, cuUserObjectCreate, cuGraphRetainUserObject) with their argument types set."""
    lib = libcuda()
    vp, u32 = ctypes.c_void_p, ctypes.c_uint
    info = lib.cuStreamGetCaptureInfo_v2
    info.argtypes = [vp, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(vp),
                     ctypes.POINTER(vp), ctypes.POINTER(ctypes.c_size_t)]
    info.restype = ctypes.c_int
    create = lib.cuUserObjectCreate
    create.argtypes = [ctypes.POINTER(vp), vp, vp, u32, u32]
    create.restype = ctypes.c_int
    retain = lib.cuGraphRetainUserObject
    retain.argtypes = [vp, vp, u32, u32]
    retain.restype = ctypes.c_int
    return info, create, retain
