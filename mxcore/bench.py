"""``python -m mxcore bench``: mxcore's GEMM kernels against the vendor library, timed with device events.

    python -m mxcore bench [--backend cuda] [--dtype fp16,bf16,tf32,fp8,mxfp8,mxfp4] [--sizes 2048,4096,8192]
                           [--shapes llm] [--repeats 20] [--json FILE]

For each case: operands are staged once (host quantization for fp8/MX, device preparation kernels); then
the GEMM kernel alone and, separately, the device-side preparation (rounding / decoding / transposition)
are timed with CUDA events: warm-up, then the median of ``--repeats`` timed launches, rotating over
``--sets`` independent input sets so that no run finds its operands in L2.  The vendor baseline runs in the
same process on inputs of the same shape (cuBLAS through torch.matmul for fp16/bf16/tf32/fp32,
cuBLASLt fp8 through torch._scaled_mm).  Printed per case: mxcore TFLOP/s (kernel alone, and with the
device preparation added), baseline TFLOP/s, the ratio, and the fraction of the register-only issue ceiling
of the mma the kernel uses (measured once per instruction).  TFLOP/s counts 2*M*N*K.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

__all__ = ["run", "time_callable", "LLM_SHAPES"]

LLM_SHAPES = [(16, 8192, 8192), (8192, 1024, 8192), (8192, 8192, 1024), (4096, 14336, 4096)]
_DTYPE_ALIASES = {"fp8": "e4m3fn", "mxfp8": "mxfp8_e4m3", "mxfp6": "mxfp6_e2m3"}


def time_callable(cp, fn, repeats: int, warmup: int = 3) -> float:
    """Median seconds of ``fn()`` (device work) over ``repeats`` launches, each bracketed by CUDA events."""
    for _ in range(warmup):
        fn()
    cp.cuda.Device().synchronize()
    times = []
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(repeats):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3)
    return float(np.median(times))


def _inputs(cp, rng, dtype: str, m: int, n: int, k: int, b_colmajor: bool = False):
    """Random normal operands as the backend takes them: fp16 CuPy arrays for fp16, float32 otherwise.
    A is row-major; B row-major (N contiguous) or, with ``b_colmajor``, column-major (K contiguous)."""
    a = cp.asarray(rng.standard_normal((m, k), dtype=np.float32))
    b = cp.asarray(rng.standard_normal((k, n), dtype=np.float32))
    if b_colmajor:
        b = cp.asfortranarray(b)
    if dtype == "fp16":
        a, b = a.astype(cp.float16), b.astype(cp.float16)
    elif dtype == "bf16":
        try:  # torch bf16 tensors are read in place; without torch the kernel reads prepped bf16 copies
            import torch

            a = torch.from_dlpack(a).to(torch.bfloat16)
            b = torch.from_dlpack(b).to(torch.bfloat16)
        except ImportError:
            pass
    return a, b


def run(backend_name: str, dtypes, shapes, *, repeats: int = 20, sets: int = 3, seed: int = 0, progress=print,
        tiles=(None,), b_colmajor: bool = False, baseline: bool = True):
    from mxcore import dtypes as _dt
    from mxcore.backends import select

    be = select(backend_name)
    if not hasattr(be, "plan"):
        raise SystemExit(f"backend {be.name!r} has no benchmark support (needs plan())")
    import cupy as cp

    rng = np.random.default_rng(seed)
    rows = []
    ceilings: dict = {}
    cases = [(d, s, t) for d in dtypes for s in shapes for t in tiles]
    t_start = time.time()
    for idx, (dtype, (m, n, k), tile) in enumerate(cases, 1):
        progress(f"[{idx}/{len(cases)}] {dtype} {m}x{n}x{k} {tile or ''} ... ({time.time() - t_start:.0f}s)", flush=True)
        be.force_tile = tile
        mdt = _dt.resolve(dtype, be.target().arch)
        a, b = _inputs(cp, rng, dtype, m, n, k, b_colmajor)
        plans = [be.plan(a, b, mdt)]  # fresh random operands; further sets are device copies of them
        del a, b
        plans += [plans[0].clone() for _ in range(sets - 1)]
        it = iter(range(1 << 62))
        gemm = lambda: plans[next(it) % sets].gemm()  # noqa: E731
        t_gemm = time_callable(cp, gemm, repeats)
        it2 = iter(range(1 << 62))
        prep = lambda: plans[next(it2) % sets].prep()  # noqa: E731
        t_prep = time_callable(cp, prep, max(3, repeats // 4))
        flops = 2.0 * m * n * k
        row = {"dtype": dtype, "m": m, "n": n, "k": k, "tile": plans[0].variant.name if plans[0].variant else "",
               "mxcore_tflops": flops / t_gemm / 1e12, "mxcore_ms": t_gemm * 1e3, "prep_ms": t_prep * 1e3,
               "mxcore_with_prep_tflops": flops / (t_gemm + t_prep) / 1e12}
        plans.clear()
        base = be.vendor_baseline(dtype, m, n, k) if baseline and hasattr(be, "vendor_baseline") else None
        if base is not None:
            label, fn = base
            t_base = time_callable(cp, fn, repeats)
            row.update(baseline=label, baseline_tflops=flops / t_base / 1e12, baseline_ms=t_base * 1e3,
                       ratio=t_base / t_gemm)
        if hasattr(be, "instruction_ceiling"):
            from mxcore.backends.cuda import ceiling_element

            key = ceiling_element(dtype, be.target().arch)
            if key not in ceilings:
                ceilings[key] = be.instruction_ceiling(dtype)
            mnem, ceil_tf = ceilings[key]
            row.update(ceiling_instruction=mnem, ceiling_tflops=ceil_tf,
                       fraction_of_ceiling=row["mxcore_tflops"] / ceil_tf)
        rows.append(row)
        progress("    " + _fmt(row), flush=True)
    be.force_tile = None
    return rows


def _fmt(r: dict) -> str:
    s = (f"{r['dtype']:<12} {r['m']}x{r['n']}x{r['k']:<6} mxcore {r['mxcore_tflops']:7.1f} TFLOP/s "
         f"({r['mxcore_ms']:.3f} ms; +prep {r['prep_ms']:.3f} ms -> {r['mxcore_with_prep_tflops']:.1f})")
    if "baseline_tflops" in r:
        s += f" | {r['baseline']}: {r['baseline_tflops']:7.1f} | ratio {r['ratio']:.2f}"
    if "ceiling_tflops" in r:
        s += f" | ceiling {r['ceiling_tflops']:.0f} ({100 * r['fraction_of_ceiling']:.0f}%)"
    return s


def _table(rows) -> str:
    head = (f"{'dtype':<12} {'M x N x K':<18} {'mxcore':>8} {'+prep':>8} {'vendor':>8} {'ratio':>6} "
            f"{'ceiling':>8} {'%ceil':>6}  tile")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['dtype']:<12} {r['m']}x{r['n']}x{r['k']:<8} {r['mxcore_tflops']:8.1f} "
                     f"{r['mxcore_with_prep_tflops']:8.1f} {r.get('baseline_tflops', float('nan')):8.1f} "
                     f"{r.get('ratio', float('nan')):6.2f} {r.get('ceiling_tflops', float('nan')):8.0f} "
                     f"{100 * r.get('fraction_of_ceiling', float('nan')):5.0f}%  {r['tile']}")
    return "\n".join(lines)


def _cli(argv) -> int:
    p = argparse.ArgumentParser(prog="mxcore bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="cuda")
    p.add_argument("--dtype", default="fp16,bf16,tf32,fp8,mxfp8,mxfp4")
    p.add_argument("--sizes", default="2048,4096,8192", help="square sizes M=N=K (comma list; '' for none)")
    p.add_argument("--shapes", default="", help="'llm' for tall/skinny LLM shapes, or MxNxK,MxNxK")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--sets", type=int, default=3, help="input sets rotated between launches")
    p.add_argument("--json", default=None, help="write the rows as JSON to this file")
    p.add_argument("--tile", default="", help="force tile configurations (comma list; tuning)")
    p.add_argument("--b-colmajor", action="store_true", help="B column-major (K contiguous) instead of row-major")
    p.add_argument("--no-baseline", action="store_true", help="skip the vendor library")
    args = p.parse_args(argv)
    dtypes = [_DTYPE_ALIASES.get(d.strip().lower(), d.strip().lower()) for d in args.dtype.split(",") if d.strip()]
    shapes = [(s, s, s) for s in (int(x) for x in args.sizes.split(",") if x.strip())]
    for spec in (x.strip() for x in args.shapes.split(",") if x.strip()):
        if spec == "llm":
            shapes += LLM_SHAPES
        else:
            shapes.append(tuple(int(v) for v in spec.lower().split("x")))
    try:
        tiles = [t.strip() for t in args.tile.split(",") if t.strip()] or [None]
        rows = run(args.backend, dtypes, shapes, repeats=args.repeats, sets=args.sets, tiles=tiles,
                   b_colmajor=args.b_colmajor, baseline=not args.no_baseline)
    except ImportError as exc:
        print(f"mxcore bench needs CuPy and an NVIDIA GPU: {exc}", file=sys.stderr)
        return 2
    print(_table(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(_cli(sys.argv[1:]))
