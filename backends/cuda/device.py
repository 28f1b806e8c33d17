"""Where a call runs: the device ordinal of its operands, that device's properties (read once per process), the
stream (torch's current stream for torch tensors, CuPy's for the rest), and device arrays as CuPy views.

Nothing here queries the driver per call beyond selecting the device: :func:`device_info` caches each
ordinal's properties (``cudaGetDeviceProperties`` costs ~1 ms)."""

from __future__ import annotations

import ctypes
import functools
import itertools
import threading
from dataclasses import dataclass

from mxcore.arrays import array_kind
from mxcore.errors import UnsupportedError

__all__ = ["DeviceInfo", "address_of", "as_cupy", "capture_graph", "capturing", "device_bytes", "device_info",
           "ensure_context", "external_stream", "graph_kept_bytes", "keep_for_graph", "ordinal_of", "refuse_capture",
           "release_destroyed_graphs", "resolve_ordinal", "stream_for", "torch_stream", "torch_view", "unowned_view"]


@dataclass(frozen=True)
class DeviceInfo:
    ordinal: int
    name: str
    arch: str
    sms: int
    props: dict  # the figures occupancy estimates need (regsPerMultiprocessor, sharedMemPerMultiprocessor, ...)


_INFO: dict = {}
_PROP_KEYS = ("regsPerMultiprocessor", "sharedMemPerMultiprocessor", "reservedSharedMemPerBlock",
              "maxThreadsPerMultiProcessor", "sharedMemPerBlockOptin")


def device_info(cp, ordinal: int) -> DeviceInfo:
    info = _INFO.get(ordinal)
    if info is None:
        p = cp.cuda.runtime.getDeviceProperties(ordinal)
        name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
        info = DeviceInfo(ordinal, name, f"sm_{p['major']}{p['minor']}", int(p["multiProcessorCount"]),
                          {k: int(p[k]) for k in _PROP_KEYS if k in p})
        _INFO[ordinal] = info
    return info


def resident_blocks(props: dict, regs: int, threads: int, smem: int = 0) -> int:
    """Blocks of ``threads`` threads using ``regs`` registers and ``smem`` bytes of shared memory each that one SM
    holds at once (``props``: :class:`DeviceInfo`'s)."""
    warps = -(-threads // 32)
    by_regs = props.get("regsPerMultiprocessor", 65536) // (-(-regs * 32 // 256) * 256 * warps)
    by_smem = (props.get("sharedMemPerMultiprocessor", 233472)
               // (smem + props.get("reservedSharedMemPerBlock", 1024))) if smem else 32
    return max(1, min(by_regs, by_smem, props.get("maxThreadsPerMultiProcessor", 2048) // threads, 32))


def address_of(x) -> int:
    """The device address of a torch CUDA tensor or CuPy array."""
    return int(x.data_ptr()) if hasattr(x, "data_ptr") else int(x.data.ptr)


def ordinal_of(x) -> int | None:
    """The CUDA device ordinal ``x`` lives on (CuPy array, torch CUDA tensor, or a quantized tensor whose codes
    are one); None for host data."""
    kind = array_kind(x)
    if kind == "cupy":
        return int(x.device.id)
    if kind == "torch":
        return int(x.device.index) if x.device.type == "cuda" else None
    if kind == "mx":
        return ordinal_of(x.codes)
    return None


def resolve_ordinal(cp, a, b) -> int:
    """The device both operands live on (host operands follow the other one, or CuPy's current device)."""
    oa, ob = ordinal_of(a), ordinal_of(b)
    if oa is not None and ob is not None and oa != ob:
        raise UnsupportedError(f"operand a is on CUDA device {oa} and operand b on CUDA device {ob}; move both to one "
                               f"device first (e.g. b.to(a.device) in torch, cupy.asarray(b) under "
                               f"cupy.cuda.Device({oa}))")
    if oa is not None:
        return oa
    if ob is not None:
        return ob
    return int(cp.cuda.runtime.getDevice())


def _torch_operand(a, b):
    for x in (a, b):
        t = x.codes if array_kind(x) == "mx" else x
        if array_kind(t) == "torch" and t.device.type == "cuda":
            return t
    return None


def stream_for(cp, a, b):
    """The stream to run on (call under the operands' device): torch's current stream of that device when an
    operand is a torch CUDA tensor (ordering with the caller's torch work), else CuPy's current stream."""
    t = _torch_operand(a, b)
    if t is None:
        return cp.cuda.get_current_stream()
    import torch

    return external_stream(cp, torch_stream(torch, t.device.index))


def element_strides(x) -> tuple:
    """Strides in elements of a CuPy array or torch tensor."""
    if array_kind(x) == "torch":
        return tuple(x.stride())
    return tuple(s // x.itemsize for s in x.strides)


_RAW_STREAM: list = []  # [torch's raw current-stream accessor, or None]


def torch_stream(torch, ordinal: int) -> int:
    """The raw handle of torch's current stream on device ``ordinal`` (torch's internal accessor when it has one:
    ~10x cheaper than building a torch.cuda.Stream)."""
    if not _RAW_STREAM:
        _RAW_STREAM.append(getattr(torch._C, "_cuda_getCurrentRawStream", None))
    raw = _RAW_STREAM[0]
    if raw is not None:
        return raw(ordinal)
    return torch.cuda.current_stream(ordinal).cuda_stream


_STREAMS: dict = {}


def external_stream(cp, handle: int):
    """CuPy's view of a foreign (torch) stream handle, one object per handle (made once: ~10 us each)."""
    s = _STREAMS.get(handle)
    if s is None:
        if len(_STREAMS) > 64:
            _STREAMS.clear()
        s = _STREAMS[handle] = cp.cuda.Stream.from_external(_StreamHandle(handle))
    return s


class _StreamHandle:
    """The CUDA stream protocol (``__cuda_stream__``: version 0, handle) around a raw stream handle."""

    def __init__(self, handle: int):
        self.handle = int(handle)

    def __cuda_stream__(self):
        return (0, self.handle)


_TORCH_AS: dict = {}  # torch dtype -> the CuPy dtype of its bits (bf16 -> uint16, fp8 -> uint8), None: DLPack


def torch_view(cp, t):
    """A CuPy array over torch CUDA tensor ``t``'s memory (same shape and strides; ``t`` kept alive as the owner),
    built from its address: no DLPack capsule and no stream query (the caller runs on the tensor's stream).
    None for dtypes without a CuPy twin and for empty tensors (DLPack handles them)."""
    dt = t.dtype
    name = _TORCH_AS.get(dt, "?")
    if name == "?":
        n = str(dt).replace("torch.", "")
        name = _TORCH_AS[dt] = ("uint16" if n == "bfloat16" else "uint8" if n.startswith("float8") else
                                n if n in ("float16", "float32", "float64", "uint8", "int8", "int16", "int32",
                                           "int64") else None)
    if name is None or t.numel() == 0:
        return None
    storage = t.untyped_storage()
    base = storage.data_ptr()
    mem = cp.cuda.UnownedMemory(base, storage.nbytes(), t, t.device.index)
    size = t.element_size()
    return cp.ndarray(tuple(t.shape), name, cp.cuda.MemoryPointer(mem, t.data_ptr() - base),
                      strides=tuple(s * size for s in t.stride()))


def as_cupy(cp, x):
    """A CuPy view of device array ``x`` (CuPy as is; torch CUDA tensors through DLPack on their own device, with
    bfloat16 as uint16 bits); host data is uploaded."""
    kind = array_kind(x)
    if kind == "cupy":
        return x
    if kind == "torch" and x.device.type == "cuda":
        view = torch_view(cp, x)
        if view is not None:
            return view
        import torch

        t = x.detach()
        bf16 = t.dtype == torch.bfloat16
        if bf16:
            t = t.view(torch.int16)
        with torch.cuda.device(t.device):  # torch exports only tensors of its current device
            arr = cp.from_dlpack(t)
        return arr.view(cp.uint16) if bf16 else arr
    if kind == "torch":
        from mxcore.arrays import to_numpy

        x = to_numpy(x)
    import numpy as np

    host = np.asarray(x)
    if host.dtype.name == "bfloat16":
        host = host.view(np.uint16)
    elif host.dtype.name.startswith("float8"):
        host = host.view(np.uint8)
    return cp.asarray(host)


def unowned_view(cp, x):
    """A CuPy view of device array ``x`` (torch CUDA tensor or CuPy array) that does not keep ``x`` alive: what a
    plan kept across calls holds as its output, so that the caller's previous result is freed when the caller drops
    it (the next call finds its new output at the same address, or re-points the plan first)."""
    v = as_cupy(cp, x)
    mem = cp.cuda.UnownedMemory(v.data.ptr, v.nbytes, None, v.device.id)
    return cp.ndarray(v.shape, v.dtype, cp.cuda.MemoryPointer(mem, 0), strides=v.strides)


# ---- CUDA graph capture ----------------------------------------------------------------------------------------------
def capturing(cp, stream_h: int) -> bool:
    """Whether stream ``stream_h`` is being captured into a CUDA graph (a query that fails counts as capturing: e.g.
    the legacy default stream while another stream captures in global mode)."""
    try:
        return bool(cp.cuda.runtime.streamIsCapturing(stream_h))
    except cp.cuda.runtime.CUDARuntimeError:
        return True


def refuse_capture(cp, stream_h: int, what: str) -> None:
    """Raise a typed error instead of letting ``what`` (work that allocates, compiles or reads the device: a plan, a
    quantization, a layout's first calls) break a CUDA graph capture of stream ``stream_h``."""
    if capturing(cp, stream_h):
        raise UnsupportedError(
            f"{what} cannot run while the stream is being captured into a CUDA graph. Only a layout's later calls "
            "can be captured (2-D operands on the per-call paths: fp16/bf16 device operands, fp8/MX products of "
            "contiguous float device arrays, float activations times a weight quantized once); run each call of "
            "the region twice on the capture stream before capturing, e.g. under torch.cuda.stream(s), then "
            "torch.cuda.graph(g, stream=s)")


# ---- threads: the device's context current in every calling thread ------------------------------------------------
_THREAD = threading.local()


def ensure_context(cp, ordinal: int) -> None:
    """Make device ``ordinal``'s primary context current in this thread, once per thread and device.  A new host
    thread has no current context: the runtime binds one lazily, but the driver launches (``cuLaunchKernel``) used
    by the per-call paths need it bound before they run.  ``cudaSetDevice`` binds it; the thread's current device is
    left as it was (the call runs under ``cupy.cuda.Device(ordinal)`` where it differs)."""
    done = getattr(_THREAD, "contexts", None)
    if done is None:
        done = _THREAD.contexts = set()
    if ordinal in done:
        return
    rt = cp.cuda.runtime
    prev = rt.getDevice()
    rt.setDevice(ordinal)
    if prev != ordinal:
        rt.setDevice(prev)
    done.add(ordinal)


# ---- CUDA graphs: what a captured launch touches lives as long as the graph ---------------------------------------
_CU_STREAM_CAPTURE_STATUS_ACTIVE = 1
_KEPT: dict = {}  # user-object token -> the objects a graph keeps alive
_RELEASED: list = []  # tokens whose graph was destroyed (freed by the next call: no CUDA work in the driver's thread)
_NEXT = itertools.count(1)
_KEEP_LOCK = threading.Lock()


@functools.lru_cache(maxsize=None)
def _graph_api():
    """The driver's graph calls (driver.graph_api) and the user objects' destroy callback, which only notes the
    token: it runs on the driver's thread, where releasing may not free device memory."""
    from .driver import graph_api

    vp = ctypes.c_void_p

    @ctypes.CFUNCTYPE(None, vp)
    def destroyed(token):
        _RELEASED.append(int(token or 0))

    return (*graph_api(), destroyed)


def capture_graph(stream_h: int):
    """The CUgraph being captured on stream ``stream_h`` (an int handle), or None when it is not capturing."""
    info = _graph_api()[0]
    status, gid, graph = ctypes.c_int(0), ctypes.c_uint64(0), ctypes.c_void_p(0)
    err = info(ctypes.c_void_p(stream_h or None), ctypes.byref(status), ctypes.byref(gid), ctypes.byref(graph), None,
               None)
    if err != 0 or status.value != _CU_STREAM_CAPTURE_STATUS_ACTIVE:
        return None
    return graph.value


def keep_for_graph(stream_h: int, *objs) -> bool:
    """Under CUDA graph capture of stream ``stream_h``, keep ``objs`` (buffers, plans the captured launches use)
    alive as long as the graph: a CUDA user object owned by the graph releases them when the graph and every
    executable made from it are destroyed.  False (nothing kept) when the stream is not capturing."""
    graph = capture_graph(stream_h)
    if graph is None:
        return False
    _info, create, retain, destroyed = _graph_api()
    token = next(_NEXT)
    obj = ctypes.c_void_p(0)
    with _KEEP_LOCK:
        _KEPT[token] = objs
    err = create(ctypes.byref(obj), ctypes.c_void_p(token), ctypes.cast(destroyed, ctypes.c_void_p), 1, 1)
    if err == 0:
        err = retain(ctypes.c_void_p(graph), obj, 1, 1)  # CU_GRAPH_USER_OBJECT_MOVE: the graph owns the reference
    if err != 0:
        with _KEEP_LOCK:
            _KEPT.pop(token, None)
        raise UnsupportedError(f"could not tie buffers to the CUDA graph being captured (CUresult {err})")
    return True


def release_destroyed_graphs() -> int:
    """Drop what destroyed graphs kept (called on the per-call paths and by ``clear_cache``); the count released."""
    n = 0
    while _RELEASED:
        token = _RELEASED.pop()
        with _KEEP_LOCK:
            n += _KEPT.pop(token, None) is not None
    return n


def graph_kept_bytes() -> int:
    """Device bytes held for live CUDA graphs (owned CuPy arrays among what they keep)."""
    with _KEEP_LOCK:
        objs = list(_KEPT.values())
    return device_bytes(objs)


_NOT_WALKED = frozenset({"CudaBackend", "KernelCache", "Stager", "DeviceInfo"})  # shared, not an entry's own


def allocations(obj) -> set:
    """The allocation addresses of the CuPy arrays reachable from ``obj`` (as :func:`device_bytes` walks)."""
    found: set = set()
    device_bytes(obj, found=found)
    return found


def device_bytes(obj, exclude=frozenset(), found=None) -> int:
    """Device bytes of the CuPy arrays reachable from ``obj`` (tuples, lists, dicts, and the attributes of mxcore's
    plan and launch objects) whose memory they own; each allocation counted once, those in ``exclude`` (allocation
    addresses) not at all.  ``found``: a set that receives the allocation addresses counted."""
    seen: set = set() if found is None else found
    total = 0
    stack = [obj]
    visited: set = set()
    while stack:
        x = stack.pop()
        if id(x) in visited:
            continue
        visited.add(id(x))
        if isinstance(x, (tuple, list, set, frozenset)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif type(x).__name__ == "ndarray" and hasattr(x, "data") and hasattr(x.data, "mem"):
            mem = x.data.mem
            if type(mem).__name__ != "UnownedMemory":
                ptr = int(mem.ptr)
                if ptr not in seen and ptr not in exclude:
                    seen.add(ptr)
                    total += int(mem.size)
            base = getattr(x, "base", None)
            if base is not None:
                stack.append(base)
        elif (type(x).__module__.startswith(("mxcore.backends", "backends")) and hasattr(x, "__dict__")
              and type(x).__name__ not in _NOT_WALKED):
            stack.extend(vars(x).values())
    return total
