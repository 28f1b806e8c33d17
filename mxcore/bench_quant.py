"""Bandwidth of device quantization: ``quantize_mx`` of a bf16 torch CUDA tensor, against a device copy.

``bench_quantize()`` times ``mxcore.quantize_mx(x, fmt)`` on an ``M x N`` bfloat16 tensor (CUDA events,
median of ``repeats`` after ``warmup`` calls) and reports bytes moved per second: the input read (2 bytes
per element) plus the codes (one byte per element, unpacked) and E8M0 scales written.  The reference is a
device-to-device copy of the same input in the same run (``y.copy_(x)``: read + write of the bf16 tensor),
the bandwidth a memory-bound kernel can reach on this GPU.  Three figures per format: the kernel alone
(outputs allocated once), one whole ``quantize_mx`` call (events around it: the host's launch work shows as
idle GPU time), and the mean of 20 back-to-back calls.  Run: ``python -m mxcore.bench_quant``.
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
                   warmup: int = 3, scale_rounding: str = "floor") -> list[dict]:
    """One row per format (and one for the copy): ms, GB/s, and the fraction of the copy's bandwidth."""
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
        kernel = codec.quantize_mx_kernel_only(x, spec, rceil=scale_rounding == "rceil")
        for what, fn, calls in (("kernel", kernel, 1), ("call", lambda: quantize_mx(x, fmt, scale_rounding=scale_rounding), 1),
                                ("call x20", lambda: [quantize_mx(x, fmt, scale_rounding=scale_rounding)
                                                      for _ in range(20)], 20)):
            ms = _median_ms(fn, repeats, warmup) / calls
            gbs = moved / ms / 1e6
            rows.append({"what": f"quantize_mx {fmt} {what}", "ms": ms, "GB/s": gbs, "of copy": gbs / copy_gbs})
    return rows


def main() -> int:
    import torch

    print(f"GPU: {torch.cuda.get_device_name()}")
    for r in bench_quantize():
        print(f"{r['what']:<32s} {r['ms']:8.4f} ms  {r['GB/s']:8.1f} GB/s  {100 * r['of copy']:5.1f} % of copy")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
