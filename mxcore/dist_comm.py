"""The collectives of :mod:`mxcore.distributed` on one ``torch.distributed`` group (:class:`_Comm`, with byte
accounting), the call check every rank runs before the large collectives (:func:`_describe`, :class:`_Comm`'s
``check_start`` / ``check_finish``, :func:`_check_table`), waiting with a timeout (:func:`wait`), the row
chunks (:func:`splits`) and the wire form of element codes (:func:`pack_codes`, :func:`unpack_codes`).  Used by
:mod:`mxcore.distributed` and the CUDA column program (:mod:`mxcore.backends.cuda.tp`)."""

from __future__ import annotations

import datetime
import json

import numpy as np

from . import errors as _errors
from . import formats as _f
from .arrays import to_numpy
from .dtypes import MX_BLOCK
from .errors import DeviceError, InputTypeError, MXCoreError, ShapeError, UnsupportedError

_CHECK_BYTES = 1024  # the call description every rank all-gathers before the large collectives


def _kind_name(x) -> str:
    fmt = getattr(x, "fmt", None)
    if fmt is not None:
        return f"{type(x).__name__}:{fmt}"
    return str(getattr(x, "dtype", type(x).__name__)).replace("torch.", "")


def _describe(layout, mdt, out_dtype, chunks, reduce, reduce_dtype, backend, scale_rounding, a, b, err):
    d = {"layout": layout, "dtype": getattr(mdt, "name", str(mdt)), "out": out_dtype, "chunks": chunks,
         "reduce": reduce if layout == "row" else None, "rdt": reduce_dtype if layout == "row" else None,
         "kind": getattr(mdt, "kind", None), "backend": backend, "rounding": scale_rounding,
         "a": list(getattr(a, "shape", ())), "b": list(getattr(b, "shape", ())),
         "a_dtype": _kind_name(a), "b_dtype": _kind_name(b), "err": err}
    text = json.dumps(d, separators=(",", ":"))
    if len(text) > _CHECK_BYTES:
        d["err"] = [err[0], err[1][: max(0, len(err[1]) - (len(text) - _CHECK_BYTES) - 8)]]
        text = json.dumps(d, separators=(",", ":"))
    return text.encode()


def wait(work, timeout, what: str, world: int):
    """Wait for ``work``: with ``timeout`` (seconds) the host blocks until it completes or the time is up; with None
    (NCCL data collectives) the current CUDA stream waits for it and the host goes on (the overlap)."""
    try:
        if timeout is None:
            work.wait()
        else:
            work.wait(timeout=datetime.timedelta(seconds=timeout))
    except Exception as exc:  # gloo / NCCL raise RuntimeError (or DistBackendError) on timeout or a lost peer
        within = f"within {timeout:g} s " if timeout is not None else ""
        raise DeviceError(
            f"the {what} collective did not complete {within}on a group of {world} ranks: a rank did "
            "not call mxcore.distributed.matmul (or called a different collective), or a peer died. Call it on "
            f"every rank of the group with the same arguments. ({type(exc).__name__}: {str(exc)[:200]})") from exc


def _check_table(rows: list[dict], world: int) -> None:
    """Raise the same error on every rank from the gathered call descriptions (identical on all ranks)."""
    for r, d in enumerate(rows):
        if d["err"]:
            cls = getattr(_errors, d["err"][0], MXCoreError)
            raise cls(f"rank {r} of {world}: {d['err'][1]}")
    for key, cls, what in (("layout", UnsupportedError, "layout"), ("dtype", InputTypeError, "dtype"),
                           ("a_dtype", InputTypeError, "operand a's dtype"),
                           ("b_dtype", InputTypeError, "operand b's dtype"),
                           ("out", UnsupportedError, "out_dtype"), ("chunks", UnsupportedError, "chunks"),
                           ("reduce", UnsupportedError, "reduce"), ("rdt", UnsupportedError, "reduce_dtype"),
                           ("backend", UnsupportedError, "backend"), ("rounding", UnsupportedError, "scale_rounding")):
        seen = [d[key] for d in rows]
        if len(set(map(str, seen))) > 1:
            per = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(seen))
            raise cls(f"ranks disagree on {what} ({per}); every rank must call mxcore.distributed.matmul with the "
                      "same one")
    a = [tuple(d["a"]) for d in rows]
    b = [tuple(d["b"]) for d in rows]
    shapes = ", ".join(f"rank {r}: a {a[r]} b {b[r]}" for r in range(world))
    if any(len(s) != 2 for s in a + b):
        raise ShapeError(f"mxcore.distributed.matmul takes 2-D shards; got {shapes}")
    for r in range(world):
        if a[r][1] != b[r][0]:
            raise ShapeError(f"rank {r}: inner dimensions differ (a {a[r]}, b {b[r]}); a's K must equal b's K ({shapes})")
    layout = rows[0]["layout"]
    if layout == "column":
        if len(set(a)) > 1:
            raise ShapeError(f"column-parallel: every rank's A shard must have the same shape (M_local, K) to be "
                             f"all-gathered; got {shapes}")
        return
    if len({s[0] for s in a}) > 1 or len({s[1] for s in b}) > 1:
        raise ShapeError(f"row-parallel: every rank's partial output must be (M, N) with the same M and N; got {shapes}")
    if rows[0]["kind"] == "mx":
        bad = [r for r in range(world - 1) if a[r][1] % MX_BLOCK]
        if bad:
            raise ShapeError(f"row-parallel MX: the K shards of ranks {bad} are not multiples of {MX_BLOCK}, so an MX "
                             f"block would straddle two ranks; shard K in multiples of {MX_BLOCK} ({shapes})")
    if rows[0]["reduce"] == "reduce_scatter" and a[0][0] % world:
        raise ShapeError(f"reduce_scatter splits the M={a[0][0]} output rows over {world} ranks: M must be a "
                         "multiple of the world size; use reduce='all_reduce' or pad M")


_TWINS: dict = {}


def _host_twin(dist, group):
    """A gloo group over the same ranks as the default (world) ``group`` (None for a subgroup, or when gloo is
    missing): made once per process — every rank reaches this point on its first call, so the collective
    ``new_group`` is entered by all of them."""
    world = dist.group.WORLD
    if group is not None and group is not world:
        return None
    if _TWINS.get("of") is not world:  # first call, or the default group was made again
        try:
            twin = dist.new_group(backend="gloo") if dist.is_gloo_available() else None
        except (RuntimeError, ValueError):
            twin = None
        _TWINS.update({"of": world, "twin": twin})
    return _TWINS["twin"]


class _Comm:
    """The few collectives this module uses, on one torch.distributed group, with byte accounting."""

    def __init__(self, torch, dist, group, world, rank, backend, device, timeout):
        self.torch, self.dist, self.group = torch, dist, group
        self.world, self.rank, self.backend, self.device, self.timeout = world, rank, backend, device, timeout
        # gloo waits on the host (with the timeout); NCCL work is waited on by the stream, so the host can queue the
        # next chunk's GEMM while the collective runs (NCCL's own watchdog bounds it: the group's timeout)
        self.data_timeout = timeout if device.type == "cpu" else None
        self.stats = {"payload_bytes": 0, "wire_bytes": 0, "collectives": 0, "check_bytes": 0}
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        self._gather, self._reduce_scatter = gather, rs
        # the call check of a GPU group runs over a gloo twin of the world group when there is one: host memory
        # only, so reading its result does not wait for the GPU work already queued (no stream synchronisation)
        self.check_group = _host_twin(dist, group) if device.type != "cpu" else None

    def check(self, blob: bytes) -> list[dict]:
        return self.check_finish(self.check_start(blob))

    def check_start(self, blob: bytes):
        """Post the call check; :meth:`check_finish` waits for it.  Over the gloo twin (host memory) the gather runs
        in gloo's thread while this rank queues its local device work; on the group itself it completes here."""
        torch = self.torch
        buf = torch.zeros(_CHECK_BYTES, dtype=torch.uint8)
        buf[: len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        if self.check_group is not None:
            parts = [torch.empty(_CHECK_BYTES, dtype=torch.uint8) for _ in range(self.world)]
            return parts, self.dist.all_gather(parts, buf, group=self.check_group, async_op=True)
        return self._check_on_group(buf), None

    def check_finish(self, pending) -> list[dict]:
        rows, work = pending
        if work is None:
            return rows
        wait(work, self.timeout, "shape check", self.world)
        self.stats["check_bytes"] += _CHECK_BYTES
        raw = self.torch.stack(rows).numpy()
        return [json.loads(bytes(row).rstrip(b"\0").decode()) for row in raw]

    def _check_on_group(self, buf) -> list[dict]:
        torch = self.torch
        buf = buf.to(self.device)
        out = torch.empty(self.world * _CHECK_BYTES, dtype=torch.uint8, device=self.device)
        wait(self._gather(out, buf, group=self.group, async_op=True), self.timeout, "shape check", self.world)
        self.stats["check_bytes"] += _CHECK_BYTES
        raw = out.cpu().numpy().reshape(self.world, _CHECK_BYTES)
        return [json.loads(bytes(row).rstrip(b"\0").decode()) for row in raw]

    def all_reduce_max(self, values):
        """Element-wise max over the ranks of 0-d tensors (float64 on the CPU, float32 on GPUs: both hold any
        fp16/bf16/fp32 amax exactly), without reading them back to the host."""
        dt = self.torch.float64 if self.device.type == "cpu" else self.torch.float32
        t = self.torch.stack([v.to(device=self.device, dtype=dt) for v in values])
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.group)
        self.stats["check_bytes"] += t.numel() * t.element_size()
        return t

    def all_reduce_max_(self, t) -> None:
        """In-place element-wise max over the ranks (integer tensors: bits of non-negative floats, scale codes);
        the current stream waits for it, the host does not."""
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.group)
        self.stats["check_bytes"] += t.numel() * t.element_size()

    def all_gather_into(self, out, payload):
        """Post the all-gather of ``payload`` into ``out`` (world × payload, rank order); returns the work."""
        work = self._gather(out, payload, group=self.group, async_op=True)
        n = payload.numel() * payload.element_size()
        self._count(n, (self.world - 1) * n)
        return work

    def all_gather_async(self, payload):
        out = self.torch.empty((self.world * payload.shape[0],) + tuple(payload.shape[1:]), dtype=payload.dtype,
                               device=payload.device)
        return out, self.all_gather_into(out, payload)

    def reduce_async(self, partial, how: str):
        n = partial.numel() * partial.element_size()
        if how == "all_reduce":
            work = self.dist.all_reduce(partial, group=self.group, async_op=True)
            self._count(n, 2 * (self.world - 1) * n // self.world)
            return partial, work
        out = self.torch.empty((partial.shape[0] // self.world,) + tuple(partial.shape[1:]), dtype=partial.dtype,
                               device=partial.device)
        work = self._reduce_scatter(out, partial, group=self.group, async_op=True)
        self._count(n, (self.world - 1) * n // self.world)
        return out, work

    def _count(self, payload, wire):
        self.stats["payload_bytes"] += payload
        self.stats["wire_bytes"] += wire
        self.stats["collectives"] += 1



def splits(n: int, chunks: int) -> list[tuple[int, int]]:
    chunks = max(1, min(chunks, n)) if n else 1
    edges = [n * i // chunks for i in range(chunks + 1)]
    return list(zip(edges[:-1], edges[1:]))


def pack_codes(torch, codes, bits: int):
    """Element codes packed along the last axis for the wire (fp4 2/byte, fp6 4 per 3 bytes), as a uint8 tensor."""
    if bits == 8:
        return codes if not isinstance(codes, np.ndarray) else torch.from_numpy(codes)
    packed = _f.pack_fp4(codes) if bits == 4 else _f.pack_fp6(codes)
    return torch.from_numpy(np.ascontiguousarray(packed)) if isinstance(packed, np.ndarray) else packed


def unpack_codes(torch, packed, bits: int, count: int):
    """The ``count`` element codes per row of a :func:`pack_codes` tensor: numpy for a CPU tensor (the reference
    path takes numpy), on its GPU otherwise."""
    p = to_numpy(packed) if packed.device.type == "cpu" else packed
    if bits == 8:
        return p
    return _f.unpack_fp4(p, count) if bits == 4 else _f.unpack_fp6(p, count)
