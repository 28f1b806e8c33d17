"""``python -m mxcore bench``: mxcore's GEMM kernels against the vendor library, timed with device events.

    python -m mxcore bench [--backend cuda] [--dtype fp16,bf16,tf32,fp8,mxfp8,mxfp4] [--sizes 2048,4096,8192]
                           [--shapes llm] [--repeats 20] [--json FILE]

A dtype ``A:B`` is an (A, B) pair, e.g. ``bf16:mxfp4`` (weight-only: 16-bit activations x an MX weight, quantized
once before timing); its kernel and the vendor's are timed as 20 back-to-back launches between two events (decode
kernels last microseconds, less than one launch's host work).  Those rows also give the kernel's memory bandwidth, counting the bytes one product must read
(the weight's packed codes, 4 bits per mxfp4 element, plus its E8M0 scales and the 16-bit activations), against
a device-to-device copy timed in the same run (read + write), and the path the backend took (``path``).

For each case: operands are staged once (host quantization for fp8/MX, device preparation kernels); then
the GEMM kernel alone and, separately, the device-side preparation (rounding / decoding / transposition)
are timed with the backend's device events: warm-up, then the median of ``--repeats`` timed launches,
rotating over ``--sets`` independent input sets so that no run finds its operands in L2.  The vendor
baseline runs in the same process on inputs of the same shape (whatever the backend's ``vendor_baseline``
names: cuBLAS / cuBLASLt through torch on NVIDIA, hipBLASLt through a ROCm torch on AMD).  Printed per case:
mxcore TFLOP/s (kernel alone, and with the device preparation added), baseline TFLOP/s, the ratio, and the
fraction of the register-only issue ceiling of the matrix instruction the kernel uses (measured once per
instruction).  TFLOP/s counts 2*M*N*K.  ``--loop-ceilings`` also times the kernel's own main loop with parts
removed (plans that list ``diagnostics``: the CUDA kernels): "smem" (operands resident in shared
memory, no global loads in the loop), "mma" (ldmatrix + mma alone, no barriers either) and "feed" (the
global->shared copies, waits and barriers alone) — what each part of the kernel allows by itself, in TFLOP/s
of the same problem.

Vendor-neutral: the backend is used only through the contract of ``backends/_contract.py`` —
``plan(a, b, mdt, tile=...)`` (``gemm()``, ``prep()``, ``clone()``, ``close()``, ``variant``, ``diagnostics`` /
``gemm_diagnostic(name)``), ``timer()``, ``bench_operands(a, b, dtype)``, ``tiles(dtype)``,
``vendor_baseline(dtype, m, n, k)``, ``instruction_ceiling(dtype)`` and ``ceiling_key(dtype)`` (which dtypes share
one instruction, hence one ceiling measurement).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from .timing import time_back_to_back, time_callable, write_rows

__all__ = ["LLM_SHAPES", "run", "time_callable"]

LLM_SHAPES = [(16, 8192, 8192), (8192, 1024, 8192), (8192, 8192, 1024), (4096, 14336, 4096)]
# Default sizes and repeats when --sizes / --repeats are not given: a GPU's, and the CPU's (the reference backend
# computes in numpy: seconds per case at 512, minutes at 2048)
DEFAULT_SIZES = {"gpu": (2048, 4096, 8192), "cpu": (256, 512)}
DEFAULT_REPEATS = {"gpu": 20, "cpu": 3}
CPU_SLOW_SIZE = 1024  # above this, a CPU case takes minutes: say so before starting
_DTYPE_ALIASES = {"fp8": "e4m3fn", "mxfp8": "mxfp8_e4m3", "mxfp6": "mxfp6_e2m3"}


def _host_inputs(rng, m: int, n: int, k: int, b_colmajor: bool):
    """Random normal float32 operands; A row-major, B row-major (N contiguous) or column-major (K contiguous)."""
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    return a, (np.asfortranarray(b) if b_colmajor else b)


def _close(plans) -> None:
    """Release every plan's device memory now (HIP plans hold raw allocations until closed)."""
    for p in plans:
        p.close()
    plans.clear()


def _ceiling(be, dtype: str, cache: dict):
    """(mnemonic, TFLOP/s) of the instruction ``dtype`` runs on (or None), measured once per ``ceiling_key``."""
    key = be.ceiling_key(dtype)
    if key not in cache:
        cache[key] = be.instruction_ceiling(dtype)
    return cache[key]


def run(backend_name: str, dtypes, shapes, *, repeats: int = 20, sets: int = 3, seed: int = 0, progress=print,
        tiles=(None,), b_colmajor: bool = False, baseline: bool = True, backend=None, loop_ceilings: bool = False,
        options=None):
    """Benchmark ``dtypes`` x ``shapes`` x ``tiles`` (None: the backend's choice; ``("all",)``: every tile of
    ``backend.tiles(dtype)``); returns one dict per case.  ``backend``: an already built backend object (tests
    pass a fake one); otherwise ``backend_name`` goes through the registry."""
    from mxcore import dtypes as _dt

    from mxcore.backends import Backend

    if backend is None:
        from mxcore.backends import select

        backend = select(backend_name)
    be = backend
    if not isinstance(be, Backend):
        raise SystemExit(f"{type(be).__name__} is not an mxcore backend (subclass backends._contract.Backend)")
    measure = be.timer()
    rng = np.random.default_rng(seed)
    rows = []
    ceilings: dict = {}
    cases = [(d, s, t) for d in dtypes for s in shapes for t in (be.tiles(d) if tuple(tiles) == ("all",) else tiles)]
    t_start = time.time()
    copy_gbs = copy_bandwidth(measure) if any(":" in d for d in dtypes) else None
    if copy_gbs:
        progress(f"device-to-device copy: {copy_gbs:.0f} GB/s (read + write)", flush=True)
    for idx, (dtype, (m, n, k), tile) in enumerate(cases, 1):
        progress(f"[{idx}/{len(cases)}] {dtype} {m}x{n}x{k} {tile or ''} ... ({time.time() - t_start:.0f}s)",
                 flush=True)
        pair = tuple(dtype.split(":")) if ":" in dtype else dtype
        rows.append(_case(be, measure, rng, dtype, m, n, k, _dt.resolve(pair, be.target().arch), repeats, sets,
                          b_colmajor, baseline, ceilings, loop_ceilings, tile, options or {}))
        if copy_gbs and "gbs" in rows[-1]:
            rows[-1].update(copy_gbs=copy_gbs, of_copy=rows[-1]["gbs"] / copy_gbs)
        progress("    " + _fmt(rows[-1]), flush=True)
    return rows


def _case(be, measure, rng, dtype, m, n, k, mdt, repeats, sets, b_colmajor, baseline, ceilings,
          loop_ceilings=False, tile=None, options=None) -> dict:
    opts = {} if tile is None else {"tile": tile}
    if mdt.kind == _dt_wonly():
        opts.update(options or {})  # e.g. wonly_path
    wonly = mdt.kind == _dt_wonly()
    if wonly:  # weight-only: activations in their 16-bit dtype, the weight quantized once (not timed)
        x, w = _host_inputs(rng, m, n, k, b_colmajor)
        a, b = be.bench_operands(x, w, mdt.a.name)[0], _weight(be, w, mdt.b.name)
    else:
        a, b = be.bench_operands(*_host_inputs(rng, m, n, k, b_colmajor), dtype)
    plans = []
    try:
        plans.append(be.plan(a, b, mdt, **opts))
        del a, b
        for _ in range(sets - 1):  # further input sets: device copies of the first, else fresh inputs
            try:
                plans.append(plans[0].clone())
            except NotImplementedError:
                x, y = be.bench_operands(*_host_inputs(rng, m, n, k, b_colmajor), dtype)
                plans.append(be.plan(x, y, mdt, **opts))
        if wonly:  # short kernels: back-to-back launches (below), for the vendor too
            t_gemm = time_back_to_back(measure, _rotating(plans, lambda p: p.gemm()), repeats)
        else:
            t_gemm = time_callable(measure, _rotating(plans, lambda p: p.gemm()), repeats)
        t_prep = time_callable(measure, _rotating(plans, lambda p: p.prep()), max(3, repeats // 4))
        variant = plans[0].variant
        loops = _loop_ceilings(measure, plans, repeats) if loop_ceilings else {}
    finally:
        _close(plans)
    flops = 2.0 * m * n * k
    row = {"dtype": dtype, "m": m, "n": n, "k": k, "tile": variant,
           "mxcore_tflops": flops / t_gemm / 1e12, "mxcore_ms": t_gemm * 1e3, "prep_ms": t_prep * 1e3,
           "mxcore_with_prep_tflops": flops / (t_gemm + t_prep) / 1e12}
    row.update({f"loop_{name}_tflops": flops / t / 1e12 for name, t in loops.items()})
    if wonly:
        from .. import formats

        wbytes = n * k * formats.get(mdt.b.element).bits / 8 + n * -(-k // 32)  # packed codes + E8M0 scales
        row.update(path="registers" if "registers" in variant else "staged", weight_bytes=wbytes,
                   gbs=(wbytes + 2 * m * k) / t_gemm / 1e9)
    base = be.vendor_baseline(mdt.a.name if wonly else dtype, m, n, k) if baseline else None
    if base is not None:
        label, fn = base
        t_base = (time_back_to_back if wonly else time_callable)(measure, fn, repeats)
        row.update(baseline=label, baseline_tflops=flops / t_base / 1e12, baseline_ms=t_base * 1e3,
                   ratio=t_base / t_gemm)
        del fn, base
    ceil = _ceiling(be, dtype, ceilings)
    if ceil is not None:
        mnem, ceil_tf = ceil
        row.update(ceiling_instruction=mnem, ceiling_tflops=ceil_tf,
                   fraction_of_ceiling=row["mxcore_tflops"] / ceil_tf)
    return row


def _dt_wonly() -> str:
    from ..dtypes import WONLY_KIND

    return WONLY_KIND


def _weight(be, w, fmt: str):
    """A host float weight as a device MXTensor (blocks along K), quantized once where the backend's operands live."""
    from .. import mx

    dev = be.bench_operands(w, w[:1], "fp32")[0]
    return mx.quantize_mx(dev, fmt, axis=0)


def copy_bandwidth(measure, nbytes: int = 1 << 28, repeats: int = 20) -> float | None:
    """GB/s of a device-to-device copy of ``nbytes`` (read + write counted), on torch's current CUDA/ROCm device;
    None without torch or a GPU."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
    except ImportError:
        return None
    x = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    return 2 * nbytes / time_callable(measure, lambda: y.copy_(x), repeats) / 1e9


def _rotating(plans, call):
    """A callable that runs ``call(plan)`` on the next plan (input set) at each call."""
    turn = [0]

    def run():
        turn[0] += 1
        return call(plans[turn[0] % len(plans)])

    return run


def _loop_ceilings(measure, plans, repeats) -> dict:
    """{diagnostic name: median seconds} for the plans' loop diagnostics (input sets rotated); {} when the plan
    has none (e.g. split K) or cannot run them."""
    from mxcore.errors import UnsupportedError

    try:
        return {name: time_callable(measure, _rotating(plans, lambda p, x=name: p.gemm_diagnostic(x)), repeats)
                for name in plans[0].diagnostics}
    except UnsupportedError:
        return {}


def _loop_names(rows) -> list[str]:
    """The diagnostic names present in ``rows`` (``loop_<name>_tflops`` keys), in the backend's order."""
    return list(dict.fromkeys(k[5:-7] for r in rows for k in r if k.startswith("loop_") and k.endswith("_tflops")))


def _tf(v: float, width: int) -> str:
    """TFLOP/s with one decimal, or three significant digits below 1 (CPU rates would print as 0.0)."""
    return f"{v:{width}.1f}" if not 0 < v < 1 else f"{v:{width}.3g}"


def _fmt(r: dict) -> str:
    s = (f"{r['dtype']:<12} {r['m']}x{r['n']}x{r['k']:<6} mxcore {_tf(r['mxcore_tflops'], 7)} TFLOP/s "
         f"({r['mxcore_ms']:.3f} ms; +prep {r['prep_ms']:.3f} ms -> {_tf(r['mxcore_with_prep_tflops'], 0)})")
    if "baseline_tflops" in r:
        s += f" | {r['baseline']}: {r['baseline_tflops']:7.1f} | ratio {r['ratio']:.2f}"
    if "ceiling_tflops" in r:
        s += f" | ceiling {r['ceiling_tflops']:.0f} ({100 * r['fraction_of_ceiling']:.0f}%)"
    if "gbs" in r:
        s += f" | {r['gbs']:.0f} GB/s" + (f" ({100 * r['of_copy']:.0f}% of copy)" if "of_copy" in r else "")
        s += f" | path {r['path']}"
    loops = _loop_names([r])
    if loops:
        s += " | loop " + ", ".join(f"{x} {r[f'loop_{x}_tflops']:.0f}" for x in loops)
    return s


def _table(rows) -> str:
    loops = _loop_names(rows)
    head = (f"{'dtype':<12} {'M x N x K':<18} {'mxcore':>8} {'+prep':>8} {'vendor':>8} {'ratio':>6} "
            f"{'ceiling':>8} {'%ceil':>6}" + "".join(f" {x:>6}" for x in loops) + "  tile")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['dtype']:<12} {r['m']}x{r['n']}x{r['k']:<8} {_tf(r['mxcore_tflops'], 8)} "
                     f"{_tf(r['mxcore_with_prep_tflops'], 8)} {r.get('baseline_tflops', float('nan')):8.1f} "
                     f"{r.get('ratio', float('nan')):6.2f} {r.get('ceiling_tflops', float('nan')):8.0f} "
                     f"{100 * r.get('fraction_of_ceiling', float('nan')):5.0f}%"
                     + "".join(f" {r.get(f'loop_{x}_tflops', float('nan')):6.0f}" for x in loops)
                     + f"  {r['tile']}")
    wo = [r for r in rows if "gbs" in r]
    if wo:
        lines += ["", f"{'weight-only':<12} {'M x N x K':<18} {'path':>9} {'GB/s':>7} {'of copy':>8} {'vs vendor':>9}"]
        for r in wo:
            lines.append(f"{r['dtype']:<12} {r['m']}x{r['n']}x{r['k']:<8} {r['path']:>9} {r['gbs']:7.0f} "
                         f"{100 * r.get('of_copy', float('nan')):7.0f}% {r.get('ratio', float('nan')):9.2f}")
    return "\n".join(lines)


def _cli(argv) -> int:
    if "--decode" in argv:  # the decode step of a named decoder shape: mxcore.tools.bench_decode
        from mxcore.tools.bench_decode import main as decode

        i = argv.index("--decode")
        return decode(["--model", argv[i + 1] if i + 1 < len(argv) else ""] + argv[:i] + argv[i + 2:])
    if "--end-to-end" in argv:  # what a user calls, beside the kernel and the vendor pipeline: mxcore.tools.bench_e2e
        from mxcore.tools.bench_e2e import cli

        return cli([x for x in argv if x != "--end-to-end"])
    from mxcore.tools.cli import CLIError, command_line_spelling, parse_shapes, parse_sizes, positive_int

    p = argparse.ArgumentParser(prog="mxcore bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="cuda", help="cuda, hip, reference, or auto (the first usable backend)")
    p.add_argument("--dtype", default="fp16,bf16,tf32,fp8,mxfp8,mxfp4")
    p.add_argument("--sizes", default=None, help="square sizes M=N=K (comma list; '' for none; default "
                   f"{','.join(map(str, DEFAULT_SIZES['gpu']))} on a GPU, {','.join(map(str, DEFAULT_SIZES['cpu']))} "
                   "on the CPU)")
    p.add_argument("--shapes", default="", help="'llm' for tall/skinny LLM shapes, or MxNxK,MxNxK")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help=f"timed runs per case (default {DEFAULT_REPEATS['gpu']}; {DEFAULT_REPEATS['cpu']} on the CPU)")
    p.add_argument("--sets", type=positive_int, default=3, help="input sets rotated between launches")
    p.add_argument("--json", default=None, help="write the rows as JSON to this file")
    p.add_argument("--tile", default="", help="force tile configurations (comma list, or 'all': every tile the "
                   "backend has for the dtype; tuning)")
    p.add_argument("--b-colmajor", action="store_true", help="B column-major (K contiguous) instead of row-major")
    p.add_argument("--no-baseline", action="store_true", help="skip the vendor library")
    p.add_argument("--end-to-end", action="store_true", help="time mxcore.matmul as a user calls it (quantization, "
                   "staging, output) beside the kernel and the vendor pipeline: mxcore.tools.bench_e2e's options apply")
    p.add_argument("--decode", metavar="MODEL", default=None, help="the decode step of a decoder's linear layers "
                   "(llama3-8b, llama3-8b-fused, llama3.2-3b): mxcore.tools.bench_decode's options apply")
    p.add_argument("--wonly-path", default=None, help="force the weight-only path of A:B pairs (cuda: registers | "
                   "staged)")
    p.add_argument("--loop-ceilings", action="store_true",
                   help="also time the kernel's main loop with parts removed: smem-resident, mma alone, feed alone")
    args = p.parse_args(argv)
    dtypes = [_DTYPE_ALIASES.get(d.strip().lower(), d.strip().lower()) for d in args.dtype.split(",") if d.strip()]
    if not dtypes:
        raise CLIError(f"--dtype {args.dtype!r} names no dtype; pass e.g. --dtype fp16,mxfp4")
    sizes = None if args.sizes is None else parse_sizes(args.sizes)
    extra = []
    for spec in parse_shapes(args.shapes, words=("llm",)):
        extra += LLM_SHAPES if spec == "llm" else [spec]
    from mxcore.backends import select
    from mxcore.errors import BackendUnavailableError

    try:
        be = select(args.backend)
    except BackendUnavailableError as exc:
        raise CLIError(command_line_spelling(f"needs a usable backend (--backend {args.backend}): {exc}")) from None
    where = "cpu" if be.vendor == "cpu" else "gpu"
    shapes = [(s, s, s) for s in (DEFAULT_SIZES[where] if sizes is None else sizes)] + extra
    if not shapes:
        raise CLIError("--sizes '' and no --shapes: nothing to run; pass --sizes 256,512 or --shapes 16x32x64")
    repeats = DEFAULT_REPEATS[where] if args.repeats is None else args.repeats
    if where == "cpu":
        big = max(max(s) for s in shapes)
        print(f"backend {be.name}: numpy on the CPU, times are host wall clock"
              + (f"; sizes above {CPU_SLOW_SIZE} take minutes per case" if big > CPU_SLOW_SIZE else ""), flush=True)
    tiles = [t.strip() for t in args.tile.split(",") if t.strip()] or [None]
    rows = run(be.name, dtypes, shapes, repeats=repeats, sets=args.sets, tiles=tiles, backend=be,
               b_colmajor=args.b_colmajor, baseline=not args.no_baseline, loop_ceilings=args.loop_ceilings,
               options={"wonly_path": args.wonly_path} if args.wonly_path else None)
    print(_table(rows))
    write_rows(rows, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(_cli(sys.argv[1:]))
