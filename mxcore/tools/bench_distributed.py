"""Benchmark of :func:`mxcore.distributed.matmul` (tensor-parallel GEMM with quantized communication).

Launch one process per GPU::

    torchrun --nproc-per-node 2 -m mxcore.tools.bench_distributed --shape 8192x16384x8192 --dtypes fp8,mxfp8,mxfp4

(``python -m torch.distributed.run`` is the same launcher.)  The global problem is A (M × K) @ B (K × N) from bf16
data; column-parallel gives each rank M/world rows of A and N/world columns of B (``--layout row``: K/world).
For each dtype, every rank reports: its time per call and TFLOP/s (its own 2·M·N_local·K flops), the bytes it
contributed to the large collectives (``stats["payload_bytes"]``) and their ratio to bf16, the achieved bus
bandwidth of the same all-gather timed alone (NCCL-tests convention: busbw = (world-1)·payload / time), and the
scaling efficiency against one GPU on the same global problem (rank 0 runs ``mxcore.matmul`` on all of A and B:
efficiency = T_one / (world · T_distributed)).  Beside them, the plain baseline a user would write: bf16
all-gather of A + ``torch.matmul``.  Calls are what a user makes: float inputs, quantization included
(``--weights quantized``: B is quantized once per rank beforehand, as a weight is for inference).

``--check`` (exact inputs, small sizes) compares both layouts with one-process ``mxcore.matmul`` and fails on any
bit that differs; ``--device cpu`` runs over gloo with the reference backend (what the CPU tests use).  Without
torchrun the environment variables RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT must be set, or a process group
already initialised (``main(argv)`` then uses it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

__all__ = ["main", "run"]



def _parser():
    p = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m mxcore.tools.bench_distributed",
                                description="Tensor-parallel mxcore.matmul vs bf16 all-gather + torch.matmul.")
    # one MxNxK option: torchrun's own parser reads a "--m..." prefix as ambiguous with its --master-*/--module
    p.add_argument("--shape", default="8192x16384x8192", help="global M x N x K (default 8192x16384x8192)")
    p.add_argument("--dtypes", default="fp8,mxfp8,mxfp4")
    p.add_argument("--layout", choices=("column", "row"), default="column")
    p.add_argument("--reduce", choices=("all_reduce", "reduce_scatter"), default="all_reduce")
    p.add_argument("--chunks", type=int, default=1, help="row chunks per rank block (1: this rank's rows overlap "
                   "the all-gather of the others')")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--backend", default="auto", help="mxcore backend (reference on the CPU)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    p.add_argument("--check", action="store_true", help="exact inputs; compare with one-process mxcore.matmul")
    p.add_argument("--weights", choices=("float", "quantized"), default="float",
                   help="B as the calls get it: bf16 data quantized per call (default), or each rank's shard quantized "
                   "once before the timed calls (an MXTensor / ScaledTensor: the inference case; the one-GPU figure "
                   "then uses all of B quantized once)")
    p.add_argument("--check-once", action="store_true",
                   help="timed calls skip the per-call shape check (the first, untimed call checks)")
    p.add_argument("--json", default=None, help="rank 0 writes the rows here")
    return p


def _init(torch, dist, device):
    if dist.is_initialized():
        return False
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    return True


def _timer(torch, dist, device, fn, warmup, iters):
    """Seconds per call of ``fn`` on this rank (device work included); with ``dist``, all ranks start together
    (None: this rank alone)."""
    for _ in range(warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    if dist is not None:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / max(iters, 1)


def _global_problem(torch, args, device, seed=14):
    g = torch.Generator(device="cpu").manual_seed(seed)
    if args.check:  # exact in every format (values of the e2m1 grid times signs): results are bit-comparable
        import numpy as np

        from mxcore import formats

        grid = torch.from_numpy(formats.decode(np.arange(8, dtype=np.uint8), "e2m1", dtype=np.float32))
        pick = lambda shape: grid[torch.randint(0, 8, shape, generator=g)] * (  # noqa: E731
            torch.randint(0, 2, shape, generator=g) * 2 - 1)
        a, b = pick((args.m, args.k)), pick((args.k, args.n))
    else:
        a, b = torch.randn(args.m, args.k, generator=g), torch.randn(args.k, args.n, generator=g)
    dt = torch.bfloat16 if not args.check else torch.float32
    return a.to(device=device, dtype=dt), b.to(device=device, dtype=dt)


def _quantized_weight(b, dt: str, backend: str):
    """``b`` quantized once as ``dt``'s B operand (mxcore.operands.quantize_on_device: an MXTensor blocked along K,
    or a per-tensor ScaledTensor in the backend's code order)."""
    from mxcore import dtypes as _dt
    from mxcore.backends import select
    from mxcore.operands import quantize_on_device

    be = select(backend)
    return quantize_on_device(b, _dt.resolve(dt, be.target().arch).b, "b", b_order=be.b_code_order)


def _shards(a, b, layout, world, rank):
    if layout == "column":
        m, n = a.shape[0] // world, b.shape[1] // world
        return a[rank * m:(rank + 1) * m].contiguous(), b[:, rank * n:(rank + 1) * n].contiguous()
    k = a.shape[1] // world
    return a[:, rank * k:(rank + 1) * k].contiguous(), b[rank * k:(rank + 1) * k].contiguous()


def _check(torch, dist, args, dev, world, rank):
    """Both layouts (and both reductions) against one-process mxcore.matmul, bit for bit (exact inputs), each on
    three input sets in turn: the first call of a layout builds its per-call program, the later ones replay it
    (the third with the first's data, after other data: a result left over from an earlier call cannot pass)."""
    import mxcore
    from mxcore import distributed

    sets = [_global_problem(torch, args, dev, seed) for seed in (14, 15)]
    for dt in args.dtypes.split(","):
        for layout, reduce in (("column", None), ("row", "all_reduce"), ("row", "reduce_scatter")):
            paths = [_check_one(torch, distributed, mxcore.matmul(a, b, dt, backend=args.backend), args, a, b, dt,
                                layout, reduce, world, rank) for a, b in sets + sets[:1]]
            if rank == 0:
                print(f"check {dt} {layout} {reduce or ''}: bit-exact on 3 calls (paths: {', '.join(paths)})")
        if args.weights == "quantized":  # column layout, this rank's shards of two weights quantized once (two
            n = sets[0][1].shape[1] // world  # layers of one layout, taken in turn): against one process
            bqs = [_quantized_weight(b[:, rank * n:(rank + 1) * n].contiguous(), dt, args.backend) for _, b in sets]
            paths = []
            for i, j in ((0, 0), (1, 0), (0, 1), (1, 1), (0, 0)):
                a, m = sets[i][0], sets[i][0].shape[0] // world
                stats = {}
                got = distributed.matmul(a[rank * m:(rank + 1) * m].contiguous(), bqs[j], dt, chunks=args.chunks,
                                         backend=args.backend, stats=stats)
                _same(torch, got, mxcore.matmul(a, bqs[j], dt, backend=args.backend),
                      f"rank {rank}: {dt} column, weight {j} quantized once", stats["path"])
                paths.append(stats["path"])
            if rank == 0:
                print(f"check {dt} column, two weights quantized once: bit-exact on 5 calls "
                      f"(paths: {', '.join(paths)})")
    dist.barrier()


def _check_one(torch, distributed, full, args, a, b, dt, layout, reduce, world, rank):
    """One distributed call against the one-process result ``full``, bit for bit."""
    al, bl = _shards(a, b, layout, world, rank)
    stats = {}
    got = distributed.matmul(al, bl, dt, layout=layout, reduce=reduce or "all_reduce", chunks=args.chunks,
                             backend=args.backend, stats=stats)
    if layout == "column":
        n = b.shape[1] // world
        want = full[:, rank * n:(rank + 1) * n]
    elif reduce == "reduce_scatter":
        m = a.shape[0] // world
        want = full[rank * m:(rank + 1) * m]
    else:
        want = full
    _same(torch, got, want, f"rank {rank}: {dt} {layout} {reduce or ''}", stats["path"])
    return stats["path"]


def _same(torch, got, want, what: str, path: str) -> None:
    """``got`` equals ``want`` bit for bit (float32), else an AssertionError naming ``what`` and the path taken."""
    if not torch.equal(got.view(torch.int32), want.view(torch.int32)):
        bad = int((got.view(torch.int32) != want.view(torch.int32)).sum())
        raise AssertionError(f"{what}: {bad} of {got.numel()} outputs differ from one-process mxcore.matmul "
                             f"(path: {path})")


def run(args, torch, dist) -> list[dict]:
    """The measurements of this rank (a list of rows); rank 0's rows include the one-GPU and baseline figures."""
    import mxcore
    from mxcore import distributed

    device = args.device
    world, rank = dist.get_world_size(), dist.get_rank()
    dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    if args.check:
        _check(torch, dist, args, dev, world, rank)
    a, b = _global_problem(torch, args, dev)
    al, bl = _shards(a, b, args.layout, world, rank)
    b_full, b_local = b, bl
    n_local = bl.shape[1]
    flops = 2.0 * al.shape[0] * n_local * al.shape[1] * (world if args.layout == "column" else 1)
    rows = []
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    for dt in args.dtypes.split(","):
        stats = {}
        kw = dict(layout=args.layout, reduce=args.reduce, chunks=args.chunks, backend=args.backend)
        if args.weights == "quantized":  # once, before any call (not timed), on every rank and for the one-GPU run
            bl, b = _quantized_weight(b_local, dt, args.backend), _quantized_weight(b_full, dt, args.backend)
        distributed.matmul(al, bl, dt, stats=stats, **kw)
        kw["check_call"] = not args.check_once
        t_dist = _timer(torch, dist, device, lambda: distributed.matmul(al, bl, dt, **kw), args.warmup, args.iters)
        timed = {}  # the path the timed calls took (the first call records the per-call program)
        distributed.matmul(al, bl, dt, stats=timed, **kw)
        per_call = stats["payload_bytes"]
        if args.layout == "column":  # the same bytes, all-gathered alone: the achieved bus bandwidth
            payload = torch.empty(per_call, dtype=torch.uint8, device=dev)
            out = torch.empty(world * per_call, dtype=torch.uint8, device=dev)
            t_comm = _timer(torch, dist, device, lambda: gather(out, payload), args.warmup, args.iters)
        else:
            part = torch.empty(per_call // 4 or 1, dtype=torch.float32, device=dev)
            t_comm = _timer(torch, dist, device, lambda: dist.all_reduce(part), args.warmup, args.iters)
        one = torch.zeros(1, dtype=torch.float64, device=dev)
        if rank == 0:  # one GPU, the same global problem, the same call a user makes
            one[0] = _timer(torch, None, device, lambda: mxcore.matmul(a, b, dt, backend=args.backend),
                            args.warmup, args.iters)
        dist.broadcast(one, 0)
        t_one = float(one[0])
        rows.append({"dtype": dt, "layout": args.layout, "world": world, "rank": rank, "m": args.m, "n": args.n,
                     "k": args.k, "chunks": args.chunks, "time_s": t_dist, "tflops_rank": flops / t_dist / 1e12,
                     "payload_bytes": per_call, "bf16_bytes": stats["bf16_bytes"], "ratio_vs_bf16": stats["ratio"],
                     "comm_time_s": t_comm, "busbw_GBps": stats["wire_bytes"] / t_comm / 1e9 if t_comm else 0.0,
                     "one_gpu_time_s": t_one, "scaling_efficiency": t_one / (world * t_dist),
                     "path": timed.get("path", ""), "weights": args.weights})
    if args.layout == "column":
        rows.append(_baseline(torch, dist, args, al, b_local, dev, world, rank, gather, flops))
    return rows


def _baseline(torch, dist, args, al, bl, dev, world, rank, gather, flops):
    """What a user writes without mxcore: bf16 all-gather of A, then torch.matmul with the local columns of B."""
    a16, b16 = al.to(torch.bfloat16), bl.to(torch.bfloat16)
    full = torch.empty((world * a16.shape[0], a16.shape[1]), dtype=torch.bfloat16, device=dev)

    def step():
        gather(full, a16)
        return torch.matmul(full, b16)

    t = _timer(torch, dist, args.device, step, args.warmup, args.iters)
    n = a16.numel() * a16.element_size()
    return {"dtype": "bf16 all-gather + torch.matmul", "layout": "column", "world": world, "rank": rank, "m": args.m,
            "n": args.n, "k": args.k, "chunks": 1, "time_s": t, "tflops_rank": flops / t / 1e12, "payload_bytes": n,
            "bf16_bytes": n, "ratio_vs_bf16": 1.0, "comm_time_s": None, "busbw_GBps": None, "one_gpu_time_s": None,
            "scaling_efficiency": None, "path": "torch"}


def _table(rows) -> str:
    head = (f"{'dtype':>32} {'rank':>4} {'ms':>9} {'TFLOP/s':>8} {'MB sent':>9} {'vs bf16':>7} {'busbw GB/s':>10} "
            f"{'eff':>6} path")
    lines = [head]
    for r in rows:
        eff = "" if r["scaling_efficiency"] is None else f"{r['scaling_efficiency']:.2f}"
        bw = "" if r["busbw_GBps"] is None else f"{r['busbw_GBps']:.1f}"
        lines.append(f"{r['dtype']:>32} {r['rank']:>4} {r['time_s'] * 1e3:9.3f} {r['tflops_rank']:8.2f} "
                     f"{r['payload_bytes'] / 1e6:9.3f} {r['ratio_vs_bf16']:7.3f} {bw:>10} {eff:>6} {r['path']}")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    """Entry point (``python -m mxcore.tools.bench_distributed`` under torchrun); returns all ranks' rows on rank 0."""
    import torch
    import torch.distributed as dist

    args = _parser().parse_args(argv)
    try:
        args.m, args.n, args.k = (int(v) for v in args.shape.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--shape {args.shape!r}: pass M x N x K as three integers, e.g. 8192x16384x8192") from None
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cpu" and args.backend == "auto":
        args.backend = "reference"
    owned = _init(torch, dist, args.device)
    try:
        rows = run(args, torch, dist)
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, rows)
        every = [r for per_rank in gathered for r in per_rank]
        if dist.get_rank() == 0:
            if args.check:
                print("check: all layouts match one-process mxcore.matmul bit for bit")
            print(f"world {every[0]['world']}, M={args.m} N={args.n} K={args.k}, layout {args.layout}, "
                  f"chunks {args.chunks}, backend {args.backend}, weights {args.weights}")
            print(_table(sorted(every, key=lambda r: (r["dtype"], r["rank"]))))
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(every, f, indent=1)
        return every
    finally:
        if owned:
            dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
