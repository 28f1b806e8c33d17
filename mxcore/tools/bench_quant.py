"""Bandwidth of quantization: on a GPU, ``quantize_mx`` of a bf16 torch CUDA tensor against a device copy; on
the host, the numpy codecs against an ml_dtypes cast of the same array.

``bench_quantize()`` times ``mxcore.quantize_mx(x, fmt)`` on an ``M x N`` bfloat16 tensor (CUDA events,
median of ``repeats`` after ``warmup`` calls) and reports bytes moved per second: the input read (2 bytes
per element) plus the codes (one byte per element, unpacked) and E8M0 scales written.  The reference is a
device-to-device copy of the same input in the same run (``y.copy_(x)``: read + write of the bf16 tensor),
the bandwidth a memory-bound kernel can reach on this GPU.  Per format: each MX quantization kernel alone
(outputs allocated once): ``fast`` (``mx_quantize_mx_fast_*``, what ``quantize_mx`` launches for this input)
and ``generic`` (one thread per block, the kernel for other layouts), then one whole ``quantize_mx`` call
(events around it: the host's launch work shows as idle GPU time) and the mean of 20 back-to-back calls.
Run: ``python -m mxcore.tools.bench_quant`` (``--generic-calls`` also times the calls with
``MXCORE_MX_KERNEL=generic``).

``bench_host()`` (``python -m mxcore.tools.bench_quant --host``, no GPU) times the host ``quantize_mx`` (each MX
format, both scale roundings), ``quantize_tensor`` (fp8) and ``dequantize`` of an ``M x N`` (4096 x 4096)
float32 array, median of ``repeats`` after one warm-up call, against ``x.astype(ml_dtypes.float8_e4m3fn)`` in
the same run (and the casts to fp6 / fp4).  GB/s counts the float32 array (4 bytes per element) for every row,
so a row's GB/s over the cast's is the inverse of its ``x cast`` time ratio; the ratio is what to compare
across machines (a shared or slow CPU moves both).
"""

from __future__ import annotations

import statistics

__all__ = ["bench_host", "bench_quantize"]


def _median_ms(fn, repeats: int, warmup: int) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def bench_quantize(m: int = 8192, n: int = 8192, formats=("mxfp8", "mxfp4"), *, repeats: int = 20,
                   warmup: int = 3, scale_rounding: str = "floor", generic_calls: bool = False,
                   axis: int = -1) -> list[dict]:
    """Rows (the copy, then per format: each kernel alone, the call, 20 calls; with ``generic_calls`` also
    the call on the generic kernel): ms, GB/s, and the fraction of the copy's bandwidth.  ``axis``: the blocks'
    axis (-1: rows of A, the lane-pair kernel; 0: columns of B, the column kernel)."""
    import torch

    from ..mx import mx_element, quantize_mx

    torch.manual_seed(0)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    copy_ms = _median_ms(lambda: y.copy_(x), repeats, warmup)
    copy_bytes = 2 * x.numel() * x.element_size()
    copy_gbs = copy_bytes / copy_ms / 1e6
    rows = [{"what": "device copy (bf16)", "ms": copy_ms, "GB/s": copy_gbs, "of copy": 1.0}]
    from ..backends import codec

    moved = x.numel() * x.element_size() + x.numel() + x.numel() // 32
    for fmt in formats:
        spec = mx_element(fmt)[1]
        rceil = scale_rounding == "rceil"
        runs = [(f"kernel {k}", codec.quantize_mx_kernel_only(x, spec, axis=axis % 2, rceil=rceil, kernel=k), 1)
                for k in ("fast", "generic")]
        runs += [("call", lambda: quantize_mx(x, fmt, axis=axis, scale_rounding=scale_rounding), 1),
                 ("call x20", lambda: [quantize_mx(x, fmt, axis=axis, scale_rounding=scale_rounding)
                                       for _ in range(20)], 20)]
        for what, fn, calls in runs:
            ms = _median_ms(fn, repeats, warmup) / calls
            gbs = moved / ms / 1e6
            rows.append({"what": f"quantize_mx {fmt} {what}", "ms": ms, "GB/s": gbs, "of copy": gbs / copy_gbs})
        if generic_calls:
            import os

            old = os.environ.get("MXCORE_MX_KERNEL")
            os.environ["MXCORE_MX_KERNEL"] = "generic"
            try:
                ms = _median_ms(lambda: quantize_mx(x, fmt, axis=axis, scale_rounding=scale_rounding), repeats,
                                warmup)
            finally:
                if old is None:
                    del os.environ["MXCORE_MX_KERNEL"]
                else:
                    os.environ["MXCORE_MX_KERNEL"] = old
            gbs = moved / ms / 1e6
            rows.append({"what": f"quantize_mx {fmt} call (generic)", "ms": ms, "GB/s": gbs, "of copy": gbs / copy_gbs})
    return rows


def _median_s(fn, repeats: int) -> float:
    import time

    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_host(m: int = 4096, n: int = 4096, formats=("mxfp8", "mxfp6", "mxfp4"), *, repeats: int = 5) -> list[dict]:
    """Host codec rows: the ml_dtypes casts, then quantize_mx (per format and scale rounding), quantize_tensor
    (fp8) and dequantize (MX and per-tensor) of an ``m x n`` float32 array: ms, GB/s and the time over the
    float32 -> float8_e4m3fn cast's (``x cast``)."""
    import ml_dtypes
    import numpy as np

    from ..mx import dequantize, quantize_mx, quantize_tensor

    x = np.random.default_rng(0).standard_normal((m, n), dtype=np.float32)
    casts = {"float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float6_e2m3fn": ml_dtypes.float6_e2m3fn,
             "float4_e2m1fn": ml_dtypes.float4_e2m1fn}
    runs = [(f"ml_dtypes cast f32 -> {k}", lambda t=t: x.astype(t)) for k, t in casts.items()]
    for fmt in formats:
        for sr in ("floor", "rceil"):
            runs.append((f"quantize_mx {fmt} {sr}", lambda f=fmt, r=sr: quantize_mx(x, f, scale_rounding=r)))
    runs.append(("quantize_tensor fp8", lambda: quantize_tensor(x, "fp8")))
    for fmt in formats:
        q = quantize_mx(x, fmt)
        runs.append((f"dequantize {fmt}", lambda q=q: dequantize(q)))
    st = quantize_tensor(x, "fp8")
    runs.append(("dequantize fp8 (per tensor)", lambda: dequantize(st)))
    rows = []
    for what, fn in runs:
        s = _median_s(fn, repeats)
        rows.append({"what": what, "ms": 1e3 * s, "GB/s": x.nbytes / s / 1e9})
    ref = rows[0]["ms"]
    for r in rows:
        r["x cast"] = r["ms"] / ref
    return rows


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mxcore.tools.bench_quant", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, nargs=2, default=None, metavar=("M", "N"),
                    help="array shape (default: 8192 8192 on the GPU, 4096 4096 with --host)")
    ap.add_argument("--formats", nargs="+", default=None,
                    help="MX formats (default: mxfp8 mxfp4 on the GPU, mxfp8 mxfp6 mxfp4 with --host)")
    ap.add_argument("--scale-rounding", choices=("floor", "rceil"), default="floor")
    ap.add_argument("--generic-calls", action="store_true", help="also time quantize_mx on the generic kernel")
    ap.add_argument("--axis", type=int, choices=(-1, 0), default=-1,
                    help="blocks along rows (-1, A's layout) or columns (0, B's layout)")
    ap.add_argument("--host", action="store_true",
                    help="time the host (numpy) codecs on a float32 array against an ml_dtypes cast of it")
    ns = ap.parse_args(argv)
    if ns.host:
        m, n = ns.size or (4096, 4096)
        print(f"host codecs, {m}x{n} float32 (median of 5; GB/s of the float32 array)")
        for r in bench_host(m, n, formats=tuple(ns.formats or ("mxfp8", "mxfp6", "mxfp4"))):
            print(f"{r['what']:<36s} {r['ms']:8.1f} ms  {r['GB/s']:6.2f} GB/s  {r['x cast']:5.2f} x cast")
        return 0
    import torch

    size = ns.size or (8192, 8192)
    print(f"GPU: {torch.cuda.get_device_name()}  ({size[0]}x{size[1]} bf16, axis={ns.axis}, "
          f"scale_rounding={ns.scale_rounding})")
    for r in bench_quantize(*size, formats=tuple(ns.formats or ("mxfp8", "mxfp4")), scale_rounding=ns.scale_rounding,
                            generic_calls=ns.generic_calls, axis=ns.axis):
        print(f"{r['what']:<40s} {r['ms']:8.4f} ms  {r['GB/s']:8.1f} GB/s  {100 * r['of copy']:5.1f} % of copy")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
