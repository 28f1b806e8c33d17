"""The CUDA backend's per-call fast paths (``Backend.fast_matmul`` and the fp16/bf16 shortcut of ``matmul``).

* :func:`fast_call` — fp16/bf16 device operands the kernel reads in place: the plan is built once per layout and
  later calls only allocate the output and relaunch it (:class:`~.plan.Relaunch`) with the new addresses.
* :func:`fast_quantized` — fp8/MX products of contiguous float device arrays: the first call of a layout runs the
  codec and the plan's staging under :func:`~mxcore.backends.codec.recording` and keeps the plan; later calls replay
  the recorded quantization (and the staging, where it covers every buffer the GEMM reads; else they stage again
  and :meth:`~.plan.CudaPlan.rebind` the operands) and launch into a new output.

Both keep their entries in the backend's ``_fast`` dict (False: the layout does not qualify).
"""

from __future__ import annotations

from mxcore.arrays import array_kind
from mxcore.errors import UnsupportedError
from mxcore.operands import quantize_on_device

from .device import as_cupy, torch_stream, unowned_view
from .plan import CudaPlan

__all__ = ["fast_call", "fast_quantized"]

_TORCH_OUT_NAMES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


class _TorchOut(dict):
    def __missing__(self, key):
        import torch

        self[key] = getattr(torch, _TORCH_OUT_NAMES[key])
        return self[key]


_TORCH_OUT = _TorchOut()


def _quantized_buffers(*objs) -> list:
    """The device arrays inside quantized objects (MXTensor: codes, scales, scale_max; ScaledTensor: codes, scale,
    scale_exp); host arrays are left out (a replay does not touch them)."""
    out = []
    for o in objs:
        for name in ("codes", "scales", "scale_max", "scale", "scale_exp"):
            x = getattr(o, name, None)
            kind = array_kind(x) if x is not None else None
            if (kind == "torch" and x.device.type == "cuda") or kind == "cupy":
                out.append(x)
    return out


def _plan_buffers(p) -> list:
    """The device arrays a plan's GEMM reads from its staged operands (codes, MX factors and flags, device scale
    exponents)."""
    out = []
    for d in (p.da, p.db):
        out += [d.buf, d.exp_at]
        if d.mx is not None:
            out += [d.mx.factors, d.mx.info, d.mx.nan, d.mx.folded]
    return [x for x in out if x is not None]


def _covered(arrays, spans) -> bool:
    """Every array's first byte lies in one of ``spans`` (device address ranges of recorded arrays)."""
    ptrs = [int(x.data_ptr()) if hasattr(x, "data_ptr") else int(x.data.ptr) for x in arrays]  # torch / CuPy
    return all(any(lo <= q < hi for lo, hi in spans) for q in ptrs)


def _replayable(arrays, *recs, extra=()) -> bool:
    """A replay of the recordings ``recs`` remakes every one of ``arrays``: no recording noted device work made
    outside its steps (``tainted``, e.g. a CuPy copy), and each array is :func:`_covered` by the arrays of the
    recorded steps (:meth:`~mxcore.backends.codec.Recording.spans`: launch arguments, zeroed buffers, copies; views
    into one allocation count) or by ``extra`` spans (buffers the caller rewrites itself each call, e.g. by a
    collective).  A buffer made by a copy outside the recording is its own allocation, in no span."""
    return all(r.tainted is None for r in recs) and _covered(arrays, [s for r in recs for s in r.spans()] + list(extra))


def _device_views(cp, *xs):
    """CuPy views of device arrays (the addresses a recording read)."""
    return [as_cupy(cp, x) for x in xs]


def fast_quantized(be, a, b, mdt, out_dtype: str, scale_rounding: str):
    """fp8/MX ``a @ b`` of contiguous 2-D float device arrays (both torch CUDA tensors or both CuPy arrays).
    Once per (device, stream, dtypes, shapes, alignment, dtype, out_dtype, scale_rounding): quantize with
    :func:`~mxcore.backends.codec.recording` on, build the plan over the quantized objects (staging re-run
    by ``prep()``), keep both.  Later calls replay the quantization into the same buffers with the new input
    addresses, re-stage (by replaying the staging's recorded launches where :func:`_replayable` shows they make every
    buffer the GEMM reads, else through ``prep()``), and launch the GEMM into a new output: no Python-side
    quantization objects, no plan.
    The kept buffers are reused in stream order (the key holds the stream)."""
    ka = array_kind(a)
    if ka != array_kind(b) or ka not in ("torch", "cupy") or mdt.kind not in ("fp8", "mx"):
        return None
    if len(a.shape) != 2 or len(b.shape) != 2:
        return None
    if ka == "torch":
        if (a.device.type != "cuda" or b.device != a.device or a.requires_grad or b.requires_grad
                or not a.is_contiguous() or not b.is_contiguous()):
            return None
        import torch

        names = (str(a.dtype), str(b.dtype))
        pa, pb, ordinal = a.data_ptr(), b.data_ptr(), a.device.index
        stream_h = torch_stream(torch, a.device.index)
    else:
        if a.device.id != b.device.id or not a.flags.c_contiguous or not b.flags.c_contiguous:
            return None
        names = (a.dtype.name, b.dtype.name)
        pa, pb, ordinal = a.data.ptr, b.data.ptr, a.device.id
        stream_h = be.cp_module.cuda.get_current_stream().ptr
    if any(n.replace("torch.", "") not in ("float16", "bfloat16", "float32") for n in names):
        return None
    key = ("q", ka, ordinal, stream_h, names, tuple(a.shape), tuple(b.shape), pa % 16, pb % 16, mdt.name,
           out_dtype, scale_rounding)
    entry = be._fast.get(key)
    cp = be.cp_module
    if entry is None:
        if len(be._fast) > 256:
            be._fast.clear()
        from mxcore.backends import codec

        with cp.cuda.Device(ordinal):
            with codec.recording() as rec:
                qa = quantize_on_device(a, mdt.a, "a", scale_rounding)
                qb = quantize_on_device(b, mdt.b, "b", scale_rounding, b_order=be.b_code_order)
            with codec.recording() as rec_stage:  # the plan's staging (its launches and zeroings)
                p = be.plan(qa, qb, mdt, out_dtype=out_dtype, scale_rounding=scale_rounding, _restage=True)
            p.gemm()
            result = p.result()
            entry = False
            # replayable only if every device buffer of the quantized operands lies in an array of a recorded step
            # (a copy made outside the codec's launches would be left stale by a replay)
            if (_replayable(_quantized_buffers(qa, qb), rec) and isinstance(p, CudaPlan) and p.batch is None
                    and p._fold is None and pa != pb):
                try:
                    entry = (rec.replay(_device_views(cp, a, b)), p, None)
                except UnsupportedError:  # an operand was copied before quantization: no replay
                    entry = False
            # the staging replays too when it made no copy of its own and every buffer the GEMM reads was written
            # (or zeroed) by a recorded step: then later calls stage nothing in Python and keep the plan's buffers
            if entry and _replayable(_plan_buffers(p), rec, rec_stage):
                entry = (entry[0], p, rec_stage.replay(()))
            be._fast[key] = entry
        return result
    if entry is False:
        return None
    replay, p, restage = entry
    with cp.cuda.Device(ordinal), p.stream:
        replay((pa, pb))
        if restage is None:
            da, db = p._prep()  # staged again from the kept quantized buffers (copies go to new buffers)
        else:
            restage()  # the staging's recorded launches, into the plan's own buffers
        if ka == "torch":
            import torch

            out = torch.empty(tuple(p.out.shape), dtype=_TORCH_OUT[out_dtype], device=a.device)
        else:
            out = cp.empty(p.out.shape, dtype=p.out.dtype)
        view = unowned_view(cp, out)  # the plan must not keep this result alive until the next call
        if restage is None:
            p.rebind(da, db, view)  # every staged part as prep() made it again (codes, MX factors, scales)
        elif int(view.data.ptr) != int(p.out.data.ptr):  # the allocator often hands back the last result's block
            p.rebind(out=view)
        p._gemm() if type(p) is CudaPlan else p.gemm()
    return out


def fast_call(be, a, b, mdt, out_dtype: str):
    """fp16/bf16 device operands the kernel reads in place: the plan is built once per layout (device, dtypes,
    shapes, strides, 16-byte alignment, output dtype) and later calls only allocate the output and launch it
    with the new addresses.  None when the operands do not qualify (the caller builds a plan)."""
    ka, kb = array_kind(a), array_kind(b)
    if ka != kb or ka not in ("torch", "cupy") or mdt.a.name not in ("fp16", "bf16"):
        return None
    if ka == "torch":
        if a.device.type != "cuda" or b.device.type != "cuda" or a.requires_grad or b.requires_grad:
            return None
        pa, pb = a.data_ptr(), b.data_ptr()
        key = (ka, a.device.index, b.device.index, a.dtype, b.dtype, tuple(a.shape), tuple(b.shape), a.stride(),
               b.stride(), pa % 16, pb % 16, mdt.a.name, out_dtype)
    else:
        pa, pb = a.data.ptr, b.data.ptr
        key = (ka, a.device.id, b.device.id, a.dtype, b.dtype, a.shape, b.shape, a.strides, b.strides, pa % 16,
               pb % 16, mdt.a.name, out_dtype)
    entry = be._fast.get(key)
    if entry is None:
        if len(be._fast) > 256:
            be._fast.clear()
        p = be.plan(a, b, mdt, out_dtype=out_dtype)
        p.gemm()
        result = p.result()
        entry = False
        if type(p) is CudaPlan and p.da.direct and p.db.direct and p._launch is not None:
            with be.cp_module.cuda.Device(p.dev.ordinal):  # the kernel handles of the plan's device
                entry = (p.launcher(), p.dev.ordinal, p._fold or tuple(p.out.shape), p.out.dtype)
        be._fast[key] = entry
        return result
    if entry is False:
        return None
    launch, ordinal, shape, store = entry
    cp = be.cp_module
    if cp.cuda.runtime.getDevice() != ordinal:
        return None
    if ka == "torch":
        import torch

        dev = a.device
        stream = torch_stream(torch, dev.index)
        out = torch.empty(shape, dtype=_TORCH_OUT[out_dtype], device=dev)
        ws = torch.empty(launch.ws_bytes, dtype=torch.uint8, device=dev) if launch.ws_bytes else None
        launch(cp.cuda.driver, stream, pa, pb, out.data_ptr(), ws.data_ptr() if ws is not None else 0)
        return out
    stream = cp.cuda.get_current_stream()
    out = cp.empty(shape, dtype=store)
    ws = cp.empty(launch.ws_bytes, dtype=cp.uint8) if launch.ws_bytes else None
    launch(cp.cuda.driver, stream.ptr, pa, pb, out.data.ptr, ws.data.ptr if ws is not None else 0)
    return out
