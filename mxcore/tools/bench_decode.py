"""The real-workload benchmark: one decode step through the linear layers of a decoder, and host time per call.

``python -m mxcore.tools.bench_decode --model llama3-8b`` (also ``python -m mxcore bench --decode llama3-8b``): every
linear layer of the named decoder shape (per layer q, k, v, o, gate, up, down; ``-fused`` shapes: qkv, o, gate_up,
down), one decode step at M tokens, with
the weights in bf16 | fp8 | mxfp8 | mxfp4 through ``mxcore.matmul`` — eager, and captured in a CUDA graph by the
documented torch recipe (warm-up on a side stream, then ``torch.cuda.graph``) — against ``torch.matmul`` on the
bf16 weights eager and graphed, in the same run.  Reported: ms per step, the ratio to torch bf16 (eager: the median
over neighbouring rounds of the two steps run in turns, since the host's speed drifts and both are host-bound;
graphed to graphed), and the share of the weight-bytes bound (the step's weight bytes at the measured
device-to-device copy bandwidth).  Weights are random (no download); each layer has its own.  ``--per-shape`` adds,
for every format, each linear layer's graphed time per call (its layers' calls captured alone), its bandwidth and
its share of the graphed step.

``--host`` adds the host-time-per-call table: small shapes, every dtype mix, 2-D and (B, T, K) activations, in
microseconds per call against ``torch.matmul`` (a loop of calls, synchronised once: host-bound at these sizes).

Needs torch with CUDA and the cuda backend.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

__all__ = ["MODELS", "decode_step", "graphed", "host_per_call", "main"]

#: decoder shapes: layers, hidden size, key/value width (kv heads x head dim), MLP width; "fused": the projections
#: that read the same input stored as one weight each, as serving engines lay them out (q, k, v as one qkv weight;
#: gate and up as one): the same weight bytes in 4 launches per layer instead of 7
MODELS = {
    "llama3-8b": {"layers": 32, "hidden": 4096, "kv": 1024, "intermediate": 14336},
    "llama3-8b-fused": {"layers": 32, "hidden": 4096, "kv": 1024, "intermediate": 14336, "fused": True},
    "llama3.2-3b": {"layers": 28, "hidden": 3072, "kv": 1024, "intermediate": 8192},
}

WEIGHTS = ("bf16", "fp8", "mxfp8", "mxfp4")


def _linears(cfg: dict) -> list:
    """(name, K, N) of one layer's linear layers (y = x @ W, W of shape (K, N))."""
    h, kv, i = cfg["hidden"], cfg["kv"], cfg["intermediate"]
    if cfg.get("fused"):
        return [("qkv", h, h + 2 * kv), ("o", h, h), ("gate_up", h, 2 * i), ("down", i, h)]
    return [("q", h, h), ("k", h, kv), ("v", h, kv), ("o", h, h), ("gate", h, i), ("up", h, i), ("down", i, h)]


def _weight_bytes(fmt: str, k: int, n: int) -> float:
    per = {"bf16": 2.0, "fp8": 1.0, "mxfp8": 1.0 + 1 / 32, "mxfp4": 0.5 + 1 / 32}[fmt]
    return per * k * n


def _quantized(torch, mxcore, w, fmt: str):
    if fmt == "bf16":
        return w
    if fmt == "fp8":
        return mxcore.quantize_tensor(w, "e4m3fn")
    return mxcore.quantize_mx(w, fmt, axis=0)


def _call_dtype(fmt: str):
    return {"bf16": "bf16", "fp8": "fp8"}.get(fmt)  # MX weights: None (bf16 activations x MX weight, inferred)


def _round(torch, fn, calls: int) -> float:
    """Seconds per call of ``fn`` over one round of ``calls`` calls between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / calls


def _time(torch, fn, reps: int, rounds: int = 5) -> float:
    """Seconds per call of ``fn``: the fastest of ``rounds`` rounds of CUDA events around ``reps / rounds`` calls,
    after two warm-up calls (the host-bound eager steps vary with the host's load: the fastest round is the one
    least disturbed)."""
    fn()
    fn()
    torch.cuda.synchronize()
    per = max(1, reps // rounds)
    return min(_round(torch, fn, per) for _ in range(rounds))


def _time_pair(torch, base, fn, reps: int, rounds: int = 8):
    """Eager ``base`` (torch's step) and ``fn`` (mxcore's) timed in turns: ``rounds`` rounds of each, CUDA events
    around ``reps / 5`` calls, the order alternating (base first, then fn first), after two warm-up calls of each.
    The host's speed drifts by up to 1.6x within seconds, and both steps are host-bound, so only rounds that ran
    side by side compare.  Returns (base's fastest round, fn's fastest round, the ratios base / fn of each pair of
    neighbouring rounds), seconds per call."""
    for f in (base, fn, base, fn):
        f()
    torch.cuda.synchronize()
    per = max(1, reps // 5)
    tb, tf, ratios = [], [], []
    for i in range(rounds):
        if i % 2 == 0:
            b = _round(torch, base, per)
            f = _round(torch, fn, per)
        else:
            f = _round(torch, fn, per)
            b = _round(torch, base, per)
        tb.append(b)
        tf.append(f)
        ratios.append(b / f)
    return min(tb), min(tf), ratios


def graphed(torch, step, warmup: int = 3):
    """``step`` captured by the documented torch recipe: warm-up on a side stream, then ``torch.cuda.graph``;
    returns (graph, what the captured ``step`` returned)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    return g, out


def copy_bandwidth(torch, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write of ``nbytes``)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = _time(torch, lambda: dst.copy_(src), 10)
    return 2 * nbytes / t


def _per_shape(torch, fmt: str, m: int, shapes, calls, run, step_ms: float, bw: float, reps: int, log) -> list:
    """Each linear layer's calls (one per decoder layer, each on its own weight) captured alone: microseconds per
    call graphed, its weight bytes per second, the share of the copy bandwidth, and its share of the graphed step
    (``step_ms``).  ``run(x, w)`` is one call."""
    rows = []
    for name in dict.fromkeys(n for n, _, _ in shapes):
        mine = [(c, k, n) for (nm, k, n), c in zip(shapes, calls) if nm == name]

        def step(mine=mine):
            for (x, w), _, _ in mine:
                run(x, w)

        g, _ = graphed(torch, step)
        t = _time(torch, g.replay, reps)
        del g
        _, k, n = mine[0]
        per_call = t / len(mine)
        rate = _weight_bytes(fmt, k, n) / per_call
        row = {"M": m, "weights": fmt, "linear": name, "K": k, "N": n, "calls": len(mine),
               "us_per_call": per_call * 1e6, "GBps": rate / 1e9, "of_bandwidth": rate / bw,
               "share_of_step": t * 1e3 / step_ms}
        rows.append(row)
        log(f"   {name:7s} {k:6d} x {n:<6d} {row['us_per_call']:7.2f} us/call  {row['GBps']:7.0f} GB/s "
            f"({100 * row['of_bandwidth']:3.0f}% of copy)  {100 * row['share_of_step']:4.1f}% of the step")
    return rows


def decode_step(model: str = "llama3-8b", tokens=(1, 16), weights=WEIGHTS, reps: int = 20, log=print,
                per_shape: bool = False) -> dict:
    """Run the decode-step benchmark; return its figures (see the module doc)."""
    import torch

    import mxcore

    cfg = MODELS[model]
    shapes = _linears(cfg) * cfg["layers"]
    bw = copy_bandwidth(torch)
    log(f"# {model}: {len(shapes)} linear layers per step; copy bandwidth {bw / 1e12:.2f} TB/s; "
        f"{torch.cuda.get_device_name()}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    bf16_w = [torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen) * (k ** -0.5)
              for _, k, n in shapes]
    for m in tokens:
        xs = {k: torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
              for k in {k for _, k, _ in shapes}}
        calls = [(xs[k], w) for (_, k, _), w in zip(shapes, bf16_w)]

        def torch_step():
            for x, w in calls:
                torch.matmul(x, w)

        t_eager = _time(torch, torch_step, reps)
        g, _ = graphed(torch, torch_step)
        t_graph = _time(torch, g.replay, reps)
        del g
        bound = sum(_weight_bytes("bf16", k, n) for _, k, n in shapes) / bw
        rows.append({"model": model, "M": m, "weights": "bf16", "impl": "torch", "eager_ms": t_eager * 1e3,
                     "graph_ms": t_graph * 1e3, "bound_ms": bound * 1e3})
        log(_row(rows[-1], rows[-1]))
        base = rows[-1]
        if per_shape:
            base["per_shape"] = _per_shape(torch, "bf16", m, shapes, calls, torch.matmul, base["graph_ms"], bw,
                                           reps, log)
        for fmt in weights:
            qw = [_quantized(torch, mxcore, w, fmt) for w in bf16_w]
            dtype = _call_dtype(fmt)
            qcalls = [(xs[k], w) for (_, k, _), w in zip(shapes, qw)]

            def step():
                for x, w in qcalls:
                    mxcore.matmul(x, w, dtype, out_dtype="bfloat16")

            row = {"model": model, "M": m, "weights": fmt, "impl": "mxcore"}
            try:
                t_base, t_mx, ratios = _time_pair(torch, torch_step, step, reps)
                row["eager_ms"] = t_mx * 1e3
                row["paired_torch_eager_ms"] = t_base * 1e3
                row["eager_x"] = statistics.median(ratios)
                row["eager_x_range"] = [min(ratios), max(ratios)]
                g, _ = graphed(torch, step)
                row["graph_ms"] = _time(torch, g.replay, reps) * 1e3
                del g
            except Exception as exc:  # noqa: BLE001  (reported in the table, the other rows still run)
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            row["bound_ms"] = sum(_weight_bytes(fmt, k, n) for _, k, n in shapes) / bw * 1e3
            rows.append(row)
            log(_row(row, base))
            if per_shape and "error" not in row:
                row["per_shape"] = _per_shape(
                    torch, fmt, m, shapes, qcalls,
                    lambda x, w, dtype=dtype: mxcore.matmul(x, w, dtype, out_dtype="bfloat16"),
                    row["graph_ms"], bw, reps, log)
            qw = qcalls = None  # the next format's weights replace these
            mxcore.clear_cache()
            torch.cuda.empty_cache()
    return {"model": model, "copy_bandwidth_Bps": bw, "device": torch.cuda.get_device_name(), "rows": rows}


def _row(r: dict, base: dict) -> str:
    if "error" in r:
        return f"M={r['M']:<3d} {r['impl']:7s} {r['weights']:6s} ERROR {r['error']}"
    ge = r.get("eager_x", base["eager_ms"] / r["eager_ms"])
    gg = base["graph_ms"] / r["graph_ms"]
    paired = ""
    if "eager_x_range" in r:
        lo, hi = r["eager_x_range"]
        paired = f", paired rounds {lo:4.2f}-{hi:4.2f}x, torch {r['paired_torch_eager_ms']:6.3f} ms"
    return (f"M={r['M']:<3d} {r['impl']:7s} {r['weights']:6s} eager {r['eager_ms']:7.3f} ms ({ge:4.2f}x torch bf16"
            f"{paired})  graph {r['graph_ms']:7.3f} ms ({gg:4.2f}x)  bound {r['bound_ms']:6.3f} ms "
            f"({100 * r['bound_ms'] / r['graph_ms']:3.0f}% of it graphed)")


def host_per_call(reps: int = 2000, log=print, rounds: int = 5) -> list:
    """Host microseconds per call over small shapes and every dtype mix, against torch.matmul (see module doc)."""
    import torch

    import mxcore

    rows = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    cases = []
    for s in (128, 512):
        cases.append((f"{s}^3", (s, s), (s, s)))
    cases.append(("16x4096x4096", (16, 4096), (4096, 4096)))
    cases.append(("(4,4,4096)x4096^2", (4, 4, 4096), (4096, 4096)))
    for name, sa, sb in cases:
        x16 = torch.randn(*sa, device="cuda", dtype=torch.float16, generator=gen)
        w16 = torch.randn(*sb, device="cuda", dtype=torch.float16, generator=gen)
        xb, wb = x16.to(torch.bfloat16), w16.to(torch.bfloat16)
        mixes = [
            ("torch fp16", lambda: torch.matmul(x16, w16)),
            ("fp16", lambda: mxcore.matmul(x16, w16, "fp16")),
            ("bf16", lambda: mxcore.matmul(xb, wb, "bf16")),
            ("fp16 in, dtype=bf16", lambda: mxcore.matmul(x16, w16, "bf16")),
            ("fp8 (bf16 in)", lambda: mxcore.matmul(xb, wb, "fp8")),
            ("mxfp8 (bf16 in)", lambda: mxcore.matmul(xb, wb, "mxfp8")),
            ("mxfp4 (bf16 in)", lambda: mxcore.matmul(xb, wb, "mxfp4")),
        ]
        w4 = mxcore.quantize_mx(wb, "mxfp4", axis=0)
        w8 = mxcore.quantize_mx(wb, "mxfp8", axis=0)
        wf8 = mxcore.quantize_tensor(wb, "e4m3fn")
        mixes += [
            ("bf16 x mxfp4 weight", lambda: mxcore.matmul(xb, w4, out_dtype="bfloat16")),
            ("bf16 x mxfp8 weight", lambda: mxcore.matmul(xb, w8, out_dtype="bfloat16")),
            ("fp8 x fp8 weight", lambda: mxcore.matmul(xb, wf8, "fp8")),
        ]
        if len(sa) == 3:  # per-element scales: a batch does not fold into one product
            mixes = [(label, fn) for label, fn in mixes if not label.startswith(("fp8", "mxfp8 (", "mxfp4 ("))]
        # the mixes take turns, round after round, and each keeps its fastest round: a change in the host's load
        # during the run touches every mix alike
        best, errors = {}, {}
        for _ in range(rounds):
            for label, fn in mixes:
                if label in errors:
                    continue
                try:
                    for _ in range(3):
                        fn()
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(max(1, reps // rounds)):
                        fn()
                    torch.cuda.synchronize()
                    us = (time.perf_counter() - t0) / max(1, reps // rounds) * 1e6
                except Exception as exc:  # noqa: BLE001
                    errors[label] = f"{type(exc).__name__}: {exc}"[:200]
                    continue
                best[label] = min(best.get(label, us), us)
        base = best.get(mixes[0][0])
        for label, _ in mixes:
            if label in errors:
                rows.append({"shape": name, "mix": label, "error": errors[label]})
                log(f"{name:20s} {label:22s} ERROR {errors[label]}")
                continue
            us = best[label]
            rows.append({"shape": name, "mix": label, "us_per_call": us, "vs_torch": us / base})
            log(f"{name:20s} {label:22s} {us:8.1f} us/call  ({us / base:4.2f}x torch.matmul)")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mxcore.tools.bench_decode", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-8b", choices=sorted(MODELS))
    ap.add_argument("--tokens", default="1,16", help="comma-separated M values (default 1,16)")
    ap.add_argument("--weights", default=",".join(WEIGHTS), help=f"comma-separated subset of {','.join(WEIGHTS)}")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--host", action="store_true", help="also the host-time-per-call table")
    ap.add_argument("--per-shape", action="store_true", help="also each linear layer's graphed time and bandwidth")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)
    try:
        tokens = tuple(int(t) for t in args.tokens.split(","))
        weights = tuple(w for w in args.weights.split(",") if w)
        if any(t < 1 for t in tokens) or args.reps < 1 or not set(weights) <= set(WEIGHTS):
            raise ValueError
    except ValueError:
        ap.error(f"--tokens takes positive integers, --reps a positive count, --weights a subset of {WEIGHTS}")
    try:
        import torch

        if not torch.cuda.is_available():
            raise ImportError("torch has no CUDA device here")
    except ImportError as exc:
        print(f"mxcore.tools.bench_decode: needs torch with a CUDA GPU ({exc})")
        return 2
    result = decode_step(args.model, tokens, weights, args.reps, per_shape=args.per_shape)
    if args.host:
        result["host"] = host_per_call()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
