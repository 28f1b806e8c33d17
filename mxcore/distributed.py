"""Tensor-parallel ``matmul`` over ``torch.distributed`` (NCCL on GPUs, gloo on the CPU) with quantized communication.

``matmul(a_local, b_local, dtype, layout=...)`` runs one sharded linear layer; every rank of the group calls it.

* ``layout="column"`` (column-parallel): rank r holds a row shard of the activations, A_r (M_local × K), and a column
  shard of the weight, B_r (K × N_r).  A is quantized ONCE on its owner (fp8: per-tensor codes; MX: element codes,
  packed two fp4 per byte / four fp6 per three bytes, plus E8M0 scales; fp16/bf16: the 16-bit values) and the
  bytes are all-gathered in ``chunks`` row chunks: chunk i+1 is in flight while chunk i is multiplied (torch's
  async work handles: NCCL runs them on its own stream).  Each rank returns its output columns, (M × N_r) with
  M = world · M_local, rows in rank order.  MX blocks run along K, so gathering rows moves whole blocks.  On CUDA
  with float torch inputs the per-call program of :mod:`mxcore.backends.cuda.tp` runs it instead (this rank's rows
  first, beside the all-gather; recorded on the first call of a layout and replayed after; ``stats["path"]``).
* ``layout="row"`` (row-parallel): K is sharded, A_r (M × K_r), B_r (K_r × N).  Each rank computes its partial
  product in ``reduce_dtype`` (float32, or bfloat16 to halve the traffic) chunk by chunk over the output rows and
  reduces it while the next chunk is computed: ``reduce="all_reduce"`` returns the full (M × N) on every rank,
  ``reduce="reduce_scatter"`` returns rank r's rows [r·M/world, (r+1)·M/world).  MX shards must hold whole blocks:
  every rank's K_r but the last is a multiple of 32.

Numerics: the result equals ``mxcore.matmul`` on the gathered operands (column: ``matmul(A, B)[:, columns of r]``;
row: ``matmul(A, B)``), bit for bit whenever the GEMM itself is exact (the reference backend; exactly
representable inputs on a GPU; row-parallel also needs the fp32 partial sums to be exact, as the reduction order
differs).  Per-tensor fp8 makes that hold with ONE global scale per operand: before quantizing, the ranks
all-reduce (max) the finite amax of their shards of A and of B (one 2-element collective), and each shard is
quantized by :func:`mxcore.quantize_tensor` with ``amax=`` that global amax (so the scale is the full tensor's,
computed by the library's own rule).  All ranks then
hold the same scale and only codes travel.  The weight shard is quantized once per call, not per chunk; quantized
operands (an ``MXTensor`` for A with ``axis=1``, any ``MXTensor`` / ``ScaledTensor`` for B) are used as they
are — a ``ScaledTensor`` A is refused (its scale is local to the shard).

Errors: before any large collective, every rank all-gathers one small uint8 tensor that describes its call (layout,
dtype, out_dtype, shapes, input dtypes, options, and any local argument error); every rank checks the same table
and raises the same typed error (:class:`~mxcore.errors.ShapeError`, :class:`~mxcore.errors.InputTypeError`,
:class:`~mxcore.errors.UnsupportedError`), naming the ranks that disagree.  The check waits at most ``timeout``
seconds (a rank that never calls): :class:`~mxcore.errors.DeviceError`.  No initialised process group (or no
torch): :class:`~mxcore.errors.BackendUnavailableError`, raised locally on each rank that lacks it.

Communication volume: pass ``stats={}`` to receive ``payload_bytes`` (what this rank contributes to the large
collectives, summed over chunks, measured from the tensors handed to torch), ``bf16_bytes`` (the same operand as
bf16), ``ratio``, ``wire_bytes`` (the ring algorithm's bytes sent by this rank: (world-1)·payload for all-gather;
2·(world-1)/world·buffer for all-reduce; (world-1)/world·buffer for reduce-scatter), ``collectives`` and
``check_bytes`` (the shape check and amax).  Column-parallel A traffic is 0.5× bf16 for fp8, (1 + 1/32)/2 for
mxfp8 and (1/2 + 1/32)/2 for mxfp4 per element.

Only ``torch.distributed`` process groups are supported (CuPy's ``cupy.cuda.nccl`` communicator is not); inputs are
torch tensors (numpy arrays are taken as CPU tensors; CuPy arrays through DLPack).  2-D operands only.
"""

from __future__ import annotations


import numpy as np

from . import dtypes as _dt
from . import errors as _errors
from . import formats as _f
from .dtypes import MX_BLOCK
from .dist_comm import _Comm, _check_table, _describe, pack_codes, unpack_codes, wait
from .dist_comm import splits as _splits
from .errors import BackendUnavailableError, InputTypeError, MXCoreError, ShapeError, UnsupportedError

__all__ = ["LAYOUTS", "REDUCES", "REDUCE_DTYPES", "matmul"]

LAYOUTS = ("column", "row")
REDUCES = ("all_reduce", "reduce_scatter")
REDUCE_DTYPES = ("float32", "bfloat16")
_BF16_BYTES = _f.get("bf16").bits // 8


def _torch():
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        raise BackendUnavailableError("mxcore.distributed needs torch (pip install torch); torch is not "
                                      "installed") from exc
    if not dist.is_available():
        raise BackendUnavailableError("this torch build has no torch.distributed; install a build with it")
    return torch, dist


def _group_info(dist, group):
    if not dist.is_initialized():
        raise BackendUnavailableError(
            "torch.distributed is not initialised on this rank: call torch.distributed.init_process_group('nccl') "
            "(GPUs) or ('gloo') (CPU) first — torchrun --nproc-per-node N sets the environment it reads")
    try:
        world, rank, backend = dist.get_world_size(group), dist.get_rank(group), str(dist.get_backend(group))
    except (RuntimeError, ValueError) as exc:
        raise BackendUnavailableError(f"group {group!r} is not a usable process group on this rank: {exc}") from exc
    if rank < 0:
        raise BackendUnavailableError(f"this process (global rank {dist.get_rank()}) is not a member of group "
                                      f"{group!r}; call mxcore.distributed.matmul only on the group's ranks")
    return world, rank, backend


def _as_torch(torch, x):
    """Float inputs as torch tensors (numpy → CPU tensor; CuPy / DLPack → CUDA tensor); quantized pass."""
    from .arrays import array_kind

    kind = array_kind(x)
    if kind in ("torch", "mx"):
        return x
    if kind == "cupy" or hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
        return torch.from_dlpack(x)
    arr = np.asarray(x)
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(arr).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(arr))


def _device_of(torch, x):
    """The torch device of a shard (an MXTensor's / ScaledTensor's codes for quantized ones), None if unknown."""
    codes = getattr(x, "codes", x)
    if isinstance(codes, np.ndarray):
        return torch.device("cpu")
    dev = getattr(codes, "device", None)
    if isinstance(dev, torch.device):
        return dev
    if hasattr(dev, "id"):  # CuPy
        return torch.device("cuda", int(dev.id))
    return None


def _finite_amax(torch, x):
    """Largest finite |x| of a float tensor as a 0-d tensor of x's dtype on x's device (0 when none): exact, and
    never read back to the host (on a GPU: mxcore's one-kernel reduction for float16/bfloat16/float32)."""
    if x.numel() == 0:
        return torch.zeros((), dtype=x.dtype, device=x.device)
    if x.device.type == "cuda" and x.dtype in (torch.float16, torch.bfloat16, torch.float32):
        from .mx import _codec

        return _codec().finite_amax(x.detach())
    mag = x.detach().abs()
    mag = torch.where(torch.isfinite(mag), mag, torch.zeros((), dtype=mag.dtype, device=mag.device))
    return mag.max()


def _quantize_global(torch, x, fmt: str, amax):
    """Per-tensor quantization of shard ``x`` with the scale of the whole tensor: ``quantize_tensor(x, amax=)``
    with the global finite amax (a maximum over values of x's dtype, so exact in it)."""
    from . import mx

    if x.device.type == "cpu":
        return mx.quantize_tensor(_np_of(x.detach()), fmt, amax=float(amax))
    return mx.quantize_tensor(x.detach(), fmt, amax=amax)


def _np_of(t):
    from .arrays import to_numpy

    return to_numpy(t)


def _host(torch, t):
    """numpy for CPU tensors (the reference path takes numpy), the tensor itself on a GPU."""
    return _np_of(t) if t.device.type == "cpu" else t


def _to_torch_like(torch, result, device):
    from .arrays import like_input

    if isinstance(result, np.ndarray):
        return like_input(result, torch.empty(0, device=device))
    return result


_FLOAT_WIRE = {"fp16": "float16", "bf16": "bfloat16"}


def _prepare_a_column(torch, a, od, scale_rounding, amax):
    """A's shard as wire bytes (M_local, W) plus a function that rebuilds the GEMM operand from gathered rows."""
    from . import mx

    if od.kind == "mx":
        q = a if isinstance(a, mx.MXTensor) else mx.quantize_mx(_host(torch, a), od.name, axis=-1,
                                                                  scale_rounding=scale_rounding)
        bits, k = _f.get(q.element).bits, q.shape[1]
        codes = pack_codes(torch, q.codes, bits)
        scales = q.scales if not isinstance(q.scales, np.ndarray) else torch.from_numpy(q.scales)
        width = codes.shape[1]
        wire = torch.cat([codes, scales], dim=1).contiguous()

        def rebuild(g):
            return mx.MXTensor(unpack_codes(torch, g[:, :width].contiguous(), bits, k),
                               _host(torch, g[:, width:].contiguous()), q.fmt, 1, MX_BLOCK)
        return wire, rebuild
    if od.kind == "fp8":
        st = _quantize_global(torch, a, od.element, amax)
        codes = st.codes if not isinstance(st.codes, np.ndarray) else torch.from_numpy(st.codes)

        def rebuild(g):
            return mx.ScaledTensor(_host(torch, g), st.scale, st.fmt, st.scale_exp if st.device else None)
        return codes.contiguous(), rebuild
    wire_dt = getattr(torch, _FLOAT_WIRE.get(od.name, "float32"))
    t = a.detach().to(wire_dt).contiguous()
    k = t.shape[1]
    wire = t.view(torch.uint8).reshape(t.shape[0], -1)

    def rebuild(g):
        return _host(torch, g.contiguous().view(wire_dt).reshape(g.shape[0], k))
    return wire, rebuild


def _prepare_b(torch, b, od, scale_rounding, amax):
    """B (the weight shard) quantized once per call, in the form mxcore.matmul takes."""
    from . import mx

    if isinstance(b, (mx.MXTensor, mx.ScaledTensor)):
        return b
    if od.kind == "mx":
        return mx.quantize_mx(_host(torch, b), od.name, axis=0, scale_rounding=scale_rounding)
    if od.kind == "fp8":
        return _quantize_global(torch, b, od.element, amax)
    return _host(torch, b)


def _local_error(torch, a, b, layout, chunks, reduce, reduce_dtype):
    from . import mx

    if layout not in LAYOUTS:
        return UnsupportedError(f"layout={layout!r}; use one of {', '.join(LAYOUTS)}")
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        return UnsupportedError(f"chunks={chunks!r}; pass a positive integer (1: no overlap)")
    if layout == "row" and reduce not in REDUCES:
        return UnsupportedError(f"reduce={reduce!r}; use one of {', '.join(REDUCES)}")
    if layout == "row" and reduce_dtype not in REDUCE_DTYPES:
        return UnsupportedError(f"reduce_dtype={reduce_dtype!r}; use one of {', '.join(REDUCE_DTYPES)}")
    if isinstance(a, mx.ScaledTensor):
        return UnsupportedError("a ScaledTensor A has a scale of its own shard, not of the whole tensor; pass float "
                                "data (mxcore.distributed quantizes it with one global scale)")
    if isinstance(a, mx.MXTensor) and (a.ndim != 2 or a.axis != 1 or a.block != MX_BLOCK):
        return ShapeError(f"an MXTensor A must be 2-D and blocked along K (axis=1) in blocks of {MX_BLOCK}; got "
                          f"shape {a.shape}, axis={a.axis}, block={a.block}; use mxcore.quantize_mx(a, fmt, axis=-1)")
    if layout == "row" and isinstance(b, mx.ScaledTensor):
        return UnsupportedError("a ScaledTensor B of a K shard has the scale of its own shard, not of the whole "
                                "weight; pass float data or an MXTensor (blocks along K)")
    for x, role in ((a, "a"), (b, "b")):
        if _device_of(torch, x) is None:
            return InputTypeError(f"operand {role} is a {type(x).__name__}; pass a torch tensor, numpy array, CuPy "
                                  "array, MXTensor or ScaledTensor")
    return None


def matmul(a_local, b_local, dtype=None, *, group=None, layout: str = "column", out_dtype: str = "float32",
           chunks: int = 1, reduce: str = "all_reduce", reduce_dtype: str = "float32", backend: str = "auto",
           scale_rounding: str = "floor", timeout: float = 120.0, check_call: bool = True,
           stats: dict | None = None):
    """One tensor-parallel GEMM; every rank of ``group`` (default: the world) calls it (see the module doc).

    a_local, b_local: this rank's shards (torch tensors; numpy / CuPy accepted). dtype: as for
    :func:`mxcore.matmul` (None: the inputs' own). layout: ``"column"`` or ``"row"``. out_dtype: the result's dtype.
    chunks: row chunks pipelined against the GEMM. reduce / reduce_dtype: row-parallel reduction and its dtype.
    backend / scale_rounding: passed to :func:`mxcore.matmul`. timeout: seconds the shape check may wait for the
    other ranks. check_call: False skips the call check (a loop of identical calls after a checked one; it saves one
    small all-gather and one host synchronisation per call, but a rank that then disagrees makes the large
    collectives fail or hang). stats: a dict filled with the communication volume of this rank.

    Returns a torch tensor on the inputs' device: column: (M, N_local); row: (M, N) (all_reduce) or
    (M / world, N) (reduce_scatter).
    """
    from . import api
    from .backends import select, tensor_parallel
    from .operands import infer_dtype

    torch, dist = _torch()
    world, rank, pg_backend = _group_info(dist, group)
    err, mdt, out, a, b = None, None, out_dtype, a_local, b_local
    try:
        try:
            a, b = _as_torch(torch, a_local), _as_torch(torch, b_local)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise InputTypeError(f"operands must be torch tensors, numpy or CuPy arrays, MXTensor or ScaledTensor; "
                                 f"got {type(a_local).__name__} and {type(b_local).__name__} ({exc})") from exc
        be = select(backend)
        mdt = _dt.resolve(infer_dtype(a, b) if dtype is None else dtype, be.target().arch)
        out = _dt.canonical_out_dtype(out_dtype, allow_float64=be.name == "reference")
        bad = _local_error(torch, a, b, layout, chunks, reduce, reduce_dtype)
        if bad is not None:
            raise bad
    except MXCoreError as exc:
        err = [type(exc).__name__, str(exc)]
    dev = _device_of(torch, a) if err is None else None
    if dev is not None and dev.type == "cpu" and "gloo" not in pg_backend:
        err = ["DeviceError", f"operands are on the CPU but the process group's backend {pg_backend!r} moves CUDA "
                              "tensors only; use a gloo group for CPU tensors (or move the operands to the GPU)"]
        dev = None
    if dev is None:  # the check still runs (so every rank raises), on the device the group's backend moves
        dev = torch.device("cuda", torch.cuda.current_device()) if "gloo" not in pg_backend else torch.device("cpu")
    comm = _Comm(torch, dist, group, world, rank, pg_backend, dev, timeout)
    prog, tp = False, None
    if err is None and layout == "column":  # the backend's replayed per-call program (CUDA: backends/cuda/tp.py)
        tp = tensor_parallel(be.name)
        if tp is not None:
            prog = tp.lookup(torch, comm, a, b, mdt, out, scale_rounding, chunks)
    if check_call:
        pending = comm.check_start(_describe(layout, mdt, out, chunks, reduce, reduce_dtype, backend, scale_rounding,
                                             a, b, err))
        if prog:  # its local launches (no collective) are queued while the check's gather runs
            prog.local(a, b)
        _check_table(comm.check_finish(pending), world)
    elif err is not None:  # unchecked: this rank's own error, raised here only
        raise getattr(_errors, err[0], MXCoreError)(err[1])
    elif prog:
        prog.local(a, b)
    if prog is not False:
        if prog:
            result, path = prog.finish(comm), "replay"
        else:
            result, kept = tp.keep(be, comm, a, b, mdt, out, scale_rounding, chunks)
            path = "recorded" if kept else "generic"
        return _with_stats(stats, comm, world, rank, layout, mdt, a.shape[0] * a.shape[1] * _BF16_BYTES, result,
                           path)

    from . import mx

    amax = None
    if mdt.kind == "fp8":  # one global scale per operand: all-reduce the shards' finite amax
        vals = [torch.zeros((), device=comm.device) if isinstance(x, (mx.ScaledTensor, mx.MXTensor))
                else _finite_amax(torch, x) for x in (a, b)]
        amax = comm.all_reduce_max(vals)
    pair = (mdt.a.name, mdt.b.name)
    bq = _prepare_b(torch, b, mdt.b, scale_rounding, None if amax is None else amax[1])
    call = dict(out_dtype=out if layout == "column" else reduce_dtype, backend=backend, scale_rounding=scale_rounding)

    if layout == "column":
        result = _column(torch, comm, a, bq, mdt, pair, call, scale_rounding, amax, chunks)
        bf16 = a.shape[0] * a.shape[1] * _BF16_BYTES
    else:
        result = _row(torch, comm, api, a, bq, mdt, pair, call, scale_rounding, amax, chunks, reduce, out)
        bf16 = result.numel() * _BF16_BYTES * (world if reduce == "reduce_scatter" else 1)
    return _with_stats(stats, comm, world, rank, layout, mdt, bf16, result, "generic")


def _with_stats(stats, comm, world, rank, layout, mdt, bf16, result, path: str):
    if stats is not None:
        stats.update(comm.stats)
        stats.update(world_size=world, rank=rank, layout=layout, dtype=mdt.name, bf16_bytes=bf16,
                     ratio=comm.stats["payload_bytes"] / bf16 if bf16 else 0.0, path=path)
    return result


def _column(torch, comm, a, bq, mdt, pair, call, scale_rounding, amax, chunks):
    from . import api

    m_local = a.shape[0]
    wire, rebuild = _prepare_a_column(torch, a, mdt.a, scale_rounding, None if amax is None else amax[0])
    n_local = bq.shape[1]
    parts = _splits(m_local, chunks)
    device = _device_of(torch, a)
    result = None
    pending = comm.all_gather_async(wire[parts[0][0]:parts[0][1]].contiguous())
    for i, (s, e) in enumerate(parts):
        gathered, work = pending
        if i + 1 < len(parts):  # the next chunk travels while this one is multiplied
            pending = comm.all_gather_async(wire[parts[i + 1][0]:parts[i + 1][1]].contiguous())
        wait(work, comm.data_timeout, "all-gather", comm.world)
        res = _to_torch_like(torch, api.matmul(rebuild(gathered), bq, pair, **call), device)
        if len(parts) == 1:  # one chunk: the gathered rows are already in rank order
            return res
        if result is None:
            result = torch.empty((comm.world, m_local, n_local), dtype=res.dtype, device=res.device)
        result[:, s:e] = res.reshape(comm.world, e - s, n_local)
    return result.reshape(comm.world * m_local, n_local)


def _row(torch, comm, api, a, bq, mdt, pair, call, scale_rounding, amax, chunks, reduce, out):
    from . import mx

    if mdt.a.kind == "fp8":
        aq = _quantize_global(torch, a, mdt.a.element, amax[0])
    elif mdt.a.kind == "mx" and not isinstance(a, mx.MXTensor):
        aq = mx.quantize_mx(_host(torch, a), mdt.a.name, axis=-1, scale_rounding=scale_rounding)
    else:
        aq = a if isinstance(a, mx.MXTensor) else _host(torch, a)
    m, world = a.shape[0], comm.world
    device = _device_of(torch, a)
    per = m // world if reduce == "reduce_scatter" else m
    parts = _splits(per, chunks)

    def rows_of(x, s, e):  # reduce_scatter: the chunk's rows of every rank's slice, in rank order
        if reduce == "all_reduce":
            idx = np.arange(s, e)
        else:
            idx = np.concatenate([np.arange(r * per + s, r * per + e) for r in range(world)])
        if isinstance(x, (mx.MXTensor, mx.ScaledTensor)):
            return _take_rows(torch, x, idx)
        return _index(torch, x, idx)

    result, inflight = None, []
    for s, e in parts:
        partial = _to_torch_like(torch, api.matmul(rows_of(aq, s, e), bq, pair, **call), device).contiguous()
        inflight.append((s, e) + comm.reduce_async(partial, reduce))  # reduced while the next chunk computes
    for s, e, reduced, work in inflight:
        wait(work, comm.data_timeout, reduce.replace("_", "-"), world)
        if result is None:
            result = torch.empty((per, reduced.shape[1]), dtype=getattr(torch, out), device=reduced.device)
        result[s:e] = _round_to(torch, reduced, out)
    return result


def _take_rows(torch, x, idx):
    from . import mx

    if isinstance(x, mx.MXTensor):
        return mx.MXTensor(_index(torch, x.codes, idx), _index(torch, x.scales, idx), x.fmt, x.axis, x.block)
    return mx.ScaledTensor(_index(torch, x.codes, idx), x.scale, x.fmt, x.scale_exp if x.device else None)


def _index(torch, x, idx):
    return x[idx] if isinstance(x, np.ndarray) else x[torch.as_tensor(idx, device=x.device)]


def _round_to(torch, reduced, out: str):
    """The reduced partial sums rounded once to ``out`` (RNE, as mxcore.matmul rounds its output)."""
    if str(reduced.dtype).replace("torch.", "") == out:
        return reduced
    if reduced.device.type == "cpu":
        from .reference import round_output

        return _to_torch_like(torch, round_output(_np_of(reduced).astype(np.float64), out), reduced.device)
    return reduced.to(getattr(torch, out))
