"""``python -m mxcore bench --end-to-end``: what a user calls, timed beside the kernel alone and the vendor pipeline.

For each dtype x shape, on torch CUDA (or CuPy) inputs of ``--input-dtype`` (fp16 or bf16) already on the GPU:

* **end to end** — ``mxcore.matmul(a, b, dtype=...)`` exactly as a user calls it: quantization (fp8: per-tensor
  amax + scale + encode; MX: block scales + codes), operand staging, the GEMM and the output conversion.  Timed as
  the wall time per call of ``--calls`` back-to-back calls followed by one device synchronisation (so host overhead,
  device work and any synchronisation inside the call all count), median of ``--repeats`` such loops, rotating over
  ``--sets`` input sets.
* **kernel only** — the backend's plan for the same operands, its ``gemm()`` alone between two device events.
* **vendor** — the pipeline a user would otherwise write, in the same run: ``torch.matmul`` for fp16/bf16; for fp8
  ``amax`` of each operand, the power-of-two scale, the cast to ``float8_e4m3fn`` (B made column-major, as
  ``torch._scaled_mm`` requires) and ``torch._scaled_mm`` with the inverse scales.  MX has no vendor pipeline on
  Hopper (cuBLASLt's block-scaled fp8 needs sm_100): the column stays empty.  fp8 also gets the same pipeline under
  ``torch.compile`` (``fullgraph=True``, default mode: amax, scale and cast fused by Inductor), the "compiled"
  column.  Weight-only pairs (``bf16:mxfp4``):
  ``torch.matmul`` with a 16-bit weight.

``--weights quantized``: B is quantized once before the timed calls (``mxcore.quantize_mx`` / ``quantize_tensor``,
the linear-layer call ``mxcore.matmul(x, w_q)``); the fp8 vendor pipeline then casts its B once as well.

``--graph``: the end-to-end and vendor columns time a torch CUDA graph of as many such calls as an eager loop
makes instead (captured once on a side stream after each input set's layout ran there three times; one replay +
one sync per loop, divided by the calls): what a user who captures the region (``torch.cuda.graph``, ``torch.compile``'s
"reduce-overhead") gets — no host time per call.  2-D calls on mxcore's per-call paths only (others refuse capture
with a typed error).

TFLOP/s counts 2*M*N*K per call.  Ratios: ``e2e / kernel`` (how much of the kernel's rate the user's call keeps)
and ``e2e / vendor`` (against the vendor pipeline's end-to-end rate).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from .timing import write_rows

__all__ = ["E2E_SHAPES", "run_e2e"]

E2E_SHAPES = [(128, 128, 128), (512, 512, 512), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
              (16, 8192, 8192), (64, 512, 4096, 4096)]  # the last: (64, 512, 4096) @ a shared (4096, 4096)


def _median_wall_per_call(fn, sync, calls: int, repeats: int, warmup: int = 2) -> float:
    """Median over ``repeats`` loops of (wall time of ``calls`` back-to-back ``fn()`` + one sync) / calls."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / calls)
    return float(np.median(times))


def _graphed(torch, fn, calls: int, warmup: int):
    """``calls`` back-to-back ``fn()`` captured into a torch CUDA graph after ``warmup`` eager calls on the capture
    stream (a layout's first calls build what its captured calls use); returns the graph's replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(calls):
                fn()
    torch.cuda.current_stream().wait_stream(s)
    return g.replay


def _timed(fn, sync, calls: int, repeats: int, graph=None, sets: int = 1) -> float:
    """Seconds per call of ``fn``: back-to-back eager calls, or (``graph``: torch) replays of a graph of them,
    captured after three warm-up calls per input set that ``fn`` rotates over."""
    if graph is None:
        return _median_wall_per_call(fn, sync, calls, repeats)
    return _median_wall_per_call(_graphed(graph, fn, calls, warmup=3 * sets), sync, 1, repeats) / calls


def _rotating(fns):
    turn = [0]

    def call():
        turn[0] += 1
        return fns[turn[0] % len(fns)]()

    return call


def _calls_for(m: int, n: int, k: int) -> int:
    """Enough back-to-back calls that one loop lasts well past timer resolution, few enough to stay quick."""
    flops = 2.0 * m * n * k
    return int(min(200, max(3, 2e13 // max(flops, 1.0))))


def _vendor_fp8(torch, a, b, weight_once: bool = False):
    """The eager torch pipeline for per-tensor fp8: amax, power-of-two scale, cast, _scaled_mm (``weight_once``: B's
    scale and cast made here, once, as a user does for a weight)."""
    f8 = torch.float8_e4m3fn
    fmax = torch.finfo(f8).max

    def scale_of(x):
        amax = x.abs().amax().float().clamp(min=1e-30)
        return torch.exp2(torch.ceil(torch.log2(amax / fmax)))

    def cast_b():
        sb = scale_of(b)
        return (b / sb).to(f8).t().contiguous().t(), sb

    kept = cast_b() if weight_once else None

    def run():
        sa = scale_of(a)
        a8 = (a / sa).to(f8)
        b8, sb = kept or cast_b()
        return torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

    return run


def run_e2e(dtypes, shapes, *, backend: str = "cuda", input_dtype: str = "fp16", repeats: int = 5, sets: int = 2,
            seed: int = 0, baseline: bool = True, weights: str = "float", graph: bool = False,
            progress=print) -> list[dict]:
    """One row per (dtype, shape); see the module docstring for what is timed (``weights="quantized"``: B is
    quantized once before the timed calls, the linear-layer call; ``graph``: the calls replayed from a CUDA
    graph)."""
    import torch

    import mxcore
    from mxcore import dtypes as _dt
    from mxcore.backends import select
    from mxcore.tools.timing import time_callable
    from mxcore.errors import UnsupportedError
    from mxcore.operands import quantize_on_device

    be = select(backend)
    measure = be.timer()
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[input_dtype]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    sync = torch.cuda.synchronize
    rows = []
    for dtype in dtypes:
        mdt = _dt.resolve(dtype, be.target().arch)
        for shape in shapes:
            bsz, (m, n, k) = (shape[0], shape[1:]) if len(shape) == 4 else (0, shape)
            lead = (bsz,) if bsz else ()
            progress(f"{dtype} {'x'.join(map(str, shape))} ...", flush=True)
            pairs = [(torch.randn(*lead, m, k, device="cuda", generator=gen, dtype=torch.float32).to(tdt),
                      torch.randn(k, n, device="cuda", generator=gen, dtype=torch.float32).to(tdt))
                     for _ in range(sets)]
            once = weights == "quantized"
            # B quantized once as the product's B (MX: blocked along K; fp8: in the backend's code order)
            calls_b = [quantize_on_device(b, mdt.b, "b", b_order=be.b_code_order) if once else b for _, b in pairs]
            flops = 2.0 * max(bsz, 1) * m * n * k
            calls = _calls_for(max(bsz, 1) * m, n, k)
            g = torch if graph else None
            try:
                e2e = _timed(_rotating([lambda a=a, b=b: mxcore.matmul(a, b, dtype=dtype, backend=be.name)
                                        for (a, _), b in zip(pairs, calls_b)]), sync, calls, repeats, g, sets)
            except UnsupportedError as exc:  # --graph: a call with no per-call path refuses capture
                if not graph:
                    raise
                progress(f"    not capturable: {str(exc).split('.')[0]}", flush=True)
                e2e = float("nan")
            plans = [be.plan(a, b, mdt) for (a, _), b in zip(pairs, calls_b)]
            try:
                kern = time_callable(measure, _rotating([p.gemm for p in plans]), max(5, repeats))
                variant = plans[0].variant
            finally:
                for p in plans:
                    p.close()
            label = (_label(dtype) + (" (B once)" if once and mdt.b.kind != "float" else "")
                     + (" graph" if graph else ""))
            row = {"dtype": label, "batch": bsz, "m": m, "n": n, "k": k, "input": input_dtype, "variant": variant,
                   "e2e_us": e2e * 1e6, "e2e_tflops": flops / e2e / 1e12,
                   "kernel_us": kern * 1e6, "kernel_tflops": flops / kern / 1e12, "e2e_over_kernel": kern / e2e}
            vendor = None
            if baseline and mdt.kind in ("float", _dt.WONLY_KIND) and mdt.a.name in ("fp16", "bf16"):
                vdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[mdt.a.name]  # weight-only: a 16-bit weight
                vp = [(a.to(vdt), b.to(vdt)) for a, b in pairs]
                vendor = ("torch.matmul", _rotating([lambda a=a, b=b: torch.matmul(a, b) for a, b in vp]))
            elif baseline and mdt.kind == "fp8" and not bsz:  # torch._scaled_mm takes 2-D operands
                vendor = ("torch fp8 pipeline", _rotating([_vendor_fp8(torch, a, b, once) for a, b in pairs]))
            if vendor is not None:
                label, fn = vendor
                t = _timed(fn, sync, calls, repeats, g, sets)
                row.update(vendor=label, vendor_us=t * 1e6, vendor_tflops=flops / t / 1e12, e2e_over_vendor=t / e2e)
            if baseline and mdt.kind == "fp8" and not bsz and not graph:  # Inductor's fused amax + cast + _scaled_mm
                fns = [torch.compile(_vendor_fp8(torch, a, b, once), fullgraph=True) for a, b in pairs]
                t = _timed(_rotating(fns), sync, calls, repeats, None, sets)
                row.update(compiled_us=t * 1e6, e2e_over_compiled=t / e2e)
            rows.append(row)
            progress("    " + _fmt(row), flush=True)
            del pairs
            torch.cuda.empty_cache()
    return rows


def _label(dtype) -> str:
    return dtype if isinstance(dtype, str) else ":".join(dtype)


def _shape(r: dict) -> str:
    return (f"{r['batch']}x" if r.get("batch") else "") + f"{r['m']}x{r['n']}x{r['k']}"


def _fmt(r: dict) -> str:
    s = (f"{r['dtype']:<18} {_shape(r):<16} e2e {r['e2e_us']:10.1f} us {r['e2e_tflops']:7.1f} TFLOP/s | "
         f"kernel {r['kernel_tflops']:7.1f} | e2e/kernel {r['e2e_over_kernel']:.2f}")
    if "vendor_tflops" in r:
        s += f" | {r['vendor']} {r['vendor_us']:.1f} us {r['vendor_tflops']:.1f} | e2e/vendor {r['e2e_over_vendor']:.2f}"
    if "compiled_us" in r:
        s += f" | torch.compile {r['compiled_us']:.1f} us | e2e/compiled {r['e2e_over_compiled']:.2f}"
    return s


def table(rows) -> str:
    head = (f"{'dtype':<18} {'M x N x K':<16} {'e2e us':>10} {'e2e TF/s':>9} {'kernel TF/s':>11} {'e2e/kern':>8} "
            f"{'vendor us':>10} {'vendor TF/s':>11} {'e2e/vendor':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['dtype']:<18} {_shape(r):<16} {r['e2e_us']:10.1f} {r['e2e_tflops']:9.1f} "
                     f"{r['kernel_tflops']:11.1f} {r['e2e_over_kernel']:8.2f} {r.get('vendor_us', float('nan')):10.1f} "
                     f"{r.get('vendor_tflops', float('nan')):11.1f} {r.get('e2e_over_vendor', float('nan')):10.2f}")
    return "\n".join(lines)


def cli(argv) -> int:
    from mxcore.tools.cli import CLIError, parse_shapes, parse_sizes, positive_int

    p = argparse.ArgumentParser(prog="mxcore bench --end-to-end", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="cuda")
    p.add_argument("--dtype", default="fp16,bf16,fp8,mxfp8,mxfp4")
    p.add_argument("--sizes", default="", help="square sizes (comma list); default: the E2E_SHAPES set")
    p.add_argument("--shapes", default="", help="MxNxK or BxMxNxK (a (B, M, K) batch times a shared (K, N)), comma list")
    p.add_argument("--input-dtype", default="fp16", choices=["fp16", "bf16"])
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--sets", type=positive_int, default=2)
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--weights", choices=("float", "quantized"), default="float",
                   help="B as the calls get it: float data quantized per call, or quantized once before them "
                   "(an MXTensor / ScaledTensor: the linear-layer call; the fp8 vendor pipeline casts its B once too)")
    p.add_argument("--graph", action="store_true",
                   help="time CUDA-graph replays of the calls (and of the vendor's) instead of eager calls")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    dtypes = [tuple(d.split(":")) if ":" in d else d for d in
              (d.strip().lower() for d in args.dtype.split(",")) if d]
    if not dtypes:
        raise CLIError(f"--dtype {args.dtype!r} names no dtype; pass e.g. --dtype fp16,mxfp4")
    shapes = [(s, s, s) for s in parse_sizes(args.sizes)]
    shapes += parse_shapes(args.shapes, dims=(3, 4))
    try:
        import torch
    except ImportError:
        raise CLIError("--end-to-end needs torch with CUDA (the inputs are torch CUDA tensors): pip install torch, "
                       "a CUDA build") from None
    if not torch.cuda.is_available():
        raise CLIError("--end-to-end needs torch with a usable CUDA GPU (the inputs are torch CUDA tensors); this "
                       f"torch {torch.__version__} sees none")
    rows = run_e2e(dtypes, shapes or E2E_SHAPES, backend=args.backend, input_dtype=args.input_dtype,
                   repeats=args.repeats, sets=args.sets, baseline=not args.no_baseline, weights=args.weights,
                   graph=args.graph)
    print(table(rows))
    write_rows(rows, args.json)
    return 0
