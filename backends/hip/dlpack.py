"""Device views of ROCm arrays (DLPack device type 10, or ``__cuda_array_interface__``): address, strides,
element type, the device they live on and the stream their producer works on.

Nothing is copied: a view keeps its producer (and the DLPack capsule) alive while the kernel reads it.  The
stream is the producer's current stream (torch: ``torch.cuda.current_stream(device)``, CuPy:
``cupy.cuda.get_current_stream()``), so mxcore's kernels queue behind the producer's work instead of racing
it; other producers are synchronised by DLPack itself (``__dlpack__(stream=...)``) on the null stream.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np

__all__ = ["KDL_ROCM", "DeviceView", "device_view", "producer_stream"]

KDL_ROCM = 10
_KDL_FLOAT, _KDL_BFLOAT = 2, 4


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


@dataclass
class DeviceView:
    """An N-D (2-D or 3-D) ROCm device array: address, element strides, numpy-style dtype name, device, stream."""

    addr: int
    shape: tuple
    strides: tuple  # in elements
    dtype: str  # "float32" | "float16" | "bfloat16"
    device: int = 0
    stream: int | None = None  # the producer's stream handle (None: the null stream)
    owner: object = field(default=None, repr=False)  # keeps the producer (and capsule) alive


def producer_stream(x, device: int) -> int | None:
    """The current stream of the library that made ``x`` (torch or CuPy on ROCm) on ``device``, else None."""
    mod = type(x).__module__.split(".")[0]
    try:
        if mod == "torch":
            import torch

            handle = int(torch.cuda.current_stream(device).cuda_stream)
            return handle or None
        if mod == "cupy":
            import cupy

            with cupy.cuda.Device(device):
                handle = int(cupy.cuda.get_current_stream().ptr)
            return handle or None
    except Exception:  # noqa: BLE001  (no stream API: the null stream, which DLPack synchronises)
        return None
    return None


def _dl_dtype(code: int, bits: int) -> str | None:
    if code == _KDL_BFLOAT and bits == 16:
        return "bfloat16"
    if code == _KDL_FLOAT and bits in (16, 32):
        return np.dtype(f"float{bits}").name
    return None


def device_view(x) -> DeviceView | None:
    """A ROCm device view of ``x`` (torch on ROCm, CuPy-ROCm, anything with DLPack or CAI), or None for host data
    and element types the kernels do not read in place."""
    dev = getattr(x, "__dlpack_device__", None)
    if callable(dev):
        try:
            dev_type, dev_id = dev()
        except Exception:  # noqa: BLE001  (a producer that cannot say: treat as host)
            dev_type, dev_id = None, 0
        if dev_type == KDL_ROCM:
            stream = producer_stream(x, int(dev_id))
            cap = x.__dlpack__(stream=stream) if stream is not None else x.__dlpack__()
            get = ctypes.pythonapi.PyCapsule_GetPointer
            get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
            t = _DLTensor.from_address(get(cap, b"dltensor"))
            name = _dl_dtype(t.dtype.code, t.dtype.bits)
            if name is None or t.ndim not in (2, 3) or t.dtype.lanes != 1:
                return None
            shape = tuple(int(t.shape[i]) for i in range(t.ndim))
            if t.strides:
                strides = tuple(int(t.strides[i]) for i in range(t.ndim))
            else:
                strides = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(t.ndim))
            return DeviceView(int(t.data or 0) + int(t.byte_offset), shape, strides, name, int(t.device.device_id),
                              stream, owner=(x, cap))
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None and len(cai.get("shape", ())) in (2, 3):
        try:
            dt = np.dtype(cai["typestr"])
        except TypeError:
            return None
        if dt.kind != "f" or dt.itemsize not in (2, 4):
            return None
        shape = tuple(int(s) for s in cai["shape"])
        st = cai.get("strides")
        if st is None:
            strides = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape)))
        else:
            strides = tuple(int(s) // dt.itemsize for s in st)
        stream = cai.get("stream")
        device = int(getattr(getattr(x, "device", None), "id", 0) or 0)
        return DeviceView(int(cai["data"][0]), shape, strides, dt.name, device,
                          int(stream) if stream not in (None, 0, 1, 2) else None, owner=x)
    return None
