"""The CUDA backend's per-call fast paths (``Backend.fast_matmul`` and the fp16/bf16 shortcut of ``matmul``).

* :func:`fast_call` — fp16/bf16 device operands the kernel reads in place: the plan is built once per layout and
  later calls only allocate the output and relaunch it (:class:`~.plan.Relaunch`) with the new addresses (wgmma:
  the kept plan, its operand maps encoded for the new addresses).
* :func:`fast_quantized` — fp8/MX products of contiguous (or transposed) float device arrays: the first call of a
  layout runs the codec and the plan's staging under :func:`~mxcore.backends.codec.recording` and keeps the plan;
  later calls replay the recorded quantization (and the staging, where it covers every buffer the GEMM reads; else
  they stage again and :meth:`~.plan.CudaPlan.rebind` the operands) and launch into a new output.

* :func:`fast_weight` — float device activations times a weight quantized once (fp8, MX, weight-only pairs).
* :func:`fast_pair` — two operands quantized once (device MXTensors / ScaledTensors): the kept plan pointed at the
  call's staged operands.

All keep their entries in the backend's ``_fast`` cache (callcache.py: per layout and stream, bounded in bytes;
False: the layout does not qualify).  A capture may take a layout's entry made on another stream (the documented
torch recipe: warm up on a side stream, then capture), and the graph keeps what it used alive; a layout's first
call under capture, and any plan or codec call, refuse capture with a typed error (:func:`~.device.refuse_capture`).
Callers hold the cache's lock (``CudaBackend.fast_matmul``): kept buffers are written by one call at a time.
"""

from __future__ import annotations

import weakref
from dataclasses import replace

from mxcore.arrays import array_kind
from mxcore.dtypes import WONLY_KIND
from mxcore.errors import UnsupportedError
from mxcore.operands import quantize_on_device

from .device import (address_of, as_cupy, element_strides, ensure_context, keep_for_graph, ordinal_of,
                     refuse_capture, stream_for, torch_stream, unowned_view)
from .plan import CudaPlan
from .quantized import (bound_plan, quantized_buffers, quantized_on, same_form, staged_key, staged_on,
                        staged_weight, swap_weight, weight_cache)
from .stage import versions

__all__ = ["fast_call", "fast_pair", "fast_quantized", "fast_weight"]

_TORCH_OUT_NAMES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


class _TorchOut(dict):
    def __missing__(self, key):
        import torch

        self[key] = getattr(torch, _TORCH_OUT_NAMES[key])
        return self[key]


_TORCH_OUT = _TorchOut()


class _TorchNames(dict):
    """torch dtype -> its name without the "torch." prefix (str() of a dtype costs more than this lookup)."""

    def __missing__(self, key):
        self[key] = str(key).replace("torch.", "")
        return self[key]


_TORCH_NAMES = _TorchNames()


def _operand_buffers(d) -> list:
    """The device arrays a GEMM reads from one staged operand (codes, MX factors and flags, device scale exponent;
    for mx_lo_fix the lost-bit lists and the elements transposed)."""
    out = [d.buf, d.exp_at]
    if d.mx is not None:
        f = d.mx
        out += [f.factors, f.info, f.nan, f.folded, f.lo_cnt, f.lo_ent, f.lo_elt]
    return [x for x in out if x is not None]


def _plan_buffers(p) -> list:
    """The device arrays a plan's GEMM reads from its staged operands."""
    return _operand_buffers(p.da) + _operand_buffers(p.db)


def _span(x) -> tuple:
    """(start, end) device addresses of a torch CUDA tensor or CuPy array."""
    lo = address_of(x)
    return (lo, lo + (x.numel() * x.element_size() if hasattr(x, "element_size") else int(x.nbytes)))


def _covered(arrays, spans) -> bool:
    """Every array's first byte lies in one of ``spans`` (device address ranges of recorded arrays)."""
    return all(any(lo <= q < hi for lo, hi in spans) for q in map(address_of, arrays))


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


_torch = None  # the torch module, once a torch operand was seen (a per-call import costs a dict lookup and more)


def _torch_module():
    global _torch
    if _torch is None:
        import torch

        _torch = torch
    return _torch


def _float_device(be, x, rows: bool = False, transposed: bool = False):
    """(kind, dtype name, address, ordinal, stream handle) of a C-contiguous 2-D float16/bfloat16/float32 device
    array (a torch CUDA tensor that autograd does not record, or a CuPy array; the stream: torch's / CuPy's current
    one), else None.  ``rows``: a C-contiguous 3-D array (B, T, K) is taken too, as the B T rows it holds;
    ``transposed``: the transpose of a C-contiguous 2-D array too (``W.t()``; the caller keys the layout)."""
    kind = array_kind(x)
    if kind == "torch":
        if not x.is_cuda or (x.requires_grad and (_torch or _torch_module()).is_grad_enabled()):
            return None  # (below the differentiable op, grad mode is off: its inputs may still require grad)
        nd = x.dim()
        if not x.is_contiguous() and not (transposed and nd == 2 and x.stride() == (1, x.shape[0])):
            return None
        if nd != 2 and not (rows and nd == 3):
            return None
        ordinal = x.get_device()
        name, ptr = _TORCH_NAMES[x.dtype], x.data_ptr()
        stream_h = torch_stream(_torch or _torch_module(), ordinal)
    elif kind == "cupy":
        if not (x.ndim == 2 or (rows and x.ndim == 3)):
            return None
        if not x.flags.c_contiguous and not (transposed and x.ndim == 2 and x.flags.f_contiguous):
            return None
        name, ptr, ordinal, stream_h = x.dtype.name, x.data.ptr, x.device.id, be.cp_module.cuda.get_current_stream().ptr
    else:
        return None
    return (kind, name, ptr, ordinal, stream_h) if name in ("float16", "bfloat16", "float32") else None


def dense_rows(be, x, dims=(2, 3)):
    """``x`` itself, or, for a float16/bfloat16/float32 device array of ``dims`` dimensions that is not C-contiguous
    (a view of some columns of a wider array: q of a fused q/k/v output, a slice of a batch), a C-contiguous copy
    made on the caller's stream: the quantized paths read activations as dense rows, and a copy (one launch) keeps
    such a call on the per-call path, capturable, instead of planning it anew each call.  Under CuPy stream capture
    the copy lives as long as the graph; torch's allocator keeps it for a torch capture."""
    kind = array_kind(x)
    if kind == "torch":
        if (x.is_contiguous() or not x.is_cuda or x.dim() not in dims
                or _TORCH_NAMES[x.dtype] not in ("float16", "bfloat16", "float32")
                or (x.dim() == 2 and x.stride() == (1, x.shape[0]))  # a transpose: read as such
                or (x.requires_grad and (_torch or _torch_module()).is_grad_enabled())):
            return x
        return x.contiguous()
    if kind == "cupy" and x.ndim in dims and not x.flags.c_contiguous and x.dtype.name in (
            "float16", "float32") and not (x.ndim == 2 and x.flags.f_contiguous):
        cp = be.cp_module
        with cp.cuda.Device(x.device.id):
            y = cp.ascontiguousarray(x)
            keep_for_graph(cp.cuda.get_current_stream().ptr, y)
        return y
    return x


def fast_quantized(be, a, b, mdt, out_dtype: str, scale_rounding: str):
    """fp8/MX ``a @ b`` of contiguous 2-D float device arrays, or transposes of such (both torch CUDA tensors or both
    CuPy arrays; a transposed operand is quantized in place, ``codec.quantize_mx``).
    Once per (device, stream, dtypes, shapes, alignment, dtype, out_dtype, scale_rounding): quantize with
    :func:`~mxcore.backends.codec.recording` on, build the plan over the quantized objects (staging re-run
    by ``prep()``), keep both.  Later calls replay the quantization into the same buffers with the new input
    addresses, re-stage (by replaying the staging's recorded launches where :func:`_replayable` shows they make every
    buffer the GEMM reads, else through ``prep()``), and launch the GEMM into a new output: no Python-side
    quantization objects, no plan.
    The kept buffers are reused in stream order (the key holds the stream)."""
    if mdt.kind not in ("fp8", "mx"):
        return None
    a, b = dense_rows(be, a, (2,)), dense_rows(be, b, (2,))
    fa, fb = _float_device(be, a, transposed=True), _float_device(be, b, transposed=True)
    if fa is None or fb is None:
        return None
    (ka, name_a, pa, ordinal, stream_h), (kb, name_b, pb, ordinal_b, _) = fa, fb
    if kb != ka or ordinal_b != ordinal:
        return None
    names = (name_a, name_b)
    key = ("q", ka, ordinal, stream_h, names, tuple(a.shape), tuple(b.shape), element_strides(a), element_strides(b), pa % 16,
           pb % 16, mdt.name, out_dtype, scale_rounding)
    cp = be.cp_module
    ensure_context(cp, ordinal)
    entry = be._fast.entry(key, cp, stream_h)
    if entry is None:
        refuse_capture(cp, stream_h, "a layout's first call (quantization recorded, plan built)")
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
            if (_replayable(quantized_buffers(qa, qb), rec) and isinstance(p, CudaPlan) and p.batch is None
                    and p._fold is None and pa != pb):
                try:
                    entry = (rec.replay(_device_views(cp, a, b)), p, None)
                except UnsupportedError:  # an operand was copied before quantization: no replay
                    entry = False
            # the staging replays too when it made no copy of its own and every buffer the GEMM reads was written
            # (or zeroed) by a recorded step: then later calls stage nothing in Python and keep the plan's buffers
            if entry and _replayable(_plan_buffers(p), rec, rec_stage):
                entry = (entry[0], p, rec_stage.replay(()))
            if entry:
                _no_result(cp, p)
            be._fast[key] = entry
        return result
    if entry is False:
        return None
    return _replayed(be, entry, (pa, pb), a)


def _replayed(be, entry, ptrs, a):
    """One later call of a kept (quantization replay, plan, staging replay or None) entry: the quantization
    replayed from the inputs at ``ptrs``, the staging replayed (or re-run by ``prep()``), the GEMM launched into a
    new output of ``a``'s kind."""
    replay, p, restage = entry
    cp = be.cp_module
    with cp.cuda.Device(p.dev.ordinal), p.stream:
        if restage is None:  # prep() allocates the staged operands anew: not in a CUDA graph
            refuse_capture(cp, p.stream.ptr, "this layout's staging (not replayable: it makes copies)")
        replay(ptrs)
        if restage is None:
            da, db = p._prep()  # staged again from the kept quantized buffers (copies go to new buffers)
        else:
            restage()  # the staging's recorded launches, into the plan's own buffers
        out = _new_out(cp, p, a)
        # the plan must not keep this result alive until the next call: it holds an unowned view of it
        if restage is None:
            p.rebind(da, db, unowned_view(cp, out))  # every staged part as prep() made it again (codes, MX factors)
        else:
            _retarget(cp, p, out)
        p._gemm() if type(p) is CudaPlan else p.gemm()
    return out


def _retarget(cp, p, out) -> None:
    """Point plan ``p`` at a new output ``out`` (an unowned view: the plan must not keep the caller's result alive
    until the next call), unless the allocator handed back the block it already writes (it often does)."""
    if address_of(out) != int(p.out.data.ptr):
        p.rebind(out=unowned_view(cp, out))


def _kept(cp, p, *direct) -> None:
    """Make plan ``p`` fit to be kept across calls without holding the caller's arrays alive: its staging and
    result callables dropped (they hold the operands), its output and the direct operands named in ``direct``
    (``"da"``, ``"db"``) as unowned views (their layout stays; a call passes the addresses)."""
    for name in direct:
        d = getattr(p, name)
        setattr(p, name, replace(d, buf=unowned_view(cp, d.buf)))
    _no_result(cp, p)
    p._prep = None


def _no_result(cp, p) -> None:
    """A plan kept for replays holds neither this call's result (its output becomes an unowned view) nor the
    callable that wraps it: the caller's result is freed when the caller drops it (a CUDA graph pool's warm-up, as
    torch.compile's cudagraph trees run it, refuses a live tensor it did not return)."""
    view = unowned_view(cp, p.out)
    if isinstance(p, CudaPlan):  # its packed launch arguments hold the output too: packed again around the view
        p.rebind(out=view)
    else:
        p.out = view
    p._like = None


def _new_out(cp, p, a, shape=None):
    """An uninitialised output like the plan's (of ``shape`` where given), of ``a``'s kind (a torch tensor on a's
    device, or CuPy)."""
    shape = p.out.shape if shape is None else shape
    if array_kind(a) == "torch":
        return a.new_empty(shape, dtype=_TORCH_OUT[p.out_dtype])
    return cp.empty(shape, dtype=p.out.dtype)


# ------------------------------------------------------------------------------------------------------------
# a weight quantized once: float device activations x a device MXTensor / ScaledTensor
# ------------------------------------------------------------------------------------------------------------


def fast_weight(be, a, b, mdt, out_dtype: str, scale_rounding: str):
    """``a @ b`` with ``a`` a contiguous 2-D float device array and ``b`` a weight quantized once (a device
    MXTensor / ScaledTensor; fp8, MX, or a weight-only pair such as bf16 x mxfp4): the linear-layer call.
    One entry per layout (device, stream, A's dtype, shape and alignment, the weight's kind, format, shape and
    blocking axis, dtype, output), shared by every weight of that layout (the layers of a model): a weight's first
    call runs the generic path, which stages it once (cached on the weight); the layout's first call with a staged
    weight records A's quantization and staging and keeps the plan when both replay; later calls replay them, take
    the plan bound to this call's weight (:func:`~.quantized.bound_plan`: made once per weight) and launch into a new output.
    A weight-only pair whose activations the kernel reads in place keeps the plan's packed launch and sets B's, A's
    and the output's addresses per call (registers path), or the staged path's bf16 GEMM launched at A's and the
    staged weight's addresses (:meth:`~.plan.CudaPlan.launch_at`).  The entry holds no weight and no activations
    (the bound plans hold their weights' staged buffers, dropped when a weight is collected).  A kept layout checks
    a weight by its staged form alone (cached on it under the plan's key: staged on this GPU as a B operand, which
    the first call checked), not buffer by buffer (:func:`~.quantized.quantized_on`, ~5 us)."""
    kind = mdt.kind
    a = dense_rows(be, a, (2, 3) if kind == WONLY_KIND else (2,))
    fa = _float_device(be, a, kind == WONLY_KIND)  # weight-only: (B, T, K) activations are B T rows
    if fa is None or kind not in ("fp8", "mx", WONLY_KIND):
        return None
    ka, name, pa, ordinal, stream_h = fa
    # (a torch.Size hashes and compares as the tuple of its sizes: no tuple() per call)
    key = ("w", ka, ordinal, stream_h, name, a.shape, pa % 16, type(b).__name__, b.fmt, b.shape, mdt.name,
           out_dtype, scale_rounding, getattr(b, "axis", 0))
    cp = be.cp_module
    ensure_context(cp, ordinal)
    cache = be._fast
    entry = cache.entry(key, cp, stream_h)
    if type(entry) is tuple:  # a kept layout: the weight's staged form under the plan's key says it was checked
        p, wkey = entry[1], entry[-1]
        if entry[0] == "wonly" and cp.cuda.runtime.getDevice() == ordinal:
            # (staged form, its address, versions): bound once per weight and version (_bind_weight)
            hit = p.__dict__.get("_binds", _NO_BINDS).get(id(b))
            if hit is None or hit[2] != versions(b):
                hit = _bind_weight(p, b, ordinal, wkey)
                if hit is None:
                    return None  # not staged yet, or another staged form: the generic path
            staged = hit[0]
            if cache.capturing:  # the graph keeps the weight's staged form (the layout's entry: the cache)
                keep_for_graph(stream_h, staged)
            p.db = staged
            if ka == "torch":  # (entry[2]: the output's shape, (B, T, N) for (B, T, K) activations)
                out = a.new_empty(entry[2], dtype=_TORCH_OUT[p.out_dtype])
                p.launch(stream_h, hit[1], pa, out.data_ptr())  # (the layout's stream)
            else:
                out = cp.empty(entry[2], dtype=p.out.dtype)
                p.launch(stream_h, hit[1], pa, out.data.ptr)
            return out
        staged = staged_weight(b, ordinal, wkey)  # (staged on GPU ordinal as B: a 2-D weight blocked along K)
        if staged is None:
            return None  # not staged yet: the generic path stages it (cached on the weight)
        if be._fast.capturing:  # the graph keeps the weight's staged form (the layout's entry: the cache)
            keep_for_graph(stream_h, staged)
        with cp.cuda.Device(ordinal):
            if entry[0] not in ("wonly", "direct"):  # the plan bound to this weight (operand maps, packed launches)
                q = bound_plan(entry[3], (b,), p, db=staged)
                if q is None:
                    return None  # another staged form: the generic path
                return _replayed(be, (entry[0], q, entry[2]), (pa,), a)
            if not swap_weight(p, staged):
                return None  # another staged form: the generic path
            if entry[0] == "wonly":
                out = _new_out(cp, p, a, entry[2])
                p.launch(stream_h, int(staged.buf.data.ptr), pa, address_of(out))  # (the layout's stream)
                return out
            if entry[0] == "direct":  # the staged path's GEMM: A read in place, the weight decoded once
                out = _new_out(cp, p, a)
                p.launch_at(pa, int(staged.buf.data.ptr), out)
                return out
    if entry is False or not quantized_on(b, ordinal):
        return None
    refuse_capture(cp, stream_h, "a layout's first call with a weight quantized once (staging, recording)")
    return _keep_weight(be, key, a, b, mdt, out_dtype, scale_rounding, pa)


_NO_BINDS: dict = {}


def _bind_weight(p, b, ordinal: int, wkey):
    """Bind weight ``b`` to the kept weight-only plan ``p`` (``fast_weight`` found no binding for its current version
    counters): what ``swap_weight`` checks (the same form, a kernel that takes it) is checked once per weight and
    version and kept on the plan (``p._binds``), keyed by the weight's id (dropped when the weight is collected), as
    (staged form, its address, version counters); a weight changed in place is staged again.  Returns that binding,
    or None: not staged, or staged in a form the plan does not take."""
    binds = p.__dict__.get("_binds")
    if binds is None:
        binds = p.__dict__["_binds"] = {}
    staged = staged_weight(b, ordinal, wkey)
    if staged is None or not (staged is p.db or (same_form(staged, p.db) and p.takes(staged))):
        return None
    if id(b) not in binds:
        weakref.finalize(b, binds.pop, id(b), None)
    hit = binds[id(b)] = (staged, int(staged.buf.data.ptr), versions(b))
    return hit


def _keep_weight(be, key, a, b, mdt, out_dtype: str, scale_rounding: str, pa: int):
    """The layout's first call with a staged weight: run it, recording what a replay needs; keep the entry."""
    from mxcore.backends import codec

    from .sm90 import Sm90Plan
    from .wonly.plan import WonlyPlan

    cp = be.cp_module
    be._fast[key] = False
    with cp.cuda.Device(ordinal_of(b)):
        if mdt.kind == WONLY_KIND:  # the activations are read as they are (or rounded once by the staging)
            shape = tuple(a.shape)
            if len(shape) == 3:  # (B, T, K) activations: planned as their B T rows, the output shaped (B, T, N)
                a = a.reshape(shape[0] * shape[1], shape[2])
            p = be.plan(a, b, mdt, out_dtype=out_dtype, scale_rounding=scale_rounding)  # stages B (cached on it)
            p.gemm()
            result = p.result()
            if len(shape) == 3:
                result = result.reshape(shape[0], shape[1], result.shape[-1])
            wkey = staged_key(weight_cache(b), p.db)
            if not (p._fold is None and p.da.direct and int(p.da.buf.data.ptr) == pa and wkey is not None):
                return result
            if isinstance(p, WonlyPlan) and p._launch is not None:  # registers: the packed launch
                kind = "wonly"
            elif type(p) in (CudaPlan, Sm90Plan) and p.batch is None and p.out.size and len(shape) == 2:
                kind = "direct"  # staged: the bf16 GEMM
            else:
                return result
            _kept(cp, p, "da")  # a call passes A's and the output's addresses (launch slots, or launch_at)
            be._fast[key] = (kind, p, shape[:-1] + (p.out.shape[-1],), wkey)
            return result
        with codec.recording() as rec:
            qa = quantize_on_device(a, mdt.a, "a", scale_rounding)
        if not staged_weight(b, ordinal_of(b)):  # B's staging (cached on it) stays out of the recorded A staging
            be.plan(qa, b, mdt, out_dtype=out_dtype, scale_rounding=scale_rounding)
        before = weight_cache(b)  # a replay must not redo (or hold) a weight's staging: it was made before
        with codec.recording() as rec_stage:  # A's staging (the weight's is cached on it: no launch)
            p = be.plan(qa, b, mdt, out_dtype=out_dtype, scale_rounding=scale_rounding, _restage="a")
        p.gemm()
        result = p.result()
        wkey = staged_key(before, p.db)
        if not (isinstance(p, CudaPlan) and p.batch is None and p._fold is None and wkey is not None
                and _replayable(quantized_buffers(qa), rec)):
            return result
        try:
            replay = rec.replay(_device_views(cp, a))
        except UnsupportedError:
            return result
        # A's staging must replay (no prep() per call: the staging callable holds the weight, and the entry must
        # not keep it alive); the weights' staged buffers stay as they are (cached on them, rewritten by nothing)
        weight = [_span(x) for x in _operand_buffers(p.db)]
        if _replayable(_plan_buffers(p), rec, rec_stage, extra=weight):
            p._prep = None
            _no_result(cp, p)
            be._fast[key] = (replay, p, rec_stage.replay(()), {}, wkey)
    return result


def fast_pair(be, a, b, mdt, out_dtype: str, scale_rounding: str):
    """``a @ b`` of two operands quantized once (2-D device MXTensors blocked along K / ScaledTensors on one GPU;
    fp8 or MX): "quantize once, multiply many times" without a plan per call.  One entry per layout (device,
    stream, each operand's kind, format and shape, dtype, output).  An operand's first call runs the generic path,
    which stages it once (cached on it); the layout's first call with both operands staged keeps its plan; later
    calls take the plan bound to this call's staged operands (cached on them under the plan's keys, the same form:
    :func:`~.quantized.same_form`; :func:`~.quantized.bound_plan`: made once per pair) and launch into a new output.  The entry holds
    neither operand (the bound plans hold their staged buffers, dropped when an operand is collected).  None: the
    generic path."""
    if mdt.kind not in ("fp8", "mx"):
        return None
    ordinal = ordinal_of(a)
    if ordinal is None or not (quantized_on(a, ordinal, 1) and quantized_on(b, ordinal, 0)):
        return None
    cp = be.cp_module
    with cp.cuda.Device(ordinal):
        stream_h = stream_for(cp, a, b).ptr
    key = ("qq", ordinal, stream_h, type(a).__name__, a.fmt, tuple(a.shape), type(b).__name__, b.fmt,
           tuple(b.shape), mdt.name, out_dtype, scale_rounding)
    ensure_context(cp, ordinal)
    entry = be._fast.entry(key, cp, stream_h)
    if type(entry) is tuple:
        p, akey, bkey, bound = entry
        da, db = staged_weight(a, ordinal, akey), staged_weight(b, ordinal, bkey)
        if not da or not db:
            return None  # an operand not staged yet: the generic path stages it (cached on it)
        if be._fast.capturing:
            keep_for_graph(stream_h, da, db)
        with cp.cuda.Device(ordinal):
            q = bound_plan(bound, (a, b), p, da, db)  # the plan bound to this pair (made once per pair)
            if q is None:
                return None  # staged in another form: the generic path
            out = _new_out(cp, q, a.codes)  # the codes' kind of array (torch: on torch's allocator and stream)
            _retarget(cp, q, out)
            q.gemm()
        return out
    if entry is False or not (staged_on(a, ordinal, "a") and staged_on(b, ordinal, "b")):
        return None  # an operand's first call: the generic path stages it (cached on it)
    refuse_capture(cp, stream_h, "a layout's first call with two operands quantized once (the plan)")
    before_a, before_b = weight_cache(a), weight_cache(b)
    p = be.plan(a, b, mdt, out_dtype=out_dtype, scale_rounding=scale_rounding)
    p.gemm()
    result = p.result()
    from .sm90 import Sm90Plan

    if not (type(p) in (CudaPlan, Sm90Plan) and p.batch is None and p._fold is None and p.out.size):
        be._fast[key] = False  # a plan this path does not keep: the generic path from now on
        return result
    akey, bkey = staged_key(before_a, p.da), staged_key(before_b, p.db)
    if akey is not None and bkey is not None:  # else the plan staged one itself (another path's form was
        _kept(cp, p)                            # cached): it is cached now, the next call keeps the plan
        be._fast[key] = (p, akey, bkey, {})
    return result


def fast_call(be, a, b, mdt, out_dtype: str):
    """fp16/bf16 device operands the kernel reads in place: the plan is built once per layout (device, stream,
    dtypes, shapes, strides, 16-byte alignment, output dtype) and later calls only allocate the output and launch
    with the new addresses (mma.sync: the packed :class:`~.plan.Relaunch`; wgmma, 2-D: the kept plan with its two
    operand maps encoded again, :meth:`~.sm90.Sm90Plan.readdress`).  None when the operands do not qualify (the
    caller builds a plan)."""
    ka, kb = array_kind(a), array_kind(b)
    elem = mdt.a.name
    if ka != kb or ka not in ("torch", "cupy") or elem not in ("fp16", "bf16"):
        return None
    cp = be.cp_module
    if ka == "torch":
        torch = _torch_module()
        if not (a.is_cuda and b.is_cuda) or ((a.requires_grad or b.requires_grad) and torch.is_grad_enabled()):
            return None
        want = torch.float16 if elem == "fp16" else torch.bfloat16
        if a.dtype != want or b.dtype != want:  # rounded once by torch (RNE, as mxcore's staging rounds): read in place
            if not (a.dtype.is_floating_point and b.dtype.is_floating_point) or torch.float64 in (a.dtype, b.dtype):
                return None
            a, b = a.to(want), b.to(want)

        pa, pb, ordinal = a.data_ptr(), b.data_ptr(), a.get_device()
        stream = torch_stream(torch, ordinal)
        key = (ka, ordinal, b.get_device(), stream, a.dtype, b.dtype, a.shape, b.shape, a.stride(), b.stride(),
               pa % 16, pb % 16, elem, out_dtype)
    else:
        pa, pb, ordinal = a.data.ptr, b.data.ptr, a.device.id
        stream = cp.cuda.get_current_stream().ptr
        key = (ka, ordinal, b.device.id, stream, a.dtype, b.dtype, a.shape, b.shape, a.strides, b.strides, pa % 16,
               pb % 16, mdt.a.name, out_dtype)
    ensure_context(cp, ordinal)
    entry = be._fast.entry(key, cp, stream)
    if entry is None:
        p = be.plan(a, b, mdt, out_dtype=out_dtype)
        p.gemm()
        result = p.result()
        be._fast[key] = _call_entry(cp, p, a)
        return result
    if entry is False:
        return None
    if cp.cuda.runtime.getDevice() != ordinal:
        return None
    kind, launch, shape, store = entry
    if ka == "torch":
        out = a.new_empty(shape, dtype=_TORCH_OUT[out_dtype])
        po = out.data_ptr()
    else:
        out = cp.empty(shape, dtype=store)
        po = out.data.ptr
    if kind == "sm90":  # the kept plan (its workspace and counters: the key holds the stream)
        launch.launch_at(pa, pb, out)
        return out
    if launch.ws_bytes:  # the split-K partials: a new buffer of the caller's kind per call
        ws = torch.empty(launch.ws_bytes, dtype=torch.uint8, device=a.device) if ka == "torch" else \
            cp.empty(launch.ws_bytes, dtype=cp.uint8)
        if ka == "cupy" and be._fast.capturing:  # CuPy's pool would reuse it while the graph still writes it
            keep_for_graph(stream, ws)
        launch(cp.cuda.driver, stream, pa, pb, po, address_of(ws))
    else:
        launch(cp.cuda.driver, stream, pa, pb, po)
    return out


def _call_entry(cp, p, a):
    """What a later call of ``fast_call``'s layout needs, or False (it builds a plan each time): ("relaunch",
    Relaunch, output shape, storage dtype) for an mma.sync plan, ("sm90", the plan, ...) for a 2-D wgmma plan —
    which then holds unowned views only (neither this call's operands nor its result stay alive)."""
    from .sm90 import Sm90Plan

    if not (p.da.direct and p.db.direct and p.out.size and p.da.k):
        return False
    with cp.cuda.Device(p.dev.ordinal):  # the kernel handles of the plan's device
        if type(p) is CudaPlan and p._launch is not None:
            return ("relaunch", p.launcher(), p._fold or tuple(p.out.shape), p.out.dtype)
        if type(p) is Sm90Plan and p.batch is None and p._fold is None and p.out.ndim == 2:
            _kept(cp, p, "da", "db")
            return ("sm90", p, tuple(p.out.shape), p.out.dtype)
    return False
