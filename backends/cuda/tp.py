"""Column-parallel GEMM on CUDA: the per-call program behind :func:`mxcore.distributed.matmul` (``layout="column"``).

The first call of a layout (group, shapes, dtypes, stream, chunks) runs every step once and keeps what it made:

1. local, before any collective: fp8 — the finite amax of both shards into one int64 pair (their magnitudes' bits,
   :func:`~mxcore.backends.codec.finite_amax_bits`); MX — the shards quantized (A along K, B along K) and A's codes
   packed for the wire (fp4 two per byte, fp6 four per three bytes);
2. collectives: fp8 — MAX all-reduce of the amax pair, then both shards quantized with the global amax (one scale per
   operand, the whole tensor's); MX — MAX all-reduce of both ``scale_max`` codes (the gathered A's and the whole B's,
   as one-GPU ``mxcore.matmul`` places the decode range); then A's wire parts all-gathered in ``chunks`` row chunks
   into buffers of the program;
3. GEMMs per (rank block, chunk): this rank's own rows first (they need no collective: they overlap the all-gather),
   then, as each chunk arrives, the other ranks' rows; each writes its row slice of the output in place, so the
   result needs no copy.

Every device step of 1 and of the GEMMs' staging runs under :func:`~mxcore.backends.codec.recording`.  When the
recordings made no copy outside their steps and every buffer a GEMM reads was written by a recorded step or by the
all-gather, later calls replay the recordings with the new input addresses, issue the same collectives, point each
plan at the new output (:meth:`~.plan.CudaPlan.rebind`) and launch: no quantization objects, no plans, no staging
decisions in Python.  Otherwise the program is not kept (:func:`build` says None) and the generic path runs.
Per call the host does a few dozen launches and collectives; the GPU work is the same as the first call's.

Numerics: the GEMMs see exactly the operands ``mxcore.matmul`` sees on the gathered A (the same codes, the same
per-tensor scale or block scales, the same ``scale_max``), and every output element is computed by one GEMM over
the whole K, so the result is one-GPU ``mxcore.matmul(A, B)[:, this rank's columns]``.
"""

from __future__ import annotations

from mxcore import formats as _f
from mxcore.dist_comm import pack_codes, splits, unpack_codes, wait
from mxcore.dtypes import MX_BLOCK
from mxcore.errors import UnsupportedError

from .device import as_cupy, stream_for, torch_stream, unowned_view
from .fastpath import _operand_buffers, _plan_buffers, _replayable, _span
from .quantized import quantized_on, staged_key, staged_weight, swap_weight, weight_cache
from .plan import CudaPlan

__all__ = ["ColumnProgram", "build"]

_MAX_PROGRAMS = 4  # programs hold the gathered operand: a few layouts per process


def _float_cuda(torch, x) -> bool:
    return (isinstance(x, torch.Tensor) and x.device.type == "cuda" and x.dim() == 2 and x.is_contiguous()
            and x.dtype in (torch.float16, torch.bfloat16, torch.float32) and not x.requires_grad)


def weight(b, a, mdt) -> bool:
    """``b`` is this rank's weight shard quantized once for ``mdt``'s B (an MXTensor blocked along K, or a
    ScaledTensor) with every device array on ``a``'s GPU."""
    from mxcore.mx import MXTensor, ScaledTensor, mx_element

    if mdt.kind == "mx":
        ok = isinstance(b, MXTensor) and mx_element(b.fmt)[0] == mx_element(mdt.b.name)[0]
    else:
        ok = isinstance(b, ScaledTensor) and _f.get(b.fmt).name == _f.get(mdt.b.element).name
    return ok and quantized_on(b, a.device.index)


def qualifies(torch, a, b, mdt) -> bool:
    """fp8 or MX; A a float CUDA tensor (2-D, contiguous); B one on A's device (quantized per call), or a weight
    quantized once (:func:`weight`)."""
    if mdt.kind not in ("fp8", "mx") or not _float_cuda(torch, a):
        return False
    if weight(b, a, mdt):
        return True
    return _float_cuda(torch, b) and a.device == b.device and a.data_ptr() != b.data_ptr()


def key(torch, comm, a, b, mdt, out_dtype: str, scale_rounding: str, chunks: int) -> tuple:
    """A program's layout (a weight quantized once by its kind, format and shape: the weights of one layout — a
    model's layers — share the program, which points its plans at each call's weight)."""
    bk = ((type(b).__name__, b.fmt, tuple(b.shape)) if not isinstance(b, torch.Tensor)
          else (str(b.dtype), tuple(b.shape), b.data_ptr() % 16))
    return (id(comm.group), comm.world, comm.rank, a.device.index, torch_stream(torch, a.device.index), str(a.dtype),
            tuple(a.shape), a.data_ptr() % 16, bk, mdt.name, out_dtype, scale_rounding, chunks)


class ColumnProgram:
    """One column-parallel layout, built by :func:`build`; ``local(a, b)`` then ``finish()`` per call."""

    def __init__(self, be, comm, mdt, out_dtype: str, scale_rounding: str, chunks: int, a, b):
        self.be, self.mdt, self.out_dtype, self.scale_rounding = be, mdt, out_dtype, scale_rounding
        self.torch = comm.torch
        self.world, self.rank = comm.world, comm.rank
        self.m_local, self.k = (int(s) for s in a.shape)
        self.n_local = int(b.shape[1])
        self.device = a.device
        self.stationary = not isinstance(b, self.torch.Tensor)  # a weight quantized once: used as it is
        self._wkey = None  # its staged form's key in the weights' staging cache (stage.py), when stationary
        self.parts = splits(self.m_local, chunks)
        self.steps = None  # the per-call replays, once the first call shows they redo everything
        with be.cp_module.cuda.Device(a.device.index):
            self.stream = stream_for(be.cp_module, a, b)  # torch's current stream, where NCCL's work is ordered

    # ---- the first call: run every step under recording --------------------------------------------------------
    def first(self, comm, a, b):
        from mxcore.backends import codec

        torch, mdt = self.torch, self.mdt
        cp = self.be.cp_module
        fp8 = mdt.kind == "fp8"
        with cp.cuda.Device(self.device.index), self.stream:
            if self.stationary:  # the weight's staging, once and cached on it: no recorded step redoes it
                self._stage_weight(a, b)
                before = weight_cache(b)
            if fp8:
                self.bits = torch.zeros(2, dtype=torch.int64, device=self.device)
                with codec.recording() as rec:
                    codec.finite_amax_bits(self._inputs(a, b), self.bits)
                self._local = rec
                comm.all_reduce_max_(self.bits)
                with codec.recording() as rec_q:
                    qa, qb = self._quantize_fp8(codec, a, b)
                self._quant = rec_q
                wire = [qa.codes]
            else:
                with codec.recording() as rec:
                    qa, qb, wire = self._quantize_mx(a, b)
                self._local, self._quant = rec, None
                # both operands' scale_max (a weight quantized once: A's alone), reduced over the ranks in one
                # collective: the GEMMs read this pair
                self._smax_src = (qa.scale_max,) if self.stationary else (qa.scale_max, qb.scale_max)
                self.smax2 = torch.empty(len(self._smax_src), dtype=torch.uint8, device=self.device)
                self._reduce_smax(comm)
                qa = _with_scale_max(qa, self.smax2[0])
                qb = qb if self.stationary else _with_scale_max(qb, self.smax2[1])
            self.qa, self.qb, self.wire = qa, qb, wire
            self.gathered = [[torch.empty((self.world, e - s) + tuple(p.shape[1:]), dtype=p.dtype, device=self.device)
                              for p in wire] for s, e in self.parts]
            works = self._post_gathers(comm)
            out = torch.empty((self.world * self.m_local, self.n_local), dtype=getattr(torch, self.out_dtype),
                              device=self.device)
            self.plans = []  # (rank block, chunk index, recording of its staging or None, plan), in launch order
            for c in range(len(self.parts)):
                self._add_plan(codec, self.rank, c, out)
            self.unpacks = []
            for c in range(len(self.parts)):
                for w in works[c]:
                    self._wait(w)
                with codec.recording() as rec_u:
                    codes = self._received_codes(c)
                self.unpacks.append(rec_u)
                for k in range(self.world):
                    if k != self.rank:
                        self._add_plan(codec, k, c, out, codes)
        if self.stationary:  # every plan reads the weight's cached staging (made before any recording)
            keys = {staged_key(before, p.db) for *_, p in self.plans}
            self._wkey = keys.pop() if len(keys) == 1 else None
            for *_, p in self.plans:
                p._prep = None  # the staging callables hold the weight: the program must not keep it alive
            self.qb = None
            if self._wkey is None:
                return out
        self._decide(a, b)
        return out

    def use_weight(self, a, b) -> bool:
        """Point every plan at weight ``b`` (this layout's kind, format and shape), staging it once (cached on it)
        when it is new; False when its staged form differs from the plans' (e.g. not foldable where the first
        weight was): that call runs the generic path."""
        cp = self.be.cp_module
        with cp.cuda.Device(self.device.index), self.stream:
            staged = staged_weight(b, self.device.index, self._wkey)
            if staged is None:
                self._stage_weight(a, b)
                staged = staged_weight(b, self.device.index, self._wkey)
            # the plans share one staged form: the first refusal (swap_weight checks the form) changes nothing
            return staged is not None and all(swap_weight(p, staged) for *_, p in self.plans)

    def _sms_for_gather(self, p) -> int:
        """SMs the own rows' persistent GEMM leaves to the concurrent all-gather (:func:`leave_for_gather`)."""
        wire = (self.world - 1) * sum(w.numel() * w.element_size() for w in self.wire)
        rate = GEMM_FLOPS_S["fp8" if p.da.elem in ("e4m3", "e5m2") else "16-bit"]
        return leave_for_gather(wire, 2.0 * self.m_local * self.n_local * self.k, p.dev.sms, rate)

    def _inputs(self, a, b) -> list:
        """The float inputs the recorded steps read (a weight quantized once is not one)."""
        return [a] if self.stationary else [a, b]

    def _stage_weight(self, a, b) -> None:
        """Stage the weight once through a plan of the own rows' first chunk (cached on it), unrecorded."""
        from mxcore import mx

        s, e = self.parts[0]
        rows = a[s:e]
        qa = (mx.quantize_mx(rows, self.mdt.a.name, axis=-1, scale_rounding=self.scale_rounding)
              if self.mdt.kind == "mx" else mx.quantize_tensor(rows, self.mdt.a.element))
        self.be.plan(qa, b, self.mdt, out_dtype=self.out_dtype, scale_rounding=self.scale_rounding).close()

    def _reduce_smax(self, comm) -> None:
        self.torch.stack(self._smax_src, out=self.smax2)
        comm.all_reduce_max_(self.smax2)

    def _quantize_fp8(self, codec, a, b):
        from mxcore.mx import ScaledTensor

        mdt = self.mdt
        sa, sb = _f.get(mdt.a.element), _f.get(mdt.b.element)
        ca, sca, ea = codec.quantize_tensor(a, sa, amax_bits=self.bits[0:1])
        if self.stationary:
            return ScaledTensor(ca, sca, sa.name, ea), b
        cb, scb, eb = codec.quantize_tensor(b, sb, order=self.be.b_code_order, amax_bits=self.bits[1:2])
        return ScaledTensor(ca, sca, sa.name, ea), ScaledTensor(cb, scb, sb.name, eb)

    def _quantize_mx(self, a, b):
        from mxcore import mx

        mdt, rounding = self.mdt, self.scale_rounding
        qa = mx.quantize_mx(a, mdt.a.name, axis=-1, scale_rounding=rounding)
        qb = b if self.stationary else mx.quantize_mx(b, mdt.b.name, axis=0, scale_rounding=rounding)
        return qa, qb, [pack_codes(self.torch, qa.codes, _f.get(qa.element).bits), qa.scales]

    def _received_codes(self, c):
        """Chunk ``c``'s gathered A codes, unpacked where they travelled packed: (world, rows, K) uint8."""
        g = self.gathered[c][0]
        bits = _f.get(self.qa.element).bits if self.mdt.kind == "mx" else 8
        return unpack_codes(self.torch, g.reshape(-1, g.shape[-1]), bits, self.k).reshape(self.world, -1, self.k)

    def _operand(self, k: int, c: int, codes):
        """A's rows of rank block ``k``, chunk ``c``, as the quantized object the GEMM takes."""
        from mxcore.mx import MXTensor, ScaledTensor

        s, e = self.parts[c]
        qa = self.qa
        if self.mdt.kind == "fp8":
            rows = qa.codes[s:e] if k == self.rank else codes[k]
            return ScaledTensor(rows, qa.scale, qa.fmt, qa.scale_exp)
        if k == self.rank:
            rows, scales = qa.codes[s:e], qa.scales[s:e]
        else:
            rows, scales = codes[k], self.gathered[c][1][k]
        return MXTensor(rows, scales, qa.fmt, 1, MX_BLOCK, (e - s, self.k), qa.scale_max)

    def _out_rows(self, out, k: int, c: int):
        s, e = self.parts[c]
        base = k * self.m_local
        return out[base + s:base + e]

    def _add_plan(self, codec, k: int, c: int, out, codes=None):
        from .sm90 import Sm90Plan

        cp = self.be.cp_module
        with codec.recording() as rec:
            p = self.be.plan(self._operand(k, c, codes), self.qb, self.mdt, out_dtype=self.out_dtype,
                             scale_rounding=self.scale_rounding, out=unowned_view(cp, self._out_rows(out, k, c)))
        if k == self.rank and isinstance(p, Sm90Plan):  # it runs beside the all-gather's kernel
            p.leave_sms(self._sms_for_gather(p))
        p.gemm()
        self.plans.append((k, c, rec, p))

    # ---- replayable? -------------------------------------------------------------------------------------------
    def _decide(self, a, b) -> None:
        recs = [self._local] + ([self._quant] if self._quant is not None else []) + self.unpacks
        recs += [rec for _, _, rec, _ in self.plans]
        # buffers the collectives rewrite each call: the gathered operand and the all-reduced pair
        written = [_span(g) for per in self.gathered for g in per]
        written.append(_span(self.smax2 if self.mdt.kind == "mx" else self.bits))
        if self.stationary:  # the weight's staged buffers: made once, cached on it, rewritten by nothing
            written += [_span(x) for *_, p in self.plans for x in _operand_buffers(p.db)]
        buffers = [x for *_, p in self.plans for x in _plan_buffers(p)] + list(self.wire)
        if not (all(isinstance(p, CudaPlan) and p.batch is None and p._fold is None for *_, p in self.plans)
                and _replayable(buffers, *recs, extra=written)):
            return
        self._bound = [int(p.out.data.ptr) for *_, p in self.plans]  # the output rows each plan writes now
        inputs = [as_cupy(self.be.cp_module, x) for x in self._inputs(a, b)]
        try:
            self.steps = {
                "local": self._local.replay(inputs),
                "quant": self._quant.replay(inputs) if self._quant is not None else None,
                "unpack": [rec.replay(()) for rec in self.unpacks],
                "stage": [rec.replay(()) for _, _, rec, _ in self.plans],
            }
        except UnsupportedError:  # an input was copied before it was read: nothing to replay into
            self.steps = None

    # ---- later calls -------------------------------------------------------------------------------------------
    def local(self, a, b) -> None:
        """The per-call work that needs no collective (fp8: the amax pair; MX: quantization and packing)."""
        self._addr = tuple(int(x.data_ptr()) for x in self._inputs(a, b))
        with self.be.cp_module.cuda.Device(self.device.index), self.stream:
            self.steps["local"](self._addr)

    def finish(self, comm):
        """The collectives (through ``comm``, this call's) and the GEMMs after :meth:`local`; returns the
        (world · M_local, N_local) output."""
        torch, steps = self.torch, self.steps
        cp = self.be.cp_module
        with cp.cuda.Device(self.device.index), self.stream:
            if steps["quant"] is not None:
                comm.all_reduce_max_(self.bits)
                steps["quant"](self._addr)
            if self.mdt.kind == "mx":
                self._reduce_smax(comm)
            works = self._post_gathers(comm)
            out = torch.empty((self.world * self.m_local, self.n_local), dtype=getattr(torch, self.out_dtype),
                              device=self.device)
            waited = set()
            for i, (k, c, _, p) in enumerate(self.plans):
                if k != self.rank and c not in waited:
                    for w in works[c]:
                        self._wait(w)
                    steps["unpack"][c]()
                    waited.add(c)
                steps["stage"][i]()
                rows = self._out_rows(out, k, c)
                if rows.data_ptr() != self._bound[i]:  # torch's allocator often hands back the last call's output
                    p.rebind(out=unowned_view(cp, rows))
                    self._bound[i] = rows.data_ptr()
                p.gemm()
        return out

    # ---- collectives -------------------------------------------------------------------------------------------
    def _post_gathers(self, comm) -> list:
        return [[comm.all_gather_into(g, p[s:e]) for g, p in zip(bufs, self.wire)]
                for (s, e), bufs in zip(self.parts, self.gathered)]

    def _wait(self, work) -> None:
        wait(work, None, "all-gather", self.world)


COMM_SMS = 24          # SMs NCCL's all-gather kernel held here (2 x H200, NCCL defaults; README "More than one GPU")
GATHER_BYTES_S = 200e9  # its bus bandwidth measured beside the GEMM (bench_distributed: 180-215 GB/s)
GEMM_FLOPS_S = {"fp8": 1.3e15, "16-bit": 0.785e15}  # the wgmma GEMMs' rates by staged element (benchmarks/results/dense-gemm-h200.json, fp8-gemm-h200.json)
HELD = 2 / 3  # the part of the gather's time a GEMM on every SM loses to it (calibrated on the three cases below)


def leave_for_gather(wire_bytes: float, flops: float, sms: int, gemm_flops_s: float = GEMM_FLOPS_S["fp8"]) -> int:
    """SMs the own rows' persistent GEMM leaves to the all-gather running beside it.  A block placed on an SM that
    NCCL's kernel holds starts only when the gather ends: on every SM the GEMM loses about ``HELD`` of the gather's
    time; on ``COMM_SMS`` fewer SMs it runs sms / (sms - COMM_SMS) times longer throughout; whichever is predicted
    shorter.  ``$MXCORE_TP_COMM_SMS`` overrides (0: never).  Measured (8192 x 16384 x 8192, 2 x H200, wall ms per
    call with 24 SMs left vs none): fp8 1.12 vs 1.22 (34 MB gathered beside a ~0.42 ms fp8 GEMM: leave); mxfp8
    1.91 vs 1.75 (35 MB beside a ~0.70 ms bf16 GEMM: keep); mxfp4 1.41 vs 1.35 (18 MB beside ~0.45 ms: keep)."""
    import os

    env = os.environ.get("MXCORE_TP_COMM_SMS")
    if env is not None:
        return max(0, int(env))
    if wire_bytes <= 0 or sms <= 2 * COMM_SMS:
        return 0
    gather_s, gemm_s = wire_bytes / GATHER_BYTES_S, flops / gemm_flops_s
    return COMM_SMS if HELD * gather_s > gemm_s * COMM_SMS / (sms - COMM_SMS) else 0


def _with_scale_max(q, smax):
    """``q`` (a device MXTensor) with its ``scale_max`` read from ``smax`` (a 0-d view of the reduced pair)."""
    from mxcore.mx import MXTensor

    return MXTensor(q.codes, q.scales, q.fmt, q.axis, q.block, q.shape, smax)


def build(be, comm, a, b, mdt, out_dtype: str, scale_rounding: str, chunks: int):
    """(program or None, result) of the first call of a layout: the program when later calls can replay it."""
    prog = ColumnProgram(be, comm, mdt, out_dtype, scale_rounding, chunks, a, b)
    out = prog.first(comm, a, b)
    return (prog if prog.steps is not None else None), out


_PROGRAMS: dict = {}


def lookup(torch, comm, a, b, mdt, out_dtype: str, scale_rounding: str, chunks: int):
    """The kept program of this call's layout; None: none yet (:func:`keep` builds one); False: this layout is
    not replayed (inputs that do not qualify, or a first call whose recordings did not redo everything)."""
    if not qualifies(torch, a, b, mdt):
        return False
    prog = _PROGRAMS.get(key(torch, comm, a, b, mdt, out_dtype, scale_rounding, chunks))
    if prog and prog.stationary and not prog.use_weight(a, b):
        return False
    return prog


def keep(be, comm, a, b, mdt, out_dtype: str, scale_rounding: str, chunks: int):
    """Run the first call of a layout through :func:`build` and keep the program (or False); returns (the result,
    whether a program was kept)."""
    k = key(comm.torch, comm, a, b, mdt, out_dtype, scale_rounding, chunks)
    prog, out = build(be, comm, a, b, mdt, out_dtype, scale_rounding, chunks)
    while len(_PROGRAMS) >= _MAX_PROGRAMS:
        _PROGRAMS.pop(next(iter(_PROGRAMS)))
    _PROGRAMS[k] = prog if prog is not None else False
    return out, prog is not None
