"""Bandwidth of device quantization: ``quantize_mx`` of a bf16 torch CUDA tensor, against a device copy.

``bench_quantize()`` times ``mxcore.quantize_mx(x, fmt)`` on an ``M x N`` bfloat16 tensor (CUDA events,
median of ``repeats`` after ``warmup`` calls) and reports bytes moved per second: the input read (2 bytes
per element) plus the codes (one byte per element, unpacked) and E8M0 scales written.  The reference is a
device-to-device copy of the same input in the same run (``y.copy_(x)``: read + write of the bf16 tensor),
the bandwidth a memory-bound kernel can reach on this GPU.  Per format: each MX quantization kernel alone
(outputs allocated once): ``fast`` (``mx_quantize_mx_fast_*``, what ``quantize_mx`` launches for this input)
and ``generic`` (one thread per block, the kernel for other layouts), then one whole ``quantize_mx`` call
(events around it: the host's launch work shows as idle GPU time) and the mean of 20 back-to-back calls.
Run: ``python -m mxcore.bench_quant`` (``--generic-calls`` also times the calls with
``MXCORE_MX_KERNEL=generic``).
"""

from __future__ import annotations

import statistics

__all__ = ["bench_quantize"]


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

    from .mx import mx_element, quantize_mx

    torch.manual_seed(0)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    copy_ms = _median_ms(lambda: y.copy_(x), repeats, warmup)
    copy_bytes = 2 * x.numel() * x.element_size()
    copy_gbs = copy_bytes / copy_ms / 1e6
    rows = [{"what": "device copy (bf16)", "ms": copy_ms, "GB/s": copy_gbs, "of copy": 1.0}]
    from .backends import codec

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


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mxcore.bench_quant", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, nargs=2, default=(8192, 8192), metavar=("M", "N"))
    ap.add_argument("--formats", nargs="+", default=["mxfp8", "mxfp4"])
    ap.add_argument("--scale-rounding", choices=("floor", "rceil"), default="floor")
    ap.add_argument("--generic-calls", action="store_true", help="also time quantize_mx on the generic kernel")
    ap.add_argument("--axis", type=int, choices=(-1, 0), default=-1,
                    help="blocks along rows (-1, A's layout) or columns (0, B's layout)")
    ns = ap.parse_args(argv)
    import torch

    print(f"GPU: {torch.cuda.get_device_name()}  ({ns.size[0]}x{ns.size[1]} bf16, axis={ns.axis}, "
          f"scale_rounding={ns.scale_rounding})")
    for r in bench_quantize(*ns.size, formats=tuple(ns.formats), scale_rounding=ns.scale_rounding,
                            generic_calls=ns.generic_calls, axis=ns.axis):
        print(f"{r['what']:<40s} {r['ms']:8.4f} ms  {r['GB/s']:8.1f} GB/s  {100 * r['of copy']:5.1f} % of copy")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
